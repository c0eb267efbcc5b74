// See few_rows_bf16.hpp. Compiled for x86-64 in general; only the functions marked with the target attribute
// use AVX-512 and are called only where the CPU has it.
#include "few_rows_bf16.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns on its own AVX-512 headers inside target-attributed functions (an `undefined` vector read in
// the intrinsics, a vector return between functions of one target): neither reaches our code's behaviour.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>
#define ATTNKIT_HAS_BF16_TARGET 1
#endif

namespace attnkit::cpu {

CpuKernelFeatures& cpu_kernel_features() {
  static CpuKernelFeatures features = [] {
    CpuKernelFeatures f;
#ifdef ATTNKIT_HAS_BF16_TARGET
    __builtin_cpu_init();
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.pair_dot_outruns_fma = f.avx512_bf16 && __builtin_cpu_is("amd");
#endif
    return f;
  }();
  return features;
}

#ifdef ATTNKIT_HAS_BF16_TARGET
namespace {

#define ATTNKIT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

// The lane sums of four vectors, as four floats.
ATTNKIT_BF16_TARGET inline __m128 sums_of_four(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 blocks = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                      _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(blocks), _mm512_extractf32x8_ps(blocks, 1));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

// 32 bfloat16 elements from p + d; past `full`, only the `tail` ones (zeros beyond the row, never read).
ATTNKIT_BF16_TARGET inline __m512bh load_bf16(const std::uint16_t* p, std::int64_t d, std::int64_t full, __mmask32 tail) {
  return d < full ? (__m512bh)_mm512_loadu_si512(p + d) : (__m512bh)_mm512_maskz_loadu_epi16(tail, p + d);
}

template <int R>
ATTNKIT_BF16_TARGET void score_rows(const std::uint16_t* const* q, std::int64_t dim, const std::uint16_t* const* k,
                                    std::int64_t n, const RowPrefetch& pf, float* s, std::int64_t row_stride) {
  constexpr std::int64_t kStep = 32;  // bfloat16 elements per vector
  const std::int64_t full = dim / kStep * kStep;
  const __mmask32 tail = static_cast<__mmask32>((std::uint64_t{1} << (dim - full)) - 1);  // zeros past dim
  // No lambda here: clang does not give a lambda its enclosing function's target attribute.
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    prefetch_keys(pf, j, j + 4);
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_setzero_ps();
    for (std::int64_t d = 0; d < dim; d += kStep) {
      __m512bh kv[4];
      for (int g = 0; g < 4; ++g) kv[g] = load_bf16(k[j + g], d, full, tail);
      for (int r = 0; r < R; ++r) {
        const __m512bh qv = load_bf16(q[r], d, full, tail);
        for (int g = 0; g < 4; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], qv, kv[g]);
      }
    }
    for (int r = 0; r < R; ++r) _mm_storeu_ps(s + r * row_stride + j, sums_of_four(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  }
  prefetch_rest(pf, j);
  for (; j < n; ++j) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (std::int64_t d = 0; d < dim; d += kStep) {
      const __m512bh kv = load_bf16(k[j], d, full, tail);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], load_bf16(q[r], d, full, tail), kv);
    }
    const __m512 z = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) s[r * row_stride + j] = _mm_cvtss_f32(sums_of_four(acc[r], z, z, z));
  }
}

}  // namespace

void score_tile_bf16_dpbf16(const std::uint16_t* const* q, int rows, std::int64_t dim, const std::uint16_t* const* k,
                            std::int64_t n, const RowPrefetch& pf, float* s, std::int64_t row_stride) {
  switch (rows) {
    case 1: score_rows<1>(q, dim, k, n, pf, s, row_stride); break;
    case 2: score_rows<2>(q, dim, k, n, pf, s, row_stride); break;
    case 3: score_rows<3>(q, dim, k, n, pf, s, row_stride); break;
    default: score_rows<4>(q, dim, k, n, pf, s, row_stride); break;
  }
}
#else
void score_tile_bf16_dpbf16(const std::uint16_t* const*, int, std::int64_t, const std::uint16_t* const*, std::int64_t,
                            const RowPrefetch&, float*, std::int64_t) {}
#endif

}  // namespace attnkit::cpu
