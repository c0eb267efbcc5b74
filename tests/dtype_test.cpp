// The scalar conversions of attnkit/dtype.hpp, which every backend, the reference and the tests share.
// Each is checked against an oracle written independently of it: exact binary16 / bfloat16 values computed
// in double from the bit fields, round-to-nearest-even decided by comparing distances in double, and, where
// the compiler has it, the compiler's own _Float16 conversion.
#include <attnkit/dtype.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

namespace attnkit::test {
namespace {

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of a finite binary16 pattern, from its fields.
double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(Dtype, HalfToFloatIsExactForEveryPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const float f = half_bits_to_float(hb);
    const bool negative = (hb & 0x8000) != 0;
    EXPECT_EQ(std::signbit(f), negative) << std::hex << h;
    if ((hb & 0x7c00) == 0x7c00) {
      if (hb & 0x3ff) {
        EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      } else {
        EXPECT_EQ(f, negative ? -INFINITY : INFINITY) << std::hex << h;
      }
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), half_value(hb)) << std::hex << h;
  }
}

// half -> float -> half gives the same bits for all 63,490 non-NaN patterns (both zeros, every subnormal,
// both infinities). A NaN stays a NaN of the same sign; its payload is not kept (float_to_half_bits
// returns the canonical quiet NaN 0x7e00, as its comment says: "NaN stays NaN").
TEST(Dtype, HalfRoundTripsThroughFloat) {
  int nans = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_half_bits(half_bits_to_float(hb));
    if (half_is_nan(hb)) {
      ++nans;
      EXPECT_TRUE(half_is_nan(back)) << std::hex << h << " -> " << back;
      EXPECT_EQ(back & 0x8000, hb & 0x8000) << std::hex << h;
    } else {
      EXPECT_EQ(back, hb) << std::hex << h;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

// The half pattern nearest to x, ties to the even pattern, decided in double (exact for these inputs).
// `lo` is a candidate at or below |x|; the answer is lo or lo + 1.
std::uint16_t nearest_even_half(float x, std::uint16_t lo) {
  const double ax = std::abs(static_cast<double>(x));
  const double a = half_value(lo);
  const double b = lo == 0x7bff ? 65536.0 : half_value(static_cast<std::uint16_t>(lo + 1));  // 0x7c00 rounds as 2^16
  std::uint16_t r;
  if (ax - a < b - ax) r = lo;
  else if (ax - a > b - ax) r = static_cast<std::uint16_t>(lo + 1);
  else r = (lo & 1) ? static_cast<std::uint16_t>(lo + 1) : lo;
  return static_cast<std::uint16_t>(r | (std::signbit(x) ? 0x8000 : 0));
}

// Around every pair of neighbouring half values (subnormals and the overflow threshold included): the
// midpoint goes to the even one, a float ulp either side goes to the nearer one, the values themselves are
// exact. Both signs.
TEST(Dtype, FloatToHalfRoundsToNearestEven) {
  for (std::uint16_t lo = 0; lo <= 0x7bff; ++lo) {
    const double a = half_value(lo);
    const double b = lo == 0x7bff ? 65536.0 : half_value(static_cast<std::uint16_t>(lo + 1));
    const float mid = static_cast<float>((a + b) / 2);  // at most 12 significant bits: exact in float
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
    for (float sign : {1.0f, -1.0f}) {
      for (float x : {static_cast<float>(a), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        const float sx = sign * x;
        EXPECT_EQ(float_to_half_bits(sx), nearest_even_half(sx, lo)) << sx << " (between " << a << " and " << b << ")";
      }
    }
  }
}

TEST(Dtype, FloatToHalfSpecialCases) {
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3c00);          // tie, to even (down)
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * 0x1p-11f), 0x3c02);      // tie, to even (up)
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);                 // smallest subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);                 // half of it: tie, to even 0
  EXPECT_EQ(float_to_half_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half_bits(3 * 0x1p-25f), 0x0002);             // 1.5 subnormal units: tie, to even 2
  EXPECT_EQ(float_to_half_bits(1023.5f * 0x1p-24f), 0x0400);        // largest subnormal + half: to the smallest normal
  EXPECT_EQ(float_to_half_bits(1e-10f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-1e-10f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);                 // tie between 65504 and 2^16: even is inf
  EXPECT_EQ(float_to_half_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half_bits(-INFINITY), 0xfc00);
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0xffc00000u, 0xff800001u, 0x7fc0deadu}) {
    const std::uint16_t h = float_to_half_bits(from_bits(nan));
    EXPECT_TRUE(half_is_nan(h)) << std::hex << nan << " -> " << h;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
  }
}

