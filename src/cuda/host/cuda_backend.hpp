// The CUDA backend's host interface. Compiled by the host compiler too (no CUDA types here), so the
// dispatcher in attention.cpp can call it; without CUDA in the build, available() is false.
#pragma once

#include <attnkit/kv_append.hpp>
#include <attnkit/attention.hpp>

#include "cuda/common/query_rotary.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace attnkit::cuda {

// True when the backend is built and a CUDA device is present.
bool available();
// True when `p` is memory a CUDA kernel can read (device or managed memory).
bool is_device_pointer(const void* p);

// Which kernel runs a problem, its grid and its key split. Chosen from the shape and the device's SM count.
struct CudaPlan {
  enum class Kernel : std::uint8_t { Simt, TensorCore, Decode, Warpgroup, Tf32, DecodeMma };
  Kernel kernel = Kernel::Simt;
  int head_dim_tile = 0;        // TensorCore: the padded head dim the kernel is built for
  std::int64_t group = 1;       // query heads per K/V head
  std::int64_t group_rows = 0;  // rows of one K/V head: group * q_len
  std::int64_t row_block = 64;  // rows per thread block
  std::int64_t row_blocks = 0;  // per K/V head
  std::int64_t splits = 1;      // key ranges (1: no merge pass)
  std::int64_t split_keys = 0;  // keys per range, a multiple of the key tile
  std::int64_t blocks = 0;      // thread blocks of the main kernel
  int sm_count = 0;
  std::size_t smem_bytes = 0;
  std::size_t partial_bytes = 0;  // split-K partial states
  std::size_t scratch_bytes = 0;  // partials + the key-length check flag
  // The tile kernel's plain build (no mask, rule, softcap, sink or split compiled in; runs_plain in
  // kernel_params.cuh), for short key ranges where a block's prologue and finish weigh.
  bool plain = false;
  // A split tail (the wgmma kernel's plain build): a grid of one-block-per-SM row blocks just past whole waves
  // would end on a last wave of a few SMs; instead the row blocks from tail_block on each run as tail_pieces
  // blocks over key ranges of tail_piece_keys, which fill the SMs as the whole blocks end, and a merge pass
  // folds their partials. tail_pieces 0: none. A decode step's key split on the plain build is a tail from row
  // block 0 (splits 1 then: key_ranges() and range_keys() say the split either way).
  std::int64_t tail_block = 0, tail_pieces = 0, tail_piece_keys = 0;
  // The key ranges every row block runs in, and their keys: the key split's, or a tail's that starts at row block 0.
  bool split_as_tail() const { return tail_pieces > 1 && tail_block == 0; }
  std::int64_t key_ranges() const { return split_as_tail() ? tail_pieces : splits; }
  std::int64_t range_keys() const { return split_as_tail() ? tail_piece_keys : split_keys; }
  // A decode split as a tail: the key split (ranges, and keys per range) that the general build runs where the
  // run finds the plain build cannot take the call (the GQA op's launch under its pre-pass). A step with device
  // key lengths has its own, longer ranges there (the split without kLengthRounds).
  std::int64_t fallback_splits = 0, fallback_split_keys = 0;
  // The split's ranges merged inside thread-block clusters of `splits` blocks (the mma.sync kernel on sm_90;
  // cluster_merge.cuh) instead of by the merge pass. The scratch still holds the partials: a run whose
  // pointers send it to the SIMT kernel takes the merge pass.
  bool cluster_merge = false;
  // The wgmma kernel at head dim 64 as three 64-row blocks per SM (instead of two), 128-key tiles one at a time:
  // for problems whose rows see their key ranges alone (no mask or softcap) with the scale in the exponent
  // (sees_keys_by_rule_only: a causal rule, a window and key lengths included).
  bool three_per_sm = false;
  // The wgmma kernel's K/V tiles by the producer warpgroup's 16-byte copies instead of TMA: rows that are not
  // whole 32-byte sectors (kv_rows_want_copies).
  bool kv_copies = false;
  // The wgmma kernel's build whose MMAs cover only the problem's columns of its bucket (warpgroup_widths in
  // config/tile_table.hpp: head dims 80, 96, 160 and MLA's (192, 128)).
  bool narrow = false;
  // What the plan was made with (a test's or benchmark's forced choices), for the run's own choices (programmatic
  // launches, the causal block order, the GQA op's rotary of Q) and its fallback plan.
  PlanOverrides overrides;
  std::string simt_reason;  // why no tensor-core kernel takes the problem (describe() of a SIMT plan)
  // Its plain build's grid where there are more blocks than places (the SMs times the blocks each holds, this):
  // a persistent grid of that many blocks, each running every persistent_places-th unit of work, so that a
  // unit's Q and first K/V tiles load under the end of the block's previous one. 0: one block per unit.
  std::int64_t persistent_places = 0;
};

CudaPlan plan(const AttentionProblem& problem, const PlanOverrides& overrides = {});
std::string describe(const CudaPlan& plan);
// Runs on args.stream, with no host synchronisation. Checks key lengths on the device first (one small kernel) when
// the problem has them: a length outside [0, k_len] hides every key of its batch entry, and the first such entry
// goes to args.status (AttentionArgs::status; else the scratch's flag).
// check_key_lengths = false skips that check: for callers that made the lengths themselves (the GQA op).
// rotary (the GQA op): Q is rotated as the kernel loads it; only where rotates_query says the run takes the wgmma
// kernel (anything else throws RuntimeError before launching).
// overlap_previous: the wgmma and decode-mma kernels may start while the stream's previous kernel runs, and wait
// for it before reading Q, K or V (that kernel must not write the key lengths, causal offsets or rotary first
// positions: the GQA op's pre-pass).
void run(const AttentionProblem& problem, const AttentionArgs& args, const CudaPlan& plan, void* scratch,
         bool check_key_lengths = true, const QueryRotary* rotary = nullptr, bool overlap_previous = false);
// Whether run() with these args takes the wgmma kernel, the one that applies a QueryRotary, and that kernel can
// apply this one (query_rotary_loads_chunks).
bool rotates_query(const AttentionProblem& problem, const AttentionArgs& args, const CudaPlan& plan,
                   const QueryRotary& rotary);

// The GQA op's output_qk for one core call (its problem and device args), on args.stream: see gqa/output_qk.hpp
// (the same float64 arithmetic); first_column is a device array.
void write_output_qk(const AttentionProblem& problem, const AttentionArgs& args, bool after_softmax,
                     const std::int32_t* first_column, std::int64_t columns, void* out);

// Device memory helpers for the op's own scratch (kept by Attention when the caller gives none).
// append_kv's copy (kernels/kv_append.cu): the problem normalised and checked, the values read on the device.
void append_kv(const KvAppendProblem& problem, const KvAppendArgs& args);

void* device_alloc(std::size_t bytes);
void device_free(void* p);
// For tools (the CLI): a blocking host -> device copy, and waiting for the device.
void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes);
void synchronize();

}  // namespace attnkit::cuda
