// The Hopper tensor-core attention kernel (sm_90a: wgmma, TMA) for float16 / bfloat16, head dims 64, 128, 256, K
// and V of the query's type, rows starting on 16 bytes. Other GPUs and shapes run attention_mma.cu.
//
// A block owns 128 rows ((query, head) pairs of one K/V head): two consumer warpgroups of 64 rows and one producer
// warpgroup (one thread issues the copies; its registers go to the consumers). At head dim 64 a block owns 64 rows
// on one consumer warpgroup and two blocks share an SM (kPairedBlocks). The producer streams the block's key range
// in tiles of 128 keys through two K and two V slots with TMA (each slot has a "full" barrier the TMA completes and
// an "empty" one the consumers' warps arrive on). Tiles land in wgmma's 128-byte-swizzle layout ([D / 64][rows][64]
// elements, the 16-byte chunks of a row XOR-ed with row % 8; Q is copied the same way once), so S = Q Kᵀ reads both
// operands straight from shared memory, and O += P V takes P from registers (S's accumulator layout is the A-operand
// layout) and V from shared memory as an N-major operand.
//
// The two consumer warpgroups take turns on the tensor cores (named barriers): each issues S_t = Q K_tᵀ and the
// previous tile's O += P_{t-1} V_{t-1} back to back, hands over, and then runs tile t's softmax while the other
// warpgroup's MMAs run. The scores, the online softmax and the finish are fragment_softmax.cuh's, the same code
// as the mma.sync kernel: float32 accumulation, the normaliser sums the rounded P, no atomics, bit-identical runs.
//
// Ragged and paged sequences (float K/V) run the general build: rows and keys come from the entry (entry_rows,
// setup_rows), ragged keys are rows of one TMA tensor from the entry's first key on, and a paged cache is a TMA
// tensor of pages whose tiles the producer warp loads page by page (issue_paged_tile).
//
// The kernel template itself, in an anonymous namespace: attention_wgmma.cu, its only includer, instantiates and
// launches it.
#pragma once

#include "cuda/common/block_phases.cuh"
#include "cuda/common/fragment_softmax.cuh"
#include "cuda/sm90/hopper.cuh"
#include "cuda/sm90/wgmma_block_layout.cuh"
#include "cuda/sm90/wgmma_tile_mmas.cuh"
#include "cuda/config/tile_table.hpp"
#include "cuda/host/kernel_launchers.hpp"
#include "cuda/common/query_tile.cuh"
#include "cuda/common/stored_pairs.cuh"

#include <algorithm>
#include <cstdint>

namespace attnkit::cuda {
namespace {

using namespace wgmma_block;  // (sm90/wgmma_block_layout.cuh)

// kPlain: the build for runs_plain problems (kernel_params.cuh): no row tables, no rule, mask, softcap, sink,
// rotary or split compiled in. A one-tile block runs every instruction of its path once, fetched cold, and the
// general path's setup, visibility tests and finish branches were most of it (bench/results/, the PC sampling of
// 2026-11-30-h200-short-prologue.md).
// kPersistent: the plain build of three per SM as a persistent grid (below); its own build, so that a grid of one
// block per unit runs the code without the units' loop.
// kQk, kV: the columns the MMAs cover (a narrow build, warpgroup_widths): S in kQk / 16 k-steps, O += P V over
// kV columns, K's and V's boxes past them not loaded.
template <class T, int D, class S, bool kPlain, bool kThree, bool kPersistent = false, int kQk = D, int kV = D>
__global__ void __launch_bounds__(block_threads<T, D, S>(), blocks_per_sm<T, D, S, kThree>())
    attention_wgmma_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ WarpgroupMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  ATTNKIT_PHASES_BEGIN()  // block_phases.cuh: marks 1-9 below, printed by the first consumer thread
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* const base = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  constexpr bool kQuantized = kQuantizedStorage<T, S>;
  constexpr int kBlockRows = block_rows<T, D, S>();
  static_assert(!kThree || kPairedBlocks<T, D, S>, "three blocks per SM: the paired build only");
  static_assert(kQk % 16 == 0 && kQk <= D && kV % 64 == 0 && kV <= D, "whole k-steps and output boxes of the bucket");
  static_assert((kQk == D && kV == D) || !kQuantizedStorage<T, S>, "narrow builds: K/V of the query's type");
  constexpr int kKBoxes = (kQk + 63) / 64, kVBoxes = kV / 64;  // 64-column boxes of K and V that the MMAs read
  constexpr int kTileKeys = tile_keys_for(D);
  constexpr int kTileBytes = static_cast<int>(tile_bytes<D>(kTileKeys));
  constexpr int kRawSlots = raw_slots<S>();
  constexpr int kRawRow = stored_row_bytes<T, S>(D);  // bytes of a stored row
  constexpr int kRawTileBytes = kQuantized ? kTileKeys * kRawRow : 0;
  std::uint8_t* const qs = base;                                   // [D / 64][kBlockRows][64]
  std::uint8_t* const ks = qs + tile_bytes<D>(kBlockRows);         // [kSlots][D / 64][kTileKeys][64]
  std::uint8_t* const vs = ks + kSlots * kTileBytes;               // [kSlots][D / 64][kTileKeys][64]
  std::uint8_t* const raw_k = vs + kSlots * kTileBytes;            // quantized: [kRawSlots][kTileKeys][kRawRow]
  std::uint8_t* const raw_v = raw_k + kRawSlots * kRawTileBytes;
  std::uint8_t* const ones = raw_v + kRawSlots * kRawTileBytes;  // [kOnesBytes], 1024-byte aligned like the tiles
  auto* const bars = reinterpret_cast<std::uint64_t*>(ones + kOnesBytes);
  std::uint64_t* const k_full = bars;
  std::uint64_t* const v_full = bars + kSlots;
  std::uint64_t* const k_empty = bars + 2 * kSlots;
  std::uint64_t* const v_empty = bars + 3 * kSlots;
  std::uint64_t* const raw_k_full = bars + 4 * kSlots;  // quantized: the raw ring's barriers
  std::uint64_t* const raw_v_full = raw_k_full + kRawSlots;
  std::uint64_t* const raw_k_empty = raw_v_full + kRawSlots;
  std::uint64_t* const raw_v_empty = raw_k_empty + kRawSlots;
  std::uint64_t* const q_full = bars + 4 * kSlots + (kQuantized ? 4 * kRawSlots : 0);  // Q by TMA (p.q_by_tma)
  int* const tables_mem = reinterpret_cast<int*>(q_full + 1);
  // (A persistent grid) the consumers' S MMAs are done with Q: after the tables, so that the other builds'
  // layout is the one they had before it.
  auto* const q_empty = reinterpret_cast<std::uint64_t*>(tables_mem + 4 * kBlockRows + kBlockKeyInts);
  // Where the producer's warp 1 zeroes V's first or last tile (zero_v_by_producer): the tile's TMA lands on
  // v_staged[0] or [1], and warp 1 arrives on its v_full barrier once the rows outside the block's keys are zeros.
  std::uint64_t* const v_staged = q_empty + 1;
  const RowTables tables{tables_mem, tables_mem + kBlockRows, tables_mem + 2 * kBlockRows,
                         tables_mem + 3 * kBlockRows, tables_mem + 4 * kBlockRows};

