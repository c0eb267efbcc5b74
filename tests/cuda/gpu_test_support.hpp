// What every GPU test binary needs first: whether a CUDA device runs attnkit's CUDA backend here (tests skip
// cleanly without one: CI builds them on a machine without a GPU), and a CUDA call's error as a test failure.
#pragma once

#include <attnkit/attention.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace attnkit::testing {

inline bool have_gpu() {
  const auto b = available_backends();
  return std::find(b.begin(), b.end(), Backend::Cuda) != b.end();
}

inline void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

}  // namespace attnkit::testing

#define SKIP_WITHOUT_GPU() \
  if (!::attnkit::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"
