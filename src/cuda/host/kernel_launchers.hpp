// Launchers of the CUDA kernels, for the backend's host code (cuda_backend.cu).
#pragma once

#include "cuda/common/kernel_params.cuh"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace attnkit::cuda {

// Lets `Kernel` use all the shared memory a block may opt into. Once per kernel (a driver call per launch costs
// host time, and this one is safe during CUDA-graph capture either way).
template <auto Kernel>
void allow_max_dynamic_smem() {
  static const bool done = [] {
    int device = 0, optin = 0;
    cudaFuncAttributes attr{};
    bool ok = cudaGetDevice(&device) == cudaSuccess &&
              cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
              cudaFuncGetAttributes(&attr, Kernel) == cudaSuccess;
    // Static shared memory counts against the opt-in limit too.
    ok = ok && cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    optin - static_cast<int>(attr.sharedSizeBytes)) == cudaSuccess;
    if (!ok) cudaGetLastError();  // leave no error behind: the launch reports its own if it cannot run
    return ok;
  }();
  (void)done;
}

// Lets `Kernel` run in clusters of up to 16 blocks (sm_90 parts schedule them; 8 is the portable size).
template <auto Kernel>
void allow_large_clusters() {
  static const bool done = [] {
    const bool ok = cudaFuncSetAttribute(Kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    if (!ok) cudaGetLastError();
    return ok;
  }();
  (void)done;
}

// Launches kernel<<<grid, threads, smem, stream>>>(args...); with `overlap`, as a programmatic dependent launch
// (it may start while the stream's previous kernel runs: the kernel must call wait_for_prior_grids() before it
// reads what that kernel writes); with cluster > 1, in thread-block clusters of that many blocks along x (sm_90;
// the grid a multiple of it; above 8, allow_large_clusters first). Errors are left for the caller's
// cudaGetLastError.
template <class... Params, class... Args>
void launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, int threads, std::size_t smem,
                               cudaStream_t stream, bool overlap, unsigned cluster, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned n = 0;
  if (overlap) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[n].id = cudaLaunchAttributeClusterDimension;
    attributes[n++].val.clusterDim = {cluster, 1, 1};
  }
  config.attrs = attributes;
  config.numAttrs = n;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, int threads, std::size_t smem, cudaStream_t stream,
                   bool overlap, Args&&... args) {
  launch_kernel_in_clusters(kernel, grid, threads, smem, stream, overlap, 1u, std::forward<Args>(args)...);
}

// The blocks of `Kernel` (threads, dynamic shared memory) one SM of this device holds at once; at least 1.
template <auto Kernel>
int resident_blocks_per_sm(int threads, std::size_t smem) {
  allow_max_dynamic_smem<Kernel>();
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    blocks = 1;
  }
  return blocks > 0 ? blocks : 1;
}

// attention_simt.cu: 64 rows per block, any dtype and head dim.
std::size_t simt_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim);
void launch_simt(const KernelParams& p, DType dtype, std::int64_t blocks, std::size_t smem, cudaStream_t stream);

// attention_mma.cu: tensor cores (mma.sync) for float16 / bfloat16, every head dim and V dim 1-256 (in the tile table's
// buckets, config/tile_table.hpp), any layout (rows off 16 bytes or dims off a multiple of 8: element loads,
// KernelParams::element_loads).
// K/V may be quantized (int8 / int4, both alike) at head dims 64 and 128 (= v_head_dim), rows on 16 bytes: tiles
// are dequantized in shared memory.
bool mma_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type);
std::size_t mma_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim, KvType type);
// overlap: a programmatic dependent launch (p.wait_first set).
void launch_mma(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream, bool overlap);
int mma_resident_blocks(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType type);  // per SM

// attention_tf32.cu: float32 on tensor cores (3 TF32 products per product, float32 accuracy), head dims and V dims
// up to 128 (the tile table's kTf32BucketDims), any layout (KernelParams::element_loads where rows are off 16
// bytes or a dim off a multiple of 4).
bool tf32_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type);
std::size_t tf32_smem_bytes(std::int64_t head_dim, std::int64_t v_head_dim);
void launch_tf32(const KernelParams& p, std::int64_t blocks, cudaStream_t stream);

