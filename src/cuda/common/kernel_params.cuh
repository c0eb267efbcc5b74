// What every CUDA attention kernel of attnkit receives, and the device-side helpers they share: element
// loads and stores per dtype, and where a block's rows (head, query) and keys come from.
#pragma once

#include "core/fast_divide.hpp"
#include "core/kv_quant.hpp"
#include "core/online_softmax.hpp"
#include "core/score_transform.hpp"
#include "core/sequences.hpp"
#include "core/visibility.hpp"

#include <attnkit/attention.hpp>

#include "cuda/common/query_rotary.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

namespace attnkit::cuda {

struct DeviceLayout {
  std::int64_t offset, batch_stride, head_stride, row_stride;
  // In range by the checks (core::normalize_and_check / check_args, docs/safety.md): for every (b, h, r) of a
  // checked problem each term and partial sum is at most the layout's highest index, below the buffer's element
  // count, and index * element size fits a pointer difference.
  __host__ __device__ std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return offset + b * batch_stride + h * head_stride + r * row_stride;
  }
};

inline DeviceLayout to_device(const Layout& l) { return {l.offset, l.batch_stride, l.head_stride, l.row_stride}; }

// Everything a launch needs, by value. Rows of a block are (query, head-in-group) pairs of one K/V head (row_of),
// so the query heads of a group share every K/V tile.
//
// The fields are in the order the kernels first read them. A block's first read of each 64-byte line of the
// parameters misses the constant cache and stalls the warp (about a thousand cycles in all when they were
// spread over ten lines): the block coordinate's fields come first, then the plain builds' pointers, layouts and
// finish, in about six lines, then what only the general builds read.
struct KernelParams {
  // (flags first: a one-byte field between wider ones pads, and pads move every later field)
  bool cluster_merge;  // split-K merged in thread-block clusters of `splits` blocks (CudaPlan::cluster_merge;
                       // cluster_merge.cuh): `partial` is not used
  bool fast_coords;    // blocks and rows below 2^31: block_coord and row_of divide by `div`
  bool heavy_first;    // a causal rule: row blocks in descending order of their keys (block_coord)
  bool plain;          // the plan's choice of the tile kernels' plain build (CudaPlan::plain); runs_plain checks the rest
  bool three_per_sm;   // the wgmma kernel's build of three 64-row blocks per SM (CudaPlan::three_per_sm)
  bool return_lse;
  bool has_sink;
  bool q_by_tma;  // the wgmma kernel's plain build: Q by TMA (WarpgroupMaps::q_by_tma, copied here by its launch)
  bool kv_copies;  // the wgmma kernel: K/V tiles by its producer warpgroup's 16-byte copies (CudaPlan::kv_copies)
  // The mma.sync kernel loads Q, K and V element by element: some row does not start on 16 bytes, or a dim is not
  // a multiple of 8 (the 16-byte chunk copies need both). Never in a plain build.
  bool element_loads;
  // The kernel's head-dim bucket is wider than a real dim (config/tile_table.hpp): columns past head_dim /
  // v_head_dim are zero on load and not stored. False: the bucket is the real dims, and the kernels read neither
  // (they sit in the general builds' lines of these parameters).
  bool bucketed;
  bool narrow;  // the wgmma kernel's narrow build of the dims (CudaPlan::narrow, warpgroup_widths)
  // Key lengths or ragged / paged sequences (has_key_lengths || has_sequences, whose line the plain builds do not
  // read otherwise): where a plain decode split's pieces may end before their range (plain_key_end).
  bool keys_end_per_entry;
  MaskedRows masked_rows;
  // Work-budget cut: this launch runs blocks [first_block, block_end). Each of its gridDim.x blocks runs block
  // first_block + blockIdx.x and, in a persistent grid (the wgmma kernel's plain build of three per SM, fewer
  // blocks than work), every gridDim.x-th after it.
  std::int64_t first_block, block_end;
  // A split tail (CudaPlan::tail_pieces > 1; the wgmma kernel's plain build): whole blocks up to block
  // tail_block, then each later row block as tail_pieces blocks over key ranges of tail_piece_keys, which leave
  // their partials in `partial` (tail pieces only) for the merge pass (plain_block_coord).
  std::int64_t tail_block, tail_pieces, tail_piece_keys;
  std::int64_t k_len, split_keys, group, group_rows;
  // Blocks and rows below 2^31 (any launch that fits in memory): block_coord and row_of divide by these instead
  // of 64-bit divisions, which were a large share of a short sequence's block prologue. (The heavy-first
  // order's, which no plain build reads, are heavy_div, further down.)
  struct Divisors {
    core::FastDivide splits, row_blocks, kv_heads, group, tail_pieces;
  } div;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  DeviceLayout lq, lk, lv, lo;
  core::ScoreTransform transform;
  float* lse;
  float* partial;  // split-K: [block][row][3 + v_head_dim] (max, sum, poison, accumulator)
  const float* sinks;  // (the shared finish loads the pointer whether or not a sink is there)
  DeviceLayout llse;
  // What only the general builds read.
  const void* mask;  // mask_dtype elements
  const std::int32_t* key_lengths;
  const std::int32_t* causal_offsets;  // per batch entry, or null
  DeviceLayout lmask;
  std::int64_t batch, heads, kv_heads, q_len, head_dim, v_head_dim;
  std::int64_t row_blocks, splits;
  std::int64_t heavy_group;  // heavy-first: (batch, K/V head) pairs ordered together, whose K/V fit in L2
  struct HeavyDivisors {
    core::FastDivide blocks, pairs, last_pairs;  // heavy_group x row_blocks, heavy_group, the last group's pairs
  } heavy_div;
  // Quantized K / V (kv_quant.hpp): stored int8 or int4 values, dequantized with k_scale / v_scale.
  KvType k_type, v_type;
  KvQuant k_quant, v_quant;
  const float* k_scale;
  const float* v_scale;
  DType mask_dtype;
  core::VisibilityRule rule;
  bool has_mask, has_key_lengths;
  // The launch reads Q, K and V only after the stream's previous kernel has finished (no programmatic overlap):
  // the wgmma kernel may start its first copies before its row setup (their latency passes under it). (The
  // mma.sync kernel gained nothing from it: its one- and two-tile blocks ran 0.1-0.3 us slower on the H200.)
  bool inputs_ready;
  // The launch may start while an unknown kernel before it in the stream runs (a programmatic dependent launch of
  // a plain attention call): the kernel waits for it before its first read of global memory (inputs_ready holds
  // then for everything after).
  bool wait_first;
  QueryRotary rotary;  // cos null: none (only the wgmma kernel applies it; the plan's caller checks rotates_query)
  // Ragged or paged sequences (AttentionProblem::sequences; only the SIMT and mma.sync kernels' general builds
  // take them): a batch entry's rows come from entry_rows, query_row_index and key_index. The arrays are device
  // memory, never read on the host; check_sequences_kernel records, per entry, which of them are out of range
  // (entry_faults, in the scratch), before any kernel that reads them.
  bool has_sequences;
  core::SequenceAccess seq;
  std::int64_t total_q, total_k, num_pages;
  const std::int32_t* entry_faults;
  // (Host only.) The blocks an SM holds at once times the SMs, where the launch may run a persistent grid of that
  // many blocks (CudaPlan::three_per_sm); 0: one block per unit of work.
  std::int64_t persistent_places;
};

