// `attnkit gqa`: the GroupQueryAttention op as a decoder runs it: one prompt (prefill) into a shared KV cache,
// then N decode steps, each appending one token per sequence in place. Default shape: Llama-3-8B's attention
// (32 query heads, 8 KV heads of 128). Reports the prefill time and, per decode step, its time and the tokens
// per second it gives (batch / step time). With --device cuda the tensors live on the GPU; a step's time is the
// wall time of the call and a device synchronisation (what a decoder loop waits for), with seqlens_k and
// total_sequence_length on the host as a decoder keeps them.
#include <algorithm>
#include <attnkit/gqa.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cuda/host/cuda_backend.hpp"

namespace attnkit::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kRopeTheta = 500000.0;  // Llama 3's rotary base
constexpr float kCacheRange = 4.0f;      // quantization scales cover |x| <= 4 (random normal inputs)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct CacheChoice {
  DType dtype = DType::f32;  // the query's type (a float cache has it too)
  bool quantized = false;
  int bits = 8;
};

CacheChoice parse_cache(const GqaBenchOptions& o) {
  CacheChoice c;
  const std::optional<DType> q = testing::parse_dtype(o.dtype);
  if (!q) throw UsageError("--dtype: unknown type '" + o.dtype + "' (float32, float16 or bfloat16)");
  c.dtype = *q;
  if (o.cache == "int8" || o.cache == "int4") {
    c.quantized = true;
    c.bits = o.cache == "int8" ? 8 : 4;
    return c;
  }
  const std::optional<DType> t = testing::parse_dtype(o.cache);
  if (!t) throw UsageError("--cache: unknown cache '" + o.cache + "' (float32, float16, bfloat16, int8 or int4)");
  c.dtype = *t;  // a float cache has the query's type: --cache float16 runs the whole op in float16
  return c;
}

std::vector<std::byte> random_tensor(DType t, std::int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::byte> b(static_cast<std::size_t>(n) * dtype_size(t));
  for (std::int64_t i = 0; i < n; ++i) store_from_float(b.data(), t, i, normal(rng));
  return b;
}

// --json: the settings, the prefill's seconds and every decode step's, for scripts.
void write_gqa_json(const std::string& path, std::ofstream& file, const GqaBenchOptions& o, const std::string& kernel,
                    double prefill_s, const std::vector<double>& steps_s, const std::string& command) {
  nlohmann::ordered_json j;
  j["command"] = command;
  j["settings"] = {{"batch", o.batch},   {"prompt", o.prompt},   {"steps", o.steps},   {"heads", o.heads},
                   {"kv_heads", o.kv_heads}, {"head_size", o.head_size}, {"dtype", o.dtype}, {"cache", o.cache},
                   {"quant", o.quant},   {"window", o.window},   {"rotary", o.rotary}, {"threads", o.threads},
                   {"device", o.device}, {"seed", o.seed}};
  j["kernel"] = kernel;
  j["prefill_ms"] = prefill_s * 1e3;
  j["prefill_tokens_per_s"] = static_cast<double>(o.batch * o.prompt) / prefill_s;
  std::vector<double> ms;
  for (double s : steps_s) ms.push_back(s * 1e3);
  j["decode_ms"] = ms;
  if (!steps_s.empty()) {
    std::vector<double> sorted = steps_s;
    std::sort(sorted.begin(), sorted.end());
    j["decode_median_ms"] = sorted[sorted.size() / 2] * 1e3;
    j["decode_tokens_per_s"] = static_cast<double>(o.batch) / sorted[sorted.size() / 2];
  }
  file << j.dump(2) << "\n";
  file.close();
  if (!file) throw std::runtime_error("writing '" + path + "' failed");
}

ElementType element_of(DType t) {
  return t == DType::f32 ? ElementType::float32 : t == DType::f16 ? ElementType::float16 : ElementType::bfloat16;
}

}  // namespace

