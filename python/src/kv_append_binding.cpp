// The binding of append_kv (include/attnkit/kv_append.hpp): attnkit.append_kv writes new K/V rows into paged or
// dense caches in place. Host arrays run on the CPU, CUDA arrays on the CUDA backend (values read on the device
// only: the call captures in a CUDA graph).
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

// [lead, rows, heads, dim] ("nhd") or [lead, heads, rows, dim] ("hnd") as (batch or page, head, row) strides.
Layout cache_layout(const ArrayArg& a, bool hnd) {
  return hnd ? Layout{0, a.strides[0], a.strides[1], a.strides[2]} : Layout{0, a.strides[0], a.strides[2], a.strides[1]};
}

void append_kv_arrays(nb::handle k_new_obj, nb::handle v_new_obj, nb::handle k_cache_obj, nb::handle v_cache_obj,
                      nb::handle positions_obj, nb::handle table_obj, nb::handle lengths_obj, bool hnd,
                      const std::string& backend, std::uintptr_t stream) {
  ArrayArg k_new = import_array(k_new_obj, "k_new", false), v_new = import_array(v_new_obj, "v_new", false);
  ArrayArg k_cache = import_array(k_cache_obj, "k_cache", true), v_cache = import_array(v_cache_obj, "v_cache", true);
  ArrayArg positions = import_array(positions_obj, "positions", false);
  std::optional<ArrayArg> table, lengths;
  if (!table_obj.is_none()) table = import_array(table_obj, "block_table", false);
  if (!lengths_obj.is_none()) lengths = import_array(lengths_obj, "new_lengths", false);
  std::vector<const ArrayArg*> all{&k_new, &v_new, &k_cache, &v_cache, &positions};
  if (table) all.push_back(&*table);
  if (lengths) all.push_back(&*lengths);
  const bool cuda_ok = cuda_usable();
  const Where where = array_location(k_new, cuda_ok, cuda_built());
  for (const ArrayArg* a : all) {
    array_location(*a, cuda_ok, cuda_built());
    require_same_device(*a, k_new);
    require_kernel_strides(*a);
  }
  if (k_new.element != Element::f32 && k_new.element != Element::f16 && k_new.element != Element::bf16)
    require_element(k_new, Element::f32, "is not supported: the rows must be float32, float16 or bfloat16");
  for (const ArrayArg* a : {&v_new, &k_cache, &v_cache}) require_same_element(*a, k_new);
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
  if (k_cache.shape[3] != p.head_dim) fail("k_cache: head_dim " + std::to_string(k_cache.shape[3]) + " must be k_new's " + std::to_string(p.head_dim));
  if (v_cache.shape[3] != p.v_head_dim) fail("v_cache: head_dim " + std::to_string(v_cache.shape[3]) + " must be v_new's " + std::to_string(p.v_head_dim));
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
  p.k_cache = cache_layout(k_cache, hnd);
  p.v_cache = cache_layout(v_cache, hnd);
  KvAppendArgs a;
  a.k_new = {k_new.data, k_new.extent()};
  a.v_new = {v_new.data, v_new.extent()};
  a.k_cache = {k_cache.data, k_cache.extent()};
  a.v_cache = {v_cache.data, v_cache.extent()};
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
        nb::arg("backend"), nb::arg("stream"),
        "New K/V rows into paged or dense caches, in place (host or CUDA arrays); see attnkit.append_kv.");
}

}  // namespace attnkit::python
