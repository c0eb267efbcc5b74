// DeviceAttention: the Vulkan backend on tensors that live in device memory (buffers made on the backend's own
// device, native_handles()). Against the host-buffer call of the same problem, bit for bit, run by the backend or
// recorded into the test's own command buffer; bad buffers refused by name with nothing written; a key length in
// device memory outside [0, k_len] hides its entry. Without a Vulkan device every test skips.
#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>

#include <vulkan/vulkan.h>

#include <gtest/gtest.h>

#include "mapped_buffer.hpp"
#include "vulkan_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace attnkit::test {
namespace {

// A mapped buffer on the backend's own device.
MappedBuffer backend_buffer(std::uint64_t bytes) {
  const vulkan::NativeHandles h = vulkan::native_handles();
  return MappedBuffer(reinterpret_cast<VkDevice>(h.device), reinterpret_cast<VkPhysicalDevice>(h.physical_device),
                      bytes);
}

// A float16 problem with key lengths and the LSE, and its tensors laid one after another in one buffer, each on
// a 256-byte boundary (every device's storage-offset alignment divides 256).
struct Packed {
  AttentionProblem p;
  std::vector<std::uint16_t> q, k, v;
  std::vector<std::int32_t> lengths;
  std::uint64_t q_at = 0, k_at = 0, v_at = 0, o_at = 0, lengths_at = 0, lse_at = 0, status_at = 0, end = 0;

  Packed() {
    p = AttentionProblem::head_first(2, 4, 2, 37, 300, 64, DType::f16);
    p.causal = true;
    p.has_key_lengths = true;
    p.return_lse = true;
    p.lse = Layout::head_first(p.heads, p.q_len, 1);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto fill = [&](std::vector<std::uint16_t>& x, std::int64_t n) {
      x.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) store_from_float(x.data(), DType::f16, i, normal(rng));
    };
    fill(q, o_elements());
    fill(k, kv_elements());
    fill(v, kv_elements());
    lengths = {300, 120};
    auto place = [&](std::uint64_t bytes) {
      const std::uint64_t at = end;
      end = (end + bytes + 255) / 256 * 256;
      return at;
    };
    q_at = place(q.size() * 2);
    k_at = place(k.size() * 2);
    v_at = place(v.size() * 2);
    o_at = place(q.size() * 2);
    lengths_at = place(8);
    lse_at = place(static_cast<std::uint64_t>(rows()) * 4);
    status_at = place(4);
  }
  std::int64_t rows() const { return p.batch * p.heads * p.q_len; }
  std::int64_t o_elements() const { return rows() * p.head_dim; }
  std::int64_t kv_elements() const { return p.batch * p.kv_heads * p.k_len * p.head_dim; }