  const int tid = threadIdx.x;
  // Broadcast from lane 0, so that the compiler knows the warp index (and the role branch below) is
  // warp-uniform: wgmma in a possibly divergent path gets serialized (ptxas C7518).
  const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const int lane = tid % 32;
  // A persistent grid (the plain build of three per SM, KernelParams::persistent_places): the block runs this
  // unit of work and every gridDim.x-th after it. Its K/V ring carries on from one unit to the next, so the next
  // unit's first tiles load under this one's last; its Q loads once this one's last S is done (the output is
  // staged in the last V slot, not in the Q tile). Otherwise the loops below run once.
  static_assert(!kPersistent || (kPlain && kThree), "a persistent grid: the plain build of three per SM only");
  std::int64_t block = p.first_block + blockIdx.x;
  BlockCoord c = kPlain ? plain_block_coord(p, block) : block_coord(p, block);
  // (Launched to overlap an unknown kernel: it may write anything read below; only its launch latency and this
  // block's start pass under its tail.)
  if (p.wait_first) wait_for_prior_grids();
  // A decode split's piece with device key lengths ends at its entry's length (read after the wait: the
  // previous kernel may write the lengths); a piece past it is empty and reads no tile.
  if constexpr (kPlain) c.key_end = plain_key_end(p, c);
  ATTNKIT_PHASE(1)
  // The rotary's position of query 0 (no position_ids), loaded now: its latency passes under the row setup
  // instead of standing before every cos / sin load (the GQA op uploads it before the pre-pass runs).
  const std::int64_t rotary_first =
      !kPlain && p.rotary.cos != nullptr && p.rotary.position_ids == nullptr && tid >= 128
          ? p.rotary.first_position[c.b * p.rotary.first_position_stride]
          : 0;
  std::int64_t first_row = c.row_block * kBlockRows;
  // Ragged or paged sequences (the general build of one or two blocks per SM, K/V of the query's type): the
  // entry's own queries and keys (its rows may end before the grid's maxima).
  constexpr bool kSequences = !kPlain && !kQuantized && !kThree;
  const core::SequenceRows entry = kSequences ? entry_rows(p, c.b) : core::SequenceRows{};
  int rows = kSequences ? block_rows(p, entry, first_row, kBlockRows)
                        : static_cast<int>(min64(kBlockRows, p.group_rows - first_row));
  // A block past its entry's queries has nothing to do (the splits of a cluster share the entry, so all of them
  // leave together).
  if (kSequences && p.has_sequences && rows == 0) return;
  // A block of at most 64 rows (a decode step: a K/V head's few query rows over a long cache) runs on consumer
  // warpgroup 0 alone, without turns: warpgroup 1 would spend the tensor cores on padding rows while the
  // stream waits for both to release each slot.
  const bool solo = kPairedBlocks<T, D, S> || rows <= 64;
  const int consumer_threads = solo ? 128 : kConsumerThreads;
  // The g-th tile through the ring (a block's tile t; a persistent block's units count on) of K and V, keys from
  // t0, into its slots by TMA, once the consumers have freed them.
  // Ragged keys sit in one tensor of total_k rows (warpgroup_maps): the entry's keys start at its first row.
  const bool ragged_keys = kSequences && p.has_sequences && p.seq.ragged_k;
  // (v_bar: V's barrier, v_full's or a staged tile's)
  auto issue_kv_tile = [&](int g, int t0, std::uint64_t* v_bar) {
    const int key_row = ragged_keys ? static_cast<int>(entry.first_key) + t0 : t0;
    const int key_batch = ragged_keys ? 0 : static_cast<int>(c.b);
    const int slot = g % kSlots;
    const unsigned parity = (g / kSlots) % 2;
    // One of K and V: wait for its slot to be free, then its boxes onto the slot's full barrier.
    auto issue = [&](std::uint64_t* empty, std::uint64_t* full, std::uint8_t* slots, const CUtensorMap* map,
                     int boxes) {
      sm90::mbarrier_wait(&empty[slot], parity ^ 1);
      sm90::mbarrier_arrive_expect(full, boxes * kTileKeys * 128);
#pragma unroll
      for (int b = 0; b < boxes; ++b) {
        sm90::tma_load_4d(slots + slot * kTileBytes + b * kTileKeys * 128, map, b * 64, key_row,
                          static_cast<int>(c.kvh), key_batch, full);
      }
    };
    issue(k_empty, &k_full[slot], ks, &maps.k, kKBoxes);
    issue(v_empty, v_bar, vs, &maps.v, kVBoxes);
  };
  // A paged cache (float K/V; pages of 8 keys or more that divide the tile or that it divides, warpgroup_maps'
  // boxes): tile t0's pages box by box, one lane of the producer warp per box and its block-table entry, so the
  // lookups overlap. Only the boxes that hold keys below hi are read; the slot's other rows keep old keys, which
  // the scores mask and prepare_v zeroes in V.
  auto issue_paged_tile = [&](int g, int t0, int hi, std::uint64_t* v_bar) {
    const int slot = g % kSlots;
    const unsigned parity = (g / kSlots) % 2;
    const int page_size = static_cast<int>(p.seq.page_size);
    const int box_keys = page_size < kTileKeys ? page_size : kTileKeys;
    const int boxes = (min(hi - t0, kTileKeys) + box_keys - 1) / box_keys;
    const int key = t0 + lane * box_keys;
    const int column = key / page_size;
    const int page = lane < boxes ? p.seq.block_table[c.b * p.seq.max_pages_per_seq + column] : 0;
    const int row = key - column * page_size;
    auto issue = [&](std::uint64_t* empty, std::uint64_t* full, std::uint8_t* slots, const CUtensorMap* map,
                     int columns) {
      sm90::mbarrier_wait(&empty[slot], parity ^ 1);
      if (lane == 0) sm90::mbarrier_arrive_expect(full, static_cast<unsigned>(boxes * box_keys * 128 * columns));
      __syncwarp();
      if (lane < boxes) {
#pragma unroll
        for (int b = 0; b < columns; ++b) {
          sm90::tma_load_4d(slots + slot * kTileBytes + b * kTileKeys * 128 + lane * box_keys * 128, map, b * 64, row,
                            static_cast<int>(c.kvh), page, full);
        }
      }
    };
    issue(k_empty, &k_full[slot], ks, &maps.k, kKBoxes);
    issue(v_empty, v_bar, vs, &maps.v, kVBoxes);
  };
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const T* q = static_cast<const T*>(p.q);
  // Rows that TMA would stream slowly (p.kv_copies, kv_rows_want_copies): the producer warpgroup copies the
  // tiles in 16-byte chunks into the slots' swizzled layout, warps 0-1 K's and warps 2-3 V's, zeros past the
  // real dims and past k_len as TMA's out-of-bounds fill. Each thread arrives on the slot's full barrier (whose
  // count is the 64 threads) once its copies of the g-th tile (keys from t0) have landed. (The producer runs on
  // 24 registers: one column pointer, one address per copy.)
  auto copy_kv_tile = [&](int g, int t0, int lo, int hi, const T* column, std::int64_t row_stride, std::int64_t dim,
                          std::uint64_t* empty, std::uint64_t* full, std::uint8_t* slots) {
    constexpr int kRowsPerPass = 64 / kChunks;  // (head dim 192: 2 rows of 24 chunks, 16 threads idle)
    const int slot = g % kSlots;
    sm90::mbarrier_wait(&empty[slot], ((g / kSlots) % 2) ^ 1);
    const int row = tid % 64 / kChunks, chunk = tid % 64 % kChunks;
    if (row < kRowsPerPass) {
      const std::uint32_t tile = sm90::smem_u32(slots) + slot * kTileBytes;
      // (rows [first, end) of the tile are the block's keys, hi <= k_len; the others zeros, as prepare_v wants V's)
      const int first = max(0, lo - t0), end = chunk * 8 < dim ? min(kTileKeys, hi - t0) : 0;
#pragma unroll 1
      for (int r = row; r < kTileKeys; r += kRowsPerPass) {
        cp_async16_zero_fill(tile + swizzled_chunk(kTileKeys, r, chunk), column + (t0 + r) * row_stride,
                             r >= first && r < end);
      }
    }
    // Landed, then made visible to the MMAs' async proxy by the threads that wrote them, then the arrival.
    cp_async_commit();
    cp_async_wait_all();
    sm90::fence_proxy_async();
    sm90::mbarrier_arrive(&full[slot]);
  };
  const int q_rows = solo ? 64 : kBlockRows;
  const bool rotary = !kPlain && p.rotary.cos != nullptr;
  // Q's plain chunks [first_chunk, kChunks) of every row by cp.async (zeros for padded rows), at the rows'
  // (head, query) from the row tables or, before they exist, from row_of.
  auto load_q = [&](int first_chunk, bool from_tables) {
    const int per_row = kChunks - first_chunk;
    for (int e = tid - 128; e < q_rows * per_row; e += consumer_threads) {
      const int r = e / per_row, ch = first_chunk + e % per_row;
      RowOf row{0, 0};
      if (!kPlain && from_tables) {
        row = RowOf{tables.head[r], tables.query[r]};
      } else if (r < rows) {
        row = row_of(p, c.kvh, first_row + r);
      }
      // (chunks past the real head dim of the bucket D are zeros)
      const std::int64_t at =
          kSequences ? query_row_index(p, p.lq, c.b, row.head, row.query) : p.lq.index(c.b, row.head, row.query);
      cp_async16(qs + swizzled_chunk(kBlockRows, r, ch), q + at + ch * 8,
                 r < rows && (!p.bucketed || ch * 8 < p.head_dim));
    }
    cp_async_commit();
  };
  // Without a sliding window every row's keys start at the block's first key (core::VisibilityRule): tile 0 of
  // K and V and all of Q can be in flight before the row setup, whose time then covers their latency (most of
  // a one-tile block's). Not in a launch that overlaps the previous kernel (the GQA pre-pass writes Q and K/V)
  // nor from a quantized cache (its raw ring) nor with a rotary (Q goes through the rotation after the setup).
  // (Nor for sequences: an entry's keys and rows are known after its setup.)
  const bool early =
      kPlain || (!kQuantized && p.inputs_ready && !(p.rule.causal && p.rule.window > 0) && !p.has_sequences);
  // Q by TMA where the host could describe it (a box of `group` heads x rows / group queries is the block's rows
  // in row_of's order): one thread's copies instead of every consumer thread's row_of and address arithmetic
  // before its cp.async (~1,650 cycles of a one-tile plain block, bench/results/2026-11-30-h200-cuda-split-tail.md;
  // ~4,000 of a general block under a causal rule, 2026-12-06-h100-main-checked-and-causal-phases.md). Rows past
  // the queries' end arrive as zeros. The general build's rows are row_of's too, except for sequences; not with a
  // rotary (Q goes through registers), a quantized cache (K's scales fold into Q in place) or inputs a previous
  // kernel may still be writing.
  const bool q_by_tma =
      p.q_by_tma && (kPlain || (!kQuantized && p.inputs_ready && !p.has_sequences && !rotary));
  auto issue_q = [&] {  // (the block's current unit)
    sm90::mbarrier_arrive_expect(q_full, static_cast<unsigned>(tile_bytes<D>(kBlockRows)));
    // (One query: the block's rows are heads from its first on, whichever box the map has; see encode_q_map.)
    const bool one_query = p.q_len == 1;
    const int first_query = one_query ? 0 : static_cast<int>(c.row_block * kBlockRows / p.group);
    const int first_head = static_cast<int>(c.kvh * p.group + (one_query ? c.row_block * kBlockRows : 0));
#pragma unroll
    for (int b = 0; b < D / 64; ++b) {
      sm90::tma_load_4d(qs + b * kBlockRows * 128, &maps.q, b * 64, first_head, first_query, static_cast<int>(c.b),
                        q_full);
    }
  };
  const int early_tile = static_cast<int>(c.key_begin) / kTileKeys * kTileKeys;
  // Tile 0 before the row setup by the TMA (the producer's loop below then starts at tile 1). Not for a range
  // that starts past its entry's device key length (a decode split's, which then has no tile to read), nor from
  // pages (the plain build's paged pieces: box by box, below).
  // (The plain build asks keys_end_per_entry first: has_sequences sits on a parameter line it reads nowhere else,
  // and a first read of a line stalls the block's start.)
  const bool sequences = kPlain ? p.keys_end_per_entry && p.has_sequences : p.has_sequences;
  const bool tile0_early = early && !p.kv_copies && !sequences &&
                           c.key_begin < (kPlain ? c.key_end : key_length_of(p, c.b));
  // A partial tile's V rows outside the block's keys must be zeros before O += P V (prepare_v). The producer
  // zeroes them: its warp 1, which has nothing else to do, between the tile's TMA (landing on v_staged) and
  // the consumers' v_full, or the copying threads' zero fill (kv_copies). Zeroed by the consumers themselves, the
  // two warpgroups had to meet at a barrier that broke their turns (~2,100 cycles of a causal block's last P V,
  // bench/results/2026-12-06-h100-main-checked-and-causal-phases.md). Three blocks per SM keep the consumers'
  // zero fill (one consumer warpgroup, which meets no other); a quantized cache needs none (integers are finite).
  const bool zero_v_by_producer = !kThree && !kQuantized && !p.kv_copies;
  // The early tile 0 is staged before the block's keys are known in the general build (warp 1 then zeroes it or
  // only passes it on); the plain build's keys are the range's.
  const bool stage_early_tile =
      zero_v_by_producer && (!kPlain || (p.keys_end_per_entry && early_tile + kTileKeys > c.key_end));
  // The K / V slots are filled by the TMA (one arrival with the bytes) or, from a quantized cache, by the 4
  // converting warps; the raw slots by the TMA, emptied by the converting warps.
  if (tid == 0) {
    for (int i = 0; i < kSlots; ++i) {
      const unsigned fills = kQuantized ? 4 : p.kv_copies ? 64 : 1;  // (converting warps, copying threads, TMA)
      sm90::mbarrier_init(&k_full[i], fills);
      sm90::mbarrier_init(&v_full[i], fills);
      sm90::mbarrier_init(&k_empty[i], consumer_threads / 32);
      sm90::mbarrier_init(&v_empty[i], consumer_threads / 32);
    }
    if constexpr (kQuantized) {
      for (int i = 0; i < kRawSlots; ++i) {
        sm90::mbarrier_init(&raw_k_full[i], 1);
        sm90::mbarrier_init(&raw_v_full[i], 1);
        sm90::mbarrier_init(&raw_k_empty[i], 4);
        sm90::mbarrier_init(&raw_v_empty[i], 4);
      }
    }
    if (q_by_tma) sm90::mbarrier_init(q_full, 1);
    if (kPersistent) sm90::mbarrier_init(q_empty, consumer_threads / 32);
    if (zero_v_by_producer) {
      sm90::mbarrier_init(&v_staged[0], 1);
      sm90::mbarrier_init(&v_staged[1], 1);
    }
    sm90::fence_barrier_init();
    if (q_by_tma) issue_q();
    if (tile0_early) issue_kv_tile(0, early_tile, stage_early_tile ? &v_staged[0] : &v_full[0]);
  }
  if (early && !rotary && !q_by_tma && tid >= 128 && tid < 128 + consumer_threads) {
    load_q(0, false);  // the consumers' rows
  }
  // The ones, by producer threads that have nothing else to do yet; the block barrier below publishes them.
  if (tid >= 32 && tid < 32 + kOnesBytes / 16) {
    const std::uint32_t one = std::is_same_v<T, __half> ? 0x3C003C00u : 0x3F803F80u;  // (1, 1) in T
    *reinterpret_cast<uint4*>(ones + (tid - 32) * 16) = uint4{one, one, one, one};
    sm90::fence_proxy_async();
  }
  ATTNKIT_PHASE(2)
  // Plain: every row sees the block's whole key range, and the barrier only publishes the initialised mbarriers.
  const BlockKeys keys = kPlain ? plain_block_keys(c)
                                : setup_rows<kBlockRows>(p, c, first_row, rows, kSequences ? entry : entry_rows(p, c.b),
                                                         tables);  // syncs
  // Launched to overlap the GQA pre-pass (launch_warpgroup's `overlap`): Q' and the appended K/V rows are that
  // kernel's, so nothing below reads Q, K or V before it has finished. The merge pass after a split may start
  // once every block of this grid is running.
  wait_for_prior_grids();
  allow_dependent_grids();
  ATTNKIT_PHASE(3)
  const int lo = keys.lo, hi = keys.hi;
  // Tiles are 128-key aligned: tile t holds keys [first_tile + 128 t, + 128); keys outside [lo, hi) are masked.
  const int first_tile = lo < hi ? lo / kTileKeys * kTileKeys : hi;
  const int tiles = (hi - first_tile + kTileKeys - 1) / kTileKeys;
  // Whether tile t0's V rows include keys outside [lo, hi) that may hold what O += P V must not read (0 x inf).
  // (Plain: a range starts on a tile, and the keys past hi = k_len are the TMA's zeros already; past a device key
  // length they are the cache's bytes, and past a paged range's last box the slot's older rows.)
  auto v_tile_partial = [&](int t0) {
    return kPlain ? p.keys_end_per_entry && t0 + kTileKeys > hi : t0 < lo || t0 + kTileKeys > hi;
  };
  // The staged barrier tile t's V lands on (0: the first tile, 1: the last; -1: none, v_full's own): a partial
  // first or last tile, and the early tile 0 as it was issued.
  auto v_stage = [&](int t) {
    if (!zero_v_by_producer) return -1;
    if (t == 0 && tile0_early) return stage_early_tile ? 0 : -1;
    if (t != 0 && t + 1 != tiles) return -1;
    return v_tile_partial(first_tile + t * kTileKeys) ? (t == 0 ? 0 : 1) : -1;
  };
  auto v_bar = [&](int t) { return v_stage(t) < 0 ? &v_full[t % kSlots] : &v_staged[v_stage(t)]; };
  // Zeroes V's rows of tile t0 (in `slot`) outside [lo, hi) with `threads` threads from `thread`, then makes the
  // stores visible to the MMAs' async proxy.
  auto zero_v_outside_keys = [&](int slot, int t0, int thread, int threads) {
    const std::uint32_t tile = sm90::smem_u32(vs) + slot * kTileBytes;
    const int below = max(0, min(lo - t0, kTileKeys)), from = max(0, min(hi - t0, kTileKeys));
#pragma unroll 1
    for (int e = thread; e < kTileKeys * (kV / 8); e += threads) {
      const int j = e / (kV / 8);
      if (j < below || j >= from) sm90::store_zero16(tile + swizzled_chunk(kTileKeys, j, e % (kV / 8)));
    }
    sm90::fence_proxy_async();
  };

