// The softmax's exponential, shared by the CPU kernels (tiled_kernel.cpp, few_rows_kernel.cpp): exp(x) for the
// x = score - max <= 0 of an online softmax. Included once per Highway target by each kernel file.
//
// Why not Highway's Exp: that one serves the whole float range (two scalings by 2^(q/2), a lower-bound select,
// sign-dependent rounding), about 24 instructions; here x <= 0 and everything below kExpFloor is 0, so 2^q is one
// normal float built from q's bits and the rounding is one add of a magic constant: about 14. The reduction and the
// polynomial are the same (Cody-Waite by ln 2 in two parts, degree 5 for e^r - 1 - r on |r| <= ln 2 / 2), so the
// accuracy is Highway's (a few ulp), and exp(0) is exactly 1 (the row's max element weighs 1).
#if defined(ATTNKIT_CPU_SOFTMAX_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNKIT_CPU_SOFTMAX_EXP_INL_H_
#undef ATTNKIT_CPU_SOFTMAX_EXP_INL_H_
#else
#define ATTNKIT_CPU_SOFTMAX_EXP_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) below this is a float32 subnormal: taken as 0 (the max element of a row has weight 1, so this is far
// below the float32 rounding of the sum, and it keeps subnormal arithmetic off the hot loops). At the floor,
// round(x / ln 2) = -126: 2^q is still a normal float.
constexpr float kExpFloor = -87.3f;

// exp(x) for x <= 0; 0 for x < kExpFloor, -inf and NaN (a NaN score poisons its row by the kernels' flag, not here).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V exp_of_nonpositive(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: t = x / ln 2 + magic holds round(x / ln 2) in its low bits
  const V t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), magic);
  const V q = hn::Sub(t, magic);
  V r = hn::MulAdd(q, hn::Set(d, -0.693145751953125f), x);  // x - q ln 2, ln 2 in two parts
  r = hn::MulAdd(q, hn::Set(d, -1.428606765330187045e-6f), r);
  V p = hn::Set(d, 0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  const V er = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));  // e^r
#if HWY_TARGET <= HWY_AVX3
  // AVX-512: e^r * 2^q in one vscalefps (exact scaling, rounded as the multiply below), zero below the floor.
  if constexpr (hn::MaxLanes(d) == 16) {
    const __mmask16 kept = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(kExpFloor), _CMP_GE_OQ);
    return V{_mm512_maskz_scalef_ps(kept, er.raw, q.raw)};
  }
#endif
  const auto exponent = hn::Add(hn::Sub(hn::BitCast(di, t), hn::BitCast(di, magic)), hn::Set(di, 127));
  const V two_q = hn::BitCast(d, hn::ShiftLeft<23>(exponent));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, kExpFloor)), hn::Mul(er, two_q));
}

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
