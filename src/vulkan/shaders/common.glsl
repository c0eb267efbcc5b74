// What every attention shader shares: the parameter block (vulkan_params.hpp is its C++ twin, field for field),
// the buffer bindings, element loads and stores, the visibility rule and the online-softmax helpers. The rules
// mirror src/core (visibility.hpp, online_softmax.hpp, score_transform.hpp) line for line: a shader cannot
// include C++, and the tests hold both to the float64 reference.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_control_flow_attributes : require

// Element type of Q, K, V and O (0 float32, 1 float16, 2 bfloat16) and of the mask.
layout(constant_id = 0) const int ELEM = 0;
layout(constant_id = 1) const int MASK_ELEM = 0;
layout(constant_id = 2) const int D = 64;    // head_dim (Q, K)
layout(constant_id = 3) const int DV = 64;   // v_head_dim (V, O)
layout(constant_id = 4) const int TK = 32;   // keys per staged tile
// 0: a dense batch (no ragged rows, no pages), whose addressing below compiles to `at` alone. The cooperative-
// matrix kernel's dense calls ran 11-29% slower on the H200 once its rows went through this addressing, a branch
// on the push constants in each of its K/V loads (bench/results/2026-12-07-h200-vulkan-sequences-and-lane-map.md).
layout(constant_id = 5) const int SEQUENCES = 1;
const int WG = 64;                           // rows (threads) per workgroup
// Two builds of each scalar shader: UNROLL_LOOPS (for GPUs) unrolls the loops over head dims and a tile's keys
// once the specialization constants are known, so q and the accumulators stay in registers; the plain build (for
// CPU devices, lavapipe) keeps loops, since llvmpipe took minutes to compile the unrolled form. llvmpipe also ends
// a shader's loops after 65535 iterations in all (a guard against hangs, counted over every loop and entry): the
// plan keeps a workgroup's key range and the merge pass's ranges short enough on CPU devices (vulkan_plan.cpp).
#ifdef UNROLL_LOOPS
#define UNROLL [[unroll]]
#else
#define UNROLL
#endif

struct TensorLayout { uint offset, batch, head, row; };

layout(std140, set = 0, binding = 0) uniform Params {
  uint batch, heads, kv_heads, q_len;
  uint k_len, group, row_blocks, splits;
  uint split_keys, causal, window, has_offsets;
  int causal_offset; uint has_key_lengths; float scale; float softcap;
  uint has_sink, masked_zero, has_lse, has_mask;
  uint total_rows, workgroups, ragged_q, ragged_k;
  uint page_size, max_pages_per_seq, per_sequence_causal, device_values;
  uint total_q, total_k, num_pages, pad0;
  TensorLayout lq, lk, lv, lo, lm, llse;
} P;

layout(push_constant) uniform Push { uint first_group; } PC;

