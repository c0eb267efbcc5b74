// The GQA op's units, each against an independent float64 (or integer) computation written here:
// RMS norm, rotary (non-interleaved, interleaved, partial), quantize / pack / dequantize (int8, int4, the
// packing byte, odd head sizes), and the cache append in every mode.
#include <gtest/gtest.h>

#include <cmath>
#include <core/kv_quant.hpp>
#include <cstring>
#include <gqa/kv_cache.hpp>
#include <gqa/qk_norm.hpp>
#include <gqa/rotary.hpp>
#include <random>
#include <vector>

namespace attnkit::test {
namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

std::vector<float> normal_floats(std::int64_t n, std::uint64_t seed, double std_dev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, std_dev);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = static_cast<float>(d(rng));
  return x;
}

std::vector<std::byte> as_type(const std::vector<float>& x, DType t) {
  std::vector<std::byte> b(x.size() * dtype_size(t));
  for (std::size_t i = 0; i < x.size(); ++i) store_from_float(b.data(), t, static_cast<std::int64_t>(i), x[i]);
  return b;
}

// ---- RMS norm ----

TEST(GqaNorm, MatchesFloat64Formula) {
  for (DType wt : kFloatTypes) {
    for (std::int64_t n : {1, 8, 64, 128, 255}) {
      SCOPED_TRACE(std::string(dtype_name(wt)) + " n=" + std::to_string(n));
      const std::vector<float> x0 = normal_floats(n, 10 + static_cast<std::uint64_t>(n), 3.0);
      const std::vector<float> w = normal_floats(n, 20, 0.5);
      const std::vector<std::byte> wb = as_type(w, wt);
      const float eps = 1e-6f;
      std::vector<float> x = x0;
      gqa::rms_norm_row(x.data(), n, wb.data(), wt, eps);
      double ms = 0.0;
      for (float v : x0) ms += static_cast<double>(v) * v;
      ms /= static_cast<double>(n);
      for (std::int64_t d = 0; d < n; ++d) {
        const double ref = x0[d] / std::sqrt(ms + eps) * load_as_float(wb.data(), wt, d);
        // One float32 rounding of a float64 result.
        EXPECT_NEAR(x[d], ref, std::abs(ref) * 6e-8 + 1e-30) << "d=" << d;
      }
    }
  }
}

TEST(GqaNorm, EpsilonDominatesAZeroRow) {
  std::vector<float> x(16, 0.0f);
  const std::vector<std::byte> w = as_type(std::vector<float>(16, 2.0f), DType::f32);
  gqa::rms_norm_row(x.data(), 16, w.data(), DType::f32, 1e-6f);
  for (float v : x) EXPECT_EQ(v, 0.0f);
  // A constant row c normalises to sign(c) * w when eps is negligible, and to c / sqrt(c^2 + eps) * w otherwise.
  std::vector<float> y(16, 1e-3f);
  gqa::rms_norm_row(y.data(), 16, w.data(), DType::f32, 1e-6f);
  const double ref = 1e-3 / std::sqrt(1e-6 + 1e-6) * 2.0;
  for (float v : y) EXPECT_NEAR(v, ref, ref * 1e-6);
}

// ---- rotary ----

struct RotaryCase {
  std::int64_t head, half;
  bool interleaved;
};

