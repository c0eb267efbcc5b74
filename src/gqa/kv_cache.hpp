// The KV cache of the GQA op: a BNSH tensor [batch, kv_heads, capacity, row] of float rows (the query's
// type) or quantized rows (int8, or int4 packed two per byte: core/kv_quant.hpp), and the one operation the
// op does to it per call: append this call's rows for one (batch entry, kv head), in one of three modes.
//
//   shared buffer   past and present are the same memory: the new rows go to rows [past, past + S); no other
//                   row moves (a window cache first slides its kept rows to the front when it is full).
//   separate        the kept past rows are copied, the new rows appended, every row after them zeroed (the
//                   value zero: byte 0x88 for int4), so the present tensor is fully defined.
//   window cache    (sliding_window_cache) a fixed number of rows that drops its oldest from the front.
#pragma once

#include <attnkit/attention.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace attnkit::gqa {

// How one cache tensor stores a row of `head_size` values.
struct CacheFormat {
  KvStorage storage;         // Float (dtype), or Int8 / Int4 with its quantization
  DType dtype = DType::f32;  // the float type (Float storage)
  std::int64_t head_size = 0;

  // Values one row spans in the buffer: head_size, or head_size rounded up to even for int4 (a whole byte).
  std::int64_t row_values() const;
  std::int64_t row_bytes() const;
  // Bytes of the buffer's last dimension: head_size elements, or (head_size + 1) / 2 bytes for int4.
  std::int64_t last_dim() const;
};

struct CacheTensor {
  std::byte* data = nullptr;  // const for a past cache (never written through unless shared)
  CacheFormat format;
  std::int64_t kv_heads = 0;
  std::int64_t capacity = 0;      // rows per head (dimension 2)
  const float* scales = nullptr;  // quantized: 1 or kv_heads * head_size float32 scales

  std::byte* row(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return data + ((b * kv_heads + h) * capacity + r) * format.row_bytes();
  }
  // The element layout the attention core reads this cache through (values; int4 rows are whole bytes).
  Layout layout() const;
  // The first scale of kv head h (null for a float cache).
  const float* head_scales(std::int64_t h) const;
};

// Stores one row of head_size floats: rounded to the float type, or quantized with the head's scales
// (`scales` from head_scales).
void store_row(const float* x, const CacheFormat& format, const float* scales, std::byte* dst);
// Fills `count` rows with the value zero.
void zero_rows(std::byte* dst, const CacheFormat& format, std::int64_t count);

// One (batch entry, kv head) of an append.
struct HeadAppend {
  std::int64_t past_rows = 0;  // rows of the past cache holding tokens
  std::int64_t drop = 0;       // of those, the oldest ones evicted (a full window cache)
  std::int64_t write_row = 0;  // present row of new row 0 (= past_rows - drop)
  std::int64_t new_rows = 0;   // S
};

// Appends for batch entry b, kv head h: keeps past rows [drop, past_rows) as present rows [0, ...), writes new
// row s (from `new_row`, which fills head_size floats) at present row write_row + s, and, with separate
// buffers, zeroes the rows after them. `past` is null or the same memory as `present` for a shared buffer.
// `raw_row`, when given, says where new row s already lies in the float cache's own element type (a row that
// needs no norm or rotary): its bytes are copied, with no round trip through float32.
void append_head(const CacheTensor* past, const CacheTensor& present, bool shared, const HeadAppend& rows,
                 std::int64_t b, std::int64_t h, const std::function<void(std::int64_t s, float* row)>& new_row,
                 float* scratch_row, const std::function<const void*(std::int64_t s)>& raw_row = nullptr);

}  // namespace attnkit::gqa
