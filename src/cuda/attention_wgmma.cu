// The Hopper tensor-core attention kernel (sm_90a: wgmma) for float16 / bfloat16, head dims 64 and 128, K and
// V of the query's type, rows starting on 16 bytes. Other GPUs and shapes run attention_mma.cu.
//
// A block owns 128 rows ((head, query) pairs of one K/V head) as two warpgroups of 64 rows and walks its key
// range in tiles of 128 keys, double-buffered in shared memory by cp.async. Q, K and V are stored in wgmma's
// 128-byte-swizzle layout ([D / 64][rows][64] elements, the 16-byte chunks of a row XOR-ed with row % 8), so
// S = Q Kᵀ reads both operands straight from shared memory through descriptors (no ldmatrix, no register
// copies of Q or K), and O += P V takes P from registers (S's accumulator layout is the A-operand layout,
// fragment_softmax.cuh) and V from shared memory as an N-major operand. The scores, the online softmax and
// the finish are fragment_softmax.cuh's, the same code as the mma.sync kernel: float32 accumulation, the
// normaliser sums the rounded P, no atomics, bit-identical runs.
#include "fragment_softmax.cuh"
#include "kernel_launchers.hpp"
#include "wgmma.cuh"

namespace attnkit::cuda {
namespace {

constexpr int kRows = static_cast<int>(kWarpgroupRows);  // 2 warpgroups x 64
constexpr int kTileKeys = 128;
constexpr int kThreads = 256;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk `chunk` of row `row` in a [D / 64][rows][64] tile of a 2-byte type with the
// 128-byte swizzle (every 64-column block is rows x 128 bytes; 8 rows make one 1024-byte pattern).
__device__ __forceinline__ int swizzled_chunk(int rows, int row, int chunk) {
  return ((chunk / 8) * rows + row) * 128 + (((chunk % 8) ^ (row % 8)) * 16);
}
#endif

template <int D>
constexpr std::size_t tile_bytes(int rows) {
  return static_cast<std::size_t>(rows) * D * 2;
}
// Q, two K and two V tiles, the row tables, and 1024 bytes to align the tiles on the swizzle pattern.
template <int D>
constexpr std::size_t smem_bytes_for() {
  return 1024 + tile_bytes<D>(kRows) + 4 * tile_bytes<D>(kTileKeys) + (4 * kRows + 2) * sizeof(int);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) attention_wgmma_kernel(const KernelParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* const base = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  constexpr int kTileBytes = static_cast<int>(tile_bytes<D>(kTileKeys));
  std::uint8_t* const qs = base;                               // [D / 64][kRows][64]
  std::uint8_t* const ks = qs + tile_bytes<D>(kRows);          // [2][D / 64][kTileKeys][64]
  std::uint8_t* const vs = ks + 2 * kTileBytes;                // [2][D / 64][kTileKeys][64]
  int* const tables_mem = reinterpret_cast<int*>(vs + 2 * kTileBytes);
  const RowTables tables{tables_mem, tables_mem + kRows, tables_mem + 2 * kRows, tables_mem + 3 * kRows,
                         tables_mem + 4 * kRows};

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int warpgroup = warp / 4;
  const std::int64_t block = p.first_block + blockIdx.x;
  const BlockCoord c = block_coord(p, block);
  const std::int64_t first_row = c.row_block * kRows;
  const int rows = static_cast<int>(min64(kRows, p.group_rows - first_row));
  const BlockKeys keys = setup_rows<kRows>(p, c, first_row, rows, key_length_of(p, c.b), tables);
  const int lo = keys.lo, hi = keys.hi;

  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const T* q = static_cast<const T*>(p.q);
  for (int e = tid; e < kRows * kChunks; e += kThreads) {  // Q rows (zeros for padded rows)
    const int r = e / kChunks, ch = e % kChunks;
    cp_async16(qs + swizzled_chunk(kRows, r, ch), q + p.lq.index(c.b, tables.head[r], tables.query[r]) + ch * 8,
               r < rows);
  }
  // Each thread copies one fixed 16-byte chunk column of every (kThreads / kChunks)-th key row.
  const T* k_head = static_cast<const T*>(p.k) + p.lk.offset + c.b * p.lk.batch_stride + c.kvh * p.lk.head_stride +
                    (tid % kChunks) * 8;
  const T* v_head = static_cast<const T*>(p.v) + p.lv.offset + c.b * p.lv.batch_stride + c.kvh * p.lv.head_stride +
                    (tid % kChunks) * 8;
  auto load_kv = [&](int buffer, std::int64_t k0, int n) {
#pragma unroll
    for (int j = tid / kChunks; j < kTileKeys; j += kThreads / kChunks) {
      const bool valid = j < n;
      const std::int64_t key = valid ? k0 + j : k0;
      const int at = buffer * kTileBytes + swizzled_chunk(kTileKeys, j, tid % kChunks);
      cp_async16(ks + at, k_head + key * p.lk.row_stride, valid);
      cp_async16(vs + at, v_head + key * p.lv.row_stride, valid);
    }
  };

  // Per thread: rows r0 = 16 warp + lane / 4 and r0 + 8 (warpgroup g has rows [64 g, 64 g + 64)).
  const int r0 = warp * 16 + lane / 4;
  float o[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  float row_max[2] = {core::kNegInf, core::kNegInf};
  float row_sum[2] = {0.0f, 0.0f};

  const std::int64_t first_tile = lo < hi ? lo / kTileKeys * kTileKeys : hi;
  if (first_tile < hi) {
    const std::int64_t k0 = max64(first_tile, lo);
    load_kv(0, k0, static_cast<int>(min64(first_tile + kTileKeys, hi) - k0));
  }
  cp_async_commit();
  cp_async_wait_all();
  sm90::fence_proxy_async();
  __syncthreads();

  // A warpgroup whose 64 rows are all padding only helps copy tiles (wgmma needs all 4 of its warps).
  const bool active = warpgroup * 64 < rows;
  const std::uint32_t q_addr = sm90::smem_u32(qs) + warpgroup * 64 * 128;
  int buffer = 0;
  for (std::int64_t t0 = first_tile; t0 < hi; t0 += kTileKeys) {
    const std::int64_t k0 = max64(t0, lo);
    const int n = static_cast<int>(min64(t0 + kTileKeys, hi) - k0);
    if (t0 + kTileKeys < hi) {  // prefetch the next tile into the other buffer
      const std::int64_t nk0 = t0 + kTileKeys;
      load_kv(buffer ^ 1, nk0, static_cast<int>(min64(nk0 + kTileKeys, hi) - nk0));
    }
    cp_async_commit();
    if (active) {
      const std::uint32_t k_addr = sm90::smem_u32(ks + buffer * kTileBytes);
      const std::uint32_t v_addr = sm90::smem_u32(vs + buffer * kTileBytes);
      // S = Q Kᵀ: 64 rows x 128 keys, D / 16 k-steps; a k-step is 32 bytes into a 128-byte row of a 64-column
      // block, 8-row groups 1024 bytes apart.
      float s[kTileKeys / 8][4];
#pragma unroll
      for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const std::uint32_t at = (kk % 4) * 32;
        sm90::Wgmma<T, kTileKeys>::ss(s, sm90::swizzle128_desc(q_addr + (kk / 4) * kRows * 128 + at, 16, 1024),
                                      sm90::swizzle128_desc(k_addr + (kk / 4) * kTileKeys * 128 + at, 16, 1024),
                                      kk > 0);
      }
      sm90::commit();
      sm90::wait<0>();
      sm90::pin(s);

      const bool full = n == kTileKeys && !p.has_mask && keys.all_begin <= k0 && keys.all_end >= k0 + kTileKeys;
      transform_scores<kTileKeys>(s, p, c, tables, r0, rows, k0, n, full);
      softmax_step<kTileKeys, D>(s, o, row_max, row_sum);

      // O += P V: P's 16-key steps from registers; V's 16 keys are 2 swizzle patterns (2048 bytes) on, its
      // 64-column blocks a whole tile block (kTileKeys x 128 bytes) apart.
      std::uint32_t a[kTileKeys / 16][4];
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) pack_probabilities<T, kTileKeys>(s, kk, a[kk], tile_sum);
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) {
        sm90::Wgmma<T, D>::rs(o, a[kk], sm90::swizzle128_desc(v_addr + kk * 2048, kTileKeys * 128, 1024));
      }
      sm90::commit();
      add_tile_sums(tile_sum, row_sum);
      sm90::wait<0>();
      sm90::pin(o);
      sm90::pin(a);
    }
    cp_async_wait_all();
    sm90::fence_proxy_async();
    __syncthreads();
    buffer ^= 1;
  }
  finish_rows<T, D, kRows>(p, c, tables, block, r0, rows, o, row_max, row_sum, [](int) { return 1.0f; });
#else
  (void)p;
  __trap();  // built for another GPU: the host never launches it there (warpgroup_supported)
#endif
}

template <class T, int D>
void launch_typed(const KernelParams& p, std::int64_t blocks, cudaStream_t stream) {
  allow_max_dynamic_smem<attention_wgmma_kernel<T, D>>();
  attention_wgmma_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, smem_bytes_for<D>(), stream>>>(p);
}

}  // namespace

bool warpgroup_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type) {
  return (dtype == DType::f16 || dtype == DType::bf16) && head_dim == v_head_dim &&
         (head_dim == 64 || head_dim == 128) && k_type == KvType::Float && v_type == KvType::Float;
}

std::size_t warpgroup_smem_bytes(std::int64_t head_dim) {
  return head_dim == 64 ? smem_bytes_for<64>() : smem_bytes_for<128>();
}

void launch_warpgroup(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream) {
  if (dtype == DType::f16) {
    if (p.head_dim == 64) launch_typed<__half, 64>(p, blocks, stream);
    else launch_typed<__half, 128>(p, blocks, stream);
  } else {
    if (p.head_dim == 64) launch_typed<__nv_bfloat16, 64>(p, blocks, stream);
    else launch_typed<__nv_bfloat16, 128>(p, blocks, stream);
  }
}

}  // namespace attnkit::cuda
