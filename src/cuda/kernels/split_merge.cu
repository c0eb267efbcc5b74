// The split-K merge pass: each key range left its partial (max, sum, poison, accumulator) per row; this folds
// them in range order with the core's merge rule and writes the finished rows. Also the device-side check of
// key lengths, which runs before anything is written.
#include "cuda/host/kernel_launchers.hpp"

namespace attnkit::cuda {
namespace {

constexpr int kMergeWarps = 4;
constexpr int kMergeThreads = kMergeWarps * 32;

constexpr int kMaxColumnsPerLane = 8;  // v_head_dim <= 256

// One warp per row: blockIdx.x is a (b, kvh, row block) without its split, blockIdx.y picks 4 of its rows. The
// fold (kernel_params.cuh, warp_max): the largest range max first, then each range's weight, then the weighted
// sums in range order. Lane j loads the state of split j of each group of 32 (its weight is shuffled to every
// lane when its turn comes) and the columns of up to 8 splits are loaded before any of them is folded.
// first_base: the row block (a whole-block index) of blockIdx.x 0, whose partials start the buffer (a split
// tail's merge: CudaPlan::tail_pieces ranges per row block, from its first split row block on).
// kColumns: the columns per lane (v_head_dim up to 32 kColumns); kSplitsInFlight: the partial rows loaded before
// any is folded. Both only size the unrolled work (the folds run in range order whatever they are): a split
// tail merges thousands of rows of two to four ranges, where a build for 256 columns and 8 ranges in flight
// issued 16 times the loads it needed (17 us for 7,680 rows of head dim 64 on the H200, Nsight Compute).
template <class T, int kColumns, int kSplitsInFlight>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const KernelParams p, std::int64_t row_block,
                                                              std::int64_t first_base) {
  static_assert(kColumns <= kMaxColumnsPerLane);
  wait_for_prior_grids();  // launched to overlap the attention kernel that writes the partials
  const std::int64_t base = blockIdx.x;
  const BlockCoord c = block_coord(p, (first_base + base) * p.splits);
  const std::int64_t first_row = c.row_block * row_block;
  // (the rows of the entry that exist: the attention kernel left partials for those only)
  const std::int64_t rows = p.has_sequences ? block_rows(p, entry_rows(p, c.b), first_row, static_cast<int>(row_block))
                                            : min64(row_block, p.group_rows - first_row);
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.y) * kMergeWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int Dv = static_cast<int>(p.v_head_dim);
  const std::int64_t stride = row_block * (3 + Dv);  // between one row's partials of consecutive splits
  const float* first_part = p.partial + (base * p.splits * row_block + r) * (3 + Dv);
  const int splits = static_cast<int>(p.splits);
  float max = core::kNegInf, sum = 0.0f;
  bool poison = false;
  for (int k = lane; k < splits; k += 32) {
    const float* part = first_part + k * stride;
    max = fmaxf(max, part[0]);
    poison |= part[2] != 0.0f;
  }
  max = warp_max(max);
  float acc[kColumns];
#pragma unroll
  for (int i = 0; i < kColumns; ++i) acc[i] = 0.0f;
  for (int group = 0; group < splits; group += 32) {
    const int in_group = min(32, splits - group);
    float part_weight = 0.0f, part_sum = 0.0f;
    if (lane < in_group) {
      const float* part = first_part + (group + lane) * stride;
      part_weight = core::rescale_factor(part[0], max);
      part_sum = part[1];
    }
    for (int k0 = 0; k0 < in_group; k0 += kSplitsInFlight) {
      float x[kSplitsInFlight][kColumns];
#pragma unroll
      for (int k = 0; k < kSplitsInFlight; ++k) {
        const float* part = first_part + (group + k0 + k) * stride + 3;
#pragma unroll
        for (int i = 0; i < kColumns; ++i) {
          const int d = lane + 32 * i;
          x[k][i] = k0 + k < in_group && d < Dv ? part[d] : 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kSplitsInFlight; ++k) {
        const float w = __shfl_sync(0xffffffffu, part_weight, (k0 + k) % 32);
        const float s = __shfl_sync(0xffffffffu, part_sum, (k0 + k) % 32);
        if (k0 + k >= in_group) continue;
        sum = add_weighted(sum, s, w);
#pragma unroll
        for (int i = 0; i < kColumns; ++i) acc[i] = add_weighted(acc[i], x[k][i], w);
      }
    }
  }
  poison = __any_sync(0xffffffffu, poison);
  const RowOf row = row_of(p, c.kvh, first_row + r);
  const std::int64_t h = row.head;
  const std::int64_t i = row.query;
  const core::RowFinish fin = core::finish_row({max, sum, poison}, p.has_sink, p.has_sink ? p.sinks[h] : 0.0f, p.masked_rows);
  T* out = static_cast<T*>(p.o) + query_row_index(p, p.lo, c.b, h, i);
#pragma unroll
  for (int k = 0; k < kColumns; ++k) {
    const int d = lane + 32 * k;
    if (d < Dv) out[d] = from_float<T>(finished_value(fin, acc[k]));
  }
  if (p.return_lse && lane == 0) p.lse[query_row_index(p, p.llse, c.b, h, i)] = fin.lse;
}

__global__ void check_key_lengths_kernel(const std::int32_t* key_lengths, std::int64_t batch, std::int64_t k_len, int* bad) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *bad = -1;
  __syncthreads();
  // One block: the lowest bad index wins (atomicMin on a flag, not on results).
  for (std::int64_t b = threadIdx.x; b < batch; b += blockDim.x) {
    const std::int32_t l = key_lengths[b];
    if (l < 0 || l > k_len) atomicMin(reinterpret_cast<unsigned*>(bad), static_cast<unsigned>(b));
  }
}

