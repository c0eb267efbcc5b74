#include "rotary.hpp"

namespace attnkit::gqa {
namespace {

// The common case, float32 tables and halves (not interleaved), as a loop over two disjoint runs that the compiler
// vectorizes: the same multiplies and subtractions, element by element, as the general loop below.
void rotate_halves_f32(float* __restrict a_run, float* __restrict b_run, const float* __restrict cos_row,
                       const float* __restrict sin_row, std::int64_t half) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float a = a_run[i];
    const float b = b_run[i];
    a_run[i] = a * cos_row[i] - b * sin_row[i];
    b_run[i] = b * cos_row[i] + a * sin_row[i];
  }
}

}  // namespace

void rotate_row(float* x, const RotaryTables& t, std::int64_t position) {
  const std::int64_t base = position * t.half;
  if (t.dtype == DType::f32 && !t.interleaved) {
    rotate_halves_f32(x, x + t.half, static_cast<const float*>(t.cos) + base, static_cast<const float*>(t.sin) + base,
                      t.half);
    return;
  }
  for (std::int64_t i = 0; i < t.half; ++i) {
    const float c = load_as_float(t.cos, t.dtype, base + i);
    const float s = load_as_float(t.sin, t.dtype, base + i);
    const std::int64_t ia = t.interleaved ? 2 * i : i;
    const std::int64_t ib = t.interleaved ? 2 * i + 1 : i + t.half;
    const float a = x[ia];
    const float b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
  }
}

}  // namespace attnkit::gqa
