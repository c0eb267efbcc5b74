// The cooperative-matrix kernel (shaders/attention_coopmat.comp): float16, 16x16x16 matrices, two passes.
#include "kernels.hpp"

namespace attnkit::vulkan {
namespace {
constexpr std::uint32_t kSpirv[] = {
#include "attention_coopmat.spv.inc"
};
}  // namespace

KernelShader coopmat_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  return {"attention_coopmat", kSpirv, common_constants(p, plan)};
}

}  // namespace attnkit::vulkan
