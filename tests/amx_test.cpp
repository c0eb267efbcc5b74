// The tiled CPU kernel's AMX products (bfloat16 problems with bfloat16 K/V on CPUs with AMX-BF16): every case on
// the plan's path and with the AMX products left out ("off=amx", the SIMD float32 products), each against the
// float64 reference at the CPU's bounds; bit-identical bytes over thread counts and cut calls; the tile products
// themselves against float64 sums. Where the CPU has no AMX, the plan never takes it and the AMX checks skip.
#include "test_support.hpp"

#include <cpu/amx_tiles.hpp>

#include <gtest/gtest.h>

#include <random>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::MaskKind;

// Items of more than 4 rows (the AMX path), head dims around its 32-wide K steps and 16-wide V steps, keys around
// the 64-key tiles, and every option.
std::vector<CaseSpec> amx_cases() {
  std::vector<CaseSpec> out;
  const std::int64_t dims[] = {1, 8, 31, 32, 40, 64, 96, 128, 200, 256};
  const std::int64_t keys[] = {1, 5, 64, 65, 300};
  // (heads, kv_heads, q_len)
  const std::int64_t groups[][3] = {{2, 2, 70}, {8, 2, 20}, {4, 4, 5}, {3, 1, 130}};
  int n = 0;
  for (const auto& g : groups) {
    for (std::int64_t d : dims) {
      for (std::int64_t k : keys) {
        ++n;
        CaseSpec s;
        s.name = "amx_" + std::to_string(n);
        s.batch = 1 + n % 2, s.heads = g[0], s.kv_heads = g[1], s.q_len = g[2], s.k_len = k, s.head_dim = d;
        s.v_head_dim = n % 4 == 0 ? (d + 5 <= 256 ? d + 5 : 250) : n % 7 == 0 ? 16 : 0;
        s.layout = n % 3 == 0 ? LayoutKind::PositionsFirst : n % 5 == 0 ? LayoutKind::Padded : LayoutKind::HeadFirst;
        s.mask = n % 4 == 1 ? MaskKind::Random : n % 4 == 2 ? MaskKind::KeyPadding : MaskKind::None;
        s.causal = n % 3 == 1;
        if (s.causal && n % 6 == 1) s.window = 1 + k / 3;
        if (n % 8 == 3) s.softcap = 5.0f;
        if (n % 5 == 2) s.key_lengths = KeyLengths::Random;
        s.head_sink = n % 9 == 4;
        s.lse = n % 2 == 0;
        s.input_std = n % 11 == 0 ? 3.0 : 1.0;
        out.push_back(s);
      }
    }
  }
  return out;
}

AttentionConfig without_amx() {
  AttentionConfig c;
  c.plan = parse_plan_overrides("off=amx");
  return c;
}

TEST(Amx, MatchesTheReferenceOnBothPaths) {
  int on_amx = 0;
  for (const CaseSpec& spec : amx_cases()) {
    SCOPED_TRACE(spec_string(spec));
    CaseData data(spec, DType::bf16, 21);
    const auto ref = data.reference();
    for (bool amx : {true, false}) {
      const Outcome o = run_and_measure(data, ref, amx ? AttentionConfig{} : without_amx());
      const bool took_amx = o.describe.find("AMX") != std::string::npos;
      EXPECT_EQ(took_amx, amx && cpu::amx::available()) << o.describe;
      on_amx += took_amx;
      EXPECT_LE(o.err, testing::tolerance(DType::bf16)) << o.describe;
      EXPECT_LE(o.lse_err, kLseTolerance) << o.describe;
      EXPECT_TRUE(o.gaps_untouched);
      EXPECT_EQ(o.unwritten, 0);
    }
  }
  if (cpu::amx::available()) EXPECT_EQ(on_amx, static_cast<int>(amx_cases().size()));
}

TEST(Amx, ThreadCountsAndCutCallsKeepTheBits) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  const auto cases = amx_cases();
  for (std::size_t i = 0; i < cases.size(); i += 5) {
    SCOPED_TRACE(spec_string(cases[i]));
    CaseData data(cases[i], DType::bf16, 22);
    std::vector<std::byte> base;
    for (int threads : {1, 2, 3}) {
      for (std::int64_t budget : {std::int64_t{0}, std::int64_t{1}}) {
        data.poison_outputs();
        AttentionProblem p = data.problem();
        p.work_budget = budget;
        AttentionConfig config;
        config.threads = threads;
        Attention(p, config).run(data.args());
        if (base.empty()) {
          base = data.output_bytes();
        } else {
          EXPECT_TRUE(data.output_bytes() == base) << threads << " threads, budget " << budget;
        }
      }
    }
  }
}

// The tile products alone: S^T and one tile's P V against float64 sums of the same bfloat16 operands (P as its
// three bfloat16 terms), within float32 accumulation's bound.
TEST(Amx, TileProductsMatchFloat64) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kL = cpu::amx::kLanes, kK = cpu::amx::kTileKeys;
  for (std::int64_t dim32 : {32, 64, 256}) {
    std::vector<std::uint16_t> k(static_cast<std::size_t>(kK * dim32)), qp(static_cast<std::size_t>(dim32 * kL));
    for (auto& x : k) x = float_to_bf16_bits(normal(rng));
    for (auto& x : qp) x = float_to_bf16_bits(normal(rng));
    std::vector<float> st(kK * kL, -1.0f);
    cpu::amx::begin();
    cpu::amx::scores(k.data(), qp.data(), dim32, st.data());
    cpu::amx::end();
    for (int j = 0; j < kK; ++j) {
      for (int q = 0; q < kL; ++q) {
        double ref = 0.0, mag = 0.0;
        for (std::int64_t d = 0; d < dim32; ++d) {
          const double x = double(bf16_bits_to_float(k[j * dim32 + d])) * bf16_bits_to_float(qp[(d / 2) * kL * 2 + q * 2 + d % 2]);
          ref += x;
          mag += std::abs(x);
        }
        ASSERT_NEAR(st[j * kL + q], ref, 1e-6 * mag + 1e-30) << "dim " << dim32 << " key " << j << " query " << q;
      }
    }
  }
  for (std::int64_t dv16 : {16, 48, 256}) {
    std::vector<std::uint16_t> vt(static_cast<std::size_t>(dv16 * kK));
    std::vector<std::uint16_t> pp(static_cast<std::size_t>(cpu::amx::kProbabilityTerms * kK * kL));
    for (auto& x : vt) x = float_to_bf16_bits(normal(rng));
    for (auto& x : pp) x = float_to_bf16_bits(std::abs(normal(rng)));
    std::vector<float> out(static_cast<std::size_t>(dv16 * kL), -1.0f);
    cpu::amx::begin();
    cpu::amx::values(vt.data(), pp.data(), dv16, out.data());
    cpu::amx::end();
    for (std::int64_t d = 0; d < dv16; ++d) {
      for (int q = 0; q < kL; ++q) {
        double ref = 0.0, mag = 0.0;
        for (int t = 0; t < cpu::amx::kProbabilityTerms; ++t) {
          for (int j = 0; j < kK; ++j) {
            const double x = double(bf16_bits_to_float(vt[d * kK + j])) *
                             bf16_bits_to_float(pp[t * kK * kL + (j / 2) * kL * 2 + q * 2 + j % 2]);
            ref += x;
            mag += std::abs(x);
          }
        }
        ASSERT_NEAR(out[d * kL + q], ref, 1e-6 * mag + 1e-30) << "dv " << dv16 << " dim " << d << " query " << q;
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::test
