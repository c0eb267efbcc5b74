#version 450
// The cooperative-matrix kernel (VK_NV_cooperative_matrix, float16 Q/K/V, float32 accumulators): a workgroup of
// four 32-lane subgroups owns 64 query rows of one K/V head, 16 rows per subgroup, and walks its key range in
// tiles of 16 keys staged in shared memory. Q Kᵀ and P V run as 16x16x16 matrix products.
//
// The elements of a cooperative matrix have no specified place in the lanes, so an accumulator cannot be
// rescaled per row without a trip through memory; the kernel avoids the online rescale instead (the seed's
// scheme). Pass 1 computes only the scores and the exact maximum of every row; pass 2 recomputes them, forms
// p = exp(s - max) rounded to float16, sums the rounded p (numerator and denominator see the same p), and
// accumulates P V in matrix registers: 1.5x the matrix work of one pass, and no rescale. Scores and
// probabilities pass between the matrix units and the lanes through shared memory, where lane l owns row l & 15
// and columns 8 (l >> 4) .. 8 (l >> 4) + 7; the two lanes of a row meet in a shuffle that takes the max or adds
// two numbers (operand order does not matter). Every order is fixed by the code, so reruns and cut launches give
// the same bits. The key split and merge pass are the scalar kernel's.
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"

layout(local_size_x = 128) in;

const int M = 16;                        // rows per subgroup, keys per tile, and the matrix edge
const int DP = (D + M - 1) / M * M;      // head dims padded to the matrix edge
const int DVP = (DV + M - 1) / M * M;
const int MAX_CHUNKS = 8;                // 128 / 16: the plan sends at most 128 dims here

shared float16_t q_stage[4 * M * DP];    // each subgroup's 16 query rows
shared float16_t k_tile[M * DP];         // 16 keys x DP
shared float16_t v_tile[M * DVP];        // 16 keys x DVP
shared float s_tile[4 * M * M];          // each subgroup's scores (and, at the end, one output block)
shared float16_t p_tile[4 * M * M];      // each subgroup's probabilities
shared uint range_lo, range_hi;

// A float16 from its bits (widened exactly, then narrowed: exact).
float16_t half_of(uint bits) { return float16_t(unpackHalf2x16(bits).x); }

