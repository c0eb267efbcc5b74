// The CUDA plan's policy (src/cuda/plan/cuda_plan.cu) on the host, with the device described by hand: no GPU needed,
// so this runs in CI. Each expectation is a rule of the plan (docs/design.md, "The CUDA kernels"), on the
// PERF.md shapes and an H200-like device (132 SMs, compute capability 9.0, 3 mma.sync blocks per SM at head dims
// 32 and 64, 2 wgmma blocks at head dim 64 (3 in the build of three per SM) and 1 above); the describe() strings
// of several of them were read off the H200 (bench/results/).
#include <cuda/plan/cuda_plan.hpp>
#include <cuda/config/tile_table.hpp>

#include "core/problem_check.hpp"
#include "core/work_rounds.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace attnkit::test {
namespace {

using cuda::CudaPlan;
using Kernel = CudaPlan::Kernel;

cuda::DeviceTraits h200(std::int64_t head_dim, bool sm90 = true) {
  cuda::DeviceTraits d;
  d.sm_count = 132;
  d.sm90 = sm90;
  d.resident_blocks = [head_dim](Kernel k) {
    return k == Kernel::Warpgroup ? (head_dim == 64 ? 2 : 1) : k == Kernel::TensorCore ? 3 : 2;
  };
  d.warpgroup_three_resident = head_dim == 64 && sm90 ? 3 : 0;
  return d;
}

AttentionProblem shape(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t sq, std::int64_t sk,
                       std::int64_t d, bool causal, DType dtype = DType::f16) {
  AttentionProblem p = AttentionProblem::head_first(b, h, hkv, sq, sk, d, dtype);
  p.causal = causal;
  return core::normalize_and_check(p);
}

// A decode step (one query, causal) over up to sk keys with device key lengths (a serving step), normalised.
AttentionProblem lengths_step(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t sk, std::int64_t d,
                              DType dtype = DType::bf16) {
  AttentionProblem p = AttentionProblem::head_first(b, h, hkv, 1, sk, d, dtype);
  p.causal = true;
  p.has_key_lengths = true;
  return core::normalize_and_check(p);
}

// Whisper's encoder shape (12 heads, 1500 tokens) with a mask: the general build.
AttentionProblem masked_encoder(std::int64_t head_dim) {
  AttentionProblem p = AttentionProblem::head_first(1, 12, 12, 1500, 1500, head_dim, DType::f16);
  p.has_mask = true;
  p.mask = Layout::head_first(12, 1500, 1500);
  return core::normalize_and_check(p);
}

CudaPlan plan_of(const AttentionProblem& p, bool sm90 = true, bool allow_special = true,
                 const std::string& overrides = "") {
  return cuda::plan_for(p, allow_special, h200(p.head_dim, sm90), parse_plan_overrides(overrides));
}
// (a name of its own: a string literal would convert to plan_of's bool)
CudaPlan plan_with(const AttentionProblem& p, const std::string& overrides) { return plan_of(p, true, true, overrides); }

// Head dim 64: the wgmma kernel's blocks are 64 rows, two per SM, the mma.sync kernel's grid; prefill takes it.
TEST(CudaPlan, HeadDim64PrefillTakesTheHopperKernelsPairedBlocks) {
  const CudaPlan bert_b8_s128 = plan_of(shape(8, 12, 12, 128, 128, 64, false));
  EXPECT_EQ(cuda::describe(bert_b8_s128), "cuda.wgmma 192 blocks of 64 rows, 76192 B shared, 132 SMs, plain, 3 per SM");
  const CudaPlan bert_b1_s512 = plan_of(shape(1, 12, 12, 512, 512, 64, false));
  EXPECT_EQ(bert_b1_s512.kernel, Kernel::Warpgroup);
  EXPECT_EQ(bert_b1_s512.blocks, 96);
  EXPECT_EQ(bert_b1_s512.splits, 1) << "a 512-key range is not split (the merge of every row costs more)";
  const CudaPlan bert_b1_s128 = plan_of(shape(1, 12, 12, 128, 128, 64, false));
  EXPECT_EQ(bert_b1_s128.kernel, Kernel::Warpgroup);
  EXPECT_EQ(bert_b1_s128.blocks, 24);
  EXPECT_EQ(plan_of(shape(1, 12, 12, 128, 128, 64, false), /*sm90=*/false).kernel, Kernel::TensorCore);
}

// Head dims 128 and 256: one 128-row block per SM.
TEST(CudaPlan, OneWaveGridsOfAQuarterOfTheSmsOrMoreTakeTheHopperKernel) {
  const CudaPlan h128 = plan_of(shape(8, 12, 12, 128, 128, 128, false));
  EXPECT_EQ(h128.kernel, Kernel::Warpgroup);
  EXPECT_EQ(h128.blocks, 96);
  // 12 blocks of 128 rows: twice as many mma.sync blocks of 64 rows on twice the SMs.
  const CudaPlan tiny = plan_of(shape(1, 12, 12, 128, 128, 128, false));
  EXPECT_EQ(tiny.kernel, Kernel::TensorCore);
  EXPECT_EQ(tiny.blocks, 24);
}

TEST(CudaPlan, MultiWaveGridsTakeTheHopperKernelWhenTheirLastWaveIsFull) {
  EXPECT_EQ(cuda::describe(plan_of(shape(8, 12, 12, 512, 512, 64, false))),
            "cuda.wgmma 768 blocks of 64 rows, 76192 B shared, 132 SMs, plain, 3 per SM, persistent grid of 396");
  const CudaPlan llama_prefill = plan_of(shape(1, 32, 8, 4096, 4096, 128, true));
  EXPECT_EQ(llama_prefill.kernel, Kernel::Warpgroup);
  EXPECT_EQ(llama_prefill.blocks, 8 * 4096 * 4 / 128);
  EXPECT_EQ(llama_prefill.splits, 1);
  // 144 blocks of 128 rows are one wave and 9% of another: the mma.sync kernel's 288 smaller blocks instead,
  // except in the plain build (no mask, rule, ...), where the wgmma kernel still runs it faster.
  const CudaPlan whisper_masked = plan_of(masked_encoder(128));
  EXPECT_EQ(whisper_masked.kernel, Kernel::TensorCore);
  EXPECT_EQ(whisper_masked.blocks, 12 * 24);
  EXPECT_EQ(whisper_masked.splits, 1);
  const CudaPlan whisper_plain = plan_of(shape(1, 12, 12, 1500, 1500, 128, false));
  EXPECT_EQ(whisper_plain.kernel, Kernel::Warpgroup);
  EXPECT_EQ(whisper_plain.blocks, 132 + 12 * 6) << "the 12 row blocks past the first wave split in 6 ranges";
  EXPECT_TRUE(whisper_plain.plain);
  // At head dim 64 the masked encoder takes the wgmma kernel's 64-row blocks too.
  const CudaPlan whisper_masked64 = plan_of(masked_encoder(64));
  EXPECT_EQ(whisper_masked64.kernel, Kernel::Warpgroup);
  EXPECT_EQ(whisper_masked64.blocks, 12 * 24);
}

TEST(CudaPlan, ADecoderStepOnATinyGridSplitsIntoShortRanges) {
  // 12 heads, one query: 12 blocks would each walk every key; ranges down to one 64-key tile.
  // On sm_90 the ranges of a row block run as one thread-block cluster and merge there (at most 16 of them).
  EXPECT_EQ(cuda::describe(plan_of(shape(1, 12, 12, 1, 448, 64, true))),
            "cuda.tensor-core 84 blocks of 64 rows, 41984 B shared, 132 SMs, split-k 7 x 64 keys, cluster merge, plain");
  const CudaPlan cross = plan_of(shape(1, 12, 12, 1, 1500, 64, false));
  EXPECT_EQ(cross.kernel, Kernel::TensorCore);
  EXPECT_TRUE(cross.cluster_merge);
  EXPECT_EQ(cross.splits, 12);
  EXPECT_EQ(cross.split_keys, 128);
  // (the partials' scratch stays: a run whose pointers send it to the SIMT kernel takes the merge pass)
  EXPECT_EQ(cross.scratch_bytes, cuda::kFlagBytes + static_cast<std::size_t>(12 * 12 * 64 * (3 + 64)) * 4);
  // A split past 16 ranges: the merge pass.
  const CudaPlan many = plan_with(shape(1, 12, 12, 1, 2048, 64, false), "splits=32");
  EXPECT_EQ(many.splits, 32);
  EXPECT_FALSE(many.cluster_merge);
  // Elsewhere, or switched off, the merge pass over the same ranges.
  for (const bool sm90 : {false, true}) {
    const CudaPlan merged = plan_of(shape(1, 12, 12, 1, 1500, 64, false), sm90, true, sm90 ? "off=cluster" : "");
    EXPECT_EQ(merged.kernel, Kernel::TensorCore);
    EXPECT_FALSE(merged.cluster_merge);
    EXPECT_EQ(merged.splits, 12);
    EXPECT_EQ(merged.split_keys, 128);
    EXPECT_EQ(merged.scratch_bytes, cuda::kFlagBytes + static_cast<std::size_t>(12 * 12 * 64 * (3 + 64)) * 4);
  }
}

TEST(CudaPlan, ALongCacheDecodeStreamsOnTheHopperKernelInWholeRounds) {
  const CudaPlan b64 = plan_of(shape(64, 32, 8, 1, 4096, 128, true));
  EXPECT_EQ(b64.kernel, Kernel::Warpgroup);
  EXPECT_EQ(b64.blocks % (64 * 8), 0);
  EXPECT_LE(b64.key_ranges(), 4);
  const CudaPlan b8 = plan_of(shape(8, 32, 8, 1, 32768, 128, true));
  EXPECT_EQ(b8.kernel, Kernel::Warpgroup);
  EXPECT_EQ(b8.key_ranges(), 2) << "64 (batch, K/V head) pairs in two ranges: 128 blocks, 97% of one round";
  // Ranges of whole 128-key tiles: batch 1 x 8 K/V heads over 8192 keys in 16 ranges of 512 (not 15 of 576).
  const CudaPlan b1 = plan_of(shape(1, 32, 8, 1, 8192, 128, true));
  EXPECT_EQ(b1.kernel, Kernel::Warpgroup);
  EXPECT_EQ(b1.key_ranges(), 16);
  EXPECT_EQ(b1.range_keys(), 512);
}

// A dense decode step's key split runs on the wgmma kernel's plain build as a tail from row block 0 (each block a
// range that leaves its partial): the same ranges and blocks as the general build's split-k, which keeps problems
// the plain build does not take (key lengths) and runs under off=plain.
TEST(CudaPlan, ADenseDecodeSplitRunsThePlainBuildAsATail) {
  const CudaPlan b1 = plan_of(shape(1, 32, 8, 1, 8192, 128, true));
  EXPECT_TRUE(b1.plain);
  EXPECT_TRUE(b1.split_as_tail());
  EXPECT_EQ(b1.splits, 1);
  EXPECT_EQ(b1.blocks, 8 * 16);
  EXPECT_NE(cuda::describe(b1).find("plain"), std::string::npos) << cuda::describe(b1);
  const CudaPlan general = plan_with(shape(1, 32, 8, 1, 8192, 128, true), "off=plain");
  EXPECT_FALSE(general.plain);
  EXPECT_EQ(general.splits, 16);
  EXPECT_EQ(general.blocks, b1.blocks);
  // Device key lengths: the same plain split tail (each piece ends at its entry's length), in ranges short
  // enough for kLengthRounds rounds of blocks on the SMs (the real lengths leave many short or empty).
  const CudaPlan with_lengths = plan_of(lengths_step(1, 32, 8, 8192, 128));
  EXPECT_TRUE(with_lengths.plain);
  EXPECT_TRUE(with_lengths.split_as_tail());
  EXPECT_GE(with_lengths.key_ranges(), b1.key_ranges());
  EXPECT_EQ(plan_with(lengths_step(1, 32, 8, 8192, 128), "off=plain").key_ranges(), with_lengths.key_ranges());
  // Where the run finds the plain build cannot take it (the GQA op's launch under its pre-pass), the general
  // build runs the dense step's split.
  EXPECT_EQ(with_lengths.fallback_splits, b1.key_ranges());
  EXPECT_EQ(b1.fallback_splits, b1.key_ranges());
  EXPECT_EQ(b1.fallback_split_keys, b1.range_keys());
  const CudaPlan serving = plan_of(lengths_step(32, 32, 8, 8192, 128));
  EXPECT_TRUE(serving.split_as_tail()) << cuda::describe(serving);
  EXPECT_GE(serving.blocks, 8 * 132) << cuda::describe(serving);
  EXPECT_LE(serving.range_keys(), 2048) << cuda::describe(serving);
  // Ranges of at most 2,048 keys (the plain build's) where the rounds alone would leave them longer.
  const CudaPlan serving64 = plan_of(lengths_step(64, 32, 8, 8192, 128));
  EXPECT_TRUE(serving64.split_as_tail()) << cuda::describe(serving64);
  EXPECT_EQ(serving64.range_keys(), 2048) << cuda::describe(serving64);
  // A range keeps 64 keys a row (the merge's partials): 32 query heads on one K/V head keep the dense step's 8
  // ranges of 2,048 keys over 16k.
  const CudaPlan mqa = plan_of(lengths_step(16, 32, 1, 16384, 128));
  EXPECT_TRUE(mqa.split_as_tail()) << cuda::describe(mqa);
  EXPECT_EQ(mqa.key_ranges(), 8) << cuda::describe(mqa);
  // A paged cache with one query per sequence (causal per sequence: the query sees all of its keys) takes the
  // same plain pieces; a chunk of two queries or ragged queries keep the general build.
  const auto paged_step = [](std::int64_t queries) {
    AttentionProblem p = AttentionProblem::head_first(32, 32, 8, queries, 8192, 128, DType::bf16);
    p.causal = true;
    p.has_key_lengths = true;
    p.k = p.v = Layout::positions_first(8, 16, 128);  // [pages, 16 keys, K/V heads, dim]
    p.sequences.page_size = 16;
    p.sequences.num_pages = 32 * 512;
    p.sequences.max_pages_per_seq = 512;
    return plan_of(core::normalize_and_check(p));
  };
  const CudaPlan paged = paged_step(1);
  EXPECT_EQ(paged.kernel, Kernel::Warpgroup) << cuda::describe(paged);
  EXPECT_TRUE(paged.split_as_tail()) << cuda::describe(paged);
  EXPECT_EQ(paged.key_ranges(), serving.key_ranges());
  EXPECT_FALSE(paged_step(2).split_as_tail()) << cuda::describe(paged_step(2));
  // (the GPU test's 64:1 shape at head dim 64 streams on the wgmma kernel's plain build too)
  const CudaPlan mqa64 = plan_of(lengths_step(8, 64, 1, 8192, 64, DType::f16));
  EXPECT_TRUE(mqa64.split_as_tail()) << cuda::describe(mqa64);
  // Ranges past the plain build's key count (a long cache split in few ranges) keep the general build.
  const CudaPlan b64 = plan_of(shape(64, 32, 8, 1, 32768, 128, true));
  EXPECT_FALSE(b64.split_as_tail()) << cuda::describe(b64);
}

// A split prefill's ranges are whole tiles too: 71 query heads on one K/V head (two 64-row blocks per entry) over
// 2048 keys in 4 ranges of 512, not 5 of 448 (3.5 of the wgmma kernel's 128-key tiles).
TEST(CudaPlan, SplitRangesAreWholeTilesOfTheKernel) {
  const CudaPlan mqa71 = plan_of(shape(32, 71, 1, 1, 2048, 64, true));
  EXPECT_EQ(mqa71.kernel, Kernel::Warpgroup);
  EXPECT_EQ(mqa71.key_ranges(), 4);
  EXPECT_EQ(mqa71.range_keys(), 512);
  // A forced count is kept where whole tiles make it, and rounded down where they do not (7 tiles in 5 ranges: 4).
  EXPECT_EQ(plan_with(shape(1, 32, 8, 1, 8192, 128, true), "kernel=wgmma,splits=32").key_ranges(), 32);
  const CudaPlan odd = plan_with(shape(1, 32, 8, 1, 896, 128, true), "kernel=wgmma,splits=5");
  EXPECT_EQ(odd.key_ranges(), 4);
  EXPECT_EQ(odd.range_keys(), 256);
}

// Prefill-sized rows on a small grid (a speculative verify step of 16 tokens x 8 heads a group) split for the
// soonest finish of the wgmma kernel's rounds of one block per SM, not for two blocks per SM: 64 row blocks over 4k
// keys in 2 ranges (one round), where 5 ranges made three rounds (104 against 79 us on the H100).
TEST(CudaPlan, APrefillSplitOnTheHopperKernelEndsInWholeRounds) {
  const CudaPlan verify = plan_of(shape(8, 64, 8, 16, 4096, 128, true));
  EXPECT_EQ(verify.kernel, Kernel::Warpgroup);
  EXPECT_EQ(verify.row_blocks, 1);
  EXPECT_EQ(verify.key_ranges(), 2);
  EXPECT_LE(verify.blocks, 132);
  // The mma.sync kernel's split (several blocks per SM) keeps its rule: two blocks per SM of the grid.
  const CudaPlan mma = plan_with(shape(8, 64, 8, 16, 4096, 128, true), "kernel=mma");
  EXPECT_EQ(mma.row_blocks, 2);
  EXPECT_EQ(mma.key_ranges(), 3) << "128 row blocks: ceil(2 x 132 / 128) ranges";
}

// A step of at most two row blocks per K/V head on a grid of a quarter of the SMs or fewer splits key ranges from
// 512 keys on (tiny_grid_split_applies); a larger grid, or prefill-sized rows, over the same keys do not.
TEST(CudaPlan, ATinyGridSplitsShortKeyRanges) {
  const CudaPlan verify = plan_of(shape(1, 128, 16, 8, 1024, 104, true, DType::bf16));  // 16 blocks of 64 rows
  EXPECT_EQ(verify.kernel, Kernel::TensorCore);
  EXPECT_EQ(verify.key_ranges(), 4) << "ranges of kMinSplitKeys (256): 64 blocks";
  const CudaPlan falcon = plan_of(shape(8, 71, 1, 1, 1000, 80, true, DType::bf16));  // 71 rows: 2 blocks a head
  EXPECT_EQ(falcon.key_ranges(), 3);
  const CudaPlan chunk = plan_of(shape(1, 2, 2, 64, 1088, 256, true, DType::bf16));
  EXPECT_EQ(chunk.key_ranges(), 4);
  EXPECT_EQ(plan_of(shape(1, 128, 16, 8, 500, 104, true, DType::bf16)).key_ranges(), 1) << "under 512 keys";
  EXPECT_EQ(plan_of(shape(8, 56, 8, 5, 1024, 40, true, DType::bf16)).key_ranges(), 1) << "64 blocks: half the SMs";
  EXPECT_EQ(plan_of(shape(1, 4, 2, 512, 512, 96, false, DType::bf16)).key_ranges(), 1) << "prefill-sized rows";
}

// Up to a consumer warpgroup's 64 rows per K/V head over a long cache stream the same way: each K/V tile is read
// once for all of a group's query rows.
TEST(CudaPlan, MultiQueryDecodeReadsEachTileOnceForTheGroupAndFillsTheSms) {
  const CudaPlan mqa = plan_of(shape(16, 32, 1, 1, 16384, 128, true));
  EXPECT_EQ(mqa.kernel, Kernel::Warpgroup);
  EXPECT_EQ(mqa.row_blocks, 1) << "the 32 query heads of the one K/V head in one block";
  EXPECT_EQ(mqa.key_ranges(), 8) << "16 (batch, K/V head) pairs in eight ranges: 128 blocks, 97% of one round";
  const CudaPlan chunk = plan_of(shape(8, 32, 8, 8, 16384, 128, true));  // 8 speculative tokens x 4 heads a group
  EXPECT_EQ(chunk.kernel, Kernel::Warpgroup);
  EXPECT_EQ(chunk.row_blocks, 1);
  EXPECT_GE(core::round_fill(chunk.blocks, 132), 0.9);
  // A d64 group of 64 rows: one streaming block per SM (two per SM read the cache no faster).
  const CudaPlan d64 = plan_of(shape(16, 64, 1, 1, 16384, 64, true));
  EXPECT_EQ(d64.kernel, Kernel::Warpgroup);
  EXPECT_EQ(d64.key_ranges(), 8);
  EXPECT_GE(core::round_fill(d64.blocks, 132), 0.9);
}

// Where the stream starts (long_cache_stream): the measured sides of it.
TEST(CudaPlan, AShortCacheStaysOnTheMmaSyncKernel) {
  EXPECT_EQ(plan_of(shape(2, 32, 1, 1, 8192, 128, true)).kernel, Kernel::Warpgroup) << "8k keys per K/V head";
  EXPECT_EQ(plan_of(shape(1, 32, 32, 1, 4096, 128, true)).kernel, Kernel::Warpgroup) << "4k keys, 64 MiB";
  EXPECT_EQ(plan_of(shape(1, 32, 8, 1, 4096, 128, true)).kernel, Kernel::TensorCore) << "4k keys, 16 MiB";
  EXPECT_EQ(plan_of(shape(8, 16, 16, 1, 2048, 64, true)).kernel, Kernel::TensorCore) << "2k keys";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1, 1500, 64, false)).kernel, Kernel::TensorCore) << "Whisper's cross-attention";
}