TEST(GqaRotary, NonInterleavedInterleavedAndPartial) {
  for (DType t : kFloatTypes) {
    for (RotaryCase rc : {RotaryCase{64, 32, false}, RotaryCase{64, 32, true}, RotaryCase{64, 16, false},
                          RotaryCase{64, 16, true}, RotaryCase{10, 1, false}, RotaryCase{10, 4, true}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " head=" + std::to_string(rc.head) +
                   " half=" + std::to_string(rc.half) + (rc.interleaved ? " interleaved" : ""));
      const std::int64_t max_len = 50;
      std::vector<float> cosv, sinv;
      for (std::int64_t p = 0; p < max_len; ++p)
        for (std::int64_t i = 0; i < rc.half; ++i) {
          const double a = p * std::pow(10000.0, -static_cast<double>(i) / rc.half);
          cosv.push_back(static_cast<float>(std::cos(a)));
          sinv.push_back(static_cast<float>(std::sin(a)));
        }
      const std::vector<std::byte> cb = as_type(cosv, t), sb = as_type(sinv, t);
      const gqa::RotaryTables tables{cb.data(), sb.data(), t, rc.half, rc.interleaved};
      for (std::int64_t pos : {0, 1, 17, 49}) {
        const std::vector<float> x0 = normal_floats(rc.head, 30 + static_cast<std::uint64_t>(pos));
        std::vector<float> x = x0;
        gqa::rotate_row(x.data(), tables, pos);
        std::vector<double> ref(x0.begin(), x0.end());
        for (std::int64_t i = 0; i < rc.half; ++i) {
          const double c = load_as_float(cb.data(), t, pos * rc.half + i),
                       s = load_as_float(sb.data(), t, pos * rc.half + i);
          const std::int64_t a = rc.interleaved ? 2 * i : i, b = rc.interleaved ? 2 * i + 1 : i + rc.half;
          ref[a] = x0[a] * c - x0[b] * s;
          ref[b] = x0[b] * c + x0[a] * s;
        }
        for (std::int64_t d = 0; d < rc.head; ++d) {
          // float32 products and one difference of values of magnitude ~|x|: a few float32 ulps of |x|.
          EXPECT_NEAR(x[d], ref[d], 4e-7 * (std::abs(x0[d]) + 4.0)) << "pos=" << pos << " d=" << d;
          if (d >= 2 * rc.half) EXPECT_EQ(x[d], x0[d]) << "dimension past rot must pass unchanged";
        }
      }
    }
  }
}

TEST(GqaRotary, PositionZeroIsIdentityAndRotationKeepsNorm) {
  const std::int64_t half = 8;
  std::vector<float> cosv(static_cast<std::size_t>(2 * half)), sinv(cosv.size());
  for (std::int64_t i = 0; i < half; ++i) {
    cosv[i] = 1.0f, sinv[i] = 0.0f;
    cosv[half + i] = std::cos(0.3f * (i + 1)), sinv[half + i] = std::sin(0.3f * (i + 1));
  }
  const gqa::RotaryTables tables{cosv.data(), sinv.data(), DType::f32, half, false};
  const std::vector<float> x0 = normal_floats(16, 5);
  std::vector<float> x = x0;
  gqa::rotate_row(x.data(), tables, 0);
  EXPECT_EQ(x, x0);
  gqa::rotate_row(x.data(), tables, 1);
  for (std::int64_t i = 0; i < half; ++i) {
    const double before = double(x0[i]) * x0[i] + double(x0[i + half]) * x0[i + half];
    const double after = double(x[i]) * x[i] + double(x[i + half]) * x[i + half];
    EXPECT_NEAR(after, before, 1e-5 * (before + 1));
  }
}

// ---- quantization ----

// The contract's formulas, written independently: q = clamp(round-half-even(x / scale)), packing byte
// ((x[2i] + 8) & 0xF) | ((x[2i+1] + 8) << 4), value = q * scale.
int expected_q(float x, float scale, int lo, int hi) {
  const float r = std::nearbyint(x * (1.0f / scale));
  return static_cast<int>(std::min<float>(std::max<float>(r, static_cast<float>(lo)), static_cast<float>(hi)));
}

