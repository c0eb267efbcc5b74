// The wgmma kernel's TMA descriptors (host code): K and V as 4-d tensors whose boxes are the kernel's tiles in
// the 128-byte swizzle, and the plain build's Q in boxes of one block's rows. attention_wgmma.cu reads them.
#include "cuda/config/tile_table.hpp"
#include "cuda/host/kernel_launchers.hpp"

#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

namespace attnkit::cuda {
namespace {

// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// cuTensorMapEncodeTiled with the last few maps kept per thread. A map describes an address and a geometry only
// (no driver resource), so the same arguments give the same map; a decode loop asks for the same ones every
// step, and the encode is host time the GPU may wait for (profile_gqa: a GQA decode step's host time).
bool encode_cached(CUtensorMap& map, CUtensorMapDataType element, void* start, const cuuint64_t (&dims)[4],
                   const cuuint64_t (&strides)[3], const cuuint32_t (&box)[4], CUtensorMapSwizzle swizzle,
                   CUtensorMapL2promotion promotion) {
  const auto fn = encode_tiled();
  if (fn == nullptr) return false;
  struct Entry {
    std::uintptr_t start;
    cuuint64_t dims[4], strides[3];
    cuuint32_t box[4];
    int element, swizzle, promotion;
    CUtensorMap map;
  };
  constexpr int kEntries = 8;
  thread_local Entry entries[kEntries];
  thread_local int used = 0, next = 0;
  const Entry key{reinterpret_cast<std::uintptr_t>(start), {dims[0], dims[1], dims[2], dims[3]},
                  {strides[0], strides[1], strides[2]}, {box[0], box[1], box[2], box[3]},
                  static_cast<int>(element), static_cast<int>(swizzle), static_cast<int>(promotion), {}};
  const auto same = [&](const Entry& e) {
    return e.start == key.start && e.element == key.element && e.swizzle == key.swizzle &&
           e.promotion == key.promotion &&
           std::equal(e.box, e.box + 4, key.box) && std::equal(e.dims, e.dims + 4, key.dims) &&
           std::equal(e.strides, e.strides + 3, key.strides);
  };
  for (int i = 0; i < used; ++i) {
    if (same(entries[i])) {
      map = entries[i].map;
      return true;
    }
  }
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = fn(&map, element, 4, start, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  entries[next] = key;
  entries[next].map = map;
  next = (next + 1) % kEntries;
  used = used < kEntries ? used + 1 : kEntries;
  return true;
}

// K or V as a 4-d tensor (head dim, key, K/V head, batch) whose boxes are 64 x 128 tiles in the 128-byte
// swizzle; keys past k_len read as zeros. A quantized cache: a tensor of bytes (stored row, key, K/V head,
// batch) whose boxes are whole stored rows of 128 keys, unswizzled (the converting warps read them).
// dim: the tensor's real head dim (K: head_dim, V: v_head_dim); its boxes cover the kernel's bucket, zeros past it.
bool encode_kv_map(CUtensorMap& map, const void* data, const DeviceLayout& l, const KernelParams& p, DType dtype,
                   KvType type, std::int64_t dim) {
  const bool quantized = type != KvType::Float;
  // Bytes per stored value, as a fraction: 2 (float16 / bfloat16), 1 (int8), 1 / 2 (int4).
  const std::int64_t num = quantized ? 1 : 2, den = type == KvType::Int4 ? 2 : 1;
  for (std::int64_t x : {l.offset, l.row_stride, l.head_stride, l.batch_stride}) {
    if (x * num % den != 0) return false;
  }
  const std::int64_t row_bytes = dim * num / den;
  const std::int64_t width = warpgroup_width(p.head_dim, p.v_head_dim);  // (the kernel's bucket's)
  cuuint32_t keys = static_cast<cuuint32_t>(warpgroup_tile_keys(warpgroup_bucket(width)));
  // Sequences: ragged keys as one tensor of total_k rows (the kernel adds the entry's first row); pages as the
  // batch axis, boxes of a page's rows where a page is smaller than a tile (warpgroup_takes_pages).
  std::int64_t key_rows = p.k_len, batch = p.batch;
  if (p.has_sequences && p.seq.paged()) {
    key_rows = p.seq.page_size;
    batch = p.num_pages;
    keys = static_cast<cuuint32_t>(std::min<std::int64_t>(keys, p.seq.page_size));
  } else if (p.has_sequences && p.seq.ragged_k) {
    key_rows = p.total_k;
    batch = 1;
  }
  if (key_rows < 1 || batch < 1) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(quantized ? row_bytes : dim),
                              static_cast<cuuint64_t>(key_rows), static_cast<cuuint64_t>(p.kv_heads),
                              static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(l.row_stride * num / den),
                           static_cast<cuuint64_t>(l.head_stride * num / den),
                           static_cast<cuuint64_t>(l.batch_stride * num / den)};
  // A dimension of extent 1 never steps: give it a stride TMA accepts whatever the layout says.
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1) strides[i] = i == 0 ? 16 : strides[i - 1] * dims[i];
  }
  const cuuint32_t box[4] = {quantized ? static_cast<cuuint32_t>(row_bytes) : 64u, keys, 1, 1};
  void* start = const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(data) + l.offset * num / den);
  const CUtensorMapDataType element = quantized ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                      : dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  // L2 promotion (a miss fetches 256 bytes) only where other row blocks read the same K/V tiles again. Where one
  // row block holds every query row of a K/V head (decode steps), each tile is read once, the box's rows are whole
  // 128-byte lines already, and promoting each miss fetched the line the other 64-column box asks for next: its
  // request then waited on that fill instead of streaming, and the L2 ran at 87% of its peak for DRAM's 79%.
  // Without it a decode step at batch 8 x 32k keys took 272 -> 251 us (4.28 TB/s; the stream alone, no softmax
  // or MMA: 264 -> 243 us), while the prefill cases ran 2-3% slower without it
  // (bench/results/2026-12-01-h200-cuda-l2-promotion.md).
  const bool read_once = p.group_rows <= warpgroup_rows(width, type);
  return encode_cached(map, element, start, dims, strides, box,
                       quantized ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                       read_once ? CU_TENSOR_MAP_L2_PROMOTION_NONE : CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// Q as a 4-d tensor (head dim, head, query, batch) whose boxes are one block's rows (64 or 128) in row_of's order
// (`group` heads fastest, then rows / group queries), 64 columns per box, in the 128-byte swizzle; queries past
// q_len read as zeros. Where a block's rows start on a query (rows % group == 0); or, for a single query, as
// `rows` consecutive heads from the block's first (a decode step of any group: 5, 7 or 71 heads per K/V head),
// whose rows past the group are other groups' heads or zeros, computed and never stored. Only where the rows are
// row_of's (no ragged or paged sequences), from float K/V's blocks (a quantized cache's build folds K's scales
// into its own copy). The kernel takes it where nothing else touches Q first (attention_wgmma_kernel-inl.cuh's
// q_by_tma; its issue_q addresses both boxes).
bool encode_q_map(CUtensorMap& map, const KernelParams& p, DType dtype) {
  const std::int64_t g = p.group;
  const std::int64_t rows = warpgroup_rows(p.head_dim, KvType::Float);
  const bool whole_queries = g >= 1 && rows % g == 0;
  if (p.has_sequences || p.k_type != KvType::Float || g < 1 || (!whole_queries && p.q_len != 1) ||
      p.v_head_dim != p.head_dim || (p.head_dim != 64 && p.head_dim != 128)) {
    return false;
  }
  const DeviceLayout& l = p.lq;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.heads),
                              static_cast<cuuint64_t>(p.q_len), static_cast<cuuint64_t>(p.batch)};
  cuuint64_t strides[3] = {static_cast<cuuint64_t>(l.head_stride * 2), static_cast<cuuint64_t>(l.row_stride * 2),
                           static_cast<cuuint64_t>(l.batch_stride * 2)};
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1) strides[i] = i == 0 ? 16 : strides[i - 1] * dims[i];
  }
  const cuuint32_t box[4] = {64u, static_cast<cuuint32_t>(whole_queries ? g : rows),
                             static_cast<cuuint32_t>(whole_queries ? rows / g : 1), 1};
  void* start = const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(p.q) + l.offset * 2);
  return encode_cached(map,
                       dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                       start, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

}  // namespace

bool warpgroup_maps(const KernelParams& p, DType dtype, WarpgroupMaps& maps) {
  maps.q_by_tma = encode_q_map(maps.q, p, dtype) ? 1 : 0;
  return encode_kv_map(maps.k, p.k, p.lk, p, dtype, p.k_type, p.head_dim) &&
         encode_kv_map(maps.v, p.v, p.lv, p, dtype, p.v_type, p.v_head_dim);
}

}  // namespace attnkit::cuda
