// Special values of the contract: a hidden key has weight exactly 0; a row with no visible key gives NaN
// (default) or zeros (MaskedRows::Zero) and LSE -inf; k_len == 0 is such a row; NaN or +inf in a visible
// score gives NaN for that row only; a sink with no visible key gives zeros; causal offsets at the ends of
// their range (int64 for the problem's, int32 per batch entry) mean "every key" / "no key".
//
// These use hand-made inputs (test_support.hpp's Manual) so that each special value sits exactly where the
// test wants it, and every test runs in all three dtypes.
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <functional>

namespace attnkit::test {
namespace {

using testing::tolerance;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// The largest finite value of each dtype (what "huge" means for a V row that must not matter).
float huge(DType t) { return t == DType::f16 ? 65504.0f : 3.0e38f; }

std::string dname(DType t) { return std::string(dtype_name(t)); }

bool row_is(const Manual& m, std::int64_t b, std::int64_t h, std::int64_t i, const std::function<bool(float)>& pred) {
  for (std::int64_t d = 0; d < m.p.v_head_dim; ++d)
    if (!pred(m.out(b, h, i, d))) return false;
  return true;
}
bool is_nan(float x) { return std::isnan(x); }
bool is_zero(float x) { return x == 0.0f; }
bool is_finite(float x) { return std::isfinite(x); }

// Rows the test expects to be special are checked by the caller; every other row must be finite and, with
// the special rows skipped, match the float64 reference at the contract tolerance.
void expect_other_rows_match(Manual& m, const cpu::ReferenceResult& ref,
                             const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& special) {
  std::size_t at = 0;
  double diff = 0.0, top = 0.0;
  for (std::int64_t b = 0; b < m.p.batch; ++b)
    for (std::int64_t h = 0; h < m.p.heads; ++h)
      for (std::int64_t i = 0; i < m.p.q_len; ++i) {
        if (special(b, h, i)) {
          at += static_cast<std::size_t>(m.p.v_head_dim);
          continue;
        }
        for (std::int64_t d = 0; d < m.p.v_head_dim; ++d, ++at) {
          const float x = m.out(b, h, i, d);
          ASSERT_TRUE(std::isfinite(x)) << "row (" << b << ", " << h << ", " << i << ") is not special but has " << x;
          diff = std::max(diff, std::abs(x - ref.out[at]));
          top = std::max(top, std::abs(ref.out[at]));
        }
        if (m.p.return_lse) {
          const double r = ref.lse[static_cast<std::size_t>((b * m.p.heads + h) * m.p.q_len + i)];
          EXPECT_NEAR(m.lse_at(b, h, i), r, cpu_lse_tolerance(m.p.dtype) * std::max(1.0, std::abs(r))) << b << " " << h << " " << i;
        }
      }
  EXPECT_LE(top > 0 ? diff / top : diff, tolerance(m.p.dtype));
}

// ---- a hidden key has weight exactly 0 ----

// How the keys get hidden. Each variant hides a set of keys from *every* row, so their V rows may hold
// anything without changing the output: the output bytes with those V rows at 0, at +huge and at
// alternating +-huge must be identical (any nonzero weight, however small, times 3e38 would show).
struct Hiding {
  const char* name;
  std::int64_t q_len, k_len;
  std::function<void(Manual&)> setup;
  std::function<bool(std::int64_t key)> hidden;  // hidden from every row
};

std::vector<Hiding> hidings() {
  const std::vector<std::int64_t> masked{0, 5, 63, 64, 100, 127, 128, 149};
  auto in = [](const std::vector<std::int64_t>& v, std::int64_t j) { return std::find(v.begin(), v.end(), j) != v.end(); };
  return {
      {"mask -inf (tile edges)", 70, 150,
       [=](Manual& m) {
         m.add_mask();
         for (std::int64_t b = 0; b < m.p.batch; ++b)
           for (std::int64_t h = 0; h < m.p.heads; ++h)
             for (std::int64_t i = 0; i < m.p.q_len; ++i)
               for (std::int64_t j : masked) m.mask_at(b, h, i, j) = -kInf;
       },
       [=](std::int64_t j) { return in(masked, j); }},
      {"mask -inf, split-K decode", 1, 1300,
       [](Manual& m) {
         m.add_mask();
         for (std::int64_t b = 0; b < m.p.batch; ++b)
           for (std::int64_t h = 0; h < m.p.heads; ++h)
             for (std::int64_t j = 0; j < m.p.k_len; j += 7) m.mask_at(b, h, 0, j) = -kInf;
       },
       [](std::int64_t j) { return j % 7 == 0; }},
      {"key length 90 (mid-tile)", 70, 150, [](Manual& m) { m.add_key_lengths(90); },
       [](std::int64_t j) { return j >= 90; }},
      {"causal offset 90, q_len 5", 5, 150,
       [](Manual& m) {
         m.p.causal = true;
         m.p.causal_offset = 90;
       },
       [](std::int64_t j) { return j > 4 + 90; }},
      {"window 20 at offset 90", 5, 150,
       [](Manual& m) {
         m.p.causal = true;
         m.p.causal_offset = 90;
         m.p.window = 20;
       },
       [](std::int64_t j) { return j < 0 + 90 + 1 - 20 || j > 4 + 90; }},
  };
}

void fill_hidden_v(Manual& m, const Hiding& hd, float value, bool alternate) {
  for (std::int64_t b = 0; b < m.p.batch; ++b)
    for (std::int64_t h = 0; h < m.p.kv_heads; ++h)
      for (std::int64_t j = 0; j < m.p.k_len; ++j)
        if (hd.hidden(j))
          for (std::int64_t d = 0; d < m.p.v_head_dim; ++d)
            m.set(m.v, m.v_at(b, h, j, d), alternate && ((j + d) % 2) ? -value : value);
}

TEST(SpecialValues, HiddenKeyHasWeightExactlyZero) {
  for (const Hiding& hd : hidings()) {
    for (DType t : kDtypes) {
      SCOPED_TRACE(std::string(hd.name) + " " + dname(t));
      Manual m(2, 4, 2, hd.q_len, hd.k_len, 24, 12, t);
      m.randomize(11);
      m.p.return_lse = true;
      hd.setup(m);
      fill_hidden_v(m, hd, 0.0f, false);
      const auto ref = m.reference();
      m.run();
      const std::vector<std::byte> zero_o = m.o;
      const std::vector<float> zero_lse = m.lse;
      EXPECT_LE(m.scaled_error(ref), tolerance(t));
      EXPECT_TRUE(row_is(m, 1, 3, hd.q_len - 1, is_finite));

      fill_hidden_v(m, hd, huge(t), false);
      m.run();
      EXPECT_TRUE(m.o == zero_o) << "a hidden key's V row (+huge) changed the output";
      EXPECT_EQ(std::memcmp(m.lse.data(), zero_lse.data(), m.lse.size() * 4), 0);

      fill_hidden_v(m, hd, huge(t), true);
      m.run();
      EXPECT_TRUE(m.o == zero_o) << "a hidden key's V row (+-huge) changed the output";
    }
  }
}

// The reference never reads the V row of a key whose weight is 0 ("its V is never read"), so +inf or NaN
// there leaves its output finite. The kernel must agree: a hidden key contributes nothing, whatever its V
// holds (the seed: "V is not inspected").
TEST(SpecialValues, HiddenKeyNonFiniteValueRowIsIgnored) {
  for (const Hiding& hd : hidings()) {
    for (DType t : kDtypes) {
      for (float bad : {kInf, kNaN}) {
        SCOPED_TRACE(std::string(hd.name) + " " + dname(t) + " V=" + std::to_string(bad));
        Manual m(1, 2, 2, hd.q_len, hd.k_len, 16, 8, t);
        m.randomize(12);
        hd.setup(m);
        fill_hidden_v(m, hd, 0.0f, false);
        m.run();
        const std::vector<std::byte> zero_o = m.o;
        fill_hidden_v(m, hd, bad, false);
        const auto ref = m.reference();
        m.run();
        // The last row of batch entry 0, head 1: finite in the reference (which never reads a hidden key's V).
        const std::size_t row = static_cast<std::size_t>((0 * m.p.heads + 1) * hd.q_len + hd.q_len - 1) * 8;
        EXPECT_TRUE(row_is(m, 0, 1, hd.q_len - 1, is_finite))
            << "output " << m.out(0, 1, hd.q_len - 1, 0) << ", reference " << ref.out[row];
        EXPECT_TRUE(m.o == zero_o) << "a hidden key's non-finite V row changed the output";
      }
    }
  }
}

// The same where the key is hidden from some rows only (causal): key 50's V row is +inf or NaN; rows 0..49
// do not see key 50 and must be finite and match the reference (rows >= 50 see it; the contract says nothing
// about a non-finite V they see, so they are not checked).
TEST(SpecialValues, CausallyHiddenKeyNonFiniteValueRowIsIgnored) {
  for (DType t : kDtypes) {
    for (float bad : {kInf, kNaN}) {
      SCOPED_TRACE(dname(t) + " V=" + std::to_string(bad));
      Manual m(1, 2, 1, 100, 100, 16, 8, t);
      m.randomize(13);
      m.p.causal = true;
      for (std::int64_t d = 0; d < 8; ++d) m.set(m.v, m.v_at(0, 0, 50, d), bad);
      const auto ref = m.reference();
      m.run();
      expect_other_rows_match(m, ref, [](std::int64_t, std::int64_t, std::int64_t i) { return i >= 50; });
    }
  }
}

// ---- rows with no visible key ----

TEST(SpecialValues, RowWithNoVisibleKeyGivesNanOrZerosAndLseMinusInf) {
  struct Way {
    const char* name;
    std::function<void(Manual&)> setup;
    std::function<bool(std::int64_t b, std::int64_t h, std::int64_t i)> empty;
  };
  const std::vector<Way> ways{
      {"mask row all -inf",
       [](Manual& m) {
         m.add_mask();
         for (std::int64_t j = 0; j < m.p.k_len; ++j) {
           m.mask_at(0, 1, 3, j) = -kInf;
           m.mask_at(1, 0, 66, j) = -kInf;
         }
       },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return (b == 0 && h == 1 && i == 3) || (b == 1 && h == 0 && i == 66); }},
      {"key length 0 for batch entry 1",
       [](Manual& m) {
         m.add_key_lengths(static_cast<std::int32_t>(m.p.k_len));
         m.lengths[1] = 0;
       },
       [](std::int64_t b, std::int64_t, std::int64_t) { return b == 1; }},
      {"causal offset -10: rows 0..9 see nothing",
       [](Manual& m) {
         m.p.causal = true;
         m.p.causal_offset = -10;
       },
       [](std::int64_t, std::int64_t, std::int64_t i) { return i < 10; }},
      // Per-batch offsets at the ends of int32: batch entry 0 sees every key, batch entry 1 none.
      {"per-batch causal offsets INT32_MAX / INT32_MIN",
       [](Manual& m) {
         m.add_causal_offsets(0);
         m.offsets = {std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()};
       },
       [](std::int64_t b, std::int64_t, std::int64_t) { return b == 1; }},
      {"per-batch causal offsets -5 / -80",
       [](Manual& m) {
         m.add_causal_offsets(0);
         m.offsets = {-5, -80};
       },
       [](std::int64_t b, std::int64_t, std::int64_t i) { return b == 1 || i < 5; }},
      {"window + key length: rows past the length see nothing",
       [](Manual& m) {
         m.p.causal = true;
         m.p.causal_offset = 0;
         m.p.window = 4;
         m.add_key_lengths(40);
       },
       [](std::int64_t, std::int64_t, std::int64_t i) { return i >= 40 + 4 - 1; }},
  };
  for (const Way& w : ways) {
    for (DType t : kDtypes) {
      for (MaskedRows mr : {MaskedRows::Nan, MaskedRows::Zero}) {
        SCOPED_TRACE(std::string(w.name) + " " + dname(t) + (mr == MaskedRows::Nan ? " nan" : " zero"));
        Manual m(2, 2, 1, 70, 100, 16, 20, t);
        m.randomize(21);
        m.p.masked_rows = mr;
        m.p.return_lse = true;
        w.setup(m);
        const auto ref = m.reference();
        m.run();
        std::int64_t empty_rows = 0;
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t h = 0; h < 2; ++h)
            for (std::int64_t i = 0; i < 70; ++i) {
              if (!w.empty(b, h, i)) continue;
              ++empty_rows;
              EXPECT_TRUE(row_is(m, b, h, i, mr == MaskedRows::Nan ? is_nan : is_zero)) << b << " " << h << " " << i;
              EXPECT_EQ(m.lse_at(b, h, i), -kInf) << b << " " << h << " " << i;
            }
        EXPECT_GT(empty_rows, 0);
        expect_other_rows_match(m, ref, w.empty);
      }
    }
  }
}

