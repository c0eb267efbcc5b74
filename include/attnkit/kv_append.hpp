// Appending new K/V rows to a cache: the update a serving loop runs before each attention call, for the paged
// caches (and dense caches) that AttentionProblem::sequences reads.
//
//   KvAppendProblem p;            // 2 sequences, 8 K/V heads, 1 new token each, pages of 16 keys
//   p.batch = 2; p.kv_heads = 8; p.new_len = 1; p.head_dim = 128; p.dtype = DType::bf16;
//   p.k_new = p.v_new = Layout::positions_first(8, 1, 128);        // [batch, new_len, kv_heads, dim]
//   p.page_size = 16; p.num_pages = 512; p.max_pages_per_seq = 64;
//   p.k_cache = p.v_cache = Layout::positions_first(8, 16, 128);   // [num_pages, page_size, kv_heads, dim]
//   append_kv(p, args);           // args: the rows, the caches, the block table, each entry's first position
//
// Row r of batch entry b goes to position positions[b] + r of that entry: in a paged cache, row
// (position % page_size) of page block_table[b * max_pages_per_seq + position / page_size]; in a dense cache
// (page_size 0), row `position` of entry b's cache ([batch, kv_heads, capacity, dim]).
//
// By default the rows are copied as they are (same element type). Two options make the call the cache update of
// the GroupQueryAttention op's pre-pass (src/gqa: the same code, the same bits):
//   rotary     (rotary_dim > 0) each new K row is rotated at its own position (positions[b] + r) by the cos / sin
//              caches ([rotary_positions, rotary_dim / 2], problem.dtype), interleaved or split-halves pairs, the
//              first rotary_dim values only, then rounded to problem.dtype; V is never rotated.
//   quantized  (k_storage / v_storage Int8 or Int4) a cache holds int8 or packed int4 values with float32 scales
//              (args.k_scale / v_scale, per tensor or per (kv head, channel)), quantized as rint(x * (1 / scale))
//              and clamped: what attnkit::attention reads with the same storage and scales (attention.hpp).
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>

namespace attnkit {

struct KvAppendProblem {
  DType dtype = DType::f32;  // of the new rows, the cos / sin caches and the float caches
  std::int64_t batch = 0;
  std::int64_t kv_heads = 0;
  std::int64_t new_len = 0;     // rows per batch entry (at most; new_lengths may say fewer per entry)
  std::int64_t head_dim = 0;    // K's
  std::int64_t v_head_dim = 0;  // V's; 0: head_dim
  // The new rows: [batch, kv_heads, new_len, dim] through the layouts (any strides, contiguous last dim).
  Layout k_new, v_new;
  // The caches. Paged (page_size > 0): batch_stride is the page stride, row_stride the step within a page
  // (NHD [num_pages, page_size, kv_heads, dim] or HND [num_pages, kv_heads, page_size, dim]), as
  // SequenceLayout's paged K/V. Dense (page_size == 0): [batch, kv_heads, capacity, dim] rows.
  Layout k_cache, v_cache;
  std::int64_t page_size = 0;  // 0: a dense cache of `capacity` rows per entry
  std::int64_t num_pages = 0;
  std::int64_t max_pages_per_seq = 0;
  std::int64_t capacity = 0;  // dense caches only
  bool has_new_lengths = false;  // args.new_lengths: entry b appends new_lengths[b] rows (in [0, new_len])
  // How each cache stores its rows (default: dtype), as AttentionProblem::k_storage / v_storage: layouts of an
  // Int4 cache count values (two per byte; offset and strides even), and so does its buffer's `elements`.
  KvStorage k_storage, v_storage;
  // Rotary on the new K rows: rotary_dim (even, in [2, head_dim]) values rotated, or 0 for none.
  std::int64_t rotary_dim = 0;
  bool rotary_interleaved = false;  // pairs (x[2i], x[2i + 1]); else (x[i], x[i + rotary_dim / 2])
  std::int64_t rotary_positions = 0;  // rows of the cos / sin caches: every appended position must be below it
};

struct KvAppendArgs {
  ConstBuffer k_new, v_new;      // problem.dtype
  MutableBuffer k_cache, v_cache;  // problem.dtype; written in place, only at the appended rows
  ConstBuffer block_table;       // int32 [batch * max_pages_per_seq], paged caches
  ConstBuffer positions;         // int32 [batch]: where each entry's first new row goes
  ConstBuffer new_lengths;       // int32 [batch], when problem.has_new_lengths
  ConstBuffer cos_cache, sin_cache;  // problem.dtype [rotary_positions, rotary_dim / 2], when rotary_dim > 0
  // float32 scales of a quantized cache: 1 (PerTensor) or kv_heads * head_dim (K) / kv_heads * v_head_dim (V),
  // indexed kv_head * dim + d (PerChannel); finite and > 0.
  ConstBuffer k_scale, v_scale;
  // Optional int32[1], CUDA: the first batch entry whose positions (capacity, or cos / sin rows), new length or
  // block-table entries are out of range, or -1 (device memory). Such an entry writes nothing.
  MutableBuffer status;
  void* stream = nullptr;  // CUDA: the cudaStream_t (null: the default stream)
};

// Copies the new rows into the caches. Every shape, layout and buffer rule is checked first (Error naming the
// field and the rule; nothing is written). Backend::Auto runs on CUDA when the buffers are device memory, else
// on the CPU. Host values (CPU) are checked before anything is written: a position below 0, a row past the
// entry's capacity (max_pages_per_seq * page_size, or capacity) or past the cos / sin caches' rows, a block-table
// entry it reaches outside [0, num_pages), or a scale not finite and > 0 is an Error. On CUDA the values live on the device and are never read back (the call captures in
// a CUDA graph): an entry with any such value writes nothing and is reported in args.status (scales are not
// checked there). Entries whose rows reach the same cache row (shared pages) race: which write lands there is
// unspecified.
void append_kv(const KvAppendProblem& problem, const KvAppendArgs& args, Backend backend = Backend::Auto);

}  // namespace attnkit
