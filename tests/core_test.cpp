// Unit tests of the numerics core every backend is built from: which keys a row sees (VisibilityRule),
// the online-softmax pieces (usable_max, rescale_factor, merge_weights, finish_row), the score
// transform (scale, softcap), the work split for whole rounds (split_for_soonest_finish) and the division by a
// launch-constant divisor (FastDivide).
#include <core/fast_divide.hpp>
#include <core/online_softmax.hpp>
#include <core/score_transform.hpp>
#include <core/visibility.hpp>
#include <core/work_rounds.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace attnkit::test {
namespace {

using core::finish_row;
using core::kNegInf;
using core::merge_weights;
using core::RowState;
using core::VisibilityRule;

// ---- VisibilityRule ----

// The rule written as a predicate, key by key, straight from the contract: key j is visible to row i when
// j < key_length, and with causal j <= i + offset, and with a window also j > i + offset - window.
bool visible(bool causal, std::int64_t offset, std::int64_t window, std::int64_t row, std::int64_t key_length,
             std::int64_t j) {
  if (j >= key_length) return false;
  if (causal && j > row + offset) return false;
  if (causal && window > 0 && j <= row + offset - window) return false;
  return true;
}

// for_row must return exactly the predicate's set (as one range) over every small combination, including
// negative offsets, windows wider than the keys, and key lengths of 0.
TEST(Core, VisibilityRuleMatchesThePredicate) {
  for (bool causal : {false, true})
    for (std::int64_t offset = -14; offset <= 14; ++offset)
      for (std::int64_t window : {0, 1, 2, 3, 5, 8, 100})
        for (std::int64_t row = 0; row <= 12; ++row)
          for (std::int64_t len = 0; len <= 11; ++len) {
            const VisibilityRule rule{causal, offset, window};
            const core::KeyRange r = rule.for_row(row, len);
            std::int64_t count = 0;
            for (std::int64_t j = -2; j <= len + 2; ++j) {
              const bool want = j >= 0 && visible(causal, offset, window, row, len, j);
              count += want;
              const bool got = !r.empty() && j >= r.begin && j < r.end;
              ASSERT_EQ(got, want) << "causal " << causal << " offset " << offset << " window " << window << " row " << row
                                   << " len " << len << " key " << j << " range [" << r.begin << ", " << r.end << ")";
            }
            EXPECT_EQ(r.empty(), count == 0);
            if (!r.empty()) {  // a non-empty range lies inside the keys
              EXPECT_GE(r.begin, 0);
              EXPECT_LE(r.end, len);
            }
          }
}

// sees_every_key holds exactly when every row from 0 up (12 of them here) sees all keys, windows and wide offsets
// included (it may say no for a window wider than every row's reach: it is a shortcut, never a wrong yes).
TEST(Core, VisibilityRuleSeesEveryKeyOnlyWhenNoKeyIsHidden) {
  for (bool causal : {false, true})
    for (std::int64_t offset = -3; offset <= 14; ++offset)
      for (std::int64_t window : {0, 1, 5, 100})
        for (std::int64_t len = 1; len <= 11; ++len) {
          const VisibilityRule rule{causal, offset, window};
          bool all = true;
          for (std::int64_t row = 0; row < 12; ++row) {
            const core::KeyRange r = rule.for_row(row, len);
            all = all && r.begin == 0 && r.end == len;
          }
          if (rule.sees_every_key(len)) {
            EXPECT_TRUE(all) << "causal " << causal << " offset " << offset << " window " << window << " len " << len;
          }
          if (window == 0) EXPECT_EQ(rule.sees_every_key(len), all) << causal << " " << offset << " " << len;
        }
}

TEST(Core, VisibilityRuleNamedCases) {
  const VisibilityRule none{};
  EXPECT_EQ(none.for_row(5, 10).begin, 0);
  EXPECT_EQ(none.for_row(5, 10).end, 10);
  EXPECT_TRUE(none.for_row(5, 0).empty());
  // Cached decoder: q_len 4, k_len 10, default offset 6: the last query sees every key.
  const VisibilityRule decoder{true, 6, 0};
  EXPECT_EQ(decoder.for_row(3, 10).end, 10);
  EXPECT_EQ(decoder.for_row(0, 10).end, 7);
  // Negative offset: the first rows see nothing.
  const VisibilityRule late{true, -3, 0};
  EXPECT_TRUE(late.for_row(2, 10).empty());
  EXPECT_EQ(late.for_row(3, 10).end, 1);
  // Window 1: only the diagonal key.
  const VisibilityRule diag{true, 0, 1};
  EXPECT_EQ(diag.for_row(4, 10).begin, 4);
  EXPECT_EQ(diag.for_row(4, 10).end, 5);
  // A key length below the window's start: nothing.
  EXPECT_TRUE((VisibilityRule{true, 0, 2}.for_row(9, 5).empty()));
}

// ---- online softmax ----

TEST(Core, UsableMaxAndRescaleFactor) {
  EXPECT_EQ(core::usable_max(kNegInf), 0.0f);
  EXPECT_EQ(core::usable_max(-3.5f), -3.5f);
  EXPECT_EQ(core::rescale_factor(kNegInf, kNegInf), 0.0f);  // a partial that saw nothing contributes nothing
  EXPECT_EQ(core::rescale_factor(kNegInf, 2.0f), 0.0f);
  EXPECT_EQ(core::rescale_factor(2.0f, 2.0f), 1.0f);
  EXPECT_FLOAT_EQ(core::rescale_factor(1.0f, 3.0f), std::exp(-2.0f));
  EXPECT_TRUE(std::isnan(core::rescale_factor(INFINITY, INFINITY)));  // +inf poisons: exp(inf - inf)
}

TEST(Core, MergeWeights) {
  const auto e = merge_weights(kNegInf, kNegInf);
  EXPECT_EQ(e.max, kNegInf);
  EXPECT_EQ(e.wa, 0.0f);  // exactly 0, not NaN: two empty partials merge into an empty one
  EXPECT_EQ(e.wb, 0.0f);
  const auto left = merge_weights(1.5f, kNegInf);
  EXPECT_EQ(left.max, 1.5f);
  EXPECT_EQ(left.wa, 1.0f);
  EXPECT_EQ(left.wb, 0.0f);
  const auto right = merge_weights(kNegInf, -4.0f);
  EXPECT_EQ(right.max, -4.0f);
  EXPECT_EQ(right.wa, 0.0f);
  EXPECT_EQ(right.wb, 1.0f);
  const auto ab = merge_weights(1.0f, 3.0f);
  EXPECT_EQ(ab.max, 3.0f);
  EXPECT_FLOAT_EQ(ab.wa, std::exp(-2.0f));
  EXPECT_EQ(ab.wb, 1.0f);
  const auto ba = merge_weights(3.0f, 1.0f);
  EXPECT_EQ(ba.max, 3.0f);
  EXPECT_EQ(ba.wa, 1.0f);
  EXPECT_FLOAT_EQ(ba.wb, std::exp(-2.0f));
}

// Partials over contiguous key ranges, merged in range order with merge_weights and finished with
// finish_row, give the softmax-weighted sum of the whole row (float64 reference, float32 pieces).
TEST(Core, MergedPartialsEqualTheWholeSoftmax) {
  std::mt19937_64 rng(8);
  std::normal_distribution<double> n(0.0, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int keys = 1 + trial % 97;
    std::vector<float> s(static_cast<std::size_t>(keys)), v(static_cast<std::size_t>(keys));
    for (int j = 0; j < keys; ++j) {
      s[static_cast<std::size_t>(j)] = trial % 5 == 0 && j % 3 == 0 ? kNegInf : static_cast<float>(n(rng));
      v[static_cast<std::size_t>(j)] = static_cast<float>(n(rng));
    }
    // float64 reference
    double m = -INFINITY;
    for (float x : s) m = std::max(m, static_cast<double>(x));
    double den = 0.0, num = 0.0;
    for (int j = 0; j < keys; ++j) {
      const double w = s[static_cast<std::size_t>(j)] == kNegInf ? 0.0 : std::exp(s[static_cast<std::size_t>(j)] - m);
      den += w;
      num += w * v[static_cast<std::size_t>(j)];
    }
    // partials of `range` keys each, merged in order
    const int range = 1 + trial % 13;
    RowState st;
    float acc = 0.0f;
    for (int b = 0; b < keys; b += range) {
      float pm = kNegInf;
      for (int j = b; j < std::min(keys, b + range); ++j) pm = std::max(pm, s[static_cast<std::size_t>(j)]);
      float ps = 0.0f, pa = 0.0f;
      for (int j = b; j < std::min(keys, b + range); ++j) {
        const float x = s[static_cast<std::size_t>(j)];
        const float w = x == kNegInf ? 0.0f : std::exp(x - core::usable_max(pm));
        ps += w;
        pa += w * v[static_cast<std::size_t>(j)];
      }
      const auto mw = merge_weights(st.max, pm);
      st.sum = st.sum * mw.wa + ps * mw.wb;
      acc = acc * mw.wa + pa * mw.wb;
      st.max = mw.max;
    }
    const auto fin = finish_row(st, false, 0.0f, MaskedRows::Nan);
    if (den == 0.0) {
      EXPECT_TRUE(std::isnan(fin.acc_scale));
      EXPECT_EQ(fin.lse, kNegInf);
      continue;
    }
    EXPECT_NEAR(acc * fin.acc_scale, num / den, 1e-5 * (1.0 + std::abs(num / den))) << "trial " << trial;
    EXPECT_NEAR(fin.lse, m + std::log(den), 1e-5 * (1.0 + std::abs(m))) << "trial " << trial;
  }
}

TEST(Core, FinishRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A row that saw a visible NaN or +inf: NaN output and LSE, with or without a sink, in either mode.
  for (bool sink : {false, true})
    for (MaskedRows mr : {MaskedRows::Nan, MaskedRows::Zero}) {
      const auto f = finish_row(RowState{2.0f, 3.0f, true}, sink, 1.0f, mr);
      EXPECT_TRUE(std::isnan(f.acc_scale));
      EXPECT_TRUE(std::isnan(f.lse));
    }
  // No visible key, no sink: NaN or 0, LSE -inf.
  const auto empty_nan = finish_row(RowState{}, false, nan, MaskedRows::Nan);
  EXPECT_TRUE(std::isnan(empty_nan.acc_scale));
  EXPECT_EQ(empty_nan.lse, kNegInf);
  const auto empty_zero = finish_row(RowState{}, false, nan, MaskedRows::Zero);
  EXPECT_EQ(empty_zero.acc_scale, 0.0f);
  EXPECT_EQ(empty_zero.lse, kNegInf);
  // No visible key with a sink: the denominator is exp(0) = 1 and the accumulator is scaled by 0: zeros,
  // LSE = the sink, in both modes.
  for (MaskedRows mr : {MaskedRows::Nan, MaskedRows::Zero}) {
    const auto f = finish_row(RowState{}, true, -2.25f, mr);
    EXPECT_EQ(f.acc_scale, 0.0f);
    EXPECT_EQ(f.lse, -2.25f);
  }
  // Plain: out = acc / sum, LSE = max + log(sum).
  const auto plain = finish_row(RowState{1.5f, 2.0f, false}, false, 0.0f, MaskedRows::Nan);
  EXPECT_EQ(plain.acc_scale, 0.5f);
  EXPECT_FLOAT_EQ(plain.lse, 1.5f + std::log(2.0f));
  // A sink above the max: the running state moves onto the sink's max.
  {
    const double factor = std::exp(2.0 - 5.0), sum = 3.0 * factor + 1.0;
    const auto f = finish_row(RowState{2.0f, 3.0f, false}, true, 5.0f, MaskedRows::Nan);
    EXPECT_NEAR(f.acc_scale, factor / sum, 1e-6 * factor / sum);
    EXPECT_NEAR(f.lse, 5.0 + std::log(sum), 1e-6);
  }
  // A sink below the max: it only adds exp(sink - max) to the denominator.
  {
    const double sum = 3.0 + std::exp(-1.0 - 2.0);
    const auto f = finish_row(RowState{2.0f, 3.0f, false}, true, -1.0f, MaskedRows::Nan);
    EXPECT_NEAR(f.acc_scale, 1.0 / sum, 1e-6);
    EXPECT_NEAR(f.lse, 2.0 + std::log(sum), 1e-6);
  }
}

// ---- score transform ----

TEST(Core, ScoreTransform) {
  const core::ScoreTransform plain{0.125f, 0.0f};
  EXPECT_EQ(plain(8.0f), 1.0f);
  EXPECT_EQ(plain.apply(8.0), 1.0);
  EXPECT_EQ(plain(-1e30f), -1.25e29f);  // no cap: unbounded
  const core::ScoreTransform capped{1.0f, 5.0f};
  for (float x : {-100.0f, -5.0f, -0.5f, 0.0f, 0.5f, 5.0f, 100.0f}) {
    EXPECT_NEAR(capped(x), 5.0 * std::tanh(x / 5.0), 1e-6 * 5.0) << x;
    EXPECT_NEAR(capped.apply(x), 5.0 * std::tanh(x / 5.0), 1e-12) << x;
    EXPECT_LE(std::abs(capped(x)), 5.0f);
  }
  EXPECT_EQ(capped(INFINITY), 5.0f);  // the cap bounds even +inf: a capped score never poisons a row
  EXPECT_TRUE(std::isnan(capped(std::numeric_limits<float>::quiet_NaN())));
  // The scale applies before the cap.
  const core::ScoreTransform both{0.5f, 2.0f};
  EXPECT_NEAR(both(3.0f), 2.0 * std::tanh(1.5 / 2.0), 1e-6);
}

// The CUDA plan's decode splits on the H200 (132 SMs): the wgmma kernel holds 1 block per SM, the mma.sync
// kernel 2.
TEST(Core, SplitForSoonestFinish) {
  EXPECT_DOUBLE_EQ(core::round_fill(132, 132), 1.0);
  EXPECT_DOUBLE_EQ(core::round_fill(133, 132), 133.0 / 264.0);
  EXPECT_DOUBLE_EQ(core::round_fill(0, 132), 0.0);
  const auto parts = [](std::int64_t items, std::int64_t workers, std::int64_t tiles, std::int64_t least,
                        std::int64_t most) { return core::split_for_soonest_finish(items, workers, tiles, least, most).parts; };
  // batch 64 x 8 K/V heads over 32 tiles: 512 blocks fill 3.9 rounds of 132 already.
  EXPECT_EQ(parts(512, 132, 32, 1, 16), 1);
  // batch 8 x 8 K/V heads over 256 tiles: 64 blocks are half a round; 2 ranges (97% of one round), not 4 (two).
  EXPECT_EQ(parts(64, 132, 256, 1, 64), 2);
  EXPECT_EQ(parts(64, 264, 256, 1, 64), 4);
  // Batch 1 x 8 K/V heads over 64 tiles: 16 ranges of 4 tiles (128 blocks), not 15 of 4.5 (120 blocks that each
  // run 5 tiles) nor 32 of 2 (two rounds).
  const core::TileSplit b1 = core::split_for_soonest_finish(8, 132, 64, 1, 32);
  EXPECT_EQ(b1.parts, 16);
  EXPECT_EQ(b1.tiles_per_part, 4);
  // Counts that whole tiles cannot make give fewer ranges: 7 tiles in at most 5 ranges are 4 of 2 tiles.
  const core::TileSplit odd = core::split_for_soonest_finish(1, 132, 7, 5, 5);
  EXPECT_EQ(odd.parts, 4);
  EXPECT_EQ(odd.tiles_per_part, 2);
  // A lower bound (the decode kernel's range limit) is kept even when fewer ranges would finish sooner.
  EXPECT_EQ(parts(64, 132, 128, 32, 64), 32);
  // Equal finishes: the fewer ranges (80 blocks whole, or 160 in two rounds of half the tiles).
  EXPECT_EQ(parts(80, 132, 2, 1, 2), 1);
  // Nothing to cut.
  EXPECT_EQ(parts(0, 132, 8, 1, 4), 1);
}

// ---- FastDivide ----

// Quotient and remainder against the division operator: every divisor up to 4096 over dividends near the
// multiples of the divisor (where a wrong multiplier shows first) and near 2^31, random divisors up to 2^31 - 1
// over random dividends.
TEST(FastDivide, MatchesIntegerDivisionOverTheWholeDividendRange) {
  const auto check = [](std::uint32_t d, std::uint32_t n) {
    const core::FastDivide f(d);
    const std::uint32_t q = f.quotient(n);
    ASSERT_EQ(q, n / d) << "n = " << n << ", d = " << d;
    ASSERT_EQ(f.remainder(n, q), n % d) << "n = " << n << ", d = " << d;
  };
  constexpr std::uint32_t kMaxDividend = 0x7fffffffu;
  for (std::uint32_t d = 1; d <= 4096; ++d) {
    for (std::uint32_t k : {0u, 1u, 2u, 3u, 1000u, kMaxDividend / d - 1, kMaxDividend / d}) {
      for (std::int64_t delta = -2; delta <= 2; ++delta) {
        const std::int64_t n = static_cast<std::int64_t>(k) * d + delta;
        if (n >= 0 && n <= kMaxDividend) check(d, static_cast<std::uint32_t>(n));
      }
    }
    check(d, kMaxDividend);
  }
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<std::uint32_t> divisor(1, kMaxDividend), dividend(0, kMaxDividend);
  for (int i = 0; i < 200000; ++i) check(divisor(rng), dividend(rng));
  for (std::uint32_t shift = 0; shift < 31; ++shift) {  // powers of two and their neighbours
    for (std::uint32_t d : {1u << shift, (1u << shift) + 1, (1u << shift) - 1}) {
      if (d == 0) continue;
      for (int i = 0; i < 200; ++i) check(d, dividend(rng));
    }
  }
}

}  // namespace
}  // namespace attnkit::test
