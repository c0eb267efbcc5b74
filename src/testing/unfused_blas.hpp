// The unfused chain the fused kernel is measured and checked against: S = scale Q Kᵀ (OpenBLAS sgemm),
// softcap, + mask, softmax, O = P V (sgemm), with the score matrix written to memory. Float32 math; half
// and bfloat16 inputs are widened first. Parallel over (batch, head) with single-threaded BLAS calls.
#pragma once

#include <attnkit/attention.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace attnkit::testing {

class UnfusedBlas {
 public:
  // `problem` must be normalised.
  UnfusedBlas(const AttentionProblem& problem, int threads);
  // Writes O (and the LSE) like the fused op.
  void run(const AttentionArgs& args);

 private:
  AttentionProblem p_;
  int threads_;
  std::vector<std::vector<float>> work_;  // per thread: Q, K, V widened, S, O
};

// OpenBLAS's name and core count, for `attnkit info`.
std::string blas_info();
// Times sgemm n x n x n on all cores: GFLOP/s (the ceiling the fused kernel is compared with).
double sgemm_gflops(int n, int repeats);

}  // namespace attnkit::testing
