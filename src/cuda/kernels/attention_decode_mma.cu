// The decode-mma kernel: a decode step's few query rows per K/V head (at most 8 per block: a group of 4 or 8
// heads, one token) over a quantized cache (int8 / int4), on mma.sync with the keys on the MMA's M side.
//
// Why: with the rows on the M side (the other tensor-core kernels), a decode block's 4 real rows sit in 16
// (mma.sync) or 64 (wgmma) rows of MMA work, and an int8 tile, half the bytes of a float16 one, costs as much
// tensor-core time: the step is bound by padded MMAs, not by its bytes (docs/benchmarks.md). Here the scores
// are computed transposed, S^T = K Q^T (m16n8k16: 16 keys x 8 rows, the group's rows padded to 8 at most), and
// the output too, O^T = V^T P^T, so the MMA work follows the keys.
//
//   * A block is 4 warps over one (batch entry, K/V head, row block of 8, key range). The warps take the range's
//     16-key chunks in turn, each with its own online-softmax state; the 4 states are merged in warp order at
//     the end (core::merge_weights, as the split-K pass merges ranges).
//   * Each warp streams its chunks through its own ring of `kStages` shared-memory slots with cp.async, the
//     stored rows copied as they are (padded: the reads below hit distinct banks). Why not straight into
//     registers: Nsight Compute on the H200 showed that version bound by latency and issue (168 registers, 3
//     blocks per SM, 2 chunks in flight per warp, a stall on the loads most chunks; the int4 build's 4-deep
//     unrolled pipeline missed the instruction cache), at 3.1 TB/s for int8 and 1.25 TB/s for int4.
//   * From its slot a lane reads its words in the fragment order the MMAs want: the dot product does not care
//     about the order of the head dimension, so lane (g, t) takes the contiguous quarter t of keys g and g + 8
//     and gives its 4 values per k-step the k positions {2t, 2t + 1, 2t + 8, 2t + 9}; Q^T's B fragment takes
//     the same order once per block (with K's scales folded in). For O^T, lane (g, t) reads the contiguous
//     eighth g of keys 2t, 2t + 1, 2t + 8, 2t + 9; a byte permute pairs two keys' values of one dimension (the A
//     fragment of V^T); m-tile mt's rows g and g + 8 are dimensions 2 mt and 2 mt + 1 of eighth g, so each lane
//     ends holding whole runs of output columns.
//   * The integers are widened exactly (stored_pairs.cuh); P is rounded to the element type and the normaliser
//     sums the rounded values, like the other tensor-core kernels; P^T reaches the B fragment of O^T = V^T P^T
//     through movmatrix (the 8 x 8 transpose of the accumulator's pairs), never through shared memory.
//
// Every sum has a fixed order: runs are bit-identical.
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/host/kernel_launchers.hpp"
#include "cuda/common/stored_pairs.cuh"

#include <type_traits>