TEST(GqaQuantize, Int8PerTensorAndPerChannelExact) {
  for (KvQuant quant : {KvQuant::PerTensor, KvQuant::PerChannel}) {
    const std::int64_t H = 40;
    std::vector<float> scales = quant == KvQuant::PerTensor ? std::vector<float>{0.031f} : normal_floats(H, 7, 0.01);
    for (float& s : scales) s = std::abs(s) + 0.005f;
    std::vector<float> x = normal_floats(H, 8, 2.0);
    x[0] = 1e9f, x[1] = -1e9f;  // clamps
    const gqa::CacheFormat f{{KvType::Int8, quant}, DType::f32, H};
    std::vector<std::byte> row(static_cast<std::size_t>(f.row_bytes()));
    gqa::store_row(x.data(), f, scales.data(), row.data());
    for (std::int64_t d = 0; d < H; ++d) {
      const float s = scales[quant == KvQuant::PerTensor ? 0 : d];
      EXPECT_EQ(static_cast<int>(reinterpret_cast<std::int8_t*>(row.data())[d]), expected_q(x[d], s, -128, 127)) << d;
    }
    EXPECT_EQ(static_cast<int>(reinterpret_cast<std::int8_t*>(row.data())[0]), 127);
    EXPECT_EQ(static_cast<int>(reinterpret_cast<std::int8_t*>(row.data())[1]), -128);
  }
}

TEST(GqaQuantize, TiesRoundToEven) {
  // scale 0.25: x / scale is exact, so these are true ties.
  const std::vector<float> x{0.125f, 0.375f, -0.125f, 0.625f, -0.375f, 31.875f, -32.125f};
  const int want8[] = {0, 2, 0, 2, -2, 127, -128};
  const int want4[] = {0, 2, 0, 2, -2, 7, -8};
  const float scale = 0.25f;
  for (KvType type : {KvType::Int8, KvType::Int4}) {
    const gqa::CacheFormat f{{type, KvQuant::PerTensor}, DType::f32, 7};
    std::vector<std::byte> row(static_cast<std::size_t>(f.row_bytes()));
    gqa::store_row(x.data(), f, &scale, row.data());
    for (std::int64_t d = 0; d < 7; ++d) {
      const int got = type == KvType::Int8 ? static_cast<int>(reinterpret_cast<std::int8_t*>(row.data())[d])
                                           : core::int4_at(reinterpret_cast<const std::uint8_t*>(row.data()), d);
      EXPECT_EQ(got, type == KvType::Int8 ? want8[d] : want4[d]) << core::kv_type_name(type) << " d=" << d;
    }
  }
}

TEST(GqaQuantize, Int4PackingByteAndOddHeadSize) {
  for (std::int64_t H : {16, 15, 1}) {
    for (KvQuant quant : {KvQuant::PerTensor, KvQuant::PerChannel}) {
      SCOPED_TRACE("H=" + std::to_string(H));
      std::vector<float> scales = quant == KvQuant::PerTensor ? std::vector<float>{0.4f} : normal_floats(H, 9, 0.1);
      for (float& s : scales) s = std::abs(s) + 0.1f;
      const std::vector<float> x = normal_floats(H, 11, 2.5);
      const gqa::CacheFormat f{{KvType::Int4, quant}, DType::f32, H};
      ASSERT_EQ(f.row_bytes(), (H + 1) / 2);
      ASSERT_EQ(f.row_values(), (H + 1) / 2 * 2);
      std::vector<std::byte> row(static_cast<std::size_t>(f.row_bytes()));
      gqa::store_row(x.data(), f, scales.data(), row.data());
      for (std::int64_t i = 0; i < (H + 1) / 2; ++i) {
        const int a = expected_q(x[2 * i], scales[quant == KvQuant::PerTensor ? 0 : 2 * i], -8, 7);
        const int b =
            2 * i + 1 < H ? expected_q(x[2 * i + 1], scales[quant == KvQuant::PerTensor ? 0 : 2 * i + 1], -8, 7) : 0;
        const int byte = ((a + 8) & 0xF) | ((b + 8) << 4);
        EXPECT_EQ(static_cast<int>(row[i]), byte) << "byte " << i;
        // The readers' unpacking gives the integers back.
        const auto* bytes = reinterpret_cast<const std::uint8_t*>(row.data());
        EXPECT_EQ(core::int4_at(bytes, 2 * i), a);
        EXPECT_EQ(core::int4_at(bytes, 2 * i + 1), b);
      }
    }
  }
}

