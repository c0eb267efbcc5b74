// The binding of ragged batches and paged K/V caches (AttentionProblem::sequences): attnkit.attention_varlen and
// attnkit.attention(..., block_table=...). Host arrays run on the CPU (or Reference, or Vulkan) backend, CUDA arrays
// on the CUDA backend, which reads the sequence arrays on the device only (the call captures in a CUDA graph).
#include "arrays.hpp"

#include <attnkit/attention.hpp>

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

// A [rows, heads, dim] array (packed sequences) as a layout whose rows are the packed rows.
Layout packed_layout(const ArrayArg& a) { return Layout{0, 0, a.strides[1], a.strides[0]}; }

// K/V pages: [pages, page_size, heads, dim] ("nhd") or [pages, heads, page_size, dim] ("hnd").
Layout page_layout(const ArrayArg& a, bool hnd) {
  return hnd ? Layout{0, a.strides[0], a.strides[1], a.strides[2]} : Layout{0, a.strides[0], a.strides[2], a.strides[1]};
}

nb::tuple shape_of(const std::vector<std::int64_t>& d) {
  nb::list l;
  for (std::int64_t x : d) l.append(x);
  return nb::tuple(l);
}

struct Inputs {
  ArrayArg q, k, v;
  std::optional<ArrayArg> cu_q, cu_k, table, lengths, sink, out;
  Where where = Where::host;
};

Inputs import_inputs(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_q, nb::handle cu_k, nb::handle table,
                     nb::handle lengths, nb::handle sink, nb::handle out) {
  Inputs in{import_array(q, "q", false), import_array(k, "k", false), import_array(v, "v", false)};
  const auto take = [](nb::handle h, const char* name, bool writable) {
    return h.is_none() ? std::optional<ArrayArg>{} : std::optional<ArrayArg>{import_array(h, name, writable)};
  };
  in.cu_q = take(cu_q, "cu_seqlens_q", false);
  in.cu_k = take(cu_k, "cu_seqlens_k", false);
  in.table = take(table, "block_table", false);
  in.lengths = take(lengths, "key_lengths", false);
  in.sink = take(sink, "head_sink", false);
  in.out = take(out, "out", true);
  std::vector<const ArrayArg*> all{&in.q, &in.k, &in.v};
  for (auto* o : {&in.cu_q, &in.cu_k, &in.table, &in.lengths, &in.sink, &in.out})
    if (*o) all.push_back(&**o);
  const bool cuda_ok = cuda_usable();
  in.where = array_location(in.q, cuda_ok, cuda_built());
  for (const ArrayArg* a : all) {
    array_location(*a, cuda_ok, cuda_built());
    require_same_device(*a, in.q);
    require_kernel_strides(*a);
  }
  if (in.q.element != Element::f32 && in.q.element != Element::f16 && in.q.element != Element::bf16)
    require_element(in.q, Element::f32, "is not supported: q, k and v must be float32, float16 or bfloat16");
  require_same_element(in.k, in.q);
  require_same_element(in.v, in.q);
  if (in.out) require_same_element(*in.out, in.q);
  for (auto* o : {&in.cu_q, &in.cu_k, &in.table, &in.lengths})
    if (*o) require_element(**o, Element::i32, "is not supported: it must be int32");
  if (in.sink) require_element(*in.sink, Element::f32, "is not supported: head_sink is float32");
  return in;
}