  // The producer starts streaming K and V at once; the consumers copy Q meanwhile (a short key range is only a
  // few tiles, so the block's start weighs).
  if (warp < 4) {  // the producer warpgroup: one thread drives the TMA
    sm90::set_max_registers_dec<kProducerRegisters>();
    if (tid == 0 && kQuantized) {  // stored rows into the raw ring, whole rows per box
      for (int t = 0; t < tiles; ++t) {
        const int slot = t % kRawSlots;
        const unsigned parity = (t / kRawSlots) % 2;
        const int t0 = first_tile + t * kTileKeys;
        sm90::mbarrier_wait(&raw_k_empty[slot], parity ^ 1);
        sm90::mbarrier_arrive_expect(&raw_k_full[slot], kRawTileBytes);
        sm90::tma_load_4d(raw_k + slot * kRawTileBytes, &maps.k, 0, t0, static_cast<int>(c.kvh), static_cast<int>(c.b),
                          &raw_k_full[slot]);
        sm90::mbarrier_wait(&raw_v_empty[slot], parity ^ 1);
        sm90::mbarrier_arrive_expect(&raw_v_full[slot], kRawTileBytes);
        sm90::tma_load_4d(raw_v + slot * kRawTileBytes, &maps.v, 0, t0, static_cast<int>(c.kvh), static_cast<int>(c.b),
                          &raw_v_full[slot]);
      }
    } else if ((kSequences || kPlain) && sequences && pages_keys(p)) {  // (plain: a paged decode split's pieces)
      if (warp == 0) {
        for (int t = 0; t < tiles; ++t) issue_paged_tile(t, first_tile + t * kTileKeys, hi, v_bar(t));
      }
    } else if (!kQuantized && !kPersistent && p.kv_copies) {  // (never a persistent grid: the launch checks)
      const bool v = warp >= 2;
      const int chunk = tid % 64 % kChunks * 8;
      const T* const column = v ? static_cast<const T*>(p.v) + p.lv.index(c.b, c.kvh, 0) + chunk
                                : static_cast<const T*>(p.k) + p.lk.index(c.b, c.kvh, 0) + chunk;
#pragma unroll 1
      for (int t = 0; t < tiles; ++t) {
        copy_kv_tile(t, first_tile + t * kTileKeys, lo, hi, column, v ? p.lv.row_stride : p.lk.row_stride,
                     v ? p.v_head_dim : p.head_dim, v ? v_empty : k_empty, v ? v_full : k_full, v ? vs : ks);
      }
    } else if (tid == 0) {
      // With the early tile in flight, a block with rows but no visible key (tiles == 0) still waits for its
      // copies to land before it exits (the early tile is tile 0 otherwise: lo is the block's first key).
      for (int t = tile0_early ? 1 : 0; t < tiles; ++t) issue_kv_tile(t, first_tile + t * kTileKeys, v_bar(t));
      if (tile0_early && tiles == 0) {
        sm90::mbarrier_wait(&k_full[0], 0);
        sm90::mbarrier_wait(stage_early_tile ? &v_staged[0] : &v_full[0], 0);
      }
      if constexpr (kPersistent) {  // the later units: tile 0 as soon as its slots are free, then Q, then the rest
        // (Every unit has the same key range: the host runs a persistent grid with keys and no split tail.)
        for (int unit = 1, ring = tiles; (block += gridDim.x) < p.block_end; ++unit, ring += tiles) {
          c = plain_block_coord(p, block);
          issue_kv_tile(ring, first_tile, &v_full[ring % kSlots]);
          sm90::mbarrier_wait(q_empty, (unit % 2) ^ 1);
          issue_q();
          for (int t = 1; t < tiles; ++t) {
            issue_kv_tile(ring + t, first_tile + t * kTileKeys, &v_full[(ring + t) % kSlots]);
          }
        }
      }
    }
    if (zero_v_by_producer && warp == 1) {  // the staged first and last tiles: zeroed, then passed on
#pragma unroll 1
      for (int t = 0; t < tiles; t = t == 0 && tiles > 1 ? tiles - 1 : tiles) {
        const int stage = v_stage(t);
        if (stage < 0) continue;
        const int t0 = first_tile + t * kTileKeys;
        sm90::mbarrier_wait(&v_staged[stage], 0);
        if (v_tile_partial(t0)) zero_v_outside_keys(t % kSlots, t0, lane, 32);
        __syncwarp();
        if (lane == 0) sm90::mbarrier_arrive(&v_full[t % kSlots]);
      }
    }
    return;
  }