TEST(GqaQuantize, Int4EveryValueRoundTripsThroughPackAndUnpack) {
  for (int a = -8; a <= 7; ++a)
    for (int b = -8; b <= 7; ++b) {
      const std::uint8_t byte = core::int4_pack(a, b);
      EXPECT_EQ(static_cast<int>(byte), ((a + 8) & 0xF) | ((b + 8) << 4));
      EXPECT_EQ(core::int4_at(&byte, 0), a);
      EXPECT_EQ(core::int4_at(&byte, 1), b);
    }
  EXPECT_EQ(core::int4_pack(0, 0), 0x88);
}

TEST(GqaQuantize, DequantizeIsOneFloat32Product) {
  for (int q : {-128, -8, -1, 0, 1, 7, 127}) {
    for (float s : {0.031f, 1.0f, 3.7e-5f}) EXPECT_EQ(core::dequantize_value(q, s), static_cast<float>(q) * s);
  }
  // load_kv reads every format the same way.
  const std::int8_t i8[] = {-5, 9};
  const float scales[] = {0.5f, 0.25f, 2.0f, 4.0f};  // per channel: kv head 1 starts at 2
  EXPECT_EQ(core::load_kv(i8, {KvType::Int8, KvQuant::PerChannel}, DType::f32, 1, scales, 1, 2, 1), 9 * 4.0f);
  const std::uint8_t i4[] = {core::int4_pack(-3, 6)};
  EXPECT_EQ(core::load_kv(i4, {KvType::Int4, KvQuant::PerTensor}, DType::f32, 1, scales, 0, 2, 1), 6 * 0.5f);
}

TEST(GqaQuantize, FloatCacheRowsRoundToTheirType) {
  for (DType t : kFloatTypes) {
    const std::vector<float> x = normal_floats(24, 3);
    const gqa::CacheFormat f{{}, t, 24};
    std::vector<std::byte> row(static_cast<std::size_t>(f.row_bytes()));
    gqa::store_row(x.data(), f, nullptr, row.data());
    for (std::int64_t d = 0; d < 24; ++d) EXPECT_EQ(load_as_float(row.data(), t, d), round_to(t, x[d]));
  }
}

TEST(GqaQuantize, ZeroRowsHoldTheValueZero) {
  for (KvType type : {KvType::Int8, KvType::Int4}) {
    const gqa::CacheFormat f{{type, KvQuant::PerTensor}, DType::f32, 7};
    std::vector<std::byte> rows(static_cast<std::size_t>(3 * f.row_bytes()), std::byte{0x13});
    gqa::zero_rows(rows.data(), f, 2);
    const float scale = 1.0f;
    for (std::int64_t v = 0; v < 2 * f.row_values(); ++v) {
      const std::int64_t row = v / f.row_values(), d = v % f.row_values();
      if (d >= 7) continue;
      EXPECT_EQ(core::load_kv(rows.data(), f.storage, DType::f32, row * f.row_values() + d, &scale, 0, 7, d), 0.0f);
    }
    for (std::int64_t i = 2 * f.row_bytes(); i < 3 * f.row_bytes(); ++i)
      EXPECT_EQ(rows[static_cast<std::size_t>(i)], std::byte{0x13});
  }
}

// ---- cache append ----

// A 1-batch, 1-head float32 cache of head size 2 whose row r holds (r, -r): appends are then easy to read.
struct TinyCache {
  std::int64_t capacity;
  std::vector<float> data;
  gqa::CacheTensor tensor() {
    return {reinterpret_cast<std::byte*>(data.data()), gqa::CacheFormat{{}, DType::f32, 2}, 1, capacity, nullptr};
  }
  float at(std::int64_t r) const { return data[static_cast<std::size_t>(2 * r)]; }
};
TinyCache numbered(std::int64_t capacity, float base) {
  TinyCache c{capacity, {}};
  for (std::int64_t r = 0; r < capacity; ++r) c.data.push_back(base + r), c.data.push_back(-(base + r));
  return c;
}
// New row s is (1000 + s, -(1000 + s)).
const auto kNewRow = [](std::int64_t s, float* x) { x[0] = 1000.0f + s, x[1] = -(1000.0f + s); };

