// The float64 reference: naive, one row at a time, obviously right. The oracle of every test.
#pragma once

#include <attnkit/attention.hpp>

#include <vector>

namespace attnkit::cpu {

struct ReferenceResult {
  std::vector<double> out;  // dense [batch, heads, q_len, v_head_dim]
  std::vector<double> lse;  // dense [batch, heads, q_len]
};

// Computes the op in float64 from the inputs as stored (half and bfloat16 widened exactly). `problem` must be
// normalised (core::normalize_and_check) and the buffers checked.
ReferenceResult reference_attention(const AttentionProblem& problem, const AttentionArgs& args);

// The Reference backend: the same, rounded into the caller's O (and LSE) buffers.
void run_reference(const AttentionProblem& problem, const AttentionArgs& args);

}  // namespace attnkit::cpu
