// Checks the GQA tests share (CPU and GPU): a present cache against the float64 reference's expectation.
#pragma once

#include <gtest/gtest.h>

#include "gqa_support.hpp"

namespace attnkit::test {

// A call's options in one line, for failure messages.
inline std::string describe(const GqaOptions& o) {
  std::string s = dtype_str(o.dtype) + " B=" + std::to_string(o.batch) + " S=" + std::to_string(o.seq) +
                  " N=" + std::to_string(o.heads) + " Nkv=" + std::to_string(o.kv_heads) +
                  " H=" + std::to_string(o.head_size) + " lengths=";
  for (auto l : o.lengths) s += std::to_string(l) + ",";
  s += std::string(o.has_past ? (o.shared ? " shared" : " separate") : " no-past") + (o.packed ? " packed" : "") +
       (o.rotary ? (o.interleaved ? " rotary-interleaved" : " rotary") : "") + (o.norm ? " norm" : "") +
       (o.position_ids ? " ids" : "") + (o.bias ? " bias" : "") + (o.head_sink ? " sink" : "") +
       (o.smooth_softmax == 1 ? " smooth" : "") + " window=" + std::to_string(o.window) +
       " causal=" + std::to_string(o.causal) + " softcap=" + std::to_string(o.softcap) + " K " + o.k_quant + " V " +
       o.v_quant + " bits=" + std::to_string(o.bits) + (o.sliding ? " sliding" : "") +
       " qk_output=" + std::to_string(o.qk_output);
  return s;
}


// output_qk against the reference's scores: -inf where the reference has it, else finite and within the dtype's
// scaled tolerance (both backends compute it in float64 and round once).
inline void check_qk(const GqaCall& c, const std::vector<double>& expected) {
  double diff = 0.0, top = 0.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double x = c.at(c.output_qk, static_cast<std::int64_t>(i));
    const double want = expected[i];
    if (std::isinf(want)) {
      ASSERT_EQ(x, want) << "output_qk element " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(x)) << "output_qk element " << i << " = " << x << ", reference " << want;
    if (want == 0.0 && x == 0.0) continue;
    diff = std::max(diff, std::abs(x - want));
    top = std::max(top, std::abs(want));
  }
  EXPECT_LE(top > 0 ? diff / top : diff, testing::tolerance(c.o.dtype)) << "output_qk";
}

// Compares a present cache with the reference's expectation: exact where no arithmetic made it (copies,
// zeros, untouched rows, V rows, and K rows without norm or rotary); a float K' row within one rounding of the
// type (the op computes norm and rotary in float32, the reference in float64, both then round to the type);
// a quantized value within one step of the reference's integer, and rarely so (a float32 x * (1 / scale)
// that lands on the other side of a .5 boundary than the float64 x / scale: the quantizer itself is checked
// exactly in gqa_units_test).
inline void check_cache(const GqaCall& c, const std::vector<double>& expected, const std::vector<std::byte>& got,
                 bool quantized, bool is_key, const char* name) {
  const bool transformed = is_key && (c.o.rotary || c.o.norm);
  std::int64_t off_by_one = 0, values = 0;
  const std::int64_t rows = c.o.batch * c.o.kv_heads * c.C;
  for (std::int64_t row = 0; row < rows; ++row) {
    for (std::int64_t d = 0; d < c.H; ++d, ++values) {
      const double want = expected[static_cast<std::size_t>(row * c.H + d)];
      if (quantized) {
        const int q = ref_quantized_at(got, c.o.bits, c.row_bytes(true), row, d);
        if (q == want) continue;
        ASSERT_LE(std::abs(q - want), 1) << name << " row " << row << " d " << d << ": " << q << " vs " << want;
        ++off_by_one;
        continue;
      }
      const double x = c.at(got, row * c.H + d);
      if (!transformed) {
        ASSERT_EQ(x, want) << name << " row " << row << " d " << d;
      } else {
        ASSERT_NEAR(x, want, testing::tolerance(c.o.dtype) * (std::abs(want) + 1.0))
            << name << " row " << row << " d " << d;
      }
    }
  }
  EXPECT_LE(off_by_one, values / 1000) << name << ": " << off_by_one << " of " << values << " values one step off";
}

}  // namespace attnkit::test
