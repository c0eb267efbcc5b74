// The CPU kernel's few-rows items (at most 8 rows per K/V head: decode steps, one-token cross-attention,
// grouped heads of one query) against the float64 reference: every element type, head dims around the vector
// widths, key counts around the 4-key groups and the 64-key tiles, split and unsplit, masks, softcap, windows,
// key lengths, sinks, layouts; and bit-identical bytes over thread counts.
#include "test_support.hpp"

#include <cpu/few_rows_bf16.hpp>

#include <gtest/gtest.h>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::MaskKind;

std::vector<std::pair<CaseSpec, DType>> few_rows_cases() {
  std::vector<std::pair<CaseSpec, DType>> out;
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  const std::int64_t dims[] = {1, 5, 16, 17, 32, 64, 100, 128};
  const std::int64_t keys[] = {1, 3, 4, 5, 63, 64, 65, 130, 700, 1500};
  // (heads, kv_heads, q_len): 1 to 4 rows per K/V head, and 5 to 8 (two halves of rows per tile).
  const std::int64_t groups[][3] = {{2, 2, 1}, {4, 2, 1}, {6, 2, 1}, {8, 2, 1},  {3, 3, 2},
                                    {2, 1, 2}, {1, 1, 4}, {1, 1, 3}, {14, 2, 1}, {16, 2, 1}, {3, 1, 2}};
  int n = 0;
  for (const auto& g : groups) {
    for (std::int64_t d : dims) {
      for (std::int64_t k : keys) {
        ++n;
        CaseSpec s;
        s.name = "few_rows_" + std::to_string(n);
        s.batch = 1 + n % 2, s.heads = g[0], s.kv_heads = g[1], s.q_len = g[2], s.k_len = k, s.head_dim = d;
        s.v_head_dim = n % 5 == 0 ? d + 3 : 0;
        s.layout = n % 3 == 0 ? LayoutKind::PositionsFirst : n % 7 == 0 ? LayoutKind::Padded : LayoutKind::HeadFirst;
        s.mask = n % 4 == 1 ? MaskKind::Random : n % 4 == 2 ? MaskKind::KeyPadding : MaskKind::None;
        s.causal = n % 3 == 1;
        if (s.causal && n % 6 == 1) s.window = 1 + k / 3;
        if (n % 8 == 3) s.softcap = 5.0f;
        if (n % 5 == 2) s.key_lengths = KeyLengths::Random;
        s.head_sink = n % 9 == 4;
        s.lse = n % 2 == 0;
        s.input_std = n % 11 == 0 ? 3.0 : 1.0;
        out.push_back({s, dtypes[n % 3]});
      }
    }
  }
  return out;
}

TEST(FewRows, MatchesReference) {
  int split = 0;
  for (const auto& [spec, dtype] : few_rows_cases()) {
    SCOPED_TRACE(spec_string(spec) + " " + std::string(dtype_name(dtype)));
    CaseData data(spec, dtype, 11);
    const Outcome o = run_and_measure(data, data.reference());
    EXPECT_NE(o.describe.find("few-rows"), std::string::npos) << o.describe;
    split += o.describe.find("split-k") != std::string::npos;
    EXPECT_LE(o.err, testing::tolerance(dtype));
    EXPECT_LE(o.lse_err, kLseTolerance);
    EXPECT_TRUE(o.gaps_untouched);
    EXPECT_EQ(o.unwritten, 0);
  }
  EXPECT_GT(split, 20) << "the split-K path of few-rows items is covered";
}

// The bfloat16 cases again on the path of CPUs without AVX512_BF16 (on a CPU without it, the cases above ran it).
TEST(FewRows, BFloat16WithoutDotProductInstructions) {
  cpu::CpuKernelFeatures& features = cpu::cpu_kernel_features();
  const cpu::CpuKernelFeatures saved = features;
  features.avx512_bf16 = false;
  for (const auto& [spec, dtype] : few_rows_cases()) {
    if (dtype != DType::bf16) continue;
    SCOPED_TRACE(spec_string(spec));
    CaseData data(spec, dtype, 13);
    const Outcome o = run_and_measure(data, data.reference());
    EXPECT_LE(o.err, testing::tolerance(dtype));
    EXPECT_LE(o.lse_err, kLseTolerance);
    EXPECT_EQ(o.unwritten, 0);
  }
  features = saved;
}

