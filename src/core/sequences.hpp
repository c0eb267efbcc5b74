// Where one batch entry's rows are: its query count, key length and visibility rule, and the element index of
// each of its Q/O/lse rows and K/V rows, for dense, ragged (packed) and paged batches alike. Every backend and the
// reference read rows through this one accessor, so the sequence rules are written once.
#pragma once

#include "portable.hpp"
#include "visibility.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/layout.hpp>

#include <cstdint>
#include <limits>

namespace attnkit::core {

// One batch entry as the kernels see it.
struct SequenceRows {
  std::int64_t queries = 0;     // query rows of this entry
  std::int64_t first_query = 0; // packed row of its query 0 (ragged queries), else 0
  std::int64_t key_length = 0;  // keys it has
  std::int64_t first_key = 0;   // packed row of its key 0 (ragged keys), else 0
  VisibilityRule rule;          // with this entry's causal offset
};

// A plain struct of the problem's sequence fields and the run's int32 arrays (host or device memory, read only
// where the rows are).
struct SequenceAccess {
  std::int64_t q_len = 0;  // the longest (every entry's, when not ragged)
  std::int64_t k_len = 0;
  bool ragged_q = false;
  bool ragged_k = false;
  std::int64_t page_size = 0;  // 0: not paged
  std::int64_t max_pages_per_seq = 0;
  VisibilityRule rule;  // the problem's (its offset unused when per_sequence_causal)
  bool per_sequence_causal = false;  // ragged or paged: bottom-right per sequence
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  const std::int32_t* block_table = nullptr;
  const std::int32_t* key_lengths = nullptr;
  const std::int32_t* causal_offsets = nullptr;

  ATTNKIT_HD bool paged() const { return page_size > 0; }

  ATTNKIT_HD SequenceRows rows_of(std::int64_t b) const {
    SequenceRows s;
    s.queries = q_len;
    if (ragged_q) {
      s.first_query = cu_seqlens_q[b];
      s.queries = cu_seqlens_q[b + 1] - s.first_query;
    }
    s.key_length = key_lengths != nullptr ? key_lengths[b] : k_len;
    if (ragged_k) {
      s.first_key = cu_seqlens_k[b];
      s.key_length = cu_seqlens_k[b + 1] - s.first_key;
    }
    s.rule = rule;
    if (per_sequence_causal) s.rule.causal_offset = s.key_length - s.queries;
    if (causal_offsets != nullptr) s.rule.causal_offset = causal_offsets[b];
    return s;
  }

  // Element index of column 0 of query row i of head h (Q, O: their layouts; lse: its layout, column 0). L: any
  // layout with index(b, h, row) (attnkit::Layout, or a backend's device copy of it).
  template <class L>
  ATTNKIT_HD std::int64_t query_index(const L& l, const SequenceRows& s, std::int64_t b, std::int64_t h,
                                      std::int64_t i) const {
    return ragged_q ? l.index(0, h, s.first_query + i) : l.index(b, h, i);
  }
  // Element index of column 0 of key row j of K/V head kvh (K or V: its layout).
  template <class L>
  ATTNKIT_HD std::int64_t key_index(const L& l, const SequenceRows& s, std::int64_t b, std::int64_t kvh,
                                    std::int64_t j) const {
    if (paged()) {
      const std::int64_t page = block_table[b * max_pages_per_seq + j / page_size];
      return l.index(page, kvh, j % page_size);
    }
    return ragged_k ? l.index(0, kvh, s.first_key + j) : l.index(b, kvh, j);
  }
  // How many keys from j on lie at one row stride apart from key j (the rest of its page; all when not paged).
  ATTNKIT_HD std::int64_t keys_in_run(std::int64_t j) const {
    return paged() ? page_size - j % page_size : std::numeric_limits<std::int64_t>::max();
  }
};

// The accessor of a normalised problem and a run's arrays.
inline SequenceAccess sequence_access(const AttentionProblem& p, const AttentionArgs& a) {
  SequenceAccess s;
  s.q_len = p.q_len;
  s.k_len = p.k_len;
  s.ragged_q = p.sequences.ragged_q;
  s.ragged_k = p.sequences.ragged_k;
  s.page_size = p.sequences.page_size;
  s.max_pages_per_seq = p.sequences.max_pages_per_seq;
  s.rule = VisibilityRule{p.causal, p.causal_offset.value_or(0), p.window.value_or(0)};
  s.per_sequence_causal = p.sequences.any();
  s.cu_seqlens_q = static_cast<const std::int32_t*>(a.cu_seqlens_q.data);
  s.cu_seqlens_k = static_cast<const std::int32_t*>(a.cu_seqlens_k.data);
  s.block_table = static_cast<const std::int32_t*>(a.block_table.data);
  s.key_lengths = p.has_key_lengths ? static_cast<const std::int32_t*>(a.key_lengths.data) : nullptr;
  s.causal_offsets = p.has_causal_offsets ? static_cast<const std::int32_t*>(a.causal_offsets.data) : nullptr;
  return s;
}

}  // namespace attnkit::core
