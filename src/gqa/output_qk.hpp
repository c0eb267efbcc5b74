// The optional output_qk of the GQA op, (B, N, S, T): the scores of every query row against every token of its
// sequence, before the softmax (qk_output = 1: softcap(scale * q.k) + bias) or after it (qk_output = 2: the
// probabilities, the sink in the denominator). Keys a row does not see (causal, window, past the sequence,
// evicted from a window cache) hold 0, as in ONNX Runtime's CPU kernel, which writes 0 there.
//
// It is computed from the problem the attention core ran (the same Q, caches read in place, visibility rule,
// score transform and mask), in float64: a debugging output, so simple rather than fast.
#pragma once

#include <attnkit/attention.hpp>
#include <cstdint>

namespace attnkit::gqa {

// `problem` is normalised and its buffers checked. Writes rows (b, h, i) of `out` ([problem.batch, heads,
// q_len, columns] of type `out_type`): column first_column[b] + r for key row r.
void write_output_qk(const AttentionProblem& problem, const AttentionArgs& args, bool after_softmax,
                     const std::int32_t* first_column, std::int64_t columns, void* out, DType out_type, int threads);

}  // namespace attnkit::gqa
