// The tiled CPU kernel's score product on AVX-512 BF16's pair dot product (`vdpbf16ps`: AMD Zen 4 and later,
// Intel Cooper Lake and later), for bfloat16 problems with bfloat16 K on CPUs without AMX: Q·Kᵀ takes half the
// instructions of the float32 products and reads K's bfloat16 rows in place (no widening). P·V stays on the
// float32 products (P is float32; rounding it to bfloat16 would cost the accuracy docs/numerics.md promises).
//
// Layouts (bfloat16 as its 16 bits):
//   q_pairs  [ceil(dim / 2)][kLanes][2]  Q's dims in pairs per query lane, the odd dim's partner 0 (the AMX
//                                         path's layout)
//   krow     [n] pointers to K's rows (dim values each, read in place; nothing past dim is read)
//   st       [kTileKeys][kLanes] float   S^T, as the SIMD path stores it
// Each score sums its dims pair by pair in order, each pair as the instruction sums it (both products exact in
// float32; bfloat16 subnormals count as 0): the bits depend on neither the thread count nor the items' order.
#pragma once

#include "tiled_kernel.hpp"

#include <cstddef>
#include <cstdint>

namespace attnkit::cpu::bf16_dot {

inline constexpr int kLanes = static_cast<int>(kRowBlock);
inline constexpr int kVectorLanes = 16;  // float32 lanes of one 512-bit register

// Whether this CPU runs the instruction (asked once per process).
bool available();
// Whether it runs it fast enough to pay against the float32 products (CpuKernelFeatures::pair_dot_outruns_fma):
// the plan's own choice. `kernel=bf16-dot` in the plan overrides takes it wherever it is available.
bool pays();
// S^T rows 0..n-1 (n <= kKeyTile) for the first `lanes` query lanes (rounded up to kVectorLanes).
void scores(const std::uint16_t* q_pairs, std::int64_t dim, const std::uint16_t* const* krow, std::int64_t n,
            std::int64_t lanes, float* st);

}  // namespace attnkit::cpu::bf16_dot
