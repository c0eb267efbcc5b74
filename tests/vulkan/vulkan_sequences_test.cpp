// Ragged (packed) batches and paged K/V caches (AttentionProblem::sequences) on the Vulkan backend's host-buffer
// path: every sequence of a call must equal that sequence alone in a dense call, against the float64 reference
// (tests/sequences_batch.hpp builds the random batches and checks them, as for the CPU and CUDA backends: empty
// sequences, length 1, queries longer than keys, causal bottom-right, random page permutations, NHD and HND
// pages of 1, 3, 16 and 48 rows, shared prefix pages). Each batch runs unsplit and through a forced split and merge
// pass, on the rows kernel and (float16) on the matrix kernel forced (its matrix build on a device with cooperative
// matrices, its emulated build elsewhere); reruns and one-workgroup cuts give the same bits; rows past every
// sequence keep the caller's bytes (O and the LSE); bad host values are refused by name with nothing written.
// Every test fails on any validation-layer error. Without a device they skip.
#include "sequences_batch.hpp"
#include "vulkan_fixture.hpp"

#include <attnkit/vulkan.hpp>

#include <set>
#include <utility>

namespace attnkit::test {
namespace {

// The LSE elements ([rows, heads], positions first) that belong to some sequence's query rows.
std::set<std::int64_t> owned_lse(const Batch& batch, const BatchSpec& s) {
  std::set<std::int64_t> owned;
  for (std::int64_t b = 0; b < batch.batch(); ++b)
    for (std::int64_t i = 0; i < s.q_lens[b]; ++i)
      for (std::int64_t h = 0; h < s.heads; ++h) owned.insert(batch.query_row(b, i) * s.heads + h);
  return owned;
}

// Runs the batch on the host path and checks it against the reference (check_batch: every sequence's rows, and
// the O elements of no sequence untouched); also that the LSE of rows past every sequence keeps its poison and
// that the plan is the one expected (`phrase` in describe(), on the kernel the config forces or else rows).
// Returns O's bytes.
std::vector<std::uint8_t> check_on_vulkan(const Batch& batch, const BatchSpec& s, const AttentionConfig& config,
                                          const std::string& phrase) {
  std::vector<float> lse_after;
  std::string described;
  const BatchRunner runner = [&](Attention& op, const Batch& b, std::vector<std::uint8_t>& o, std::vector<float>& lse) {
    described = op.describe();
    op.run(b.args(o, lse));
    lse_after = lse;
  };
  const auto out = check_batch(batch, s, config, runner);
  EXPECT_NE(described.find(phrase), std::string::npos) << described;
  if (!config.plan.kernel.empty()) {
    EXPECT_NE(described.find("vulkan." + config.plan.kernel), std::string::npos) << described;
  }
  if (s.lse) {
    const std::set<std::int64_t> owned = owned_lse(batch, s);
    const std::vector<float> poison = batch.lse_buffer();
    for (std::size_t e = 0; e < lse_after.size(); ++e) {
      if (owned.count(static_cast<std::int64_t>(e)) == 0) EXPECT_EQ(lse_after[e], poison[e]) << "lse " << e << " was written";
    }
  }
  return out;
}

// The properties every batch owes on one kernel: it matches the reference unsplit
// and forced into three key ranges (merge pass), and reruns, a second plan and one-workgroup cuts (work_budget = 1)
// of either give the same bits.
void check_on_kernel(const BatchSpec& spec, std::uint64_t seed, const std::string& kernel) {
  SCOPED_TRACE("kernel " + (kernel.empty() ? std::string("(the plan's)") : kernel));
  BatchSpec s = spec;
  const Batch batch(s, seed);
  const auto whole = check_on_vulkan(batch, s, vulkan_config(kernel), "vulkan.");
  EXPECT_EQ(check_on_vulkan(batch, s, vulkan_config(kernel), "vulkan."), whole) << "a rerun differs";
  const auto split = check_on_vulkan(batch, s, vulkan_config(kernel, 3), "split-k=");
  s.work_budget = 1;  // one workgroup per launch
  const Batch cut(s, seed);
  EXPECT_EQ(check_on_vulkan(cut, s, vulkan_config(kernel), "launches"), whole) << "the cut call differs";
  EXPECT_EQ(check_on_vulkan(cut, s, vulkan_config(kernel, 3), "launches"), split) << "the cut split call differs";
}

// Every batch on the scalar kernel, and float16 batches of head dims up to 128 on the matrix kernel (the plan's
// choice for them where the device has matrices; the emulated build elsewhere), each forced.
void check_everything(const BatchSpec& spec, std::uint64_t seed) {
  check_on_kernel(spec, seed, "rows");
  if (spec.dtype == DType::f16 && std::max(spec.head_dim, spec.v_head_dim) <= 128) check_on_kernel(spec, seed, "coopmat");
}

class VulkanSequences : public VulkanTest {};

// Six ragged variants (tests/sequences_batch.hpp: grouped heads, a 40 dim and a narrower V dim, causal, a window, a
// softcap, a head sink, zero masked rows) in every dtype; the longest query run (50, 90 in variant 5) passes the
// longest key run (70), so some sequences have more queries than keys (causal bottom-right: early rows see none).
TEST_F(VulkanSequences, RaggedBatchesMatchEachSequenceAlone) {
  std::mt19937 rng(31);
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (int variant = 0; variant < 6; ++variant) {
      const BatchSpec s = ragged_variant(rng, t, variant, {24, 32, 16, 50, 90, 70});
      check_everything(s, 100 + variant);
    }
  }
}

// Ragged queries over dense, padded keys with key lengths.
TEST_F(VulkanSequences, RaggedQueriesOverDenseKeysWithKeyLengths) {
  std::mt19937 rng(7);
  BatchSpec s;
  s.dtype = DType::f16;
  s.q_lens = random_lengths(rng, 5, 40);
  s.k_lens = random_lengths(rng, 5, 90);
  s.ragged_k = false;
  s.causal = true;
  check_everything(s, 5);
}

// Paged K/V: pages of 1, 3 (not a power of two) and 16 rows in a random order among spare pages, NHD and HND,
// two sequences sharing their first page, ragged queries (chunked prefill) and dense ones (decode steps).
TEST_F(VulkanSequences, PagedKvMatchesEachSequenceAlone) {
  std::mt19937 rng(11);
  for (std::int64_t page : {1, 3, 16}) {
    for (int variant = 0; variant < 4; ++variant) {
      BatchSpec s;
      s.dtype = variant == 1 ? DType::bf16 : variant == 2 ? DType::f32 : DType::f16;
      s.page_size = page;
      s.heads_before_pages_rows = variant % 2 == 1;
      s.shared_prefix = variant >= 2;
      s.ragged_k = false;
      const std::int64_t batch = 5;
      s.k_lens = random_lengths(rng, batch, 100);
      if (variant == 3) {
        s.q_lens = random_lengths(rng, batch, 30);
      } else {
        s.ragged_q = false;
        s.q_lens.assign(batch, variant == 0 ? 1 : 6);
      }
      s.causal = variant != 2;
      if (variant == 1) s.window = 20;
      SCOPED_TRACE("page size " + std::to_string(page) + ", variant " + std::to_string(variant));
      check_everything(s, 1000 + page * 10 + variant);
    }
  }
}

// A decode step over long paged caches (pages of 48 rows, HND; a key length that ends mid-page): few workgroups,
// so the plan splits the keys itself (on a GPU to fill it, on a CPU device for llvmpipe's loop guard) and the
// merge pass folds the ranges; cut calls equal the whole call.
TEST_F(VulkanSequences, LongPagedDecodeSplitsOnItsOwn) {
  BatchSpec s;
  s.dtype = DType::f16;
  s.ragged_q = false;
  s.ragged_k = false;
  s.q_lens.assign(3, 1);
  s.k_lens = {2500, 1777, 0};
  s.page_size = 48;
  s.heads_before_pages_rows = true;
  s.shared_prefix = true;
  s.causal = true;
  const Batch batch(s, 41);
  const auto whole = check_on_vulkan(batch, s, vulkan_config(), "split-k=");
  s.work_budget = 1;
  EXPECT_EQ(check_on_vulkan(Batch(s, 41), s, vulkan_config(), "launches"), whole) << "the cut call differs";
}

// ---- refusals: an Error naming the argument, nothing written ----


TEST_F(VulkanSequences, BadHostValuesAreRejectedByNameWithNothingWritten) {
  for (const BadSequenceValue& bad : bad_sequence_values()) expect_rejected(bad, vulkan_config());
}

// On a device with matrices the plan takes the matrix kernel for float16 batches, rows elsewhere; forced, the
// matrix kernel takes float16 batches (the tests above run them) and refuses other dtypes by name. (Device buffers:
// vulkan_device_sequences_test.cpp.)
TEST_F(VulkanSequences, MatrixKernelWhereTheDeviceHasMatricesAndRefusesOtherDtypesByName) {
  for (const BatchSpec& base : {small_ragged(), small_paged()}) {
    BatchSpec s = base;
    s.dtype = DType::f16;
    const Batch batch(s, 3);
    const std::string described = Attention(batch.problem(), vulkan_config()).describe();
    const bool matrices = vulkan::current_device().cooperative_matrix;
    EXPECT_NE(described.find(matrices ? "vulkan.coopmat" : "vulkan.rows"), std::string::npos) << described;
    const std::string forced = Attention(batch.problem(), vulkan_config("coopmat")).describe();
    EXPECT_NE(forced.find("vulkan.coopmat"), std::string::npos) << forced;
    BatchSpec b = base;
    b.dtype = DType::bf16;
    try {
      Attention op(Batch(b, 3).problem(), vulkan_config("coopmat"));
      ADD_FAILURE() << "coopmat accepted a bfloat16 batch";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "config.plan.kernel") << e.what();
      EXPECT_NE(std::string(e.what()).find("float16 only"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnkit::test
