// Helpers the test files share: a one-line description of a case (for SCOPED_TRACE), a run that checks
// everything a run must leave behind (accuracy, LSE, gaps, every reached element written), and a small
// hand-made problem whose inputs a test sets element by element (special values, bad input, rising scores).
#pragma once

#include <testing/case_data.hpp>
#include <testing/cases.hpp>

#include <attnkit/attention.hpp>

#include <core/problem_check.hpp>
#include <cpu/reference.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace attnkit::test {

using testing::CaseData;
using testing::CaseSpec;

// The LSE is computed in float32 from the same (already rounded) inputs whatever the element type, so one
// bound serves every dtype. lse_error() is |lse - ref| / max(1, |ref|): a few float32 ulps of the max plus
// the rounding of log(sum); 1e-5 is the float32 output bound of the contract, applied to the LSE.
inline constexpr double kLseTolerance = 1e-5;
using testing::cpu_lse_tolerance;

inline std::string spec_string(const CaseSpec& s) {
  std::ostringstream o;
  o << s.name << ": B=" << s.batch << " H=" << s.heads << " Hkv=" << s.kv_heads << " Q=" << s.q_len
    << " K=" << s.k_len << " D=" << s.head_dim << " Dv=" << s.v_head_dim << " layout=" << testing::layout_name(s.layout)
    << " mask=" << testing::mask_name(s.mask) << " key_lengths="
    << (s.key_lengths == testing::KeyLengths::None ? "none"
                                                   : s.key_lengths == testing::KeyLengths::Random ? "random" : "zero")
    << " causal=" << s.causal;
  if (s.causal_offset) o << " offset=" << *s.causal_offset;
  if (s.causal_offsets) o << " per-batch-offsets";
  if (s.window) o << " window=" << *s.window;
  if (s.softcap) o << " softcap=" << *s.softcap;
  if (s.scale) o << " scale=" << *s.scale;
  o << " sink=" << s.head_sink << " masked_rows=" << (s.masked_rows == MaskedRows::Nan ? "nan" : "zero")
    << " lse=" << s.lse << " std=" << s.input_std;
  return o.str();
}

// Element indices (of O, then of the LSE) that the layouts reach: the elements a run must write.
inline std::int64_t count_unwritten(CaseData& data, const std::vector<std::byte>& poisoned) {
  const AttentionProblem p = core::normalize_and_check(data.problem());
  const std::vector<std::byte> now = data.output_bytes();
  const std::size_t es = dtype_size(p.dtype);
  const std::size_t o_bytes = static_cast<std::size_t>(data.args().o.elements) * es;
  std::int64_t unwritten = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.q_len; ++i) {
        for (std::int64_t d = 0; d < p.v_head_dim; ++d) {
          const std::size_t at = static_cast<std::size_t>(p.o.index(b, h, i) + d) * es;
          if (std::memcmp(&now[at], &poisoned[at], es) == 0) ++unwritten;
        }
        if (p.return_lse) {
          const std::size_t at = o_bytes + static_cast<std::size_t>(p.lse.index(b, h, i)) * 4;
          if (std::memcmp(&now[at], &poisoned[at], 4) == 0) ++unwritten;
        }
      }
  return unwritten;
}

struct Outcome {
  double err = 0.0;      // scaled error of O
  double lse_err = 0.0;  // LSE error (0 without an LSE)
  bool gaps_untouched = false;
  std::int64_t unwritten = 0;  // reached elements that still hold the poison
  std::string describe;
};

// Poisons the outputs, runs the op and measures the result against `ref`.
inline Outcome run_and_measure(CaseData& data, const cpu::ReferenceResult& ref, const AttentionConfig& config = {}) {
  data.poison_outputs();
  const std::vector<std::byte> poisoned = data.output_bytes();
  Attention op(data.problem(), config);
  op.run(data.args());
  Outcome out;
  out.err = data.scaled_error(ref);
  out.lse_err = data.lse_error(ref);
  out.gaps_untouched = data.gaps_untouched();
  out.unwritten = count_unwritten(data, poisoned);
  out.describe = op.describe();
  return out;
}

// A dense head-first problem whose inputs a test writes one element at a time. Values are stored in the
// problem's dtype (store_from_float rounds), so the reference sees exactly what the kernel sees.
class Manual {
 public:
  AttentionProblem p;
  std::vector<std::byte> q, k, v, o;
  std::vector<float> mask, sink, lse;
  std::vector<std::int32_t> lengths;
  std::vector<std::int32_t> offsets;  // per-batch causal offsets

  Manual(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len, std::int64_t k_len,
         std::int64_t head_dim, std::int64_t v_head_dim, DType dtype) {
    p = AttentionProblem::head_first(batch, heads, kv_heads, q_len, k_len, head_dim, dtype);
    p.v_head_dim = v_head_dim;
    p.v = Layout::head_first(p.kv_heads, k_len, v_head_dim);
    p.o = Layout::head_first(heads, q_len, v_head_dim);
    const std::size_t es = dtype_size(dtype);
    q.resize(static_cast<std::size_t>(batch * heads * q_len * head_dim) * es);
    k.resize(static_cast<std::size_t>(batch * p.kv_heads * k_len * head_dim) * es);
    v.resize(static_cast<std::size_t>(batch * p.kv_heads * k_len * v_head_dim) * es);
    o.resize(static_cast<std::size_t>(batch * heads * q_len * v_head_dim) * es);
    lse.resize(static_cast<std::size_t>(batch * heads * q_len));
  }

