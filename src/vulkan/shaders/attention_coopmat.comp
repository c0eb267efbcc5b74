#version 450
// The cooperative-matrix kernel (VK_NV_cooperative_matrix, float16 Q/K/V, float32 accumulators): a workgroup of
// 128 threads owns 64 query rows of one K/V head and walks its key range in tiles of 16 keys staged in shared
// memory. Each 32-lane subgroup (gl_SubgroupID) runs the matrix products of 16 of the rows: Q Kᵀ and P V as
// 16x16x16 products. The scalar steps (scale, mask, max, exp, sums, output) use no subgroup operation: thread t
// owns row t >> 1 and the 8 columns 8 (t & 1) .. 8 (t & 1) + 7 of every 16-wide block, and the two threads of a
// row meet in shared memory.
//
// The elements of a cooperative matrix have no specified place in the lanes, so an accumulator cannot be
// rescaled per row without a trip through memory; the kernel avoids the online rescale instead (the seed's
// scheme). Pass 1 computes only the scores and the exact maximum of every row; pass 2 recomputes them, forms
// p = exp(s - max) rounded to float16, sums the rounded p (numerator and denominator see the same p), and
// accumulates P V in matrix registers: 1.5x the matrix work of one pass, and no rescale. Every order is fixed by
// the code, so reruns and cut launches give the same bits. The key split and merge pass are the scalar kernel's.
//
// What the matrices read and write lives in uvec4 arrays (8 float16 or 4 float32 per element; offsets and
// strides count uvec4s), as in every cooperative-matrix shader known to run on NVIDIA: a 16-byte element keeps
// each matrix row on the 16-byte alignment the loads and stores need (a float16_t array promises 2 bytes), and
// every hand-over between the matrix steps and the scalar steps is a workgroup barrier().
//
// EMULATED_MATRICES (the build for devices without matrices, lavapipe in CI): the three matrix steps become
// scalar loops over the same shared arrays (each thread its own 8 cells; P V accumulators in the per-thread
// scratch buffer), so everything but the matrix instructions runs and is tested on every device.
#ifndef EMULATED_MATRICES
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
#include "common.glsl"

layout(local_size_x = 128) in;

const int M = 16;                        // rows per subgroup, keys per tile, and the matrix edge
const int DP = (D + M - 1) / M * M;      // head dims padded to the matrix edge
const int DVP = (DV + M - 1) / M * M;
const int MAX_CHUNKS = 8;                // 128 / 16: the plan sends at most 128 dims here
const int QU = DP / 8, VU = DVP / 8;     // uvec4s (8 float16) per row of Q or K, of V

shared uvec4 q_stage[WG * QU];           // the workgroup's 64 query rows, zero-padded to DP
shared uvec4 k_tile[M * QU];             // 16 keys x DP
shared uvec4 v_tile[M * VU];             // 16 keys x DVP
shared uvec4 s_tile[WG * 4];             // 64 rows x 16 float32: scores, then one output block
shared uvec4 p_tile[WG * 2];             // 64 rows x 16 float16: probabilities
shared float pair_value[128];            // what the two threads of a row tell each other
shared uint pair_flag[128];
shared uint range_lo, range_hi;

// 8 float16 of a row of Q (which 0), K (1) or V (2) from element `at` on, as one uvec4; dims >= `valid` are 0
// (and are not read).
uvec4 gather8(uint which, uint at, int first_dim, int valid) {
  uint h[8];
  [[unroll]] for (int e = 0; e < 8; ++e) {
    h[e] = 0u;
    if (first_dim + e < valid) {
      const uint i = at + uint(e);
      if (which == 0u) h[e] = uint(q16[i]);
      else if (which == 1u) h[e] = uint(k16[i]);
      else h[e] = uint(v16[i]);
    }
  }
  return uvec4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
}
// Float16 number e (0..7) of a uvec4, widened (exact).
float half_at(uvec4 u, int e) {
  const vec2 two = unpackHalf2x16(u[e >> 1]);
  return (e & 1) == 0 ? two.x : two.y;
}

