// Host-buffer calls on the Vulkan backend. Planning makes everything a run needs: the plan (vulkan_plan.cpp),
// the pipelines (cached per shape in the context), one device buffer per tensor sized by the span its layout
// reaches, staging buffers, the descriptor set, and the command buffers (upload, the main kernel's launches, the
// merge pass, download), recorded once. A run copies the host inputs into staging, submits, waits and copies
// O and the LSE back: no allocation, no recording.
#include "vulkan_backend.hpp"

#include "context.hpp"
#include "core/problem_check.hpp"
#include "session.hpp"
#include "core/require.hpp"
#include "kernels.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <limits>

namespace attnkit::vulkan {
namespace {

thread_local double g_last_gpu_ms = 0.0;

ShaderLayout shader_layout(const Layout& l, std::int64_t lowest, std::int64_t batch, std::int64_t heads,
                           std::int64_t rows, const char* name) {
  // A stride over an extent of 1 is never multiplied by a nonzero index: 0 keeps it in 32 bits.
  const std::int64_t fields[4] = {l.offset - lowest, batch > 1 ? l.batch_stride : 0, heads > 1 ? l.head_stride : 0,
                                  rows > 1 ? l.row_stride : 0};
  for (std::int64_t f : fields) {
    ATTNKIT_REQUIRE(f >= 0 && f <= std::numeric_limits<std::uint32_t>::max(), name,
                    "the Vulkan backend needs offsets and strides below 2^32 elements");
  }
  return {static_cast<std::uint32_t>(fields[0]), static_cast<std::uint32_t>(fields[1]),
          static_cast<std::uint32_t>(fields[2]), static_cast<std::uint32_t>(fields[3])};
}

VulkanTraits traits_of(const Context& ctx) {
  VulkanTraits t;
  t.cpu_device = ctx.info().type == "cpu";
  t.cooperative_matrix = ctx.info().cooperative_matrix;
  t.subgroup_size = ctx.info().subgroup_size;
  t.shared_memory_bytes = ctx.limits().maxComputeSharedMemorySize;
  t.max_groups_x = ctx.limits().maxComputeWorkGroupCount[0];
  t.max_buffer_bytes = ctx.limits().maxStorageBufferRange;
  return t;
}

}  // namespace

void memory_barrier(VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access) {
  VkMemoryBarrier b{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cb, src, dst, 0, 1, &b, 0, nullptr, 0, nullptr);
}


Session::Session(const AttentionProblem& p, const PlanOverride& force, bool device_values)
    : ctx_(shared_context()), p_(p), device_values_(device_values) {
  plan_ = plan_for(p_, traits_of(ctx_), force);
  const KernelShader main = main_kernel(p_, plan_);
  main_ = &ctx_.pipeline(main.name, main.spirv, main.constants);
  if (plan_.splits > 1) {
    const KernelShader merge = merge_kernel(p_, plan_);
    merge_ = &ctx_.pipeline(merge.name, merge.spirv, merge.constants);
  }
  make_regions();
  make_buffers();
  set_ = allocate_set();
  std::array<VkDescriptorBufferInfo, kBindingCount> tensors{};
  for (std::uint32_t b = kQ; b < kPartials; ++b) tensors[b] = {device_[b].handle(), 0, VK_WHOLE_SIZE};
  write_set(set_, tensors);
  record();
}

Session::~Session() {
  if (context_gone()) return;  // destroyed with the context's device at exit
  VkDevice d = ctx_.device();
  if (fence_ != VK_NULL_HANDLE) vkDestroyFence(d, fence_, nullptr);
  if (!commands_.empty()) vkFreeCommandBuffers(d, ctx_.command_pool(), static_cast<std::uint32_t>(commands_.size()), commands_.data());
  if (queries_ != VK_NULL_HANDLE) vkDestroyQueryPool(d, queries_, nullptr);
  for (auto& [key, call] : device_calls_) {
    if (call.commands != VK_NULL_HANDLE) vkFreeCommandBuffers(d, ctx_.command_pool(), 1, &call.commands);
  }
  for (VkDescriptorPool pool : pools_) vkDestroyDescriptorPool(d, pool, nullptr);
}

// Q, O and the LSE hold [leading, rows] rows per head ([1, total_q] when ragged), K and V [num_pages, page_size]
// when paged, [1, total_k] when ragged (core::query_extent / key_extent): the spans that are uploaded or bound.
void Session::make_regions() {
  const std::size_t es = dtype_size(p_.dtype);
  const core::Extent qe = core::query_extent(p_), ke = core::key_extent(p_);
  auto tensor = [&](std::uint32_t binding, const char* name, const Layout& l, core::Extent e, std::int64_t heads,
                    std::int64_t cols, std::size_t size, bool output) {
    const core::IndexSpan s = core::index_span(l, e.leading, heads, e.rows, cols);
    Region& r = regions_[binding];
    r.name = name;
    r.element_size = size;
    r.output = output;
    if (!s.empty()) {
      r.lowest = s.lowest;
      r.bytes = static_cast<std::uint64_t>(s.highest - s.lowest + 1) * size;
    }
    ATTNKIT_REQUIRE(r.bytes <= ctx_.limits().maxStorageBufferRange, name,
                    "the span its layout reaches exceeds the device's largest storage buffer (" +
                        std::to_string(ctx_.limits().maxStorageBufferRange) + " bytes)");
  };
  auto flat = [&](std::uint32_t binding, const char* name, bool present, std::int64_t count) {
    Region& r = regions_[binding];
    r.name = name;
    ATTNKIT_REQUIRE(!present || static_cast<std::uint64_t>(count) <= ctx_.limits().maxStorageBufferRange / 4, name,
                    "exceeds the device's largest storage buffer (" +
                        std::to_string(ctx_.limits().maxStorageBufferRange) + " bytes)");
    r.bytes = present ? static_cast<std::uint64_t>(count) * 4 : 0;
  };
  // Every binding's name, for the device-buffer checks' messages (a tensor the problem has not keeps 0 bytes).
  const char* names[] = {"", "q", "k", "v", "o", "mask", "key_lengths", "causal_offsets", "head_sink", "lse",
                         "cu_seqlens_q", "cu_seqlens_k", "block_table"};
  static_assert(std::size(names) == kPartials);
  for (std::uint32_t b = kQ; b < kPartials; ++b) regions_[b].name = names[b];
  tensor(kQ, "q", p_.q, qe, p_.heads, p_.head_dim, es, false);
  tensor(kK, "k", p_.k, ke, p_.kv_heads, p_.head_dim, es, false);
  tensor(kV, "v", p_.v, ke, p_.kv_heads, p_.v_head_dim, es, false);
  tensor(kO, "o", p_.o, qe, p_.heads, p_.v_head_dim, es, true);
  if (p_.has_mask) {
    tensor(kMask, "mask", p_.mask, {p_.batch, p_.q_len}, p_.heads, p_.k_len, dtype_size(p_.mask_dtype), false);
  }
  if (p_.return_lse) tensor(kLse, "lse", p_.lse, qe, p_.heads, 1, 4, true);
  flat(kKeyLengths, "key_lengths", p_.has_key_lengths, p_.batch);
  flat(kCausalOffsets, "causal_offsets", p_.has_causal_offsets, p_.batch);
  flat(kHeadSink, "head_sink", p_.has_head_sink, p_.heads);
  const SequenceLayout& seq = p_.sequences;
  flat(kCuSeqlensQ, "cu_seqlens_q", seq.ragged_q, p_.batch + 1);
  flat(kCuSeqlensK, "cu_seqlens_k", seq.ragged_k, p_.batch + 1);
  flat(kBlockTable, "block_table", seq.paged() && p_.batch > 0, p_.batch * seq.max_pages_per_seq);
}

ShaderParams Session::make_params() const {
  ShaderParams s{};
  const auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  s.batch = u32(p_.batch);
  s.heads = u32(p_.heads);
  s.kv_heads = u32(p_.kv_heads);
  s.q_len = u32(p_.q_len);
  s.k_len = u32(p_.k_len);
  s.group = u32(plan_.group);
  s.row_blocks = u32(plan_.row_blocks);
  s.splits = u32(plan_.splits);
  s.split_keys = u32(plan_.split_keys);
  s.causal = p_.causal ? 1u : 0u;
  // Offsets past either end see the same keys as the ends themselves: clamped, they fit 32 bits.
  s.causal_offset = static_cast<std::int32_t>(std::clamp<std::int64_t>(p_.causal_offset.value_or(0), -(p_.q_len + 1), p_.k_len));
  s.window = u32(std::min<std::int64_t>(p_.window.value_or(0), p_.q_len + p_.k_len + 2));
  s.has_offsets = p_.has_causal_offsets ? 1u : 0u;
  s.has_key_lengths = p_.has_key_lengths ? 1u : 0u;
  s.scale = *p_.scale;
  s.softcap = p_.softcap.value_or(0.0f);
  s.has_sink = p_.has_head_sink ? 1u : 0u;
  s.masked_zero = p_.masked_rows == MaskedRows::Zero ? 1u : 0u;
  s.has_lse = p_.return_lse ? 1u : 0u;
  s.has_mask = p_.has_mask ? 1u : 0u;
  s.total_rows = u32(plan_.total_rows);
  s.workgroups = u32(plan_.workgroups);
  const SequenceLayout& seq = p_.sequences;
  s.ragged_q = seq.ragged_q ? 1u : 0u;
  s.ragged_k = seq.ragged_k ? 1u : 0u;
  s.page_size = u32(seq.page_size);
  s.max_pages_per_seq = u32(seq.max_pages_per_seq);
  s.per_sequence_causal = seq.any() ? 1u : 0u;  // bottom-right per sequence (core::SequenceAccess)
  s.device_values = device_values_ ? 1u : 0u;
  s.total_q = u32(seq.total_q);
  s.total_k = u32(seq.total_k);
  s.num_pages = u32(seq.num_pages);
  const core::Extent qe = core::query_extent(p_), ke = core::key_extent(p_);
  s.q = shader_layout(p_.q, regions_[kQ].lowest, qe.leading, p_.heads, qe.rows, "q");
  s.k = shader_layout(p_.k, regions_[kK].lowest, ke.leading, p_.kv_heads, ke.rows, "k");
  s.v = shader_layout(p_.v, regions_[kV].lowest, ke.leading, p_.kv_heads, ke.rows, "v");
  s.o = shader_layout(p_.o, regions_[kO].lowest, qe.leading, p_.heads, qe.rows, "o");
  if (p_.has_mask) s.mask = shader_layout(p_.mask, regions_[kMask].lowest, p_.batch, p_.heads, p_.q_len, "mask");
  if (p_.return_lse) s.lse = shader_layout(p_.lse, regions_[kLse].lowest, qe.leading, p_.heads, qe.rows, "lse");
  return s;
}

void Session::make_buffers() {
  const ShaderParams params = make_params();
  params_ = Buffer(ctx_, sizeof(ShaderParams), VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT, true);
  std::memcpy(params_.mapped(), &params, sizeof params);
  dummy_ = Buffer(ctx_, 16, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, false);
  VkDeviceSize up = 0, down = 0;
  for (Region& r : regions_) {
    if (r.bytes == 0) continue;
    r.staging_offset = up;
    up += (r.bytes + 15) / 16 * 16;
    if (r.output) down = std::max<VkDeviceSize>(down, r.staging_offset + r.bytes);
  }
  upload_ = Buffer(ctx_, up, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, true);
  download_ = Buffer(ctx_, down, VK_BUFFER_USAGE_TRANSFER_DST_BIT, true);
  for (std::uint32_t b = kQ; b < kPartials; ++b) {
    if (regions_[b].bytes == 0) continue;
    device_[b] = Buffer(ctx_, regions_[b].bytes,
                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                        false);
  }
  // (the status word of device-buffer calls that give none; filled by the call, written by the shaders)
  device_[kStatus] = Buffer(ctx_, 4, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, false);
  if (plan_.partial_bytes > 0) device_[kPartials] = Buffer(ctx_, plan_.partial_bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, false);
  if (plan_.thread_scratch_bytes > 0) {
    device_[kThreadScratch] = Buffer(ctx_, plan_.thread_scratch_bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, false);
  }
}

// Descriptor sets come from pools of kSetsPerPool: the host path's one, then one per set of caller buffers.
constexpr std::uint32_t kSetsPerPool = 8;

VkDescriptorSet Session::allocate_set() {
  VkDevice d = ctx_.device();
  if (pools_.empty() || sets_in_pool_ == kSetsPerPool) {
    const VkDescriptorPoolSize sizes[] = {{VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, kSetsPerPool},
                                          {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kStorageBindings * kSetsPerPool}};
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = kSetsPerPool;
    pi.poolSizeCount = 2;
    pi.pPoolSizes = sizes;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    check(vkCreateDescriptorPool(d, &pi, nullptr, &pool), "vkCreateDescriptorPool");
    pools_.push_back(pool);
    sets_in_pool_ = 0;
  }
  VkDescriptorSetLayout layout = ctx_.set_layout();
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = pools_.back();
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(d, &ai, &set), "vkAllocateDescriptorSets");
  ++sets_in_pool_;
  return set;
}

