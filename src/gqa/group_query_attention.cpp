// The GQA op: the composition of its units (see gqa.hpp and docs/gqa.md).
//
//   plan_call         every rule checked, the call resolved (gqa_check.cpp)
//   core problems     built and checked too, before anything is written
//   Q prep            RMS norm, rotary -> Q' in scratch, the query's type (skipped when neither is on: the
//                     core then reads the query, packed or not, in place)
//   K/V append        the same prep on the new K rows, then each (batch entry, kv head) appended to its cache,
//                     quantized as it is written (kv_cache.cpp)
//   attention         the core (Attention) reading Q' and the present caches in place: key lengths, per-batch
//                     causal offsets, window, softcap, bias as its mask, sinks
//   output_qk         optional, from the same core problem (output_qk.cpp)
#include <omp.h>

#include <algorithm>
#include <attnkit/gqa.hpp>
#include <cstring>

#include "../core/kv_quant.hpp"
#include "../core/problem_check.hpp"
#include "cuda/host/cuda_backend.hpp"
#include "gqa/cuda/gqa_device.hpp"
#include "gqa_plan.hpp"
#include "head_row.hpp"
#include "output_qk.hpp"
#include "qk_norm.hpp"
#include "rotary.hpp"

namespace attnkit {
namespace {

constexpr std::size_t kScratchAlign = 64;  // the core requires caller scratch aligned to 64 bytes
constexpr std::int64_t kMaxHeadSize = 256;

// A byte buffer that only grows, handing out a 64-byte aligned start.
struct AlignedScratch {
  std::vector<std::byte> bytes;
  std::byte* get(std::size_t size) {
    if (bytes.size() < size + kScratchAlign) bytes.resize(size + kScratchAlign);
    const auto at = reinterpret_cast<std::uintptr_t>(bytes.data());
    return bytes.data() + (kScratchAlign - at % kScratchAlign) % kScratchAlign;
  }
};

std::string step_name(const gqa::GqaPlan& g) {
  if (g.first_prompt) return "first prompt (S=" + std::to_string(g.seq) + ")";
  if (g.seq == 1) return "decode";
  return "prompt chunk (S=" + std::to_string(g.seq) + ")";
}

std::string cache_name(const gqa::CacheFormat& f) {
  std::string s = f.storage.type == KvType::Float ? std::string(dtype_name(f.dtype))
                                                  : (f.storage.type == KvType::Int8 ? "int8" : "int4");
  if (f.storage.quant == KvQuant::PerTensor) s += " per-tensor";
  if (f.storage.quant == KvQuant::PerChannel) s += " per-channel";
  return s;
}

// What a call did, for describe(): the step, where, the cache mode and formats, Q' and the core's kernel.
// rotate_in_core: Q is rotated by the attention kernel as it loads it (no Q' written).
std::string describe_call(const gqa::GqaPlan& g, const char* where, std::size_t core_calls, const std::string& core,
                          bool rotate_in_core = false) {
  const bool prepare_q = (g.qk_norm || g.rotary) && !rotate_in_core;
  return "gqa " + step_name(g) + where + ", " +
         (g.sliding  ? "window cache"
          : g.shared ? "shared cache"
                     : "separate caches") +
         " K " + cache_name(g.present_key.format) + " / V " + cache_name(g.present_value.format) +
         (prepare_q ? std::string(", Q'") + (g.qk_norm ? " norm" : "") + (g.rotary ? " rotary" : "") : "") +
         (rotate_in_core ? ", Q rotary in the attention kernel" : "") + "; " +
         std::to_string(core_calls) + " core call" + (core_calls > 1 ? "s: " : ": ") + core;
}

// Widens head row `index` of a token buffer, then applies the RMS norm and rotary when on, and rounds to the
// query's type (gqa/head_row.hpp: the same steps append_kv's rotary takes).
void prepare_row(const gqa::GqaPlan& g, const void* base, std::int64_t index, const void* norm_weight,
                 std::int64_t position, float* row) {
  const gqa::RotaryTables tables{g.cos_cache, g.sin_cache, g.dtype, g.rotary_half, g.interleaved};
  const gqa::HeadRowSteps steps{g.dtype, g.head_size, g.qk_norm ? norm_weight : nullptr, g.norm_epsilon,
                                g.rotary ? &tables : nullptr};
  gqa::prepare_head_row(steps, base, index, position, row);
}

}  // namespace

struct GroupQueryAttention::Impl {
  GqaAttributes attributes;
  gqa::GqaSettings settings;
  GqaConfig config;
  AlignedScratch q_scratch;
  AlignedScratch core_scratch;
  std::vector<std::int32_t> key_rows, offsets, first;
  std::vector<float> sinks;
  std::string last = "not run";

