// The shaders of the Vulkan backend, one file per kernel strategy (rows_kernel.cpp, coopmat_kernel.cpp,
// split_merge.cpp): each gives its SPIR-V (compiled from shaders/*.comp at build time) and the specialization
// constants a plan needs.
#pragma once

#include "vulkan_params.hpp"
#include "vulkan_plan.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnkit::vulkan {

struct KernelShader {
  std::string name;
  std::span<const std::uint32_t> spirv;
  std::vector<std::int32_t> constants;
};

// The common constants (common.glsl's constant_id 0..5) of a problem.
std::vector<std::int32_t> common_constants(const AttentionProblem& p, const VulkanPlan& plan);

KernelShader rows_kernel(const AttentionProblem& p, const VulkanPlan& plan);
KernelShader coopmat_kernel(const AttentionProblem& p, const VulkanPlan& plan);
KernelShader merge_kernel(const AttentionProblem& p, const VulkanPlan& plan);

// The main kernel a plan names.
inline KernelShader main_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  return plan.kernel == VulkanPlan::Kernel::CoopMatrix ? coopmat_kernel(p, plan) : rows_kernel(p, plan);
}

}  // namespace attnkit::vulkan
