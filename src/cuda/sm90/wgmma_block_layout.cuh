// The wgmma kernel's block layout (attention_wgmma.cu): rows and threads per block, blocks per SM, the K/V ring,
// registers and named barriers, and the shared memory a build needs. Host and device code read the same numbers.
#pragma once

#include "cuda/common/fragment_softmax.cuh"
#include "cuda/common/kernel_params.cuh"
#include "cuda/common/stored_pairs.cuh"
#include "cuda/config/tile_table.hpp"
#include "cuda/host/kernel_launchers.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace attnkit::cuda::wgmma_block {

inline constexpr int kRows = static_cast<int>(kWarpgroupRows);  // 2 consumer warpgroups x 64
// Keys per tile (warpgroup_tile_keys, on the device too), in every build.
__host__ __device__ constexpr int tile_keys_for(int head_dim) { return head_dim > 128 ? 64 : 128; }
static_assert(tile_keys_for(64) == warpgroup_tile_keys(64) && tile_keys_for(128) == warpgroup_tile_keys(128) &&
                  tile_keys_for(192) == warpgroup_tile_keys(192) && tile_keys_for(256) == warpgroup_tile_keys(256),
              "the TMA boxes (warpgroup_maps.cu) are the kernel's tiles");
inline constexpr int kConsumerThreads = 256;
inline constexpr int kSlots = 2;  // K and V tiles in flight
// Ones in the element type, the B operand of the MMA that sums the rows of P (sm90::RowSums), read without
// swizzle as two 128-byte core matrices (16 x 8, K-major): 256 bytes, so that three blocks of 128-key tiles fit
// an SM. Filled at every head dim though only head dim 64 reads them: leaving them out above measured no gain
// (bench/results/2026-11-30-h200-cuda-row-sums.md).
inline constexpr int kOnesBytes = 256;
inline constexpr int kConsumerWarps = kConsumerThreads / 32;
// Registers per thread: the producer gives most of its share to the consumers (setmaxnreg).
inline constexpr int kProducerRegisters = 24;
inline constexpr int kConsumerRegisters = 240;  // (24 + 2 x 240) / 3 = 168, a block of 384 threads
// Named barriers: 1 and 2 are the warpgroups' turns on the tensor cores, 3 the zero fill of three blocks per SM, 4 Q.
inline constexpr int kTurnBarrier = 1;
inline constexpr int kZeroFillBarrier = 3;
inline constexpr int kQBarrier = 4;  // the consumers' Q copy is complete

template <int D>
constexpr std::size_t tile_bytes(int rows) {
  return static_cast<std::size_t>(rows) * D * 2;
}

// A quantized cache (S int8 or int4, T the query's type): blocks of 64 rows on consumer warpgroup 0, while
// warpgroup 1 turns the stored tiles, streamed by TMA into a ring of raw slots, into element-type tiles of the
// stored integers (exactly) in the K and V slots. int4 tiles are half the bytes of int8 ones: twice the slots
// keep the same bytes in flight.
template <class T, class S>
inline constexpr bool kQuantizedStorage = !std::is_same_v<S, T>;
// Head dim 64, K/V of the query's type: blocks of 64 rows on one consumer warpgroup (no turns), two per SM
// (256 threads at 128 registers; the consumers take 232 of the producer's). Each SM still holds 128 rows, but
// the two blocks run apart: one's start (barriers, Q, the first tile's latency) and finish pass under the
// other's tiles, where a 128-row block's warpgroups wait for each other's turns and start and end together
// (bench/results/2026-11-30-h200-cuda-paired-blocks.md: bert_b1_s512 9.9 -> 7.9 us, bert_b8_s512 27.1 -> 25.5).
// A 64 x 64 accumulator and 128-key scores fit the 232 registers; head dims 128 and 256 need a 128-row
// block's shared memory per SM and keep it.
// kThree (KernelParams::three_per_sm, the plan's choice): three such blocks per SM (80 registers at launch, the
// consumers take 136). Each SM holds 192 rows, the way FlashAttention-3 runs head dim 64 with three consumer
// warpgroups: faster on grids of several rounds of plain blocks, slower on one round
// (bench/results/2026-11-30-h200-cuda-paired-blocks.md). Its tiles are 128 keys too, one at a time (S, softmax,
// P V, each MMA waited for): the scores and the previous tile's P do not fit 136 registers together. Against
// 64-key tiles with the MMAs overlapping the softmax, 17% fewer instructions (each tile's waits, votes,
// descriptors and maximum are paid per 128 keys) and bert_b8_s512 23.1 -> 21.2 us on the H200
// (bench/results/2026-12-01-h200-cuda-three-seq.md).
template <class T, int D, class S>
inline constexpr bool kPairedBlocks = D == 64 && !kQuantizedStorage<T, S>;
template <class T, int D, class S, bool kThree>
constexpr int blocks_per_sm() {
  return kPairedBlocks<T, D, S> ? (kThree ? 3 : 2) : 1;
}
template <class T, int D, class S>
constexpr int block_rows() {
  return kQuantizedStorage<T, S> || kPairedBlocks<T, D, S> ? 64 : kRows;
}
// Warpgroup 0 produces (one thread drives the TMA); one or two consume.
template <class T, int D, class S>
constexpr int block_threads() {
  return kPairedBlocks<T, D, S> ? 256 : 128 + kConsumerThreads;
}
template <class S>
constexpr int raw_slots() {
  return std::is_same_v<S, Int4Tag> ? 2 * kSlots : kSlots;
}

// Q, the K and V slots, (quantized) the raw slots, the ones of the rows' sums, the barriers (the ring's, Q's),
// the row tables, Q's empty barrier (a persistent grid), the two barriers of V's staged tiles, and
// 1024 bytes to align the tiles on the swizzle pattern.
template <class T, int D, class S, bool kThree = false>
constexpr std::size_t smem_bytes_for() {
  constexpr int rows = block_rows<T, D, S>();
  std::size_t bytes = 1024 + tile_bytes<D>(rows) + 2 * kSlots * tile_bytes<D>(tile_keys_for(D)) + kOnesBytes +
                      (4 * kSlots + 4) * sizeof(std::uint64_t) + (4 * rows + kBlockKeyInts) * sizeof(int);
  static_assert((4 * rows + kBlockKeyInts) % 2 == 0, "Q's empty barrier after the tables, on 8 bytes");
  if (kQuantizedStorage<T, S>) {
    bytes += 2 * raw_slots<S>() * static_cast<std::size_t>(tile_keys_for(D) * stored_row_bytes<T, S>(D)) +
             4 * raw_slots<S>() * sizeof(std::uint64_t);
  }
  return bytes;
}

}  // namespace attnkit::cuda::wgmma_block
