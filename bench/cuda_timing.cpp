// Times attnkit's CUDA kernels alone on the PERF.md shapes and cases/llm.json's: eager (CUDA events around
// back-to-back calls, host launch cost included where the GPU outruns it) and by CUDA-graph replay (20 calls
// captured in one graph, as bench/bench_cuda.py times them), medians. A quick look between full runs, and the
// way to compare two builds of a kernel in one device run; the numbers that count come from bench/bench_cuda.py,
// side by side with PyTorch in one process.
//   usage: attnkit_cuda_timing [case-substring [dtype [plan]]]
//          attnkit_cuda_timing shape:B,H,HKV,SQ,SK,D[,causal[,DV[,PAD[,FROM]]]] [dtype [plan]]   (one shape of your own,
//          head-first; PAD: every row of Q, K, V and O PAD elements longer than its head dim, as in a slice of a wider
//          tensor; FROM > 0: device key lengths drawn uniformly from [FROM, SK], seed 1, as a serving step's; GB/s
//          then counts the keys they reach; PAGE > 0: K and V in a paged cache [pages, PAGE, HKV, D] whose block
//          table gives each sequence shuffled pages)
//          attnkit_cuda_timing pshape:B,H,HKV,SQ,SK,D[,causal[,DV]] [dtype [plan]]  (the same, positions-first: [B, S, H, D],
//          the layout of PyTorch's and the Python benchmarks' tensors)
//   plan: plan overrides in their text form (e.g. kernel=mma,splits=4), "" for the plan's own choice.
#include <attnkit/attention.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace attnkit;

