// The GQA pre-pass for the usual head sizes (8 to 256, a power of two) with 16-byte rows: the same work as
// gqa_kernels.cu's append_kernel (Q/K RMS norm, rotary, rounding, Q' out, K/V into the cache, quantized or
// not) with the same arithmetic (gqa_rows.cuh), laid out for bandwidth instead of generality:
//
//   * A head row is read by L = head_size / 8 consecutive lanes, 8 values each (one 16-byte load of float16 /
//     bfloat16, two of float32), so a warp holds 32 / L rows and one load per lane brings a whole row in.
//   * Rows are spread over the grid, not walked by a block: row i of the grid is (token, row-of-token) with the
//     token's rows ordered Q heads, K heads, V heads, so a 4096-token prompt runs 8 x 4096 x 48 / 32 warps at
//     once instead of 4096 blocks walking 48 rows each.
//   * Rotary pairs: split halves (x[i], x[i + half]) sit in lanes half / 8 apart, fetched by one shuffle per
//     value; interleaved pairs (x[2i], x[2i + 1]) sit in one lane. Both need half a multiple of 8; a lane's
//     cos and sin values are contiguous (one 16- or 8-byte load each).
//   * The RMS norm's sum of squares (float64) is folded over the row's L lanes by shuffles.
//
// Every lane of a warp runs the shuffles, also the lanes of a row past the grid's end or a row that needs no
// rotary (a V row): they discard the result.
#include "gqa/cuda/gqa_device.hpp"
#include "gqa/cuda/gqa_rows.cuh"

#include <cuda_runtime.h>

#include <string>

namespace attnkit::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kValues = 8;  // per lane

template <class T>
__device__ __forceinline__ void load_values(const T* src, float (&x)[kValues]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(src)[0];
    const float4 b = reinterpret_cast<const float4*>(src)[1];
    const float v[kValues] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = v[i];
  } else {
    const uint4 w = *reinterpret_cast<const uint4*>(src);
    const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = to_float(e[i]);
  }
}

// 4 values (a lane's cos or sin of interleaved pairs): 8 bytes of float16 / bfloat16, 16 of float32.
template <class T>
__device__ __forceinline__ void load_four(const T* src, float (&x)[kValues / 2]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(src);
    const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int i = 0; i < kValues / 2; ++i) x[i] = to_float(e[i]);
  }
}

template <class T>
__device__ __forceinline__ void store_values(T* dst, const float (&x)[kValues]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    uint4 w;
    T* e = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int i = 0; i < kValues; ++i) e[i] = from_float<T>(x[i]);
    *reinterpret_cast<uint4*>(dst) = w;
  }
}

