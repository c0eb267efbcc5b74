// A CPU decode step over a paged K/V cache, timed against the same keys in a dense cache, in one process: the
// shape of bench/sequences_cpu.py's decode rows (Llama-3-8B heads: 32 query / 8 K/V heads, head dim 128; key
// lengths uniform in [lo, hi]), with the op alone and no Python in between, for A/B runs of two builds or of plan
// overrides. The dense cache is head-first [B, 8, hi, 128] with key lengths; the pages hold the same keys in a
// shuffled order, NHD [pages, page, 8, 128] or HND [pages, 8, page, 128]. Prints each layout's plan, median and
// GB/s of visible K/V, dense and paged taking turns.
//
//   g++ -O2 -std=c++20 -Iinclude bench/cpu_paged_timing.cpp -Lbuild/release -lattnkit -o build/cpu_paged_timing
//   LD_LIBRARY_PATH=build/release build/cpu_paged_timing B lo hi f16|bf16|f32 nhd|hnd page seconds [overrides [threads]]
#include <attnkit/attention.hpp>

#include "cpu_timing_values.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace attnkit;

constexpr std::int64_t kHeads = 32, kKvHeads = 8, kDim = 128;

struct Call {
  Attention op;
  AttentionArgs args;
  std::vector<double> us;
};

double median_us(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void time_for(Call& call, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    call.op.run(call.args);
    call.us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s B lo hi f16|bf16|f32 nhd|hnd page seconds [overrides [threads]]\n", argv[0]);
    return 2;
  }
  const std::int64_t B = std::atol(argv[1]), lo = std::atol(argv[2]), hi = std::atol(argv[3]);
  const std::string type = argv[4], order = argv[5];
  const std::int64_t page = std::atol(argv[6]);
  const double seconds = std::atof(argv[7]);
  const DType t = type == "f32" ? DType::f32 : type == "f16" ? DType::f16 : DType::bf16;
  const std::size_t es = dtype_size(t);
  AttentionConfig config;
  if (argc > 8) config.plan = parse_plan_overrides(argv[8]);
  if (argc > 9) config.threads = std::atoi(argv[9]);

  std::mt19937 rng(1);
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(B));
  std::uniform_int_distribution<std::int64_t> length_of(lo, hi);
  for (auto& n : lengths) n = static_cast<std::int32_t>(length_of(rng));
  auto random_values = [&](std::int64_t n) { return bench::random_values(n, t, rng); };
  const std::int64_t nq = B * kHeads * kDim, nk = B * kKvHeads * hi * kDim;
  const auto q = random_values(nq), k = random_values(nk), v = random_values(nk);
  std::vector<unsigned char> o_dense(q.size()), o_paged(q.size());

  // The dense call: head-first [B, Hkv, hi, D] with key lengths.
  AttentionProblem dense = AttentionProblem::head_first(B, kHeads, kKvHeads, 1, hi, kDim, t);
  dense.has_key_lengths = true;
  Call dense_call{Attention(dense, config), {}, {}};
  dense_call.args.q = {q.data(), nq};
  dense_call.args.k = {k.data(), nk};
  dense_call.args.v = {v.data(), nk};
  dense_call.args.o = {o_dense.data(), nq};
  dense_call.args.key_lengths = {lengths.data(), B};

  // The paged call: each sequence's keys in shuffled pages.
  const std::int64_t max_pages = (hi + page - 1) / page, num_pages = B * max_pages;
  std::vector<std::int32_t> table(static_cast<std::size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const bool nhd = order == "nhd";
  const Layout pages = nhd ? Layout{0, page * kKvHeads * kDim, kDim, kKvHeads * kDim}
                           : Layout{0, kKvHeads * page * kDim, page * kDim, kDim};
  std::vector<unsigned char> k_pages(
      static_cast<std::size_t>(num_pages * page * kKvHeads * kDim) * es);
  std::vector<unsigned char> v_pages(k_pages.size());
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < kKvHeads; ++h) {
      for (std::int64_t j = 0; j < lengths[static_cast<std::size_t>(b)]; ++j) {
        const std::int64_t at = pages.index(table[static_cast<std::size_t>(b * max_pages + j / page)], h, j % page);
        const std::int64_t from = dense.k.index(b, h, j);
        std::memcpy(k_pages.data() + at * es, k.data() + from * es, kDim * es);
        std::memcpy(v_pages.data() + at * es, v.data() + from * es, kDim * es);
      }
    }
  }
  AttentionProblem paged = dense;
  paged.k = paged.v = pages;
  paged.sequences.page_size = page;
  paged.sequences.num_pages = num_pages;
  paged.sequences.max_pages_per_seq = max_pages;
  Call paged_call{Attention(paged, config), dense_call.args, {}};
  paged_call.args.k = {k_pages.data(), num_pages * page * kKvHeads * kDim};
  paged_call.args.v = {v_pages.data(), num_pages * page * kKvHeads * kDim};
  paged_call.args.o = {o_paged.data(), nq};
  paged_call.args.block_table = {table.data(), num_pages};

  dense_call.op.run(dense_call.args);  // (warm-up: scratch, the thread team)
  paged_call.op.run(paged_call.args);
  if (o_dense != o_paged) std::fprintf(stderr, "note: the paged output differs from the dense one in some bits\n");
  for (int turn = 0; turn < 4; ++turn) {
    time_for(dense_call, seconds / 4);
    time_for(paged_call, seconds / 4);
  }
  const double bytes = 2.0 * kKvHeads * kDim * static_cast<double>(es) *
                       static_cast<double>(std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
  const double d = median_us(dense_call.us), p = median_us(paged_call.us);
  std::printf("dense  %.1f us %.1f GB/s  %s\n", d, bytes / d / 1e3, dense_call.op.describe().c_str());
  std::printf("%s %lld %.1f us %.1f GB/s  dense/paged %.3f  %s\n", order.c_str(), static_cast<long long>(page), p,
              bytes / p / 1e3, d / p, paged_call.op.describe().c_str());
  return 0;
}