CLI::App* add_gqa_command(CLI::App& app, GqaBenchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "gqa", "GroupQueryAttention (ONNX Runtime's op): a prefill, then decode steps on a shared KV cache");
  cmd->add_option("--batch", o.batch, "Sequences decoded together")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--prompt", o.prompt, "Prompt tokens per sequence (the prefill)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--steps", o.steps, "Decode steps after the prompt")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--heads", o.heads, "Query heads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-heads", o.kv_heads, "Key/value heads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--head-size", o.head_size, "Head size (at most 256)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--dtype", o.dtype, "Query / output type (float32, float16, bfloat16); a float cache sets it")
      ->capture_default_str();
  cmd->add_option("--cache", o.cache, "KV cache: float32, float16, bfloat16, int8 or int4")->capture_default_str();
  cmd->add_option("--quant", o.quant, "Scales of a quantized cache: per-tensor or per-channel")->capture_default_str();
  cmd->add_option("--window", o.window, "Local window: keys each query sees, itself included (-1: off)")
      ->capture_default_str();
  cmd->add_flag("--rotary,!--no-rotary", o.rotary, "Rotary position embedding inside the op (default: on)");
  cmd->add_option("--threads", o.threads, "Worker threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  cmd->add_option("--device", o.device, "Where the op runs: cpu or cuda")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the random inputs")->capture_default_str();
  cmd->add_option("--json", o.json_path, "Also write the settings and times as JSON to this file");
  return cmd;
}

