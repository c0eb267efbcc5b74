// Every case of cases/*.json, in every dtype it lists, against the float64 reference at the contract
// tolerances; plus the checks that the case files keep covering what the contract asks for, and the API's
// own Reference backend on a few cases.
//
// One test per (case, dtype), generated from the JSON at discovery time (tests/CMakeLists.txt uses
// DISCOVERY_MODE PRE_TEST, so a case added to a file is picked up without rebuilding).
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::load_cases;
using testing::MaskKind;
using testing::tolerance;

// A seed per (case, dtype) that does not move when cases are added or reordered: FNV-1a of the name.
std::uint64_t seed_for(const std::string& name, DType t) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : name + "/" + std::string(dtype_name(t))) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

struct CaseParam {
  CaseSpec spec;
  DType dtype;
};

// What gtest prints for a parameter (instead of its bytes).
void PrintTo(const CaseParam& c, std::ostream* os) { *os << c.spec.name << " " << dtype_name(c.dtype); }

std::vector<CaseParam> all_params() {
  std::vector<CaseParam> out;
  for (const CaseSpec& s : load_cases())
    for (DType t : s.dtypes) out.push_back({s, t});
  return out;
}

std::string param_name(const ::testing::TestParamInfo<CaseParam>& info) {
  std::string n = info.param.spec.name + "_" + std::string(dtype_name(info.param.dtype));
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class CaseFiles : public ::testing::TestWithParam<CaseParam> {};

// The case against the float64 reference: scaled error within the dtype's bound, the LSE within
// cpu_lse_tolerance (NaN and -inf rows must match exactly: lse_error gives inf otherwise), every element the
// layouts reach written, every other element of the O and LSE buffers still poisoned.
TEST_P(CaseFiles, MatchesReference) {
  const CaseSpec& spec = GetParam().spec;
  const DType t = GetParam().dtype;
  const std::uint64_t seed = seed_for(spec.name, t);
  SCOPED_TRACE(spec_string(spec) + " dtype=" + std::string(dtype_name(t)) + " seed=" + std::to_string(seed));
  CaseData data(spec, t, seed);
  const auto ref = data.reference();
  const Outcome r = run_and_measure(data, ref);
  std::printf("%-36s %-8s err %.2e  lse err %.2e  %s\n", spec.name.c_str(), std::string(dtype_name(t)).c_str(), r.err,
              r.lse_err, r.describe.c_str());
  EXPECT_LE(r.err, tolerance(t));
  EXPECT_LE(r.lse_err, cpu_lse_tolerance(t));
  EXPECT_TRUE(r.gaps_untouched);
  EXPECT_EQ(r.unwritten, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, CaseFiles, ::testing::ValuesIn(all_params()), param_name);

// ---- the API's Reference backend ----
//
// Backend::Reference rounds the float64 result into the caller's buffers, so its only error is that
// rounding: float64 -> float32 (2^-24 relative) and, for half types, float32 -> dtype (the dtype's unit
// roundoff). The bound is that sum, far tighter than the contract tolerances.
double unit_roundoff(DType t) {
  switch (t) {
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
  }
  return 0.0;
}

TEST(ReferenceBackend, RoundsTheFloat64Result) {
  const std::vector<std::string> names{"layout_padded_causal_mask", "head_sink_gqa_causal_window", "mask_masked_rows_zero",
                                       "k_len_0_nan", "split_decode_key_lengths", "gqa_rows_cross_blocks"};
  std::map<std::string, CaseSpec> by_name;
  for (const CaseSpec& s : load_cases()) by_name[s.name] = s;
  for (const std::string& name : names) {
    ASSERT_TRUE(by_name.count(name)) << name << " is missing from cases/edges.json";
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      const CaseSpec& spec = by_name[name];
      SCOPED_TRACE(spec_string(spec) + " dtype=" + std::string(dtype_name(t)));
      CaseData data(spec, t, seed_for(name, t));
      const auto ref = data.reference();
      AttentionConfig config;
      config.backend = Backend::Reference;
      const Outcome r = run_and_measure(data, ref, config);
      EXPECT_EQ(r.describe.rfind("reference", 0), 0u) << r.describe;
      EXPECT_LE(r.err, unit_roundoff(t) + 0x1p-23);
      EXPECT_LE(r.lse_err, 0x1p-23);
      EXPECT_TRUE(r.gaps_untouched);
      EXPECT_EQ(r.unwritten, 0);
    }
  }
}

// ---- half-type outputs are rounded to nearest ----
//
// With float32 accumulation, a float16 / bfloat16 output element is a float32 result r (within the float32
// bound of the exact value x: |r - x| <= 1e-5 max|x|) rounded to nearest: |out - r| <= u |r| (u = 2^-11 /
// 2^-8, half an ulp; plus 2^-25 for float16 subnormals). So |out - x| <= u |x| + (1 + u) 1e-5 max|x|, element
// by element. The scaled-error bound alone (8e-3 for bfloat16) would also pass a truncating conversion
// (up to a whole ulp, 2^-7 |x|); this per-element bound does not. (bfloat16 on the CPU's AMX tiles rounds P to
// bfloat16 by default, as the GPU kernels do: "off=rounded-p" keeps all of P's bits, which is what this checks.)
TEST(HalfOutputs, RoundedToNearestElementByElement) {
  AttentionConfig all_of_p;
  all_of_p.plan = parse_plan_overrides("off=rounded-p");
  const std::vector<std::string> names{"layout_padded_causal_mask", "gqa_8_2", "split_decode", "v_head_dim_17_100",
                                       "head_sink_gqa_causal_window", "bert_b1_s128"};
  std::map<std::string, CaseSpec> by_name;
  for (const CaseSpec& s : load_cases()) by_name[s.name] = s;
  for (const std::string& name : names) {
    ASSERT_TRUE(by_name.count(name)) << name;
    for (DType t : {DType::f16, DType::bf16}) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(t)));
      CaseData data(by_name[name], t, seed_for(name, t) + 1);
      const auto ref = data.reference();
      data.poison_outputs();
      Attention(data.problem(), all_of_p).run(data.args());
      const AttentionProblem p = core::normalize_and_check(data.problem());
      const void* o = data.args().o.data;
      double top = 0.0;
      for (double r : ref.out)
        if (std::isfinite(r)) top = std::max(top, std::abs(r));
      const double u = t == DType::f16 ? 0x1p-11 : 0x1p-8;
      const double slack = (1 + u) * 1e-5 * top + (t == DType::f16 ? 0x1p-25 : 0.0);
      std::size_t at = 0;
      std::int64_t bad = 0;
      for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t h = 0; h < p.heads; ++h)
          for (std::int64_t i = 0; i < p.q_len; ++i)
            for (std::int64_t d = 0; d < p.v_head_dim; ++d, ++at) {
              const double x = ref.out[at];
              if (!std::isfinite(x)) continue;
              const double out = load_as_float(o, t, p.o.index(b, h, i) + d);
              if (!(std::abs(out - x) <= u * std::abs(x) + slack)) {
                if (bad++ < 5) ADD_FAILURE() << "element (" << b << ", " << h << ", " << i << ", " << d << "): " << out
                                             << " vs exact " << x << ", more than half an ulp away";
              }
            }
      EXPECT_EQ(bad, 0);
    }
  }
}

