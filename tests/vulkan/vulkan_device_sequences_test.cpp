// Ragged and paged batches on device buffers (vulkan::DeviceAttention with problem.sequences): the cu_seqlens,
// block tables and key lengths live in device memory with the tensors. Against the host-buffer call of the same
// batch (Attention with Backend::Vulkan, itself checked against the reference by vulkan_sequences_test.cpp), bit
// for bit, on each kernel and through the merge pass; and out-of-range device values, which cannot be checked
// before the call: the entry they belong to gets masked rows (its keys cannot be read) or none of its rows (its
// queries cannot be placed), every other entry the bits of the call without the bad value (docs/numerics.md).
// Without a Vulkan device every test skips.
#include "mapped_buffer.hpp"
#include "sequences_batch.hpp"
#include "vulkan_fixture.hpp"

#include <attnkit/vulkan.hpp>

#include <vulkan/vulkan.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>

namespace attnkit::test {
namespace {

// Every array a batch's arguments point at, copied into one mapped buffer on the backend's own device (each at a
// 256-byte boundary: every device's storage-offset alignment divides 256), and the DeviceArgs over the copies.
class DeviceBatch {
 public:
  DeviceBatch(const Batch& batch, std::vector<std::uint8_t>& o, std::vector<float>& lse) : o_(o), lse_(lse) {
    std::uint64_t end = 0;
    (void)batch.args(o, lse, [&](const void* host, std::size_t bytes) {
      offsets_[host] = end;
      end = (end + bytes + 255) / 256 * 256;
      return const_cast<void*>(host);
    });
    status_at_ = end;  // (then the status word)
    const vulkan::NativeHandles h = vulkan::native_handles();
    buffer_ = std::make_unique<MappedBuffer>(reinterpret_cast<VkDevice>(h.device),
                                             reinterpret_cast<VkPhysicalDevice>(h.physical_device), end + 256);
    const std::int32_t poison = 12345;
    std::memcpy(buffer_->bytes() + status_at_, &poison, 4);
    const AttentionArgs a = batch.args(o, lse, [&](const void* host, std::size_t bytes) {
      std::memcpy(buffer_->bytes() + offsets_.at(host), host, bytes);
      return static_cast<void*>(buffer_->bytes() + offsets_.at(host));
    });
    args_.q = at(a.q.data);
    args_.k = at(a.k.data);
    args_.v = at(a.v.data);
    args_.o = at(a.o.data);
    args_.lse = at(a.lse.data);
    args_.head_sink = at(a.head_sink.data);
    args_.key_lengths = at(a.key_lengths.data);
    args_.cu_seqlens_q = at(a.cu_seqlens_q.data);
    args_.cu_seqlens_k = at(a.cu_seqlens_k.data);
    args_.block_table = at(a.block_table.data);
    args_.status = buffer_->at(status_at_);
  }
  const vulkan::DeviceArgs& args() const { return args_; }
  std::int32_t status() const {
    std::int32_t v = 0;
    std::memcpy(&v, buffer_->bytes() + status_at_, 4);
    return v;
  }
  // O and the LSE back into the caller's vectors.
  void fetch() const {
    std::memcpy(o_.data(), buffer_->bytes() + offsets_.at(o_.data()), o_.size());
    if (!lse_.empty() && offsets_.count(lse_.data()) != 0) {
      std::memcpy(lse_.data(), buffer_->bytes() + offsets_.at(lse_.data()), lse_.size() * sizeof(float));
    }
  }

