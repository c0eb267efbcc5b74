// Calls on the caller's own device buffers (DeviceAttention): each buffer checked against the span its layout
// reaches, bound from the tensor's first reached byte (so the shaders' layouts are the host path's), and the
// dispatches recorded into the caller's command buffer or into one of the session's, kept per set of buffers.
#include "core/problem_check.hpp"
#include "core/require.hpp"
#include "session.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

namespace attnkit::vulkan {
namespace {

// The caller's buffer of a binding.
const DeviceBuffer& device_buffer(const DeviceArgs& a, std::uint32_t binding) {
  static const DeviceBuffer kNone{};
  switch (binding) {
    case kQ: return a.q;
    case kK: return a.k;
    case kV: return a.v;
    case kO: return a.o;
    case kMask: return a.mask;
    case kKeyLengths: return a.key_lengths;
    case kCausalOffsets: return a.causal_offsets;
    case kHeadSink: return a.head_sink;
    case kLse: return a.lse;
    case kCuSeqlensQ: return a.cu_seqlens_q;
    case kCuSeqlensK: return a.cu_seqlens_k;
    case kBlockTable: return a.block_table;
    default: return kNone;
  }
}

// The bytes [first, end) of the caller's buffer that a tensor's layout reaches.
struct ByteRange {
  std::uint64_t buffer = 0, first = 0, end = 0;
  bool overlaps(const ByteRange& o) const { return buffer != 0 && buffer == o.buffer && first < o.end && o.first < end; }
};

}  // namespace

std::array<VkDescriptorBufferInfo, kBindingCount> Session::device_ranges(const DeviceArgs& args) const {
  const std::uint64_t align = ctx_.limits().minStorageBufferOffsetAlignment;
  std::array<ByteRange, kBindingCount> ranges{};
  for (std::uint32_t b = kQ; b < kPartials; ++b) {
    const Region& r = regions_[b];
    const DeviceBuffer& d = device_buffer(args, b);
    const std::string name = r.name;
    if (r.bytes == 0) {
      ATTNKIT_REQUIRE(d.buffer == 0, name, "a buffer is given, but the problem has no such tensor (or it reaches nothing)");
      continue;
    }
    ATTNKIT_REQUIRE(d.buffer != 0, name, "the problem has this tensor: a VkBuffer is needed");
    const std::uint64_t lowest_bytes = static_cast<std::uint64_t>(r.lowest) * r.element_size;
    ATTNKIT_REQUIRE(d.offset <= std::numeric_limits<std::uint64_t>::max() - lowest_bytes - r.bytes, name + ".offset",
                    "offset plus the span the layout reaches does not fit 64 bits");
    const std::uint64_t first = d.offset + lowest_bytes;
    ATTNKIT_REQUIRE(first % align == 0, name + ".offset",
                    "the tensor's first reached byte (offset + " + std::to_string(lowest_bytes) + " = " +
                        std::to_string(first) + ") must be a multiple of the device's minStorageBufferOffsetAlignment (" +
                        std::to_string(align) + ")");
    ATTNKIT_REQUIRE(first + r.bytes <= d.size, name + ".size",
                    "the layout reaches byte " + std::to_string(first + r.bytes) + " of a buffer of " +
                        std::to_string(d.size) + " bytes");
    ranges[b] = {d.buffer, first, first + r.bytes};
  }
  // The status word (optional): one int32 at its offset, which the call fills (vkCmdFillBuffer: a multiple of 4).
  if (const DeviceBuffer& d = args.status; d.buffer != 0) {
    ATTNKIT_REQUIRE(d.offset % std::max<std::uint64_t>(align, 4) == 0, "status.offset",
                    "must be a multiple of 4 and of the device's minStorageBufferOffsetAlignment (" + std::to_string(align) + ")");
    ATTNKIT_REQUIRE(d.offset <= d.size && d.size - d.offset >= 4, "status.size",
                    "the status word needs 4 bytes from its offset");
    ranges[kStatus] = {d.buffer, d.offset, d.offset + 4};
  }
  auto name_of = [&](std::uint32_t b) { return b == kStatus ? std::string("status") : std::string(regions_[b].name); };
  for (std::uint32_t out : {kO, kLse, kStatus}) {
    for (std::uint32_t b = kQ; b < kBindingCount; ++b) {
      if (b == kPartials || b == kThreadScratch) continue;
      ATTNKIT_REQUIRE(b == out || !ranges[out].overlaps(ranges[b]), name_of(out),
                      "its bytes overlap those of " + name_of(b) + " in the same buffer");
    }
  }
  std::array<VkDescriptorBufferInfo, kBindingCount> infos{};
  for (std::uint32_t b = kQ; b < kBindingCount; ++b) {
    if (ranges[b].buffer == 0) continue;
    infos[b] = {reinterpret_cast<VkBuffer>(ranges[b].buffer), ranges[b].first, ranges[b].end - ranges[b].first};
  }
  return infos;
}

// The status word set to -1 (device-buffer calls: the caller's, else the session's own); earlier writes (shaders,
// copies, the host) visible to the call's shaders; then the launches; then its writes visible to whatever the
// caller records next.
void Session::record_dispatches(VkCommandBuffer cb, VkDescriptorSet set, bool host, const VkDescriptorBufferInfo& status) {
  if (device_values_) {
    const bool given = status.buffer != VK_NULL_HANDLE;
    vkCmdFillBuffer(cb, given ? status.buffer : device_[kStatus].handle(), given ? status.offset : 0, 4, 0xffffffffu);
  }
  memory_barrier(cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_MEMORY_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
  const std::int64_t launches =
      plan_.workgroups > 0 ? (plan_.workgroups + plan_.per_launch - 1) / plan_.per_launch : 1;
  for (std::int64_t i = 0; i < launches; ++i) record_launch(cb, set, i, launches, host);
  memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                 VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
}

Session::DeviceCall& Session::device_call(const DeviceArgs& args, bool with_commands) {
  const auto infos = device_ranges(args);  // (throws before anything is made)
  std::vector<std::uint64_t> key;
  for (const auto& i : infos) {
    key.push_back(reinterpret_cast<std::uint64_t>(i.buffer));
    key.push_back(i.offset);
    key.push_back(i.range);
  }
  DeviceCall& call = device_calls_[key];
  if (call.set == VK_NULL_HANDLE) {
    call.set = allocate_set();
    write_set(call.set, infos);
    call.status = infos[kStatus];
  }
  if (with_commands && call.commands == VK_NULL_HANDLE) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = ctx_.command_pool();
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(ctx_.device(), &ai, &call.commands), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check(vkBeginCommandBuffer(call.commands, &bi), "vkBeginCommandBuffer");
    // (timestamps around the kernels for last_gpu_milliseconds(); not in a caller's command buffer)
    if (queries_ != VK_NULL_HANDLE) {
      vkCmdResetQueryPool(call.commands, queries_, 0, 2);
      vkCmdWriteTimestamp(call.commands, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, 0);
    }
    record_dispatches(call.commands, call.set, false, call.status);
    if (queries_ != VK_NULL_HANDLE) vkCmdWriteTimestamp(call.commands, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 1);
    check(vkEndCommandBuffer(call.commands), "vkEndCommandBuffer");
  }
  return call;
}

void Session::record_device(const DeviceArgs& args, VkCommandBuffer cb) {
  ATTNKIT_REQUIRE(cb != VK_NULL_HANDLE, "command_buffer", "a VkCommandBuffer in the recording state is needed");
  std::lock_guard run_lock(run_lock_);
  const DeviceCall& call = device_call(args, false);
  record_dispatches(cb, call.set, false, call.status);
}

void Session::run_device(const DeviceArgs& args) {
  std::lock_guard run_lock(run_lock_);
  const DeviceCall& call = device_call(args, true);
  std::lock_guard lock(ctx_.queue_mutex());
  check(vkResetFences(ctx_.device(), 1, &fence_), "vkResetFences");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &call.commands;
  check(vkQueueSubmit(ctx_.queue(), 1, &si, fence_), "vkQueueSubmit");
  check(vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, std::numeric_limits<std::uint64_t>::max()), "vkWaitForFences");
  read_gpu_time();
}

