// The CUDA plan's policy: which kernel runs a problem, its grid, its key split and its scratch, from the problem
// and what the device holds (DeviceTraits) only. Host code without a CUDA call, so that it also runs, and is
// tested, on a machine without a GPU (tests/cuda/plan_test.cu); the backend fills the traits from the current
// device (cuda_backend.cu).
#include "cuda/plan/cuda_plan.hpp"
#include "cuda/host/kernel_launchers.hpp"

#include "core/checked_int.hpp"
#include "core/work_rounds.hpp"
#include "cuda/config/tile_table.hpp"

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <string>

namespace attnkit::cuda {

namespace {

constexpr std::int64_t kRowBlock = 64;
constexpr std::int64_t kSplitGranule = 64;   // the shortest key range of a split (split_granule)
constexpr std::int64_t kMinSplitKeys = 256;  // shorter ranges cost more in the merge than they gain
// Many-row shapes (prefill) on tensor cores split a key range only when it is long: the partials of every row
// are written and merged. On the H200 a 512-key BERT layer ran 13.1 us whole and 22.5 us in two ranges with 96
// blocks (mma.sync), 12.1 and 23.4 us with 48 (wgmma), bench/sweep_cuda.py. The SIMT kernel (float32), slower
// per block, still gains from the split there (132 against 199 us).
constexpr std::int64_t kMinTileSplitKeys = 2048;
constexpr std::int64_t kMaxSplits = 64;
// A decode step with device key lengths on the plain build: its split's rounds of blocks, and the fewest keys
// of a range per row of a block (the merge's partials)
constexpr std::int64_t kLengthRounds = 8;
constexpr std::int64_t kLengthRowKeys = 64;
constexpr std::int64_t kFloatDecodeRows = 8;       // rows per K/V head up to which a float cache decodes
constexpr std::int64_t kQuantizedDecodeRows = 64;  // likewise for a quantized cache
// Rows per K/V head up to which a long cache is streamed as a decode step on the wgmma kernel: one consumer
// warpgroup's 64 rows (a Llama decode step's 4, multi-query decode's 32 query heads on one K/V head, a short
// speculative chunk), each K/V tile read once for all of them, the key split chosen to fill the SMs
// (core::split_for_soonest_finish).
constexpr std::int64_t kStreamRows = 64;
// A cache is long enough for that when the whole step holds at least kStreamKeysPerSm keys per SM, when each K/V
// head has kLongCacheKeys keys (the mma.sync kernel's cluster merge caps its split at 16 ranges, each then a long
// chain of two-stage cp.async tiles), or when each has kStreamMinKeys and the step reads kStreamBytesPerSm of K and
// V per SM. On the H200 (bfloat16, bench/results/2026-12-02-h200-decode-stream-threshold.md): 16 x 32 heads on one
// K/V head over 16k keys 77.0 -> 46.4 us, 2 x 32 on one over 8k 20.0 -> 14.0, 1 x 32 on 32 over 4k 40.0 -> 28.2;
// while 1 x 32 on 8 over 4k stays (13.2 on mma.sync against 16.7) and 8 x 16 heads of 64 over 2k too (22.7
// against 24.7).
constexpr std::int64_t kStreamKeysPerSm = 4096;
constexpr std::int64_t kLongCacheKeys = 8192;
constexpr std::int64_t kStreamMinKeys = 4096;
constexpr std::int64_t kStreamBytesPerSm = 256 * 1024;
// Keys from which a decode step of a group that does not divide the wgmma kernel's rows takes that kernel (below).
constexpr std::int64_t kOddGroupDecodeKeys = 2048;

// Whether a step's K and V are a long stream (above): the work is reading them.
bool long_cache_stream(const AttentionProblem& p, std::int64_t sms) {
  const std::int64_t keys = p.batch * p.kv_heads * p.k_len;
  const std::int64_t bytes = keys * (p.head_dim + p.v_head_dim) * static_cast<std::int64_t>(dtype_size(p.dtype));
  return keys >= sms * kStreamKeysPerSm || p.k_len >= kLongCacheKeys ||
         (p.k_len >= kStreamMinKeys && bytes >= sms * kStreamBytesPerSm);
}
// Key ranges up to which a plain problem runs the tile kernels' plain build. A one-tile block of it ran 16-18%
// faster on the H200 (BERT and MiniLM at 128 tokens), 512 keys 7-9%, Whisper's 1500 5%; at 4096 keys the
// general build was 1% faster (bench/results/2026-11-30-h200-cuda-plain-build.md).
constexpr std::int64_t kPlainMaxKeys = 2048;

// A split tail's ranges hold at least this many of the wgmma kernel's 128-key tiles (a block's prologue and its
// partial cost about one tile), and a tail is split only where the whole row blocks run at least this many.
constexpr std::int64_t kTailPieceTiles = 2;
constexpr std::int64_t kTailMinTiles = 4;

using core::ceil_div;

// Whether a grid of `blocks` blocks (no split) of prefill-sized rows is small enough and its key range long enough
// for the plan to split the keys across the SMs (plan_for). The SIMT kernel, slow per block, splits shorter ranges.
bool prefill_split_applies(const AttentionProblem& p, std::int64_t blocks, std::int64_t sms, bool simt) {
  return blocks > 0 && blocks < 2 * sms && p.k_len >= 2 * kMinSplitKeys &&
         (simt || p.k_len >= 2 * kMinTileSplitKeys || (2 * blocks <= sms && p.k_len >= kMinTileSplitKeys));
}

// A step of at most two row blocks per K/V head (a verify step or a short chunk of one sequence, a decode step with
// many query heads on few K/V heads) on a grid of a quarter of the SMs or fewer splits shorter key ranges than
// prefill_split_applies: each block would otherwise read its whole range alone while most SMs idle. On the H100
// (bench/results/2026-12-07-h100-random-calls.md): 16 blocks of 64 rows over 1,024 keys 39.6 -> 15.8 us in 4
// ranges, 2 blocks over 1,088 keys (head dim 256) 95.7 -> 40.2, 71 query heads on one K/V head over 1,000 keys
// 31.7 -> 16.1 in 4. (Prefill-sized rows keep the longer ranges: their merge reads every row's partials.)
bool tiny_grid_split_applies(const AttentionProblem& p, std::int64_t group_rows, std::int64_t blocks,
                             std::int64_t sms) {
  return blocks > 0 && group_rows <= 2 * kRowBlock && 4 * blocks <= sms && p.k_len >= 2 * kMinSplitKeys;
}

// Keys per range of a key split: whole tiles of the kernel that runs it (a range of 4.5 tiles costs what 5 do), and
// at least kSplitGranule (every range a multiple of every kernel's tile, so that any kernel can run a plan's split).
std::int64_t split_granule(const CudaPlan& plan, const AttentionProblem& p) {
  std::int64_t tile = kSplitGranule;
  if (plan.kernel == CudaPlan::Kernel::Warpgroup) {
    tile = warpgroup_tile_keys(warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim)));
  } else if (plan.kernel == CudaPlan::Kernel::TensorCore) {
    tile = mma_tile_keys(mma_bucket(p.head_dim, p.v_head_dim));
  }
  return std::max(tile, kSplitGranule);
}