TEST(GqaCacheAppend, SharedBufferAppendsInPlaceAndMovesNothingElse) {
  TinyCache c = numbered(8, 0.0f);
  float scratch[2];
  const gqa::CacheTensor t = c.tensor();
  gqa::append_head(&t, t, true, gqa::HeadAppend{3, 0, 3, 2}, 0, 0, kNewRow, scratch);
  const float want[] = {0, 1, 2, 1000, 1001, 5, 6, 7};
  for (std::int64_t r = 0; r < 8; ++r) EXPECT_EQ(c.at(r), want[r]) << r;
}

TEST(GqaCacheAppend, SeparateBuffersCopyPastAppendAndZeroTheRest) {
  TinyCache past = numbered(4, 10.0f);
  TinyCache present = numbered(7, 500.0f);  // junk the append must overwrite
  float scratch[2];
  const gqa::CacheTensor pt = past.tensor();
  gqa::append_head(&pt, present.tensor(), false, gqa::HeadAppend{3, 0, 3, 2}, 0, 0, kNewRow, scratch);
  const float want[] = {10, 11, 12, 1000, 1001, 0, 0};
  for (std::int64_t r = 0; r < 7; ++r) EXPECT_EQ(present.at(r), want[r]) << r;
  for (std::int64_t r = 0; r < 4; ++r) EXPECT_EQ(past.at(r), 10 + r) << "past must not change";
}

TEST(GqaCacheAppend, FullWindowCacheDropsItsOldestRowsFromTheFront) {
  // Shared: 5 rows, all holding tokens; 2 new ones: the 2 oldest go.
  TinyCache c = numbered(5, 0.0f);
  float scratch[2];
  const gqa::CacheTensor t = c.tensor();
  gqa::append_head(&t, t, true, gqa::HeadAppend{5, 2, 3, 2}, 0, 0, kNewRow, scratch);
  const float want[] = {2, 3, 4, 1000, 1001};
  for (std::int64_t r = 0; r < 5; ++r) EXPECT_EQ(c.at(r), want[r]) << r;
  // Separate: the same from a past buffer, into a present of 5.
  TinyCache past = numbered(5, 20.0f);
  TinyCache present = numbered(5, 500.0f);
  const gqa::CacheTensor pt = past.tensor();
  gqa::append_head(&pt, present.tensor(), false, gqa::HeadAppend{5, 3, 2, 1}, 0, 0, kNewRow, scratch);
  const float want2[] = {23, 24, 1000, 0, 0};
  for (std::int64_t r = 0; r < 5; ++r) EXPECT_EQ(present.at(r), want2[r]) << r;
}

TEST(GqaCacheAppend, QuantizedSeparateAppendZeroesWithTheFormatsZero) {
  const gqa::CacheFormat f{{KvType::Int4, KvQuant::PerTensor}, DType::f32, 3};  // odd: 2 bytes per row
  const float scale = 0.5f;
  std::vector<std::byte> present(static_cast<std::size_t>(4 * f.row_bytes()), std::byte{0x11});
  const gqa::CacheTensor t{present.data(), f, 1, 4, &scale};
  float scratch[3];
  gqa::append_head(
      nullptr, t, false, gqa::HeadAppend{0, 0, 0, 1}, 0, 0,
      [](std::int64_t, float* x) { x[0] = 1.0f, x[1] = -3.2f, x[2] = 9.0f; }, scratch);
  EXPECT_EQ(static_cast<int>(present[0]), ((2 + 8) & 0xF) | ((-6 + 8) << 4));
  EXPECT_EQ(static_cast<int>(present[1]), ((7 + 8) & 0xF) | (8 << 4)) << "9 / 0.5 clamps to 7; the pad nibble is 0";
  for (std::size_t i = 2; i < present.size(); ++i) EXPECT_EQ(static_cast<int>(present[i]), 0x88) << i;
}

}  // namespace
}  // namespace attnkit::test
