// The KV cache unit (see kv_cache.hpp): row formats, quantizing stores, and the append of one head.
#include "kv_cache.hpp"

#include <cstring>

#include "../core/kv_quant.hpp"

namespace attnkit::gqa {

std::int64_t CacheFormat::row_values() const {
  return storage.type == KvType::Int4 ? (head_size + 1) / 2 * 2 : head_size;
}

std::int64_t CacheFormat::row_bytes() const {
  switch (storage.type) {
    case KvType::Int8: return head_size;
    case KvType::Int4: return (head_size + 1) / 2;
    case KvType::Float: break;
  }
  return head_size * static_cast<std::int64_t>(dtype_size(dtype));
}

std::int64_t CacheFormat::last_dim() const { return storage.type == KvType::Int4 ? (head_size + 1) / 2 : head_size; }

Layout CacheTensor::layout() const {
  const std::int64_t row = format.row_values();
  return Layout{0, kv_heads * capacity * row, capacity * row, row};
}

const float* CacheTensor::head_scales(std::int64_t h) const {
  if (format.storage.type == KvType::Float) return nullptr;
  return format.storage.quant == KvQuant::PerChannel ? scales + h * format.head_size : scales;
}

void store_row(const float* x, const CacheFormat& format, const float* scales, std::byte* dst) {
  const std::int64_t n = format.head_size;
  const bool per_channel = format.storage.quant == KvQuant::PerChannel;
  auto inverse = [&](std::int64_t d) { return core::inverse_scale(per_channel ? scales[d] : scales[0]); };
  switch (format.storage.type) {
    case KvType::Float:
      if (format.dtype == DType::f32) {
        std::memcpy(dst, x, static_cast<std::size_t>(n) * sizeof(float));
        return;
      }
      for (std::int64_t d = 0; d < n; ++d) store_from_float(dst, format.dtype, d, x[d]);
      return;
    case KvType::Int8: {
      auto* q = reinterpret_cast<std::int8_t*>(dst);
      for (std::int64_t d = 0; d < n; ++d) {
        q[d] = static_cast<std::int8_t>(core::quantize_value(x[d], inverse(d), core::kInt8Min, core::kInt8Max));
      }
      return;
    }
    case KvType::Int4: {
      auto* bytes = reinterpret_cast<std::uint8_t*>(dst);
      for (std::int64_t d = 0; d < n; d += 2) {
        const int even = core::quantize_value(x[d], inverse(d), core::kInt4Min, core::kInt4Max);
        // An odd head size pads its last byte with the value zero (what ONNX Runtime's packer does).
        const int odd = d + 1 < n ? core::quantize_value(x[d + 1], inverse(d + 1), core::kInt4Min, core::kInt4Max) : 0;
        bytes[d / 2] = core::int4_pack(even, odd);
      }
      return;
    }
  }
}

void zero_rows(std::byte* dst, const CacheFormat& format, std::int64_t count) {
  if (count <= 0) return;
  const std::size_t bytes = static_cast<std::size_t>(count * format.row_bytes());
  // Every float type's zero and int8's zero are all-zero bytes; int4's zero is the biased nibble 8.
  std::memset(dst, format.storage.type == KvType::Int4 ? core::kInt4ZeroByte : 0, bytes);
}

void append_head(const CacheTensor* past, const CacheTensor& present, bool shared, const HeadAppend& rows,
                 std::int64_t b, std::int64_t h, const std::function<void(std::int64_t s, float* row)>& new_row,
                 float* scratch_row, const std::function<const void*(std::int64_t s)>& raw_row) {
  const std::int64_t row_bytes = present.format.row_bytes();
  const std::int64_t kept = rows.past_rows - rows.drop;
  std::byte* head = present.row(b, h, 0);
  if (kept > 0) {
    const std::byte* src = (shared ? present : *past).row(b, h, rows.drop);
    if (!shared) {
      std::memcpy(head, src, static_cast<std::size_t>(kept * row_bytes));
    } else if (rows.drop > 0) {  // a full window cache: slide the kept rows to the front (ranges overlap)
      std::memmove(head, src, static_cast<std::size_t>(kept * row_bytes));
    }
  }
  const float* scales = present.head_scales(h);
  const bool copy_bytes = raw_row && present.format.storage.type == KvType::Float;
  for (std::int64_t s = 0; s < rows.new_rows; ++s) {
    if (copy_bytes) {
      std::memcpy(present.row(b, h, rows.write_row + s), raw_row(s), static_cast<std::size_t>(row_bytes));
      continue;
    }
    new_row(s, scratch_row);
    store_row(scratch_row, present.format, scales, present.row(b, h, rows.write_row + s));
  }
  if (!shared) {
    const std::int64_t end = rows.write_row + rows.new_rows;
    zero_rows(present.row(b, h, end), present.format, present.capacity - end);
  }
}

}  // namespace attnkit::gqa
