// The tiled CPU kernel's bfloat16 products: the AMX tiles (bfloat16 K/V on CPUs with AMX-BF16) and the
// vdpbf16ps scores (bfloat16 K on CPUs with AVX-512 BF16: the plan's choice on AMD cores without AMX, forced by
// "kernel=bf16-dot"). Every case on each path
// the CPU has and with it left out ("off=amx", "off=amx+bf16-dot": the SIMD float32 products), each against the
// float64 reference at the CPU's bounds; bit-identical bytes over thread counts and cut calls; the products
// themselves against float64 sums. A path this CPU lacks is never planned, and its own checks skip.
#include "test_support.hpp"

#include <cpu/amx_tiles.hpp>
#include <cpu/bf16_dot.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::MaskKind;

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Items of more than 8 rows (the tiled kernel: AMX, vdpbf16ps), head dims around its 32-wide K steps and 16-wide V steps, keys around
// the 64-key tiles, and every option.
std::vector<CaseSpec> amx_cases() {
  std::vector<CaseSpec> out;
  const std::int64_t dims[] = {1, 8, 31, 32, 40, 64, 96, 128, 200, 256};
  const std::int64_t keys[] = {1, 5, 63, 64, 65, 127, 300};
  // (heads, kv_heads, q_len)
  const std::int64_t groups[][3] = {{2, 2, 70}, {8, 2, 20}, {4, 4, 9}, {3, 1, 130}};
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

AttentionConfig with_overrides(const char* overrides) {
  AttentionConfig c;
  c.plan = parse_plan_overrides(overrides);
  return c;
}
AttentionConfig without_amx() { return with_overrides("off=amx"); }

// bfloat16 (P rounded to bfloat16, and with "off=rounded-p" as three terms), and float16 as two bfloat16 terms
// (held to float16's bound, and with all of P's bits to float32's accuracy by
// HalfOutputs.RoundedToNearestElementByElement). float16 takes the tiles only with 4 or more row blocks per K/V head,
// head dims 17 to 64 and keys that fill whole 64-key tiles but for at most 1/16 (the plan's rule): those cases
// must.
TEST(Amx, MatchesTheReferenceOnBothPaths) {
  int on_amx = 0, expected = 0, f16_expected = 0;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const CaseSpec& spec : amx_cases()) {
      SCOPED_TRACE(spec_string(spec) + " " + std::string(dtype_name(dtype)));
      CaseData data(spec, dtype, 21);
      const auto ref = data.reference();
      for (const char* overrides : {"", "off=rounded-p", "off=amx"}) {
        const bool amx = std::string(overrides) != "off=amx";
        const Outcome o = run_and_measure(data, ref, with_overrides(overrides));
        const bool took_amx = o.describe.find("AMX") != std::string::npos;
        const std::int64_t padded_keys = (spec.k_len + 63) / 64 * 64;
        const bool f16_rule = dtype == DType::bf16 || (spec.heads / spec.kv_heads * spec.q_len > 3 * 64 &&
                                                       spec.head_dim > 16 && spec.head_dim <= 64 &&
                                                       (padded_keys - spec.k_len) * 16 <= spec.k_len);
        EXPECT_EQ(took_amx, amx && cpu::amx::available() && f16_rule) << o.describe;
        const bool rounded_p = took_amx && dtype == DType::bf16 && std::string(overrides).empty();
        EXPECT_EQ(o.describe.find("P rounded to bfloat16") != std::string::npos, rounded_p) << o.describe;
        on_amx += took_amx;
        expected += amx && f16_rule;
        f16_expected += amx && f16_rule && dtype == DType::f16;
        EXPECT_LE(o.err, testing::tolerance(dtype)) << o.describe;
        EXPECT_LE(o.lse_err, rounded_p ? cpu_lse_tolerance(dtype) : kLseTolerance) << o.describe;
        EXPECT_TRUE(o.gaps_untouched);
        EXPECT_EQ(o.unwritten, 0);
      }
    }
  }
  if (cpu::amx::available()) EXPECT_EQ(on_amx, expected);
  EXPECT_GE(f16_expected, 20) << "float16 cases on the tiles are covered (63 and 127 keys: a partial last tile)";
}