  // One call of the attention core (several when a window cache with a bias needs per-batch mask offsets).
  struct CoreCall {
    AttentionProblem problem;  // normalised
    AttentionArgs args;
    std::int64_t batch_offset = 0;  // first batch entry it covers
  };

  // The CUDA backend's state: device scratch, the pinned stage, host copies of small device inputs.
  std::unique_ptr<cuda::DeviceWorkspace> device;
  std::vector<std::vector<std::byte>> host_copies;
  std::vector<std::byte> kept_stage;  // the small arrays kept from call to call, as this call has them

  void run(const GqaInputs& in, const GqaOutputs& out, void* stream);
  void run_cuda(const GqaInputs& in, const GqaOutputs& out, void* stream);
  std::vector<CoreCall> core_calls(const gqa::GqaPlan& g, const void* q, std::int64_t q_elements, bool q_prepared);
};

std::vector<GroupQueryAttention::Impl::CoreCall> GroupQueryAttention::Impl::core_calls(const gqa::GqaPlan& g,
                                                                                       const void* q,
                                                                                       std::int64_t q_elements,
                                                                                       bool q_prepared) {
  const std::int64_t B = g.batch;
  key_rows.resize(static_cast<std::size_t>(B));
  offsets.resize(static_cast<std::size_t>(B));
  first.resize(static_cast<std::size_t>(B));
  std::int32_t max_rows = 0;
  bool evicted = false;
  for (std::int64_t b = 0; b < B; ++b) {
    const gqa::BatchPlan& r = g.rows[static_cast<std::size_t>(b)];
    key_rows[static_cast<std::size_t>(b)] = r.key_rows;
    offsets[static_cast<std::size_t>(b)] = r.past - r.first;  // query i sits at cache row past - first + i
    first[static_cast<std::size_t>(b)] = r.first;
    max_rows = std::max(max_rows, r.key_rows);
    evicted |= r.first > 0;
  }
  sinks.clear();
  if (g.sink == gqa::SinkMode::HeadSink) {
    for (std::int64_t h = 0; h < g.heads; ++h) sinks.push_back(load_as_float(g.head_sink, g.dtype, h));
  } else if (g.sink == gqa::SinkMode::Smooth) {
    sinks.assign(static_cast<std::size_t>(g.heads), 0.0f);  // smooth softmax: a zero logit in every denominator
  }

  AttentionProblem p;
  p.batch = B;
  p.heads = g.heads;
  p.kv_heads = g.kv_heads;
  p.q_len = g.seq;
  p.k_len = max_rows;
  p.head_dim = g.head_size;
  p.scale = g.scale;
  p.dtype = g.dtype;
  p.q = q_prepared ? Layout::positions_first(g.heads, g.seq, g.head_size) : g.q_in;
  p.k = g.present_key.layout();
  p.v = g.present_value.layout();
  p.o = Layout::positions_first(g.heads, g.seq, g.head_size);
  p.k_storage = g.present_key.format.storage;
  p.v_storage = g.present_value.format.storage;
  p.has_key_lengths = true;
  p.causal = g.causal;
  p.has_causal_offsets = g.causal;
  if (g.window > 0) p.window = g.window;
  if (g.softcap > 0.0f) p.softcap = g.softcap;
  p.has_head_sink = g.sink != gqa::SinkMode::None;
  // A row can see no key only when a -inf bias hides them all, or in a padded prompt row past its window:
  // such a row gives zeros (finite, meaningless), not NaN.
  p.masked_rows = MaskedRows::Zero;
  if (g.bias != nullptr) {
    p.has_mask = true;
    p.mask_dtype = g.dtype;
    p.mask = Layout::mask(g.bias_batch, g.bias_heads, g.seq, g.total);
  }

  AttentionArgs a;
  a.q = {q, q_elements};
  const auto cache_values = [&](const gqa::CacheTensor& c) {
    return B * c.kv_heads * c.capacity * c.format.row_values();
  };
  a.k = {g.present_key.data, cache_values(g.present_key)};
  a.v = {g.present_value.data, cache_values(g.present_value)};
  a.o = {g.output, B * g.seq * g.heads * g.head_size};
  if (g.bias != nullptr) a.mask = {g.bias, g.bias_batch * g.bias_heads * g.seq * g.total};
  a.key_lengths = {key_rows.data(), B};
  if (g.causal) a.causal_offsets = {offsets.data(), B};
  if (p.has_head_sink) a.head_sink = {sinks.data(), g.heads};
  const auto scales = [&](const gqa::CacheTensor& c) {
    return ConstBuffer{c.scales, core::kv_scale_count(c.format.storage.quant, c.kv_heads, c.format.head_size)};
  };
  if (p.k_storage.type != KvType::Float) a.k_scale = scales(g.present_key);
  if (p.v_storage.type != KvType::Float) a.v_scale = scales(g.present_value);

  // A window cache that has evicted rows holds token first + r in row r, and the bias is indexed by token:
  // the offset differs per batch entry, which one layout cannot say, so such a call runs per batch entry.
  std::vector<CoreCall> calls;
  if (!(g.bias != nullptr && evicted)) {
    calls.push_back({core::normalize_and_check(p), a, 0});
    return calls;
  }
  for (std::int64_t b = 0; b < B; ++b) {
    AttentionProblem pb = p;
    pb.batch = 1;
    pb.k_len = key_rows[static_cast<std::size_t>(b)];
    pb.q.offset += b * p.q.batch_stride;
    pb.k.offset += b * p.k.batch_stride;
    pb.v.offset += b * p.v.batch_stride;
    pb.o.offset += b * p.o.batch_stride;
    pb.mask.offset += b * p.mask.batch_stride + first[static_cast<std::size_t>(b)];
    AttentionArgs ab = a;
    ab.key_lengths = {key_rows.data() + b, 1};
    if (g.causal) ab.causal_offsets = {offsets.data() + b, 1};
    calls.push_back({core::normalize_and_check(pb), ab, b});
  }
  return calls;
}

// Inputs the CUDA op reads on the host (its checks and its plan need their values); each may be host or device
// memory. Every other tensor of a CUDA call is device memory.
constexpr int kHostReadInputs[] = {5, 6, 9, 11, 12, 13};  // seqlens_k, total_sequence_length, position_ids,
                                                          // head_sink, k_scale, v_scale
bool host_read_input(int index) {
  return std::find(std::begin(kHostReadInputs), std::end(kHostReadInputs), index) != std::end(kHostReadInputs);
}

// Every tensor of a call is host memory (CPU backends) or, with CUDA, device memory where the op reads it there.
void check_memory_kinds(const GqaInputs& in, const GqaOutputs& out, bool on_device) {
  if (!cuda::available()) {
    if (on_device) throw Error("config.backend", "no CUDA device is present (or this build has no CUDA backend)");
    return;
  }
  auto check = [&](const void* data, std::int64_t elements, std::string_view name, bool device_required) {
    if (data == nullptr || elements == 0) return;
    const bool device = cuda::is_device_pointer(data);
    if (device_required && !device) {
      throw Error(std::string(name), "is host memory, but a CUDA call reads it on the device (every tensor but "
                                     "seqlens_k, total_sequence_length, position_ids, head_sink, k_scale and "
                                     "v_scale must be CUDA device memory)");
    }
    if (!on_device && device) {
      throw Error(std::string(name), "is CUDA device memory: run the op with GqaConfig::backend = Backend::Cuda");
    }
  };
  for (int i = 0; i < GqaInputs::kCount; ++i) {
    const TensorView& t = in.input(i);
    if (t.present()) check(t.data, t.elements(), gqa_input_name(i), on_device && !host_read_input(i));
  }
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    const MutableTensorView& t = out.output_at(i);
    if (t.present()) check(t.data, t.elements(), gqa_output_name(i), on_device);
  }
}

