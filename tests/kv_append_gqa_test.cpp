// append_kv with rotary on K and int8 / int4 caches, against the GroupQueryAttention op's cache update:
//   - every case of kv_append_gqa_cases.hpp (dtypes, rotary full / partial / interleaved, float / int8 / int4
//     per side, per-tensor / per-channel scales, dense, paged NHD and HND, ragged) leaves the caches the op leaves,
//     bit for bit, and no other byte changed;
//   - attention over the appended quantized pages equals attention over the op's cache, bit for bit;
//   - every bad rotary or quantization input is an Error naming the argument and the rule, with nothing written.
#include "kv_append_gqa_cases.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/error.hpp>
#include <attnkit/gqa.hpp>

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

namespace attnkit::test {
namespace {

// Runs the op (CPU) on the case's call: call.present_key / present_value become its caches after the append.
void run_op(GqaAppendCase& c) {
  GroupQueryAttention op(c.call.attrs, GqaConfig{Backend::Cpu, 1});
  op.run(c.call.inputs(), c.call.outputs());
}

TEST(KvAppend, RotaryAndQuantizedRowsEqualTheGqaOpsCache) {
  for (GqaAppendCase c : gqa_append_cases()) {
    const std::vector<std::byte> want_k =
        c.scatter(c.k_side, c.op_rows(c.k_side, (run_op(c), c.call.present_key), c.call.past_key_before), c.p.k_cache);
    const std::vector<std::byte> want_v =
        c.scatter(c.v_side, c.op_rows(c.v_side, c.call.present_value, c.call.past_value_before), c.p.v_cache);
    std::int32_t status = 7;
    KvAppendArgs a = c.args();
    a.status = {&status, 1};
    append_kv(c.p, a, Backend::Cpu);
    EXPECT_TRUE(c.k_cache == want_k) << c.name << ": K";
    EXPECT_TRUE(c.v_cache == want_v) << c.name << ": V";
    EXPECT_EQ(status, -1) << c.name;
  }
}

// Decode queries over (a) the op's dense cache after its append and (b) append_kv's pages: the same bits.
TEST(KvAppend, AttentionOverAppendedQuantizedPagesEqualsOverTheGqaCache) {
  for (AppendCache kind : {AppendCache::PagedNhd, AppendCache::PagedHnd}) {
    for (const auto& [k_quant, v_quant, bits] :
         {std::tuple{"PER_TENSOR", "PER_CHANNEL", 8}, std::tuple{"PER_CHANNEL", "PER_TENSOR", 4}}) {
      GqaAppendCase c(append_options(DType::f32, 32, true, false, 0, k_quant, v_quant, bits, 41), kind, false, 41);
      run_op(c);
      append_kv(c.p, c.args(), Backend::Cpu);
      const GqaCall& g = c.call;
      const std::int64_t heads = g.o.heads, H = g.H;
      std::mt19937 rng(3);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> q(static_cast<std::size_t>(g.o.batch * heads * H));
      for (float& x : q) x = normal(rng);
      std::vector<std::int32_t> lengths(g.o.lengths.begin(), g.o.lengths.end());
      AttentionProblem dense = AttentionProblem::head_first(g.o.batch, heads, g.o.kv_heads, 1, g.C, H);
      dense.k = Layout::head_first(g.o.kv_heads, g.C, c.k_side.row_values);
      dense.v = Layout::head_first(g.o.kv_heads, g.C, c.v_side.row_values);
      dense.k_storage = c.p.k_storage;
      dense.v_storage = c.p.v_storage;
      dense.has_key_lengths = true;
      AttentionProblem paged = dense;
      paged.k = c.p.k_cache;
      paged.v = c.p.v_cache;
      paged.k_len = c.p.max_pages_per_seq * c.p.page_size;
      paged.sequences.page_size = c.p.page_size;
      paged.sequences.num_pages = c.p.num_pages;
      paged.sequences.max_pages_per_seq = c.p.max_pages_per_seq;
      std::vector<float> o_dense(q.size(), -1.0f), o_paged(q.size(), -2.0f);
      AttentionArgs a;
      a.q = {q.data(), static_cast<std::int64_t>(q.size())};
      a.k = {g.present_key.data(), c.values(c.k_side, g.present_key)};
      a.v = {g.present_value.data(), c.values(c.v_side, g.present_value)};
      a.k_scale = {g.k_scale.data(), static_cast<std::int64_t>(g.k_scale.size())};
      a.v_scale = {g.v_scale.data(), static_cast<std::int64_t>(g.v_scale.size())};
      a.key_lengths = {lengths.data(), static_cast<std::int64_t>(lengths.size())};
      a.o = {o_dense.data(), static_cast<std::int64_t>(o_dense.size())};
      Attention(dense, {}).run(a);
      a.k = {c.k_cache.data(), c.values(c.k_side, c.k_cache)};
      a.v = {c.v_cache.data(), c.values(c.v_side, c.v_cache)};
      a.block_table = {c.block_table.data(), static_cast<std::int64_t>(c.block_table.size())};
      a.o = {o_paged.data(), static_cast<std::int64_t>(o_paged.size())};
      Attention(paged, {}).run(a);
      EXPECT_EQ(o_dense, o_paged) << c.name;
    }
  }
}

// A mutation of a valid rotary + int8 / int4 case, the argument its Error must name and words of the rule; the
// (poisoned) caches unchanged.
void expect_rejected(const std::string& what, const std::function<void(GqaAppendCase&, KvAppendArgs&)>& mutate,
                     const std::string& argument, const std::string& words, std::int64_t bits = 8) {
  GqaAppendCase c(append_options(DType::f16, 32, true, false, 0, "PER_CHANNEL", "PER_TENSOR", bits, 5),
                  AppendCache::PagedNhd, true, 5);
  for (std::byte& x : c.k_cache) x = std::byte{0x5C};
  for (std::byte& x : c.v_cache) x = std::byte{0xC5};
  KvAppendArgs a = c.args();
  mutate(c, a);
  const std::vector<std::byte> k = c.k_cache, v = c.v_cache;
  try {
    append_kv(c.p, a, Backend::Cpu);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << what << ": " << e.what();
  }
  EXPECT_TRUE(c.k_cache == k && c.v_cache == v) << what << ": a cache was written";
}

TEST(KvAppend, BadRotaryOrQuantizationInputIsRejectedByName) {
  expect_rejected("odd rotary_dim", [](GqaAppendCase& c, KvAppendArgs&) { c.p.rotary_dim = 7; }, "rotary_dim",
                  "must be even and in [2, head_dim = 32]");
  expect_rejected("rotary_dim past head_dim", [](GqaAppendCase& c, KvAppendArgs&) { c.p.rotary_dim = 34; },
                  "rotary_dim", "must be even");
  expect_rejected("no cos_cache", [](GqaAppendCase&, KvAppendArgs& a) { a.cos_cache = {}; }, "cos_cache", "is null");
  expect_rejected("short sin_cache", [](GqaAppendCase&, KvAppendArgs& a) { a.sin_cache.elements -= 1; }, "sin_cache",
                  "holds");
  expect_rejected("cos_cache without rotary", [](GqaAppendCase& c, KvAppendArgs& a) {
    c.p.rotary_dim = 0, c.p.rotary_positions = 0, c.p.rotary_interleaved = false;
    a.sin_cache = {};
  }, "cos_cache", "was given but rotary_dim is 0");
  expect_rejected("interleaved without rotary", [](GqaAppendCase& c, KvAppendArgs& a) {
    c.p.rotary_dim = 0, c.p.rotary_positions = 0, c.p.rotary_interleaved = true;
    a.cos_cache = a.sin_cache = {};
  }, "rotary_interleaved", "rotary_dim is 0");
  expect_rejected("position past the cos / sin rows", [](GqaAppendCase& c, KvAppendArgs&) {
    c.new_lengths[1] = 3;
    c.p.rotary_positions = 12;  // entry 1 appends rows [10, 13)
  }, "positions[1]", "reach past the cos / sin caches' 12 rows");
  expect_rejected("cos_cache inside the K cache", [](GqaAppendCase&, KvAppendArgs& a) {
    a.cos_cache.data = a.k_cache.data;
  }, "cos_cache", "overlaps k_cache");
  expect_rejected("no k_scale", [](GqaAppendCase&, KvAppendArgs& a) { a.k_scale = {}; }, "k_scale",
                  "is null but the tensor is quantized (per channel)");
  expect_rejected("short k_scale", [](GqaAppendCase&, KvAppendArgs& a) { a.k_scale.elements = 1; }, "k_scale",
                  "per-channel quantization needs kv_heads * dim = 64");
  expect_rejected("zero scale", [](GqaAppendCase& c, KvAppendArgs&) { c.call.v_scale[0] = 0.0f; }, "v_scale[0]",
                  "must be finite and > 0");
  expect_rejected("NaN scale", [](GqaAppendCase& c, KvAppendArgs&) { c.call.k_scale[17] = std::nanf(""); },
                  "k_scale[17]", "must be finite and > 0");
  expect_rejected("scale of a float cache", [](GqaAppendCase& c, KvAppendArgs&) {
    c.p.v_storage = {};
  }, "v_scale", "the tensor is not quantized");
  expect_rejected("int8 without a quantization", [](GqaAppendCase& c, KvAppendArgs&) {
    c.p.k_storage.quant = KvQuant::None;
  }, "k_storage.quant", "must be PerTensor or PerChannel");
  expect_rejected("int4 rows not on bytes", [](GqaAppendCase& c, KvAppendArgs&) { c.p.k_cache.offset = 1; },
                  "k_cache.offset", "must be even for an int4 k_cache", 4);
  expect_rejected("short int4 cache", [](GqaAppendCase&, KvAppendArgs& a) { a.v_cache.elements -= 1; }, "v_cache",
                  "holds", 4);
}

}  // namespace
}  // namespace attnkit::test
