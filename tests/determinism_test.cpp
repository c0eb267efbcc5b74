// Determinism and splitting, bit for bit (the contract: every sum has an order the code fixes, no atomics):
// two runs give identical bytes; the thread count does not change a bit; a call cut into several launches by
// the work budget equals the whole call; caller-provided scratch gives the same bytes as the op's own.
// Every comparison is of CaseData::output_bytes(): all of O and the LSE, gaps included.
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::MaskKind;

struct Shape {
  CaseSpec spec;
  DType dtype;
  bool split;  // whether the kernel should split the keys (checked, so the split path is really covered)
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  {
    CaseSpec s;  // grouped heads, a per-row mask, causal: rows of several heads per item, no split
    s.name = "gqa_mask_causal";
    s.batch = 2, s.heads = 8, s.kv_heads = 2, s.q_len = 70, s.k_len = 200, s.head_dim = 40;
    s.mask = MaskKind::Random, s.causal = true, s.lse = true;
    out.push_back({s, DType::f32, false});
  }
  {
    CaseSpec s;  // a decoder step: q_len 1, few heads, many keys: split-K with a merge pass
    s.name = "decode_split";
    s.batch = 1, s.heads = 4, s.q_len = 1, s.k_len = 2500, s.head_dim = 64;
    s.key_lengths = KeyLengths::None, s.lse = true;
    out.push_back({s, DType::f32, true});
  }
  {
    CaseSpec s;  // split-K with key lengths and per-batch offsets (empty ranges), grouped heads, float16
    s.name = "decode_split_gqa_lengths";
    s.batch = 3, s.heads = 8, s.kv_heads = 2, s.q_len = 1, s.k_len = 3000, s.head_dim = 32;
    s.key_lengths = KeyLengths::Random, s.causal = true, s.causal_offsets = true, s.lse = true;
    out.push_back({s, DType::f16, true});
  }
  {
    CaseSpec s;  // split-K with fully masked rows and a sink, bfloat16
    s.name = "split_masked_rows_sink";
    s.batch = 1, s.heads = 2, s.q_len = 7, s.k_len = 1030, s.head_dim = 16;
    s.mask = MaskKind::MaskedRows, s.head_sink = true, s.lse = true;
    out.push_back({s, DType::bf16, true});
  }
  {
    CaseSpec s;  // padded layout, window, softcap, bfloat16, several row blocks
    s.name = "padded_window_softcap";
    s.batch = 3, s.heads = 3, s.q_len = 130, s.k_len = 150, s.head_dim = 24, s.v_head_dim = 20;
    s.layout = LayoutKind::Padded, s.causal = true, s.window = 40, s.softcap = 4.0f, s.lse = true;
    out.push_back({s, DType::bf16, false});
  }
  {
    CaseSpec s;  // a model shape
    s.name = "bert_b1_s128";
    s.batch = 1, s.heads = 12, s.q_len = 128, s.k_len = 128, s.head_dim = 64, s.layout = LayoutKind::PositionsFirst;
    out.push_back({s, DType::f32, false});
  }
  return out;
}

std::vector<std::byte> run_bytes(CaseData& data, const AttentionProblem& problem, const AttentionConfig& config = {},
                                 void* scratch = nullptr, std::size_t scratch_bytes = 0) {
  data.poison_outputs();
  AttentionArgs a = data.args();
  a.scratch = scratch;
  a.scratch_bytes = scratch_bytes;
  Attention(problem, config).run(a);
  return data.output_bytes();
}

// 64-byte aligned scratch, filled with a byte pattern (0xff: NaN in every float) so that a kernel that
// read scratch before writing it would show.
struct AlignedScratch {
  explicit AlignedScratch(std::size_t bytes) : size((bytes + 63) / 64 * 64 + 64) {
    data.reset(static_cast<std::byte*>(std::aligned_alloc(64, size)));
    std::memset(data.get(), 0xff, size);
  }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::size_t size;
  std::unique_ptr<std::byte, Free> data;
};

TEST(Determinism, SplitPathIsWhereExpected) {
  for (const Shape& s : shapes()) {
    CaseData data(s.spec, s.dtype, 1);
    const std::string how = Attention(data.problem()).describe();
    EXPECT_EQ(how.find("split-k") != std::string::npos, s.split) << s.spec.name << ": " << how;
  }
}

TEST(Determinism, TwoRunsGiveIdenticalBytes) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(spec_string(s.spec));
    CaseData data(s.spec, s.dtype, 2);
    Attention op(data.problem());
    data.poison_outputs();
    op.run(data.args());
    const std::vector<std::byte> first = data.output_bytes();
    data.poison_outputs();
    op.run(data.args());  // the same plan and the same own scratch, reused
    EXPECT_TRUE(data.output_bytes() == first);
    EXPECT_TRUE(run_bytes(data, data.problem()) == first);  // a fresh op
    // And the bytes are a real result, not the poison.
    EXPECT_LE(data.scaled_error(data.reference()), testing::tolerance(s.dtype));
  }
}

