// What both GQA pre-pass kernels (gqa_kernels.cu: any head size; gqa_prepass_vector.cu: 16-byte lanes) compute
// per value, in the CPU units' precision (qk_norm.cpp, rotary.cpp, kv_cache.cpp) so a GPU cache holds the bits
// a CPU cache holds: rounding to the query's type, rotary products without contraction into FMAs, quantization
// as rint(x * (1 / scale)).
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

}  // namespace attnkit::cuda
