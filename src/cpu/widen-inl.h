// Element-type conversions shared by the CPU kernels (tiled_kernel.cpp, few_rows_kernel.cpp): widening Q, K, V
// and mask rows to float32 (dequantizing int8 / int4 cache rows), and rounding output rows to the element type.
// Included once per Highway target by each kernel file (the per-target include guard below).
#if defined(ATTNKIT_CPU_WIDEN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNKIT_CPU_WIDEN_INL_H_
#undef ATTNKIT_CPU_WIDEN_INL_H_
#else
#define ATTNKIT_CPU_WIDEN_INL_H_
#endif

#include <hwy/highway.h>

#include "../core/kv_quant.hpp"

#include <attnkit/attention.hpp>

#include <cstdint>
#include <cstring>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;

// For gathering one word (`word_bytes`) from each of rows r0.. of a vector (row r's elements of `elem_bytes` from
// index q_index[r] of base `q`): the rows' byte offsets from row r0's. False, with nothing to gather, where row
// r0's start is not word-aligned, or an offset is not whole words or does not fit int32 (the gather's offsets).
template <class DI32>
HWY_INLINE bool gather_row_offsets(DI32 di, const void* q, const std::int64_t* q_index, std::int64_t r0,
                                   std::int64_t elem_bytes, std::int64_t word_bytes, hn::Vec<DI32>& offset) {
  const auto* first = static_cast<const char*>(q) + q_index[r0] * elem_bytes;
  if (reinterpret_cast<std::uintptr_t>(first) % static_cast<std::uintptr_t>(word_bytes) != 0) return false;
  HWY_ALIGN std::int32_t offsets[hn::MaxLanes(di)];
  for (std::size_t i = 0; i < hn::Lanes(di); ++i) {
    const std::int64_t bytes = (q_index[r0 + static_cast<std::int64_t>(i)] - q_index[r0]) * elem_bytes;
    if (bytes % word_bytes != 0 || bytes < std::numeric_limits<std::int32_t>::min() ||
        bytes > std::numeric_limits<std::int32_t>::max()) {
      return false;
    }
    offsets[i] = static_cast<std::int32_t>(bytes);
  }
  offset = hn::Load(di, offsets);
  return true;
}

// Widens `n` elements of type `t` at `src` into `dst`.
HWY_INLINE void widen_row(const void* src, DType t, std::int64_t n, float* HWY_RESTRICT dst) {
  if (t == DType::f32) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const DF df;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (t == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* s = static_cast<const hwy::float16_t*>(src);
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, s + i)), df, dst + i);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* s = static_cast<const hwy::bfloat16_t*>(src);
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, s + i)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = load_as_float(src, t, i);
}

