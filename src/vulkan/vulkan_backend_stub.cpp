// The Vulkan backend when the build has none: nothing is available, and asking for it is an error.
#include "vulkan_backend.hpp"

#include <attnkit/vulkan.hpp>

namespace attnkit::vulkan {

class Session {};
bool available() { return false; }
std::shared_ptr<Session> plan(const AttentionProblem&, const std::string&, std::int64_t) {
  throw Error("config.backend", "the Vulkan backend is not part of this build");
}
std::string describe(const Session&) { return "vulkan (not built)"; }
void run(Session&, const AttentionArgs&) { throw Error("config.backend", "the Vulkan backend is not part of this build"); }

void configure(const Options&) {}
void shutdown() {}
bool validation_available() { return false; }
std::vector<DeviceInfo> devices() { return {}; }
DeviceInfo current_device() { throw Error("config.backend", "the Vulkan backend is not part of this build"); }
std::vector<std::string> validation_errors() { return {}; }
std::vector<std::string> pipeline_statistics() { return {}; }
double last_gpu_milliseconds() { return 0.0; }
NativeHandles native_handles() { throw Error("config.backend", "the Vulkan backend is not part of this build"); }

DeviceAttention::DeviceAttention(const AttentionProblem&, const PlanOverrides&) {
  throw Error("config.backend", "the Vulkan backend is not part of this build");
}
DeviceAttention::~DeviceAttention() = default;
DeviceAttention::DeviceAttention(DeviceAttention&&) noexcept = default;
DeviceAttention& DeviceAttention::operator=(DeviceAttention&&) noexcept = default;
const AttentionProblem& DeviceAttention::problem() const { throw Error("config.backend", "the Vulkan backend is not part of this build"); }
std::string DeviceAttention::describe() const { return "vulkan (not built)"; }
void DeviceAttention::record(const DeviceArgs&, std::uint64_t) {
  throw Error("config.backend", "the Vulkan backend is not part of this build");
}
void DeviceAttention::run(const DeviceArgs&) { throw Error("config.backend", "the Vulkan backend is not part of this build"); }

}  // namespace attnkit::vulkan
