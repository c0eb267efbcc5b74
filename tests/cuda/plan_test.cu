// The CUDA plan's policy (src/cuda/cuda_plan.cu) on the host, with the device described by hand: no GPU needed,
// so this runs in CI. Each expectation is a rule of the plan (docs/design.md, "The CUDA kernels"), on the
// PERF.md shapes and an H200-like device (132 SMs, compute capability 9.0, 3 mma.sync blocks per SM at head dims
// 32 and 64, 2 wgmma blocks at head dim 64 (3 in the build of three per SM) and 1 above); the describe() strings
// of several of them were read off the H200 (bench/results/).
#include <cuda/cuda_plan.hpp>

#include "core/problem_check.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

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

// Whisper's encoder shape (12 heads, 1500 tokens) with a mask: the general build.
AttentionProblem masked_encoder(std::int64_t head_dim) {
  AttentionProblem p = AttentionProblem::head_first(1, 12, 12, 1500, 1500, head_dim, DType::f16);
  p.has_mask = true;
  p.mask = Layout::head_first(12, 1500, 1500);
  return core::normalize_and_check(p);
}

CudaPlan plan_of(const AttentionProblem& p, bool sm90 = true, bool allow_special = true) {
  return cuda::plan_for(p, allow_special, h200(p.head_dim, sm90));
}

// Head dim 64: the wgmma kernel's blocks are 64 rows, two per SM, the mma.sync kernel's grid; prefill takes it.
TEST(CudaPlan, HeadDim64PrefillTakesTheHopperKernelsPairedBlocks) {
  const CudaPlan bert_b8_s128 = plan_of(shape(8, 12, 12, 128, 128, 64, false));
  EXPECT_EQ(cuda::describe(bert_b8_s128), "cuda.wgmma 192 blocks of 64 rows, 76176 B shared, 132 SMs, plain, 3 per SM");
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
            "cuda.wgmma 768 blocks of 64 rows, 76176 B shared, 132 SMs, plain, 3 per SM, persistent grid of 396");
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
  setenv("ATTNKIT_CUDA_SPLITS", "32", 1);
  const CudaPlan many = plan_of(shape(1, 12, 12, 1, 2048, 64, false));
  unsetenv("ATTNKIT_CUDA_SPLITS");
  EXPECT_EQ(many.splits, 32);
  EXPECT_FALSE(many.cluster_merge);
  // Elsewhere, or switched off, the merge pass over the same ranges.
  for (const bool sm90 : {false, true}) {
    if (sm90) setenv("ATTNKIT_CUDA_CLUSTER", "0", 1);
    const CudaPlan merged = plan_of(shape(1, 12, 12, 1, 1500, 64, false), sm90);
    unsetenv("ATTNKIT_CUDA_CLUSTER");
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
  EXPECT_LE(b64.splits, 4);
  const CudaPlan b8 = plan_of(shape(8, 32, 8, 1, 32768, 128, true));
  EXPECT_EQ(b8.kernel, Kernel::Warpgroup);
  EXPECT_EQ(b8.splits, 2) << "64 (batch, K/V head) pairs in two ranges: 128 blocks, 97% of one round";
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

// Head dim 64: every problem whose rows see every key with the scale in the exponent runs three blocks per SM
// (128-key tiles, one at a time), in the plain build or the general one, however many rounds its grid is; causal
// shapes, a mask, key lengths, a split and ATTNKIT_CUDA_THREE=0 keep two.
TEST(CudaPlan, HeadDim64ProblemsThatSeeEveryKeyRunThreeBlocksPerSm) {
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 512, 512, 64, false)).three_per_sm) << "768 blocks";
  const CudaPlan whisper = plan_of(shape(1, 12, 12, 1500, 1500, 64, false));
  EXPECT_EQ(cuda::describe(whisper), "cuda.wgmma 288 blocks of 64 rows, 76176 B shared, 132 SMs, plain, 3 per SM");
  EXPECT_TRUE(plan_of(shape(8, 12, 12, 128, 128, 64, false)).three_per_sm) << "192 blocks: one round";
  EXPECT_TRUE(plan_of(shape(1, 12, 12, 512, 512, 64, false)).three_per_sm) << "96 blocks";
  const CudaPlan long_keys = plan_of(shape(4, 32, 32, 4096, 4096, 64, false));
  EXPECT_TRUE(long_keys.three_per_sm) << "4096 keys: the general build";
  EXPECT_FALSE(long_keys.plain);
  EXPECT_FALSE(plan_of(shape(1, 12, 12, 1500, 1500, 64, true)).three_per_sm) << "causal";
  EXPECT_FALSE(plan_of(masked_encoder(64)).three_per_sm) << "a mask";
  AttentionProblem lengths = AttentionProblem::head_first(8, 12, 12, 512, 512, 64, DType::f16);
  lengths.has_key_lengths = true;
  EXPECT_FALSE(plan_of(core::normalize_and_check(lengths)).three_per_sm) << "key lengths";
  AttentionProblem capped = AttentionProblem::head_first(8, 12, 12, 512, 512, 64, DType::f16);
  capped.softcap = 30.0f;
  EXPECT_FALSE(plan_of(core::normalize_and_check(capped)).three_per_sm) << "softcap";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 512, 512, 128, false)).three_per_sm) << "head dim 128";
  EXPECT_FALSE(plan_of(shape(8, 12, 12, 512, 512, 64, false), /*sm90=*/false).three_per_sm) << "mma.sync";
  // The general build takes it too (the plain and general builds give the same bits at the same tiles).
  setenv("ATTNKIT_CUDA_PLAIN", "0", 1);
  const CudaPlan general = plan_of(shape(8, 12, 12, 512, 512, 64, false));
  unsetenv("ATTNKIT_CUDA_PLAIN");
  EXPECT_TRUE(general.three_per_sm);
  EXPECT_FALSE(general.plain);
  // The plain build runs a persistent grid of the places where its last round is whole or two thirds full; one
  // round, a last round less full, the general build and ATTNKIT_CUDA_PERSISTENT=0 run one block per unit.
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false)).persistent_places, 396) << "768 blocks";
  EXPECT_EQ(plan_of(shape(12, 16, 16, 512, 512, 64, false)).persistent_places, 396) << "1,536 blocks";
  EXPECT_EQ(plan_of(shape(9, 11, 11, 512, 512, 64, false)).persistent_places, 396) << "792 blocks: two rounds";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 64, false)).persistent_places, 0) << "288 blocks: one round";
  EXPECT_EQ(plan_of(shape(6, 12, 12, 512, 512, 64, false)).persistent_places, 0) << "576 blocks: 180 last";
  EXPECT_EQ(plan_of(shape(10, 16, 16, 512, 512, 64, false)).persistent_places, 0) << "1,280 blocks: 92 last";
  EXPECT_EQ(general.persistent_places, 0);
  EXPECT_EQ(long_keys.persistent_places, 0);
  setenv("ATTNKIT_CUDA_PERSISTENT", "0", 1);
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false)).persistent_places, 0);
  setenv("ATTNKIT_CUDA_PERSISTENT", "5", 1);  // (tests: a grid of 5 wherever the plain build of three runs)
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 64, false)).persistent_places, 5);
  unsetenv("ATTNKIT_CUDA_PERSISTENT");
  setenv("ATTNKIT_CUDA_THREE", "0", 1);
  const CudaPlan two = plan_of(shape(8, 12, 12, 512, 512, 64, false));
  unsetenv("ATTNKIT_CUDA_THREE");
  EXPECT_EQ(cuda::describe(two), "cuda.wgmma 768 blocks of 64 rows, 76176 B shared, 132 SMs, plain");
}

