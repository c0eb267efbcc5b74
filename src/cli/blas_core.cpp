#include "cli/blas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace attnkit::cli {
namespace {

// Set beside OPENBLAS_CORETYPE before the re-execution, for the report only (nothing reads it to decide).
constexpr const char* kDetectedVariable = "ATTNKIT_CLI_OPENBLAS_DETECTED";

// OpenBLAS 0.3.21 core names whose kernels use AVX-512 / at least AVX2 + FMA.
constexpr std::array<std::string_view, 3> kAvx512Cores = {"SkylakeX", "Cooperlake", "SapphireRapids"};
constexpr std::array<std::string_view, 5> kAvx2Cores = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};

template <std::size_t N>
bool contains(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::optional<std::string> better_blas_core(std::string_view detected, CpuIsa isa) {
  if (isa.avx512) {
    if (contains(kAvx512Cores, detected)) return std::nullopt;
    return std::string("SkylakeX");
  }
  if (isa.avx2_fma) {
    if (contains(kAvx2Cores, detected)) return std::nullopt;
    return std::string("Haswell");
  }
  return std::nullopt;
}

CpuIsa host_isa() {
  CpuIsa isa;  // (not x86-64: neither, and OpenBLAS keeps the core it detected)
#if defined(__x86_64__)
  __builtin_cpu_init();
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  isa.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa;
}

void prefer_tuned_blas_core(char** argv) {
  if (std::getenv(kDetectedVariable) != nullptr) return;  // this is the re-executed program
  const char* active = openblas_get_corename();  // what OpenBLAS detected, or what OPENBLAS_CORETYPE said
  const std::optional<std::string> want = better_blas_core(active != nullptr ? active : "", host_isa());
  if (!want) return;
  const char* given = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved_core = given != nullptr ? given : "";
  const char* given_l2 = std::getenv("OPENBLAS_L2_SIZE");
  const std::string saved_l2 = given_l2 != nullptr ? given_l2 : "";
  setenv("OPENBLAS_CORETYPE", want->c_str(), 1);
  unsetenv("OPENBLAS_L2_SIZE");  // set for the weaker core's blocking, if at all: the kernels pick their own
  setenv(kDetectedVariable, active != nullptr ? active : "unknown", 1);
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the core OpenBLAS runs, the environment as it was
  if (given != nullptr) {
    setenv("OPENBLAS_CORETYPE", saved_core.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  if (given_l2 != nullptr) setenv("OPENBLAS_L2_SIZE", saved_l2.c_str(), 1);
  unsetenv(kDetectedVariable);
}

std::string blas_core_note() {
  const char* detected = std::getenv(kDetectedVariable);
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  if (detected == nullptr || set == nullptr) return "";
  return std::string("OPENBLAS_CORETYPE=") + set + " set by attnkit (OpenBLAS ran " + detected + " kernels on this CPU)";
}

}  // namespace attnkit::cli
