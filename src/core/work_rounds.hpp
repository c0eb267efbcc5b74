// How many parts to cut each of a grid's work items into so that the parts fill whole rounds of the workers
// that run at once (a GPU's resident blocks): a decode step streams every block's key range at about one pace,
// so a last round that is mostly empty costs nearly a whole round. Used by the CUDA plan's key split.
#pragma once

#include <cstdint>

namespace attnkit::core {

// The share of the last round's workers that have work when `items` items run on `workers` workers at a time.
inline double round_fill(std::int64_t items, std::int64_t workers) {
  const std::int64_t rounds = (items + workers - 1) / workers;
  return rounds > 0 ? static_cast<double>(items) / static_cast<double>(rounds * workers) : 0.0;
}

// The fewest parts per item in [least, most] whose rounds are at least 90% full (every part costs a block
// prologue and a share of the merge: the H200's batch 8 x 32k decode ran 268 us in 2 ranges per K/V head and
// 324 us in 32, equally full), else the count whose rounds are fullest (the smallest of equals).
inline std::int64_t parts_for_full_rounds(std::int64_t items, std::int64_t workers, std::int64_t least,
                                          std::int64_t most) {
  std::int64_t best = least;
  for (std::int64_t s = least; s <= most; ++s) {
    if (round_fill(items * s, workers) >= 0.9) return s;
    if (round_fill(items * s, workers) > round_fill(items * best, workers)) best = s;
  }
  return best;
}

}  // namespace attnkit::core
