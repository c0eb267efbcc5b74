// The CUDA backend against the float64 reference on every case of cases/*.json, plus the properties every
// backend owes: bit-identical reruns, cut calls equal to whole calls, bad key lengths rejected with nothing
// written. Inputs are the CPU tests' (CaseData), copied to the device by DeviceMirror; outputs come back into
// CaseData.
#include <testing/case_data.hpp>
#include <testing/device_mirror.hpp>

#include "forced_plan.hpp"
#include "gpu_test_support.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace attnkit::testing {
namespace {

// Whether the device is a compute capability 9.0 part (the wgmma kernel's).
bool hopper_device() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0 &&
         forced_plan().empty();
}

// Whether `op`'s plan runs on kernel `name` (of plan_kernel_names()): a forced kernel runs only where it
// accepts the problem.
bool runs_on(const Attention& op, const std::string& name) {
  const std::string shown = name == "mma" ? "tensor-core" : name;
  return op.describe().rfind("cuda." + shown + " ", 0) == 0;
}

// `op` run again, and its problem run cut into one-block launches by the work budget (with the same plan
// overrides `plan` as op), give `first`'s bytes.
void expect_rerun_and_cut_equal(CaseData& data, DeviceMirror& dev, Attention& op, const std::vector<std::byte>& first,
                                const std::string& plan = "") {
  dev.run(op);
  EXPECT_EQ(first, data.output_bytes()) << "two runs differ";
  AttentionProblem cut_problem = data.problem();
  cut_problem.work_budget = 1;  // one block per launch
  Attention cut(cut_problem, cuda_config(plan));
  dev.run(cut);
  EXPECT_EQ(first, data.output_bytes()) << "cut call differs from whole call: " << cut.describe();
}

// Every case on the plan's kernel and on every other kernel of the registry that accepts it (forced through the
// plan overrides): each against the reference, the gaps untouched.
TEST(CudaAttention, EveryCaseMatchesTheReferenceOnEveryKernel) {
  SKIP_WITHOUT_GPU();
  for (const CaseSpec& spec : load_cases()) {
    for (DType t : spec.dtypes) {
      SCOPED_TRACE(spec.file + ": " + spec.name + " " + std::string(dtype_name(t)));
      CaseData data(spec, t, 20261129);
      const auto ref = data.reference();
      DeviceMirror dev(data);
      std::vector<std::string> plans{""};
      for (const std::string& k : plan_kernel_names()) plans.push_back("kernel=" + k);
      plans.push_back("kernel=wgmma,off=three");  // (two blocks per SM where the plan runs three)
      std::vector<std::string> seen;
      for (const std::string& plan : plans) {
        Attention op(data.problem(), cuda_config(plan));
        const std::string kernel = plan.empty() ? "" : plan.substr(7, plan.find(',') - 7);
        if (!plan.empty() && (!runs_on(op, kernel) ||
                              std::find(seen.begin(), seen.end(), op.describe()) != seen.end())) {
          continue;  // (the kernel declines the problem, or ran already as the plan's choice)
        }
        seen.push_back(op.describe());
        dev.run(op);
        const double err = data.scaled_error(ref);
        std::printf("%-32s %-9s err %.2e (bound %.0e)  %s\n", spec.name.c_str(), std::string(dtype_name(t)).c_str(),
                    err, tolerance(t), op.describe().c_str());
        EXPECT_LE(err, tolerance(t)) << op.describe();
        // The LSE is a float32 output, but half/bfloat16 kernels sum probabilities rounded to the element type
        // (so numerator and denominator agree), which moves it by about the element type's rounding.
        EXPECT_LE(data.lse_error(ref), t == DType::f32 ? 1e-5 : tolerance(t)) << op.describe();
        EXPECT_TRUE(data.gaps_untouched()) << op.describe();
      }
    }
  }
}

// Two runs, and a run cut into many launches by the work budget, give the same bytes.
TEST(CudaAttention, DeterministicAndCutEqualsWhole) {
  SKIP_WITHOUT_GPU();
  struct Shape { std::int64_t batch, heads, kv, q, k, d; bool causal; };
  for (const Shape s : {Shape{2, 8, 2, 1, 5000, 64, true}, Shape{1, 12, 12, 300, 300, 64, false},
                        Shape{2, 4, 1, 77, 129, 40, true}}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "det";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = s.q; spec.k_len = s.k;
      spec.head_dim = s.d; spec.causal = s.causal; spec.lse = true; spec.mask = MaskKind::Random;
      SCOPED_TRACE(std::to_string(s.k) + " keys, " + std::string(dtype_name(t)));
      CaseData data(spec, t, 7);
      Attention whole(data.problem(), cuda_config());
      DeviceMirror dev(data);
      dev.run(whole);
      const auto first = data.output_bytes();
      expect_rerun_and_cut_equal(data, dev, whole, first);
      EXPECT_LE(data.scaled_error(data.reference()), tolerance(t));
    }
  }
}

