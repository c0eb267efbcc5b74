// The tensor-core attention kernel for float16 / bfloat16 (sm_80+: mma.sync m16n8k16, ldmatrix, cp.async), every
// head dim 1-256 and V dim 1-256, built for the head-dim buckets of the tile table (config/tile_table.hpp): the
// real dims come at run time, columns past them are zero in the tiles and never stored.
//
// A block owns 64 rows ((query, head) pairs of one K/V head) as 4 warps of 16 rows, and walks its key range in tiles
// of mma_tile_keys keys. K and V tiles are double-buffered in shared memory (cp.async of 16-byte chunks, XOR-
// swizzled or in padded rows so that ldmatrix reads are conflict-free; element loads where rows do not start on 16
// bytes or a dim is not a multiple of 8); Q stays in shared memory and is re-read by ldmatrix. S = Q Kᵀ lives in
// registers (16 x keys per warp), the online softmax runs on those registers (a row is spread over the 4 lanes of a
// quad: two xor-shuffles), P is rounded to the element type in registers and fed straight back as the A operand of
// O += P V. The normaliser sums the rounded P, so numerator and denominator agree. Accumulation is float32
// throughout. No atomics: every sum has a fixed order, runs are bit-identical.
#include "cuda/common/block_phases.cuh"
#include "cuda/common/cluster_merge.cuh"
#include "cuda/config/tile_table.hpp"
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/host/kernel_launchers.hpp"
#include "cuda/common/stored_pairs.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace attnkit::cuda {
namespace {

constexpr int kRows = kMmaRows;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads == kMmaThreads, "the tile table's block");

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Element offset of (row, col) in a shared tile W elements wide (smem_pitch). A power-of-two number of 16-byte
// chunks per row is XOR-swizzled by row, so that the 8 rows one ldmatrix reads at one column fall in 8 different
// bank groups (4 at width 32, whose rows have only 4 chunks: two rows share a group, a 2-way conflict); other
// widths sit in rows padded to an odd number of chunks, which does the same.
template <int W>
__device__ __forceinline__ int tile_at(int row, int col) {
  constexpr int kChunks = W / 8;
  if constexpr (is_power_of_two(kChunks)) {
    constexpr int kMask = (kChunks < 8 ? kChunks : 8) - 1;
    return row * W + ((((col >> 3) ^ (row & kMask))) << 3) + (col & 7);
  } else {
    return row * smem_pitch(W) + col;
  }
}

// Eight elements (one 16-byte chunk of a tile) from `src`, one load each: those at columns >= `valid` are zero.
// For rows that do not start on 16 bytes or dims that are not a multiple of 8 (the chunk copies need both).
__device__ __forceinline__ uint4 load_chunk_by_elements(const void* src, int valid) {
  const auto* from = static_cast<const std::uint16_t*>(src);
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t first = 2 * i < valid ? from[2 * i] : 0u;
    const std::uint32_t second = 2 * i + 1 < valid ? from[2 * i + 1] : 0u;
    w[i] = first | second << 16;
  }
  return uint4{w[0], w[1], w[2], w[3]};
}