namespace attnkit::cuda {
namespace {

constexpr int kRows = static_cast<int>(kDecodeMmaRows);  // the n of m16n8k16
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunkKeys = 16;  // the m of m16n8k16
// Four blocks an SM (the rings' shared memory allows four): at most 128 registers a thread.
constexpr int kBlocksPerSm = 4;

template <class S>
constexpr int stored_row_bytes_of(int head_dim) {
  return std::is_same_v<S, Int4Tag> ? head_dim / 2 : head_dim;
}
// What a lane reads of a stored row: a quarter of a K row, an eighth of a V row.
template <class S, int D>
constexpr int kKBytes = stored_row_bytes_of<S>(D) / 4;
template <class S, int D>
constexpr int kVBytes = stored_row_bytes_of<S>(D) / 8;
// Lane t's word w of a K row (4 bytes, in read order) starts at byte k_word_byte(t, w): its contiguous quarter.
// K-step ks of S^T = K Q^T takes the lane's pairs 2 ks and 2 ks + 1 (pair_first / pair_second below say which
// values; Q^T's B fragment takes the same).
template <class S, int D>
__host__ __device__ constexpr int k_word_byte(int t, int w) {
  return kKBytes<S, D> * t + 4 * w;
}
// Which of a lane's values pair p of words_to_pairs holds: int8 words give pairs in value order (2p, 2p + 1),
// int4 words pairs (k, k + 4) of their 8 values (no permute back to value order). Any order of the head
// dimension serves the MMAs as long as Q^T's B fragment (for K) and the output columns (for V) follow it.
template <class S>
__host__ __device__ constexpr int pair_first(int p) {
  return std::is_same_v<S, Int4Tag> ? 8 * (p / 4) + p % 4 : 2 * p;
}
template <class S>
__host__ __device__ constexpr int pair_second(int p) {
  return pair_first<S>(p) + (std::is_same_v<S, Int4Tag> ? 4 : 1);
}
// The values a lane's bytes start at: bytes for int8, two values a byte for int4.
template <class S>
__host__ __device__ constexpr int values_of_bytes(int bytes) {
  return std::is_same_v<S, Int4Tag> ? 2 * bytes : bytes;
}

// A ring slot: one chunk's 16 K rows, then its 16 V rows, each row padded to a pitch at which a quarter-warp's
// (LDS.128), half-warp's (LDS.64) or warp's (LDS.32) reads fall on distinct banks: K rows g and g + 1 sit 16 bytes
// apart modulo 128 (128-byte rows, read in 32-byte quarters) or 64 / 32 bytes apart (shorter rows); V rows 2t
// sit 32 bytes apart modulo 128.
template <class S, int D>
struct Slot {
  static constexpr int kRowBytes = stored_row_bytes_of<S>(D);
  static constexpr int kKPitch = kRowBytes == 128 ? 144 : kRowBytes;
  static constexpr int kVPitch = kRowBytes == 128 ? 144 : 80;
  static constexpr int kVOffset = kChunkKeys * kKPitch;
  static constexpr int kBytes = kVOffset + kChunkKeys * kVPitch;
  static constexpr int kPieces = kRowBytes / 16;  // 16-byte pieces per stored row
};
// Slots per warp: about 13.5 KB of ring each (a block's 4 rings ~54 KB: 4 blocks of an SM's 227 KB).
template <class S, int D>
constexpr int kStages = (13824 / Slot<S, D>::kBytes) < 8 ? (13824 / Slot<S, D>::kBytes) : 8;

// kBytes of shared memory into words (one 16-, 8- or 4-byte read per 16 bytes).
template <int kBytes>
__device__ __forceinline__ void read_words(std::uint32_t (&w)[kBytes / 4], const std::uint8_t* src) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 x = *reinterpret_cast<const uint4*>(src + 16 * i);
      w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
    }
  } else if constexpr (kBytes == 8) {
    const uint2 x = *reinterpret_cast<const uint2*>(src);
    w[0] = x.x, w[1] = x.y;
  } else {
    static_assert(kBytes == 4, "a lane reads 4, 8 or a multiple of 16 bytes");
    w[0] = *reinterpret_cast<const unsigned int*>(src);
  }
}

// Stored words -> element-type pairs (int8: 2 pairs per word in value order, int4: 4, as pair_first says).
template <class T, class S, int kWords>
__device__ __forceinline__ void words_to_pairs(const std::uint32_t (&w)[kWords],
                                               std::uint32_t (&pairs)[kWords * (std::is_same_v<S, Int4Tag> ? 4 : 2)]) {
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    if constexpr (std::is_same_v<S, Int4Tag>) {
      std::uint32_t out[4];
      int4x8_to_pairs_k_k4<T>(w[i], out);
#pragma unroll
      for (int j = 0; j < 4; ++j) pairs[4 * i + j] = out[j];
    } else {
      std::uint32_t out[2];
      int8x4_to_pairs<T>(w[i], out);
      pairs[2 * i] = out[0], pairs[2 * i + 1] = out[1];
    }
  }
}