// The tensor-core kernel copies rows in 16-byte chunks: every row of Q, K and V must start on 16 bytes.
bool layout_aligned16(const Layout& l) {
  constexpr std::int64_t kElems = 8;  // 16 bytes of a 2-byte type
  return l.offset % kElems == 0 && l.batch_stride % kElems == 0 && l.head_stride % kElems == 0 &&
         l.row_stride % kElems == 0;
}
// The decode kernel reads a lane's 16 values of a row with 16-byte (int4: 8-byte) loads.
bool decode_aligned(const Layout& l, KvType type, DType dtype) {
  const std::int64_t m = decode_value_alignment(type, dtype);
  return l.offset % m == 0 && l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
}

// The tensor-core kernel copies rows in 16-byte chunks (of the element type, or of int8 / int4 values).
bool mma_aligned(const Layout& l, KvType type) {
  if (type == KvType::Float) return layout_aligned16(l);
  const std::int64_t m = type == KvType::Int8 ? 16 : 32;
  return l.offset % m == 0 && l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
}

// Whether the visibility rule hides no key of [0, k_len) from any row (a causal rule may hide nothing: a
// decoder step's query).
bool rule_hides_no_key(const AttentionProblem& p) {
  // (sequences: each sequence's causal rule, bottom-right, under which a single query sees all of its keys)
  if (p.sequences.any()) return !p.has_causal_offsets && (!p.causal || (p.q_len == 1 && p.window.value_or(0) == 0));
  return core::VisibilityRule{p.causal, *p.causal_offset, p.window.value_or(0)}.sees_every_key(p.k_len) &&
         !p.has_causal_offsets;
}

// Whether the wgmma kernel takes K and V by its producer warpgroup's 16-byte copies (KernelParams::kv_copies)
// rather than TMA. TMA streams rows that are not whole 32-byte sectors slowly, 80-byte rows (head dim 40) most;
// the copies are slower wherever TMA is not (whole sectors, wider rows, the 128 bucket's one block per SM), so
// they are for the 64 bucket with K and V rows both off whole sectors and at most 80 bytes
// (bench/results/2026-12-02-h200-wgmma-kv-copies.md). Ragged and paged K/V keep TMA (their tiles are boxes of the
// entry's rows or pages), and so does a quantized cache (its raw ring); `off=kv-tma` / `off=kv-copies` force
// either way (tests, benchmarks).
bool kv_rows_want_copies(const AttentionProblem& p, const PlanOverrides& o) {
  if (p.sequences.any() || p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float) return false;
  if (o.is_off("kv-tma")) return true;
  if (o.is_off("kv-copies")) return false;
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.dtype));
  const auto slow_rows = [&](const Layout& l, std::int64_t dim) {
    const bool sectors = dim * elem % 32 == 0 && l.offset * elem % 32 == 0 && l.row_stride * elem % 32 == 0 &&
                         l.head_stride * elem % 32 == 0 && l.batch_stride * elem % 32 == 0;
    return !sectors && dim * elem <= 80;
  };
  return warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim)) == 64 && slow_rows(p.k, p.head_dim) &&
         slow_rows(p.v, p.v_head_dim);
}

