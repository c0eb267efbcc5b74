// The online softmax on tensor-core accumulator fragments, shared by the tile kernels (attention_mma.cu with
// mma.sync, attention_wgmma.cu with Hopper's wgmma). Both hold a warp's 16 rows of scores in the m16n8
// accumulator layout: a thread has rows r0 = 16 warp + lane / 4 and r0 + 8, columns 8 j + 2 (lane % 4) + {0, 1}
// as s[j][0..1] (row r0) and s[j][2..3] (row r0 + 8); a row is spread over the 4 lanes of a quad. The same
// layout is the A operand of P V once P is rounded to the element type, so P never leaves registers.
#pragma once

#include "cuda/common/kernel_params.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <cstring>

namespace attnkit::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// Two floats rounded to the element type's pair (round to nearest); also returns the rounded values.
template <class T>
struct Pack2;
template <>
struct Pack2<__half> {
  static __device__ __forceinline__ std::uint32_t pack(float a, float b, float& ra, float& rb) {
    const __half2 h = __floats2half2_rn(a, b);
    ra = __low2float(h);
    rb = __high2float(h);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};
template <>
struct Pack2<__nv_bfloat16> {
  static __device__ __forceinline__ std::uint32_t pack(float a, float b, float& ra, float& rb) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    ra = __low2float(h);
    rb = __high2float(h);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};
template <class T>
__device__ __forceinline__ std::uint32_t pack_pair(float a, float b) {
  float ra, rb;
  return Pack2<T>::pack(a, b, ra, rb);
}

// D += A B on the tensor cores (sm_80+): A 16 x 16 row-major, B 16 x 8 column-major, D 16 x 8 in float32, in the
// m16n8k16 fragment layouts (the tile kernels and the decode-mma kernel).
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                 std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                        std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A block's rows in shared memory: (head, query) of each row and the key range [begin, end) it sees.
inline constexpr int kMaxTableRows = 128;  // rows of a block (setup_rows)
inline constexpr int kBlockKeyInts = 4 * (kMaxTableRows / 32);
struct RowTables {
  int* head;
  int* query;
  int* begin;
  int* end;
  int* lo_hi;  // kBlockKeyInts ints: per warp of rows, the union of its rows' visible ranges within the block's
               // key range, then the intersection of their ranges (folded into BlockKeys by setup_rows)
};

// Where a block's keys go: [lo, hi) is every key some row sees, [all_begin, all_end) the keys all rows see
// (tiles inside it need no per-element visibility test).
struct BlockKeys {
  int lo, hi, all_begin, all_end;
};

// Fills the row tables (threads < kRows) for the rows [first_row, first_row + rows) of the block. Call with the
// whole block; it synchronises once. Each warp of rows folds its ranges with warp reductions and leaves them in
// lo_hi; every thread folds the warps' after the barrier (all of a block's threads once hit 4 shared-memory
// atomics on the same 4 words, one after the other, behind a second barrier).
template <int kRows>
__device__ __forceinline__ BlockKeys setup_rows(const KernelParams& p, const BlockCoord& c, std::int64_t first_row,
                                                int rows, const core::SequenceRows& entry, const RowTables& t) {
  static_assert(kRows <= kMaxTableRows, "lo_hi holds 4 ints per warp of rows");
  constexpr int kRowWarps = (kRows + 31) / 32;
  const int tid = threadIdx.x;
  // Neutral values: no visible key, and a rowless thread bounds nothing.
  int lo = static_cast<int>(c.key_end), hi = static_cast<int>(c.key_begin), all_begin = 0, all_end = 0x7fffffff;
  if (tid < kRows) {
    int head = 0, query = 0, begin = 0, end = 0;
    if (tid < rows) {
      const RowOf row = row_of(p, c.kvh, first_row + tid);
      head = row.head;
      query = row.query;
      const core::KeyRange r = entry.rule.for_row(query, entry.key_length);
      begin = static_cast<int>(max64(r.begin, c.key_begin));
      end = static_cast<int>(max64(begin, min64(r.end, c.key_end)));
      if (begin < end) lo = begin, hi = end;
      // Every row, empty or not, bounds the keys all rows see.
      all_begin = begin;
      all_end = end;
    }
    t.head[tid] = head;
    t.query[tid] = query;
    t.begin[tid] = begin;
    t.end[tid] = end;
  }
  const int warp = tid / 32;
  if (warp < kRowWarps) {  // whole warps (a min / max of integers: the order cannot change the result)
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    all_begin = __reduce_max_sync(0xffffffffu, all_begin);
    all_end = __reduce_min_sync(0xffffffffu, all_end);
    if (tid % 32 == 0) {
      t.lo_hi[4 * warp] = lo;
      t.lo_hi[4 * warp + 1] = hi;
      t.lo_hi[4 * warp + 2] = all_begin;
      t.lo_hi[4 * warp + 3] = all_end;
    }
  }
  __syncthreads();
  BlockKeys keys{t.lo_hi[0], t.lo_hi[1], t.lo_hi[2], t.lo_hi[3]};
#pragma unroll
  for (int w = 1; w < kRowWarps; ++w) {
    keys.lo = min(keys.lo, t.lo_hi[4 * w]);
    keys.hi = max(keys.hi, t.lo_hi[4 * w + 1]);
    keys.all_begin = max(keys.all_begin, t.lo_hi[4 * w + 2]);
    keys.all_end = min(keys.all_end, t.lo_hi[4 * w + 3]);
  }
  return keys;
}

// setup_rows for a plain problem (runs_plain): every row sees the block's whole key range, and no table is
// written (the rows' heads and queries come from row_of where needed). Syncs the block once, as setup_rows does.
__device__ __forceinline__ BlockKeys plain_block_keys(const BlockCoord& c) {
  __syncthreads();
  const int begin = static_cast<int>(c.key_begin), end = static_cast<int>(c.key_end);
  return {begin, end, begin, end};
}

// transform_scores for a plain problem (runs_plain checks folds_scale): -inf for the keys at and past column `n`
// (the keys' end, in the last tile; every key where n <= 0). Returns the scale, left to softmax_exponentials.
template <int kCols>
__device__ __forceinline__ float scale_plain_scores(float (&s)[kCols / 8][4], float scale, int n) {
  const int lane = threadIdx.x % 32;
  if (n >= kCols) return scale;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (j * 8 + (lane % 4) * 2 + e % 2 >= n) s[j][e] = core::kNegInf;
    }
  return scale;
}