// Rows [0, kTileRows) of a W-wide tile from rows [0, n) of a tensor (row j at row_at(j): one stride apart, or
// a page lookup each), the columns below `dim`; zeros elsewhere. By cp.async chunks (rows on 16 bytes, dim a
// multiple of 8) or, with `by_elements`, by element loads and 16-byte shared stores. Called by the whole block.
template <class T, int W, int kTileRows, class RowAt>
__device__ __forceinline__ void copy_tile(T* tile, int n, int dim, bool by_elements, RowAt row_at) {
  constexpr int kChunks = W / 8;
  const int tid = threadIdx.x;
  if (by_elements) {
    for (int e = tid; e < kTileRows * kChunks; e += kThreads) {
      const int j = e / kChunks, col = e % kChunks * 8;
      const int valid = j < n ? dim - col : 0;
      *reinterpret_cast<uint4*>(tile + tile_at<W>(j, col)) =
          valid > 0 ? load_chunk_by_elements(row_at(j) + col, valid) : uint4{0u, 0u, 0u, 0u};
    }
    return;
  }
  if constexpr (kThreads % kChunks == 0) {  // (each thread one fixed chunk column)
    const int col = tid % kChunks * 8;
    const bool column_real = col < dim;
#pragma unroll
    for (int j = tid / kChunks; j < kTileRows; j += kThreads / kChunks) {
      const bool valid = j < n && column_real;
      cp_async16(tile + tile_at<W>(j, col), row_at(valid ? j : 0) + col, valid);
    }
  } else {
#pragma unroll
    for (int e = tid; e < kTileRows * kChunks; e += kThreads) {
      const int j = e / kChunks, col = e % kChunks * 8;
      const bool valid = j < n && col < dim;
      cp_async16(tile + tile_at<W>(j, col), row_at(valid ? j : 0) + col, valid);
    }
  }
}

// Shared memory of one block (mma_smem_bytes_for): Q, double-buffered K and V tiles (the element type), the rows'
// state and, for a quantized cache, the K/V scales of the block's head and double-buffered raw tiles as stored.
// A quantized cache double-buffers the raw tiles (the copies in flight) and converts each into one K and one V
// element-type tile just before it is used, so that two blocks still fit an SM.
template <class T, class S>
__host__ __device__ constexpr int element_tile_buffers() {
  return std::is_same_v<S, T> ? 2 : 1;
}
template <class T, class S>
__host__ __device__ constexpr std::size_t smem_bytes_for(HeadDimBucket b) {
  return mma_smem_bytes_for(b, sizeof(T), element_tile_buffers<T, S>(),
                            std::is_same_v<S, T> ? 0 : stored_row_bytes<T, S>(b.qk));
}

// Blocks per SM asked of ptxas: 3 at head dim 32 on sm_90 (its 128-key tiles would take 248 registers, 2
// blocks), 2 in the sm_80 build (whose general build spilled 8 bytes at 3, 168 registers); none elsewhere (0 =
// unspecified: an explicit 1 let ptxas take 188 registers at head dim 64 instead of 161, 2 blocks per SM
// instead of 3).
template <int DQK, int DV>
constexpr int mma_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return DQK == 32 && DV == 32 ? 2 : 0;
#else
  return DQK == 32 && DV == 32 ? 3 : 0;
#endif
}

