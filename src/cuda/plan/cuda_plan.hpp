// The CUDA plan's policy (cuda_plan.cu) as a function of the problem and of what the device holds: host code
// with no CUDA call, so that tests check it without a GPU.
#pragma once

#include "cuda/host/cuda_backend.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attnkit::cuda {

// What the plan needs to know of the device.
struct DeviceTraits {
  int sm_count = 0;
  bool sm90 = false;  // compute capability 9.0: the wgmma kernel's sm_90a code runs there
  // Blocks of `kernel` (the problem's instance) one SM holds at once, at the plan's shared memory.
  std::function<int(CudaPlan::Kernel)> resident_blocks;
  // The wgmma kernel's blocks per SM in its build of three per SM (0: no such build for the problem).
  int warpgroup_three_resident = 0;
};

// The largest cluster the cluster merge asks for: 16, the H100 / H200's non-portable limit (8 is portable).
inline constexpr std::int64_t kMaxClusterSplits = 16;

// Scratch starts with the device checks' flag, then (ragged or paged sequences) one int32 per batch entry of
// what the sequences check found (entry_fault_bytes); the split-K partials follow.
inline constexpr std::size_t kFlagBytes = 256;
inline std::size_t entry_fault_bytes(const AttentionProblem& p) {
  if (!p.sequences.any()) return 0;
  return (static_cast<std::size_t>(p.batch) * sizeof(std::int32_t) + kFlagBytes - 1) / kFlagBytes * kFlagBytes;
}

// The plan of `p` on `device`, a pure function of the three. allow_special: the decode and wgmma kernels may be
// chosen (both need 16-byte-aligned base pointers, which only the run sees; the run falls back to the plan
// without them). `overrides`: what a test or benchmark forces (kernel, splits, features off; PlanOverrides).
CudaPlan plan_for(const AttentionProblem& p, bool allow_special, const DeviceTraits& device,
                  const PlanOverrides& overrides = {});

// The kernel registry (cuda_plan.cu): its names in order (PlanOverrides::kernel's, plan_kernel_names()), the ones
// that accept `p` on `device` (with aligned base pointers), and the name describe() shows for a kernel.
std::vector<std::string> registry_kernel_names();
std::vector<std::string> accepting_kernels(const AttentionProblem& p, const DeviceTraits& device);
const char* kernel_shown_name(CudaPlan::Kernel k);

}  // namespace attnkit::cuda