// attention_wgmma.cu: Hopper (sm_90a) wgmma + TMA for float16 / bfloat16, head dim 64, 128 or 256 (= v_head_dim), K/V
// of the query's type or (head dims 64 and 128) int8 / int4, both alike; rows aligned to 16 bytes. 128 rows per
// block (head dim 64 or quantized: 64, warpgroup_rows). Launch only on a compute capability 9.0 device, with the
// TMA descriptors of K and V from warpgroup_maps (false: TMA cannot describe the layout).
inline constexpr std::int64_t kWarpgroupRows = 128;
inline constexpr std::int64_t kWarpgroupTileKeys = 128;  // keys per tile at head dims up to 128
// Keys per tile: 128, or 64 at head dim 256 (whose 64 x 256 float32 accumulator per warpgroup already takes 128
// registers per thread), in every build (three blocks per SM too).
constexpr int warpgroup_tile_keys(std::int64_t head_dim) { return head_dim > 128 ? 64 : 128; }  // (by bucket)
// Ragged and paged sequences on the wgmma kernel: float K/V; pages read by TMA in boxes of a page's rows (whole
// 8-row swizzle atoms), so a page holds 8 keys or a multiple and divides the tile or is a multiple of it.
constexpr bool warpgroup_takes_pages(std::int64_t page_size, std::int64_t bucket) {
  const std::int64_t tile = warpgroup_tile_keys(bucket);
  return page_size >= 8 && page_size % 8 == 0 && (tile % page_size == 0 || page_size % tile == 0);
}
struct WarpgroupMaps {
  CUtensorMap k, v;
  CUtensorMap q;   // the plain build's Q (dim, head, query, batch) in boxes of one block's rows, where q_by_tma
  int q_by_tma;  // (the launch copies it into KernelParams::q_by_tma, where the kernel reads it)
};
bool warpgroup_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type);
// (head_dim here: warpgroup_width(head_dim, v_head_dim), the dim whose bucket the kernel is built for)
std::size_t warpgroup_smem_bytes(std::int64_t head_dim, KvType type, bool three = false);
std::int64_t warpgroup_rows(std::int64_t head_dim, KvType type);
// Blocks per SM: 2 at head dim 64 from K/V of the query's type (64-row blocks of one consumer warpgroup; 3 in the
// build of three per SM, `three`), else 1.
int warpgroup_resident_blocks(DType dtype, std::int64_t head_dim, KvType type, bool three = false);
bool warpgroup_maps(const KernelParams& p, DType dtype, WarpgroupMaps& maps);  // (warpgroup_maps.cu)
// overlap: a programmatic dependent launch (the kernel waits for the stream's previous kernel before it reads
// Q, K or V, after its barriers and row tables are set up: that kernel must not write the key lengths, causal
// offsets or rotary first positions read before that).
void launch_warpgroup(const KernelParams& p, const WarpgroupMaps& maps, DType dtype, std::int64_t blocks,
                      cudaStream_t stream, bool overlap = false);

// attention_decode.cu: 4 rows per block, key ranges of at most kDecodeMaxKeys keys, K/V of the query's type or
// quantized (int8 / int4, same type for K and V), head dim a multiple of 16 (int4: 32) up to 256 (= v_head_dim),
// rows starting on 16 bytes (decode_value_alignment values).
inline constexpr std::int64_t kDecodeRows = 4;
inline constexpr std::int64_t kDecodeMaxKeys = 1024;
bool decode_supports(std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type);
std::int64_t decode_value_alignment(KvType type, DType dtype);
std::size_t decode_smem_bytes();
void launch_decode(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream);
int decode_resident_blocks(DType dtype, KvType type);  // blocks per SM

// attention_decode_mma.cu: a decode step over a quantized cache on mma.sync with the keys on the MMA's M side:
// 8 rows per block, float16 / bfloat16 queries, int8 / int4 K/V (the same for both), head dim 64 or 128
// (= v_head_dim), no additive mask; rows starting on 16 bytes.
inline constexpr std::int64_t kDecodeMmaRows = 8;
bool decode_mma_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type,
                         bool has_mask);
std::size_t decode_mma_smem_bytes(std::int64_t head_dim, KvType type);
// Launched in stream order (no programmatic overlap: measured slower, cuda_backend.cu).
void launch_decode_mma(const KernelParams& p, DType dtype, std::int64_t blocks, cudaStream_t stream);
int decode_mma_resident_blocks(DType dtype, std::int64_t head_dim, KvType type);  // blocks per SM

// gqa_output_qk.cu: the GQA op's output_qk, (batch, heads, q_len, columns) of the query's type; row (b, h, i)
// puts key j at column first_column[b] + j (device array), 0 where the row sees no key.
void launch_output_qk(const KernelParams& p, DType dtype, bool after_softmax, const std::int32_t* first_column,
                      std::int64_t columns, void* out, cudaStream_t stream);

// split_merge.cu: folds the split-K partials of each row in range order and writes O (and the LSE).
// overlap: a programmatic dependent launch after the attention kernel that wrote the partials (the merge waits
// for it before reading them).
// Merges the partials of p.splits ranges per row block, for the row blocks (whole-block indices) from first_base
// on (a split tail's; 0: every row block).
void launch_merge(const KernelParams& p, DType dtype, std::int64_t row_block, cudaStream_t stream, bool overlap,
                  std::int64_t first_base = 0);

// split_merge.cu: first key_lengths index outside [0, k_len] into *bad (-1 when all are in range).
void launch_check_key_lengths(const std::int32_t* key_lengths, std::int64_t batch, std::int64_t k_len, int* bad,
                              cudaStream_t stream);

// split_merge.cu: for ragged / paged sequences (p.has_sequences), each batch entry's out-of-range device arrays
// into faults[b] (kQueriesOutOfRange, kKeysOutOfRange) and the lowest such entry into *status, which the caller
// set to -1. Runs before any kernel that reads the sequences.
void launch_check_sequences(const KernelParams& p, std::int32_t* faults, int* status, cudaStream_t stream);

}  // namespace attnkit::cuda
