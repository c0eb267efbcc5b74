// Context parallelism (ring attention): one long self-attention prefill split across N ranks.
//
// Each rank holds a slice of the sequence's tokens (its queries and its K/V). The K/V slices travel round a ring:
// at step s rank r holds the K/V of rank (r - s) mod N and attends its own queries to them, keeping each row's
// partial (output, log-sum-exp); the partials are folded in ring order by the library's one merge rule
// (core::merge_weights / core::finish_row, the split-K merge). Causal prefill balances the work with the zig-zag
// layout: of 2N equal chunks, rank r holds chunks r and 2N-1-r, so every rank sees the same number of visible keys.
//
// What exists: the plan (which chunk pairs each (rank, step) attends, as ordinary attention calls with a causal
// offset) and a CPU driver that runs all ranks in one process. There is no NCCL transport yet.
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>
#include <optional>
#include <vector>

namespace attnkit {

enum class RingLayout : std::uint8_t {
  Contiguous,  // N chunks of S / N tokens, rank r holds chunk r
  ZigZag,      // 2N chunks of S / (2N) tokens, rank r holds chunks r and 2N-1-r (in that local order)
};

// The whole self-attention problem: q_len = k_len = seq_len, query i at the same position as key i.
struct RingProblem {
  std::int64_t batch = 1;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;  // 0: same as heads
  std::int64_t seq_len = 0;
  std::int64_t head_dim = 0;
  std::int64_t v_head_dim = 0;  // 0: same as head_dim
  std::optional<float> scale;   // default 1 / sqrt(head_dim)
  DType dtype = DType::f32;
  bool causal = false;
  std::optional<std::int64_t> window;  // needs causal
  std::optional<float> softcap;
};

// A run of consecutive tokens of the whole sequence.
struct TokenChunk {
  std::int64_t begin = 0;   // position of its first token in the whole sequence
  std::int64_t length = 0;
  std::int64_t local_row = 0;  // its first row in the holding rank's local tensors
};

// How one (query chunk, key chunk) pair is attended.
enum class BlockKind : std::uint8_t {
  Full,    // every key visible to every query: a non-causal call
  Masked,  // some keys hidden: a causal call with causal_offset (and the window, if any)
  Skip,    // no key visible to any query: no call
};

// One attention call of a ring step: the rank's query chunk q_chunk against the held K/V's chunk kv_chunk.
struct RingBlock {
  int q_chunk = 0;   // index into RankPlan::chunks of the attending rank
  int kv_chunk = 0;  // index into RankPlan::chunks of the K/V's owner
  BlockKind kind = BlockKind::Skip;
  std::int64_t causal_offset = 0;  // key j visible to query i when j <= i + causal_offset (Masked only)
};

struct RingStep {
  int kv_owner = 0;  // the rank whose K/V this rank holds at this step: (rank - step) mod N
  std::vector<RingBlock> blocks;  // every chunk pair, in (q_chunk, kv_chunk) order; Skip ones included
};

struct RankPlan {
  std::vector<TokenChunk> chunks;  // this rank's tokens, in local row order
  std::int64_t local_len = 0;      // sum of the chunks' lengths
  std::vector<RingStep> steps;     // N steps, in ring order
};

struct RingPlan {
  RingProblem problem;  // with kv_heads, v_head_dim and scale filled in
  int ranks = 0;
  RingLayout layout = RingLayout::Contiguous;
  std::vector<RankPlan> rank;
};

// Checks the problem (the attention op's rules, plus: ranks >= 1, seq_len divisible by N (Contiguous) or 2N
// (ZigZag), window only with causal) and builds the plan. Throws Error naming the argument.
RingPlan plan_ring(const RingProblem& problem, int ranks, RingLayout layout);

// One rank's local tensors, dense head-first: Q [batch, heads, local_len, head_dim], K [batch, kv_heads,
// local_len, head_dim], V [batch, kv_heads, local_len, v_head_dim] (problem.dtype); O [batch, heads, local_len,
// v_head_dim] (problem.dtype) and LSE float32 [batch, heads, local_len], written in local row order.
struct RankBuffers {
  ConstBuffer q, k, v;
  MutableBuffer o, lse;
};

// Runs every rank of the plan on the CPU backend in one process: each rank attends its queries to each K/V slice
// in ring order (an Attention call per non-skipped block, with return_lse) and folds the partials in that order.
// `buffers` has one entry per rank. The result depends only on the plan and the inputs (not on threads).
void run_ring_on_cpu(const RingPlan& plan, const std::vector<RankBuffers>& buffers, const AttentionConfig& config = {});

}  // namespace attnkit