struct Row {
  bool has_row, sees;
  uint i, h;
  ivec2 keys;
};

// Local row `local` (0..63) of workgroup (b, kvh, row_block), within key range [range_begin, range_end).
Row row_of(uint local, uint row_block, uint b, uint kvh, int range_begin, int range_end) {
  Row x;
  const uint r = row_block * uint(WG) + local;
  x.has_row = r < P.group * P.q_len;
  x.i = x.has_row ? r % P.q_len : 0u;
  x.h = kvh * P.group + (x.has_row ? r / P.q_len : 0u);
  x.keys = visible_keys(b, x.i);
  x.keys.x = max(x.keys.x, range_begin);
  x.keys.y = min(x.keys.y, range_end);
  x.sees = x.has_row && x.keys.x < x.keys.y;
  return x;
}

void load_tiles(int tile, int hi, uint b, uint kvh) {
  const uint t = gl_LocalInvocationID.x;
  for (uint e = t; e < uint(M * QU); e += 128u) {
    const int j = tile + int(e) / QU, d = int(e) % QU * 8;
    k_tile[e] = j < hi ? gather8(1u, at(P.lk, b, kvh, uint(j)) + uint(d), d, D) : uvec4(0u);
  }
  for (uint e = t; e < uint(M * VU); e += 128u) {
    const int j = tile + int(e) / VU, d = int(e) % VU * 8;
    v_tile[e] = j < hi ? gather8(2u, at(P.lv, b, kvh, uint(j)) + uint(d), d, DV) : uvec4(0u);
  }
}

// This thread's 8 float32 cells of s_tile (row `row`, columns col0 .. col0 + 7).
float s_cell(uint row, uint half_index, int cc) {
  const uvec4 u = s_tile[row * 4u + half_index * 2u + uint(cc >> 2)];
  return uintBitsToFloat(u[cc & 3]);
}

