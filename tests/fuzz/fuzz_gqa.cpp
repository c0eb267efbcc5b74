// Fuzz target: the GroupQueryAttention op's attributes, config, inputs and outputs, decoded from the input, through
// gqa_output_specs and GroupQueryAttention::run. Shapes start consistent (a prompt or a decode step of a few
// tokens, so most inputs reach the kernels) and are then perturbed; values (seqlens_k, total_sequence_length,
// position ids, scales, the floats) come from the input. Every tensor is allocated at exactly the bytes its view
// states. The oracles: no sanitizer report, no exception but attnkit::Error, and a rejected call leaves every
// output (and a shared cache) as it was.
#include "fuzz_support.hpp"

#include <attnkit/gqa.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attnkit::fuzz {
namespace {

constexpr std::int64_t kMaxBytes = std::int64_t{1} << 18;  // per tensor actually allocated

struct Tensor {
  Buffer buffer;
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;
  bool present = false;
  bool null = false;
};

// Bytes of a shape, or -1 when it does not fit int64 (the op must refuse it; nothing of it is allocated).
std::int64_t bytes_of(const std::vector<std::int64_t>& shape, ElementType type) {
  __int128 n = static_cast<__int128>(element_size(type));
  for (std::int64_t d : shape) {
    if (d < 0) return -1;
    n *= d;
    if (n > kInt64Max) return -1;
  }
  return static_cast<std::int64_t>(n);
}

// Perturbs a shape now and then: one dimension set to an edge value, or the rank changed.
void perturb(FuzzedDataProvider& in, std::vector<std::int64_t>& shape) {
  const int mode = in.ConsumeIntegralInRange<int>(0, 31);
  if (mode == 0 && !shape.empty()) {
    shape[in.ConsumeIntegralInRange<std::size_t>(0, shape.size() - 1)] = edgy_int(in, 0, 70);
  } else if (mode == 1) {
    shape.push_back(edgy_int(in, 0, 3));
  } else if (mode == 2 && !shape.empty()) {
    shape.pop_back();
  }
}

// Returns false when the tensor states more bytes than a fuzzing step allocates but few enough to exist (the op
// may read all of them): such an input is skipped.
bool make(FuzzedDataProvider& in, Tensor& t, ElementType type, std::vector<std::int64_t> shape) {
  t.present = true;
  t.type = in.ConsumeIntegralInRange<int>(0, 40) == 0 ? static_cast<ElementType>(in.ConsumeIntegralInRange<int>(0, 8))
                                                       : type;
  perturb(in, shape);
  t.shape = std::move(shape);
  t.null = in.ConsumeIntegralInRange<int>(0, 40) == 0;
  const std::int64_t bytes = bytes_of(t.shape, t.type);
  const bool beyond_address_space = bytes < 0 || element_size(t.type) == 0;
  if (!beyond_address_space && bytes > kMaxBytes) return false;
  if (!t.null && !beyond_address_space) t.buffer = Buffer(in, static_cast<std::size_t>(bytes));
  if (!t.null && beyond_address_space) t.buffer = Buffer(in, 64);  // must be refused before any access
  return true;
}

TensorView view(const Tensor& t) {
  if (!t.present) return {};
  return {t.null ? nullptr : t.buffer.data(), t.type, t.shape};
}
MutableTensorView mutable_view(const Tensor& t) {
  if (!t.present) return {};
  return {t.null ? nullptr : t.buffer.data(), t.type, t.shape};
}

// Writes small int32 values into an int32 tensor (seqlens_k, total_sequence_length): mostly in range.
void fill_int32(FuzzedDataProvider& in, Tensor& t, std::int64_t lo, std::int64_t hi) {
  if (t.type != ElementType::int32 || t.buffer.data() == nullptr) return;
  auto* v = reinterpret_cast<std::int32_t*>(t.buffer.data());
  for (std::size_t i = 0; i < t.buffer.bytes() / 4; ++i)
    v[i] = static_cast<std::int32_t>(in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(lo, hi)
                                                      : in.ConsumeIntegral<std::int32_t>());
}

void run_one(FuzzedDataProvider& in) {
  GqaAttributes a;
  const std::int64_t kv = in.ConsumeIntegralInRange<std::int64_t>(1, 3);
  const std::int64_t group = in.ConsumeIntegralInRange<std::int64_t>(1, 3);
  a.num_heads = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? edgy_int(in, 0, 8) : kv * group;
  a.kv_num_heads = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? edgy_int(in, 0, 8) : kv;
  const std::int64_t H = in.ConsumeIntegralInRange<std::int64_t>(1, 40);
  const std::int64_t B = in.ConsumeIntegralInRange<std::int64_t>(1, 3);
  const std::int64_t S = in.ConsumeIntegralInRange<std::int64_t>(1, 5);
  const bool prompt = in.ConsumeBool();
  const std::int64_t past = prompt ? 0 : in.ConsumeIntegralInRange<std::int64_t>(0, 40);
  const std::int64_t T = past + S;
  const bool packed = in.ConsumeBool();
  a.scale = in.ConsumeBool() ? 0.0f : in.ConsumeFloatingPoint<float>();
  a.softcap = in.ConsumeBool() ? 0.0f : in.ConsumeFloatingPoint<float>();
  a.local_window_size = in.ConsumeBool() ? -1 : edgy_int(in, -2, 50);
  a.causal = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? edgy_int(in, -1, 2) : 1;
  a.do_rotary = in.ConsumeIntegralInRange<std::int64_t>(0, 1);
  a.rotary_interleaved = in.ConsumeIntegralInRange<std::int64_t>(0, 1);
  a.smooth_softmax = in.ConsumeIntegralInRange<std::int64_t>(-1, 1);
  a.qk_output = in.ConsumeIntegralInRange<std::int64_t>(0, 3) == 0 ? in.ConsumeIntegralInRange<std::int64_t>(0, 3) : 0;
  static const char* const kQuants[] = {"NONE", "NONE", "PER_TENSOR", "PER_CHANNEL", "per_tensor", ""};
  a.k_quant_type = in.PickValueInArray(kQuants);
  a.v_quant_type = in.PickValueInArray(kQuants);
  const bool quantized = a.k_quant_type != "NONE" || a.v_quant_type != "NONE";
  a.kv_cache_bit_width = quantized ? (in.ConsumeBool() ? 8 : in.ConsumeBool() ? 4 : edgy_int(in, 0, 16)) : 0;
  a.sliding_window_cache = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1 : 0;
  GqaConfig config;
  config.threads = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? static_cast<int>(edgy_int(in, 0, 4)) : 1;
  config.backend = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? static_cast<Backend>(in.ConsumeIntegralInRange<int>(0, 5))
                                                               : in.ConsumeBool() ? Backend::Cpu : Backend::Reference;

  const std::int64_t N = a.num_heads > 0 && a.num_heads < 64 ? a.num_heads : 1;
  const std::int64_t Nkv = a.kv_num_heads > 0 && a.kv_num_heads < 64 ? a.kv_num_heads : 1;
  const ElementType ft = static_cast<ElementType>(in.ConsumeIntegralInRange<int>(0, 2));
  const bool int4 = a.kv_cache_bit_width == 4;
  const ElementType kt = a.k_quant_type == "NONE" || !quantized ? ft : int4 ? ElementType::uint8 : ElementType::int8;
  const ElementType vt = a.v_quant_type == "NONE" || !quantized ? ft : int4 ? ElementType::uint8 : ElementType::int8;
  const std::int64_t k_last = kt == ElementType::uint8 ? (H + 1) / 2 : H;
  const std::int64_t v_last = vt == ElementType::uint8 ? (H + 1) / 2 : H;
  const std::int64_t C = std::max<std::int64_t>(T, in.ConsumeIntegralInRange<std::int64_t>(0, 48));

  std::array<Tensor, GqaInputs::kCount> t;
  std::array<Tensor, GqaOutputs::kCount> o;
  bool ok = make(in, t[0], ft, {B, S, (packed ? N + 2 * Nkv : N) * H});
  if (!packed) ok = ok && make(in, t[1], ft, {B, S, Nkv * H}) && make(in, t[2], ft, {B, S, Nkv * H});
  const bool has_past = !prompt || in.ConsumeBool();
  const bool shared = has_past && in.ConsumeBool();
  if (has_past && !shared) {
    const std::int64_t P = in.ConsumeBool() ? C : std::max<std::int64_t>(past, in.ConsumeIntegralInRange<std::int64_t>(0, 48));
    ok = ok && make(in, t[3], kt, {B, Nkv, P, k_last}) && make(in, t[4], vt, {B, Nkv, P, v_last});
  }
  ok = ok && make(in, t[5], ElementType::int32, {B}) && make(in, t[6], ElementType::int32, {1});
  if (!ok) return;
  fill_int32(in, t[5], 0, T - 1);
  fill_int32(in, t[6], 1, T);
  if (prompt && t[6].buffer.data() != nullptr && t[6].type == ElementType::int32 && in.ConsumeBool())
    *reinterpret_cast<std::int32_t*>(t[6].buffer.data()) = static_cast<std::int32_t>(S);
  if (a.do_rotary == 1 || in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    const std::int64_t half = std::max<std::int64_t>(1, in.ConsumeIntegralInRange<std::int64_t>(1, std::max<std::int64_t>(1, H / 2)));
    const std::int64_t rows = T + in.ConsumeIntegralInRange<std::int64_t>(0, 4);
    ok = ok && make(in, t[7], ft, {rows, half}) && make(in, t[8], ft, {rows, half});
    if (in.ConsumeBool()) {
      ok = ok && make(in, t[9], ElementType::int64, {B, S});
      if (ok && t[9].type == ElementType::int64 && t[9].buffer.data() != nullptr) {
        auto* pos = reinterpret_cast<std::int64_t*>(t[9].buffer.data());
        for (std::size_t i = 0; i < t[9].buffer.bytes() / 8; ++i) pos[i] = edgy_int(in, 0, rows);
      }
    }
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    ok = ok && make(in, t[10], ft, {in.ConsumeBool() ? B : 1, in.ConsumeBool() ? N : 1, S, T});
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) ok = ok && make(in, t[11], ft, {N});
  const auto scales = [&](Tensor& s, const std::string& quant) {
    if (quant == "PER_TENSOR") return make(in, s, ElementType::float32, {1});
    if (quant == "PER_CHANNEL") return make(in, s, ElementType::float32, {Nkv * H});
    return in.ConsumeIntegralInRange<int>(0, 15) == 0 ? make(in, s, ElementType::float32, {1}) : true;
  };
  ok = ok && scales(t[12], a.k_quant_type) && scales(t[13], a.v_quant_type);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) ok = ok && make(in, t[14], ft, {H}) && make(in, t[15], ft, {H});

