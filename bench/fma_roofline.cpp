// The float32 FMA ceiling of this machine's cores, measured: each thread runs independent chains of 512-bit
// (or 256-bit) fused multiply-adds, enough of them to cover the FMA latency on every port, and the rate of all
// threads together is the roofline the CPU kernel's GFLOP/s are compared with (docs/benchmarks.md). Where the CPU
// has AVX512_BF16, the same chains of `vdpbf16ps` (two bfloat16 products a lane): whether the pair dot product
// outruns the float32 multiply-add (src/cpu/few_rows_bf16.hpp's pair_dot_at_fma_rate).
//
//   g++ -O2 -march=native -fopenmp bench/fma_roofline.cpp -o build/fma_roofline && build/fma_roofline [threads]
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kChains = 16;  // > latency (4 cycles) x ports (2): every FMA port busy every cycle
constexpr long kIterations = 20'000'000;

template <class V, class Fma, class Add>
float run_chains(V x, V y, Fma fma, Add add) {
  V acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = x;
  for (long i = 0; i < kIterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], y, x);
  }
  V s = acc[0];
  for (int c = 1; c < kChains; ++c) s = add(s, acc[c]);
  float out[16];
  std::memcpy(out, &s, sizeof(s) < sizeof(out) ? sizeof(s) : sizeof(out));
  return out[0];
}

enum class Op { Fma512, Fma256, DotBf16 };

double gflops(int threads, Op op) {
  volatile float sink = 0.0f;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    float r;
#ifdef __AVX512BF16__
    if (op == Op::DotBf16) {
      const __m512bh pair = (__m512bh)_mm512_set1_epi16(0x3f80);  // (1, 1) in bfloat16
      r = run_chains(_mm512_set1_ps(1e-3f), _mm512_set1_ps(0.0f),
                     [pair](__m512 a, __m512, __m512) { return _mm512_dpbf16_ps(a, pair, pair); },
                     [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
    } else
#endif
#ifdef __AVX512F__
    if (op == Op::Fma512) {
      r = run_chains(_mm512_set1_ps(1e-3f), _mm512_set1_ps(0.999f),
                     [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); },
                     [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
    } else
#endif
    {
      r = run_chains(_mm256_set1_ps(1e-3f), _mm256_set1_ps(0.999f),
                     [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
                     [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
    }
#pragma omp critical
    sink = sink + r;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // (a multiply and an add per product; vdpbf16ps: two products per lane)
  const double products = op == Op::Fma256 ? 8.0 : op == Op::Fma512 ? 16.0 : 32.0;
  return 2.0 * products * kChains * static_cast<double>(kIterations) * threads / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  for (int rep = 0; rep < 3; ++rep) {
    std::printf("%d threads: ", threads);
#ifdef __AVX512F__
    std::printf("512-bit FMA %.1f GFLOP/s, ", gflops(threads, Op::Fma512));
#endif
#ifdef __AVX512BF16__
    std::printf("512-bit vdpbf16ps %.1f GFLOP/s, ", gflops(threads, Op::DotBf16));
#endif
    std::printf("256-bit FMA %.1f GFLOP/s\n", gflops(threads, Op::Fma256));
  }
  return 0;
}