// kPlain: the build for runs_plain problems (kernel_params.cuh), with no row tables, rule, mask, softcap, sink
// or split compiled in (attention_wgmma.cu says why). DQK, DV: the bucket (p.head_dim <= DQK, p.v_head_dim <=
// DV). S: the K/V storage (T, or int8 / int4 at DQK == DV == the real dims).
template <class T, int DQK, int DV, class S, bool kPlain>
__global__ void __launch_bounds__(kThreads, (mma_min_blocks<DQK, DV>())) attention_mma_kernel(const KernelParams p) {
  constexpr HeadDimBucket kBucket{DQK, DV};
  constexpr int kTileKeys = mma_tile_keys(kBucket);
  constexpr bool kQuantized = !std::is_same_v<S, T>;
  static_assert(!kQuantized || DQK == DV, "quantized caches at equal dims");
  constexpr int kRawRow = stored_row_bytes<T, S>(DQK);  // bytes of a stored row
  constexpr int kQkPitch = smem_pitch(DQK), kVPitch = smem_pitch(DV);
  ATTNKIT_PHASES_BEGIN()  // block_phases.cuh: marks 1-6 below, printed by thread 0
  extern __shared__ float4 smem_raw[];
  constexpr int kBuffers = element_tile_buffers<T, S>();
  T* qs = reinterpret_cast<T*>(smem_raw);   // [kRows][kQkPitch]
  T* ks = qs + kRows * kQkPitch;             // [kBuffers][kTileKeys][kQkPitch]
  T* vs = ks + kBuffers * kTileKeys * kQkPitch;  // [kBuffers][kTileKeys][kVPitch]
  auto* row_head = reinterpret_cast<int*>(vs + kBuffers * kTileKeys * kVPitch);
  int* row_query = row_head + kRows;
  int* row_begin = row_query + kRows;
  int* row_end = row_begin + kRows;
  float* k_scales = reinterpret_cast<float*>(row_end + kRows);  // quantized: [DQK], [DV]
  float* v_scales = k_scales + DQK;
  auto* raw_k = reinterpret_cast<std::byte*>(v_scales + DV);    // quantized: [2][kTileKeys][kRawRow]
  std::byte* raw_v = raw_k + 2 * kTileKeys * kRawRow;
  __shared__ int lo_hi[kBlockKeyInts];

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = kPlain ? plain_block_coord(p, block) : block_coord(p, block);
  ATTNKIT_PHASE(1)
  const std::int64_t first_row = c.row_block * kRows;
  // (Plain problems are dense: the entry is every batch entry's shape.)
  const core::SequenceRows entry = kPlain ? core::SequenceRows{} : entry_rows(p, c.b);
  const int rows = kPlain ? static_cast<int>(min64(kRows, p.group_rows - first_row))
                          : block_rows(p, entry, first_row, kRows);
  const T* q = static_cast<const T*>(p.q);
  const int qk_dim = p.bucketed ? static_cast<int>(p.head_dim) : DQK;
  const int v_dim = p.bucketed ? static_cast<int>(p.v_head_dim) : DV;
  // (Plain problems never load by elements: the plan keeps their rows on 16 bytes.)
  const bool by_elements = !kPlain && p.element_loads;

  const RowTables tables{row_head, row_query, row_begin, row_end, lo_hi};
  if (p.wait_first) wait_for_prior_grids();  // (launched to overlap an unknown kernel, which may write any input)
  // Plain: every row sees the block's whole key range (all keys, or its range of a split merged in clusters) and
  // Q's rows come from row_of, so no table and no barrier.
  const BlockKeys keys = kPlain ? BlockKeys{static_cast<int>(c.key_begin), static_cast<int>(c.key_end),
                                            static_cast<int>(c.key_begin), static_cast<int>(c.key_end)}
                                : setup_rows<kRows>(p, c, first_row, rows, entry, tables);
  allow_dependent_grids();  // the split-K merge pass may launch (it waits for this grid before reading)
  ATTNKIT_PHASE(2)
  const int lo = keys.lo, hi = keys.hi;

  // Q rows into shared memory (zeros for padded rows and for columns past the head dim).
  constexpr int kQkChunks = DQK / 8;  // 16-byte chunks per row
  for (int e = tid; e < kRows * kQkChunks; e += kThreads) {
    const int r = e / kQkChunks, col = e % kQkChunks * 8;
    RowOf row{0, 0};
    if (!kPlain) {
      row = RowOf{row_head[r], row_query[r]};
    } else if (r < rows) {
      row = row_of(p, c.kvh, first_row + r);
    }
    const T* src = q + (kPlain ? p.lq.index(c.b, row.head, row.query)
                               : query_row_index(p, p.lq, c.b, row.head, row.query)) + col;
    const bool valid = r < rows && col < qk_dim;
    if (by_elements) {
      *reinterpret_cast<uint4*>(qs + tile_at<DQK>(r, col)) =
          valid ? load_chunk_by_elements(src, qk_dim - col) : uint4{0u, 0u, 0u, 0u};
    } else {
      cp_async16(qs + tile_at<DQK>(r, col), src, valid);
    }
  }
  // K and V tiles: the element-type tiles by copy_tile, or (a quantized cache) each thread copies one fixed
  // 16-byte chunk column of every (kThreads / kCopyChunks)-th raw stored row (converted by convert_kv below).
  constexpr int kCopyChunks = kRawRow / 16;
  const std::int64_t value_bytes_num = std::is_same_v<S, Int4Tag> ? 1 : static_cast<std::int64_t>(sizeof(S));
  const std::int64_t value_bytes_den = std::is_same_v<S, Int4Tag> ? 2 : 1;
  auto bytes_of = [&](std::int64_t values) { return values * value_bytes_num / value_bytes_den; };
  // Dense and ragged keys: one base and one row stride per head; paged keys: a page lookup per row (the plain
  // build is never paged).
  const bool paged = !kPlain && pages_keys(p);
  // Pages that hold whole key tiles (page size a multiple of the tile; tiles start on multiples of it): one
  // block-table lookup per tile, then the rows one stride apart as in a dense cache. Built for sm_90 at tiles of
  // up to 64 keys: the 128-key tiles of head dim 32 (three blocks per SM) and the sm_80 build at head dims 64 and
  // 256 spilled with it; their pages take the per-row lookups.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kTilesInPagesBuilt = false;
#else
  constexpr bool kTilesInPagesBuilt = kTileKeys <= 64;
#endif
  const bool tiles_in_pages = kTilesInPagesBuilt && paged && p.seq.page_size % kTileKeys == 0;
  const std::byte* k_head = static_cast<const std::byte*>(p.k) +
                            bytes_of(kPlain ? p.lk.index(c.b, c.kvh, 0) : key_row_base(p, p.lk, entry, c.b, c.kvh));
  const std::byte* v_head = static_cast<const std::byte*>(p.v) +
                            bytes_of(kPlain ? p.lv.index(c.b, c.kvh, 0) : key_row_base(p, p.lv, entry, c.b, c.kvh));
  const std::int64_t k_row_bytes = bytes_of(p.lk.row_stride);
  const std::int64_t v_row_bytes = bytes_of(p.lv.row_stride);
  auto load_kv = [&](int buffer, std::int64_t k0, int n) {
    if constexpr (kQuantized) {
#pragma unroll
      for (int j = tid / kCopyChunks; j < kTileKeys; j += kThreads / kCopyChunks) {
        const bool valid = j < n;
        const std::int64_t key = valid ? k0 + j : k0;
        const int chunk = (tid % kCopyChunks) * 16;
        const int at = (buffer * kTileKeys + j) * kRawRow + chunk;
        const auto* k_values = static_cast<const std::byte*>(p.k);
        const auto* v_values = static_cast<const std::byte*>(p.v);
        const std::byte* k_src =
            paged ? k_values + bytes_of(paged_key_index(p, p.lk, c.b, c.kvh, key)) : k_head + key * k_row_bytes;
        const std::byte* v_src =
            paged ? v_values + bytes_of(paged_key_index(p, p.lv, c.b, c.kvh, key)) : v_head + key * v_row_bytes;
        cp_async16(raw_k + at, k_src + chunk, valid);
        cp_async16(raw_v + at, v_src + chunk, valid);
      }
    } else if (paged && !tiles_in_pages) {
      const T* k_tensor = static_cast<const T*>(p.k);
      const T* v_tensor = static_cast<const T*>(p.v);
      copy_tile<T, DQK, kTileKeys>(ks + buffer * kTileKeys * kQkPitch, n, qk_dim, by_elements,
                                   [&](int j) { return k_tensor + paged_key_index(p, p.lk, c.b, c.kvh, k0 + j); });
      copy_tile<T, DV, kTileKeys>(vs + buffer * kTileKeys * kVPitch, n, v_dim, by_elements,
                                  [&](int j) { return v_tensor + paged_key_index(p, p.lv, c.b, c.kvh, k0 + j); });
    } else {  // rows one stride apart: dense and ragged keys, or a tile inside one page
      const T* k_first = reinterpret_cast<const T*>(k_head) + k0 * p.lk.row_stride;
      const T* v_first = reinterpret_cast<const T*>(v_head) + k0 * p.lv.row_stride;
      if (tiles_in_pages) {
        const std::int64_t tile_start = k0 / kTileKeys * kTileKeys;
        const PageRow at = page_row_of(p, static_cast<int>(tile_start));
        const std::int64_t page = p.seq.block_table[c.b * p.seq.max_pages_per_seq + at.column];
        const std::int64_t row0 = at.row + (k0 - tile_start);
        k_first = static_cast<const T*>(p.k) + page_row_index(p.lk, page, c.kvh, row0);
        v_first = static_cast<const T*>(p.v) + page_row_index(p.lv, page, c.kvh, row0);
      }
      const std::int64_t k_stride = p.lk.row_stride, v_stride = p.lv.row_stride;
      copy_tile<T, DQK, kTileKeys>(ks + buffer * kTileKeys * kQkPitch, n, qk_dim, by_elements,
                                   [=](int j) { return k_first + j * k_stride; });
      copy_tile<T, DV, kTileKeys>(vs + buffer * kTileKeys * kVPitch, n, v_dim, by_elements,
                                  [=](int j) { return v_first + j * v_stride; });
    }
  };
  // A quantized cache: the raw rows of `buffer` become element-type tiles of the stored integers, exactly (rows
  // past the tile's n are zero). The scales act outside the tiles: K's are folded into Q once per block
  // (q . (k * s) = (q * s) . k), V's scale the output columns at the end (sum p (v * s) = s sum p v).
  auto convert_kv = [&](int buffer, int n) {
    if constexpr (kQuantized) {
      constexpr int kValuesPerChunk = std::is_same_v<S, Int4Tag> ? 32 : 16;
      constexpr int kRawChunks = kTileKeys * (kRawRow / 16);
      const auto convert = [&](const std::byte* raw, T* tile) {
        for (int i = tid; i < kRawChunks; i += kThreads) {
          const int j = i / (kRawRow / 16);
          const int col = (i % (kRawRow / 16)) * kValuesPerChunk;
          const uint4 w = *reinterpret_cast<const uint4*>(raw + i * 16);
          const bool valid = j < n;
          const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int g = 0; g < kValuesPerChunk / 8; ++g) {  // 8 values -> one 16-byte chunk of the tile
            std::uint32_t h[4];
            stored_chunk_pairs<T, S>(words, g, h);
            const uint4 out = valid ? uint4{h[0], h[1], h[2], h[3]} : uint4{0u, 0u, 0u, 0u};
            *reinterpret_cast<uint4*>(tile + tile_at<DQK>(j, col + g * 8)) = out;
          }
        }
      };
      convert(raw_k + buffer * kTileKeys * kRawRow, ks);
      convert(raw_v + buffer * kTileKeys * kRawRow, vs);
    }
  };
  if constexpr (kQuantized) {
    for (int d = tid; d < DQK; d += kThreads) {
      k_scales[d] = core::kv_scale_at(p.k_scale, p.k_quant, c.kvh, DQK, d);
      v_scales[d] = core::kv_scale_at(p.v_scale, p.v_quant, c.kvh, DV, d);
    }
  }

  // Per thread: rows r0 = 16 warp + lane / 4 and r0 + 8; accumulator columns 8 t + 2 (lane % 4) + {0, 1}.
  const int r0 = warp * 16 + lane / 4;
  float o[DV / 8][4];