NativeHandles native_handles() {
  Context& ctx = shared_context();
  NativeHandles h;
  h.instance = reinterpret_cast<std::uint64_t>(ctx.instance());
  h.physical_device = reinterpret_cast<std::uint64_t>(ctx.physical());
  h.device = reinterpret_cast<std::uint64_t>(ctx.device());
  h.queue = reinterpret_cast<std::uint64_t>(ctx.queue());
  h.queue_family = ctx.queue_family();
  return h;
}

DeviceAttention::DeviceAttention(const AttentionProblem& problem, const PlanOverrides& plan) {
  const AttentionProblem p = core::normalize_and_check(problem);
  PlanOverride force;
  force.kernel = plan.kernel;
  force.key_splits = plan.splits;
  session_ = std::make_shared<Session>(p, force, true);
}
DeviceAttention::~DeviceAttention() = default;
DeviceAttention::DeviceAttention(DeviceAttention&&) noexcept = default;
DeviceAttention& DeviceAttention::operator=(DeviceAttention&&) noexcept = default;

const AttentionProblem& DeviceAttention::problem() const { return session_->problem(); }
std::string DeviceAttention::describe() const {
  return vulkan::describe(session_->plan()) + " on " + shared_context().info().name;
}
void DeviceAttention::record(const DeviceArgs& args, std::uint64_t command_buffer) {
  session_->record_device(args, reinterpret_cast<VkCommandBuffer>(command_buffer));
}
void DeviceAttention::run(const DeviceArgs& args) { session_->run_device(args); }

}  // namespace attnkit::vulkan
