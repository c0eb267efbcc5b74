// Scores of a few-rows item on bfloat16 inputs with AVX512_BF16 (`vdpbf16ps`: pairs of bfloat16 products summed
// into float32 lanes, 32 elements an instruction, no widening), for CPUs that have it (Cooper Lake, Sapphire
// Rapids, Zen 4). The choice is made at run time, once per process; other CPUs take the Highway path.
#pragma once

#include <cstdint>

#include "row_prefetch.hpp"

namespace attnkit::cpu {

// Which of the CPU's optional instruction sets the CPU kernel uses. Filled from the CPU at start-up; a test
// may turn a feature off to run (and check) the path other CPUs take.
struct CpuKernelFeatures {
  bool avx512_bf16 = false;
  // vdpbf16ps runs more products a cycle than the float32 multiply-add (its pairs: two a lane): AMD's cores (on a
  // Zen 5 the tiled kernel's pair scores ran 1.11-1.21x faster). On an Intel Xeon with AVX512_FP16 and no AMX it
  // ran half the products of the 512-bit multiply-add (bench/fma_roofline.cpp: 86 against 172 GFLOP/s a core), and
  // the tiled kernel's float32 products 1.14-1.40x faster (bench/results/cpu-2026-12-07-xeon-bf16-dot-gated.md).
  bool pair_dot_outruns_fma = false;
};
CpuKernelFeatures& cpu_kernel_features();

// s[r * row_stride + j] = Σ_d q[r][d] · k[j][d] for `rows` (1..4) query rows and `n` keys, K row j at k[j]. Each
// product is exact in float32; the sums run in pairs of dims per lane, then across lanes in a fixed order (FTZ/DAZ:
// bfloat16 subnormals count as 0). The rows of `pf` are asked for along the way. Needs avx512_bf16.
void score_tile_bf16_dpbf16(const std::uint16_t* const* q, int rows, std::int64_t dim, const std::uint16_t* const* k,
                            std::int64_t n, const RowPrefetch& pf, float* s, std::int64_t row_stride);

}  // namespace attnkit::cpu