// On sm_90 the mma.sync kernel merges a split's ranges inside a thread-block cluster (CudaPlan::cluster_merge):
// the merge pass's bytes (off=cluster; splits= gives both the same ranges: 4 over 448 keys
// in granules of 64, 6 over 1000, 16 over 1024), against the reference with the LSE and the gaps untouched, and
// the same bytes again when cut into one-cluster launches.
// Shapes: Whisper's decoder step (causal, its query sees every key: the plain build on sm_90), and GQA rows (several per block, folded by different blocks of a cluster) with
// a causal rule, random key lengths (ranges with no key), a mask, a softcap, masked rows as zeros and head sinks.
TEST(CudaAttention, ClusterMergeGivesTheMergePassBits) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0));
  struct Shape { std::int64_t batch, heads, kv, q, k, d; bool causal, extras; const char* splits; };
  // (the last: 16 ranges of 64 keys, the largest cluster)
  for (const Shape s : {Shape{1, 12, 12, 1, 448, 64, true, false, "6"}, Shape{2, 8, 2, 5, 1000, 128, true, true, "6"},
                        Shape{3, 6, 3, 7, 1024, 32, false, true, "16"}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "cluster";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = s.q; spec.k_len = s.k;
      spec.head_dim = s.d; spec.causal = s.causal; spec.lse = true;
      if (s.extras) {
        spec.key_lengths = KeyLengths::Random;
        spec.mask = MaskKind::Random;
        spec.softcap = 30.0f;
        spec.masked_rows = MaskedRows::Zero;
        spec.head_sink = s.d == 32;
      }
      SCOPED_TRACE(std::to_string(s.q) + " x " + std::to_string(s.k) + " d " + std::to_string(s.d) + " " +
                   std::string(dtype_name(t)));
      CaseData data(spec, t, 53);
      const auto ref = data.reference();
      DeviceMirror dev(data);
      const std::string forced = std::string("kernel=mma,splits=") + s.splits;
      Attention clustered(data.problem(), cuda_config(forced));
      Attention merged(data.problem(), cuda_config(forced + ",off=cluster"));
      const std::string kernel = clustered.describe();
      if (prop.major == 9 && prop.minor == 0) {
        EXPECT_NE(kernel.find("split-k"), std::string::npos) << kernel;
        EXPECT_NE(kernel.find("cluster merge"), std::string::npos) << kernel;
      }
      EXPECT_EQ(merged.describe().find("cluster"), std::string::npos) << merged.describe();
      dev.run(clustered);
      const auto first = data.output_bytes();
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
      EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
      EXPECT_TRUE(data.gaps_untouched());
      expect_rerun_and_cut_equal(data, dev, clustered, first, forced);
      dev.run(merged);
      EXPECT_EQ(first, data.output_bytes()) << kernel << " against " << merged.describe();
    }
  }
}