int run_gqa(const GqaBenchOptions& o, Context& ctx) {
  const CacheChoice cache = parse_cache(o);
  if (o.quant != "per-tensor" && o.quant != "per-channel") {
    throw UsageError("--quant: '" + o.quant + "' is not per-tensor or per-channel");
  }
  if (o.heads % o.kv_heads != 0) throw UsageError("--heads must be a multiple of --kv-heads");
  std::ofstream json;  // opened first: a bad path fails before the run
  if (!o.json_path.empty()) {
    json.open(o.json_path);
    if (!json) throw UsageError("--json: cannot write '" + o.json_path + "'");
  }
  const std::int64_t B = o.batch, P = o.prompt, N = o.heads, Nkv = o.kv_heads, H = o.head_size;
  const std::int64_t capacity = P + o.steps;
  const DType t = cache.dtype;
  const ElementType et = element_of(t);
  std::mt19937_64 rng(o.seed);

  GqaAttributes attrs;
  attrs.num_heads = N;
  attrs.kv_num_heads = Nkv;
  attrs.local_window_size = o.window;
  attrs.do_rotary = o.rotary ? 1 : 0;
  const std::string quant = o.quant == "per-tensor" ? "PER_TENSOR" : "PER_CHANNEL";
  if (cache.quantized) {
    attrs.k_quant_type = attrs.v_quant_type = quant;
    attrs.kv_cache_bit_width = cache.bits;
  }
  if (o.device != "cpu" && o.device != "cuda") throw UsageError("--device: '" + o.device + "' is not cpu or cuda");
  const bool on_gpu = o.device == "cuda";
  if (on_gpu && !cuda::available()) throw UsageError("--device cuda: no CUDA device (or this build has no CUDA backend)");
  GqaConfig config;
  config.backend = on_gpu ? Backend::Cuda : Backend::Cpu;
  config.threads = o.threads;
  GroupQueryAttention op(attrs, config);
  // Tensors the op reads or writes: on the host, or device copies of them.
  std::vector<void*> device_buffers;
  struct DeviceFree {
    std::vector<void*>& all;
    ~DeviceFree() {
      for (void* p : all) cuda::device_free(p);
    }
  } free_all{device_buffers};
  auto place = [&](const void* host, std::size_t bytes) -> void* {
    if (!on_gpu) return const_cast<void*>(host);
    void* d = cuda::device_alloc(std::max<std::size_t>(bytes, 1));
    device_buffers.push_back(d);
    cuda::copy_to_device(d, host, bytes);
    return d;
  };

  // The shared cache (past and present are one buffer: every call appends in place).
  const std::int64_t row_bytes = !cache.quantized  ? H * static_cast<std::int64_t>(dtype_size(t))
                                 : cache.bits == 8 ? H
                                                   : (H + 1) / 2;
  const std::int64_t last_dim = cache.quantized && cache.bits == 4 ? (H + 1) / 2 : H;
  const ElementType cache_type = !cache.quantized ? et : cache.bits == 8 ? ElementType::int8 : ElementType::uint8;
  std::vector<std::byte> k_cache(static_cast<std::size_t>(B * Nkv * capacity * row_bytes)), v_cache(k_cache.size());
  const float scale = kCacheRange / (cache.bits == 8 ? 127.0f : 7.0f);
  std::vector<float> scales(o.quant == "per-tensor" ? 1 : static_cast<std::size_t>(Nkv * H), scale);

  void* k_at = place(k_cache.data(), k_cache.size());
  void* v_at = place(v_cache.data(), v_cache.size());
  const void* scales_at = place(scales.data(), scales.size() * sizeof(float));

  // Rotary tables for every position of the run.
  const std::int64_t half = H / 2;
  std::vector<std::byte> cos_t(static_cast<std::size_t>(capacity * half) * dtype_size(t)), sin_t(cos_t.size());
  for (std::int64_t p = 0; p < capacity; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle =
          static_cast<double>(p) * std::pow(kRopeTheta, -2.0 * static_cast<double>(i) / static_cast<double>(H));
      store_from_float(cos_t.data(), t, p * half + i, static_cast<float>(std::cos(angle)));
      store_from_float(sin_t.data(), t, p * half + i, static_cast<float>(std::sin(angle)));
    }
  }

  const void* cos_at = place(cos_t.data(), cos_t.size());
  const void* sin_at = place(sin_t.data(), sin_t.size());

  // One call on tensors already placed (q, k, v, out: device copies with --device cuda).
  auto call = [&](std::int64_t S, std::int64_t past, const void* q, const void* k, const void* v, void* out) {
    std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B), static_cast<std::int32_t>(past + S - 1));
    std::int32_t total = static_cast<std::int32_t>(past + S);
    GqaInputs in;
    in.query = {q, et, {B, S, N * H}};
    in.key = {k, et, {B, S, Nkv * H}};
    in.value = {v, et, {B, S, Nkv * H}};
    in.past_key = {k_at, cache_type, {B, Nkv, capacity, last_dim}};
    in.past_value = {v_at, cache_type, {B, Nkv, capacity, last_dim}};
    in.seqlens_k = {seqlens.data(), ElementType::int32, {B}};
    in.total_sequence_length = {&total, ElementType::int32, {}};
    if (o.rotary) {
      in.cos_cache = {cos_at, et, {capacity, half}};
      in.sin_cache = {sin_at, et, {capacity, half}};
    }
    if (cache.quantized) {
      in.k_scale = {scales_at, ElementType::float32, {static_cast<std::int64_t>(scales.size())}};
      in.v_scale = in.k_scale;
    }
    GqaOutputs outs;
    outs.output = {out, et, {B, S, N * H}};
    outs.present_key = {k_at, cache_type, {B, Nkv, capacity, last_dim}};
    outs.present_value = {v_at, cache_type, {B, Nkv, capacity, last_dim}};
    op.run(in, outs);
    if (on_gpu) cuda::synchronize();
  };

  const std::string cache_label = cache.quantized ? o.cache + " " + o.quant : o.cache;
  ctx.out << strprintf(
      "gqa: batch %lld, %lld query heads / %lld kv heads of %lld, %s queries, %s cache, "
      "window %lld, rotary %s, %s\n",
      static_cast<long long>(B), static_cast<long long>(N), static_cast<long long>(Nkv), static_cast<long long>(H),
      dtype_string(t).c_str(), cache_label.c_str(), static_cast<long long>(o.window), o.rotary ? "on" : "off",
      on_gpu ? "on cuda" : (std::to_string(resolve_threads(o.threads)) + " threads").c_str());
  ctx.out << strprintf("      cache %lld rows per head, %.1f MiB for K and V\n", static_cast<long long>(capacity),
                       2.0 * static_cast<double>(k_cache.size()) / (1 << 20));

  double prefill_s = 0.0;
  {
    const auto q = random_tensor(t, B * P * N * H, rng), k = random_tensor(t, B * P * Nkv * H, rng),
               v = random_tensor(t, B * P * Nkv * H, rng);
    std::vector<std::byte> out(static_cast<std::size_t>(B * P * N * H) * dtype_size(t));
    const void* q_at = place(q.data(), q.size());
    const void* kn_at = place(k.data(), k.size());
    const void* vn_at = place(v.data(), v.size());
    void* out_at = place(out.data(), out.size());
    const auto t0 = Clock::now();
    call(P, 0, q_at, kn_at, vn_at, out_at);
    const double s = prefill_s = seconds_since(t0);
    ctx.out << strprintf("prefill  %lld tokens x %lld: %9.3f ms  %10.0f tokens/s   [%s]\n", static_cast<long long>(P),
                         static_cast<long long>(B), s * 1e3, static_cast<double>(B * P) / s, op.describe().c_str())
            << std::flush;
  }
  if (o.steps == 0) {
    if (json.is_open()) write_gqa_json(o.json_path, json, o, op.describe(), prefill_s, {}, ctx.command_line);
    return kExitOk;
  }

  const auto q = random_tensor(t, B * N * H, rng), k = random_tensor(t, B * Nkv * H, rng),
             v = random_tensor(t, B * Nkv * H, rng);
  std::vector<std::byte> out(static_cast<std::size_t>(B * N * H) * dtype_size(t));
  const void* q_at = place(q.data(), q.size());
  const void* k_new = place(k.data(), k.size());
  const void* v_new = place(v.data(), v.size());
  void* out_at = place(out.data(), out.size());
  std::vector<double> times;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    if (ctx.should_stop()) {
      ctx.out << strprintf("interrupted after %lld of %lld decode steps\n", static_cast<long long>(step),
                           static_cast<long long>(o.steps));
      return kExitInterrupted;
    }
    const auto t0 = Clock::now();
    call(1, P + step, q_at, k_new, v_new, out_at);
    times.push_back(seconds_since(t0));
  }
  const std::int64_t shown = std::min<std::int64_t>(o.steps, 8);
  for (std::int64_t step = 0; step < o.steps; ++step) {
    if (step >= shown && step != o.steps - 1) continue;
    if (step > shown) ctx.out << "  ...\n";
    const double s = times[static_cast<std::size_t>(step)];
    ctx.out << strprintf("decode %5lld (keys %6lld): %9.3f ms  %10.1f tokens/s\n", static_cast<long long>(step),
                         static_cast<long long>(P + step + 1), s * 1e3, static_cast<double>(B) / s);
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0.0;
  for (double s : times) sum += s;
  const double median = sorted[sorted.size() / 2];
  ctx.out << strprintf("decode: %lld steps, median %.3f ms (min %.3f, mean %.3f), %.1f tokens/s at the median   [%s]\n",
                       static_cast<long long>(o.steps), median * 1e3, sorted.front() * 1e3,
                       sum / static_cast<double>(times.size()) * 1e3, static_cast<double>(B) / median,
                       op.describe().c_str());
  if (json.is_open()) {
    write_gqa_json(o.json_path, json, o, op.describe(), prefill_s, times, ctx.command_line);
    ctx.out << "wrote " << o.json_path << "\n";
  }
  return kExitOk;
}

}  // namespace attnkit::cli
