// append_kv on the CPU: every case of kv_append_cases.hpp gives the expected caches bit for bit (and touches no
// other byte); appended pages read back through the paged attention op equal the dense call on the same rows;
// every bad input is an Error naming the argument and the rule, with nothing written.
#include "kv_append_cases.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <utility>

namespace attnkit {
namespace {

using testing::AppendCase;
using testing::CacheKind;

TEST(KvAppend, EveryCaseWritesExactlyTheAppendedRows) {
  for (AppendCase c : testing::append_cases()) {
    for (Backend backend : {Backend::Auto, Backend::Cpu}) {
      AppendCase run = c;
      std::vector<std::byte> k, v;
      run.expected(k, v);
      std::int32_t status = 7;
      KvAppendArgs a = run.args();
      a.status = {&status, 1};
      append_kv(run.p, a, backend);
      EXPECT_TRUE(run.k_cache == k) << c.name;
      EXPECT_TRUE(run.v_cache == v) << c.name;
      EXPECT_EQ(status, -1) << c.name;
    }
  }
}

// K and V pages interleaved in one buffer ([num_pages, 2, page_size, kv_heads, dim]: vLLM's layout): the same rows
// as separate caches, and each page's K half and V half hold their own rows.
TEST(KvAppend, InterleavedKAndVPagesInOneBuffer) {
  AppendCase c(CacheKind::PagedNhd, DType::bf16, 3, 2, 6, 32, 32, 4, 3, true, 77);
  std::vector<std::byte> want_k, want_v;
  c.expected(want_k, want_v);
  const std::int64_t page = c.p.k_cache.batch_stride;  // elements of one K (or V) page
  std::vector<std::byte> both(static_cast<std::size_t>(2 * page * c.p.num_pages) * 2);
  for (std::int64_t g = 0; g < c.p.num_pages; ++g) {  // the poisoned pages, interleaved
    std::copy_n(c.k_cache.begin() + g * page * 2, page * 2, both.begin() + 2 * g * page * 2);
    std::copy_n(c.v_cache.begin() + g * page * 2, page * 2, both.begin() + (2 * g + 1) * page * 2);
  }
  KvAppendProblem p = c.p;
  p.k_cache.batch_stride = p.v_cache.batch_stride = 2 * page;
  p.v_cache.offset = page;
  KvAppendArgs a = c.args();
  a.k_cache = a.v_cache = {both.data(), static_cast<std::int64_t>(both.size() / 2)};
  append_kv(p, a, Backend::Cpu);
  for (std::int64_t g = 0; g < c.p.num_pages; ++g) {
    EXPECT_TRUE(std::equal(want_k.begin() + g * page * 2, want_k.begin() + (g + 1) * page * 2, both.begin() + 2 * g * page * 2)) << "K page " << g;
    EXPECT_TRUE(std::equal(want_v.begin() + g * page * 2, want_v.begin() + (g + 1) * page * 2, both.begin() + (2 * g + 1) * page * 2)) << "V page " << g;
  }
}

// A prompt appended page by page (two chunks), then attention over the pages: the same bits as the dense call on
// the prompt's rows (the CPU kernel reads a paged cache through the same steps).
TEST(KvAppend, AppendedPagesAttendLikeTheDenseCache) {
  constexpr std::int64_t kHeads = 4, kKvHeads = 2, kLen = 45, kDim = 32, kPage = 8, kPages = 6;
  AppendCase c(CacheKind::PagedNhd, DType::f32, 1, kKvHeads, kLen, kDim, kDim, kPage, kPages, false, 99);
  // Finite values for attention: the random bits of the case are replaced by small floats.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::vector<std::byte>* rows : {&c.k_new, &c.v_new}) {
    auto* f = reinterpret_cast<float*>(rows->data());
    for (std::size_t i = 0; i < rows->size() / 4; ++i) f[i] = u(rng);
  }
  // Two appends: rows [0, 20) at position 0, then [20, 45) at position 20.
  for (const auto& [from, count] : {std::pair<std::int64_t, std::int64_t>{0, 20}, {20, 25}}) {
    KvAppendProblem p = c.p;
    p.new_len = count;
    p.k_new.offset += from * p.k_new.row_stride;
    p.v_new.offset += from * p.v_new.row_stride;
    std::vector<std::int32_t> pos{static_cast<std::int32_t>(from)};
    KvAppendArgs a = c.args();
    a.positions = {pos.data(), 1};
    append_kv(p, a, Backend::Cpu);
  }
  std::vector<float> q(static_cast<std::size_t>(kHeads * kDim));
  for (float& x : q) x = u(rng);
  AttentionProblem dense = AttentionProblem::head_first(1, kHeads, kKvHeads, 1, kLen, kDim);
  dense.k = c.p.k_new;
  dense.v = c.p.v_new;
  AttentionProblem paged = dense;
  paged.k = c.p.k_cache;
  paged.v = c.p.v_cache;
  paged.sequences.page_size = kPage;
  paged.sequences.num_pages = c.p.num_pages;
  paged.sequences.max_pages_per_seq = kPages;
  std::vector<float> o_dense(q.size(), -1.0f), o_paged(q.size(), -2.0f);
  AttentionArgs a;
  a.q = {q.data(), static_cast<std::int64_t>(q.size())};
  a.k = {c.k_new.data(), static_cast<std::int64_t>(c.k_new.size() / 4)};
  a.v = {c.v_new.data(), static_cast<std::int64_t>(c.v_new.size() / 4)};
  a.o = {o_dense.data(), static_cast<std::int64_t>(o_dense.size())};
  Attention(dense, {}).run(a);
  a.k = {c.k_cache.data(), static_cast<std::int64_t>(c.k_cache.size() / 4)};
  a.v = {c.v_cache.data(), static_cast<std::int64_t>(c.v_cache.size() / 4)};
  a.o = {o_paged.data(), static_cast<std::int64_t>(o_paged.size())};
  a.block_table = {c.block_table.data(), static_cast<std::int64_t>(c.block_table.size())};
  Attention(paged, {}).run(a);
  EXPECT_EQ(o_dense, o_paged);
}

// A mutation of a valid case, the argument its Error must name and words of the rule; the caches unchanged.
void expect_rejected(const std::string& what, const std::function<void(AppendCase&, KvAppendArgs&)>& mutate,
                     const std::string& argument, const std::string& words, CacheKind kind = CacheKind::PagedNhd,
                     Backend backend = Backend::Cpu) {
  AppendCase c(kind, DType::f16, 3, 2, 5, 16, 16, 4, 3, true, 11);
  KvAppendArgs a = c.args();
  mutate(c, a);
  const std::vector<std::byte> k = c.k_cache, v = c.v_cache;
  try {
    append_kv(c.p, a, backend);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << what << ": " << e.what();
  }
  EXPECT_TRUE(c.k_cache == k && c.v_cache == v) << what << ": a cache was written";
}

TEST(KvAppend, BadInputIsRejectedByNameAndWritesNothing) {
  expect_rejected("position past the capacity", [](AppendCase& c, KvAppendArgs&) {
    c.new_lengths[1] = 2;
    c.positions[1] = 11;  // rows [11, 13) of 12
  }, "positions[1]", "rows [11, 13) must lie in [0, 12)");
  expect_rejected("negative position", [](AppendCase& c, KvAppendArgs&) {
    c.positions[0] = -1;
    c.new_lengths[0] = 2;
  }, "positions[0]", "must lie in");
  expect_rejected("new length past new_len", [](AppendCase& c, KvAppendArgs&) { c.new_lengths[2] = 6; },
                  "new_lengths[2]", "must be in [0, new_len = 5]");
  expect_rejected("page out of range", [](AppendCase& c, KvAppendArgs&) {
    c.new_lengths[0] = 5;
    c.positions[0] = 0;
    c.block_table[1] = static_cast<std::int32_t>(c.p.num_pages);
  }, "block_table[0]", "must be in [0, num_pages");
  expect_rejected("no block table", [](AppendCase&, KvAppendArgs& a) { a.block_table = {}; }, "block_table",
                  "is null");
  expect_rejected("short block table", [](AppendCase&, KvAppendArgs& a) { a.block_table.elements -= 1; },
                  "block_table", "holds");
  expect_rejected("cache too small", [](AppendCase&, KvAppendArgs& a) { a.k_cache.elements -= 1; }, "k_cache",
                  "holds");
  expect_rejected("new rows too small", [](AppendCase&, KvAppendArgs& a) { a.v_new.elements = 3; }, "v_new", "holds");
  expect_rejected("no positions", [](AppendCase&, KvAppendArgs& a) { a.positions = {}; }, "positions", "is null");
  expect_rejected("new lengths not asked for", [](AppendCase& c, KvAppendArgs&) { c.p.has_new_lengths = false; },
                  "new_lengths", "was given");
  expect_rejected("new rows in the cache", [](AppendCase& c, KvAppendArgs& a) {
    a.k_new = {a.k_cache.data, a.k_cache.elements};
    c.p.k_new = Layout{0, 0, 0, 0};
  }, "k_new", "overlaps k_cache");
  expect_rejected("one cache for K and V", [](AppendCase& c, KvAppendArgs& a) {
    a.v_cache = a.k_cache;
    c.p.v_cache = c.p.k_cache;
  }, "v_cache", "is the same memory as k_cache");
  expect_rejected("cache rows sharing addresses", [](AppendCase& c, KvAppendArgs&) { c.p.v_cache.row_stride = 8; },
                  "v_cache.row_stride", "must not share addresses");
  expect_rejected("negative stride", [](AppendCase& c, KvAppendArgs&) { c.p.k_new.head_stride = -1; },
                  "k_new.head_stride", "must be >= 0");
  expect_rejected("head dim 0", [](AppendCase& c, KvAppendArgs&) { c.p.head_dim = 0; }, "head_dim", "[1, 256]");
  expect_rejected("page size negative", [](AppendCase& c, KvAppendArgs&) { c.p.page_size = -4; }, "page_size",
                  "must be in [1, 2^31)");
  expect_rejected("capacity on a paged cache", [](AppendCase& c, KvAppendArgs&) { c.p.capacity = 9; }, "capacity",
                  "is for dense caches");
  expect_rejected("block table on a dense cache", [](AppendCase& c, KvAppendArgs& a) {
    a.block_table = {c.positions.data(), 3};
  }, "block_table", "the cache is dense", CacheKind::Dense);
  expect_rejected("Vulkan", [](AppendCase&, KvAppendArgs&) {}, "backend", "no Vulkan implementation",
                  CacheKind::PagedNhd, Backend::Vulkan);
}

}  // namespace
}  // namespace attnkit
