// The tiled CPU kernel's score and value products on Intel AMX tiles (bfloat16 operands, float32 accumulators),
// for bfloat16 problems with bfloat16 K and V on CPUs with AMX-BF16. tiled_kernel.cpp stages the operands and runs
// everything else (the softmax, the blockwise sums, the finish) as it does for its own products.
//
// float16 problems take the same products exactly: a float16 value is the sum of two bfloat16 terms (its top 8
// significant bits, then the rest, at most 3 bits), so the scores run over an extended head dim, K' = [kh, kh, kl,
// kl] against Q' = [qh, ql, qh, ql] (every product of the four exact, summed in float32), and V's two terms are
// two V^T blocks of one sum.
//
// Layouts (bfloat16 as its 16 bits; dim32: the extended head dim rounded up to 32, dv16: the V dim rounded up to
// 16, the extra columns zero):
//   k        [kTileKeys][dim32]         the tile's K rows (extended)
//   q_pairs  [dim32 / 2][kLanes][2]     Q's dims in pairs per query lane (AMX's "VNNI" operand order)
//   st       [kTileKeys][kLanes] float  S^T: the scores, as the kernel's SIMD path stores them
//   vt       [v_terms][dv16][kTileKeys] V transposed, each of V's terms
//   p_pairs  [p_terms][kTileKeys / 2][kLanes][2]  the probabilities, two keys per pair: a bfloat16 problem's
//            rounded to bfloat16 (one term, as the CUDA tensor cores round P to the element type), a float16
//            problem's (or a bfloat16 one's with "off=rounded-p") as the sum of three bfloat16 terms (the value's
//            top bits, then those of what is left, twice): all 24 bits of the float32 value, so that P V is as
//            accurate as the float32 products (docs/numerics.md)
//   out      [dv16][kLanes] float       this tile's P V, O^T's layout, summed from zero (the blockwise sum)
// Each product sums its dims (keys) in a fixed order: the bits depend on neither the thread count nor the order
// of the items.
#pragma once

#include "tiled_kernel.hpp"

#include <cstdint>

namespace attnkit::cpu::amx {

inline constexpr int kLanes = static_cast<int>(kRowBlock);
inline constexpr int kTileKeys = static_cast<int>(kKeyTile);
static_assert(kLanes == 64 && kTileKeys == 64, "the products are written for 64 x 64 tiles");
inline constexpr int kMaxProbabilityTerms = 3;  // P's terms that hold all of its 24 bits
// Key tiles per softmax step: the step's scores are all taken before its softmax, so the running output is
// rescaled once per step and the step's P V summed in the tiles' accumulators.
inline constexpr int kTilesPerStep = 8;

// bfloat16 terms of one input element: 1 for bfloat16, 2 for float16.
inline int input_terms(DType t) { return t == DType::f16 ? 2 : 1; }
// The score product's extended head dim (the K' / Q' rows above), before rounding up to 32.
inline std::int64_t score_dims(DType t, std::int64_t head_dim) { return head_dim * input_terms(t) * input_terms(t); }
inline std::int64_t score_dim32(DType t, std::int64_t head_dim) { return (score_dims(t, head_dim) + 31) / 32 * 32; }

// Whether this CPU and OS run the tiles (asked once per process).
bool available();
// Loads the tile configuration on the calling thread (before an item's products), and releases it (after).
void begin();
void end();
void scores(const std::uint16_t* k, const std::uint16_t* q_pairs, std::int64_t dim32, float* st);
// out = P V over `tiles` key tiles: tile g's V^T at vt[g], its p_terms terms of P at p_pairs + g * p_terms *
// kTileKeys * kLanes.
void values(const std::uint16_t* const* vt, int tiles, int v_terms, const std::uint16_t* p_pairs, int p_terms,
            std::int64_t dv16, float* out);
// vt from V's keys in pairs: v_pairs [kTileKeys / 2][dv16] (32-bit: key 2j's value low, key 2j + 1's high) is
// transposed into vt, read as [dv16][kTileKeys / 2] 32-bit pairs, which is vt's layout.
void transpose_pairs(const std::uint32_t* v_pairs, std::int64_t dv16, std::uint16_t* vt);

}  // namespace attnkit::cpu::amx
