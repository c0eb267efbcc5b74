// The fast CPU kernel: tiled online softmax with blockwise per-tile sums, SIMD (Highway, dispatched at run
// time), all cores.
//
// Orientation. Query rows run across SIMD lanes: a work item owns up to kRowBlock rows of one K/V head (the
// rows of every query head of the group, so grouped heads share each K/V tile), keeps Qᵀ [dim][row] packed, and
// reads K and V rows in place, broadcasting one element at a time. Every score, running max, running sum and
// output element is then a per-lane sequential sum in a fixed order: the bits do not depend on the SIMD width,
// the thread count or how the items are scheduled.
//
// Blockwise sums. Each key tile (kKeyTile keys, absolute tile boundaries) is summed into fresh accumulators
// (p·V in registers, Σp in a vector) that are then added to the running ones after one rescale, which keeps
// float32 within 1e-5 of float64 at 16k keys.
//
// Split-K. When a problem has too few row blocks to keep the cores busy, the keys are cut into equal ranges
// (a multiple of kKeyTile) chosen from the shape only; each range writes its partial (max, sum, accumulator)
// to scratch and a merge pass folds them in range order.
#pragma once

#include <attnkit/attention.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace attnkit::cpu {

inline constexpr std::int64_t kRowBlock = 64;  // query rows (SIMD lanes) per work item
inline constexpr std::int64_t kKeyTile = 64;   // keys per blockwise-summed tile
inline constexpr int kFewRows = 4;              // rows per K/V head of a wide few-rows item; the micro-kernels' rows
// Items of one K/V head with at most this many rows run the few-rows kernel, in halves of at most kFewRows rows per
// tile (the second half reads the tile's K/V rows from the caches): a decode step of 5-8 query heads per K/V head
// (Qwen2's 7, Llama-3-70B's 8) reads its cache once, where the tiled kernel's 16-row lanes were half empty.
inline constexpr int kMaxFewRows = 2 * kFewRows;
inline constexpr int kMaxKvHeadsPerItem = static_cast<int>(kRowBlock) / kFewRows;  // a wide few-rows item's most

struct TiledPlan {
  std::int64_t group = 1;       // query heads per K/V head
  std::int64_t group_rows = 0;  // rows of one K/V head: group * q_len
  std::int64_t row_blocks = 0;  // row blocks per K/V head
  std::int64_t splits = 1;      // key ranges per row block (1: no split, no merge pass)
  std::int64_t kv_heads_per_item = 1;  // > 1: few-rows items over that many K/V heads (interleaved heads' rows)
  std::int64_t split_keys = 0;  // keys per range, a multiple of kKeyTile
  std::int64_t base_items = 0;  // batch * kv_heads * row_blocks: the row blocks of the call
  std::int64_t items = 0;       // batch * ceil(kv_heads / kv_heads_per_item) * row_blocks * splits
  int threads = 1;
  std::int64_t item_chunk = 1;  // items a thread takes at once (a K/V head's row blocks, or 1)
  // bfloat16 or float16 with K/V of that type on a CPU with AMX-BF16: the items of more than kFewRows rows take
  // their two products on AMX tiles (amx_tiles.hpp): the scores exact products summed in float32 (a float16 input
  // as two bfloat16 terms), P V with P rounded to bfloat16 (bfloat16 problems) or as three terms that hold all of
  // its bits (float16, or "off=rounded-p").
  bool amx = false;
  bool f16_terms = false;  // (describe(): the problem is float16)
  int p_terms = 3;         // AMX: bfloat16 terms of P in P V (1: P rounded to bfloat16; 3: all of its 24 bits)
  // bfloat16 with bfloat16 K on a CPU with AVX-512 BF16 and no AMX: the items of more than kFewRows rows take
  // their scores on vdpbf16ps (bf16_dot.hpp) with K read in place; P V stays on the float32 products.
  bool bf16_dot = false;
  // Few-rows items ask the caches for each tile's V rows and the next tile's K rows while the tile's scores run
  // (few_rows_kernel.cpp), where the call's K/V does not fit the caches: the hardware prefetchers alone left a
  // streaming decode waiting on its loads.
  bool prefetch_v = false;
  bool prefetch_ahead = false;
  bool interleaved_scores = false;  // wide few-rows items: heads' scores in turns by group of keys (few_rows_kernel)
  // Tiled items reading float K/V in place over streaming K/V (prefetch_ahead, no widened copy, no AMX) ask for
  // the next tile's K and V rows as they load a tile (tiled_kernel.cpp, prefetch_next_tile).
  bool prefetch_tiles = false;
  // Tiled items whose thread's share of the call's Q, K, V and O does not fit its L2 ask for the rows of the next
  // tile they copy into the thread's widened K/V and, under their last tile, for the query rows (and a new head's
  // first K/V tile) of the item the thread most likely runs next (tiled_kernel.cpp, prefetch_next_item).
  bool prefetch_items = false;
  // > 0: each thread keeps one K/V head's widened (dequantized, copied) keys, or their AMX operands, for the row
  // blocks it runs of that head (Workspace::widened_k); the number of keys it has room for.
  std::int64_t widened_keys = 0;
  bool widened_k = false;  // which of K and V that float32 copy holds (the other is read in place)
  bool widened_v = false;
  std::size_t workspace_bytes = 0;  // per thread
  std::size_t partial_bytes = 0;    // per item, when split
  std::size_t scratch_bytes = 0;    // all of it: threads * workspace + items * partial
};

// Plans a normalised problem for `threads` worker threads (the split depends on the shape only); `overrides`
// may leave the AMX products out ("off=amx") or the vdpbf16ps scores ("off=bf16-dot").
TiledPlan plan_tiled(const AttentionProblem& problem, int threads, const PlanOverrides& overrides = {});
std::string describe(const TiledPlan& plan);

// Runs the planned problem. `scratch` holds plan.scratch_bytes, aligned to 64 bytes.
void run_tiled(const AttentionProblem& problem, const AttentionArgs& args, const TiledPlan& plan,
               std::byte* scratch);

// The SIMD target the dispatcher picks on this machine (e.g. "AVX3_ZEN4", "AVX2").
std::string simd_target_name();

}  // namespace attnkit::cpu
