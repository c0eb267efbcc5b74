// The tile table of the tensor-core kernels: which head-dim buckets each is built for and the tile of each
// bucket (rows per block, keys per tile, shared-memory pitch and size), as constexpr functions that the host plan,
// the kernels and the tests all read, so the three cannot disagree.
//
// Head dims are buckets: a kernel is built for a bucket (DQK for Q and K, DV for V and O) and told the real dims
// at run time. Columns past a real dim are zero on load (copies of zero source bytes) and never stored, so a
// problem runs on the smallest built bucket pair that holds it. Adding a head dim is one entry of a bucket list.
// Host and device code (no CUDA types; C++17, as nvcc builds it), so the plan's tests run without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnkit::cuda {

// The Q/K and V widths a kernel instance is built for; qk == 0: none.
struct HeadDimBucket {
  int qk = 0;
  int v = 0;
  constexpr bool valid() const { return qk > 0; }
  constexpr bool operator==(const HeadDimBucket& o) const { return qk == o.qk && v == o.v; }
};

constexpr bool is_power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

// ---- mma.sync (sm_80+, float16 / bfloat16) ----

// The widths built for Q/K and V alike, where models use them: multiples of 32, and 80 (ViT-H's, Phi-2's and
// Stable Diffusion 1.5's 80, whose MMAs and tiles in the 96 bucket were a sixth zeros). 40 and 112 run in the next
// bucket up (a 48 bucket spilled 8 bytes in every build). The cluster merge (a lane's columns: multiples of 32) is
// not built at 80.
inline constexpr int kMmaBucketDims[] = {32, 64, 80, 96, 128, 160, 192, 256};
constexpr bool mma_cluster_merge_built(int v) { return v <= 128 && v % 32 == 0; }
// Pairs with V narrower than Q/K, built as instances of their own (DeepSeek / Kimi MLA prefill: 192 for Q/K,
// 128 for V). Any other unequal pair runs in the equal bucket of its wider dim.
inline constexpr HeadDimBucket kMmaUnequalBuckets[] = {{192, 128}};

inline constexpr int kMmaRows = 64;      // rows per block: 4 warps of 16
inline constexpr int kMmaThreads = 128;

// Keys per tile. The warp's 16 x DV float32 accumulator and its 16 x keys scores share 255 registers per thread:
// 16 keys at DV 256 (the accumulator alone is 128 registers), 32 above 128, 64 up to 128, and 128 at 32 (whose
// accumulator is 16 registers: a 128-token sequence is one tile, one dependent load-score-softmax chain).
constexpr int mma_tile_keys(HeadDimBucket b) {
  if (b.v > 192) return 16;
  if (b.v > 128) return 32;
  if (b.qk <= 32 && b.v <= 32) return 128;
  return 64;
}

// Elements per shared row of a tile `width` wide. Widths of a power-of-two number of 16-byte chunks XOR-swizzle
// the chunks by row (conflict-free ldmatrix at the width itself); other widths pad the row to an odd number of
// chunks, which puts the 8 rows an ldmatrix reads at one column in 8 different bank groups.
constexpr int smem_pitch(int width) {
  const int chunks = width / 8;
  if (is_power_of_two(chunks)) return width;
  return (chunks % 2 == 0 ? chunks + 1 : chunks) * 8;
}

// The smallest built pair that holds (head_dim, v_head_dim), by the work it does per key (qk + v); none past 256.
constexpr HeadDimBucket mma_bucket(std::int64_t head_dim, std::int64_t v_head_dim) {
  HeadDimBucket best{};
  const auto consider = [&](HeadDimBucket b) {
    if (b.qk >= head_dim && b.v >= v_head_dim && (!best.valid() || b.qk + b.v < best.qk + best.v)) best = b;
  };
  for (int d : kMmaBucketDims) consider({d, d});
  for (HeadDimBucket b : kMmaUnequalBuckets) consider(b);
  return best;
}

// Shared memory of one mma.sync block of element size `elem`: Q, `buffers` K and V tiles each (2 for float K/V,
// double-buffered; 1 for a quantized cache, converted from its raw tiles just before use), the row tables, and
// for a quantized cache the scales and the double-buffered raw tiles (`raw_row_bytes` per stored row).
constexpr std::size_t mma_smem_bytes_for(HeadDimBucket b, int elem, int buffers, int raw_row_bytes) {
  const std::size_t keys = static_cast<std::size_t>(mma_tile_keys(b));
  const std::size_t tiles = (static_cast<std::size_t>(kMmaRows) * smem_pitch(b.qk) +
                             buffers * keys * (smem_pitch(b.qk) + smem_pitch(b.v))) * elem;
  const std::size_t row_tables = 4 * kMmaRows * sizeof(int);
  if (raw_row_bytes == 0) return tiles + row_tables;
  return tiles + row_tables + (b.qk + b.v) * sizeof(float) + 4 * keys * raw_row_bytes;
}

// The shared memory an sm_80 / sm_90 block may opt into: every entry of the table fits the smaller (sm_80's).
inline constexpr std::size_t kSm80SmemOptin = 163 * 1024;

// ---- wgmma (sm_90a, float16 / bfloat16) ----

