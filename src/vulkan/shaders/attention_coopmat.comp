#version 450
// The cooperative-matrix kernel (VK_NV_cooperative_matrix, float16 Q/K/V, float32 accumulators), one pass of
// online softmax: a workgroup of 128 threads owns 64 query rows of one K/V head and walks its key range in tiles
// of TK keys (16, 32 or 64: the plan's choice from the head dims and the device's shared memory) staged in shared
// memory. Subgroup s (gl_SubgroupID, 32 lanes) owns rows 16 s .. 16 s + 15: it runs their matrix products (Q Kᵀ and
// P V as 16x16x16 products) and their scalar steps (lane l: row 16 s + l / 2, the TK / 2 keys of half l % 2), so
// between the tile loads only the subgroup synchronises, and the two lanes of a row meet by a shuffle.
//
// The elements of a cooperative matrix have no specified place in the lanes, but two matrices of one type place
// them alike: the running output is rescaled per row by loading a matrix whose row r holds row r's rescale
// factor in every column and multiplying element by element (only in tiles where a row's maximum moved). p =
// exp(s - running max) is rounded to float16 before the sums, so numerator and denominator see the same p. Every
// order is fixed by the code, so reruns and cut launches give the same bits. The key split and merge pass are the
// scalar kernel's.
//
// What the matrices read and write lives in one uvec4 array (8 float16 or 4 float32 per element; offsets and
// strides count uvec4s): a 16-byte element keeps each matrix row on the 16-byte alignment the loads and stores
// need (a float16_t array promises 2 bytes). Q, K and V rows whose layout keeps 8-element groups together are read
// from the buffers as uvec4s; other layouts element by element.
//
// EMULATED_MATRICES (the build for devices without matrices, lavapipe in CI): the three matrix steps become
// scalar loops over the same shared arrays (each thread its own cells; P V accumulators in the per-thread scratch
// buffer), thread t owns row t / 2, and every hand-over is a workgroup barrier, so everything but the matrix
// instructions and the subgroup steps runs and is tested on every device.
#ifndef EMULATED_MATRICES
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#endif
#include "common.glsl"

layout(local_size_x = 128) in;

layout(std430, set = 0, binding = 1) readonly buffer Q4 { uvec4 q4[]; };
layout(std430, set = 0, binding = 2) readonly buffer K4 { uvec4 k4[]; };
layout(std430, set = 0, binding = 3) readonly buffer V4 { uvec4 v4[]; };

const int M = 16;                        // the matrix edge: rows per subgroup, keys per score block
const int DP = (D + M - 1) / M * M;      // head dims padded to the matrix edge
const int DVP = (DV + M - 1) / M * M;
// The matrix loops run to these fixed bounds and test the real ones inside (folded once the specialization
// constants are known), so the compiler can unroll them and keep the fragment arrays in registers.
const int MAX_CHUNKS = 8;                // 128 / 16: the plan sends at most 128 dims here
const int MAX_KEY_BLOCKS = 4;            // 64 / 16: the longest tile
const int QU = DP / 8, VU = DVP / 8;     // uvec4s (8 float16) per row of Q or K, of V
const int HALF = TK / 2;                 // keys of a tile per thread
const int SU = TK / 4, PU = TK / 8;      // uvec4s per row of scores (float32), of probabilities (float16)

// Regions of smem, in uvec4s: the K and V tiles, the 64 rows' scores and probabilities; the rows' rescale factors
// (matrix build, 16 float32 per row) take the scores' place once the scalar step has read them. Q is staged once:
// over the tiles' space in the matrix build (its fragments then live in registers), apart in the emulated build
// (whose scores read it every tile). In the matrix build every row is padded by one uvec4, so that the 8 rows a
// matrix load or store reaches at once fall in different banks (rows of 2^n uvec4s would all start in the same one).
#ifdef EMULATED_MATRICES
const int PAD = 0;
#else
const int PAD = 1;
#endif
const int QS = QU + PAD, KS = QU + PAD, VS = VU + PAD;  // row strides of Q, the K tile, the V tile
const int SS = SU + PAD, PS = PU + PAD, AS = SS;       // of the scores, the probabilities, the factors
const int K_AT = 0;
const int V_AT = K_AT + TK * KS;
const int S_AT = V_AT + TK * VS;
const int P_AT = S_AT + WG * SS;
#ifdef EMULATED_MATRICES
const int Q_AT = P_AT + WG * PS;
const int SMEM = Q_AT + WG * QS;
#else
const int A_AT = S_AT;
const int Q_AT = 0;
const int TILES_END = P_AT + WG * PS;
const int SMEM = TILES_END > WG * QS ? TILES_END : WG * QS;
#endif
shared uvec4 smem[SMEM];
shared uint range_lo, range_hi;
#ifdef EMULATED_MATRICES
shared float pair_value[128];            // what the two threads of a row tell each other
#endif