// The problem's shape fields from the arrays: ragged or dense queries, ragged or paged keys.
void set_shapes(AttentionProblem& p, const Inputs& in, std::int64_t max_q, std::int64_t max_k, bool hnd) {
  SequenceLayout& s = p.sequences;
  if (in.cu_q) {
    require_rank(in.q, 3, "[total_q, heads, head_dim] (packed sequences)");
    s.ragged_q = true;
    s.total_q = in.q.shape[0];
    p.batch = in.cu_q->shape.empty() ? 0 : in.cu_q->shape[0] - 1;
    p.q_len = max_q;
    p.heads = in.q.shape[1];
    p.head_dim = in.q.shape[2];
    p.q = packed_layout(in.q);
  } else {
    require_rank(in.q, 4, "[batch, q_len, heads, head_dim] (dense queries against pages)");
    p.batch = in.q.shape[0];
    p.q_len = in.q.shape[1];
    p.heads = in.q.shape[2];
    p.head_dim = in.q.shape[3];
    p.q = Layout{0, in.q.strides[0], in.q.strides[2], in.q.strides[1]};
  }
  if (in.table) {
    require_rank(in.k, 4, hnd ? "pages [num_pages, kv_heads, page_size, head_dim]" : "pages [num_pages, page_size, kv_heads, head_dim]");
    require_rank(in.v, 4, "pages like k");
    require_rank(*in.table, 2, "[batch, max_pages_per_seq]");
    s.num_pages = in.k.shape[0];
    s.page_size = in.k.shape[hnd ? 2 : 1];
    s.max_pages_per_seq = in.table->shape[1];
    p.kv_heads = in.k.shape[hnd ? 1 : 2];
    p.k_len = max_k >= 0 ? max_k : s.max_pages_per_seq * s.page_size;
    p.v_head_dim = in.v.shape[3];
    if (in.v.shape[0] != s.num_pages || in.v.shape[hnd ? 2 : 1] != s.page_size || in.v.shape[hnd ? 1 : 2] != p.kv_heads)
      fail("v: pages of shape " + in.v.shape_string() + " do not match k's " + in.k.shape_string());
    if (in.table->shape[0] != p.batch)
      fail("block_table: has " + std::to_string(in.table->shape[0]) + " rows; it needs one per sequence (" + std::to_string(p.batch) + ")");
    p.k = page_layout(in.k, hnd);
    p.v = page_layout(in.v, hnd);
  } else {
    if (!in.cu_k) fail("cu_seqlens_k: is needed for ragged keys (or pass block_table for paged K/V)");
    require_rank(in.k, 3, "[total_k, kv_heads, head_dim] (packed sequences)");
    require_rank(in.v, 3, "[total_k, kv_heads, v_head_dim] (packed sequences)");
    if (in.v.shape[0] != in.k.shape[0] || in.v.shape[1] != in.k.shape[1])
      fail("v: shape " + in.v.shape_string() + " does not match k's " + in.k.shape_string() + " (rows, heads)");
    s.ragged_k = true;
    s.total_k = in.k.shape[0];
    p.kv_heads = in.k.shape[1];
    p.k_len = max_k;
    p.v_head_dim = in.v.shape[2];
    p.k = packed_layout(in.k);
    p.v = packed_layout(in.v);
  }
  if (in.k.shape.back() != p.head_dim) fail("k: head_dim " + std::to_string(in.k.shape.back()) + " must be q's " + std::to_string(p.head_dim));
}

