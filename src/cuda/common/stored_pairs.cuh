// Stored int8 / int4 K/V values as exact pairs of the element type, for the tensor-core kernels that turn a
// quantized tile into an element-type tile (attention_mma.cu, attention_wgmma.cu). Every int8 and int4 value is
// exact in float16 and bfloat16; the scales act outside the tiles.
#pragma once

#include "cuda/common/fragment_softmax.cuh"
#include "cuda/common/kernel_params.cuh"
#include "cuda/common/query_tile.cuh"

#include <cstdint>
#include <type_traits>

namespace attnkit::cuda {

// Bytes of a stored K/V row: D elements of T, D int8 values, or D / 2 bytes of int4.
template <class T, class S>
__host__ __device__ constexpr int stored_row_bytes(int head_dim) {
  return std::is_same_v<S, Int4Tag> ? head_dim / 2 : head_dim * static_cast<int>(sizeof(S));
}

// (a & kMask) | bits as one LOP3. Written plainly, with both constants immediate, it compiles to two (a LOP3
// takes one immediate operand): 64 extra ALU instructions per int4 chunk of the decode-mma kernel.
template <std::uint32_t kMask>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a, std::uint32_t bits) {
  std::uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(kMask), "r"(bits));
  return d;
}

// Stored integers as exact pairs of the element type (every int8 and int4 value is exact in float16 and
// bfloat16). float16 uses the magic-number trick: a byte u under exponent 2^10 is the half 1024 + u, so one
// byte permute and one half2 subtraction give two values. bfloat16 has too few mantissa bits for a byte and goes
// through float32 (int4 nibbles fit: 128 + n).
template <class T>
__device__ __forceinline__ void int8x4_to_pairs(std::uint32_t w, std::uint32_t (&out)[2]) {
  if constexpr (std::is_same_v<T, __half>) {
    const std::uint32_t b = w ^ 0x80808080u;  // q + 128
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1024 + 128
    const std::uint32_t words[2] = {__byte_perm(b, 0x64646464u, 0x4140), __byte_perm(b, 0x64646464u, 0x4342)};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&words[i]), bias);
      out[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
  } else {
    float x[4];
    widen_int8x4(w, x);
    out[0] = pack_pair<T>(x[0], x[1]);
    out[1] = pack_pair<T>(x[2], x[3]);
  }
}
template <class T>
__device__ __forceinline__ void int8x8_to_pairs(std::uint32_t w0, std::uint32_t w1, std::uint32_t (&out)[4]) {
  std::uint32_t lo[2], hi[2];
  int8x4_to_pairs<T>(w0, lo);
  int8x4_to_pairs<T>(w1, hi);
  out[0] = lo[0], out[1] = lo[1], out[2] = hi[0], out[3] = hi[1];
}
template <class T>
__device__ __forceinline__ void int4x8_to_pairs(std::uint32_t w, std::uint32_t (&out)[4]) {
  // Nibble k (value k) sits at bit 4k: (w >> 4k) & 0x000F000F holds values k and k + 4 in a pair's two halves.
  constexpr std::uint32_t kMagic = std::is_same_v<T, __half> ? 0x64006400u : 0x43004300u;  // 1024 / 128
  std::uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const std::uint32_t word = and_or<0x000F000Fu>(w >> (4 * k), kMagic);
    if constexpr (std::is_same_v<T, __half>) {
      const __half2 bias = __halves2half2(__ushort_as_half(0x6408), __ushort_as_half(0x6408));  // 1024 + 8
      const __half2 v = __hsub2(*reinterpret_cast<const __half2*>(&word), bias);
      h[k] = *reinterpret_cast<const std::uint32_t*>(&v);
    } else {
      const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16(0x4308), __ushort_as_bfloat16(0x4308));
      const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&word), bias);  // 128 + 8
      h[k] = *reinterpret_cast<const std::uint32_t*>(&v);
    }
  }
  out[0] = __byte_perm(h[0], h[1], 0x5410);  // values 0, 1
  out[1] = __byte_perm(h[2], h[3], 0x5410);  // 2, 3
  out[2] = __byte_perm(h[0], h[1], 0x7632);  // 4, 5
  out[3] = __byte_perm(h[2], h[3], 0x7632);  // 6, 7
}

