// Importing array arguments: DLPack first (NumPy, PyTorch, CuPy, JAX), the buffer protocol second, and
// NumPy's ml_dtypes.bfloat16 arrays (which neither can carry) through a uint16 view of the same memory.
#include "arrays.hpp"

#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#if defined(ATTNKIT_PYTHON_HAS_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace attnkit::python {
namespace {

namespace dl = nb::dlpack;

// DLPack device types (dlpack.h: DLDeviceType).
constexpr int kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLROCM = 10, kDLROCMHost = 11, kDLCUDAManaged = 13;

std::string device_name(int type, int id) {
  const char* name = "unknown";
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: name = "cuda"; break;
    case kDLCUDAHost: return "cuda_host";
    case 4: name = "opencl"; break;
    case 7: name = "vulkan"; break;
    case 8: name = "metal"; break;
    case kDLROCM: name = "rocm"; break;
    case kDLROCMHost: return "rocm_host";
    case kDLCUDAManaged: name = "cuda_managed"; break;
    case 14: name = "oneapi"; break;
    default: return "device type " + std::to_string(type);
  }
  return std::string(name) + ":" + std::to_string(id);
}

bool host_accessible(int type) { return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost; }

std::string python_type_name(nb::handle obj) {
  nb::handle tp = obj.type();
  std::string module;
  if (nb::hasattr(tp, "__module__")) module = nb::cast<std::string>(nb::str(tp.attr("__module__")));
  const std::string name = nb::cast<std::string>(nb::str(tp.attr("__qualname__")));
  return module.empty() || module == "builtins" ? name : module + "." + name;
}

// The numpy module when it is already imported (an object cannot be a NumPy array otherwise), else null.
nb::object numpy_if_loaded() {
  PyObject* np = PyImport_GetModule(nb::str("numpy").ptr());
  if (np == nullptr) {
    PyErr_Clear();
    return nb::object();
  }
  return nb::steal(np);
}

// ml_dtypes' bfloat16 scalar type once ml_dtypes is imported (a NumPy bfloat16 array comes from it), else null.
// Kept for the process (a module is never unloaded): comparing a dtype's `type` with it costs a C getter, where
// its `name` is Python code in NumPy (~0.5 us a call, for each array of every call).
PyObject* ml_dtypes_bfloat16_type() {
  static PyObject* type = nullptr;
  if (type == nullptr) {
    PyObject* module = PyImport_GetModule(nb::str("ml_dtypes").ptr());
    if (module == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    type = PyObject_GetAttrString(module, "bfloat16");
    Py_DECREF(module);
    if (type == nullptr) PyErr_Clear();
  }
  return type;
}

// ml_dtypes.bfloat16 NumPy arrays can leave NumPy neither through DLPack nor the buffer protocol; a uint16
// view of the same memory can, and is read as bfloat16.
bool is_numpy_bfloat16(nb::handle obj, nb::object& numpy) {
  numpy = numpy_if_loaded();
  if (!numpy.is_valid()) return false;
  const int is_array = PyObject_IsInstance(obj.ptr(), numpy.attr("ndarray").ptr());
  if (is_array != 1) {
    PyErr_Clear();
    return false;
  }
  nb::object dtype = obj.attr("dtype");
  // The item size and kind first (C getters; ml_dtypes' bfloat16 is a 2-byte type of kind 'V'), then the type.
  if (nb::cast<std::int64_t>(dtype.attr("itemsize")) != 2) return false;
  const std::string kind = nb::cast<std::string>(dtype.attr("kind"));
  if (kind == "f" || kind == "i" || kind == "u" || kind == "b") return false;
  PyObject* bfloat16 = ml_dtypes_bfloat16_type();
  if (bfloat16 != nullptr && dtype.attr("type").ptr() == bfloat16) return true;
  return nb::cast<std::string>(nb::str(dtype.attr("name"))) == "bfloat16";  // (another package's bfloat16)
}

Element classify(dl::dtype t) {
  if (t.lanes != 1) return Element::other;
  if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Float) && t.bits == 32) return Element::f32;
  if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Float) && t.bits == 16) return Element::f16;
  if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Bfloat) && t.bits == 16) return Element::bf16;
  if (t.code == static_cast<std::uint8_t>(dl::dtype_code::Int) && t.bits == 32) return Element::i32;
  return Element::other;
}

std::string dlpack_dtype_name(dl::dtype t) {
  std::string prefix;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Int: prefix = "int"; break;
    case dl::dtype_code::UInt: prefix = "uint"; break;
    case dl::dtype_code::Float: prefix = "float"; break;
    case dl::dtype_code::Bfloat: prefix = "bfloat"; break;
    case dl::dtype_code::Complex: prefix = "complex"; break;
    case dl::dtype_code::Bool: return "bool";
    default: prefix = "dlpack-code-" + std::to_string(t.code) + "-bits-"; break;
  }
  std::string name = prefix + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

