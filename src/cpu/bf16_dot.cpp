// The tiled kernel's score product on `vdpbf16ps` (see bf16_dot.hpp). Only the functions marked with the target
// attribute use AVX-512: the file is compiled for the baseline ISA, so no inline function it shares with other
// files gets AVX-512 code, and nothing here runs unless available() said yes (the CPU check of the few-rows
// kernel's vdpbf16ps scores, few_rows_bf16.hpp).
#include "bf16_dot.hpp"

#include "few_rows_bf16.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
// (GCC 12 warns inside its own AVX-512 headers in target-attributed functions; see few_rows_bf16.cpp.)
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wpsabi"
#include <immintrin.h>
#define ATTNKIT_BF16_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#endif

namespace attnkit::cpu::bf16_dot {

bool available() { return cpu_kernel_features().avx512_bf16; }
bool pays() { return available() && cpu_kernel_features().pair_dot_outruns_fma; }

#ifdef ATTNKIT_BF16_DOT_TARGET
namespace {

constexpr int kKeysPerBlock = 6;  // 6 keys x 4 vectors of accumulators, 4 Q vectors and a K pair: 29 registers
constexpr int kVectorsPerBlock = 4;

// acc[m][n] += Q's pair p (vector v0 + n) . K row m's values 2p and 2p + 1 (broadcast, the even one low); a
// `single` pair is the odd head dim's last value and a 0 (nothing past the row is read).
template <int MK, int NV>
ATTNKIT_BF16_DOT_TARGET inline void add_pair(__m512 (&acc)[MK][NV], const std::uint32_t* q32,
                                             const std::uint16_t* const* krow, std::int64_t p, int v0, bool single) {
  __m512bh q[NV];
  for (int n = 0; n < NV; ++n) q[n] = (__m512bh)_mm512_loadu_si512(q32 + p * kLanes + (v0 + n) * kVectorLanes);
  for (int m = 0; m < MK; ++m) {
    std::uint32_t pair = krow[m][2 * p];
    if (!single) std::memcpy(&pair, krow[m] + 2 * p, sizeof(pair));
    const __m512bh k = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    for (int n = 0; n < NV; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], k, q[n]);
  }
}

// S^T for MK keys x NV query vectors from vector v0.
template <int MK, int NV>
ATTNKIT_BF16_DOT_TARGET inline void score_block(const std::uint16_t* q_pairs, std::int64_t dim,
                                                const std::uint16_t* const* krow, float* st, int v0) {
  const auto* q32 = reinterpret_cast<const std::uint32_t*>(q_pairs);  // [pair][lane]
  __m512 acc[MK][NV];
  for (int m = 0; m < MK; ++m)
    for (int n = 0; n < NV; ++n) acc[m][n] = _mm512_setzero_ps();
  const std::int64_t full = dim / 2;
  for (std::int64_t p = 0; p < full; ++p) add_pair<MK, NV>(acc, q32, krow, p, v0, false);
  if (dim % 2 != 0) add_pair<MK, NV>(acc, q32, krow, full, v0, true);
  for (int m = 0; m < MK; ++m)
    for (int n = 0; n < NV; ++n) _mm512_storeu_ps(st + m * kLanes + (v0 + n) * kVectorLanes, acc[m][n]);
}

template <int MK>
ATTNKIT_BF16_DOT_TARGET inline void key_block(const std::uint16_t* q_pairs, std::int64_t dim,
                                              const std::uint16_t* const* krow, float* st, int nvec) {
  int v = 0;
  for (; v + kVectorsPerBlock <= nvec; v += kVectorsPerBlock) score_block<MK, kVectorsPerBlock>(q_pairs, dim, krow, st, v);
  if (v + 2 <= nvec) {
    score_block<MK, 2>(q_pairs, dim, krow, st, v);
    v += 2;
  }
  if (v < nvec) score_block<MK, 1>(q_pairs, dim, krow, st, v);
}

}  // namespace

ATTNKIT_BF16_DOT_TARGET void scores(const std::uint16_t* q_pairs, std::int64_t dim, const std::uint16_t* const* krow,
                                    std::int64_t n, std::int64_t lanes, float* st) {
  const int nvec = static_cast<int>((lanes + kVectorLanes - 1) / kVectorLanes);
  std::int64_t j = 0;
  for (; j + kKeysPerBlock <= n; j += kKeysPerBlock) key_block<kKeysPerBlock>(q_pairs, dim, krow + j, st + j * kLanes, nvec);
  const std::uint16_t* const* rest = krow + j;
  float* rest_st = st + j * kLanes;
  switch (n - j) {
    case 5: key_block<5>(q_pairs, dim, rest, rest_st, nvec); break;
    case 4: key_block<4>(q_pairs, dim, rest, rest_st, nvec); break;
    case 3: key_block<3>(q_pairs, dim, rest, rest_st, nvec); break;
    case 2: key_block<2>(q_pairs, dim, rest, rest_st, nvec); break;
    case 1: key_block<1>(q_pairs, dim, rest, rest_st, nvec); break;
    default: break;
  }
}

#else
void scores(const std::uint16_t*, std::int64_t, const std::uint16_t* const*, std::int64_t, std::int64_t, float*) {
  std::abort();  // never planned: available() is false where the instruction cannot be built
}
#endif

}  // namespace attnkit::cpu::bf16_dot
