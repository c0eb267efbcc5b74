// The binding of append_kv (include/attnkit/kv_append.hpp): attnkit.append_kv writes new K/V rows into paged or
// dense caches in place, optionally with rotary on K (cos_cache / sin_cache) and into int8 / int4 caches (the GQA
// op's arguments: k_quant_type / v_quant_type, kv_cache_bit_width, k_scale / v_scale). Host arrays run on the CPU,
// CUDA arrays on the CUDA backend (values read on the device only: the call captures in a CUDA graph).
#include "arrays.hpp"

#include <attnkit/kv_append.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <vector>

namespace attnkit::python {
namespace {

[[noreturn]] void fail(const std::string& message) { throw nb::value_error(message.c_str()); }

void require_rank(const ArrayArg& a, std::int64_t rank, const char* what) {
  if (a.ndim() != rank) fail(a.name + ": must be " + std::to_string(rank) + "-D " + what + ", got shape " + a.shape_string());
}

// [lead, rows, heads, dim] ("nhd") or [lead, heads, rows, dim] ("hnd") as (batch or page, head, row) strides, in
// values: an int4 cache's bytes hold two.
Layout cache_layout(const ArrayArg& a, bool hnd, const KvStorage& storage) {
  const std::int64_t per = storage.type == KvType::Int4 ? 2 : 1;
  return hnd ? Layout{0, per * a.strides[0], per * a.strides[1], per * a.strides[2]}
             : Layout{0, per * a.strides[0], per * a.strides[2], per * a.strides[1]};
}

bool holds(const ArrayArg& a, nb::dlpack::dtype_code code, int bits) {
  return a.dtype.lanes == 1 && a.dtype.code == static_cast<std::uint8_t>(code) && a.dtype.bits == bits;
}

// A cache's storage from the GQA op's attributes: its quantization type, and (quantized) the bit width.
KvStorage storage_of(const std::string& quant_type, const char* field, std::int64_t bits) {
  if (quant_type == "NONE") return {};
  if (quant_type != "PER_TENSOR" && quant_type != "PER_CHANNEL")
    fail(std::string(field) + ": must be 'NONE', 'PER_TENSOR' or 'PER_CHANNEL', got '" + quant_type + "'");
  if (bits != 8 && bits != 4)
    fail("kv_cache_bit_width: must be 8 (int8) or 4 (int4) when " + std::string(field) + " is " + quant_type +
         ", got " + std::to_string(bits));
  return {bits == 8 ? KvType::Int8 : KvType::Int4, quant_type == "PER_TENSOR" ? KvQuant::PerTensor : KvQuant::PerChannel};
}

// A cache's element type: the new rows' for a float cache, int8, or uint8 (int4: two values per byte).
void require_cache_element(const ArrayArg& cache, const ArrayArg& rows, const KvStorage& s, const char* quant_field) {
  if (s.type == KvType::Float) return require_same_element(cache, rows, " (a cache that is not quantized holds the new rows' type)");
  const bool int8 = s.type == KvType::Int8;
  if (!holds(cache, int8 ? nb::dlpack::dtype_code::Int : nb::dlpack::dtype_code::UInt, 8))
    throw nb::type_error((cache.name + ": must be " + (int8 ? "int8" : "uint8 (int4 values, two per byte)") + " for " +
                          quant_field + " with kv_cache_bit_width " + (int8 ? "8" : "4") + ", got " + cache.dtype_name()).c_str());
}

// A float32 scale array of a quantized cache, C-contiguous in any shape (as the GQA op takes them, e.g.
// (1, Nkv, 1, H)); the count is the library's rule.
ConstBuffer scale_buffer(const std::optional<ArrayArg>& scale, const char* name, const KvStorage& s) {
  if (!scale) return {};
  if (s.type == KvType::Float) fail(std::string(name) + ": was given but the cache is not quantized (its quant type is NONE)");
  require_element(*scale, Element::f32, "is not supported: dequantization scales are float32");
  std::int64_t step = 1;
  for (std::int64_t i = scale->ndim() - 1; i >= 0; --i) {
    const auto axis = static_cast<std::size_t>(i);
    if (scale->shape[axis] > 1 && scale->strides[axis] != step)
      fail(std::string(name) + ": must be C-contiguous (1 value, or kv_heads * head_dim in order), got shape " + scale->shape_string());
    step *= scale->shape[axis];
  }
  return {scale->data, step};
}

// cos_cache / sin_cache: [max_position, rotary_dim / 2] of the new rows' type, rows contiguous.
void check_rotary_tables(const ArrayArg& cos, const ArrayArg& sin, const ArrayArg& k_new, std::int64_t head_dim) {
  for (const ArrayArg* t : {&cos, &sin}) {
    require_rank(*t, 2, "[max_position, rotary_dim / 2]");
    require_same_element(*t, k_new, " (cos_cache and sin_cache hold the new rows' type)");
    if (t->shape[0] > 1 && t->strides[0] != t->shape[1]) fail(t->name + ": its rows must be contiguous ([max_position, rotary_dim / 2] row-major)");
  }
  if (sin.shape != cos.shape) fail("sin_cache: shape " + sin.shape_string() + " must be cos_cache's " + cos.shape_string());
  if (cos.shape[1] < 1 || 2 * cos.shape[1] > head_dim)
    fail("cos_cache: dimension 1 (rotary_dim / 2 = " + std::to_string(cos.shape[1]) + ") must be in [1, head_dim / 2 = " +
         std::to_string(head_dim / 2) + "]");
}

void append_kv_arrays(nb::handle k_new_obj, nb::handle v_new_obj, nb::handle k_cache_obj, nb::handle v_cache_obj,
                      nb::handle positions_obj, nb::handle table_obj, nb::handle lengths_obj, bool hnd,
                      nb::handle cos_obj, nb::handle sin_obj, bool rotary_interleaved, nb::handle k_scale_obj,
                      nb::handle v_scale_obj, const std::string& k_quant_type, const std::string& v_quant_type,
                      std::int64_t kv_cache_bit_width, const std::string& backend, std::uintptr_t stream) {
  ArrayArg k_new = import_array(k_new_obj, "k_new", false), v_new = import_array(v_new_obj, "v_new", false);
  ArrayArg k_cache = import_array(k_cache_obj, "k_cache", true), v_cache = import_array(v_cache_obj, "v_cache", true);
  ArrayArg positions = import_array(positions_obj, "positions", false);
  std::optional<ArrayArg> table, lengths, cos, sin, k_scale, v_scale;
  const auto optional = [](std::optional<ArrayArg>& slot, nb::handle obj, const char* name) {
    if (!obj.is_none()) slot = import_array(obj, name, false);
  };
  optional(table, table_obj, "block_table");
  optional(lengths, lengths_obj, "new_lengths");
  optional(cos, cos_obj, "cos_cache");
  optional(sin, sin_obj, "sin_cache");
  optional(k_scale, k_scale_obj, "k_scale");
  optional(v_scale, v_scale_obj, "v_scale");
  if (cos.has_value() != sin.has_value())
    fail(std::string(cos ? "sin_cache" : "cos_cache") + ": cos_cache and sin_cache must both be given (rotary), or neither");
  std::vector<const ArrayArg*> all{&k_new, &v_new, &k_cache, &v_cache, &positions};
  for (std::optional<ArrayArg>* a : {&table, &lengths, &cos, &sin, &k_scale, &v_scale})
    if (a->has_value()) all.push_back(&**a);
  const bool cuda_ok = cuda_usable();
  const Where where = array_location(k_new, cuda_ok, cuda_built());
  for (const ArrayArg* a : all) {
    array_location(*a, cuda_ok, cuda_built());
    require_same_device(*a, k_new);
    require_kernel_strides(*a);
  }
  if (k_new.element != Element::f32 && k_new.element != Element::f16 && k_new.element != Element::bf16)
    require_element(k_new, Element::f32, "is not supported: the rows must be float32, float16 or bfloat16");
  const KvStorage k_storage = storage_of(k_quant_type, "k_quant_type", kv_cache_bit_width);
  const KvStorage v_storage = storage_of(v_quant_type, "v_quant_type", kv_cache_bit_width);
  require_same_element(v_new, k_new);
  require_cache_element(k_cache, k_new, k_storage, "k_quant_type");
  require_cache_element(v_cache, k_new, v_storage, "v_quant_type");
  for (const ArrayArg* a : {&positions, table ? &*table : nullptr, lengths ? &*lengths : nullptr})
    if (a != nullptr) require_element(*a, Element::i32, "is not supported: it must be int32");
  require_rank(k_new, 4, "[batch, new_len, kv_heads, head_dim]");
  require_rank(v_new, 4, "[batch, new_len, kv_heads, v_head_dim]");
  require_rank(k_cache, 4, hnd ? "[num_pages or batch, kv_heads, page_size or capacity, head_dim]"
                               : "[num_pages or batch, page_size or capacity, kv_heads, head_dim]");
  require_rank(v_cache, 4, "like k_cache");
  require_rank(positions, 1, "[batch]");
  KvAppendProblem p;
  p.dtype = to_dtype(k_new.element);
  p.batch = k_new.shape[0];
  p.new_len = k_new.shape[1];
  p.kv_heads = k_new.shape[2];
  p.head_dim = k_new.shape[3];
  p.v_head_dim = v_new.shape[3];
  if (v_new.shape[0] != p.batch || v_new.shape[1] != p.new_len || v_new.shape[2] != p.kv_heads)
    fail("v_new: shape " + v_new.shape_string() + " does not match k_new's " + k_new.shape_string() + " (batch, rows, heads)");
  const int heads_axis = hnd ? 1 : 2, rows_axis = hnd ? 2 : 1;
  for (const ArrayArg* c : {&k_cache, &v_cache}) {
    if (c->shape[heads_axis] != p.kv_heads)
      fail(c->name + ": has " + std::to_string(c->shape[heads_axis]) + " K/V heads; k_new has " + std::to_string(p.kv_heads));
    if (c->shape[0] != k_cache.shape[0] || c->shape[rows_axis] != k_cache.shape[rows_axis])
      fail("v_cache: shape " + v_cache.shape_string() + " does not match k_cache's " + k_cache.shape_string());
  }
  // The last dimension: head_dim values, or (head_dim + 1) / 2 bytes of int4 pairs.
  const auto last_dim = [](const KvStorage& s, std::int64_t dim) { return s.type == KvType::Int4 ? (dim + 1) / 2 : dim; };
  if (k_cache.shape[3] != last_dim(k_storage, p.head_dim))
    fail("k_cache: last dimension " + std::to_string(k_cache.shape[3]) + " must be " + std::to_string(last_dim(k_storage, p.head_dim)) +
         (k_storage.type == KvType::Int4 ? " ((head_dim + 1) / 2 bytes of int4 pairs)" : " (k_new's head_dim)"));
  if (v_cache.shape[3] != last_dim(v_storage, p.v_head_dim))
    fail("v_cache: last dimension " + std::to_string(v_cache.shape[3]) + " must be " + std::to_string(last_dim(v_storage, p.v_head_dim)) +
         (v_storage.type == KvType::Int4 ? " ((head_dim + 1) / 2 bytes of int4 pairs)" : " (v_new's head_dim)"));
  p.k_storage = k_storage;
  p.v_storage = v_storage;
  if (cos) {
    check_rotary_tables(*cos, *sin, k_new, p.head_dim);
    p.rotary_dim = 2 * cos->shape[1];
    p.rotary_positions = cos->shape[0];
  }
  p.rotary_interleaved = rotary_interleaved;
  if (positions.shape[0] != p.batch) fail("positions: needs one entry per batch entry (" + std::to_string(p.batch) + ")");
  if (lengths) {
    require_rank(*lengths, 1, "[batch]");
    if (lengths->shape[0] != p.batch) fail("new_lengths: needs one entry per batch entry (" + std::to_string(p.batch) + ")");
    p.has_new_lengths = true;
  }
  if (table) {
    require_rank(*table, 2, "[batch, max_pages_per_seq]");
    if (table->shape[0] != p.batch) fail("block_table: has " + std::to_string(table->shape[0]) + " rows; it needs one per batch entry");
    p.page_size = k_cache.shape[rows_axis];
    p.num_pages = k_cache.shape[0];
    p.max_pages_per_seq = table->shape[1];
  } else {
    if (k_cache.shape[0] != p.batch) fail("k_cache: a dense cache (no block_table) needs one entry per batch entry");
    p.capacity = k_cache.shape[rows_axis];
  }
  p.k_new = Layout{0, k_new.strides[0], k_new.strides[2], k_new.strides[1]};
  p.v_new = Layout{0, v_new.strides[0], v_new.strides[2], v_new.strides[1]};
  p.k_cache = cache_layout(k_cache, hnd, k_storage);
  p.v_cache = cache_layout(v_cache, hnd, v_storage);
  KvAppendArgs a;
  a.k_new = {k_new.data, k_new.extent()};
  a.v_new = {v_new.data, v_new.extent()};
  a.k_cache = {k_cache.data, (k_storage.type == KvType::Int4 ? 2 : 1) * k_cache.extent()};
  a.v_cache = {v_cache.data, (v_storage.type == KvType::Int4 ? 2 : 1) * v_cache.extent()};
  if (cos) {
    a.cos_cache = {cos->data, cos->extent()};
    a.sin_cache = {sin->data, sin->extent()};
  }
  a.k_scale = scale_buffer(k_scale, "k_scale", k_storage);
  a.v_scale = scale_buffer(v_scale, "v_scale", v_storage);
  a.positions = {positions.data, positions.extent()};
  if (table) a.block_table = {table->data, table->extent()};
  if (lengths) a.new_lengths = {lengths->data, lengths->extent()};
  a.stream = reinterpret_cast<void*>(stream);
  if (where == Where::cuda ? backend != "auto" && backend != "cuda" : backend != "auto" && backend != "cpu")
    fail("backend: \"" + backend + "\" does not run " + (where == Where::cuda ? "CUDA" : "host") +
         " arrays (append_kv: \"auto\" or \"cpu\" for host arrays, \"cuda\" for CUDA arrays)");
  const CudaDeviceGuard device_guard(where == Where::cuda ? k_new.device_id : -1);
  nb::gil_scoped_release release;
  append_kv(p, a, where == Where::cuda ? Backend::Cuda : Backend::Cpu);  // every rule checked before a write
}

}  // namespace

void register_kv_append(nb::module_& m) {
  m.def("append_kv", &append_kv_arrays, nb::arg("k_new"), nb::arg("v_new"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("positions"), nb::arg("block_table").none(), nb::arg("new_lengths").none(), nb::arg("hnd"),
        nb::arg("cos_cache").none(), nb::arg("sin_cache").none(), nb::arg("rotary_interleaved"),
        nb::arg("k_scale").none(), nb::arg("v_scale").none(), nb::arg("k_quant_type"), nb::arg("v_quant_type"),
        nb::arg("kv_cache_bit_width"), nb::arg("backend"), nb::arg("stream"),
        "New K/V rows into paged or dense caches, in place (host or CUDA arrays); see attnkit.append_kv.");
}

}  // namespace attnkit::python
