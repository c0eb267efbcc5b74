// The scalar online-softmax kernel (shaders/attention_rows.comp): one thread per query row, every device.
#include "kernels.hpp"

namespace attnkit::vulkan {
namespace {
constexpr std::uint32_t kLoops[] = {
#include "attention_rows.spv.inc"
};
constexpr std::uint32_t kUnrolled[] = {
#include "attention_rows_unrolled.spv.inc"
};

std::int32_t elem_code(DType t) { return t == DType::f32 ? 0 : t == DType::f16 ? 1 : 2; }
}  // namespace

std::vector<std::int32_t> common_constants(const AttentionProblem& p, const VulkanPlan& plan) {
  return {elem_code(p.dtype), elem_code(p.mask_dtype), static_cast<std::int32_t>(p.head_dim),
          static_cast<std::int32_t>(p.v_head_dim), plan.tile_keys, p.sequences.any() ? 1 : 0};
}

KernelShader rows_kernel(const AttentionProblem& p, const VulkanPlan& plan) {
  if (plan.unrolled) return {"attention_rows_unrolled", kUnrolled, common_constants(p, plan)};
  return {"attention_rows", kLoops, common_constants(p, plan)};
}

}  // namespace attnkit::vulkan