  // Consumers. Per thread: rows r0 = 16 w + lane / 4 and r0 + 8 of consumer warp w (consumer warpgroup g has
  // rows [64 g, 64 g + 64)).
  // (24 + 232) / 2 = 128 and (24 + 136) / 2 = 80: the registers of two and three blocks per SM.
  sm90::set_max_registers_inc<!kPairedBlocks<T, D, S> ? kConsumerRegisters : kThree ? 136 : 232>();
  if (solo && warp >= 8) {
    // A quantized cache: warpgroup 1 turns each raw tile into an element-type tile of the stored integers in
    // the K / V slot (rows past k_len arrive as zeros from the TMA), then frees the raw slot and fills the other.
    if constexpr (kQuantized) {
      const int ct = tid - 256;  // (its thread 0-127)
      auto pass = [&](std::uint64_t* raw_full, std::uint64_t* raw_empty, std::uint64_t* full, std::uint64_t* empty,
                      const std::uint8_t* raw, std::uint8_t* slots, int t) {
        const int slot = t % kSlots, raw_slot = t % kRawSlots;
        sm90::mbarrier_wait(&raw_full[raw_slot], (t / kRawSlots) % 2);
        sm90::mbarrier_wait(&empty[slot], ((t / kSlots) % 2) ^ 1);
        std::uint8_t* const tile = slots + slot * kTileBytes;
        stored_tile_to_swizzled<T, S, kTileKeys, kRawRow>(raw + raw_slot * kRawTileBytes, tile, ct);
        sm90::fence_proxy_async();  // the tile's generic stores, seen by the consumers' wgmma
        __syncwarp();
        if (lane == 0) {
          sm90::mbarrier_arrive(&raw_empty[raw_slot]);
          sm90::mbarrier_arrive(&full[slot]);
        }
      };
      for (int t = 0; t < tiles; ++t) {
        pass(raw_k_full, raw_k_empty, k_full, k_empty, raw_k, ks, t);
        pass(raw_v_full, raw_v_empty, v_full, v_empty, raw_v, vs, t);
      }
    }
    return;
  }
  // With a rotary (query_rotary_loads_chunks holds), the rotated chunks come through registers; the others, as
  // without one, by cp.async.
  const int rotated_chunks = rotary ? static_cast<int>(p.rotary.half / 4) : 0;
  if (!q_by_tma && (!early || rotary)) load_q(rotated_chunks, true);
  if (rotary) {
    load_rotated_query<T>(qs, kBlockRows, rows, q_rows, tables, p, c, rotary_first, tid - 128, consumer_threads);
  }
  cp_async_wait_all();
  // The fold below reads chunks in the copy order: with a rotary, other threads wrote some of them.
  if (kQuantized && rotary) sm90::named_sync(kQBarrier, consumer_threads);
  if constexpr (kQuantized) {
    // K's scales fold into Q (q . (k * s) = (q * s) . k), rounded to T like any element of Q, after the rotary
    // (the GQA pre-pass order: Q' first).
    for (int e = tid - 128; e < q_rows * kChunks; e += consumer_threads) {
      const int r = e / kChunks, ch = e % kChunks;
      auto* chunk = reinterpret_cast<uint4*>(qs + swizzled_chunk(kBlockRows, r, ch));
      uint4 w = *chunk;
      T* x = reinterpret_cast<T*>(&w);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        x[i] = from_float<T>(to_float(x[i]) * core::kv_scale_at(p.k_scale, p.k_quant, c.kvh, D, ch * 8 + i));
      }
      *chunk = w;
    }
  }
  if (q_by_tma) {
    sm90::mbarrier_wait(q_full, 0);  // each thread sees the TMA's bytes (async proxy, as wgmma reads them)
  } else {
    sm90::fence_proxy_async();
    sm90::named_sync(kQBarrier, consumer_threads);
  }
  ATTNKIT_PHASE(4)
  const int warpgroup = warp / 4 - 1;
  const int r0 = (warp - 4) * 16 + lane / 4;
  float o[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
  // At head dims up to 64 the rows' sums of the rounded P come from the tensor cores, P 1 in `sums` (every column
  // holds its row's sum), which the MMAs of O += P V carry along: rescaled by the same alpha, summed in the same
  // order of tiles. Two float32 instructions fewer per score than converting P back and adding (the softmax, not
  // the MMAs, is what a head-dim-64 tile waits for); row_sum then holds the softmax's poison only (NaN: a +inf
  // maximum), else 0. Above, float32 adds as before (the 4 registers made the general builds spill at 168).
  constexpr bool kSumsOnTensorCores = D <= 64;
  float sums[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  float row_max[2] = {core::kNegInf, core::kNegInf};
  float row_sum[2] = {0.0f, 0.0f};
  float alpha[2] = {1.0f, 1.0f};
  std::uint32_t a[kTileKeys / 16][4];  // P of the previous tile, until its MMA is done
  const std::uint32_t q_addr = sm90::smem_u32(qs) + warpgroup * 64 * 128;
  const std::uint64_t ones_desc = sm90::interleave_desc(sm90::smem_u32(ones), 128, 128);
  int ring = 0;  // the ring index of the unit's tile 0 (issue_kv_tile's g)

  // V of tile t ready for O += P V: its slot full and, in a partial tile, the rows of keys outside [lo, hi)
  // zeroed, so that keys no row sees (p = 0) cannot bring a NaN or inf of the buffer into the sum (0 x inf).
  // Done before a turn's MMAs: ptxas serialises MMAs around branches and register use between an MMA and its
  // wait, so a turn is straight-line code that touches no accumulator.
  auto prepare_v = [&](int t) {
    const int slot = (ring + t) % kSlots;
    const int t0 = first_tile + t * kTileKeys;
    sm90::mbarrier_wait(&v_full[slot], ((ring + t) / kSlots) % 2);
    if constexpr (kThree) {  // (elsewhere the producer zeroed them before v_full; a quantized cache's are finite)
      if (v_tile_partial(t0)) {
        zero_v_outside_keys(slot, t0, tid - 128, consumer_threads);
        sm90::named_sync(kZeroFillBarrier, consumer_threads);
      }
    }
  };
  // S = Q K_tᵀ: 64 rows x 128 keys in D / 16 k-steps; a k-step is 32 bytes into the 128-byte rows of a
  // 64-column block, 8-row groups 1024 bytes apart.
  // Three blocks per SM (80 registers at launch) issue it as two MMAs of 64 keys: ptxas does not compile an MMA
  // whose 64 accumulators and operands pass the launch's registers, whatever setmaxnreg grants later.
  constexpr int kScoreN = kThree ? 64 : kTileKeys;
  // Three per SM: each MMA's descriptors as a base plus a constant (one add, not the address's mask, shift and
  // fields again: the build's uniform pipe ran 6x cuDNN's instructions). A shared-memory address's 14-bit field
  // never carries into the next one.
  const std::uint64_t q_desc = sm90::swizzle128_desc(q_addr, 16, 1024);
  const std::uint64_t k_desc = sm90::swizzle128_desc(sm90::smem_u32(ks), 16, 1024);
  const std::uint64_t v_desc = sm90::swizzle128_desc(sm90::smem_u32(vs), kTileKeys * 128, 1024);
  auto plus = [](std::uint64_t desc, std::uint32_t bytes) { return desc + (bytes >> 4); };
  // (keys: the tile's first 64 keys (scores_stage's narrow branch) or all; s's other columns are left as they are)
  auto issue_qk = [&](int t, float (&s)[kTileKeys / 8][4], int keys) {
    const bool narrow = keys == 64 && kTileKeys > 64;
    const std::uint32_t k_addr = sm90::smem_u32(ks + ((ring + t) % kSlots) * kTileBytes);
    if constexpr (kThree) {
      const std::uint64_t slot_desc = plus(k_desc, ((ring + t) % kSlots) * kTileBytes);
#pragma unroll
      for (int kk = 0; kk < kQk / 16; ++kk) {
#pragma unroll
        for (int n = 0; n < (narrow ? 64 : kTileKeys) / kScoreN; ++n) {
          sm90::Wgmma<T, kScoreN>::ss(*reinterpret_cast<float(*)[kScoreN / 8][4]>(&s[n * (kScoreN / 8)]),
                                      plus(q_desc, (kk / 4) * kBlockRows * 128 + (kk % 4) * 32),
                                      plus(slot_desc, (kk / 4) * kTileKeys * 128 + n * kScoreN * 128 + (kk % 4) * 32),
                                      kk > 0);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kQk / 16; ++kk) {
        const std::uint32_t at = (kk % 4) * 32;
        const std::uint64_t q_at = sm90::swizzle128_desc(q_addr + (kk / 4) * kBlockRows * 128 + at, 16, 1024);
        const std::uint64_t k_at = sm90::swizzle128_desc(k_addr + (kk / 4) * kTileKeys * 128 + at, 16, 1024);
        if (narrow) {
          sm90::Wgmma<T, 64>::ss(*reinterpret_cast<float(*)[8][4]>(&s[0]), q_at, k_at, kk > 0);
        } else {
          sm90::Wgmma<T, kScoreN>::ss(s, q_at, k_at, kk > 0);
        }
      }
    }
    sm90::commit();
  };
  // O += P V_t over the tile's first `keys` keys: 32, 64, 96 (at_tile_keys' constants, so that the branches fold
  // away) or the whole tile (issue_values).
  constexpr int kOutN = kV % 128 != 0 && kV > 128 ? 64 : kV > 128 ? 128 : kV;
  static_assert(kV % kOutN == 0, "whole MMAs of output columns");
  auto issue_pv = [&](int t, int keys) {
    const std::uint32_t v_addr = sm90::smem_u32(vs + ((ring + t) % kSlots) * kTileBytes);
    const std::uint64_t slot_desc = plus(v_desc, ((ring + t) % kSlots) * kTileBytes);
    constexpr bool kSums = kSumsOnTensorCores;
    if (keys == 32) {
      issue_values<T, D, kV, kOutN, kTileKeys, 32, kThree, kSums>(o, sums, a, v_addr, slot_desc, ones_desc);
    } else if (keys == 64) {
      issue_values<T, D, kV, kOutN, kTileKeys, 64, kThree, kSums>(o, sums, a, v_addr, slot_desc, ones_desc);
    } else if (keys == 96 && kTileKeys > 96) {
      issue_values<T, D, kV, kOutN, kTileKeys, 96, kThree, kSums>(o, sums, a, v_addr, slot_desc, ones_desc);
    } else {
      issue_values<T, D, kV, kOutN, kTileKeys, kTileKeys, kThree, kSums>(o, sums, a, v_addr, slot_desc, ones_desc);
    }
    sm90::commit();
  };
  auto release = [&](std::uint64_t* bar) {
    __syncwarp();
    if (lane == 0) sm90::mbarrier_arrive(bar);
  };
  // Tile t's scores into P (in `a`), after its S is complete.
  auto softmax_tile = [&](int t, float (&s)[kTileKeys / 8][4]) {
    const int t0 = first_tile + t * kTileKeys;
    float score_scale;  // (what transform_scores leaves to the exponent)
    if constexpr (kPlain) {
      score_scale = scale_plain_scores<kTileKeys>(s, p.transform.scale, hi - t0);
    } else if constexpr (kThree) {
      // (The general build of three per SM runs problems with no mask or softcap and the scale in the exponent,
      // sees_keys_by_rule_only: the visibility test alone, on the tiles that some row does not see whole. The
      // general transform_scores spilled here.)
      score_scale = p.transform.scale;
      if (t0 < keys.all_begin || t0 + kTileKeys > keys.all_end) {
        hide_unseen_keys<kTileKeys>(s, tables, r0, rows, t0, hi - t0);
      }
    } else {
      const bool full = !p.has_mask && keys.all_begin <= t0 && keys.all_end >= t0 + kTileKeys;
      score_scale = transform_scores<kTileKeys, true>(s, p, c, tables, r0, rows, t0, kTileKeys, full);
    }
    softmax_exponentials<kTileKeys>(s, row_max, row_sum, alpha, score_scale);
  };
  auto pack_p = [&](float (&s)[kTileKeys / 8][4]) {
    if constexpr (kSumsOnTensorCores) {
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) pack_probability_operand<T, kTileKeys>(s, kk, a[kk]);
    } else {
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < kTileKeys / 16; ++kk) pack_probabilities<T, kTileKeys>(s, kk, a[kk], tile_sum);
      add_tile_sums(tile_sum, row_sum);
    }
  };
  // The accumulator columns the MMAs write (a narrow build's others stay zero, in no register).
  auto pin_out = [&] { sm90::pin(*reinterpret_cast<float(*)[kV / 8][4]>(&o[0])); };
  // O and the sums times alpha before the next P V (rescale_accumulator's, one vote for both).
  auto rescale = [&] {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (!__all_sync(0xffffffffu, alpha[half] == 1.0f)) {
#pragma unroll
        for (int t = 0; t < kV / 8; ++t) {
          o[t][half * 2] *= alpha[half];
          o[t][half * 2 + 1] *= alpha[half];
        }
        if constexpr (kSumsOnTensorCores) {
          sums[0][half * 2] *= alpha[half];
          sums[0][half * 2 + 1] *= alpha[half];
        }
      }
    }
  };