// -inf in one half's row of the scores outside its visible columns [lo_col, hi_col) of the tile.
template <int kCols>
__device__ __forceinline__ void hide_unseen_columns(float (&s)[kCols / 8][4], int half, int lo_col, int hi_col) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = j * 8 + (lane % 4) * 2 + e;
      float& x = s[j][half * 2 + e];
      x = col >= lo_col && col < hi_col ? x : core::kNegInf;
    }
}

// Scores of a tile of kCols keys starting at key k0 (n of them real): scale (or softcap), then, unless the
// tile is `full` (every row sees every key, no mask), the mask and the visibility test (-inf where unseen).
// Returns the factor still to apply, for softmax_exponentials: the scale where folds_scale (the scores are left
// raw), else 1.
// The rare steps sit behind block-uniform branches around whole unrolled loops, so the common path (a fully
// visible tile without softcap) stays short: per-element branches blow up the code and miss the I-cache.
// kFewLoadsInFlight: mask loads in groups of 8 (a compiler barrier between groups), for a kernel whose registers
// cannot hold 32 loads in flight (the wgmma kernel's consumers; the mma.sync kernel is better off without).
template <int kCols, bool kFewLoadsInFlight = false>
__device__ __forceinline__ float transform_scores(float (&s)[kCols / 8][4], const KernelParams& p, const BlockCoord& c,
                                                  const RowTables& t, int r0, int rows, std::int64_t k0, int n,
                                                  bool full) {
  const int lane = threadIdx.x % 32;
  const float scale = p.transform.scale;
  const float softcap = p.transform.softcap;
  const bool fold = folds_scale(p);
  const float left = fold ? scale : 1.0f;
  if (fold) {
    // (the scale goes into the exponent)
  } else if (softcap > 0.0f) {
    const float scale_over_cap = scale / softcap;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = softcap * tanhf(s[j][e] * scale_over_cap);
  } else {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= scale;
  }
  if (full) return left;
  // Keys as 32-bit offsets from the tile start (key ranges fit in int): the 64-bit form of this loop is what
  // pushed the wgmma kernel's consumers past their registers.
  const int first = static_cast<int>(k0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + half * 8;
    const int lo_col = r < rows ? t.begin[r] - first : 0;  // visible columns: [lo_col, hi_col) and < n
    const int hi_col = r < rows ? min(t.end[r] - first, n) : 0;
    if (p.has_mask) {
      // One row pointer per half and constant column offsets: the loads take immediate offsets, not 64
      // computed addresses (and the dtype switch sits outside the loop).
      const std::int64_t mask_row = r < rows ? p.lmask.index(c.b, t.head[r], t.query[r]) + k0 + (lane % 4) * 2 : 0;
      auto add_mask = [&](const auto* row) {
#pragma unroll
        for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = j * 8 + (lane % 4) * 2 + e;
            float& x = s[j][half * 2 + e];
            x = col >= lo_col && col < hi_col ? x + to_float(row[j * 8 + e]) : core::kNegInf;
          }
          if (kFewLoadsInFlight && j % 4 == 3) asm volatile("" ::: "memory");
        }
      };
      switch (p.mask_dtype) {
        case DType::f16: add_mask(static_cast<const __half*>(p.mask) + mask_row); break;
        case DType::bf16: add_mask(static_cast<const __nv_bfloat16*>(p.mask) + mask_row); break;
        case DType::f32: add_mask(static_cast<const float*>(p.mask) + mask_row); break;
      }
    } else {
      hide_unseen_columns<kCols>(s, half, lo_col, hi_col);
    }
  }
  return left;
}

