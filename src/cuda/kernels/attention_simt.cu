// The CUDA-core (FFMA) attention kernel: every dtype, every head dim 1..256, any strides. It is the float32
// kernel and the fallback for half/bfloat16 shapes the tensor-core kernel does not take.
//
// A block owns kRows = 64 rows (the (query, head) pairs of one K/V head) and walks its key range in tiles of
// kKeys = 32. 128 threads form a 16 x 8 grid: thread (ty, tx) owns rows 4ty..4ty+3 and, for the scores,
// keys 4tx..4tx+3 of the tile (16 scores in registers, two 16-byte shared loads per 16 FMAs); for P·V the same
// rows and 8 output columns per 64-column chunk. The 8 threads of a row are consecutive lanes: row max and row
// sum are butterfly shuffles in a fixed order. Each tile's P·V is summed into fresh registers and then added
// to the running output (kept in shared memory) after one rescale: blockwise sums, for float32 accuracy at
// long key lengths. No atomics; every sum has a fixed order, so runs are bit-identical.
#include "cuda/common/kernel_params.cuh"
#include "cuda/host/kernel_launchers.hpp"

#include <cmath>

namespace attnkit::cuda {
namespace {

constexpr int kRows = 64;
constexpr int kKeys = 32;
constexpr int kThreads = 128;
constexpr int kColChunk = 64;                 // output columns per P·V pass
constexpr int kRowPad = kRows + 4;            // shared row length of Qᵀ and Pᵀ (float4-aligned, fewer conflicts)
constexpr int kKeyPad = kKeys + 4;            // shared row length of Kᵀ
constexpr float kLog2e = 1.4426950408889634f;

__host__ __device__ constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

struct SmemLayout {
  std::int64_t qt, kt, vs, pt, o, row_state, total;  // float offsets
  std::int64_t v_stride, o_stride;
};

__host__ __device__ inline SmemLayout smem_layout(std::int64_t head_dim, std::int64_t v_head_dim) {
  SmemLayout s;
  s.v_stride = round_up(v_head_dim, kColChunk) + 4;
  s.o_stride = round_up(v_head_dim, kColChunk) + 1;
  s.qt = 0;
  s.kt = s.qt + head_dim * kRowPad;
  s.vs = s.kt + head_dim * kKeyPad;
  s.pt = s.vs + kKeys * s.v_stride;
  s.o = s.pt + kKeys * kRowPad;
  s.row_state = s.o + kRows * s.o_stride;  // per row: head, query, begin, end (as int32)
  s.total = s.row_state + 4 * kRows;
  return s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_simt_kernel(const KernelParams p) {
  extern __shared__ float4 smem_raw[];
  float* smem = reinterpret_cast<float*>(smem_raw);
  const SmemLayout L = smem_layout(p.head_dim, p.v_head_dim);
  float* qt = smem + L.qt;
  float* kt = smem + L.kt;
  float* vs = smem + L.vs;
  float* pt = smem + L.pt;
  float* os = smem + L.o;
  auto* row_head = reinterpret_cast<int*>(smem + L.row_state);
  int* row_query = row_head + kRows;
  int* row_begin = row_query + kRows;
  int* row_end = row_begin + kRows;

  const int tid = threadIdx.x;
  const int ty = tid / 8;
  const int tx = tid % 8;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = block_coord(p, block);
  allow_dependent_grids();  // the split-K merge pass may launch (it waits for this grid before reading)
  const std::int64_t first_row = c.row_block * kRows;
  const core::SequenceRows entry = entry_rows(p, c.b);
  const int rows = block_rows(p, entry, first_row, kRows);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const std::int64_t D = p.head_dim;
  const std::int64_t Dv = p.v_head_dim;

  // Rows: which head and query each is, which keys of this range it sees; Qᵀ into shared memory.
  if (tid < kRows) {
    int head = 0, query = 0, begin = 0, end = 0;
    if (tid < rows) {
      const RowOf row = row_of(p, c.kvh, first_row + tid);
      head = row.head;
      query = row.query;
      const core::KeyRange r = entry.rule.for_row(query, entry.key_length);
      begin = static_cast<int>(max64(r.begin, c.key_begin));
      end = static_cast<int>(max64(begin, min64(r.end, c.key_end)));
    }
    row_head[tid] = head;
    row_query[tid] = query;
    row_begin[tid] = begin;
    row_end[tid] = end;
  }
  __syncthreads();
  const int warp = tid / 32;
  const int lane = tid % 32;
  constexpr int kWarps = kThreads / 32;
  for (int r = warp; r < kRows; r += kWarps) {
    const T* src = r < rows ? q + query_row_index(p, p.lq, c.b, row_head[r], row_query[r]) : nullptr;
    for (std::int64_t d = lane; d < D; d += 32) qt[d * kRowPad + r] = src != nullptr ? to_float(src[d]) : 0.0f;
  }
  for (std::int64_t e = tid; e < kRows * L.o_stride; e += kThreads) os[e] = 0.0f;
  int lo = c.key_end, hi = static_cast<int>(c.key_begin);
  for (int r = 0; r < rows; ++r) {
    if (row_begin[r] < row_end[r]) {
      lo = min(lo, row_begin[r]);
      hi = max(hi, row_end[r]);
    }
  }
  __syncthreads();

  // Keys every row of the block sees: tiles inside [all_begin, all_end) need no per-element visibility test.
  int all_begin = 0, all_end = 0x7fffffff;
  for (int r = 0; r < rows; ++r) {
    all_begin = max(all_begin, row_begin[r]);
    all_end = min(all_end, row_end[r]);
  }
  const float scale = p.transform.scale;
  const float softcap = p.transform.softcap;
  const float scale_over_cap = softcap > 0.0f ? scale / softcap : 0.0f;

  // Per-thread row state for rows 4ty..4ty+3 (the 8 threads of a row hold identical copies).
  float row_max[4], row_sum[4];
  bool poison[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    row_max[a] = core::kNegInf;
    row_sum[a] = 0.0f;
    poison[a] = false;
  }

  const std::int64_t first_tile = lo < hi ? lo / kKeys * kKeys : hi;
  for (std::int64_t t0 = first_tile; t0 < hi; t0 += kKeys) {
    const std::int64_t k0 = max64(t0, lo);
    const int n = static_cast<int>(min64(t0 + kKeys, hi) - k0);
    // K tile transposed, V tile as is; keys past n and columns past Dv are zero.
    if (p.k_type == KvType::Float && p.v_type == KvType::Float) {
      for (int j = warp; j < kKeys; j += kWarps) {
        const T* krow = j < n ? k + key_index(p, p.lk, entry, c.b, c.kvh, k0 + j) : nullptr;
        const T* vrow = j < n ? v + key_index(p, p.lv, entry, c.b, c.kvh, k0 + j) : nullptr;
        for (std::int64_t d = lane; d < D; d += 32) kt[d * kKeyPad + j] = krow != nullptr ? to_float(krow[d]) : 0.0f;
        for (std::int64_t d = lane; d < L.v_stride; d += 32)
          vs[j * L.v_stride + d] = vrow != nullptr && d < Dv ? to_float(vrow[d]) : 0.0f;
      }
    } else {  // a quantized cache (the GQA op's chunked prefill): dequantized value by value
      for (int j = warp; j < kKeys; j += kWarps) {
        const bool valid = j < n;
        const std::int64_t krow = valid ? key_index(p, p.lk, entry, c.b, c.kvh, k0 + j) : 0;
        const std::int64_t vrow = valid ? key_index(p, p.lv, entry, c.b, c.kvh, k0 + j) : 0;
        for (std::int64_t d = lane; d < D; d += 32)
          kt[d * kKeyPad + j] = valid ? load_kv_value<T>(p.k, p.k_type, p.k_quant, p.k_scale, c.kvh, D, krow, d) : 0.0f;
        for (std::int64_t d = lane; d < L.v_stride; d += 32)
          vs[j * L.v_stride + d] =
              valid && d < Dv ? load_kv_value<T>(p.v, p.v_type, p.v_quant, p.v_scale, c.kvh, Dv, vrow, d) : 0.0f;
      }
    }
    __syncthreads();

    // Scores for rows 4ty.., keys 4tx..: s[a][b].
    float s[4][4] = {};
    for (std::int64_t d = 0; d < D; ++d) {
      const float4 qa = *reinterpret_cast<const float4*>(qt + d * kRowPad + 4 * ty);
      const float4 kb = *reinterpret_cast<const float4*>(kt + d * kKeyPad + 4 * tx);
      const float qv[4] = {qa.x, qa.y, qa.z, qa.w};
      const float kv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) s[a][b] = fmaf(qv[a], kv[b], s[a][b]);
    }

    // Scale (softcap), then visibility and mask only where the tile needs them: block-uniform branches around
    // whole unrolled loops keep the common path short (per-element branches bloat the code and miss the I-cache).
    const bool full = n == kKeys && !p.has_mask && all_begin <= k0 && all_end >= k0 + kKeys;
    if (softcap > 0.0f) {
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) s[a][b] = softcap * tanhf(s[a][b] * scale_over_cap);
    } else {
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) s[a][b] *= scale;
    }
    if (!full) {
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int r = 4 * ty + a;
        const int begin = r < rows ? row_begin[r] : 0;
        const int end = r < rows ? row_end[r] : 0;
        const std::int64_t mask_row = p.has_mask && r < rows ? p.lmask.index(c.b, row_head[r], row_query[r]) : -1;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int j = 4 * tx + b;
          const std::int64_t key = k0 + j;
          const bool seen = j < n && key >= begin && key < end;
          s[a][b] = seen ? (mask_row >= 0 ? s[a][b] + load_mask(p, mask_row + key) : s[a][b]) : core::kNegInf;
        }
      }
    }
    float alpha[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int r = 4 * ty + a;
      float tile_max = core::kNegInf;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        poison[a] |= !(s[a][b] < INFINITY);
        tile_max = fmaxf(tile_max, s[a][b]);
      }
