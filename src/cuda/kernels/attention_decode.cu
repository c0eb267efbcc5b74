// The decode kernel: few query rows per K/V head (a decode step, grouped heads, a short chunk), a long key range,
// K/V stored as the query's type or quantized (int8 / int4, dequantized in registers). Here the work is reading
// the cache, so the kernel is built around streaming K and V once, with enough bytes in flight:
//
//   * A block owns kRows = 4 rows ((query, head) pairs of one K/V head: the query heads of a group share every
//     K/V load) and one key range of at most kDecodeMaxKeys keys (the split-K plan makes the ranges).
//   * K, then V, stream through shared memory in 16 KB tiles, kStages deep (cp.async: the copies of the next
//     tiles are in flight while this one is computed; the first V tiles are issued before the softmax pass).
//   * Lanes split a row into chunks of 16 values (32 bytes of float16, 16 of int8, 8 of int4): a row is read by
//     L = pow2(D / 16) consecutive lanes, 128 / L rows at a time per block.
//   * Pass 1: each lane group forms the dot products of its keys with the 4 query rows (Q in registers, the K
//     scales folded into it), reduces them over its L lanes and writes the scores to shared memory.
//   * Pass 2: one warp per row takes the max and the sum of exp over the whole range: a single max, so there is
//     no running rescale at all.
//   * Pass 3: each lane group accumulates p * V of its keys for its 16 columns; the groups' sums are folded in a
//     fixed order (shuffles, then the warps through shared memory), the V scales applied at the end.
//
// Every sum has a fixed order: runs are bit-identical. Ranges longer than kDecodeMaxKeys are the plan's to
// split, never the kernel's to meet.
#include "cuda/host/kernel_launchers.hpp"

namespace attnkit::cuda {
namespace {

constexpr int kRows = static_cast<int>(kDecodeRows);
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;       // values a lane reads of each K/V row
constexpr int kStages = 3;       // K/V tiles in shared memory: one computed, the next ones in flight
constexpr int kStageBytes = 16384;
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory: scores / probabilities [kRows][kDecodeMaxKeys] (at the end the warps' partial outputs
// [kWarps][kRows][256] reuse it), then kStages tiles of K or V rows.
constexpr std::size_t kScoreFloats = static_cast<std::size_t>(kRows) * kDecodeMaxKeys;
static_assert(kScoreFloats >= static_cast<std::size_t>(kWarps) * kRows * 256, "the fold must fit the scores");

// One lane's 16 values of a stored row, as raw 16-byte words (float32 needs four, half types two, int8 one,
// int4 half of one).
template <class S>
struct ChunkWords {
  static constexpr int kBytes = static_cast<int>(sizeof(S)) * kChunk;
  static constexpr int kWords = kBytes >= 16 ? kBytes / 16 : 1;
  uint4 w[kWords];
};
template <>
struct ChunkWords<Int4Tag> {
  uint4 w[1];  // x, y used
};

// A lane's chunk of a row in a shared-memory tile.
template <class S>
__device__ __forceinline__ void load_chunk(ChunkWords<S>& c, const std::byte* chunk) {
  const uint4* src = reinterpret_cast<const uint4*>(chunk);
#pragma unroll
  for (int i = 0; i < ChunkWords<S>::kWords; ++i) c.w[i] = src[i];
}
__device__ __forceinline__ void load_chunk(ChunkWords<Int4Tag>& c, const std::byte* chunk) {
  const uint2 v = *reinterpret_cast<const uint2*>(chunk);
  c.w[0].x = v.x;
  c.w[0].y = v.y;
}

template <class S>
__device__ __forceinline__ void widen_chunk(const ChunkWords<S>& c, float (&x)[kChunk]) {
  const S* e = reinterpret_cast<const S*>(c.w);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) x[i] = to_float(e[i]);
}
__device__ __forceinline__ void widen_chunk(const ChunkWords<std::int8_t>& c, float (&x)[kChunk]) {
  widen_int8x4(c.w[0].x, x);
  widen_int8x4(c.w[0].y, x + 4);
  widen_int8x4(c.w[0].z, x + 8);
  widen_int8x4(c.w[0].w, x + 12);
}
__device__ __forceinline__ void widen_chunk(const ChunkWords<Int4Tag>& c, float (&x)[kChunk]) {
  widen_int4x8(c.w[0].x, x);
  widen_int4x8(c.w[0].y, x + 8);
}

// The element pointer type of a stored row: S itself, or bytes for int4.
template <class S>
struct Stored {
  using type = S;
  static constexpr bool kQuantized = !std::is_same_v<S, float> && !std::is_same_v<S, __half> &&
                                     !std::is_same_v<S, __nv_bfloat16>;
  static constexpr int kChunkBytes = static_cast<int>(sizeof(S)) * kChunk;
  // Values -> bytes of a row.
  static __device__ __forceinline__ std::int64_t bytes(std::int64_t values) { return values * sizeof(S); }
};
template <>
struct Stored<Int4Tag> {
  using type = std::uint8_t;
  static constexpr bool kQuantized = true;
  static constexpr int kChunkBytes = kChunk / 2;
  static __device__ __forceinline__ std::int64_t bytes(std::int64_t values) { return values / 2; }
};

// Rows [lo, lo + n) of one K or V head, streamed through the stage tiles. Each thread copies fixed 16-byte
// chunks; a tile holds tile_keys rows packed (row_bytes apart).
struct RowStream {
  const std::byte* head;  // row 0 of the head
  std::int64_t row_stride;  // bytes
  int row_bytes, tile_keys, tiles, lo, n;
  std::byte* stages;

