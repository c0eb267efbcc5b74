#include "problem_check.hpp"
#include "checked_int.hpp"
#include "require.hpp"

#include "kv_quant.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

namespace attnkit::core {
namespace {

constexpr std::int64_t kMaxHeadDim = 256;

std::string str(std::int64_t v) { return std::to_string(v); }

}  // namespace

void check_layout_signs(const Layout& l, const std::string& name) {
  ATTNKIT_REQUIRE(l.offset >= 0, name + ".offset", "must be >= 0 (got " + str(l.offset) + ")");
  ATTNKIT_REQUIRE(l.batch_stride >= 0, name + ".batch_stride", "must be >= 0 (got " + str(l.batch_stride) + ")");
  ATTNKIT_REQUIRE(l.head_stride >= 0, name + ".head_stride", "must be >= 0 (got " + str(l.head_stride) + ")");
  ATTNKIT_REQUIRE(l.row_stride >= 0, name + ".row_stride", "must be >= 0 (got " + str(l.row_stride) + ")");
}

// An output must give every element its own address: sort the dimensions by stride and require each stride
// to step over everything the smaller dimensions span. (Sufficient, and what any dense or padded layout meets.)
void check_no_self_overlap(const Layout& l, std::int64_t batch, std::int64_t heads, std::int64_t rows,
                           std::int64_t cols, const std::string& name) {
  if (batch == 0 || heads == 0 || rows == 0 || cols == 0) return;
  struct Dim {
    std::int64_t extent, stride;
    const char* field;
  };
  std::array<Dim, 3> dims{Dim{batch, l.batch_stride, "batch_stride"}, Dim{heads, l.head_stride, "head_stride"},
                          Dim{rows, l.row_stride, "row_stride"}};
  std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  std::int64_t covered = cols;  // elements spanned by the dimensions below
  for (const Dim& d : dims) {
    if (d.extent == 1) continue;
    ATTNKIT_REQUIRE(d.stride >= covered, name + "." + d.field,
            "an output's elements must not share addresses: stride " + str(d.stride) + " is below the " +
                str(covered) + " elements the inner dimensions span");
    // Cannot overflow once the spans are checked (it is at most o's highest index - offset + 1); checked anyway.
    const std::optional<std::int64_t> reach = checked_mul(d.stride, d.extent - 1);
    const std::optional<std::int64_t> next = reach ? checked_add(*reach, covered) : std::nullopt;
    ATTNKIT_REQUIRE(next.has_value(), name + "." + d.field, "the layout's indices do not fit int64");
    covered = *next;
  }
}

namespace {

// Byte range [first, last) of a span of `bits`-bit elements (4-bit elements: a partly used byte counts), in
// 128-bit arithmetic: a span of an input nothing reads (K of a problem with no queries) is not bounded by its
// buffer, and an address plus its bytes may pass 2^64 without wrapping to a low address here.
struct ByteRange {
  unsigned __int128 first, last;
};
ByteRange byte_range(const void* base, IndexSpan s, std::int64_t bits) {
  const auto at = static_cast<unsigned __int128>(reinterpret_cast<std::uintptr_t>(base));
  const auto lowest = static_cast<unsigned __int128>(s.lowest);
  const auto end = static_cast<unsigned __int128>(s.highest) + 1;
  const auto b = static_cast<unsigned __int128>(bits);
  return {at + lowest * b / 8, at + (end * b + 7) / 8};
}

}  // namespace

bool bytes_overlap(const void* a, IndexSpan sa, std::int64_t abits, const void* b, IndexSpan sb, std::int64_t bbits) {
  if (a == nullptr || b == nullptr || sa.empty() || sb.empty()) return false;
  const ByteRange ra = byte_range(a, sa, abits);
  const ByteRange rb = byte_range(b, sb, bbits);
  return ra.first < rb.last && rb.first < ra.last;
}

namespace {

struct Region {
  const char* name;
  const void* data;
  IndexSpan span;
  std::int64_t element_bits;
  bool written;
};

}  // namespace

// The rules of a K or V storage: a float type has no quantization, a quantized one names its scales, and an
// int4 tensor's rows start on whole bytes.
void check_storage(const KvStorage& s, const Layout& l, const std::string& name, const std::string& layout_name) {
  const std::string field = name + "_storage";
  ATTNKIT_REQUIRE(s.type == KvType::Float || s.type == KvType::Int8 || s.type == KvType::Int4, field + ".type",
          "must be Float, Int8 or Int4");
  ATTNKIT_REQUIRE(s.quant == KvQuant::None || s.quant == KvQuant::PerTensor || s.quant == KvQuant::PerChannel,
          field + ".quant", "must be None, PerTensor or PerChannel");
  if (s.type == KvType::Float) {
    ATTNKIT_REQUIRE(s.quant == KvQuant::None, field + ".quant", "must be None when the type is Float (no scales)");
    return;
  }
  ATTNKIT_REQUIRE(s.quant != KvQuant::None, field + ".quant",
          std::string("must be PerTensor or PerChannel for an ") + kv_type_name(s.type) + " " + name);
  if (s.type == KvType::Int4) {
    const std::pair<const char*, std::int64_t> parts[] = {
        {"offset", l.offset}, {"batch_stride", l.batch_stride}, {"head_stride", l.head_stride},
        {"row_stride", l.row_stride}};
    for (const auto& [part, value] : parts) {
      ATTNKIT_REQUIRE(value % 2 == 0, layout_name + "." + part,
              "must be even for an int4 " + layout_name + " (values are packed two per byte; every row starts on a "
              "byte), got " + str(value));
    }
  }
}

// A quantized tensor's scales: present, enough of them; none for a float one.
void check_scales(const char* name, const ConstBuffer& buffer, KvQuant quant, std::int64_t kv_heads,
                  std::int64_t dim) {
  if (quant == KvQuant::None) {
    ATTNKIT_REQUIRE(buffer.data == nullptr, name, "a scale buffer was given but the tensor is not quantized");
    return;
  }
  const std::int64_t need = kv_scale_count(quant, kv_heads, dim);  // fits: the size rule bounds kv_heads * dim
  constexpr std::int64_t kMostScales = std::numeric_limits<std::ptrdiff_t>::max() / 4;
  ATTNKIT_REQUIRE(buffer.elements <= kMostScales, name,
          "states " + str(buffer.elements) + " elements, more than an address space holds (at most " +
              str(kMostScales) + " float32 values)");
  ATTNKIT_REQUIRE(buffer.data != nullptr, name, std::string("is null but the tensor is quantized (") +
                                            (quant == KvQuant::PerTensor ? "per tensor" : "per channel") + ")");
  ATTNKIT_REQUIRE(buffer.elements >= need, name,
          "holds " + str(buffer.elements) + " scales but " +
              (quant == KvQuant::PerTensor ? std::string("per-tensor quantization needs 1")
                                           : "per-channel quantization needs kv_heads * dim = " + str(need)));
}

// A buffer of `elements` elements of `bits` bits each: no more bytes than an address space holds (so that every
// byte offset into it, index * element size, fits a signed pointer difference), and every index the layout
// reaches below `elements`.
void check_buffer(const char* name, const void* data, std::int64_t elements, std::int64_t bits, IndexSpan span) {
  const std::int64_t most = bits >= 8 ? std::numeric_limits<std::ptrdiff_t>::max() / (bits / 8) : kInt64Max;
  ATTNKIT_REQUIRE(elements <= most, name,
          "states " + str(elements) + " elements, more than an address space holds (at most " + str(most) +
              " elements of " + str(bits) + " bits)");
  if (span.empty()) return;
  ATTNKIT_REQUIRE(data != nullptr, name, "is null but the tensor is not empty");
  ATTNKIT_REQUIRE(span.highest < elements, name,
          "the layout reaches element " + str(span.highest) + " but the buffer holds " + str(elements) +
              " elements");
}

IndexSpan index_span(const Layout& l, std::int64_t batch, std::int64_t heads, std::int64_t rows, std::int64_t cols,
                     const std::string& name) {
  if (batch <= 0 || heads <= 0 || rows <= 0 || cols <= 0) return {};
  struct Term {
    const char* field;
    std::int64_t steps, stride;
  };
  const Term terms[] = {{"batch_stride", batch - 1, l.batch_stride},
                        {"head_stride", heads - 1, l.head_stride},
                        {"row_stride", rows - 1, l.row_stride},
                        {"offset", cols - 1, 1}};
  std::int64_t highest = l.offset;
  const char* largest = "offset";  // the field of the largest term so far: what an overflow is blamed on
  std::int64_t largest_term = l.offset;
  for (const Term& t : terms) {
    const std::optional<std::int64_t> step = checked_mul(t.steps, t.stride);
    const std::optional<std::int64_t> sum = step ? checked_add(highest, *step) : std::nullopt;
    if (!step || *step > largest_term) {
      largest = t.field;
      largest_term = step.value_or(kInt64Max);
    }
    ATTNKIT_REQUIRE(sum.has_value(), name + "." + largest,
            "the layout's highest index (offset + (batch - 1) * batch_stride + (heads - 1) * head_stride + "
            "(rows - 1) * row_stride + cols - 1) does not fit int64: every index of a problem must be below 2^63");
    highest = *sum;
  }
  return {l.offset, highest};
}

namespace {

// The size rule: the logical element counts (Q and O: batch * heads * q_len * dim; K and V: batch * kv_heads *
// k_len * dim; the scores and the mask: batch * heads * q_len * k_len) fit int64, each extent counted as at
// least 1. Then every product of some of these extents fits too, whatever a kernel or a plan multiplies.
void check_sizes(const AttentionProblem& p) {
  const std::int64_t dim = std::max(p.head_dim, p.v_head_dim);
  const std::string rule = " does not fit int64 (each extent counted as at least 1): every index of a problem "
                           "must be below 2^63";
  ATTNKIT_REQUIRE(checked_extent_product({p.batch, p.heads, p.q_len, dim}).has_value(), "heads",
          "batch * heads * q_len * max(head_dim, v_head_dim) = " + str(p.batch) + " * " + str(p.heads) + " * " +
              str(p.q_len) + " * " + str(dim) + rule);
  ATTNKIT_REQUIRE(checked_extent_product({p.batch, p.kv_heads, p.k_len, dim}).has_value(), "kv_heads",
          "batch * kv_heads * k_len * max(head_dim, v_head_dim) = " + str(p.batch) + " * " + str(p.kv_heads) +
              " * " + str(p.k_len) + " * " + str(dim) + rule);
  ATTNKIT_REQUIRE(checked_extent_product({p.batch, p.heads, p.q_len, p.k_len}).has_value(), "k_len",
          "batch * heads * q_len * k_len = " + str(p.batch) + " * " + str(p.heads) + " * " + str(p.q_len) + " * " +
              str(p.k_len) + rule);
}

// The rules of ragged and paged sequences (problem.sequences) and of the options they change.
void check_sequences(const AttentionProblem& in, const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  constexpr std::int64_t kMaxRows = std::numeric_limits<std::int32_t>::max();  // cu_seqlens are int32
  ATTNKIT_REQUIRE(s.total_q >= 0 && s.total_q <= kMaxRows, "sequences.total_q", "must be in [0, 2^31) (got " + str(s.total_q) + ")");
  ATTNKIT_REQUIRE(s.total_k >= 0 && s.total_k <= kMaxRows, "sequences.total_k", "must be in [0, 2^31) (got " + str(s.total_k) + ")");
  ATTNKIT_REQUIRE(s.ragged_q || s.total_q == 0, "sequences.total_q", "is set but sequences.ragged_q is false");
  ATTNKIT_REQUIRE(s.ragged_k || s.total_k == 0, "sequences.total_k", "is set but sequences.ragged_k is false");
  ATTNKIT_REQUIRE(s.page_size >= 0 && s.page_size <= kMaxRows, "sequences.page_size",
                  "must be in [1, 2^31) for paged K/V, or 0 (got " + str(s.page_size) + ")");
  ATTNKIT_REQUIRE(s.num_pages >= 0 && s.num_pages <= kMaxRows, "sequences.num_pages",
                  "must be in [0, 2^31) (block-table entries are int32; got " + str(s.num_pages) + ")");
  ATTNKIT_REQUIRE(s.max_pages_per_seq >= 0 && s.max_pages_per_seq <= kMaxRows, "sequences.max_pages_per_seq",
                  "must be in [0, 2^31) (got " + str(s.max_pages_per_seq) + ")");
  if (s.paged()) {
    ATTNKIT_REQUIRE(!s.ragged_k, "sequences.ragged_k",
                    "paged K/V take their key lengths from key_lengths (has_key_lengths), not from cu_seqlens_k");
    ATTNKIT_REQUIRE(s.max_pages_per_seq >= 1, "sequences.max_pages_per_seq", "must be >= 1 for paged K/V");
    ATTNKIT_REQUIRE(p.k_len <= s.max_pages_per_seq * s.page_size, "k_len",
                    "= " + str(p.k_len) + " is more keys than max_pages_per_seq * page_size = " +
                        str(s.max_pages_per_seq) + " * " + str(s.page_size) + " pages hold");
    ATTNKIT_REQUIRE(checked_extent_product({p.batch, s.max_pages_per_seq}).has_value(), "sequences.max_pages_per_seq",
                    "batch * max_pages_per_seq (the block table's entries) does not fit int64");
  } else {
    ATTNKIT_REQUIRE(s.num_pages == 0 && s.max_pages_per_seq == 0, "sequences.page_size",
                    "is 0 (not paged) but num_pages or max_pages_per_seq is set");
  }
  if (s.ragged_k) {
    ATTNKIT_REQUIRE(!p.has_key_lengths, "has_key_lengths",
                    "ragged keys take their lengths from cu_seqlens_k: no key_lengths with sequences.ragged_k");
  }
  if (!s.any()) return;
  ATTNKIT_REQUIRE(!in.causal_offset.has_value(), "causal_offset",
                  "must be unset with ragged or paged sequences: causal is bottom-right per sequence (per-batch "
                  "offsets: has_causal_offsets)");
  ATTNKIT_REQUIRE(!p.has_mask || !(s.ragged_q || s.ragged_k), "has_mask",
                  "an additive mask is not supported with ragged sequences (its [b, h, i, j] rows would not match "
                  "packed rows)");
  const Extent qe = query_extent(p), ke = key_extent(p);
  const std::int64_t dim = std::max(p.head_dim, p.v_head_dim);
  ATTNKIT_REQUIRE(checked_extent_product({qe.leading, p.heads, qe.rows, dim}).has_value(), "sequences.total_q",
                  "total_q * heads * max(head_dim, v_head_dim) does not fit int64");
  ATTNKIT_REQUIRE(checked_extent_product({ke.leading, p.kv_heads, ke.rows, dim}).has_value(),
                  s.paged() ? "sequences.num_pages" : "sequences.total_k",
                  "the K/V rows times kv_heads * max(head_dim, v_head_dim) do not fit int64");
}

// A ragged batch's cumulative lengths: non-decreasing from cu[0] >= 0, each sequence at most `longest`, the last
// entry within the packed tensor's `total` rows.
void check_cu_seqlens(const char* name, const std::int32_t* cu, std::int64_t batch, std::int64_t longest,
                      std::int64_t total, const char* longest_name, const char* total_name) {
  ATTNKIT_REQUIRE(cu[0] >= 0, std::string(name) + "[0]", "= " + str(cu[0]) + " must be >= 0");
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t n = static_cast<std::int64_t>(cu[b + 1]) - cu[b];
    ATTNKIT_REQUIRE(n >= 0, std::string(name) + "[" + str(b + 1) + "]",
                    "= " + str(cu[b + 1]) + " is below the entry before it (" + str(cu[b]) + "): must not decrease");
    ATTNKIT_REQUIRE(n <= longest, std::string(name) + "[" + str(b + 1) + "]",
                    "makes sequence " + str(b) + " " + str(n) + " rows long, more than " + longest_name + " = " +
                        str(longest));
  }
  ATTNKIT_REQUIRE(cu[batch] <= total, std::string(name) + "[" + str(batch) + "]",
                  "= " + str(cu[batch]) + " is past the " + str(total) + " rows of " + total_name);
}

// The block-table entries each sequence's keys reach: within [0, num_pages).
void check_block_table(const AttentionProblem& p, const AttentionArgs& a) {
  const SequenceLayout& s = p.sequences;
  const auto* table = static_cast<const std::int32_t*>(a.block_table.data);
  const auto* lengths = p.has_key_lengths ? static_cast<const std::int32_t*>(a.key_lengths.data) : nullptr;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t keys = lengths != nullptr ? lengths[b] : p.k_len;
    const std::int64_t pages = (keys + s.page_size - 1) / s.page_size;
    for (std::int64_t i = 0; i < pages; ++i) {
      const std::int64_t at = b * s.max_pages_per_seq + i;
      ATTNKIT_REQUIRE(table[at] >= 0 && table[at] < s.num_pages, "block_table[" + str(at) + "]",
                      "= " + str(table[at]) + " (sequence " + str(b) + ", page " + str(i) +
                          ") is outside [0, num_pages = " + str(s.num_pages) + ")");
    }
  }
}

}  // namespace

