#include "output_qk.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "../core/kv_quant.hpp"
#include "../core/score_transform.hpp"
#include "../core/visibility.hpp"

namespace attnkit::gqa {

void write_output_qk(const AttentionProblem& p, const AttentionArgs& a, bool after_softmax,
                     const std::int32_t* first_column, std::int64_t columns, void* out, DType out_type, int threads) {
  const std::int64_t group = p.heads / p.kv_heads;
  const core::VisibilityRule base{p.causal, *p.causal_offset, p.window.value_or(0)};
  const core::ScoreTransform transform{*p.scale, p.softcap.value_or(0.0f)};
  const auto* key_lengths = static_cast<const std::int32_t*>(a.key_lengths.data);
  const auto* offsets = static_cast<const std::int32_t*>(a.causal_offsets.data);
  const auto* sinks = static_cast<const float*>(a.head_sink.data);
  const auto* k_scales = static_cast<const float*>(a.k_scale.data);
  constexpr double kInf = std::numeric_limits<double>::infinity();

#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    const std::int64_t b = bh / p.heads;
    const std::int64_t h = bh % p.heads;
    const std::int64_t kvh = h / group;
    const core::VisibilityRule rule = base.for_batch(offsets, b);
    const std::int64_t key_length = p.has_key_lengths ? key_lengths[b] : p.k_len;
    std::vector<double> row(static_cast<std::size_t>(columns));
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      std::fill(row.begin(), row.end(), 0.0);
      const core::KeyRange range = rule.for_row(i, key_length);
      double max = -kInf;
      for (std::int64_t j = range.begin; j < range.end; ++j) {
        double dot = 0.0;
        for (std::int64_t d = 0; d < p.head_dim; ++d) {
          dot += static_cast<double>(load_as_float(a.q.data, p.dtype, p.q.index(b, h, i) + d)) *
                 core::load_kv(a.k.data, p.k_storage, p.dtype, p.k.index(b, kvh, j) + d, k_scales, kvh, p.head_dim, d);
        }
        double s = transform.apply(dot);
        if (p.has_mask) s += load_as_float(a.mask.data, p.mask_dtype, p.mask.index(b, h, i) + j);
        row[static_cast<std::size_t>(first_column[b] + j)] = s;
        max = std::max(max, s);
      }
      if (after_softmax && !range.empty()) {
        const double sink = p.has_head_sink ? static_cast<double>(sinks[h]) : -kInf;
        const double m = std::max(max, sink);
        double sum = p.has_head_sink ? std::exp(sink - m) : 0.0;
        for (std::int64_t j = range.begin; j < range.end; ++j) {
          double& x = row[static_cast<std::size_t>(first_column[b] + j)];
          x = x == -kInf ? 0.0 : std::exp(x - m);
          sum += x;
        }
        for (std::int64_t j = range.begin; j < range.end; ++j) {
          double& x = row[static_cast<std::size_t>(first_column[b] + j)];
          x = sum > 0.0 ? x / sum : 0.0;  // every key hidden by a -inf bias and no sink: the core's zero row
        }
      }
      const std::int64_t base_index = ((b * p.heads + h) * p.q_len + i) * columns;
      for (std::int64_t c = 0; c < columns; ++c) {
        store_from_float(out, out_type, base_index + c, static_cast<float>(row[static_cast<std::size_t>(c)]));
      }
    }
  }
}

}  // namespace attnkit::gqa