// Whether the problem's key ranges, however long, have the plain build's shape (a split tail's pieces, which may
// end at a device key length and read a paged cache with dense queries: plain_key_end).
bool plain_split_shape(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  const bool paged_only = s.paged() && !s.ragged_q && !s.ragged_k;
  // Every output row starts on 16 bytes (the plain finish writes 16-byte chunks; the run checks the base pointer).
  const bool output_chunks = layout_aligned16(p.o);
  const bool quantized = p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float;
  return (!s.any() || paged_only) && p.head_dim <= 128 && !p.has_mask && !p.has_head_sink &&
         p.softcap.value_or(0.0f) == 0.0f && rule_hides_no_key(p) && !quantized && output_chunks;
}

// Whether the problem, whole (no split), has the plain build's shape (plain_problem, switches aside).
bool plain_shape(const AttentionProblem& p) {
  return plain_split_shape(p) && !p.sequences.any() && !p.has_key_lengths && p.k_len <= kPlainMaxKeys;
}

// Whether what a row sees is its key range alone (a causal rule, a window, key lengths: no mask, no softcap) and
// the scale may go to the exponent: the problems that the wgmma kernel's build of three blocks per SM takes (its
// launch checks sees_keys_by_rule_only again).
bool sees_keys_by_rule_only(const AttentionProblem& p) {
  const float scale = p.scale.value_or(1.0f);
  return !p.sequences.any() && !p.has_mask && p.softcap.value_or(0.0f) == 0.0f && scale > 0.0f && scale <= FLT_MAX;
}

// Whether the problem, whole (no split), may run the tile kernels' plain build (CudaPlan::plain).
bool plain_problem(const AttentionProblem& p, const PlanOverrides& o) { return plain_shape(p) && !o.is_off("plain"); }

// allow_special: the decode and wgmma kernels may be chosen (both need 16-byte-aligned base pointers, which
// only the run sees; the run falls back to the plan without them).
// ---- the kernel registry: every CUDA kernel, its name and whether it accepts a problem on a device ----

bool is_quantized(const AttentionProblem& p) {
  return p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float;
}
// allow_special: the decode and wgmma kernels may be chosen (both need 16-byte-aligned base pointers, which only
// the run sees; the run falls back to the plan without them).
// Ragged and paged sequences (AttentionProblem::sequences) run on the kernels that read rows through
// kernel_params.cuh's sequence accessors: the SIMT, mma.sync and (float K/V, warpgroup_takes_sequences) wgmma
// kernels.
bool decode_accepts(const AttentionProblem& p, const DeviceTraits&, bool allow_special) {
  return allow_special && !p.sequences.any() && decode_supports(p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
         decode_aligned(p.k, p.k_storage.type, p.dtype) && decode_aligned(p.v, p.v_storage.type, p.dtype);
}
// Sequences on the wgmma kernel: float K/V, and pages it reads by TMA (warpgroup_takes_pages).
bool warpgroup_takes_sequences(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  if (!s.any()) return true;
  return !is_quantized(p) &&
         (s.page_size == 0 || warpgroup_takes_pages(s.page_size, warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim))));
}
bool warpgroup_accepts(const AttentionProblem& p, const DeviceTraits& device, bool allow_special) {
  return allow_special && device.sm90 && warpgroup_takes_sequences(p) &&
         warpgroup_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
         layout_aligned16(p.q) && mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type);
}
// Float K/V in any layout (rows off 16 bytes load by elements); a quantized cache copies 16-byte chunks.
bool mma_accepts(const AttentionProblem& p, const DeviceTraits&, bool) {
  return mma_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
         (!is_quantized(p) ||
          (layout_aligned16(p.q) && mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type)));
}
bool tf32_accepts(const AttentionProblem& p, const DeviceTraits&, bool) {  // (any layout, as mma.sync)
  return !p.sequences.any() && tf32_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type);
}
bool decode_mma_accepts(const AttentionProblem& p, const DeviceTraits&, bool allow_special) {
  return allow_special && !p.sequences.any() &&
         decode_mma_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type, p.has_mask) &&
         mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type);
}
bool simt_accepts(const AttentionProblem&, const DeviceTraits&, bool) { return true; }

struct KernelEntry {
  CudaPlan::Kernel kernel;
  const char* name;  // PlanOverrides::kernel's name (plan_kernel_names)
  const char* shown;  // describe()'s
  bool (*accepts)(const AttentionProblem&, const DeviceTraits&, bool allow_special);
};
// In plan_kernel_names()' order; the plan's policy (choose_kernel) picks among the entries that accept.
constexpr KernelEntry kRegistry[] = {
    {CudaPlan::Kernel::Simt, "simt", "simt", simt_accepts},
    {CudaPlan::Kernel::TensorCore, "mma", "tensor-core", mma_accepts},
    {CudaPlan::Kernel::Warpgroup, "wgmma", "wgmma", warpgroup_accepts},
    {CudaPlan::Kernel::Decode, "decode", "decode", decode_accepts},
    {CudaPlan::Kernel::DecodeMma, "decode-mma", "decode-mma", decode_mma_accepts},
    {CudaPlan::Kernel::Tf32, "tf32", "tf32", tf32_accepts},
};

const KernelEntry& entry_of(CudaPlan::Kernel k) {
  for (const KernelEntry& e : kRegistry) {
    if (e.kernel == k) return e;
  }
  return kRegistry[0];
}

bool accepts(CudaPlan::Kernel k, const AttentionProblem& p, const DeviceTraits& device, bool allow_special) {
  return entry_of(k).accepts(p, device, allow_special);
}