  // The last tile of a short key range or under a causal rule is often partial: this warpgroup's rows see at most
  // its first last_keys keys (ViT's 257 keys: 1 of the third tile; a causal block of 32 queries of a 4-head
  // group: 16-128 keys of its last). Its S covers the tile's first 64 keys where they hold them (scores_stage),
  // its O += P V those keys' k-steps only (at_tile_keys). Every key past them lies past every row's end: its score
  // is -inf whatever S holds there and its P is 0, so the skipped products would add exact zeros and the bits are
  // the whole tile's. (The general build: the per-warp bounds of setup_rows' lo_hi. Broadcast, so that ptxas sees
  // a warp-uniform branch.) Three blocks per SM run every tile whole (below).
  int last_keys = kTileKeys;
  if constexpr (!kThree) {
    const int warpgroup_hi = kPlain ? hi : max(tables.lo_hi[8 * warpgroup + 1], tables.lo_hi[8 * warpgroup + 5]);
    last_keys = __shfl_sync(0xffffffffu, min(warpgroup_hi, hi) - (first_tile + (tiles - 1) * kTileKeys), 0);
  }

  for (int unit = 0;; ++unit) {  // (one unit of work unless kPersistent)
    if constexpr (kThree) {
      // Three blocks per SM: one tile at a time, S_t, its softmax, then O += P_t V_t, each MMA waited for. The
      // scores of 128 keys and P of the tile before do not fit 136 registers together, so the MMAs of a
      // warpgroup do not overlap its softmax: the other two blocks' warpgroups fill the tensor cores meanwhile.
      // Its partial last tiles run whole (with them narrowed as below, its plain prefill ran 2-3% slower on an
      // H200: bench/results/2026-12-07-h200-wgmma-partial-last-tiles.md).
      for (int t = 0; t < tiles; ++t) {
        const int slot = (ring + t) % kSlots;
        float s[kTileKeys / 8][4];
#pragma unroll
        for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        sm90::mbarrier_wait(&k_full[slot], ((ring + t) / kSlots) % 2);
        sm90::fence();
        issue_qk(t, s, kTileKeys);
        sm90::wait<0>();
        sm90::pin(s);
        release(&k_empty[slot]);
        if (kPersistent && t + 1 == tiles) release(q_empty);  // the next unit's Q may land
        softmax_tile(t, s);
        if (t == 0) {  // (the macro is empty outside phase builds)
          ATTNKIT_PHASE(6)
        }
        rescale();
        pack_p(s);
        prepare_v(t);
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        sm90::fence();
        issue_pv(t, kTileKeys);
        sm90::wait<0>();
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        sm90::pin(a);
        if (!kPersistent || t + 1 < tiles) release(&v_empty[slot]);  // (persistent: the last after the finish)
      }
      ATTNKIT_PHASE(7)
    } else {
      // Turns: warpgroup 0 goes first; each turn hands over to the other warpgroup, whose barrier-1 side (warpgroup
      // 1's initial arrive plus one per turn but its last) counts the same as warpgroup 0's turns.
      if (tiles > 0) {
        float s[kTileKeys / 8][4];
#pragma unroll
        for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        if (warpgroup == 1) sm90::named_arrive(kTurnBarrier, kConsumerThreads);
        sm90::mbarrier_wait(&k_full[0], 0);
        ATTNKIT_PHASE(5)
        if (!solo) sm90::named_sync(kTurnBarrier + warpgroup, kConsumerThreads);
        scores_stage<kTileKeys>(
            s, tiles > 1 ? kTileKeys : last_keys,
            [&](float (&into)[kTileKeys / 8][4], int keys) {
              sm90::fence();
              issue_qk(0, into, keys);
              if (!solo && (warpgroup == 0 || tiles > 1)) {
                sm90::named_arrive(kTurnBarrier + (warpgroup ^ 1), kConsumerThreads);
              }
            },
            [] { sm90::wait<0>(); });
        sm90::pin(s);
        release(&k_empty[0]);
        softmax_tile(0, s);
        pack_p(s);
        ATTNKIT_PHASE(6)
      }
      for (int t = 1; t < tiles; ++t) {
        // This turn: S_t = Q K_tᵀ, then O = alpha O + P_{t-1} V_{t-1}; the softmax of tile t overlaps the latter
        // and the other warpgroup's turn.
        const int slot = t % kSlots;
        rescale();
        prepare_v(t - 1);
        sm90::mbarrier_wait(&k_full[slot], (t / kSlots) % 2);
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        if (!solo) sm90::named_sync(kTurnBarrier + warpgroup, kConsumerThreads);
        float s[kTileKeys / 8][4];
#pragma unroll
        for (int j = 0; j < kTileKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        scores_stage<kTileKeys>(
            s, t + 1 < tiles ? kTileKeys : last_keys,
            [&](float (&into)[kTileKeys / 8][4], int keys) {
              sm90::fence();
              issue_qk(t, into, keys);
              issue_pv(t - 1, kTileKeys);
              if (!solo && (warpgroup == 0 || t + 1 < tiles)) {
                sm90::named_arrive(kTurnBarrier + (warpgroup ^ 1), kConsumerThreads);
              }
            },
            [] { sm90::wait<1>(); });
        sm90::pin(s);
        release(&k_empty[slot]);
        softmax_tile(t, s);
        sm90::wait<0>();  // the previous tile's P V: its P registers and V slot are free again
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        sm90::pin(a);
        release(&v_empty[(t - 1) % kSlots]);
        pack_p(s);
      }
      ATTNKIT_PHASE(7)
      if (tiles > 0) {
        rescale();
        prepare_v(tiles - 1);
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        auto pv_stage = [&](int keys) {
          sm90::fence();
          issue_pv(tiles - 1, keys);
          sm90::wait<0>();
        };
        at_tile_keys<kTileKeys>(last_keys, pv_stage);
        pin_out();
        if constexpr (kSumsOnTensorCores) sm90::pin(sums);
        sm90::pin(a);
      }
    }
    ATTNKIT_PHASE(8)
    if constexpr (kSumsOnTensorCores) {
      row_sum[0] += sums[0][0];
      row_sum[1] += sums[0][2];
    }
    if constexpr (kPlain) {
      if (is_tail_piece(p, block)) {  // a key range of a split tail row block: its partial, for the merge pass
        for (int half = 0; half < 2; ++half) {
          if (r0 + half * 8 < rows) {
            const int columns = p.bucketed ? static_cast<int>(p.v_head_dim) : D;
            store_partial_row<D>(p.partial + ((block - p.tail_block) * kBlockRows + r0 + half * 8) * (3 + columns),
                                 half, o, row_max, row_sum, [](int) { return 1.0f; }, columns);
          }
        }
      } else {
        // Staged in the warp's own rows of the Q tile: its warpgroup's S MMAs, the only readers, are all complete
        // (the last P V above could not start before every warp of the warpgroup had waited for its last S).
        // Persistent: in the last tile's V slot, its P V complete, so that the next unit's Q is already landing.
        const int warp_row = (warp - 4) * 16;
        std::uint8_t* const stage = kPersistent ? vs + (ring + tiles - 1) % kSlots * kTileBytes : qs;
        finish_plain_rows<T, D, kBlockRows>(p, c, warp_row, rows, o, row_max, row_sum, [&](int r, int ch) {
          return stage + swizzled_chunk(kPersistent ? kTileKeys : kBlockRows, warp_row + r, ch);
        });
      }
    } else {
      // V's scales act on the output columns (sum p (v * s) = s sum p v).
      finish_rows<T, D, kBlockRows, false, true>(p, c, tables, block, r0, rows, o, row_max, row_sum, [&](int col) {
        return kQuantized ? core::kv_scale_at(p.v_scale, p.v_quant, c.kvh, D, col) : 1.0f;
      });
    }
    if constexpr (!kPersistent) {
      break;
    } else {
      sm90::fence_proxy_async();  // the staging's generic accesses before the TMA's next copy into the slot
      release(&v_empty[(ring + tiles - 1) % kSlots]);
      if ((block += gridDim.x) >= p.block_end) break;
      c = plain_block_coord(p, block);
      first_row = c.row_block * kBlockRows;
      rows = static_cast<int>(min64(kBlockRows, p.group_rows - first_row));
      ring += tiles;
#pragma unroll
      for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
      sums[0][0] = sums[0][1] = sums[0][2] = sums[0][3] = 0.0f;
      row_max[0] = row_max[1] = core::kNegInf;
      row_sum[0] = row_sum[1] = 0.0f;
      alpha[0] = alpha[1] = 1.0f;
      sm90::mbarrier_wait(q_full, (unit + 1) % 2);
    }
  }
  ATTNKIT_PHASE(9)
  ATTNKIT_PHASES_PRINT("wgmma", 128)
#else
  (void)p;
  (void)maps;
  __trap();  // built for another GPU: the host never launches it there (warpgroup kernels need compute 9.0)
#endif
}

}  // namespace
}  // namespace attnkit::cuda