// Above head dim 128 few rows per K/V head take the wgmma kernel over any cache (its 64-key tiles against
// mma.sync's 32 or 16); in the 64 bucket so do decode steps of 17-64 rows; otherwise the short-cache rule above stands.
TEST(CudaPlan, FewRowsOverShortCachesTakeTheWgmmaKernelWhereItsTilesPay) {
  EXPECT_EQ(plan_of(shape(1, 128, 32, 1, 1000, 192, true)).kernel, Kernel::Warpgroup) << "4 rows, d 192";
  EXPECT_EQ(plan_of(shape(1, 8, 1, 1, 4096, 256, true)).kernel, Kernel::Warpgroup) << "8 rows, d 256";
  EXPECT_EQ(plan_of(shape(1, 16, 8, 32, 1024, 256, true)).kernel, Kernel::Warpgroup) << "64 rows, d 256";
  EXPECT_EQ(plan_of(shape(4, 32, 8, 1, 2048, 160, true)).kernel, Kernel::Warpgroup) << "4 rows, d 160";
  EXPECT_EQ(plan_of(shape(1, 128, 32, 1, 1000, 192, true), /*sm90=*/false).kernel, Kernel::TensorCore) << "sm_80";
  EXPECT_EQ(plan_of(shape(8, 32, 8, 5, 2048, 64, true)).kernel, Kernel::TensorCore) << "20 rows, d 64, verify";
  EXPECT_EQ(plan_of(shape(1, 32, 1, 1, 4096, 48, true)).kernel, Kernel::Warpgroup) << "32 rows, d 48, decode";
  EXPECT_EQ(plan_of(shape(16, 64, 1, 1, 1024, 64, true)).kernel, Kernel::Warpgroup) << "64 rows, d 64, decode";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1, 448, 64, true)).kernel, Kernel::TensorCore) << "1 row: Whisper's decoder";
  EXPECT_EQ(plan_of(shape(1, 32, 8, 1, 4096, 128, true)).kernel, Kernel::TensorCore) << "4 rows, d 128";
}

