// The wgmma kernel's MMA stages of one tile (attention_wgmma_kernel-inl.cuh): O += P V over a tile's first keys,
// and the branches that give a partial last tile's S and P V MMAs as few columns as hold its visible keys, each
// branch a whole pipeline stage.
#pragma once

#include "cuda/sm90/hopper.cuh"

#include <cstdint>

namespace attnkit::cuda::wgmma_block {

// O += P V_t over the tile's first kKeys keys, P in `a`: 16 keys are 2 swizzle patterns (2048 bytes) on; the
// 64-column blocks of V are kTileKeys x 128 bytes apart. O's kV columns as MMAs of kOutN (head dim 256 as two of
// 128: N is at most 256, and two halves keep each MMA's operand list at 64 registers; 192 as three of 64). kSums:
// the rows' sums of P on the tensor cores too (sm90::RowSums, `ones`). kThree: V's descriptors as v_desc plus a
// constant (one add per MMA, not the address's fields again).
template <class T, int D, int kV, int kOutN, int kTileKeys, int kKeys, bool kThree, bool kSums>
__device__ __forceinline__ void issue_values(float (&o)[D / 8][4], float (&sums)[1][4],
                                             const std::uint32_t (&a)[kTileKeys / 16][4], std::uint32_t v_addr,
                                             std::uint64_t v_desc, std::uint64_t ones) {
#pragma unroll
  for (int h = 0; h < kV / kOutN; ++h) {
    auto& out = *reinterpret_cast<float(*)[kOutN / 8][4]>(&o[h * (kOutN / 8)]);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const std::uint32_t at = h * (kOutN / 64) * kTileKeys * 128 + kk * 2048;
      sm90::Wgmma<T, kOutN>::rs(out, a[kk], kThree ? v_desc + (at >> 4)
                                                  : sm90::swizzle128_desc(v_addr + at, kTileKeys * 128, 1024));
    }
  }
  if constexpr (kSums) {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) sm90::RowSums<T>::rs(sums, a[kk], ones);
  }
}

// stage(keys) with `keys` a constant in each branch: the fewest of 32, 64, 96 or all kTileKeys keys of a tile that
// hold its first `visible` keys. Each branch is a whole pipeline stage, from the MMAs' fence to their wait: ptxas
// serialises the MMAs of a stage that spans a branch.
template <int kTileKeys, class Stage>
__device__ __forceinline__ void at_tile_keys(int visible, Stage stage) {
  if (visible <= 32) {
    stage(32);
  } else if (visible <= 64) {
    stage(64);
  } else if (visible <= 96 && kTileKeys > 96) {
    stage(96);
  } else {
    stage(kTileKeys);
  }
}

// The pipeline stage of S_t for a tile whose first `visible` keys count (issue(into, keys): the fence and the
// stage's MMAs, S over the tile's first `keys` keys; end(): their wait). S covers the first 64 keys where they
// hold the visible ones (and the tile has more), else the whole tile; each branch is a whole stage, since ptxas
// serialises the MMAs of a stage that spans a branch. One narrow width only: with 32 and 96 as well ptxas ran
// out of registers for the MMA pipeline in most builds (C7511: serialised); 64 alone or 32 alone compiled clean,
// and 64 saves the most over visible counts spread evenly. A narrow S lands in an array of its own, copied into s
// after the wait with zeros past it: into s's first registers, with the others live across the stage, the MMAs
// were serialised and spilled.
template <int kTileKeys, class Issue, class End>
__device__ __forceinline__ void scores_stage(float (&s)[kTileKeys / 8][4], int visible, Issue issue, End end) {
  if (visible > 64 || kTileKeys <= 64) {
    issue(s, kTileKeys);
    end();
    return;
  }
  float part[kTileKeys / 8][4];
  issue(part, 64);
  end();
#pragma unroll
  for (int j = 0; j < kTileKeys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = j < 8 ? part[j][e] : 0.0f;
  }
}

}  // namespace attnkit::cuda::wgmma_block