TEST(Determinism, ThreadCountDoesNotChangeABit) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(spec_string(s.spec));
    CaseData data(s.spec, s.dtype, 3);
    const std::vector<std::byte> base = run_bytes(data, data.problem());
    for (int threads : {1, 2, 3, 8}) {
      AttentionConfig config;
      config.threads = threads;
      EXPECT_TRUE(run_bytes(data, data.problem(), config) == base) << threads << " threads";
    }
  }
}

// The work budget cuts the items into launches; each item computes the same bits in whichever launch it
// lands. Budgets: 1 (every item its own launch), fractions of the whole estimated work (cuts in the middle
// of the item list, and for split-K between the ranges of one row block), and one above the whole.
TEST(Determinism, CutCallEqualsWholeCall) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(spec_string(s.spec));
    CaseData data(s.spec, s.dtype, 4);
    const std::vector<std::byte> whole = run_bytes(data, data.problem());
    const AttentionProblem n = core::normalize_and_check(data.problem());
    const std::int64_t work = 4 * n.batch * n.heads * n.q_len * std::max<std::int64_t>(n.k_len, 1) * n.head_dim;
    for (std::int64_t budget : {std::int64_t{1}, std::int64_t{1000}, work / 13, work / 7, work / 3, work / 2, work + 1}) {
      for (int threads : {0, 3}) {
        AttentionProblem cut = data.problem();
        cut.work_budget = std::max<std::int64_t>(budget, 1);
        AttentionConfig config;
        config.threads = threads;
        EXPECT_TRUE(run_bytes(data, cut, config) == whole) << "budget " << budget << ", threads " << threads;
      }
    }
  }
}

TEST(Determinism, CallerScratchEqualsOwnScratch) {
  for (const Shape& s : shapes()) {
    for (int threads : {0, 1, 3}) {
      SCOPED_TRACE(spec_string(s.spec) + " threads " + std::to_string(threads));
      CaseData data(s.spec, s.dtype, 5);
      AttentionConfig config;
      config.threads = threads;
      const std::vector<std::byte> own = run_bytes(data, data.problem(), config);
      const std::size_t need = Attention(data.problem(), config).scratch_bytes();
      AlignedScratch scratch(need);
      EXPECT_TRUE(run_bytes(data, data.problem(), config, scratch.data.get(), need) == own);
      // Reused as it is (holding the last run's partials) and offered with room to spare.
      EXPECT_TRUE(run_bytes(data, data.problem(), config, scratch.data.get(), scratch.size) == own);
      // A cut call with caller scratch.
      AttentionProblem cut = data.problem();
      cut.work_budget = 1;
      EXPECT_TRUE(run_bytes(data, cut, config, scratch.data.get(), need) == own);
    }
  }
}

// Scratch on the CPU backend is the per-thread tiles (so that run() never allocates when scratch is given) plus,
// for a split problem, the partial states of the key ranges; the float64 reference needs none.
TEST(Determinism, ScratchHoldsThreadTilesAndSplitPartials) {
  for (const Shape& s : shapes()) {
    CaseData data(s.spec, s.dtype, 6);
    AttentionConfig one, two, reference;
    one.threads = 1;
    two.threads = 2;
    reference.backend = Backend::Reference;
    const std::size_t need1 = Attention(data.problem(), one).scratch_bytes();
    const std::size_t need2 = Attention(data.problem(), two).scratch_bytes();
    EXPECT_GT(need1, 0u) << s.spec.name;
    EXPECT_GT(need2, need1) << s.spec.name << ": each thread works in its own tiles";
    EXPECT_EQ(Attention(data.problem(), reference).scratch_bytes(), 0u) << s.spec.name;
  }
}

// The Reference backend too ("determinism and cut-versus-whole bit equality on every backend").
TEST(Determinism, ReferenceBackend) {
  for (const Shape& s : shapes()) {
    if (s.spec.name == "bert_b1_s128") continue;  // the float64 reference is slow; the small shapes suffice
    SCOPED_TRACE(spec_string(s.spec));
    CaseData data(s.spec, s.dtype, 7);
    AttentionConfig config;
    config.backend = Backend::Reference;
    const std::vector<std::byte> whole = run_bytes(data, data.problem(), config);
    EXPECT_TRUE(run_bytes(data, data.problem(), config) == whole);
    AttentionProblem cut = data.problem();
    cut.work_budget = 1;
    EXPECT_TRUE(run_bytes(data, cut, config) == whole);
  }
}

}  // namespace
}  // namespace attnkit::test
