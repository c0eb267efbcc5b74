// Hopper (sm_90a) primitives of the wgmma kernel: the warpgroup MMA (shared-memory matrix descriptors with the
// 128-byte swizzle, the fence / commit / wait protocol, m64nNk16 float16 / bfloat16 MMAs with float32
// accumulators for N = 64 and 128, and N = 8 against ones for rows' sums), the tensor memory accelerator (TMA)
// tile load, shared-memory barriers (mbarrier) and named barriers. Accumulators are the m16n8 fragments of
// fragment_softmax.cuh, one warp's 16 rows each: d[j][0..3] holds columns 8 j + 2 (lane % 4) + {0, 1} of rows
// lane / 4 and lane / 4 + 8.
#pragma once

#include <cstdint>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace attnkit::cuda::sm90 {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// A matrix in shared memory (PTX ISA, "Matrix Descriptor Format"): start address, leading and stride byte
// offsets in 16-byte units, layout 1 = 128-byte swizzle. The swizzle XORs address bits [4, 7) with bits [7, 10),
// so a start address moved by whole 16-byte chunks inside a 1024-byte-aligned pattern stays valid.
__device__ __forceinline__ std::uint64_t swizzle128_desc(std::uint32_t addr, std::uint32_t leading_bytes,
                                                          std::uint32_t stride_bytes) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) |
         static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16 |
         static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32 | (1ull << 62);
}

// The descriptor of an operand without swizzle (8-row x 16-byte core matrices, `leading_bytes` apart along K,
// `stride_bytes` apart along M / N).
__device__ __forceinline__ std::uint64_t interleave_desc(std::uint32_t addr, std::uint32_t leading_bytes,
                                                         std::uint32_t stride_bytes) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) |
         static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16 |
         static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32;
}

