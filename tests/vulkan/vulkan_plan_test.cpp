// The Vulkan plan's policy with the device described by hand (no device needed): the kernel and why, the key
// split from the shape and the device, the work budget's launches.
#include <vulkan/vulkan_plan.hpp>

#include <core/problem_check.hpp>

#include <gtest/gtest.h>

namespace attnkit::vulkan {
namespace {

VulkanTraits gpu(bool coop) {
  VulkanTraits t;
  t.cooperative_matrix = coop;
  t.shared_memory_bytes = 49152;
  t.max_groups_x = 65535;
  t.max_buffer_bytes = std::uint64_t{1} << 32;
  return t;
}

AttentionProblem problem(std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t k, std::int64_t d, DType t) {
  return core::normalize_and_check(AttentionProblem::head_first(b, h, h, q, k, d, t));
}

// The matrix kernel is the plan's choice for float16 where the device has cooperative matrices, and runs
// elsewhere (emulated) only where forced.
TEST(VulkanPlan, MatrixKernelWhereTheDeviceHasMatrices) {
  const VulkanPlan f16 = plan_for(problem(1, 12, 512, 512, 64, DType::f16), gpu(true));
  EXPECT_EQ(f16.kernel, VulkanPlan::Kernel::CoopMatrix);
  EXPECT_FALSE(f16.emulated_matrices);
  EXPECT_NE(describe(f16).find("cooperative matrices"), std::string::npos) << describe(f16);
  const VulkanPlan forced = plan_for(problem(1, 12, 512, 512, 64, DType::f16), gpu(true), {"coopmat", 0});
  EXPECT_EQ(forced.kernel, VulkanPlan::Kernel::CoopMatrix);
  EXPECT_EQ(forced.tile_keys, 64);  // 64 dims: 64-key tiles fit 48 KiB of shared memory
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 128, DType::f16), gpu(true)).tile_keys, 32);
  VulkanTraits small = gpu(true);
  small.shared_memory_bytes = 32768;
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 64, DType::f16), small).tile_keys, 32);
  small.shared_memory_bytes = 16384;
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 128, DType::f16), small).kernel, VulkanPlan::Kernel::Rows);
  EXPECT_NE(describe(forced).find("forced"), std::string::npos);
  // Forced on a device without matrices: the emulated build, with its per-thread scratch.
  const VulkanPlan emulated = plan_for(problem(1, 12, 512, 512, 64, DType::f16), gpu(false), {"coopmat", 0});
  EXPECT_EQ(emulated.kernel, VulkanPlan::Kernel::CoopMatrix);
  EXPECT_TRUE(emulated.emulated_matrices);
  EXPECT_EQ(emulated.tile_keys, 16);
  EXPECT_FALSE(forced.emulated_matrices);
  EXPECT_GE(emulated.thread_scratch_bytes, static_cast<std::uint64_t>(emulated.per_launch * 128 * 32 * 4));
  EXPECT_NE(describe(emulated).find("emulated"), std::string::npos) << describe(emulated);
  VulkanTraits narrow = gpu(true);
  narrow.subgroup_size = 64;
  EXPECT_THROW(plan_for(problem(1, 12, 512, 512, 64, DType::f16), narrow, {"coopmat", 0}), Error);
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 64, DType::f16), gpu(false)).kernel, VulkanPlan::Kernel::Rows);
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 64, DType::f32), gpu(true)).kernel, VulkanPlan::Kernel::Rows);
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 64, DType::bf16), gpu(true)).kernel, VulkanPlan::Kernel::Rows);
  EXPECT_EQ(plan_for(problem(1, 12, 512, 512, 256, DType::f16), gpu(true)).kernel, VulkanPlan::Kernel::Rows);
  const VulkanPlan rows = plan_for(problem(1, 12, 512, 512, 64, DType::f16), gpu(true), {"rows", 0});
  EXPECT_EQ(rows.kernel, VulkanPlan::Kernel::Rows);
  EXPECT_NE(describe(rows).find("forced"), std::string::npos);
  EXPECT_THROW(plan_for(problem(1, 12, 512, 512, 64, DType::f32), gpu(true), {"coopmat", 0}), Error);
  EXPECT_NE(describe(plan_for(problem(1, 1, 1, 1, 64, DType::f32), gpu(true))).find("float16 only"), std::string::npos);
}

