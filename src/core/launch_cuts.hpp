// How a work budget cuts a grid into launches of whole blocks (workgroups): every block computes the same bits
// wherever it lands, so a cut call equals the whole call. Used by the Vulkan backend (the CUDA backend computes
// the same quotient inline).
#pragma once

#include <algorithm>
#include <cstdint>

namespace attnkit::core {

// Blocks per launch under `work_budget` estimated operations (0: never cut), when one block costs `block_cost`:
// at least one block per launch, at most `blocks`.
inline std::int64_t blocks_per_launch(std::int64_t work_budget, std::int64_t block_cost, std::int64_t blocks) {
  if (work_budget <= 0) return std::max<std::int64_t>(blocks, 1);
  return std::clamp<std::int64_t>(work_budget / std::max<std::int64_t>(block_cost, 1), 1, std::max<std::int64_t>(blocks, 1));
}

}  // namespace attnkit::core
