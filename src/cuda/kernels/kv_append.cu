// append_kv on the GPU: the new K/V rows copied into a paged or dense cache, reading positions, new lengths and
// the block table on the device only (no read-back: the call captures in a CUDA graph and replays with new
// values in the same buffers).
//
// A block owns 16 new rows of one batch entry, all K/V heads: its threads first check the entry's values together
// (core::append_entry_valid's rule, the block-table entries split among them), so that an entry with any value
// out of range writes nothing and is reported in the status word; then they copy the rows in 16-byte chunks
// (or elements, where a row does not start on 16 bytes).
//
// With rotary on K or a quantized cache the rows go through the GQA pre-pass's steps instead (gqa_rows.cuh: the
// same device functions, the CPU's bits): a warp per (row, head, K or V) widens the row into shared memory,
// rotates K at its position, rounds it to the rows' type and stores it, quantized when the cache is.
#include "core/kv_append_rows.hpp"
#include "cuda/host/cuda_backend.hpp"
#include "gqa/cuda/gqa_rows.cuh"

#include <attnkit/error.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace attnkit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerBlock = 16;
constexpr int kMaxDim = 256;

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
  // The steps of the GQA pre-pass (transform_kernel only).
  DeviceCache k_store, v_store;  // type, quantization, scales (data and rows: the layouts above)
  const void *cos_cache, *sin_cache;
  std::int64_t rotary_half;  // 0: no rotary
  bool interleaved;
};

