#include "reference.hpp"

#include "../core/kv_quant.hpp"
#include "../core/online_softmax.hpp"
#include "../core/score_transform.hpp"
#include "../core/sequences.hpp"
#include "../core/visibility.hpp"

#include <cmath>
#include <limits>

namespace attnkit::cpu {

ReferenceResult reference_attention(const AttentionProblem& p, const AttentionArgs& a) {
  const std::int64_t group = p.heads / p.kv_heads;
  const std::int64_t dv = p.v_head_dim;
  const core::SequenceAccess seqs = core::sequence_access(p, a);
  const core::ScoreTransform transform{*p.scale, p.softcap.value_or(0.0f)};
  const auto* k_scales = static_cast<const float*>(a.k_scale.data);
  const auto* v_scales = static_cast<const float*>(a.v_scale.data);
  const auto* sinks = static_cast<const float*>(a.head_sink.data);
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();

  ReferenceResult r;
  if (p.batch == 0 || p.q_len == 0) return r;  // no output row: nothing to loop over (batch may be 2^50)
  r.out.assign(static_cast<std::size_t>(p.batch * p.heads * p.q_len * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.batch * p.heads * p.q_len), 0.0);
  std::vector<double> scores;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const core::SequenceRows seq = seqs.rows_of(b);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t kvh = h / group;
      for (std::int64_t i = 0; i < seq.queries; ++i) {
        const core::KeyRange range = seq.rule.for_row(i, seq.key_length);
        const std::int64_t q_row = seqs.query_index(p.q, seq, b, h, i);
        const std::int64_t n = range.empty() ? 0 : range.end - range.begin;
        scores.assign(static_cast<std::size_t>(n), -kInf);
        bool poisoned = false;
        double max = -kInf;
        for (std::int64_t j = range.begin; j < range.begin + n; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            dot += static_cast<double>(load_as_float(a.q.data, p.dtype, q_row + d)) *
                   static_cast<double>(core::load_kv(a.k.data, p.k_storage, p.dtype, seqs.key_index(p.k, seq, b, kvh, j) + d,
                                                     k_scales, kvh, p.head_dim, d));
          }
          double s = transform.apply(dot);
          if (p.has_mask) s += static_cast<double>(load_as_float(a.mask.data, p.mask_dtype, p.mask.index(b, h, i) + j));
          if (std::isnan(s) || s == kInf) poisoned = true;
          scores[static_cast<std::size_t>(j - range.begin)] = s;
          if (s > max) max = s;
        }
        double denominator = 0.0;
        for (double& s : scores) {
          s = s == -kInf ? 0.0 : std::exp(s - max);  // s is now the unnormalised weight
          denominator += s;
        }
        if (p.has_head_sink) {
          const double sink = sinks[h];
          const double m = std::max(max, sink);
          for (double& s : scores) s *= std::exp(max - m);
          denominator = denominator * (max == -kInf ? 0.0 : std::exp(max - m)) + std::exp(sink - m);
          max = m;
        }
        double* out = &r.out[static_cast<std::size_t>(((b * p.heads + h) * p.q_len + i) * dv)];
        double& lse = r.lse[static_cast<std::size_t>((b * p.heads + h) * p.q_len + i)];
        if (poisoned) {
          for (std::int64_t d = 0; d < dv; ++d) out[d] = kNaN;
          lse = kNaN;
          continue;
        }
        if (denominator == 0.0) {  // no visible key and no sink
          const double fill = p.masked_rows == MaskedRows::Zero ? 0.0 : kNaN;
          for (std::int64_t d = 0; d < dv; ++d) out[d] = fill;
          lse = -kInf;
          continue;
        }
        for (std::int64_t j = 0; j < n; ++j) {
          const double w = scores[static_cast<std::size_t>(j)] / denominator;
          if (w == 0.0) continue;  // a hidden key has weight exactly 0: its V is never read
          const std::int64_t vrow = seqs.key_index(p.v, seq, b, kvh, range.begin + j);
          for (std::int64_t d = 0; d < dv; ++d) {
            out[d] += w * static_cast<double>(core::load_kv(a.v.data, p.v_storage, p.dtype, vrow + d, v_scales, kvh,
                                                            dv, d));
          }
        }
        lse = max + std::log(denominator);
      }
    }
  }
  return r;
}

void run_reference(const AttentionProblem& p, const AttentionArgs& a) {
  if (p.batch == 0 || p.q_len == 0) return;  // no output row (and batch * heads may be any size)
  const ReferenceResult r = reference_attention(p, a);
  const core::SequenceAccess seqs = core::sequence_access(p, a);
  const std::int64_t dv = p.v_head_dim;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const core::SequenceRows seq = seqs.rows_of(b);
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < seq.queries; ++i) {
        const std::size_t row = static_cast<std::size_t>((b * p.heads + h) * p.q_len + i);
        const std::int64_t o_row = seqs.query_index(p.o, seq, b, h, i);
        for (std::int64_t d = 0; d < dv; ++d) {
          store_from_float(a.o.data, p.dtype, o_row + d,
                           static_cast<float>(r.out[row * static_cast<std::size_t>(dv) + static_cast<std::size_t>(d)]));
        }
        if (p.return_lse) {
          static_cast<float*>(a.lse.data)[seqs.query_index(p.lse, seq, b, h, i)] = static_cast<float>(r.lse[row]);
        }
      }
    }
  }
}

}  // namespace attnkit::cpu