// The same 8 values as pairs (value k, value k + 4), k = 0..3: no permute back to value order, for kernels whose
// MMAs take the values in any order as long as the other operand and the output follow it (the decode-mma
// kernel). float16 takes the odd nibbles in place: under the magic exponent 2^10 a nibble at bits 4-7 is the
// half 1024 + 16 n, and one fused multiply-add by 1/16 with -(64 + 8) gives n - 8 exactly (one shift less per
// pair of nibbles). bfloat16's 7 mantissa bits cannot hold 16 n, so it shifts every nibble down.
template <class T>
__device__ __forceinline__ void int4x8_to_pairs_k_k4(std::uint32_t w, std::uint32_t (&out)[4]) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 bias = __halves2half2(__ushort_as_half(0x6408), __ushort_as_half(0x6408));        // 1024 + 8
    const __half2 sixteenth = __halves2half2(__ushort_as_half(0x2C00), __ushort_as_half(0x2C00));   // 1 / 16
    const __half2 odd_bias = __halves2half2(__ushort_as_half(0xD480), __ushort_as_half(0xD480));    // -(64 + 8)
    const std::uint32_t shifted = w >> 8;
    const std::uint32_t words[4] = {and_or<0x000F000Fu>(w, 0x64006400u), and_or<0x00F000F0u>(w, 0x64006400u),
                                    and_or<0x000F000Fu>(shifted, 0x64006400u),
                                    and_or<0x00F000F0u>(shifted, 0x64006400u)};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __half2 x = *reinterpret_cast<const __half2*>(&words[k]);
      const __half2 v = (k % 2 == 0) ? __hsub2(x, bias) : __hfma2(x, sixteenth, odd_bias);
      out[k] = *reinterpret_cast<const std::uint32_t*>(&v);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t word = and_or<0x000F000Fu>(w >> (4 * k), 0x43004300u);  // 128 + n
      const __nv_bfloat162 bias = __halves2bfloat162(__ushort_as_bfloat16(0x4308), __ushort_as_bfloat16(0x4308));
      const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&word), bias);  // 128 + 8
      out[k] = *reinterpret_cast<const std::uint32_t*>(&v);
    }
  }
}

// Chunk g (8 values) of a 16-byte unit of stored integers (`words`: 16 int8 or 32 int4 values) as four pairs.
template <class T, class S>
__device__ __forceinline__ void stored_chunk_pairs(const std::uint32_t (&words)[4], int g, std::uint32_t (&h)[4]) {
  if constexpr (std::is_same_v<S, Int4Tag>) {
    int4x8_to_pairs<T>(words[g], h);
  } else {
    int8x8_to_pairs<T>(words[2 * g], words[2 * g + 1], h);
  }
}

// A stored tile (kTileKeys rows of kRawRow bytes, int8 or int4) as the element-type tile of its integers in wgmma's
// 128-byte-swizzle layout (swizzled_chunk), by the 128 threads of a warpgroup (`thread` 0-127): one 16-byte unit
// of a stored row, 16 or 32 values, per thread and step (attention_wgmma_kernel-inl.cuh's converting warpgroup).
template <class T, class S, int kTileKeys, int kRawRow>
__device__ __forceinline__ void stored_tile_to_swizzled(const std::uint8_t* raw, std::uint8_t* tile, int thread) {
  constexpr int kUnitsPerRow = kRawRow / 16;  // 16-byte units of a stored row
  constexpr int kValuesPerUnit = std::is_same_v<S, Int4Tag> ? 32 : 16;
  for (int i = thread; i < kTileKeys * kUnitsPerRow; i += 128) {
    const int j = i / kUnitsPerRow;
    const int chunk0 = (i % kUnitsPerRow) * (kValuesPerUnit / 8);
    const uint4 w = *reinterpret_cast<const uint4*>(raw + i * 16);
    const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int g = 0; g < kValuesPerUnit / 8; ++g) {  // 8 values -> one 16-byte chunk of the tile
      std::uint32_t h[4];
      stored_chunk_pairs<T, S>(words, g, h);
      *reinterpret_cast<uint4*>(tile + swizzled_chunk(kTileKeys, j, chunk0 + g)) = uint4{h[0], h[1], h[2], h[3]};
    }
  }
}

}  // namespace attnkit::cuda