template <typename Array>
void fill_from(ArrayArg& a, const Array& arr) {
  a.data = const_cast<void*>(static_cast<const void*>(arr.data()));
  a.element = classify(arr.dtype());
  a.dtype = arr.dtype();
  a.element_bytes = (arr.dtype().bits * arr.dtype().lanes + 7) / 8;
  a.device_type = arr.device_type();
  a.device_id = arr.device_id();
  a.shape.resize(arr.ndim());
  a.strides.resize(arr.ndim());
  for (std::size_t i = 0; i < arr.ndim(); ++i) {
    a.shape[i] = static_cast<std::int64_t>(arr.shape(i));
    // A dimension of size 1 is never stepped over: its stride means nothing (frameworks leave anything there).
    a.strides[i] = a.shape[i] == 1 ? 0 : arr.stride(i);
  }
  // An empty array is never read either: give it dense strides, whatever the framework reported.
  if (arr.size() == 0) {
    std::int64_t step = 1;
    for (std::size_t i = arr.ndim(); i-- > 0;) {
      a.strides[i] = step;
      // Saturating: the other dimensions of an empty array may be of any size, and nothing steps over them.
      if (__builtin_mul_overflow(step, std::max<std::int64_t>(a.shape[i], 1), &step))
        step = std::numeric_limits<std::int64_t>::max();
    }
  }
}

[[noreturn]] void not_an_array(nb::handle obj, const std::string& name) {
  std::string why = "expected an array that supports DLPack or the buffer protocol (NumPy, PyTorch, CuPy, JAX), got " +
                    python_type_name(obj);
  if (nb::hasattr(obj, "requires_grad") && nb::hasattr(obj, "detach") &&
      PyObject_IsTrue(obj.attr("requires_grad").ptr()) == 1) {
    why = "a tensor that requires grad cannot be exported through DLPack: pass tensor.detach()";
  } else if (nb::hasattr(obj, "dtype") && nb::hasattr(obj, "shape")) {
    why = "an array of dtype " + nb::cast<std::string>(nb::str(obj.attr("dtype"))) +
          " cannot be passed through DLPack or the buffer protocol (attnkit takes float32, float16 or bfloat16)";
  }
  throw nb::type_error((name + ": " + why).c_str());
}

}  // namespace

std::int64_t ArrayArg::extent() const {
  for (std::int64_t d : shape) {
    if (d == 0) return 0;
  }
  // Checked: strides from as_strided (or any producer) may reach past 2^63 elements; such an array is refused,
  // never given a wrapped extent that the library would take for a small buffer.
  std::int64_t highest = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::int64_t step = 0;
    if (strides[i] < 0) continue;  // refused by the callers' stride rules; it reaches no higher element
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &step) ||
        __builtin_add_overflow(highest, step, &highest) || highest == std::numeric_limits<std::int64_t>::max()) {
      throw nb::value_error((name + ": shape " + shape_string() +
                             " and its strides reach past element 2^63 - 1 (every index must fit int64)")
                                .c_str());
    }
  }
  return highest + 1;
}

std::string ArrayArg::dtype_name() const { return bfloat16_view ? "bfloat16" : dlpack_dtype_name(dtype); }

std::string ArrayArg::shape_string() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

ArrayArg import_array(nb::handle obj, const std::string& name, bool writable) {
  ArrayArg a;
  a.name = name;
  nb::object numpy;
  // (A DLPack capsule, the torch path's way in, is never a NumPy array: no NumPy lookups for it.)
  const bool bf16_view = !PyCapsule_CheckExact(obj.ptr()) && is_numpy_bfloat16(obj, numpy);
  nb::object source = bf16_view ? obj.attr("view")(numpy.attr("uint16")) : nb::borrow(obj);

  // convert = false: an array is taken as it is or refused, never copied.
  if (writable) {
    if (!nb::try_cast(source, a.writable, false)) {
      nb::ndarray<nb::ro> probe;
      if (nb::try_cast(source, probe, false))
        throw nb::value_error((name + ": is read-only but is written (pass a writable array)").c_str());
      not_an_array(obj, name);
    }
    fill_from(a, a.writable);
  } else {
    if (!nb::try_cast(source, a.read_only, false)) not_an_array(obj, name);
    fill_from(a, a.read_only);
  }
  if (bf16_view) {
    a.element = Element::bf16;
    a.bfloat16_view = true;
  }
  return a;
}

Where array_location(const ArrayArg& a, bool usable, bool built) {
  if (host_accessible(a.device_type)) return Where::host;
  const std::string where = device_name(a.device_type, a.device_id);
  if (a.device_type == kDLCUDA || a.device_type == kDLCUDAManaged) {
    if (usable) return Where::cuda;
    throw nb::value_error((a.name + ": is a CUDA array (" + where + ") but " +
                           (built ? std::string("attnkit's CUDA backend finds no usable CUDA device")
                                  : std::string("this build of attnkit has no CUDA backend")) +
                           "; pass a CPU array")
                              .c_str());
  }
  throw nb::value_error((a.name + ": lives on " + where + "; attnkit runs on CPU and CUDA arrays only").c_str());
}