// A rotary pair (a, b) -> (a cos - b sin, b cos + a sin), each product rounded on its own (no FMA
// contraction), as the CPU's rotary unit computes it.
__device__ __forceinline__ float rotate_first(float a, float b, float c, float s) {
  return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
__device__ __forceinline__ float rotate_second(float a, float b, float c, float s) {
  return __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__host__ __device__ __forceinline__ std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ std::int64_t max64(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Element `index` of the additive mask, as float (the mask may be float32, float16 or bfloat16).
__device__ __forceinline__ float load_mask(const KernelParams& p, std::int64_t index) {
  switch (p.mask_dtype) {
    case DType::f16: return __half2float(static_cast<const __half*>(p.mask)[index]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p.mask)[index]);
    case DType::f32: break;
  }
  return static_cast<const float*>(p.mask)[index];
}

// Value d of a K or V row that starts at value index `row`: a float element of type T, or a stored int8 / int4
// value times its scale (one float product, as every reader of a quantized cache computes it).
template <class T>
__device__ __forceinline__ float load_kv_value(const void* base, KvType type, KvQuant quant, const float* scales,
                                               std::int64_t kv_head, std::int64_t dim, std::int64_t row,
                                               std::int64_t d) {
  switch (type) {
    case KvType::Int8:
      return core::dequantize_value(static_cast<const std::int8_t*>(base)[row + d],
                                    core::kv_scale_at(scales, quant, kv_head, dim, d));
    case KvType::Int4:
      return core::dequantize_value(core::int4_at(static_cast<const std::uint8_t*>(base), row + d),
                                    core::kv_scale_at(scales, quant, kv_head, dim, d));
    case KvType::Float: break;
  }
  return to_float(static_cast<const T*>(base)[row + d]);
}

// The int4 storage type of kernel templates (two values per byte; int8 storage is std::int8_t).
struct Int4Tag {};

// int8 -> float without the slow integer-convert unit: a biased byte placed in the low mantissa of 2^23 is
// 2^23 + (q + 128) exactly; one subtraction leaves q.
__device__ __forceinline__ void widen_int8x4(std::uint32_t word, float* out) {
  const std::uint32_t biased = word ^ 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[i] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u + i)) - 8388736.0f;  // 2^23 + 128
  }
}
// Eight int4 values of a word (value 2i in the low nibble of byte i), stored +8: 2^23 + nibble, minus 2^23 + 8.
__device__ __forceinline__ void widen_int4x8(std::uint32_t word, float* out) {
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __uint_as_float(0x4B000000u | ((word >> (4 * i)) & 0xFu)) - 8388616.0f;
}