// The visibility test alone, for a build whose problems have no mask and a scale left to the exponent
// (sees_keys_by_rule_only: the wgmma kernel's build of three per SM under a causal rule, a window or key
// lengths): -inf where a row does not see the key by its row table's range, or past column n. Returns nothing;
// the scale stays for softmax_exponentials.
template <int kCols>
__device__ __forceinline__ void hide_unseen_keys(float (&s)[kCols / 8][4], const RowTables& t, int r0, int rows,
                                                 int first, int n) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + half * 8;
    const int lo_col = r < rows ? t.begin[r] - first : 0;
    const int hi_col = r < rows ? min(t.end[r] - first, n) : 0;
    hide_unseen_columns<kCols>(s, half, lo_col, hi_col);
  }
}

// The online softmax for one tile, without the accumulator: new row maxima, the running sums scaled by
// alpha (the factor the accumulator needs too, rescale_accumulator) and s replaced by exp(s - max) (unrounded).
// score_scale: the factor transform_scores left (s are the raw scores times it; 1 where they are final). The
// maxima are kept in scaled scores (the split-K merge and the log-sum-exp read them); the exponent takes the
// factor in its FMA. A scaled maximum of +inf poisons the row, as a +inf score does (the raw scores may be finite).
template <int kCols>
__device__ __forceinline__ void softmax_exponentials(float (&s)[kCols / 8][4], float (&row_max)[2],
                                                     float (&row_sum)[2], float (&alpha)[2], float score_scale) {
  const float exponent_scale = score_scale * kLog2e;
  // The rows' maxima in four chains, joined at the end: a quarter as deep as one chain through every column
  // (each step waits on the one before), and four registers more, not one per column (a full tree made the
  // head-dim-128 wgmma build spill). Both halves' shuffles go side by side.
  constexpr int kChains = kCols / 8 < 4 ? kCols / 8 : 4;
  static_assert(kCols / 8 % kChains == 0 && (kChains & (kChains - 1)) == 0, "whole chains, joined by halving");
  float tile_maxima[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float m[kChains];
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const float pair = fmaxf(s[j][half * 2], s[j][half * 2 + 1]);
      m[j % kChains] = j < kChains ? pair : fmaxf(m[j % kChains], pair);
    }
#pragma unroll
    for (int width = kChains / 2; width >= 1; width /= 2)
#pragma unroll
      for (int j = 0; j < width; ++j) m[j] = fmaxf(m[j], m[j + width]);
    tile_maxima[half] = m[0];
  }
