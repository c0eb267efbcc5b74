// The Vulkan plan's policy: which kernel runs a problem, its tile, its key split and its launches, from the
// problem and what the device offers only. Host code with no Vulkan call, so tests check it without a device.
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>
#include <string>

namespace attnkit::vulkan {

struct VulkanTraits {
  bool cpu_device = false;                 // a software rasteriser (lavapipe): few workgroups at once
  bool cooperative_matrix = false;         // float16 16x16x16 matrices, float32 accumulators
  std::uint32_t subgroup_size = 32;
  std::uint32_t shared_memory_bytes = 16384;
  std::uint32_t max_groups_x = 65535;
  std::uint64_t max_buffer_bytes = 1u << 27;  // maxStorageBufferRange
};

struct VulkanPlan {
  enum class Kernel : std::uint8_t { Rows, CoopMatrix };
  Kernel kernel = Kernel::Rows;
  std::string why;                // why this kernel (describe())
  int tile_keys = 32;             // keys per tile
  bool unrolled = true;           // the scalar shaders' unrolled build (GPUs); CPU devices keep loops
  bool emulated_matrices = false; // coopmat's build without matrix instructions (devices that have none)
  std::int64_t group = 1;         // query heads per K/V head
  std::int64_t row_block = 64;    // rows per workgroup
  std::int64_t row_blocks = 0;    // per (batch, K/V head)
  std::int64_t splits = 1;        // key ranges (1: no merge pass)
  std::int64_t split_keys = 0;    // keys per range
  std::int64_t workgroups = 0;    // of the main kernel
  std::int64_t per_launch = 0;    // workgroups per launch (the work budget's cut)
  std::int64_t total_rows = 0;    // batch * heads * q_len
  std::uint64_t partial_bytes = 0;
  // The loop build's per-thread arrays (shaders/common.glsl): a slot per thread of one launch, whose workgroups
  // are then at most launch_groups (also the merge pass's).
  std::int64_t launch_groups = 0;
  std::uint64_t thread_scratch_bytes = 0;
};

// What a caller may force (AttentionConfig::plan: its kernel and splits): "" and 0 leave the choice to the plan.
struct PlanOverride {
  std::string kernel;
  std::int64_t key_splits = 0;
};

const char* kernel_name(VulkanPlan::Kernel k);
// The plan of a normalised problem on a device; throws Error("config.plan.kernel", ...) for a kernel the problem or
// the device cannot run, Error(field, ...) for what the backend does not support.
VulkanPlan plan_for(const AttentionProblem& p, const VulkanTraits& device, const PlanOverride& force = {});
std::string describe(const VulkanPlan& plan);

}  // namespace attnkit::vulkan
