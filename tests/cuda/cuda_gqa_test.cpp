// GroupQueryAttention on the CUDA backend against the float64 reference of gqa_support.hpp (written from the
// contract), with the CPU tests' checks: output, both present caches (every row), over a seeded sweep of steps,
// cache modes, options, element types and quantized caches; then decode loops, long caches (split-K), bits
// that do not change between runs, and bad input that writes nothing. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "../gqa_checks.hpp"
#include "forced_plan.hpp"
#include "gpu_test_support.hpp"

namespace attnkit::test {
namespace {

using ::attnkit::testing::check;
using ::attnkit::testing::have_gpu;


// Device copies of a call's buffers; views re-pointed at them. The small inputs the op may read on the host
// (seqlens_k, total_sequence_length, position_ids, head_sink, scales) stay on the host unless asked.
struct DeviceCall {
  GqaCall& c;
  std::map<const void*, void*> device;  // host buffer -> device copy
  std::vector<void*> owned;
  bool small_on_device = false;

  explicit DeviceCall(GqaCall& call, bool small_inputs_on_device = false)
      : c(call), small_on_device(small_inputs_on_device) {
    auto add = [&](const void* host, std::size_t bytes) {
      if (host == nullptr || bytes == 0 || device.count(host)) return;
      void* d = nullptr;
      EXPECT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      device[host] = d;
      owned.push_back(d);
    };
    for (auto* v : {&c.query, &c.key, &c.value, &c.past_key, &c.past_value, &c.cos, &c.sin, &c.bias, &c.sink,
                    &c.q_norm, &c.k_norm, &c.output, &c.present_key, &c.present_value, &c.output_qk}) {
      add(v->data(), v->size());
    }
    if (small_on_device) {
      add(c.seqlens.data(), c.seqlens.size() * sizeof(std::int32_t));
      add(&c.total, sizeof(c.total));
      add(c.positions.data(), c.positions.size() * sizeof(std::int64_t));
      add(c.k_scale.data(), c.k_scale.size() * sizeof(float));
      add(c.v_scale.data(), c.v_scale.size() * sizeof(float));
    }
  }
  ~DeviceCall() {
    for (void* d : owned) cudaFree(d);
  }
  void* on_device(const void* host) const {
    auto it = device.find(host);
    return it == device.end() ? const_cast<void*>(host) : it->second;
  }
  GqaInputs inputs() const {
    GqaInputs in = c.inputs();
    for (int i = 0; i < GqaInputs::kCount; ++i) in.input(i).data = on_device(in.input(i).data);
    return in;
  }
  GqaOutputs outputs() const {
    GqaOutputs out = c.outputs();
    for (MutableTensorView* t : {&out.output, &out.present_key, &out.present_value, &out.output_qk}) {
      t->data = on_device(t->data);
    }
    return out;
  }
  // Copies the outputs and caches back into the call's host buffers.
  void fetch() {
    check(cudaDeviceSynchronize());
    for (auto* v : {&c.output, &c.present_key, &c.present_value, &c.output_qk}) {
      if (!v->empty()) check(cudaMemcpy(v->data(), on_device(v->data()), v->size(), cudaMemcpyDeviceToHost));
    }
  }
};

// The plan overrides every GPU op of this binary runs with: its `--plan=...` argument (PlanOverrides' text
// form; scripts/gpu-check runs the binary once per kernel family), "" for the plan's own choices.
GqaConfig cuda_config(void* stream = nullptr) {
  return GqaConfig{Backend::Cuda, 0, stream, parse_plan_overrides(attnkit::testing::forced_plan())};
}


// Runs one call on the GPU and checks everything it wrote against the reference. Returns false (and checks
// nothing) when the CPU op refuses the options: the sweep's generator may draw a combination the contract
// forbids.
bool check_on_gpu(const GqaOptions& o, bool small_on_device = false) {
  SCOPED_TRACE(describe(o));
  {
    GqaCall probe = make_call(o);
    try {
      GroupQueryAttention(probe.attrs).run(probe.inputs(), probe.outputs());
    } catch (const Error&) {
      return false;
    }
  }
  GqaCall c = make_call(o);
  DeviceCall d(c, small_on_device);
  GroupQueryAttention op(c.attrs, cuda_config());
  EXPECT_NO_THROW(op.run(d.inputs(), d.outputs())) << describe(o);
  d.fetch();
  const GqaExpected e = gqa_reference(c, c.present_key, c.present_value);
  EXPECT_LE(scaled_error(e.output, c.output, o.dtype), testing::tolerance(o.dtype)) << op.describe();
  check_cache(c, e.present_k, c.present_key, c.k_quantized(), true, "present_key");
  check_cache(c, e.present_v, c.present_value, c.v_quantized(), false, "present_value");
  if (o.qk_output != 0) check_qk(c, e.qk);
  return true;
}

// A seeded draw over everything the op does.
GqaOptions draw(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](auto... v) {
    const std::vector<std::common_type_t<decltype(v)...>> all{v...};
    return all[rng() % all.size()];
  };
  auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  GqaOptions o;
  o.seed = seed;
  o.dtype = pick(DType::f32, DType::f16, DType::bf16);
  const auto heads = pick(std::pair{4, 2}, std::pair{6, 3}, std::pair{8, 8}, std::pair{8, 1}, std::pair{32, 8});
  o.heads = heads.first, o.kv_heads = heads.second;
  o.head_size = pick(16, 32, 64, 80, 128, 256, 40);
  o.batch = pick(1, 2, 3);
  const int step = static_cast<int>(rng() % 3);  // first prompt, decode, chunk
  o.seq = step == 0 ? pick(1, 5, 17, 70) : step == 1 ? 1 : pick(2, 9);
  o.lengths.clear();
  for (std::int64_t b = 0; b < o.batch; ++b) {
    if (step == 0) {
      o.lengths.push_back(static_cast<std::int32_t>(b == 0 ? o.seq : 1 + rng() % o.seq));
    } else {
      o.lengths.push_back(static_cast<std::int32_t>(o.seq + rng() % pick(40, 300, 2500)));
    }
  }
  o.has_past = step != 0;
  o.shared = o.has_past && chance(60);
  if (o.has_past && !o.shared && chance(50)) {
    o.past_rows = *std::max_element(o.lengths.begin(), o.lengths.end()) - o.seq + static_cast<std::int64_t>(rng() % 5);
  }
  if (chance(30)) o.present_rows = *std::max_element(o.lengths.begin(), o.lengths.end()) + 7;
  o.packed = chance(20);
  o.rotary = chance(50);
  o.interleaved = o.rotary && chance(50);
  if (o.rotary && chance(30)) o.rotary_half = o.head_size / 4;
  o.position_ids = o.rotary && chance(25);
  if (o.position_ids) o.max_len = *std::max_element(o.lengths.begin(), o.lengths.end()) + 16;
  o.norm = chance(20);
  o.bias = chance(20);
  if (o.bias && chance(50)) o.bias_batch = 1;
  if (o.bias && chance(50)) o.bias_heads = 1;
  o.head_sink = chance(15);
  if (!o.head_sink && chance(15)) o.smooth_softmax = 1;
  if (chance(15)) o.softcap = 5.0f;
  if (chance(20)) o.window = pick(1, 8, 100);
  if (step == 0 && o.window < 0 && chance(10)) o.causal = 0;
  if (chance(35)) {
    o.bits = pick(8, 4);
    o.k_quant = pick(std::string("PER_TENSOR"), std::string("PER_CHANNEL"));
    o.v_quant = chance(20) ? std::string("NONE") : pick(std::string("PER_TENSOR"), std::string("PER_CHANNEL"));
  }
  if (chance(15)) o.qk_output = pick(1, 2);  // drawn last: the draws above stay what they were
  return o;
}

TEST(CudaGqa, SeededSweepMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  int ran = 0;
  for (std::uint64_t seed = 1; seed <= 160; ++seed) {
    if (check_on_gpu(draw(seed))) ++ran;
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(ran, 120) << "the generator drew too many combinations the contract forbids";
}

TEST(CudaGqa, EveryQuantizedModeAndStep) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (std::int64_t bits : {8, 4}) {
      for (const char* kq : {"PER_TENSOR", "PER_CHANNEL"}) {
        for (int step = 0; step < 3; ++step) {
          GqaOptions o;
          o.dtype = t;
          o.bits = bits;
          o.k_quant = kq;
          o.v_quant = std::string(kq) == "PER_TENSOR" ? "PER_CHANNEL" : "PER_TENSOR";
          o.batch = 2, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
          o.rotary = step != 1;
          if (step == 0) o.seq = 6, o.lengths = {6, 3}, o.has_past = false;
          if (step == 1) o.seq = 1, o.lengths = {3000, 20}, o.shared = true, o.present_rows = 3100;
          if (step == 2) o.seq = 3, o.lengths = {120, 5}, o.shared = false, o.past_rows = 118, o.present_rows = 130;
          o.seed = static_cast<std::uint64_t>(step * 10 + bits);
          EXPECT_TRUE(check_on_gpu(o));
        }
      }
    }
  }
}