// The tile kernels' plain build (CudaPlan::plain: no mask, rule, softcap, sink or split compiled in) gives the
// bits of their general build (off=plain) on plain problems: partial tiles, padded row blocks, GQA,
// a layout with gaps, one key, and the LSE; both against the reference, the gaps untouched. (The wgmma plain
// build takes Q by TMA where a block's rows (64 at head dim 64, else 128) are a multiple of the group and by
// cp.async elsewhere; the general build always by cp.async.)
TEST(CudaAttention, PlainBuildGivesTheGeneralBuildsBits) {
  SKIP_WITHOUT_GPU();
  struct Shape { std::int64_t batch, heads, kv, q, k, d; LayoutKind layout; };
  for (const Shape s : {Shape{1, 12, 12, 128, 128, 32, LayoutKind::HeadFirst},
                        Shape{2, 8, 2, 77, 129, 64, LayoutKind::Padded},
                        Shape{8, 12, 12, 128, 128, 64, LayoutKind::HeadFirst},
                        Shape{1, 4, 4, 300, 1500, 64, LayoutKind::PositionsFirst},
                        Shape{2, 4, 1, 65, 1, 128, LayoutKind::HeadFirst},
                        Shape{1, 16, 16, 200, 333, 128, LayoutKind::HeadFirst},
                        // the wgmma plain build's Q: group 3 (cp.async, 64 % 3 != 0), group 8 (TMA boxes of 8
                        // heads x 16 queries, rows past the queries' end read as zeros)
                        Shape{2, 24, 8, 150, 257, 64, LayoutKind::HeadFirst},
                        Shape{2, 32, 4, 100, 300, 128, LayoutKind::PositionsFirst},
                        // 288 row blocks of 64 at head dim 64: three blocks per SM on an H200 (128-key tiles,
                        // one at a time)
                        Shape{3, 12, 12, 512, 300, 64, LayoutKind::HeadFirst},
                        // Whisper's decoder steps: split, merged in clusters on sm_90 (the merge pass elsewhere)
                        Shape{1, 12, 12, 1, 448, 64, LayoutKind::HeadFirst},
                        Shape{2, 12, 12, 1, 1500, 64, LayoutKind::PositionsFirst}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "plain";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = s.q; spec.k_len = s.k;
      spec.head_dim = s.d; spec.layout = s.layout; spec.lse = true;
      SCOPED_TRACE(std::to_string(s.q) + " x " + std::to_string(s.k) + " d " + std::to_string(s.d) + " " +
                   std::string(dtype_name(t)));
      CaseData data(spec, t, 31);
      DeviceMirror dev(data);
      Attention plain(data.problem(), cuda_config());
      const std::string kernel = plain.describe();
      const bool tiles = kernel.find("wgmma") != std::string::npos || kernel.find("tensor-core") != std::string::npos;
      // A split merged by the merge pass (the decoder steps with the wgmma kernel forced, or off sm_90) keeps the
      // general build: the plain one takes a split only merged in clusters or as a split tail.
      const bool merge_pass =
          kernel.find("split-k") != std::string::npos && kernel.find("cluster merge") == std::string::npos;
      // (Padded rows may start on odd elements: no pairs)
      if (tiles && s.layout != LayoutKind::Padded && !merge_pass) {
        EXPECT_NE(kernel.find("plain"), std::string::npos) << kernel;
      }
      dev.run(plain);
      const auto plain_bytes = data.output_bytes();
      EXPECT_LE(data.scaled_error(data.reference()), tolerance(t)) << kernel;
      EXPECT_TRUE(data.gaps_untouched());
      Attention general(data.problem(), cuda_config("off=plain"));
      EXPECT_EQ(general.describe().find("plain"), std::string::npos) << general.describe();
      dev.run(general);
      EXPECT_EQ(plain_bytes, data.output_bytes()) << kernel << " against " << general.describe();
    }
  }
}