// The compiler's half type: aarch64's __fp16 (GCC 12 has no _Float16 in C++ there), else _Float16.
#if defined(__aarch64__)
#define ATTNKIT_TEST_COMPILER_HALF 1
using CompilerHalf = __fp16;
#elif defined(__FLT16_MAX__)
#define ATTNKIT_TEST_COMPILER_HALF 1
using CompilerHalf = _Float16;
#endif

#if defined(ATTNKIT_TEST_COMPILER_HALF)
// The compiler's half conversion (IEEE round to nearest even) as a second oracle, on random float bit
// patterns (every exponent) and on random values in and near half's range.
TEST(Dtype, FloatToHalfMatchesTheCompiler) {
  std::mt19937_64 rng(16);
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int n = 0; n < 3'000'000; ++n) {
    const float x = n % 3 == 0 ? from_bits(static_cast<std::uint32_t>(rng())) : n % 3 == 1 ? in_range(rng) : small(rng);
    if (std::isnan(x)) continue;
    const CompilerHalf h = static_cast<CompilerHalf>(x);
    std::uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(float_to_half_bits(x), want) << x << " bits " << std::hex << bits_of(x);
  }
}
#endif

// ---- bfloat16 ----

TEST(Dtype, Bf16ToFloatIsTheTopHalf) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    EXPECT_EQ(bits_of(f), b << 16) << std::hex << b;
  }
}

TEST(Dtype, Bf16RoundTripsThroughFloat) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bb = static_cast<std::uint16_t>(b);
    const std::uint16_t back = float_to_bf16_bits(bf16_bits_to_float(bb));
    if (bf16_is_nan(bb)) {
      EXPECT_TRUE(bf16_is_nan(back)) << std::hex << b << " -> " << back;
      EXPECT_EQ(back & 0x8000, bb & 0x8000);
    } else {
      EXPECT_EQ(back, bb) << std::hex << b;
    }
  }
}

// Between neighbouring bfloat16 values lo and lo + 1 (one ulp apart, also across an exponent step and at
// the overflow threshold 0x7f7f -> 0x7f80 = inf), the float with the low 16 bits 0x8000 is the exact
// midpoint: it goes to the even one; 0x7fff goes down, 0x8001 up, 0x0001 down. Checked in double too.
TEST(Dtype, FloatToBf16RoundsToNearestEven) {
  for (std::uint32_t lo = 0; lo < 0x7f80; ++lo) {
    const double a = bf16_bits_to_float(static_cast<std::uint16_t>(lo));
    const double b = lo == 0x7f7f ? std::ldexp(1.0, 128) : bf16_bits_to_float(static_cast<std::uint16_t>(lo + 1));
    for (std::uint32_t low : {0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        const float x = from_bits(sign | (lo << 16) | low);
        const double ax = std::abs(static_cast<double>(x));
        std::uint32_t want = ax - a < b - ax ? lo : ax - a > b - ax ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
        want |= sign >> 16;
        EXPECT_EQ(float_to_bf16_bits(x), want) << std::hex << bits_of(x);
      }
    }
  }
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up past the largest: inf
  EXPECT_EQ(float_to_bf16_bits(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);  // 1 below the midpoint of 0 and 0x0001
  // NaN stays NaN, whatever the payload: a signalling NaN whose payload is all in the low 16 bits must not
  // round or truncate to infinity.
  for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xff800001u, 0xffc00000u}) {
    const std::uint16_t r = float_to_bf16_bits(from_bits(nan));
    EXPECT_TRUE(bf16_is_nan(r)) << std::hex << nan << " -> " << r;
    EXPECT_EQ(r & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
  }
}

// ---- the typed helpers ----

TEST(Dtype, LoadStoreAndRoundTo) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_name(DType::f32), "float32");
  EXPECT_EQ(dtype_name(DType::f16), "float16");
  EXPECT_EQ(dtype_name(DType::bf16), "bfloat16");
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float x = n(rng);
    std::uint16_t h[3] = {0xaaaa, 0xaaaa, 0xaaaa};
    store_from_float(h, DType::f16, 1, x);
    EXPECT_EQ(h[0], 0xaaaa);  // neighbours untouched
    EXPECT_EQ(h[2], 0xaaaa);
    EXPECT_EQ(h[1], float_to_half_bits(x));
    EXPECT_EQ(bits_of(load_as_float(h, DType::f16, 1)), bits_of(round_to(DType::f16, x)));
    store_from_float(h, DType::bf16, 1, x);
    EXPECT_EQ(h[1], float_to_bf16_bits(x));
    EXPECT_EQ(bits_of(load_as_float(h, DType::bf16, 1)), bits_of(round_to(DType::bf16, x)));
    float f[2] = {0.0f, 0.0f};
    store_from_float(f, DType::f32, 1, x);
    EXPECT_EQ(bits_of(load_as_float(f, DType::f32, 1)), bits_of(x));
    EXPECT_EQ(round_to(DType::f32, x), x);
  }
}

}  // namespace
}  // namespace attnkit::test