nb::tuple attention_sequences(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle cu_q_obj,
                              nb::handle cu_k_obj, nb::handle table_obj, nb::handle lengths_obj, nb::handle sink_obj,
                              std::int64_t max_seqlen_q, std::int64_t max_seqlen_k, bool causal,
                              std::optional<std::int64_t> window, std::optional<float> softcap,
                              std::optional<float> scale, bool masked_rows_zero, bool return_lse, nb::handle out_obj,
                              bool hnd, std::optional<int> threads, const std::string& backend, std::uintptr_t stream,
                              nb::callable alloc, const std::string& plan) {
  Inputs in = import_inputs(q_obj, k_obj, v_obj, cu_q_obj, cu_k_obj, table_obj, lengths_obj, sink_obj, out_obj);
  const CudaDeviceGuard device_guard(in.where == Where::cuda ? in.q.device_id : -1);
  AttentionProblem p;
  set_shapes(p, in, max_seqlen_q, max_seqlen_k, hnd);
  p.dtype = to_dtype(in.q.element);
  p.scale = scale;
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  p.masked_rows = masked_rows_zero ? MaskedRows::Zero : MaskedRows::Nan;
  p.has_key_lengths = in.lengths.has_value();
  p.has_head_sink = in.sink.has_value();
  p.return_lse = return_lse;
  std::vector<std::int64_t> out_shape = in.q.shape;
  out_shape.back() = p.v_head_dim;
  const std::int64_t rows = p.sequences.ragged_q ? p.sequences.total_q : p.q_len;
  // lse: [heads, total_q] for packed queries (flash-attn's varlen convention), [batch, heads, q_len] otherwise.
  const std::vector<std::int64_t> lse_shape = p.sequences.ragged_q ? std::vector<std::int64_t>{p.heads, rows}
                                                                   : std::vector<std::int64_t>{p.batch, p.heads, rows};
  if (in.out && in.out->shape != out_shape) fail("out: shape " + in.out->shape_string() + " must be q's with v's head_dim");
  nb::object out_result = in.out ? nb::borrow(out_obj) : alloc(shape_of(out_shape), "out");
  if (!in.out) in.out = import_array(out_result, "out", true);
  p.o = p.sequences.ragged_q ? packed_layout(*in.out)
                             : Layout{0, in.out->strides[0], in.out->strides[2], in.out->strides[1]};
  nb::object lse_result = nb::none();
  std::optional<ArrayArg> lse;
  if (return_lse) {
    lse_result = alloc(shape_of(lse_shape), "lse");
    lse = import_array(lse_result, "lse", true);
    p.lse = p.sequences.ragged_q ? Layout{0, 0, lse->strides[0], lse->strides[1]}
                                 : Layout{0, lse->strides[0], lse->strides[1], lse->strides[2]};
  }
  AttentionConfig config;
  config.threads = threads.value_or(0);
  config.plan = parse_plan_overrides(plan);
  config.backend = in.where == Where::cuda    ? Backend::Cuda
                   : backend == "reference"   ? Backend::Reference
                   : backend == "vulkan"      ? Backend::Vulkan
                                              : Backend::Cpu;
  if (in.where == Where::cuda ? backend != "auto" && backend != "cuda"
                              : backend != "auto" && backend != "cpu" && backend != "reference" && backend != "vulkan") {
    fail("backend: \"" + backend + "\" does not run " + (in.where == Where::cuda ? "CUDA" : "host") +
         " arrays (ragged batches and paged K/V: \"auto\", \"cpu\", \"reference\", \"vulkan\" for host arrays, "
         "\"cuda\" for CUDA arrays)");
  }
  Attention op(p, config);  // checks every shape, layout and option rule
  AttentionArgs args;
  args.q = {in.q.data, in.q.extent()};
  args.k = {in.k.data, in.k.extent()};
  args.v = {in.v.data, in.v.extent()};
  args.o = {in.out->data, in.out->extent()};
  if (in.cu_q) args.cu_seqlens_q = {in.cu_q->data, in.cu_q->extent()};
  if (in.cu_k && p.sequences.ragged_k) args.cu_seqlens_k = {in.cu_k->data, in.cu_k->extent()};
  if (in.table) args.block_table = {in.table->data, in.table->extent()};
  if (in.lengths) args.key_lengths = {in.lengths->data, in.lengths->extent()};
  if (in.sink) args.head_sink = {in.sink->data, in.sink->extent()};
  if (lse) args.lse = {lse->data, lse->extent()};
  // CUDA scratch (the sequences check's faults, split-K partials) from the caller's framework allocator, on its
  // stream: no allocation or synchronisation of ours, so that the call captures in a CUDA graph.
  nb::object scratch_result;
  if (op.backend() == Backend::Cuda && op.scratch_bytes() > 0) {
    const auto floats = static_cast<std::int64_t>((op.scratch_bytes() + 3) / 4);
    scratch_result = alloc(shape_of(std::vector<std::int64_t>{floats}), "scratch");
    const ArrayArg scratch = import_array(scratch_result, "scratch", true);
    require_same_device(scratch, in.q);
    args.scratch = scratch.data;
    args.scratch_bytes = op.scratch_bytes();
  }
  args.stream = reinterpret_cast<void*>(stream);
  {
    nb::gil_scoped_release release;
    op.run(args);  // checks the buffers and the cu_seqlens / block-table values before it writes
  }
  return nb::make_tuple(out_result, lse_result);
}

}  // namespace

void register_sequences(nb::module_& m) {
  m.def("attention_sequences", &attention_sequences, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("block_table").none(),
        nb::arg("key_lengths").none(), nb::arg("head_sink").none(), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"),
        nb::arg("causal"), nb::arg("window").none(), nb::arg("softcap").none(), nb::arg("scale").none(),
        nb::arg("masked_rows_zero"), nb::arg("return_lse"), nb::arg("out").none(), nb::arg("hnd"),
        nb::arg("threads").none(), nb::arg("backend"), nb::arg("stream"), nb::arg("alloc"), nb::arg("plan"),
        "Ragged batches and paged K/V (host or CUDA arrays); see attnkit.attention_varlen. Returns (out, lse or "
        "None).");
}

}  // namespace attnkit::python
