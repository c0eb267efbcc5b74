// The split-K merge pass (shaders/split_merge.comp): folds the key ranges' partials in range order.
#include "kernels.hpp"

namespace attnkit::vulkan {
namespace {
constexpr std::uint32_t kLoops[] = {
#include "split_merge.spv.inc"
};
constexpr std::uint32_t kUnrolled[] = {
#include "split_merge_unrolled.spv.inc"
};
}  // namespace

KernelShader merge_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  if (plan.unrolled) return {"split_merge_unrolled", kUnrolled, common_constants(p, plan)};
  return {"split_merge", kLoops, common_constants(p, plan)};
}

}  // namespace attnkit::vulkan