void check_config(int threads, Backend backend, const std::string& prefix) {
  ATTNKIT_REQUIRE(threads >= 0 && threads <= kMaxThreads, prefix + ".threads",
          "must be >= 0 and at most " + str(kMaxThreads) + " (0: all cores), got " + str(threads));
  ATTNKIT_REQUIRE(backend == Backend::Auto || backend == Backend::Cpu || backend == Backend::Reference ||
                      backend == Backend::Cuda || backend == Backend::Vulkan,
          prefix + ".backend",
          "must be Auto, Cpu, Reference, Cuda or Vulkan, got the value " + str(static_cast<int>(backend)));
}

AttentionProblem normalize_and_check(const AttentionProblem& in) {
  AttentionProblem p = in;
  ATTNKIT_REQUIRE(p.batch >= 0, "batch", "must be >= 0 (got " + str(p.batch) + ")");
  ATTNKIT_REQUIRE(p.heads >= 1, "heads", "must be >= 1 (got " + str(p.heads) + ")");
  if (p.kv_heads == 0) p.kv_heads = p.heads;
  ATTNKIT_REQUIRE(p.kv_heads >= 1, "kv_heads", "must be >= 1, or 0 for 'same as heads' (got " + str(p.kv_heads) + ")");
  ATTNKIT_REQUIRE(p.heads % p.kv_heads == 0, "kv_heads",
          "heads (" + str(p.heads) + ") must be a multiple of kv_heads (" + str(p.kv_heads) + ")");
  ATTNKIT_REQUIRE(p.q_len >= 0, "q_len", "must be >= 0 (got " + str(p.q_len) + ")");
  ATTNKIT_REQUIRE(p.k_len >= 0, "k_len", "must be >= 0 (got " + str(p.k_len) + ")");
  constexpr std::int64_t kMaxLen = std::numeric_limits<std::int32_t>::max();
  ATTNKIT_REQUIRE(p.q_len <= kMaxLen, "q_len", "must be below 2^31 (got " + str(p.q_len) + ")");
  ATTNKIT_REQUIRE(p.k_len <= kMaxLen, "k_len", "must be below 2^31 (got " + str(p.k_len) + ")");
  ATTNKIT_REQUIRE(p.head_dim >= 1 && p.head_dim <= kMaxHeadDim, "head_dim",
          "must be in [1, 256] (got " + str(p.head_dim) + ")");
  if (p.v_head_dim == 0) p.v_head_dim = p.head_dim;
  ATTNKIT_REQUIRE(p.v_head_dim >= 1 && p.v_head_dim <= kMaxHeadDim, "v_head_dim",
          "must be in [1, 256], or 0 for 'same as head_dim' (got " + str(p.v_head_dim) + ")");
  ATTNKIT_REQUIRE(p.dtype == DType::f32 || p.dtype == DType::f16 || p.dtype == DType::bf16, "dtype",
          "must be float32, float16 or bfloat16");
  if (!p.scale) p.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  ATTNKIT_REQUIRE(std::isfinite(*p.scale), "scale", "must be finite");
  if (p.softcap) {
    ATTNKIT_REQUIRE(std::isfinite(*p.softcap) && *p.softcap > 0.0f, "softcap", "must be finite and > 0 when set");
  }
  if (!p.causal_offset) p.causal_offset = p.k_len - p.q_len;
  ATTNKIT_REQUIRE(!p.has_causal_offsets || p.causal, "has_causal_offsets", "per-batch causal offsets need causal = true");
  if (p.window) {
    ATTNKIT_REQUIRE(p.causal, "window", "a sliding window needs causal = true (it is measured from the causal limit)");
    ATTNKIT_REQUIRE(*p.window >= 1, "window", "must be >= 1 when set (got " + str(*p.window) + ")");
  }
  ATTNKIT_REQUIRE(p.work_budget >= 0, "work_budget", "must be >= 0 (0: never cut)");
  ATTNKIT_REQUIRE(p.mask_dtype == DType::f32 || p.mask_dtype == DType::f16 || p.mask_dtype == DType::bf16, "mask_dtype",
          "must be float32, float16 or bfloat16");
  ATTNKIT_REQUIRE(p.masked_rows == MaskedRows::Nan || p.masked_rows == MaskedRows::Zero, "masked_rows",
          "must be Nan or Zero, got the value " + str(static_cast<int>(p.masked_rows)));
  check_storage(p.k_storage, p.k, "k", "k");
  check_storage(p.v_storage, p.v, "v", "v");
  check_sizes(p);
  check_sequences(in, p);
  if (p.sequences.any()) p.causal_offset = 0;  // (per sequence: SequenceAccess)
  const Extent qe = query_extent(p), ke = key_extent(p);

  check_layout_signs(p.q, "q");
  check_layout_signs(p.k, "k");
  check_layout_signs(p.v, "v");
  check_layout_signs(p.o, "o");
  if (qe.rows > 1) ATTNKIT_REQUIRE(p.q.row_stride >= 1, "q.row_stride", "must be >= 1 when q_len > 1");
  if (p.has_mask) check_layout_signs(p.mask, "mask");
  if (p.return_lse) check_layout_signs(p.lse, "lse");
  // The index rule, before any work: every index a layout reaches fits int64 (check_args computes the same
  // spans again against the buffers; here they are computed for their overflow checks only).
  index_span(p.q, qe.leading, p.heads, qe.rows, p.head_dim, "q");
  index_span(p.k, ke.leading, p.kv_heads, ke.rows, p.head_dim, "k");
  index_span(p.v, ke.leading, p.kv_heads, ke.rows, p.v_head_dim, "v");
  index_span(p.o, qe.leading, p.heads, qe.rows, p.v_head_dim, "o");
  if (p.has_mask) index_span(p.mask, p.batch, p.heads, p.q_len, p.k_len, "mask");
  if (p.return_lse) {
    index_span(p.lse, qe.leading, p.heads, qe.rows, 1, "lse");
    check_no_self_overlap(p.lse, qe.leading, p.heads, qe.rows, 1, "lse");
  }
  check_no_self_overlap(p.o, qe.leading, p.heads, qe.rows, p.v_head_dim, "o");
  return p;
}

