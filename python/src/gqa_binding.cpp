// attnkit._attnkit.group_query_attention: ONNX Runtime's com.microsoft.GroupQueryAttention (include/attnkit/gqa.hpp)
// on host arrays.
//
// Every array is imported zero-copy (DLPack / buffer protocol / NumPy bfloat16 through a uint16 view, arrays.cpp)
// and handed to the op as a (pointer, ElementType, shape) view. The op takes dense row-major tensors, so an array
// whose strides are not the dense ones is refused (never copied). Outputs that were not passed in are allocated
// through the caller's `alloc(shape, dtype_name)` at the shapes gqa_output_specs gives (ONNX Runtime's inference);
// a present cache passed in as the same memory as its past cache is updated in place. The op checks every input,
// attribute and output before it writes anything; attnkit::Error becomes ValueError (module.cpp).
#include "arrays.hpp"

#include <attnkit/error.hpp>
#include <attnkit/gqa.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <memory>
#include <mutex>
#include <map>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <optional>
#include <string>
#include <vector>

namespace attnkit::python {
namespace {

// DLPack device types readable from the host (dlpack.h).
bool host_device(int type) { return type == 1 || type == 3 || type == 11; }

std::optional<ElementType> element_type_of(const std::string& dtype_name) {
  if (dtype_name == "float32") return ElementType::float32;
  if (dtype_name == "float16") return ElementType::float16;
  if (dtype_name == "bfloat16") return ElementType::bfloat16;
  if (dtype_name == "int8") return ElementType::int8;
  if (dtype_name == "uint8") return ElementType::uint8;
  if (dtype_name == "int32") return ElementType::int32;
  if (dtype_name == "int64") return ElementType::int64;
  return std::nullopt;
}

// The rules the binding adds to the op's: a host array of an element type the op knows, dense row-major
// (the op's views have no strides), aligned to its elements.
ElementType check_array(const ArrayArg& a) {
  if (!host_device(a.device_type)) {
    throw nb::value_error((a.name + ": lives on " + device_string(a) +
                           "; group_query_attention runs on the CPU (pass host arrays)")
                              .c_str());
  }
  const std::optional<ElementType> t = element_type_of(a.dtype_name);
  if (!t) {
    throw nb::type_error((a.name + ": dtype " + a.dtype_name +
                          " is not supported (float32, float16, bfloat16; int8 / uint8 caches; int32 seqlens_k and "
                          "total_sequence_length; int64 position_ids)")
                             .c_str());
  }
  std::int64_t step = 1;
  const bool empty = a.extent() == 0;  // nothing is read: any strides
  for (std::size_t i = a.shape.size(); !empty && i-- > 0;) {
    if (a.shape[i] != 1 && a.strides[i] != step) {
      throw nb::value_error((a.name + ": must be C-contiguous (dense row-major), but dimension " + std::to_string(i) +
                             " has stride " + std::to_string(a.strides[i]) + " elements where " +
                             std::to_string(step) + " is dense; attnkit makes no hidden copies: pass "
                             "numpy.ascontiguousarray(...)")
                                .c_str());
    }
    step *= a.shape[i];
  }
  if (a.element_bytes > 0 && reinterpret_cast<std::uintptr_t>(a.data) % a.element_bytes != 0) {
    throw nb::value_error(
        (a.name + ": data is not aligned to its " + std::to_string(a.element_bytes) + "-byte elements").c_str());
  }
  return *t;
}

TensorView view_of(const ArrayArg& a, ElementType t) { return TensorView{a.data, t, a.shape}; }

std::string shape_text(const std::vector<std::int64_t>& d) {
  std::string s = "(";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

nb::tuple shape_tuple(const std::vector<std::int64_t>& d) {
  nb::list l;
  for (std::int64_t x : d) l.append(x);
  return nb::tuple(l);
}

// Ops by attributes and thread count, kept between calls: an op keeps its scratch (the rotated Q, the attention
// core's tiles), so a decode loop does not allocate and fault in fresh pages on every step. Each op has its own
// lock, taken with the GIL released, so two Python threads never share scratch.
struct CachedOp {
  explicit CachedOp(const GqaAttributes& a, const GqaConfig& c) : op(a, c) {}
  GroupQueryAttention op;
  std::mutex lock;
};

CachedOp& cached_op(const GqaAttributes& a, const GqaConfig& c) {
  static std::mutex table_lock;
  static std::map<std::string, std::unique_ptr<CachedOp>> table;
  constexpr std::size_t kMaxOps = 32;
  // Every attribute (floats by their bits: two scales that print alike must not share an op) and the threads.
  auto num = [](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>) {
      std::uint32_t bits;
      const float f = static_cast<float>(v);
      std::memcpy(&bits, &f, sizeof bits);
      return std::to_string(bits) + "|";
    } else {
      return std::to_string(v) + "|";
    }
  };
  const std::string key = num(a.num_heads) + num(a.kv_num_heads) + num(a.scale) + num(a.softcap) +
                          num(a.local_window_size) + num(a.causal) + num(a.do_rotary) + num(a.rotary_interleaved) +
                          num(a.smooth_softmax) + num(a.qk_output) + a.k_quant_type + "|" + a.v_quant_type + "|" +
                          num(a.kv_cache_bit_width) + num(a.sliding_window_cache) + num(a.qk_norm_epsilon) +
                          num(c.threads);
  std::lock_guard<std::mutex> guard(table_lock);
  auto it = table.find(key);
  if (it != table.end()) return *it->second;
  auto op = std::make_unique<CachedOp>(a, c);  // checks the attributes: throws before anything is cached
  if (table.size() >= kMaxOps) {
    // Drop ops nobody is running (a held lock means a call in flight); simple and bounded.
    for (auto i = table.begin(); i != table.end();) {
      if (i->second->lock.try_lock()) {
        i->second->lock.unlock();
        i = table.erase(i);
      } else {
        ++i;
      }
    }
  }
  return *table.emplace(key, std::move(op)).first->second;
}

nb::tuple group_query_attention(nb::sequence input_objs, std::int64_t num_heads, std::int64_t kv_num_heads,
                                float scale, float softcap, std::int64_t local_window_size, std::int64_t causal,
                                std::int64_t do_rotary, std::int64_t rotary_interleaved, std::int64_t smooth_softmax,
                                std::int64_t qk_output, const std::string& k_quant_type,
                                const std::string& v_quant_type, std::int64_t kv_cache_bit_width,
                                std::int64_t sliding_window_cache, float qk_norm_epsilon, nb::handle output_obj,
                                nb::handle present_key_obj, nb::handle present_value_obj, nb::handle output_qk_obj,
                                std::optional<int> threads, nb::callable alloc) {
  GqaAttributes attrs;
  attrs.num_heads = num_heads;
  attrs.kv_num_heads = kv_num_heads;
  attrs.scale = scale;
  attrs.softcap = softcap;
  attrs.local_window_size = local_window_size;
  attrs.causal = causal;
  attrs.do_rotary = do_rotary;
  attrs.rotary_interleaved = rotary_interleaved;
  attrs.smooth_softmax = smooth_softmax;
  attrs.qk_output = qk_output;
  attrs.k_quant_type = k_quant_type;
  attrs.v_quant_type = v_quant_type;
  attrs.kv_cache_bit_width = kv_cache_bit_width;
  attrs.sliding_window_cache = sliding_window_cache;
  attrs.qk_norm_epsilon = qk_norm_epsilon;
  GqaConfig config;
  config.threads = threads.value_or(0);
  // The attribute rules (and the config's) first: they need no array.
  CachedOp& cached = cached_op(attrs, config);

  if (nb::len(input_objs) != GqaInputs::kCount)
    throw nb::value_error("inputs: group_query_attention takes 16 inputs (ONNX Runtime's order)");
  std::array<std::optional<ArrayArg>, GqaInputs::kCount> in_arrays;
  GqaInputs inputs;
  for (int i = 0; i < GqaInputs::kCount; ++i) {
    nb::object obj = input_objs[static_cast<std::size_t>(i)];
    if (obj.is_none()) continue;
    in_arrays[i] = import_array(obj, std::string(gqa_input_name(i)), false);
    inputs.input(i) = view_of(*in_arrays[i], check_array(*in_arrays[i]));
  }

  // Outputs passed in: writable host arrays. The op checks their shapes, types and overlaps.
  const nb::handle given[GqaOutputs::kCount] = {output_obj, present_key_obj, present_value_obj, output_qk_obj};
  std::array<std::optional<ArrayArg>, GqaOutputs::kCount> out_arrays;
  std::array<nb::object, GqaOutputs::kCount> results;
  std::array<ElementType, GqaOutputs::kCount> out_types{};
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    if (given[i].is_none()) continue;
    out_arrays[i] = import_array(given[i], std::string(gqa_output_name(i)), true);
    out_types[i] = check_array(*out_arrays[i]);
    results[i] = nb::borrow(given[i]);
  }