// Stores this lane's 8 values of a cache row (starting at column d0): the element type, 8 int8 bytes, or 4
// bytes of int4 pairs.
template <class T>
__device__ __forceinline__ void store_cache_values(const float (&x)[kValues], const DeviceCache& cache,
                                                   std::int64_t kv_head, std::int64_t H, std::int64_t d0,
                                                   std::byte* row) {
  switch (cache.type) {
    case KvType::Float:
      store_values(reinterpret_cast<T*>(row) + d0, x);
      return;
    case KvType::Int8: {
      std::uint32_t w[2] = {0, 0};
#pragma unroll
      for (int i = 0; i < kValues; ++i) {
        const int q = quantize(x[i], inverse_cache_scale(cache, kv_head, H, d0 + i), core::kInt8Min, core::kInt8Max);
        w[i / 4] |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(static_cast<std::int8_t>(q))) << (8 * (i % 4));
      }
      *reinterpret_cast<uint2*>(row + d0) = make_uint2(w[0], w[1]);
      return;
    }
    case KvType::Int4: {
      std::uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < kValues / 2; ++j) {
        const int even = quantize(x[2 * j], inverse_cache_scale(cache, kv_head, H, d0 + 2 * j), core::kInt4Min,
                                  core::kInt4Max);
        const int odd = quantize(x[2 * j + 1], inverse_cache_scale(cache, kv_head, H, d0 + 2 * j + 1),
                                 core::kInt4Min, core::kInt4Max);
        w |= static_cast<std::uint32_t>(core::int4_pack(even, odd)) << (8 * j);
      }
      *reinterpret_cast<std::uint32_t*>(row + d0 / 2) = w;
      return;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) prepass_vector_kernel(const AppendStep st, int lanes_per_row) {
  // The attention kernel launched after it may start its setup now (it waits for this grid before it reads).
  allow_dependent_grids();
  const int L = lanes_per_row;
  const int lane = threadIdx.x % 32;
  const int part = lane % L;
  const std::int64_t H = st.head_size;
  const std::int64_t d0 = static_cast<std::int64_t>(part) * kValues;
  const std::int64_t q_rows = st.q_out != nullptr ? st.heads : 0;
  const std::int64_t per_token = q_rows + 2 * st.kv_heads;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * (kThreads / L) + threadIdx.x / L;
  const bool live = item < st.batch * st.seq * per_token;
  const std::int64_t token = live ? item / per_token : 0;
  const std::int64_t r = item - token * per_token;
  const std::int64_t b = token / st.seq;
  const std::int64_t s = token % st.seq;
  const bool is_q = r < q_rows;
  const bool is_k = !is_q && r < q_rows + st.kv_heads;
  const std::int64_t h = is_q ? r : (is_k ? r - q_rows : r - q_rows - st.kv_heads);
  const bool prepare = live && (is_q || is_k);

  float x[kValues] = {};
  if (live) {
    const T* src = static_cast<const T*>(is_q ? st.query : is_k ? st.key : st.value) +
                   (is_q ? st.q_in : is_k ? st.k_in : st.v_in).index(b, h, s);
    load_values(src + d0, x);
  }
  if (st.qk_norm) {
    // x * rsqrt(mean(x^2) + eps) * w, in float64 like the CPU unit.
    double squares = 0.0;
#pragma unroll
    for (int i = 0; i < kValues; ++i) squares += static_cast<double>(x[i]) * x[i];
    for (int o = L / 2; o >= 1; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
    if (prepare) {
      const double inv_rms = 1.0 / sqrt(squares / static_cast<double>(H) + static_cast<double>(st.norm_epsilon));
      const T* w = static_cast<const T*>(is_q ? st.q_norm_weight : st.k_norm_weight);
#pragma unroll
      for (int i = 0; i < kValues; ++i) x[i] = static_cast<float>(__dmul_rn(__dmul_rn(x[i], inv_rms), to_float(w[d0 + i])));
    }
  }
  if (st.rotary) {
    const std::int64_t half = st.rotary_half;
    const DeviceBatchRows br = st.rows[live ? b : 0];
    const std::int64_t position = live ? rotary_position(st, br, b, s) : 0;
    const T* cos_row = static_cast<const T*>(st.cos_cache) + position * half;
    const T* sin_row = static_cast<const T*>(st.sin_cache) + position * half;
    const bool rotated = prepare && d0 < 2 * half;
    if (st.interleaved) {
      if (rotated) {
        float c[kValues / 2], sn[kValues / 2];
        load_four(cos_row + d0 / 2, c);
        load_four(sin_row + d0 / 2, sn);
#pragma unroll
        for (int j = 0; j < kValues / 2; ++j) {
          const float a = x[2 * j], bb = x[2 * j + 1];
          x[2 * j] = rotate_first(a, bb, c[j], sn[j]);
          x[2 * j + 1] = rotate_second(a, bb, c[j], sn[j]);
        }
      }
    } else {
      // The partner chunk of a split-halves pair: half / 8 lanes on, or back.
      const int distance = static_cast<int>(half / kValues);
      const bool first_half = d0 < half;
      const int partner = first_half ? lane + distance : lane - distance;
      float other[kValues];
#pragma unroll
      for (int i = 0; i < kValues; ++i) other[i] = __shfl_sync(0xffffffffu, x[i], partner & 31);
      if (rotated) {
        const std::int64_t i0 = first_half ? d0 : d0 - half;
        float c[kValues], sn[kValues];
        load_values(cos_row + i0, c);
        load_values(sin_row + i0, sn);
#pragma unroll
        for (int i = 0; i < kValues; ++i) {
          x[i] = first_half ? rotate_first(x[i], other[i], c[i], sn[i]) : rotate_second(other[i], x[i], c[i], sn[i]);
        }
      }
    }
  }
  if (!live) return;
  // Q' and the new K rows are tensors of the query's type (what a quantized cache quantizes).
  if (prepare) {
#pragma unroll
    for (int i = 0; i < kValues; ++i) x[i] = round_to<T>(x[i]);
  }
  if (is_q) {
    store_values(static_cast<T*>(st.q_out) + ((b * st.seq + s) * st.heads + h) * H + d0, x);
    return;
  }
  const DeviceCache& cache = is_k ? st.key_cache : st.value_cache;
  const DeviceBatchRows br = st.rows[b];
  std::byte* row = cache.data + ((b * st.kv_heads + h) * cache.capacity + br.write_row + s) * cache.row_bytes;
  store_cache_values<T>(x, cache, h, H, d0, row);
}

bool aligned(const void* base, const Layout& l, std::size_t element, std::size_t bytes) {
  const auto at = [&](std::int64_t elements) { return static_cast<std::size_t>(elements) * element % bytes == 0; };
  return reinterpret_cast<std::uintptr_t>(base) % bytes == 0 && at(l.offset) && at(l.batch_stride) &&
         at(l.head_stride) && at(l.row_stride);
}

}  // namespace

