// Which keys a query row may see: the structural masks (key length, causal with offset, sliding window).
// Every backend and the reference take a row's visible range from here, so the rule is written once.
// The additive mask and the score's own value (-inf, NaN) are applied on top, per key.
#pragma once

#include "portable.hpp"

#include <cstdint>
#include <limits>

namespace attnkit::core {

// a + b, saturated at the int64 limits: an offset or window may be any int64 a caller passes (INT64_MAX for
// "every key", say), and row + offset must not overflow.
ATTNKIT_HD std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  if (b > 0 && a > kMax - b) return kMax;
  if (b < 0 && a < kMin - b) return kMin;
  return a + b;
}

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

  // Whether every row (0 and up) sees all of k_len keys, as without the rule: a causal limit at or past the last
  // key for row 0 and no window (a decoder step's one query at the end of its keys). Per-batch offsets aside.
  ATTNKIT_HD bool sees_every_key(std::int64_t k_len) const {
    return !causal || (window == 0 && causal_offset >= k_len - 1);
  }
  // Keys query `row` may see when its batch entry has `key_length` keys.
  ATTNKIT_HD KeyRange for_row(std::int64_t row, std::int64_t key_length) const {
    std::int64_t begin = 0;
    std::int64_t end = key_length;
    if (causal) {
      const std::int64_t limit = saturating_add(row, causal_offset);  // last visible key
      if (limit < end - 1) end = limit + 1;
      if (window > 0) {
        const std::int64_t first = saturating_add(limit, 1 - window);  // 1 - window cannot overflow: window >= 1
        if (first > begin) begin = first;
      }
    }
    if (end < begin) end = begin;
    return {begin, end};
  }
};

}  // namespace attnkit::core
