// How to cut each of a grid's work items into ranges so that the ranges fill whole rounds of the workers that run
// at once (a GPU's resident blocks): a decode step streams every block's key range at about one pace, so a last
// round that is mostly empty costs nearly a whole round. Used by the CUDA plan's key split.
#pragma once

#include <algorithm>
#include <cstdint>

namespace attnkit::core {

// The share of the last round's workers that have work when `items` items run on `workers` workers at a time.
inline double round_fill(std::int64_t items, std::int64_t workers) {
  const std::int64_t rounds = (items + workers - 1) / workers;
  return rounds > 0 ? static_cast<double>(items) / static_cast<double>(rounds * workers) : 0.0;
}

// The ranges of a split: `parts` ranges of `tiles_per_part` tiles each (the last may hold fewer).
struct TileSplit {
  std::int64_t parts = 1;
  std::int64_t tiles_per_part = 1;
};

// Cuts each of `items` work items of `tiles` tiles into ranges of whole tiles for `workers` that run at once (a
// GPU's resident blocks), trying every count of ranges in [least, most]: the cut that finishes soonest, counting
// rounds of workers times the tiles of a range plus one tile for a range's fixed cost (its start and its share of
// the merge), the fewest ranges of equals. Whole tiles because a range of 4.5 tiles costs what 5 do: on the H200
// a batch-1 Llama decode step (8 K/V heads, 64 tiles of 128 keys) took 20.6 us in 15 ranges of 4.5 tiles and
// 17.4 us in 16 of 4 (bench/results/2026-12-05-h200-cliff-sweep.md). The plain fill rule it replaces (the fewest
// ranges whose rounds are 90% full) agrees where the tiles divide evenly: batch 8 x 8 K/V heads over 32k keys in
// 2 ranges (268 us) rather than 32 (324 us).
inline TileSplit split_for_soonest_finish(std::int64_t items, std::int64_t workers, std::int64_t tiles,
                                          std::int64_t least, std::int64_t most) {
  TileSplit best{1, tiles > 0 ? tiles : 1};
  std::int64_t best_cost = -1;
  if (items <= 0 || workers <= 0 || tiles <= 0) return best;
  for (std::int64_t s = std::max<std::int64_t>(least, 1); s <= std::max(least, most); ++s) {
    const std::int64_t per = (tiles + s - 1) / s;
    const std::int64_t parts = (tiles + per - 1) / per;
    const std::int64_t rounds = (items * parts + workers - 1) / workers;
    const std::int64_t cost = rounds * (per + 1);
    if (best_cost < 0 || cost < best_cost) {
      best = {parts, per};
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace attnkit::core