// Index arithmetic here is int64 and in range by the checks (docs/safety.md, "What the kernels may rely on"):
// every Layout::index of a checked problem is below its buffer's stated element count, and that count times the
// element size fits a pointer difference, so `index * dtype_size` and `base + index` never overflow.
// Widens row `index` (in values) of a K or V buffer into `dst`: a float type as widen_row does, a quantized one
// dequantized (q * scale in float32, the product every reader of the format computes: core/kv_quant.hpp).
// `scales` is the row's kv head's first channel scale (per channel) or the tensor's one scale.
HWY_NOINLINE inline void widen_kv_row(const void* base, std::int64_t index, KvStorage storage, DType t, std::int64_t n,
                  const float* HWY_RESTRICT scales, float* HWY_RESTRICT dst) {
  if (storage.type == KvType::Float) {
    widen_row(static_cast<const char*>(base) + index * static_cast<std::int64_t>(dtype_size(t)), t, n, dst);
    return;
  }
  const DF df;
  const DI di;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  const bool per_channel = storage.quant == KvQuant::PerChannel;
  const VF tensor_scale = hn::Set(df, scales[0]);
  std::int64_t i = 0;
  if (storage.type == KvType::Int8) {
    const hn::Rebind<std::int8_t, DF> d8;
    const auto* q = static_cast<const std::int8_t*>(base) + index;
    for (; i + lanes <= n; i += lanes) {
      const VF x = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q + i)));
      hn::StoreU(hn::Mul(x, per_channel ? hn::LoadU(df, scales + i) : tensor_scale), df, dst + i);
    }
    for (; i < n; ++i) dst[i] = core::dequantize_value(q[i], per_channel ? scales[i] : scales[0]);
    return;
  }
  // Int4: `lanes` bytes hold 2 * lanes values; the low nibbles are the even values, the high ones the odd.
  const hn::Rebind<std::uint8_t, DF> du8;
  const auto* bytes = static_cast<const std::uint8_t*>(base) + index / 2;
  const auto nibble = hn::Set(di, 0xF);
  const auto bias = hn::Set(di, core::kInt4Bias);
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto x = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(du8, bytes + i / 2)));
    VF even = hn::ConvertTo(df, hn::Sub(hn::And(x, nibble), bias));
    VF odd = hn::ConvertTo(df, hn::Sub(hn::ShiftRight<4>(x), bias));
    if (per_channel) {
      VF s_even, s_odd;
      hn::LoadInterleaved2(df, scales + i, s_even, s_odd);
      even = hn::Mul(even, s_even);
      odd = hn::Mul(odd, s_odd);
    } else {
      even = hn::Mul(even, tensor_scale);
      odd = hn::Mul(odd, tensor_scale);
    }
    hn::StoreInterleaved2(even, odd, df, dst + i);
  }
  for (; i < n; ++i) dst[i] = core::dequantize_value(core::int4_at(bytes, i), per_channel ? scales[i] : scales[0]);
}

// Where the K or V scales of kv head `kvh` start (null for a float tensor).
inline const float* kv_head_scales(const ConstBuffer& scales, KvStorage storage, std::int64_t kvh, std::int64_t dim) {
  if (storage.type == KvType::Float) return nullptr;
  const auto* s = static_cast<const float*>(scales.data);
  return storage.quant == KvQuant::PerChannel ? s + kvh * dim : s;
}

// `n` mask values from element `index` as float32: in place for a float32 mask, else widened into `buf`.
HWY_NOINLINE inline const float* mask_values(const AttentionProblem& p, const AttentionArgs& a, std::int64_t index,
                                      std::int64_t n, float* HWY_RESTRICT buf) {
  if (p.mask_dtype == DType::f32) return static_cast<const float*>(a.mask.data) + index;
  widen_row(static_cast<const char*>(a.mask.data) + index * static_cast<std::int64_t>(dtype_size(p.mask_dtype)),
            p.mask_dtype, n, buf);
  return buf;
}

// Rounds `n` floats to type `t` (nearest even) into `dst`.
inline void narrow_row(const float* HWY_RESTRICT src, DType t, std::int64_t n, void* dst) {
  if (t == DType::f32) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  const DF df;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  if (t == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    auto* d = static_cast<hwy::float16_t*>(dst);
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, d + i);
  } else {
    // Highway's float -> bfloat16 demotion truncates; round to nearest even by hand, keeping NaN quiet.
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> du16;
    const hn::RebindToSigned<DF> di;
    auto* d = static_cast<std::uint16_t*>(dst);
    for (; i + lanes <= n; i += lanes) {
      const auto x = hn::LoadU(df, src + i);
      const auto bits = hn::BitCast(du, x);
      const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
      const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb)));
      const auto quiet = hn::ShiftRight<16>(hn::Or(bits, hn::Set(du, 0x400000u)));
      const auto out = hn::IfThenElse(hn::RebindMask(du, hn::Eq(x, x)), rounded, quiet);
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, out)), du16, d + i);
    }
  }
  for (; i < n; ++i) store_from_float(dst, t, i, src[i]);
}

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
