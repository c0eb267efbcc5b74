// append_kv on the GPU: the new K/V rows copied into a paged or dense cache, reading positions, new lengths and
// the block table on the device only (no read-back: the call captures in a CUDA graph and replays with new
// values in the same buffers).
//
// A block owns 16 new rows of one batch entry, all K/V heads: its threads first check the entry's values together
// (core::append_entry_valid's rule, the block-table entries split among them), so that an entry with any value
// out of range writes nothing and is reported in the status word; then they copy the rows in 16-byte chunks
// (or elements, where a row does not start on 16 bytes).
#include "core/kv_append_rows.hpp"
#include "cuda/host/cuda_backend.hpp"

#include <attnkit/error.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace attnkit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 16;

struct AppendParams {
  core::KvAppendGeometry g;
  std::int64_t batch, kv_heads, head_dim, v_head_dim;
  Layout k_new, v_new, k_cache, v_cache;
  const std::byte *k_src, *v_src;
  std::byte *k_dst, *v_dst;
  const std::int32_t *positions, *new_lengths, *block_table;
  unsigned* status;  // (the int32 word, -1 before the launch; atomicMin as unsigned keeps the lowest entry)
  int elem;          // bytes per element
  bool chunks;       // every row of the four tensors starts on 16 bytes and dims are whole chunks
};

// The entry's rows in range: the cheap bounds by every thread, the block-table entries split among the threads.
__device__ bool entry_valid(const AppendParams& p, std::int64_t b, std::int64_t first, std::int64_t rows) {
  bool ok = rows >= 0 && rows <= p.g.new_len && (rows == 0 || (first >= 0 && first + rows <= p.g.capacity));
  if (ok && rows > 0 && p.g.page_size > 0) {
    const std::int32_t* table = p.block_table + b * p.g.max_pages_per_seq;
    for (std::int64_t j = first / p.g.page_size + threadIdx.x; j <= (first + rows - 1) / p.g.page_size; j += kThreads) {
      if (table[j] < 0 || table[j] >= p.g.num_pages) ok = false;
    }
  }
  return __syncthreads_and(ok) != 0;
}

template <class Word>
__device__ void copy_rows(const AppendParams& p, const Layout& from, const std::byte* src, const Layout& to,
                          std::byte* dst, std::int64_t dim, std::int64_t b, std::int64_t r0, std::int64_t rows,
                          std::int64_t first) {
  const std::int64_t words = dim * p.elem / static_cast<std::int64_t>(sizeof(Word));  // per row
  const std::int64_t total = rows * p.kv_heads * words;
  for (std::int64_t e = threadIdx.x; e < total; e += kThreads) {
    const std::int64_t w = e % words, hr = e / words;
    const std::int64_t h = hr % p.kv_heads, r = r0 + hr / p.kv_heads;
    const core::CacheRow at = core::append_target(p.g, p.block_table, b, first + r);
    const auto* s = reinterpret_cast<const Word*>(src + from.index(b, h, r) * p.elem);
    auto* d = reinterpret_cast<Word*>(dst + to.index(at.leading, h, at.row) * p.elem);
    d[w] = s[w];
  }
}

__global__ void __launch_bounds__(kThreads) kv_append_kernel(const AppendParams p) {
  const std::int64_t blocks_per_entry = (p.g.new_len + kRowsPerBlock - 1) / kRowsPerBlock;
  const std::int64_t b = blockIdx.x / blocks_per_entry;
  const std::int64_t r0 = blockIdx.x % blocks_per_entry * kRowsPerBlock;
  const std::int64_t first = p.positions[b];
  const std::int64_t rows = p.new_lengths != nullptr ? p.new_lengths[b] : p.g.new_len;
  if (!entry_valid(p, b, first, rows)) {
    if (threadIdx.x == 0 && r0 == 0 && p.status != nullptr) atomicMin(p.status, static_cast<unsigned>(b));
    return;
  }
  const std::int64_t mine = rows - r0 < kRowsPerBlock ? rows - r0 : kRowsPerBlock;
  if (mine <= 0) return;
  if (p.chunks) {
    copy_rows<uint4>(p, p.k_new, p.k_src, p.k_cache, p.k_dst, p.head_dim, b, r0, mine, first);
    copy_rows<uint4>(p, p.v_new, p.v_src, p.v_cache, p.v_dst, p.v_head_dim, b, r0, mine, first);
  } else if (p.elem == 4) {
    copy_rows<std::uint32_t>(p, p.k_new, p.k_src, p.k_cache, p.k_dst, p.head_dim, b, r0, mine, first);
    copy_rows<std::uint32_t>(p, p.v_new, p.v_src, p.v_cache, p.v_dst, p.v_head_dim, b, r0, mine, first);
  } else {
    copy_rows<std::uint16_t>(p, p.k_new, p.k_src, p.k_cache, p.k_dst, p.head_dim, b, r0, mine, first);
    copy_rows<std::uint16_t>(p, p.v_new, p.v_src, p.v_cache, p.v_dst, p.v_head_dim, b, r0, mine, first);
  }
}

bool rows_in_chunks(const Layout& l, std::int64_t dim, const void* base, int elem) {
  const std::int64_t m = 16 / elem;
  return reinterpret_cast<std::uintptr_t>(base) % 16 == 0 && dim % m == 0 && l.offset % m == 0 &&
         l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

void append_kv(const KvAppendProblem& pr, const KvAppendArgs& a) {
  AppendParams p{};
  p.g = core::append_geometry(pr);
  p.batch = pr.batch;
  p.kv_heads = pr.kv_heads;
  p.head_dim = pr.head_dim;
  p.v_head_dim = pr.v_head_dim;
  p.k_new = pr.k_new;
  p.v_new = pr.v_new;
  p.k_cache = pr.k_cache;
  p.v_cache = pr.v_cache;
  p.k_src = static_cast<const std::byte*>(a.k_new.data);
  p.v_src = static_cast<const std::byte*>(a.v_new.data);
  p.k_dst = static_cast<std::byte*>(a.k_cache.data);
  p.v_dst = static_cast<std::byte*>(a.v_cache.data);
  p.positions = static_cast<const std::int32_t*>(a.positions.data);
  p.new_lengths = static_cast<const std::int32_t*>(a.new_lengths.data);
  p.block_table = static_cast<const std::int32_t*>(a.block_table.data);
  p.status = static_cast<unsigned*>(a.status.data);
  p.elem = static_cast<int>(dtype_size(pr.dtype));
  p.chunks = rows_in_chunks(pr.k_new, pr.head_dim, a.k_new.data, p.elem) &&
             rows_in_chunks(pr.v_new, pr.v_head_dim, a.v_new.data, p.elem) &&
             rows_in_chunks(pr.k_cache, pr.head_dim, a.k_cache.data, p.elem) &&
             rows_in_chunks(pr.v_cache, pr.v_head_dim, a.v_cache.data, p.elem);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (p.status != nullptr) check(cudaMemsetAsync(p.status, 0xFF, sizeof(std::int32_t), stream), "append_kv's status");
  const std::int64_t blocks = pr.batch * ((pr.new_len + kRowsPerBlock - 1) / kRowsPerBlock);
  if (blocks == 0 || pr.kv_heads == 0) return;
  check(blocks <= 0x7FFFFFFF ? cudaSuccess : cudaErrorInvalidConfiguration, "append_kv's grid (batch * new_len / 16 blocks)");
  kv_append_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  check(cudaGetLastError(), "append_kv's launch");
}

}  // namespace attnkit::cuda