// Decode steps of a group that does not divide the wgmma kernel's rows (Q by TMA as a run of heads), over 2k keys
// or more on a grid too small for mma.sync unsplit: the wgmma kernel. Shorter caches, grids that fill the SMs,
// groups that divide the rows and other head dims keep their kernels.
TEST(CudaPlan, OddGroupDecodeStepsOverLongerCachesTakeTheWgmmaKernel) {
  EXPECT_EQ(plan_of(shape(1, 28, 4, 1, 4096, 128, true, DType::bf16)).kernel, Kernel::Warpgroup) << "7 heads, b 1";
  EXPECT_EQ(plan_of(shape(16, 28, 4, 1, 2048, 128, true, DType::bf16)).kernel, Kernel::Warpgroup) << "7 heads, b 16";
  EXPECT_EQ(plan_of(shape(8, 40, 8, 1, 2048, 128, true, DType::bf16)).kernel, Kernel::Warpgroup) << "5 heads";
  EXPECT_EQ(plan_of(shape(4, 24, 2, 1, 3000, 64, true, DType::bf16)).kernel, Kernel::Warpgroup) << "12 heads, d 64";
  EXPECT_EQ(plan_of(lengths_step(8, 28, 4, 4096, 128)).kernel, Kernel::Warpgroup) << "device key lengths";
  EXPECT_EQ(plan_of(shape(32, 24, 2, 1, 1024, 64, true, DType::bf16)).kernel, Kernel::TensorCore) << "1k keys";
  EXPECT_EQ(plan_of(shape(64, 28, 4, 1, 1024, 128, true, DType::bf16)).kernel, Kernel::TensorCore) << "full grid";
  EXPECT_EQ(plan_of(shape(40, 28, 4, 1, 2048, 128, true, DType::bf16)).kernel, Kernel::TensorCore) << "160 heads";
  EXPECT_EQ(plan_of(shape(1, 32, 8, 1, 4096, 128, true, DType::bf16)).kernel, Kernel::TensorCore) << "4 divides 128";
  EXPECT_EQ(plan_of(shape(1, 28, 4, 1, 4096, 96, true, DType::bf16)).kernel, Kernel::TensorCore) << "head dim 96";
  EXPECT_EQ(plan_of(shape(1, 28, 4, 2, 4096, 128, true, DType::bf16)).kernel, Kernel::TensorCore) << "2 queries";
  EXPECT_EQ(plan_with(shape(1, 28, 4, 1, 4096, 128, true, DType::bf16), "off=plain").kernel, Kernel::TensorCore);
}

