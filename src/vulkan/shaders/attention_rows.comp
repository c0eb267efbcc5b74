#version 450
// The scalar online-softmax kernel ("rows"): one thread owns one query row, a workgroup 64 rows of one K/V head
// (the query heads of a group one after another), each row walking its visible keys in tiles of TK keys, reading
// K and V straight from the buffers (every row through common.glsl's query_at / key_at: dense, ragged or paged) (the rows of a workgroup read the same K/V rows, which the caches serve).
// No shared memory and no barrier: lavapipe (Mesa 22.3) corrupted the thread-local arrays of this kernel across
// a barrier inside the key loop once a row walked about 30 tiles, and without barriers it cannot. Needs nothing
// of a device beyond 16-bit storage and 64-bit integers, so it runs everywhere.
//
// Blockwise sums: each tile's probabilities and p * V products are summed apart (sums that start at zero), and
// added to the running ones after one rescale; so no sum runs over more than TK keys or over the tiles, and
// float32 holds 1e-5 at 16k keys. Every order is fixed by
// the code: two runs give the same bits, and so do cut launches (a workgroup's bits depend only on its index).
#include "common.glsl"

layout(local_size_x = 64) in;

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint wg = PC.first_group + gl_WorkGroupID.x;
  const uint split = wg % P.splits;
  const uint rest = wg / P.splits;
  const uint row_block = rest % P.row_blocks;
  const uint bk = rest / P.row_blocks;  // b * kv_heads + kv head
  const uint kvh = bk % P.kv_heads;
  const uint b = bk / P.kv_heads;

  // Rows of the entry's longest possible query count (q_len): those past its own (ragged queries) have no row.
  const SequenceRows seq = sequence_rows(b);
  const uint r = row_block * WG + t;
  const bool in_rows = r < P.group * P.q_len;
  const uint i = in_rows ? r % P.q_len : 0u;
  const uint h = kvh * P.group + (in_rows ? r / P.q_len : 0u);
  const bool has_row = in_rows && int(i) < seq.queries;

  const int range_begin = int(split * P.split_keys);
  const int range_end = int(min(P.k_len, (split + 1u) * P.split_keys));
  ivec2 keys = visible_keys(seq, i);
  keys.x = max(keys.x, range_begin);
  keys.y = min(keys.y, range_end);
  const bool sees = has_row && keys.x < keys.y;

#ifdef UNROLL_LOOPS
  float q_[D], acc_[DV], part_[DV], p_[TK];
#define Q(d) q_[d]
#define ACC(d) acc_[d]
#define PART(d) part_[d]
#define PJ(j) p_[j]
#else
  const uint slot = (gl_WorkGroupID.x * uint(WG) + t) * uint(D + 2 * DV + TK);
#define Q(d) thread_scratch[slot + uint(d)]
#define ACC(d) thread_scratch[slot + uint(D + (d))]
#define PART(d) thread_scratch[slot + uint(D + DV + (d))]
#define PJ(j) thread_scratch[slot + uint(D + 2 * DV + (j))]
#endif
  UNROLL for (int d = 0; d < D; ++d) Q(d) = sees ? load_q(query_at(P.lq, seq, b, h, i) + uint(d)) : 0.0;
  UNROLL for (int d = 0; d < DV; ++d) ACC(d) = 0.0;
  float row_max = NEG_INF, row_sum = 0.0;
  bool poisoned = false;
  const uint mask_row = (P.has_mask != 0u && sees) ? at(P.lm, b, h, i) : 0u;

  // PART: this tile's sum of p * V, from zero (blockwise); PJ: the tile's scores, then probabilities.
  // Tiles of TK keys from the range's start: the first one holding a visible key, up to the last.
  const int first_tile = sees ? range_begin + (keys.x - range_begin) / TK * TK : 0;
  const int end_tile = sees ? keys.y : 0;
  for (int tile = first_tile; tile < end_tile; tile += TK) {
    float tile_max = NEG_INF;
    for (int jj = 0; jj < TK; ++jj) {
      const int j = tile + jj;
      float s = NEG_INF;
      if (j >= keys.x && j < keys.y) {
        float dot = 0.0;
        const uint k_row = key_at(P.lk, seq, b, kvh, uint(j));
        UNROLL for (int d = 0; d < D; ++d) dot += Q(d) * load_k(k_row + uint(d));
        s = transform(dot);
        if (P.has_mask != 0u) s += load_mask(mask_row + uint(j));
        if (isnan(s) || s == POS_INF) poisoned = true;
        else if (s > tile_max) tile_max = s;
      }
      PJ(jj) = s;
    }
    const float new_max = max(row_max, tile_max);
    const float alpha = rescale_factor(row_max, new_max);
    const float base = usable_max(new_max);
    float tile_sum = 0.0;
    UNROLL for (int d = 0; d < DV; ++d) PART(d) = 0.0;
    for (int jj = 0; jj < TK; ++jj) {
      const float pj = PJ(jj) == NEG_INF || isnan(PJ(jj)) || PJ(jj) == POS_INF ? 0.0 : exp(PJ(jj) - base);
      tile_sum += pj;
      // p is 0 off the visible keys: read a visible row there (V is not inspected where it has no weight).
      const uint v_row = key_at(P.lv, seq, b, kvh, uint(clamp(tile + jj, keys.x, keys.y - 1)));
      UNROLL for (int d = 0; d < DV; ++d) PART(d) += pj * load_v(v_row + uint(d));
    }
    row_sum = row_sum * alpha + tile_sum;
    UNROLL for (int d = 0; d < DV; ++d) ACC(d) = ACC(d) * alpha + PART(d);
    row_max = new_max;
  }
  if (!has_row) return;

  if (P.splits > 1u) {
    const uint row_id = (b * P.heads + h) * P.q_len + i;
    const uint at_partial = (split * P.total_rows + row_id) * uint(DV + 3);
    partials[at_partial] = row_max;
    partials[at_partial + 1u] = row_sum;
    partials[at_partial + 2u] = poisoned ? 1.0 : 0.0;
    UNROLL for (int d = 0; d < DV; ++d) partials[at_partial + 3u + uint(d)] = ACC(d);
    return;
  }
  const vec2 fin = finish_row(row_max, row_sum, poisoned, h);
  const uint out_at = query_at(P.lo, seq, b, h, i);
  UNROLL for (int d = 0; d < DV; ++d) store_o(out_at + uint(d), finished(ACC(d), fin.x));
  if (P.has_lse != 0u) lse_out[query_at(P.llse, seq, b, h, i)] = fin.y;
}