  __device__ void issue(int t) const {
    if (t < tiles) {
      const int k0 = t * tile_keys;
      const int chunks_per_row = row_bytes / 16;
      const int chunks = min(tile_keys, n - k0) * chunks_per_row;
      std::byte* dst = stages + (t % kStages) * kStageBytes;
      // i = key * chunks_per_row + ch, stepped by kThreads without a division per copy.
      int key = threadIdx.x / chunks_per_row, ch = threadIdx.x % chunks_per_row;
      const int key_step = kThreads / chunks_per_row, ch_step = kThreads % chunks_per_row;
      for (int i = threadIdx.x; i < chunks; i += kThreads) {
        cp_async16(dst + i * 16, head + (lo + k0 + key) * row_stride + ch * 16, true);
        key += key_step;
        ch += ch_step;
        if (ch >= chunks_per_row) {
          ch -= chunks_per_row;
          ++key;
        }
      }
    }
    cp_async_commit();  // an empty group past the last tile keeps the wait counts uniform
  }
  // The first kStages - 1 tiles (issued ahead of the loop, possibly before other work).
  __device__ void prologue() const {
    for (int t = 0; t < kStages - 1; ++t) issue(t);
  }
  // Calls visit(tile, first key of the tile, keys in it) for each tile once every thread's copies landed.
  template <class Visit>
  __device__ void run(Visit&& visit) const {
    for (int t = 0; t < tiles; ++t) {
      issue(t + kStages - 1);
      cp_async_wait<kStages - 1>();
      __syncthreads();
      visit(stages + (t % kStages) * kStageBytes, t * tile_keys, min(tile_keys, n - t * tile_keys));
      __syncthreads();  // the tile's stage is refilled by the next issue
    }
    cp_async_wait_all();
  }
};

template <class T, class S>
__global__ void __launch_bounds__(kThreads) attention_decode_kernel(const KernelParams p) {
  extern __shared__ float4 smem_raw[];
  float* scores = reinterpret_cast<float*>(smem_raw);  // [kRows][kDecodeMaxKeys]
  __shared__ int row_head[kRows], row_query[kRows], row_begin[kRows], row_end[kRows];
  __shared__ float row_max[kRows], row_sum[kRows];
  __shared__ int row_poison[kRows];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = block_coord(p, block);
  allow_dependent_grids();  // the split-K merge pass may launch (it waits for this grid before reading)
  const std::int64_t first_row = c.row_block * kRows;
  const int rows = static_cast<int>(min64(kRows, p.group_rows - first_row));
  const std::int64_t key_length = key_length_of(p, c.b);
  const std::int64_t D = p.head_dim;

  if (tid < kRows) {
    int head = 0, query = 0, begin = 0, end = 0;
    if (tid < rows) {
      const RowOf row = row_of(p, c.kvh, first_row + tid);
      head = row.head;
      query = row.query;
      const core::KeyRange r = p.rule.for_batch(p.causal_offsets, c.b).for_row(query, key_length);
      begin = static_cast<int>(max64(r.begin, c.key_begin));
      end = static_cast<int>(max64(begin, min64(r.end, c.key_end)));
    }
    row_head[tid] = head;
    row_query[tid] = query;
    row_begin[tid] = begin;
    row_end[tid] = end;
    row_poison[tid] = 0;
  }
  __syncthreads();
  // The keys any row sees; scores outside a row's own range are -inf.
  int lo = static_cast<int>(c.key_end), hi = static_cast<int>(c.key_begin);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r < rows && row_begin[r] < row_end[r]) {
      lo = min(lo, row_begin[r]);
      hi = max(hi, row_end[r]);
    }
  }
  const int n = max(0, hi - lo);