void GroupQueryAttention::Impl::run(const GqaInputs& in, const GqaOutputs& out, void* stream) {
  if (config.backend == Backend::Cuda) {
    run_cuda(in, out, stream);
    return;
  }
  check_memory_kinds(in, out, false);
  const gqa::GqaPlan g = gqa::plan_call(settings, in, out);
  const int threads = config.threads > 0 ? config.threads : omp_get_max_threads();
  const bool prepare_q = g.qk_norm || g.rotary;
  const std::size_t es = dtype_size(g.dtype);
  const std::int64_t q_elements = prepare_q ? g.batch * g.seq * g.heads * g.head_size : in.query.elements();
  std::byte* q_prepared = prepare_q ? q_scratch.get(static_cast<std::size_t>(q_elements) * es) : nullptr;

  // Plan and check every core call before writing anything: the core's own checks cannot fail after the
  // caches have been appended.
  std::vector<CoreCall> calls = core_calls(g, prepare_q ? q_prepared : g.query, q_elements, prepare_q);
  const AttentionConfig core_config{config.backend == Backend::Reference ? Backend::Reference : Backend::Cpu,
                                    config.threads, config.plan};
  std::vector<Attention> ops;
  std::size_t scratch_bytes = 0;
  for (const CoreCall& c : calls) {
    ops.emplace_back(c.problem, core_config);
    scratch_bytes = std::max(scratch_bytes, ops.back().scratch_bytes());
  }
  std::byte* scratch = scratch_bytes > 0 ? core_scratch.get(scratch_bytes) : nullptr;
  for (CoreCall& c : calls) {
    c.args.scratch = scratch;
    c.args.scratch_bytes = scratch_bytes;
    core::check_args(c.problem, c.args, scratch_bytes);
  }

  // Small pre-passes (a decode step of a few sequences) run on the calling thread: waking the team costs more
  // than the rows.
  constexpr std::int64_t kParallelRows = 64;
  const bool parallel_q = g.batch * g.seq * g.heads >= kParallelRows;
  const bool parallel_append = g.batch * g.seq * g.kv_heads >= kParallelRows / 2;

  // Q': norm and rotary, in the query's type, positions-first.
  if (prepare_q) {
#pragma omp parallel for num_threads(threads) schedule(static) if (parallel_q)
    for (std::int64_t bs = 0; bs < g.batch * g.seq; ++bs) {
      const std::int64_t b = bs / g.seq;
      const std::int64_t s = bs % g.seq;
      float row[kMaxHeadSize];
      for (std::int64_t h = 0; h < g.heads; ++h) {
        prepare_row(g, g.query, g.q_in.index(b, h, s), g.q_norm_weight, g.position(b, s), row);
        const std::int64_t at = ((b * g.seq + s) * g.heads + h) * g.head_size;
        if (g.dtype == DType::f32) {
          std::memcpy(reinterpret_cast<float*>(q_prepared) + at, row, static_cast<std::size_t>(g.head_size) * sizeof(float));
        } else {
          for (std::int64_t d = 0; d < g.head_size; ++d) store_from_float(q_prepared, g.dtype, at + d, row[d]);
        }
      }
    }
  }

  // The caches: every (batch entry, kv head) independently, K rows prepared like Q, V rows as given.
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (parallel_append)
  for (std::int64_t bh = 0; bh < g.batch * g.kv_heads; ++bh) {
    const std::int64_t b = bh / g.kv_heads;
    const std::int64_t h = bh % g.kv_heads;
    const gqa::BatchPlan& r = g.rows[static_cast<std::size_t>(b)];
    const gqa::HeadAppend rows{r.past_rows, r.drop, r.write_row, g.seq};
    float row[kMaxHeadSize];
    const gqa::CacheTensor* past_k = g.has_past ? &g.past_key : nullptr;
    const gqa::CacheTensor* past_v = g.has_past ? &g.past_value : nullptr;
    // Rows that need no norm or rotary, bound for a float cache of their own type, are copied as bytes (a
    // float16 prompt's append cost more than its attention when each element went through float32).
    const std::int64_t es_in = static_cast<std::int64_t>(dtype_size(g.dtype));
    const auto raw = [&](const void* base, const Layout& layout) -> std::function<const void*(std::int64_t)> {
      return [&, base, layout](std::int64_t s) -> const void* {
        return static_cast<const char*>(base) + layout.index(b, h, s) * es_in;
      };
    };
    const bool k_as_given = !g.qk_norm && !g.rotary && g.present_key.format.dtype == g.dtype;
    const bool v_as_given = g.present_value.format.dtype == g.dtype;
    gqa::append_head(
        past_k, g.present_key, g.shared, rows, b, h,
        [&](std::int64_t s, float* x) {
          prepare_row(g, g.key, g.k_in.index(b, h, s), g.k_norm_weight, g.position(b, s), x);
        },
        row, k_as_given ? raw(g.key, g.k_in) : nullptr);
    gqa::append_head(
        past_v, g.present_value, g.shared, rows, b, h,
        [&](std::int64_t s, float* x) {
          const std::int64_t at = g.v_in.index(b, h, s);
          if (g.dtype == DType::f32) {
            std::memcpy(x, static_cast<const float*>(g.value) + at, static_cast<std::size_t>(g.head_size) * sizeof(float));
            return;
          }
          for (std::int64_t d = 0; d < g.head_size; ++d) x[d] = load_as_float(g.value, g.dtype, at + d);
        },
        row, v_as_given ? raw(g.value, g.v_in) : nullptr);
  }

  for (std::size_t i = 0; i < calls.size(); ++i) ops[i].run(calls[i].args);

  if (g.qk_output != gqa::QkOutput::None) {
    for (const CoreCall& c : calls) {
      const std::int64_t row_block = g.heads * g.seq * g.total * static_cast<std::int64_t>(es);
      gqa::write_output_qk(c.problem, c.args, g.qk_output == gqa::QkOutput::AfterSoftmax, first.data() + c.batch_offset,
                           g.total, static_cast<std::byte*>(g.output_qk) + c.batch_offset * row_block, g.dtype,
                           threads);
    }
  }

  last = describe_call(g, "", calls.size(), ops.front().describe());
}