TEST(CudaGqa, SlidingWindowCacheAndOddHeadSizes) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f16}) {
    for (bool shared : {true, false}) {
      for (bool bias : {false, true}) {
        GqaOptions o;
        o.dtype = t;
        o.sliding = true;
        o.window = 4;
        o.batch = 3, o.heads = 4, o.kv_heads = 2, o.head_size = 16;
        o.present_rows = o.past_rows = 6;
        o.shared = shared;
        o.bias = bias;
        o.rotary = true;
        o.seq = 1, o.lengths = {30, 7, 3}, o.total = 30;
        EXPECT_TRUE(check_on_gpu(o));
        o.seq = 3, o.lengths = {40, 9, 4}, o.total = 40;
        EXPECT_TRUE(check_on_gpu(o));
      }
    }
  }
  GqaOptions o;  // int4 rows with a pad nibble, K quantized only; then V only
  o.k_quant = "PER_CHANNEL";
  o.bits = 4;
  o.batch = 2, o.seq = 1, o.heads = 3, o.kv_heads = 1, o.head_size = 15;
  o.lengths = {9, 4};
  o.shared = true;
  o.present_rows = 12;
  EXPECT_TRUE(check_on_gpu(o));
  o.k_quant = "NONE", o.v_quant = "PER_TENSOR", o.bits = 8, o.shared = false, o.past_rows = 10;
  EXPECT_TRUE(check_on_gpu(o));
}