// The wgmma kernel's tiles are 64-column boxes in the 128-byte swizzle: buckets are multiples of 64, one for Q/K
// and V alike (the wider dim's: warpgroup_width), and a float K/V row must be whole 16-byte chunks (head dims a
// multiple of 8: TMA's strides). Columns past the real dims arrive as zeros (the TMA's out-of-bounds fill) and are
// never stored.
inline constexpr int kWarpgroupBucketDims[] = {64, 128, 192, 256};
constexpr std::int64_t warpgroup_width(std::int64_t head_dim, std::int64_t v_head_dim) {
  return head_dim > v_head_dim ? head_dim : v_head_dim;
}
constexpr int warpgroup_bucket(std::int64_t head_dim) {
  for (int d : kWarpgroupBucketDims) {
    if (d >= head_dim) return d;
  }
  return 0;
}

// Within a bucket, the columns the wgmma kernel's MMAs cover: S = Q Kᵀ runs qk / 16 k-steps and O += P V runs
// over v columns (whole MMAs of its output: 128 in the 128 bucket, 64 in the 192 bucket), so a head dim of 80 does
// 5 of the 128 bucket's 8 k-steps of S and MLA's V of 128 2 of the 192 bucket's 3 MMAs of P V. The tiles, shared
// memory and rows are the bucket's (what the MMAs skip is the TMA's zero fill). One build per entry; a problem
// takes the narrowest entry of its bucket that holds its dims, else the bucket's full build.
struct WarpgroupWidths {
  int bucket = 0;
  int qk = 0;
  int v = 0;
  constexpr bool narrow() const { return qk < bucket || v < bucket; }
};
inline constexpr WarpgroupWidths kWarpgroupNarrowBuilds[] = {{128, 80, 128}, {128, 96, 128}, {192, 160, 192},
                                                             {192, 192, 128}};
constexpr WarpgroupWidths warpgroup_widths(std::int64_t head_dim, std::int64_t v_head_dim, bool allow_narrow) {
  const int bucket = warpgroup_bucket(warpgroup_width(head_dim, v_head_dim));
  WarpgroupWidths best{bucket, bucket, bucket};
  if (!allow_narrow) return best;
  for (WarpgroupWidths w : kWarpgroupNarrowBuilds) {
    if (w.bucket == bucket && w.qk >= head_dim && w.v >= v_head_dim && w.qk + w.v < best.qk + best.v) best = w;
  }
  return best;
}

// Prefill at a head dim between buckets: the wgmma kernel in its wider bucket ran faster than mma.sync in its finer
// one at every head dim from 40 to 256 on the H200 (1.1-2.3x, batch 4 x 16 x 2048; mma.sync's rate is 0.40-0.60 of
// wgmma's: bench/results/2026-12-01-h200-cuda-head-dims-first.md). At 32 and below (bucket 64, half of it zeros)
// it pays only on long rows of keys: from 512 keys without a causal mask (head dims 16 and 32 1.2-1.5x, 24 level to
// 1.1x) and from 4096 with one (1.02-1.23x); on shorter ones (MiniLM's 128 tokens, causal 512-2048) mma.sync's
// finer bucket is up to 1.4x faster (bench/results/2026-12-03-h200-small-head-dims.md).
constexpr bool warpgroup_bucket_pays(std::int64_t head_dim, bool long_keys) { return head_dim > 32 || long_keys; }
// Prefill over few keys (a ViT's 257 tokens, a UNet's cross-attention over 77 text tokens) at a head dim up to 96
// that is not a wgmma bucket: the mma.sync kernel's 64-key tiles and finer bucket ran faster on the H200 (d 40 over
// 77 keys 16.1 against 17.5 us, over 256 13.0 against 15.1; d 80 over 257 109 against 114, causal 94 against 119;
// d 96 over 257 111 against 114), while from 512 keys the wgmma kernel leads (d 40 20.8 against 22.6, d 80 49.8
// against 70.1), and at d 112 even over 128 keys (48.6 against 56.8;
// bench/results/2026-12-05-h200-split-tiles-and-short-keys.md). Above 96 mma.sync's bucket is 128 too, so only its
// shorter tiles would speak for it: at d 104 over 128 keys the wgmma kernel ran 1.14x faster (H100, 73.4 against
// 64.4 us; bench/results/2026-12-07-h100-main-checked-tiny-grid-and-random-seed9.md).
inline constexpr std::int64_t kShortRowKeys = 320;
constexpr bool short_rows_prefer_mma(std::int64_t width, std::int64_t k_len) {
  return width <= 96 && width % 64 != 0 && k_len <= kShortRowKeys;
}
// Whether a prefill's rows see enough keys for the wgmma bucket at head dims up to 32 (above).
constexpr bool long_keys_for_small_dims(bool causal, bool windowed, std::int64_t k_len) {
  return !windowed && k_len >= (causal ? 4096 : 512);
}

// ---- the float32 kernel on tensor cores (three TF32 products per product) ----

inline constexpr int kTf32BucketDims[] = {32, 64, 96, 128};
inline constexpr int kTf32Rows = 64;
inline constexpr int kTf32TileKeys = 32;
constexpr int tf32_pitch(int width) { return width + 4; }  // floats: 4 banks on per row, conflict-free fragments
constexpr HeadDimBucket tf32_bucket(std::int64_t head_dim, std::int64_t v_head_dim) {
  const std::int64_t wider = head_dim > v_head_dim ? head_dim : v_head_dim;
  for (int d : kTf32BucketDims) {
    if (d >= wider) return {d, d};
  }
  return {};
}
constexpr std::size_t tf32_smem_bytes_for(HeadDimBucket b) {
  return static_cast<std::size_t>(kTf32Rows + 4 * kTf32TileKeys) * tf32_pitch(b.qk) * sizeof(float);
}

}  // namespace attnkit::cuda
