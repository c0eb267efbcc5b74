#include "case_data.hpp"

#include <core/problem_check.hpp>
#include <core/visibility.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

namespace attnkit::testing {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Poison patterns: NaNs with payloads no arithmetic produces.
constexpr std::uint32_t kPoison32 = 0x7fc0deadu;
constexpr std::uint16_t kPoisonHalf = 0x7e5au;
constexpr std::uint16_t kPoisonBf16 = 0x7fd5u;

void fill_poison(std::byte* data, DType t, std::int64_t elements) {
  for (std::int64_t i = 0; i < elements; ++i) {
    if (t == DType::f32) {
      std::memcpy(data + i * 4, &kPoison32, 4);
    } else {
      const std::uint16_t v = t == DType::f16 ? kPoisonHalf : kPoisonBf16;
      std::memcpy(data + i * 2, &v, 2);
    }
  }
}

bool is_poison(const std::byte* data, DType t, std::int64_t i) {
  if (t == DType::f32) {
    std::uint32_t v;
    std::memcpy(&v, data + i * 4, 4);
    return v == kPoison32;
  }
  std::uint16_t v;
  std::memcpy(&v, data + i * 2, 2);
  return v == (t == DType::f16 ? kPoisonHalf : kPoisonBf16);
}

// Marks every element index a layout reaches over [batch, heads, rows, cols].
void mark_reached(std::vector<bool>& reached, const Layout& l, std::int64_t batch, std::int64_t heads,
                  std::int64_t rows, std::int64_t cols) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) reached[static_cast<std::size_t>(l.index(b, h, r) + c)] = true;
}

std::int64_t extent_of(const Layout& l, std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t cols) {
  const core::IndexSpan s = core::index_span(l, batch, heads, rows, cols);
  return s.empty() ? 0 : s.highest + 1;
}

// Head-first with an offset, padded rows and gaps between heads and batch entries.
Layout padded_layout(std::int64_t heads, std::int64_t rows, std::int64_t cols) {
  Layout l;
  l.offset = 3;
  l.row_stride = cols + 5;
  l.head_stride = rows * l.row_stride + 7;
  l.batch_stride = heads * l.head_stride + 11;
  return l;
}

}  // namespace

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 8e-3;
  }
  return 0.0;
}

double cpu_lse_tolerance(DType dtype) { return dtype == DType::bf16 ? 0x1p-8 : 1e-5; }

