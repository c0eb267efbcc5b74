// append_kv with rotary on K and int8 / int4 caches on the CUDA backend: every case of ../kv_append_gqa_cases.hpp
// gives the CPU append's caches bit for bit (the CPU append is the GQA op's cache, ../kv_append_gqa_test.cpp);
// a position past the cos / sin rows makes its entry write nothing and is reported in status; a rotary int8 append
// captured in a strict-mode graph replays with new positions.
#include "../kv_append_gqa_cases.hpp"

#include "gpu_test_support.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace attnkit::test {
namespace {

using testing::check;
using testing::DeviceVector;

// The case's buffers on the device, and its args pointing at them (the host args' extents).
struct DeviceCase {
  DeviceVector<std::byte> k_new, v_new, k_cache, v_cache, cos, sin;
  DeviceVector<float> k_scale, v_scale;
  DeviceVector<std::int32_t> block_table, positions, new_lengths, status;
  explicit DeviceCase(const GqaAppendCase& c)
      : k_new(c.call.key), v_new(c.call.value), k_cache(c.k_cache), v_cache(c.v_cache), cos(c.call.cos),
        sin(c.call.sin), k_scale(c.call.k_scale), v_scale(c.call.v_scale), block_table(c.block_table),
        positions(c.positions), new_lengths(c.new_lengths), status(std::vector<std::int32_t>{7}) {}
  KvAppendArgs args(GqaAppendCase& c) const {
    KvAppendArgs a = c.args();
    const auto on_device = [](auto& buffer, auto* data) {
      if (buffer.data != nullptr) buffer.data = data;
    };
    on_device(a.k_new, k_new.data);
    on_device(a.v_new, v_new.data);
    on_device(a.k_cache, k_cache.data);
    on_device(a.v_cache, v_cache.data);
    on_device(a.cos_cache, cos.data);
    on_device(a.sin_cache, sin.data);
    on_device(a.k_scale, k_scale.data);
    on_device(a.v_scale, v_scale.data);
    on_device(a.block_table, block_table.data);
    on_device(a.positions, positions.data);
    on_device(a.new_lengths, new_lengths.data);
    a.status = {status.data, 1};
    return a;
  }
};

TEST(CudaKvAppend, RotaryAndQuantizedRowsEqualTheCpuAppend) {
  SKIP_WITHOUT_GPU();
  for (GqaAppendCase c : gqa_append_cases()) {
    DeviceCase dev(c);
    append_kv(c.p, dev.args(c), Backend::Auto);
    check(cudaDeviceSynchronize());
    append_kv(c.p, c.args(), Backend::Cpu);
    EXPECT_TRUE(dev.k_cache.fetch() == c.k_cache) << c.name << ": K";
    EXPECT_TRUE(dev.v_cache.fetch() == c.v_cache) << c.name << ": V";
    EXPECT_EQ(dev.status.fetch()[0], -1) << c.name;
  }
}

TEST(CudaKvAppend, PositionsPastTheCosSinRowsSkipTheirEntryAndAreReported) {
  SKIP_WITHOUT_GPU();
  GqaAppendCase c(append_options(DType::bf16, 64, true, true, 0, "PER_CHANNEL", "PER_TENSOR", 4, 9),
                  AppendCache::PagedNhd, true, 9);
  c.new_lengths = {3, 3};
  c.p.rotary_positions = 12;  // entry 0: rows [5, 8) in range; entry 1: rows [10, 13) past the 12 rows
  DeviceCase dev(c);
  append_kv(c.p, dev.args(c));
  check(cudaDeviceSynchronize());
  c.new_lengths[1] = 0;  // what the CPU writes without entry 1
  append_kv(c.p, c.args(), Backend::Cpu);
  EXPECT_TRUE(dev.k_cache.fetch() == c.k_cache);
  EXPECT_TRUE(dev.v_cache.fetch() == c.v_cache);
  EXPECT_EQ(dev.status.fetch()[0], 1);
}

TEST(CudaKvAppend, RotaryInt8CaptureInAStrictGraphAndReplayWithNewPositions) {
  SKIP_WITHOUT_GPU();
  GqaOptions o = append_options(DType::f16, 128, true, false, 0, "PER_CHANNEL", "PER_CHANNEL", 8, 17);
  o.seq = 1, o.lengths = {6, 11};  // a decode step
  o.max_len = 16;                  // cos / sin rows for every position of the 16-row cache
  GqaAppendCase c(o, AppendCache::PagedHnd, false, 17);
  DeviceCase dev(c);
  cudaStream_t stream{};
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KvAppendArgs a = dev.args(c);
  a.stream = stream;
  cudaGraph_t graph{};
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  append_kv(c.p, a);
  check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec{};
  check(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < 3; ++step) {  // each replay: the next positions, new K rows
    for (std::int32_t& pos : c.positions) pos = (pos + 1) % 16;
    for (std::size_t i = 0; i < c.call.key.size(); i += 2) c.call.key[i + 1] = static_cast<std::byte>((i / 2 + step) % 0x3C);
    dev.positions.put(c.positions);
    dev.k_new.put(c.call.key);
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    append_kv(c.p, c.args(), Backend::Cpu);
    EXPECT_TRUE(dev.k_cache.fetch() == c.k_cache) << "replay " << step;
    EXPECT_TRUE(dev.v_cache.fetch() == c.v_cache) << "replay " << step;
    EXPECT_EQ(dev.status.fetch()[0], -1) << "replay " << step;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace attnkit::test