// The vdpbf16ps score tile itself against float64 dot products of the same bfloat16 values: every row count,
// head dims around its 32-element vectors, key counts around its groups of 4.
TEST(FewRows, DotProductTileMatchesFloat64) {
  if (!cpu::cpu_kernel_features().avx512_bf16) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t dim : {1, 7, 31, 32, 33, 64, 100, 128, 256}) {
    for (std::int64_t n : {1, 3, 4, 5, 64}) {
      const std::int64_t stride = dim + 3;
      std::vector<std::uint16_t> q(4 * dim), k(static_cast<std::size_t>(n * stride));
      for (auto& x : q) x = float_to_bf16_bits(normal(rng));
      for (auto& x : k) x = float_to_bf16_bits(normal(rng));
      for (int rows = 1; rows <= 4; ++rows) {
        const std::uint16_t* qr[4] = {q.data(), q.data() + dim, q.data() + 2 * dim, q.data() + 3 * dim};
        std::vector<float> s(static_cast<std::size_t>(4 * 64), -1.0f);
        std::vector<const std::uint16_t*> kr;
        for (std::int64_t j = 0; j < n; ++j) kr.push_back(k.data() + j * stride);
        cpu::score_tile_bf16_dpbf16(qr, rows, dim, kr.data(), n, cpu::RowPrefetch{}, s.data(), 64);
        for (int r = 0; r < rows; ++r) {
          for (std::int64_t j = 0; j < n; ++j) {
            double ref = 0.0, mag = 0.0;
            for (std::int64_t d = 0; d < dim; ++d) {
              const double p = double(bf16_bits_to_float(qr[r][d])) * bf16_bits_to_float(k[j * stride + d]);
              ref += p;
              mag += std::abs(p);
            }
            EXPECT_NEAR(s[r * 64 + j], ref, 1e-6 * mag + 1e-30) << "dim " << dim << " n " << n << " row " << r;
          }
        }
      }
    }
  }
}

TEST(FewRows, ThreadCountDoesNotChangeABit) {
  const auto cases = few_rows_cases();
  for (std::size_t i = 0; i < cases.size(); i += 7) {
    const auto& [spec, dtype] = cases[i];
    SCOPED_TRACE(spec_string(spec));
    CaseData data(spec, dtype, 12);
    std::vector<std::byte> base;
    for (int threads : {1, 2, 3, 8}) {
      data.poison_outputs();
      AttentionConfig config;
      config.threads = threads;
      Attention(data.problem(), config).run(data.args());
      if (base.empty()) {
        base = data.output_bytes();
      } else {
        EXPECT_TRUE(data.output_bytes() == base) << threads << " threads";
      }
    }
  }
}

// Interleaved K/V heads (positions-first): few-rows items over several K/V heads, which take turns tile by tile.
// Against the reference, and the same bytes whatever the heads per item (one thread: all of an entry's; more
// threads: fewer per item, then one), with the keys split too (1300 keys: each head of a wide item keeps its own
// partial for the merge pass).
TEST(FewRows, ItemsOverSeveralInterleavedHeads) {
  int wide = 0, wide_split = 0;
  const std::int64_t shapes[][2] = {{2, 1}, {1, 3}, {4, 1}};  // (query heads per K/V head, q_len)
  for (const auto& shape : shapes) {
    for (std::int64_t kv_heads : {2, 3, 8, 20}) {
      const std::pair<DType, std::int64_t> variants[] = {
          {DType::f32, 200}, {DType::f16, 200}, {DType::bf16, 200}, {DType::f32, 1300}, {DType::bf16, 1300}};
      for (const auto& [dtype, k_len] : variants) {
        CaseSpec s;
        s.name = "interleaved_heads";
        s.batch = 3, s.heads = kv_heads * shape[0], s.kv_heads = kv_heads, s.q_len = shape[1], s.k_len = k_len;
        s.head_dim = 40;
        s.layout = LayoutKind::PositionsFirst;
        s.causal = kv_heads % 2 == 0;
        s.key_lengths = kv_heads == 3 ? KeyLengths::Random : KeyLengths::None;
        s.lse = true;
        SCOPED_TRACE(spec_string(s) + " " + std::string(dtype_name(dtype)));
        CaseData data(s, dtype, 21);
        const cpu::ReferenceResult ref = data.reference();
        std::vector<std::byte> base;
        for (int threads : {1, 4, 64}) {
          AttentionConfig config;
          config.threads = threads;
          const Outcome o = run_and_measure(data, ref, config);
          const bool is_wide = o.describe.find("K/V heads per item") != std::string::npos;
          wide += is_wide;
          wide_split += is_wide && o.describe.find("split-k") != std::string::npos;
          EXPECT_LE(o.err, testing::tolerance(dtype)) << o.describe;
          EXPECT_LE(o.lse_err, kLseTolerance);
          EXPECT_EQ(o.unwritten, 0);
          if (base.empty()) base = data.output_bytes();
          else EXPECT_TRUE(data.output_bytes() == base) << threads << " threads: " << o.describe;
        }
      }
    }
  }
  EXPECT_GT(wide, 12) << "items over several K/V heads are covered";
  EXPECT_GT(wide_split, 6) << "items over several K/V heads with split keys are covered";
}

// A positions-first causal case whose K/V streams from memory (past the prefetch threshold: 4-16 MiB), with key
// lengths that end mid-tile.
CaseSpec streaming_case(const char* name, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t q_len, std::int64_t k_len) {
  CaseSpec s;
  s.name = name;
  s.batch = batch, s.heads = heads, s.kv_heads = kv_heads, s.q_len = q_len, s.k_len = k_len, s.head_dim = 128;
  s.layout = LayoutKind::PositionsFirst;
  s.causal = true;
  s.key_lengths = KeyLengths::Random;
  return s;
}

