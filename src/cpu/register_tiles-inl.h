// The tiled kernel's register tiles (tiled_kernel.cpp): the score products St = K Qᵀ and the output products
// Oᵀ = Oᵀ alpha + Vᵀ P over a tile, kKeysPerStep keys (or output dims) by kVecsPerStep query vectors of
// accumulators at a time, and the loops that cover a tile with them. Included once per Highway target (the
// per-target include guard below).
#if defined(ATTNKIT_CPU_REGISTER_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNKIT_CPU_REGISTER_TILES_INL_H_
#undef ATTNKIT_CPU_REGISTER_TILES_INL_H_
#else
#define ATTNKIT_CPU_REGISTER_TILES_INL_H_
#endif

#include <hwy/highway.h>

#include "tiled_kernel.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register tiles: kKeysPerStep keys (or output dims) by kVecsPerStep query vectors of accumulators. 32 vector
// registers (AVX-512) hold 6 x 4 accumulators plus the operands; 16 registers (AVX2, SSE4) hold 6 x 2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kVecsPerStep = 4;
#else
constexpr int kVecsPerStep = 2;
#endif
constexpr int kKeysPerStep = 6;

// St[key][lane] = Σ_d K[key][d] · Qᵀ[d][lane] for MK keys and NV query vectors starting at vector v0.
template <int MK, int NV>
HWY_INLINE void score_step(const float* HWY_RESTRICT qt, std::int64_t dim, const float* const* krow,
                           float* HWY_RESTRICT st, std::size_t v0) {
  const DF df;
  const std::size_t L = hn::Lanes(df);
  VF acc[MK][NV];
  for (int m = 0; m < MK; ++m)
    for (int n = 0; n < NV; ++n) acc[m][n] = hn::Zero(df);
  for (std::int64_t d = 0; d < dim; ++d) {
    VF q[NV];
    for (int n = 0; n < NV; ++n) q[n] = hn::Load(df, qt + d * kRowBlock + (v0 + n) * L);
    for (int m = 0; m < MK; ++m) {
      const VF k = hn::Set(df, krow[m][d]);
      for (int n = 0; n < NV; ++n) acc[m][n] = hn::MulAdd(k, q[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MK; ++m)
    for (int n = 0; n < NV; ++n) hn::Store(acc[m][n], df, st + m * kRowBlock + (v0 + n) * L);
}

// Oᵀ[d][lane] = Oᵀ[d][lane] · alpha[lane] + Σ_key V[key][d] · P[key][lane], for MD output dims from d0 and NV
// query vectors from v0. The sum over the tile starts at zero: this is the blockwise accumulation.
template <int MD, int NV>
HWY_INLINE void value_step(const float* HWY_RESTRICT pt, std::int64_t tile_len, const float* const* vrow,
                           std::int64_t d0, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT ot,
                           std::size_t v0) {
  const DF df;
  const std::size_t L = hn::Lanes(df);
  VF acc[MD][NV];
  for (int m = 0; m < MD; ++m)
    for (int n = 0; n < NV; ++n) acc[m][n] = hn::Zero(df);
  for (std::int64_t j = 0; j < tile_len; ++j) {
    VF p[NV];
    for (int n = 0; n < NV; ++n) p[n] = hn::Load(df, pt + j * kRowBlock + (v0 + n) * L);
    const float* v = vrow[j] + d0;
    for (int m = 0; m < MD; ++m) {
      const VF vb = hn::Set(df, v[m]);
      for (int n = 0; n < NV; ++n) acc[m][n] = hn::MulAdd(vb, p[n], acc[m][n]);
    }
  }
  // 0 * inf is NaN: a key hidden from one row (weight 0) but visible to another, whose V holds inf or NaN,
  // would poison the row that cannot see it. Rare, so check the sums and redo this block with guarded products.
  const VF inf = hn::Set(df, std::numeric_limits<float>::infinity());
  auto finite = hn::Lt(hn::Abs(acc[0][0]), inf);
  for (int m = 0; m < MD; ++m)
    for (int n = 0; n < NV; ++n) finite = hn::And(finite, hn::Lt(hn::Abs(acc[m][n]), inf));
  if (!hn::AllTrue(df, finite)) {
    for (int m = 0; m < MD; ++m)
      for (int n = 0; n < NV; ++n) acc[m][n] = hn::Zero(df);
    for (std::int64_t j = 0; j < tile_len; ++j) {
      for (int n = 0; n < NV; ++n) {
        const VF p = hn::Load(df, pt + j * kRowBlock + (v0 + n) * L);
        const auto seen = hn::Ne(p, hn::Zero(df));
        // Same fused multiply-add as the fast path where the weight is nonzero (identical bits), acc where it is 0.
        for (int m = 0; m < MD; ++m)
          acc[m][n] = hn::MulAdd(hn::IfThenElseZero(seen, hn::Set(df, vrow[j][d0 + m])), p, acc[m][n]);
      }
    }
  }
  for (int n = 0; n < NV; ++n) {
    const VF a = hn::Load(df, alpha + (v0 + n) * L);
    for (int m = 0; m < MD; ++m) {
      float* o = ot + (d0 + m) * kRowBlock + (v0 + n) * L;
      hn::Store(hn::MulAdd(hn::Load(df, o), a, acc[m][n]), df, o);
    }
  }
}

// Runs step.run<M, NV> over `nvec` query vectors, the remainder with smaller register tiles.
template <int M, int NV, class Step>
HWY_INLINE void tile_loop_vecs(Step& step, std::int64_t first, std::size_t nvec) {
  std::size_t v0 = 0;
  for (; v0 + NV <= nvec; v0 += NV) step.template run<M, NV>(first, v0);
  if constexpr (NV >= 4) {
    if (v0 + 2 <= nvec) {
      step.template run<M, 2>(first, v0);
      v0 += 2;
    }
  }
  if constexpr (NV >= 2) {
    if (v0 < nvec) step.template run<M, 1>(first, v0);
  }
}

template <class Step>
HWY_INLINE void tile_loop(Step& step, std::int64_t count, std::size_t nvec) {
  std::int64_t i = 0;
  for (; i + kKeysPerStep <= count; i += kKeysPerStep) tile_loop_vecs<kKeysPerStep, kVecsPerStep>(step, i, nvec);
  switch (count - i) {
    case 5: tile_loop_vecs<5, kVecsPerStep>(step, i, nvec); break;
    case 4: tile_loop_vecs<4, kVecsPerStep>(step, i, nvec); break;
    case 3: tile_loop_vecs<3, kVecsPerStep>(step, i, nvec); break;
    case 2: tile_loop_vecs<2, kVecsPerStep>(step, i, nvec); break;
    case 1: tile_loop_vecs<1, kVecsPerStep>(step, i, nvec); break;
    default: break;
  }
}

struct ScoreStep {
  const float* qt;
  std::int64_t dim;
  const float* const* krow;
  float* st;
  template <int M, int NV>
  HWY_INLINE void run(std::int64_t key, std::size_t v0) {
    score_step<M, NV>(qt, dim, krow + key, st + key * kRowBlock, v0);
  }
};

struct ValueStep {
  const float* pt;
  std::int64_t tile_len;
  const float* const* vrow;
  const float* alpha;
  float* ot;
  template <int M, int NV>
  HWY_INLINE void run(std::int64_t d0, std::size_t v0) {
    value_step<M, NV>(pt, tile_len, vrow, d0, alpha, ot, v0);
  }
};

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTNKIT_CPU_REGISTER_TILES_INL_H_