// 2^x on the special-function unit (relative error ~2^-22, far below float16/bfloat16 rounding); exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16-byte copy global -> shared; `valid` false writes zeros (keys past the tile, padded rows).
__device__ __forceinline__ void cp_async16_at(std::uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(valid ? gmem : nullptr),
               "r"(src_size));
}
// The same at a shared-space address, `gmem` passed as it is: with `valid` false nothing is read from it (a source
// size of 0), so an address past the tensor's rows needs no select (registers of a 24-register producer).
__device__ __forceinline__ void cp_async16_zero_fill(std::uint32_t smem_addr, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_at(static_cast<std::uint32_t>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// Programmatic dependent launch (sm_90): a kernel launched with the stream-serialization attribute
// (launch_kernel's `overlap`) may start while the kernel before it in the stream still runs, and calls
// wait_for_prior_grids() before it reads anything that kernel writes; a kernel calls allow_dependent_grids() to
// let the next one start early (it launches once every block of this one has called it or exited). Without the
// attribute, or before sm_90, both are no-ops.
__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Decodes a block index into (batch, K/V head, row block, key range).
struct BlockCoord {
  std::int64_t b, kvh, row_block, split;
  std::int64_t key_begin, key_end;
};

// Row `pair` of a K/V head's rows: query pair / group, head-in-group pair % group. Query-major, so that a row
// block is a run of consecutive queries (all heads of the group) and, under a causal rule, a later row block
// never sees fewer keys than an earlier one (block_coord's heavy-first order relies on it).
struct RowOf {
  int head, query;
};
__host__ __device__ __forceinline__ RowOf row_of(const KernelParams& p, std::int64_t kvh, std::int64_t pair) {
  if (p.fast_coords) {
    const auto n = static_cast<std::uint32_t>(pair);
    const std::uint32_t query = p.div.group.quotient(n);
    return {static_cast<int>(kvh * p.group + p.div.group.remainder(n, query)), static_cast<int>(query)};
  }
  return {static_cast<int>(kvh * p.group + pair % p.group), static_cast<int>(pair / p.group)};
}

// Blocks run about in index order, a new one wherever one ends. Row blocks of one (batch, K/V head) do equal work
// unless the rule is causal: then the last row block sees all keys and the first a few, and with the row block
// varying fastest the GPU ends on whichever long blocks started last. Heavy-first orders (batch, K/V head) pairs
// in groups of heavy_group, and within a group the row block slowest, in descending order: the longest blocks
// start first and the short ones fill the gaps at the end. The group bounds the K/V that blocks in flight read
// at once to part of L2 (all 64 pairs of a 4k causal prompt at once ran 7% slower than index order, groups of 4
// or 5 pairs 2-3% faster: cuda_backend.cu sets the group). Either way the split varies fastest. Below 2^31 blocks
// (fast_coords: every launch that fits a GPU's memory but the most contrived) the divisions are FastDivide's; the
// 64-bit path computes the same coordinates.
__host__ __device__ __forceinline__ BlockCoord block_coord(const KernelParams& p, std::int64_t block) {
  BlockCoord c;
  if (p.fast_coords) {
    const auto index = static_cast<std::uint32_t>(block);
    const std::uint32_t n = p.div.splits.quotient(index);
    c.split = p.div.splits.remainder(index, n);
    std::uint32_t pair;
    if (p.heavy_first) {
      const std::uint32_t group = p.heavy_div.blocks.quotient(n);
      const std::uint32_t in_group = p.heavy_div.blocks.remainder(n, group);
      const std::uint32_t first_pair = group * p.heavy_div.pairs.divisor;
      // The last group may hold fewer pairs.
      const core::FastDivide& pairs =
          first_pair + p.heavy_div.pairs.divisor <= p.batch * p.kv_heads ? p.heavy_div.pairs : p.heavy_div.last_pairs;
      const std::uint32_t from_last = pairs.quotient(in_group);
      pair = first_pair + pairs.remainder(in_group, from_last);
      c.row_block = p.row_blocks - 1 - from_last;
    } else {
      pair = p.div.row_blocks.quotient(n);
      c.row_block = p.div.row_blocks.remainder(n, pair);
    }
    const std::uint32_t b = p.div.kv_heads.quotient(pair);
    c.kvh = p.div.kv_heads.remainder(pair, b);
    c.b = b;
  } else {
    c.split = block % p.splits;
    block /= p.splits;
    if (p.heavy_first) {
      const std::int64_t group_blocks = p.heavy_group * p.row_blocks;
      const std::int64_t first_pair = block / group_blocks * p.heavy_group;
      const std::int64_t in_group = block % group_blocks;
      const std::int64_t pairs = min64(p.heavy_group, p.batch * p.kv_heads - first_pair);
      const std::int64_t pair = first_pair + in_group % pairs;
      c.row_block = p.row_blocks - 1 - in_group / pairs;
      c.kvh = pair % p.kv_heads;
      c.b = pair / p.kv_heads;
    } else {
      c.row_block = block % p.row_blocks;
      block /= p.row_blocks;
      c.kvh = block % p.kv_heads;
      c.b = block / p.kv_heads;
    }
  }
  c.key_begin = c.split * p.split_keys;
  c.key_end = min64(p.k_len, c.key_begin + p.split_keys);
  return c;
}

// The host's half of block_coord: the order (heavy_first, in groups of heavy_group pairs) and, below 2^31 blocks
// and rows, the divisors. Reads the shape fields of k (batch, kv_heads, group, group_rows, row_blocks, splits).
inline void set_block_order(KernelParams& k, bool heavy_first, std::int64_t heavy_group) {
  const std::int64_t pairs = k.batch * k.kv_heads;
  k.heavy_first = heavy_first;
  k.heavy_group = heavy_first ? (heavy_group < 1 ? 1 : min64(heavy_group, max64(pairs, 1))) : 0;
  constexpr std::int64_t kFast = std::int64_t{1} << 31;
  const std::int64_t blocks = max64(pairs * k.row_blocks, 1) * max64(k.splits, 1);
  k.fast_coords = blocks < kFast && k.group_rows < kFast && k.group < kFast;
  if (!k.fast_coords) return;
  const auto divide_by = [](std::int64_t d) { return core::FastDivide(static_cast<std::uint32_t>(max64(d, 1))); };
  k.div.splits = divide_by(k.splits);
  k.div.row_blocks = divide_by(k.row_blocks);
  k.div.kv_heads = divide_by(k.kv_heads);
  k.div.group = divide_by(k.group);
  k.div.tail_pieces = divide_by(k.tail_pieces);
  if (k.heavy_first) {
    k.heavy_div.blocks = divide_by(k.heavy_group * k.row_blocks);
    k.heavy_div.pairs = divide_by(k.heavy_group);
    k.heavy_div.last_pairs = divide_by(pairs % k.heavy_group == 0 ? k.heavy_group : pairs % k.heavy_group);
  }
}

// Whether a launch's scale is left to the exponent (transform_scores, softmax_exponentials): no softcap and no mask act on the scaled
// score, and a positive finite scale keeps the order of the scores, so the row maxima of the raw scores times the
// scale are those of the scaled scores. One multiply per score fewer, on a short block's critical path.
__host__ __device__ __forceinline__ bool folds_scale(const KernelParams& p) {
  return p.transform.softcap == 0.0f && !p.has_mask && p.transform.scale > 0.0f &&
         p.transform.scale <= FLT_MAX;
}

// Every row sees every key of [0, k_len) and the scale goes to the exponent (folds_scale): the scores need no
// test but the keys' end, as in the plain build (scale_plain_scores). The wgmma kernel's plain build of three
// blocks per SM takes only such problems.
__host__ __device__ __forceinline__ bool sees_keys_as_plain(const KernelParams& p) {
  return folds_scale(p) && !p.has_sequences && !p.has_key_lengths && p.rule.sees_every_key(p.k_len) && p.causal_offsets == nullptr &&
         p.splits == 1;
}

// No mask, no softcap, the scale in the exponent (folds_scale), one batch layout and no key split: what a row
// sees is its row table's key range alone (a causal rule, a window, key lengths, causal offsets), so the scores
// need only hide_unseen_keys. The wgmma kernel's general build of three blocks per SM takes these.
__host__ __device__ __forceinline__ bool sees_keys_by_rule_only(const KernelParams& p) {
  return folds_scale(p) && !p.has_sequences && p.splits == 1;
}

// Whether every row sees every key of its entry (up to its key length): no causal rule hides one. With sequences
// the causal rule is each sequence's, bottom-right: there a single query sees every key of its entry.
__host__ __device__ __forceinline__ bool rows_see_every_key(const KernelParams& p) {
  if (p.has_sequences && p.seq.per_sequence_causal) return !p.rule.causal || (p.q_len == 1 && p.rule.window == 0);
  return p.rule.sees_every_key(p.k_len);
}

// A plain problem: a scale left to the exponent (folds_scale); no mask, key lengths, sink, softcap, causal rule
// that hides a key, rotary, quantized cache or key split (but a split tail, and a split merged in clusters), every
// output row on 16 bytes, and the launch's inputs ready at its start. The tile kernels have a build for it with
// none of those compiled in (their `kPlain`): the encoder layers of BERT, MiniLM or Whisper and Whisper's decoder
// steps, whose short blocks run each instruction of their path about once. The plan chooses it (CudaPlan::plain,
// for short key ranges); this re-checks what only the launch knows, and the rest.
inline bool runs_plain(const KernelParams& p) {
  // Output rows on 16 bytes (the wgmma kernel's plain finish writes 16-byte chunks; one rule for both kernels).
  const bool chunks = reinterpret_cast<std::uintptr_t>(p.o) % 16 == 0 && p.lo.offset % 8 == 0 &&
                      p.lo.batch_stride % 8 == 0 && p.lo.head_stride % 8 == 0 && p.lo.row_stride % 8 == 0;
  // Key lengths and a paged cache (dense queries) only where every block is a piece of a split tail (a decode
  // step's key split, which only the wgmma kernel's plan makes): each piece's range ends at its entry's length
  // (plain_key_end), and the merge pass, not the plain finish, writes the rows, masked ones included.
  const bool all_pieces = p.tail_pieces > 1 && p.tail_block == 0;
  const bool paged_only = p.has_sequences && p.seq.paged() && !p.seq.ragged_q && !p.seq.ragged_k;
  const bool entries_ok = (!p.has_key_lengths && !p.has_sequences) || (all_pieces && (!p.has_sequences || paged_only));
  return p.plain && chunks && !p.element_loads && !p.has_mask && entries_ok && !p.has_sink && p.transform.softcap == 0.0f &&
         rows_see_every_key(p) && p.causal_offsets == nullptr && p.rotary.cos == nullptr &&
         p.k_type == KvType::Float && p.v_type == KvType::Float &&
         (p.partial == nullptr || p.tail_pieces > 1 || p.cluster_merge) && (p.splits == 1 || p.cluster_merge) &&
         p.inputs_ready && p.fast_coords && !p.heavy_first && folds_scale(p);
}

// Whether `block` of a plain launch is a piece of a split tail row block (it leaves a partial).
__host__ __device__ __forceinline__ bool is_tail_piece(const KernelParams& p, std::int64_t block) {
  return p.tail_pieces > 1 && block >= p.tail_block;
}

// block_coord of a plain problem (index order, fast_coords): one key range, or a piece of a split tail row block
// (its piece varies fastest).
__host__ __device__ __forceinline__ BlockCoord plain_block_coord(const KernelParams& p, std::int64_t block) {
  BlockCoord c;
  auto index = static_cast<std::uint32_t>(block);
  c.split = 0;
  c.key_begin = 0;
  c.key_end = p.k_len;
  if (p.cluster_merge) {  // (a split merged in clusters: ranges of split_keys, the split fastest)
    const std::uint32_t n = p.div.splits.quotient(index);
    c.split = p.div.splits.remainder(index, n);
    index = n;
    c.key_begin = c.split * p.split_keys;
    c.key_end = min64(p.k_len, c.key_begin + p.split_keys);
  } else if (is_tail_piece(p, block)) {
    const auto in_tail = static_cast<std::uint32_t>(block - p.tail_block);
    const std::uint32_t n = p.div.tail_pieces.quotient(in_tail);
    c.split = p.div.tail_pieces.remainder(in_tail, n);
    index = static_cast<std::uint32_t>(p.tail_block) + n;
    c.key_begin = c.split * p.tail_piece_keys;
    c.key_end = min64(p.k_len, c.key_begin + p.tail_piece_keys);
  }
  const std::uint32_t pair = p.div.row_blocks.quotient(index);
  c.row_block = p.div.row_blocks.remainder(index, pair);
  const std::uint32_t b = p.div.kv_heads.quotient(pair);
  c.kvh = p.div.kv_heads.remainder(pair, b);
  c.b = b;
  return c;
}

// Batch entry b's key length. The lengths live on the device and are not checked on the host: one outside
// [0, k_len] hides every key (the row's keys are then [0, 0): masked rows; the run's check reports the entry).
__device__ __forceinline__ std::int64_t key_length_of(const KernelParams& p, std::int64_t b) {
  if (!p.has_key_lengths) return p.k_len;
  const std::int32_t n = p.key_lengths[b];
  return n >= 0 && n <= p.k_len ? n : 0;
}

// What check_sequences_kernel records of a batch entry (entry_faults): its query rows cannot be placed
// (cu_seqlens_q out of range: none of its rows is written), or its keys cannot be read (cu_seqlens_k, its key
// length or a block-table entry its keys reach out of range: every row of it is a masked row).
inline constexpr std::int32_t kQueriesOutOfRange = 1;
inline constexpr std::int32_t kKeysOutOfRange = 2;

// Batch entry b's query count, key length and visibility rule (and, for sequences, where its rows start).
__device__ __forceinline__ core::SequenceRows entry_rows(const KernelParams& p, std::int64_t b) {
  core::SequenceRows e;
  if (!p.has_sequences) {
    e.queries = p.q_len;
    e.key_length = key_length_of(p, b);
    e.rule = p.rule.for_batch(p.causal_offsets, b);
    return e;
  }
  e = p.seq.rows_of(b);
  const std::int32_t faults = p.entry_faults[b];
  if (faults & kQueriesOutOfRange) e.queries = 0;
  if (faults & kKeysOutOfRange) e.key_length = 0;
  return e;
}

// The end of a plain block's key range: a decode split's piece ends at its entry's device key length (a paged
// cache's: entry_rows, which hides an entry whose arrays are out of range), then it may hold no key; every other
// plain block at the range plain_block_coord gave.
__device__ __forceinline__ std::int64_t plain_key_end(const KernelParams& p, const BlockCoord& c) {
  if (!p.keys_end_per_entry) return c.key_end;
  if (p.has_sequences) return min64(c.key_end, entry_rows(p, c.b).key_length);
  return p.has_key_lengths ? min64(c.key_end, key_length_of(p, c.b)) : c.key_end;
}

// The rows of a block that exist: row block `first_row` of an entry with e.queries queries (0 past its end).
__device__ __forceinline__ int block_rows(const KernelParams& p, const core::SequenceRows& e, std::int64_t first_row,
                                          int block_rows_most) {
  const std::int64_t rows = p.has_sequences ? p.group * e.queries : p.group_rows;
  return static_cast<int>(max64(0, min64(block_rows_most, rows - first_row)));
}

// Element index of column 0 of query row i of head h of batch entry b in Q, O or lse (layout l).
__device__ __forceinline__ std::int64_t query_row_index(const KernelParams& p, const DeviceLayout& l, std::int64_t b,
                                                        std::int64_t h, std::int64_t i) {
  if (p.has_sequences && p.seq.ragged_q) return l.index(0, h, p.seq.cu_seqlens_q[b] + i);
  return l.index(b, h, i);
}

// Where key j of batch entry b, K/V head kvh is in K or V (layout l), as a value index. Dense and ragged keys:
// key_row_base + j * row_stride. Paged keys: a block-table lookup per key (paged_key_index; everything it reads
// comes from the parameters, so that it holds no registers over a kernel's key loop).
__device__ __forceinline__ std::int64_t key_row_base(const KernelParams& p, const DeviceLayout& l,
                                                     const core::SequenceRows& e, std::int64_t b, std::int64_t kvh) {
  return p.has_sequences && p.seq.ragged_k ? l.index(0, kvh, e.first_key) : l.index(b, kvh, 0);
}
__device__ __forceinline__ bool pages_keys(const KernelParams& p) { return p.has_sequences && p.seq.paged(); }
// Key j's page (its block-table column) and row in the page.
struct PageRow {
  int column, row;
};
__device__ __forceinline__ PageRow page_row_of(const KernelParams& p, int j) {
  const int page_size = static_cast<int>(p.seq.page_size);
  const int column = j / page_size;
  return {column, j - column * page_size};
}
// Value index of row `row` of page `page` of K/V head kvh.
__device__ __forceinline__ std::int64_t page_row_index(const DeviceLayout& l, std::int64_t page, std::int64_t kvh,
                                                       std::int64_t row) {
  return l.offset + page * l.batch_stride + kvh * l.head_stride + row * l.row_stride;
}
__device__ __forceinline__ std::int64_t paged_key_index(const KernelParams& p, const DeviceLayout& l, std::int64_t b,
                                                        std::int64_t kvh, std::int64_t key) {
  const int j = static_cast<int>(key);  // (key ranges fit in int)
  const int page_size = static_cast<int>(p.seq.page_size);
  const std::int64_t page = p.seq.block_table[b * p.seq.max_pages_per_seq + j / page_size];
  return l.offset + page * l.batch_stride + kvh * l.head_stride + (j % page_size) * l.row_stride;
}
__device__ __forceinline__ std::int64_t key_index(const KernelParams& p, const DeviceLayout& l,
                                                  const core::SequenceRows& e, std::int64_t b, std::int64_t kvh,
                                                  std::int64_t key) {
  return pages_keys(p) ? paged_key_index(p, l, b, kvh, key) : key_row_base(p, l, e, b, kvh) + key * l.row_stride;
}

// Writes a finished row (or its split-K partial) from an unnormalised accumulator element.
// The split-K merges (the merge pass, split_merge.cu, and the cluster merge, cluster_merge.cuh) fold a row's
// partials (max m_k, sum s_k, accumulator x_k) in two steps, the same operations in both so that they give the
// same bits: M = the largest m_k, then, in range order, sum += s_k w_k and acc += x_k w_k with w_k = exp(m_k - M)
// (core::rescale_factor). The weights do not depend on each other: one exponential per range, all at once, where a
// running merge (core::merge_weights) chains two per range. The largest of a warp's values (exact in any order):
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int lanes = 16; lanes >= 1; lanes /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, lanes));
  return x;
}
// One term of the weighted sums, rounded once (no contraction choice left to the compiler).
__device__ __forceinline__ float add_weighted(float total, float x, float w) { return __fmaf_rn(x, w, total); }

__device__ __forceinline__ float finished_value(const core::RowFinish& fin, float acc) {
  return fin.acc_scale == 0.0f ? 0.0f : acc * fin.acc_scale;
}

}  // namespace attnkit::cuda
