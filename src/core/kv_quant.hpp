// The quantized K/V cache formats, written once for the writer (the GQA cache append), the readers (the
// tiled CPU kernel, the float64 reference) and the checks.
//
// A value is q * scale: q an int8 in [-128, 127], or a signed 4-bit integer in [-8, 7] stored +8-biased,
// two per byte, the even index in the low nibble. Quantizing rounds x * (1 / scale) to the nearest integer,
// ties to even (rintf, as ONNX Runtime's CUDA and MLAS quantizers do), then clamps. Dequantizing is one float32
// product, q * scale: every reader computes exactly the same float, so a kernel that widens a quantized
// tile sees the same K/V as one that reads a dequantized float32 copy.
#pragma once

#include <algorithm>
#include <attnkit/attention.hpp>
#include <cmath>
#include <cstdint>

#include "portable.hpp"

namespace attnkit::core {

inline constexpr int kInt8Min = -128;
inline constexpr int kInt8Max = 127;
inline constexpr int kInt4Min = -8;
inline constexpr int kInt4Max = 7;
inline constexpr int kInt4Bias = 8;  // stored nibble = q + 8, in [0, 15]
// A byte of two int4 zeros: what the padding rows of an int4 cache hold.
inline constexpr std::uint8_t kInt4ZeroByte = static_cast<std::uint8_t>(kInt4Bias | (kInt4Bias << 4));

// Two int4 values in one byte: `even` (index 2i) low, `odd` (index 2i + 1) high.
ATTNKIT_HD std::uint8_t int4_pack(int even, int odd) {
  return static_cast<std::uint8_t>(((even + kInt4Bias) & 0xF) | (((odd + kInt4Bias) & 0xF) << 4));
}
// Value `index` of an int4 buffer: the low nibble of byte index / 2 when index is even, else the high one.
ATTNKIT_HD int int4_at(const std::uint8_t* bytes, std::int64_t index) {
  const std::uint8_t b = bytes[index >> 1];
  return static_cast<int>((index & 1) ? (b >> 4) : (b & 0xF)) - kInt4Bias;
}

// round-to-nearest-even of x * inv_scale, clamped to [lo, hi]. NaN becomes 0 (rintf(NaN) has no integer;
// the checks keep scales finite and positive, so only a NaN input gets here).
inline int quantize_value(float x, float inv_scale, int lo, int hi) {
  const float q = std::rint(x * inv_scale);
  if (!(q == q)) return 0;
  return static_cast<int>(std::clamp(q, static_cast<float>(lo), static_cast<float>(hi)));
}
// The reciprocal every quantizer multiplies by (computed once per scale, in float32).
ATTNKIT_HD float inverse_scale(float scale) { return 1.0f / scale; }

ATTNKIT_HD float dequantize_value(int q, float scale) { return static_cast<float>(q) * scale; }

// Scale of channel d of kv head `kv_head` (dim channels per head).
ATTNKIT_HD float kv_scale_at(const float* scales, KvQuant quant, std::int64_t kv_head, std::int64_t dim,
                             std::int64_t d) {
  return quant == KvQuant::PerChannel ? scales[kv_head * dim + d] : scales[0];
}

// Scales a quantized tensor needs: 1, or kv_heads * dim.
inline std::int64_t kv_scale_count(KvQuant quant, std::int64_t kv_heads, std::int64_t dim) {
  return quant == KvQuant::PerChannel ? kv_heads * dim : quant == KvQuant::PerTensor ? 1 : 0;
}

// Bits one stored value takes: int4 4, int8 8, a float its dtype's size.
inline std::int64_t kv_value_bits(KvType type, DType dtype) {
  switch (type) {
    case KvType::Int8: return 8;
    case KvType::Int4: return 4;
    case KvType::Float: break;
  }
  return static_cast<std::int64_t>(dtype_size(dtype)) * 8;
}

inline const char* kv_type_name(KvType type) {
  switch (type) {
    case KvType::Float: return "float";
    case KvType::Int8: return "int8";
    case KvType::Int4: return "int4";
  }
  return "?";
}

// Value `index` of a K or V buffer as float: a float type widened, a quantized one dequantized with the
// scale of (kv_head, d). One element at a time: for the reference and the tests, not for hot loops.
inline float load_kv(const void* base, KvStorage storage, DType dtype, std::int64_t index, const float* scales,
                     std::int64_t kv_head, std::int64_t dim, std::int64_t d) {
  switch (storage.type) {
    case KvType::Float: return load_as_float(base, dtype, index);
    case KvType::Int8:
      return dequantize_value(static_cast<const std::int8_t*>(base)[index],
                              kv_scale_at(scales, storage.quant, kv_head, dim, d));
    case KvType::Int4:
      return dequantize_value(int4_at(static_cast<const std::uint8_t*>(base), index),
                              kv_scale_at(scales, storage.quant, kv_head, dim, d));
  }
  return 0.0f;
}

}  // namespace attnkit::core