// Binding 0 the parameter block; the tensors' ranges where given (a null buffer: the binding's own buffer, the
// partials and scratch, or a dummy for a tensor the problem has not).
void Session::write_set(VkDescriptorSet set, const std::array<VkDescriptorBufferInfo, kBindingCount>& tensors) {
  std::array<VkDescriptorBufferInfo, kStorageBindings + 1> infos{};
  std::array<VkWriteDescriptorSet, kStorageBindings + 1> writes{};
  for (std::uint32_t b = 0; b <= kStorageBindings; ++b) {
    if (b > 0 && tensors[b].buffer != VK_NULL_HANDLE) {
      infos[b] = tensors[b];
    } else {
      const Buffer& buf = b == 0 ? params_ : device_[b].handle() != VK_NULL_HANDLE ? device_[b] : dummy_;
      infos[b] = {buf.handle(), 0, VK_WHOLE_SIZE};
    }
    writes[b] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[b].dstSet = set;
    writes[b].dstBinding = b;
    writes[b].descriptorCount = 1;
    writes[b].descriptorType = b == 0 ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[b].pBufferInfo = &infos[b];
  }
  vkUpdateDescriptorSets(ctx_.device(), static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
}

// One launch of the work budget's cut; `host`: with the host path's copies and timestamps around the first and last.
void Session::record_launch(VkCommandBuffer cb, VkDescriptorSet set, std::int64_t launch, std::int64_t launches,
                            bool host) {
  const bool first = launch == 0, last = launch == launches - 1;
  if (first && host) {
    if (queries_ != VK_NULL_HANDLE) vkCmdResetQueryPool(cb, queries_, 0, 2);
    for (std::uint32_t b = kQ; b < kPartials; ++b) {
      const Region& r = regions_[b];
      if (r.bytes == 0) continue;
      const VkBufferCopy copy{r.staging_offset, 0, r.bytes};
      vkCmdCopyBuffer(cb, upload_.handle(), device_[b].handle(), 1, &copy);
    }
    memory_barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    if (queries_ != VK_NULL_HANDLE) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, 0);
  }
  auto dispatch = [&](const Pipeline& pipe, std::uint32_t first_group, std::uint32_t groups) {
    vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe.pipeline);
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1, &set, 0, nullptr);
    vkCmdPushConstants(cb, pipe.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof first_group, &first_group);
    vkCmdDispatch(cb, groups, 1, 1);
  };
  if (!first && plan_.thread_scratch_bytes > 0) {  // the launches share the per-thread scratch: one after another
    memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
  }
  const std::int64_t begin = launch * plan_.per_launch;
  const std::int64_t groups = std::min(plan_.per_launch, plan_.workgroups - begin);
  if (groups > 0) dispatch(*main_, static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(groups));
  if (!last) return;
  if (merge_ != nullptr) {
    memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    const std::int64_t merge_groups = (plan_.total_rows + plan_.row_block - 1) / plan_.row_block;
    const std::int64_t most = plan_.launch_groups;
    for (std::int64_t g = 0; g < merge_groups; g += most) {
      if (g > 0) {
        memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      }
      dispatch(*merge_, static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(std::min(most, merge_groups - g)));
    }
  }
  if (!host) return;
  if (queries_ != VK_NULL_HANDLE) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 1);
  memory_barrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_TRANSFER_READ_BIT);
  for (std::uint32_t b : {kO, kLse}) {
    const Region& r = regions_[b];
    if (r.bytes == 0) continue;
    const VkBufferCopy copy{0, r.staging_offset, r.bytes};
    vkCmdCopyBuffer(cb, device_[b].handle(), download_.handle(), 1, &copy);
  }
  memory_barrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_HOST_READ_BIT);
}