  ok = ok && make(in, o[0], ft, {B, S, N * H}) && make(in, o[1], kt, {B, Nkv, C, k_last}) &&
       make(in, o[2], vt, {B, Nkv, C, v_last});
  if (a.qk_output != 0 || in.ConsumeIntegralInRange<int>(0, 15) == 0) ok = ok && make(in, o[3], ft, {B, N, S, T});
  if (!ok) return;

  GqaInputs inputs;
  for (int i = 0; i < GqaInputs::kCount; ++i) inputs.input(i) = view(t[static_cast<std::size_t>(i)]);
  GqaOutputs outputs;
  outputs.output = mutable_view(o[0]);
  outputs.present_key = mutable_view(o[1]);
  outputs.present_value = mutable_view(o[2]);
  outputs.output_qk = mutable_view(o[3]);
  if (shared) {  // an in-place cache: past is present's memory, shape and type
    inputs.past_key = outputs.present_key.view();
    inputs.past_value = outputs.present_value.view();
  }

  std::array<std::vector<std::byte>, GqaOutputs::kCount> before;
  for (std::size_t i = 0; i < o.size(); ++i) before[i] = o[i].buffer.copy();
  try {
    (void)gqa_output_specs(a, inputs);
  } catch (const Error&) {
  }
  try {
    GroupQueryAttention op(a, config);
    op.run(inputs, outputs);
  } catch (const Error&) {
    for (std::size_t i = 0; i < o.size(); ++i) require_unchanged(o[i].buffer, before[i]);
  }
}

}  // namespace
}  // namespace attnkit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  attnkit::fuzz::run_one(in);
  return 0;
}