// A decode step with device key lengths: its key split runs on the wgmma kernel's plain build as a split tail
// from row block 0, each piece ending at its entry's length (an empty piece reads no tile), and gives the general
// build's bits (off=plain) and the reference's values. The cache past each length holds NaN (a serving cache's
// unwritten rows): neither K's scores nor V's rows there may reach the output. Lengths 0 (masked rows: NaN, or
// zeros under MaskedRows::Zero), 1, k_len and random ones; GQA 4:1 at head dims 128 and 64 (mma.sync's cluster
// merge there), 32:1, and 64:1 at head dim 64; the LSE; a rerun
// and the call cut into one-block launches give the same bytes.
TEST(CudaAttention, PlainDecodeSplitWithDeviceKeyLengthsGivesTheGeneralBuildsBits) {
  SKIP_WITHOUT_GPU();
  struct Shape { std::int64_t batch, heads, kv, k, d; MaskedRows masked; };
  for (const Shape s : {Shape{4, 32, 8, 5000, 128, MaskedRows::Nan}, Shape{5, 16, 4, 3000, 64, MaskedRows::Zero},
                        Shape{3, 32, 1, 9000, 128, MaskedRows::Nan}, Shape{8, 64, 1, 8192, 64, MaskedRows::Zero}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "lengths";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = 1; spec.k_len = s.k;
      spec.head_dim = s.d; spec.causal = true; spec.lse = true; spec.key_lengths = KeyLengths::Random;
      spec.masked_rows = s.masked;
      SCOPED_TRACE(std::to_string(s.batch) + " x " + std::to_string(s.k) + " d " + std::to_string(s.d) + " " +
                   std::string(dtype_name(t)));
      CaseData data(spec, t, 59);
      std::vector<std::int32_t> lengths = data.key_lengths();
      lengths[0] = 0;
      lengths[1] = static_cast<std::int32_t>(s.k);
      lengths[2] = 1;
      data.set_key_lengths(lengths);
      const auto ref = data.reference();
      DeviceMirror dev(data);
      AttentionArgs& args = dev.device_args();  // (the lengths above, uploaded with the case)
      // NaN (all-ones bits) in every K and V row past its entry's length, on the device only.
      const AttentionProblem& p = data.problem();
      const std::size_t es = dtype_size(t);
      for (std::int64_t b = 0; b < s.batch; ++b) {
        for (std::int64_t h = 0; h < s.kv; ++h) {
          const std::int64_t rows = s.k - lengths[b];
          if (rows == 0) continue;
          for (const auto& [buffer, layout] : {std::pair{args.k.data, p.k}, std::pair{args.v.data, p.v}}) {
            auto* at = static_cast<char*>(const_cast<void*>(buffer)) + layout.index(b, h, lengths[b]) * es;
            check(cudaMemset(at, 0xff, ((rows - 1) * layout.row_stride + s.d) * es));
          }
        }
      }
      Attention plain(p, cuda_config());
      const std::string kernel = plain.describe();
      if (kernel.find("wgmma") != std::string::npos) {  // (the d64 group of 4 takes mma.sync's cluster merge)
        EXPECT_NE(kernel.find("plain"), std::string::npos) << kernel;
        EXPECT_NE(kernel.find("tail"), std::string::npos) << kernel;
      }
      dev.run(plain);
      const auto first = data.output_bytes();
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
      EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
      EXPECT_TRUE(data.gaps_untouched());
      expect_rerun_and_cut_equal(data, dev, plain, first);
      Attention general(p, cuda_config("off=plain"));
      EXPECT_EQ(general.describe().find("plain"), std::string::npos) << general.describe();
      dev.run(general);
      EXPECT_EQ(first, data.output_bytes()) << kernel << " against " << general.describe();
    }
  }
}

// A decode step whose group does not divide the wgmma kernel's block rows (64 at head dim 64, 128 at 128: groups
// of 5, 7, 12 and 71) takes Q by TMA as the block's run of heads, the rows past its group other groups' heads (or
// zeros past the last head), computed and never stored. Forced onto the wgmma kernel, in its plain build (the
// decode split as a split tail) and its general one (off=plain), with and without device key lengths: the
// reference's values and LSE, and the same bytes from both builds (positions-first tensors, as a serving cache
// keeps them: Q's rows are on 16 bytes, as the TMA needs).
TEST(CudaAttention, DecodeStepsOfAnyGroupTakeQByTmaOnTheWgmmaKernel) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) GTEST_SKIP() << "the wgmma kernel needs compute 9.0";
  struct Shape { std::int64_t batch, heads, kv, k, d; bool lengths; };
  for (const Shape s : {Shape{3, 71, 1, 1500, 64, false}, Shape{2, 71, 1, 700, 64, true},
                        Shape{2, 28, 4, 2000, 128, false}, Shape{3, 40, 8, 1100, 128, true},
                        Shape{2, 24, 2, 900, 64, false}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "decode-group";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = 1; spec.k_len = s.k;
      spec.head_dim = s.d; spec.causal = true; spec.lse = true; spec.layout = LayoutKind::PositionsFirst;
      if (s.lengths) spec.key_lengths = KeyLengths::Random;
      SCOPED_TRACE("group " + std::to_string(s.heads / s.kv) + " d " + std::to_string(s.d) + " " +
                   std::string(dtype_name(t)) + (s.lengths ? " key lengths" : ""));
      CaseData data(spec, t, 83);
      const auto ref = data.reference();
      DeviceMirror dev(data);
      Attention plain(data.problem(), cuda_config("kernel=wgmma"));
      const std::string kernel = plain.describe();
      ASSERT_NE(kernel.find("wgmma"), std::string::npos) << kernel;
      dev.run(plain);
      const auto first = data.output_bytes();
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
      EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
      EXPECT_TRUE(data.gaps_untouched());
      Attention general(data.problem(), cuda_config("kernel=wgmma,off=plain"));
      dev.run(general);
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << general.describe();
      EXPECT_TRUE(data.gaps_untouched());
      if (kernel.find("plain") != std::string::npos) {
        EXPECT_EQ(first, data.output_bytes()) << kernel << " against " << general.describe();
      }
    }
  }
}

