// `attnkit bench`'s baseline BLAS: which OpenBLAS cores the executable replaces, on which CPUs (blas_core.hpp).
#include <cli/blas_core.hpp>

#include <gtest/gtest.h>

namespace attnkit::cli {
namespace {

TEST(BlasCore, AvxFiveTwelveCpuGetsSkylakeXKernelsForAnOlderCore) {
  const CpuIsa avx512{true, true};
  for (const char* weak : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Haswell", "Zen", "Unknown", ""}) {
    EXPECT_EQ(better_blas_core(weak, avx512), std::optional<std::string>("SkylakeX")) << weak;
  }
  for (const char* good : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(better_blas_core(good, avx512), std::nullopt) << good;
  }
}

TEST(BlasCore, AvxTwoCpuGetsHaswellKernelsNeverAvxFiveTwelve) {
  const CpuIsa avx2{false, true};
  EXPECT_EQ(better_blas_core("Prescott", avx2), std::optional<std::string>("Haswell"));
  EXPECT_EQ(better_blas_core("Sandybridge", avx2), std::optional<std::string>("Haswell"));
  EXPECT_EQ(better_blas_core("Haswell", avx2), std::nullopt);
  EXPECT_EQ(better_blas_core("Zen", avx2), std::nullopt);
}

TEST(BlasCore, OlderCpuKeepsWhatOpenBlasPicked) {
  EXPECT_EQ(better_blas_core("Prescott", CpuIsa{false, false}), std::nullopt);
  EXPECT_EQ(better_blas_core("Nehalem", CpuIsa{false, false}), std::nullopt);
}

}  // namespace
}  // namespace attnkit::cli