// causal_offset is an int64 with no range rule, so its extremes are valid input: INT64_MAX means every key
// is visible to every row (j <= i + offset always holds), INT64_MIN that no key is. The output must be
// that of the non-causal problem, resp. all NaN with LSE -inf, and computing the limit i + offset (+ 1)
// must not overflow.
TEST(SpecialValues, CausalOffsetAtTheInt64Limits) {
  for (DType t : kDtypes) {
    for (bool with_window : {false, true}) {
      SCOPED_TRACE(dname(t) + (with_window ? " window 5" : ""));
      Manual m(1, 2, 2, 70, 100, 16, 8, t);
      m.randomize(61);
      m.p.return_lse = true;
      const auto open = m.reference();  // not causal: every key visible
      m.p.causal = true;
      if (with_window) m.p.window = 5;
      m.p.causal_offset = std::numeric_limits<std::int64_t>::max();
      m.run();
      if (with_window) {
        // The window ends at the causal limit, far past the keys: nothing is left.
        for (std::int64_t i = 0; i < 70; ++i) EXPECT_TRUE(row_is(m, 0, 0, i, is_nan)) << i;
      } else {
        expect_other_rows_match(m, open, [](std::int64_t, std::int64_t, std::int64_t) { return false; });
      }
      m.p.causal_offset = std::numeric_limits<std::int64_t>::min();
      m.run();
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 70; ++i) {
          EXPECT_TRUE(row_is(m, 0, h, i, is_nan)) << h << " " << i;
          EXPECT_EQ(m.lse_at(0, h, i), -kInf) << h << " " << i;
        }
    }
  }
}