CaseData::CaseData(const CaseSpec& spec, DType dtype, std::uint64_t seed) : spec_(spec), dtype_(dtype) {
  AttentionProblem& p = problem_;
  p.batch = spec.batch;
  p.heads = spec.heads;
  p.kv_heads = spec.kv_heads == 0 ? spec.heads : spec.kv_heads;
  p.q_len = spec.q_len;
  p.k_len = spec.k_len;
  p.head_dim = spec.head_dim;
  p.v_head_dim = spec.v_head_dim == 0 ? spec.head_dim : spec.v_head_dim;
  p.scale = spec.scale;
  p.dtype = dtype;
  p.causal = spec.causal;
  p.causal_offset = spec.causal_offset;
  p.window = spec.window;
  p.softcap = spec.softcap;
  p.masked_rows = spec.masked_rows;
  p.has_head_sink = spec.head_sink;
  p.has_key_lengths = spec.key_lengths != KeyLengths::None;
  p.has_causal_offsets = spec.causal_offsets;
  p.return_lse = spec.lse;
  const std::int64_t B = p.batch, H = p.heads, Hkv = p.kv_heads, Sq = p.q_len, Sk = p.k_len;
  const std::int64_t D = p.head_dim, Dv = p.v_head_dim;

  switch (spec.layout) {
    case LayoutKind::HeadFirst:
    case LayoutKind::BroadcastKv:
      p.q = Layout::head_first(H, Sq, D);
      p.k = Layout::head_first(Hkv, Sk, D);
      p.v = Layout::head_first(Hkv, Sk, Dv);
      p.o = Layout::head_first(H, Sq, Dv);
      p.lse = Layout::rows_only(H, Sq);
      if (spec.layout == LayoutKind::BroadcastKv) p.k.batch_stride = p.v.batch_stride = 0;
      break;
    case LayoutKind::PositionsFirst:
      p.q = Layout::positions_first(H, Sq, D);
      p.k = Layout::positions_first(Hkv, Sk, D);
      p.v = Layout::positions_first(Hkv, Sk, Dv);
      p.o = Layout::positions_first(H, Sq, Dv);
      p.lse = Layout::rows_only(H, Sq);
      break;
    case LayoutKind::PackedQkv:
      if (Sq != Sk || D != Dv) throw std::runtime_error(spec.name + ": packed_qkv needs q_len == k_len and one head_dim");
      p.q = Layout::packed_qkv_q(H, Hkv, Sq, D);
      p.k = Layout::packed_qkv_k(H, Hkv, Sq, D);
      p.v = Layout::packed_qkv_v(H, Hkv, Sq, D);
      p.o = Layout::positions_first(H, Sq, Dv);
      p.lse = Layout::rows_only(H, Sq);
      break;
    case LayoutKind::Padded:
      p.q = padded_layout(H, Sq, D);
      p.k = padded_layout(Hkv, Sk, D);
      p.v = padded_layout(Hkv, Sk, Dv);
      p.o = padded_layout(H, Sq, Dv);
      p.lse = {2, H * (2 * Sq + 1) + 3, 2 * Sq + 1, 2};
      break;
  }

  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::size_t es = dtype_size(dtype);
  auto fill_inputs = [&](std::int64_t base, std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) {
      store_from_float(qkv_.data(), dtype, base + i, static_cast<float>(normal(rng) * spec.input_std));
    }
  };
  if (spec.layout == LayoutKind::PackedQkv) {
    q_elems_ = k_elems_ = v_elems_ = extent_of(p.q, B, 1, Sq, (H + 2 * Hkv) * D);
    qkv_.resize(static_cast<std::size_t>(q_elems_) * es);
    fill_inputs(0, q_elems_);
  } else {
    const std::int64_t kb = spec.layout == LayoutKind::BroadcastKv ? 1 : B;
    q_elems_ = extent_of(p.q, B, H, Sq, D);
    k_elems_ = extent_of(p.k, kb, Hkv, Sk, D);
    v_elems_ = extent_of(p.v, kb, Hkv, Sk, Dv);
    q_base_ = 0;
    k_base_ = q_elems_;
    v_base_ = k_base_ + k_elems_;
    qkv_.resize(static_cast<std::size_t>(v_base_ + v_elems_) * es);
    fill_inputs(0, v_base_ + v_elems_);
  }
  o_elems_ = extent_of(p.o, B, H, Sq, Dv);
  o_.resize(static_cast<std::size_t>(o_elems_) * es);
  if (p.return_lse) lse_.resize(static_cast<std::size_t>(extent_of(p.lse, B, H, Sq, 1)));

  if (spec.mask != MaskKind::None) {
    p.has_mask = true;
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    switch (spec.mask) {
      case MaskKind::KeyPadding: {
        p.mask = Layout::mask(B, 1, 1, Sk);
        mask_.assign(static_cast<std::size_t>(B * Sk), 0.0f);
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t valid = Sk == 0 ? 0 : 1 + static_cast<std::int64_t>(unit(rng) * static_cast<double>(Sk));
          for (std::int64_t j = std::min(valid, Sk); j < Sk; ++j) mask_[static_cast<std::size_t>(b * Sk + j)] = kNegInf;
        }
        break;
      }
      case MaskKind::Random:
      case MaskKind::RandomShared:
      case MaskKind::MaskedRows: {
        const std::int64_t mh = spec.mask == MaskKind::RandomShared ? 1 : H;
        p.mask = Layout::mask(B, mh, Sq, Sk);
        mask_.resize(static_cast<std::size_t>(B * mh * Sq * Sk));
        for (float& m : mask_) m = unit(rng) < 0.1 ? kNegInf : static_cast<float>(normal(rng));
        if (spec.mask == MaskKind::MaskedRows) {
          for (std::int64_t bh = 0; bh < B * mh; ++bh)
            for (std::int64_t i = 0; i < Sq; i += 3)
              for (std::int64_t j = 0; j < Sk; ++j) mask_[static_cast<std::size_t>((bh * Sq + i) * Sk + j)] = kNegInf;
        }
        break;
      }
      case MaskKind::None: break;
    }
  }
  if (p.has_key_lengths) {
    key_lengths_.resize(static_cast<std::size_t>(B));
    std::uniform_int_distribution<std::int64_t> len(0, Sk);
    for (auto& l : key_lengths_) l = spec.key_lengths == KeyLengths::Zero ? 0 : static_cast<std::int32_t>(len(rng));
  }
  if (p.has_causal_offsets) {
    offsets_.resize(static_cast<std::size_t>(B));
    std::uniform_int_distribution<std::int64_t> off(-Sq, Sk);
    for (auto& o : offsets_) o = static_cast<std::int32_t>(off(rng));
  }
  if (p.has_head_sink) {
    sinks_.resize(static_cast<std::size_t>(H));
    for (float& s : sinks_) s = static_cast<float>(normal(rng));
  }
  normalized_ = core::normalize_and_check(problem_);
  poison_outputs();
}