#pragma unroll
  for (int t = 0; t < DV / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float row_max[2] = {core::kNegInf, core::kNegInf};
  float row_sum[2] = {0.0f, 0.0f};

  const std::int64_t first_tile = lo < hi ? lo / kTileKeys * kTileKeys : hi;
  int buffer = 0;
  if (first_tile < hi) {
    const std::int64_t k0 = max64(first_tile, lo);
    load_kv(0, k0, static_cast<int>(min64(first_tile + kTileKeys, hi) - k0));
  }
  cp_async_commit();  // Q and tile 0
  // Tile 1 goes in flight now too, so that its copy overlaps tile 0's rather than starting after it (a short
  // sequence is one or two tiles: the block's time is mostly such waits).
  if (first_tile + kTileKeys < hi) {
    const std::int64_t k1 = first_tile + kTileKeys;
    load_kv(1, k1, static_cast<int>(min64(k1 + kTileKeys, hi) - k1));
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  ATTNKIT_PHASE(3)
  if constexpr (kQuantized) {  // Q <- Q * K scales, in place (rounded to T, like any element of Q)
    for (int e = tid; e < kRows * DQK; e += kThreads) {
      T& x = qs[tile_at<DQK>(e / DQK, e % DQK)];
      x = from_float<T>(to_float(x) * k_scales[e % DQK]);
    }
    __syncthreads();
  }

  for (std::int64_t t0 = first_tile; t0 < hi; t0 += kTileKeys) {
    const std::int64_t k0 = max64(t0, lo);
    const int n = static_cast<int>(min64(t0 + kTileKeys, hi) - k0);
    if (t0 != first_tile && t0 + kTileKeys < hi) {  // prefetch the next tile (tile 1 is in flight already)
      const std::int64_t nk0 = t0 + kTileKeys;
      load_kv(buffer ^ 1, nk0, static_cast<int>(min64(nk0 + kTileKeys, hi) - nk0));
    }
    cp_async_commit();
    if constexpr (kQuantized) {
      convert_kv(buffer, n);
      __syncthreads();
    }
    const T* kt = ks + (kBuffers == 2 ? buffer : 0) * kTileKeys * kQkPitch;
    const T* vt = vs + (kBuffers == 2 ? buffer : 0) * kTileKeys * kVPitch;
    // A warp whose 16 rows are all padding (a decode step fills only the first rows) only helps copy tiles.
    if (warp * 16 < rows) {

    // S = Q Kᵀ for this warp's 16 rows and the tile's keys: n-tiles of 8 keys.
    float s[kTileKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DQK; kk += 16) {
      std::uint32_t a[4];
      ldmatrix_x4(a, qs + tile_at<DQK>(warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8, kk + (lane / 16) * 8));
#pragma unroll
      for (int j = 0; j < kTileKeys / 8; j += 2) {
        std::uint32_t b[4];
        ldmatrix_x4(b, kt + tile_at<DQK>(j * 8 + (lane % 8) + (lane / 16) * 8, kk + ((lane / 8) % 2) * 8));
        mma16816<T>(s[j], a, b[0], b[1]);
        mma16816<T>(s[j + 1], a, b[2], b[3]);
      }
    }

    float score_scale;  // (what the transform leaves to the exponent)
    if constexpr (kPlain) {
      score_scale = scale_plain_scores<kTileKeys>(s, p.transform.scale, n);
    } else {
      const bool full = n == kTileKeys && !p.has_mask && keys.all_begin <= k0 && keys.all_end >= k0 + kTileKeys;
      score_scale = transform_scores<kTileKeys, (kTileKeys > 64)>(s, p, c, tables, r0, rows, k0, n, full);
    }
    softmax_step<kTileKeys, DV>(s, o, row_max, row_sum, score_scale);

    // P (rounded to T) as the A operand; O += P V. The rows' sums of that P: at V dims up to 64, P 1 on the
    // tensor cores (fewer instructions per score, where scores are most of a block's work); above, in float32
    // adds (the extra accumulator made the head-dim-128 plain build spill).
    constexpr bool kSumsOnTensorCores = DV <= 64;
    float tile_sum[2] = {0.0f, 0.0f};               // (float32 adds)
    float mma_sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};    // (tensor cores)
#pragma unroll
    for (int kk = 0; kk < kTileKeys / 16; ++kk) {
      std::uint32_t a[4];
      if constexpr (kSumsOnTensorCores) {
        pack_probability_operand<T, kTileKeys>(s, kk, a);
        add_probability_sums<T>(mma_sum, a);
      } else {
        pack_probabilities<T, kTileKeys>(s, kk, a, tile_sum);
      }
#pragma unroll
      for (int t = 0; t < DV / 8; t += 2) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, vt + tile_at<DV>(kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, t * 8 + (lane / 16) * 8));
        mma16816<T>(o[t], a, b[0], b[1]);
        mma16816<T>(o[t + 1], a, b[2], b[3]);
      }
    }
    if constexpr (kSumsOnTensorCores) {
      row_sum[0] += mma_sum[0];
      row_sum[1] += mma_sum[2];
    } else {
      add_tile_sums(tile_sum, row_sum);
    }
    }
    cp_async_wait_all();
    __syncthreads();
    buffer ^= 1;
    if (t0 == first_tile) {
      ATTNKIT_PHASE(4)
    }
  }
  ATTNKIT_PHASE(5)

  auto v_scale_at = [&](int col) { return kQuantized ? v_scales[col] : 1.0f; };
  if constexpr (mma_cluster_merge_built(DV) && kClusterMergeBuilt) {
    if (p.cluster_merge) {
      // The partial rows go to this block's shared memory (Q and the tiles are free: the loop ended on a
      // barrier with no copy in flight), for the cluster's merge.
      float* staged = reinterpret_cast<float*>(smem_raw);
      static_assert(kRows * (3 + DV) * sizeof(float) <=
                        (kRows * kQkPitch + kBuffers * kTileKeys * (kQkPitch + kVPitch)) * sizeof(T),
                    "the partial rows fit in Q and the tiles");
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r0 + half * 8;
        if (r < rows) store_partial_row<DV>(staged + r * (3 + DV), half, o, row_max, row_sum, v_scale_at);
      }
      const auto row_at = [&](int r) {
        return kPlain ? row_of(p, c.kvh, first_row + r) : RowOf{tables.head[r], tables.query[r]};
      };
      merge_rows_in_cluster<T, DV, kThreads>(p, c, row_at, rows, staged);
      return;
    }
  }
  finish_rows<T, DV, kRows, kPlain, true>(p, c, tables, block, r0, rows, o, row_max, row_sum, v_scale_at);
  ATTNKIT_PHASE(6)
  ATTNKIT_PHASES_PRINT("mma", 0)
}