TEST(CudaGqa, SmallInputsOnTheDeviceGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  GqaOptions o;
  o.dtype = DType::f16;
  o.batch = 3, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 128;
  o.lengths = {700, 33, 5000};
  o.shared = true;
  o.rotary = true;
  o.position_ids = true;
  o.max_len = 6000;
  o.k_quant = o.v_quant = "PER_CHANNEL";
  std::vector<std::byte> first;
  for (bool on_device : {false, true}) {
    GqaCall c = make_call(o);
    DeviceCall d(c, on_device);
    GroupQueryAttention op(c.attrs, cuda_config());
    ASSERT_NO_THROW(op.run(d.inputs(), d.outputs()));
    d.fetch();
    if (!on_device) first = c.output;
    else EXPECT_EQ(first, c.output);
  }
}

TEST(CudaGqa, DecodeLoopMatchesTheCpuLoopAndRepeatsBitForBit) {  // and notices scales that change
  SKIP_WITHOUT_GPU();
  for (const char* quant : {"NONE", "PER_CHANNEL"}) {
    GqaOptions o;
    o.dtype = DType::bf16;
    o.batch = 2, o.seq = 1, o.heads = 32, o.kv_heads = 8, o.head_size = 128;
    o.lengths = {4100, 2500};
    o.shared = true;
    o.rotary = true;
    o.k_quant = o.v_quant = quant;
    o.bits = 8;
    o.present_rows = 4110;  // room for the steps
    GqaCall cpu = make_call(o);
    GqaCall gpu = make_call(o);
    DeviceCall d(gpu);
    GroupQueryAttention cpu_op(cpu.attrs), gpu_op(gpu.attrs, cuda_config());
    std::vector<std::byte> previous;
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step) + " " + quant);
      cpu_op.run(cpu.inputs(), cpu.outputs());
      gpu_op.run(d.inputs(), d.outputs());
      d.fetch();
      double diff = 0, top = 0;
      for (std::int64_t i = 0; i < static_cast<std::int64_t>(cpu.output.size() / cpu.es()); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(cpu.at(cpu.output, i)) - gpu.at(gpu.output, i)));
        top = std::max(top, std::abs(static_cast<double>(cpu.at(cpu.output, i))));
      }
      EXPECT_LE(diff / top, 2 * testing::tolerance(o.dtype)) << gpu_op.describe();
      // The same step again on the same cache rows gives the same bits (the append rewrites the same row).
      gpu_op.run(d.inputs(), d.outputs());
      std::vector<std::byte> again = gpu.output;
      d.fetch();
      EXPECT_EQ(again, gpu.output);
      // Next step: one more token each, new inputs. Before step 2 the scales change in place (same host buffers,
      // new values): the op must notice that the scales it keeps on the device are stale.
      if (step == 1 && !cpu.k_scale.empty()) {
        for (GqaCall* c : {&cpu, &gpu}) {
          for (float& x : c->k_scale) x *= 1.5f;
          for (float& x : c->v_scale) x *= 0.75f;
        }
      }
      for (auto& l : cpu.seqlens) ++l;
      for (auto& l : gpu.seqlens) ++l;
      ++cpu.total;
      ++gpu.total;
      if (HasFailure()) return;
    }
  }
}

