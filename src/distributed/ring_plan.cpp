// The ring decomposition of one self-attention prefill: which tokens each rank holds, and for each ring step
// which (query chunk, key chunk) pairs it attends, each as one call of the attention op.
#include <attnkit/context_parallel.hpp>

#include <core/problem_check.hpp>
#include <core/require.hpp>

#include <string>

namespace attnkit {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// The whole call as the attention op sees it: checking it applies every rule of the contract (heads, dims,
// scale, softcap, window) with the op's own messages, and fills the defaults the plan keeps.
AttentionProblem whole_call(const RingProblem& r) {
  AttentionProblem p =
      AttentionProblem::head_first(r.batch, r.heads, r.kv_heads, r.seq_len, r.seq_len, r.head_dim, r.dtype);
  p.v_head_dim = r.v_head_dim;
  if (r.v_head_dim > 0) {
    p.v = Layout::head_first(p.kv_heads, r.seq_len, r.v_head_dim);
    p.o = Layout::head_first(r.heads, r.seq_len, r.v_head_dim);
  }
  p.scale = r.scale;
  p.causal = r.causal;
  p.window = r.window;
  p.softcap = r.softcap;
  return core::normalize_and_check(p);
}

std::vector<TokenChunk> rank_chunks(std::int64_t seq_len, int ranks, int rank, RingLayout layout) {
  if (layout == RingLayout::Contiguous) {
    const std::int64_t len = seq_len / ranks;
    return {{rank * len, len, 0}};
  }
  const std::int64_t len = seq_len / (2 * ranks);
  const std::int64_t mirror = 2 * ranks - 1 - rank;
  return {{rank * len, len, 0}, {mirror * len, len, len}};
}

// Query positions [qb, qb + ql), key positions [kb, kb + kl). Key j (local) is visible to query i (local) when
// kb + j <= qb + i, i.e. j <= i + (qb - kb), and, with a window w, kb + j > qb + i - w.
RingBlock classify(const RingProblem& p, const TokenChunk& q, const TokenChunk& kv) {
  RingBlock b;
  b.causal_offset = q.begin - kv.begin;
  if (!p.causal) {
    b.kind = BlockKind::Full;
    return b;
  }
  const std::int64_t q_last = q.begin + q.length - 1;
  const std::int64_t kv_last = kv.begin + kv.length - 1;
  const std::int64_t w = p.window.value_or(0);
  const bool none_visible = kv.begin > q_last || (w > 0 && kv_last <= q.begin - w);
  const bool all_visible = kv_last <= q.begin && (w == 0 || kv.begin > q_last - w);
  b.kind = none_visible ? BlockKind::Skip : all_visible ? BlockKind::Full : BlockKind::Masked;
  return b;
}

}  // namespace

RingPlan plan_ring(const RingProblem& problem, int ranks, RingLayout layout) {
  ATTNKIT_REQUIRE(ranks >= 1, "ranks", "must be >= 1 (got " + str(ranks) + ")");
  ATTNKIT_REQUIRE(layout == RingLayout::Contiguous || layout == RingLayout::ZigZag, "layout",
                  "must be Contiguous or ZigZag");
  ATTNKIT_REQUIRE(problem.seq_len >= 1, "seq_len", "must be >= 1 (got " + str(problem.seq_len) + ")");
  const std::int64_t chunks = layout == RingLayout::ZigZag ? 2 * std::int64_t{ranks} : ranks;
  ATTNKIT_REQUIRE(problem.seq_len % chunks == 0, "seq_len",
                  "must be divisible by " + std::string(layout == RingLayout::ZigZag ? "2 * ranks" : "ranks") +
                      " = " + str(chunks) + " (got " + str(problem.seq_len) + ")");
  const AttentionProblem whole = whole_call(problem);

  RingPlan plan;
  plan.problem = problem;
  plan.problem.kv_heads = whole.kv_heads;
  plan.problem.v_head_dim = whole.v_head_dim;
  plan.problem.scale = whole.scale;
  plan.ranks = ranks;
  plan.layout = layout;
  plan.rank.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    RankPlan& rp = plan.rank[static_cast<std::size_t>(r)];
    rp.chunks = rank_chunks(problem.seq_len, ranks, r, layout);
    for (const TokenChunk& c : rp.chunks) rp.local_len += c.length;
  }
  for (int r = 0; r < ranks; ++r) {
    RankPlan& rp = plan.rank[static_cast<std::size_t>(r)];
    for (int s = 0; s < ranks; ++s) {
      RingStep step;
      step.kv_owner = (r - s + ranks) % ranks;
      const RankPlan& owner = plan.rank[static_cast<std::size_t>(step.kv_owner)];
      for (int qc = 0; qc < static_cast<int>(rp.chunks.size()); ++qc)
        for (int kc = 0; kc < static_cast<int>(owner.chunks.size()); ++kc) {
          RingBlock b = classify(plan.problem, rp.chunks[static_cast<std::size_t>(qc)],
                                 owner.chunks[static_cast<std::size_t>(kc)]);
          b.q_chunk = qc;
          b.kv_chunk = kc;
          step.blocks.push_back(b);
        }
      rp.steps.push_back(std::move(step));
    }
  }
  return plan;
}

}  // namespace attnkit
