// The unfused chain (see unfused_blas.hpp). The softmax's exp is vectorised with Highway so that the chain
// is a fair peer: only the GEMMs and the written score matrix separate it from the fused kernel.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "testing/unfused_blas.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "unfused_blas.hpp"

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attnkit::testing::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x[j] = exp(x[j] - max); returns the sum (in lane order, then across lanes).
float exp_and_sum(float* HWY_RESTRICT x, std::int64_t n, float max) {
  const hn::ScalableTag<float> df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const auto m = hn::Set(df, max);
  auto acc = hn::Zero(df);
  std::int64_t j = 0;
  for (; j + L <= n; j += L) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + j), m));
    acc = hn::Add(acc, e);
    hn::StoreU(e, df, x + j);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - max);
    sum += x[j];
  }
  return sum;
}

}  // namespace attnkit::testing::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <core/online_softmax.hpp>
#include <core/score_transform.hpp>
#include <core/visibility.hpp>

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

namespace attnkit::testing {

HWY_EXPORT(exp_and_sum);

UnfusedBlas::UnfusedBlas(const AttentionProblem& problem, int threads)
    : p_(problem), threads_(threads > 0 ? threads : omp_get_max_threads()) {
  const std::size_t per_thread = static_cast<std::size_t>(
      p_.q_len * p_.head_dim + p_.k_len * (p_.head_dim + p_.v_head_dim) + p_.q_len * p_.k_len + p_.q_len * p_.v_head_dim);
  work_.assign(static_cast<std::size_t>(threads_), std::vector<float>(per_thread));
}

void UnfusedBlas::run(const AttentionArgs& a) {
  const AttentionProblem& p = p_;
  const std::int64_t Sq = p.q_len, Sk = p.k_len, D = p.head_dim, Dv = p.v_head_dim;
  const std::int64_t group = p.heads / p.kv_heads;
  const core::VisibilityRule base_rule{p.causal, *p.causal_offset, p.window.value_or(0)};
  const core::ScoreTransform transform{1.0f, p.softcap.value_or(0.0f)};
  const auto* mask = static_cast<const float*>(a.mask.data);
  const auto* lengths = static_cast<const std::int32_t*>(a.key_lengths.data);
  const auto* sinks = static_cast<const float*>(a.head_sink.data);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 1)
  for (std::int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    const std::int64_t b = bh / p.heads, h = bh % p.heads, kvh = h / group;
    float* q = work_[static_cast<std::size_t>(omp_get_thread_num())].data();
    float* k = q + Sq * D;
    float* v = k + Sk * D;
    float* s = v + Sk * Dv;
    float* o = s + Sq * Sk;
    for (std::int64_t i = 0; i < Sq; ++i)
      for (std::int64_t d = 0; d < D; ++d) q[i * D + d] = load_as_float(a.q.data, p.dtype, p.q.index(b, h, i) + d);
    for (std::int64_t j = 0; j < Sk; ++j) {
      for (std::int64_t d = 0; d < D; ++d) k[j * D + d] = load_as_float(a.k.data, p.dtype, p.k.index(b, kvh, j) + d);
      for (std::int64_t d = 0; d < Dv; ++d) v[j * Dv + d] = load_as_float(a.v.data, p.dtype, p.v.index(b, kvh, j) + d);
    }
    if (Sq > 0 && Sk > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(Sq), static_cast<int>(Sk),
                  static_cast<int>(D), *p.scale, q, static_cast<int>(D), k, static_cast<int>(D), 0.0f, s,
                  static_cast<int>(Sk));
    }
    const std::int64_t key_length = p.has_key_lengths ? lengths[b] : Sk;
    const core::VisibilityRule rule = base_rule.for_batch(static_cast<const std::int32_t*>(a.causal_offsets.data), b);
    std::vector<float> lse_row(static_cast<std::size_t>(Sq));
    for (std::int64_t i = 0; i < Sq; ++i) {
      float* row = s + i * Sk;
      const core::KeyRange range = rule.for_row(i, key_length);
      float max = core::kNegInf;
      for (std::int64_t j = 0; j < Sk; ++j) {
        float x = j >= range.begin && j < range.end ? transform(row[j]) : core::kNegInf;
        if (p.has_mask && x != core::kNegInf) x += mask[p.mask.index(b, h, i) + j];
        row[j] = x;
        max = std::max(max, x);
        if (std::isnan(x)) max = nan;
      }
      float sink_term = 0.0f;
      if (p.has_head_sink) {
        max = std::max(max, sinks[h]);
        sink_term = std::exp(sinks[h] - max);
      }
      if (max == core::kNegInf) {  // nothing visible
        const float fill = p.masked_rows == MaskedRows::Zero ? 0.0f : nan;
        for (std::int64_t j = 0; j < Sk; ++j) row[j] = 0.0f;
        lse_row[static_cast<std::size_t>(i)] = core::kNegInf;
        for (std::int64_t d = 0; d < Dv; ++d) o[i * Dv + d] = fill;
        continue;
      }
      const float sum = HWY_DYNAMIC_DISPATCH(exp_and_sum)(row, Sk, max) + sink_term;
      const float inv = 1.0f / sum;
      for (std::int64_t j = 0; j < Sk; ++j) row[j] *= inv;
      lse_row[static_cast<std::size_t>(i)] = max + std::log(sum);
    }
    if (Sq > 0 && Sk > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(Sq), static_cast<int>(Dv),
                  static_cast<int>(Sk), 1.0f, s, static_cast<int>(Sk), v, static_cast<int>(Dv), 0.0f, o,
                  static_cast<int>(Dv));
    }
    for (std::int64_t i = 0; i < Sq; ++i) {
      const bool empty = lse_row[static_cast<std::size_t>(i)] == core::kNegInf;
      for (std::int64_t d = 0; d < Dv; ++d) {
        const float value = empty ? (p.masked_rows == MaskedRows::Zero ? 0.0f : nan) : o[i * Dv + d];
        store_from_float(a.o.data, p.dtype, p.o.index(b, h, i) + d, value);
      }
      if (p.return_lse) static_cast<float*>(a.lse.data)[p.lse.index(b, h, i)] = lse_row[static_cast<std::size_t>(i)];
    }
  }
  openblas_set_num_threads(blas_threads);
}

std::string blas_info() {
  return std::string(openblas_get_config()) + " (" + openblas_get_corename() + ", " +
         std::to_string(openblas_get_num_threads()) + " threads)";
}

double sgemm_gflops(int n, int repeats) {
  std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size(), 0.0f);
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * static_cast<double>(n) * n / s / 1e9);
  }
  return best;
}

}  // namespace attnkit::testing
#endif