// One warp per batch entry: which of its device arrays are out of range (kernel_params.cuh, entry_faults), and
// the lowest such entry into `status` (set to -1 before this launch).
__global__ void check_sequences_kernel(const KernelParams p, std::int32_t* faults, int* status) {
  const std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= p.batch) return;
  const core::SequenceAccess& s = p.seq;
  const auto out_of_range = [](const std::int32_t* cu, std::int64_t b, std::int64_t longest, std::int64_t total) {
    const std::int64_t first = cu[b], last = cu[b + 1];
    return first < 0 || last < first || last > total || last - first > longest;
  };
  std::int32_t fault = 0;
  if (s.ragged_q && out_of_range(s.cu_seqlens_q, b, s.q_len, p.total_q)) fault |= kQueriesOutOfRange;
  std::int64_t keys = s.k_len;
  if (s.ragged_k) {
    if (out_of_range(s.cu_seqlens_k, b, s.k_len, p.total_k)) fault |= kKeysOutOfRange;
    keys = static_cast<std::int64_t>(s.cu_seqlens_k[b + 1]) - s.cu_seqlens_k[b];
  }
  if (s.key_lengths != nullptr) {
    keys = s.key_lengths[b];
    if (keys < 0 || keys > s.k_len) fault |= kKeysOutOfRange;
  }
  if (s.paged() && !(fault & kKeysOutOfRange)) {
    const std::int64_t pages = (keys + s.page_size - 1) / s.page_size;
    bool bad = false;
    for (std::int64_t i = lane; i < pages; i += 32) {
      const std::int32_t page = s.block_table[b * s.max_pages_per_seq + i];
      bad |= page < 0 || page >= p.num_pages;
    }
    if (__any_sync(0xffffffffu, bad)) fault |= kKeysOutOfRange;
  }
  if (lane != 0) return;
  faults[b] = fault;
  if (fault != 0) atomicMin(reinterpret_cast<unsigned*>(status), static_cast<unsigned>(b));
}

template <class T, int kColumns>
void launch_merge_columns(const KernelParams& p, dim3 blocks, std::int64_t row_block, cudaStream_t stream,
                          bool overlap, std::int64_t first_base) {
  if (p.splits <= 2) {
    launch_kernel(merge_kernel<T, kColumns, 2>, blocks, kMergeThreads, 0, stream, overlap, p, row_block, first_base);
  } else if (p.splits <= 4) {
    launch_kernel(merge_kernel<T, kColumns, 4>, blocks, kMergeThreads, 0, stream, overlap, p, row_block, first_base);
  } else {
    launch_kernel(merge_kernel<T, kColumns, 8>, blocks, kMergeThreads, 0, stream, overlap, p, row_block, first_base);
  }
}

template <class T>
void launch_merge_typed(const KernelParams& p, dim3 blocks, std::int64_t row_block, cudaStream_t stream,
                        bool overlap, std::int64_t first_base) {
  if (p.v_head_dim <= 32) return launch_merge_columns<T, 1>(p, blocks, row_block, stream, overlap, first_base);
  if (p.v_head_dim <= 64) return launch_merge_columns<T, 2>(p, blocks, row_block, stream, overlap, first_base);
  if (p.v_head_dim <= 128) return launch_merge_columns<T, 4>(p, blocks, row_block, stream, overlap, first_base);
  launch_merge_columns<T, kMaxColumnsPerLane>(p, blocks, row_block, stream, overlap, first_base);
}

}  // namespace

void launch_merge(const KernelParams& p, DType dtype, std::int64_t row_block, cudaStream_t stream, bool overlap,
                  std::int64_t first_base) {
  const dim3 blocks(static_cast<unsigned>(p.batch * p.kv_heads * p.row_blocks - first_base),
                    static_cast<unsigned>((row_block + kMergeWarps - 1) / kMergeWarps));
  switch (dtype) {
    case DType::f32: return launch_merge_typed<float>(p, blocks, row_block, stream, overlap, first_base);
    case DType::f16: return launch_merge_typed<__half>(p, blocks, row_block, stream, overlap, first_base);
    case DType::bf16: return launch_merge_typed<__nv_bfloat16>(p, blocks, row_block, stream, overlap, first_base);
  }
}

void launch_check_key_lengths(const std::int32_t* key_lengths, std::int64_t batch, std::int64_t k_len, int* bad,
                              cudaStream_t stream) {
  check_key_lengths_kernel<<<1, 256, 0, stream>>>(key_lengths, batch, k_len, bad);
}

void launch_check_sequences(const KernelParams& p, std::int32_t* faults, int* status, cudaStream_t stream) {
  constexpr int kWarpsPerBlock = 8;
  const auto blocks = static_cast<unsigned>((p.batch + kWarpsPerBlock - 1) / kWarpsPerBlock);
  check_sequences_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(p, faults, status);
}

}  // namespace attnkit::cuda