template <class T, int DQK, int DV, class S, bool kPlain = false>
struct Instance {
  static constexpr auto kernel = attention_mma_kernel<T, DQK, DV, S, kPlain>;
  static std::size_t smem() { return smem_bytes_for<T, S>({DQK, DV}); }
};

// Calls f(Instance<T, DQK, DV, S, plain>{}) for the kernel instance of (dtype, bucket, storage, plain): quantized
// caches are built for head dims 64 and 128 (mma_supports says so), the plain build for V buckets up to 128.
template <class T, int DQK, int DV, class F>
void with_storage(KvType type, bool plain, F&& f) {
  if constexpr (DQK == DV && (DQK == 64 || DQK == 128)) {
    if (type == KvType::Int8) return f(Instance<T, DQK, DV, std::int8_t>{});
    if (type == KvType::Int4) return f(Instance<T, DQK, DV, Int4Tag>{});
  }
  if constexpr (DQK <= 128 && DV <= 128) {
    if (plain) return f(Instance<T, DQK, DV, T, true>{});
  }
  f(Instance<T, DQK, DV, T>{});
}
// The bucket's instance: one branch per built pair of the tile table (a pair missing here fails the
// static_assert of built_buckets_dispatched below).
template <class T, class F>
void with_bucket(HeadDimBucket b, KvType type, bool plain, F&& f) {
  if (b == HeadDimBucket{32, 32}) return with_storage<T, 32, 32>(type, plain, f);
  if (b == HeadDimBucket{64, 64}) return with_storage<T, 64, 64>(type, plain, f);
  if (b == HeadDimBucket{80, 80}) return with_storage<T, 80, 80>(type, plain, f);
  if (b == HeadDimBucket{96, 96}) return with_storage<T, 96, 96>(type, plain, f);
  if (b == HeadDimBucket{128, 128}) return with_storage<T, 128, 128>(type, plain, f);
  if (b == HeadDimBucket{160, 160}) return with_storage<T, 160, 160>(type, plain, f);
  if (b == HeadDimBucket{192, 192}) return with_storage<T, 192, 192>(type, plain, f);
  if (b == HeadDimBucket{192, 128}) return with_storage<T, 192, 128>(type, plain, f);
  with_storage<T, 256, 256>(type, plain, f);
}
constexpr bool built_buckets_dispatched() {
  constexpr HeadDimBucket kDispatched[] = {{32, 32},   {64, 64},   {80, 80},   {96, 96},  {128, 128},
                                           {160, 160}, {192, 192}, {192, 128}, {256, 256}};
  int built = 0;
  for (int d : kMmaBucketDims) {
    bool found = false;
    for (HeadDimBucket b : kDispatched) found = found || b == HeadDimBucket{d, d};
    if (!found) return false;
    ++built;
  }
  for (HeadDimBucket u : kMmaUnequalBuckets) {
    bool found = false;
    for (HeadDimBucket b : kDispatched) found = found || b == u;
    if (!found) return false;
    ++built;
  }
  return built == static_cast<int>(sizeof(kDispatched) / sizeof(kDispatched[0]));
}
static_assert(built_buckets_dispatched(), "with_bucket dispatches exactly the tile table's mma.sync buckets");

