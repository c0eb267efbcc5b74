// Random append_kv cases for the CPU and CUDA tests: new rows of random bits, caches poisoned with a pattern,
// pages in a random order, and the expected caches computed here, apart from the library (row by row, from the
// rule of include/attnkit/kv_append.hpp).
#pragma once

#include <attnkit/kv_append.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace attnkit::testing {

enum class CacheKind { PagedNhd, PagedHnd, Dense };

struct AppendCase {
  KvAppendProblem p;
  std::vector<std::byte> k_new, v_new, k_cache, v_cache;
  std::vector<std::int32_t> block_table, positions, new_lengths;
  std::string name;

  // batch entries each append up to new_len rows (fewer where ragged) at random positions of a cache of
  // `pages_per_seq` pages of `page_size` rows (dense: that many rows per entry).
  AppendCase(CacheKind kind, DType dtype, std::int64_t batch, std::int64_t kv_heads, std::int64_t new_len,
             std::int64_t head_dim, std::int64_t v_head_dim, std::int64_t page_size, std::int64_t pages_per_seq,
             bool ragged, unsigned seed) {
    std::mt19937 rng(seed);
    p.dtype = dtype;
    p.batch = batch;
    p.kv_heads = kv_heads;
    p.new_len = new_len;
    p.head_dim = head_dim;
    p.v_head_dim = v_head_dim;
    // New rows positions-first, padded by 3 elements per row (odd strides: the element path on CUDA where 3 breaks
    // 16-byte rows).
    const auto rows_layout = [&](std::int64_t dim) {
      const std::int64_t row = kv_heads * (dim + 3);
      return Layout{1, new_len * row, dim + 3, row};
    };
    p.k_new = rows_layout(head_dim);
    p.v_new = rows_layout(v_head_dim);
    const std::int64_t rows_per_entry = page_size * pages_per_seq;
    if (kind == CacheKind::Dense) {
      p.capacity = rows_per_entry;
      p.k_cache = Layout::head_first(kv_heads, p.capacity, head_dim);
      p.v_cache = Layout::head_first(kv_heads, p.capacity, v_head_dim);
    } else {
      p.page_size = page_size;
      p.max_pages_per_seq = pages_per_seq;
      p.num_pages = batch * pages_per_seq + 3;  // some pages no entry uses
      const bool nhd = kind == CacheKind::PagedNhd;
      p.k_cache = nhd ? Layout::positions_first(kv_heads, page_size, head_dim) : Layout::head_first(kv_heads, page_size, head_dim);
      p.v_cache = nhd ? Layout::positions_first(kv_heads, page_size, v_head_dim) : Layout::head_first(kv_heads, page_size, v_head_dim);
      std::vector<std::int32_t> pages(static_cast<std::size_t>(p.num_pages));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      block_table.assign(pages.begin(), pages.begin() + batch * pages_per_seq);
    }
    const std::size_t elem = dtype_size(dtype);
    const auto random_bytes = [&](std::int64_t elements) {
      std::vector<std::byte> v(static_cast<std::size_t>(elements) * elem);
      for (std::byte& b : v) b = static_cast<std::byte>(rng() & 0xFF);
      return v;
    };
    k_new = random_bytes(1 + batch * p.k_new.batch_stride);
    v_new = random_bytes(1 + batch * p.v_new.batch_stride);
    const std::int64_t leading = kind == CacheKind::Dense ? batch : p.num_pages;
    k_cache.assign(static_cast<std::size_t>(leading * p.k_cache.batch_stride) * elem, std::byte{0xA5});
    v_cache.assign(static_cast<std::size_t>(leading * p.v_cache.batch_stride) * elem, std::byte{0x5A});
    p.has_new_lengths = ragged;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t rows = ragged ? static_cast<std::int64_t>(rng() % (new_len + 1)) : new_len;
      if (ragged) new_lengths.push_back(static_cast<std::int32_t>(rows));
      positions.push_back(static_cast<std::int32_t>(rng() % (rows_per_entry - rows + 1)));
    }
    name = std::string(kind == CacheKind::Dense ? "dense" : kind == CacheKind::PagedNhd ? "NHD" : "HND") + " " +
           std::string(dtype_name(dtype)) + " b" + std::to_string(batch) + " h" + std::to_string(kv_heads) + " n" +
           std::to_string(new_len) + " d" + std::to_string(head_dim) + "/" + std::to_string(v_head_dim) + " page " +
           std::to_string(page_size) + (ragged ? " ragged" : "");
  }

  KvAppendArgs args() {
    const std::size_t elem = dtype_size(p.dtype);
    KvAppendArgs a;
    a.k_new = {k_new.data(), static_cast<std::int64_t>(k_new.size() / elem)};
    a.v_new = {v_new.data(), static_cast<std::int64_t>(v_new.size() / elem)};
    a.k_cache = {k_cache.data(), static_cast<std::int64_t>(k_cache.size() / elem)};
    a.v_cache = {v_cache.data(), static_cast<std::int64_t>(v_cache.size() / elem)};
    if (!block_table.empty()) a.block_table = {block_table.data(), static_cast<std::int64_t>(block_table.size())};
    a.positions = {positions.data(), static_cast<std::int64_t>(positions.size())};
    if (p.has_new_lengths) a.new_lengths = {new_lengths.data(), static_cast<std::int64_t>(new_lengths.size())};
    return a;
  }

  // The caches after the append, by the rule; `skip` entries write nothing (out-of-range device values).
  void expected(std::vector<std::byte>& k, std::vector<std::byte>& v, const std::vector<bool>& skip = {}) const {
    k = k_cache;
    v = v_cache;
    const std::size_t elem = dtype_size(p.dtype);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      if (!skip.empty() && skip[static_cast<std::size_t>(b)]) continue;
      const std::int64_t rows = p.has_new_lengths ? new_lengths[static_cast<std::size_t>(b)] : p.new_len;
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t pos = positions[static_cast<std::size_t>(b)] + r;
        const std::int64_t lead = p.page_size == 0 ? b : block_table[static_cast<std::size_t>(b * p.max_pages_per_seq + pos / p.page_size)];
        const std::int64_t row = p.page_size == 0 ? pos : pos % p.page_size;
        for (std::int64_t h = 0; h < p.kv_heads; ++h) {
          std::memcpy(&k[static_cast<std::size_t>(p.k_cache.index(lead, h, row)) * elem],
                      &k_new[static_cast<std::size_t>(p.k_new.index(b, h, r)) * elem], static_cast<std::size_t>(p.head_dim) * elem);
          std::memcpy(&v[static_cast<std::size_t>(p.v_cache.index(lead, h, row)) * elem],
                      &v_new[static_cast<std::size_t>(p.v_new.index(b, h, r)) * elem], static_cast<std::size_t>(p.v_head_dim) * elem);
        }
      }
    }
  }
};

// The cases both tests run: every cache kind and dtype; decode (1 row), prefill chunks over page boundaries,
// ragged appends, unequal K and V dims, odd dims (no 16-byte rows), pages of 1 and non-powers of two.
inline std::vector<AppendCase> append_cases() {
  std::vector<AppendCase> cases;
  unsigned seed = 1;
  for (CacheKind kind : {CacheKind::PagedNhd, CacheKind::PagedHnd, CacheKind::Dense}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      cases.emplace_back(kind, t, 3, 2, 1, 64, 64, 16, 4, false, seed++);
      cases.emplace_back(kind, t, 2, 3, 37, 40, 24, 16, 5, true, seed++);
      cases.emplace_back(kind, t, 4, 1, 9, 7, 7, 3, 6, false, seed++);
      cases.emplace_back(kind, t, 2, 2, 5, 128, 128, 1, 12, true, seed++);
    }
  }
  return cases;
}

}  // namespace attnkit::testing
