// The wgmma kernel's Q tile in shared memory (attention_wgmma.cu): the 128-byte-swizzle layout that wgmma reads
// and TMA writes, and the GQA op's Q' = rotary(Q) loaded into it (the rotary applied as Q loads).
#pragma once

#include "cuda/common/fragment_softmax.cuh"

#include <cstdint>

namespace attnkit::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk `chunk` of row `row` in a [D / 64][rows][64] tile of a 2-byte type with the
// 128-byte swizzle (every 64-column block is rows x 128 bytes; 8 rows make one 1024-byte pattern). TMA writes
// K and V tiles in this layout itself (CU_TENSOR_MAP_SWIZZLE_128B).
__device__ __forceinline__ int swizzled_chunk(int rows, int row, int chunk) {
  return ((chunk / 8) * rows + row) * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}

// Q' = rotary(Q) from global memory into the swizzled Q tile (layout_rows rows; rows [rows, q_rows) get zeros),
// the rotated chunks only (first_position: the batch entry's position of query 0, loaded at the kernel's start
// so that a row's cos / sin loads wait on nothing without position_ids): `pairs` pairs per item (8 across chunks j and j + half / 8, or, interleaved, the 4 of
// chunk j), all loads of kBatch items issued before the first is worked on (each item waits on two dependent
// loads, its position and its cos / sin row). The plain chunks past the rotary dimension are the caller's.
template <class T>
__device__ void load_rotated_query(std::uint8_t* qs, int layout_rows, int rows, int q_rows, const RowTables& tables,
                                   const KernelParams& p, const BlockCoord& c, std::int64_t first_position, int t,
                                   int threads) {
  constexpr int kBatch = 4;
  const QueryRotary& rq = p.rotary;
  const int half = static_cast<int>(rq.half);
  const bool inter = rq.interleaved;
  const int per_row = inter ? half / 4 : half / 8;  // items of a row
  const T* q = static_cast<const T*>(p.q);
  const T* cos = static_cast<const T*>(rq.cos);
  const T* sin = static_cast<const T*>(rq.sin);
  for (int e0 = t; e0 < q_rows * per_row; e0 += kBatch * threads) {
    uint4 x[kBatch], y[kBatch], cs[kBatch], sn[kBatch];
    std::int64_t position[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int e = e0 + k * threads, r = e / per_row;
      position[k] = 0;
      if (e < q_rows * per_row && r < rows) {
        const std::int64_t s = tables.query[r];
        position[k] = rq.position_ids != nullptr ? rq.position_ids[c.b * rq.position_row + s] : first_position + s;
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int e = e0 + k * threads, r = e / per_row, j = e % per_row;
      x[k] = y[k] = cs[k] = sn[k] = uint4{};
      if (e < q_rows * per_row && r < rows) {
        const T* row = q + p.lq.index(c.b, tables.head[r], tables.query[r]);
        x[k] = *reinterpret_cast<const uint4*>(row + j * 8);
        if (inter) {
          const uint2 a = *reinterpret_cast<const uint2*>(cos + position[k] * half + j * 4);
          const uint2 b = *reinterpret_cast<const uint2*>(sin + position[k] * half + j * 4);
          cs[k] = uint4{a.x, a.y, 0u, 0u};
          sn[k] = uint4{b.x, b.y, 0u, 0u};
        } else {
          y[k] = *reinterpret_cast<const uint4*>(row + (j + half / 8) * 8);
          cs[k] = *reinterpret_cast<const uint4*>(cos + position[k] * half + j * 8);
          sn[k] = *reinterpret_cast<const uint4*>(sin + position[k] * half + j * 8);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int e = e0 + k * threads, r = e / per_row, j = e % per_row;
      if (e >= q_rows * per_row) break;
      T* a = reinterpret_cast<T*>(&x[k]);
      T* b = reinterpret_cast<T*>(&y[k]);
      const T* cv = reinterpret_cast<const T*>(&cs[k]);
      const T* sv = reinterpret_cast<const T*>(&sn[k]);
      if (inter) {  // pairs (2i, 2i + 1) of the chunk
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float u = to_float(a[2 * i]), v = to_float(a[2 * i + 1]);
          const float co = to_float(cv[i]), si = to_float(sv[i]);
          a[2 * i] = from_float<T>(rotate_first(u, v, co, si));
          a[2 * i + 1] = from_float<T>(rotate_second(u, v, co, si));
        }
      } else {  // pairs (i, i + half): element i of chunk j and of chunk j + half / 8
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float u = to_float(a[i]), v = to_float(b[i]);
          const float co = to_float(cv[i]), si = to_float(sv[i]);
          a[i] = from_float<T>(rotate_first(u, v, co, si));
          b[i] = from_float<T>(rotate_second(u, v, co, si));
        }
        *reinterpret_cast<uint4*>(qs + swizzled_chunk(layout_rows, r, j + half / 8)) = y[k];
      }
      *reinterpret_cast<uint4*>(qs + swizzled_chunk(layout_rows, r, j)) = x[k];
    }
  }
}
#endif

}  // namespace attnkit::cuda