// k_len == 0: every row is empty; K and V may be null (nothing of them is reached).
TEST(SpecialValues, NoKeysAtAll) {
  for (DType t : kDtypes) {
    for (MaskedRows mr : {MaskedRows::Nan, MaskedRows::Zero}) {
      for (bool split_sized : {false, true}) {
        SCOPED_TRACE(dname(t) + (mr == MaskedRows::Nan ? " nan" : " zero") + (split_sized ? " q_len 1" : " q_len 70"));
        // q_len 1 with few heads is the shape that would be split if it had keys.
        Manual m(2, 3, 1, split_sized ? 1 : 70, 0, 8, 5, t);
        m.randomize(3);
        m.p.masked_rows = mr;
        m.p.return_lse = true;
        m.poison();
        AttentionArgs a = m.args();
        a.k = {};
        a.v = {};
        Attention(m.p).run(a);
        for (std::int64_t b = 0; b < m.p.batch; ++b)
          for (std::int64_t h = 0; h < m.p.heads; ++h)
            for (std::int64_t i = 0; i < m.p.q_len; ++i) {
              EXPECT_TRUE(row_is(m, b, h, i, mr == MaskedRows::Nan ? is_nan : is_zero));
              EXPECT_EQ(m.lse_at(b, h, i), -kInf);
            }
        // The NaN written is the kernel's, not the poison left behind.
        if (mr == MaskedRows::Nan) {
          std::vector<std::byte> written = m.o;
          m.poison();
          EXPECT_FALSE(written == m.o);
        }
      }
    }
  }
}