layout(std430, set = 0, binding = 1) readonly buffer Q32 { float q32[]; };
layout(std430, set = 0, binding = 1) readonly buffer Q16 { uint16_t q16[]; };
layout(std430, set = 0, binding = 2) readonly buffer K32 { float k32[]; };
layout(std430, set = 0, binding = 2) readonly buffer K16 { uint16_t k16[]; };
layout(std430, set = 0, binding = 3) readonly buffer V32 { float v32[]; };
layout(std430, set = 0, binding = 3) readonly buffer V16 { uint16_t v16[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O32 { float o32[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O16 { uint16_t o16[]; };
layout(std430, set = 0, binding = 5) readonly buffer M32 { float m32[]; };
layout(std430, set = 0, binding = 5) readonly buffer M16 { uint16_t m16[]; };
layout(std430, set = 0, binding = 6) readonly buffer KeyLengths { int key_lengths[]; };
layout(std430, set = 0, binding = 7) readonly buffer CausalOffsets { int causal_offsets[]; };
layout(std430, set = 0, binding = 8) readonly buffer HeadSink { float head_sink[]; };
layout(std430, set = 0, binding = 9) writeonly buffer Lse { float lse_out[]; };
// Ragged and paged sequences (AttentionProblem::sequences), int32: read only through sequence_rows, query_at and
// key_at below, which every shader uses to find a row.
layout(std430, set = 0, binding = 10) readonly buffer CuSeqlensQ { int cu_seqlens_q[]; };
layout(std430, set = 0, binding = 11) readonly buffer CuSeqlensK { int cu_seqlens_k[]; };
layout(std430, set = 0, binding = 12) readonly buffer BlockTable { int block_table[]; };
// Split-K partials: per (range, row) the max, the sum, a poison flag and the DV accumulators.
layout(std430, set = 0, binding = 13) buffer Partials { float partials[]; };
// The loop build's per-thread arrays (q, accumulators, a tile's p) live here, one slot per thread of a launch:
// llvmpipe lowers a dynamically indexed local array to chains of selects and took a minute to compile a 32-dim
// kernel; buffer indexing compiles at once. The unrolled build keeps them in registers.
layout(std430, set = 0, binding = 14) buffer ThreadScratch { float thread_scratch[]; };
// Device-buffer calls (P.device_values): the lowest entry whose device values are out of range (the call fills it
// with 0xffffffff, -1 as an int32, before its kernels).
layout(std430, set = 0, binding = 15) buffer Status { uint status_word; };

#define NEG_INF uintBitsToFloat(0xff800000u)
#define POS_INF uintBitsToFloat(0x7f800000u)
#define QNAN uintBitsToFloat(0x7fc00000u)

float bf16_to_float(uint bits) { return uintBitsToFloat(bits << 16); }
float f16_to_float(uint bits) { return unpackHalf2x16(bits).x; }  // exact

// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN (dtype.hpp's rule).
uint float_to_bf16(float f) {
  uint x = floatBitsToUint(f);
  if (isnan(f)) return ((x >> 16) & 0x8000u) | 0x7fc0u;
  return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}
// float -> binary16 bits, round to nearest even; overflow gives inf, NaN a quiet NaN (dtype.hpp's rule).
uint float_to_f16(float f) {
  uint x = floatBitsToUint(f);
  uint sign = (x >> 16) & 0x8000u;
  uint ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) {  // a binary16 subnormal: round(|f| * 2^24), exact scaling, ties to even
    return sign | uint(roundEven(uintBitsToFloat(ax) * 16777216.0));
  }
  uint h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  uint rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) h += 1u;
  return sign | h;
}

float widen(uint bits) { return ELEM == 1 ? f16_to_float(bits) : bf16_to_float(bits); }
float load_q(uint i) { return ELEM == 0 ? q32[i] : widen(uint(q16[i])); }
float load_k(uint i) { return ELEM == 0 ? k32[i] : widen(uint(k16[i])); }
float load_v(uint i) { return ELEM == 0 ? v32[i] : widen(uint(v16[i])); }
float load_mask(uint i) {
  if (MASK_ELEM == 0) return m32[i];
  uint bits = uint(m16[i]);
  return MASK_ELEM == 1 ? f16_to_float(bits) : bf16_to_float(bits);
}
void store_o(uint i, float x) {
  if (ELEM == 0) o32[i] = x;
  else o16[i] = uint16_t(ELEM == 1 ? float_to_f16(x) : float_to_bf16(x));
}

uint at(TensorLayout l, uint b, uint h, uint r) { return l.offset + b * l.batch + h * l.head + r * l.row; }

// core::SequenceRows: one batch entry as the kernels see it (dense, ragged and paged batches alike).
struct SequenceRows {
  int queries;        // query rows of this entry
  int first_query;    // packed row of its query 0 (ragged queries), else 0
  int key_length;     // keys it has
  int first_key;      // packed row of its key 0 (ragged keys), else 0
  int causal_offset;  // its causal offset, clamped to [-(q_len + 1), k_len]
};

// Whether every block-table entry that keys [0, key_length) of entry b reach names a page in [0, num_pages).
bool pages_in_range(uint b, int key_length) {
  const uint pages = (uint(key_length) + P.page_size - 1u) / P.page_size;
  bool ok = true;
  for (uint i = 0u; i < pages; ++i) {
    const int page = block_table[b * P.max_pages_per_seq + i];
    ok = ok && page >= 0 && uint(page) < P.num_pages;
  }
  return ok;
}

// Whether [first, next) are rows of a packed tensor of `total` rows, at most `most` of them.
bool packed_rows_in_range(int first, int next, uint total, uint most) {
  return first >= 0 && next >= first && uint(next) <= total && uint(next - first) <= most;
}

// Entry b's device values are out of range: the status word keeps the lowest such entry.
void report_entry(uint b) { atomicMin(status_word, b); }

// core::SequenceAccess::rows_of. Host buffers: the host checked cu_seqlens and the block table before the upload,
// so every length here lies within [0, q_len] / [0, k_len]. Device buffers (P.device_values): each entry is judged
// by its own values, as on CUDA (docs/numerics.md): queries that cannot be placed give the entry no rows (nothing
// of it is written), keys that cannot be read a key length of -1 (visible_keys: no key, masked rows). Every shader
// takes an entry's rows from here, so the main kernels and the merge pass see the same verdict.
SequenceRows sequence_rows(uint b) {
  SequenceRows s;
  s.queries = int(P.q_len);
  s.first_query = 0;
  if (SEQUENCES != 0 && P.ragged_q != 0u) {
    const int first = cu_seqlens_q[b], next = cu_seqlens_q[b + 1u];
    const bool placed = P.device_values == 0u || packed_rows_in_range(first, next, P.total_q, P.q_len);
    s.first_query = placed ? first : 0;
    s.queries = placed ? next - first : 0;
    if (!placed) report_entry(b);
  }
  s.key_length = P.has_key_lengths != 0u ? key_lengths[b] : int(P.k_len);
  if (P.device_values != 0u && (s.key_length < 0 || s.key_length > int(P.k_len))) report_entry(b);
  s.first_key = 0;
  if (SEQUENCES != 0 && P.ragged_k != 0u) {
    const int first = cu_seqlens_k[b], next = cu_seqlens_k[b + 1u];
    const bool readable = P.device_values == 0u || packed_rows_in_range(first, next, P.total_k, P.k_len);
    s.first_key = readable ? first : 0;
    s.key_length = readable ? next - first : -1;
    if (!readable) report_entry(b);
  }
  if (SEQUENCES != 0 && P.device_values != 0u && P.page_size != 0u && s.key_length >= 0 &&
      s.key_length <= int(P.k_len) && !pages_in_range(b, s.key_length)) {
    s.key_length = -1;
    report_entry(b);
  }
  // Offsets past either end see what the ends see (per-batch offsets from device buffers are clamped here, the
  // scalar one by the host): every bound of visible_keys then stays within [-(q_len + 1), q_len + k_len].
  int64_t offset = int64_t(P.causal_offset);
  if (SEQUENCES != 0 && P.per_sequence_causal != 0u) {
    offset = int64_t(s.key_length) - int64_t(s.queries);  // bottom-right
  }
  if (P.has_offsets != 0u) offset = int64_t(causal_offsets[b]);
  s.causal_offset = int(clamp(offset, -int64_t(P.q_len) - 1, int64_t(P.k_len)));
  return s;
}

// core::SequenceAccess::query_index: element of column 0 of query row i of head h (Q, O, lse: their layouts).
uint query_at(TensorLayout l, SequenceRows s, uint b, uint h, uint i) {
  return SEQUENCES != 0 && P.ragged_q != 0u ? at(l, 0u, h, uint(s.first_query) + i) : at(l, b, h, i);
}
// core::SequenceAccess::key_index: element of column 0 of key row j of K/V head kvh (K, V: their layouts); a
// paged cache's key j is row j % page_size of the page the block table names.
uint key_at(TensorLayout l, SequenceRows s, uint b, uint kvh, uint j) {
  if (SEQUENCES != 0 && P.page_size != 0u) {
    const uint page = uint(block_table[b * P.max_pages_per_seq + j / P.page_size]);
    return at(l, page, kvh, j % P.page_size);
  }
  return SEQUENCES != 0 && P.ragged_k != 0u ? at(l, 0u, kvh, uint(s.first_key) + j) : at(l, b, kvh, j);
}

// core::VisibilityRule::for_row: the keys [begin, end) query `row` of an entry may see.
ivec2 visible_keys(SequenceRows s, uint row) {
  int64_t end = int64_t(s.key_length);
  // A key length outside [0, k_len] (device buffers: the host could not check it) hides the entry's every key.
  if (end < 0 || end > int64_t(P.k_len)) return ivec2(0, 0);
  int64_t begin = 0;
  if (P.causal != 0u) {
    int64_t limit = int64_t(row) + int64_t(s.causal_offset);
    if (limit < end - 1) end = limit + 1;
    if (P.window > 0u) {
      int64_t first = limit + 1 - int64_t(P.window);
      if (first > begin) begin = first;
    }
  }
  if (end < begin) end = begin;
  return ivec2(int(begin), int(end));
}
ivec2 visible_keys(uint b, uint row) { return visible_keys(sequence_rows(b), row); }

// core::ScoreTransform: scale, then softcap.
float transform(float dot) {
  float s = dot * P.scale;
  return P.softcap > 0.0 ? P.softcap * tanh(s / P.softcap) : s;
}

// core::usable_max and core::rescale_factor.
float usable_max(float m) { return m == NEG_INF ? 0.0 : m; }
float rescale_factor(float from, float to) { return from == NEG_INF ? 0.0 : exp(from - usable_max(to)); }

// core::finish_row: x = (acc_scale, lse) of a row state (max, sum, poisoned).
vec2 finish_row(float m, float sum, bool poisoned, uint h) {
  if (poisoned) return vec2(QNAN, QNAN);
  float acc_factor = 1.0;
  if (P.has_sink != 0u) {
    float sink = head_sink[h];
    float mm = m > sink ? m : sink;
    acc_factor = rescale_factor(m, mm);
    sum = sum * acc_factor + exp(sink - mm);
    m = mm;
  }
  if (!(sum > 0.0)) return vec2(P.masked_zero != 0u ? 0.0 : QNAN, NEG_INF);
  return vec2(acc_factor / sum, usable_max(m) + log(sum));
}

// The output of a finished row (a zero scale writes zeros, whatever the accumulator holds).
float finished(float acc, float acc_scale) { return acc_scale == 0.0 ? 0.0 : acc * acc_scale; }
