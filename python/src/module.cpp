// attnkit._attnkit: the nanobind extension behind `import attnkit`.
//
// `attention` maps its array arguments onto one AttentionProblem (layouts straight from the arrays' strides),
// checks everything the Python side can check, plans (which checks the problem), allocates the outputs it was
// not given, and runs with the GIL released. Every check comes before the run, so a rejected call writes
// nothing. attnkit::Error becomes ValueError with the library's message.
#include "arrays.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/error.hpp>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <ostream>
#include <streambuf>
#include <string>
#include <vector>

#if defined(ATTNKIT_PYTHON_HAS_CLI)
#include "cli/cli.hpp"
#endif

namespace attnkit::python {
namespace {

MaskedRows parse_masked_rows(const std::string& s) {
  if (s == "nan") return MaskedRows::Nan;
  if (s == "zero") return MaskedRows::Zero;
  throw nb::value_error(("masked_rows: must be \"nan\" or \"zero\", got \"" + s + "\"").c_str());
}

Backend parse_backend(const std::string& s) {
  if (s == "auto") return Backend::Auto;
  if (s == "cpu") return Backend::Cpu;
  if (s == "reference") return Backend::Reference;
  if (s == "cuda") return Backend::Cuda;
  if (s == "vulkan") return Backend::Vulkan;
  throw nb::value_error(
      ("backend: must be \"auto\", \"cpu\", \"reference\", \"cuda\" or \"vulkan\", got \"" + s + "\"").c_str());
}

std::string dims_string(const std::vector<std::int64_t>& d) {
  std::string s = "(";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

// Q, K, V (and O) must be 4-D in the order the layout string names.
void require_4d(const ArrayArg& a, const Axes& axes) {
  if (a.ndim() == 4) return;
  throw nb::value_error((a.name + ": must be 4-D " + axes.order_string() + " (layout \"" + axes.name + "\"), got shape " +
                         a.shape_string())
                            .c_str());
}

void require_dim(const ArrayArg& a, int axis, std::int64_t want, const char* what, const std::string& from) {
  if (a.shape[axis] == want) return;
  throw nb::value_error((a.name + ": " + what + " (dimension " + std::to_string(axis) + ") is " +
                         std::to_string(a.shape[axis]) + " but " + from + " gives " + std::to_string(want) +
                         " (shape " + a.shape_string() + ")")
                            .c_str());
}

// The additive mask: float32, broadcastable (NumPy rules) to [batch, heads, q_len, k_len]; the key dimension
// cannot broadcast (a layout's row elements are contiguous).
Layout mask_layout(const ArrayArg& m, const std::vector<std::int64_t>& target) {
  const std::string full = dims_string(target);
  if (m.ndim() < 1 || m.ndim() > 4) {
    throw nb::value_error(("mask: must have 1 to 4 dimensions broadcastable to [batch, heads, q_len, k_len] = " + full +
                           ", got shape " + m.shape_string())
                              .c_str());
  }
  std::int64_t strides[4] = {0, 0, 0, 0};
  const std::int64_t lead = 4 - m.ndim();
  for (std::int64_t i = 0; i < m.ndim(); ++i) {
    const std::int64_t t = lead + i;
    if (m.shape[i] == target[t]) {
      strides[t] = m.strides[i];
    } else if (m.shape[i] != 1) {
      throw nb::value_error(("mask: shape " + m.shape_string() + " does not broadcast to [batch, heads, q_len, k_len] = " +
                             full)
                                .c_str());
    }
  }
  if (m.shape.back() != target[3]) {
    throw nb::value_error(("mask: the last dimension must be k_len = " + std::to_string(target[3]) +
                           " (the key dimension does not broadcast), got shape " + m.shape_string())
                              .c_str());
  }
  return Layout{0, strides[0], strides[1], strides[2]};
}

void require_vector(const ArrayArg& a, std::int64_t length, const char* what) {
  if (a.ndim() != 1 || a.shape[0] != length) {
    throw nb::value_error((a.name + ": must be 1-D of length " + std::to_string(length) + " (" + what + "), got shape " +
                           a.shape_string())
                              .c_str());
  }
}

nb::tuple shape_tuple(const std::vector<std::int64_t>& d) {
  nb::list l;
  for (std::int64_t x : d) l.append(x);
  return nb::tuple(l);
}

nb::tuple attention(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle mask_obj,
                    nb::handle key_lengths_obj, nb::handle head_sink_obj, bool causal,
                    std::optional<std::int64_t> causal_offset, nb::handle causal_offsets_obj,
                    std::optional<std::int64_t> window,
                    std::optional<float> softcap, std::optional<float> scale, const std::string& masked_rows,
                    bool return_lse, nb::handle out_obj, const std::string& layout, std::optional<int> threads,
                    const std::string& backend, std::uintptr_t stream, nb::callable alloc, nb::handle lse_obj,
                    const std::string& plan) {
  // Options first: they need no array.
  const Axes axes = parse_axes(layout);
  AttentionProblem p;
  p.masked_rows = parse_masked_rows(masked_rows);
  AttentionConfig config;
  config.backend = parse_backend(backend);
  config.threads = threads.value_or(0);
  config.plan = parse_plan_overrides(plan);
  if ((causal_offset || !causal_offsets_obj.is_none()) && !causal)
    throw nb::value_error("causal_offset: is set but causal is False");

  // Imports, in argument order; then the device, element type, shape and stride rules.
  ArrayArg q = import_array(q_obj, "q", false);
  ArrayArg k = import_array(k_obj, "k", false);
  ArrayArg v = import_array(v_obj, "v", false);
  std::optional<ArrayArg> mask, lengths, offsets, sink, out;
  if (!mask_obj.is_none()) mask = import_array(mask_obj, "mask", false);
  if (!key_lengths_obj.is_none()) lengths = import_array(key_lengths_obj, "key_lengths", false);
  if (!causal_offsets_obj.is_none()) offsets = import_array(causal_offsets_obj, "causal_offset", false);
  if (!head_sink_obj.is_none()) sink = import_array(head_sink_obj, "head_sink", false);
  if (!out_obj.is_none()) out = import_array(out_obj, "out", true);

  const ArrayArg* all_arrays[8] = {&q, &k, &v};  // (a fixed array: this runs on every call)
  std::size_t array_count = 3;
  for (auto* o : {&mask, &lengths, &offsets, &sink, &out})
    if (*o) all_arrays[array_count++] = &**o;
  // The arrays' device picks the backend: CUDA arrays run on the CUDA backend, host arrays on the CPU ones.
  const bool cuda_ok = cuda_usable();
  const Where where = array_location(q, cuda_ok, cuda_built());
  for (std::size_t i = 0; i < array_count; ++i) {
    array_location(*all_arrays[i], cuda_ok, cuda_built());
    require_same_device(*all_arrays[i], q);
  }
  if (where == Where::cuda) {
    if (config.backend == Backend::Auto) config.backend = Backend::Cuda;
    if (config.backend != Backend::Cuda) {
      throw nb::value_error(("backend: \"" + backend_name(config.backend) + "\" runs host arrays, but q is on " +
                             device_string(q) + " (use backend=\"auto\" or \"cuda\")")
                                .c_str());
    }
  } else if (config.backend == Backend::Cuda) {
    throw nb::value_error(("backend: \"cuda\" runs CUDA arrays, but q is on " + device_string(q)).c_str());
  }
  const CudaDeviceGuard device_guard(where == Where::cuda ? q.device_id : -1);

  if (q.element != Element::f32 && q.element != Element::f16 && q.element != Element::bf16)
    require_element(q, Element::f32, "is not supported: q, k and v must be float32, float16 or bfloat16");
  constexpr const char* kShared = " (q, k, v and out share one dtype)";
  require_same_element(k, q, kShared);
  require_same_element(v, q, kShared);
  if (out) require_same_element(*out, q, kShared);
  if (mask && mask->element != Element::f16 && mask->element != Element::bf16)
    require_element(*mask, Element::f32,
                    "is not supported: the mask is float32, float16 or bfloat16 (additive, -inf hides a key) or bool");
  if (lengths) require_element(*lengths, Element::i32, "is not supported: key_lengths is int32");
  if (offsets)
    require_element(*offsets, Element::i32, "is not supported: per-batch causal offsets are int32 (or pass an int)");
  if (sink) require_element(*sink, Element::f32, "is not supported: head_sink is float32");

  require_4d(q, axes);
  require_4d(k, axes);
  require_4d(v, axes);
  const std::int64_t batch = q.shape[axes.batch], heads = q.shape[axes.heads], q_len = q.shape[axes.seq],
                     head_dim = q.shape[axes.dim];
  const std::int64_t kv_heads = k.shape[axes.heads], k_len = k.shape[axes.seq], v_head_dim = v.shape[axes.dim];
  // In an AttentionProblem a kv_heads or v_head_dim of 0 means "same as heads / head_dim": an array's empty
  // dimension must not turn into that default (and into a message about another argument).
  if (kv_heads == 0 || v_head_dim == 0) {
    const ArrayArg& a = kv_heads == 0 ? k : v;
    const int axis = kv_heads == 0 ? axes.heads : axes.dim;
    throw nb::value_error((a.name + ": " + (kv_heads == 0 ? "heads" : "head_dim") + " (dimension " +
                           std::to_string(axis) + ") is 0; it must be >= 1 (shape " + a.shape_string() + ")")
                              .c_str());
  }
  require_dim(k, axes.batch, batch, "batch", "q");
  require_dim(k, axes.dim, head_dim, "head_dim", "q");
  require_dim(v, axes.batch, batch, "batch", "q");
  require_dim(v, axes.heads, kv_heads, "heads", "k");
  require_dim(v, axes.seq, k_len, "k_len", "k");

  std::vector<std::int64_t> out_shape(4);
  out_shape[axes.batch] = batch;
  out_shape[axes.heads] = heads;
  out_shape[axes.seq] = q_len;
  out_shape[axes.dim] = v_head_dim;
  const std::vector<std::int64_t> lse_shape{batch, heads, q_len};
  if (out && out->shape != out_shape) {
    throw nb::value_error(("out: shape " + out->shape_string() + " must be " + dims_string(out_shape) + " " +
                           axes.order_string() + " (q's shape with v's head_dim)")
                              .c_str());
  }
  if (lengths) require_vector(*lengths, batch, "one key length per batch entry");
  if (offsets) require_vector(*offsets, batch, "one causal offset per batch entry");
  if (sink) require_vector(*sink, heads, "one sink logit per query head");

  for (std::size_t i = 0; i < array_count; ++i) require_kernel_strides(*all_arrays[i]);

  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.q_len = q_len;
  p.k_len = k_len;
  p.head_dim = head_dim;
  p.v_head_dim = v_head_dim;
  p.scale = scale;
  p.dtype = to_dtype(q.element);
  p.q = tensor_layout(q, axes);
  p.k = tensor_layout(k, axes);
  p.v = tensor_layout(v, axes);
  if (mask) {
    p.has_mask = true;
    p.mask_dtype = to_dtype(mask->element);
    p.mask = mask_layout(*mask, {batch, heads, q_len, k_len});
  }
  p.has_key_lengths = lengths.has_value();
  p.causal = causal;
  p.causal_offset = causal_offset;
  p.has_causal_offsets = offsets.has_value();
  p.window = window;
  p.softcap = softcap;
  p.has_head_sink = sink.has_value();
  p.return_lse = return_lse;
  // Outputs we allocate are dense: head-first or positions-first like the inputs; the LSE is [B, H, Sq].
  const auto dense_o = axes.name == "bshd" ? Layout::positions_first(heads, q_len, v_head_dim)
                                           : Layout::head_first(heads, q_len, v_head_dim);
  p.o = out ? tensor_layout(*out, axes) : dense_o;
  p.lse = Layout::rows_only(heads, q_len);

  // Plan: checks the problem (shapes, layouts, options) before anything is allocated or written.
  Attention op(p, config);

  nb::object out_result = out ? nb::borrow(out_obj) : alloc(shape_tuple(out_shape), "out");
  if (!out) {
    out = import_array(out_result, "out", true);
    require_same_device(*out, q);
    require_element(*out, q.element, "was allocated with the wrong dtype");
    if (out->shape != out_shape) throw nb::value_error("out: was allocated with the wrong shape");
    require_kernel_strides(*out);
  }
  nb::object lse_result = nb::none();
  std::optional<ArrayArg> lse;
  if (return_lse) {
    lse_result = lse_obj.is_none() ? alloc(shape_tuple(lse_shape), "lse") : nb::borrow(lse_obj);
    lse = import_array(lse_result, "lse", true);
    require_same_device(*lse, q);
    require_element(*lse, Element::f32, "was allocated with the wrong dtype");
    if (lse->shape != lse_shape) throw nb::value_error("lse: was allocated with the wrong shape");
    require_kernel_strides(*lse);  // also refuses negative strides
  }
  // An allocator may hand out other strides than the dense ones planned for: plan again with those.
  const Layout o_layout = tensor_layout(*out, axes);
  const Layout lse_layout = lse ? Layout{0, lse->strides[0], lse->strides[1], lse->strides[2]} : p.lse;
  auto same_layout = [](const Layout& a, const Layout& b) {
    return a.offset == b.offset && a.batch_stride == b.batch_stride && a.head_stride == b.head_stride &&
           a.row_stride == b.row_stride;
  };
  if (!same_layout(o_layout, p.o) || !same_layout(lse_layout, p.lse)) {
    p.o = o_layout;
    p.lse = lse_layout;
    op = Attention(p, config);
  }

  // CUDA scratch (split-K partials, the key-length flag) comes from the caller's framework allocator, so that a
  // call captured into a CUDA graph allocates nothing itself. The array lives until this call returns; PyTorch's
  // stream-ordered caching allocator keeps its memory for the kernels already queued on the caller's stream.
  nb::object scratch_result;
  std::optional<ArrayArg> scratch;
  if (op.backend() == Backend::Cuda && op.scratch_bytes() > 0) {
    const auto floats = static_cast<std::int64_t>((op.scratch_bytes() + 3) / 4);
    scratch_result = alloc(shape_tuple(std::vector<std::int64_t>{floats}), "scratch");
    scratch = import_array(scratch_result, "scratch", true);
    require_same_device(*scratch, q);
  }

  AttentionArgs args;
  if (scratch) {
    args.scratch = scratch->data;
    args.scratch_bytes = op.scratch_bytes();
  } else if (op.backend() != Backend::Cuda && op.scratch_bytes() > 0) {
    // Host scratch kept per thread between calls: the op is new each call, and its own buffer would be allocated
    // and zeroed every time (most of a tiny call's cost). The kernels never read scratch they did not write.
    static thread_local std::vector<std::byte> host_scratch;
    constexpr std::size_t kAlign = 64;
    if (host_scratch.size() < op.scratch_bytes() + kAlign) host_scratch.resize(op.scratch_bytes() + kAlign);
    const auto address = reinterpret_cast<std::uintptr_t>(host_scratch.data());
    args.scratch = host_scratch.data() + (kAlign - address % kAlign) % kAlign;
    args.scratch_bytes = op.scratch_bytes();
  }
  args.q = {q.data, q.extent()};
  args.k = {k.data, k.extent()};
  args.v = {v.data, v.extent()};
  args.o = {out->data, out->extent()};
  if (mask) args.mask = {mask->data, mask->extent()};
  if (lengths) args.key_lengths = {lengths->data, lengths->extent()};
  if (offsets) args.causal_offsets = {offsets->data, offsets->extent()};
  if (sink) args.head_sink = {sink->data, sink->extent()};
  if (lse) args.lse = {lse->data, lse->extent()};
  args.stream = reinterpret_cast<void*>(stream);  // the caller's current stream (CUDA backend only)
  {
    nb::gil_scoped_release release;
    op.run(args);  // checks the buffers (extents, overlap, key lengths) before it writes
  }
  return nb::make_tuple(out_result, lse_result);
}

std::vector<std::string> backends() {
  std::vector<std::string> names;
  for (Backend b : available_backends()) names.push_back(backend_name(b));
  return names;
}

// A streambuf that hands whole lines to sys.stdout / sys.stderr (taking the GIL for each), so the CLI's output
// lands where Python's own output goes (pytest's capture, Jupyter, a redirected sys.stdout).
class PythonStreamBuf : public std::streambuf {
 public:
  explicit PythonStreamBuf(const char* stream) : stream_(stream) {}
  ~PythonStreamBuf() override { flush_lines(); }

 protected:
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) {
      pending_.push_back(static_cast<char>(c));
      if (c == '\n') flush_lines();
    }
    return traits_type::not_eof(c);
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    pending_.append(s, static_cast<std::size_t>(n));
    if (std::memchr(s, '\n', static_cast<std::size_t>(n)) != nullptr) flush_lines();
    return n;
  }
  int sync() override {
    flush_lines();
    return 0;
  }