TEST(CudaPlan, PlainShortProblemsTakeThePlainBuild) {
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 128, 128, 64, false)).plain);
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 128, 128, 32, false)).plain) << "MiniLM, on the mma.sync kernel";
  EXPECT_TRUE(plan_of(shape(1, 12, 12, 1500, 1500, 64, false)).plain) << "Whisper's encoder";
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 512, 512, 64, false), /*sm90=*/false).plain);
  EXPECT_FALSE(plan_of(shape(4, 16, 16, 4096, 4096, 128, false)).plain) << "long key ranges keep the general build";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 128, 128, 64, true)).plain) << "causal";
  EXPECT_TRUE(plan_of(shape(1, 12, 12, 1, 448, 64, true)).plain) << "causal, but its one query sees every key";
  EXPECT_FALSE(plan_of(shape(1, 12, 12, 2, 448, 64, true)).plain) << "the first of two queries misses a key";
  EXPECT_TRUE(plan_of(shape(1, 12, 12, 1, 1500, 64, false)).plain) << "split, merged in clusters (sm_90)";
  EXPECT_FALSE(plan_of(shape(1, 12, 12, 1, 1500, 64, false), /*sm90=*/false).plain) << "split, the merge pass";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 128, 128, 64, false, DType::f32)).plain) << "float32 (tf32 kernel)";
  EXPECT_FALSE(plan_of(shape(2, 4, 4, 128, 128, 256, false)).plain) << "head dim 256";
  AttentionProblem masked = AttentionProblem::head_first(8, 12, 12, 128, 128, 64, DType::f16);
  masked.has_mask = true;
  masked.mask = Layout::head_first(12, 128, 128);
  EXPECT_FALSE(plan_of(core::normalize_and_check(masked)).plain) << "a mask";
  AttentionProblem capped = AttentionProblem::head_first(8, 12, 12, 128, 128, 64, DType::f16);
  capped.softcap = 30.0f;
  EXPECT_FALSE(plan_of(core::normalize_and_check(capped)).plain) << "a softcap";
  AttentionProblem odd = AttentionProblem::head_first(8, 12, 12, 128, 128, 64, DType::f16);
  odd.o.offset = 1;
  EXPECT_FALSE(plan_of(core::normalize_and_check(odd)).plain) << "output rows off pairs";
  AttentionProblem paired = AttentionProblem::head_first(8, 12, 12, 128, 128, 64, DType::f16);
  paired.o.offset = 2;
  EXPECT_FALSE(plan_of(core::normalize_and_check(paired)).plain) << "output rows on pairs, off 16 bytes";
}

