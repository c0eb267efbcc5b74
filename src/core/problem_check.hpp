// The rules of the attention contract, checked once for every backend: a problem is normalised (defaults
// filled in) and checked when it is planned, and the buffers are checked before a run writes anything.
#pragma once

#include <attnkit/attention.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace attnkit::core {

// Fills every default (kv_heads, v_head_dim, scale, causal_offset) and checks every shape, layout and
// option rule. Throws Error naming the field and the rule.
AttentionProblem normalize_and_check(const AttentionProblem& problem);

// Rows each tensor holds per leading index: Q / O / lse are [batch, q_len] rows, or [1, total_q] when ragged; K / V
// [batch, k_len], [1, total_k] when ragged, [num_pages, page_size] when paged. (The spans the checks and the
// device backends' buffers cover.)
struct Extent {
  std::int64_t leading, rows;
};
inline Extent query_extent(const AttentionProblem& p) {
  return p.sequences.ragged_q ? Extent{1, p.sequences.total_q} : Extent{p.batch, p.q_len};
}
inline Extent key_extent(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  return s.paged() ? Extent{s.num_pages, s.page_size} : s.ragged_k ? Extent{1, s.total_k} : Extent{p.batch, p.k_len};
}

// Checks a run's buffers against a normalised problem: null pointers, extents, output/input overlap,
// key-length, cu_seqlens and block-table values (when `host_key_lengths`: a device backend checks them on the
// device), scratch size.
// Throws Error before anything is written.
void check_args(const AttentionProblem& problem, const AttentionArgs& args, std::size_t scratch_needed,
                bool host_key_lengths = true);

// Lowest and highest element index a layout reaches over [batch, heads, rows, cols] (cols contiguous), in checked
// arithmetic: throws Error naming `name`.<field> when the highest index does not fit int64.
struct IndexSpan {
  std::int64_t lowest = 0;
  std::int64_t highest = -1;  // highest < lowest: the tensor is empty
  bool empty() const { return highest < lowest; }
};
IndexSpan index_span(const Layout& layout, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                     std::int64_t cols, const std::string& name = "layout");

// The buffer rules, shared by the ops that take layouts (attention, append_kv); each throws Error naming `name`.
// Offsets and strides >= 0.
void check_layout_signs(const Layout& l, const std::string& name);
// An output gives every element its own address (sorted strides each step over the inner dimensions' span).
void check_no_self_overlap(const Layout& l, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                           std::int64_t cols, const std::string& name);
// A stated size within an address space, and every index of `span` below it (a non-empty span needs data).
void check_buffer(const char* name, const void* data, std::int64_t elements, std::int64_t bits, IndexSpan span);
// Whether two spans of elements of the given bits share a byte (128-bit arithmetic; null or empty: no).
bool bytes_overlap(const void* a, IndexSpan sa, std::int64_t abits, const void* b, IndexSpan sb, std::int64_t bbits);

// The rules of a K or V storage (fields `name`_storage.type / .quant): a float type has no quantization, a
// quantized one names its quantization, an int4 tensor's layout (`layout_name`) has even offset and strides (rows
// start on whole bytes).
void check_storage(const KvStorage& storage, const Layout& layout, const std::string& name,
                   const std::string& layout_name);
// A quantized tensor's float32 scales: present and enough of them (kv_scale_count); none for a float one.
void check_scales(const char* name, const ConstBuffer& buffer, KvQuant quant, std::int64_t kv_heads,
                  std::int64_t dim);

// The most CPU worker threads a config may ask for (each gets its own workspace).
inline constexpr int kMaxThreads = 1024;
// A config's `threads` (0: all cores) and `backend` (one of the enum's values); `prefix` names the struct.
void check_config(int threads, Backend backend, const std::string& prefix);

}  // namespace attnkit::core