// A plain wgmma grid just past whole waves splits its tail row blocks in key ranges (Whisper's encoder at head
// dim 128: 144 row blocks of 12 tiles, one per SM on 132 SMs); a tail of half the places or more, a short key
// range, a grid of one wave, three blocks per SM, the general build and ATTNKIT_CUDA_TAIL=0 do not.
TEST(CudaPlan, APlainGridJustPastWholeWavesSplitsItsTail) {
  const CudaPlan whisper = plan_of(shape(1, 12, 12, 1500, 1500, 128, false));
  EXPECT_EQ(cuda::describe(whisper), "cuda.wgmma 204 blocks of 128 rows, 167312 B shared, 132 SMs, plain, "
                                     "tail of 12 row blocks in 6 x 256 keys");
  EXPECT_EQ(whisper.tail_block, 132);
  EXPECT_EQ(whisper.partial_bytes, std::size_t{72} * 128 * (3 + 128) * sizeof(float));
  EXPECT_GE(whisper.scratch_bytes, whisper.partial_bytes);
  // Three per SM (400 row blocks on 396 places) keeps its tail whole.
  const CudaPlan three = plan_of(shape(1, 200, 200, 100, 600, 64, false));
  EXPECT_EQ(cuda::describe(three), "cuda.wgmma 400 blocks of 64 rows, 76176 B shared, 132 SMs, plain, 3 per SM");
  EXPECT_EQ(plan_of(shape(8, 12, 12, 512, 512, 64, false)).tail_pieces, 0) << "768 blocks: a tail of 372";
  EXPECT_EQ(plan_of(shape(8, 12, 12, 128, 128, 64, false)).tail_pieces, 0) << "one wave";
  EXPECT_EQ(plan_of(shape(1, 140, 140, 256, 256, 64, false)).tail_pieces, 0) << "two tiles";
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 128, true)).tail_pieces, 0) << "causal: the general build";
  setenv("ATTNKIT_CUDA_TAIL", "0", 1);
  EXPECT_EQ(plan_of(shape(1, 12, 12, 1500, 1500, 128, false)).tail_pieces, 0);
  unsetenv("ATTNKIT_CUDA_TAIL");
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

}  // namespace
}  // namespace attnkit::test
