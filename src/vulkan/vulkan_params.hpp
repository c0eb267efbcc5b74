// The shaders' parameter block (shaders/common.glsl, `Params`), field for field: std140 lays 4-byte scalars
// one after another, so a plain struct of 4-byte fields matches it.
#pragma once

#include <cstdint>

namespace attnkit::vulkan {

struct ShaderLayout {
  std::uint32_t offset = 0, batch = 0, head = 0, row = 0;
};

struct ShaderParams {
  std::uint32_t batch, heads, kv_heads, q_len;
  std::uint32_t k_len, group, row_blocks, splits;
  std::uint32_t split_keys, causal, window, has_offsets;
  std::int32_t causal_offset;
  std::uint32_t has_key_lengths;
  float scale, softcap;
  std::uint32_t has_sink, masked_zero, has_lse, has_mask;
  std::uint32_t total_rows, workgroups, ragged_q, ragged_k;
  std::uint32_t page_size, max_pages_per_seq, per_sequence_causal, device_values;
  std::uint32_t total_q, total_k, num_pages, pad0;
  ShaderLayout q, k, v, o, mask, lse;
};
static_assert(sizeof(ShaderParams) == 32 * 4 + 6 * 16);

// The specialization constants (constant_id 0..5 of common.glsl, then the kernel's own).
struct SpecConstants {
  std::int32_t elem, mask_elem, head_dim, v_head_dim, tile_keys, sequences;
};

}  // namespace attnkit::vulkan
