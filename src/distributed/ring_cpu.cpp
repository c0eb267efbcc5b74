// The ring run on the CPU, every rank in one process: each rank attends its queries to the K/V slice it holds at
// each step (one attention call per non-skipped block, with its LSE) and folds the partials in ring order with
// the split-K merge rule (core::merge_weights, then core::finish_row), the one merge of the library.
#include <attnkit/context_parallel.hpp>

#include <core/online_softmax.hpp>
#include <core/require.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace attnkit {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// A partial (o, lse) from one call is the state (max = lse, sum = 1, acc = o): its output is already divided by
// its own sum, so exp(lse) is the sum under max 0 and the fold below weighs it exactly as a split-K range.
struct RankState {
  std::vector<float> max, sum, acc;  // per row [b, h, local row]; acc [row, v_head_dim]
  std::vector<char> poisoned;
};

void check_buffers(const RingPlan& plan, const std::vector<RankBuffers>& buffers) {
  ATTNKIT_REQUIRE(plan.ranks >= 1 && plan.rank.size() == static_cast<std::size_t>(plan.ranks), "plan",
                  "must come from plan_ring");
  ATTNKIT_REQUIRE(buffers.size() == plan.rank.size(), "buffers",
                  "needs one entry per rank: " + str(plan.ranks) + " (got " + str(std::int64_t(buffers.size())) + ")");
  const RingProblem& p = plan.problem;
  for (std::size_t r = 0; r < buffers.size(); ++r) {
    const std::int64_t rows = p.batch * plan.rank[r].local_len;
    const std::string at = "buffers[" + str(std::int64_t(r)) + "].";
    const auto need = [&](const void* data, std::int64_t have, std::int64_t want, const char* name) {
      ATTNKIT_REQUIRE(data != nullptr, at + name, "is null");
      ATTNKIT_REQUIRE(have >= want, at + name,
                      "holds " + str(have) + " elements, the rank's slice needs " + str(want));
    };
    need(buffers[r].q.data, buffers[r].q.elements, rows * p.heads * p.head_dim, "q");
    need(buffers[r].k.data, buffers[r].k.elements, rows * p.kv_heads * p.head_dim, "k");
    need(buffers[r].v.data, buffers[r].v.elements, rows * p.kv_heads * p.v_head_dim, "v");
    need(buffers[r].o.data, buffers[r].o.elements, rows * p.heads * p.v_head_dim, "o");
    need(buffers[r].lse.data, buffers[r].lse.elements, rows * p.heads, "lse");
  }
}

// The attention call of one block: the rank's query chunk against the owner's K/V chunk, into a dense partial.
AttentionProblem block_call(const RingPlan& plan, const RankPlan& rank, const RankPlan& owner, const RingBlock& b) {
  const RingProblem& p = plan.problem;
  const TokenChunk& qc = rank.chunks[static_cast<std::size_t>(b.q_chunk)];
  const TokenChunk& kc = owner.chunks[static_cast<std::size_t>(b.kv_chunk)];
  AttentionProblem c =
      AttentionProblem::head_first(p.batch, p.heads, p.kv_heads, qc.length, kc.length, p.head_dim, p.dtype);
  c.v_head_dim = p.v_head_dim;
  c.scale = p.scale;
  c.softcap = p.softcap;
  c.q = Layout::head_first(p.heads, rank.local_len, p.head_dim);
  c.q.offset = qc.local_row * p.head_dim;
  c.k = Layout::head_first(p.kv_heads, owner.local_len, p.head_dim);
  c.k.offset = kc.local_row * p.head_dim;
  c.v = Layout::head_first(p.kv_heads, owner.local_len, p.v_head_dim);
  c.v.offset = kc.local_row * p.v_head_dim;
  c.o = Layout::head_first(p.heads, qc.length, p.v_head_dim);
  c.lse = Layout::rows_only(p.heads, qc.length);
  c.return_lse = true;
  c.masked_rows = MaskedRows::Zero;  // a row seeing no key of this block adds nothing (lse -inf, output 0)
  if (b.kind == BlockKind::Masked) {
    c.causal = true;
    c.causal_offset = b.causal_offset;
    c.window = p.window;
  }
  return c;
}

