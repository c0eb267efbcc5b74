// A planned problem on the Vulkan device (vulkan_backend.cpp: planning and host-buffer calls; device_buffers.cpp:
// calls on the caller's own device buffers). Everything a call needs is made here once: the plan, the pipelines,
// the parameter block, the partials and scratch of the merge, and for host buffers the device copies, staging
// buffers and recorded command buffers.
#pragma once

#include "context.hpp"
#include "vulkan_params.hpp"
#include "vulkan_plan.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace attnkit::vulkan {

// Bindings of common.glsl: the call's buffers (kQ up to kPartials: uploaded from, or bound to, the caller's), then the
// session's own, then the status word (the caller's on device buffers when given, else the session's own).
enum Binding : std::uint32_t {
  kQ = 1, kK, kV, kO, kMask, kKeyLengths, kCausalOffsets, kHeadSink, kLse, kCuSeqlensQ, kCuSeqlensK, kBlockTable,
  kPartials, kThreadScratch, kStatus
};
inline constexpr std::uint32_t kBindingCount = kStatus + 1;

// One tensor's region: the element span its layout reaches, moved (host buffers) or bound (device buffers) as bytes.
struct Region {
  const char* name = "";
  std::int64_t lowest = 0;     // first element reached
  std::uint64_t bytes = 0;     // 0: nothing reached (or no such tensor)
  std::size_t element_size = 4;
  bool output = false;         // copied back after the run (its gaps are uploaded first, so they come back as they were)
  VkDeviceSize staging_offset = 0;
};

// One pipeline barrier over all memory of the stages given (vulkan_backend.cpp).
void memory_barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access);

class Session {
 public:
  // device_values: the calls take the caller's device buffers (DeviceAttention), whose key lengths, cu_seqlens and
  // block tables the shaders judge themselves (common.glsl's sequence_rows).
  Session(const AttentionProblem& p, const PlanOverride& force, bool device_values = false);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Host buffers: copies the inputs in, runs, copies O (and the LSE) out; one call at a time (a lock).
  void run(const AttentionArgs& args);
  // The caller's device buffers: records the call into `cb` (device_buffers.cpp), or submits it and waits.
  void record_device(const DeviceArgs& args, VkCommandBuffer cb);
  void run_device(const DeviceArgs& args);
  const VulkanPlan& plan() const { return plan_; }
  const AttentionProblem& problem() const { return p_; }

 private:
  // A descriptor set over the caller's buffers, and the command buffer run_device submits with it.
  struct DeviceCall {
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkCommandBuffer commands = VK_NULL_HANDLE;
    VkDescriptorBufferInfo status{};  // the caller's status word (buffer null: none given)
  };

  void make_regions();
  ShaderParams make_params() const;
  void make_buffers();
  VkDescriptorSet allocate_set();
  void write_set(VkDescriptorSet set, const std::array<VkDescriptorBufferInfo, kBindingCount>& tensors);
  void record();
  void record_launch(VkCommandBuffer cb, VkDescriptorSet set, std::int64_t launch, std::int64_t launches, bool host);
  void record_dispatches(VkCommandBuffer cb, VkDescriptorSet set, bool host, const VkDescriptorBufferInfo& status);
  const void* host_source(const AttentionArgs& a, std::uint32_t binding) const;
  std::array<VkDescriptorBufferInfo, kBindingCount> device_ranges(const DeviceArgs& args) const;
  DeviceCall& device_call(const DeviceArgs& args, bool with_commands);
  void read_gpu_time();  // the timestamps around the last submitted call's kernels into last_gpu_milliseconds()

  Context& ctx_;
  AttentionProblem p_;
  bool device_values_ = false;
  VulkanPlan plan_;
  const Pipeline* main_ = nullptr;
  const Pipeline* merge_ = nullptr;
  std::array<Region, kBindingCount> regions_{};
  Buffer params_, upload_, download_, dummy_;
  std::array<Buffer, kBindingCount> device_{};
  std::vector<VkDescriptorPool> pools_;  // sets of kSetsPerPool; the first one's first set is the host path's
  std::uint32_t sets_in_pool_ = 0;
  VkDescriptorSet set_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> commands_;
  std::map<std::vector<std::uint64_t>, DeviceCall> device_calls_;  // by the caller's (buffer, offset) pairs
  std::mutex run_lock_;
};

}  // namespace attnkit::vulkan
