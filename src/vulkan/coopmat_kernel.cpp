// The cooperative-matrix kernel (shaders/attention_coopmat.comp): float16, 16x16x16 matrices, one pass; its
// emulated build (matrix steps as scalar loops) where the device has no matrices.
#include "kernels.hpp"

namespace attnkit::vulkan {
namespace {
constexpr std::uint32_t kSpirv[] = {
#include "attention_coopmat.spv.inc"
};
constexpr std::uint32_t kEmulated[] = {
#include "attention_coopmat_emulated.spv.inc"
};
}  // namespace

KernelShader coopmat_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  if (plan.emulated_matrices) return {"attention_coopmat_emulated", kEmulated, common_constants(p, plan)};
  return {"attention_coopmat", kSpirv, common_constants(p, plan)};
}

}  // namespace attnkit::vulkan
