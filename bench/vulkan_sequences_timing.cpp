// The Vulkan backend on ragged batches and paged K/V caches (float16): the rows kernel against the
// cooperative-matrix kernel (plan override kernel=coopmat), and each paged decode step against the same keys in a
// dense head-first cache with key lengths on the plan's kernel. Host-buffer calls; the GPU time of each call
// (timestamp queries around its kernels), the variants taking turns in one process, medians. Each paged step also
// runs on device buffers (vulkan::DeviceAttention over device-local copies, the plan's kernel): its shaders judge
// the block table and key lengths themselves, which the host path checks on the host. Prints the largest
// difference between the rows and coopmat outputs (the two kernels round differently; the tests hold the bounds).
// The plan's choice of kernel for sequences rests on this tool's figures (docs/vulkan.md).
//   usage: attnkit_vulkan_sequences_timing [case-substring] [--rounds N]
#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>

#include "cpu_timing_values.hpp"
#include "vulkan/memory_type.hpp"

#include <vulkan/vulkan.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace attnkit;
constexpr DType kType = DType::f16;

// A batch of sequences: ragged prefill (queries and keys packed, lengths in [lo, hi]) or a paged decode step
// (one query per sequence, key lengths in [lo, hi], pages of `page` keys, NHD).
struct Spec {
  const char* name;
  std::int64_t batch, heads, kv_heads, dim, lo, hi, page;
  bool causal;
};

struct Call {
  std::string label;
  Attention op;
  AttentionArgs args;
  std::vector<double> ms;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

float half_to_float(const unsigned char* at) {
  std::uint16_t h;
  std::memcpy(&h, at, 2);
  return half_bits_to_float(h);
}

// The largest difference between the first `count` values of two float16 outputs.
double max_difference(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, std::int64_t count) {
  double worst = 0.0;
  for (std::int64_t i = 0; i < count; ++i) {
    worst = std::max(worst, std::fabs(double(half_to_float(&a[2 * i])) - double(half_to_float(&b[2 * i]))));
  }
  return worst;
}

// A device-local storage buffer on the backend's device, filled from host memory through a staging buffer and
// one copy on the backend's queue (nobody else submits to it in this tool).
class DeviceLocal {
 public:
  explicit DeviceLocal(const void* host, std::size_t bytes) {
    const vulkan::NativeHandles h = vulkan::native_handles();
    device_ = reinterpret_cast<VkDevice>(h.device);
    physical_ = reinterpret_cast<VkPhysicalDevice>(h.physical_device);
    size_ = bytes;
    make(bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
         VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, buffer_, memory_);
    VkBuffer staging = VK_NULL_HANDLE;
    VkDeviceMemory staging_memory = VK_NULL_HANDLE;
    make(bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
         staging, staging_memory);
    void* mapped = nullptr;
    vkMapMemory(device_, staging_memory, 0, VK_WHOLE_SIZE, 0, &mapped);
    std::memcpy(mapped, host, bytes);
    vkUnmapMemory(device_, staging_memory);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = h.queue_family;
    VkCommandPool pool = VK_NULL_HANDLE;
    vkCreateCommandPool(device_, &pi, nullptr, &pool);
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    vkAllocateCommandBuffers(device_, &ai, &cb);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cb, &bi);
    const VkBufferCopy copy{0, 0, bytes};
    vkCmdCopyBuffer(cb, staging, buffer_, 1, &copy);
    vkEndCommandBuffer(cb);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    VkQueue queue = reinterpret_cast<VkQueue>(h.queue);
    vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE);
    vkQueueWaitIdle(queue);
    vkDestroyCommandPool(device_, pool, nullptr);
    vkDestroyBuffer(device_, staging, nullptr);
    vkFreeMemory(device_, staging_memory, nullptr);
  }
  ~DeviceLocal() {
    vkDestroyBuffer(device_, buffer_, nullptr);
    vkFreeMemory(device_, memory_, nullptr);
  }
  DeviceLocal(const DeviceLocal&) = delete;
  DeviceLocal& operator=(const DeviceLocal&) = delete;
  vulkan::DeviceBuffer at() const { return {reinterpret_cast<std::uint64_t>(buffer_), 0, size_}; }

 private:
  void make(std::size_t bytes, VkBufferUsageFlags usage, VkMemoryPropertyFlags want, VkBuffer& buffer,
            VkDeviceMemory& memory) {
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = usage;
    if (vkCreateBuffer(device_, &bi, nullptr, &buffer) != VK_SUCCESS) throw std::runtime_error("vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device_, buffer, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = test::memory_type(physical_, req.memoryTypeBits, want);
    if (ai.memoryTypeIndex == UINT32_MAX || vkAllocateMemory(device_, &ai, nullptr, &memory) != VK_SUCCESS) {
      throw std::runtime_error("no memory for a device buffer");
    }
    vkBindBufferMemory(device_, buffer, memory, 0);
  }
  VkDevice device_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  std::size_t size_ = 0;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
};