// ---- the case files themselves ----

std::vector<CaseSpec> tagged(const std::string& tag) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& s : load_cases())
    if (s.has_tag(tag)) out.push_back(s);
  return out;
}

TEST(CaseFiles, NamesAreUnique) {
  std::set<std::string> seen;
  for (const CaseSpec& s : load_cases()) EXPECT_TRUE(seen.insert(s.name).second) << "duplicate case " << s.name << " in " << s.file;
}

// The reference model shapes of the seed, exactly, in all three dtypes, positions-first, tagged for the
// tests and the benchmark.
TEST(CaseFiles, ModelShapesArePresent) {
  struct Shape {
    const char* name;
    std::int64_t batch, heads, q_len, k_len, head_dim;
    bool causal;
  };
  const Shape shapes[] = {
      {"minilm_b1_s128", 1, 12, 128, 128, 32, false}, {"minilm_b8_s128", 8, 12, 128, 128, 32, false},
      {"bert_b1_s128", 1, 12, 128, 128, 64, false},   {"bert_b1_s512", 1, 12, 512, 512, 64, false},
      {"bert_b8_s128", 8, 12, 128, 128, 64, false},   {"bert_b8_s512", 8, 12, 512, 512, 64, false},
      {"whisper_enc_1500", 1, 12, 1500, 1500, 64, false}, {"whisper_dec_448", 1, 12, 1, 448, 64, true},
      {"whisper_cross_1q", 1, 12, 1, 1500, 64, false},
  };
  std::map<std::string, CaseSpec> models;
  for (const CaseSpec& s : tagged("model")) models[s.name] = s;
  for (const Shape& want : shapes) {
    SCOPED_TRACE(want.name);
    ASSERT_TRUE(models.count(want.name));
    const CaseSpec& s = models[want.name];
    EXPECT_EQ(s.file, "models.json");
    EXPECT_TRUE(s.has_tag("bench"));
    EXPECT_EQ(s.batch, want.batch);
    EXPECT_EQ(s.heads, want.heads);
    EXPECT_TRUE(s.kv_heads == 0 || s.kv_heads == s.heads);
    EXPECT_EQ(s.q_len, want.q_len);
    EXPECT_EQ(s.k_len, want.k_len);
    EXPECT_EQ(s.head_dim, want.head_dim);
    EXPECT_TRUE(s.v_head_dim == 0 || s.v_head_dim == s.head_dim);
    EXPECT_EQ(s.causal, want.causal);
    EXPECT_FALSE(s.causal_offset.has_value());  // the decoder step uses the default offset k_len - q_len
    EXPECT_EQ(s.layout, LayoutKind::PositionsFirst);
    EXPECT_EQ(s.mask, MaskKind::None);
    EXPECT_EQ(s.dtypes, (std::vector<DType>{DType::f32, DType::f16, DType::bf16}));
  }
}