// Head dim 64: every problem whose rows see their key ranges alone (no mask, no softcap) with the scale in the
// exponent runs three blocks per SM (128-key tiles, one at a time), in the plain build or the general one (causal
// rules, windows, key lengths; a decode step's few rows only without them, in a grid of at most one block per
// SM), however many rounds its grid is; a
// mask, a softcap, a split and off=three keep two.
TEST(CudaPlan, HeadDim64ProblemsThatSeeEveryKeyRunThreeBlocksPerSm) {
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 512, 512, 64, false)).three_per_sm) << "768 blocks";
  const CudaPlan whisper = plan_of(shape(1, 12, 12, 1500, 1500, 64, false));
  EXPECT_EQ(cuda::describe(whisper), "cuda.wgmma 288 blocks of 64 rows, 76192 B shared, 132 SMs, plain, 3 per SM");
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 128, 128, 64, false)).three_per_sm) << "192 blocks: one round";
  EXPECT_TRUE(plan_of(shape(1, 12, 12, 512, 512, 64, false)).three_per_sm) << "96 blocks";
  const CudaPlan long_keys = plan_of(shape(4, 32, 32, 4096, 4096, 64, false));
  EXPECT_TRUE(long_keys.three_per_sm) << "4096 keys: the general build";
  EXPECT_FALSE(long_keys.plain);
  const CudaPlan causal = plan_of(shape(1, 12, 12, 1500, 1500, 64, true));
  EXPECT_TRUE(causal.three_per_sm) << "causal";
  EXPECT_FALSE(causal.plain) << "causal: the general build";
  EXPECT_EQ(causal.persistent_places, 0) << "causal: one block per unit";
  EXPECT_EQ(cuda::describe(causal), "cuda.wgmma 288 blocks of 64 rows, 76192 B shared, 132 SMs, 3 per SM");
  EXPECT_FALSE(plan_of(masked_encoder(64)).three_per_sm) << "a mask";
  AttentionProblem lengths = AttentionProblem::head_first(8, 12, 12, 512, 512, 64, DType::f16);
  lengths.has_key_lengths = true;
  EXPECT_TRUE(plan_of(core::normalize_and_check(lengths)).three_per_sm) << "key lengths";
  AttentionProblem window = AttentionProblem::head_first(4, 16, 16, 2048, 2048, 64, DType::bf16);
  window.causal = true;
  window.window = 512;
  EXPECT_TRUE(plan_of(core::normalize_and_check(window)).three_per_sm) << "a sliding window";
  // A decode step (few rows per K/V head) takes it only where every row sees every key and its grid is at most
  // one block per SM: a wider one runs two per SM (three loaded some SMs with three blocks and left others idle).
  EXPECT_TRUE(plan_with(shape(16, 32, 8, 1, 8192, 64, false), "splits=1").three_per_sm) << "decode, 128 blocks";
  const CudaPlan wide_decode = plan_of(shape(32, 32, 8, 1, 8192, 64, false));
  EXPECT_EQ(wide_decode.splits, 1);
  EXPECT_FALSE(wide_decode.three_per_sm) << "decode, 256 blocks";
  EXPECT_FALSE(plan_of(shape(128, 32, 8, 1, 1024, 64, false)).three_per_sm) << "decode, 1024 blocks";
  // A step of a few rows per K/V head splits for one block per SM: batch 16 x 8 K/V heads (128 blocks) stays whole
  // and runs three per SM, batch 4 over 16k keys takes 4 ranges (128 blocks), not 8.
  const CudaPlan b16 = plan_of(shape(16, 32, 8, 1, 8192, 64, false));
  EXPECT_EQ(b16.splits, 1);
  EXPECT_TRUE(b16.three_per_sm) << "decode, 128 blocks";
  EXPECT_EQ(plan_of(shape(4, 32, 8, 1, 16384, 64, true)).splits, 4);
  AttentionProblem decode_lengths = AttentionProblem::head_first(16, 32, 8, 1, 8192, 64, DType::bf16);
  decode_lengths.has_key_lengths = true;
  EXPECT_FALSE(plan_with(core::normalize_and_check(decode_lengths), "splits=1").three_per_sm) << "decode, key lengths";
  AttentionProblem capped = AttentionProblem::head_first(8, 12, 12, 512, 512, 64, DType::f16);
  capped.softcap = 30.0f;
  EXPECT_FALSE(plan_of(core::normalize_and_check(capped)).three_per_sm) << "softcap";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 512, 512, 128, false)).three_per_sm) << "head dim 128";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 512, 512, 64, false), /*sm90=*/false).three_per_sm) << "mma.sync";
  // The general build takes it too (the plain and general builds give the same bits at the same tiles).
  const CudaPlan general = plan_with(shape(8, 12, 12, 512, 512, 64, false), "off=plain");
  EXPECT_TRUE(general.three_per_sm);
  EXPECT_FALSE(general.plain);
  // The plain build runs a persistent grid of the places where its last round is whole or two thirds full; one
  // round, a last round less full, the general build and off=persistent run one block per unit.
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false)).persistent_places, 396) << "768 blocks";
  EXPECT_EQ(plan_of(shape(12, 16, 16, 512, 512, 64, false)).persistent_places, 396) << "1,536 blocks";
  EXPECT_EQ(plan_of(shape(9, 11, 11, 512, 512, 64, false)).persistent_places, 396) << "792 blocks: two rounds";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 64, false)).persistent_places, 0) << "288 blocks: one round";
  EXPECT_EQ(plan_of(shape(6, 12, 12, 512, 512, 64, false)).persistent_places, 0) << "576 blocks: 180 last";
  EXPECT_EQ(plan_of(shape(10, 16, 16, 512, 512, 64, false)).persistent_places, 0) << "1,280 blocks: 92 last";
  EXPECT_EQ(general.persistent_places, 0);
  EXPECT_EQ(long_keys.persistent_places, 0);
  EXPECT_EQ(plan_with(shape(8, 12, 12, 512, 512, 64, false), "off=persistent").persistent_places, 0);
  // (tests: a grid of 5 wherever the plain build of three runs)
  EXPECT_EQ(plan_with(shape(1, 12, 12, 1500, 1500, 64, false), "persistent=5").persistent_places, 5);
  const CudaPlan two = plan_with(shape(8, 12, 12, 512, 512, 64, false), "off=three");
  EXPECT_EQ(cuda::describe(two), "cuda.wgmma 768 blocks of 64 rows, 76192 B shared, 132 SMs, plain");
}

