// The float32 tensor-core kernel (sm_80+: mma.sync m16n8k8 TF32) at float32 accuracy, head dims and V dims up to
// 128, built for the buckets of the tile table (kTf32BucketDims: Q/K and V at the wider dim's bucket; columns past
// the real dims are zero in the tiles and never stored). Rows off 16 bytes, or dims off a multiple of 4, load
// element by element. The SIMT kernel (attention_simt.cu) runs float32 above 128.
//
// TF32 keeps 10 of float32's 23 mantissa bits, so every product is taken as three TF32 products of split
// operands: x = hi + lo with hi = tf32(x) and lo = tf32(x - hi), a b = hi_a hi_b + hi_a lo_b + lo_a hi_b (the
// dropped lo_a lo_b is about 2^-22 of the product), accumulated in float32 by the tensor cores, smallest terms
// first. Both matrix products are split this way: S = Q Kᵀ and O += P V (P in float32, never rounded).
//
// Layout as the mma.sync kernel: a block owns 64 rows ((query, head) pairs of one K/V head) as 4 warps of 16,
// and walks its key range in tiles of 32 keys, double-buffered by cp.async. Shared rows are padded to D + 4
// floats, so the fragment loads (8 rows x 4 columns, or 4 keys x 8 columns) fall in 32 different banks. The
// scores and the online softmax are fragment_softmax.cuh's (the m16n8k8 accumulator has the m16n8k16 layout);
// P moves from the accumulator layout into the A-operand layout by quad shuffles. Each tile's P V is summed in
// fresh registers and then added to the running output after its rescale (blockwise sums, for float32
// accuracy at long key ranges, as in the SIMT kernel). No atomics: runs are bit-identical.
//
// A non-finite K, V or Q value splits into hi = ±inf and lo = NaN: its products come out NaN where float32
// gives ±inf (a row with such a visible score is NaN either way; an infinite V value seen with p > 0 gives NaN
// here, ±inf there).
#include "cuda/config/tile_table.hpp"
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/host/kernel_launchers.hpp"