 private:
  void flush_lines() {
    if (pending_.empty()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* stream = PySys_GetObject(stream_);  // borrowed
    PyObject* text = PyUnicode_DecodeUTF8(pending_.data(), static_cast<Py_ssize_t>(pending_.size()), "replace");
    if (stream != nullptr && stream != Py_None && text != nullptr) {
      PyObject* r = PyObject_CallMethod(stream, "write", "O", text);
      Py_XDECREF(r);
    }
    Py_XDECREF(text);
    if (PyErr_Occurred()) PyErr_Clear();
    PyGILState_Release(gil);
    pending_.clear();
  }
  const char* stream_;
  std::string pending_;
};

int run_cli(const std::vector<std::string>& args) {
#if defined(ATTNKIT_PYTHON_HAS_CLI)
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  PythonStreamBuf out_buf("stdout"), err_buf("stderr");
  std::ostream out(&out_buf), err(&err_buf);
  int rc = 0;
  bool interrupted = false;
  // Ctrl-C: Python's handler only sets a flag while the GIL is released; the tool asks between cases.
  // The handler's exception is cleared here (the tool's output still goes through sys.stdout) and raised after.
  auto stop = [&interrupted] {
    nb::gil_scoped_acquire acquire;
    if (!interrupted && PyErr_CheckSignals() != 0) {
      PyErr_Clear();
      interrupted = true;
    }
    return interrupted;
  };
  {
    nb::gil_scoped_release release;
    rc = attnkit::cli::run(static_cast<int>(argv.size()), argv.data(), out, err, stop);
    out.flush();
    err.flush();
  }
  if (interrupted) {  // KeyboardInterrupt, raised where Python expects it
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw nb::python_error();
  }
  return rc;
#else
  (void)args;
  throw std::runtime_error("this build of attnkit has no command-line tool (configure with -DATTNKIT_BUILD_CLI=ON)");
#endif
}

}  // namespace

void register_gqa(nb::module_& m);  // gqa_binding.cpp: group_query_attention
void register_sequences(nb::module_& m);  // sequences_binding.cpp: attention_varlen, paged K/V
void register_kv_append(nb::module_& m);  // kv_append_binding.cpp: append_kv

}  // namespace attnkit::python

