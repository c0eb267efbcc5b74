// The CPU kernels' prefetches: the few-rows kernel's (few_rows_kernel.cpp and its vdpbf16ps scores,
// few_rows_bf16.cpp), rows asked for a few keys at a time while a tile's scores run, and the tiled kernel's, an
// item's query and output rows asked for when it starts.
#pragma once

#include <algorithm>
#include <cstdint>

namespace attnkit::cpu {

// Rows to ask the caches for while a tile's scores run, a few keys per group of keys: the tile's V rows (read after
// the scores, a few vectors of each row per pass, which the hardware prefetchers do not follow) and the next tile's
// K rows. Spread over the score loop, the requests overlap the arithmetic; issued in one burst they waited on each
// other (the core has a few dozen line fills in flight).
struct RowPrefetch {
  const void* const* rows[2] = {};
  std::int64_t n[2] = {};
  std::int64_t bytes[2] = {};
};

// One cache line into the L2 (the T2 hint): a tile's rows are as large as the L1, where they would evict the lines
// the tile reads now. An asm statement on x86-64: GCC 12 deletes a loop of __builtin_prefetch once it has inlined
// it from a function it found to have no side effects.
inline void prefetch_line(const char* line) {
#if defined(__x86_64__) && defined(__GNUC__)
  asm volatile("prefetcht2 %0" : : "m"(*line));
#else
  __builtin_prefetch(line, 0, 1);
#endif
}

// Calls ask(line) for every cache line of `bytes` bytes from `row`.
template <class Ask>
inline void for_each_line(const void* row, std::int64_t bytes, Ask ask) {
  constexpr std::uintptr_t kLine = 64;
  const auto start = reinterpret_cast<std::uintptr_t>(row);
  const std::uintptr_t end = start + static_cast<std::uintptr_t>(bytes);
  for (std::uintptr_t line = start & ~(kLine - 1); line < end; line += kLine) ask(reinterpret_cast<const char*>(line));
}

inline void prefetch_row(const void* row, std::int64_t bytes) { for_each_line(row, bytes, prefetch_line); }

// One cache line, to be written soon (PREFETCHW: the line arrives owned, so the store does not wait on it).
inline void prefetch_line_for_write(const char* line) {
#if defined(__x86_64__) && defined(__GNUC__)
  asm volatile("prefetchw %0" : : "m"(*line));
#else
  __builtin_prefetch(line, 1, 3);
#endif
}

inline void prefetch_row_for_write(const void* row, std::int64_t bytes) {
  for_each_line(row, bytes, prefetch_line_for_write);
}

// The rows [j0, j1) of each list of pf.
inline void prefetch_keys(const RowPrefetch& pf, std::int64_t j0, std::int64_t j1) {
  for (int list = 0; list < 2; ++list) {
    for (std::int64_t j = j0; j < std::min(j1, pf.n[list]); ++j) prefetch_row(pf.rows[list][j], pf.bytes[list]);
  }
}

// The rows from j0 on of each list (after a tile's last group of keys: the next tile may hold more keys).
inline void prefetch_rest(const RowPrefetch& pf, std::int64_t j0) {
  prefetch_keys(pf, j0, std::max(pf.n[0], pf.n[1]));
}

}  // namespace attnkit::cpu