#pragma unroll
  for (int lane_bit = 1; lane_bit <= 2; lane_bit *= 2)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      tile_maxima[half] = fmaxf(tile_maxima[half], __shfl_xor_sync(0xffffffffu, tile_maxima[half], lane_bit));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float tile_max = tile_maxima[half] * score_scale;  // (score_scale > 0: the largest scaled score)
    const float new_max = fmaxf(row_max[half], tile_max);
    alpha[half] = core::rescale_factor(row_max[half], new_max);
    row_max[half] = new_max;
    row_sum[half] = new_max == -core::kNegInf ? __int_as_float(0x7fffffff) : row_sum[half] * alpha[half];
    const float shift = core::usable_max(new_max) * kLog2e;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) s[j][half * 2 + e] = fast_exp2(fmaf(s[j][half * 2 + e], exponent_scale, -shift));
  }
}

// The accumulator's rows times alpha. Most tiles after the first leave every row's max where it was: the
// multiply is skipped then (warp-uniform).
template <int kOutCols>
__device__ __forceinline__ void rescale_accumulator(float (&o)[kOutCols / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!__all_sync(0xffffffffu, alpha[half] == 1.0f)) {
#pragma unroll
      for (int t = 0; t < kOutCols / 8; ++t) {
        o[t][half * 2] *= alpha[half];
        o[t][half * 2 + 1] *= alpha[half];
      }
    }
  }
}

// Both, for kernels whose accumulator is idle during the softmax.
template <int kCols, int kOutCols>
__device__ __forceinline__ void softmax_step(float (&s)[kCols / 8][4], float (&o)[kOutCols / 8][4],
                                             float (&row_max)[2], float (&row_sum)[2], float score_scale) {
  float alpha[2];
  softmax_exponentials<kCols>(s, row_max, row_sum, alpha, score_scale);
  rescale_accumulator<kOutCols>(o, alpha);
}

// P for keys [16 kk, 16 kk + 16) of the tile, rounded to T, as the A operand of P V; adds the rounded values to
// the per-thread tile sums (the normaliser sums exactly what the numerator multiplies).
template <class T, int kCols>
__device__ __forceinline__ void pack_probabilities(const float (&s)[kCols / 8][4], int kk, std::uint32_t (&a)[4],
                                                   float (&tile_sum)[2]) {
  float rounded[8];
  a[0] = Pack2<T>::pack(s[2 * kk][0], s[2 * kk][1], rounded[0], rounded[1]);
  a[1] = Pack2<T>::pack(s[2 * kk][2], s[2 * kk][3], rounded[2], rounded[3]);
  a[2] = Pack2<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1], rounded[4], rounded[5]);
  a[3] = Pack2<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3], rounded[6], rounded[7]);
  tile_sum[0] += (rounded[0] + rounded[1]) + (rounded[4] + rounded[5]);
  tile_sum[1] += (rounded[2] + rounded[3]) + (rounded[6] + rounded[7]);
}

// P for keys [16 kk, 16 kk + 16) of the tile, rounded to T, as the A operand of P V, for a kernel that takes the
// rows' sums of the same rounded values from the tensor cores (add_probability_sums) instead of converting them
// back to float32 (pack_probabilities: two instructions per probability on a short tile's critical path).
template <class T, int kCols>
__device__ __forceinline__ void pack_probability_operand(const float (&s)[kCols / 8][4], int kk,
                                                         std::uint32_t (&a)[4]) {
  a[0] = pack_pair<T>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_pair<T>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_pair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_pair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// sums += P 1 over P's 16 keys (a, as pack_probability_operand gives it): the rows' sums of the rounded
// probabilities, exact products accumulated in float32, the whole row's in every thread of its quad (c[0]: row
// lane / 4, c[2]: row lane / 4 + 8; every column of the 8 holds the same sum).
template <class T>
__device__ __forceinline__ void add_probability_sums(float (&sums)[4], const std::uint32_t (&a)[4]) {
  constexpr std::uint32_t kOnes = std::is_same_v<T, __half> ? 0x3C003C00u : 0x3F803F80u;  // (1, 1) in T
  mma16816<T>(sums, a, kOnes, kOnes);
}

// The quad's tile sums into each row's running sum.
__device__ __forceinline__ void add_tile_sums(float (&tile_sum)[2], float (&row_sum)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    tile_sum[half] += __shfl_xor_sync(0xffffffffu, tile_sum[half], 1);
    tile_sum[half] += __shfl_xor_sync(0xffffffffu, tile_sum[half], 2);
    row_sum[half] += tile_sum[half];
  }
}

