// Array arguments of the Python binding: any DLPack or buffer-protocol object, taken as it is (zero-copy).
//
// An array is imported once, checked (device, element type, rank, strides) and mapped onto an attnkit::Layout
// with its element extent. Nothing here copies or converts: an array the kernel cannot read where it lies is an
// error (ValueError / TypeError naming the argument), never a silent copy.
#pragma once

#include <attnkit/attention.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnkit::python {

namespace nb = nanobind;

// What an array holds, as far as attnkit cares.
enum class Element : std::uint8_t { f32, f16, bf16, i32, other };

struct ArrayArg {
  std::string name;                    // the Python argument, for messages ("q", "out", ...)
  nb::ndarray<nb::ro> read_only;       // keeps the source alive (inputs)
  nb::ndarray<> writable;              // keeps the source alive (outputs)
  void* data = nullptr;                // first element (byte offset applied)
  Element element = Element::other;
  nb::dlpack::dtype dtype{};            // as exported (a NumPy bfloat16 array: its uint16 view's)
  bool bfloat16_view = false;          // a NumPy (ml_dtypes) bfloat16 array, read through a uint16 view
  std::size_t element_bytes = 0;
  int device_type = 1;                 // DLPack device type (1: CPU)
  int device_id = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;   // in elements; 0 for every dimension of size 1

  std::int64_t ndim() const { return static_cast<std::int64_t>(shape.size()); }
  // Elements the array reaches from `data` on: highest index + 1 (0 when empty), in checked arithmetic: throws
  // ValueError naming the array when it reaches past element 2^63 - 1. Negative strides count as 0 (refused later).
  std::int64_t extent() const;
  std::string shape_string() const;
  // "float32", "int64", "bfloat16", ...: made only for messages and the GQA binding's type rules.
  std::string dtype_name() const;
};

// Imports `obj` without copying. `writable`: the array will be written (read-only sources are refused).
// Throws TypeError when `obj` is no array (or holds a type DLPack cannot carry), ValueError when it is
// read-only but must be written.
ArrayArg import_array(nb::handle obj, const std::string& name, bool writable);

// Where an array's memory is, as far as choosing a backend goes.
enum class Where : std::uint8_t { host, cuda };
// Host memory (CPU, CUDA/ROCm pinned host memory) or CUDA device memory (device or managed). Throws
// ValueError for any other device, and for a CUDA array when `usable` is false (saying whether the CUDA
// backend is missing from this build or finds no device).
Where array_location(const ArrayArg& a, bool usable, bool built);
std::string device_string(const ArrayArg& a);
// DLPack device types: memory the host reads (CPU, CUDA / ROCm pinned host memory) and CUDA device memory
// (device or managed).
bool host_memory(const ArrayArg& a);
bool cuda_memory(const ArrayArg& a);
// Whether this build has the CUDA backend, and whether that backend finds a device now.
bool cuda_built();
bool cuda_usable();
// Copies `bytes` bytes from CUDA device memory to the host, ordered after the work already queued on `stream`
// (a cudaStream_t; null: the default stream), and waits for them. Only reached when cuda_usable().
void copy_device_to_host(void* dst, const void* src, std::size_t bytes, void* stream, const std::string& what);
// Whether `stream` is capturing a CUDA graph now (false without CUDA in the build).
bool stream_capturing(void* stream);

// Makes the arrays' CUDA device current while an op plans and runs (plans read the device's SM count, scratch is
// allocated on it), and puts the caller's device back afterwards. Does nothing for device < 0 (host arrays).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Throws ValueError when `a` and `b` live on different devices.
void require_same_device(const ArrayArg& a, const ArrayArg& b);
// Throws TypeError unless the array holds `want` (`why` completes the message).
void require_element(const ArrayArg& a, Element want, const char* why);
// Throws TypeError unless `a` holds the element type of `like`: "<a>: dtype X does not match <like>'s dtype Y"
// and `note` (the message is made only when it is thrown).
void require_same_element(const ArrayArg& a, const ArrayArg& like, const char* note = "");
// Throws ValueError on a negative stride, a strided innermost dimension or a misaligned pointer.
void require_kernel_strides(const ArrayArg& a);

DType to_dtype(Element e);
std::string element_name(Element e);

// Which axis of a 4-D Q/K/V/O array holds what, for the layout string "bhsd" or "bshd".
struct Axes {
  int batch = 0, heads = 1, seq = 2, dim = 3;
  std::string name;  // "bhsd" / "bshd"
  std::string order_string() const;  // "[B, H, S, D]" / "[B, S, H, D]"
};
Axes parse_axes(const std::string& layout);

// The attnkit layout of a 4-D array read through `axes` (offset 0 from the array's own data pointer).
Layout tensor_layout(const ArrayArg& a, const Axes& axes);

}  // namespace attnkit::python