// The plain build of three blocks per SM (head dim 64) runs a persistent grid where it has more blocks than places
// and a full enough last round (CudaPlan::persistent_places): each block runs several units of work, its K/V ring
// and Q barrier carrying on
// from one to the next. Against the reference (O, the LSE, the gaps untouched), and the same bytes as one block
// per unit (off=persistent), as a grid of 7 blocks and as the call cut into launches of 450 blocks,
// each persistent again.
// Shapes (on 396 places): 768 units of 3 tiles (the last partial); group 8 with padded last row blocks, 1,120
// units (two or three per block); 5 tiles per unit, so that consecutive units start on different slots of the
// ring.
TEST(CudaAttention, PersistentGridGivesOneBlockPerUnitsBits) {
  SKIP_WITHOUT_GPU();
  const bool hopper = hopper_device();
  struct Shape { std::int64_t batch, heads, kv, q, k; LayoutKind layout; };
  for (const Shape s : {Shape{8, 12, 12, 512, 300, LayoutKind::HeadFirst},
                        Shape{4, 32, 4, 555, 257, LayoutKind::PositionsFirst},
                        Shape{3, 16, 16, 1000, 640, LayoutKind::HeadFirst}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "persistent";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = s.q; spec.k_len = s.k;
      spec.head_dim = 64; spec.layout = s.layout; spec.lse = true;
      SCOPED_TRACE(std::to_string(s.q) + " x " + std::to_string(s.k) + " " + std::string(dtype_name(t)));
      CaseData data(spec, t, 43);
      const auto ref = data.reference();
      DeviceMirror dev(data);
      Attention op(data.problem(), cuda_config());
      const std::string kernel = op.describe();
      if (hopper) EXPECT_NE(kernel.find("persistent grid"), std::string::npos) << kernel;
      dev.run(op);
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
      EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
      EXPECT_TRUE(data.gaps_untouched());
      const auto first = data.output_bytes();
      Attention one_per_unit(data.problem(), cuda_config("off=persistent"));
      EXPECT_EQ(one_per_unit.describe().find("persistent"), std::string::npos) << one_per_unit.describe();
      dev.run(one_per_unit);
      EXPECT_EQ(first, data.output_bytes()) << kernel << " against " << one_per_unit.describe();
      Attention seven(data.problem(), cuda_config("persistent=7"));  // a grid of 7 blocks: over a hundred units each
      if (hopper) EXPECT_NE(seven.describe().find("persistent grid of 7"), std::string::npos) << seven.describe();
      dev.run(seven);
      EXPECT_EQ(first, data.output_bytes()) << kernel << " against " << seven.describe();
      AttentionProblem cut_problem = data.problem();
      cut_problem.work_budget = 450 * 4 * 64 * s.k * 64;  // launches of 450 blocks (block_cost in the backend)
      Attention cut(cut_problem, cuda_config());
      dev.run(cut);
      EXPECT_EQ(first, data.output_bytes()) << "cut call differs from whole call: " << cut.describe();
    }
  }
}