bool prepass_vector_supports(const AppendStep& s) {
  const std::int64_t H = s.head_size;
  if (H < kValues || H > 256 || (H & (H - 1)) != 0) return false;
  // Rotary: whole 8-value chunks on either side of a split-halves pair, cos / sin rows on 16 bytes.
  if (s.rotary && (s.rotary_half % kValues != 0 || reinterpret_cast<std::uintptr_t>(s.cos_cache) % 16 != 0 ||
                   reinterpret_cast<std::uintptr_t>(s.sin_cache) % 16 != 0)) {
    return false;
  }
  const std::size_t es = dtype_size(s.dtype);
  const bool inputs = aligned(s.query, s.q_in, es, 16) && aligned(s.key, s.k_in, es, 16) &&
                      aligned(s.value, s.v_in, es, 16) && reinterpret_cast<std::uintptr_t>(s.q_out) % 16 == 0;
  // A cache row of H values: a lane stores 8 of them, 16 / 32 bytes (float), 8 (int8) or 4 (int4).
  const auto cache_ok = [&](const DeviceCache& c) {
    const std::size_t unit = c.type == KvType::Float ? 16 : c.type == KvType::Int8 ? 8 : 4;
    return reinterpret_cast<std::uintptr_t>(c.data) % unit == 0 && static_cast<std::size_t>(c.row_bytes) % unit == 0;
  };
  return inputs && cache_ok(s.key_cache) && cache_ok(s.value_cache);
}

void launch_prepass_vector(const AppendStep& s, void* stream_handle) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  const int lanes_per_row = static_cast<int>(s.head_size / kValues);
  const std::int64_t rows = s.batch * s.seq * ((s.q_out != nullptr ? s.heads : 0) + 2 * s.kv_heads);
  const std::int64_t rows_per_block = kThreads / lanes_per_row;
  const auto grid = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  switch (s.dtype) {
    case DType::f32: prepass_vector_kernel<float><<<grid, kThreads, 0, stream>>>(s, lanes_per_row); break;
    case DType::f16: prepass_vector_kernel<__half><<<grid, kThreads, 0, stream>>>(s, lanes_per_row); break;
    case DType::bf16: prepass_vector_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(s, lanes_per_row); break;
  }
}

}  // namespace attnkit::cuda
