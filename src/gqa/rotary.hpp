// Rotary position embedding of one head row (ONNX Runtime's RotaryEmbedding as GroupQueryAttention applies
// it to Q and the new K). The first rot = 2 * half dimensions rotate, the rest pass unchanged:
//   non-interleaved  pairs (x[i], x[i + half]) for i < half
//   interleaved      pairs (x[2i], x[2i + 1])  for i < half
// each by angle i at position p: (a, b) -> (a cos - b sin, b cos + a sin), cos = cos_cache[p][i].
#pragma once

#include <attnkit/dtype.hpp>
#include <cstdint>

namespace attnkit::gqa {

struct RotaryTables {
  const void* cos = nullptr;  // [max_len][half], type `dtype`
  const void* sin = nullptr;
  DType dtype = DType::f32;
  std::int64_t half = 0;  // rot / 2
  bool interleaved = false;
};

// Rotates `x` (a head row of at least 2 * half floats) for position `position` (the caller checked it is
// below the tables' length). float32 arithmetic, as ONNX Runtime's CPU kernel does.
void rotate_row(float* x, const RotaryTables& tables, std::int64_t position);

}  // namespace attnkit::gqa
