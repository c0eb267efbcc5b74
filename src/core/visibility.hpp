// Which keys a query row may see: the structural masks (key length, causal with offset, sliding window).
// Every backend and the reference take a row's visible range from here, so the rule is written once.
// The additive mask and the score's own value (-inf, NaN) are applied on top, per key.
#pragma once

#include "portable.hpp"

#include <cstdint>

namespace attnkit::core {

// Visible keys of one row: [begin, end). Empty when end <= begin.
struct KeyRange {
  std::int64_t begin;
  std::int64_t end;
  ATTNKIT_HD bool empty() const { return end <= begin; }
};

struct VisibilityRule {
  bool causal = false;
  std::int64_t causal_offset = 0;  // query i sees key j when j <= i + causal_offset
  std::int64_t window = 0;         // > 0: only the `window` keys ending at the causal limit

  // The rule of batch entry b: its own causal offset when per-batch offsets are given (a right-padded batch of
  // sequences whose queries sit at different positions, as in a KV-cached decoder step).
  ATTNKIT_HD VisibilityRule for_batch(const std::int32_t* offsets, std::int64_t b) const {
    VisibilityRule r = *this;
    if (offsets != nullptr) r.causal_offset = offsets[b];
    return r;
  }

  // Keys query `row` may see when its batch entry has `key_length` keys.
  ATTNKIT_HD KeyRange for_row(std::int64_t row, std::int64_t key_length) const {
    std::int64_t begin = 0;
    std::int64_t end = key_length;
    if (causal) {
      const std::int64_t limit = row + causal_offset;  // last visible key
      if (limit + 1 < end) end = limit + 1;
      if (window > 0 && limit + 1 - window > begin) begin = limit + 1 - window;
    }
    if (end < begin) end = begin;
    return {begin, end};
  }
};

}  // namespace attnkit::core