// The edge list must keep covering every item the contract and the brief name; a case removed or changed
// so that an item loses its last case fails here, naming the item.
TEST(CaseFiles, EdgesCoverTheContract) {
  const std::vector<CaseSpec> edges = tagged("edge");
  auto any = [&](const char* what, auto pred) {
    EXPECT_TRUE(std::any_of(edges.begin(), edges.end(), pred)) << "no edge case covers: " << what;
  };
  for (std::int64_t k : {1, 63, 64, 65, 127, 128, 129})
    any(("k_len " + std::to_string(k)).c_str(), [&](const CaseSpec& s) { return s.k_len == k && s.q_len > 0; });
  for (std::int64_t q : {1, 63, 64, 65, 127})
    any(("q_len " + std::to_string(q)).c_str(), [&](const CaseSpec& s) { return s.q_len == q && s.k_len > 0; });
  for (std::int64_t d : {1, 3, 17, 33, 65, 129, 255, 256})
    any(("head_dim " + std::to_string(d)).c_str(), [&](const CaseSpec& s) { return s.head_dim == d; });
  any("size 1", [](const CaseSpec& s) {
    return s.batch == 1 && s.heads == 1 && s.q_len == 1 && s.k_len == 1 && s.head_dim == 1;
  });
  any("v_head_dim != head_dim", [](const CaseSpec& s) { return s.v_head_dim != 0 && s.v_head_dim != s.head_dim; });
  // A pair, not a structured binding: clang 14 cannot capture a binding in a lambda (C++20 allows it).
  for (const std::pair<int, int> heads : {std::pair{8, 2}, {6, 3}, {16, 1}, {32, 8}})
    any(("grouped heads " + std::to_string(heads.first) + "/" + std::to_string(heads.second)).c_str(),
        [&](const CaseSpec& s) { return s.heads == heads.first && s.kv_heads == heads.second; });
  for (LayoutKind l : {LayoutKind::HeadFirst, LayoutKind::PositionsFirst, LayoutKind::PackedQkv, LayoutKind::Padded,
                       LayoutKind::BroadcastKv})
    any(("layout " + testing::layout_name(l)).c_str(), [&](const CaseSpec& s) { return s.layout == l; });
  for (MaskKind m : {MaskKind::KeyPadding, MaskKind::Random, MaskKind::RandomShared, MaskKind::MaskedRows})
    any(("mask " + testing::mask_name(m)).c_str(), [&](const CaseSpec& s) { return s.mask == m; });
  any("key lengths random", [](const CaseSpec& s) { return s.key_lengths == KeyLengths::Random; });
  any("key lengths zero", [](const CaseSpec& s) { return s.key_lengths == KeyLengths::Zero; });
  any("k_len 0", [](const CaseSpec& s) { return s.k_len == 0 && s.q_len > 0; });
  any("q_len 0", [](const CaseSpec& s) { return s.q_len == 0; });
  any("causal, explicit offset", [](const CaseSpec& s) { return s.causal && s.causal_offset && *s.causal_offset > 0; });
  any("causal, negative offset", [](const CaseSpec& s) { return s.causal && s.causal_offset && *s.causal_offset < 0; });
  any("causal, default offset", [](const CaseSpec& s) { return s.causal && !s.causal_offset; });
  any("per-batch causal offsets", [](const CaseSpec& s) { return s.causal_offsets && s.batch > 1; });
  any("per-batch causal offsets, split-K sized", [](const CaseSpec& s) { return s.causal_offsets && s.k_len >= 512; });
  any("window", [](const CaseSpec& s) { return s.window.has_value(); });
  any("softcap", [](const CaseSpec& s) { return s.softcap.has_value(); });
  any("head sink", [](const CaseSpec& s) { return s.head_sink; });
  any("head sink, no visible key", [](const CaseSpec& s) { return s.head_sink && s.key_lengths == KeyLengths::Zero; });
  any("masked rows nan", [](const CaseSpec& s) { return s.mask == MaskKind::MaskedRows && s.masked_rows == MaskedRows::Nan; });
  any("masked rows zero", [](const CaseSpec& s) { return s.mask == MaskKind::MaskedRows && s.masked_rows == MaskedRows::Zero; });
  any("lse", [](const CaseSpec& s) { return s.lse; });
  any("split-K sized (q_len 1, k_len >= 512)", [](const CaseSpec& s) { return s.q_len == 1 && s.k_len >= 512; });
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    any(("dtype " + std::string(dtype_name(t))).c_str(), [&](const CaseSpec& s) {
      return std::find(s.dtypes.begin(), s.dtypes.end(), t) != s.dtypes.end();
    });
}

}  // namespace
}  // namespace attnkit::test