// float16 int8 V keeps the magic number's bias: a value v widens to the half 1152 + v (one byte permute, no
// subtraction), O^T accumulates sum p (1152 + v), and the bias comes off once per row at the end, 1152 times the
// row's sum of the same rounded p (the MMA's products are exact; the float32 sums carry ~1e-3 of an int8 step on
// 5k keys, far below the output's rounding). 2 of a chunk's ~11 instructions per V word less.
template <class T, class S>
constexpr bool kBiasedV = std::is_same_v<T, __half> && !std::is_same_v<S, Int4Tag>;
constexpr float kVBias = 1152.0f;

template <int kWords>
__device__ __forceinline__ void int8_words_to_biased_halves(const std::uint32_t (&w)[kWords],
                                                            std::uint32_t (&pairs)[2 * kWords]) {
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    const std::uint32_t b = w[i] ^ 0x80808080u;  // v + 128 as a byte
    pairs[2 * i] = __byte_perm(b, 0x64646464u, 0x4140);
    pairs[2 * i + 1] = __byte_perm(b, 0x64646464u, 0x4342);
  }
}

__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// A lane's stored bytes of one chunk: K keys g and g + 8 (quarter t), V keys 2t, 2t + 1, 2t + 8, 2t + 9
// (eighth g).
template <class S, int D>
struct RawChunk {
  std::uint32_t k[2][kKBytes<S, D> / 4];
  std::uint32_t v[4][kVBytes<S, D> / 4];
};

template <class S, int D>
__device__ __forceinline__ void read_chunk(RawChunk<S, D>& raw, const std::uint8_t* slot, int g, int t) {
  using L = Slot<S, D>;
#pragma unroll
  for (int i = 0; i < 2; ++i) read_words<kKBytes<S, D>>(raw.k[i], slot + (g + 8 * i) * L::kKPitch + k_word_byte<S, D>(t, 0));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = 2 * t + (i % 2) + 8 * (i / 2);
    read_words<kVBytes<S, D>>(raw.v[i], slot + L::kVOffset + key * L::kVPitch + g * kVBytes<S, D>);
  }
}

// Byte offset of value index `index` of a stored K/V buffer.
template <class S>
__device__ __forceinline__ std::int64_t stored_byte(std::int64_t index) {
  return std::is_same_v<S, Int4Tag> ? index / 2 : index;
}

// One warp's copies of its chunks into its ring, in order: lane l copies pieces l + 32 i (the first half K's, the
// second V's), row (l + 32 i) / kPieces of its region, column l % kPieces; rows past `hi` are zero-filled. The
// source pointers run along the warp's chunks (kWarps chunks apart), so that a full chunk costs its copies and
// two 64-bit additions.
template <class S, int D>
struct ChunkCopier {
  using L = Slot<S, D>;
  static constexpr int kRowsPerPass = 32 / L::kPieces;  // rows one pass of the warp's lanes covers
  static constexpr int kPasses = kChunkKeys / kRowsPerPass;
  const std::uint8_t* k_next;  // the lane's first K piece of the warp's next chunk
  const std::uint8_t* v_next;
  std::int64_t k_stride, v_stride;  // bytes from one key's row to the next
  int next_key;                     // the first key of that chunk
  int row0, column;

  __device__ ChunkCopier(const KernelParams& p, const BlockCoord& c, int lane, int first_key) {
    const auto* k = static_cast<const std::uint8_t*>(p.k);
    const auto* v = static_cast<const std::uint8_t*>(p.v);
    const std::int64_t k0 = stored_byte<S>(p.lk.index(c.b, c.kvh, 0));
    const std::int64_t v0 = stored_byte<S>(p.lv.index(c.b, c.kvh, 0));
    k_stride = stored_byte<S>(p.lk.index(c.b, c.kvh, 1)) - k0;
    v_stride = stored_byte<S>(p.lv.index(c.b, c.kvh, 1)) - v0;
    row0 = lane / L::kPieces;
    column = lane % L::kPieces;
    next_key = first_key;
    k_next = k + k0 + (first_key + row0) * k_stride + 16 * column;
    v_next = v + v0 + (first_key + row0) * v_stride + 16 * column;
  }