struct Batch {
  std::vector<std::int32_t> lengths, cu, table;
  std::vector<unsigned char> q, k, v, k_pages, v_pages, o_rows, o_coopmat, o_dense;
  AttentionProblem problem, dense;
  std::int64_t q_rows = 0, keys = 0;
};

void build_ragged(const Spec& s, std::mt19937& rng, Batch& b) {
  const std::int64_t H = s.heads, Hkv = s.kv_heads, D = s.dim;
  b.cu.assign(1, 0);
  for (std::int32_t n : b.lengths) b.cu.push_back(b.cu.back() + n);
  const std::int64_t total = b.cu.back();
  b.q_rows = total;
  b.q = bench::random_values(total * H * D, kType, rng);
  b.k = bench::random_values(total * Hkv * D, kType, rng);
  b.v = bench::random_values(total * Hkv * D, kType, rng);
  b.problem = AttentionProblem::positions_first(s.batch, H, Hkv, s.hi, s.hi, D, kType);
  b.problem.q = b.problem.o = Layout{0, 0, D, H * D};
  b.problem.k = b.problem.v = Layout{0, 0, D, Hkv * D};
  b.problem.causal = s.causal;
  b.problem.sequences.ragged_q = b.problem.sequences.ragged_k = true;
  b.problem.sequences.total_q = b.problem.sequences.total_k = total;
}

void build_paged(const Spec& s, std::mt19937& rng, Batch& b) {
  const std::int64_t H = s.heads, Hkv = s.kv_heads, D = s.dim, B = s.batch, page = s.page;
  b.q_rows = B;
  b.q = bench::random_values(B * H * D, kType, rng);
  b.k = bench::random_values(B * Hkv * s.hi * D, kType, rng);
  b.v = bench::random_values(B * Hkv * s.hi * D, kType, rng);
  b.dense = AttentionProblem::head_first(B, H, Hkv, 1, s.hi, D, kType);
  b.dense.has_key_lengths = true;
  const std::int64_t max_pages = (s.hi + page - 1) / page, num_pages = B * max_pages;
  b.table.resize(static_cast<std::size_t>(num_pages));
  std::iota(b.table.begin(), b.table.end(), 0);
  std::shuffle(b.table.begin(), b.table.end(), rng);
  const Layout pages{0, page * Hkv * D, D, Hkv * D};
  b.k_pages.resize(static_cast<std::size_t>(num_pages * page * Hkv * D) * 2);
  b.v_pages.resize(b.k_pages.size());
  for (std::int64_t e = 0; e < B; ++e) {
    for (std::int64_t h = 0; h < Hkv; ++h) {
      for (std::int64_t j = 0; j < b.lengths[static_cast<std::size_t>(e)]; ++j) {
        const std::int64_t at = pages.index(b.table[static_cast<std::size_t>(e * max_pages + j / page)], h, j % page);
        const std::int64_t from = b.dense.k.index(e, h, j);
        std::memcpy(&b.k_pages[2 * at], &b.k[2 * from], 2 * D);
        std::memcpy(&b.v_pages[2 * at], &b.v[2 * from], 2 * D);
      }
    }
  }
  b.problem = b.dense;
  b.problem.k = b.problem.v = pages;
  b.problem.sequences.page_size = page;
  b.problem.sequences.num_pages = num_pages;
  b.problem.sequences.max_pages_per_seq = max_pages;
}

AttentionArgs sequence_args(const Spec& s, Batch& b, std::vector<unsigned char>& out) {
  AttentionArgs a;
  const std::int64_t nq = b.q_rows * s.heads * s.dim;
  out.assign(static_cast<std::size_t>(nq) * 2, 0);
  a.q = {b.q.data(), nq};
  a.o = {out.data(), nq};
  if (s.page == 0) {
    a.k = {b.k.data(), static_cast<std::int64_t>(b.k.size() / 2)};
    a.v = {b.v.data(), static_cast<std::int64_t>(b.v.size() / 2)};
    a.cu_seqlens_q = a.cu_seqlens_k = {b.cu.data(), s.batch + 1};
  } else {
    a.k = {b.k_pages.data(), static_cast<std::int64_t>(b.k_pages.size() / 2)};
    a.v = {b.v_pages.data(), static_cast<std::int64_t>(b.v_pages.size() / 2)};
    a.key_lengths = {b.lengths.data(), s.batch};
    a.block_table = {b.table.data(), static_cast<std::int64_t>(b.table.size())};
  }
  return a;
}

AttentionConfig vulkan_config(const std::string& overrides) {
  AttentionConfig c;
  c.backend = Backend::Vulkan;
  if (!overrides.empty()) c.plan = parse_plan_overrides(overrides);
  return c;
}