// Why no tensor-core kernel takes a problem (describe() of a SIMT plan).
std::string simt_reason(const AttentionProblem& p, const PlanOverrides& o) {
  if (!o.kernel.empty() && o.kernel == "simt") return "forced by the plan overrides";
  if (p.dtype == DType::f32) {
    if (p.sequences.any()) return "float32 ragged or paged sequences (the TF32 kernel does not read them)";
    if (o.is_off("tf32")) return "tf32 off in the plan overrides";
    return "float32 above head dim 128 (the TF32 kernel is built to 128)";
  }
  if (is_quantized(p)) {
    return "int8 / int4 K/V: the tensor-core kernels take them at equal head dims 64 or 128, with K and V stored "
           "alike, rows on 16 bytes";
  }
  return "no tensor-core kernel accepts the problem";
}

CudaPlan::Kernel choose_kernel(const AttentionProblem& p, std::int64_t group_rows, std::int64_t sms,
                               bool allow_special, const DeviceTraits& device, const PlanOverrides& o) {
  const bool quantized = is_quantized(p);
  const bool decode_ok = accepts(CudaPlan::Kernel::Decode, p, device, allow_special);
  const bool warpgroup_ok = accepts(CudaPlan::Kernel::Warpgroup, p, device, allow_special);
  const bool mma_ok = accepts(CudaPlan::Kernel::TensorCore, p, device, allow_special);
  const bool tf32_ok = accepts(CudaPlan::Kernel::Tf32, p, device, allow_special);
  const bool decode_mma_ok = accepts(CudaPlan::Kernel::DecodeMma, p, device, allow_special);
  const std::string& forced = o.kernel;
  if (forced == "decode-mma" && decode_mma_ok) return CudaPlan::Kernel::DecodeMma;
  if (forced == "tf32" && tf32_ok) return CudaPlan::Kernel::Tf32;
  if (forced == "wgmma" && warpgroup_ok) return CudaPlan::Kernel::Warpgroup;
  if (forced == "mma" && mma_ok) return CudaPlan::Kernel::TensorCore;
  if (forced == "decode" && decode_ok) return CudaPlan::Kernel::Decode;
  if (forced == "simt") return CudaPlan::Kernel::Simt;
  // Few rows per K/V head: the work is streaming the cache, which the decode kernel does at full width (a
  // 64-row tile would leave most of its rows empty). A quantized cache takes it up to 64 rows (a prompt chunk)
  // since the other kernels dequantize value by value.
  // Tensor cores first wherever they apply: even a decode step with 4 of a tile's 64 rows used reads the cache
  // faster through them than the CUDA-core decode kernel, whose 8 multiply-adds per K/V element (4 rows)
  // leave it compute-bound (docs/benchmarks.md).
  // On Hopper, shapes with more than one 64-row tile per K/V head (prefill) take the wgmma kernel at head dim 64
  // (its 64-row blocks, below), and at 128 and 256 when its
  // grid (one 128-row block per SM at a time) fills its last wave to 80% or more, or is one wave of a quarter of
  // the SMs or more: a grid just past a whole number of waves (whisper's 144 blocks on 132 SMs) runs faster as
  // the mma.sync kernel's smaller blocks, two or more per SM, while a grid of one partial wave does not (BERT's
  // 96 blocks of 128 keys: 7.0 against 7.4 us; 48 blocks of 512 keys: 11.9 against 13.1 us), unless it is
  // tiny (12 blocks of 128 keys: 6.4 against 5.7 us, twice the blocks on twice the SMs; bench/sweep_cuda.py).
  // Up to 64 rows per K/V head over a long cache (a decode step, long_cache_stream) take it too: its TMA ring keeps
  // more of the cache in flight per SM than the mma.sync kernel's two cp.async stages (4.0 against 3.7 TB/s on the
  // H200's Llama decode shapes, bench/sweep_cuda.py); a short cache (whisper's 448 keys) stays with mma.sync.
  const bool warpgroup_off = o.is_off("wgmma");
  // A quantized cache under a decode step's few rows: the keys on the MMA's M side, so that the tensor-core work
  // follows the keys, not 16 or 64 padded rows (the wgmma kernel's int8 step took as long as its float16 one).
  if (decode_mma_ok && quantized && group_rows <= 2 * kDecodeMmaRows && !o.is_off("decode-mma")) {
    return CudaPlan::Kernel::DecodeMma;
  }
  const std::int64_t warpgroup_row_block = warpgroup_rows(warpgroup_width(p.head_dim, p.v_head_dim), p.k_storage.type);
  const std::int64_t warpgroup_blocks = p.batch * p.kv_heads * ceil_div(group_rows, warpgroup_row_block);
  // At head dim 64 the wgmma kernel's blocks are the mma.sync kernel's 64 rows, two per SM: the same grid, so no
  // wave count speaks for mma.sync (BERT's 24 blocks of 128 keys: 4.19 against 4.46 us;
  // bench/results/2026-11-30-h200-cuda-paired-blocks.md).
  const bool paired = !quantized && warpgroup_row_block == kRowBlock;
  // A grid that the key split spreads over the SMs (prefill_split_applies) is not judged by its blocks before the
  // split: a speculative verify step of 4 x 8 K/V heads x 128 rows over 8k keys, 32 row blocks, ran 75.6 us on
  // the wgmma kernel in 4 ranges against 144.8 on mma.sync in 5 (H100, bench/results/2026-12-07-h100-choice-and-mma80.md).
  // In the plain build, a grid just past whole waves runs faster on the wgmma kernel too (Whisper's encoder,
  // 144 blocks: 47.4 against 48.3 us on mma.sync; bench/results/2026-11-30-h200-cuda-plain-build.md).
  const bool whole_waves =
      paired || (warpgroup_blocks <= sms && warpgroup_blocks * 4 >= sms) ||
      warpgroup_blocks * 5 >= ceil_div(warpgroup_blocks, sms) * sms * 4 ||
      (plain_problem(p, o) && warpgroup_blocks * 4 >= sms) ||
      prefill_split_applies(p, warpgroup_blocks, sms, false);
  const bool long_stream = group_rows <= kStreamRows && long_cache_stream(p, sms);
  const std::int64_t width = warpgroup_width(p.head_dim, p.v_head_dim);
  // Few rows per K/V head above head dim 128, over a cache of any length: the wgmma kernel's 64-key tiles walk a
  // key range in half (160, 192) or a quarter (256) of mma.sync's dependent tile steps. On an H100, ten decode,
  // verify and chunk steps at 160-256 over 512-4k keys ran 1.08-1.63x faster so, none slower; in the 64 bucket the
  // same choice was mixed, 0.82-1.35x: there only the decode steps below take it
  // (bench/results/2026-12-07-h100-few-rows-wide-dims.md).
  const bool wide_few_rows = group_rows <= kStreamRows && width > 128;
  // A decode step of 17-64 rows per K/V head in the 64 bucket (multi-query decode at head dims 40-64) over a short
  // cache: the wgmma kernel's plain build, its 128-key tiles by TMA, ran 1.07-1.35x faster than mma.sync on an H100
  // (four such steps, 512-4k keys); verify steps there (causal rows, the general build) ran 0.82-0.90x, and steps of
  // fewer rows were not measured apart, so both stay (2026-12-07-h100-few-rows-wide-dims.md).
  const bool multi_query_decode_64 = p.q_len == 1 && group_rows > 16 && group_rows <= kStreamRows && width > 32 &&
                                     width <= 64 && plain_split_shape(p) && !o.is_off("plain");
  // A decode step whose group does not divide the wgmma kernel's block rows (5, 7 or 12 heads per K/V head: Qwen's
  // 28 on 4 and 40 on 8) over 2k keys or more, with too few blocks for mma.sync to run unsplit: its Q comes by TMA
  // as a run of heads too (encode_q_map), and its split tail ran 1.30-1.40x faster than mma.sync's key split on an
  // H100 (four such steps at batch 1-16 over 2k-4k keys); at 1k keys (12 heads per K/V head, batch 32: 0.87x) and
  // where mma.sync's grid fills the SMs unsplit (batch 32-64 over 1k, 0.97x) mma.sync stays
  // (bench/sweeps/decode-odd-groups-wgmma-2026-12-07.txt). Groups that divide the rows were not measured since.
  // (Head dims 64 and 128 only: the bucket's own dims, where Q has a tensor map.)
  const bool odd_group_decode = p.q_len == 1 && group_rows <= kStreamRows && warpgroup_row_block % group_rows != 0 &&
                                (p.head_dim == 64 || p.head_dim == 128) && p.v_head_dim == p.head_dim &&
                                p.k_len >= kOddGroupDecodeKeys && p.batch * p.kv_heads < sms &&
                                plain_split_shape(p) && !o.is_off("plain");
  // A quantized cache runs the wgmma kernel's 64-row blocks on one consumer warpgroup (the other converts its
  // tiles): a decode step's way, not a prefill's.
  // (a head dim between buckets: where the wgmma bucket's zero columns cost more than mma.sync's finer bucket,
  // warpgroup_bucket_pays, or its short rows run faster in mma.sync's 64-key tiles, short_rows_prefer_mma, prefill
  // stays on mma.sync)
  const bool long_keys = long_keys_for_small_dims(p.causal, p.window.value_or(0) > 0, p.k_len);
  const bool prefill_wants_warpgroup = !quantized && group_rows > kRowBlock && whole_waves &&
                                       warpgroup_bucket_pays(width, long_keys) && !short_rows_prefer_mma(width, p.k_len);
  const bool warpgroup_wanted = !warpgroup_off && (prefill_wants_warpgroup || long_stream || wide_few_rows ||
                                                   multi_query_decode_64 || odd_group_decode);
  if (warpgroup_ok && warpgroup_wanted) return CudaPlan::Kernel::Warpgroup;
  if (mma_ok) return CudaPlan::Kernel::TensorCore;
  if (decode_ok && !o.is_off("decode") &&
      group_rows <= (quantized ? kQuantizedDecodeRows : kFloatDecodeRows)) {
    return CudaPlan::Kernel::Decode;
  }
  // float32 beyond a decode step's few rows: on the tensor cores at float32 accuracy.
  if (tf32_ok && !o.is_off("tf32")) return CudaPlan::Kernel::Tf32;
  return CudaPlan::Kernel::Simt;
}

}  // namespace

