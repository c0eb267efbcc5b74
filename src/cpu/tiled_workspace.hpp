// What one work item of the tiled CPU kernel works in, and the parts of it that need no SIMD (the driver in
// tiled_driver.cpp: planning, the thread loop, the split-K merge and the output write).
#pragma once

#include "../core/sequences.hpp"
#include "tiled_kernel.hpp"

#include <cstddef>
#include <cstdint>

namespace attnkit::cpu {

// Per-thread buffers, carved from scratch. Row-indexed arrays have kRowBlock entries (one per lane);
// [x][lane] arrays are stored x-major with kRowBlock floats per x, so a row of lanes is a run of vectors.
struct Workspace {
  float* qt;      // [head_dim][lane]: the item's queries, transposed
  float* qrows;   // [kRowBlock][head_dim]: a few-rows item's queries, row-major (kFewRows per K/V head of the item)
  float* st;      // [kKeyTile][lane]: scores, then probabilities, of the current tile ([row][kKeyTile]: few rows)
  float* ot;      // [v_head_dim][lane]: running unnormalised output
  float* orows;   // [kRowBlock][v_head_dim]: a few-rows item's running output, row-major (moved to ot at its end)
  float* max;     // [lane] running max
  float* sum;     // [lane] running sum of exp(s - max)
  float* poison;  // [lane] nonzero once a visible score was NaN or +inf
  float* alpha;   // [lane] rescale of the running state for the current tile
  std::int32_t* begin;  // [lane] first visible key in this item's range
  std::int32_t* end;    // [lane] one past the last visible key
  std::int64_t* head;   // [lane] query head
  std::int64_t* query;  // [lane] query row
  float* kbuf;          // [kKeyTile][head_dim]: widened K rows (float16 / bfloat16 inputs)
  float* vbuf;          // [kKeyTile][v_head_dim]: widened V rows
  float* row;           // [max(head_dim, v_head_dim)]: one widened or finished row
  float* mrow;          // [kKeyTile]: one tile of a mask row widened from float16 / bfloat16
  const float** krow;   // [kKeyTile] where each key's float32 row is
  const float** vrow;   // [kKeyTile]
  const std::uint16_t** kbits;  // [kKeyTile] where each key's bfloat16 row is (the bf16-dot scores read it in place)
  // The AMX products' operands (amx_tiles.hpp; bfloat16 as bits; dim32, dv16: the dims rounded up to 32, 16).
  std::uint16_t* k_bf16;   // [kKeyTile][dim32] (dim32: amx::score_dim32)
  std::uint16_t* q_pairs;  // [dim32 / 2][kRowBlock][2]
  std::uint16_t* vt_bf16;  // [v_terms][dv16][kKeyTile]
  std::uint16_t* amx_row;  // [6 * max(head_dim, v_head_dim)]: float16 rows' terms (amx_staging-inl.h)
  std::uint16_t* p_pairs;  // [step tiles][p_terms][kKeyTile / 2][kRowBlock][2]
  float* tile_pv;          // [dv16][kRowBlock]: one tile's P V
  std::int32_t* amx_bad_keys;  // [kKeyTile]: the tile's keys whose V holds inf or NaN
  // The thread's copy of one K/V head (TiledPlan::widened_keys > 0): the keys of the items of one (b, kvh) are
  // widened (or dequantized), or staged for the AMX products, once per thread, not once per row block. Tile t of
  // it is there once widened_ready[t] is set; widened_for names the (b, kvh) held.
  float* widened_k;               // [widened_keys][head_dim]: key j's row at j (not AMX)
  float* widened_v;               // [widened_keys][v_head_dim]
  std::uint16_t* staged_k;        // AMX: [widened_keys][dim32], tile t's K rows from t * kKeyTile
  std::uint16_t* staged_vt;       // AMX: [widened_keys / kKeyTile][v_terms][dv16][kKeyTile], tile t's V^T
  std::int32_t* staged_bad_keys;  // AMX: [widened_keys / kKeyTile][kKeyTile], tile t's keys whose V is inf or NaN
  std::int32_t* staged_bad_count; // AMX: [widened_keys / kKeyTile], how many
  std::uint8_t* widened_ready;    // [widened_keys / kKeyTile]
  std::int64_t* widened_for;      // [2]: b, kvh (-1: nothing held)
};

// Lays a workspace out from `base` (null: only measure) and returns its size in bytes. `amx_dtype`: the AMX
// products' element type (bfloat16, float16), whose staged operands the head copy (widened_keys of it) holds
// rather than float32 rows; float32: no AMX.
std::size_t carve_workspace(std::byte* base, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t widened_keys, DType amx_dtype, Workspace* ws);

// Partial state of one item of a split problem: [lane] max, sum, poison, then [v_head_dim][lane] accumulator.
std::size_t partial_floats(std::int64_t v_head_dim);

struct ItemJob {
  const AttentionProblem* problem;
  const AttentionArgs* args;
  const Workspace* ws;
  std::int64_t b;
  std::int64_t kvh;
  std::int64_t kv_span = 1;  // K/V heads kvh, kvh + 1, ... in this item (> 1: a wide few-rows item)
  std::int64_t group;      // query heads per K/V head
  const core::SequenceAccess* seqs;  // where the rows of every batch entry are
  core::SequenceRows seq;            // batch entry b's: its queries, key length and visibility rule
  std::int64_t first_row;  // first (head-in-group, query) pair: pair = g * seq.queries + i
  std::int64_t rows;       // pairs in this item (<= kRowBlock; 0: past this entry's queries, nothing to do)
  std::int64_t key_begin;  // key range of this item
  std::int64_t key_end;
  float* partial;  // split-K: where the partial state goes; null: finish the rows into O
  std::int64_t partial_head_stride = 0;  // floats from one head's partial slot to the next (a wide item's span)
  bool amx = false;  // the score and value products on AMX tiles (TiledPlan::amx)
  int p_terms = 3;   // AMX: bfloat16 terms of P in P V (TiledPlan::p_terms)
  bool bf16_dot = false;  // the score product on vdpbf16ps (TiledPlan::bf16_dot)
  bool widened = false;        // K/V rows from the thread's widened copy of the head (TiledPlan::widened_keys)
  bool widened_k = false;      // of them K's (the rest in place; TiledPlan::widened_k)
  bool widened_v = false;
  bool prefetch_v = false;      // few-rows items: prefetch each tile's V rows (TiledPlan::prefetch_v)
  bool prefetch_ahead = false;  // few-rows items: prefetch the next tile's K rows (TiledPlan::prefetch_ahead)
  bool prefetch_tiles = false;  // tiled items: prefetch the next tile's K/V rows (TiledPlan::prefetch_tiles)
  bool prefetch_items = false;  // tiled items: prefetch what the next tile copies and the next item reads (TiledPlan)
  bool interleaved_scores = false;  // wide few-rows items: heads' scores in turns by key group (TiledPlan::...)
  // The item this thread most likely runs next (its chunk's next item, else the one a round of chunks on), or
  // null: its query rows, and K/V rows where it starts another head, are asked for under this item's last tile.
  const ItemJob* next = nullptr;
};

// The SIMD items, dispatched to the best target: rows across lanes (tiled_kernel.cpp), and for items of at most
// kFewRows rows dot products along the head dim (few_rows_kernel.cpp).
void run_item_dispatched(const ItemJob& job);
void run_few_rows_dispatched(const ItemJob& job);
// A few-rows item over job.kv_span K/V heads, which take turns tile by tile (interleaved heads' rows read whole).
void run_few_rows_wide_dispatched(const ItemJob& job);

// Copies the item's unnormalised state into its partial slot: a few-rows item's output rows row-major (from `orows`),
// a tiled item's [dim][lane] block (from `ot`); merge_partials reads either by the rows.
void save_partial(const Workspace& ws, std::int64_t rows, std::int64_t v_head_dim, float* partial);
// Normalises the item's rows from the workspace state and writes O (and the LSE); used after the merge pass.
void finish_rows_dispatched(const ItemJob& job);

}  // namespace attnkit::cpu