void Session::record() {
  VkDevice d = ctx_.device();
  if (ctx_.has_timestamps()) {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = 2;
    check(vkCreateQueryPool(d, &qi, nullptr, &queries_), "vkCreateQueryPool");
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(d, &fi, nullptr, &fence_), "vkCreateFence");
  // One command buffer per launch of the work budget's cut (a submission may end between them).
  const std::int64_t launches =
      plan_.workgroups > 0 ? (plan_.workgroups + plan_.per_launch - 1) / plan_.per_launch : 1;
  commands_.resize(static_cast<std::size_t>(launches));
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = ctx_.command_pool();
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = static_cast<std::uint32_t>(launches);
  check(vkAllocateCommandBuffers(d, &ai, commands_.data()), "vkAllocateCommandBuffers");
  for (std::int64_t i = 0; i < launches; ++i) {
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check(vkBeginCommandBuffer(commands_[i], &bi), "vkBeginCommandBuffer");
    record_launch(commands_[i], set_, i, launches, true);
    check(vkEndCommandBuffer(commands_[i]), "vkEndCommandBuffer");
  }
}

const void* Session::host_source(const AttentionArgs& a, std::uint32_t binding) const {
  switch (binding) {
    case kQ: return a.q.data;
    case kK: return a.k.data;
    case kV: return a.v.data;
    case kO: return a.o.data;
    case kMask: return a.mask.data;
    case kKeyLengths: return a.key_lengths.data;
    case kCausalOffsets: return a.causal_offsets.data;
    case kHeadSink: return a.head_sink.data;
    case kLse: return a.lse.data;
    case kCuSeqlensQ: return a.cu_seqlens_q.data;
    case kCuSeqlensK: return a.cu_seqlens_k.data;
    case kBlockTable: return a.block_table.data;
    default: return nullptr;
  }
}