TEST(Amx, ThreadCountsAndCutCallsKeepTheBits) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  const auto cases = amx_cases();
  for (std::size_t i = 0; i < cases.size(); i += 5) {
    const DType dtype = i % 2 == 0 ? DType::bf16 : DType::f16;
    SCOPED_TRACE(spec_string(cases[i]) + " " + std::string(dtype_name(dtype)));
    CaseData data(cases[i], dtype, 22);
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

// A thread's staged copy of a K/V head (4 or more row blocks of it; "off=widened-kv" stages every tile per item)
// gives the same bytes as staging per item: the tiles are the same absolute key tiles either way. Windows and
// causal offsets start rows' keys mid-tile, and a V row of inf or NaN that only some rows see is staged as 0 and
// added back where its weight is not 0: those rows agree too, and every row that cannot see it matches the
// reference.
TEST(Amx, TheHeadCopyKeepsTheBits) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU has no AMX-BF16";
  struct Variant {
    const char* name;
    std::int64_t window, offset, length;
    float bad_v;
  };
  const Variant variants[] = {{"plain", 0, -1, 0, 0.0f},       {"window 70", 70, 40, 0, 0.0f},
                              {"key length 190", 0, -1, 190, 0.0f}, {"causal, V inf at key 150", 0, 40, 0, kInfinity},
                              {"window 50, V NaN at key 100", 50, 60, 0, std::numeric_limits<float>::quiet_NaN()}};
  for (const Variant& var : variants) {
   for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(var.name) + " " + std::string(dtype_name(dtype)));
    Manual m(2, 6, 2, 70, 320, 40, 24, dtype);  // 3 x 70 rows per K/V head: 4 row blocks, 5 whole key tiles
    m.randomize(31);
    m.p.return_lse = true;
    if (var.offset >= 0) {
      m.p.causal = true;
      m.p.causal_offset = var.offset;
      if (var.window > 0) m.p.window = var.window;
    }
    if (var.length > 0) m.add_key_lengths(static_cast<std::int32_t>(var.length));
    const std::int64_t bad_key = var.bad_v != 0.0f ? (var.window > 0 ? 100 : 150) : -1;
    if (bad_key >= 0) {
      for (std::int64_t d = 0; d < 24; ++d) m.set(m.v, m.v_at(1, 0, bad_key, d), var.bad_v);
    }
    const auto ref = m.reference();
    m.run();
    EXPECT_NE(Attention(m.p).describe().find("staged once per head"), std::string::npos) << Attention(m.p).describe();
    const std::vector<std::byte> copied = m.o;
    const std::vector<float> copied_lse = m.lse;
    m.run(with_overrides("off=widened-kv"));
    EXPECT_TRUE(m.o == copied) << "the head copy changed the output";
    EXPECT_EQ(std::memcmp(m.lse.data(), copied_lse.data(), m.lse.size() * sizeof(float)), 0);
    // Rows that cannot see the bad key (entry 1, K/V head 0's query heads 0-2): finite and within the bound.
    for (std::int64_t h = 0; h < 3 && bad_key >= 0; ++h) {
      for (std::int64_t i = 0; i < m.p.q_len; ++i) {
        const std::int64_t last = i + var.offset, first = var.window > 0 ? last - var.window + 1 : 0;
        if (bad_key >= first && bad_key <= last) continue;
        for (std::int64_t d = 0; d < 24; ++d) {
          const double r = ref.out[static_cast<std::size_t>(((1 * m.p.heads + h) * m.p.q_len + i) * 24 + d)];
          ASSERT_TRUE(std::isfinite(m.out(1, h, i, d))) << "row " << i << " of head " << h;
          EXPECT_NEAR(m.out(1, h, i, d), r, 1e-2) << "row " << i << " of head " << h;
        }
      }
    }
    if (bad_key < 0) EXPECT_LE(m.scaled_error(ref), testing::tolerance(dtype));
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
  // (several tiles: one sum over every key of the step's tiles)
  for (const auto& [dv16, v_terms, tiles] : {std::tuple<std::int64_t, int, int>{16, 1, 1}, {48, 1, 1}, {256, 1, 1},
                                             {48, 2, 1}, {48, 1, 3}, {32, 2, cpu::amx::kTilesPerStep}}) {
    const int p_terms = tiles == 3 ? 1 : cpu::amx::kMaxProbabilityTerms;  // (P rounded: one term)
    const std::int64_t tile_p = p_terms * kK * kL;
    std::vector<std::uint16_t> vt(static_cast<std::size_t>(tiles * v_terms * dv16 * kK));
    std::vector<std::uint16_t> pp(static_cast<std::size_t>(tiles * tile_p));
    for (auto& x : vt) x = float_to_bf16_bits(normal(rng));
    for (auto& x : pp) x = float_to_bf16_bits(std::abs(normal(rng)));
    std::vector<const std::uint16_t*> vt_tiles;
    for (int g = 0; g < tiles; ++g) vt_tiles.push_back(vt.data() + g * v_terms * dv16 * kK);
    std::vector<float> out(static_cast<std::size_t>(dv16 * kL), -1.0f);
    cpu::amx::begin();
    cpu::amx::values(vt_tiles.data(), tiles, v_terms, pp.data(), p_terms, dv16, out.data());
    cpu::amx::end();
    for (std::int64_t d = 0; d < dv16; ++d) {
      for (int q = 0; q < kL; ++q) {
        double ref = 0.0, mag = 0.0;
        for (int g = 0; g < tiles; ++g) {
          for (int vterm = 0; vterm < v_terms; ++vterm) {
            for (int t = 0; t < p_terms; ++t) {
              for (int j = 0; j < kK; ++j) {
                const double x = double(bf16_bits_to_float(vt_tiles[g][(vterm * dv16 + d) * kK + j])) *
                                 bf16_bits_to_float(pp[g * tile_p + t * kK * kL + (j / 2) * kL * 2 + q * 2 + j % 2]);
                ref += x;
                mag += std::abs(x);
              }
            }
          }
        }
        ASSERT_NEAR(out[d * kL + q], ref, 1e-6 * mag + 1e-30)
            << "dv " << dv16 << " dim " << d << " query " << q << " tiles " << tiles;
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::test

namespace attnkit::test {
namespace {

bool took_bf16_dot(const std::string& describe) { return describe.find("vdpbf16ps") != std::string::npos; }

// The vdpbf16ps scores: forced by "kernel=bf16-dot" wherever the CPU has them (AMX or not), never with
// "off=bf16-dot"; every case within the bounds either way. The plan's own choice (AMX out of the way) takes them
// where they pay only.
TEST(Bf16Dot, MatchesTheReferenceOnBothPaths) {
  int on_dot = 0;
  for (const CaseSpec& spec : amx_cases()) {
    SCOPED_TRACE(spec_string(spec));
    CaseData data(spec, DType::bf16, 23);
    const auto ref = data.reference();
    EXPECT_EQ(took_bf16_dot(Attention(data.problem(), with_overrides("off=amx")).describe()),
              cpu::bf16_dot::pays());
    for (bool dot : {true, false}) {
      const Outcome o = run_and_measure(data, ref, with_overrides(dot ? "kernel=bf16-dot" : "off=amx+bf16-dot"));
      EXPECT_EQ(took_bf16_dot(o.describe), dot && cpu::bf16_dot::available()) << o.describe;
      on_dot += took_bf16_dot(o.describe);
      EXPECT_LE(o.err, testing::tolerance(DType::bf16)) << o.describe;
      EXPECT_LE(o.lse_err, kLseTolerance) << o.describe;
      EXPECT_TRUE(o.gaps_untouched);
      EXPECT_EQ(o.unwritten, 0);
    }
  }
  if (cpu::bf16_dot::available()) EXPECT_EQ(on_dot, static_cast<int>(amx_cases().size()));
}

TEST(Bf16Dot, ThreadCountsAndCutCallsKeepTheBits) {
  if (!cpu::bf16_dot::available()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  const auto cases = amx_cases();
  for (std::size_t i = 0; i < cases.size(); i += 5) {
    SCOPED_TRACE(spec_string(cases[i]));
    CaseData data(cases[i], DType::bf16, 24);
    std::vector<std::byte> base;
    for (int threads : {1, 2, 3}) {
      for (std::int64_t budget : {std::int64_t{0}, std::int64_t{1}}) {
        data.poison_outputs();
        AttentionProblem p = data.problem();
        p.work_budget = budget;
        AttentionConfig config = with_overrides("kernel=bf16-dot");
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

// The score product alone, on every head dim from 1 to 67 (odd ones end on a single value: nothing past a K row
// may be read, so each row is its own allocation) and every key count and lane count it is called with, against
// float64 sums of the same bfloat16 values.
TEST(Bf16Dot, ScoresMatchFloat64) {
  if (!cpu::bf16_dot::available()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  std::mt19937_64 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int kL = cpu::bf16_dot::kLanes, kK = static_cast<int>(cpu::kKeyTile);
  for (std::int64_t dim = 1; dim <= 67; dim += (dim < 10 ? 1 : 7)) {
    const std::int64_t pairs = (dim + 1) / 2;
    std::vector<std::vector<std::uint16_t>> rows(kK, std::vector<std::uint16_t>(static_cast<std::size_t>(dim)));
    std::vector<const std::uint16_t*> krow;
    for (auto& r : rows) {
      for (auto& x : r) x = float_to_bf16_bits(normal(rng));
      krow.push_back(r.data());
    }
    std::vector<std::uint16_t> qp(static_cast<std::size_t>(pairs * kL * 2), 0);
    for (std::int64_t d = 0; d < dim; ++d)
      for (int q = 0; q < kL; ++q) qp[(d / 2) * kL * 2 + q * 2 + d % 2] = float_to_bf16_bits(normal(rng));
    for (std::int64_t n : {1, 5, 6, 7, 64}) {
      for (std::int64_t lanes : {1, 16, 17, 48, 64}) {
        std::vector<float> st(kK * kL, -1.0f);
        cpu::bf16_dot::scores(qp.data(), dim, krow.data(), n, lanes, st.data());
        const std::int64_t computed = (lanes + 15) / 16 * 16;
        for (int j = 0; j < kK; ++j) {
          for (int q = 0; q < kL; ++q) {
            const float got = st[j * kL + q];
            if (j >= n || q >= computed) {  // nothing written outside the requested keys and vectors
              ASSERT_EQ(got, -1.0f) << "dim " << dim << " n " << n << " lanes " << lanes << " key " << j << " query " << q;
              continue;
            }
            double ref = 0.0, mag = 0.0;
            for (std::int64_t d = 0; d < dim; ++d) {
              const double x = double(bf16_bits_to_float(rows[j][d])) * bf16_bits_to_float(qp[(d / 2) * kL * 2 + q * 2 + d % 2]);
              ref += x;
              mag += std::abs(x);
            }
            ASSERT_NEAR(got, ref, 1e-6 * mag + 1e-30) << "dim " << dim << " key " << j << " query " << q;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::test
