// Element types and the scalar conversions every backend and test shares.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace attnkit {

// Storage type of Q, K, V, O and the mask (K and V may instead be quantized: KvStorage in attention.hpp).
// Accumulation is always float32.
enum class DType : std::uint8_t { f32, f16, bf16 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}

// IEEE binary16 bits -> float (exact).
inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    while ((mant & 0x400u) == 0) { mant <<= 1; ++shift; }
    mant &= 0x3ffu;
    bits = sign | ((113u - shift) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE binary16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
inline std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                         // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    const std::uint32_t base = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    const std::uint32_t rounded = base + ((rem > halfway || (rem == halfway && (base & 1u))) ? 1u : 0u);
    return sign | static_cast<std::uint16_t>(rounded);
  }
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t base = rebased >> 13;
  const std::uint32_t rem = rebased & 0x1fffu;
  const std::uint32_t rounded = base + ((rem > 0x1000u || (rem == 0x1000u && (base & 1u))) ? 1u : 0u);
  return sign | static_cast<std::uint16_t>(rounded);
}

// bfloat16 bits -> float (exact).
inline float bf16_bits_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> bfloat16 bits, round to nearest even; NaN stays NaN.
inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

// Reads element `i` of a buffer of type `t` as float.
inline float load_as_float(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return half_bits_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0.0f;
}

// Writes `value` rounded to type `t` into element `i`.
inline void store_from_float(void* base, DType t, std::int64_t i, float value) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = value; break;
    case DType::f16: static_cast<std::uint16_t*>(base)[i] = float_to_half_bits(value); break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16_bits(value); break;
  }
}

// Rounds a float to what type `t` can hold (identity for float32).
inline float round_to(DType t, float value) {
  switch (t) {
    case DType::f32: return value;
    case DType::f16: return half_bits_to_float(float_to_half_bits(value));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(value));
  }
  return value;
}

}  // namespace attnkit