// K/V rows that are not whole 32-byte sectors (a head dim of an odd number of 16-byte chunks, or a stride or
// offset off 32 bytes) reach the wgmma kernel's tiles by its producer's 16-byte copies, not TMA; forced either
// way by off=kv-copies / off=kv-tma; never on another kernel or a persistent grid.
TEST(CudaPlan, SlowTmaRowsOfTheSixtyFourBucketTakeTheWgmmaKernelsCopies) {
  // Rows of 48 and 80 bytes in the 64 bucket: copies; every other dim of the bucket and the 128 bucket's keep TMA.
  for (std::int64_t d : {24, 40}) {
    const CudaPlan plan = plan_with(shape(4, 16, 16, 2048, 2048, d, false), "kernel=wgmma");
    EXPECT_EQ(plan.kernel, Kernel::Warpgroup) << d;
    EXPECT_TRUE(plan.kv_copies) << "head dim " << d;
  }
  for (std::int64_t d : {16, 32, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 160, 192, 200, 256}) {
    EXPECT_FALSE(plan_with(shape(4, 16, 16, 2048, 2048, d, false), "kernel=wgmma").kv_copies) << "head dim " << d;
  }
  // Both K's and V's rows must be slow: K 40 with V 64 keeps TMA, and so do rows of 48 in a stride of 56 (96 bytes).
  AttentionProblem v64 = AttentionProblem::head_first(4, 16, 16, 2048, 2048, 40, DType::bf16);
  v64.v_head_dim = 64;
  v64.v = v64.o = Layout::head_first(16, 2048, 64);
  EXPECT_FALSE(plan_of(core::normalize_and_check(v64)).kv_copies);
  AttentionProblem wide_rows = AttentionProblem::head_first(4, 16, 16, 2048, 2048, 48, DType::bf16);
  wide_rows.k = Layout::head_first(16, 2048, 56);
  wide_rows.v = Layout::head_first(16, 2048, 56);
  EXPECT_FALSE(plan_of(core::normalize_and_check(wide_rows)).kv_copies);
  // Head dim 40 whose heads sit side by side in positions-first rows (heads 80 bytes apart): copies.
  const AttentionProblem positions = AttentionProblem::positions_first(4, 16, 16, 2048, 2048, 40, DType::bf16);
  EXPECT_TRUE(plan_of(core::normalize_and_check(positions)).kv_copies);
  const CudaPlan d40 = plan_of(shape(4, 16, 16, 2048, 2048, 40, false));
  EXPECT_NE(cuda::describe(d40).find(", K/V by copies"), std::string::npos) << cuda::describe(d40);
  EXPECT_FALSE(plan_with(shape(4, 16, 16, 2048, 2048, 40, false), "kernel=wgmma,off=kv-copies").kv_copies);
  EXPECT_FALSE(plan_with(shape(4, 16, 16, 2048, 2048, 40, false), "kernel=mma").kv_copies) << "mma.sync";
  EXPECT_FALSE(plan_of(shape(4, 16, 16, 2048, 2048, 40, false), /*sm90=*/false).kv_copies);
  // off=kv-tma forces copies wherever wgmma runs float K/V, never with a persistent grid.
  const CudaPlan forced = plan_with(shape(8, 12, 12, 512, 512, 64, false), "off=kv-tma");
  EXPECT_TRUE(forced.kv_copies);
  EXPECT_EQ(forced.persistent_places, 0) << "a persistent grid loads K/V by TMA only";
  EXPECT_TRUE(plan_with(shape(4, 16, 16, 2048, 2048, 128, false), "off=kv-tma").kv_copies);
}

// A plain wgmma grid just past whole waves splits its tail row blocks in key ranges (Whisper's encoder at head
// dim 128: 144 row blocks of 12 tiles, one per SM on 132 SMs); a tail of half the places or more, a short key
// range, a grid of one wave, three blocks per SM, the general build and off=tail do not.
TEST(CudaPlan, APlainGridJustPastWholeWavesSplitsItsTail) {
  const CudaPlan whisper = plan_of(shape(1, 12, 12, 1500, 1500, 128, false));
  EXPECT_EQ(cuda::describe(whisper), "cuda.wgmma 204 blocks of 128 rows, 167328 B shared, 132 SMs, plain, "
                                     "tail of 12 row blocks in 6 x 256 keys");
  EXPECT_EQ(whisper.tail_block, 132);
  EXPECT_EQ(whisper.partial_bytes, std::size_t{72} * 128 * (3 + 128) * sizeof(float));
  EXPECT_GE(whisper.scratch_bytes, whisper.partial_bytes);
  // Three per SM (400 row blocks on 396 places) keeps its tail whole.
  const CudaPlan three = plan_of(shape(1, 200, 200, 100, 600, 64, false));
  EXPECT_EQ(cuda::describe(three), "cuda.wgmma 400 blocks of 64 rows, 76192 B shared, 132 SMs, plain, 3 per SM");
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false)).tail_pieces, 0) << "768 blocks: a tail of 372";
  EXPECT_EQ(plan_of(shape(8, 12, 12, 128, 128, 64, false)).tail_pieces, 0) << "one wave";
  EXPECT_EQ(plan_of(shape(1, 140, 140, 256, 256, 64, false)).tail_pieces, 0) << "two tiles";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 128, true)).tail_pieces, 0) << "causal: the general build";
  EXPECT_EQ(plan_with(shape(1, 12, 12, 1500, 1500, 128, false), "off=tail").tail_pieces, 0);
}

TEST(CudaPlan, AQuantizedCacheDecodesOnTheDecodeMmaKernel) {
  AttentionProblem p = AttentionProblem::head_first(8, 32, 8, 1, 4096, 128, DType::f16);
  p.causal = true;
  p.k_storage = p.v_storage = KvStorage{KvType::Int8, KvQuant::PerTensor};
  const CudaPlan plan = plan_of(core::normalize_and_check(p));
  EXPECT_EQ(plan.kernel, Kernel::DecodeMma);
}

TEST(CudaPlan, Float32TakesTheTf32KernelOrTheDecodeKernel) {
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false, DType::f32)).kernel, Kernel::Tf32);
  EXPECT_EQ(plan_of(shape(8, 32, 8, 1, 4096, 128, true, DType::f32)).kernel, Kernel::Decode);
}

TEST(CudaPlan, WithoutHopperOrAlignedPointersTheMmaKernelRuns) {
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false), /*sm90=*/false).kernel, Kernel::TensorCore);
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false), true, /*allow_special=*/false).kernel,
            Kernel::TensorCore);
  // A long key range over few row blocks is split: 32 blocks of 4096 keys into 8 ranges of 512.
  const CudaPlan few = plan_of(shape(1, 4, 4, 512, 4096, 64, false), /*sm90=*/false);
  EXPECT_EQ(few.kernel, Kernel::TensorCore);
  EXPECT_EQ(few.splits, 8);
  EXPECT_EQ(few.split_keys, 512);
}


