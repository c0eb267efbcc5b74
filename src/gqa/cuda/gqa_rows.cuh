// What both GQA pre-pass kernels (gqa_kernels.cu: any head size; gqa_prepass_vector.cu: 16-byte lanes), and
// append_kv's rotary and quantized stores (src/cuda/kernels/kv_append.cu), compute per value, in the CPU units'
// precision (qk_norm.cpp, rotary.cpp, kv_cache.cpp) so a GPU cache holds the bits a CPU cache holds: rounding to
// the query's type, rotary products without contraction into FMAs, quantization as rint(x * (1 / scale)).
#pragma once

#include "core/kv_quant.hpp"
#include "gqa/cuda/gqa_device.hpp"
#include "cuda/common/kernel_params.cuh"

namespace attnkit::cuda {

template <class T>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<T>(x));
}

__device__ __forceinline__ int quantize(float x, float inv_scale, int lo, int hi) {
  const float q = rintf(__fmul_rn(x, inv_scale));
  if (!(q == q)) return 0;
  return static_cast<int>(fminf(fmaxf(q, static_cast<float>(lo)), static_cast<float>(hi)));
}

// 1 / the scale of column d of a quantized cache's K/V head.
__device__ __forceinline__ float inverse_cache_scale(const DeviceCache& cache, std::int64_t kv_head, std::int64_t H,
                                                     std::int64_t d) {
  return core::inverse_scale(cache.quant == KvQuant::PerChannel ? cache.scales[kv_head * H + d] : cache.scales[0]);
}

// The rotary position of new token s of batch entry b.
__device__ __forceinline__ std::int64_t rotary_position(const AppendStep& st, const DeviceBatchRows& rows,
                                                        std::int64_t b, std::int64_t s) {
  return st.position_ids != nullptr ? st.position_ids[b * st.position_row + s] : rows.past + s;
}

// Rotates a head row in shared memory (x, a warp's lanes together) by one position's cos / sin rows:
// (a, b) -> (a cos - b sin, b cos + a sin) for pairs (x[i], x[i + half]), or (x[2i], x[2i + 1]) when
// interleaved, i < half <= 128. Every lane computes its pairs into registers first, then writes, so no lane reads
// a rotated value. The GQA pre-pass's general kernel and append_kv's rotary.
template <class T>
__device__ __forceinline__ void rotate_row_warp(float* x, const T* cos_row, const T* sin_row, std::int64_t half,
                                                bool interleaved, int lane) {
  constexpr int kPairsPerLane = 128 / 32;
  float out_a[kPairsPerLane], out_b[kPairsPerLane];
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const std::int64_t i = lane + 32 * k;
    if (i >= half) continue;
    const std::int64_t ia = interleaved ? 2 * i : i;
    const std::int64_t ib = interleaved ? 2 * i + 1 : i + half;
    const float c = to_float(cos_row[i]), sn = to_float(sin_row[i]);
    const float a = x[ia], bb = x[ib];
    out_a[k] = rotate_first(a, bb, c, sn);
    out_b[k] = rotate_second(a, bb, c, sn);
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kPairsPerLane; ++k) {
    const std::int64_t i = lane + 32 * k;
    if (i >= half) continue;
    x[interleaved ? 2 * i : i] = out_a[k];
    x[interleaved ? 2 * i + 1 : i + half] = out_b[k];
  }
  __syncwarp();
}

// Stores a head row (x in shared memory, H values; a warp's lanes together) into a cache row: rounded to T, or
// quantized with kv head `kv_head`'s scales. The GQA pre-pass's general kernel and append_kv's store.
template <class T>
__device__ __forceinline__ void store_cache_row(const float* x, std::int64_t H, const DeviceCache& cache,
                                                std::int64_t kv_head, std::byte* dst, int lane) {
  auto inverse = [&](std::int64_t d) { return inverse_cache_scale(cache, kv_head, H, d); };
  switch (cache.type) {
    case KvType::Float:
      for (std::int64_t d = lane; d < H; d += 32) reinterpret_cast<T*>(dst)[d] = from_float<T>(x[d]);
      return;
    case KvType::Int8:
      for (std::int64_t d = lane; d < H; d += 32) {
        reinterpret_cast<std::int8_t*>(dst)[d] =
            static_cast<std::int8_t>(quantize(x[d], inverse(d), core::kInt8Min, core::kInt8Max));
      }
      return;
    case KvType::Int4:
      for (std::int64_t j = lane; 2 * j < H; j += 32) {
        const int even = quantize(x[2 * j], inverse(2 * j), core::kInt4Min, core::kInt4Max);
        const int odd = 2 * j + 1 < H ? quantize(x[2 * j + 1], inverse(2 * j + 1), core::kInt4Min, core::kInt4Max) : 0;
        reinterpret_cast<std::uint8_t*>(dst)[j] = core::int4_pack(even, odd);
      }
      return;
  }
}

}  // namespace attnkit::cuda
