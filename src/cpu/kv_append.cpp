#include "kv_append.hpp"

#include "../core/kv_append_rows.hpp"
#include "../gqa/head_row.hpp"
#include "../gqa/kv_cache.hpp"

#include <cstddef>
#include <cstring>

namespace attnkit::cpu {
namespace {

// Where the appended rows go: the cache's bytes, its storage and (quantized) scales.
struct CacheSide {
  std::byte* data;
  Layout layout;
  gqa::CacheFormat format;
  const float* scales;  // quantized: 1 or kv_heads * head_size

  // Byte address of value `index` (int4: an even index, two values per byte).
  std::byte* at(std::int64_t index) const {
    switch (format.storage.type) {
      case KvType::Int8: return data + index;
      case KvType::Int4: return data + index / 2;
      case KvType::Float: break;
    }
    return data + index * static_cast<std::int64_t>(dtype_size(format.dtype));
  }
  const float* head_scales(std::int64_t h) const {
    if (format.storage.type == KvType::Float) return nullptr;
    return format.storage.quant == KvQuant::PerChannel ? scales + h * format.head_size : scales;
  }
};

// The new rows of one side, and what they go through on the way: nothing (a byte copy into a cache of their own
// type), or the GQA op's steps (rotary on K, rounding) and its store (quantized or rounded).
struct RowSource {
  const std::byte* data;
  Layout layout;
  gqa::HeadRowSteps steps;
  bool as_given;  // no rotary and a float cache: the bytes are copied
};

class Appender {
 public:
  Appender(const KvAppendProblem& p, const KvAppendArgs& a)
      : p_(p),
        g_(core::append_geometry(p)),
        positions_(static_cast<const std::int32_t*>(a.positions.data)),
        table_(static_cast<const std::int32_t*>(a.block_table.data)),
        tables_{a.cos_cache.data, a.sin_cache.data, p.dtype, p.rotary_dim / 2, p.rotary_interleaved} {}

  // Rows [0, rows) of entry b, head h, from `src` into `dst`.
  void append(const RowSource& src, const CacheSide& dst, std::int64_t b, std::int64_t h, std::int64_t rows) {
    const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p_.dtype));
    const float* scales = dst.head_scales(h);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t position = positions_[b] + r;
      const core::CacheRow to = core::append_target(g_, table_, b, position);
      std::byte* out = dst.at(dst.layout.index(to.leading, h, to.row));
      if (src.as_given) {
        std::memcpy(out, src.data + src.layout.index(b, h, r) * elem, static_cast<std::size_t>(dst.format.row_bytes()));
        continue;
      }
      gqa::prepare_head_row(src.steps, src.data, src.layout.index(b, h, r), position, row_);
      gqa::store_row(row_, dst.format, scales, out);
    }
  }

  const gqa::RotaryTables* rotary() const { return p_.rotary_dim > 0 ? &tables_ : nullptr; }

 private:
  const KvAppendProblem& p_;
  core::KvAppendGeometry g_;
  const std::int32_t* positions_;
  const std::int32_t* table_;
  gqa::RotaryTables tables_;
  float row_[256];  // one prepared row (head dims are at most 256)
};

}  // namespace

void append_kv(const KvAppendProblem& p, const KvAppendArgs& a) {
  Appender appender(p, a);
  const auto* lengths = static_cast<const std::int32_t*>(a.new_lengths.data);
  const CacheSide k_cache{static_cast<std::byte*>(a.k_cache.data), p.k_cache, {p.k_storage, p.dtype, p.head_dim},
                          static_cast<const float*>(a.k_scale.data)};
  const CacheSide v_cache{static_cast<std::byte*>(a.v_cache.data), p.v_cache, {p.v_storage, p.dtype, p.v_head_dim},
                          static_cast<const float*>(a.v_scale.data)};
  const RowSource k_new{static_cast<const std::byte*>(a.k_new.data), p.k_new,
                        {p.dtype, p.head_dim, nullptr, 0.0f, appender.rotary()},
                        p.rotary_dim == 0 && p.k_storage.type == KvType::Float};
  const RowSource v_new{static_cast<const std::byte*>(a.v_new.data), p.v_new, {p.dtype, p.v_head_dim},
                        p.v_storage.type == KvType::Float};
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t rows = lengths != nullptr ? lengths[b] : p.new_len;
    if (rows == 0) continue;  // (then the head loop, of a head count the checks bound only by the cache it fills)
    for (std::int64_t h = 0; h < p.kv_heads; ++h) {
      appender.append(k_new, k_cache, b, h, rows);
      appender.append(v_new, v_cache, b, h, rows);
    }
  }
}

}  // namespace attnkit::cpu
