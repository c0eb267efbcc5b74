// Q/K RMS norm (ONNX Runtime's q_norm_weight / k_norm_weight, applied before rotary): per head row,
// x[d] * rsqrt(mean(x^2) + eps) * w[d].
#pragma once

#include <attnkit/dtype.hpp>
#include <cstdint>

namespace attnkit::gqa {

// Normalises one head row of `n` floats in place. The mean of squares and its reciprocal square root are
// taken in float64 (a row is at most 256 values: the cost is nothing, and the result does not depend on how
// a float32 sum would have been ordered); `weight` holds n values of type `weight_type`.
void rms_norm_row(float* x, std::int64_t n, const void* weight, DType weight_type, float epsilon);

}  // namespace attnkit::gqa
