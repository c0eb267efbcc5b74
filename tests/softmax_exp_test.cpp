// The CPU kernels' softmax exponential (src/cpu/softmax_exp-inl.h) on the best SIMD target of this CPU: within
// 2 float32 ulp of exp in double over its whole range [kExpFloor, 0], exactly 1 at 0, and 0 below the floor,
// at -inf and at NaN.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax_exp_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cpu/softmax_exp-inl.h>

#include <cstddef>
#include <vector>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {

// out[i] = exp_of_nonpositive(in[i]); n a multiple of the lane count.
void exp_of_each(const float* in, float* out, std::size_t n) {
  const hn::ScalableTag<float> d;
  for (std::size_t i = 0; i < n; i += hn::Lanes(d)) hn::StoreU(exp_of_nonpositive(d, hn::LoadU(d, in + i)), d, out + i);
}

float exp_floor() { return kExpFloor; }

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace attnkit::cpu {
HWY_EXPORT(exp_of_each);
HWY_EXPORT(exp_floor);

namespace {

constexpr std::size_t kBatch = 64;  // a multiple of every target's lane count

const float kFloor = HWY_DYNAMIC_DISPATCH(exp_floor)();

std::vector<float> exp_of_each_dispatched(std::vector<float> in) {
  in.resize((in.size() + kBatch - 1) / kBatch * kBatch, 0.0f);
  std::vector<float> out(in.size());
  HWY_DYNAMIC_DISPATCH(exp_of_each)(in.data(), out.data(), in.size());
  return out;
}

TEST(SoftmaxExp, WithinTwoUlpOverItsRange) {
  std::vector<float> xs;
  // Every 1/4096 from the floor to 0, plus the float32 values right next to 0 and to the floor.
  for (double x = static_cast<double>(kFloor); x <= 0.0; x += 1.0 / 4096) xs.push_back(static_cast<float>(x));
  for (float x = -1e-30f; x > -1e-3f; x *= 3.0f) xs.push_back(x);
  xs.push_back(std::nextafter(kFloor, 0.0f));
  const std::vector<float> got = exp_of_each_dispatched(xs);
  double worst = 0.0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] < kFloor) continue;
    const double want = std::exp(static_cast<double>(xs[i]));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    const double err = std::abs(got[i] - want) / ulp;
    worst = std::max(worst, err);
    ASSERT_LE(err, 2.0) << "x " << xs[i] << ": " << got[i] << " against " << want;
  }
  EXPECT_GT(worst, 0.0);  // (the comparison ran)
  std::printf("worst error: %.2f ulp over %zu values\n", worst, xs.size());
}

TEST(SoftmaxExp, OneAtZeroAndZeroBelowTheFloor) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> got = exp_of_each_dispatched(
      {0.0f, -0.0f, std::nextafter(kFloor, -kInf), -100.0f, -1e30f, -kInf,
       std::numeric_limits<float>::quiet_NaN()});
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 1.0f);
  for (int i = 2; i < 7; ++i) EXPECT_EQ(got[i], 0.0f) << i;
}

}  // namespace
}  // namespace attnkit::cpu
#endif