  // Random normal inputs (std `std_dev`), rounded to the dtype.
  void randomize(std::uint64_t seed, double std_dev = 1.0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n(0.0, std_dev);
    for (auto* buf : {&q, &k, &v}) {
      const std::int64_t count = static_cast<std::int64_t>(buf->size() / dtype_size(p.dtype));
      for (std::int64_t i = 0; i < count; ++i) store_from_float(buf->data(), p.dtype, i, static_cast<float>(n(rng)));
    }
  }
  // One K and V for every batch entry (batch stride 0), as a shared prefix or cross-attention memory keeps it.
  void share_kv_across_batch() {
    p.k.batch_stride = p.v.batch_stride = 0;
    k.resize(k.size() / static_cast<std::size_t>(p.batch));
    v.resize(v.size() / static_cast<std::size_t>(p.batch));
  }
  void add_mask() {  // [B, H, Q, K], zero
    p.has_mask = true;
    p.mask = Layout::mask(p.batch, p.heads, p.q_len, p.k_len);
    mask.assign(static_cast<std::size_t>(p.batch * p.heads * p.q_len * p.k_len), 0.0f);
  }
  void add_key_lengths(std::int32_t value) {
    p.has_key_lengths = true;
    lengths.assign(static_cast<std::size_t>(p.batch), value);
  }
  void add_causal_offsets(std::int32_t value) {
    p.causal = true;
    p.has_causal_offsets = true;
    offsets.assign(static_cast<std::size_t>(p.batch), value);
  }
  void add_sink(float value) {
    p.has_head_sink = true;
    sink.assign(static_cast<std::size_t>(p.heads), value);
  }

  std::int64_t q_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const { return p.q.index(b, h, i) + d; }
  std::int64_t k_at(std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t d) const { return p.k.index(b, h, j) + d; }
  std::int64_t v_at(std::int64_t b, std::int64_t h, std::int64_t j, std::int64_t d) const { return p.v.index(b, h, j) + d; }
  float& mask_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    return mask[static_cast<std::size_t>(p.mask.index(b, h, i) + j)];
  }
  void set(std::vector<std::byte>& buf, std::int64_t index, float value) { store_from_float(buf.data(), p.dtype, index, value); }
  float get(const std::vector<std::byte>& buf, std::int64_t index) const { return load_as_float(buf.data(), p.dtype, index); }
  float out(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const { return get(o, p.o.index(b, h, i) + d); }
  float lse_at(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return lse[static_cast<std::size_t>(p.lse.index(b, h, i))];
  }

  AttentionArgs args() {
    AttentionArgs a;
    const auto count = [&](const std::vector<std::byte>& b) {
      return static_cast<std::int64_t>(b.size() / dtype_size(p.dtype));
    };
    a.q = {q.data(), count(q)};
    a.k = {k.data(), count(k)};
    a.v = {v.data(), count(v)};
    a.o = {o.data(), count(o)};
    if (p.has_mask) a.mask = {mask.data(), static_cast<std::int64_t>(mask.size())};
    if (p.has_key_lengths) a.key_lengths = {lengths.data(), static_cast<std::int64_t>(lengths.size())};
    if (p.has_head_sink) a.head_sink = {sink.data(), static_cast<std::int64_t>(sink.size())};
    if (p.has_causal_offsets) a.causal_offsets = {offsets.data(), static_cast<std::int64_t>(offsets.size())};
    if (p.return_lse) a.lse = {lse.data(), static_cast<std::int64_t>(lse.size())};
    return a;
  }

  // Fills O and the LSE with a NaN pattern no kernel writes (payload 0x0dead / 0x5a).
  void poison() {
    const std::size_t es = dtype_size(p.dtype);
    for (std::size_t i = 0; i < o.size(); i += es) {
      if (es == 4) {
        const std::uint32_t bits = 0x7fc0deadu;
        std::memcpy(&o[i], &bits, 4);
      } else {
        const std::uint16_t bits = 0x7e5au;
        std::memcpy(&o[i], &bits, 2);
      }
    }
    const std::uint32_t bits = 0x7fc0deadu;
    for (float& x : lse) std::memcpy(&x, &bits, 4);
  }

  void run(const AttentionConfig& config = {}) {
    poison();
    Attention(p, config).run(args());
  }
  cpu::ReferenceResult reference() {
    return cpu::reference_attention(core::normalize_and_check(p), args());
  }
  // max |out - ref| / max |ref| over rows where the reference is finite (callers check NaN rows themselves).
  double scaled_error(const cpu::ReferenceResult& r) const {
    const AttentionProblem n = core::normalize_and_check(p);
    double diff = 0.0, top = 0.0;
    std::size_t at = 0;
    for (std::int64_t b = 0; b < n.batch; ++b)
      for (std::int64_t h = 0; h < n.heads; ++h)
        for (std::int64_t i = 0; i < n.q_len; ++i)
          for (std::int64_t d = 0; d < n.v_head_dim; ++d, ++at) {
            const double ref = r.out[at];
            if (std::isnan(ref)) continue;
            const double x = out(b, h, i, d);
            if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
            diff = std::max(diff, std::abs(x - ref));
            top = std::max(top, std::abs(ref));
          }
    return top > 0.0 ? diff / top : diff;
  }
};

}  // namespace attnkit::test