// Ragged and paged float16 batches take the matrix kernel where the device has matrices, as dense ones do, and
// rows elsewhere or where forced; forced, coopmat takes them (its matrix build, or the emulated one where the device
// has no matrices), in float16 only.
TEST(VulkanPlan, SequencesTakeTheMatrixKernelWhereTheDeviceHasMatrices) {
  AttentionProblem ragged = AttentionProblem::head_first(3, 8, 8, 64, 200, 64, DType::f16);
  ragged.sequences.ragged_q = true;
  ragged.sequences.total_q = 150;
  ragged.q = ragged.o = Layout{0, 0, 64, 8 * 64};
  AttentionProblem paged = AttentionProblem::head_first(3, 8, 8, 1, 200, 64, DType::f16);
  paged.sequences.page_size = 16;
  paged.sequences.num_pages = 40;
  paged.sequences.max_pages_per_seq = 13;
  for (const AttentionProblem& p : {core::normalize_and_check(ragged), core::normalize_and_check(paged)}) {
    const VulkanPlan plan = plan_for(p, gpu(true));
    EXPECT_EQ(plan.kernel, VulkanPlan::Kernel::CoopMatrix) << describe(plan);
    EXPECT_FALSE(plan.emulated_matrices);
    EXPECT_EQ(plan_for(p, gpu(true), {"rows", 0}).kernel, VulkanPlan::Kernel::Rows);
    const VulkanPlan forced = plan_for(p, gpu(true), {"coopmat", 0});
    EXPECT_EQ(forced.kernel, VulkanPlan::Kernel::CoopMatrix);
    EXPECT_FALSE(forced.emulated_matrices);
    EXPECT_TRUE(plan_for(p, gpu(false), {"coopmat", 0}).emulated_matrices);
    EXPECT_EQ(plan_for(p, gpu(false)).kernel, VulkanPlan::Kernel::Rows);
    EXPECT_EQ(plan_for(p, gpu(true), {"rows", 3}).splits, 3);
    AttentionProblem f32 = p;
    f32.dtype = DType::f32;
    try {
      (void)plan_for(f32, gpu(true), {"coopmat", 0});
      ADD_FAILURE() << "coopmat accepted a float32 batch with sequences";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "config.plan.kernel") << e.what();
    }
  }
}

TEST(VulkanPlan, SplitsFewWorkgroupsOnly) {
  const VulkanPlan decode = plan_for(problem(1, 12, 1, 1500, 64, DType::f32), gpu(false));
  EXPECT_GT(decode.splits, 1);
  EXPECT_EQ(decode.split_keys % 32, 0);
  EXPECT_GE(decode.split_keys * decode.splits, 1500);
  EXPECT_LT(decode.split_keys * (decode.splits - 1), 1500);
  EXPECT_EQ(decode.partial_bytes, static_cast<std::uint64_t>(decode.splits * 12 * (64 + 3) * 4));
  EXPECT_EQ(plan_for(problem(8, 12, 512, 512, 64, DType::f32), gpu(false)).splits, 1);
  EXPECT_EQ(plan_for(problem(1, 12, 1, 200, 64, DType::f32), gpu(false)).splits, 1);  // too few keys
  VulkanTraits cpu = gpu(false);
  cpu.cpu_device = true;
  EXPECT_LT(plan_for(problem(1, 4, 1, 4096, 64, DType::f32), cpu).splits,
            plan_for(problem(1, 4, 1, 4096, 64, DType::f32), gpu(false)).splits);
  EXPECT_EQ(plan_for(problem(8, 12, 512, 512, 64, DType::f32), gpu(false), {"", 4}).splits, 4);  // 4 ranges of 128 keys
}

TEST(VulkanPlan, WorkBudgetCutsIntoWholeWorkgroups) {
  AttentionProblem p = problem(8, 12, 512, 512, 64, DType::f32);  // 768 workgroups: no split
  EXPECT_EQ(plan_for(p, gpu(false)).per_launch, plan_for(p, gpu(false)).workgroups);
  p.work_budget = 1;
  EXPECT_EQ(plan_for(p, gpu(false)).per_launch, 1);
  p.work_budget = 4 * 64 * 512 * 64 * 10;  // ten workgroups' estimate
  EXPECT_EQ(plan_for(p, gpu(false)).per_launch, 10);
}

TEST(VulkanPlan, ShorterTilesForWideHeads) {
  EXPECT_EQ(plan_for(problem(1, 1, 4, 4, 256, DType::f32), gpu(false)).tile_keys, 8);
  EXPECT_EQ(plan_for(problem(1, 1, 4, 4, 128, DType::f32), gpu(false)).tile_keys, 16);
  EXPECT_EQ(plan_for(problem(1, 1, 4, 4, 64, DType::f32), gpu(false)).tile_keys, 32);
}

// A CPU device (llvmpipe) walks few enough keys per workgroup for its loop guard (60000 iterations in all).
TEST(VulkanPlan, CpuDeviceRangesStayShort) {
  VulkanTraits cpu = gpu(false);
  cpu.cpu_device = true;
  const VulkanPlan p = plan_for(problem(64, 1, 1, 40000, 64, DType::f32), cpu);
  EXPECT_LE(p.split_keys * (64 + 64 + 4 + 4), 60000);
  EXPECT_FALSE(p.unrolled);
  EXPECT_GT(plan_for(problem(64, 1, 1, 40000, 64, DType::f32), gpu(false)).split_keys, 8 * p.split_keys);
  EXPECT_TRUE(plan_for(problem(64, 1, 1, 40000, 64, DType::f32), gpu(false)).unrolled);
}

}  // namespace
}  // namespace attnkit::vulkan
