#version 450
// The split-K merge pass: one thread per query row folds the partial (max, sum, accumulator) of each key range
// in range order (core::merge_weights), then finishes the row as the one-pass kernels do (core::finish_row).
#include "common.glsl"

layout(local_size_x = 64) in;

void main() {
  const uint row_id = (PC.first_group + gl_WorkGroupID.x) * uint(WG) + gl_LocalInvocationID.x;
  if (row_id >= P.total_rows) return;
  const uint i = row_id % P.q_len;
  const uint bh = row_id / P.q_len;
  const uint h = bh % P.heads;
  const uint b = bh / P.heads;
  const SequenceRows seq = sequence_rows(b);
  if (int(i) >= seq.queries) return;  // past the entry's queries (ragged): no partials, nothing written

#ifdef UNROLL_LOOPS
  float acc_[DV];
#define ACC(d) acc_[d]
#else
  const uint slot = (gl_WorkGroupID.x * uint(WG) + gl_LocalInvocationID.x) * uint(D + 2 * DV + TK);
#define ACC(d) thread_scratch[slot + uint(d)]
#endif
  UNROLL for (int d = 0; d < DV; ++d) ACC(d) = 0.0;
  float m = NEG_INF, sum = 0.0;
  bool poisoned = false;
  for (uint s = 0u; s < P.splits; ++s) {
    const uint base = (s * P.total_rows + row_id) * uint(DV + 3);
    const float pm = partials[base];
    poisoned = poisoned || partials[base + 2u] != 0.0;
    const float mm = m > pm ? m : pm;
    const float wa = rescale_factor(m, mm), wb = rescale_factor(pm, mm);
    sum = sum * wa + partials[base + 1u] * wb;
    UNROLL for (int d = 0; d < DV; ++d) ACC(d) = ACC(d) * wa + partials[base + 3u + uint(d)] * wb;
    m = mm;
  }
  const vec2 fin = finish_row(m, sum, poisoned, h);
  const uint out_at = query_at(P.lo, seq, b, h, i);
  UNROLL for (int d = 0; d < DV; ++d) store_o(out_at + uint(d), finished(ACC(d), fin.x));
  if (P.has_lse != 0u) lse_out[query_at(P.llse, seq, b, h, i)] = fin.y;
}