  // The others are allocated where ONNX Runtime would infer them (this checks what it reads of the inputs).
  const auto specs = gqa_output_specs(attrs, inputs);
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    if (out_arrays[i] || !specs[i].produced) continue;
    const std::string name(gqa_output_name(i));
    results[i] = alloc(shape_tuple(specs[i].shape), std::string(element_type_name(specs[i].type)));
    out_arrays[i] = import_array(results[i], name, true);
    out_types[i] = check_array(*out_arrays[i]);
    if (out_types[i] != specs[i].type || out_arrays[i]->shape != specs[i].shape) {
      throw nb::value_error((name + ": was allocated as " + out_arrays[i]->dtype_name + " " +
                             shape_text(out_arrays[i]->shape) + ", not " +
                             std::string(element_type_name(specs[i].type)) + " " + shape_text(specs[i].shape))
                                .c_str());
    }
  }
  GqaOutputs outputs;
  MutableTensorView* const out_views[GqaOutputs::kCount] = {&outputs.output, &outputs.present_key,
                                                            &outputs.present_value, &outputs.output_qk};
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    if (out_arrays[i]) *out_views[i] = MutableTensorView{out_arrays[i]->data, out_types[i], out_arrays[i]->shape};
  }

  {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> guard(cached.lock);
    cached.op.run(inputs, outputs);  // checks every input and output before it writes
  }
  if (qk_output != 0) return nb::make_tuple(results[0], results[1], results[2], results[3]);
  return nb::make_tuple(results[0], results[1], results[2]);
}

}  // namespace

void register_gqa(nb::module_& m) {
  m.def("group_query_attention", &group_query_attention, nb::arg("inputs"), nb::arg("num_heads"),
        nb::arg("kv_num_heads"), nb::arg("scale"), nb::arg("softcap"), nb::arg("local_window_size"), nb::arg("causal"),
        nb::arg("do_rotary"), nb::arg("rotary_interleaved"), nb::arg("smooth_softmax"), nb::arg("qk_output"),
        nb::arg("k_quant_type"), nb::arg("v_quant_type"), nb::arg("kv_cache_bit_width"),
        nb::arg("sliding_window_cache"), nb::arg("qk_norm_epsilon"), nb::arg("output").none(),
        nb::arg("present_key").none(), nb::arg("present_value").none(), nb::arg("output_qk").none(),
        nb::arg("threads").none(), nb::arg("alloc"),
        "Runs ONNX Runtime's GroupQueryAttention on host arrays; see attnkit.group_query_attention. `inputs` holds "
        "the 16 inputs in ONNX Runtime's order (None: absent); outputs not passed in are allocated through "
        "`alloc(shape, dtype_name)`. Returns (output, present_key, present_value[, output_qk]).");
}

}  // namespace attnkit::python