// The entry's rows in range: the cheap bounds by every thread, the block-table entries split among the threads.
__device__ bool entry_valid(const AppendParams& p, std::int64_t b, std::int64_t first, std::int64_t rows) {
  bool ok = rows >= 0 && rows <= p.g.new_len &&
            (rows == 0 ||
             (first >= 0 && first + rows <= p.g.capacity && core::append_rotary_in_range(p.g, first, rows)));
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

// The rows this block appends: entry b's rows [r0, r0 + mine), the first of them at position `first`.
struct BlockRows {
  std::int64_t b, r0, first, mine;
};
// This block's rows; false when it has none, or when its entry's device values are out of range (then the
// entry's first block reports it in status, and no block of it writes).
__device__ bool block_rows(const AppendParams& p, BlockRows& out) {
  const std::int64_t blocks_per_entry = (p.g.new_len + kRowsPerBlock - 1) / kRowsPerBlock;
  out.b = blockIdx.x / blocks_per_entry;
  out.r0 = blockIdx.x % blocks_per_entry * kRowsPerBlock;
  out.first = p.positions[out.b];
  const std::int64_t rows = p.new_lengths != nullptr ? p.new_lengths[out.b] : p.g.new_len;
  if (!entry_valid(p, out.b, out.first, rows)) {
    if (threadIdx.x == 0 && out.r0 == 0 && p.status != nullptr) atomicMin(p.status, static_cast<unsigned>(out.b));
    return false;
  }
  out.mine = rows - out.r0 < kRowsPerBlock ? rows - out.r0 : kRowsPerBlock;
  return out.mine > 0;
}

__global__ void __launch_bounds__(kThreads) kv_append_kernel(const AppendParams p) {
  BlockRows br;
  if (!block_rows(p, br)) return;
  const std::int64_t b = br.b, r0 = br.r0, first = br.first, mine = br.mine;
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

// Byte address of value `index` of a cache (int4: an even index, two values per byte).
__device__ std::byte* cache_value(std::byte* base, const DeviceCache& c, std::int64_t index, int elem) {
  return base + (c.type == KvType::Int4 ? index / 2 : c.type == KvType::Int8 ? index : index * elem);
}

// The rows of one block (entry b, rows [r0, r0 + mine)) through the pre-pass's steps: warp w takes items w,
// w + kWarps, ... of (row, K or V, head).
template <class T>
__device__ void transform_rows(const AppendParams& p, std::int64_t b, std::int64_t r0, std::int64_t mine,
                               std::int64_t first, float* x) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (std::int64_t item = warp; item < mine * 2 * p.kv_heads; item += kWarps) {
    const std::int64_t r = r0 + item / (2 * p.kv_heads);
    const bool is_k = item % (2 * p.kv_heads) < p.kv_heads;
    const std::int64_t h = item % p.kv_heads;
    const std::int64_t dim = is_k ? p.head_dim : p.v_head_dim;
    const T* src = reinterpret_cast<const T*>(is_k ? p.k_src : p.v_src) + (is_k ? p.k_new : p.v_new).index(b, h, r);
    for (std::int64_t d = lane; d < dim; d += 32) x[d] = to_float(src[d]);
    __syncwarp();
    const std::int64_t position = first + r;
    if (is_k && p.rotary_half > 0) {
      const std::int64_t at = position * p.rotary_half;
      rotate_row_warp(x, static_cast<const T*>(p.cos_cache) + at, static_cast<const T*>(p.sin_cache) + at,
                      p.rotary_half, p.interleaved, lane);
    }
    // The new K rows are tensors of the rows' type (what a quantized cache quantizes), as in the GQA op.
    if (is_k) {
      for (std::int64_t d = lane; d < dim; d += 32) x[d] = round_to<T>(x[d]);
      __syncwarp();
    }
    const core::CacheRow at = core::append_target(p.g, p.block_table, b, position);
    const DeviceCache& cache = is_k ? p.k_store : p.v_store;
    const std::int64_t index = (is_k ? p.k_cache : p.v_cache).index(at.leading, h, at.row);
    std::byte* dst = cache_value(is_k ? p.k_dst : p.v_dst, cache, index, p.elem);
    store_cache_row<T>(x, dim, cache, h, dst, lane);
    __syncwarp();
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) transform_kernel(const AppendParams p) {
  __shared__ float rows_smem[kWarps][kMaxDim];
  BlockRows br;
  if (block_rows(p, br)) transform_rows<T>(p, br.b, br.r0, br.mine, br.first, rows_smem[threadIdx.x / 32]);
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
  const auto store = [](const KvStorage& s, const ConstBuffer& scales) {
    return DeviceCache{nullptr, s.type, s.quant, 0, 0, static_cast<const float*>(scales.data)};
  };
  p.k_store = store(pr.k_storage, a.k_scale);
  p.v_store = store(pr.v_storage, a.v_scale);
  p.cos_cache = a.cos_cache.data;
  p.sin_cache = a.sin_cache.data;
  p.rotary_half = pr.rotary_dim / 2;
  p.interleaved = pr.rotary_interleaved;
  const bool transform = pr.rotary_dim > 0 || pr.k_storage.type != KvType::Float || pr.v_storage.type != KvType::Float;
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (p.status != nullptr) check(cudaMemsetAsync(p.status, 0xFF, sizeof(std::int32_t), stream), "append_kv's status");
  const std::int64_t blocks = pr.batch * ((pr.new_len + kRowsPerBlock - 1) / kRowsPerBlock);
  if (blocks == 0 || pr.kv_heads == 0) return;
  check(blocks <= 0x7FFFFFFF ? cudaSuccess : cudaErrorInvalidConfiguration, "append_kv's grid (batch * new_len / 16 blocks)");
  const auto grid = static_cast<unsigned>(blocks);
  if (!transform) {
    kv_append_kernel<<<grid, kThreads, 0, stream>>>(p);
  } else if (pr.dtype == DType::f32) {
    transform_kernel<float><<<grid, kThreads, 0, stream>>>(p);
  } else if (pr.dtype == DType::f16) {
    transform_kernel<__half><<<grid, kThreads, 0, stream>>>(p);
  } else {
    transform_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  }
  check(cudaGetLastError(), "append_kv's launch");
}

}  // namespace attnkit::cuda