// Two elements as one 4-byte word (first in the low half), as a paired store writes them.
template <class T>
__device__ __forceinline__ std::uint32_t pair_bits(T first, T second) {
  std::uint16_t a, b;
  memcpy(&a, &first, 2);
  memcpy(&b, &second, 2);
  return static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b) << 16;
}

// Two elements at an address aligned to both: one store.
template <class T>
__device__ __forceinline__ void store_pair(T* at, T first, T second) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float2*>(at) = make_float2(first, second);
  } else {
    *reinterpret_cast<std::uint32_t*>(at) = pair_bits(first, second);
  }
}

// One of the thread's rows (`half`) of a split key range's finish: its partial state (max, sum, poison,
// accumulator) at `part` ([3 + columns]), for the merge pass: the accumulator's first `columns` columns (the real
// V dim of a kernel built for a wider bucket D). `v_scale(col)`: as in finish_rows.
template <int D, class VScale>
__device__ __forceinline__ void store_partial_row(float* part, int half, const float (&o)[D / 8][4],
                                                  const float (&row_max)[2], const float (&row_sum)[2],
                                                  VScale v_scale, int columns = D) {
  const int lane = threadIdx.x % 32;
  if (lane % 4 == 0) {
    part[0] = row_max[half];
    part[1] = row_sum[half];
    part[2] = isnan(row_sum[half]) ? 1.0f : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int col = j * 8 + (lane % 4) * 2;
    if (col < columns) part[3 + col] = o[j][half * 2] * v_scale(col);
    if (col + 1 < columns) part[3 + col + 1] = o[j][half * 2 + 1] * v_scale(col + 1);
  }
}

// Finish: normalise and write the thread's two rows (or leave the split-K partial of block `block` with kRows
// rows). A NaN sum means a NaN or +inf score. `v_scale(col)` scales output column col (a quantized V; else 1).
// kPlain (runs_plain; the mma.sync kernel's plain build): no partial, no sink, every output row on a pair
// boundary, rows from row_of (no tables). kBucketed: D is a bucket, the real V dim p.v_head_dim (<= D).
template <class T, int D, int kRows, bool kPlain = false, bool kBucketed = false, class VScale>
__device__ __forceinline__ void finish_rows(const KernelParams& p, const BlockCoord& c, const RowTables& t,
                                            std::int64_t block, int r0, int rows, const float (&o)[D / 8][4],
                                            const float (&row_max)[2], const float (&row_sum)[2],
                                            VScale v_scale) {
  const int lane = threadIdx.x % 32;
  // The real V dim (a kernel built for a bucket D wider than it; D itself where the kernel has no buckets).
  const int columns = kBucketed && p.bucketed ? static_cast<int>(p.v_head_dim) : D;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + half * 8;
    if (r >= rows) continue;
    const bool poisoned = isnan(row_sum[half]);
    const RowOf row = kPlain ? row_of(p, c.kvh, c.row_block * kRows + r) : RowOf{t.head[r], t.query[r]};
    if (!kPlain && p.partial != nullptr) {
      store_partial_row<D>(p.partial + (block * kRows + r) * (3 + columns), half, o, row_max, row_sum, v_scale,
                           columns);
      continue;
    }
    const bool sink = !kPlain && p.has_sink;
    const core::RowFinish fin = core::finish_row({row_max[half], row_sum[half], poisoned}, sink,
                                                 sink ? p.sinks[row.head] : 0.0f, p.masked_rows);
    T* out = static_cast<T*>(p.o) + (kPlain ? p.lo.index(c.b, row.head, row.query)
                                            : query_row_index(p, p.lo, c.b, row.head, row.query));
    // A thread's two columns side by side: one store of both where the row allows (any layout may start a row
    // on an odd element), half the store instructions of the block's epilogue.
    const bool paired = kPlain || reinterpret_cast<std::uintptr_t>(out) % (2 * sizeof(T)) == 0;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      if (col >= columns) break;  // (columns past the real V dim of a bucket are never stored)
      const T first = from_float<T>(finished_value(fin, o[j][half * 2] * v_scale(col)));
      const T second = from_float<T>(finished_value(fin, o[j][half * 2 + 1] * v_scale(col + 1)));
      if (paired && col + 1 < columns) {
        store_pair(out + col, first, second);
      } else {
        out[col] = first;
        if (col + 1 < columns) out[col + 1] = second;
      }
    }
    if (p.return_lse && lane % 4 == 0) p.lse[query_row_index(p, p.llse, c.b, row.head, row.query)] = fin.lse;
  }
}

