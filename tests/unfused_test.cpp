// The fused op against the unfused chain it replaces (GEMM + add + softmax + GEMM on OpenBLAS,
// testing::UnfusedBlas), on the same inputs: both are measured against the float64 reference, both errors
// are printed, and the fused one must be within the contract tolerance and not materially worse than the
// unfused one (the contract: "never worse than GEMM + softmax + GEMM on the same inputs").
#include "test_support.hpp"

#include <testing/unfused_blas.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

namespace attnkit::test {
namespace {

using testing::load_cases;
using testing::tolerance;
using testing::UnfusedBlas;

struct Errors {
  double fused, unfused, fused_lse, unfused_lse;
};

Errors measure(const CaseSpec& spec, DType t, std::uint64_t seed) {
  CaseData data(spec, t, seed);
  const auto ref = data.reference();
  Errors e{};
  const Outcome fused = run_and_measure(data, ref);
  EXPECT_TRUE(fused.gaps_untouched);
  EXPECT_EQ(fused.unwritten, 0);
  e.fused = fused.err;
  e.fused_lse = fused.lse_err;

  data.poison_outputs();
  UnfusedBlas unfused(core::normalize_and_check(data.problem()), 0);
  unfused.run(data.args());
  e.unfused = data.scaled_error(ref);
  e.unfused_lse = data.lse_error(ref);
  std::printf("%-28s %-8s fused %.2e  unfused %.2e  ratio %.2f   lse: fused %.2e unfused %.2e\n", spec.name.c_str(),
              std::string(dtype_name(t)).c_str(), e.fused, e.unfused, e.fused / e.unfused, e.fused_lse, e.unfused_lse);
  return e;
}

// How much worse than the unfused chain the fused op may be. Measured on this file's float32 cases over
// five seeds (AVX-512 target), the ratio fused / unfused ranged from 0.3 to 1.6, the high end only where
// both errors are below 5e-7 (a few float32 ulps of the largest output, where which path is closer on a
// given seed is luck); above 7e-7 it stayed below 1.45. A factor 2 allows that luck and still fails an
// accumulation that really is worse: a plain running sum over thousands of keys loses a factor 3-10 (the
// seed's measurement at 4096 keys).
constexpr double kWorseFactor = 2.0;
// Below this both errors are rounding of the output itself (a handful of float32 ulps): comparing ratios
// of two numbers that small compares noise, so the ratio is not asserted there.
constexpr double kFloor = 4e-7;

void expect_not_worse(const Errors& e, DType t) {
  EXPECT_LE(e.fused, tolerance(t));
  EXPECT_LE(e.fused, std::max(kWorseFactor * e.unfused, t == DType::f32 ? kFloor : 0.0))
      << "fused " << e.fused << " vs unfused " << e.unfused;
}

// The reference model shapes in float32, where the two paths differ only in summation order (in half
// types both round the same float32 result to the same 8 or 11 bits, so the comparison says little; one
// model shape checks them anyway).
TEST(FusedVsUnfused, ModelShapesFloat32) {
  for (const CaseSpec& spec : load_cases()) {
    if (!spec.has_tag("model")) continue;
    SCOPED_TRACE(spec_string(spec));
    expect_not_worse(measure(spec, DType::f32, 7), DType::f32);
  }
}

TEST(FusedVsUnfused, ModelShapeHalfTypes) {
  for (const CaseSpec& spec : load_cases()) {
    if (spec.name != "bert_b1_s512") continue;
    for (DType t : {DType::f16, DType::bf16}) {
      SCOPED_TRACE(spec_string(spec) + " " + std::string(dtype_name(t)));
      const Errors e = measure(spec, t, 8);
      EXPECT_LE(e.fused, tolerance(t));
      // Both round the float32 result to the dtype: the fused one may not be worse by more than the
      // dtype's rounding of the largest output (half an ulp at 1.0).
      EXPECT_LE(e.fused, e.unfused + (t == DType::f16 ? 0x1p-11 : 0x1p-8));
    }
  }
}

// Many keys with spread scores: where a single running sum would fall behind the unfused chain.
TEST(FusedVsUnfused, LongKeysFloat32) {
  const struct {
    const char* name;
    std::int64_t heads, q_len, k_len;
    double std_dev;
  } shapes[] = {
      {"k4096_std1", 4, 16, 4096, 1.0},   {"k4096_std2", 4, 16, 4096, 2.0},   {"k4096_std2.5", 4, 16, 4096, 2.5},
      {"k16384_std1", 2, 4, 16384, 1.0},  {"k16384_std2", 2, 4, 16384, 2.0},
      {"k4096_std2_many_rows", 64, 2, 4096, 2.0},  // 64 row blocks: no split-K, one item walks every key
  };
  for (const auto& s : shapes) {
    CaseSpec spec;
    spec.name = s.name;
    spec.heads = s.heads;
    spec.q_len = s.q_len;
    spec.k_len = s.k_len;
    spec.head_dim = 64;
    spec.input_std = s.std_dev;
    SCOPED_TRACE(spec_string(spec));
    expect_not_worse(measure(spec, DType::f32, 9), DType::f32);
  }
}

// Masks, grouped heads and the rest of the options, on the edge cases that carry them: the unfused chain
// implements the same rules, so the comparison holds there too.
TEST(FusedVsUnfused, EdgeCasesWithOptions) {
  const std::vector<std::string> names{"layout_padded_causal_mask", "gqa_rows_cross_blocks", "softcap_mask_causal",
                                       "head_sink_gqa_causal_window", "split_decode_key_lengths", "mask_masked_rows",
                                       "window_offset_key_lengths", "wide_scores_std3"};
  std::map<std::string, CaseSpec> by_name;
  for (const CaseSpec& s : load_cases()) by_name[s.name] = s;
  for (const std::string& name : names) {
    ASSERT_TRUE(by_name.count(name)) << name;
    SCOPED_TRACE(spec_string(by_name[name]));
    expect_not_worse(measure(by_name[name], DType::f32, 10), DType::f32);
  }
}

}  // namespace
}  // namespace attnkit::test
