// The GQA op's checked call: the attributes resolved once (GqaSettings), then every input and output checked
// against the contract and resolved into a plan (GqaPlan) that the units run from. Checking and running are
// apart so that nothing is written before every rule has passed.
#pragma once

#include <attnkit/gqa.hpp>
#include <cstdint>
#include <vector>

#include "kv_cache.hpp"

namespace attnkit::gqa {

enum class SinkMode : std::uint8_t { None, HeadSink, Smooth };
enum class QkOutput : std::uint8_t { None = 0, BeforeSoftmax = 1, AfterSoftmax = 2 };

// The attributes, checked and resolved.
struct GqaSettings {
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  float scale = 0.0f;       // 0: 1/sqrt(H), resolved per call
  float softcap = 0.0f;     // 0: off
  std::int64_t window = 0;  // 0: off; W >= 1: W keys ending at the causal limit
  bool causal = true;
  bool rotary = false;
  bool interleaved = false;
  bool smooth_softmax = false;
  QkOutput qk_output = QkOutput::None;
  KvQuant k_quant = KvQuant::None;
  KvQuant v_quant = KvQuant::None;
  KvType quant_type = KvType::Float;  // Int8 or Int4 when either quant is not None
  bool sliding_window_cache = false;
  float norm_epsilon = 1e-6f;
};

// Checks every attribute rule; throws Error naming the attribute.
GqaSettings check_attributes(const GqaAttributes& attributes);

// Where batch entry b's rows go. Rows are cache rows; token positions are absolute (what rotary and the
// attention bias see). Row r of the present cache holds token first + r.
struct BatchPlan {
  std::int32_t total = 0;      // T_b = seqlens_k[b] + 1
  std::int32_t past = 0;       // tokens before this call's first one (0 for a first prompt)
  std::int32_t past_rows = 0;  // rows of the past cache that hold tokens (past, or fewer in a window cache)
  std::int32_t drop = 0;       // oldest past rows a window cache evicts to make room
  std::int32_t write_row = 0;  // present row of this call's token 0
  std::int32_t first = 0;      // token held by present row 0
  std::int32_t key_rows = 0;   // rows the attention reads: tokens [first, total)
};

struct GqaPlan {
  // Shapes.
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_size = 0, total = 0;
  DType dtype = DType::f32;
  bool first_prompt = false;

  // The new tokens: element layouts ([b, head, s] -> element) into the query / key / value buffers.
  bool packed = false;
  const void* query = nullptr;
  const void* key = nullptr;    // the query buffer when packed
  const void* value = nullptr;  // likewise
  Layout q_in, k_in, v_in;

  // The caches.
  CacheTensor past_key, past_value;  // data null when absent
  CacheTensor present_key, present_value;
  bool has_past = false;
  bool shared = false;   // past and present are the same memory: append in place
  bool sliding = false;  // sliding_window_cache
  std::vector<BatchPlan> rows;

  // Options.
  float scale = 0.0f;  // resolved
  float softcap = 0.0f;
  std::int64_t window = 0;
  bool causal = true;
  bool rotary = false;
  bool interleaved = false;
  const void* cos_cache = nullptr;
  const void* sin_cache = nullptr;
  std::int64_t rotary_half = 0;     // cos_cache.shape[1]: rot / 2
  std::int64_t rotary_max_len = 0;  // cos_cache.shape[0]
  const std::int64_t* position_ids = nullptr;
  std::int64_t position_row = 0;  // position_ids.shape[1]
  bool qk_norm = false;
  const void* q_norm_weight = nullptr;
  const void* k_norm_weight = nullptr;
  float norm_epsilon = 1e-6f;
  const void* bias = nullptr;  // attention_bias, the query's type
  std::int64_t bias_batch = 1, bias_heads = 1;
  SinkMode sink = SinkMode::None;
  const void* head_sink = nullptr;  // the query's type
  QkOutput qk_output = QkOutput::None;

  // Outputs.
  void* output = nullptr;
  void* output_qk = nullptr;

  // Position of new token s of batch entry b (rotary).
  std::int64_t position(std::int64_t b, std::int64_t s) const;
};

// Checks every input and output rule of the contract and resolves the call. Throws Error naming the input
// (or output) and the rule. Reads seqlens_k, total_sequence_length, position_ids and the scales; writes nothing.
GqaPlan plan_call(const GqaSettings& settings, const GqaInputs& inputs, const GqaOutputs& outputs);

// The output shapes ONNX Runtime would infer (see gqa_output_specs in gqa.hpp).
std::array<GqaOutputSpec, GqaOutputs::kCount> output_specs(const GqaSettings& settings, const GqaInputs& inputs);

}  // namespace attnkit::gqa