std::vector<std::string> registry_kernel_names() {
  std::vector<std::string> names;
  for (const KernelEntry& e : kRegistry) names.emplace_back(e.name);
  return names;
}

std::vector<std::string> accepting_kernels(const AttentionProblem& p, const DeviceTraits& device) {
  std::vector<std::string> names;
  for (const KernelEntry& e : kRegistry) {
    if (e.accepts(p, device, true)) names.emplace_back(e.name);
  }
  return names;
}

const char* kernel_shown_name(CudaPlan::Kernel k) { return entry_of(k).shown; }

CudaPlan plan_for(const AttentionProblem& p, bool allow_special, const DeviceTraits& device,
                  const PlanOverrides& o) {
  CudaPlan plan;
  plan.sm_count = device.sm_count;
  plan.group = p.heads / p.kv_heads;
  plan.group_rows = plan.group * p.q_len;
  plan.kernel = choose_kernel(p, plan.group_rows, plan.sm_count, allow_special, device, o);
  if (plan.kernel == CudaPlan::Kernel::Simt) plan.simt_reason = simt_reason(p, o);
  const bool decode = plan.kernel == CudaPlan::Kernel::Decode;
  const bool warpgroup = plan.kernel == CudaPlan::Kernel::Warpgroup;
  plan.head_dim_tile = plan.kernel == CudaPlan::Kernel::TensorCore ? mma_bucket(p.head_dim, p.v_head_dim).qk
                       : warpgroup ? warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim))
                                                                   : 0;
  const bool decode_mma = plan.kernel == CudaPlan::Kernel::DecodeMma;
  plan.row_block = decode       ? kDecodeRows
                   : decode_mma ? kDecodeMmaRows
                   : warpgroup  ? warpgroup_rows(warpgroup_width(p.head_dim, p.v_head_dim), p.k_storage.type)
                                : kRowBlock;
  plan.row_blocks = ceil_div(plan.group_rows, plan.row_block);
  const std::int64_t base_blocks = p.batch * p.kv_heads * plan.row_blocks;
  plan.split_keys = std::max<std::int64_t>(p.k_len, 1);
  // Split long key ranges when the row blocks alone would not fill the GPU twice over (the tile kernels). The decode
  // kernel also holds a whole range's scores in shared memory: its ranges are at most kDecodeMaxKeys long.
  // Few rows per K/V head (a decode step): the work is streaming the cache, so the split is chosen for whole rounds
  // of resident blocks (core::split_for_soonest_finish). Ranges are whole tiles of the kernel (split_granule).
  const std::int64_t sms = plan.sm_count;
  const std::int64_t granule = split_granule(plan, p);
  const std::int64_t tiles = std::max<std::int64_t>(ceil_div(p.k_len, granule), 1);
  std::int64_t most = std::min(std::max<std::int64_t>(p.k_len / kMinSplitKeys, 1), kMaxSplits);
  // A few-row grid that ranges of kMinSplitKeys would still leave mostly idle (a single decoder step: Whisper's
  // 12 heads over 448 or 1500 keys) splits down to single tiles: its merge is a few rows, and each block's
  // chain of dependent tile loads is what the step waits for (448 keys: 9.8 us whole, 7.7 us in 7 ranges;
  // 1500 keys: 11.3 us in 5 ranges, 10.2-10.5 us in 8-24; bench/sweep_cuda.py).
  if (plan.group_rows <= 16 && base_blocks * most * 2 <= sms) {
    most = std::min(std::max<std::int64_t>(p.k_len / granule, 1), kMaxSplits);
  }
  // The mma.sync kernel on sm_90 merges a split inside a thread-block cluster (CudaPlan::cluster_merge): at
  // most kMaxClusterSplits ranges (Whisper's cross-attention step, 1500 keys: 12 ranges of 128 keys, 7.65 us,
  // against 8 of 192, 7.94).
  const bool clusters = plan.kernel == CudaPlan::Kernel::TensorCore && device.sm90 &&
                        mma_cluster_merge_built(mma_bucket(p.head_dim, p.v_head_dim).v) && !o.is_off("cluster");
  if (clusters) most = std::min(most, kMaxClusterSplits);
  std::int64_t want = 1;
  std::int64_t general_want = 0;  // > 0: the split without the device-key-length rule (fallback_splits)
  const bool streams = plan.group_rows <= 16 || (warpgroup && plan.group_rows <= kStreamRows);
  // (the decode kernel's ranges hold at most kDecodeMaxKeys keys)
  const std::int64_t least_for_decode = decode ? ceil_div(p.k_len, kDecodeMaxKeys) : 1;
  if (streams && base_blocks > 0 && o.splits == 0) {
    // The wgmma kernel's workers are SMs, not resident blocks: one of its streaming blocks per SM reads a cache as
    // fast as two (H100, head dim 64: batch 16 x 8 K/V heads over 8k keys 90.9 us whole, 98.0 in 2 ranges; 64 query
    // heads on one K/V head, batch 16 over 16k, 36.4 us in 8 ranges, 41.4 in 16;
    // bench/results/2026-12-05-h100-decode-d64-split.md).
    const std::int64_t resident = sms * (warpgroup ? 1 : device.resident_blocks(plan.kernel));
    const core::TileSplit cut =
        core::split_for_soonest_finish(base_blocks, resident, tiles, std::min(least_for_decode, kMaxSplits),
                                       std::max(std::min(least_for_decode, kMaxSplits), most));
    want = cut.parts;
    // Device key lengths (a serving step) where the wgmma kernel's plain build takes the ranges (below): the plan
    // sees only k_len, the longest a range may be, while the real lengths leave many ranges short or empty.
    // Ranges short enough for kLengthRounds rounds of blocks on the workers let the hardware's block scheduler
    // even out the SMs' work, a piece past its entry's length exits at once, and ranges of at most kPlainMaxKeys
    // run on the plain build. Each range leaves a partial of its rows, written and read back by the merge, so a
    // range keeps kLengthRowKeys keys a row (multi-query decode's 32 rows, batch 16 over 16k keys on the H100:
    // 48.1 us in 64 ranges of 256 keys, 41.2 in the 8 of a dense step). The general build keeps the dense
    // step's split (fallback_splits): it lost with more ranges (batch 64 over 8k, 441 us in 4 against 433 whole).
    if (p.has_key_lengths && warpgroup && plain_split_shape(p)) {
      general_want = want;
      const std::int64_t for_rounds = ceil_div(kLengthRounds * resident, base_blocks);
      const std::int64_t for_plain = ceil_div(p.k_len, kPlainMaxKeys);
      const std::int64_t fewest_keys = std::max(kMinSplitKeys, kLengthRowKeys * plan.group_rows);
      want = std::max(want, std::min({std::max(for_rounds, for_plain), most,
                                      std::max<std::int64_t>(p.k_len / fewest_keys, 1)}));
    }
  } else if (prefill_split_applies(p, base_blocks, sms, plan.kernel == CudaPlan::Kernel::Simt) ||
             tiny_grid_split_applies(p, plan.group_rows, base_blocks, sms)) {
    want = std::min(ceil_div(2 * sms, base_blocks), most);
    // The wgmma kernel's workers are SMs (above): aiming at two blocks per SM left the last of its rounds part
    // full. A speculative verify step (8 x 8 K/V heads of 16 queries x 8 heads over 4k keys, head dim 128) took
    // 104.2 us in 5 ranges (320 blocks of one per SM: three rounds) and 78.7 in 2 (one round) on the H100
    // (bench/results/2026-12-07-h100-gap-sweep.md). So it takes the split whose rounds end soonest, at most that.
    // Not the 64-row blocks of head dim 64 (two or three per SM): fewer ranges there can leave one block of three
    // per SM alone, whose S, softmax and P V run one after the other (Falcon's 71:1 decode steps gained 4-9%, a
    // compute-bound grid was not measured).
    if (warpgroup && plan.row_block != kRowBlock) {
      want = core::split_for_soonest_finish(base_blocks, sms, tiles, 1, want).parts;
    }
  }
  want = std::max(want, least_for_decode);
  if (o.splits > 0) want = std::max(std::min<std::int64_t>(o.splits, tiles), least_for_decode);
  if (want > 1) {
    plan.split_keys = ceil_div(tiles, want) * granule;
    plan.splits = ceil_div(p.k_len, plan.split_keys);
  }
  const std::int64_t general_split_keys =
      general_want > 1 ? ceil_div(tiles, general_want) * granule
                       : general_want == 1 ? std::max<std::int64_t>(p.k_len, 1) : plan.split_keys;
  plan.blocks = base_blocks * plan.splits;
  plan.cluster_merge = clusters && plan.splits > 1 && plan.splits <= kMaxClusterSplits;
  plan.plain = (plan.kernel == CudaPlan::Kernel::Warpgroup || plan.kernel == CudaPlan::Kernel::TensorCore) &&
               (plan.splits == 1 || plan.cluster_merge) && plain_problem(p, o);
  // Head dim 64, three 64-row blocks per SM (128-key tiles, one at a time), for every problem that build takes
  // (sees_keys_by_rule_only), in the plain build or the general one. On the H200 it took `bert_b8_s512` 23.1 -> 21.2 us
  // and Whisper's encoder 28.9 -> 27.4 (bench/results/2026-12-01-h200-cuda-three-seq.md), and, since its tiles are
  // 128 keys run one at a time, one-round grids gain too: `bert_b1_s512` 7.74 -> 7.53, `fa3_h64_s4k` (4,096 keys,
  // the general build) 1,516 -> 1,414 (bench/results/2026-12-01-h200-cuda-three-all.md). With 64-key tiles those
  // had lost (bench/results/2026-11-30-h200-cuda-paired-blocks.md).
  // Under a rule (causal, a window, key lengths) only prefill-sized rows take it (1.13-1.36x on causal prefill at
  // head dims 16-64, bench/results/2026-12-05-h100-three-per-sm-rules.md); a decode step's few rows per K/V head
  // (`streams`) keep the choice they had, where only rows that see every key took it: under rules its one-tile-at-
  // a-time blocks were never timed against two per SM.
  // A decode step's grid of more blocks than SMs runs two per SM: at three per SM, batch 32 x 8 K/V heads over 8k
  // keys (256 blocks) took 206 us on the H100 against 179 at two per SM, and four more such grids 1.02-1.15x
  // (bench/results/2026-12-05-h100-decode-d64.md).
  const bool stream_takes_three =
      !streams || (rule_hides_no_key(p) && !p.has_key_lengths && base_blocks * plan.splits <= sms);
  plan.three_per_sm = warpgroup && plan.row_block == kRowBlock && device.warpgroup_three_resident >= 3 &&
                      plan.splits == 1 && p.k_storage.type == KvType::Float && sees_keys_by_rule_only(p) &&
                      stream_takes_three && !o.is_off("three");
  // The split tail. On the H200 Whisper's encoder is 144 row blocks of 12 tiles on 132 SMs: a wave of 132, then
  // 12 SMs running a second while 120 idle (Nsight Compute: SMs active 49% of the kernel's cycles). Split in
  // ranges of kTailPieceTiles tiles, the last 12 row blocks become 72 blocks that start as the first wave ends
  // (places: blocks the SMs hold at once). Not under three per SM: there the tails of 84 and 116 row blocks made
  // two head-dim-64 shapes slower, 37.1 -> 44.1 and 26.6 -> 36.1 us, merge included
  // (bench/results/2026-12-01-h200-cuda-three-all.md).
  if (plan.plain && warpgroup && plan.splits == 1 && !plan.three_per_sm && !o.is_off("tail")) {
    const std::int64_t places = sms * device.resident_blocks(plan.kernel);
    const std::int64_t tail = base_blocks % places;
    const std::int64_t tiles = ceil_div(p.k_len, kWarpgroupTileKeys);
    if (base_blocks > places && tail > 0 && 2 * tail <= places && tiles >= kTailMinTiles) {
      const std::int64_t piece_tiles = std::max(kTailPieceTiles, ceil_div(tail * tiles, places));
      const std::int64_t pieces = ceil_div(tiles, piece_tiles);
      if (pieces > 1) {
        plan.tail_block = base_blocks - tail;
        plan.tail_pieces = pieces;
        plan.tail_piece_keys = piece_tiles * kWarpgroupTileKeys;
        plan.blocks = plan.tail_block + tail * pieces;
      }
    }
  }
  // A decode step's key split on the wgmma kernel's plain build: its ranges run as a split tail from the first row
  // block on (every block a tail piece that leaves its partial), so that a range of a few tiles skips the general
  // build's row setup and per-tile rule tests. The plain build is kept to ranges of kPlainMaxKeys, as for whole
  // problems.
  if (warpgroup && streams && plan.splits > 1 && !plan.plain && !plan.three_per_sm && plain_split_shape(p) &&
      plan.split_keys <= kPlainMaxKeys && !o.is_off("plain") && !o.is_off("tail")) {
    plan.tail_block = 0;
    plan.tail_pieces = plan.splits;
    plan.tail_piece_keys = plan.split_keys;
    plan.fallback_split_keys = general_split_keys;
    plan.fallback_splits = ceil_div(std::max<std::int64_t>(p.k_len, 1), general_split_keys);
    plan.splits = 1;
    plan.split_keys = std::max<std::int64_t>(p.k_len, 1);
    plan.plain = true;
  }
  plan.kv_copies = warpgroup && kv_rows_want_copies(p, o);
  plan.narrow = warpgroup && p.k_storage.type == KvType::Float &&
                warpgroup_widths(p.head_dim, p.v_head_dim, true).narrow() && !o.is_off("narrow");
  // The persistent grid of three per SM's plain build: where its blocks' last round is whole or at least two
  // thirds full. Then a block's next unit loads under the end of its current one: on the H200, against one block
  // per unit, 768 units on 396 places (bert_b8_s512) 21.4 -> 20.3 us, 1,152 31.9 -> 30.0, 1,536 41.5 -> 39.5. A
  // persistent block's units are fixed by its index, while the hardware puts a new block wherever one ends: with
  // fewer units left for the last round, the blocks with one more unit than the rest land unevenly on the SMs, and
  // 576, 640 and 1,024 units (last rounds 45-62% full) ran 8-12% slower
  // (bench/results/2026-12-01-h200-cuda-persistent.md).
  const std::int64_t places = sms * device.warpgroup_three_resident;
  const std::int64_t last_round = places > 0 ? plan.blocks % places : 0;
  if (plan.three_per_sm && plan.plain && !plan.kv_copies && !o.is_off("persistent")) {
    if (o.persistent_blocks > 0) {
      plan.persistent_places = o.persistent_blocks;
    } else if (plan.blocks > places && (last_round == 0 || 3 * last_round >= 2 * places)) {
      plan.persistent_places = places;
    }
  }
  plan.smem_bytes = plan.kernel == CudaPlan::Kernel::Tf32         ? tf32_smem_bytes(p.head_dim, p.v_head_dim)
                    : plan.kernel == CudaPlan::Kernel::TensorCore ? mma_smem_bytes(p.head_dim, p.v_head_dim, p.k_storage.type)
                    : decode                                    ? decode_smem_bytes()
                    : decode_mma                                ? decode_mma_smem_bytes(p.head_dim, p.k_storage.type)
                    : warpgroup ? warpgroup_smem_bytes(warpgroup_width(p.head_dim, p.v_head_dim), p.k_storage.type, plan.three_per_sm)
                                                                : simt_smem_bytes(p.head_dim, p.v_head_dim);
  const std::int64_t partial_blocks =
      plan.splits > 1 ? plan.blocks : plan.tail_pieces > 1 ? plan.blocks - plan.tail_block : 0;
  plan.partial_bytes = static_cast<std::size_t>(partial_blocks * plan.row_block * (3 + p.v_head_dim)) * sizeof(float);
  plan.scratch_bytes = (p.has_key_lengths || p.sequences.any() || plan.partial_bytes > 0)
                           ? kFlagBytes + entry_fault_bytes(p) + plan.partial_bytes
                           : 0;
  plan.overrides = o;
  return plan;
}

}  // namespace attnkit::cuda