void time_case(const Spec& s, int rounds) {
  std::mt19937 rng(11);
  Batch b;
  std::uniform_int_distribution<std::int64_t> length_of(s.lo, s.hi);
  for (std::int64_t e = 0; e < s.batch; ++e) b.lengths.push_back(static_cast<std::int32_t>(length_of(rng)));
  b.keys = std::accumulate(b.lengths.begin(), b.lengths.end(), std::int64_t{0});
  s.page == 0 ? build_ragged(s, rng, b) : build_paged(s, rng, b);
  std::vector<Call> calls;
  calls.push_back({"rows", Attention(b.problem, vulkan_config("kernel=rows")), sequence_args(s, b, b.o_rows), {}});
  calls.push_back({"coopmat", Attention(b.problem, vulkan_config("kernel=coopmat")), sequence_args(s, b, b.o_coopmat), {}});
  if (s.page > 0) {
    AttentionArgs a = sequence_args(s, b, b.o_dense);
    a.k = {b.k.data(), static_cast<std::int64_t>(b.k.size() / 2)};
    a.v = {b.v.data(), static_cast<std::int64_t>(b.v.size() / 2)};
    a.block_table = {};
    calls.push_back({"dense", Attention(b.dense, vulkan_config("")), a, {}});
  }
  for (Call& c : calls) c.op.run(c.args);  // (warm-up: pipelines, buffers)
  for (int r = 0; r < rounds; ++r) {
    for (Call& c : calls) {
      for (int i = 0; i < 5; ++i) {
        c.op.run(c.args);
        c.ms.push_back(vulkan::last_gpu_milliseconds());
      }
    }
  }
  // The paged step on device buffers: device-local copies of its tensors, block table and key lengths.
  std::vector<double> device_ms;
  std::string device_plan;
  if (s.page > 0) {
    const AttentionArgs& a = calls[1].args;
    const std::size_t o_bytes = static_cast<std::size_t>(a.o.elements) * 2;
    DeviceLocal q(a.q.data, static_cast<std::size_t>(a.q.elements) * 2), o(a.o.data, o_bytes);
    DeviceLocal k(a.k.data, static_cast<std::size_t>(a.k.elements) * 2), v(a.v.data, static_cast<std::size_t>(a.v.elements) * 2);
    DeviceLocal lengths(a.key_lengths.data, static_cast<std::size_t>(a.key_lengths.elements) * 4);
    DeviceLocal table(a.block_table.data, static_cast<std::size_t>(a.block_table.elements) * 4);
    vulkan::DeviceArgs d;
    d.q = q.at(), d.k = k.at(), d.v = v.at(), d.o = o.at(), d.key_lengths = lengths.at(), d.block_table = table.at();
    vulkan::DeviceAttention op(b.problem);
    device_plan = op.describe();
    op.run(d);  // (warm-up)
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < 5; ++i) {
        op.run(d);
        device_ms.push_back(vulkan::last_gpu_milliseconds());
      }
    }
  }
  const double rows_ms = median(calls[0].ms);
  const std::int64_t values = b.q_rows * s.heads * s.dim;
  std::printf("%-26s keys %7lld  max |rows - coopmat| %.2e\n", s.name, static_cast<long long>(b.keys),
              max_difference(b.o_rows, b.o_coopmat, values));
  for (const Call& c : calls) {
    const double ms = median(c.ms);
    std::printf("  %-8s %10.4f ms  rows/this %5.2f  %s\n", c.label.c_str(), ms, rows_ms / ms, c.op.describe().c_str());
  }
  if (!device_ms.empty()) {
    const double ms = median(device_ms);
    std::printf("  %-8s %10.4f ms  rows/this %5.2f  device buffers, %s\n", "device", ms, rows_ms / ms, device_plan.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string only;
  int rounds = 4;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else only = argv[i];
  }
  // name, batch, heads, kv heads, dim, length lo / hi, page (0: ragged prefill), causal
  const std::vector<Spec> specs = {
      {"ragged_llama8b_causal", 8, 32, 8, 128, 256, 1024, 0, true},
      {"ragged_bert_encoder", 16, 12, 12, 64, 64, 512, 0, false},
      {"ragged_d32_causal", 8, 16, 16, 32, 128, 768, 0, true},
      {"paged16_llama8b_decode", 16, 32, 8, 128, 1024, 4096, 16, false},
      {"paged64_llama8b_decode", 16, 32, 8, 128, 1024, 4096, 64, false},
      {"paged16_mqa_decode", 8, 32, 1, 128, 2048, 8192, 16, false},
  };
  std::printf("device: %s\n", vulkan::current_device().name.c_str());
  for (const Spec& s : specs) {
    if (!only.empty() && std::string(s.name).find(only) == std::string::npos) continue;
    try {
      time_case(s, rounds);
    } catch (const std::exception& e) {
      std::printf("%-26s failed: %s\n", s.name, e.what());
    }
  }
}