#ifdef EMULATED_MATRICES
// The matrix steps as scalar loops, each thread its own row and 8 columns.
void emulated_scores(uint row, uint half_index) {
  float s[8];
  [[unroll]] for (int cc = 0; cc < 8; ++cc) s[cc] = 0.0;
  for (int u = 0; u < QU; ++u) {
    const uvec4 q = q_stage[row * uint(QU) + uint(u)];
    [[unroll]] for (int cc = 0; cc < 8; ++cc) {
      const uvec4 k = k_tile[(half_index * 8u + uint(cc)) * uint(QU) + uint(u)];
      [[unroll]] for (int e = 0; e < 8; ++e) s[cc] += half_at(q, e) * half_at(k, e);
    }
  }
  s_tile[row * 4u + half_index * 2u] = floatBitsToUint(vec4(s[0], s[1], s[2], s[3]));
  s_tile[row * 4u + half_index * 2u + 1u] = floatBitsToUint(vec4(s[4], s[5], s[6], s[7]));
}
uint acc_slot(int c, int cc) {
  return (gl_WorkGroupID.x * 128u + gl_LocalInvocationID.x) * uint(DVP / 2) + uint(c * 8 + cc);
}
void emulated_pv(uint row, uint half_index) {
  for (int c = 0; c < DVP / M; ++c) {
    float a[8];
    [[unroll]] for (int cc = 0; cc < 8; ++cc) a[cc] = thread_scratch[acc_slot(c, cc)];
    for (int j = 0; j < M; ++j) {
      const float p = half_at(p_tile[row * 2u + uint(j >> 3)], j & 7);
      const uvec4 v = v_tile[uint(j) * uint(VU) + uint(c * 2) + half_index];
      [[unroll]] for (int cc = 0; cc < 8; ++cc) a[cc] += p * half_at(v, cc);
    }
    [[unroll]] for (int cc = 0; cc < 8; ++cc) thread_scratch[acc_slot(c, cc)] = a[cc];
  }
}
void emulated_output_block(int c, uint row, uint half_index) {
  vec4 lo4, hi4;
  [[unroll]] for (int cc = 0; cc < 4; ++cc) {
    lo4[cc] = thread_scratch[acc_slot(c, cc)];
    hi4[cc] = thread_scratch[acc_slot(c, cc + 4)];
  }
  s_tile[row * 4u + half_index * 2u] = floatBitsToUint(lo4);
  s_tile[row * 4u + half_index * 2u + 1u] = floatBitsToUint(hi4);
}
#endif

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint wg = PC.first_group + gl_WorkGroupID.x;
  const uint split = wg % P.splits;
  const uint rest = wg / P.splits;
  const uint row_block = rest % P.row_blocks;
  const uint bk = rest / P.row_blocks;
  const uint kvh = bk % P.kv_heads;
  const uint b = bk / P.kv_heads;
  const int range_begin = int(split * P.split_keys);
  const int range_end = int(min(P.k_len, (split + 1u) * P.split_keys));

  // This thread's row and columns.
  const uint row = t >> 1, half_index = t & 1u, col0 = half_index * 8u;
  const Row me = row_of(row, row_block, b, kvh, range_begin, range_end);
  const uint mask_row = (P.has_mask != 0u && me.sees) ? at(P.lm, b, me.h, me.i) : 0u;

  if (t == 0u) { range_lo = 0x7fffffffu; range_hi = 0u; }
  // Q rows, zero-padded (rows that see no key stage zeros).
  for (uint e = t; e < uint(WG * QU); e += 128u) {
    const uint r = e / uint(QU);
    const int d = int(e % uint(QU)) * 8;
    const Row x = row_of(r, row_block, b, kvh, range_begin, range_end);
    q_stage[e] = x.sees ? gather8(0u, at(P.lq, b, x.h, x.i) + uint(d), d, D) : uvec4(0u);
  }
  barrier();
  if (me.sees) { atomicMin(range_lo, uint(me.keys.x)); atomicMax(range_hi, uint(me.keys.y)); }
  barrier();
  const int lo = int(range_lo), hi = int(range_hi);

#ifndef EMULATED_MATRICES
  const uint sg = gl_SubgroupID;  // its rows: 16 sg .. 16 sg + 15 (32-lane subgroups: four of them)
  fcoopmatNV<16, gl_ScopeSubgroup, M, M> qf[MAX_CHUNKS];
  [[unroll]] for (int c = 0; c < DP / M; ++c) {
    coopMatLoadNV(qf[c], q_stage, sg * uint(M * QU) + uint(c * 2), uint(QU), false);
  }
  fcoopmatNV<32, gl_ScopeSubgroup, M, M> of[MAX_CHUNKS];
  [[unroll]] for (int c = 0; c < DVP / M; ++c) of[c] = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);
#else
  for (int c = 0; c < DVP / M; ++c)
    for (int cc = 0; cc < 8; ++cc) thread_scratch[acc_slot(c, cc)] = 0.0;