// ---- head dims: the tile table and the plan's choice at every head dim (no GPU needed) ----

std::vector<std::int64_t> every_head_dim() {
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 1; d <= 256; ++d) dims.push_back(d);
  return dims;
}

// float16 / bfloat16 run on tensor cores at every head dim and V dim, on an sm_90 and an sm_80 device; float32
// runs the TF32 kernel up to 128 and the SIMT kernel (saying why) above.
TEST(CudaPlan, EveryHeadDimRunsOnTensorCores) {
  for (const bool sm90 : {true, false}) {
    for (const std::int64_t d : every_head_dim()) {
      for (const std::int64_t dv : {d, std::int64_t{64}, std::int64_t{128}, std::int64_t{256}}) {
        for (const DType t : {DType::f16, DType::bf16, DType::f32}) {
          AttentionProblem p = AttentionProblem::positions_first(4, 16, 16, 2048, 2048, d, t);
          p.v_head_dim = dv;
          p.v = Layout::positions_first(16, 2048, dv);
          p.o = Layout::positions_first(16, 2048, dv);
          const CudaPlan plan = plan_of(core::normalize_and_check(p), sm90);
          SCOPED_TRACE("d " + std::to_string(d) + " dv " + std::to_string(dv) + " " + std::string(dtype_name(t)) +
                       (sm90 ? " sm_90" : " sm_80") + ": " + cuda::describe(plan));
          if (t == DType::f32 && std::max(d, dv) > 128) {
            EXPECT_EQ(plan.kernel, Kernel::Simt);
            EXPECT_NE(cuda::describe(plan).find("float32 above head dim 128"), std::string::npos);
          } else if (t == DType::f32) {
            EXPECT_EQ(plan.kernel, Kernel::Tf32);
          } else {
            EXPECT_TRUE(plan.kernel == Kernel::TensorCore || plan.kernel == Kernel::Warpgroup);
            if (!sm90) EXPECT_EQ(plan.kernel, Kernel::TensorCore);
          }
          EXPECT_TRUE(plan.simt_reason.empty() == (plan.kernel != Kernel::Simt));
        }
      }
    }
  }
}

// Prefill over few keys at a head dim up to 96 between the wgmma buckets stays on mma.sync (short_rows_prefer_mma);
// from 512 keys, at the buckets themselves, and from 104 up (mma.sync's bucket is 128 there too), the wgmma kernel
// takes it.
TEST(CudaPlan, ShortRowsBetweenBucketsStayOnTheMmaSyncKernel) {
  EXPECT_EQ(plan_of(shape(32, 16, 16, 257, 257, 80, false)).kernel, Kernel::TensorCore);  // ViT-H/14
  EXPECT_EQ(plan_of(shape(32, 16, 16, 257, 257, 80, true)).kernel, Kernel::TensorCore);
  EXPECT_EQ(plan_of(shape(2, 8, 8, 4096, 77, 40, false)).kernel, Kernel::TensorCore);      // SD 1.5 cross-attention
  EXPECT_EQ(plan_of(shape(32, 16, 16, 257, 257, 96, false)).kernel, Kernel::TensorCore);
  EXPECT_EQ(plan_of(shape(8, 16, 16, 512, 512, 80, false)).kernel, Kernel::Warpgroup);
  EXPECT_EQ(plan_of(shape(32, 16, 16, 257, 257, 64, false)).kernel, Kernel::Warpgroup);
  EXPECT_EQ(plan_of(shape(64, 12, 12, 128, 128, 112, false)).kernel, Kernel::Warpgroup);
  EXPECT_EQ(plan_of(shape(64, 16, 2, 128, 128, 104, false)).kernel, Kernel::Warpgroup);
  EXPECT_EQ(plan_of(shape(32, 16, 16, 257, 257, 160, false)).kernel, Kernel::Warpgroup);
}

// In its bucket, the wgmma kernel's MMAs cover the narrowest built widths that hold the dims; `off=narrow` and
// the dims of a bucket itself take its full build.
TEST(CudaPlan, WgmmaNarrowBuildsCoverOnlyTheProblemsColumns) {
  using cuda::WarpgroupWidths;
  using cuda::warpgroup_widths;
  const auto same = [](WarpgroupWidths a, WarpgroupWidths b) { return a.bucket == b.bucket && a.qk == b.qk && a.v == b.v; };
  EXPECT_TRUE(same(warpgroup_widths(80, 80, true), {128, 80, 128}));
  EXPECT_TRUE(same(warpgroup_widths(72, 72, true), {128, 80, 128}));
  EXPECT_TRUE(same(warpgroup_widths(96, 88, true), {128, 96, 128}));
  EXPECT_TRUE(same(warpgroup_widths(112, 112, true), {128, 128, 128}));
  EXPECT_TRUE(same(warpgroup_widths(80, 128, true), {128, 80, 128}));
  EXPECT_TRUE(same(warpgroup_widths(160, 160, true), {192, 160, 192}));
  EXPECT_TRUE(same(warpgroup_widths(192, 128, true), {192, 192, 128}));
  EXPECT_TRUE(same(warpgroup_widths(136, 64, true), {192, 192, 128}));  // (the cheaper of the two that hold it)
  EXPECT_TRUE(same(warpgroup_widths(80, 80, false), {128, 128, 128}));
  EXPECT_TRUE(same(warpgroup_widths(40, 40, true), {64, 64, 64}));
  for (const std::int64_t d : every_head_dim()) {
    for (const std::int64_t dv : every_head_dim()) {
      const WarpgroupWidths w = warpgroup_widths(d, dv, true);
      if (w.bucket == 0) continue;
      EXPECT_GE(w.qk, d);
      EXPECT_GE(w.v, dv);
      EXPECT_EQ(w.bucket, cuda::warpgroup_bucket(std::max(d, dv)));
    }
  }
  const auto phi2 = shape(4, 32, 32, 2048, 2048, 80, true);
  EXPECT_TRUE(plan_of(phi2).narrow);
  EXPECT_NE(cuda::describe(plan_of(phi2)).find(", narrow MMAs"), std::string::npos);
  EXPECT_FALSE(plan_with(phi2, "off=narrow").narrow);
  EXPECT_FALSE(plan_of(shape(4, 32, 32, 2048, 2048, 128, true)).narrow);
  EXPECT_FALSE(plan_with(phi2, "kernel=mma").narrow) << "a wgmma build only";
}

