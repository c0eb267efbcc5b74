// Overflow-checked int64 arithmetic for the host validation layers (problem_check.cpp, gqa_check.cpp, views.cpp)
// and the planners' divisions.
//
// Every size, span and offset a check computes from caller-given numbers goes through these: a product or sum
// that does not fit int64 is an answer ("does not fit"), never a wrapped value that a later comparison would
// take for a small one. docs/safety.md states what the checks then guarantee to the kernels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>

namespace attnkit::core {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// a * b and a + b, or nothing when the exact result does not fit int64.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<std::int64_t> checked_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of the factors, or nothing when it (or any partial product) does not fit int64.
inline std::optional<std::int64_t> checked_product(std::initializer_list<std::int64_t> factors) {
  std::int64_t r = 1;
  for (std::int64_t f : factors) {
    if (__builtin_mul_overflow(r, f, &r)) return std::nullopt;
  }
  return r;
}

// The product with every factor counted as at least 1: when it fits, so does the product of any subset of the
// factors (every partial product is at most the whole), whatever order a kernel multiplies them in.
inline std::optional<std::int64_t> checked_extent_product(std::initializer_list<std::int64_t> extents) {
  std::int64_t r = 1;
  for (std::int64_t e : extents) {
    if (__builtin_mul_overflow(r, e > 1 ? e : 1, &r)) return std::nullopt;
  }
  return r;
}

// ceil(a / b) for a >= 0 and b > 0, exact for every int64 a: the planners divide extents that the checks let be
// as large as int64 allows (a head count of 2^63 - 1 over an empty batch), where a + b - 1 would wrap.
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace attnkit::core
