// The tiled CPU kernel's driver: planning (row blocks, the key split), scratch layout, the thread loop with
// its work-budget cut, and the split-K merge pass. The SIMD work item is in tiled_kernel.cpp.
#include "../core/checked_int.hpp"
#include "../core/kv_quant.hpp"
#include "../core/online_softmax.hpp"
#include "../core/visibility.hpp"
#include "amx_tiles.hpp"
#include "bf16_dot.hpp"
#include "tiled_workspace.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <unistd.h>

namespace attnkit::cpu {
namespace {

// Split the keys when fewer items than this would run: enough independent work for a many-core CPU.
constexpr std::int64_t kTargetItems = 64;
// A key range shorter than this costs more in its merge than it gains in parallelism.
constexpr std::int64_t kMinSplitKeys = 256;
constexpr std::int64_t kMaxSplits = 16;
constexpr std::int64_t kMinRowBlocksForAmxF16 = 4;
constexpr std::int64_t kMaxHeadDimForAmxF16 = 64;
constexpr std::int64_t kMinHeadDimForAmxF16 = 17;
constexpr std::size_t kAlign = 64;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

template <class T>
T* take(std::byte* base, std::size_t& offset, std::int64_t count) {
  T* p = base == nullptr ? nullptr : reinterpret_cast<T*>(base + offset);
  offset = align_up(offset + static_cast<std::size_t>(count) * sizeof(T));
  return p;
}

using core::ceil_div;

struct ItemIndex {
  std::int64_t b, kvh, block, split;
};

ItemIndex decode_item(const AttentionProblem& p, const TiledPlan& plan, std::int64_t item) {
  ItemIndex ix{};
  ix.split = item % plan.splits;
  item /= plan.splits;
  ix.block = item % plan.row_blocks;
  item /= plan.row_blocks;
  const std::int64_t kv_groups = ceil_div(p.kv_heads, plan.kv_heads_per_item);
  ix.kvh = item % kv_groups * plan.kv_heads_per_item;
  ix.b = item / kv_groups;
  return ix;
}

ItemJob make_job(const AttentionProblem& p, const AttentionArgs& a, const core::SequenceAccess& seqs,
                 const TiledPlan& plan, ItemIndex ix, const Workspace* ws) {
  ItemJob job{};
  job.problem = &p;
  job.args = &a;
  job.ws = ws;
  job.b = ix.b;
  job.kvh = ix.kvh;
  job.kv_span = std::min(plan.kv_heads_per_item, p.kv_heads - ix.kvh);
  job.group = plan.group;
  job.seqs = &seqs;
  job.seq = seqs.rows_of(ix.b);
  job.first_row = ix.block * kRowBlock;
  // (a ragged entry's shorter query run leaves the plan's last row blocks of it empty)
  job.rows = std::max<std::int64_t>(0, std::min(kRowBlock, plan.group * job.seq.queries - job.first_row));
  job.key_begin = ix.split * plan.split_keys;
  job.key_end = std::min(p.k_len, job.key_begin + plan.split_keys);
  job.amx = plan.amx;
  job.p_terms = plan.p_terms;
  job.bf16_dot = plan.bf16_dot;
  job.widened = plan.widened_keys > 0;
  job.widened_k = job.widened && plan.widened_k;
  job.widened_v = job.widened && plan.widened_v;
  job.prefetch_v = plan.prefetch_v;
  job.prefetch_ahead = plan.prefetch_ahead;
  job.prefetch_tiles = plan.prefetch_tiles;
  job.prefetch_items = plan.prefetch_items;
  job.interleaved_scores = plan.interleaved_scores;
  return job;
}

// Folds the partials of one row block, in range order, into the workspace state.
void merge_partials(const TiledPlan& plan, std::int64_t rows, std::int64_t dv, const float* partials,
                    const Workspace& w) {
  // (the ranges' slots of one K/V head: a wide item keeps one slot per head of its span)
  const std::size_t stride = static_cast<std::size_t>(plan.kv_heads_per_item) * plan.partial_bytes / sizeof(float);
  // (A few-rows item's partial holds its rows row-major, save_partial's layout: folded in a row-major buffer,
  // moved into the [dim][lane] layout once.)
  const bool few = rows <= kMaxFewRows;
  for (std::int64_t r = 0; r < rows; ++r) {
    float max = core::kNegInf;
    float sum = 0.0f;
    bool poison = false;
    float* const row = w.orows + r * dv;
    if (few) std::fill(row, row + dv, 0.0f);
    else for (std::int64_t d = 0; d < dv; ++d) w.ot[d * kRowBlock + r] = 0.0f;
    for (std::int64_t s = 0; s < plan.splits; ++s) {
      const float* part = partials + static_cast<std::size_t>(s) * stride;
      const core::MergeWeights mw = core::merge_weights(max, part[r]);
      sum = sum * mw.wa + part[kRowBlock + r] * mw.wb;
      poison |= part[2 * kRowBlock + r] != 0.0f;
      const float* acc = part + 3 * kRowBlock;
      if (few) {
        for (std::int64_t d = 0; d < dv; ++d) row[d] = row[d] * mw.wa + acc[r * dv + d] * mw.wb;
      } else {
        for (std::int64_t d = 0; d < dv; ++d) {
          float& o = w.ot[d * kRowBlock + r];
          o = o * mw.wa + acc[d * kRowBlock + r] * mw.wb;
        }
      }
      max = mw.max;
    }
    if (few) {
      for (std::int64_t d = 0; d < dv; ++d) w.ot[d * kRowBlock + r] = row[d];
    }
    w.max[r] = max;
    w.sum[r] = sum;
    w.poison[r] = poison ? 1.0f : 0.0f;
  }
}

}  // namespace

std::size_t carve_workspace(std::byte* base, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t widened_keys, DType amx_dtype, Workspace* ws) {
  const bool amx = amx_dtype != DType::f32;
  std::size_t off = 0;
  Workspace w{};
  w.qt = take<float>(base, off, head_dim * kRowBlock);
  w.qrows = take<float>(base, off, kRowBlock * head_dim);
  const std::int64_t step_tiles = amx ? amx::kTilesPerStep : 1;  // score tiles a softmax step holds
  w.st = take<float>(base, off, step_tiles * kKeyTile * kRowBlock);
  w.ot = take<float>(base, off, v_head_dim * kRowBlock);
  w.orows = take<float>(base, off, kRowBlock * v_head_dim);
  w.max = take<float>(base, off, kRowBlock);
  w.sum = take<float>(base, off, kRowBlock);
  w.poison = take<float>(base, off, kRowBlock);
  w.alpha = take<float>(base, off, kRowBlock);
  w.begin = take<std::int32_t>(base, off, kRowBlock);
  w.end = take<std::int32_t>(base, off, kRowBlock);
  w.head = take<std::int64_t>(base, off, kRowBlock);
  w.query = take<std::int64_t>(base, off, kRowBlock);
  w.kbuf = take<float>(base, off, kKeyTile * head_dim);
  w.vbuf = take<float>(base, off, kKeyTile * v_head_dim);
  w.row = take<float>(base, off, std::max(head_dim, v_head_dim));
  w.mrow = take<float>(base, off, kKeyTile);
  w.krow = take<const float*>(base, off, kKeyTile);
  w.vrow = take<const float*>(base, off, kKeyTile);
  w.kbits = take<const std::uint16_t*>(base, off, kKeyTile);
  const std::int64_t dim32 = amx ? amx::score_dim32(amx_dtype, head_dim) : (head_dim + 31) / 32 * 32;
  const std::int64_t dv16 = (v_head_dim + 15) / 16 * 16, v_terms = amx ? amx::input_terms(amx_dtype) : 1;
  w.k_bf16 = take<std::uint16_t>(base, off, step_tiles * kKeyTile * dim32);
  w.q_pairs = take<std::uint16_t>(base, off, dim32 * kRowBlock);
  w.vt_bf16 = take<std::uint16_t>(base, off, step_tiles * v_terms * dv16 * kKeyTile);
  w.amx_row = take<std::uint16_t>(base, off, 6 * std::max(head_dim, v_head_dim));
  w.p_pairs = take<std::uint16_t>(base, off, step_tiles * amx::kMaxProbabilityTerms * kKeyTile * kRowBlock);
  w.tile_pv = take<float>(base, off, dv16 * kRowBlock);
  w.amx_bad_keys = take<std::int32_t>(base, off, step_tiles * kKeyTile);
  const std::int64_t float_keys = amx ? 0 : widened_keys, staged_keys = amx ? widened_keys : 0;
  w.widened_k = take<float>(base, off, float_keys * head_dim);
  w.widened_v = take<float>(base, off, float_keys * v_head_dim);
  w.staged_k = take<std::uint16_t>(base, off, staged_keys * dim32);
  w.staged_vt = take<std::uint16_t>(base, off, staged_keys * v_terms * dv16);
  w.staged_bad_keys = take<std::int32_t>(base, off, staged_keys);
  w.staged_bad_count = take<std::int32_t>(base, off, staged_keys / kKeyTile);
  w.widened_ready = take<std::uint8_t>(base, off, widened_keys / kKeyTile);
  w.widened_for = take<std::int64_t>(base, off, 2);
  if (ws != nullptr) *ws = w;
  return off;
}

std::size_t partial_floats(std::int64_t v_head_dim) {
  return static_cast<std::size_t>((3 + v_head_dim) * kRowBlock);
}

void save_partial(const Workspace& w, std::int64_t rows, std::int64_t v_head_dim, float* partial) {
  // The merge reads only the item's rows; lanes past them carry whatever they hold. (A head of a wide few-rows
  // item passes a view whose lanes start inside the workspace's: only its rows are read then.)
  const std::size_t state_lanes = static_cast<std::size_t>(rows > kMaxFewRows ? kRowBlock : rows);
  std::memcpy(partial, w.max, state_lanes * sizeof(float));
  std::memcpy(partial + kRowBlock, w.sum, state_lanes * sizeof(float));
  std::memcpy(partial + 2 * kRowBlock, w.poison, state_lanes * sizeof(float));
  if (rows > kMaxFewRows) {  // one contiguous copy: per-row copies of many lanes cost more in calls than in bytes
    std::memcpy(partial + 3 * kRowBlock, w.ot, static_cast<std::size_t>(v_head_dim * kRowBlock) * sizeof(float));
    return;
  }
  // A few-rows item: its rows row-major from the kernel's row buffer (`orows`), one contiguous copy (the
  // [dim][lane] layout would put each row's values 64 floats apart, a cache line per value).
  std::memcpy(partial + 3 * kRowBlock, w.orows, static_cast<std::size_t>(rows * v_head_dim) * sizeof(float));
}

// Whether each K/V head's rows lie between other heads' rows (a positions-first cache, NHD pages): a decode item
// of one head then reads a row's bytes out of every few hundred, at half the bandwidth of whole rows (measured:
// bench/results/cpu-sequences-2026-12-02.md).
bool heads_interleaved(const Layout& l) { return l.head_stride > 0 && l.head_stride < l.row_stride; }

// K/V heads per few-rows item where heads interleave: as many of a batch entry's as keep at least two items per
// thread that share out evenly (the threads' last round at least 85% full), at most kMaxKvHeadsPerItem. Split
// keys too: each head of a wide item then keeps its own partial. The bits do not depend on it: each head's rows
// take the same steps either way.
std::int64_t kv_heads_per_item(const AttentionProblem& p, const TiledPlan& plan, std::int64_t base_items, int threads) {
  if (plan.group_rows > kFewRows || p.kv_heads < 2 || base_items == 0 ||
      !(heads_interleaved(p.k) || heads_interleaved(p.v))) {
    return 1;
  }
  const std::int64_t t = threads;
  auto items = [&](std::int64_t span) { return p.batch * ceil_div(p.kv_heads, span) * plan.splits; };
  auto even = [&](std::int64_t span) { return 100 * items(span) >= 85 * t * ceil_div(items(span), t); };
  // (spans that cut the heads into groups of equal size, or as near as the count allows)
  for (std::int64_t groups = ceil_div(p.kv_heads, kMaxKvHeadsPerItem); groups < p.kv_heads; ++groups) {
    const std::int64_t span = ceil_div(p.kv_heads, groups);
    if (items(span) >= 2 * t && even(span)) return span;
  }
  return 1;
}

// Items a thread takes at once: all row blocks of a K/V head where there are heads enough for every thread to
// take several (then the thread's copy of the head serves them all, and the balance is a whole head's), else one.
std::int64_t item_chunk(const AttentionProblem& p, const TiledPlan& plan) {
  const bool whole_heads = plan.splits == 1 && plan.kv_heads_per_item == 1 && plan.row_blocks >= 2 &&
                           p.batch * p.kv_heads >= 4 * static_cast<std::int64_t>(plan.threads);
  return whole_heads ? plan.row_blocks : 1;
}

// Keys of the per-thread widened K/V (Workspace::widened_k), 0 for none: where K or V must be widened,
// dequantized, copied or staged on the tiled path, a thread runs several row blocks of a K/V head (a head's row
// blocks are one chunk of the thread loop, or the head has so many that each thread takes several: the threads
// take items in turns, and with 2 row blocks each would widen its own, where the copy only costs), and one head's
// keys fit kMaxWidenedBytes. The bits do not depend on it: a widened row is the same floats either way.
// Measured in bench/results/cpu-peers-2026-12-03-zen5-widened.md.
namespace {
constexpr std::int64_t kMaxWidenedBytes = std::int64_t{4} << 20;
constexpr std::int64_t kMinRowBlocksForWidened = 4;
// Whether a float32 K or V row is read from a copy rather than in place: where the tensor's rows are apart (a
// positions-first [B, S, H, D] tensor: one row per few KB, so a head's tiles touch one page per key and the TLB
// misses on every tile), a contiguous copy of the head is read faster. The same floats either way.
bool copies_strided(const Layout& l, std::int64_t dim) { return l.row_stride != dim; }

// Which of K and V the thread's copy of a head holds, in float32 (widened, dequantized or copied).
void plan_widened_rows(const AttentionProblem& p, TiledPlan& plan) {
  const bool f32 = p.dtype == DType::f32;
  plan.widened_k = !plan.amx && !plan.bf16_dot &&
                   (!f32 || p.k_storage.type != KvType::Float || copies_strided(p.k, p.head_dim));
  plan.widened_v = !plan.amx && (!f32 || p.v_storage.type != KvType::Float || copies_strided(p.v, p.v_head_dim));
}

std::int64_t widened_keys(const AttentionProblem& p, const TiledPlan& plan, const PlanOverrides& overrides) {
  if (overrides.is_off("widened-kv")) return 0;
  if (plan.group_rows <= kMaxFewRows || (plan.row_blocks < kMinRowBlocksForWidened && plan.item_chunk < 2) ||
      !(plan.widened_k || plan.widened_v || plan.amx)) {
    return 0;
  }
  const std::int64_t keys = ceil_div(std::max<std::int64_t>(p.k_len, 1), kKeyTile) * kKeyTile;
  // AMX: bfloat16 K rows and V^T, the dims rounded up to the tiles', and the list of inf / NaN keys.
  const std::int64_t key_bytes = plan.amx ? (amx::score_dim32(p.dtype, p.head_dim) +
                                             ceil_div(p.v_head_dim, 16) * 16 * amx::input_terms(p.dtype)) * 2 + 4
                                          : (p.head_dim + p.v_head_dim) * static_cast<std::int64_t>(sizeof(float));
  return keys * key_bytes <= kMaxWidenedBytes ? keys : 0;
}
}  // namespace

namespace {
// The K/V bytes a call reads at most (double: no overflow for any size the checks let through).
double kv_bytes(const AttentionProblem& p) {
  const double bits = static_cast<double>(p.head_dim * core::kv_value_bits(p.k_storage.type, p.dtype) +
                                          p.v_head_dim * core::kv_value_bits(p.v_storage.type, p.dtype));
  return static_cast<double>(p.batch) * static_cast<double>(p.kv_heads) * static_cast<double>(p.k_len) * bits / 8;
}
// The few-rows items prefetch K/V rows only where the call's K/V is at least this large: a third of the last-level
// cache, within [4, 16] MiB (8 MiB where the OS does not say). A smaller K/V stays in the caches from call to call,
// and there the prefetches only cost (bench/results/cpu-decode-2026-12-03-zen4.md: 8 MiB of a 32 MiB L3 ran 1.17x
// faster without them, 16 MiB 1.3x faster with them).
double min_prefetched_bytes() {
  static const double bytes = [] {
    constexpr double kMiB = 1 << 20;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? std::clamp(static_cast<double>(l3) / 3, 4 * kMiB, 16 * kMiB) : 8 * kMiB;
  }();
  return bytes;
}
// Q, K, V and O of a call, in bytes (double: no overflow).
double call_bytes(const AttentionProblem& p) {
  const double es = static_cast<double>(dtype_size(p.dtype));
  const double rows = static_cast<double>(p.batch) * static_cast<double>(p.heads) * static_cast<double>(p.q_len);
  return kv_bytes(p) + rows * static_cast<double>(p.head_dim + p.v_head_dim) * es;
}
// A core's L2 (1 MiB where the OS does not say). A call whose share per thread fits it runs from the caches from
// call to call, and there the tiled items' prefetches only cost (1-2% on BERT-base at batch 1).
double l2_bytes() {
  static const double bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<double>(l2) : static_cast<double>(1 << 20);
  }();
  return bytes;
}
}  // namespace