// A decode step captured into a CUDA graph on the caller's stream in global mode (PyTorch's default: any
// potentially unsafe CUDA call on this thread fails the capture) replays to the eager step's bits.
TEST(CudaGqa, DecodeStepCapturesIntoACudaGraph) {
  SKIP_WITHOUT_GPU();
  GqaOptions o;
  o.dtype = DType::f16;
  o.batch = 2, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 128;
  o.lengths = {300, 41};
  o.shared = true;
  o.rotary = true;
  o.k_quant = o.v_quant = "PER_CHANNEL";
  o.bits = 8;
  o.present_rows = 320;
  GqaCall c = make_call(o);
  DeviceCall d(c);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GroupQueryAttention op(c.attrs, cuda_config(stream));
  ASSERT_NO_THROW(op.run(d.inputs(), d.outputs()));  // eager (the same step again rewrites the same cache row)
  d.fetch();
  const std::vector<std::byte> eager = c.output;
  check(cudaMemset(d.on_device(c.output.data()), 0, c.output.size()));
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  EXPECT_NO_THROW(op.run(d.inputs(), d.outputs()));
  check(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0));
  check(cudaGraphLaunch(exec, stream));
  check(cudaStreamSynchronize(stream));
  d.fetch();
  EXPECT_EQ(eager, c.output);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The capture PyTorch makes: the step warmed up on one stream, captured on another (torch.cuda.graph's own
// stream). The op's memory from the warm-up serves the capture; memory it must grow later (a longer call) is
// kept for the graph, which still replays to the eager bits. A capture that would allocate, or read a device
// input back, throws naming the argument instead of failing the capture.
GqaOptions capture_step() {
  GqaOptions o;
  o.dtype = DType::bf16;
  o.batch = 3, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
  o.lengths = {90, 7, 200};
  o.shared = true;
  o.rotary = true;
  o.present_rows = 256;
  return o;
}

std::vector<std::byte> replay(cudaGraph_t graph, cudaStream_t stream, DeviceCall& d) {
  check(cudaMemset(d.on_device(d.c.output.data()), 0, d.c.output.size()));
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0));
  check(cudaGraphLaunch(exec, stream));
  check(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  d.fetch();
  return d.c.output;
}

TEST(CudaGqa, CaptureOnAnotherStreamUsesTheWarmedUpMemory) {
  SKIP_WITHOUT_GPU();
  GqaCall c = make_call(capture_step());
  DeviceCall d(c);
  cudaStream_t warm = nullptr, capture = nullptr;
  check(cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking));
  check(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  GroupQueryAttention op(c.attrs, cuda_config());
  ASSERT_NO_THROW(op.run(d.inputs(), d.outputs(), warm));
  d.fetch();
  const std::vector<std::byte> eager = c.output;
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  EXPECT_NO_THROW(op.run(d.inputs(), d.outputs(), capture));
  check(cudaStreamEndCapture(capture, &graph));
  EXPECT_EQ(replay(graph, capture, d), eager);

  // A first prompt of 64 tokens with Q/K norm on the same op (its memory grows for Q'), then the graph again.
  GqaOptions longer = capture_step();
  longer.seq = 64;
  longer.lengths = {64, 64, 64};
  longer.has_past = false;
  longer.shared = false;
  longer.norm = true;
  GqaCall big = make_call(longer);
  DeviceCall big_d(big);
  ASSERT_EQ(big.attrs.num_heads, c.attrs.num_heads);
  ASSERT_NO_THROW(op.run(big_d.inputs(), big_d.outputs(), warm));
  check(cudaStreamSynchronize(warm));
  EXPECT_EQ(replay(graph, capture, d), eager);
  cudaGraphDestroy(graph);

  // A fresh op has no memory to capture with; a device seqlens_k cannot be read back in a capture.
  DeviceCall on_device(c, true);
  for (bool fresh : {true, false}) {
    GroupQueryAttention other(c.attrs, cuda_config());
    if (!fresh) ASSERT_NO_THROW(other.run(d.inputs(), d.outputs(), warm));
    check(cudaStreamSynchronize(warm));
    check(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
    try {
      other.run(fresh ? d.inputs() : on_device.inputs(), d.outputs(), capture);
      ADD_FAILURE() << "the capture did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), fresh ? "stream" : "seqlens_k") << e.what();
    }
    cudaGraph_t unused = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(capture, &unused), cudaSuccess);
    if (unused != nullptr) cudaGraphDestroy(unused);
  }
  cudaStreamDestroy(warm);
  cudaStreamDestroy(capture);
}