// 8 float16 of a row of Q (which 0), K (1) or V (2) from element `at` on, as one uvec4; dims >= `valid` are 0
// (and are not read). `whole`: the layout keeps groups of 8 together (at is a multiple of 8, valid too).
uvec4 load8(uint which, uint at, int first_dim, int valid, bool whole) {
  if (first_dim >= valid) return uvec4(0u);
  if (whole) return which == 0u ? q4[at >> 3] : which == 1u ? k4[at >> 3] : v4[at >> 3];
  uint h[8];
  [[unroll]] for (int e = 0; e < 8; ++e) {
    h[e] = 0u;
    if (first_dim + e < valid) {
      const uint i = at + uint(e);
      h[e] = which == 0u ? uint(q16[i]) : which == 1u ? uint(k16[i]) : uint(v16[i]);
    }
  }
  return uvec4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
}
bool whole_groups(TensorLayout l, int dims) { return dims % 8 == 0 && ((l.offset | l.batch | l.head | l.row) & 7u) == 0u; }

// Float16 number e (0..7) of a uvec4, widened (exact).
float half_at(uvec4 u, int e) {
  const vec2 two = unpackHalf2x16(u[e >> 1]);
  return (e & 1) == 0 ? two.x : two.y;
}
uvec4 pack8(uint h[8]) { return uvec4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16)); }

struct Row {
  bool has_row, sees;
  uint i, h;
  ivec2 keys;
};

// Local row `local` (0..63) of workgroup (b, kvh, row_block), within key range [range_begin, range_end). Rows of
// the entry's longest possible query count (q_len): those past its own (ragged queries) have no row.
Row row_of(uint local, uint row_block, SequenceRows seq, uint kvh, int range_begin, int range_end) {
  Row x;
  const uint r = row_block * uint(WG) + local;
  const bool in_rows = r < P.group * P.q_len;
  x.i = in_rows ? r % P.q_len : 0u;
  x.h = kvh * P.group + (in_rows ? r / P.q_len : 0u);
  x.has_row = in_rows && int(x.i) < seq.queries;
  x.keys = visible_keys(seq, x.i);
  x.keys.x = max(x.keys.x, range_begin);
  x.keys.y = min(x.keys.y, range_end);
  x.sees = x.has_row && x.keys.x < x.keys.y;
  return x;
}

// The tile's K and V: every load first (thread t takes uvec4s t, t + 128, ... of each), then every store, so that
// a thread's loads are in flight together. The loops run to a fixed bound (8: 64 keys of 128 dims) and test the
// real one inside, so they unroll and the arrays stay in registers.
const int MAX_PER_THREAD = 8;
void load_tiles(int tile, int hi, SequenceRows seq, uint b, uint kvh) {
  const int t = int(gl_LocalInvocationID.x);
  const bool k_whole = whole_groups(P.lk, D), v_whole = whole_groups(P.lv, DV);
  uvec4 k_got[MAX_PER_THREAD], v_got[MAX_PER_THREAD];
  [[unroll]] for (int n = 0; n < MAX_PER_THREAD; ++n) {
    const int e = t + 128 * n, j = tile + e / QU, d = e % QU * 8;
    k_got[n] = uvec4(0u);
    if (e < TK * QU && j < hi) k_got[n] = load8(1u, key_at(P.lk, seq, b, kvh, uint(j)) + uint(d), d, D, k_whole);
  }
  [[unroll]] for (int n = 0; n < MAX_PER_THREAD; ++n) {
    const int e = t + 128 * n, j = tile + e / VU, d = e % VU * 8;
    v_got[n] = uvec4(0u);
    if (e < TK * VU && j < hi) v_got[n] = load8(2u, key_at(P.lv, seq, b, kvh, uint(j)) + uint(d), d, DV, v_whole);
  }
  [[unroll]] for (int n = 0; n < MAX_PER_THREAD; ++n) {
    const int e = t + 128 * n;
    if (e < TK * QU) smem[K_AT + e / QU * KS + e % QU] = k_got[n];
    if (e < TK * VU) smem[V_AT + e / VU * VS + e % VU] = v_got[n];
  }
}

