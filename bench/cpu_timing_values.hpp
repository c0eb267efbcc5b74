// Random inputs for the CPU timing tools (cpu_op_timing.cpp, cpu_paged_timing.cpp).
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace attnkit::bench {

// n values uniform in [-1, 1], stored as t (bfloat16: the top half of the float32, as the inputs' rounding does
// not matter for timing).
inline std::vector<unsigned char> random_values(std::int64_t n, DType t, std::mt19937& rng) {
  const std::size_t es = dtype_size(t);
  std::vector<unsigned char> out(static_cast<std::size_t>(n) * es);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = uniform(rng);
    unsigned char* at = out.data() + static_cast<std::size_t>(i) * es;
    if (t == DType::f32) {
      std::memcpy(at, &x, 4);
    } else if (t == DType::bf16) {
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      const auto half = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(at, &half, 2);
    } else {
      const std::uint16_t h = float_to_half_bits(x);
      std::memcpy(at, &h, 2);
    }
  }
  return out;
}

}  // namespace attnkit::bench
