// attnkit._attnkit.group_query_attention: ONNX Runtime's com.microsoft.GroupQueryAttention (include/attnkit/gqa.hpp)
// on host arrays (the CPU backend) or CUDA arrays (the CUDA backend, on the caller's stream).
//
// Every array is imported zero-copy (DLPack / buffer protocol / NumPy bfloat16 through a uint16 view, arrays.cpp)
// and handed to the op as a (pointer, ElementType, shape) view. The op takes dense row-major tensors, so an array
// whose strides are not the dense ones is refused (never copied). The query's memory picks the backend; the op's
// placement rules (host: everything on the host; CUDA: everything on query's device except the small inputs the op
// reads on the host, which may be host memory) are checked here at import, so a misplaced array is a ValueError naming it rather than
// a fault. Outputs that were not passed in are allocated through the caller's `alloc(shape, dtype_name)` at the
// shapes gqa_output_specs gives (ONNX Runtime's inference); a present cache passed in as the same memory as its
// past cache is updated in place. The op checks every input, attribute and output before it writes anything;
// attnkit::Error becomes ValueError (module.cpp).
#include "arrays.hpp"

#include <attnkit/error.hpp>
#include <attnkit/gqa.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
#include <atomic>
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

std::optional<ElementType> element_type_of(const ArrayArg& a) {
  namespace dl = nb::dlpack;
  if (a.bfloat16_view) return ElementType::bfloat16;
  const dl::dtype t = a.dtype;
  if (t.lanes != 1) return std::nullopt;
  const auto code = static_cast<dl::dtype_code>(t.code);
  if (code == dl::dtype_code::Float && t.bits == 32) return ElementType::float32;
  if (code == dl::dtype_code::Float && t.bits == 16) return ElementType::float16;
  if (code == dl::dtype_code::Bfloat && t.bits == 16) return ElementType::bfloat16;
  if (code == dl::dtype_code::Int && t.bits == 8) return ElementType::int8;
  if (code == dl::dtype_code::UInt && t.bits == 8) return ElementType::uint8;
  if (code == dl::dtype_code::Int && t.bits == 32) return ElementType::int32;
  if (code == dl::dtype_code::Int && t.bits == 64) return ElementType::int64;
  return std::nullopt;
}

// Where a call runs: host arrays on the CPU backend, CUDA arrays on the CUDA backend; the query decides.
struct Placement {
  bool cuda = false;
  int device = -1;          // query's CUDA device (cuda only)
  std::string query_where;  // "cpu", "cuda:0", ... for messages
};

// The inputs the op also takes as host memory when it runs on CUDA (it reads their values on the host for its
// checks and plan, reading device copies back): seqlens_k, total_sequence_length, position_ids, head_sink,
// k_scale, v_scale (src/gqa/group_query_attention.cpp: kHostReadInputs).
bool host_or_device_input(int index) {
  return index == 5 || index == 6 || index == 9 || index == 11 || index == 12 || index == 13;
}

// The placement rule for one array. Host call: host memory only. CUDA call: query's device, or (for the small
// inputs above) also host memory. Checked before anything is read, so a misplaced array never reaches a kernel
// or a host read.
void check_placement(const ArrayArg& a, const Placement& p, bool may_be_host) {
  if (!p.cuda) {
    if (host_memory(a)) return;
    throw nb::value_error((a.name + ": lives on " + device_string(a) + " but query is on " + p.query_where +
                           "; with a host query every array must be host memory (put query on the GPU to run on "
                           "CUDA)")
                              .c_str());
  }
  if (cuda_memory(a) && a.device_id == p.device) return;
  if (may_be_host && host_memory(a)) return;
  const std::string rule = may_be_host ? a.name + " may be host memory or on query's device"
                                       : "every tensor but seqlens_k, total_sequence_length, position_ids, "
                                         "head_sink, k_scale and v_scale must be on query's CUDA device";
  throw nb::value_error((a.name + ": lives on " + device_string(a) + " but query is on " + p.query_where + "; " + rule)
                            .c_str());
}