// ---- NaN or +inf in a visible score: NaN for that row only ----

TEST(SpecialValues, NanOrInfScorePoisonsOnlyItsRow) {
  struct Poison {
    const char* name;
    std::int64_t q_len, k_len;
    std::function<void(Manual&)> setup;
    std::function<bool(std::int64_t b, std::int64_t h, std::int64_t i)> poisoned;
  };
  const std::vector<Poison> cases{
      {"NaN in Q", 70, 100, [](Manual& m) { m.set(m.q, m.q_at(0, 1, 3, 2), kNaN); },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return b == 0 && h == 1 && i == 3; }},
      {"+inf in Q", 70, 100, [](Manual& m) { m.set(m.q, m.q_at(1, 2, 65, 0), kInf); },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return b == 1 && h == 2 && i == 65; }},
      {"+inf in the mask", 70, 100,
       [](Manual& m) {
         m.add_mask();
         m.mask_at(0, 0, 2, 40) = kInf;
       },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return b == 0 && h == 0 && i == 2; }},
      {"NaN in the mask (last key)", 70, 100,
       [](Manual& m) {
         m.add_mask();
         m.mask_at(1, 3, 69, 99) = kNaN;
       },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return b == 1 && h == 3 && i == 69; }},
      {"NaN in the mask, split-K decode", 1, 1300,
       [](Manual& m) {
         m.add_mask();
         m.mask_at(0, 0, 0, 1000) = kNaN;
       },
       [](std::int64_t b, std::int64_t h, std::int64_t) { return b == 0 && h == 0; }},
      {"+inf in the mask, split-K decode, first key", 1, 1300,
       [](Manual& m) {
         m.add_mask();
         m.mask_at(1, 2, 0, 0) = kInf;
       },
       [](std::int64_t b, std::int64_t h, std::int64_t) { return b == 1 && h == 2; }},
      // K row 50 of K/V head 0 is NaN: with causal offset 0, query rows i >= 50 of heads 0 and 1 (which read
      // K/V head 0) see it; rows below 50 do not.
      {"NaN in K, causal", 70, 100,
       [](Manual& m) {
         m.set(m.k, m.k_at(0, 0, 50, 1), kNaN);
         m.p.causal = true;
         m.p.causal_offset = 0;
       },
       [](std::int64_t b, std::int64_t h, std::int64_t i) { return b == 0 && h < 2 && i >= 50; }},
      // A NaN in a score the structural rules hide is not a visible score: it poisons nothing.
      {"NaN in the mask at a causally hidden key", 70, 100,
       [](Manual& m) {
         m.add_mask();
         m.p.causal = true;
         m.p.causal_offset = 0;
         m.mask_at(0, 0, 10, 11) = kNaN;
         m.mask_at(0, 0, 10, 99) = kInf;
       },
       [](std::int64_t, std::int64_t, std::int64_t) { return false; }},
      {"NaN in the mask past the key length", 70, 100,
       [](Manual& m) {
         m.add_mask();
         m.add_key_lengths(64);
         m.mask_at(1, 1, 5, 64) = kNaN;
       },
       [](std::int64_t, std::int64_t, std::int64_t) { return false; }},
  };
  for (const Poison& c : cases) {
    for (DType t : kDtypes) {
      SCOPED_TRACE(std::string(c.name) + " " + dname(t));
      Manual m(2, 4, 2, c.q_len, c.k_len, 16, 12, t);
      m.randomize(31);
      m.p.return_lse = true;
      c.setup(m);
      const auto ref = m.reference();
      m.run();
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t h = 0; h < 4; ++h)
          for (std::int64_t i = 0; i < c.q_len; ++i)
            if (c.poisoned(b, h, i)) {
              EXPECT_TRUE(row_is(m, b, h, i, is_nan)) << b << " " << h << " " << i;
              EXPECT_TRUE(std::isnan(m.lse_at(b, h, i))) << b << " " << h << " " << i;
            }
      expect_other_rows_match(m, ref, c.poisoned);
    }
  }
}

