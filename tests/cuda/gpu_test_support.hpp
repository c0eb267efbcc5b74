// What every GPU test binary needs first: whether a CUDA device runs attnkit's CUDA backend here (tests skip
// cleanly without one: CI builds them on a machine without a GPU), a CUDA call's error as a test failure, and
// device copies of host vectors.
#pragma once

#include <attnkit/attention.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace attnkit::testing {

inline bool have_gpu() {
  const auto b = available_backends();
  return std::find(b.begin(), b.end(), Backend::Cuda) != b.end();
}

inline void check(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// A device copy of a host vector, copied back by fetch().
template <class T>
struct DeviceVector {
  T* data = nullptr;
  std::size_t count = 0;
  explicit DeviceVector(const std::vector<T>& host) : count(host.size()) {
    if (cudaMalloc(&data, std::max<std::size_t>(count * sizeof(T), 16)) != cudaSuccess) data = nullptr;
    if (data != nullptr && count > 0) cudaMemcpy(data, host.data(), count * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(data); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  void put(const std::vector<T>& host) { cudaMemcpy(data, host.data(), count * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> fetch() const {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
};

}  // namespace attnkit::testing

#define SKIP_WITHOUT_GPU() \
  if (!::attnkit::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"
