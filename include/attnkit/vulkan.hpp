// The Vulkan backend's own knobs (Backend::Vulkan runs through the ordinary Attention API on host buffers), and
// calls on tensors that already live in device memory (DeviceAttention). Nothing here includes Vulkan's headers:
// handles are passed as the integers they are (a VkBuffer as its uint64_t, a VkCommandBuffer as its address).
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attnkit::vulkan {

// A device the caller made (an engine that already runs on Vulkan), for the backend to run on instead of making
// its own. The caller made `device` on `physical_device` of `instance` (Vulkan 1.2 or later) with the features
// shaderInt64 and storageBuffer16BitAccess enabled, and `queue` is a queue of `queue_family`, a family with compute;
// `cooperative_matrix`: it also enabled VK_NV_cooperative_matrix with its cooperativeMatrix feature, shaderFloat16
// and vulkanMemoryModel, so that the float16 cooperative-matrix kernel may run. The caller keeps the handles: the
// backend never destroys them, and shutdown() must come before the caller destroys them. The backend submits
// (DeviceAttention::run, Attention on host buffers) to `queue` under its own lock: the caller must not submit to the
// same queue from another thread at the same time (Vulkan's rule for a queue); DeviceAttention::record submits
// nothing.
struct AdoptedDevice {
  std::uint64_t instance = 0, physical_device = 0, device = 0, queue = 0;  // VkInstance, ..., VkQueue
  std::uint32_t queue_family = 0;
  bool cooperative_matrix = false;
};

// How the backend's shared context (instance, device, queue) is made. It is made on first use; configure()
// must come before that, or it throws attnkit::Error("vulkan.configure", ...).
struct Options {
  int device = -1;          // index into devices(); -1: the first discrete GPU, else integrated, virtual, CPU
  bool validation = false;  // load the Khronos validation layers and record what they report as errors
  bool pipeline_statistics = false;  // ask the driver to keep each pipeline's statistics (pipeline_statistics())
  AdoptedDevice adopt;      // adopt.device != 0: run on the caller's device (device and validation stay unset:
                            // the caller's instance has whatever layers the caller gave it)
};
void configure(const Options& options);
// Destroys what the backend made on its device (pipelines, command pool, layouts) and the device and instance if it
// made them; after it, the backend is gone for the rest of the process (a call throws attnkit::Error). With an
// adopted device, call it after destroying every DeviceAttention and Vulkan Attention (they free their buffers) and
// before destroying the device. (Without it the backend cleans up at exit.)
void shutdown();
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

// What the driver reports of each pipeline made so far (VK_KHR_pipeline_executable_properties: registers, shared
// memory, spills, ... as the driver names them), one line per pipeline, executable and statistic: "shader
// [specialization constants] executable: statistic = value". Empty unless Options::pipeline_statistics was set and
// the device offers the extension (the backend's own device only).
std::vector<std::string> pipeline_statistics();

// GPU time, in milliseconds, of the kernels of the last run() on this thread (Attention on host buffers or
// DeviceAttention::run; timestamp queries around the dispatches; 0 when the device has no timestamps).
double last_gpu_milliseconds();

// The backend's instance, device and queue (makes the context; throws attnkit::Error when no device is usable),
// for an engine that keeps its tensors on that device: buffers it makes on `device` (with
// VK_BUFFER_USAGE_STORAGE_BUFFER_BIT) can be DeviceAttention's inputs and outputs. The handles stay the
// backend's: do not destroy them (with Options::adopt they are the caller's own).
struct NativeHandles {
  std::uint64_t instance = 0, physical_device = 0, device = 0, queue = 0;  // VkInstance, ..., VkQueue
  std::uint32_t queue_family = 0;  // the compute queue's family (for the caller's command pool)
};
NativeHandles native_handles();

// A tensor in device memory: a VkBuffer made on native_handles().device, the byte offset of the tensor's element
// 0 (its layout's index 0) in it, and the buffer's size in bytes. buffer == 0: no such tensor.
struct DeviceBuffer {
  std::uint64_t buffer = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};
// The device counterpart of AttentionArgs (no caller scratch: the object holds its own).
struct DeviceArgs {
  DeviceBuffer q, k, v, o;
  DeviceBuffer mask, key_lengths, causal_offsets, head_sink, lse;
  DeviceBuffer cu_seqlens_q, cu_seqlens_k, block_table;  // int32, where problem.sequences has them
  // Optional: one int32 the call sets to -1, then to the lowest batch entry whose device values (key length,
  // cu_seqlens, block-table entries) are out of range (as CUDA's AttentionArgs::status). The call fills it with a
  // transfer command: a buffer made with VK_BUFFER_USAGE_TRANSFER_DST_BIT, the offset a multiple of 4.
  DeviceBuffer status;
};

// An attention problem on device buffers: planned once (the problem's rules as Attention checks them, the plan as
// Backend::Vulkan makes it), then run on any buffers that hold the problem's tensors. Every call checks its
// buffers first (a buffer where the problem has a tensor and none where it has not, the span each layout reaches
// inside its buffer, the first reached byte of each on the device's minStorageBufferOffsetAlignment, outputs
// overlapping no other tensor) and throws attnkit::Error naming the argument before anything is recorded or
// written. Values in device memory cannot be checked: a key length outside [0, k_len] hides every key of its batch
// entry (its rows are masked rows), as on the CUDA backend (docs/numerics.md); per-batch causal offsets are
// clamped to [-(q_len + 1), k_len], which leaves every row's visible keys as they were. Ragged and paged batches
// (problem.sequences) take their cu_seqlens and block tables from device buffers too, judged per entry by the
// shaders as on CUDA: an entry whose queries cannot be placed (cu_seqlens_q[b] < 0, cu_seqlens_q[b + 1] below it
// or past total_q, more than q_len rows) has none of its rows written; one whose keys cannot be read (the same
// rules for cu_seqlens_k against total_k and k_len, a key length outside [0, k_len], a block-table entry its keys
// reach outside [0, num_pages)) sees no key (masked rows); every other entry gets the bits of a call without the
// bad value; the lowest such entry goes to DeviceArgs::status when given.
class Session;  // (the backend's planned problem)
class DeviceAttention {
 public:
  explicit DeviceAttention(const AttentionProblem& problem, const PlanOverrides& plan = {});
  ~DeviceAttention();
  DeviceAttention(DeviceAttention&&) noexcept;
  DeviceAttention& operator=(DeviceAttention&&) noexcept;

  const AttentionProblem& problem() const;  // with every default filled in
  std::string describe() const;
  // Records the call into `command_buffer` (a VkCommandBuffer of native_handles().device in the recording state,
  // from a pool of queue_family): a barrier that makes earlier writes visible to its shaders, the dispatches, and a
  // barrier after which later commands see O and the LSE. The object's partials are shared by its recordings:
  // submissions of two of them must not overlap in time (one queue, in order, is enough).
  void record(const DeviceArgs& args, std::uint64_t command_buffer);
  // Submits the call on the backend's queue and waits for it. Calls on one object take turns (a lock).
  void run(const DeviceArgs& args);

 private:
  std::shared_ptr<Session> session_;
};

}  // namespace attnkit::vulkan