template <class F>
void with_instance(DType dtype, HeadDimBucket b, KvType type, bool plain, F&& f) {
  if (dtype == DType::f16) with_bucket<__half>(b, type, plain, f);
  else with_bucket<__nv_bfloat16>(b, type, plain, f);
}

}  // namespace

bool mma_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type) {
  if (dtype != DType::f16 && dtype != DType::bf16) return false;
  if (k_type != v_type) return false;
  if (k_type != KvType::Float) return head_dim == v_head_dim && (head_dim == 64 || head_dim == 128);
  return mma_bucket(head_dim, v_head_dim).valid();
}

std::size_t mma_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim, KvType type) {
  const HeadDimBucket b = mma_bucket(head_dim, v_head_dim);
  switch (type) {
    case KvType::Int8: return smem_bytes_for<__half, std::int8_t>(b);
    case KvType::Int4: return smem_bytes_for<__half, Int4Tag>(b);
    case KvType::Float: break;
  }
  return smem_bytes_for<__half, __half>(b);
}

void launch_mma(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream, bool overlap) {
  const HeadDimBucket bucket = mma_bucket(p.head_dim, p.v_head_dim);
  with_instance(dtype, bucket, p.k_type, runs_plain(p), [&](auto instance) {
    using I = decltype(instance);
    allow_max_dynamic_smem<I::kernel>();
    if (p.cluster_merge) {
      allow_large_clusters<I::kernel>();
      launch_kernel_in_clusters(I::kernel, dim3(static_cast<unsigned>(blocks)), kThreads, I::smem(), stream, overlap,
                                static_cast<unsigned>(p.splits), p);
    } else {
      launch_kernel(I::kernel, dim3(static_cast<unsigned>(blocks)), kThreads, I::smem(), stream, overlap, p);
    }
  });
}

int mma_resident_blocks(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType type) {
  int blocks = 1;
  with_instance(dtype, mma_bucket(head_dim, v_head_dim), type, /*plain=*/false, [&](auto instance) {
    using I = decltype(instance);
    static const int resident = resident_blocks_per_sm<I::kernel>(kThreads, I::smem());
    blocks = resident;
  });
  return blocks;
}

}  // namespace attnkit::cuda