  // Copies the warp's next chunk into `slot` (nothing once past `hi`) and moves on to the one after.
  __device__ __forceinline__ void copy_next(std::uint8_t* slot, int hi) {
    std::uint8_t* k_dst = slot + row0 * L::kKPitch + 16 * column;
    std::uint8_t* v_dst = slot + L::kVOffset + row0 * L::kVPitch + 16 * column;
    if (next_key + kChunkKeys <= hi) {  // warp-uniform: a full chunk
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        cp_async16(k_dst + kRowsPerPass * i * L::kKPitch, k_next + kRowsPerPass * i * k_stride, true);
        cp_async16(v_dst + kRowsPerPass * i * L::kVPitch, v_next + kRowsPerPass * i * v_stride, true);
      }
    } else if (next_key < hi) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const bool valid = next_key + row0 + kRowsPerPass * i < hi;
        cp_async16(k_dst + kRowsPerPass * i * L::kKPitch, valid ? k_next + kRowsPerPass * i * k_stride : k_next, valid);
        cp_async16(v_dst + kRowsPerPass * i * L::kVPitch, valid ? v_next + kRowsPerPass * i * v_stride : v_next, valid);
      }
    }
    next_key += kWarps * kChunkKeys;
    k_next += kWarps * kChunkKeys * k_stride;
    v_next += kWarps * kChunkKeys * v_stride;
  }
};