// The wgmma kernel runs a block's last tile's O += P V over the k-steps that hold keys some row of the warpgroup
// sees (the first 32, 64 or 96 keys of a 128-key tile, 32 of a 64-key one, or all): key counts ending every way
// inside a tile; causal rules, under which a block's two warpgroups see different counts (a 4-head group's
// blocks of 32 queries, and 128 queries of one head); random key lengths; head dims of a full build (64, 128),
// a narrow one (80) and the 64-key tiles of 256; two and three blocks per SM at 64. Each against the reference
// (O, the LSE, the gaps untouched), rerun and cut into one-block launches bit for bit.
TEST(CudaAttention, PartialLastTilesMatchTheReferenceOnTheHopperKernel) {
  SKIP_WITHOUT_GPU();
  if (!hopper_device()) {
    GTEST_SKIP() << "needs compute capability 9.0 and no --plan override (the test sets its own plans)";
  }
  struct Shape { std::int64_t heads, kv, q, k; bool causal, lengths; };
  std::vector<Shape> shapes;
  for (const std::int64_t k : {1, 20, 33, 64, 80, 97, 128, 140, 161, 190, 257}) {
    shapes.push_back({4, 4, 70, k, false, false});
  }
  for (const std::int64_t k : {33, 97, 161, 257}) shapes.push_back({8, 2, k, k, true, false});
  shapes.push_back({4, 4, 200, 200, true, false});
  shapes.push_back({4, 4, 100, 300, true, true});
  shapes.push_back({8, 2, 150, 190, false, true});
  for (const std::int64_t d : {64, 80, 128, 256}) {
    for (const Shape& s : shapes) {
      for (const DType t : {DType::f16, DType::bf16}) {
        CaseSpec spec;
        spec.name = "partial last tiles";
        spec.batch = 2; spec.heads = s.heads; spec.kv_heads = s.kv; spec.q_len = s.q; spec.k_len = s.k;
        spec.head_dim = d; spec.causal = s.causal; spec.lse = true; spec.layout = LayoutKind::PositionsFirst;
        if (s.lengths) spec.key_lengths = KeyLengths::Random;
        SCOPED_TRACE(std::to_string(s.q) + " x " + std::to_string(s.k) + " heads " + std::to_string(s.heads) + ":" +
                     std::to_string(s.kv) + (s.causal ? " causal" : "") + (s.lengths ? " lengths" : "") + " d " +
                     std::to_string(d) + " " + std::string(dtype_name(t)));
        CaseData data(spec, t, 71);
        const auto ref = data.reference();
        DeviceMirror dev(data);
        std::vector<std::string> seen;
        for (const std::string plan : {"kernel=wgmma", "kernel=wgmma,off=three"}) {
          Attention op(data.problem(), cuda_config(plan));
          const std::string kernel = op.describe();
          EXPECT_TRUE(runs_on(op, "wgmma")) << kernel;
          if (!runs_on(op, "wgmma") || std::find(seen.begin(), seen.end(), kernel) != seen.end()) continue;
          seen.push_back(kernel);
          dev.run(op);
          EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
          EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
          EXPECT_TRUE(data.gaps_untouched()) << kernel;
          expect_rerun_and_cut_equal(data, dev, op, data.output_bytes(), plan);
        }
      }
    }
  }
}

// A plain grid just past whole waves of the wgmma kernel (head dim 128, one 128-row block per SM; the SM count plus
// two heads of 100 queries) splits its tail row blocks in key ranges merged after (CudaPlan::tail_pieces): against
// the reference (O and the LSE, the gaps untouched), the same bytes in a second run and cut into one-block
// launches, and within the tolerance of the unsplit plan.
TEST(CudaAttention, SplitTailMatchesTheReferenceAndCutsEqualWhole) {
  SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  check(cudaGetDevice(&device));
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (DType t : {DType::f16, DType::bf16}) {
    CaseSpec spec;
    spec.name = "tail";
    const int heads = sms + 2, tail = heads - sms;  // (one row block per head)
    spec.batch = 1; spec.heads = heads; spec.kv_heads = heads; spec.q_len = 100; spec.k_len = 600;
    spec.head_dim = 128; spec.lse = true;
    SCOPED_TRACE(std::string(dtype_name(t)));
    CaseData data(spec, t, 41);
    const auto ref = data.reference();
    DeviceMirror dev(data);
    Attention op(data.problem(), cuda_config());
    const std::string kernel = op.describe();
    if (hopper_device()) {
      EXPECT_NE(kernel.find("tail of " + std::to_string(tail) + " row blocks in 3 x 256 keys"),
                std::string::npos)
          << kernel;
    }
    dev.run(op);
    EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
    EXPECT_LE(data.lse_error(ref), tolerance(t)) << kernel;
    EXPECT_TRUE(data.gaps_untouched());
    const auto first = data.output_bytes();
    expect_rerun_and_cut_equal(data, dev, op, first);
    Attention whole(data.problem(), cuda_config("off=tail"));
    EXPECT_EQ(whole.describe().find("tail"), std::string::npos) << whole.describe();
    dev.run(whole);
    EXPECT_LE(data.scaled_error(ref), tolerance(t)) << whole.describe();
    // The merge of a split row block rounds differently from its whole block: the bytes show that the run
    // took the plan's split tail (a run may still fall back to whole blocks, which would give these bytes).
    if (kernel.find("tail") != std::string::npos) {
      EXPECT_NE(first, data.output_bytes()) << "the split tail did not run";
    }
  }
}