TiledPlan plan_tiled(const AttentionProblem& p, int threads, const PlanOverrides& overrides) {
  TiledPlan plan;
  plan.group = p.heads / p.kv_heads;
  plan.group_rows = plan.group * p.q_len;
  plan.f16_terms = p.dtype == DType::f16;
  // float16 takes the tiles where a K/V head has 4 or more row blocks and a head dim up to 64: its staging (each
  // row split into two terms) is paid once per head and thread, and over fewer row blocks cost more than the tiles
  // saved (BERT-base at 128 tokens: 1.32x slower on the tiles, at 512: 1.06-1.2x faster, the Whisper encoder 1.28x);
  // at head dim 128 the four-fold score product cost more than the float32 products (Llama-3-8B prefill 0.82x,
  // a 128-query chunk over 4k keys 0.72x). The tiles cost whole 64-key tiles, so float16 (where they gain at most
  // 1.15x) takes them only where padding the keys to whole tiles adds at most 1/16: 77 keys ran 1.68x slower on
  // them, 197 keys 1.34x, 240 1.06x; and not at head dim 16, whose two terms fill one 32-wide step (0.79-0.86x)
  // (bench/results/cpu-2026-12-05-f16-amx-partial-tiles.md).
  const std::int64_t padded_keys = ceil_div(p.k_len, kKeyTile) * kKeyTile;
  const bool f16_tiles_pay = ceil_div(plan.group_rows, kRowBlock) >= kMinRowBlocksForAmxF16 &&
                             p.head_dim >= kMinHeadDimForAmxF16 && p.head_dim <= kMaxHeadDimForAmxF16 &&
                             (padded_keys - p.k_len) * 16 <= p.k_len;
  const bool amx_dtype = p.dtype == DType::bf16 || (p.dtype == DType::f16 && f16_tiles_pay);
  plan.amx = amx_dtype && p.k_storage.type == KvType::Float && p.v_storage.type == KvType::Float &&
             plan.group_rows > kMaxFewRows && !overrides.is_off("amx") && overrides.kernel != "bf16-dot" &&
             amx::available();
  // P rounded to the element type for P V, as on the CUDA tensor cores (bfloat16); float16's 11 bits take all of
  // P's (the tiles hold bfloat16 only).
  plan.p_terms = p.dtype == DType::bf16 && !overrides.is_off("rounded-p") ? 1 : amx::kMaxProbabilityTerms;
  const bool streams = kv_bytes(p) >= min_prefetched_bytes();
  plan.prefetch_v = streams && !overrides.is_off("prefetch-v");
  plan.prefetch_ahead = streams && !overrides.is_off("prefetch-ahead");
  // A wide few-rows item whose K/V streams from memory scores its heads in turns by group of keys, so that each K row
  // is read across the heads at once; on K/V that stays in the caches the turns cost more than they save (Whisper's
  // decoder step 0.87x), bench/results/cpu-paged-nhd-2026-12-05-xeon.md.
  plan.interleaved_scores = streams && !overrides.is_off("interleaved-scores");
  // The pair dot product's scores only where they run faster than the float32 products (bf16_dot::pays), or forced.
  plan.bf16_dot = p.dtype == DType::bf16 && p.k_storage.type == KvType::Float && plan.group_rows > kMaxFewRows &&
                  !plan.amx && !overrides.is_off("bf16-dot") && bf16_dot::available() &&
                  (bf16_dot::pays() || overrides.kernel == "bf16-dot");
  plan.row_blocks = ceil_div(plan.group_rows, kRowBlock);
  const std::int64_t base_items = p.batch * p.kv_heads * plan.row_blocks;
  plan.base_items = base_items;
  plan.split_keys = std::max<std::int64_t>(p.k_len, 1);
  if (base_items > 0 && base_items < kTargetItems && p.k_len >= 2 * kMinSplitKeys) {
    const std::int64_t want = std::min({ceil_div(kTargetItems, base_items), p.k_len / kMinSplitKeys, kMaxSplits});
    plan.split_keys = ceil_div(ceil_div(p.k_len, want), kKeyTile) * kKeyTile;
    plan.splits = ceil_div(p.k_len, plan.split_keys);
  }
  plan.kv_heads_per_item = kv_heads_per_item(p, plan, base_items, threads);
  plan.items = p.batch * ceil_div(p.kv_heads, plan.kv_heads_per_item) * plan.row_blocks * plan.splits;
  plan.threads = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, plan.items)));
  plan.item_chunk = item_chunk(p, plan);
  plan_widened_rows(p, plan);
  plan.widened_keys = widened_keys(p, plan, overrides);
  plan.prefetch_tiles = plan.prefetch_ahead && plan.group_rows > kMaxFewRows && !plan.amx && plan.widened_keys == 0 &&
                        p.k_storage.type == KvType::Float && p.v_storage.type == KvType::Float;
  plan.prefetch_items = plan.group_rows > kMaxFewRows && call_bytes(p) / plan.threads > l2_bytes() &&
                        !overrides.is_off("prefetch-items");
  plan.workspace_bytes = carve_workspace(nullptr, p.head_dim, p.v_head_dim, plan.widened_keys,
                                         plan.amx ? p.dtype : DType::f32, nullptr);
  plan.partial_bytes = plan.splits > 1 ? align_up(partial_floats(p.v_head_dim) * sizeof(float)) : 0;
  plan.scratch_bytes = static_cast<std::size_t>(plan.threads) * plan.workspace_bytes +
                       static_cast<std::size_t>(plan.items * plan.kv_heads_per_item) * plan.partial_bytes;
  return plan;
}

