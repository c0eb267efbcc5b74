// The Vulkan backend's own knobs (Backend::Vulkan runs through the ordinary Attention API on host buffers).
// Nothing here includes Vulkan's headers: handles are passed as the integers / pointers they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnkit::vulkan {

// How the backend's shared context (instance, device, queue) is made. It is made on first use; configure()
// must come before that, or it throws attnkit::Error("vulkan.configure", ...).
struct Options {
  int device = -1;          // index into devices(); -1: the first discrete GPU, else integrated, virtual, CPU
  bool validation = false;  // load the Khronos validation layers and record what they report as errors
};
void configure(const Options& options);
// Whether the Khronos validation layer is installed (Options::validation needs it).
bool validation_available();

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string type;            // "discrete", "integrated", "virtual", "cpu", "other"
  std::string driver;          // driver name and version as the driver reports them
  std::uint32_t api_version = 0;
  bool usable = false;         // offers what the kernels need (a compute queue, 16-bit storage, 64-bit ints)
  bool cooperative_matrix = false;  // float16 16x16x16 cooperative matrices with float32 accumulators
  std::uint32_t subgroup_size = 0;
  std::uint32_t shared_memory_bytes = 0;
};
// Every Vulkan device the loader finds (empty without a loader or a driver). Does not make the context.
std::vector<DeviceInfo> devices();
// The device the shared context runs on (makes the context; throws attnkit::Error when none is usable).
DeviceInfo current_device();

// Messages of severity "error" the validation layers reported since the context was made (Options::validation).
std::vector<std::string> validation_errors();

// GPU time, in milliseconds, of the kernels of the last run() on this thread (timestamp queries around the
// dispatches; 0 when the device has no timestamps).
double last_gpu_milliseconds();

}  // namespace attnkit::vulkan
