// The unfused baseline of `attnkit bench` must run on a correctly configured BLAS. OpenBLAS built with
// DYNAMIC_ARCH picks its kernels from the CPU model, and Debian's 0.3.21 takes some AVX-512 cores it does not
// know for `Prescott` (SSE3 kernels: sgemm at a sixth of its speed), and some machines set OPENBLAS_CORETYPE to
// such a core for older OpenBLAS builds. The executable (never the library, never the Python extension) checks
// the core OpenBLAS runs before it does anything else, and when the CPU can run a better kernel set, sets
// OPENBLAS_CORETYPE to it (OPENBLAS_L2_SIZE unset) and runs itself again: OpenBLAS reads them only while it
// loads.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace attnkit::cli {

struct CpuIsa {
  bool avx512 = false;  // AVX-512 F, BW, DQ, VL: OpenBLAS's SkylakeX kernels
  bool avx2_fma = false;  // AVX2 and FMA: its Haswell kernels
};

// The OpenBLAS core to ask for instead of `detected` on a CPU with `isa`, or nothing when `detected` is already
// a kernel set that uses what the CPU has.
std::optional<std::string> better_blas_core(std::string_view detected, CpuIsa isa);

// This CPU's ISA, from the compiler's CPU detection.
CpuIsa host_isa();

// Called first in main(): re-executes the program with OPENBLAS_CORETYPE set where better_blas_core() says so
// (once: the re-executed program carries a marker). Returns only when no re-execution happened (or it failed).
void prefer_tuned_blas_core(char** argv);

// What the bench and info print about it: "" when attnkit set nothing, else "set by attnkit: OpenBLAS picked X".
std::string blas_core_note();

}  // namespace attnkit::cli
