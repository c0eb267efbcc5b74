// Every head dim and V dim on every CUDA kernel that accepts the problem (forced through the plan overrides, not
// only the plan's choice), against the float64 reference at the contract's tolerances: head dims 1-16, every
// multiple of 8 to 256 and odd ones, each with V dim equal and 64 / 128 / 256, float16 / bfloat16 / float32, plain,
// with causal + mask + key lengths and with causal + key lengths; bit-identical reruns and cut calls equal to whole calls.
#include <testing/case_data.hpp>
#include <testing/device_mirror.hpp>

#include "gpu_test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace attnkit::testing {
namespace {


std::vector<std::int64_t> swept_head_dims() {
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 1; d <= 16; ++d) dims.push_back(d);
  for (std::int64_t d = 24; d <= 256; d += 8) dims.push_back(d);
  for (std::int64_t d : {33, 57, 75, 99, 130, 191, 255}) dims.push_back(d);
  return dims;
}

AttentionConfig forced(const std::string& kernel, const std::string& off = "") {
  AttentionConfig c;
  c.backend = Backend::Cuda;
  if (!kernel.empty()) c.plan.kernel = kernel;
  if (!off.empty()) c.plan.off = {off};
  return c;
}

// The kernel `op` runs on ("tensor-core" for mma.sync), from its description.
std::string kernel_of(const Attention& op) {
  const std::string d = op.describe();
  return d.substr(5, d.find(' ') - 5);
}

// One problem on every kernel that accepts it; returns the kernels that ran.
std::vector<std::string> check_every_kernel(const CaseSpec& spec, DType t, bool rerun_and_cut) {
  CaseData data(spec, t, 1000 + static_cast<unsigned>(spec.head_dim * 7 + spec.v_head_dim));
  const auto ref = data.reference();
  DeviceMirror dev(data);
  std::vector<std::string> ran;
  // (The wgmma kernel up to five times: its K/V tiles by TMA and by the producer's copies, the plan picking one by
  // the rows, its bucket's full build beside a narrow one, and two blocks per SM beside three at head dim 64.)
  std::vector<std::pair<std::string, std::string>> plans{{"", ""}};
  for (const std::string& k : plan_kernel_names()) plans.push_back({k, ""});
  plans.push_back({"wgmma", "kv-tma"});
  plans.push_back({"wgmma", "kv-copies"});
  plans.push_back({"wgmma", "narrow"});
  plans.push_back({"wgmma", "three"});
  for (const auto& [k, off] : plans) {
    Attention op(data.problem(), forced(k, off));
    const std::string d = op.describe();
    const std::string variant = std::string(d.find("K/V by copies") != std::string::npos ? " (K/V by copies)" : "") +
                                (d.find("narrow MMAs") != std::string::npos ? " (narrow)" : "") +
                                (d.find("3 per SM") != std::string::npos ? " (3 per SM)" : "");
    const std::string kernel = kernel_of(op) + variant;
    const std::string wanted = (k == "mma" ? "tensor-core" : k) + variant;
    if ((!k.empty() && kernel != wanted) || std::find(ran.begin(), ran.end(), kernel) != ran.end()) continue;
    ran.push_back(kernel);
    dev.run(op);
    EXPECT_LE(data.scaled_error(ref), tolerance(t)) << op.describe();
    EXPECT_TRUE(data.gaps_untouched()) << op.describe();
    if (rerun_and_cut) {
      const auto first = data.output_bytes();
      dev.run(op);
      EXPECT_EQ(first, data.output_bytes()) << "two runs differ: " << op.describe();
      AttentionProblem cut = data.problem();
      cut.work_budget = 1;  // one block per launch
      Attention cut_op(cut, forced(k, off));
      dev.run(cut_op);
      EXPECT_EQ(first, data.output_bytes()) << "cut call differs from whole call: " << cut_op.describe();
    }
  }
  return ran;
}

TEST(CudaHeadDims, EveryHeadDimAndVDimOnEveryKernelThatAcceptsIt) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const std::int64_t d : swept_head_dims()) {
    for (const std::int64_t dv : {std::int64_t{0}, std::int64_t{64}, std::int64_t{128}, std::int64_t{256}}) {
      for (const DType t : {DType::f16, DType::bf16, DType::f32}) {
        // 0: no rule; 1: causal, a mask and key lengths; 2: causal and key lengths without a mask (what the
        // wgmma kernel's build of three blocks per SM takes besides the plain problems).
        for (const int extras : {0, 1, 2}) {
          CaseSpec spec;
          spec.name = "head dims";
          spec.batch = 2, spec.heads = 4, spec.kv_heads = 2, spec.q_len = 37, spec.k_len = 150;
          spec.head_dim = d;
          spec.v_head_dim = dv;
          spec.lse = true;
          spec.layout = extras ? LayoutKind::Padded : LayoutKind::PositionsFirst;
          if (extras) {
            spec.causal = true;
            spec.key_lengths = KeyLengths::Random;
          }
          if (extras == 1) spec.mask = MaskKind::Random;
          SCOPED_TRACE("d " + std::to_string(d) + " dv " + std::to_string(dv) + " " + std::string(dtype_name(t)) +
                       (extras == 1 ? " causal+mask+lengths" : extras == 2 ? " causal+lengths" : " plain"));
          const auto ran = check_every_kernel(spec, t, /*rerun_and_cut=*/dv == 0 && extras != 1);
          // float16 / bfloat16 never fall to the SIMT kernel: the plan's choice (first) is a tensor-core kernel.
          ASSERT_FALSE(ran.empty());
          if (t != DType::f32) EXPECT_NE(ran.front(), "simt");
        }
      }
    }
  }
}

// A few of the sweep's problems, small enough for compute-sanitizer (scripts/gpu-check runs memcheck, racecheck,
// initcheck and synccheck on it): head dims off every bucket edge and unequal pairs, on every kernel that accepts.
TEST(CudaHeadDims, ASmallSweepForTheSanitizers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Dims { std::int64_t d, dv; };
  for (const Dims dims : {Dims{8, 0}, Dims{40, 0}, Dims{72, 0}, Dims{99, 0}, Dims{136, 0}, Dims{192, 128},
                          Dims{64, 256}, Dims{255, 0}}) {
    for (const DType t : {DType::f16, DType::f32}) {
      CaseSpec spec;
      spec.name = "sanitized head dims";
      spec.batch = 1, spec.heads = 2, spec.kv_heads = 1, spec.q_len = 20, spec.k_len = 70;
      spec.head_dim = dims.d;
      spec.v_head_dim = dims.dv;
      spec.causal = true;
      spec.lse = true;
      spec.key_lengths = KeyLengths::Random;
      SCOPED_TRACE("d " + std::to_string(dims.d) + " dv " + std::to_string(dims.dv) + " " + std::string(dtype_name(t)));
      check_every_kernel(spec, t, /*rerun_and_cut=*/true);
    }
  }
}

}  // namespace
}  // namespace attnkit::testing