  // The inputs into `buf`, O and the LSE poisoned.
  void upload(const MappedBuffer& buf) const {
    std::memcpy(buf.bytes() + q_at, q.data(), q.size() * 2);
    std::memcpy(buf.bytes() + k_at, k.data(), k.size() * 2);
    std::memcpy(buf.bytes() + v_at, v.data(), v.size() * 2);
    std::memcpy(buf.bytes() + lengths_at, lengths.data(), 8);
    std::memset(buf.bytes() + o_at, 0x7b, q.size() * 2);
    std::memset(buf.bytes() + lse_at, 0x7b, static_cast<std::size_t>(rows()) * 4);
    std::memset(buf.bytes() + status_at, 0x7b, 4);
  }
  vulkan::DeviceArgs args(const MappedBuffer& buf) const {
    vulkan::DeviceArgs a;
    a.q = buf.at(q_at);
    a.k = buf.at(k_at);
    a.v = buf.at(v_at);
    a.o = buf.at(o_at);
    a.key_lengths = buf.at(lengths_at);
    a.lse = buf.at(lse_at);
    a.status = buf.at(status_at);
    return a;
  }
  std::int32_t status(const MappedBuffer& buf) const {
    std::int32_t v = 0;
    std::memcpy(&v, buf.bytes() + status_at, 4);
    return v;
  }
  // The host-buffer call on the Vulkan backend: O then the LSE's bytes.
  std::vector<std::byte> host_call(std::vector<std::int32_t> host_lengths, const std::string& plan = "") const {
    std::vector<std::uint16_t> o(q.size());
    std::vector<float> lse(static_cast<std::size_t>(rows()));
    AttentionArgs a;
    a.q = {q.data(), static_cast<std::int64_t>(q.size())};
    a.k = {k.data(), static_cast<std::int64_t>(k.size())};
    a.v = {v.data(), static_cast<std::int64_t>(v.size())};
    a.o = {o.data(), static_cast<std::int64_t>(o.size())};
    a.key_lengths = {host_lengths.data(), p.batch};
    a.lse = {lse.data(), rows()};
    AttentionConfig config;
    config.backend = Backend::Vulkan;
    config.plan = parse_plan_overrides(plan);
    Attention(p, config).run(a);
    std::vector<std::byte> out(o.size() * 2 + lse.size() * 4);
    std::memcpy(out.data(), o.data(), o.size() * 2);
    std::memcpy(out.data() + o.size() * 2, lse.data(), lse.size() * 4);
    return out;
  }
  std::vector<std::byte> device_result(const MappedBuffer& buf) const {
    std::vector<std::byte> out(q.size() * 2 + static_cast<std::size_t>(rows()) * 4);
    std::memcpy(out.data(), buf.bytes() + o_at, q.size() * 2);
    std::memcpy(out.data() + q.size() * 2, buf.bytes() + lse_at, static_cast<std::size_t>(rows()) * 4);
    return out;
  }
};

class VulkanDeviceBuffers : public VulkanTest {};

TEST_F(VulkanDeviceBuffers, RunMatchesTheHostCallBitForBit) {
  const Packed t;
  MappedBuffer buf = backend_buffer(t.end);
  t.upload(buf);
  vulkan::DeviceAttention op(t.p);
  op.run(t.args(buf));
  EXPECT_TRUE(t.device_result(buf) == t.host_call(t.lengths)) << op.describe();
  EXPECT_EQ(t.status(buf), -1) << "every key length is in range";
  // Again on the same buffers (the kept descriptor set and commands), after poisoning O.
  t.upload(buf);
  op.run(t.args(buf));
  EXPECT_TRUE(t.device_result(buf) == t.host_call(t.lengths));
}

TEST_F(VulkanDeviceBuffers, RecordedIntoTheCallersCommandBufferMatchesTheHostCall) {
  const Packed t;
  MappedBuffer buf = backend_buffer(t.end);
  t.upload(buf);
  vulkan::DeviceAttention op(t.p, parse_plan_overrides("splits=3"));  // with the merge pass
  const vulkan::NativeHandles h = vulkan::native_handles();
  VkDevice device = reinterpret_cast<VkDevice>(h.device);
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.queueFamilyIndex = h.queue_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateCommandPool(device, &pi, nullptr, &pool), VK_SUCCESS);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  ASSERT_EQ(vkAllocateCommandBuffers(device, &ai, &cb), VK_SUCCESS);
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  ASSERT_EQ(vkBeginCommandBuffer(cb, &bi), VK_SUCCESS);
  op.record(t.args(buf), reinterpret_cast<std::uint64_t>(cb));
  ASSERT_EQ(vkEndCommandBuffer(cb), VK_SUCCESS);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cb;
  ASSERT_EQ(vkQueueSubmit(reinterpret_cast<VkQueue>(h.queue), 1, &si, VK_NULL_HANDLE), VK_SUCCESS);
  ASSERT_EQ(vkQueueWaitIdle(reinterpret_cast<VkQueue>(h.queue)), VK_SUCCESS);
  vkDestroyCommandPool(device, pool, nullptr);
  EXPECT_NE(op.describe().find("split"), std::string::npos) << op.describe();
  EXPECT_TRUE(t.device_result(buf) == t.host_call(t.lengths, "splits=3")) << op.describe();
}