void Session::run(const AttentionArgs& args) {
  std::lock_guard run_lock(run_lock_);  // the staging buffers and partials are this call's until it returns
  for (std::uint32_t b = kQ; b < kPartials; ++b) {
    const Region& r = regions_[b];
    if (r.bytes == 0) continue;
    const auto* src = static_cast<const std::byte*>(host_source(args, b)) + r.lowest * static_cast<std::int64_t>(r.element_size);
    std::memcpy(upload_.mapped() + r.staging_offset, src, r.bytes);
  }
  {
    std::lock_guard lock(ctx_.queue_mutex());
    check(vkResetFences(ctx_.device(), 1, &fence_), "vkResetFences");
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = static_cast<std::uint32_t>(commands_.size());
    si.pCommandBuffers = commands_.data();
    check(vkQueueSubmit(ctx_.queue(), 1, &si, fence_), "vkQueueSubmit");
    check(vkWaitForFences(ctx_.device(), 1, &fence_, VK_TRUE, std::numeric_limits<std::uint64_t>::max()), "vkWaitForFences");
  }
  for (std::uint32_t b : {kO, kLse}) {
    const Region& r = regions_[b];
    if (r.bytes == 0) continue;
    auto* dst = static_cast<std::byte*>(const_cast<void*>(host_source(args, b))) + r.lowest * static_cast<std::int64_t>(r.element_size);
    std::memcpy(dst, download_.mapped() + r.staging_offset, r.bytes);
  }
  read_gpu_time();
}

void Session::read_gpu_time() {
  g_last_gpu_ms = 0.0;
  if (queries_ != VK_NULL_HANDLE) {
    std::uint64_t stamps[2] = {0, 0};
    if (vkGetQueryPoolResults(ctx_.device(), queries_, 0, 2, sizeof stamps, stamps, sizeof(std::uint64_t),
                              VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
      g_last_gpu_ms = static_cast<double>(stamps[1] - stamps[0]) * ctx_.timestamp_period_ns() * 1e-6;
    }
  }
}

bool available() { return context_available(); }

std::shared_ptr<Session> plan(const AttentionProblem& problem, const std::string& kernel, std::int64_t key_splits) {
  PlanOverride force;
  force.kernel = kernel;
  force.key_splits = key_splits;
  return std::make_shared<Session>(problem, force);
}

std::string describe(const Session& session) {
  return vulkan::describe(session.plan()) + " on " + shared_context().info().name;
}

void run(Session& session, const AttentionArgs& args) { session.run(args); }

double last_gpu_milliseconds() { return g_last_gpu_ms; }

}  // namespace attnkit::vulkan
