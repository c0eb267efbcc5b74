// The GroupQueryAttention op of ONNX Runtime (com.microsoft.GroupQueryAttention, its newest schema) on the CPU:
// ONNX Runtime's 16 inputs, attributes and 4 outputs, taken as (pointer, element type, shape) views of the
// caller's memory. Nothing is copied: the caches are appended in place (or copied past -> present, as the
// contract says for separate buffers) and the attention core reads Q and the K/V caches where they are,
// dequantizing int8 / int4 caches one key tile at a time.
//
// A call is: every input, attribute and output checked (an attnkit::Error names the input and the rule,
// e.g. "seqlens_k[2]: = 900 exceeds the cache capacity 512", and nothing is written) -> Q/K RMS norm ->
// rotary -> cache append (quantizing new rows) -> attention -> the optional output_qk. docs/gqa.md has the
// design and every place this differs from ONNX Runtime.
#pragma once

#include <array>
#include <attnkit/attention.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attnkit {

// Element types of the op's tensors, with ONNX's names.
enum class ElementType : std::uint8_t { float32, float16, bfloat16, int8, uint8, int32, int64 };
std::string_view element_type_name(ElementType t);
std::size_t element_size(ElementType t);

// A dense row-major tensor in the caller's memory. An optional input or output is absent when `data` is null
// and `shape` is empty; a present tensor with no elements may have a null `data`. A scalar has shape {}.
struct TensorView {
  const void* data = nullptr;
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;

  bool present() const { return data != nullptr || !shape.empty(); }
  std::int64_t elements() const;  // product of the shape (1 for a scalar)
};
struct MutableTensorView {
  void* data = nullptr;
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;

  bool present() const { return data != nullptr || !shape.empty(); }
  std::int64_t elements() const;
  TensorView view() const { return {data, type, shape}; }
};

// The inputs, in ONNX Runtime's order (input(i) / gqa_input_name(i) index them 0..15).
struct GqaInputs {
  TensorView query;                  // 0  (B, S, N*H), or packed (B, S, (N + 2*Nkv)*H) when key/value are absent
  TensorView key;                    // 1  (B, S, Nkv*H)
  TensorView value;                  // 2  (B, S, Nkv*H)
  TensorView past_key;               // 3  (B, Nkv, P, H) BNSH; int4: (B, Nkv, P, (H+1)/2) bytes
  TensorView past_value;             // 4
  TensorView seqlens_k;              // 5  int32 (B): each sequence's total length minus one
  TensorView total_sequence_length;  // 6  int32, one element
  TensorView cos_cache;              // 7  (max_len, rot/2)
  TensorView sin_cache;              // 8
  TensorView position_ids;           // 9  int64 (B, S)
  TensorView attention_bias;         // 10 (B or 1, N or 1, S, total_sequence_length)
  TensorView head_sink;              // 11 (N)
  TensorView k_scale;                // 12 float32: 1 value (PER_TENSOR) or Nkv*H values (PER_CHANNEL)
  TensorView v_scale;                // 13
  TensorView q_norm_weight;          // 14 (H)
  TensorView k_norm_weight;          // 15 (H)

  static constexpr int kCount = 16;
  const TensorView& input(int index) const;
  TensorView& input(int index);
};
std::string_view gqa_input_name(int index);

struct GqaOutputs {
  MutableTensorView output;         // 0 (B, S, N*H), the query's type
  MutableTensorView present_key;    // 1 (B, Nkv, C, H) BNSH (int4: (H+1)/2 bytes per row); may be past_key's memory
  MutableTensorView present_value;  // 2
  MutableTensorView output_qk;      // 3 (B, N, S, total_sequence_length), only with qk_output != 0

  static constexpr int kCount = 4;
  const MutableTensorView& output_at(int index) const;
};
std::string_view gqa_output_name(int index);