namespace attnkit::cuda {
namespace {

constexpr int kRows = kTf32Rows;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileKeys = kTf32TileKeys;

template <int D>
constexpr int pitch() {
  return tf32_pitch(D);  // floats per shared row: 4 banks on per row, conflict-free fragment loads
}
template <int D>
constexpr std::size_t smem_bytes_for() {
  return tf32_smem_bytes_for({D, D});
}

// Four floats (one 16-byte chunk of a row) into shared memory: a cp.async copy where the row's chunks are
// aligned (`by_elements` false), else four loads; zeros past `valid` columns (all four where valid <= 0).
__device__ __forceinline__ void copy_chunk4(float* dst, const float* src, int valid, bool by_elements) {
  if (!by_elements) {
    cp_async16(dst, src, valid > 0);
    return;
  }
  float4 x{0.0f, 0.0f, 0.0f, 0.0f};
  if (valid > 0) x.x = src[0];
  if (valid > 1) x.y = src[1];
  if (valid > 2) x.z = src[2];
  if (valid > 3) x.w = src[3];
  *reinterpret_cast<float4*>(dst) = x;
}

struct Split {
  std::uint32_t hi, lo;
};
__device__ __forceinline__ Split split_tf32(float x) {
  std::uint32_t hi, lo;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  const float rest = x - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(rest));
  return {hi, lo};
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An A fragment (4 float32 values) split once, for the several B fragments it multiplies.
struct SplitA {
  std::uint32_t hi[4], lo[4];
};
__device__ __forceinline__ SplitA split_a(const float (&a)[4]) {
  SplitA r;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const Split s = split_tf32(a[i]);
    r.hi[i] = s.hi;
    r.lo[i] = s.lo;
  }
  return r;
}

// c += a b for a split A fragment and float32 b (2 B-fragment values), as three TF32 products.
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const SplitA& a, float b0, float b1) {
  const Split s0 = split_tf32(b0), s1 = split_tf32(b1);
  mma_tf32(c, a.lo, s0.hi, s1.hi);
  mma_tf32(c, a.hi, s0.lo, s1.lo);
  mma_tf32(c, a.hi, s0.hi, s1.hi);
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) attention_tf32_kernel(const KernelParams p) {
  constexpr int kPitch = pitch<D>();
  constexpr int kChunks = D / 4;  // 16-byte chunks per row
  extern __shared__ float4 smem_raw[];
  float* qs = reinterpret_cast<float*>(smem_raw);  // [kRows][kPitch]
  float* ks = qs + kRows * kPitch;                 // [2][kTileKeys][kPitch]
  float* vs = ks + 2 * kTileKeys * kPitch;         // [2][kTileKeys][kPitch]
  __shared__ int row_head[kRows], row_query[kRows], row_begin[kRows], row_end[kRows], lo_hi[kBlockKeyInts];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = block_coord(p, block);
  const std::int64_t first_row = c.row_block * kRows;
  const int rows = static_cast<int>(min64(kRows, p.group_rows - first_row));
  const RowTables tables{row_head, row_query, row_begin, row_end, lo_hi};
  const BlockKeys keys = setup_rows<kRows>(p, c, first_row, rows, entry_rows(p, c.b), tables);
  allow_dependent_grids();  // the split-K merge pass may launch (it waits for this grid before reading)
  const int lo = keys.lo, hi = keys.hi;

  const float* q = static_cast<const float*>(p.q);
  const int qk_dim = p.bucketed ? static_cast<int>(p.head_dim) : D;
  const int v_dim = p.bucketed ? static_cast<int>(p.v_head_dim) : D;
  const bool by_elements = p.element_loads;
  for (int e = tid; e < kRows * kChunks; e += kThreads) {  // Q rows (zeros for padded rows, past the head dim)
    const int r = e / kChunks, col = e % kChunks * 4;
    copy_chunk4(qs + r * kPitch + col, q + p.lq.index(c.b, row_head[r], row_query[r]) + col,
                r < rows ? qk_dim - col : 0, by_elements);
  }
  // Each thread copies one fixed 16-byte chunk column of every (kThreads / kChunks)-th key row; rows past the
  // tile's n and columns past the dims are zeros (0 x p = 0: nothing of the buffer reaches the sums).
  const int col = (tid % kChunks) * 4;
  const float* k_head = static_cast<const float*>(p.k) + p.lk.index(c.b, c.kvh, 0) + col;
  const float* v_head = static_cast<const float*>(p.v) + p.lv.index(c.b, c.kvh, 0) + col;
  // (where kChunks does not divide the block, the last threads copy nothing: no two write one chunk)
  const bool copies = tid < kThreads / kChunks * kChunks;
  auto load_kv = [&](int buffer, std::int64_t k0, int n) {
    if (!copies) return;
#pragma unroll
    for (int j = tid / kChunks; j < kTileKeys; j += kThreads / kChunks) {
      const bool valid = j < n;
      const std::int64_t key = valid ? k0 + j : k0;
      const int at = (buffer * kTileKeys + j) * kPitch + col;
      copy_chunk4(ks + at, k_head + key * p.lk.row_stride, valid ? qk_dim - col : 0, by_elements);
      copy_chunk4(vs + at, v_head + key * p.lv.row_stride, valid ? v_dim - col : 0, by_elements);
    }
  };

  // Per thread: rows r0 = 16 warp + g and r0 + 8 (g = lane / 4), accumulator columns 8 j + 2 t + {0, 1}
  // (t = lane % 4).
  const int g = lane / 4, t = lane % 4;
  const int r0 = warp * 16 + g;
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float row_max[2] = {core::kNegInf, core::kNegInf};
  float row_sum[2] = {0.0f, 0.0f};

  const std::int64_t first_tile = lo < hi ? lo / kTileKeys * kTileKeys : hi;
  int buffer = 0;
  if (first_tile < hi) {
    const std::int64_t k0 = max64(first_tile, lo);
    load_kv(0, k0, static_cast<int>(min64(first_tile + kTileKeys, hi) - k0));
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  for (std::int64_t t0 = first_tile; t0 < hi; t0 += kTileKeys) {
    const std::int64_t k0 = max64(t0, lo);
    const int n = static_cast<int>(min64(t0 + kTileKeys, hi) - k0);
    if (t0 + kTileKeys < hi) {  // prefetch the next tile into the other buffer
      const std::int64_t nk0 = t0 + kTileKeys;
      load_kv(buffer ^ 1, nk0, static_cast<int>(min64(nk0 + kTileKeys, hi) - nk0));
    }
    cp_async_commit();
    const float* kt = ks + buffer * kTileKeys * kPitch;
    const float* vt = vs + buffer * kTileKeys * kPitch;
    if (warp * 16 < rows) {  // a warp whose 16 rows are all padding only helps copy tiles
      // S = Q Kᵀ: 16 rows x 32 keys per warp, k-steps of 8 head columns.
      float s[kTileKeys / 8][4];
#pragma unroll
      for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D; kk += 8) {
        const SplitA a = split_a({qs[r0 * kPitch + kk + t], qs[(r0 + 8) * kPitch + kk + t],
                                  qs[r0 * kPitch + kk + t + 4], qs[(r0 + 8) * kPitch + kk + t + 4]});
#pragma unroll
        for (int j = 0; j < kTileKeys / 8; ++j) {
          const float* key = kt + (j * 8 + g) * kPitch + kk + t;
          mma_3xtf32(s[j], a, key[0], key[4]);
        }
      }
      const bool full = n == kTileKeys && !p.has_mask && keys.all_begin <= k0 && keys.all_end >= k0 + kTileKeys;
      const float score_scale = transform_scores<kTileKeys>(s, p, c, tables, r0, rows, k0, n, full);
      float alpha[2];
      softmax_exponentials<kTileKeys>(s, row_max, row_sum, alpha, score_scale);
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kTileKeys / 8; ++j) {
        tile_sum[0] += s[j][0] + s[j][1];
        tile_sum[1] += s[j][2] + s[j][3];
      }
      add_tile_sums(tile_sum, row_sum);

      // This tile's P V in fresh registers. P's A fragment for keys [8 j, 8 j + 8): (g, t), (g + 8, t),
      // (g, t + 4), (g + 8, t + 4); lane (g, t') of the accumulator holds columns 2 t' and 2 t' + 1.
      float pv[D / 8][4];
#pragma unroll
      for (int i = 0; i < D / 8; ++i) pv[i][0] = pv[i][1] = pv[i][2] = pv[i][3] = 0.0f;
      const int near = (lane & ~3) | (t >> 1), far = near + 2;
      const bool odd = t & 1;
#pragma unroll
      for (int j = 0; j < kTileKeys / 8; ++j) {
        float a[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float n0 = __shfl_sync(0xffffffffu, s[j][2 * half], near);
          const float n1 = __shfl_sync(0xffffffffu, s[j][2 * half + 1], near);
          const float f0 = __shfl_sync(0xffffffffu, s[j][2 * half], far);
          const float f1 = __shfl_sync(0xffffffffu, s[j][2 * half + 1], far);
          a[half] = odd ? n1 : n0;      // column t of row g (+ 8)
          a[2 + half] = odd ? f1 : f0;  // column t + 4
        }
        const SplitA pa = split_a(a);
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          const float* value = vt + (j * 8 + t) * kPitch + i * 8 + g;
          mma_3xtf32(pv[i], pa, value[0], value[4 * kPitch]);
        }
      }
      rescale_accumulator<D>(o, alpha);
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][e] += pv[i][e];
    }
    cp_async_wait_all();
    __syncthreads();
    buffer ^= 1;
  }

  finish_rows<float, D, kRows, false, true>(p, c, tables, block, r0, rows, o, row_max, row_sum,
                                            [](int) { return 1.0f; });
}

template <int D>
void launch_bucket(const KernelParams& p, unsigned grid, cudaStream_t stream) {
  allow_max_dynamic_smem<attention_tf32_kernel<D>>();
  attention_tf32_kernel<D><<<grid, kThreads, smem_bytes_for<D>(), stream>>>(p);
}

}  // namespace

bool tf32_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type) {
  return dtype == DType::f32 && tf32_bucket(head_dim, v_head_dim).valid() && k_type == KvType::Float &&
         v_type == KvType::Float;
}

std::size_t tf32_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim) {
  return tf32_smem_bytes_for(tf32_bucket(head_dim, v_head_dim));
}

void launch_tf32(const KernelParams& p, std::int64_t blocks, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(blocks);
  static_assert(sizeof(kTf32BucketDims) / sizeof(int) == 4, "a branch below per built bucket");
  switch (tf32_bucket(p.head_dim, p.v_head_dim).qk) {
    case 32: return launch_bucket<32>(p, grid, stream);
    case 64: return launch_bucket<64>(p, grid, stream);
    case 96: return launch_bucket<96>(p, grid, stream);
    default: return launch_bucket<128>(p, grid, stream);
  }
}

}  // namespace attnkit::cuda
