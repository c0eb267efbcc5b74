// A program of another project that uses attnkit: one small attention call checked against a naive loop.
// Built by tests/consumers/*/ against an installed attnkit (find_package) and a source tree (add_subdirectory).
#include <attnkit/attention.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace attnkit;
  const int heads = 2, q_len = 3, k_len = 5, dim = 4;
  AttentionProblem p = AttentionProblem::positions_first(1, heads, heads, q_len, k_len, dim);
  std::vector<float> q(q_len * heads * dim), k(k_len * heads * dim), v(k.size()), o(q.size(), NAN);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * i);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.3 * i), v[i] = std::sin(0.11 * i + 1);
  Attention op(p);
  AttentionArgs a;
  a.q = {q.data(), (long)q.size()};
  a.k = {k.data(), (long)k.size()};
  a.v = {v.data(), (long)v.size()};
  a.o = {o.data(), (long)o.size()};
  op.run(a);
  double worst = 0;
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < q_len; ++i) {
      std::vector<double> s(k_len);
      double m = -INFINITY, sum = 0;
      for (int j = 0; j < k_len; ++j) {
        double d = 0;
        for (int c = 0; c < dim; ++c) d += q[(i * heads + h) * dim + c] * k[(j * heads + h) * dim + c];
        s[j] = d / std::sqrt(double(dim));
        m = std::max(m, s[j]);
      }
      for (int j = 0; j < k_len; ++j) sum += s[j] = std::exp(s[j] - m);
      for (int c = 0; c < dim; ++c) {
        double want = 0;
        for (int j = 0; j < k_len; ++j) want += s[j] / sum * v[(j * heads + h) * dim + c];
        worst = std::max(worst, std::abs(want - o[(i * heads + h) * dim + c]));
      }
    }
  }
  std::printf("attnkit consumer: max error %.2e\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
