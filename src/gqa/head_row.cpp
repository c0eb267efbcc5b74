#include "head_row.hpp"

#include "qk_norm.hpp"

#include <cstddef>
#include <cstring>

namespace attnkit::gqa {

void prepare_head_row(const HeadRowSteps& steps, const void* base, std::int64_t index, std::int64_t position,
                      float* row) {
  // float32 rows are copied as they are and need no rounding (a prefill rotates tens of thousands of rows: the
  // per-element type dispatch of the other types cost more than the rotation itself).
  const bool f32 = steps.dtype == DType::f32;
  const std::int64_t n = steps.head_size;
  if (f32) {
    std::memcpy(row, static_cast<const float*>(base) + index, static_cast<std::size_t>(n) * sizeof(float));
  } else {
    for (std::int64_t d = 0; d < n; ++d) row[d] = load_as_float(base, steps.dtype, index + d);
  }
  if (steps.norm_weight != nullptr) rms_norm_row(row, n, steps.norm_weight, steps.dtype, steps.norm_epsilon);
  if (steps.rotary != nullptr) rotate_row(row, *steps.rotary, position);
  if (!f32) {
    for (std::int64_t d = 0; d < n; ++d) row[d] = round_to(steps.dtype, row[d]);
  }
}

}  // namespace attnkit::gqa
