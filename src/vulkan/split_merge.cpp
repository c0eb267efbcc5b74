// The split-K merge pass (shaders/split_merge.comp): folds the key ranges' partials in range order.
#include "kernels.hpp"

namespace attnkit::vulkan {
namespace {
constexpr std::uint32_t kSpirv[] = {
#include "split_merge.spv.inc"
};
}  // namespace

KernelShader merge_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  return {"split_merge", kSpirv, common_constants(p, plan)};
}

}  // namespace attnkit::vulkan
