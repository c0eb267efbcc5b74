#include "kv_append.hpp"

#include "../core/kv_append_rows.hpp"

#include <cstddef>
#include <cstring>

namespace attnkit::cpu {

void append_kv(const KvAppendProblem& p, const KvAppendArgs& a) {
  const core::KvAppendGeometry g = core::append_geometry(p);
  const auto* positions = static_cast<const std::int32_t*>(a.positions.data);
  const auto* lengths = static_cast<const std::int32_t*>(a.new_lengths.data);
  const auto* table = static_cast<const std::int32_t*>(a.block_table.data);
  const std::size_t elem = dtype_size(p.dtype);
  const auto copy_rows = [&](const Layout& from, const void* src, const Layout& to, void* dst, std::int64_t dim,
                             std::int64_t b, std::int64_t h, std::int64_t rows) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const core::CacheRow at = core::append_target(g, table, b, positions[b] + r);
      std::memcpy(static_cast<std::byte*>(dst) + to.index(at.leading, h, at.row) * elem,
                  static_cast<const std::byte*>(src) + from.index(b, h, r) * elem, static_cast<std::size_t>(dim) * elem);
    }
  };
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t rows = lengths != nullptr ? lengths[b] : p.new_len;
    if (rows == 0) continue;  // (then the head loop, of a head count the checks bound only by the cache it fills)
    for (std::int64_t h = 0; h < p.kv_heads; ++h) {
      copy_rows(p.k_new, a.k_new.data, p.k_cache, a.k_cache.data, p.head_dim, b, h, rows);
      copy_rows(p.v_new, a.v_new.data, p.v_cache, a.v_cache.data, p.v_head_dim, b, h, rows);
    }
  }
}

}  // namespace attnkit::cpu
