#include "kernels.hpp"
#include <attnkit/error.hpp>
namespace attnkit::vulkan {
KernelShader coopmat_kernel(const AttentionProblem&, const VulkanPlan&) { throw RuntimeError("coopmat: in progress"); }
}
