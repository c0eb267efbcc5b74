// Context parallelism on the CPU: the ring decomposition over N simulated ranks, each rank attending its slice of
// queries to every K/V slice in ring order and folding the partials, against the whole call (CPU backend) and the
// float64 reference; the plan's coverage and balance; bit-identical reruns; bad input.
#include "test_support.hpp"

#include <attnkit/context_parallel.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace attnkit::test {
namespace {

struct Shape {
  std::int64_t batch = 1, heads = 2, kv_heads = 2, chunk = 5, head_dim = 16, v_head_dim = 16;
  bool causal = false;
  std::optional<std::int64_t> window;
  std::optional<float> softcap;
};

std::string describe(const Shape& s, int n, RingLayout layout, DType dtype) {
  return "N=" + std::to_string(n) + (layout == RingLayout::ZigZag ? " zigzag" : " contiguous") +
         " causal=" + std::to_string(s.causal) + " B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads) +
         " Hkv=" + std::to_string(s.kv_heads) + " D=" + std::to_string(s.head_dim) +
         " Dv=" + std::to_string(s.v_head_dim) + " window=" + std::to_string(s.window.value_or(0)) +
         " softcap=" + std::to_string(s.softcap.value_or(0.0f)) + " " + std::string(dtype_name(dtype));
}

RingProblem ring_problem(const Shape& s, int n, RingLayout layout, DType dtype) {
  RingProblem r;
  r.batch = s.batch;
  r.heads = s.heads;
  r.kv_heads = s.kv_heads;
  r.seq_len = s.chunk * n * (layout == RingLayout::ZigZag ? 2 : 1);
  r.head_dim = s.head_dim;
  r.v_head_dim = s.v_head_dim;
  r.dtype = dtype;
  r.causal = s.causal;
  r.window = s.window;
  r.softcap = s.softcap;
  return r;
}

// The whole problem as one call, with random inputs and its LSE.
Manual whole_call(const RingProblem& r, std::uint64_t seed) {
  Manual m(r.batch, r.heads, r.kv_heads, r.seq_len, r.seq_len, r.head_dim, r.v_head_dim, r.dtype);
  m.p.causal = r.causal;
  m.p.window = r.window;
  m.p.softcap = r.softcap;
  m.p.return_lse = true;
  m.p.lse = Layout::rows_only(r.heads, r.seq_len);
  m.randomize(seed);
  return m;
}

// Every rank's local tensors, cut from the whole ones by the plan's chunks; outputs poisoned.
struct Ranks {
  std::vector<std::vector<std::byte>> q, k, v, o;
  std::vector<std::vector<float>> lse;
  std::vector<RankBuffers> buffers;
};

// Copies rows [from, from + count) of [batch, heads, rows, dim] tensor `src` (`src_rows` rows) into rows
// [to, to + count) of `dst` (`dst_rows` rows).
void copy_rows(const std::byte* src, std::int64_t src_rows, std::int64_t from, std::byte* dst, std::int64_t dst_rows,
               std::int64_t to, std::int64_t count, std::int64_t planes, std::int64_t row_bytes) {
  for (std::int64_t bh = 0; bh < planes; ++bh)
    std::memcpy(dst + (bh * dst_rows + to) * row_bytes, src + (bh * src_rows + from) * row_bytes,
                static_cast<std::size_t>(count * row_bytes));
}

Ranks scatter(const RingPlan& plan, const Manual& whole) {
  const RingProblem& p = plan.problem;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  Ranks out;
  for (const RankPlan& rank : plan.rank) {
    const std::int64_t len = rank.local_len;
    out.q.emplace_back(static_cast<std::size_t>(p.batch * p.heads * len * p.head_dim * es));
    out.k.emplace_back(static_cast<std::size_t>(p.batch * p.kv_heads * len * p.head_dim * es));
    out.v.emplace_back(static_cast<std::size_t>(p.batch * p.kv_heads * len * p.v_head_dim * es));
    out.o.emplace_back(static_cast<std::size_t>(p.batch * p.heads * len * p.v_head_dim * es), std::byte{0x7f});
    out.lse.emplace_back(static_cast<std::size_t>(p.batch * p.heads * len), std::nanf("0x5a"));
    for (const TokenChunk& c : rank.chunks) {
      copy_rows(whole.q.data(), p.seq_len, c.begin, out.q.back().data(), len, c.local_row, c.length,
                p.batch * p.heads, p.head_dim * es);
      copy_rows(whole.k.data(), p.seq_len, c.begin, out.k.back().data(), len, c.local_row, c.length,
                p.batch * p.kv_heads, p.head_dim * es);
      copy_rows(whole.v.data(), p.seq_len, c.begin, out.v.back().data(), len, c.local_row, c.length,
                p.batch * p.kv_heads, p.v_head_dim * es);
    }
  }
  for (std::size_t r = 0; r < plan.rank.size(); ++r) {
    const auto count = [&](const std::vector<std::byte>& b) { return static_cast<std::int64_t>(b.size()) / es; };
    out.buffers.push_back({{out.q[r].data(), count(out.q[r])},
                           {out.k[r].data(), count(out.k[r])},
                           {out.v[r].data(), count(out.v[r])},
                           {out.o[r].data(), count(out.o[r])},
                           {out.lse[r].data(), static_cast<std::int64_t>(out.lse[r].size())}});
  }
  return out;
}

// The ranks' outputs put back in whole-sequence order, into a copy of the whole call.
Manual gather(const RingPlan& plan, const Ranks& ranks, const Manual& whole) {
  const RingProblem& p = plan.problem;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  Manual m = whole;
  for (std::size_t r = 0; r < plan.rank.size(); ++r) {
    const std::int64_t len = plan.rank[r].local_len;
    for (const TokenChunk& c : plan.rank[r].chunks) {
      copy_rows(ranks.o[r].data(), len, c.local_row, m.o.data(), p.seq_len, c.begin, c.length, p.batch * p.heads,
                p.v_head_dim * es);
      copy_rows(reinterpret_cast<const std::byte*>(ranks.lse[r].data()), len, c.local_row,
                reinterpret_cast<std::byte*>(m.lse.data()), p.seq_len, c.begin, c.length, p.batch * p.heads, 4);
    }
  }
  return m;
}

// max |a - b| / max |b| over O, and max |lse_a - lse_b| / max(1, |lse_b|).
std::pair<double, double> difference(const Manual& a, const Manual& b) {
  double diff = 0.0, top = 0.0, lse = 0.0;
  const std::int64_t count = static_cast<std::int64_t>(b.o.size() / dtype_size(b.p.dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    const double x = a.get(a.o, i), y = b.get(b.o, i);
    if (!std::isfinite(x)) return {INFINITY, INFINITY};
    diff = std::max(diff, std::abs(x - y));
    top = std::max(top, std::abs(y));
  }
  for (std::size_t i = 0; i < b.lse.size(); ++i) {
    if (!std::isfinite(a.lse[i])) return {INFINITY, INFINITY};
    lse = std::max(lse, std::abs(double(a.lse[i]) - b.lse[i]) / std::max(1.0, std::abs(double(b.lse[i]))));
  }
  return {top > 0.0 ? diff / top : diff, lse};
}

double lse_error_vs(const Manual& m, const cpu::ReferenceResult& ref) {
  double e = 0.0;
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    if (!std::isfinite(m.lse[i])) return INFINITY;
    e = std::max(e, std::abs(m.lse[i] - ref.lse[i]) / std::max(1.0, std::abs(ref.lse[i])));
  }
  return e;
}

double lse_bound(DType dtype) { return dtype == DType::f32 ? kLseTolerance : testing::tolerance(dtype); }

const AttentionConfig kCpu{Backend::Cpu, 0, {}};

// The ring against the whole call on the CPU backend and against the float64 reference.
void check_ring(const Shape& s, int n, RingLayout layout, DType dtype, std::uint64_t seed) {
  SCOPED_TRACE(describe(s, n, layout, dtype));
  const RingPlan plan = plan_ring(ring_problem(s, n, layout, dtype), n, layout);
  Manual whole = whole_call(plan.problem, seed);
  Ranks ranks = scatter(plan, whole);
  whole.run(kCpu);
  run_ring_on_cpu(plan, ranks.buffers, kCpu);
  const Manual ring = gather(plan, ranks, whole);

  const double tol = testing::tolerance(dtype);
  const auto [err_vs_whole, lse_vs_whole] = difference(ring, whole);
  EXPECT_LE(err_vs_whole, tol);
  EXPECT_LE(lse_vs_whole, lse_bound(dtype));
  const cpu::ReferenceResult ref = whole.reference();
  EXPECT_LE(ring.scaled_error(ref), tol);
  EXPECT_LE(lse_error_vs(ring, ref), lse_bound(dtype));
  EXPECT_LE(whole.scaled_error(ref), tol);  // the baseline itself holds the contract
}

constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr RingLayout kLayouts[] = {RingLayout::Contiguous, RingLayout::ZigZag};

TEST(ContextParallel, EveryRankCountLayoutAndDtype) {
  for (int n = 1; n <= 8; ++n)
    for (RingLayout layout : kLayouts)
      for (bool causal : {false, true})
        for (DType dtype : kDtypes) {
          Shape s;
          s.causal = causal;
          check_ring(s, n, layout, dtype, 100 + n);
        }
}

TEST(ContextParallel, GqaWindowSoftcapOddSizes) {
  Shape gqa;  // 6 query heads on 2 K/V heads, odd dims, batch 2
  gqa.batch = 2;
  gqa.heads = 6;
  gqa.kv_heads = 2;
  gqa.head_dim = 40;
  gqa.v_head_dim = 24;
  gqa.chunk = 7;
  Shape window = gqa;
  window.causal = true;
  window.window = 9;  // crosses chunk edges: some blocks skipped, some full, some masked
  Shape capped = gqa;
  capped.causal = true;
  capped.softcap = 3.5f;
  Shape all = window;
  all.softcap = 2.0f;
  all.head_dim = 3;
  all.v_head_dim = 5;
  all.chunk = 3;
  for (const Shape& s : {gqa, window, capped, all})
    for (int n : {1, 2, 3, 5, 8})
      for (RingLayout layout : kLayouts)
        for (DType dtype : kDtypes) check_ring(s, n, layout, dtype, 7 * n + 1);
}

// Every rank meets every (query chunk, key chunk) pair of its own queries exactly once over the ring, the blocks'
// visible pairs add up to the causal triangle, and the zig-zag layout gives every rank the same work.
TEST(ContextParallel, PlanCoversEachPairOnceAndZigZagBalances) {
  for (int n = 1; n <= 8; ++n) {
    RingProblem p;
    p.heads = 1;
    p.head_dim = 8;
    p.causal = true;
    p.seq_len = 6 * n;
    const RingPlan plan = plan_ring(p, n, RingLayout::ZigZag);
    std::int64_t total = 0;
    std::vector<std::int64_t> per_rank;
    std::vector<int> seen_kv(static_cast<std::size_t>(2 * n), 0);
    for (int r = 0; r < n; ++r) {
      const RankPlan& rank = plan.rank[static_cast<std::size_t>(r)];
      ASSERT_EQ(rank.steps.size(), static_cast<std::size_t>(n));
      std::int64_t visible = 0;
      std::vector<int> owners;
      for (const RingStep& step : rank.steps) {
        owners.push_back(step.kv_owner);
        for (const RingBlock& b : step.blocks) {
          const TokenChunk& q = rank.chunks[static_cast<std::size_t>(b.q_chunk)];
          const TokenChunk& k = plan.rank[static_cast<std::size_t>(step.kv_owner)].chunks[static_cast<std::size_t>(b.kv_chunk)];
          std::int64_t pairs = 0;  // brute force: visible (i, j) of the block
          for (std::int64_t i = 0; i < q.length; ++i)
            for (std::int64_t j = 0; j < k.length; ++j) pairs += k.begin + j <= q.begin + i;
          if (b.kind == BlockKind::Skip) EXPECT_EQ(pairs, 0);
          if (b.kind == BlockKind::Full) EXPECT_EQ(pairs, q.length * k.length);
          if (b.kind == BlockKind::Masked) EXPECT_EQ(b.causal_offset, q.begin - k.begin);
          visible += pairs;
        }
      }
      std::sort(owners.begin(), owners.end());
      for (int o = 0; o < n; ++o) EXPECT_EQ(owners[static_cast<std::size_t>(o)], o);
      for (const TokenChunk& c : rank.chunks) ++seen_kv[static_cast<std::size_t>(c.begin / c.length)];
      per_rank.push_back(visible);
      total += visible;
    }
    EXPECT_EQ(total, p.seq_len * (p.seq_len + 1) / 2);
    for (std::int64_t v : per_rank) EXPECT_EQ(v, per_rank[0]) << "N=" << n;
    for (int c : seen_kv) EXPECT_EQ(c, 1);  // each of the 2N chunks held by exactly one rank
  }
}

// Two runs in the same ring order give the same bytes, and so do runs on 1 and 2 threads.
TEST(ContextParallel, MergeIsBitIdenticalInAFixedRingOrder) {
  Shape s;
  s.causal = true;
  s.heads = 4;
  s.kv_heads = 2;
  s.chunk = 9;
  for (DType dtype : kDtypes) {
    const RingPlan plan = plan_ring(ring_problem(s, 4, RingLayout::ZigZag, dtype), 4, RingLayout::ZigZag);
    const Manual whole = whole_call(plan.problem, 42);
    Ranks first = scatter(plan, whole), second = scatter(plan, whole), third = scatter(plan, whole);
    run_ring_on_cpu(plan, first.buffers, kCpu);
    run_ring_on_cpu(plan, second.buffers, kCpu);
    run_ring_on_cpu(plan, third.buffers, AttentionConfig{Backend::Cpu, 1, {}});
    for (int r = 0; r < plan.ranks; ++r) {
      EXPECT_EQ(first.o[r], second.o[r]) << dtype_name(dtype) << " rank " << r;
      EXPECT_EQ(first.o[r], third.o[r]) << dtype_name(dtype) << " rank " << r;
      EXPECT_EQ(0, std::memcmp(first.lse[r].data(), second.lse[r].data(), first.lse[r].size() * 4));
      EXPECT_EQ(0, std::memcmp(first.lse[r].data(), third.lse[r].data(), first.lse[r].size() * 4));
    }
  }
}

void expect_error(const std::function<void()>& call, const std::string& argument) {
  try {
    call();
    ADD_FAILURE() << "no Error for " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(ContextParallel, BadInputIsRejectedNamingTheArgument) {
  RingProblem p;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 8;
  p.seq_len = 24;
  expect_error([&] { plan_ring(p, 0, RingLayout::Contiguous); }, "ranks");
  expect_error([&] { plan_ring(p, -3, RingLayout::ZigZag); }, "ranks");
  expect_error([&] { plan_ring(p, 5, RingLayout::Contiguous); }, "seq_len");   // 24 % 5
  expect_error([&] { plan_ring(p, 8, RingLayout::ZigZag); }, "seq_len");       // 24 % 16
  expect_error([&] { plan_ring(p, 2, static_cast<RingLayout>(9)); }, "layout");
  RingProblem empty = p;
  empty.seq_len = 0;
  expect_error([&] { plan_ring(empty, 1, RingLayout::Contiguous); }, "seq_len");
  RingProblem window = p;
  window.window = 4;
  expect_error([&] { plan_ring(window, 2, RingLayout::ZigZag); }, "window");  // needs causal
  RingProblem heads = p;
  heads.kv_heads = 3;
  expect_error([&] { plan_ring(heads, 2, RingLayout::Contiguous); }, "kv_heads");
  RingProblem dim = p;
  dim.head_dim = 0;
  expect_error([&] { plan_ring(dim, 2, RingLayout::Contiguous); }, "head_dim");

  // Buffers: the count, a short slice, the backend; nothing written before the Error.
  p.causal = true;
  const RingPlan plan = plan_ring(p, 3, RingLayout::ZigZag);
  const Manual whole = whole_call(plan.problem, 5);
  Ranks ranks = scatter(plan, whole);
  const Ranks untouched = ranks;
  std::vector<RankBuffers> fewer(ranks.buffers.begin(), ranks.buffers.end() - 1);
  expect_error([&] { run_ring_on_cpu(plan, fewer); }, "buffers");
  std::vector<RankBuffers> short_q = ranks.buffers;
  short_q[1].q.elements -= 1;
  expect_error([&] { run_ring_on_cpu(plan, short_q); }, "buffers[1].q");
  std::vector<RankBuffers> null_lse = ranks.buffers;
  null_lse[2].lse.data = nullptr;
  expect_error([&] { run_ring_on_cpu(plan, null_lse); }, "buffers[2].lse");
  expect_error([&] { run_ring_on_cpu(plan, ranks.buffers, AttentionConfig{Backend::Cuda, 0, {}}); },
               "config.backend");
  for (int r = 0; r < plan.ranks; ++r) {
    EXPECT_EQ(ranks.o[r], untouched.o[r]);
    EXPECT_EQ(0, std::memcmp(ranks.lse[r].data(), untouched.lse[r].data(), ranks.lse[r].size() * 4));
  }
}

}  // namespace
}  // namespace attnkit::test