AttentionArgs CaseData::args() {
  AttentionArgs a;
  const std::size_t es = dtype_size(dtype_);
  std::byte* base = qkv_.data();
  a.q = {base + q_base_ * static_cast<std::int64_t>(es), q_elems_};
  a.k = {base + k_base_ * static_cast<std::int64_t>(es), k_elems_};
  a.v = {base + v_base_ * static_cast<std::int64_t>(es), v_elems_};
  a.o = {o_.data(), o_elems_};
  if (problem_.has_mask) a.mask = {mask_.data(), static_cast<std::int64_t>(mask_.size())};
  if (problem_.has_key_lengths) a.key_lengths = {key_lengths_.data(), static_cast<std::int64_t>(key_lengths_.size())};
  if (problem_.has_head_sink) a.head_sink = {sinks_.data(), static_cast<std::int64_t>(sinks_.size())};
  if (problem_.has_causal_offsets) a.causal_offsets = {offsets_.data(), static_cast<std::int64_t>(offsets_.size())};
  if (problem_.return_lse) a.lse = {lse_.data(), static_cast<std::int64_t>(lse_.size())};
  return a;
}

void CaseData::poison_outputs() {
  fill_poison(o_.data(), dtype_, o_elems_);
  fill_poison(reinterpret_cast<std::byte*>(lse_.data()), DType::f32, static_cast<std::int64_t>(lse_.size()));
}

bool CaseData::gaps_untouched() const {
  const AttentionProblem& p = normalized_;
  std::vector<bool> reached(static_cast<std::size_t>(o_elems_), false);
  mark_reached(reached, p.o, p.batch, p.heads, p.q_len, p.v_head_dim);
  for (std::int64_t i = 0; i < o_elems_; ++i)
    if (!reached[static_cast<std::size_t>(i)] && !is_poison(o_.data(), dtype_, i)) return false;
  std::vector<bool> lse_reached(lse_.size(), false);
  if (p.return_lse) mark_reached(lse_reached, p.lse, p.batch, p.heads, p.q_len, 1);
  const auto* lse_bytes = reinterpret_cast<const std::byte*>(lse_.data());
  for (std::size_t i = 0; i < lse_.size(); ++i)
    if (!lse_reached[i] && !is_poison(lse_bytes, DType::f32, static_cast<std::int64_t>(i))) return false;
  return true;
}

std::vector<std::byte> CaseData::output_bytes() const {
  std::vector<std::byte> out(o_);
  const auto* l = reinterpret_cast<const std::byte*>(lse_.data());
  out.insert(out.end(), l, l + lse_.size() * sizeof(float));
  return out;
}

cpu::ReferenceResult CaseData::reference() const {
  AttentionArgs a = const_cast<CaseData*>(this)->args();
  return cpu::reference_attention(normalized_, a);
}

double CaseData::scaled_error(const cpu::ReferenceResult& ref) const {
  const AttentionProblem& p = normalized_;
  const double inf = std::numeric_limits<double>::infinity();
  double max_diff = 0.0, max_ref = 0.0;
  std::size_t n = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.q_len; ++i)
        for (std::int64_t d = 0; d < p.v_head_dim; ++d, ++n) {
          const double r = ref.out[n];
          const double o = load_as_float(o_.data(), dtype_, p.o.index(b, h, i) + d);
          if (std::isnan(r)) {
            if (!std::isnan(o)) return inf;
            continue;
          }
          if (!std::isfinite(o)) return inf;
          max_diff = std::max(max_diff, std::abs(o - r));
          max_ref = std::max(max_ref, std::abs(r));
        }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

double CaseData::lse_error(const cpu::ReferenceResult& ref) const {
  const AttentionProblem& p = normalized_;
  if (!p.return_lse) return 0.0;
  double max_diff = 0.0;
  std::size_t n = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.q_len; ++i, ++n) {
        const double r = ref.lse[n];
        const double o = lse_[static_cast<std::size_t>(p.lse.index(b, h, i))];
        if (std::isnan(r) || std::isinf(r)) {
          if (!(std::isnan(r) ? std::isnan(o) : o == r)) return std::numeric_limits<double>::infinity();
          continue;
        }
        if (!std::isfinite(o)) return std::numeric_limits<double>::infinity();
        max_diff = std::max(max_diff, std::abs(o - r) / std::max(1.0, std::abs(r)));
      }
  return max_diff;
}

double CaseData::flops() const {
  const AttentionProblem& p = normalized_;
  const core::VisibilityRule base_rule{p.causal, *p.causal_offset, p.window.value_or(0)};
  double pairs = 0.0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const core::VisibilityRule rule = base_rule.for_batch(p.has_causal_offsets ? offsets_.data() : nullptr, b);
    const std::int64_t len = p.has_key_lengths ? key_lengths_[static_cast<std::size_t>(b)] : p.k_len;
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      const core::KeyRange r = rule.for_row(i, len);
      pairs += static_cast<double>(r.empty() ? 0 : r.end - r.begin);
    }
  }
  return 2.0 * pairs * static_cast<double>(p.heads) * static_cast<double>(p.head_dim + p.v_head_dim);
}

}  // namespace attnkit::testing
