// The tiled kernel's two products on Intel AMX (bfloat16 tiles, float32 accumulators), for bfloat16 problems
// on CPUs that have AMX-BF16 (Sapphire Rapids and later). See amx_tiles.hpp for the operand layouts.
//
// Only these functions use the tile instructions, through function target attributes: the file is compiled for
// the baseline ISA, so no inline function it shares with other files gets AMX or AVX-512 code, and nothing here
// runs unless available() said yes. Other architectures get available() == false and nothing else runs.
#include "amx_tiles.hpp"

#if defined(__x86_64__)

// (GCC 12 warns inside its own AVX-512 gather intrinsic in a target-attributed function; see few_rows_bf16.cpp.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace attnkit::cpu::amx {
namespace {

constexpr long kArchRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
constexpr long kTileData = 18;                    // XFEATURE_XTILEDATA

// Palette 1: every tile 16 rows of 64 bytes (16 float32 accumulators, or 32 bfloat16 operands / 16 pairs).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

bool cpu_has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u, avx512f = (b >> 16) & 1u;  // (transpose_pairs)
  const bool avx512bw = (b >> 30) & 1u;
  __cpuid_count(7, 1, a, b, c, d);
  const bool avx512_bf16 = (a >> 5) & 1u;  // (the kernel packs P with vcvtne2ps2bf16 and sums it by vdpbf16ps)
  return tile && bf16 && avx512f && avx512bw && avx512_bf16;
}

}  // namespace

bool available() {
  // Linux hands out the tile state only on request (once per process); without it the first tile instruction
  // faults.
  static const bool ok = cpu_has_amx_bf16() && syscall(SYS_arch_prctl, kArchRequestPermission, kTileData) == 0;
  return ok;
}

__attribute__((target("amx-tile"))) void begin() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  // (GCC 12 does not see the configuration instruction read the object and drops the stores above: the
  // escape below keeps them.)
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void end() { _tile_release(); }

