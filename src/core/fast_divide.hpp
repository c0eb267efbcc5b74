// Division by a divisor fixed for a whole launch, without a divide instruction: a GPU has none, and a general
// 64-bit division costs a kernel's block prologue (block coordinates, the row of each thread) dozens of dependent
// instructions each. With p = 31 + ceil(log2 d), m = ceil(2^p / d) fits 32 bits and, for every n < 2^31,
// n / d = floor(n m / 2^p) = umulhi(n, m) >> (p - 32) (the error n (m d - 2^p) / (d 2^p) < n / 2^31 < 1 stays
// below the gap to the next multiple of 1 / d). d = 1 takes m = 0 and the dividend as it is.
#pragma once

#include "portable.hpp"

#include <cstdint>

namespace attnkit::core {

struct FastDivide {
  std::uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDivide() = default;
  // d in [1, 2^31).
  explicit FastDivide(std::uint32_t d) : divisor(d) {
    if (d <= 1) return;
    std::uint32_t log2_ceil = 0;
    while ((std::uint64_t{1} << log2_ceil) < d) ++log2_ceil;
    const std::uint32_t p = 31 + log2_ceil;
    multiplier = static_cast<std::uint32_t>(((std::uint64_t{1} << p) + d - 1) / d);
    shift = p - 32;
  }

  // n / divisor for n in [0, 2^31).
  ATTNKIT_HD std::uint32_t quotient(std::uint32_t n) const {
    if (multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
    return __umulhi(n, multiplier) >> shift;
#else
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * multiplier) >> 32) >> shift;
#endif
  }
  // n % divisor, given q = quotient(n).
  ATTNKIT_HD std::uint32_t remainder(std::uint32_t n, std::uint32_t q) const { return n - q * divisor; }
};

}  // namespace attnkit::core