#endif

  float row_max = NEG_INF, row_sum = 0.0;
  bool poisoned = false;
  for (int pass = 0; pass < 2; ++pass) {
    const float base = usable_max(row_max);
    for (int tile = lo; tile < hi; tile += M) {
      barrier();  // the last tile's readers of k_tile, v_tile, s_tile, p_tile and pair_value are done
      load_tiles(tile, hi, b, kvh);
      barrier();
#ifndef EMULATED_MATRICES
      fcoopmatNV<32, gl_ScopeSubgroup, M, M> sf = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);
      [[unroll]] for (int c = 0; c < DP / M; ++c) {
        fcoopmatNV<16, gl_ScopeSubgroup, M, M> kf;
        coopMatLoadNV(kf, k_tile, uint(c * 2), uint(QU), true);  // Kᵀ: (d, key) at key * QU + d / 8
        sf = coopMatMulAddNV(qf[c], kf, sf);
      }
      coopMatStoreNV(sf, s_tile, sg * uint(M * 4), 4u, false);
#else
      emulated_scores(row, half_index);
#endif
      barrier();
      float part = 0.0;  // pass 2: this thread's share of the tile's rounded p
      uint ph[8];
      [[unroll]] for (int cc = 0; cc < 8; ++cc) {
        const int j = tile + int(col0) + cc;
        float s = NEG_INF;
        if (me.sees && j >= me.keys.x && j < me.keys.y) {
          s = transform(s_cell(row, half_index, cc));
          if (P.has_mask != 0u) s += load_mask(mask_row + uint(j));
        }
        ph[cc] = 0u;
        if (pass == 0) {
          if (isnan(s) || s == POS_INF) poisoned = true;
          else if (s > row_max) row_max = s;
        } else if (!(s == NEG_INF || isnan(s) || s == POS_INF)) {
          ph[cc] = packHalf2x16(vec2(exp(s - base), 0.0)) & 0xffffu;
          part += unpackHalf2x16(ph[cc]).x;
        }
      }
      if (pass == 1) {
        p_tile[row * 2u + half_index] = uvec4(ph[0] | (ph[1] << 16), ph[2] | (ph[3] << 16), ph[4] | (ph[5] << 16),
                                              ph[6] | (ph[7] << 16));
        pair_value[t] = part;
        barrier();
        row_sum += part + pair_value[t ^ 1u];  // both threads of the row add the same two numbers
#ifndef EMULATED_MATRICES
        fcoopmatNV<16, gl_ScopeSubgroup, M, M> pf;
        coopMatLoadNV(pf, p_tile, sg * uint(M * 2), 2u, false);
        [[unroll]] for (int c = 0; c < DVP / M; ++c) {
          fcoopmatNV<16, gl_ScopeSubgroup, M, M> vf;
          coopMatLoadNV(vf, v_tile, uint(c * 2), uint(VU), false);
          of[c] = coopMatMulAddNV(pf, vf, of[c]);
        }
#else
        emulated_pv(row, half_index);
#endif
      }
    }
    if (pass == 0) {
      barrier();  // the last tile's readers of pair_value are done
      pair_value[t] = row_max;
      pair_flag[t] = poisoned ? 1u : 0u;
      barrier();
      row_max = max(row_max, pair_value[t ^ 1u]);
      poisoned = poisoned || pair_flag[t ^ 1u] != 0u;
    }
  }

  // Out: each 16-wide block of the accumulators through s_tile.
  const vec2 fin = finish_row(row_max, row_sum, poisoned, me.h);
  const uint row_id = (b * P.heads + me.h) * P.q_len + me.i;
  const uint at_partial = (split * P.total_rows + row_id) * uint(DV + 3);
  const uint out_at = at(P.lo, b, me.h, me.i);
  if (me.has_row && P.splits > 1u && half_index == 0u) {
    partials[at_partial] = row_max;
    partials[at_partial + 1u] = row_sum;
    partials[at_partial + 2u] = poisoned ? 1.0 : 0.0;
  }
  if (me.has_row && P.splits == 1u && half_index == 0u && P.has_lse != 0u) lse_out[at(P.llse, b, me.h, me.i)] = fin.y;
  for (int c = 0; c < DVP / M; ++c) {
    barrier();  // s_tile's last readers are done
#ifndef EMULATED_MATRICES
    coopMatStoreNV(of[c], s_tile, sg * uint(M * 4), 4u, false);
#else
    emulated_output_block(c, row, half_index);
#endif
    barrier();
    if (me.has_row) {
      [[unroll]] for (int cc = 0; cc < 8; ++cc) {
        const int d = c * M + int(col0) + cc;
        if (d < DV) {
          const float a = s_cell(row, half_index, cc);
          if (P.splits > 1u) partials[at_partial + 3u + uint(d)] = a;
          else store_o(out_at + uint(d), finished(a, fin.x));
        }
      }
    }
  }
}