// Cell (row, col) of the float32 scores region (also the output blocks' staging).
float s_cell(uint row, uint col) { return uintBitsToFloat(smem[S_AT + row * uint(SS) + (col >> 2)][col & 3u]); }

// The row's partner thread's value of x (the other half of the row's keys).
#ifdef EMULATED_MATRICES
float partner(float x) {
  const uint t = gl_LocalInvocationID.x;
  barrier();  // the last exchange's readers are done
  pair_value[t] = x;
  barrier();
  return pair_value[t ^ 1u];
}
#define ROWS_SYNC() barrier()
#else
float partner(float x) { return subgroupShuffleXor(x, 1u); }
#define ROWS_SYNC() subgroupMemoryBarrierShared(); subgroupBarrier()
#endif

// The scalar step of a tile for this thread's row and its HALF keys: scores (scaled, capped, masked; written back
// in place), the running maximum and sum, p = exp(s - new max) rounded to float16 into the probabilities region.
// Returns the factor the row's running output must be multiplied by. The cells go 4 at a time as vec4s, so no
// array is indexed by a loop whose length is a specialization constant.
float softmax_step(int tile, uint row, uint half_index, Row me, uint mask_row, inout float row_max, inout float row_sum,
                   inout bool poisoned) {
  const uint col0 = half_index * uint(HALF);
  const uint cells = S_AT + row * uint(SS) + col0 / 4u;
  float tile_max = NEG_INF;
  bool bad = false;
  for (int g = 0; g < HALF / 4; ++g) {
    vec4 x = uintBitsToFloat(smem[cells + uint(g)]);
    [[unroll]] for (int e = 0; e < 4; ++e) {
      const int j = tile + int(col0) + g * 4 + e;
      float v = NEG_INF;
      if (me.sees && j >= me.keys.x && j < me.keys.y) {
        v = transform(x[e]);
        if (P.has_mask != 0u) v += load_mask(mask_row + uint(j));
      }
      if (isnan(v) || v == POS_INF) bad = true;
      else tile_max = max(tile_max, v);
      x[e] = v;
    }
    smem[cells + uint(g)] = floatBitsToUint(x);
  }
  tile_max = max(tile_max, partner(tile_max));
  poisoned = poisoned || bad || partner(bad ? 1.0 : 0.0) != 0.0;
  const float new_max = max(row_max, tile_max);
  const float alpha = rescale_factor(row_max, new_max);
  const float base = usable_max(new_max);
  float part = 0.0;
  for (int g = 0; g < HALF / 8; ++g) {
    const vec4 lo = uintBitsToFloat(smem[cells + uint(2 * g)]), hi = uintBitsToFloat(smem[cells + uint(2 * g + 1)]);
    uint h[8];
    [[unroll]] for (int e = 0; e < 8; ++e) {
      const float x = e < 4 ? lo[e] : hi[e - 4];
      h[e] = 0u;
      if (!(x == NEG_INF || isnan(x) || x == POS_INF)) {
        h[e] = packHalf2x16(vec2(exp(x - base), 0.0)) & 0xffffu;
        part += unpackHalf2x16(h[e]).x;
      }
    }
    smem[P_AT + row * uint(PS) + half_index * uint(HALF / 8) + uint(g)] = pack8(h);
  }
  row_sum = row_sum * alpha + (part + partner(part));  // both threads of the row add the same two numbers
  row_max = new_max;
  return alpha;
}

