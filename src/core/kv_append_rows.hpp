// Where append_kv puts each new row, and which entries' values are in range: one rule for the CPU (which checks
// the values before writing) and the CUDA kernel (which reads them on the device and skips a bad entry).
#pragma once

#include "portable.hpp"

#include <attnkit/kv_append.hpp>

#include <cstdint>

namespace attnkit::core {

// What the rule needs of a normalised KvAppendProblem (plain values: a kernel parameter).
struct KvAppendGeometry {
  std::int64_t new_len = 0;
  std::int64_t page_size = 0;  // 0: dense
  std::int64_t num_pages = 0;
  std::int64_t max_pages_per_seq = 0;
  std::int64_t capacity = 0;  // rows per entry: max_pages_per_seq * page_size, or the dense capacity
  bool rotary = false;
  std::int64_t rotary_positions = 0;  // rows of the cos / sin caches (rotary only)
};

inline KvAppendGeometry append_geometry(const KvAppendProblem& p) {  // (p normalised: capacity set)
  return {p.new_len, p.page_size, p.num_pages, p.max_pages_per_seq, p.capacity, p.rotary_dim > 0, p.rotary_positions};
}

// The entry's rows [first, first + rows) have cos / sin rows (first >= 0 and rows > 0 checked before).
ATTNKIT_HD bool append_rotary_in_range(const KvAppendGeometry& g, std::int64_t first, std::int64_t rows) {
  return !g.rotary || first + rows <= g.rotary_positions;
}

// Entry b's rows [first, first + rows) are in range: first >= 0, rows in [0, new_len], first + rows <= capacity
// (and <= rotary_positions with rotary), and (paged) every block-table entry those rows reach in [0, num_pages). An entry of no rows is always valid.
// first and rows are the int32 values the caller gave; int64 arithmetic here cannot overflow.
ATTNKIT_HD bool append_entry_valid(const KvAppendGeometry& g, const std::int32_t* block_table, std::int64_t b,
                                   std::int64_t first, std::int64_t rows) {
  if (rows < 0 || rows > g.new_len) return false;
  if (rows == 0) return true;
  if (first < 0 || first + rows > g.capacity || !append_rotary_in_range(g, first, rows)) return false;
  if (g.page_size == 0) return true;
  const std::int32_t* table = block_table + b * g.max_pages_per_seq;
  for (std::int64_t j = first / g.page_size; j <= (first + rows - 1) / g.page_size; ++j) {
    if (table[j] < 0 || table[j] >= g.num_pages) return false;
  }
  return true;
}

// The (leading index, row) of the cache that position `pos` of entry b is: (page, row in page) when paged, else
// (b, pos). For a valid entry only.
struct CacheRow {
  std::int64_t leading, row;
};
ATTNKIT_HD CacheRow append_target(const KvAppendGeometry& g, const std::int32_t* block_table, std::int64_t b,
                                  std::int64_t pos) {
  if (g.page_size == 0) return {b, pos};
  return {block_table[b * g.max_pages_per_seq + pos / g.page_size], pos % g.page_size};
}

}  // namespace attnkit::core