  // Lane geometry: L lanes per row (a power of two), `slots` rows in flight per block.
  int lanes_per_row = 1;
  while (lanes_per_row * kChunk < D) lanes_per_row *= 2;
  const int part = lane % lanes_per_row;  // this lane's chunk of a row
  const int slot = tid / lanes_per_row;
  const int slots = kThreads / lanes_per_row;
  const bool active = part * kChunk < D;  // D not a power of two: the last lanes of a group idle
  const std::int64_t d0 = static_cast<std::int64_t>(part) * kChunk;

  // Q rows (this lane's 16 columns), with the K scales folded in: q . (k * s) = (q * s) . k.
  float q[kRows][kChunk];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const T* src = static_cast<const T*>(p.q) + p.lq.index(c.b, row_head[r], row_query[r]);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      float x = active && r < rows ? to_float(src[d0 + i]) : 0.0f;
      if constexpr (Stored<S>::kQuantized) {
        if (active) x *= core::kv_scale_at(p.k_scale, p.k_quant, c.kvh, D, d0 + i);
      }
      q[r][i] = x;
    }
  }

  // Layouts count values; rows are streamed as bytes.
  std::byte* stages = reinterpret_cast<std::byte*>(scores + kScoreFloats);
  const int row_bytes = static_cast<int>(Stored<S>::bytes(D));
  const int tile_keys = kStageBytes / row_bytes;
  const int tiles = (n + tile_keys - 1) / tile_keys;
  const RowStream k_stream{static_cast<const std::byte*>(p.k) + Stored<S>::bytes(p.lk.index(c.b, c.kvh, 0)),
                           Stored<S>::bytes(p.lk.row_stride), row_bytes, tile_keys, tiles, lo, n, stages};
  const RowStream v_stream{static_cast<const std::byte*>(p.v) + Stored<S>::bytes(p.lv.index(c.b, c.kvh, 0)),
                           Stored<S>::bytes(p.lv.row_stride), row_bytes, tile_keys, tiles, lo, n, stages};
  const int per_slot = (tile_keys + slots - 1) / slots;  // warp-uniform trip count (the shuffles need every lane)
  const int chunk_at = part * Stored<S>::kChunkBytes;
  const float scale = p.transform.scale;
  const float softcap = p.transform.softcap;
  const float scale_over_cap = softcap > 0.0f ? scale / softcap : 0.0f;

  // Pass 1: scores.
  k_stream.prologue();
  k_stream.run([&](const std::byte* tile, int k0, int keys) {
    for (int u = 0; u < per_slot; ++u) {
      const int j = slot + u * slots;  // row of the tile
      float kx[kChunk];
      if (active && j < keys) {
        ChunkWords<S> kc;
        load_chunk(kc, tile + j * row_bytes + chunk_at);
        widen_chunk(kc, kx);
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) kx[i] = 0.0f;
      }
      float dot[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) acc = fmaf(q[r][i], kx[i], acc);
        dot[r] = acc;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        for (int o = 1; o < lanes_per_row; o <<= 1) dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], o);
      if (part == 0 && j < keys) {
        const std::int64_t key = lo + k0 + j;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float s = softcap > 0.0f ? softcap * tanhf(dot[r] * scale_over_cap) : dot[r] * scale;
          const bool seen = key >= row_begin[r] && key < row_end[r];
          if (seen && p.has_mask) s += load_mask(p, p.lmask.index(c.b, row_head[r], row_query[r]) + key);
          scores[r * kDecodeMaxKeys + k0 + j] = seen ? s : core::kNegInf;
        }
      }
    }
  });
  // The first V tiles are in flight during the softmax pass.
  v_stream.prologue();
  __syncthreads();

  // Pass 2: one warp per row: max, then p = exp(s - max) in place and its sum (fixed order: lane-strided, then
  // a butterfly).
  if (warp < rows) {
    float* s_row = scores + warp * kDecodeMaxKeys;
    float m = core::kNegInf;
    bool poison = false;
    for (int j = lane; j < n; j += 32) {
      poison |= !(s_row[j] < INFINITY);
      m = fmaxf(m, s_row[j]);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float shift = core::usable_max(m) * kLog2e;
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = fast_exp2(fmaf(s_row[j], kLog2e, -shift));
      s_row[j] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    poison = __any_sync(0xffffffffu, poison);
    if (lane == 0) {
      row_max[warp] = m;
      row_sum[warp] = sum;
      row_poison[warp] = poison ? 1 : 0;
    }
  }
  __syncthreads();

  // Pass 3: O = P V for this lane's 16 columns over its keys.
  float acc[kRows][kChunk];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < kChunk; ++i) acc[r][i] = 0.0f;
  v_stream.run([&](const std::byte* tile, int k0, int keys) {
    for (int u = 0; u < per_slot; ++u) {
      const int j = slot + u * slots;
      if (!active || j >= keys) continue;
      ChunkWords<S> vc;
      load_chunk(vc, tile + j * row_bytes + chunk_at);
      float vx[kChunk];
      widen_chunk(vc, vx);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float pr = scores[r * kDecodeMaxKeys + k0 + j];
        // A hidden key has p = 0 exactly; skipping it keeps 0 * inf (a non-finite V) out of the row.
        if (pr == 0.0f) continue;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) acc[r][i] = fmaf(pr, vx[i], acc[r][i]);
      }
    }
  });
  // Fold the lane groups of a warp (butterfly over the slot bits), then the warps in order, through the
  // scores' shared memory (every read of it is done).
  __syncthreads();
  float* fold = scores;  // [kWarps][kRows][256]
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      for (int o = lanes_per_row; o < 32; o <<= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
  if (lane < lanes_per_row && active) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kChunk; ++i) fold[(warp * kRows + r) * 256 + d0 + i] = acc[r][i];
  }
  __syncthreads();

  // Finish: thread (row r, column d) sums the warps, applies the V scale, writes O or the split-K partial.
  const std::int64_t Dv = p.v_head_dim;
  for (int e = tid; e < kRows * 256; e += kThreads) {
    const int r = e / 256;
    const int d = e % 256;
    if (r >= rows || d >= Dv) continue;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += fold[(w * kRows + r) * 256 + d];
    if constexpr (Stored<S>::kQuantized) o *= core::kv_scale_at(p.v_scale, p.v_quant, c.kvh, Dv, d);
    if (p.partial != nullptr) {
      float* part_row = p.partial + (block * kRows + r) * (3 + Dv);
      if (d == 0) {
        part_row[0] = row_max[r];
        part_row[1] = row_sum[r];
        part_row[2] = row_poison[r] ? 1.0f : 0.0f;
      }
      part_row[3 + d] = o;
      continue;
    }
    const core::RowFinish fin = core::finish_row({row_max[r], row_sum[r], row_poison[r] != 0}, p.has_sink,
                                                 p.has_sink ? p.sinks[row_head[r]] : 0.0f, p.masked_rows);
    T* out = static_cast<T*>(p.o) + p.lo.index(c.b, row_head[r], row_query[r]);
    out[d] = from_float<T>(finished_value(fin, o));
    if (p.return_lse && d == 0) p.lse[p.llse.index(c.b, row_head[r], row_query[r])] = fin.lse;
  }
}

