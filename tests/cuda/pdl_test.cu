// A plain call's tile kernel is a programmatic dependent launch (cuda_backend.cu): it may start while the
// stream's previous kernel runs, and must wait for it before reading anything. Here the previous kernel lets
// dependents launch at once, then writes Q only after a long delay; the call must see that Q. A kernel that read
// Q before waiting would compute with the garbage left there. (On a device before sm_90 the launches are
// ordinary and the test passes trivially.)
#include <testing/case_data.hpp>
#include <testing/device_mirror.hpp>

#include "gpu_test_support.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace attnkit::testing {
namespace {


// Lets the next kernel launch, waits about `delay_cycles`, then copies `words` 4-byte words from src to dst.
__global__ void write_late(std::uint32_t* dst, const std::uint32_t* src, std::int64_t words, long long delay_cycles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const long long start = clock64();
  while (clock64() - start < delay_cycles) {
  }
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

TEST(CudaProgrammaticLaunch, ACallSeesWhatThePreviousKernelWritesLate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { std::int64_t batch, heads, q, k, d; };
  // The mma.sync plain build (head dim 32) and the wgmma plain build of three per SM (head dim 64).
  for (const Shape s : {Shape{2, 4, 128, 128, 32}, Shape{2, 4, 512, 512, 64}}) {
    for (DType t : {DType::f16, DType::bf16}) {
      CaseSpec spec;
      spec.name = "pdl";
      spec.batch = s.batch; spec.heads = s.heads; spec.kv_heads = s.heads; spec.q_len = s.q; spec.k_len = s.k;
      spec.head_dim = s.d;
      SCOPED_TRACE("head dim " + std::to_string(s.d) + ", " + std::string(dtype_name(t)));
      CaseData data(spec, t, 20261201);
      const auto ref = data.reference();
      AttentionConfig config;
      config.backend = Backend::Cuda;
      Attention op(data.problem(), config);
      DeviceMirror dev(data);
      cudaStream_t stream = nullptr;
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      AttentionArgs args = dev.device_args();
      args.stream = stream;
      dev.run(op, args);  // (a first run: whatever the op allocates, which may synchronise the device, is done)
      // Q's bytes aside, Q itself garbled (large values), then restored by the late writer.
      const std::int64_t q_bytes = args.q.elements * static_cast<std::int64_t>(dtype_size(t));
      ASSERT_EQ(q_bytes % 4, 0);
      void* q = const_cast<void*>(args.q.data);
      void* saved = nullptr;
      check(cudaMalloc(&saved, static_cast<std::size_t>(q_bytes)));
      check(cudaMemcpy(saved, q, static_cast<std::size_t>(q_bytes), cudaMemcpyDeviceToDevice));
      check(cudaMemset(q, 0x5B, static_cast<std::size_t>(q_bytes)));
      int clock_khz = 0;
      check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
      write_late<<<64, 256, 0, stream>>>(static_cast<std::uint32_t*>(q), static_cast<const std::uint32_t*>(saved),
                                         q_bytes / 4, 2LL * clock_khz /* ~2 ms */);
      check(cudaGetLastError());
      dev.run(op, args);  // (poisons O by synchronous copies, which do not wait for the non-blocking stream)
      check(cudaStreamDestroy(stream));
      check(cudaFree(saved));
      EXPECT_LE(data.scaled_error(ref), tolerance(t)) << op.describe();
      EXPECT_TRUE(data.gaps_untouched());
    }
  }
}

}  // namespace
}  // namespace attnkit::testing
