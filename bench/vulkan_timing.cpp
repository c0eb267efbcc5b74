// The Vulkan backend against attnkit's CUDA backend on the seed's shapes and fa3_h128_s4k, in one process on one
// GPU: the Vulkan call's GPU time (timestamp queries around its kernels) and wall time (host copies, submit and
// wait included: host-buffer calls), and the CUDA backend's time per call (CUDA events around back-to-back calls
// on device buffers). Medians of repeated calls. PyTorch's unfused chain on the same shapes comes from
// bench/bench_cuda.py (scripts/gpu-check runs both; see docs/benchmarks.md).
//   usage: attnkit_vulkan_timing [case-substring] [--kernel rows|coopmat] [--stats]
//   (--stats: the driver's statistics of every pipeline made, at the end: registers, spills, ...)
#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace attnkit;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Case { const char* name; std::int64_t b, h, hkv, sq, sk, d; bool causal; };

struct HostData {
  std::vector<std::uint16_t> q16, k16, v16, o16;
  std::vector<float> q32, k32, v32, o32;
};

void fill(const AttentionProblem& p, DType t, HostData& h) {
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto make = [&](std::int64_t count, std::vector<float>& f, std::vector<std::uint16_t>& s) {
    f.resize(count);
    for (auto& x : f) x = n(rng);
    if (t == DType::f16) {
      s.resize(count);
      for (std::int64_t i = 0; i < count; ++i) s[i] = float_to_half_bits(f[i]);
    }
  };
  make(p.batch * p.heads * p.q_len * p.head_dim, h.q32, h.q16);
  make(p.batch * p.kv_heads * p.k_len * p.head_dim, h.k32, h.k16);
  make(p.batch * p.kv_heads * p.k_len * p.head_dim, h.v32, h.v16);
  make(p.batch * p.heads * p.q_len * p.head_dim, h.o32, h.o16);
}

AttentionArgs host_args(const AttentionProblem& p, DType t, HostData& h) {
  AttentionArgs a;
  const bool half = t == DType::f16;
  a.q = {half ? static_cast<const void*>(h.q16.data()) : h.q32.data(), static_cast<std::int64_t>(h.q32.size())};
  a.k = {half ? static_cast<const void*>(h.k16.data()) : h.k32.data(), static_cast<std::int64_t>(h.k32.size())};
  a.v = {half ? static_cast<const void*>(h.v16.data()) : h.v32.data(), static_cast<std::int64_t>(h.v32.size())};
  a.o = {half ? static_cast<void*>(h.o16.data()) : h.o32.data(), static_cast<std::int64_t>(h.o32.size())};
  return a;
}

// CUDA backend: device copies of the inputs, events around back-to-back calls.
double cuda_ms(const AttentionProblem& p, const AttentionArgs& host, DType t) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 0.0;
  const std::size_t es = dtype_size(t);
  AttentionArgs d = host;
  std::vector<void*> owned;
  auto up = [&](const void* src, std::int64_t n) {
    void* x = nullptr;
    cudaMalloc(&x, n * es);
    cudaMemcpy(x, src, n * es, cudaMemcpyHostToDevice);
    owned.push_back(x);
    return x;
  };
  d.q.data = up(host.q.data, host.q.elements);
  d.k.data = up(host.k.data, host.k.elements);
  d.v.data = up(host.v.data, host.v.elements);
  d.o.data = up(host.o.data, host.o.elements);
  AttentionConfig c;
  c.backend = Backend::Cuda;
  Attention op(p, c);
  for (int i = 0; i < 3; ++i) op.run(d);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> per_call;
  constexpr int kCalls = 10;
  for (int s = 0; s < 7; ++s) {
    cudaEventRecord(e0);
    for (int i = 0; i < kCalls; ++i) op.run(d);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    per_call.push_back(ms / kCalls);
  }
  for (void* x : owned) cudaFree(x);
  return median(per_call);
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, kernel;
  bool stats = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kernel") == 0 && i + 1 < argc) kernel = argv[++i];
    else if (std::strcmp(argv[i], "--stats") == 0) stats = true;
    else only = argv[i];
  }
  if (stats) {
    vulkan::Options options;
    options.pipeline_statistics = true;
    vulkan::configure(options);
  }
  const std::vector<Case> cases = {
      {"minilm_b1_s128", 1, 12, 12, 128, 128, 32, false},   {"minilm_b8_s128", 8, 12, 12, 128, 128, 32, false},
      {"bert_b1_s128", 1, 12, 12, 128, 128, 64, false},     {"bert_b8_s128", 8, 12, 12, 128, 128, 64, false},
      {"bert_b1_s512", 1, 12, 12, 512, 512, 64, false},     {"bert_b8_s512", 8, 12, 12, 512, 512, 64, false},
      {"whisper_enc_1500", 1, 12, 12, 1500, 1500, 64, false}, {"whisper_dec_448", 1, 12, 12, 1, 448, 64, true},
      {"whisper_cross_1q", 1, 12, 12, 1, 1500, 64, false},  {"fa3_h128_s4k", 4, 16, 16, 4096, 4096, 128, false},
  };
  std::printf("device: %s\n", vulkan::current_device().name.c_str());
  std::printf("%-18s %-8s %11s %11s %11s %8s %8s %7s  %s\n", "case", "dtype", "vk_gpu_ms", "vk_wall_ms", "cuda_ms",
              "vk_TF/s", "cu_TF/s", "vk/cu", "vulkan kernel");
  for (const Case& c : cases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    for (DType t : {DType::f16, DType::f32}) {
      AttentionProblem p = AttentionProblem::head_first(c.b, c.h, c.hkv, c.sq, c.sk, c.d, t);
      p.causal = c.causal;
      HostData h;
      fill(p, t, h);
      const AttentionArgs args = host_args(p, t, h);
      AttentionConfig vc;
      vc.backend = Backend::Vulkan;
      vc.plan.kernel = kernel;
      try {
        Attention op(p, vc);
        for (int i = 0; i < 3; ++i) op.run(args);
        std::vector<double> gpu, wall;
        for (int i = 0; i < 15; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          op.run(args);
          wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          gpu.push_back(vulkan::last_gpu_milliseconds());
        }
        const double flops = 4.0 * c.b * c.h * c.sq * c.sk * c.d * (c.causal && c.sq > 1 ? 0.5 : 1.0);
        const double g = median(gpu), w = median(wall), cu = cuda_ms(p, args, t);
        std::printf("%-18s %-8s %11.4f %11.4f %11.4f %8.2f %8.2f %7.2f  %s\n", c.name,
                    std::string(dtype_name(t)).c_str(), g, w, cu, flops / (g * 1e9), cu > 0 ? flops / (cu * 1e9) : 0.0,
                    cu > 0 ? cu / g : 0.0, op.describe().c_str());
      } catch (const std::exception& e) {
        std::printf("%-18s %-8s failed: %s\n", c.name, std::string(dtype_name(t)).c_str(), e.what());
      }
    }
  }
  if (stats) {
    const std::vector<std::string> lines = vulkan::pipeline_statistics();
    std::printf("pipeline statistics: %s\n", lines.empty() ? "none (the device does not offer them)" : "");
    for (const std::string& line : lines) std::printf("  %s\n", line.c_str());
  }
}