// A prefill large enough that the default plan takes the Hopper wgmma kernel (on compute capability 9.0): causal
// GQA with key lengths, a partial last tile (500 keys) and a row count that is not a multiple of 128.
TEST(CudaAttention, LargePrefillTakesTheHopperKernelAndMatches) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0));
  for (DType t : {DType::f16, DType::bf16}) {
    for (const std::int64_t d : {64, 128}) {
      CaseSpec spec;
      spec.name = "prefill";
      spec.batch = 2; spec.heads = 32; spec.kv_heads = 8; spec.q_len = 500; spec.k_len = 500; spec.head_dim = d;
      spec.causal = true; spec.lse = true; spec.key_lengths = KeyLengths::Random;
      SCOPED_TRACE(std::string(dtype_name(t)) + " d " + std::to_string(d));
      CaseData data(spec, t, 5);
      Attention op(data.problem(), cuda_config());
      if (prop.major == 9 && prop.minor == 0 && forced_plan().empty()) {
        EXPECT_NE(op.describe().find("wgmma"), std::string::npos) << op.describe();
      }
      DeviceMirror dev(data);
      dev.run(op);
      EXPECT_LE(data.scaled_error(data.reference()), tolerance(t)) << op.describe();
      EXPECT_TRUE(data.gaps_untouched());
    }
  }
}

// A decode step over a cache long enough that the default plan streams it through the wgmma kernel's TMA ring
// (compute capability 9.0), split in key ranges: GQA, random key lengths (ranges that end inside a tile or hold
// no key at all), the LSE.
TEST(CudaAttention, LongDecodeTakesTheHopperKernelAndMatches) {
  SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0));
  for (DType t : {DType::f16, DType::bf16}) {
    CaseSpec spec;
    spec.name = "long decode";
    spec.batch = 4; spec.heads = 32; spec.kv_heads = 8; spec.q_len = 1; spec.k_len = 18000; spec.head_dim = 128;
    spec.causal = true; spec.lse = true; spec.key_lengths = KeyLengths::Random;
    SCOPED_TRACE(dtype_name(t));
    CaseData data(spec, t, 7);
    Attention op(data.problem(), cuda_config());
    if (prop.major == 9 && prop.minor == 0 && forced_plan().empty()) {
      EXPECT_NE(op.describe().find("wgmma"), std::string::npos) << op.describe();
      // (a key split: the general build's split-k, or the plain build's pieces of a split tail from row block 0)
      EXPECT_TRUE(op.describe().find("split-k") != std::string::npos ||
                  op.describe().find("plain, tail of") != std::string::npos)
          << op.describe();
    }
    DeviceMirror dev(data);
    dev.run(op);
    EXPECT_LE(data.scaled_error(data.reference()), tolerance(t)) << op.describe();
    EXPECT_TRUE(data.gaps_untouched());
  }
}

// float32 beyond a decode step takes the tensor cores (three TF32 products per product) and keeps float32's
// accuracy over a long key range: 16k keys, head dim 128, the 1e-5 bound of float32.
TEST(CudaAttention, Float32OnTensorCoresKeepsFloat32AccuracyOverLongKeys) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec;
  spec.name = "tf32";
  spec.batch = 1; spec.heads = 4; spec.kv_heads = 2; spec.q_len = 100; spec.k_len = 16384; spec.head_dim = 128;
  spec.causal = true; spec.lse = true;
  CaseData data(spec, DType::f32, 13);
  Attention op(data.problem(), cuda_config());
  if (forced_plan().empty()) EXPECT_NE(op.describe().find("tf32"), std::string::npos) << op.describe();
  DeviceMirror dev(data);
  dev.run(op);
  EXPECT_LE(data.scaled_error(data.reference()), 1e-5) << op.describe();
  EXPECT_TRUE(data.gaps_untouched());
}

TEST(CudaAttention, SplitKIsUsedForDecodeAndMatches) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec;
  spec.name = "decode";
  spec.batch = 1; spec.heads = 8; spec.kv_heads = 2; spec.q_len = 1; spec.k_len = 16384; spec.head_dim = 128;
  spec.causal = true;
  CaseData data(spec, DType::f32, 11);
  Attention op(data.problem(), cuda_config());
  EXPECT_NE(op.describe().find("split-k"), std::string::npos) << op.describe();
  DeviceMirror dev(data);
  dev.run(op);
  EXPECT_LE(data.scaled_error(data.reference()), 1e-5);
}