// Before the first MMA that reads registers written by ordinary instructions (accumulators, A fragments).
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// 16 zero bytes at a shared-memory address (one st.shared of the zero register).
__device__ __forceinline__ void store_zero16(std::uint32_t addr) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}
// Shared memory written through the generic proxy (st.shared, cp.async) becomes visible to wgmma's async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarrier: a phase completes when `count` arrivals (and the transaction bytes expected in it) are in.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes initialised barriers visible to the other threads and to the async proxy (TMA); then a block barrier.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// One arrival that also expects `bytes` to land by TMA in the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Waits for the phase of parity `parity` to complete (a fresh barrier counts its phase "before 0", parity 1,
// as complete: a producer's first wait on an empty slot passes at once).
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// TMA: a box of a 4-d tensor (coordinates innermost first) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// Named barriers (id 0 is __syncthreads): sync waits for `threads` arrivals including its own, arrive does not wait.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Moves registers between warpgroups: a producer that only issues copies frees most of its share, consumers
// that hold the accumulators take it (the whole warpgroup executes it).
template <int kRegisters>
__device__ __forceinline__ void set_max_registers_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void set_max_registers_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// The compiler sees an MMA's registers only at the asm statement, not while it runs: after a wait, these tie
// every accumulator / operand register to that point, so no read moves before it and no register is reused
// while an MMA may still read it.
template <int J>
__device__ __forceinline__ void pin(float (&d)[J][4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int J>
__device__ __forceinline__ void pin(std::uint32_t (&a)[J][4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[j][e])::"memory");
}

// ss: D (+)= A B with A (64 x 16) and B (16 x N) both K-major in shared memory (S = Q Kᵀ).
// rs: D += A B with A (64 x 16) in registers (the m16n8k16 A fragment of each warp) and B N-major in shared
//     memory (O += P V, V stored key-major).
// accumulate = 0 ignores D's old value (the first k-step of S).
template <class T, int N>
struct Wgmma;

#define ATTNKIT_ACC4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define ATTNKIT_ACC8(d, j)                                                                                       \
  ATTNKIT_ACC4(d, j + 0), ATTNKIT_ACC4(d, j + 1), ATTNKIT_ACC4(d, j + 2), ATTNKIT_ACC4(d, j + 3),               \
      ATTNKIT_ACC4(d, j + 4), ATTNKIT_ACC4(d, j + 5), ATTNKIT_ACC4(d, j + 6), ATTNKIT_ACC4(d, j + 7)
#define ATTNKIT_REGS32                                                                                           \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "   \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31"
#define ATTNKIT_REGS64                                                                                           \
  ATTNKIT_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, " \
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define ATTNKIT_DEFINE_WGMMA(CT, PT)                                                                            \
  template <>                                                                                                   \
  struct Wgmma<CT, 64> {                                                                                        \
    static __device__ __forceinline__ void ss(float (&d)[8][4], std::uint64_t a, std::uint64_t b, int accumulate) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " {" ATTNKIT_REGS32                \
                   "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                          \
                   : ATTNKIT_ACC8(d, 0)                                                                        \
                   : "l"(a), "l"(b), "r"(accumulate));                                                         \
    }                                                                                                           \
    static __device__ __forceinline__ void rs(float (&d)[8][4], const std::uint32_t (&a)[4], std::uint64_t b) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " {" ATTNKIT_REGS32                \
                   "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                          \
                   : ATTNKIT_ACC8(d, 0)                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                              \
    }                                                                                                           \
  };                                                                                                            \
  template <>                                                                                                   \
  struct Wgmma<CT, 128> {                                                                                       \
    static __device__ __forceinline__ void ss(float (&d)[16][4], std::uint64_t a, std::uint64_t b, int accumulate) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." PT "." PT " {" ATTNKIT_REGS64               \
                   "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                          \
                   : ATTNKIT_ACC8(d, 0), ATTNKIT_ACC8(d, 8)                                                    \
                   : "l"(a), "l"(b), "r"(accumulate));                                                         \
    }                                                                                                           \
    static __device__ __forceinline__ void rs(float (&d)[16][4], const std::uint32_t (&a)[4], std::uint64_t b) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." PT "." PT " {" ATTNKIT_REGS64               \
                   "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                          \
                   : ATTNKIT_ACC8(d, 0), ATTNKIT_ACC8(d, 8)                                                    \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                              \
    }                                                                                                           \
  };

ATTNKIT_DEFINE_WGMMA(__half, "f16")
ATTNKIT_DEFINE_WGMMA(__nv_bfloat16, "bf16")

// d += A 1: the rows' sums of A (64 x 16, registers, as in rs) on the tensor cores, in an m64n8 accumulator
// whose 8 columns all hold the row's sum. `ones` describes 1024 bytes of ones in the element type, 1024-byte
// aligned (any K-major 16 x 8 view of it reads ones only).
template <class T>
struct RowSums;
#define ATTNKIT_DEFINE_ROW_SUMS(CT, PT)                                                                         \
  template <>                                                                                                   \
  struct RowSums<CT> {                                                                                          \
    static __device__ __forceinline__ void rs(float (&d)[1][4], const std::uint32_t (&a)[4], std::uint64_t ones) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"                                                 \
                   "wgmma.mma_async.sync.aligned.m64n8k16.f32." PT "." PT " {%0, %1, %2, %3}, "                \
                   "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"                                                    \
                   : ATTNKIT_ACC4(d, 0)                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(ones), "r"(1));                           \
    }                                                                                                           \
  };
ATTNKIT_DEFINE_ROW_SUMS(__half, "f16")
ATTNKIT_DEFINE_ROW_SUMS(__nv_bfloat16, "bf16")
#undef ATTNKIT_DEFINE_ROW_SUMS

#undef ATTNKIT_DEFINE_WGMMA
#undef ATTNKIT_REGS64
#undef ATTNKIT_REGS32
#undef ATTNKIT_ACC8
#undef ATTNKIT_ACC4

}  // namespace attnkit::cuda::sm90