// The CUDA form of run(): the same checks and plan on the host, then on `stream`: the cache moves, the
// fused pre-pass (Q' and the new K/V rows), the attention core reading the caches in place.
void GroupQueryAttention::Impl::run_cuda(const GqaInputs& in_given, const GqaOutputs& out, void* stream) {
  check_memory_kinds(in_given, out, true);
  if (!device) device = std::make_unique<cuda::DeviceWorkspace>();
  const bool capturing = device->begin_call(stream);
  // Host copies of the small inputs that live on the device.
  GqaInputs in = in_given;
  host_copies.resize(GqaInputs::kCount);
  for (int i : kHostReadInputs) {
    TensorView& t = in.input(i);
    if (!t.present() || t.data == nullptr || !cuda::is_device_pointer(t.data)) continue;
    if (capturing) {
      throw Error(std::string(gqa_input_name(i)), "is read on the host, and a CUDA graph capture cannot read device memory back: "
                                     "pass it in host memory to capture the step");
    }
    const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(t.elements(), 0)) * element_size(t.type);
    host_copies[static_cast<std::size_t>(i)].resize(bytes);
    cuda::copy_to_host(host_copies[static_cast<std::size_t>(i)].data(), t.data, bytes, stream);
    t.data = host_copies[static_cast<std::size_t>(i)].data();
  }
  const gqa::GqaPlan g = gqa::plan_call(settings, in, out);
  const std::size_t es = dtype_size(g.dtype);

  // The core's plans (they need shapes only). Rotary without Q/K norm, where every core call takes the wgmma
  // kernel: that kernel rotates Q as it loads it, so the pre-pass writes no Q' (a 4k Llama prompt: 32 MB
  // written and read back less). Else Q' is prepared when norm or rotary is on.
  std::vector<CoreCall> calls;
  std::vector<cuda::CudaPlan> plans;
  auto plan_calls = [&](bool prepared, std::int64_t q_elements) {
    calls = core_calls(g, g.query, q_elements, prepared);
    plans.clear();
    for (const CoreCall& c : calls) plans.push_back(cuda::plan(c.problem, config.plan));
  };
  cuda::QueryRotary rotary;  // its device positions are filled in below
  rotary.cos = g.cos_cache;
  rotary.sin = g.sin_cache;
  rotary.half = g.rotary_half;
  rotary.interleaved = g.interleaved;
  // Only where a kernel block holds mostly real rows (seq x group >= 64): the rotation adds a dependent load of
  // the cos / sin rows before a block's first MMA, which a decode step (4 rows of a 64-row block) pays in full
  // for a Q' of a few hundred KB (H200, batch 64 decode: 275 -> 281 µs; 4k prompt: 437 -> 405 µs per step).
  bool rotate_in_core = false;
  // (output_qk reads Q' too: with it, Q' is written.)
  if (g.rotary && !g.qk_norm && g.qk_output == gqa::QkOutput::None && g.seq * (g.heads / g.kv_heads) >= 64) {
    plan_calls(false, in.query.elements());
    rotate_in_core = true;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      rotate_in_core = rotate_in_core && cuda::rotates_query(calls[i].problem, calls[i].args, plans[i], rotary);
    }
  }
  const bool prepare_q = (g.qk_norm || g.rotary) && !rotate_in_core;
  const std::int64_t q_elements = prepare_q ? g.batch * g.seq * g.heads * g.head_size : in.query.elements();
  if (!rotate_in_core) plan_calls(prepare_q, q_elements);
  std::size_t core_bytes = 0;
  for (const cuda::CudaPlan& plan : plans) core_bytes = std::max(core_bytes, plan.scratch_bytes);
  const auto align = [](std::size_t x) { return (x + 255) / 256 * 256; };
  const std::int64_t B = g.batch;
  const std::size_t k_scales = static_cast<std::size_t>(
      core::kv_scale_count(g.present_key.format.storage.quant, g.kv_heads, g.head_size));
  const std::size_t v_scales = static_cast<std::size_t>(
      core::kv_scale_count(g.present_value.format.storage.quant, g.kv_heads, g.head_size));
  const std::size_t positions = g.position_ids != nullptr ? static_cast<std::size_t>(B * g.position_row) : 0;
  // Small arrays, each 256-byte aligned: key rows, causal offsets, batch rows, sinks, K / V scales, positions,
  // output_qk's first columns.
  const bool qk = g.qk_output != gqa::QkOutput::None;
  const std::size_t small_sizes[] = {B * sizeof(std::int32_t), B * sizeof(std::int32_t),
                                     B * sizeof(cuda::DeviceBatchRows), static_cast<std::size_t>(g.heads) * sizeof(float),
                                     k_scales * sizeof(float), v_scales * sizeof(float),
                                     positions * sizeof(std::int64_t), qk ? B * sizeof(std::int32_t) : 0};
  // The per-call arrays first, then those a model keeps from call to call (sinks, K / V scales), which go up only
  // when their bytes change (DeviceWorkspace::upload_kept): a decode step then uploads a few hundred bytes.
  constexpr int kSmallArrays = 8;
  constexpr int kOrder[kSmallArrays] = {0, 1, 2, 6, 7, 3, 4, 5};
  constexpr int kFirstKept = 5;
  std::size_t small_at[kSmallArrays];
  std::size_t small_bytes = 0, call_bytes = 0;
  for (int n = 0; n < kSmallArrays; ++n) {
    if (n == kFirstKept) call_bytes = small_bytes;
    small_at[kOrder[n]] = small_bytes;
    small_bytes += align(small_sizes[kOrder[n]]);
  }
  const std::size_t q_bytes = prepare_q ? static_cast<std::size_t>(q_elements) * es : 0;
  std::byte* base = device->device(align(core_bytes) + align(q_bytes) + small_bytes);
  std::byte* core_scratch = base;
  std::byte* q_prepared = prepare_q ? base + align(core_bytes) : nullptr;
  std::byte* small = base + align(core_bytes) + align(q_bytes);

  // The calls with their real Q, checked with the host arrays (lengths and scales are read there); then every
  // small array moves to its device copy.
  calls = core_calls(g, prepare_q ? q_prepared : g.query, q_elements, prepare_q);
  for (CoreCall& c : calls) core::check_args(c.problem, c.args, 0);

  std::byte* stage = device->stage(call_bytes, !config.plan.is_off("upload-kernel"));
  auto put = [&](int i, const void* src) {
    if (small_sizes[i] > 0) std::memcpy(stage + small_at[i], src, small_sizes[i]);
  };
  kept_stage.assign(small_bytes - call_bytes, std::byte{0});
  auto keep = [&](int i, const void* src) {
    if (small_sizes[i] > 0) std::memcpy(kept_stage.data() + (small_at[i] - call_bytes), src, small_sizes[i]);
  };
  put(0, key_rows.data());
  put(1, offsets.data());
  std::vector<cuda::DeviceBatchRows> batch_rows(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    const gqa::BatchPlan& r = g.rows[static_cast<std::size_t>(b)];
    batch_rows[static_cast<std::size_t>(b)] = {r.past_rows, r.drop, r.write_row, r.past};
  }
  put(2, batch_rows.data());
  if (positions > 0) put(6, g.position_ids);
  if (qk) put(7, first.data());
  device->upload(small, call_bytes, stream);
  if (!sinks.empty()) keep(3, sinks.data());
  if (k_scales > 0) keep(4, g.present_key.scales);
  if (v_scales > 0) keep(5, g.present_value.scales);
  device->upload_kept(small + call_bytes, kept_stage.data(), kept_stage.size(), stream);
  const auto* d_key_rows = reinterpret_cast<const std::int32_t*>(small + small_at[0]);
  const auto* d_offsets = reinterpret_cast<const std::int32_t*>(small + small_at[1]);
  const auto* d_rows = reinterpret_cast<const cuda::DeviceBatchRows*>(small + small_at[2]);
  const auto* d_sinks = reinterpret_cast<const float*>(small + small_at[3]);
  const auto* d_k_scales = k_scales > 0 ? reinterpret_cast<const float*>(small + small_at[4]) : nullptr;
  const auto* d_v_scales = v_scales > 0 ? reinterpret_cast<const float*>(small + small_at[5]) : nullptr;
  const auto* d_positions = positions > 0 ? reinterpret_cast<const std::int64_t*>(small + small_at[6]) : nullptr;
  for (CoreCall& c : calls) {
    if (c.args.key_lengths.data != nullptr) c.args.key_lengths.data = d_key_rows + c.batch_offset;
    if (c.args.causal_offsets.data != nullptr) c.args.causal_offsets.data = d_offsets + c.batch_offset;
    if (c.args.head_sink.data != nullptr) c.args.head_sink.data = d_sinks;
    if (c.args.k_scale.data != nullptr) c.args.k_scale.data = d_k_scales;
    if (c.args.v_scale.data != nullptr) c.args.v_scale.data = d_v_scales;
    c.args.scratch = core_scratch;
    c.args.scratch_bytes = core_bytes;
    c.args.stream = stream;
  }

  // Writes start here: every check has passed.
  const auto device_cache = [](const gqa::CacheTensor& t, const float* scales) {
    return cuda::DeviceCache{t.data, t.format.storage.type, t.format.storage.quant, t.capacity, t.format.row_bytes(),
                             scales};
  };
  const cuda::DeviceCache key_cache = device_cache(g.present_key, d_k_scales);
  const cuda::DeviceCache value_cache = device_cache(g.present_value, d_v_scales);
  bool drops = false;
  for (const gqa::BatchPlan& r : g.rows) drops |= r.drop > 0;
  if (!g.shared || drops) {  // separate buffers (or no past): copy the kept rows, zero the rest; a full window slides
    cuda::CacheMove m;
    m.separate = !g.shared;
    m.past_key = g.has_past && !g.shared ? g.past_key.data : nullptr;
    m.past_value = g.has_past && !g.shared ? g.past_value.data : nullptr;
    m.past_capacity = g.has_past ? g.past_key.capacity : 0;
    m.key = key_cache;
    m.value = value_cache;
    m.batch = B;
    m.kv_heads = g.kv_heads;
    m.new_rows = g.seq;
    m.rows = d_rows;
    cuda::launch_cache_move(m, stream);
  }
  cuda::AppendStep st;
  st.dtype = g.dtype;
  st.batch = B;
  st.seq = g.seq;
  st.heads = g.heads;
  st.kv_heads = g.kv_heads;
  st.head_size = g.head_size;
  st.query = g.query;
  st.key = g.key;
  st.value = g.value;
  st.q_in = g.q_in;
  st.k_in = g.k_in;
  st.v_in = g.v_in;
  st.q_out = q_prepared;
  st.rotary = g.rotary;
  st.interleaved = g.interleaved;
  st.cos_cache = g.cos_cache;
  st.sin_cache = g.sin_cache;
  st.rotary_half = g.rotary_half;
  st.position_ids = d_positions;
  st.position_row = g.position_row;
  st.qk_norm = g.qk_norm;
  st.q_norm_weight = g.q_norm_weight;
  st.k_norm_weight = g.k_norm_weight;
  st.norm_epsilon = g.norm_epsilon;
  st.key_cache = key_cache;
  st.value_cache = value_cache;
  st.rows = d_rows;
  st.vector_allowed = !config.plan.is_off("prepass-vector");
  cuda::launch_append(st, stream);
  if (rotate_in_core) {
    rotary.position_ids = d_positions;
    rotary.position_row = g.position_row;
    // The position of new token 0 is each batch entry's DeviceBatchRows::past.
    rotary.first_position = &d_rows->past;
    rotary.first_position_stride = sizeof(cuda::DeviceBatchRows) / sizeof(std::int32_t);
  }
  for (std::size_t i = 0; i < calls.size(); ++i) {
    // The attention kernel may overlap the pre-pass's tail (it waits for it before reading Q', K and V; the
    // lengths and offsets it reads first came up before the pre-pass ran).
    cuda::run(calls[i].problem, calls[i].args, plans[i], core_scratch, false, rotate_in_core ? &rotary : nullptr,
              /*overlap_previous=*/true);
  }

  if (qk) {
    const auto* d_first = reinterpret_cast<const std::int32_t*>(small + small_at[7]);
    const std::int64_t row_block = g.heads * g.seq * g.total * static_cast<std::int64_t>(es);
    for (const CoreCall& c : calls) {
      cuda::write_output_qk(c.problem, c.args, g.qk_output == gqa::QkOutput::AfterSoftmax, d_first + c.batch_offset,
                            g.total, static_cast<std::byte*>(g.output_qk) + c.batch_offset * row_block);
    }
  }

  device->end_call(stream);
  last = describe_call(g, " on cuda", calls.size(), cuda::describe(plans.front()), rotate_in_core);
}

