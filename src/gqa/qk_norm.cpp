#include "qk_norm.hpp"

#include <cmath>

namespace attnkit::gqa {

void rms_norm_row(float* x, std::int64_t n, const void* weight, DType weight_type, float epsilon) {
  double squares = 0.0;
  for (std::int64_t d = 0; d < n; ++d) squares += static_cast<double>(x[d]) * x[d];
  const double inv_rms = 1.0 / std::sqrt(squares / static_cast<double>(n) + static_cast<double>(epsilon));
  for (std::int64_t d = 0; d < n; ++d) {
    x[d] = static_cast<float>(x[d] * inv_rms * load_as_float(weight, weight_type, d));
  }
}

}  // namespace attnkit::gqa