// One call on the GPU and the same call on the CPU op (fresh inputs of `o`): the outputs within twice the
// dtype's tolerance, the caches equal (the pre-pass computes what the CPU units compute), and, on compute
// capability 9.0 with the default plan, `plan_has` in the op's description.
void expect_gpu_matches_cpu(const GqaOptions& o, const std::string& plan_has) {
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  GqaCall cpu = make_call(o);
  GqaCall gpu = make_call(o);
  DeviceCall d(gpu);
  GroupQueryAttention cpu_op(cpu.attrs), gpu_op(gpu.attrs, cuda_config());
  cpu_op.run(cpu.inputs(), cpu.outputs());
  ASSERT_NO_THROW(gpu_op.run(d.inputs(), d.outputs()));
  d.fetch();
  if (prop.major == 9 && prop.minor == 0 && attnkit::testing::forced_plan().empty()) {
    EXPECT_NE(gpu_op.describe().find(plan_has), std::string::npos) << gpu_op.describe();
  }
  double diff = 0, top = 0;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(cpu.output.size() / cpu.es()); ++i) {
    const double want = cpu.at(cpu.output, i), got = gpu.at(gpu.output, i);
    diff = std::max(diff, std::isfinite(got) ? std::abs(want - got) : INFINITY);
    top = std::max(top, std::abs(want));
  }
  EXPECT_LE(diff / top, 2 * testing::tolerance(o.dtype)) << gpu_op.describe();
  EXPECT_EQ(cpu.present_key, gpu.present_key);
  EXPECT_EQ(cpu.present_value, gpu.present_value);
}

// Decode steps over long caches: float16 / bfloat16 ones stream through the Hopper kernel (compute capability
// 9.0), quantized ones through the decode-mma kernel (keys on the MMA's M side; with --plan=kernel=wgmma,
// through the Hopper kernel's raw-tile ring): every cache kind, both element types, head sizes 64 and 128.
TEST(CudaGqa, LongCacheDecodeTakesTheStreamingKernelsAndMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  struct Kind {
    const char* quant;
    std::int64_t bits, head_size;
    DType dtype;
  };
  for (const Kind& k : {Kind{"NONE", 8, 128, DType::f16}, Kind{"PER_CHANNEL", 8, 128, DType::f16},
                        Kind{"PER_TENSOR", 8, 64, DType::bf16}, Kind{"PER_CHANNEL", 4, 128, DType::bf16},
                        Kind{"PER_TENSOR", 4, 64, DType::f16}}) {
    SCOPED_TRACE(std::string(k.quant) + " int" + std::to_string(k.bits) + " H " + std::to_string(k.head_size) + " " +
                 std::string(dtype_name(k.dtype)));
    GqaOptions o;
    o.dtype = k.dtype;
    o.batch = 4, o.seq = 1, o.heads = 32, o.kv_heads = 8, o.head_size = k.head_size;
    o.lengths = {17000, 9000, 12345, 17990};
    o.present_rows = 18000;  // 4 x 8 x 18000 keys: a long stream on 132 SMs
    o.shared = true;
    o.rotary = true;
    o.k_quant = o.v_quant = k.quant;
    o.bits = k.bits;
    expect_gpu_matches_cpu(o, std::string(k.quant) == "NONE" ? "wgmma" : "decode-mma");
  }
}