NB_MODULE(_attnkit, m) {
  namespace nb = nanobind;
  using namespace attnkit::python;
  m.doc() = "attnkit's compiled core; use the `attnkit` package (attnkit.attention).";
  m.attr("__version__") = ATTNKIT_VERSION;
#if defined(ATTNKIT_PYTHON_HAS_CLI)
  m.attr("has_cli") = true;
#else
  m.attr("has_cli") = false;
#endif

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const attnkit::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const attnkit::RuntimeError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(),
        nb::arg("key_lengths").none(), nb::arg("head_sink").none(), nb::arg("causal"),
        nb::arg("causal_offset").none(), nb::arg("causal_offsets").none(), nb::arg("window").none(), nb::arg("softcap").none(),
        nb::arg("scale").none(), nb::arg("masked_rows"), nb::arg("return_lse"), nb::arg("out").none(),
        nb::arg("layout"), nb::arg("threads").none(), nb::arg("backend"), nb::arg("stream"), nb::arg("alloc"),
        nb::arg("lse") = nb::none(), nb::arg("plan") = "",
        "Runs the attention op; see attnkit.attention (which allocates outputs through `alloc(shape, what)` and "
        "passes the caller's current CUDA stream as an integer, 0 for the default stream; `lse`: a float32 "
        "[B, H, Sq] destination for return_lse instead of alloc's). "
        "Returns (out, lse or None).");
  m.def("available_backends", &backends, "Backends this build can run now, e.g. ['cpu', 'reference'].");
  m.def("_cli", &run_cli, nb::arg("argv"),
        "Runs the attnkit command-line tool in-process (argv[0] is the program name); returns its exit code.");
  register_gqa(m);
  register_sequences(m);
  register_kv_append(m);
}
