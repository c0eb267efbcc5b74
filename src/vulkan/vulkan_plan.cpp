#include "vulkan_plan.hpp"

#include "core/checked_int.hpp"
#include "core/launch_cuts.hpp"
#include "core/require.hpp"

#include <algorithm>

namespace attnkit::vulkan {
namespace {

constexpr std::int64_t kRowBlock = 64;
// A split cuts keys into ranges of whole granules, each at least kMinSplitKeys long, at most kMaxSplits of them.
constexpr std::int64_t kSplitGranule = 32;
constexpr std::int64_t kMinSplitKeys = 128;
constexpr std::int64_t kMaxSplits = 16;
// Workgroups that keep a device busy: about 256 on a GPU (the seed's figure), a few per core on a CPU device.
constexpr std::int64_t kGpuWorkgroups = 256;
constexpr std::int64_t kCpuWorkgroups = 16;
// llvmpipe's loop guard (shaders/common.glsl): a shader's loops may run this many iterations in all, with margin.
constexpr std::int64_t kCpuLoopIterations = 60000;
// Workgroups per launch on a CPU device: bounds the loop build's per-thread scratch (64 threads x the arrays).
constexpr std::int64_t kCpuLaunchGroups = 64;
// The cooperative-matrix kernel's limits: float16, head dims up to 128 (its fragments' registers).
constexpr std::int64_t kCoopMaxHeadDim = 128;
// Workgroups per launch of the emulated matrix build: bounds its per-thread scratch on a GPU.
constexpr std::int64_t kEmulatedLaunchGroups = 1024;

using core::ceil_div;

// Keys per tile: the unrolled loops over a tile (shaders/common.glsl) hold TK x head dim products, so wide heads
// take shorter tiles to keep the shader small (32 up to 64 dims, 16 up to 128, 8 above).
int tile_keys_for(const AttentionProblem& p) {
  const std::int64_t widest = std::max(p.head_dim, p.v_head_dim);
  return widest <= 64 ? 32 : widest <= 128 ? 16 : 8;
}

// The cooperative-matrix kernel's shared memory at `tile_keys` keys per tile (shaders/attention_coopmat.comp's
// regions, in 16-byte units): K and V tiles, 64 rows of float32 scores and float16 probabilities, and Q: staged
// over the tiles' space in the matrix build (whose rows are padded by one unit), apart in the emulated build.
std::int64_t coop_shared_bytes(const AttentionProblem& p, std::int64_t tile_keys, bool emulated) {
  const std::int64_t pad = emulated ? 0 : 1;
  const std::int64_t q_row = ceil_div(p.head_dim, 16) * 2 + pad, v_row = ceil_div(p.v_head_dim, 16) * 2 + pad;
  const std::int64_t tiles = tile_keys * (q_row + v_row) + kRowBlock * (tile_keys / 4 + pad + tile_keys / 8 + pad);
  const std::int64_t units = emulated ? tiles + kRowBlock * q_row : std::max(tiles, kRowBlock * q_row);
  return 16 * units + (emulated ? 128 * 4 : 0) + 8;
}

// Keys per tile of the cooperative-matrix kernel: the longest tile that fits the device's shared memory (fewer
// workgroup barriers per key); 16 in the emulated build, whose per-thread loops stay short.
int coop_tile_keys(const AttentionProblem& p, const VulkanTraits& device, bool emulated) {
  if (emulated) return 16;
  for (const int keys : {64, 32}) {
    if (coop_shared_bytes(p, keys, false) <= device.shared_memory_bytes) return keys;
  }
  return 16;
}

// Why the cooperative-matrix kernel cannot run `p` on `device` ("" when it can). Without the device's matrices
// it runs its emulated build (matrix steps as scalar loops: for tests, on lavapipe); with them it needs four
// 32-lane subgroups per workgroup.
std::string coop_refusal(const AttentionProblem& p, const VulkanTraits& device) {
  if (p.dtype != DType::f16) return "it runs float16 only";
  if (p.head_dim > kCoopMaxHeadDim || p.v_head_dim > kCoopMaxHeadDim) return "head dims above 128";
  if (device.cooperative_matrix && device.subgroup_size != 32) return "its matrix steps are laid out for 32-lane subgroups";
  if (coop_shared_bytes(p, 16, !device.cooperative_matrix) > device.shared_memory_bytes) {
    return "its tiles need more shared memory than the device's " + std::to_string(device.shared_memory_bytes) + " bytes";
  }
  return "";
}

void choose_split(const AttentionProblem& p, const VulkanTraits& device, const PlanOverride& force, VulkanPlan& plan) {
  const std::int64_t base = p.batch * p.kv_heads * plan.row_blocks;
  const std::int64_t target = device.cpu_device ? kCpuWorkgroups : kGpuWorkgroups;
  std::int64_t want = 1;
  if (force.key_splits > 0) {
    want = std::min<std::int64_t>(force.key_splits, std::max<std::int64_t>(ceil_div(p.k_len, kSplitGranule), 1));
  } else if (base > 0 && base < target && p.k_len >= 2 * kMinSplitKeys) {
    want = std::min({kMaxSplits, ceil_div(target, base), p.k_len / kMinSplitKeys});
  }
  if (device.cpu_device) {
    // The rolled build runs about D + DV loop iterations per key (plus 2 DV per tile): ranges that stay under
    // the guard, as many as that takes.
    const std::int64_t per_key = p.head_dim + p.v_head_dim + 2 * p.v_head_dim / plan.tile_keys + 4;
    const std::int64_t most_keys = std::max<std::int64_t>(kCpuLoopIterations / per_key / kSplitGranule * kSplitGranule, kSplitGranule);
    want = std::max(want, ceil_div(p.k_len, most_keys));
  }
  plan.split_keys = std::max<std::int64_t>(p.k_len, 1);
  plan.splits = 1;
  if (want > 1) {
    plan.split_keys = ceil_div(ceil_div(p.k_len, want), kSplitGranule) * kSplitGranule;
    plan.splits = ceil_div(p.k_len, plan.split_keys);
  }
  ATTNKIT_REQUIRE(!device.cpu_device || plan.splits * (p.v_head_dim + 2) + 2 * p.v_head_dim < kCpuLoopIterations, "k_len",
                  "too many keys for a CPU Vulkan device at this head dim (llvmpipe's loop guard ends the merge pass)");
}

}  // namespace

const char* kernel_name(VulkanPlan::Kernel k) { return k == VulkanPlan::Kernel::CoopMatrix ? "coopmat" : "rows"; }

VulkanPlan plan_for(const AttentionProblem& p, const VulkanTraits& device, const PlanOverride& force) {
  ATTNKIT_REQUIRE(p.k_storage.type == KvType::Float, "k_storage.type", "the Vulkan backend reads float K only (no int8 / int4 caches)");
  ATTNKIT_REQUIRE(p.v_storage.type == KvType::Float, "v_storage.type", "the Vulkan backend reads float V only (no int8 / int4 caches)");
  constexpr std::int64_t kIndexLimit = std::int64_t{1} << 30;
  ATTNKIT_REQUIRE(p.q_len < kIndexLimit && p.k_len < kIndexLimit, "q_len / k_len", "must be below 2^30 on the Vulkan backend");
  ATTNKIT_REQUIRE(p.batch * p.heads * p.q_len < kIndexLimit, "batch * heads * q_len", "must be below 2^30 on the Vulkan backend");
  ATTNKIT_REQUIRE(force.kernel.empty() || force.kernel == "rows" || force.kernel == "coopmat", "config.plan.kernel",
                  "the Vulkan backend's kernels are \"rows\" and \"coopmat\" (got \"" + force.kernel + "\")");
  ATTNKIT_REQUIRE(force.key_splits >= 0, "config.plan.splits", "must be >= 0 (0: the plan's choice)");

  VulkanPlan plan;
  const std::string refusal = coop_refusal(p, device);
  if (force.kernel == "coopmat") {
    ATTNKIT_REQUIRE(refusal.empty(), "config.plan.kernel", "coopmat cannot run this problem: " + refusal);
    plan.kernel = VulkanPlan::Kernel::CoopMatrix;
    plan.emulated_matrices = !device.cooperative_matrix;
    plan.why = plan.emulated_matrices ? "forced; matrix steps emulated, the device has no cooperative matrices" : "forced";
  } else if (force.kernel == "rows") {
    plan.why = "forced";
  } else if (refusal.empty() && device.cooperative_matrix) {
    // Faster than rows on every float16 case timed on the H200: dense batches
    // (bench/results/2026-12-02-h200-vulkan-coopmat.md) and ragged and paged ones, 4.4-14x
    // (bench/results/2026-12-07-h200-vulkan-sequences-and-lane-map.md).
    plan.kernel = VulkanPlan::Kernel::CoopMatrix;
    plan.why = "float16 on the device's cooperative matrices; kernel=rows forces the scalar kernel";
  } else {
    plan.why = "scalar: coopmat not taken, " +
               (refusal.empty() ? std::string("the device offers no float16 cooperative matrices") : refusal);
  }
  plan.tile_keys = plan.kernel == VulkanPlan::Kernel::CoopMatrix ? coop_tile_keys(p, device, plan.emulated_matrices)
                                                                   : tile_keys_for(p);
  plan.unrolled = !device.cpu_device;
  plan.group = p.heads / p.kv_heads;
  plan.row_block = kRowBlock;
  plan.row_blocks = ceil_div(plan.group * p.q_len, plan.row_block);
  choose_split(p, device, force, plan);
  plan.workgroups = p.batch * p.kv_heads * plan.row_blocks * plan.splits;
  plan.total_rows = p.batch * p.heads * p.q_len;
  const std::int64_t block_cost = 4 * plan.row_block * plan.split_keys * p.head_dim;
  plan.per_launch = std::min<std::int64_t>(core::blocks_per_launch(p.work_budget, block_cost, plan.workgroups),
                                           device.max_groups_x);
  plan.launch_groups = device.cpu_device ? kCpuLaunchGroups : device.max_groups_x;
  if (plan.emulated_matrices) plan.launch_groups = std::min(plan.launch_groups, kEmulatedLaunchGroups);
  plan.per_launch = std::min(plan.per_launch, plan.launch_groups);
  if (!plan.unrolled) {  // the loop builds of rows and of the merge pass
    plan.thread_scratch_bytes =
        static_cast<std::uint64_t>(plan.launch_groups * plan.row_block * (p.head_dim + 2 * p.v_head_dim + plan.tile_keys)) * 4;
  }
  if (plan.emulated_matrices) {  // 128 threads a workgroup, each with its 8 columns of every 16 V dims
    plan.thread_scratch_bytes = std::max<std::uint64_t>(
        plan.thread_scratch_bytes, static_cast<std::uint64_t>(plan.launch_groups * 128 * (ceil_div(p.v_head_dim, 16) * 8)) * 4);
  }
  plan.partial_bytes = plan.splits > 1 ? static_cast<std::uint64_t>(plan.splits * plan.total_rows * (p.v_head_dim + 3)) * 4 : 0;
  ATTNKIT_REQUIRE(plan.partial_bytes <= device.max_buffer_bytes, "k_len",
                  "the split-K partials exceed the device's largest storage buffer");
  return plan;
}

std::string describe(const VulkanPlan& plan) {
  std::string s = std::string("vulkan.") + kernel_name(plan.kernel) + " (" + plan.why + ")";
  s += ", " + std::to_string(plan.tile_keys) + "-key tiles";
  if (plan.splits > 1) {
    s += ", split-k=" + std::to_string(plan.splits) + " x " + std::to_string(plan.split_keys) + " keys + merge pass";
  }
  const std::int64_t launches = plan.per_launch > 0 ? (plan.workgroups + plan.per_launch - 1) / plan.per_launch : 1;
  s += ", " + std::to_string(plan.workgroups) + " workgroups";
  if (launches > 1) s += " in " + std::to_string(launches) + " launches";
  return s;
}

}  // namespace attnkit::vulkan