// The wgmma kernel's plain finish (runs_plain: output rows on 16 bytes, no partial, no sink). A warp normalises
// its 16 rows into a staging tile in shared memory (its own rows of the Q tile, which no one reads after its
// last S), then writes them out in 16-byte chunks, consecutive lanes on consecutive chunks of a row: whole
// 128-byte lines where rows are contiguous. finish_rows' 4-byte pair stores touch 8 rows (8 lines) per
// instruction. The values and their rounding are finish_rows': the plain build gives the general build's bits.
// (The mma.sync kernel's 64-row blocks ran 2-5% slower so: bench/results/2026-11-30-h200-cuda-split-tail.md.)
// warp_row: the warp's first row in the block (of kRows); rows: the block's rows that exist; chunk_at(r, ch):
// the staging bytes of 16-byte chunk ch (8 columns) of the warp's row r (0-15), in the caller's swizzle.
template <class T, int D, int kRows, class ChunkAt>
__device__ __forceinline__ void finish_plain_rows(const KernelParams& p, const BlockCoord& c, int warp_row, int rows,
                                                  const float (&o)[D / 8][4], const float (&row_max)[2],
                                                  const float (&row_sum)[2], ChunkAt chunk_at) {
  static_assert(sizeof(T) == 2, "the plain build is float16 / bfloat16");
  constexpr int kChunks = D / 8;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + half * 8;
    // (The logarithm only where the log-sum-exp is returned: ~25 instructions per row otherwise spent.)
    const core::RowState state{row_max[half], row_sum[half], isnan(row_sum[half])};
    const core::RowFinish fin = p.return_lse ? core::finish_row(state, false, 0.0f, p.masked_rows)
                                             : core::finish_row<false>(state, false, 0.0f, p.masked_rows);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const T first = from_float<T>(finished_value(fin, o[j][half * 2]));
      const T second = from_float<T>(finished_value(fin, o[j][half * 2 + 1]));
      *reinterpret_cast<std::uint32_t*>(chunk_at(r, j) + (lane % 4) * 4) = pair_bits(first, second);
    }
    if (p.return_lse && lane % 4 == 0 && warp_row + r < rows) {
      const RowOf row = row_of(p, c.kvh, c.row_block * kRows + warp_row + r);
      p.lse[p.llse.index(c.b, row.head, row.query)] = fin.lse;
    }
  }
  __syncwarp();
#pragma unroll
  for (int e = lane; e < 16 * kChunks; e += 32) {
    const int r = e / kChunks, ch = e % kChunks;
    if (warp_row + r < rows && (!p.bucketed || ch * 8 < p.v_head_dim)) {  // (D: maybe a bucket, wider)
      const RowOf row = row_of(p, c.kvh, c.row_block * kRows + warp_row + r);
      T* at = static_cast<T*>(p.o) + p.lo.index(c.b, row.head, row.query) + ch * 8;
      *reinterpret_cast<uint4*>(at) = *reinterpret_cast<const uint4*>(chunk_at(r, ch));
    }
  }
}

}  // namespace attnkit::cuda
