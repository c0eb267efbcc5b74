// The CPU attention op alone, timed back to back in one process: the median of `Attention::run` calls on fresh
// random positions-first tensors ([B, S, H, D]), for A/B runs of two builds of the library (bench/cpu_ab_timing.sh)
// or of plan overrides. Prints the plan's description, then the median, GFLOP/s and the number of calls.
//
//   g++ -O2 -std=c++20 -Iinclude bench/cpu_op_timing.cpp -Lbuild/release -lattnkit -o build/cpu_op_timing
//   LD_LIBRARY_PATH=build/release build/cpu_op_timing B H HKV SQ SK D f32|f16|bf16 causal(0|1) seconds [overrides]
#include <attnkit/attention.hpp>

#include "cpu_timing_values.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace attnkit;

int main(int argc, char** argv) {
  if (argc < 10) {
    std::fprintf(stderr, "usage: %s B H HKV SQ SK D f32|f16|bf16 causal seconds [overrides]\n", argv[0]);
    return 2;
  }
  const std::int64_t B = std::atol(argv[1]), H = std::atol(argv[2]), HKV = std::atol(argv[3]);
  const std::int64_t SQ = std::atol(argv[4]), SK = std::atol(argv[5]), D = std::atol(argv[6]);
  const std::string type = argv[7];
  const DType t = type == "f32" ? DType::f32 : type == "f16" ? DType::f16 : DType::bf16;
  const bool causal = std::atoi(argv[8]) != 0;
  const double seconds = std::atof(argv[9]);
  AttentionProblem p = AttentionProblem::positions_first(B, H, HKV, SQ, SK, D, t);
  p.causal = causal;
  AttentionConfig config;
  if (argc > 10) config.plan = parse_plan_overrides(argv[10]);
  Attention op(p, config);
  std::fprintf(stderr, "%s\n", op.describe().c_str());
  std::mt19937 rng(1);
  const std::int64_t nq = B * SQ * H * D, nk = B * SK * HKV * D;
  auto q = bench::random_values(nq, t, rng), k = bench::random_values(nk, t, rng), v = bench::random_values(nk, t, rng);
  std::vector<unsigned char> o(q.size());
  AttentionArgs args;
  args.q = {q.data(), nq};
  args.k = {k.data(), nk};
  args.v = {v.data(), nk};
  args.o = {o.data(), nq};
  op.run(args);  // (warm-up: the plan's scratch, the thread team)
  std::vector<double> us;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    op.run(args);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  const double flop = 4.0 * B * H * SQ * SK * D * (causal ? 0.5 : 1.0);
  const double median = us[us.size() / 2];
  std::printf("median %.1f us  %.1f GFLOP/s  (%zu runs)\n", median, flop / median / 1e3, us.size());
  return 0;
}