// Tiles 0-3: S^T for keys kb..kb+31 x queries qb..qb+31 (2 x 2 blocks of 16); 4, 5: K blocks; 6, 7: Q pairs.
__attribute__((target("amx-tile,amx-bf16"))) void scores(const std::uint16_t* k, const std::uint16_t* q_pairs,
                                                          std::int64_t dim32, float* st) {
  const long k_stride = static_cast<long>(dim32 * 2);
  constexpr long kPairStride = kLanes * 2 * 2;  // bytes per row of pairs: 64 queries x 2 values
  constexpr long kScoreStride = kLanes * 4;
  for (int kb = 0; kb < kTileKeys; kb += 32) {
    for (int qb = 0; qb < kLanes; qb += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (std::int64_t d0 = 0; d0 < dim32; d0 += 32) {
        _tile_loadd(4, k + kb * dim32 + d0, k_stride);
        _tile_loadd(5, k + (kb + 16) * dim32 + d0, k_stride);
        const std::uint16_t* pairs = q_pairs + (d0 / 2) * kLanes * 2;
        _tile_loadd(6, pairs + qb * 2, kPairStride);
        _tile_loadd(7, pairs + (qb + 16) * 2, kPairStride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, st + kb * kLanes + qb, kScoreStride);
      _tile_stored(1, st + kb * kLanes + qb + 16, kScoreStride);
      _tile_stored(2, st + (kb + 16) * kLanes + qb, kScoreStride);
      _tile_stored(3, st + (kb + 16) * kLanes + qb + 16, kScoreStride);
    }
  }
}

// Tiles 0-3: T for output dims db..db+31 x queries qb..qb+31 (2 x 2 blocks of 16, four independent sums so
// that the products' latency overlaps); 4, 5: V^T blocks (of each of V's terms in turn); 6, 7: P pairs of one
// term. A last block of 16 dims (dv16 an odd multiple of 16, kTwoDimBlocks false) takes tiles 0, 1 and 4. The
// sums run over every key of every tile of the step, tile by tile.
namespace {

template <bool kTwoDimBlocks>
__attribute__((target("amx-tile,amx-bf16"))) void value_block(const std::uint16_t* const* vt_tiles, int tiles,
                                                                      int v_terms, const std::uint16_t* p_pairs,
                                                                      int p_terms, std::int64_t dv16, std::int64_t db,
                                                                      int qb, float* out) {
  constexpr std::int64_t kTermStride = kTileKeys * kLanes;  // uint16 per term of P
  constexpr long kVtStride = kTileKeys * 2;
  constexpr long kPairStride = kLanes * 2 * 2;
  constexpr long kOutStride = kLanes * 4;
  const std::int64_t tile_stride = p_terms * kTermStride;
  const std::int64_t vt_term_stride = dv16 * kTileKeys;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kTwoDimBlocks) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int g = 0; g < tiles; ++g) {
    for (int k0v = 0; k0v < kTileKeys * v_terms; k0v += 32) {
      const int k0 = k0v % kTileKeys;
      const std::uint16_t* vt = vt_tiles[g] + (k0v / kTileKeys) * vt_term_stride;
      _tile_loadd(4, vt + db * kTileKeys + k0, kVtStride);
      if constexpr (kTwoDimBlocks) _tile_loadd(5, vt + (db + 16) * kTileKeys + k0, kVtStride);
      for (int term = 0; term < p_terms; ++term) {
        const std::uint16_t* pairs = p_pairs + g * tile_stride + term * kTermStride + (k0 / 2) * kLanes * 2;
        _tile_loadd(6, pairs + qb * 2, kPairStride);
        _tile_loadd(7, pairs + (qb + 16) * 2, kPairStride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if constexpr (kTwoDimBlocks) {
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
    }
  }
  _tile_stored(0, out + db * kLanes + qb, kOutStride);
  _tile_stored(1, out + db * kLanes + qb + 16, kOutStride);
  if constexpr (kTwoDimBlocks) {
    _tile_stored(2, out + (db + 16) * kLanes + qb, kOutStride);
    _tile_stored(3, out + (db + 16) * kLanes + qb + 16, kOutStride);
  }
}

}  // namespace

__attribute__((target("amx-tile,amx-bf16"))) void values(const std::uint16_t* const* vt_tiles, int tiles,
                                                          int v_terms, const std::uint16_t* p_pairs, int p_terms,
                                                          std::int64_t dv16, float* out) {
  std::int64_t db = 0;
  for (; db + 32 <= dv16; db += 32) {
    for (int qb = 0; qb < kLanes; qb += 32) value_block<true>(vt_tiles, tiles, v_terms, p_pairs, p_terms, dv16, db, qb, out);
  }
  for (; db < dv16; db += 16) {
    for (int qb = 0; qb < kLanes; qb += 32) value_block<false>(vt_tiles, tiles, v_terms, p_pairs, p_terms, dv16, db, qb, out);
  }
}

// One gather per 16 output pairs: output row d, pairs j..j+15, from column d of rows j..j+15.
__attribute__((target("avx512f"))) void transpose_pairs(const std::uint32_t* v_pairs, std::int64_t dv16,
                                                         std::uint16_t* vt) {
  constexpr int kPairs = kTileKeys / 2;
  auto* out = reinterpret_cast<std::uint32_t*>(vt);
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int>(dv16)));
  for (std::int64_t d = 0; d < dv16; ++d) {
    for (int j = 0; j < kPairs; j += 16) {
      const __m512i x = _mm512_i32gather_epi32(rows, v_pairs + j * dv16 + d, 4);
      _mm512_storeu_si512(out + d * kPairs + j, x);
    }
  }
}

}  // namespace attnkit::cpu::amx

#else  // no AMX: the tiled kernel never asks for the tiles (available() is false)

#include <cstdlib>

namespace attnkit::cpu::amx {

bool available() { return false; }
void begin() { std::abort(); }
void end() { std::abort(); }
void scores(const std::uint16_t*, const std::uint16_t*, std::int64_t, float*) { std::abort(); }
void values(const std::uint16_t* const*, int, int, const std::uint16_t*, int, std::int64_t, float*) { std::abort(); }
void transpose_pairs(const std::uint32_t*, std::int64_t, std::uint16_t*) { std::abort(); }

}  // namespace attnkit::cpu::amx

#endif
