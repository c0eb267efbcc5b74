// One head row as the GroupQueryAttention op prepares Q and the new K before it uses or stores them: widened to
// float32, RMS-normalised and rotated when on, rounded to the row's type. One definition for the op and for
// append_kv with rotary (src/cpu/kv_append.cpp), so that a row appended either way holds the same bits.
#pragma once

#include "rotary.hpp"

#include <attnkit/dtype.hpp>
#include <cstdint>

namespace attnkit::gqa {

struct HeadRowSteps {
  DType dtype = DType::f32;  // of the row (and of the norm weight and the cos / sin tables)
  std::int64_t head_size = 0;
  const void* norm_weight = nullptr;  // null: no RMS norm
  float norm_epsilon = 1e-6f;
  const RotaryTables* rotary = nullptr;  // null: no rotary
};

// Reads head row `index` (an element index) of `base` into `row` and applies the steps; `position` is the
// row's rotary position (checked by the caller against the tables' length). The result is rounded to the row's
// type: Q' and the new K rows are tensors of that type (what a quantized cache quantizes, and what ONNX
// Runtime's rotary writes).
void prepare_head_row(const HeadRowSteps& steps, const void* base, std::int64_t index, std::int64_t position,
                      float* row);

}  // namespace attnkit::gqa