// A problem takes the smallest built bucket that holds it; (192, 128) has its own instance.
TEST(CudaPlan, HeadDimsTakeTheSmallestBucketThatHoldsThem) {
  using cuda::HeadDimBucket;
  using cuda::mma_bucket;
  EXPECT_EQ(mma_bucket(1, 1), (HeadDimBucket{32, 32}));
  EXPECT_EQ(mma_bucket(40, 40), (HeadDimBucket{64, 64}));
  EXPECT_EQ(mma_bucket(80, 80), (HeadDimBucket{80, 80}));
  EXPECT_EQ(mma_bucket(72, 72), (HeadDimBucket{80, 80}));
  EXPECT_EQ(mma_bucket(88, 88), (HeadDimBucket{96, 96}));
  const CudaPlan d80_step = plan_with(shape(1, 32, 32, 1, 2048, 80, true), "kernel=mma");
  EXPECT_GT(d80_step.splits, 1);
  EXPECT_FALSE(d80_step.cluster_merge) << "no cluster merge is built at V bucket 80: the merge pass runs";
  EXPECT_EQ(mma_bucket(112, 112), (HeadDimBucket{128, 128}));
  EXPECT_EQ(mma_bucket(160, 160), (HeadDimBucket{160, 160}));
  EXPECT_EQ(mma_bucket(192, 128), (HeadDimBucket{192, 128}));
  EXPECT_EQ(mma_bucket(180, 100), (HeadDimBucket{192, 128}));
  EXPECT_EQ(mma_bucket(64, 192), (HeadDimBucket{192, 192}));
  EXPECT_EQ(mma_bucket(255, 1), (HeadDimBucket{256, 256}));
  EXPECT_FALSE(mma_bucket(257, 64).valid());
  for (const std::int64_t d : every_head_dim()) {
    for (const std::int64_t dv : every_head_dim()) {
      const HeadDimBucket b = mma_bucket(d, dv);
      ASSERT_TRUE(b.valid()) << d << " " << dv;
      EXPECT_GE(b.qk, d);
      EXPECT_GE(b.v, dv);
    }
  }
  EXPECT_EQ(cuda::tf32_bucket(33, 20), (HeadDimBucket{64, 64}));
  EXPECT_EQ(cuda::tf32_bucket(100, 128), (HeadDimBucket{128, 128}));
  EXPECT_FALSE(cuda::tf32_bucket(129, 8).valid());
}

// The tile table's invariants: every built bucket's block fits sm_80's shared memory (the smaller opt-in), two
// blocks of it fit an H100 / H200 SM where the bucket is at most 128 wide, its rows and keys are whole MMA
// tiles, and the padded pitches leave ldmatrix conflict-free (an odd number of 16-byte chunks per row).
TEST(CudaPlan, TileTableInvariants) {
  using cuda::HeadDimBucket;
  std::vector<HeadDimBucket> built;
  for (const int d : cuda::kMmaBucketDims) built.push_back({d, d});
  for (const HeadDimBucket b : cuda::kMmaUnequalBuckets) built.push_back(b);
  for (const HeadDimBucket b : built) {
    SCOPED_TRACE(std::to_string(b.qk) + ", " + std::to_string(b.v));
    EXPECT_EQ(b.qk % 16, 0) << "k-steps of 16";
    EXPECT_EQ(b.v % 16, 0) << "P V's output columns in pairs of 8-column MMAs";
    if (cuda::mma_cluster_merge_built(b.v)) EXPECT_EQ(b.v % 32, 0) << "the cluster merge's columns per lane";
    const int keys = cuda::mma_tile_keys(b);
    EXPECT_EQ(keys % 16, 0) << "P V's k-steps of 16 keys";
    EXPECT_EQ(64 % keys == 0 || keys % 64 == 0, true) << "the split granule (64 keys) holds whole tiles";
    EXPECT_EQ(cuda::kMmaRows % 16, 0);
    for (const int w : {b.qk, b.v}) {
      const int chunks = cuda::smem_pitch(w) / 8;
      EXPECT_GE(cuda::smem_pitch(w), w);
      EXPECT_TRUE(cuda::is_power_of_two(w / 8) || chunks % 2 == 1) << "width " << w;
    }
    for (const int elem : {2}) {
      const std::size_t float_kv = cuda::mma_smem_bytes_for(b, elem, 2, 0);
      EXPECT_LE(float_kv, cuda::kSm80SmemOptin);
      if (b.v <= 128 && b.qk <= 128) EXPECT_LE(2 * float_kv, std::size_t{228} * 1024) << "two blocks per SM";
    }
  }
  for (const int d : cuda::kTf32BucketDims) {
    EXPECT_LE(cuda::tf32_smem_bytes_for({d, d}), cuda::kSm80SmemOptin);
    EXPECT_EQ(d % 8, 0);
  }
}

// The registry's names are the public plan_kernel_names(), in order, and a forced kernel runs only where it
// accepts the problem (else the plan's own choice runs).
TEST(CudaPlan, RegistryNamesAndForcedKernels) {
  const auto names = plan_kernel_names();
  const auto registry = cuda::registry_kernel_names();
  EXPECT_TRUE(std::equal(registry.begin(), registry.end(), names.begin())) << "CUDA's registry first, in order";
  const AttentionProblem bert = shape(8, 12, 12, 512, 512, 64, false);
  EXPECT_EQ(plan_with(bert, "kernel=mma").kernel, Kernel::TensorCore);
  EXPECT_EQ(plan_with(bert, "kernel=simt").kernel, Kernel::Simt);
  EXPECT_EQ(plan_with(bert, "kernel=tf32").kernel, plan_of(bert).kernel) << "tf32 declines float16";
  const auto accepting = cuda::accepting_kernels(bert, h200(64));
  EXPECT_NE(std::find(accepting.begin(), accepting.end(), "wgmma"), accepting.end());
  EXPECT_EQ(std::find(accepting.begin(), accepting.end(), "tf32"), accepting.end());
  EXPECT_THROW(parse_plan_overrides("kernel=fast"), Error);
  EXPECT_THROW(parse_plan_overrides("off=plain+turbo"), Error);
  EXPECT_THROW(parse_plan_overrides("splits=-1"), Error);
  EXPECT_THROW(parse_plan_overrides("colour=red"), Error);
  const PlanOverrides o = parse_plan_overrides("kernel=wgmma,splits=3,off=plain+cluster,persistent=7,heavy_group=2");
  EXPECT_EQ(o.to_string(), "kernel=wgmma,splits=3,off=plain+cluster,persistent=7,heavy_group=2");
  EXPECT_TRUE(o.is_off("cluster"));
  EXPECT_FALSE(o.is_off("tail"));
}

// No environment variable steers the library: no getenv in the library's sources (src/ but for the tools around it:
// the test-data reader in src/testing, which finds the case files, and the CLI in src/cli, which sets OpenBLAS's own
// core variable for its unfused baseline).
TEST(CudaPlan, NoEnvironmentVariableSteersTheLibrary) {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(ATTNKIT_SOURCE_DIR) / "src")) {
    const std::string path = entry.path().string();
    if (!entry.is_regular_file() || path.find("/src/testing/") != std::string::npos ||
        path.find("/src/cli/") != std::string::npos) {
      continue;
    }
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++files;
    EXPECT_EQ(text.find("getenv"), std::string::npos) << entry.path();
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace attnkit::test