#ifdef EMULATED_MATRICES
// The matrix steps as scalar loops: thread (row, half) computes the scores of its HALF keys, and holds the output
// columns 8 half .. 8 half + 7 of every 16 V dims in the per-thread scratch buffer.
void emulated_scores(uint row, uint half_index) {
  for (int cc = 0; cc < HALF; ++cc) {
    const uint col = half_index * uint(HALF) + uint(cc);
    float s = 0.0;
    for (int u = 0; u < QU; ++u) {
      const uvec4 q = smem[Q_AT + row * uint(QS) + uint(u)], k = smem[K_AT + col * uint(KS) + uint(u)];
      [[unroll]] for (int e = 0; e < 8; ++e) s += half_at(q, e) * half_at(k, e);
    }
    const uint at_cell = S_AT + row * uint(SS) + (col >> 2);
    uvec4 cell = smem[at_cell];
    cell[col & 3u] = floatBitsToUint(s);
    smem[at_cell] = cell;
  }
}
uint acc_slot(int c, int cc) {
  return (gl_WorkGroupID.x * 128u + gl_LocalInvocationID.x) * uint(DVP / 2) + uint(c * 8 + cc);
}
void emulated_pv(uint row, uint half_index, float alpha) {
  for (int c = 0; c < DVP / M; ++c) {
    float a[8];
    [[unroll]] for (int cc = 0; cc < 8; ++cc) a[cc] = thread_scratch[acc_slot(c, cc)] * alpha;
    for (int j = 0; j < TK; ++j) {
      const float p = half_at(smem[P_AT + row * uint(PS) + uint(j >> 3)], j & 7);
      const uvec4 v = smem[V_AT + uint(j) * uint(VS) + uint(c * 2) + half_index];
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
  smem[S_AT + row * uint(SS) + half_index * 2u] = floatBitsToUint(lo4);
  smem[S_AT + row * uint(SS) + half_index * 2u + 1u] = floatBitsToUint(hi4);
}
#else
fcoopmatNV<16, gl_ScopeSubgroup, M, M> qf[MAX_CHUNKS];  // the subgroup's 16 query rows
fcoopmatNV<32, gl_ScopeSubgroup, M, M> of[MAX_CHUNKS];  // their running output, 16 V dims each

void load_query_fragments(uint sg) {
  [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {
    if (c < DP / M) coopMatLoadNV(qf[c], smem, Q_AT + sg * uint(M * QS) + uint(c * 2), uint(QS), false);
  }
  [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {
    if (c < DVP / M) of[c] = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);
  }
}

// The subgroup's scores of the tile, block of 16 keys by block, into the scores region.
void matrix_scores(uint sg) {
  [[unroll]] for (int kb = 0; kb < MAX_KEY_BLOCKS; ++kb) {
    if (kb < TK / M) {
      fcoopmatNV<32, gl_ScopeSubgroup, M, M> sf = fcoopmatNV<32, gl_ScopeSubgroup, M, M>(0.0);
      [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {
        if (c < DP / M) {
          fcoopmatNV<16, gl_ScopeSubgroup, M, M> kf;
          coopMatLoadNV(kf, smem, K_AT + uint(kb * M * KS + c * 2), uint(KS), true);  // Kᵀ: (d, key) at key * KS + d / 8
          sf = coopMatMulAddNV(qf[c], kf, sf);
        }
      }
      coopMatStoreNV(sf, smem, S_AT + sg * uint(M * SS) + uint(kb * 4), uint(SS), false);
    }
  }
}

// The running output times each row's factor (when some row's maximum moved), plus P V of the tile.
void matrix_accumulate(uint sg, uint row, uint half_index, float alpha) {
  if (!subgroupAll(alpha == 1.0)) {
    smem[A_AT + row * uint(AS) + half_index * 2u] = floatBitsToUint(vec4(alpha));
    smem[A_AT + row * uint(AS) + half_index * 2u + 1u] = floatBitsToUint(vec4(alpha));
    ROWS_SYNC();
    fcoopmatNV<32, gl_ScopeSubgroup, M, M> factor;
    coopMatLoadNV(factor, smem, A_AT + sg * uint(M * AS), uint(AS), false);
    [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {
      if (c < DVP / M) {
        [[unroll]] for (int e = 0; e < factor.length(); ++e) of[c][e] *= factor[e];
      }
    }
  }
  [[unroll]] for (int kb = 0; kb < MAX_KEY_BLOCKS; ++kb) {
    if (kb < TK / M) {
      fcoopmatNV<16, gl_ScopeSubgroup, M, M> pf;
      coopMatLoadNV(pf, smem, P_AT + sg * uint(M * PS) + uint(kb * 2), uint(PS), false);
      [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {
        if (c < DVP / M) {
          fcoopmatNV<16, gl_ScopeSubgroup, M, M> vf;
          coopMatLoadNV(vf, smem, V_AT + uint(kb * M * VS + c * 2), uint(VS), false);
          of[c] = coopMatMulAddNV(pf, vf, of[c]);
        }
      }
    }
  }
}
#endif

// The workgroup's rows staged in smem (rows that see no key stage zeros), and the union of their key ranges.
ivec2 stage_queries(uint row_block, SequenceRows seq, uint b, uint kvh, int range_begin, int range_end, Row me) {
  const uint t = gl_LocalInvocationID.x;
  if (t == 0u) { range_lo = 0x7fffffffu; range_hi = 0u; }
  const bool q_whole = whole_groups(P.lq, D);
  for (uint e = t; e < uint(WG * QU); e += 128u) {
    const uint r = e / uint(QU);
    const int d = int(e % uint(QU)) * 8;
    const Row x = row_of(r, row_block, seq, kvh, range_begin, range_end);
    smem[Q_AT + r * uint(QS) + e % uint(QU)] = x.sees ? load8(0u, query_at(P.lq, seq, b, x.h, x.i) + uint(d), d, D, q_whole) : uvec4(0u);
  }
  barrier();
  if (me.sees) { atomicMin(range_lo, uint(me.keys.x)); atomicMax(range_hi, uint(me.keys.y)); }
  barrier();
  return ivec2(int(range_lo), int(range_hi));
}

void main() {
  const uint wg = PC.first_group + gl_WorkGroupID.x;
  const uint split = wg % P.splits;
  const uint rest = wg / P.splits;
  const uint row_block = rest % P.row_blocks;
  const uint bk = rest / P.row_blocks;
  const uint kvh = bk % P.kv_heads;
  const uint b = bk / P.kv_heads;
  const int range_begin = int(split * P.split_keys);
  const int range_end = int(min(P.k_len, (split + 1u) * P.split_keys));

  // This thread's row and half of the keys.
#ifdef EMULATED_MATRICES
  const uint row = gl_LocalInvocationID.x >> 1, half_index = gl_LocalInvocationID.x & 1u;
#else
  const uint sg = gl_SubgroupID;
  const uint row = sg * uint(M) + (gl_SubgroupInvocationID >> 1), half_index = gl_SubgroupInvocationID & 1u;
#endif
  const SequenceRows seq = sequence_rows(b);
  const Row me = row_of(row, row_block, seq, kvh, range_begin, range_end);
  const uint mask_row = (P.has_mask != 0u && me.sees) ? at(P.lm, b, me.h, me.i) : 0u;

  const ivec2 range = stage_queries(row_block, seq, b, kvh, range_begin, range_end, me);
#ifndef EMULATED_MATRICES
  load_query_fragments(sg);
#else
  for (int c = 0; c < DVP / M; ++c)
    for (int cc = 0; cc < 8; ++cc) thread_scratch[acc_slot(c, cc)] = 0.0;
#endif

  float row_max = NEG_INF, row_sum = 0.0;
  bool poisoned = false;
  for (int tile = range.x; tile < range.y; tile += TK) {
    barrier();  // the last tile's (and Q's) readers are done
    load_tiles(tile, range.y, seq, b, kvh);
    barrier();
#ifndef EMULATED_MATRICES
    matrix_scores(sg);
#else
    emulated_scores(row, half_index);
#endif
    ROWS_SYNC();
    const float alpha = softmax_step(tile, row, half_index, me, mask_row, row_max, row_sum, poisoned);
    ROWS_SYNC();
#ifndef EMULATED_MATRICES
    matrix_accumulate(sg, row, half_index, alpha);
#else
    emulated_pv(row, half_index, alpha);
#endif
  }

  // Out: each 16-wide block of the accumulators through the scores region.
  const vec2 fin = finish_row(row_max, row_sum, poisoned, me.h);
  const uint row_id = (b * P.heads + me.h) * P.q_len + me.i;
  const uint at_partial = (split * P.total_rows + row_id) * uint(DV + 3);
  const uint out_at = query_at(P.lo, seq, b, me.h, me.i);
  if (me.has_row && P.splits > 1u && half_index == 0u) {
    partials[at_partial] = row_max;
    partials[at_partial + 1u] = row_sum;
    partials[at_partial + 2u] = poisoned ? 1.0 : 0.0;
  }
  if (me.has_row && P.splits == 1u && half_index == 0u && P.has_lse != 0u) lse_out[query_at(P.llse, seq, b, me.h, me.i)] = fin.y;
  [[unroll]] for (int c = 0; c < MAX_CHUNKS; ++c) {  // (unrolled: a loop index into `of` would put it in memory)
    if (c >= DVP / M) break;
    ROWS_SYNC();  // the scores region's last readers are done
#ifndef EMULATED_MATRICES
    coopMatStoreNV(of[c], smem, S_AT + sg * uint(M * SS), uint(SS), false);
#else
    emulated_output_block(c, row, half_index);
#endif
    ROWS_SYNC();
    if (me.has_row) {
      [[unroll]] for (int cc = 0; cc < 8; ++cc) {
        const int d = c * M + int(half_index) * 8 + cc;
        if (d < DV) {
          const float a = s_cell(row, half_index * 8u + uint(cc));
          if (P.splits > 1u) partials[at_partial + 3u + uint(d)] = a;
          else store_o(out_at + uint(d), finished(a, fin.x));
        }
      }
    }
  }
}