#pragma unroll
      for (int lane = 1; lane < 8; lane <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, lane));
      const float new_max = fmaxf(row_max[a], tile_max);
      const float use_max = core::usable_max(new_max);
      alpha[a] = core::rescale_factor(row_max[a], new_max);
      float tile_sum = 0.0f;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        // ex2.approx: relative error ~2^-22; (s - max) first keeps the argument's rounding relative to itself.
        const float e = fast_exp2((s[a][b] - use_max) * kLog2e);
        pt[(4 * tx + b) * kRowPad + r] = e;
        tile_sum += e;
      }
#pragma unroll
      for (int lane = 1; lane < 8; lane <<= 1) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, lane);
      row_sum[a] = row_sum[a] * alpha[a] + tile_sum;
      row_max[a] = new_max;
    }
    __syncthreads();

    // Blockwise P·V: this tile's sum in fresh registers, then O = O·alpha + tile.
    for (std::int64_t c0 = 0; c0 < Dv; c0 += kColChunk) {
      float acc[4][8] = {};
      for (int j = 0; j < n; ++j) {
        const float4 pa = *reinterpret_cast<const float4*>(pt + j * kRowPad + 4 * ty);
        const float4 v0 = *reinterpret_cast<const float4*>(vs + j * L.v_stride + c0 + 8 * tx);
        const float4 v1 = *reinterpret_cast<const float4*>(vs + j * L.v_stride + c0 + 8 * tx + 4);
        const float pv[4] = {pa.x, pa.y, pa.z, pa.w};
        const float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 8; ++b) acc[a][b] = fmaf(pv[a], vv[b], acc[a][b]);
      }
      // 0 * inf is NaN: a key hidden from this row (weight 0) whose V holds inf or NaN must not reach it. Rare:
      // check the tile's sums and redo them with guarded products.
      bool finite = true;
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) finite &= fabsf(acc[a][b]) < INFINITY;
      if (!finite) {
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 8; ++b) acc[a][b] = 0.0f;
        for (int j = 0; j < n; ++j) {
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            const float pj = pt[j * kRowPad + 4 * ty + a];
            if (pj == 0.0f) continue;
#pragma unroll
            for (int b = 0; b < 8; ++b) acc[a][b] = fmaf(pj, vs[j * L.v_stride + c0 + 8 * tx + b], acc[a][b]);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          float& o = os[(4 * ty + a) * L.o_stride + c0 + 8 * tx + b];
          o = fmaf(o, alpha[a], acc[a][b]);
        }
    }
    __syncthreads();
  }

  // Finish: normalise and write O (or the split-K partial). Thread tx == 0 of each row writes its state.
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int r = 4 * ty + a;
    if (r >= rows) continue;
    const std::int64_t cols_per_thread = (Dv + 7) / 8;
    const std::int64_t d_begin = tx * cols_per_thread;
    const std::int64_t d_end = min64(Dv, d_begin + cols_per_thread);
    if (p.partial != nullptr) {
      float* part = p.partial + (block * kRows + r) * (3 + Dv);
      if (tx == 0) {
        part[0] = row_max[a];
        part[1] = row_sum[a];
        part[2] = poison[a] ? 1.0f : 0.0f;
      }
      for (std::int64_t d = d_begin; d < d_end; ++d) part[3 + d] = os[r * L.o_stride + d];
      continue;
    }
    const core::RowState state{row_max[a], row_sum[a], poison[a]};
    const core::RowFinish fin =
        core::finish_row(state, p.has_sink, p.has_sink ? p.sinks[row_head[r]] : 0.0f, p.masked_rows);
    T* out = static_cast<T*>(p.o) + query_row_index(p, p.lo, c.b, row_head[r], row_query[r]);
    for (std::int64_t d = d_begin; d < d_end; ++d) out[d] = from_float<T>(finished_value(fin, os[r * L.o_stride + d]));
    if (p.return_lse && tx == 0) p.lse[query_row_index(p, p.llse, c.b, row_head[r], row_query[r])] = fin.lse;
  }
}

}  // namespace

std::size_t simt_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim) {
  return static_cast<std::size_t>(smem_layout(head_dim, v_head_dim).total) * sizeof(float);
}

template <class T>
void launch_typed(const KernelParams& p, std::int64_t blocks, std::size_t smem, cudaStream_t stream) {
  allow_max_dynamic_smem<attention_simt_kernel<T>>();
  attention_simt_kernel<T><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
}

void launch_simt(const KernelParams& p, DType dtype, std::int64_t blocks, std::size_t smem, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: launch_typed<float>(p, blocks, smem, stream); break;
    case DType::f16: launch_typed<__half>(p, blocks, smem, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(p, blocks, smem, stream); break;
  }
}

}  // namespace attnkit::cuda