// A plan feature that must not change the bits: `data` under `base` overrides matches the reference with every
// output written and its plan says `phrase`; with `feature` left out too, the same bytes and the phrase is gone.
// Returns the second plan's description.
std::string expect_feature_keeps_the_bits(CaseData& data, DType dtype, AttentionConfig config, const std::string& base,
                                          const std::string& feature, const std::string& phrase) {
  const cpu::ReferenceResult ref = data.reference();
  config.plan = parse_plan_overrides(base);
  const Outcome with = run_and_measure(data, ref, config);
  EXPECT_NE(with.describe.find(phrase), std::string::npos) << with.describe;
  EXPECT_LE(with.err, testing::tolerance(dtype));
  EXPECT_EQ(with.unwritten, 0);
  const std::vector<std::byte> bytes = data.output_bytes();
  config.plan = parse_plan_overrides(base.empty() ? "off=" + feature : base + "+" + feature);
  const Outcome without = run_and_measure(data, ref, config);
  EXPECT_EQ(without.describe.find(phrase), std::string::npos) << without.describe;
  EXPECT_TRUE(data.output_bytes() == bytes);
  return without.describe;
}

// A wide item's heads score in turns by group of keys (TiledPlan::interleaved_scores): against the reference, and
// the same bytes as with each head's whole tile in turn (off=interleaved-scores).
TEST(FewRows, WideItemsOverStreamingKeysScoreTheirHeadsInTurns) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const CaseSpec s = streaming_case("interleaved_scores", 3, 16, 8, 2, 2100);  // >= 25 MB of K/V
    SCOPED_TRACE(spec_string(s) + " " + std::string(dtype_name(dtype)));
    CaseData data(s, dtype, 23);
    AttentionConfig config;
    config.threads = 1;  // (one thread: all 8 K/V heads of an entry in one item)
    const std::string whole =
        expect_feature_keeps_the_bits(data, dtype, config, "", "interleaved-scores", "scores in turns");
    EXPECT_NE(whole.find("K/V heads per item"), std::string::npos) << whole;
  }
}

// A tiled item (more rows than the few-rows kernel's: a verify step's 5 tokens x 4 heads) over streaming K/V read
// in place asks for its next tile's K/V rows (TiledPlan::prefetch_tiles): against the reference, and the same bytes
// as without (off=prefetch-ahead).
TEST(FewRows, TiledItemsOverStreamingKeysPrefetchTheNextTile) {
  for (DType dtype : {DType::f32, DType::f16}) {
    const CaseSpec s = streaming_case("prefetch_tiles", 2, 16, 4, 5, 4100);  // >= 16 MiB of K/V
    SCOPED_TRACE(spec_string(s) + " " + std::string(dtype_name(dtype)));
    CaseData data(s, dtype, 29);
    // (off=amx: float16 items on AMX tiles stage their own rows)
    expect_feature_keeps_the_bits(data, dtype, AttentionConfig{}, "off=amx", "prefetch-ahead", "prefetched");
  }
}

// Tiled items over more Q/K/V/O than a thread's L2 (BERT-size prefill, K/V copied into the thread's widened head)
// ask for the rows of the next tile they copy and of the item the thread runs next (TiledPlan::prefetch_items):
// against the reference, and the same bytes as without (off=prefetch-items).
TEST(FewRows, TiledItemsLargerThanTheL2FetchTheNextItemsRowsEarly) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const CaseSpec s = streaming_case("prefetch_items", 2, 12, 12, 300, 300);  // 7-15 MB of Q, K, V and O
    SCOPED_TRACE(spec_string(s) + " " + std::string(dtype_name(dtype)));
    CaseData data(s, dtype, 31);
    expect_feature_keeps_the_bits(data, dtype, AttentionConfig{}, "", "prefetch-items", "fetched early");
  }
}

// A NaN in one key's V row reaches only the rows that see that key (a zero weight skips it), and a NaN score
// poisons only its own row.
TEST(FewRows, NonFiniteValuesStayInTheirRows) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Manual m(1, 4, 1, 1, 200, 64, 64, dtype);
    m.randomize(5);
    m.add_mask();
    for (std::int64_t d = 0; d < 64; ++d) m.set(m.v, m.v_at(0, 0, 150, d), std::numeric_limits<float>::quiet_NaN());
    for (std::int64_t h = 0; h < 4; ++h) {
      if (h != 2) m.mask_at(0, h, 0, 150) = -std::numeric_limits<float>::infinity();  // only head 2 sees key 150
    }
    m.set(m.q, m.q_at(0, 3, 0, 7), std::numeric_limits<float>::quiet_NaN());  // head 3's scores are NaN
    m.run();
    for (std::int64_t d = 0; d < 64; ++d) {
      EXPECT_TRUE(std::isfinite(m.out(0, 0, 0, d)));
      EXPECT_TRUE(std::isfinite(m.out(0, 1, 0, d)));
      EXPECT_TRUE(std::isnan(m.out(0, 2, 0, d)));
      EXPECT_TRUE(std::isnan(m.out(0, 3, 0, d)));
    }
  }
}

}  // namespace
}  // namespace attnkit::test