// ---- head sink ----

// A sink joins the denominator, so a row with a sink and no visible key has a denominator of exp(0) = 1 and
// a numerator of 0: zeros, whichever MaskedRows is asked for, and LSE = the sink logit.
TEST(SpecialValues, SinkWithNoVisibleKeyGivesZeros) {
  for (DType t : kDtypes) {
    for (MaskedRows mr : {MaskedRows::Nan, MaskedRows::Zero}) {
      for (std::int64_t k_len : {0, 100, 1300}) {
        SCOPED_TRACE(dname(t) + " k_len " + std::to_string(k_len) + (mr == MaskedRows::Nan ? " nan" : " zero"));
        const std::int64_t q_len = k_len == 1300 ? 1 : 9;
        Manual m(2, 3, 3, q_len, k_len, 16, 8, t);
        m.randomize(41);
        m.p.masked_rows = mr;
        m.p.return_lse = true;
        m.add_sink(0.0f);
        m.sink = {-1.5f, 0.25f, 7.0f};
        m.add_key_lengths(static_cast<std::int32_t>(k_len));
        m.lengths[0] = 0;  // batch entry 0 sees nothing
        if (k_len > 0) {   // and row 1 of batch entry 1, head 2, is masked out entirely
          m.add_mask();
          for (std::int64_t j = 0; j < k_len; ++j) m.mask_at(1, 2, q_len - 1, j) = -kInf;
        }
        auto empty = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
          return b == 0 || k_len == 0 || (b == 1 && h == 2 && i == q_len - 1);
        };
        const auto ref = m.reference();
        m.run();
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t h = 0; h < 3; ++h)
            for (std::int64_t i = 0; i < q_len; ++i)
              if (empty(b, h, i)) {
                EXPECT_TRUE(row_is(m, b, h, i, is_zero)) << b << " " << h << " " << i;
                EXPECT_FLOAT_EQ(m.lse_at(b, h, i), m.sink[static_cast<std::size_t>(h)]) << b << " " << h << " " << i;
              }
        expect_other_rows_match(m, ref, empty);
      }
    }
  }
}

// One visible key: its weight is 1 (up to rounding), so the row is that key's V row.
TEST(SpecialValues, SingleVisibleKeyGivesItsValueRow) {
  for (DType t : kDtypes) {
    SCOPED_TRACE(dname(t));
    Manual m(1, 2, 2, 3, 200, 16, 10, t);
    m.randomize(51);
    m.add_mask();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 200; ++j)
          if (j != 130 + i) m.mask_at(0, h, i, j) = -kInf;
    m.run();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t d = 0; d < 10; ++d) {
          const float v = m.get(m.v, m.v_at(0, h, 130 + i, d));
          EXPECT_NEAR(m.out(0, h, i, d), v, tolerance(t) * std::abs(v)) << h << " " << i << " " << d;
        }
  }
}

}  // namespace
}  // namespace attnkit::test