TEST_F(VulkanDeviceBuffers, BadBuffersAreRefusedByNameAndNothingIsWritten) {
  const Packed t;
  MappedBuffer buf = backend_buffer(t.end);
  t.upload(buf);
  const std::vector<std::byte> poisoned = t.device_result(buf);
  vulkan::DeviceAttention op(t.p);
  auto refuses = [&](const vulkan::DeviceArgs& a, const std::string& argument) {
    try {
      op.run(a);
      ADD_FAILURE() << "accepted; expected an error on " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    EXPECT_TRUE(t.device_result(buf) == poisoned) << argument;
  };
  vulkan::DeviceArgs a = t.args(buf);
  a.q.buffer = 0;
  refuses(a, "q");
  a = t.args(buf);
  a.k.size = t.k_at + 100;  // the buffer ends inside K
  refuses(a, "k.size");
  a = t.args(buf);
  a.v.offset += 2;  // one float16 on: off the storage-offset alignment of any device (at least 4)
  refuses(a, "v.offset");
  a = t.args(buf);
  a.o = buf.at(t.q_at + 64);  // O over Q
  refuses(a, "o");
  a = t.args(buf);
  a.lse = buf.at(t.o_at);  // the LSE over O
  refuses(a, "o");
  a = t.args(buf);
  a.mask = buf.at(t.end - 256);  // a mask the problem does not have
  refuses(a, "mask");
  a = t.args(buf);
  a.key_lengths.buffer = 0;
  refuses(a, "key_lengths");
}

// A length in device memory cannot be checked: outside [0, k_len] its entry sees no key (NaN rows, LSE -inf), the
// status word names it, and the other entry is the host call's, bit for bit.
TEST_F(VulkanDeviceBuffers, AnOutOfRangeDeviceKeyLengthHidesItsEntry) {
  Packed t;
  t.lengths = {static_cast<std::int32_t>(t.p.k_len + 1), 120};
  MappedBuffer buf = backend_buffer(t.end);
  t.upload(buf);
  vulkan::DeviceAttention(t.p).run(t.args(buf));
  EXPECT_EQ(t.status(buf), 0) << "the status word names entry 0";
  const std::vector<std::byte> got = t.device_result(buf);
  const std::vector<std::byte> want = t.host_call({50, 120});
  const std::size_t entry_o = static_cast<std::size_t>(t.o_elements() / t.p.batch) * 2;
  const std::size_t o_bytes = static_cast<std::size_t>(t.o_elements()) * 2;
  const std::size_t entry_lse = static_cast<std::size_t>(t.rows() / t.p.batch) * 4;
  for (std::size_t i = 0; i < entry_o / 2; ++i) {
    std::uint16_t h;
    std::memcpy(&h, got.data() + 2 * i, 2);
    ASSERT_TRUE(std::isnan(load_as_float(&h, DType::f16, 0))) << "entry 0, element " << i;
  }
  for (std::size_t i = 0; i < entry_lse / 4; ++i) {
    float l;
    std::memcpy(&l, got.data() + o_bytes + 4 * i, 4);
    ASSERT_TRUE(std::isinf(l) && l < 0) << "entry 0, LSE row " << i;
  }
  EXPECT_TRUE(std::equal(got.begin() + entry_o, got.begin() + o_bytes, want.begin() + entry_o));
  EXPECT_TRUE(std::equal(got.begin() + o_bytes + entry_lse, got.end(), want.begin() + o_bytes + entry_lse));
  // Negative: the same.
  t.lengths = {-3, 120};
  t.upload(buf);
  vulkan::DeviceAttention(t.p).run(t.args(buf));
  std::uint16_t first;
  std::memcpy(&first, buf.bytes() + t.o_at, 2);
  EXPECT_TRUE(std::isnan(load_as_float(&first, DType::f16, 0)));
}

}  // namespace
}  // namespace attnkit::test