// A prompt large enough for the Hopper kernel (compute capability 9.0) with rotary and no Q/K norm: the kernel
// rotates Q as it loads it (no Q' written); split-halves and interleaved pairs, explicit positions, a partial
// rotary, Q read in place from packed QKV rows.
TEST(CudaGqa, LargePrefillRotatesQueryInTheAttentionKernel) {
  SKIP_WITHOUT_GPU();
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "split halves");
    GqaOptions o;
    o.dtype = interleaved ? DType::bf16 : DType::f16;
    o.batch = 1, o.seq = 1500, o.heads = 32, o.kv_heads = 8, o.head_size = 128;
    o.lengths = {1500};
    o.rotary = true;
    o.interleaved = interleaved;
    o.rotary_half = interleaved ? 32 : 64;
    o.position_ids = interleaved;
    o.packed = interleaved;
    expect_gpu_matches_cpu(o, "Q rotary in the attention kernel");
  }
  // A rotary half the kernel cannot load in 16-byte chunks (44 of 64) stays in the pre-pass.
  GqaOptions o;
  o.dtype = DType::f16;
  o.batch = 1, o.seq = 1500, o.heads = 32, o.kv_heads = 8, o.head_size = 128;
  o.lengths = {1500};
  o.rotary = true;
  o.rotary_half = 44;
  expect_gpu_matches_cpu(o, "");
  GqaCall c = make_call(o);
  DeviceCall d(c);
  GroupQueryAttention op(c.attrs, cuda_config());
  op.run(d.inputs(), d.outputs());
  EXPECT_EQ(op.describe().find("Q rotary in the attention kernel"), std::string::npos) << op.describe();
}

// output_qk on the GPU, before and after the softmax, against the float64 reference: a prompt with a bias, a
// window and a sink; a chunk over a quantized cache with softcap; a decode step over an evicting window cache.
TEST(CudaGqa, OutputQkMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  for (const std::int64_t mode : {1, 2}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      GqaOptions o;
      o.dtype = t;
      o.qk_output = mode;
      o.batch = 2, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
      o.seq = 9, o.lengths = {9, 5}, o.has_past = false;
      o.bias = true, o.window = 6, o.head_sink = true, o.rotary = true;
      EXPECT_TRUE(check_on_gpu(o));
      GqaOptions chunk;
      chunk.dtype = t;
      chunk.qk_output = mode;
      chunk.batch = 2, chunk.heads = 4, chunk.kv_heads = 2, chunk.head_size = 128;
      chunk.seq = 3, chunk.lengths = {300, 40}, chunk.shared = true, chunk.present_rows = 320;
      chunk.softcap = 5.0f, chunk.bits = 8, chunk.k_quant = "PER_CHANNEL", chunk.v_quant = "PER_TENSOR";
      EXPECT_TRUE(check_on_gpu(chunk));
      GqaOptions window;
      window.dtype = t;
      window.qk_output = mode;
      window.sliding = true, window.window = 4;
      window.batch = 3, window.heads = 4, window.kv_heads = 2, window.head_size = 16;
      window.present_rows = window.past_rows = 6, window.shared = true;
      window.seq = 1, window.lengths = {30, 7, 3}, window.total = 30;
      EXPECT_TRUE(check_on_gpu(window));
    }
  }
}

TEST(CudaGqa, BadInputWritesNothing) {
  SKIP_WITHOUT_GPU();
  GqaOptions o;
  o.dtype = DType::f16;
  o.batch = 2, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
  o.lengths = {40, 7};
  o.shared = true;
  o.present_rows = 48;
  GqaCall c = make_call(o);
  DeviceCall d(c);
  const std::vector<std::byte> output = c.output, key = c.present_key, value = c.present_value;
  GroupQueryAttention op(c.attrs, cuda_config());
  auto expect_unchanged = [&](const char* what) {
    d.fetch();
    EXPECT_EQ(c.output, output) << what;
    EXPECT_EQ(c.present_key, key) << what;
    EXPECT_EQ(c.present_value, value) << what;
  };
  c.seqlens[1] = 60;  // beyond the cache's 48 rows
  try {
    op.run(d.inputs(), d.outputs());
    ADD_FAILURE() << "seqlens_k beyond the capacity was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seqlens_k[1]"), std::string::npos) << e.what();
  }
  expect_unchanged("seqlens_k");
  c.seqlens[1] = 6;
  // A host buffer where device memory is required.
  GqaInputs in = d.inputs();
  in.query.data = c.query.data();
  try {
    op.run(in, d.outputs());
    ADD_FAILURE() << "a host query was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query"), std::string::npos) << e.what();
  }
  expect_unchanged("host query");
  // Device memory on the CPU backend.
  EXPECT_THROW(GroupQueryAttention(c.attrs).run(d.inputs(), d.outputs()), Error);
  expect_unchanged("device memory on the CPU");
}

}  // namespace
}  // namespace attnkit::test

int main(int argc, char** argv) { return attnkit::testing::run_tests_with_plan_flag(argc, argv); }