GroupQueryAttention::GroupQueryAttention(const GqaAttributes& attributes, const GqaConfig& config)
    : impl_(std::make_unique<Impl>()) {
  impl_->attributes = attributes;
  impl_->settings = gqa::check_attributes(attributes);
  core::check_config(config.threads, config.backend, "config");
  if (config.backend == Backend::Vulkan) {
    throw Error("config.backend", "GroupQueryAttention runs on Cpu, Reference or Cuda (Vulkan: the attention op only)");
  }
  if (!config.plan.empty()) {  // (checked by the attention op's rules)
    (void)Attention(AttentionProblem::head_first(1, 1, 1, 1, 1, 1), AttentionConfig{Backend::Reference, 0, config.plan});
  }
  if (config.backend == Backend::Cuda) {
    if (!cuda::available()) throw Error("config.backend", "no CUDA device is present (or this build has no CUDA backend)");
  }
  impl_->config = config;
}

GroupQueryAttention::~GroupQueryAttention() = default;
GroupQueryAttention::GroupQueryAttention(GroupQueryAttention&&) noexcept = default;
GroupQueryAttention& GroupQueryAttention::operator=(GroupQueryAttention&&) noexcept = default;

const GqaAttributes& GroupQueryAttention::attributes() const { return impl_->attributes; }
void GroupQueryAttention::run(const GqaInputs& inputs, const GqaOutputs& outputs) {
  impl_->run(inputs, outputs, impl_->config.stream);
}
void GroupQueryAttention::run(const GqaInputs& inputs, const GqaOutputs& outputs, void* stream) {
  impl_->run(inputs, outputs, stream);
}
std::string GroupQueryAttention::describe() const { return impl_->last; }

void group_query_attention(const GqaAttributes& attributes, const GqaInputs& inputs, const GqaOutputs& outputs,
                           const GqaConfig& config) {
  GroupQueryAttention(attributes, config).run(inputs, outputs);
}

std::array<GqaOutputSpec, GqaOutputs::kCount> gqa_output_specs(const GqaAttributes& attributes,
                                                               const GqaInputs& inputs) {
  return gqa::output_specs(gqa::check_attributes(attributes), inputs);
}

}  // namespace attnkit