std::string describe(const TiledPlan& plan) {
  std::string s = "cpu.tiled[" + simd_target_name() + "] " + std::to_string(plan.items) + " items of " +
                  std::to_string(kRowBlock) + " rows x " + std::to_string(kKeyTile) + "-key tiles, " +
                  std::to_string(plan.threads) + " threads";
  if (plan.group_rows <= kMaxFewRows) s += ", few-rows items (dot products along the head dim)";
  if (plan.group_rows <= kMaxFewRows && (plan.prefetch_v || plan.prefetch_ahead)) {
    s += ", K/V rows prefetched a tile ahead";
  }
  if (plan.prefetch_tiles) s += ", the next tile's K/V rows prefetched";
  if (plan.prefetch_items) s += ", the next item's rows fetched early";
  if (plan.amx) s += ", AMX bfloat16 tiles for the products";
  if (plan.amx && plan.f16_terms) s += " (float16 as two bfloat16 terms)";
  if (plan.amx) s += plan.p_terms == 1 ? ", P rounded to bfloat16" : ", P as three bfloat16 terms";
  if (plan.bf16_dot) s += ", vdpbf16ps scores";
  if (plan.widened_keys > 0) s += plan.amx ? ", K/V staged once per head and thread" : ", K/V widened once per head and thread";
  if (plan.kv_heads_per_item > 1) {
    s += ", " + std::to_string(plan.kv_heads_per_item) + " K/V heads per item (interleaved heads' rows read whole)";
    if (plan.interleaved_scores) s += ", their scores in turns by group of keys";
  }
  if (plan.splits > 1) {
    s += ", split-k " + std::to_string(plan.splits) + " x " + std::to_string(plan.split_keys) + " keys (" +
         std::to_string(plan.base_items) + " row blocks under " + std::to_string(kTargetItems) + ")";
  }
  return s;
}