template <class T, class S>
struct Instance {
  static constexpr auto kernel = attention_decode_kernel<T, S>;
};

// Calls f(Instance<T, S>{}) for the kernel instance of (dtype, storage).
template <class T, class F>
void with_storage(KvType type, F&& f) {
  switch (type) {
    case KvType::Float: return f(Instance<T, T>{});
    case KvType::Int8: return f(Instance<T, std::int8_t>{});
    case KvType::Int4: return f(Instance<T, Int4Tag>{});
  }
}
template <class F>
void with_instance(DType dtype, KvType type, F&& f) {
  switch (dtype) {
    case DType::f32: return with_storage<float>(type, f);
    case DType::f16: return with_storage<__half>(type, f);
    case DType::bf16: return with_storage<__nv_bfloat16>(type, f);
  }
}

}  // namespace

std::size_t decode_smem_bytes() { return kScoreFloats * sizeof(float) + kStages * kStageBytes; }

bool decode_supports(std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type) {
  // Rows are copied in 16-byte chunks: an int4 row of 16 values (8 bytes) is not.
  const std::int64_t multiple = k_type == KvType::Int4 ? 2 * kChunk : kChunk;
  return head_dim == v_head_dim && head_dim % multiple == 0 && head_dim <= 256 && k_type == v_type;
}

std::int64_t decode_value_alignment(KvType type, DType dtype) {
  // Rows are copied in 16-byte chunks: every row starts on 16 bytes.
  switch (type) {
    case KvType::Int8: return 16;
    case KvType::Int4: return 32;  // 16 bytes
    case KvType::Float: break;
  }
  return 16 / static_cast<std::int64_t>(dtype_size(dtype));
}

void launch_decode(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream) {
  with_instance(dtype, p.k_type, [&](auto instance) {
    using I = decltype(instance);
    allow_max_dynamic_smem<I::kernel>();
    I::kernel<<<static_cast<unsigned>(blocks), kThreads, decode_smem_bytes(), stream>>>(p);
  });
}

int decode_resident_blocks(DType dtype, KvType type) {
  int blocks = 1;
  with_instance(dtype, type, [&](auto instance) {
    using I = decltype(instance);
    static const int resident = resident_blocks_per_sm<I::kernel>(kThreads, decode_smem_bytes());
    blocks = resident;
  });
  return blocks;
}

}  // namespace attnkit::cuda