// The attributes, with ONNX Runtime's names, types and defaults. Integer flags stay integers so a binding can
// pass a model's values through and the checks can reject anything else.
struct GqaAttributes {
  std::int64_t num_heads = 0;
  std::int64_t kv_num_heads = 0;
  float scale = 0.0f;                   // 0: 1/sqrt(H)
  float softcap = 0.0f;                 // 0: off
  std::int64_t local_window_size = -1;  // -1: off; W >= 1: key j visible to position p when p - W < j <= p
  std::int64_t causal = 1;
  std::int64_t do_rotary = 0;
  std::int64_t rotary_interleaved = 0;
  std::int64_t smooth_softmax = -1;   // 1: a zero sink logit in every denominator; 0 or -1: off
  std::int64_t qk_output = 0;         // 0: none, 1: scores before the softmax, 2: probabilities after it
  std::string k_quant_type = "NONE";  // NONE, PER_TENSOR, PER_CHANNEL
  std::string v_quant_type = "NONE";
  std::int64_t kv_cache_bit_width = 0;  // 8 or 4 when a quant type is not NONE (ignored otherwise)
  std::int64_t sliding_window_cache = 0;
  float qk_norm_epsilon = 1e-6f;
};

// Where the op runs.
//   Cpu (Auto means Cpu) or Reference (the attention core in float64): every tensor is host memory.
//   Cuda: every tensor is CUDA device memory, except seqlens_k, total_sequence_length, position_ids, head_sink,
//   k_scale and v_scale, which may be host or device memory. The op reads them on the host (its checks and its
//   plan need their values) before it writes anything, so device copies of them are read back in `stream`'s
//   order (a synchronisation); pass them on the host and a decode step queues its kernels on `stream` without
//   waiting. output_qk is not produced on CUDA (an Error says so).
struct GqaConfig {
  Backend backend = Backend::Cpu;
  int threads = 0;               // Cpu: 0..1024, 0 = all cores. The results do not depend on it.
  void* stream = nullptr;        // Cuda: the cudaStream_t to run on (null: the default stream)
  PlanOverrides plan;            // for tests and benchmarks only: the attention core's plan (attention.hpp)
};

// What a call produces, as ONNX Runtime infers it: a binding allocates the outputs from this. present_key /
// present_value have max(total_sequence_length, past_key's rows) rows (a window cache: past_key's rows), and
// (H+1)/2 bytes per row for int4; pass past_key's memory as present_key for an in-place (shared) cache.
// output_qk is produced only when qk_output != 0.
struct GqaOutputSpec {
  bool produced = false;
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;
};
// Throws Error when the attributes or the inputs it reads are bad (it checks no more than it needs).
std::array<GqaOutputSpec, GqaOutputs::kCount> gqa_output_specs(const GqaAttributes& attributes,
                                                               const GqaInputs& inputs);

class GroupQueryAttention {
 public:
  // Checks every attribute rule; throws Error naming the attribute.
  explicit GroupQueryAttention(const GqaAttributes& attributes, const GqaConfig& config = {});
  ~GroupQueryAttention();
  GroupQueryAttention(GroupQueryAttention&&) noexcept;
  GroupQueryAttention& operator=(GroupQueryAttention&&) noexcept;

  const GqaAttributes& attributes() const;
  // Checks every input and output against the contract, then computes. Nothing is written when a check fails.
  // Thread safety: one object runs one call at a time. Its scratch (the rotated Q, the core's workspace) and
  // describe()'s text are kept between calls, so concurrent run() calls on one object are not allowed: use one
  // object per thread, or a lock around run() (as the Python binding does, per cached op). Distinct objects share
  // nothing and run concurrently.
  void run(const GqaInputs& inputs, const GqaOutputs& outputs);
  // The same on `stream` (Cuda) instead of config.stream, so that one op (and its device memory) serves several
  // streams: a decode step warmed up on one stream and captured into a CUDA graph on another. A call on another
  // stream than the last call waits, on the device, for that call's work. A captured call allocates nothing (run
  // the step once before capturing, or it throws naming `stream`), reads no device input back (seqlens_k and the
  // other host-read inputs must be host memory), and the graph uses the op's memory: keep the op while the graph
  // may replay, and do not replay it while another call of the op runs.
  void run(const GqaInputs& inputs, const GqaOutputs& outputs, void* stream);
  // What the last run did: the step (first prompt, decode, chunk), the cache mode, and the core's kernel.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot form.
void group_query_attention(const GqaAttributes& attributes, const GqaInputs& inputs, const GqaOutputs& outputs,
                           const GqaConfig& config = {});

}  // namespace attnkit