void run_tiled(const AttentionProblem& p, const AttentionArgs& a, const TiledPlan& plan, std::byte* scratch) {
  if (plan.items == 0) return;
  const core::SequenceAccess seqs = core::sequence_access(p, a);
  std::byte* partials = scratch + static_cast<std::size_t>(plan.threads) * plan.workspace_bytes;
  auto workspace = [&](int thread) {
    Workspace w{};
    carve_workspace(scratch + static_cast<std::size_t>(thread) * plan.workspace_bytes, p.head_dim, p.v_head_dim,
                    plan.widened_keys, plan.amx ? p.dtype : DType::f32, &w);
    return w;
  };
  if (plan.widened_keys > 0) {  // no thread holds a head's widened K/V from an earlier call yet
    for (int t = 0; t < plan.threads; ++t) workspace(t).widened_for[0] = -1;
  }
  auto item_cost = [&](std::int64_t item) {
    const ItemJob job = make_job(p, a, seqs, plan, decode_item(p, plan, item), nullptr);
    return 4 * job.kv_span * job.rows * std::max<std::int64_t>(job.key_end - job.key_begin, 1) * p.head_dim;
  };

  auto run_item = [&](std::int64_t item) {
    const Workspace w = workspace(omp_get_thread_num());
    ItemJob job = make_job(p, a, seqs, plan, decode_item(p, plan, item), &w);
    if (job.rows == 0) return;
    if (plan.splits > 1) {  // one slot per head of the item's span
      job.partial = reinterpret_cast<float*>(partials + static_cast<std::size_t>(item * plan.kv_heads_per_item) * plan.partial_bytes);
      job.partial_head_stride = static_cast<std::int64_t>(plan.partial_bytes / sizeof(float));
    }
    // (the tiled items' guess of the thread's next item: prefetch_next_item)
    ItemJob next{};
    const std::int64_t guess = (item + 1) % plan.item_chunk != 0 ? item + 1 : item + 1 + (plan.threads - 1) * plan.item_chunk;
    if (plan.prefetch_items && job.rows > kMaxFewRows && job.kv_span == 1 && guess < plan.items) {
      next = make_job(p, a, seqs, plan, decode_item(p, plan, guess), &w);
      job.next = &next;
    }
    if (job.kv_span > 1) {
      run_few_rows_wide_dispatched(job);
    } else if (job.rows <= kMaxFewRows) {
      run_few_rows_dispatched(job);
    } else {
      run_item_dispatched(job);
    }
  };
  auto merge_block = [&](std::int64_t block) {  // each head of the block's span in turn
    const Workspace w = workspace(omp_get_thread_num());
    const ItemJob job = make_job(p, a, seqs, plan, decode_item(p, plan, block * plan.splits), &w);
    if (job.rows == 0) return;
    for (std::int64_t h = 0; h < job.kv_span; ++h) {
      ItemJob head = job;
      head.kvh = job.kvh + h;
      head.kv_span = 1;
      const std::size_t slot = static_cast<std::size_t>(block * plan.splits * plan.kv_heads_per_item + h);
      merge_partials(plan, head.rows, p.v_head_dim, reinterpret_cast<const float*>(partials + slot * plan.partial_bytes), w);
      finish_rows_dispatched(head);
    }
  };

  // One parallel region per call (a decode step is tens of microseconds: a second wake-up of the team for the
  // merge would be a share of it). The work budget cuts the items into consecutive runs ("launches"), each
  // ended by the loop's barrier; every item computes the same bits whichever run it lands in, so a cut call
  // equals the whole call. Every thread computes the same cuts.
  auto run_all = [&] {
    // (a local of the lambda: clang 14 crashed generating a schedule clause that reads through a capture)
    const std::int64_t chunk = plan.item_chunk;
    for (std::int64_t start = 0; start < plan.items;) {
      std::int64_t stop = start + 1;
      if (p.work_budget == 0) {
        stop = plan.items;
      } else {
        // Saturating: a call's total cost (4 * b * h * q * k * d) is not bounded by the size rule, only each item's.
        for (std::int64_t ops = item_cost(start);
             stop < plan.items && core::saturating_add(ops, item_cost(stop)) <= p.work_budget; ++stop)
          ops = core::saturating_add(ops, item_cost(stop));
      }
#pragma omp for schedule(dynamic, chunk)
      for (std::int64_t item = start; item < stop; ++item) run_item(item);
      start = stop;
    }
    if (plan.splits > 1) {
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t block = 0; block < plan.items / plan.splits; ++block) merge_block(block);
    }
  };
  // One thread: no parallel region (the worksharing loops above then run on the calling thread alone). Even a
  // team of one costs the runtime's barrier wake-ups, a share of a tiny call.
  if (plan.threads == 1) {
    run_all();
    return;
  }
#pragma omp parallel num_threads(plan.threads)
  run_all();
}

}  // namespace attnkit::cpu