 private:
  vulkan::DeviceBuffer at(const void* copy) const {
    if (copy == nullptr) return {};
    return buffer_->at(static_cast<std::uint64_t>(static_cast<const std::byte*>(copy) - buffer_->bytes()));
  }
  std::vector<std::uint8_t>& o_;
  std::vector<float>& lse_;
  std::map<const void*, std::uint64_t> offsets_;
  std::uint64_t status_at_ = 0;
  std::unique_ptr<MappedBuffer> buffer_;
  vulkan::DeviceArgs args_;
};

struct Outputs {
  std::vector<std::uint8_t> o;
  std::vector<float> lse;
  std::int32_t status = 0;
};

// The batch on device buffers (O and the LSE start as the batch's poison), with the status word.
Outputs run_on_device(const Batch& batch, const std::string& plan) {
  Outputs out{batch.output_buffer(), batch.lse_buffer()};
  const DeviceBatch copies(batch, out.o, out.lse);
  vulkan::DeviceAttention op(batch.problem(), parse_plan_overrides(plan));
  op.run(copies.args());
  copies.fetch();
  out.status = copies.status();
  return out;
}

// The same batch on host buffers.
Outputs run_on_host(const Batch& batch, const std::string& plan) {
  Outputs out{batch.output_buffer(), batch.lse_buffer()};
  AttentionConfig config;
  config.backend = Backend::Vulkan;
  config.plan = parse_plan_overrides(plan);
  Attention(batch.problem(), config).run(batch.args(out.o, out.lse));
  return out;
}

// The plans each batch runs under: the scalar kernel, whole and split (merge pass), and for float16 the matrix
// kernel (its emulated build on a device without matrices).
std::vector<std::string> plans_for(DType t) {
  std::vector<std::string> plans = {"kernel=rows", "kernel=rows,splits=3"};
  if (t == DType::f16) {
    plans.push_back("kernel=coopmat");
    plans.push_back("kernel=coopmat,splits=3");
  }
  return plans;
}

class VulkanDeviceSequences : public VulkanTest {};

// A ragged prefill (grouped heads, causal bottom-right, an empty sequence, the LSE), ragged queries over paged
// K/V (NHD pages of 16, a shared first page) and a paged decode step (HND pages of 3), in float16 and float32: the
// device-buffer call gives the host call's bytes, O's and the LSE's (rows no sequence owns keep theirs).
TEST_F(VulkanDeviceSequences, RaggedAndPagedBatchesGiveTheHostCallsBits) {
  std::mt19937 rng(5);
  for (DType t : {DType::f16, DType::f32}) {
    for (int variant = 0; variant < 3; ++variant) {
      BatchSpec s;
      s.dtype = t;
      s.head_dim = s.v_head_dim = 40;
      s.causal = true;
      if (variant == 0) {
        s.q_lens = {17, 0, 40, 5};
        s.k_lens = {17, 9, 60, 33};
      } else {
        s.ragged_k = false;
        s.page_size = variant == 1 ? 16 : 3;
        s.heads_before_pages_rows = variant == 2;
        s.shared_prefix = variant == 1;
        s.k_lens = random_lengths(rng, 4, 90);
        s.ragged_q = variant == 1;
        s.q_lens = variant == 1 ? random_lengths(rng, 4, 20) : std::vector<std::int64_t>(4, 1);
      }
      const Batch batch(s, 60 + variant);
      for (const std::string& plan : plans_for(t)) {
        SCOPED_TRACE(describe(s) + " " + plan);
        const Outputs host = run_on_host(batch, plan), device = run_on_device(batch, plan);
        EXPECT_EQ(device.status, -1) << "every value is in range";
        EXPECT_TRUE(device.o == host.o) << "O differs from the host call's";
        EXPECT_TRUE(std::memcmp(device.lse.data(), host.lse.data(), host.lse.size() * sizeof(float)) == 0)
            << "the LSE differs from the host call's";
      }
    }
  }
}

// A sequence array the problem has but the call does not give, or one the problem has not, and a status word
// inside O or off 4 bytes, are Errors naming the argument, and nothing is written.
TEST_F(VulkanDeviceSequences, MissingOrExtraSequenceBuffersAreRefusedByName) {
  BatchSpec s = small_paged();
  s.dtype = DType::f16;
  const Batch paged(s, 9);
  std::vector<std::uint8_t> o = paged.output_buffer();
  std::vector<float> lse = paged.lse_buffer();
  const DeviceBatch copies(paged, o, lse);
  vulkan::DeviceAttention op(paged.problem());
  auto refuses = [&](const vulkan::DeviceArgs& a, const std::string& argument) {
    try {
      op.run(a);
      ADD_FAILURE() << "accepted; expected an error on " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
    copies.fetch();
    EXPECT_TRUE(o == paged.output_buffer()) << argument << ": O was written";
  };
  vulkan::DeviceArgs a = copies.args();
  a.block_table.buffer = 0;
  refuses(a, "block_table");
  a = copies.args();
  a.cu_seqlens_k = a.key_lengths;  // keys in pages: no cu_seqlens_k
  refuses(a, "cu_seqlens_k");
  a = copies.args();
  a.cu_seqlens_q.size = a.cu_seqlens_q.offset + 8;  // ends inside the array of batch + 1 entries
  refuses(a, "cu_seqlens_q.size");
  a = copies.args();
  a.status = a.o;  // the status word inside O
  refuses(a, "o");
  a = copies.args();
  a.status.offset += 2;
  refuses(a, "status.offset");
}

// One bad device value per run, in the entry it belongs to: that entry's rows are masked rows (keys that cannot be
// read: cu_seqlens_k past total_k, a block-table entry below 0 or past num_pages, a key length past k_len) or keep
// their bytes (queries that cannot be placed: cu_seqlens_q past total_q, or decreasing), and the status word names
// it (-1 on the clean run); the other entries' rows are
// the bytes of the call without the bad value; rows past the last entry keep theirs.
TEST_F(VulkanDeviceSequences, OutOfRangeDeviceValuesMaskTheirEntry) {
  enum class Corrupt { CuSeqlensK, CuSeqlensQPast, CuSeqlensQDecreasing, PageBelow, PagePast, KeyLength };
  for (const Corrupt what : {Corrupt::CuSeqlensK, Corrupt::CuSeqlensQPast, Corrupt::CuSeqlensQDecreasing,
                             Corrupt::PageBelow, Corrupt::PagePast, Corrupt::KeyLength}) {
    for (const std::string& plan : plans_for(DType::f16)) {
      BatchSpec s;
      s.dtype = DType::f16;
      s.head_dim = s.v_head_dim = 32;
      s.q_lens = {5, 7, 3, 6};
      s.k_lens = {90, 200, 150, 70};
      s.causal = true;
      const bool paged = what == Corrupt::PageBelow || what == Corrupt::PagePast || what == Corrupt::KeyLength;
      if (paged) s.page_size = 16, s.ragged_k = false;
      Batch batch(s, 77);
      SCOPED_TRACE(describe(s) + " " + plan + ", corruption " + std::to_string(static_cast<int>(what)));
      const Outputs good = run_on_device(batch, plan);
      std::int64_t bad = 0;
      bool nan = true;
      const std::int64_t pages = batch.problem().sequences.max_pages_per_seq;
      switch (what) {
        case Corrupt::CuSeqlensK: bad = 3, batch.cu_seqlens_k()[4] = 1 << 30; break;
        case Corrupt::CuSeqlensQPast: bad = 3, nan = false, batch.cu_seqlens_q()[4] += 1000; break;
        case Corrupt::CuSeqlensQDecreasing: bad = 3, nan = false, batch.cu_seqlens_q()[4] = batch.cu_seqlens_q()[3] - 1; break;
        case Corrupt::PageBelow: bad = 1, batch.block_table()[pages + 2] = -4; break;
        case Corrupt::PagePast:
          bad = 2, batch.block_table()[2 * pages + 9] = static_cast<std::int32_t>(batch.problem().sequences.num_pages);
          break;
        case Corrupt::KeyLength: bad = 2, batch.key_lengths()[2] = 100000; break;
      }
      EXPECT_EQ(good.status, -1);
      const Outputs got = run_on_device(batch, plan);
      EXPECT_EQ(got.status, bad) << "the status word names the entry";
      EXPECT_TRUE(rows_are(batch, s, got.o, bad, nan)) << (nan ? "not masked rows" : "written");
      const std::size_t row_bytes = static_cast<std::size_t>(s.heads * s.v_head_dim) * dtype_size(s.dtype);
      for (std::int64_t b = 0; b < 4; ++b) {
        if (b == bad) continue;
        for (std::int64_t i = 0; i < s.q_lens[b]; ++i) {
          const std::size_t at = static_cast<std::size_t>(batch.query_row(b, i)) * row_bytes;
          EXPECT_EQ(std::memcmp(&got.o[at], &good.o[at], row_bytes), 0) << "entry " << b << " changed";
        }
      }
      const std::size_t tail = std::min(static_cast<std::size_t>(batch.query_row(3, s.q_lens[3])) * row_bytes, got.o.size());
      EXPECT_TRUE(std::equal(got.o.begin() + static_cast<std::ptrdiff_t>(tail), got.o.end(),
                             good.o.begin() + static_cast<std::ptrdiff_t>(tail)))
          << "rows past the last entry were written";
    }
  }
}

}  // namespace
}  // namespace attnkit::test