template <class T, int D, class S>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) attention_decode_mma_kernel(const KernelParams p) {
  // The warps' rings while they stream; then [kWarps][kRows][D + 2] floats: each warp's accumulator, max, sum.
  extern __shared__ __align__(16) std::uint8_t smem[];
  __shared__ int table_mem[4 * kRows + kBlockKeyInts];
  const RowTables tables{table_mem, table_mem + kRows, table_mem + 2 * kRows, table_mem + 3 * kRows,
                         table_mem + 4 * kRows};
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = block_coord(p, block);
  const std::int64_t first_row = c.row_block * kRows;
  const int rows = static_cast<int>(min64(kRows, p.group_rows - first_row));
  const BlockKeys keys = setup_rows<kRows>(p, c, first_row, rows, entry_rows(p, c.b), tables);
  allow_dependent_grids();  // the split-K merge pass may launch (it waits for this grid before reading)
  // The warps take the chunks of [lo, hi) in turn; each keeps kStages - 1 of its next chunks in flight through
  // its ring (one commit group per chunk, empty past the range, so that the wait count stays fixed). The first
  // ones start before Q is read.
  const int lo = keys.lo, hi = keys.hi;
  const int chunks = hi > lo ? (hi - lo + kChunkKeys - 1) / kChunkKeys : 0;
  constexpr int kSlots = kStages<S, D>;
  using L = Slot<S, D>;
  std::uint8_t* ring = smem + warp * kSlots * L::kBytes;
  ChunkCopier<S, D> copier(p, c, lane, lo + warp * kChunkKeys);
  int issue_slot = 0;  // the slot of the warp's next copy: its chunks go round the ring in order
  auto issue = [&] {
    copier.copy_next(ring + issue_slot * L::kBytes, hi);
    cp_async_commit();
    issue_slot = issue_slot + 1 == kSlots ? 0 : issue_slot + 1;
  };
#pragma unroll
  for (int n = 0; n < kSlots - 1; ++n) issue();

  // Q^T as B fragments: column g is row g; k-step ks holds the dims of K's pairs 2 ks and 2 ks + 1 (the lane's
  // quarter of a K row), each times K's scale and rounded to T (q . (k s) = (q s) . k, as the other kernels
  // fold it).
  std::uint32_t qb[D / 16][2];
  {
    const bool real = g < rows;
    const T* q = static_cast<const T*>(p.q) + (real ? p.lq.index(c.b, tables.head[g], tables.query[g]) : 0);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int base = values_of_bytes<S>(k_word_byte<S, D>(t, 0));
        const int d0 = base + pair_first<S>(2 * ks + h), d1 = base + pair_second<S>(2 * ks + h);
        float x0 = 0.0f, x1 = 0.0f;
        if (real) {
          x0 = to_float(q[d0]) * core::kv_scale_at(p.k_scale, p.k_quant, c.kvh, D, d0);
          x1 = to_float(q[d1]) * core::kv_scale_at(p.k_scale, p.k_quant, c.kvh, D, d1);
        }
        qb[ks][h] = pack_pair<T>(x0, x1);
      }
  }
  // This lane's two rows of S^T's columns: 2t and 2t + 1.
  int row_begin[2], row_end[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 2 * t + r;
    row_begin[r] = row < rows ? tables.begin[row] : 0;
    row_end[r] = row < rows ? tables.end[row] : 0;
  }

  float o[D / 16][4];  // O^T of m-tile mt: V pair mt's first dim (c0, c1) and second (c2, c3), rows 2t, 2t + 1
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
  float row_max[2] = {core::kNegInf, core::kNegInf};
  float row_sum[2] = {0.0f, 0.0f};  // this lane's share (keys g and g + 8 of each chunk), summed over g at the end
  const float scale = p.transform.scale, softcap = p.transform.softcap;

  auto compute = [&](const RawChunk<S, D>& raw, int key0) {
    // S^T = K Q^T: 16 keys x 8 rows.
    constexpr int kKPairs = kKBytes<S, D> / 4 * (std::is_same_v<S, Int4Tag> ? 4 : 2);
    std::uint32_t kp[2][kKPairs];
    words_to_pairs<T, S>(raw.k[0], kp[0]);
    words_to_pairs<T, S>(raw.k[1], kp[1]);
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const std::uint32_t a[4] = {kp[0][2 * ks], kp[1][2 * ks], kp[0][2 * ks + 1], kp[1][2 * ks + 1]};
      mma16816<T>(s, a, qb[ks][0], qb[ks][1]);
    }
    // s[0], s[1]: key g, rows 2t and 2t + 1; s[2], s[3]: key g + 8.
    if (softcap > 0.0f) {
      const float scale_over_cap = scale / softcap;
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = softcap * tanhf(s[e] * scale_over_cap);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] *= scale;
    }
    if (key0 < keys.all_begin || key0 + kChunkKeys > keys.all_end) {  // warp-uniform
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + g + 8 * (e / 2);
        const int r = e % 2;
        if (key < row_begin[r] || key >= row_end[r]) s[e] = core::kNegInf;
      }
    }
    float alpha[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = fmaxf(s[r], s[r + 2]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      const float new_max = fmaxf(row_max[r], m);
      alpha[r] = core::rescale_factor(row_max[r], new_max);
      row_max[r] = new_max;
      row_sum[r] *= alpha[r];
      shift[r] = core::usable_max(new_max) * kLog2e;
    }
    if (!__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        o[mt][0] *= alpha[0], o[mt][2] *= alpha[0];
        o[mt][1] *= alpha[1], o[mt][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = fast_exp2(fmaf(s[e], kLog2e, -shift[e % 2]));
    // P^T rounded to T: the 8 x 8 matrices [key][row] of keys 0-7 and 8-15, transposed into O^T's B fragment.
    float rounded[4];
    const std::uint32_t p_lo = Pack2<T>::pack(s[0], s[1], rounded[0], rounded[1]);
    const std::uint32_t p_hi = Pack2<T>::pack(s[2], s[3], rounded[2], rounded[3]);
    row_sum[0] += rounded[0] + rounded[2];
    row_sum[1] += rounded[1] + rounded[3];
    const std::uint32_t b0 = movmatrix_trans(p_lo), b1 = movmatrix_trans(p_hi);
    // O^T += V^T P^T. The A fragment of m-tile mt pairs two keys' values of one dimension: keys (2t, 2t + 1) and
    // (2t + 8, 2t + 9), dimensions 2 mt (row g) and 2 mt + 1 (row g + 8) of this lane's eighth. The words of two
    // keys are interleaved first (one byte permute per word: int8 bytes, int4 16-bit halves), so that widening
    // them gives such key pairs directly, in dimension order.
    constexpr int kVWords = kVBytes<S, D> / 4;
    static_assert(kVWords * (std::is_same_v<S, Int4Tag> ? 8 : 4) == D / 8, "a lane's eighth of a V row");
    std::uint32_t vp[2][D / 8];  // [key pair][dimension of the eighth]: (key 2t(+8), key 2t + 1(+9))
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {
      std::uint32_t mixed[2 * kVWords];
#pragma unroll
      for (int w = 0; w < kVWords; ++w) {
        const std::uint32_t a = raw.v[2 * kp][w], b = raw.v[2 * kp + 1][w];
        constexpr bool kInt4 = std::is_same_v<S, Int4Tag>;
        mixed[2 * w] = __byte_perm(a, b, kInt4 ? 0x5410 : 0x5140);      // int4: values 0-3, int8: values 0-1
        mixed[2 * w + 1] = __byte_perm(a, b, kInt4 ? 0x7632 : 0x7362);  // int4: values 4-7, int8: values 2-3
      }
      if constexpr (kBiasedV<T, S>) {
        int8_words_to_biased_halves(mixed, vp[kp]);
      } else if constexpr (std::is_same_v<S, Int4Tag>) {
#pragma unroll
        for (int i = 0; i < 2 * kVWords; ++i) {  // int4x8_to_pairs_k_k4's pairs (k, k + 4) are (key a, key b) here
          std::uint32_t out[4];
          int4x8_to_pairs_k_k4<T>(mixed[i], out);
#pragma unroll
          for (int k = 0; k < 4; ++k) vp[kp][4 * i + k] = out[k];
        }
      } else {
        words_to_pairs<T, S>(mixed, vp[kp]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      const std::uint32_t a[4] = {vp[0][2 * mt], vp[0][2 * mt + 1], vp[1][2 * mt], vp[1][2 * mt + 1]};
      mma16816<T>(o[mt], a, b0, b1);
    }
  };

  int read_slot = 0;
  for (int n = 0; warp + n * kWarps < chunks; ++n) {
    cp_async_wait<kSlots - 2>();  // this lane's copies of chunk n have landed
    __syncwarp();                 // and every lane's; every lane is also done reading the slot before
    issue();                      // chunk n + kSlots - 1, into that slot
    RawChunk<S, D> raw;
    read_chunk<S, D>(raw, ring + read_slot * L::kBytes, g, t);
    read_slot = read_slot + 1 == kSlots ? 0 : read_slot + 1;
    compute(raw, lo + (warp + n * kWarps) * kChunkKeys);
  }
  cp_async_wait_all();
  __syncthreads();  // every warp is done with its ring: the merge area below overlaps them

  // Each warp's state into shared memory, then the 4 merged in warp order per (row, column).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 4);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 8);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 16);
  }
  if constexpr (kBiasedV<T, S>) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      o[mt][0] -= kVBias * row_sum[0], o[mt][2] -= kVBias * row_sum[0];
      o[mt][1] -= kVBias * row_sum[1], o[mt][3] -= kVBias * row_sum[1];
    }
  }
  constexpr int kStride = D + 2;
  float* merge = reinterpret_cast<float*>(smem);
  float* mine = merge + warp * kRows * kStride;
  const int base = g * (D / 8);
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    const int first = base + 2 * mt, second = base + 2 * mt + 1;
    mine[(2 * t) * kStride + first] = o[mt][0];
    mine[(2 * t + 1) * kStride + first] = o[mt][1];
    mine[(2 * t) * kStride + second] = o[mt][2];
    mine[(2 * t + 1) * kStride + second] = o[mt][3];
  }
  if (g == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mine[(2 * t + r) * kStride + D] = row_max[r];
      mine[(2 * t + r) * kStride + D + 1] = row_sum[r];
    }
  }
  __syncthreads();
  for (int e = tid; e < rows * D; e += kThreads) {
    const int r = e / D, d = e % D;
    float max = core::kNegInf, sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* state = merge + (w * kRows + r) * kStride;
      const core::MergeWeights mw = core::merge_weights(max, state[D]);
      sum = sum * mw.wa + state[D + 1] * mw.wb;
      acc = acc * mw.wa + state[d] * mw.wb;
      max = mw.max;
    }
    acc *= core::kv_scale_at(p.v_scale, p.v_quant, c.kvh, D, d);
    const bool poisoned = isnan(sum);  // a NaN or +inf score
    if (p.partial != nullptr) {
      float* part = p.partial + (block * kRows + r) * (3 + D);
      if (d == 0) {
        part[0] = max;
        part[1] = sum;
        part[2] = poisoned ? 1.0f : 0.0f;
      }
      part[3 + d] = acc;
      continue;
    }
    const core::RowFinish fin = core::finish_row({max, sum, poisoned}, p.has_sink,
                                                 p.has_sink ? p.sinks[tables.head[r]] : 0.0f, p.masked_rows);
    T* out = static_cast<T*>(p.o) + p.lo.index(c.b, tables.head[r], tables.query[r]);
    out[d] = from_float<T>(finished_value(fin, acc));
    if (p.return_lse && d == 0) p.lse[p.llse.index(c.b, tables.head[r], tables.query[r])] = fin.lse;
  }
}

