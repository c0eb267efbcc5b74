// The split-K merge inside a thread-block cluster (sm_90): the blocks of one row block's key ranges run as one
// cluster, each leaves its partial rows in its own shared memory, and after a cluster barrier each block folds a
// share of the rows from every block's shared memory (distributed shared memory) and writes them finished. No
// partial goes through global memory and no merge kernel follows: for a decoder step (Whisper's 12 heads over
// 448 or 1500 keys) the merge pass was a second launch on a grid that runs a few microseconds.
//
// The fold is split_merge.cu's (kernel_params.cuh, warp_max: the largest max, then the weighted sums in range order)
// with the same operations: a clustered run gives the merge pass's bits (a test checks it), so a call cut into
// launches, or run without clusters, agrees.
#pragma once

#include "cuda/common/fragment_softmax.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

namespace attnkit::cuda {

// Whether this compilation pass has the cluster merge (device code for sm_90 on): the kernels compile the
// staging around it only then (the sm_80 build of the head-dim-32 kernel spilled with it).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kClusterMergeBuilt = true;
#else
inline constexpr bool kClusterMergeBuilt = false;
#endif

// Call with the whole block, which left its rows' partials at staged + r * (3 + D) for r < rows (store_partial_row),
// after its last use of that shared memory by other threads. Rows r with r % splits == rank are this block's to
// fold; a warp takes one row at a time, a lane columns lane + 32 i (those below p.v_head_dim are written: D may be
// a bucket wider than the real V dim). `v_scale` was applied when staging.
// row_at(r): the (head, query) of the block's row r (the row tables, or row_of in the plain build).
template <class T, int D, int kThreads, class RowAt>
__device__ __forceinline__ void merge_rows_in_cluster(const KernelParams& p, const BlockCoord& c, RowAt row_at,
                                                      int rows, float* staged) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  static_assert(D % 32 == 0, "a lane's columns: lane + 32 i");
  constexpr int kLaneColumns = D / 32;
  constexpr int kWarps = kThreads / 32;
  const cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's partials staged (release / acquire: visible across the cluster)
  const int splits = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());  // = c.split: a cluster is a row block's ranges in order
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int r = rank + splits * warp; r < rows; r += splits * kWarps) {
    // Lane k < splits: block k's state of the row.
    float part_max = core::kNegInf, part_sum = 0.0f;
    bool poison = false;
    if (lane < splits) {
      const float* part = cluster.map_shared_rank(staged, lane) + r * (3 + D);
      part_max = part[0];
      part_sum = part[1];
      poison = part[2] != 0.0f;
    }
    const float max = warp_max(part_max);
    const float part_weight = core::rescale_factor(part_max, max);
    poison = __any_sync(0xffffffffu, poison);
    float sum = 0.0f, acc[kLaneColumns];
#pragma unroll
    for (int i = 0; i < kLaneColumns; ++i) acc[i] = 0.0f;
    for (int k = 0; k < splits; ++k) {
      const float* part = cluster.map_shared_rank(staged, k) + r * (3 + D);
      float x[kLaneColumns];
#pragma unroll
      for (int i = 0; i < kLaneColumns; ++i) x[i] = part[3 + lane + 32 * i];
      const float w = __shfl_sync(0xffffffffu, part_weight, k);
      sum = add_weighted(sum, __shfl_sync(0xffffffffu, part_sum, k), w);
#pragma unroll
      for (int i = 0; i < kLaneColumns; ++i) acc[i] = add_weighted(acc[i], x[i], w);
    }
    const RowOf row = row_at(r);
    const int head = row.head, query = row.query;
    const core::RowFinish fin =
        core::finish_row({max, sum, poison}, p.has_sink, p.has_sink ? p.sinks[head] : 0.0f, p.masked_rows);
    T* out = static_cast<T*>(p.o) + query_row_index(p, p.lo, c.b, head, query);
#pragma unroll
    for (int i = 0; i < kLaneColumns; ++i) {
      if (!p.bucketed || lane + 32 * i < p.v_head_dim) out[lane + 32 * i] = from_float<T>(finished_value(fin, acc[i]));
    }
    if (p.return_lse && lane == 0) p.lse[query_row_index(p, p.llse, c.b, head, query)] = fin.lse;
  }
  cluster.sync();  // no block leaves (its shared memory) while another still reads it
#endif
}

}  // namespace attnkit::cuda
