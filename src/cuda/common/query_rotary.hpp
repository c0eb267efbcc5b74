// The rotary embedding of Q applied by the wgmma kernel as it loads Q (the GQA op's rotary without Q/K norm: Q'
// is then never written to memory and read back). Plain C++: the host code fills it, KernelParams carries it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnkit::cuda {

// Row (b, head, s) of Q is rotated by the cos / sin row of its position, position_ids[b * position_row + s] or
// first_position[b * first_position_stride] + s: the pairs (x[i], x[i + half]), or (x[2i], x[2i + 1]) when
// interleaved, each product rounded on its own, the result rounded to the query's type. That is what the GQA
// pre-pass writes as Q' (gqa_rows.cuh), so either way the attention reads the same values.
struct QueryRotary {
  const void* cos = nullptr;  // [positions][half] of the query's type; null: no rotary
  const void* sin = nullptr;
  std::int64_t half = 0;
  bool interleaved = false;
  const std::int64_t* position_ids = nullptr;  // device, or null
  std::int64_t position_row = 0;
  const std::int32_t* first_position = nullptr;  // device
  std::int64_t first_position_stride = 1;
};

// The wgmma kernel loads a rotated row in 16-byte chunks of Q with the cos / sin values of its pairs in one
// load (16 bytes; interleaved: 8): half a multiple of 8 (interleaved: 4), cos and sin aligned to that load.
inline bool query_rotary_loads_chunks(const QueryRotary& r, std::size_t element_bytes) {
  const std::size_t values = r.interleaved ? 4 : 8;
  const auto aligned = [&](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % (values * element_bytes) == 0; };
  return r.half > 0 && r.half % static_cast<std::int64_t>(values) == 0 && aligned(r.cos) && aligned(r.sin);
}

}  // namespace attnkit::cuda