// A key length on the device is never read back (no host synchronisation): one outside [0, k_len] hides every
// key of its batch entry (masked rows: NaN, or zeros under MaskedRows::Zero), the other entries are the reference's,
// and the status word names the first bad entry (-1 when none is bad). Captured in a CUDA graph in the strict
// (global) mode and replayed with new lengths written into the same buffer, it gives the eager call's bytes.
TEST(CudaAttention, OutOfRangeDeviceKeyLengthHidesItsEntryAndIsReported) {
  SKIP_WITHOUT_GPU();
  for (const MaskedRows masked : {MaskedRows::Nan, MaskedRows::Zero}) {
    CaseSpec spec;
    spec.name = "bad length";
    spec.batch = 3; spec.heads = 4; spec.kv_heads = 2; spec.q_len = 5; spec.k_len = 300; spec.head_dim = 64;
    spec.key_lengths = KeyLengths::Random;
    spec.masked_rows = masked;
    CaseData data(spec, DType::f16, 3);
    AttentionProblem problem = data.problem();
    Attention op(problem, cuda_config());
    DeviceMirror dev(data);
    auto* lengths = static_cast<std::int32_t*>(const_cast<void*>(dev.device_args().key_lengths.data));
    int* status = nullptr;
    check(cudaMalloc(&status, sizeof(int)));
    AttentionArgs args = dev.device_args();
    args.status = {status, 1};
    const std::int32_t bad = 301;
    check(cudaMemcpy(lengths + 1, &bad, 4, cudaMemcpyHostToDevice));
    dev.run(op, args);
    int reported = 0;
    check(cudaMemcpy(&reported, status, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(reported, 1);
    const auto bad_bytes = data.output_bytes();
    // Entry 1 with length 0 is what the kernels computed for it; entries 0 and 2 are untouched by the bad one.
    std::vector<std::int32_t> host_lengths = data.key_lengths();
    host_lengths[1] = 0;
    check(cudaMemcpy(lengths, host_lengths.data(), 4 * host_lengths.size(), cudaMemcpyHostToDevice));
    data.set_key_lengths(host_lengths);
    dev.run(op, args);
    check(cudaMemcpy(&reported, status, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(reported, -1);
    EXPECT_EQ(bad_bytes, data.output_bytes());
    EXPECT_LE(data.scaled_error(data.reference()), tolerance(DType::f16));
    check(cudaFree(status));
  }
}

// The whole call, key-length check included, captures in a CUDA graph in the strict (global) capture mode with
// caller scratch, and a replay after new lengths are written into the same buffer gives the eager call's bytes.
TEST(CudaAttention, DeviceKeyLengthsCaptureInAStrictGraph) {
  SKIP_WITHOUT_GPU();
  CaseSpec spec;
  spec.name = "graph";
  spec.batch = 8; spec.heads = 32; spec.kv_heads = 8; spec.q_len = 1; spec.k_len = 5000; spec.head_dim = 128;
  spec.causal = true; spec.key_lengths = KeyLengths::Random;
  CaseData data(spec, DType::bf16, 17);
  Attention op(data.problem(), cuda_config());
  DeviceMirror dev(data);
  void* scratch = nullptr;
  check(cudaMalloc(&scratch, std::max<std::size_t>(op.scratch_bytes(), 1)));
  AttentionArgs args = dev.device_args();
  args.scratch = scratch;
  args.scratch_bytes = op.scratch_bytes();
  cudaStream_t stream{};
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  args.stream = stream;
  dev.run(op, args);  // eager, first lengths
  const auto eager_first = data.output_bytes();
  cudaGraph_t graph{};
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  op.run(args);
  check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec{};
  check(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<std::int32_t> lengths = data.key_lengths();
  for (auto& n : lengths) n = std::max(1, static_cast<int>(spec.k_len) - n);  // new lengths, same buffer
  auto* device_lengths = static_cast<std::int32_t*>(const_cast<void*>(args.key_lengths.data));
  check(cudaMemcpy(device_lengths, lengths.data(), 4 * lengths.size(), cudaMemcpyHostToDevice));
  data.set_key_lengths(lengths);
  dev.run(op, args);  // eager, new lengths (DeviceMirror poisons and fetches the output)
  const auto eager_second = data.output_bytes();
  EXPECT_NE(eager_first, eager_second);
  EXPECT_LE(data.scaled_error(data.reference()), tolerance(DType::bf16));
  data.poison_outputs();
  dev.upload_outputs();
  check(cudaGraphLaunch(exec, stream));
  check(cudaStreamSynchronize(stream));
  dev.download();
  EXPECT_EQ(eager_second, data.output_bytes()) << "graph replay differs from the eager call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  check(cudaFree(scratch));
}

}  // namespace
}  // namespace attnkit::testing

int main(int argc, char** argv) { return attnkit::testing::run_tests_with_plan_flag(argc, argv); }
