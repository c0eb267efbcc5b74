#include "rotary.hpp"

namespace attnkit::gqa {

void rotate_row(float* x, const RotaryTables& t, std::int64_t position) {
  const std::int64_t base = position * t.half;
  const bool f32 = t.dtype == DType::f32;  // read float32 tables directly: no per-element type dispatch
  const float* cos32 = static_cast<const float*>(t.cos) + base;
  const float* sin32 = static_cast<const float*>(t.sin) + base;
  for (std::int64_t i = 0; i < t.half; ++i) {
    const float c = f32 ? cos32[i] : load_as_float(t.cos, t.dtype, base + i);
    const float s = f32 ? sin32[i] : load_as_float(t.sin, t.dtype, base + i);
    const std::int64_t ia = t.interleaved ? 2 * i : i;
    const std::int64_t ib = t.interleaved ? 2 * i + 1 : i + t.half;
    const float a = x[ia];
    const float b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
  }
}

}  // namespace attnkit::gqa