// The rules the binding adds to the op's: an element type the op knows, dense row-major (the op's views have no
// strides), aligned to its elements.
ElementType check_array(const ArrayArg& a) {
  const std::optional<ElementType> t = element_type_of(a);
  if (!t) {
    throw nb::type_error((a.name + ": dtype " + a.dtype_name() +
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
    if (__builtin_mul_overflow(step, a.shape[i], &step))  // a dense array this large cannot exist
      throw nb::value_error((a.name + ": shape " + a.shape_string() + " holds more than 2^63 elements").c_str());
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

// Ops by attributes and configuration, kept between calls: an op keeps its scratch (the rotated Q, the attention
// core's tiles; device memory on CUDA), so a decode loop does not allocate on every step. The key holds the
// backend and the CUDA device (the scratch lives there), not the stream: each call passes its stream, and the op
// orders a call on a new stream after the last one. So a step warmed up on one stream finds its memory ready when
// torch.cuda.graph captures it on the capture stream.
//
// A call holds its op by shared ownership from the lookup to the end of its run: eviction (the table is bounded)
// only drops the table's reference, so neither another thread nor an input whose __dlpack__ calls the op again
// (with other attributes) can free an op a call is using. Each op has its own lock, taken with the GIL released
// around run(), so two Python threads never share its scratch.
struct CachedOp {
  explicit CachedOp(const GqaAttributes& a, const GqaConfig& c) : op(a, c) {}
  GroupQueryAttention op;
  std::mutex lock;
  std::atomic<bool> in_graph{false};  // a call was captured: a graph uses its memory, so it is never evicted
};

std::shared_ptr<CachedOp> cached_op(const GqaAttributes& a, const GqaConfig& c, int device) {
  static std::mutex table_lock;
  static auto* table = new std::map<std::string, std::shared_ptr<CachedOp>>();  // never destroyed: no exit-order race
  constexpr std::size_t kMaxOps = 32;
  // Every attribute (floats by their bits: two scales that print alike must not share an op) and the config.
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
                          num(c.threads) + num(static_cast<int>(c.backend)) + num(device);
  std::lock_guard<std::mutex> guard(table_lock);
  auto it = table->find(key);
  if (it != table->end()) return it->second;
  auto op = std::make_shared<CachedOp>(a, c);  // checks the attributes: throws before anything is cached
  if (table->size() >= kMaxOps) {
    // Drop the ops no call holds now (simple and bounded); one still held is freed by its last call. A CUDA op
    // may still have kernels queued: its destructor owns releasing its device scratch safely.
    for (auto i = table->begin(); i != table->end();) {
      i = i->second.use_count() == 1 && !i->second->in_graph ? table->erase(i) : std::next(i);
    }
  }
  table->emplace(key, op);
  return op;
}

// gqa_output_specs reads total_sequence_length's value on the host (the present caches' rows). A device copy is
// read back here, ordered after the caller's stream (a synchronisation, and only when an output is allocated:
// pass it on the host, or pass the outputs, and a step does not wait).
TensorView host_total_length(const ArrayArg& a, const TensorView& view, void* stream, std::int64_t& storage) {
  if (host_memory(a)) return view;
  storage = 0;
  const std::size_t bytes =
      std::min<std::size_t>(sizeof storage, static_cast<std::size_t>(view.elements()) * element_size(view.type));
  if (bytes > 0 && view.data != nullptr) copy_device_to_host(&storage, view.data, bytes, stream, a.name);
  return TensorView{&storage, view.type, view.shape};
}

nb::tuple group_query_attention(nb::sequence input_objs, std::int64_t num_heads, std::int64_t kv_num_heads,
                                float scale, float softcap, std::int64_t local_window_size, std::int64_t causal,
                                std::int64_t do_rotary, std::int64_t rotary_interleaved, std::int64_t smooth_softmax,
                                std::int64_t qk_output, const std::string& k_quant_type,
                                const std::string& v_quant_type, std::int64_t kv_cache_bit_width,
                                std::int64_t sliding_window_cache, float qk_norm_epsilon, nb::handle output_obj,
                                nb::handle present_key_obj, nb::handle present_value_obj, nb::handle output_qk_obj,
                                std::optional<int> threads, std::uintptr_t stream, nb::callable alloc) {
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
  if (nb::len(input_objs) != GqaInputs::kCount)
    throw nb::value_error("inputs: group_query_attention takes 16 inputs (ONNX Runtime's order)");

  // The query's memory picks the backend (a CUDA query without a usable CUDA backend is a ValueError saying why).
  std::array<std::optional<ArrayArg>, GqaInputs::kCount> in_arrays;
  Placement place;
  place.query_where = "cpu";
  if (nb::object q = input_objs[static_cast<std::size_t>(0)]; !q.is_none()) {
    in_arrays[0] = import_array(q, std::string(gqa_input_name(0)), false);
    place.cuda = array_location(*in_arrays[0], cuda_usable(), cuda_built()) == Where::cuda;
    place.device = place.cuda ? in_arrays[0]->device_id : -1;
    place.query_where = device_string(*in_arrays[0]);
  }
  GqaConfig config;
  config.threads = threads.value_or(0);
  if (place.cuda) {
    config.backend = Backend::Cuda;
    config.stream = reinterpret_cast<void*>(stream);  // the caller's current stream (0: the default stream)
  }
  // Query's device is current while the op is built, plans and runs; the caller's device is put back after.
  const CudaDeviceGuard device_guard(place.device);
  // The attribute rules (and the config's) first: they need no other array.
  const std::shared_ptr<CachedOp> cached = cached_op(attrs, config, place.device);  // held until the run ends

  GqaInputs inputs;
  for (int i = 0; i < GqaInputs::kCount; ++i) {
    nb::object obj = input_objs[static_cast<std::size_t>(i)];
    if (obj.is_none()) continue;
    if (!in_arrays[i]) in_arrays[i] = import_array(obj, std::string(gqa_input_name(i)), false);
    check_placement(*in_arrays[i], place, host_or_device_input(i));
    inputs.input(i) = view_of(*in_arrays[i], check_array(*in_arrays[i]));
  }

  // Outputs passed in: writable arrays on query's device. The op checks their shapes, types and overlaps.
  const nb::handle given[GqaOutputs::kCount] = {output_obj, present_key_obj, present_value_obj, output_qk_obj};
  std::array<std::optional<ArrayArg>, GqaOutputs::kCount> out_arrays;
  std::array<nb::object, GqaOutputs::kCount> results;
  std::array<ElementType, GqaOutputs::kCount> out_types{};
  bool allocate = false;  // an output the op produces was not passed in
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    if (given[i].is_none()) {
      allocate = allocate || i < 3 || qk_output != 0;
      continue;
    }
    out_arrays[i] = import_array(given[i], std::string(gqa_output_name(i)), true);
    check_placement(*out_arrays[i], place, false);
    out_types[i] = check_array(*out_arrays[i]);
    results[i] = nb::borrow(given[i]);
  }

  // The others are allocated where ONNX Runtime would infer them (this checks what it reads of the inputs), on
  // query's device: the allocator makes arrays of query's kind there.
  if (allocate) {
    GqaInputs spec_inputs = inputs;
    std::int64_t total_storage = 0;
    if (in_arrays[6])
      spec_inputs.total_sequence_length =
          host_total_length(*in_arrays[6], inputs.total_sequence_length, config.stream, total_storage);
    const auto specs = gqa_output_specs(attrs, spec_inputs);
    for (int i = 0; i < GqaOutputs::kCount; ++i) {
      if (out_arrays[i] || !specs[i].produced) continue;
      const std::string name(gqa_output_name(i));
      results[i] = alloc(shape_tuple(specs[i].shape), std::string(element_type_name(specs[i].type)));
      out_arrays[i] = import_array(results[i], name, true);
      check_placement(*out_arrays[i], place, false);
      out_types[i] = check_array(*out_arrays[i]);
      if (out_types[i] != specs[i].type || out_arrays[i]->shape != specs[i].shape) {
        throw nb::value_error((name + ": was allocated as " + out_arrays[i]->dtype_name() + " " +
                               shape_text(out_arrays[i]->shape) + ", not " +
                               std::string(element_type_name(specs[i].type)) + " " + shape_text(specs[i].shape))
                                  .c_str());
      }
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
    std::lock_guard<std::mutex> guard(cached->lock);
    if (place.cuda && stream_capturing(config.stream)) cached->in_graph = true;
    cached->op.run(inputs, outputs, config.stream);  // checks every input and output before it writes (CUDA: then queues)
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
        nb::arg("threads").none(), nb::arg("stream"), nb::arg("alloc"),
        "Runs ONNX Runtime's GroupQueryAttention on host arrays (CPU) or CUDA arrays (CUDA, on `stream`: a "
        "cudaStream_t as an integer, 0 for the default stream); see attnkit.group_query_attention. `inputs` holds "
        "the 16 inputs in ONNX Runtime's order (None: absent); outputs not passed in are allocated through "
        "`alloc(shape, dtype_name)`. Returns (output, present_key, present_value[, output_qk]).");
}

}  // namespace attnkit::python