template <class T, int D, class S>
struct Instance {
  static constexpr auto kernel = attention_decode_mma_kernel<T, D, S>;
};

// Dynamic shared memory: the warps' rings, or the merge area that reuses them when it is larger.
template <class T, int D, class S>
constexpr std::size_t smem_bytes_of(Instance<T, D, S>) {
  constexpr std::size_t rings = static_cast<std::size_t>(kWarps * kStages<S, D> * Slot<S, D>::kBytes);
  constexpr std::size_t states = static_cast<std::size_t>(kWarps * kRows * (D + 2)) * sizeof(float);
  return rings > states ? rings : states;
}

// Calls f(Instance<T, D, S>{}) for (dtype, head dim, storage); only the supported combinations are built.
template <class T, class F>
void with_dim(std::int64_t head_dim, KvType type, F&& f) {
  const bool int4 = type == KvType::Int4;
  if (head_dim == 64) return int4 ? f(Instance<T, 64, Int4Tag>{}) : f(Instance<T, 64, std::int8_t>{});
  return int4 ? f(Instance<T, 128, Int4Tag>{}) : f(Instance<T, 128, std::int8_t>{});
}
template <class F>
void with_instance(DType dtype, std::int64_t head_dim, KvType type, F&& f) {
  if (dtype == DType::bf16) return with_dim<__nv_bfloat16>(head_dim, type, f);
  with_dim<__half>(head_dim, type, f);
}

}  // namespace