std::string device_string(const ArrayArg& a) { return device_name(a.device_type, a.device_id); }

bool host_memory(const ArrayArg& a) { return host_accessible(a.device_type); }
bool cuda_memory(const ArrayArg& a) { return a.device_type == kDLCUDA || a.device_type == kDLCUDAManaged; }

bool cuda_built() {
#if defined(ATTNKIT_PYTHON_HAS_CUDA)
  return true;
#else
  return false;
#endif
}

// (Only CUDA is asked: listing every backend would also load a Vulkan driver on a CPU call.)
bool cuda_usable() { return backend_available(Backend::Cuda); }

void copy_device_to_host(void* dst, const void* src, std::size_t bytes, void* stream, const std::string& what) {
#if defined(ATTNKIT_PYTHON_HAS_CUDA)
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    throw std::runtime_error(what + ": reading it back from the device failed: " + cudaGetErrorString(e));
#else
  (void)dst, (void)src, (void)bytes, (void)stream;
  throw std::runtime_error(what + ": this build of attnkit has no CUDA backend");
#endif
}

bool stream_capturing(void* stream) {
#if defined(ATTNKIT_PYTHON_HAS_CUDA)
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
#if defined(ATTNKIT_PYTHON_HAS_CUDA)
  if (device >= 0 && cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
    if (cudaSetDevice(device) != cudaSuccess)
      throw nb::value_error(("cannot make CUDA device " + std::to_string(device) + " current").c_str());
    switched_ = true;
  }
#else
  (void)device;
#endif
}

CudaDeviceGuard::~CudaDeviceGuard() {
#if defined(ATTNKIT_PYTHON_HAS_CUDA)
  if (switched_) cudaSetDevice(previous_);
#endif
}

void require_same_device(const ArrayArg& a, const ArrayArg& b) {
  if (a.device_type == b.device_type && a.device_id == b.device_id) return;
  throw nb::value_error((a.name + ": is on " + device_name(a.device_type, a.device_id) + " but " + b.name +
                         " is on " + device_name(b.device_type, b.device_id) + "; every array must be on one device")
                            .c_str());
}

void require_element(const ArrayArg& a, Element want, const char* why) {
  if (a.element == want) return;
  throw nb::type_error((a.name + ": dtype " + a.dtype_name() + " " + why).c_str());
}

void require_same_element(const ArrayArg& a, const ArrayArg& like, const char* note) {
  if (a.element == like.element) return;
  throw nb::type_error((a.name + ": dtype " + a.dtype_name() + " does not match " + like.name + "'s dtype " +
                        element_name(like.element) + note)
                           .c_str());
}

void require_kernel_strides(const ArrayArg& a) {
  for (std::size_t i = 0; i < a.strides.size(); ++i) {
    if (a.strides[i] < 0) {
      throw nb::value_error((a.name + ": stride " + std::to_string(a.strides[i]) + " of dimension " +
                             std::to_string(i) + " is negative; attnkit takes non-negative strides only")
                                .c_str());
    }
  }
  if (!a.shape.empty() && a.shape.back() > 1 && a.strides.back() != 1) {
    throw nb::value_error((a.name + ": the last dimension must be contiguous (stride 1 element), got stride " +
                           std::to_string(a.strides.back()) +
                           "; attnkit makes no hidden copies: pass a view whose rows are contiguous")
                              .c_str());
  }
  if (a.element_bytes > 0 && reinterpret_cast<std::uintptr_t>(a.data) % a.element_bytes != 0) {
    throw nb::value_error(
        (a.name + ": data is not aligned to its " + std::to_string(a.element_bytes) + "-byte elements").c_str());
  }
}

DType to_dtype(Element e) {
  switch (e) {
    case Element::f16: return DType::f16;
    case Element::bf16: return DType::bf16;
    default: return DType::f32;
  }
}

std::string element_name(Element e) {
  switch (e) {
    case Element::f32: return "float32";
    case Element::f16: return "float16";
    case Element::bf16: return "bfloat16";
    case Element::i32: return "int32";
    case Element::other: break;
  }
  return "?";
}

std::string Axes::order_string() const { return name == "bshd" ? "[B, S, H, D]" : "[B, H, S, D]"; }

Axes parse_axes(const std::string& layout) {
  if (layout == "bhsd") return Axes{0, 1, 2, 3, layout};
  if (layout == "bshd") return Axes{0, 2, 1, 3, layout};
  throw nb::value_error(("layout: must be \"bhsd\" ([B, H, S, D]) or \"bshd\" ([B, S, H, D]), got \"" + layout + "\"")
                            .c_str());
}

Layout tensor_layout(const ArrayArg& a, const Axes& axes) {
  return Layout{0, a.strides[axes.batch], a.strides[axes.heads], a.strides[axes.seq]};
}

}  // namespace attnkit::python
