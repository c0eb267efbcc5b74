// Ragged (packed) batches and paged K/V caches (AttentionProblem::sequences): every sequence of a ragged or paged
// call must equal that sequence alone in a dense call. Each test builds random batches (empty sequences, length
// 1, the longest, queries longer than keys; random page permutations, shared prefix pages, page sizes that are
// not powers of two), gathers each sequence into dense tensors, and checks the call's rows against the float64
// reference of the dense sequence; the Reference backend must give the dense Reference backend's bits.
#include "sequences_batch.hpp"

#include <cpu/amx_tiles.hpp>

namespace attnkit {
namespace {

// A plan feature that must not change the bits: the plan names it (`phrase` in describe()) unless `feature_off` turns
// it off, and the batch checks out against the reference with the same bits either way. `base_off`: features off in
// both plans (e.g. "amx", which would take the feature's place on CPUs that have it).
void expect_feature_keeps_the_bits(const Batch& b, const BatchSpec& s, const std::string& feature_off,
                                   const char* phrase, const std::string& base_off = "") {
  AttentionConfig own, off;
  if (!base_off.empty()) own.plan = parse_plan_overrides("off=" + base_off);
  off.plan = parse_plan_overrides("off=" + (base_off.empty() ? feature_off : base_off + "+" + feature_off));
  const std::string described = Attention(b.problem(), own).describe();
  EXPECT_NE(described.find(phrase), std::string::npos) << described;
  EXPECT_EQ(Attention(b.problem(), off).describe().find(phrase), std::string::npos);
  EXPECT_EQ(check_batch(b, s, own), check_batch(b, s, off));
}

TEST(Sequences, RaggedBatchesMatchEachSequenceAlone) {
  std::mt19937 rng(31);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (int variant = 0; variant < 6; ++variant) {
      const BatchSpec s = ragged_variant(rng, t, variant, {24, 24, 16, 90, 150, 200});
      const Batch batch(s, 100 + variant);
      check_batch(batch, s, Backend::Reference);
      const auto whole = check_batch(batch, s, Backend::Cpu);
      EXPECT_EQ(check_batch(batch, s, Backend::Cpu, 1), whole) << "the bits depend on the thread count";
    }
  }
}

TEST(Sequences, RaggedQueriesOverDenseKeysWithKeyLengths) {
  std::mt19937 rng(7);
  BatchSpec s;
  s.dtype = DType::f16;
  s.q_lens = random_lengths(rng, 5, 70);
  s.k_lens = random_lengths(rng, 5, 130);
  s.ragged_k = false;
  s.causal = true;
  check_batch(Batch(s, 5), s, Backend::Reference);
  check_batch(Batch(s, 5), s, Backend::Cpu);
}

TEST(Sequences, PagedKvMatchesEachSequenceAlone) {
  std::mt19937 rng(11);
  for (std::int64_t page : {1, 3, 16, 64, 128}) {
    for (int variant = 0; variant < 4; ++variant) {
      BatchSpec s;
      s.dtype = variant == 1 ? DType::bf16 : variant == 2 ? DType::f32 : DType::f16;
      s.page_size = page;
      s.heads_before_pages_rows = variant % 2 == 1;
      s.shared_prefix = variant == 2;
      s.ragged_k = false;
      const std::int64_t batch = 5;
      s.k_lens = random_lengths(rng, batch, 300);
      if (variant == 3) {  // ragged queries against the pages (chunked prefill of several sequences)
        s.q_lens = random_lengths(rng, batch, 40);
      } else {  // dense queries: a decode step (1) or a chunk (6) per sequence
        s.ragged_q = false;
        s.q_lens.assign(batch, variant == 0 ? 1 : 6);
      }
      s.causal = variant != 2;
      if (variant == 1) s.window = 50;
      SCOPED_TRACE("page size " + std::to_string(page));
      const Batch b(s, 1000 + page * 10 + variant);
      check_batch(b, s, Backend::Reference);
      const auto whole = check_batch(b, s, Backend::Cpu);
      EXPECT_EQ(check_batch(b, s, Backend::Cpu, 1), whole) << "the bits depend on the thread count";
    }
  }
}

TEST(Sequences, QuantizedPages) {
  std::mt19937 rng(13);
  for (KvType type : {KvType::Int8, KvType::Int4}) {
    for (KvQuant quant : {KvQuant::PerTensor, KvQuant::PerChannel}) {
      for (std::int64_t page : {16, 64}) {
        BatchSpec s;
        s.dtype = DType::f16;
        s.kv_type = type;
        s.kv_quant = quant;
        s.page_size = page;
        s.ragged_k = false;
        s.ragged_q = false;
        s.head_dim = s.v_head_dim = 32;
        s.k_lens = random_lengths(rng, 4, 200);
        s.q_lens.assign(4, 2);
        s.causal = true;
        const Batch b(s, 77 + page);
        check_batch(b, s, Backend::Reference);
        check_batch(b, s, Backend::Cpu);
      }
    }
  }
}

// The tiled kernel's per-thread widened copy of a K/V head ("K/V widened once" in the plan): it reads only each
// entry's own keys (ragged keys end where the entry's do, pages past its length are not its own) and gives the
// bits of items that widen their own tiles ("off=widened-kv"), in float16 and bfloat16, int8 and int4 pages, and
// float32 (ragged and paged rows are apart: copied), and on an AMX CPU bfloat16's staged tiles ("staged once").
TEST(Sequences, WidenedHeadCopyKeepsTheBits) {
  std::mt19937 rng(19);
  for (int variant = 0; variant < 8; ++variant) {
    BatchSpec s;
    s.dtype = variant == 1 || variant == 7 ? DType::bf16 : variant >= 5 ? DType::f32 : DType::f16;
    s.q_lens = random_lengths(rng, 4, 200);
    s.k_lens = random_lengths(rng, 4, 300);
    s.causal = variant != 2;
    if (variant >= 2 && variant != 5) s.page_size = 16, s.ragged_k = false;  // paged: float, then int8 and int4 pages
    if (variant == 3) s.kv_type = KvType::Int8, s.kv_quant = KvQuant::PerChannel;
    if (variant == 4) s.kv_type = KvType::Int4, s.kv_quant = KvQuant::PerTensor;
    SCOPED_TRACE("variant " + std::to_string(variant));
    const Batch b(s, 60 + variant);
    if (variant == 7) {
      if (!cpu::amx::available()) continue;
      expect_feature_keeps_the_bits(b, s, "widened-kv", "staged once");
      continue;
    }
    // (float16 / bfloat16 on an AMX CPU take AMX tiles, which stage their own copy: off there, so the float32
    // copy runs)
    expect_feature_keeps_the_bits(b, s, "widened-kv", "widened once", s.dtype != DType::f32 ? "amx" : "");
  }
}

// The few-rows kernel's prefetches ("K/V rows prefetched a tile ahead" in the plan, on from 16 MiB of K/V at most):
// a decode step over ragged keys and NHD-paged (heads interleaved: wide items) and HND-paged caches, float16, and
// NHD pages in float32, whose bits must not depend on them ("off=prefetch-v+prefetch-ahead"), with key lengths that end mid-tile and mid-page.
TEST(Sequences, PrefetchedDecodeKeepsTheBits) {
  std::mt19937 rng(23);
  for (int variant = 0; variant < 4; ++variant) {
    BatchSpec s;
    s.dtype = variant == 3 ? DType::f32 : DType::f16;
    s.heads = 16;
    s.kv_heads = 4;
    s.head_dim = s.v_head_dim = 128;
    s.ragged_q = false;
    s.q_lens.assign(3, 1);
    s.k_lens = {3000 + static_cast<std::int64_t>(rng() % 1000), 3900, 2999};
    s.ragged_k = variant == 0;
    if (variant >= 1) s.page_size = 48, s.heads_before_pages_rows = variant == 2;
    s.causal = true;
    SCOPED_TRACE("variant " + std::to_string(variant));
    const Batch b(s, 90 + variant);
    expect_feature_keeps_the_bits(b, s, "prefetch-v+prefetch-ahead", "prefetched");
  }
}

TEST(Sequences, CutCallsEqualTheWholeCall) {
  std::mt19937 rng(17);
  BatchSpec s;
  s.dtype = DType::bf16;
  s.q_lens = random_lengths(rng, 4, 100);
  s.k_lens = random_lengths(rng, 4, 400);
  s.causal = true;
  const auto whole = check_batch(Batch(s, 3), s, Backend::Cpu);
  s.work_budget = 40000;
  EXPECT_EQ(check_batch(Batch(s, 3), s, Backend::Cpu), whole);
}

// ---- bad input: an Error naming the argument, nothing written ----

TEST(Sequences, BadHostValuesAreRejectedByNameWithNothingWritten) {
  AttentionConfig c;
  c.backend = Backend::Cpu;
  for (const BadSequenceValue& bad : bad_sequence_values()) expect_rejected(bad, c);
}

TEST(Sequences, BadProblemsAreRejectedByName) {
  const auto rejected = [](AttentionProblem p, const std::string& argument, Backend backend = Backend::Cpu) {
    try {
      AttentionConfig c;
      c.backend = backend;
      Attention op(p, c);
      ADD_FAILURE() << "accepted; expected an Error naming " << argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  const AttentionProblem ragged = Batch(small_ragged(), 1).problem();
  const AttentionProblem paged = Batch(small_paged(), 1).problem();
  AttentionProblem p = paged;
  p.sequences.page_size = 0;
  rejected(p, "sequences.page_size");  // num_pages set, not paged
  p = paged;
  p.sequences.ragged_k = true;
  p.sequences.total_k = 10;
  rejected(p, "sequences.ragged_k");
  p = paged;
  p.sequences.max_pages_per_seq = 2;  // 8 keys, fewer than k_len 9
  rejected(p, "k_len");
  p = ragged;
  p.causal_offset = 0;
  rejected(p, "causal_offset");
  p = ragged;
  p.has_mask = true;
  p.mask = Layout::head_first(p.heads, p.q_len, p.k_len);
  rejected(p, "has_mask");
  p = ragged;
  p.has_key_lengths = true;
  rejected(p, "has_key_lengths");
  p = ragged;
  p.sequences.total_q = -1;
  rejected(p, "sequences.total_q");
  p = ragged;
  p.sequences.ragged_q = false;  // total_q set without ragged queries
  rejected(p, "sequences.total_q");
}

}  // namespace
}  // namespace attnkit
