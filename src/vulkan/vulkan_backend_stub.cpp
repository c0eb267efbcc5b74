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
bool validation_available() { return false; }
std::vector<DeviceInfo> devices() { return {}; }
DeviceInfo current_device() { throw Error("config.backend", "the Vulkan backend is not part of this build"); }
std::vector<std::string> validation_errors() { return {}; }
double last_gpu_milliseconds() { return 0.0; }

}  // namespace attnkit::vulkan
