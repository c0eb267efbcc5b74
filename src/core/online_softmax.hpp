// The online-softmax state of one query row and the two operations every kernel is built from: moving a
// partial (max, sum, accumulator) onto a larger max, and turning the final state into an output scale.
// The split-K merge pass (and, later, merges across devices) is nothing but `merge` in range order.
#pragma once

#include "portable.hpp"

#include <attnkit/attention.hpp>

#include <cmath>
#include <limits>

namespace attnkit::core {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The max used to form exp(s - max). A row that has seen no visible key yet has max = -inf; exp(s - (-inf))
// would be inf or NaN, so such a row uses 0 (every p is then exp(-inf) = 0, as it must be).
ATTNKIT_HD float usable_max(float running_max) { return running_max == kNegInf ? 0.0f : running_max; }

// Factor that moves a sum taken under max `from` onto max `to` (to >= from). A partial that saw nothing
// (from = -inf) contributes nothing; a row poisoned by +inf stays NaN (exp(inf - inf)).
ATTNKIT_HD float rescale_factor(float from, float to) {
  return from == kNegInf ? 0.0f : std::exp(from - usable_max(to));
}

// Partial state of one row over one contiguous key range. The accumulator (sum of p * V) lives beside it.
struct RowState {
  float max = kNegInf;  // largest visible score so far
  float sum = 0.0f;     // sum of exp(s - usable_max(max)) over visible keys
  bool poisoned = false;  // a visible score was NaN or +inf: the row's output is NaN
};

// Weights of two partials merged into one: result = a * wa + b * wb for sum and accumulator alike.
struct MergeWeights {
  float max;
  float wa;
  float wb;
};
ATTNKIT_HD MergeWeights merge_weights(float max_a, float max_b) {
  const float m = max_a > max_b ? max_a : max_b;
  return {m, rescale_factor(max_a, m), rescale_factor(max_b, m)};
}

// How a finished row becomes output: out[d] = acc[d] * acc_scale (or NaN / 0), plus its log-sum-exp.
struct RowFinish {
  float acc_scale;
  float lse;
};

// `sink`: the head-sink logit joining the denominator (ignored unless has_sink). kWithLse = false leaves the
// log-sum-exp out (0 where the row has keys): a caller that does not return it saves the logarithm.
template <bool kWithLse = true>
ATTNKIT_HD RowFinish finish_row(const RowState& s, bool has_sink, float sink, MaskedRows masked) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  if (s.poisoned) return {kNaN, kNaN};
  float max = s.max;
  float sum = s.sum;
  float acc_factor = 1.0f;
  if (has_sink) {
    const float m = max > sink ? max : sink;
    acc_factor = rescale_factor(max, m);
    sum = sum * acc_factor + std::exp(sink - m);
    max = m;
  }
  if (!(sum > 0.0f)) {  // no visible key (and no sink)
    return {masked == MaskedRows::Zero ? 0.0f : kNaN, kNegInf};
  }
  return {acc_factor / sum, kWithLse ? usable_max(max) + std::log(sum) : 0.0f};
}

}  // namespace attnkit::core