void check_args(const AttentionProblem& p, const AttentionArgs& a, std::size_t scratch_needed,
                bool host_key_lengths) {
  const std::int64_t bits = static_cast<std::int64_t>(dtype_size(p.dtype)) * 8;
  const std::int64_t k_bits = kv_value_bits(p.k_storage.type, p.dtype);
  const std::int64_t v_bits = kv_value_bits(p.v_storage.type, p.dtype);
  const std::int64_t mask_bits = static_cast<std::int64_t>(dtype_size(p.mask_dtype)) * 8;
  const Extent qe = query_extent(p), ke = key_extent(p);
  const IndexSpan q = index_span(p.q, qe.leading, p.heads, qe.rows, p.head_dim, "q");
  const IndexSpan k = index_span(p.k, ke.leading, p.kv_heads, ke.rows, p.head_dim, "k");
  const IndexSpan v = index_span(p.v, ke.leading, p.kv_heads, ke.rows, p.v_head_dim, "v");
  const IndexSpan o = index_span(p.o, qe.leading, p.heads, qe.rows, p.v_head_dim, "o");
  const IndexSpan mask = p.has_mask ? index_span(p.mask, p.batch, p.heads, p.q_len, p.k_len, "mask") : IndexSpan{};
  const IndexSpan lse = p.return_lse ? index_span(p.lse, qe.leading, p.heads, qe.rows, 1, "lse") : IndexSpan{};
  const SequenceLayout& seq = p.sequences;
  const IndexSpan cu_q = seq.ragged_q ? IndexSpan{0, p.batch} : IndexSpan{};
  const IndexSpan cu_k = seq.ragged_k ? IndexSpan{0, p.batch} : IndexSpan{};
  const IndexSpan table =
      seq.paged() && p.batch > 0 ? IndexSpan{0, p.batch * seq.max_pages_per_seq - 1} : IndexSpan{};
  const IndexSpan lengths = p.has_key_lengths && p.batch > 0 ? IndexSpan{0, p.batch - 1} : IndexSpan{};
  const IndexSpan sink = p.has_head_sink ? IndexSpan{0, p.heads - 1} : IndexSpan{};
  const IndexSpan offsets = p.has_causal_offsets && p.batch > 0 ? IndexSpan{0, p.batch - 1} : IndexSpan{};
  const std::int64_t k_scales = kv_scale_count(p.k_storage.quant, p.kv_heads, p.head_dim);
  const std::int64_t v_scales = kv_scale_count(p.v_storage.quant, p.kv_heads, p.v_head_dim);
  const IndexSpan k_scale = k_scales > 0 ? IndexSpan{0, k_scales - 1} : IndexSpan{};
  const IndexSpan v_scale = v_scales > 0 ? IndexSpan{0, v_scales - 1} : IndexSpan{};

  check_buffer("q", a.q.data, a.q.elements, bits, q);
  // K and V are read only for rows that have queries.
  check_buffer("k", a.k.data, a.k.elements, k_bits, p.q_len > 0 ? k : IndexSpan{});
  check_buffer("v", a.v.data, a.v.elements, v_bits, p.q_len > 0 ? v : IndexSpan{});
  check_buffer("o", a.o.data, a.o.elements, bits, o);
  check_scales("k_scale", a.k_scale, p.k_storage.quant, p.kv_heads, p.head_dim);
  check_scales("v_scale", a.v_scale, p.v_storage.quant, p.kv_heads, p.v_head_dim);
  ATTNKIT_REQUIRE(p.has_mask || a.mask.data == nullptr, "mask", "a mask buffer was given but problem.has_mask is false");
  check_buffer("mask", a.mask.data, a.mask.elements, mask_bits, mask);
  ATTNKIT_REQUIRE(p.has_key_lengths || a.key_lengths.data == nullptr, "key_lengths",
          "a key-length buffer was given but problem.has_key_lengths is false");
  check_buffer("key_lengths", a.key_lengths.data, a.key_lengths.elements, 32, lengths);
  ATTNKIT_REQUIRE(p.has_head_sink || a.head_sink.data == nullptr, "head_sink",
          "a head-sink buffer was given but problem.has_head_sink is false");
  check_buffer("head_sink", a.head_sink.data, a.head_sink.elements, 32, sink);
  ATTNKIT_REQUIRE(p.has_causal_offsets || a.causal_offsets.data == nullptr, "causal_offsets",
          "a causal-offset buffer was given but problem.has_causal_offsets is false");
  check_buffer("causal_offsets", a.causal_offsets.data, a.causal_offsets.elements, 32, offsets);
  const std::pair<const char*, bool> sequence_arrays[] = {
      {"cu_seqlens_q", seq.ragged_q}, {"cu_seqlens_k", seq.ragged_k}, {"block_table", seq.paged()}};
  const ConstBuffer* sequence_buffers[] = {&a.cu_seqlens_q, &a.cu_seqlens_k, &a.block_table};
  const IndexSpan sequence_spans[] = {cu_q, cu_k, table};
  for (int i = 0; i < 3; ++i) {
    const auto& [name, wanted] = sequence_arrays[i];
    ATTNKIT_REQUIRE(wanted || sequence_buffers[i]->data == nullptr, name,
                    "a buffer was given but problem.sequences does not ask for it");
    check_buffer(name, sequence_buffers[i]->data, sequence_buffers[i]->elements, 32, sequence_spans[i]);
  }
  ATTNKIT_REQUIRE(p.return_lse || a.lse.data == nullptr, "lse", "an lse buffer was given but problem.return_lse is false");
  check_buffer("lse", a.lse.data, a.lse.elements, 32, lse);
  if (a.scratch != nullptr) {
    ATTNKIT_REQUIRE(reinterpret_cast<std::uintptr_t>(a.scratch) % 64 == 0, "scratch", "must be aligned to 64 bytes");
    ATTNKIT_REQUIRE(a.scratch_bytes >= scratch_needed, "scratch_bytes",
            "is " + std::to_string(a.scratch_bytes) + " but this problem needs " + std::to_string(scratch_needed));
  }

  if (p.has_key_lengths && host_key_lengths) {
    const auto* len = static_cast<const std::int32_t*>(a.key_lengths.data);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      ATTNKIT_REQUIRE(len[b] >= 0 && len[b] <= p.k_len, "key_lengths[" + str(b) + "]",
              "= " + str(len[b]) + " is outside [0, k_len = " + str(p.k_len) + "]");
    }
  }
  if (host_key_lengths) {  // (the sequence arrays live where the key lengths do)
    if (seq.ragged_q) {
      check_cu_seqlens("cu_seqlens_q", static_cast<const std::int32_t*>(a.cu_seqlens_q.data), p.batch, p.q_len,
                       seq.total_q, "q_len", "sequences.total_q");
    }
    if (seq.ragged_k) {
      check_cu_seqlens("cu_seqlens_k", static_cast<const std::int32_t*>(a.cu_seqlens_k.data), p.batch, p.k_len,
                       seq.total_k, "k_len", "sequences.total_k");
    }
    if (seq.paged()) check_block_table(p, a);
  }

  // A plan's scratch is far below 2^63 bytes (the size rule bounds what it counts); clamped all the same.
  const auto scratch_last = static_cast<std::int64_t>(std::min<std::size_t>(scratch_needed, kInt64Max) - 1);
  const IndexSpan scratch = a.scratch != nullptr && scratch_needed > 0 ? IndexSpan{0, scratch_last} : IndexSpan{};
  const std::array<Region, 15> regions{
      Region{"cu_seqlens_q", a.cu_seqlens_q.data, cu_q, 32, false},
      Region{"cu_seqlens_k", a.cu_seqlens_k.data, cu_k, 32, false},
      Region{"block_table", a.block_table.data, table, 32, false},
      Region{"q", a.q.data, q, bits, false},
      Region{"k", a.k.data, k, k_bits, false},
      Region{"v", a.v.data, v, v_bits, false},
      Region{"mask", a.mask.data, mask, mask_bits, false},
      Region{"key_lengths", a.key_lengths.data, lengths, 32, false},
      Region{"head_sink", a.head_sink.data, sink, 32, false},
      Region{"causal_offsets", a.causal_offsets.data, offsets, 32, false},
      Region{"k_scale", a.k_scale.data, k_scale, 32, false},
      Region{"v_scale", a.v_scale.data, v_scale, 32, false},
      Region{"o", a.o.data, o, bits, true},
      Region{"lse", a.lse.data, lse, 32, true},
      Region{"scratch", a.scratch, scratch, 8, true},
  };
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (!regions[i].written) continue;
    for (std::size_t j = 0; j < regions.size(); ++j) {
      if (i == j || (regions[j].written && j < i)) continue;
      const Region& w = regions[i];
      const Region& r = regions[j];
      ATTNKIT_REQUIRE(!bytes_overlap(w.data, w.span, w.element_bits, r.data, r.span, r.element_bits), w.name,
              std::string("must not overlap ") + r.name + " (an output may not alias any other buffer of the call)");
    }
  }
}

}  // namespace attnkit::core