void load_tiles(int tile, int lo, int hi, uint b, uint kvh) {
  const uint t = gl_LocalInvocationID.x;
  for (uint e = t; e < uint(M * DP); e += 128u) {
    const int j = tile + int(e) / DP, d = int(e) % DP;
    k_tile[e] = (j < hi && d < D) ? half_of(uint(k16[at(P.lk, b, kvh, uint(j)) + uint(d)])) : float16_t(0.0);
  }
  for (uint e = t; e < uint(M * DVP); e += 128u) {
    const int j = tile + int(e) / DVP, d = int(e) % DVP;
    v_tile[e] = (j < hi && d < DV) ? half_of(uint(v16[at(P.lv, b, kvh, uint(j)) + uint(d)])) : float16_t(0.0);
  }
}

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint sg = t / 32u, lane = t % 32u;
  const uint wg = PC.first_group + gl_WorkGroupID.x;
  const uint split = wg % P.splits;
  const uint rest = wg / P.splits;
  const uint row_block = rest % P.row_blocks;
  const uint bk = rest / P.row_blocks;
  const uint kvh = bk % P.kv_heads;
  const uint b = bk / P.kv_heads;

  // This lane's row (lane & 15 of the subgroup's 16) and its 8 columns of every 16-wide block.
  const uint r = row_block * uint(WG) + sg * uint(M) + (lane & 15u);
  const bool has_row = r < P.group * P.q_len;
  const uint i = has_row ? r % P.q_len : 0u;
  const uint h = kvh * P.group + (has_row ? r / P.q_len : 0u);
  const uint col0 = (lane >> 4) * 8u;
  const int range_begin = int(split * P.split_keys);
  const int range_end = int(min(P.k_len, (split + 1u) * P.split_keys));
  ivec2 keys = visible_keys(b, i);
  keys.x = max(keys.x, range_begin);
  keys.y = min(keys.y, range_end);
  const bool sees = has_row && keys.x < keys.y;
  const uint mask_row = (P.has_mask != 0u && sees) ? at(P.lm, b, h, i) : 0u;

  if (t == 0u) { range_lo = 0x7fffffffu; range_hi = 0u; }
  // Q rows of this subgroup, padded with zeros (the two lanes of a row each stage half of it).
  const uint q_base = sg * uint(M * DP) + (lane & 15u) * uint(DP);
  for (int d = int(lane >> 4); d < DP; d += 2) {
    q_stage[q_base + uint(d)] = (sees && d < D) ? half_of(uint(q16[at(P.lq, b, h, i) + uint(d)])) : float16_t(0.0);
  }
  barrier();
  if (sees) { atomicMin(range_lo, uint(keys.x)); atomicMax(range_hi, uint(keys.y)); }
  barrier();
  const int lo = int(range_lo), hi = int(range_hi);

  fcoopmatNV<16, gl_ScopeSubgroup, M, M> qf[MAX_CHUNKS];
  [[unroll]] for (int c = 0; c < DP / M; ++c) coopMatLoadNV(qf[c], q_stage, sg * uint(M * DP) + uint(c * M), uint(DP), false);

  const uint s_base = sg * uint(M * M);
  float row_max = NEG_INF, row_sum = 0.0;
  bool poisoned = false;
  fcoopmatNV<32, gl_ScopeSubgroup, M, M> of[MAX_CHUNKS];
  [[unroll]] for (int c = 0; c < DVP / M; ++c) of[c] = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);

  for (int pass = 0; pass < 2; ++pass) {
    const float base = usable_max(row_max);
    for (int tile = lo; tile < hi; tile += M) {
      barrier();
      load_tiles(tile, lo, hi, b, kvh);
      barrier();
      fcoopmatNV<32, gl_ScopeSubgroup, M, M> sf = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);
      [[unroll]] for (int c = 0; c < DP / M; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, M, M> kf;
        coopMatLoadNV(kf, k_tile, uint(c * M), uint(DP), true);  // Kᵀ: (d, key) at key * DP + d
        sf = coopMatMulAddNV(qf[c], kf, sf);
      }
      coopMatStoreNV(sf, s_tile, s_base, uint(M), false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      float part = 0.0;  // pass 2: this lane's share of the tile's rounded p
      [[unroll]] for (int cc = 0; cc < 8; ++cc) {
        const uint col = col0 + uint(cc);
        const int j = tile + int(col);
        float s = NEG_INF;
        if (sees && j >= keys.x && j < keys.y) {
          s = transform(s_tile[s_base + (lane & 15u) * uint(M) + col]);
          if (P.has_mask != 0u) s += load_mask(mask_row + uint(j));
        }
        if (pass == 0) {
          if (isnan(s) || s == POS_INF) poisoned = true;
          else if (s > row_max) row_max = s;
        } else {
          const float16_t ph = (s == NEG_INF || isnan(s) || s == POS_INF) ? float16_t(0.0) : float16_t(exp(s - base));
          part += float(ph);
          p_tile[s_base + (lane & 15u) * uint(M) + col] = ph;
        }
      }
      if (pass == 1) {
        row_sum += part + subgroupShuffleXor(part, 16u);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        fcoopmatNV<16, gl_ScopeSubgroup, M, M> pf;
        coopMatLoadNV(pf, p_tile, s_base, uint(M), false);
        [[unroll]] for (int c = 0; c < DVP / M; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, M, M> vf;
          coopMatLoadNV(vf, v_tile, uint(c * M), uint(DVP), false);
          of[c] = coopMatMulAddNV(pf, vf, of[c]);
        }
      }
      subgroupBarrier();
    }
    if (pass == 0) {
      const float other = subgroupShuffleXor(row_max, 16u);
      row_max = max(row_max, other);
      poisoned = subgroupShuffleXor(poisoned ? 1u : 0u, 16u) != 0u || poisoned;
    }
  }

  // Out: each 16-wide block of the accumulator through the scores' place in shared memory.
  const vec2 fin = finish_row(row_max, row_sum, poisoned, h);
  const uint row_id = (b * P.heads + h) * P.q_len + i;
  const uint at_partial = (split * P.total_rows + row_id) * uint(DV + 3);
  const uint out_at = at(P.lo, b, h, i);
  if (has_row && P.splits > 1u && lane < 16u) {
    partials[at_partial] = row_max;
    partials[at_partial + 1u] = row_sum;
    partials[at_partial + 2u] = poisoned ? 1.0 : 0.0;
  }
  if (has_row && P.splits == 1u && lane < 16u && P.has_lse != 0u) lse_out[at(P.llse, b, h, i)] = fin.y;
  [[unroll]] for (int c = 0; c < DVP / M; ++c) {
    subgroupBarrier();
    coopMatStoreNV(of[c], s_tile, s_base, uint(M), false);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    if (has_row) {
      [[unroll]] for (int cc = 0; cc < 8; ++cc) {
        const int d = c * M + int(col0) + cc;
        if (d < DV) {
          const float a = s_tile[s_base + (lane & 15u) * uint(M) + col0 + uint(cc)];
          if (P.splits > 1u) partials[at_partial + 3u + uint(d)] = a;
          else store_o(out_at + uint(d), finished(a, fin.x));
        }
      }
    }
  }
}