int main(int argc, char** argv) {
  const std::string only_case = argc > 1 ? argv[1] : "";
  const std::string only_dtype = argc > 2 ? argv[2] : "";
  const PlanOverrides plan = parse_plan_overrides(argc > 3 ? argv[3] : "");
  struct Case {
    const char* name;
    std::int64_t b, h, hkv, sq, sk, d;
    bool causal;
    std::int64_t dv = 0;
    bool positions_first = false;
    std::int64_t pad = 0;
    std::int64_t lengths_from = 0;  // > 0: device key lengths uniform in [lengths_from, sk]
  };
  std::vector<Case> cases = {
      {"minilm_b1_s128", 1, 12, 12, 128, 128, 32, false},   {"minilm_b8_s128", 8, 12, 12, 128, 128, 32, false},
      {"bert_b1_s128", 1, 12, 12, 128, 128, 64, false},     {"bert_b8_s128", 8, 12, 12, 128, 128, 64, false},
      {"bert_b1_s512", 1, 12, 12, 512, 512, 64, false},
      {"bert_b8_s512", 8, 12, 12, 512, 512, 64, false},     {"whisper_enc_1500", 1, 12, 12, 1500, 1500, 64, false},
      {"whisper_dec_448", 1, 12, 12, 1, 448, 64, true},     {"whisper_cross_1q", 1, 12, 12, 1, 1500, 64, false},
      {"fa3_h128_s4k", 4, 16, 16, 4096, 4096, 128, false},  {"fa3_h64_s4k", 4, 32, 32, 4096, 4096, 64, false},
      {"fa3_h128_s4k_causal", 4, 16, 16, 4096, 4096, 128, true},
      {"llama8b_prefill_s4k_gqa", 1, 32, 8, 4096, 4096, 128, true},
      {"llama8b_decode_b64_k4k_gqa", 64, 32, 8, 1, 4096, 128, true},
      {"llama8b_decode_b8_k32k_gqa", 8, 32, 8, 1, 32768, 128, true},
      {"llama70b_prefill_s8k_gqa", 1, 64, 8, 8192, 8192, 128, true},
      {"bert_large_b32_s256", 32, 16, 16, 256, 256, 64, false},
      {"mqa_decode_b16_k16k", 16, 32, 1, 1, 16384, 128, true},
  };
  const bool own_positions_first = only_case.rfind("pshape:", 0) == 0;
  std::int64_t page = 0;  // > 0: a paged K/V cache of pages of `page` keys
  if (only_case.rfind("shape:", 0) == 0 || own_positions_first) {
    Case own{own_positions_first ? "pshape" : "shape", 1, 1, 1, 1, 1, 64, false};
    own.positions_first = own_positions_first;
    int causal = 0;
    const int n = std::sscanf(only_case.c_str() + (own_positions_first ? 7 : 6), "%ld,%ld,%ld,%ld,%ld,%ld,%d,%ld,%ld,%ld,%ld",
                              &own.b, &own.h, &own.hkv, &own.sq, &own.sk, &own.d, &causal, &own.dv, &own.pad,
                              &own.lengths_from, &page);
    if (n < 6) {
      std::fprintf(stderr, "usage: [p]shape:B,H,HKV,SQ,SK,D[,causal[,DV[,PAD[,FROM[,PAGE]]]]]\n");
      return 2;
    }
    own.causal = causal != 0;
    cases = {own};
  }
  std::printf("%-28s %-9s %10s %10s %9s %9s  %s\n", "case", "dtype", "eager us", "graph us", "TFLOP/s", "GB/s",
              "kernel");
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (const Case& c : cases) {
    if (cases.size() > 1 && std::string(c.name).find(only_case) == std::string::npos) continue;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      if (!only_dtype.empty() && only_dtype != dtype_name(t)) continue;
      const std::int64_t dv = c.dv > 0 ? c.dv : c.d;
      // Rows of `cols` elements and c.pad more (a slice of a wider tensor), in the case's order.
      const auto layout = [&](std::int64_t heads, std::int64_t rows, std::int64_t cols) {
        return c.positions_first ? Layout::positions_first(heads, rows, cols + c.pad)
                                 : Layout::head_first(heads, rows, cols + c.pad);
      };
      AttentionProblem p = AttentionProblem::head_first(c.b, c.h, c.hkv, c.sq, c.sk, c.d, t);
      p.causal = c.causal;
      p.v_head_dim = dv;
      p.q = layout(c.h, c.sq, c.d);
      p.k = layout(c.hkv, c.sk, c.d);
      p.v = layout(c.hkv, c.sk, dv);
      p.o = layout(c.h, c.sq, dv);
      const std::size_t es = dtype_size(t);
      // A paged cache: every sequence's pages, shuffled over the cache.
      const std::int64_t pages_per_seq = page > 0 ? (c.sk + page - 1) / page : 0;
      const std::int64_t key_rows = page > 0 ? pages_per_seq * page : c.sk;
      if (page > 0) {
        p.k = Layout::positions_first(c.hkv, page, c.d + c.pad);
        p.v = Layout::positions_first(c.hkv, page, dv + c.pad);
        p.sequences.page_size = page;
        p.sequences.num_pages = c.b * pages_per_seq;
        p.sequences.max_pages_per_seq = pages_per_seq;
      }
      const std::int64_t nq = c.b * c.h * c.sq * (c.d + c.pad), nk = c.b * c.hkv * key_rows * (c.d + c.pad);
      const std::int64_t nv = c.b * c.hkv * key_rows * (dv + c.pad), no = c.b * c.h * c.sq * (dv + c.pad);
      std::vector<std::uint16_t> host(static_cast<std::size_t>(std::max(nq, nk)) * 2);
      std::mt19937 rng(1);
      std::normal_distribution<float> normal;
      const std::int64_t most = std::max({nq, nk, nv});
      std::vector<char> bytes(static_cast<std::size_t>(most) * es);
      for (std::int64_t i = 0; i < most; ++i) store_from_float(bytes.data(), t, i, normal(rng));
      void *q, *k, *v, *o;
      cudaMalloc(&q, nq * es); cudaMalloc(&k, nk * es); cudaMalloc(&v, nv * es); cudaMalloc(&o, no * es);
      cudaMemcpy(q, bytes.data(), nq * es, cudaMemcpyHostToDevice);
      cudaMemcpy(k, bytes.data(), nk * es, cudaMemcpyHostToDevice);
      cudaMemcpy(v, bytes.data(), nv * es, cudaMemcpyHostToDevice);
      // Device key lengths (a serving step's): the keys they reach, for the GB/s below.
      std::vector<std::int32_t> lengths;
      std::int32_t* lengths_dev = nullptr;
      double keys_read = static_cast<double>(c.b) * c.sk;
      if (c.lengths_from > 0) {
        std::uniform_int_distribution<std::int64_t> draw(std::min(c.lengths_from, c.sk), c.sk);
        keys_read = 0;
        for (std::int64_t b = 0; b < c.b; ++b) {
          lengths.push_back(static_cast<std::int32_t>(draw(rng)));
          keys_read += lengths.back();
        }
        cudaMalloc(&lengths_dev, lengths.size() * 4);
        cudaMemcpy(lengths_dev, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice);
        p.has_key_lengths = true;
      }
      AttentionConfig cfg;
      cfg.backend = Backend::Cuda;
      cfg.plan = plan;
      Attention op(p, cfg);
      AttentionArgs a;
      a.q = {q, nq}; a.k = {k, nk}; a.v = {v, nv}; a.o = {o, no};
      if (lengths_dev != nullptr) a.key_lengths = {lengths_dev, c.b};
      std::int32_t* table_dev = nullptr;
      if (page > 0) {
        std::vector<std::int32_t> table(static_cast<std::size_t>(c.b * pages_per_seq));
        for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
        std::shuffle(table.begin(), table.end(), rng);
        cudaMalloc(&table_dev, table.size() * 4);
        cudaMemcpy(table_dev, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
        a.block_table = {table_dev, static_cast<std::int64_t>(table.size())};
      }
      a.stream = stream;
      for (int i = 0; i < 3; ++i) op.run(a);
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0); cudaEventCreate(&e1);
      // Median milliseconds per call of `calls` calls of `body` between two events, over 15 repetitions.
      const auto median_ms = [&](int calls, const auto& body) {
        std::vector<float> ms;
        for (int rep = 0; rep < 15; ++rep) {
          cudaEventRecord(e0, stream);
          body();
          cudaEventRecord(e1, stream);
          cudaEventSynchronize(e1);
          float m = 0; cudaEventElapsedTime(&m, e0, e1); ms.push_back(m / calls);
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
      };
      const float eager_ms = median_ms(5, [&] { for (int i = 0; i < 5; ++i) op.run(a); });
      constexpr int kGraphCalls = 20;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
      for (int i = 0; i < kGraphCalls; ++i) op.run(a);
      cudaStreamEndCapture(stream, &graph);
      float graph_ms = 0;
      if (graph != nullptr && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
        cudaGraphLaunch(exec, stream);
        graph_ms = median_ms(kGraphCalls, [&] { cudaGraphLaunch(exec, stream); });
        cudaGraphExecDestroy(exec);
      }
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaEventDestroy(e0); cudaEventDestroy(e1);
      const double sec = (graph_ms > 0 ? graph_ms : eager_ms) * 1e-3;
      double pairs = static_cast<double>(c.sq) * c.sk;
      if (c.causal && c.sq > 1) pairs = static_cast<double>(c.sq) * (c.sk - c.sq) + c.sq * (c.sq + 1) / 2.0;
      const double flops = 2.0 * c.b * c.h * pairs * (c.d + dv);
      const double bytes_min = static_cast<double>(es) * (c.b * c.h * c.sq + keys_read * c.hkv) * (c.d + dv);
      std::printf("%-28s %-9s %10.2f %10.2f %9.1f %9.0f  %s\n", c.name, std::string(dtype_name(t)).c_str(),
                  eager_ms * 1e3, graph_ms * 1e3, flops / sec / 1e12, bytes_min / sec / 1e9, op.describe().c_str());
      cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lengths_dev); cudaFree(table_dev);
      if (cudaGetLastError() != cudaSuccess) { std::printf("CUDA error\n"); return 1; }
    }
  }
}
