// The public view types of the GQA op: element types, element counts, and the inputs / outputs by index
// (ONNX Runtime's order), so a binding can fill them in a loop.
#include <attnkit/gqa.hpp>

namespace attnkit {

std::string_view element_type_name(ElementType t) {
  switch (t) {
    case ElementType::float32: return "float32";
    case ElementType::float16: return "float16";
    case ElementType::bfloat16: return "bfloat16";
    case ElementType::int8: return "int8";
    case ElementType::uint8: return "uint8";
    case ElementType::int32: return "int32";
    case ElementType::int64: return "int64";
  }
  return "?";
}

std::size_t element_size(ElementType t) {
  switch (t) {
    case ElementType::float32:
    case ElementType::int32: return 4;
    case ElementType::float16:
    case ElementType::bfloat16: return 2;
    case ElementType::int8:
    case ElementType::uint8: return 1;
    case ElementType::int64: return 8;
  }
  return 0;
}

namespace {
// The element count, in checked arithmetic: a shape whose product does not fit int64 is an Error (the op's checks
// name the tensor before they get here; this keeps any other caller from a wrapped count).
std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("shape", "the product of the dimensions does not fit int64 (a tensor holds fewer than 2^63 elements)");
  }
  return n;
}

// ONNX Runtime's input and output names, in its order.
constexpr std::string_view kInputNames[GqaInputs::kCount] = {"query",
                                                             "key",
                                                             "value",
                                                             "past_key",
                                                             "past_value",
                                                             "seqlens_k",
                                                             "total_sequence_length",
                                                             "cos_cache",
                                                             "sin_cache",
                                                             "position_ids",
                                                             "attention_bias",
                                                             "head_sink",
                                                             "k_scale",
                                                             "v_scale",
                                                             "q_norm_weight",
                                                             "k_norm_weight"};
constexpr std::string_view kOutputNames[GqaOutputs::kCount] = {"output", "present_key", "present_value", "output_qk"};
}  // namespace

std::int64_t TensorView::elements() const { return product(shape); }
std::int64_t MutableTensorView::elements() const { return product(shape); }

std::string_view gqa_input_name(int index) {
  return index >= 0 && index < GqaInputs::kCount ? kInputNames[index] : std::string_view("?");
}
std::string_view gqa_output_name(int index) {
  return index >= 0 && index < GqaOutputs::kCount ? kOutputNames[index] : std::string_view("?");
}

TensorView& GqaInputs::input(int index) {
  TensorView* const all[kCount] = {
      &query,         &key,          &value,        &past_key,       &past_value, &seqlens_k, &total_sequence_length,
      &cos_cache,     &sin_cache,    &position_ids, &attention_bias, &head_sink,  &k_scale,   &v_scale,
      &q_norm_weight, &k_norm_weight};
  if (index < 0 || index >= kCount) throw Error("inputs", "index " + std::to_string(index) + " is outside 0..15");
  return *all[index];
}
const TensorView& GqaInputs::input(int index) const { return const_cast<GqaInputs*>(this)->input(index); }

const MutableTensorView& GqaOutputs::output_at(int index) const {
  const MutableTensorView* const all[kCount] = {&output, &present_key, &present_value, &output_qk};
  if (index < 0 || index >= kCount) throw Error("outputs", "index " + std::to_string(index) + " is outside 0..3");
  return *all[index];
}

}  // namespace attnkit
