// append_kv on the CUDA backend: every case of ../kv_append_cases.hpp with its buffers on the device gives the
// expected caches bit for bit (chunk and element copies); out-of-range device values make their entry write
// nothing and report the lowest such entry; a call captured in a strict-mode graph replays with new positions.
#include "../kv_append_cases.hpp"

#include "gpu_test_support.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace attnkit {
namespace {

using testing::AppendCase;
using testing::CacheKind;
using testing::check;
using testing::DeviceVector;

// The case's buffers on the device, and its args pointing at them.
struct DeviceCase {
  DeviceVector<std::byte> k_new, v_new, k_cache, v_cache;
  DeviceVector<std::int32_t> block_table, positions, new_lengths, status;
  explicit DeviceCase(const AppendCase& c)
      : k_new(c.k_new), v_new(c.v_new), k_cache(c.k_cache), v_cache(c.v_cache), block_table(c.block_table),
        positions(c.positions), new_lengths(c.new_lengths), status(std::vector<std::int32_t>{7}) {}
  KvAppendArgs args(const AppendCase& c) const {
    const auto elem = static_cast<std::int64_t>(dtype_size(c.p.dtype));
    KvAppendArgs a;
    a.k_new = {k_new.data, static_cast<std::int64_t>(k_new.count) / elem};
    a.v_new = {v_new.data, static_cast<std::int64_t>(v_new.count) / elem};
    a.k_cache = {k_cache.data, static_cast<std::int64_t>(k_cache.count) / elem};
    a.v_cache = {v_cache.data, static_cast<std::int64_t>(v_cache.count) / elem};
    if (!c.block_table.empty()) a.block_table = {block_table.data, static_cast<std::int64_t>(block_table.count)};
    a.positions = {positions.data, static_cast<std::int64_t>(positions.count)};
    if (c.p.has_new_lengths) a.new_lengths = {new_lengths.data, static_cast<std::int64_t>(new_lengths.count)};
    a.status = {status.data, 1};
    return a;
  }
};

TEST(CudaKvAppend, EveryCaseWritesExactlyTheAppendedRows) {
  SKIP_WITHOUT_GPU();
  for (const AppendCase& c : testing::append_cases()) {
    // aligned: dense new rows, every row on 16 bytes where the dims are whole chunks (the 16-byte copies);
    // otherwise the case's padded rows (an offset of 1, rows 3 elements apart: the element copies) and a cache
    // one element off.
    for (const bool aligned : {true, false}) {
      AppendCase run = c;
      if (aligned) {
        run.p.k_new = Layout::positions_first(c.p.kv_heads, c.p.new_len, c.p.head_dim);
        run.p.v_new = Layout::positions_first(c.p.kv_heads, c.p.new_len, c.p.v_head_dim);
      } else {
        run.p.v_cache.offset += 1;
        run.v_cache.resize(run.v_cache.size() + dtype_size(c.p.dtype), std::byte{0x5A});
      }
      std::vector<std::byte> k, v;
      run.expected(k, v);
      DeviceCase dev(run);
      append_kv(run.p, dev.args(run), Backend::Auto);
      check(cudaDeviceSynchronize());
      EXPECT_TRUE(dev.k_cache.fetch() == k) << run.name << (aligned ? "" : " (element copies)");
      EXPECT_TRUE(dev.v_cache.fetch() == v) << run.name << (aligned ? "" : " (element copies)");
      EXPECT_EQ(dev.status.fetch()[0], -1) << run.name;
    }
  }
}

TEST(CudaKvAppend, OutOfRangeDeviceValuesSkipTheirEntryAndAreReported) {
  SKIP_WITHOUT_GPU();
  AppendCase c(CacheKind::PagedNhd, DType::bf16, 4, 2, 6, 64, 64, 4, 3, true, 31);  // 12 rows per entry
  c.new_lengths = {6, 6, 6, 6};
  c.positions = {0, 0, 0, 0};
  c.positions[1] = 7;                                          // rows [7, 13) of 12
  c.block_table[static_cast<std::size_t>(3 * 3 + 1)] = -5;     // entry 3's second page
  c.new_lengths[2] = 9;                                        // past new_len
  std::vector<std::byte> k, v;
  c.expected(k, v, {false, true, true, true});
  DeviceCase dev(c);
  append_kv(c.p, dev.args(c));
  check(cudaDeviceSynchronize());
  EXPECT_TRUE(dev.k_cache.fetch() == k);
  EXPECT_TRUE(dev.v_cache.fetch() == v);
  EXPECT_EQ(dev.status.fetch()[0], 1);
}

TEST(CudaKvAppend, CaptureInAStrictGraphAndReplayWithNewPositions) {
  SKIP_WITHOUT_GPU();
  AppendCase c(CacheKind::PagedHnd, DType::f16, 3, 8, 1, 128, 128, 16, 8, false, 41);  // a decode step
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
  for (int step = 0; step < 3; ++step) {  // each replay: the next position, new rows
    for (std::int32_t& pos : c.positions) pos = static_cast<std::int32_t>((pos + 5 * step + 1) % 128);
    for (std::size_t i = 0; i < c.k_new.size(); ++i) c.k_new[i] = static_cast<std::byte>(i * 7 + step);
    dev.positions.put(c.positions);
    dev.k_new.put(c.k_new);
    std::vector<std::byte> k, v;
    c.expected(k, v);
    check(cudaGraphLaunch(exec, stream));
    check(cudaStreamSynchronize(stream));
    EXPECT_TRUE(dev.k_cache.fetch() == k) << "replay " << step;
    EXPECT_TRUE(dev.v_cache.fetch() == v) << "replay " << step;
    c.k_cache = k;
    c.v_cache = v;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace attnkit
