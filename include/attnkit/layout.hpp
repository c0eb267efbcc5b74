// Where each element of a [batch, heads, rows, cols] tensor lives in its buffer.
#pragma once

#include <cstdint>

namespace attnkit {

// Element offset plus batch, head and row strides, all in elements. The `cols` elements of one row are
// contiguous. A stride of 0 broadcasts (one mask for every head, one K/V for every batch entry).
struct Layout {
  std::int64_t offset = 0;
  std::int64_t batch_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t row_stride = 0;

  // Plain int64 arithmetic: in range for every (b, h, row) of a problem Attention accepted (its checks bound each
  // layout's highest index below 2^63; docs/safety.md). The helpers below multiply their extents unchecked.
  constexpr std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t row) const {
    return offset + b * batch_stride + h * head_stride + row * row_stride;
  }

  // [batch, heads, rows, cols]: what attention kernels and caches keep.
  static constexpr Layout head_first(std::int64_t heads, std::int64_t rows, std::int64_t cols) {
    return {0, heads * rows * cols, rows * cols, cols};
  }
  // [batch, rows, heads, cols]: what a linear projection leaves.
  static constexpr Layout positions_first(std::int64_t heads, std::int64_t rows, std::int64_t cols) {
    return {0, rows * heads * cols, cols, heads * cols};
  }
  // Q, K and V slices of one packed projection [batch, rows, (heads + 2 * kv_heads) * dim], laid out per
  // token as [Q heads | K heads | V heads].
  static constexpr Layout packed_qkv_q(std::int64_t heads, std::int64_t kv_heads, std::int64_t rows,
                                       std::int64_t dim) {
    const std::int64_t token = (heads + 2 * kv_heads) * dim;
    return {0, rows * token, dim, token};
  }
  static constexpr Layout packed_qkv_k(std::int64_t heads, std::int64_t kv_heads, std::int64_t rows,
                                       std::int64_t dim) {
    Layout l = packed_qkv_q(heads, kv_heads, rows, dim);
    l.offset = heads * dim;
    return l;
  }
  static constexpr Layout packed_qkv_v(std::int64_t heads, std::int64_t kv_heads, std::int64_t rows,
                                       std::int64_t dim) {
    Layout l = packed_qkv_q(heads, kv_heads, rows, dim);
    l.offset = (heads + kv_heads) * dim;
    return l;
  }
  // An additive mask [mask_batch, mask_heads, mask_rows, k_len]; a dimension of size 1 broadcasts (stride 0).
  static constexpr Layout mask(std::int64_t mask_batch, std::int64_t mask_heads, std::int64_t mask_rows,
                               std::int64_t k_len) {
    const std::int64_t row = mask_rows > 1 ? k_len : 0;
    const std::int64_t head = mask_heads > 1 ? mask_rows * k_len : 0;
    const std::int64_t batch = mask_batch > 1 ? mask_heads * mask_rows * k_len : 0;
    return {0, batch, head, row};
  }
  // Per-row float32 values (the log-sum-exp output) [batch, heads, rows].
  static constexpr Layout rows_only(std::int64_t heads, std::int64_t rows) { return {0, heads * rows, rows, 1}; }
};

}  // namespace attnkit