void fold_partial(const RingPlan& plan, const RankPlan& rank, const RingBlock& b, const std::vector<std::byte>& o,
                  const std::vector<float>& lse, RankState& st) {
  const RingProblem& p = plan.problem;
  const TokenChunk& qc = rank.chunks[static_cast<std::size_t>(b.q_chunk)];
  const std::int64_t dv = p.v_head_dim;
  for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh)
    for (std::int64_t i = 0; i < qc.length; ++i) {
      const std::int64_t src = bh * qc.length + i;
      const std::size_t row = static_cast<std::size_t>(bh * rank.local_len + qc.local_row + i);
      const float part_max = lse[static_cast<std::size_t>(src)];
      if (std::isnan(part_max)) st.poisoned[row] = 1;
      const core::MergeWeights mw = core::merge_weights(st.max[row], part_max);
      st.sum[row] = st.sum[row] * mw.wa + 1.0f * mw.wb;
      float* acc = &st.acc[row * static_cast<std::size_t>(dv)];
      for (std::int64_t d = 0; d < dv; ++d)
        acc[d] = acc[d] * mw.wa + load_as_float(o.data(), p.dtype, src * dv + d) * mw.wb;
      st.max[row] = mw.max;
    }
}

void finish_rank(const RingPlan& plan, const RankPlan& rank, const RankState& st, const RankBuffers& out) {
  const RingProblem& p = plan.problem;
  const std::int64_t dv = p.v_head_dim;
  const std::int64_t rows = p.batch * p.heads * rank.local_len;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::size_t r = static_cast<std::size_t>(row);
    core::RowState s;
    s.max = st.max[r];
    s.sum = st.sum[r];
    s.poisoned = st.poisoned[r] != 0;
    const core::RowFinish fin = core::finish_row(s, false, 0.0f, MaskedRows::Nan);
    for (std::int64_t d = 0; d < dv; ++d)
      store_from_float(out.o.data, p.dtype, row * dv + d, st.acc[r * static_cast<std::size_t>(dv) + d] * fin.acc_scale);
    static_cast<float*>(out.lse.data)[row] = fin.lse;
  }
}

}  // namespace

void run_ring_on_cpu(const RingPlan& plan, const std::vector<RankBuffers>& buffers, const AttentionConfig& config) {
  check_buffers(plan, buffers);
  ATTNKIT_REQUIRE(config.backend != Backend::Cuda, "config.backend",
                  "the ring driver runs on the CPU (Auto, Cpu or Reference)");
  AttentionConfig cfg = config;
  if (cfg.backend == Backend::Auto) cfg.backend = Backend::Cpu;
  const RingProblem& p = plan.problem;
  const std::size_t es = dtype_size(p.dtype);
  for (std::size_t r = 0; r < plan.rank.size(); ++r) {
    const RankPlan& rank = plan.rank[r];
    const std::size_t rows = static_cast<std::size_t>(p.batch * p.heads * rank.local_len);
    RankState st{std::vector<float>(rows, core::kNegInf), std::vector<float>(rows, 0.0f),
                 std::vector<float>(rows * static_cast<std::size_t>(p.v_head_dim), 0.0f), std::vector<char>(rows, 0)};
    for (const RingStep& step : rank.steps) {
      const RankPlan& owner = plan.rank[static_cast<std::size_t>(step.kv_owner)];
      const RankBuffers& kv = buffers[static_cast<std::size_t>(step.kv_owner)];
      for (const RingBlock& b : step.blocks) {
        if (b.kind == BlockKind::Skip) continue;
        const AttentionProblem call = block_call(plan, rank, owner, b);
        const std::int64_t q_rows = p.batch * p.heads * call.q_len;
        std::vector<std::byte> o(static_cast<std::size_t>(q_rows * p.v_head_dim) * es);
        std::vector<float> lse(static_cast<std::size_t>(q_rows));
        AttentionArgs args;
        args.q = buffers[r].q;
        args.k = kv.k;
        args.v = kv.v;
        args.o = {o.data(), q_rows * p.v_head_dim};
        args.lse = {lse.data(), q_rows};
        Attention(call, cfg).run(args);
        fold_partial(plan, rank, b, o, lse, st);
      }
    }
    finish_rank(plan, rank, st, buffers[r]);
  }
}

}  // namespace attnkit
