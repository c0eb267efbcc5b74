// The Vulkan backend's device context: instance (with the validation layers when asked), the chosen physical
// device, a logical device with one compute queue, a command pool, the device's limits and the buffers and
// pipelines made on it. One shared context per process (shared_context()): made on first use (or on the caller's
// device, Options::adopt), destroyed by shutdown() or an exit handler (context.cpp says why).
#pragma once

#include <attnkit/vulkan.hpp>

#include <vulkan/vulkan.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace attnkit::vulkan {

// Throws RuntimeError naming the call when a Vulkan call fails.
void check(VkResult result, const char* call);

class Context;

// A buffer and its own memory; host-visible buffers stay mapped.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Context& ctx, VkDeviceSize bytes, VkBufferUsageFlags usage, bool host_visible);
  ~Buffer();
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  VkBuffer handle() const { return buffer_; }
  VkDeviceSize bytes() const { return bytes_; }
  std::byte* mapped() const { return mapped_; }

 private:
  VkDevice device_ = VK_NULL_HANDLE;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  VkDeviceSize bytes_ = 0;
  std::byte* mapped_ = nullptr;
};

// A compute pipeline of one shader with its specialization constants.
struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
};

class Context {
 public:
  explicit Context(const Options& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkInstance instance() const { return instance_; }
  VkDevice device() const { return device_; }
  std::uint32_t queue_family() const { return queue_family_; }
  VkPhysicalDevice physical() const { return physical_; }
  VkQueue queue() const { return queue_; }
  VkCommandPool command_pool() const { return pool_; }
  VkDescriptorSetLayout set_layout() const { return set_layout_; }
  const DeviceInfo& info() const { return info_; }
  const VkPhysicalDeviceLimits& limits() const { return limits_; }
  std::uint32_t memory_type(std::uint32_t allowed, VkMemoryPropertyFlags want, VkMemoryPropertyFlags avoid) const;
  bool has_timestamps() const { return timestamp_period_ns_ > 0.0; }
  double timestamp_period_ns() const { return timestamp_period_ns_; }

  // The pipeline of `shader` (a SPIR-V module by name) with these specialization constants, made once and kept.
  const Pipeline& pipeline(const std::string& shader, std::span<const std::uint32_t> spirv,
                           const std::vector<std::int32_t>& constants);

  // One queue for every plan of the process: submissions are serialised here.
  std::mutex& queue_mutex() { return queue_mutex_; }

  std::vector<std::string> validation_errors() const;
  // The driver's statistics of every pipeline made so far (pipeline_statistics.cpp); empty unless captured.
  std::vector<std::string> pipeline_statistics();
  void record_validation_error(std::string message);

 private:
  void make_device(const Options& options);
  void adopt(const Options& options);
  void make_layouts();

  bool capture_statistics_ = false;  // Options::pipeline_statistics, where the device offers them
  bool owns_device_ = true;  // false: Options::adopt's device and instance, the caller's to destroy
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t queue_family_ = 0;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout_ = VK_NULL_HANDLE;
  VkPhysicalDeviceLimits limits_{};
  VkPhysicalDeviceMemoryProperties memory_{};
  double timestamp_period_ns_ = 0.0;
  DeviceInfo info_;
  std::map<std::tuple<std::string, std::vector<std::int32_t>>, Pipeline> pipelines_;
  std::map<std::string, VkShaderModule> modules_;
  std::mutex pipelines_mutex_, queue_mutex_;
  mutable std::mutex errors_mutex_;
  std::vector<std::string> errors_;
};

// The process's context (made with the configured options on first call). Throws Error when no usable device.
Context& shared_context();
// Whether a usable device exists (makes the context; false when making it fails).
bool context_available();
// True once the process's exit has destroyed the context (and with its device everything made on it): objects
// that outlive it make no Vulkan call.
bool context_gone();

// The bindings of common.glsl: 0 the parameter block, 1..15 the storage buffers.
inline constexpr std::uint32_t kStorageBindings = 15;

}  // namespace attnkit::vulkan