bool decode_mma_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type,
                         bool has_mask) {
  return (dtype == DType::f16 || dtype == DType::bf16) && head_dim == v_head_dim &&
         (head_dim == 64 || head_dim == 128) && k_type == v_type && k_type != KvType::Float && !has_mask;
}

std::size_t decode_mma_smem_bytes(std::int64_t head_dim, KvType type) {
  std::size_t bytes = 0;
  with_dim<__half>(head_dim, type, [&](auto instance) { bytes = smem_bytes_of(instance); });
  return bytes;
}

void launch_decode_mma(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream) {
  with_instance(dtype, p.head_dim, p.k_type, [&](auto instance) {
    using I = decltype(instance);
    allow_max_dynamic_smem<I::kernel>();  // the rings may pass the default 48 KB
    launch_kernel(I::kernel, dim3(static_cast<unsigned>(blocks)), kThreads, decode_mma_smem_bytes(p.head_dim, p.k_type),
                  stream, false, p);
  });
}

int decode_mma_resident_blocks(DType dtype, std::int64_t head_dim, KvType type) {
  int blocks = 1;
  with_instance(dtype, head_dim, type, [&](auto instance) {
    using I = decltype(instance);
    static const int resident = resident_blocks_per_sm<I::kernel>(kThreads, decode_mma_smem_bytes(head_dim, type));
    blocks = resident;
  });
  return blocks;
}

}  // namespace attnkit::cuda
