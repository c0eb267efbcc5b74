// append_kv: the rules (shapes, layouts, buffers; on the CPU the values too), then the backend's copy.
#include <attnkit/kv_append.hpp>

#include "core/checked_int.hpp"
#include "core/kv_append_rows.hpp"
#include "core/kv_quant.hpp"
#include "core/problem_check.hpp"
#include "core/require.hpp"
#include "cpu/kv_append.hpp"
#include "cuda/host/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

namespace attnkit {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

// Values one cache row spans: dim, or dim rounded up to even for int4 (a row is whole bytes; an odd dim's last
// byte pads with the value zero, as the GQA op's int4 rows do).
std::int64_t row_values(const KvStorage& storage, std::int64_t dim) {
  return storage.type == KvType::Int4 ? (dim + 1) / 2 * 2 : dim;
}

// Rotary: an even rotary_dim within K's row (the GQA op's rule: cos_cache's rot / 2 in [1, head_size / 2]), or
// none with no rotary settings.
void check_rotary(const KvAppendProblem& p) {
  ATTNKIT_REQUIRE(p.rotary_dim >= 0 && p.rotary_dim <= p.head_dim && p.rotary_dim % 2 == 0, "rotary_dim",
                  "must be even and in [2, head_dim = " + str(p.head_dim) +
                      "] (rotary pairs within K's row), or 0 for no rotary (got " + str(p.rotary_dim) + ")");
  if (p.rotary_dim == 0) {
    ATTNKIT_REQUIRE(p.rotary_positions == 0, "rotary_positions", "must be 0 without rotary (rotary_dim 0)");
    ATTNKIT_REQUIRE(!p.rotary_interleaved, "rotary_interleaved", "is set but rotary_dim is 0 (no rotary)");
    return;
  }
  ATTNKIT_REQUIRE(p.rotary_positions >= 0 && p.rotary_positions <= kInt32Max, "rotary_positions",
                  "must be in [0, 2^31) (the cos / sin caches' rows; got " + str(p.rotary_positions) + ")");
}

// Defaults filled in (v_head_dim) and every shape rule checked.
KvAppendProblem normalize(const KvAppendProblem& problem) {
  KvAppendProblem p = problem;
  if (p.v_head_dim == 0) p.v_head_dim = p.head_dim;
  ATTNKIT_REQUIRE(p.dtype == DType::f32 || p.dtype == DType::f16 || p.dtype == DType::bf16, "dtype",
                  "must be f32, f16 or bf16");
  ATTNKIT_REQUIRE(p.batch >= 0, "batch", "must be >= 0 (got " + str(p.batch) + ")");
  ATTNKIT_REQUIRE(p.kv_heads >= 0, "kv_heads", "must be >= 0 (got " + str(p.kv_heads) + ")");
  ATTNKIT_REQUIRE(p.new_len >= 0 && p.new_len <= kInt32Max, "new_len",
                  "must be in [0, 2^31) (got " + str(p.new_len) + ")");
  ATTNKIT_REQUIRE(p.head_dim >= 1 && p.head_dim <= 256, "head_dim", "must be in [1, 256] (got " + str(p.head_dim) + ")");
  ATTNKIT_REQUIRE(p.v_head_dim >= 1 && p.v_head_dim <= 256, "v_head_dim",
                  "must be in [1, 256] or 0 for head_dim (got " + str(problem.v_head_dim) + ")");
  ATTNKIT_REQUIRE(p.page_size >= 0 && p.page_size <= kInt32Max, "page_size",
                  "must be in [1, 2^31) for a paged cache, or 0 for a dense one (got " + str(p.page_size) + ")");
  if (p.page_size > 0) {
    ATTNKIT_REQUIRE(p.num_pages >= 0 && p.num_pages <= kInt32Max, "num_pages",
                    "must be in [0, 2^31) (block-table entries are int32; got " + str(p.num_pages) + ")");
    ATTNKIT_REQUIRE(p.max_pages_per_seq >= 0 && p.max_pages_per_seq <= kInt32Max, "max_pages_per_seq",
                    "must be in [0, 2^31) (got " + str(p.max_pages_per_seq) + ")");
    ATTNKIT_REQUIRE(p.capacity == 0, "capacity", "is for dense caches: a paged cache holds max_pages_per_seq * page_size rows per entry");
    p.capacity = p.max_pages_per_seq * p.page_size;  // < 2^62
  } else {
    ATTNKIT_REQUIRE(p.num_pages == 0 && p.max_pages_per_seq == 0, p.num_pages != 0 ? "num_pages" : "max_pages_per_seq",
                    "must be 0 for a dense cache (page_size 0)");
    ATTNKIT_REQUIRE(p.capacity >= 0 && p.capacity <= kInt32Max, "capacity",
                    "must be in [0, 2^31) (positions are int32; got " + str(p.capacity) + ")");
  }
  core::check_storage(p.k_storage, p.k_cache, "k", "k_cache");
  core::check_storage(p.v_storage, p.v_cache, "v", "v_cache");
  check_rotary(p);
  const std::int64_t k_row = row_values(p.k_storage, p.head_dim), v_row = row_values(p.v_storage, p.v_head_dim);
  const std::int64_t dim = std::max(k_row, v_row);
  const std::int64_t cache_leading = p.page_size > 0 ? p.num_pages : p.batch;
  const std::int64_t cache_rows = p.page_size > 0 ? p.page_size : p.capacity;
  ATTNKIT_REQUIRE(core::checked_extent_product({p.batch, p.kv_heads, p.new_len, dim}).has_value(), "new_len",
                  "batch * kv_heads * new_len * max(head_dim, v_head_dim) does not fit int64");
  ATTNKIT_REQUIRE(core::checked_extent_product({cache_leading, p.kv_heads, cache_rows, dim}).has_value(),
                  p.page_size > 0 ? "num_pages" : "capacity",
                  "the cache's rows * kv_heads * max(head_dim, v_head_dim) do not fit int64");
  ATTNKIT_REQUIRE(core::checked_mul(p.batch, std::max<std::int64_t>(p.max_pages_per_seq, 1)).has_value(),
                  "max_pages_per_seq", "batch * max_pages_per_seq does not fit int64");
  for (const auto& [layout, name] : {std::pair{&p.k_new, "k_new"}, std::pair{&p.v_new, "v_new"},
                                     std::pair{&p.k_cache, "k_cache"}, std::pair{&p.v_cache, "v_cache"}}) {
    core::check_layout_signs(*layout, name);
  }
  core::check_no_self_overlap(p.k_cache, cache_leading, p.kv_heads, cache_rows, k_row, "k_cache");
  core::check_no_self_overlap(p.v_cache, cache_leading, p.kv_heads, cache_rows, v_row, "v_cache");
  return p;
}

struct Spans {
  core::IndexSpan k_new, v_new, k_cache, v_cache;
};
Spans spans_of(const KvAppendProblem& p) {
  const std::int64_t leading = p.page_size > 0 ? p.num_pages : p.batch;
  const std::int64_t rows = p.page_size > 0 ? p.page_size : p.capacity;
  return {core::index_span(p.k_new, p.batch, p.kv_heads, p.new_len, p.head_dim, "k_new"),
          core::index_span(p.v_new, p.batch, p.kv_heads, p.new_len, p.v_head_dim, "v_new"),
          core::index_span(p.k_cache, leading, p.kv_heads, rows, row_values(p.k_storage, p.head_dim), "k_cache"),
          core::index_span(p.v_cache, leading, p.kv_heads, rows, row_values(p.v_storage, p.v_head_dim), "v_cache")};
}

void check_int32_buffer(const char* name, const ConstBuffer& b, std::int64_t need, bool wanted, const std::string& why) {
  if (!wanted) {
    ATTNKIT_REQUIRE(b.data == nullptr, name, "was given but " + why);
    return;
  }
  core::check_buffer(name, b.data, b.elements, 32, core::IndexSpan{0, need - 1});
}

// The cos / sin caches: [rotary_positions, rotary_dim / 2] of problem.dtype with rotary, else absent.
core::IndexSpan check_rotary_buffers(const KvAppendProblem& p, const KvAppendArgs& a, std::int64_t bits) {
  if (p.rotary_dim == 0) {
    ATTNKIT_REQUIRE(a.cos_cache.data == nullptr, "cos_cache", "was given but rotary_dim is 0 (no rotary)");
    ATTNKIT_REQUIRE(a.sin_cache.data == nullptr, "sin_cache", "was given but rotary_dim is 0 (no rotary)");
    return {};
  }
  const core::IndexSpan span{0, p.rotary_positions * (p.rotary_dim / 2) - 1};
  core::check_buffer("cos_cache", a.cos_cache.data, a.cos_cache.elements, bits, span);
  core::check_buffer("sin_cache", a.sin_cache.data, a.sin_cache.elements, bits, span);
  return span;
}

void check_buffers(const KvAppendProblem& p, const KvAppendArgs& a) {
  const Spans s = spans_of(p);
  const std::int64_t bits = static_cast<std::int64_t>(dtype_size(p.dtype)) * 8;
  const std::int64_t k_bits = core::kv_value_bits(p.k_storage.type, p.dtype);
  const std::int64_t v_bits = core::kv_value_bits(p.v_storage.type, p.dtype);
  core::check_buffer("k_new", a.k_new.data, a.k_new.elements, bits, s.k_new);
  core::check_buffer("v_new", a.v_new.data, a.v_new.elements, bits, s.v_new);
  core::check_buffer("k_cache", a.k_cache.data, a.k_cache.elements, k_bits, s.k_cache);
  core::check_buffer("v_cache", a.v_cache.data, a.v_cache.elements, v_bits, s.v_cache);
  core::check_scales("k_scale", a.k_scale, p.k_storage.quant, p.kv_heads, p.head_dim);
  core::check_scales("v_scale", a.v_scale, p.v_storage.quant, p.kv_heads, p.v_head_dim);
  const core::IndexSpan rotary = check_rotary_buffers(p, a, bits);
  const bool rows = p.batch > 0 && p.kv_heads > 0 && p.new_len > 0;
  check_int32_buffer("block_table", a.block_table, p.batch * p.max_pages_per_seq, p.page_size > 0,
                     "the cache is dense (page_size 0)");
  check_int32_buffer("positions", a.positions, p.batch, true, "");
  check_int32_buffer("new_lengths", a.new_lengths, p.batch, p.has_new_lengths, "problem.has_new_lengths is false");
  if (a.status.data != nullptr) core::check_buffer("status", a.status.data, a.status.elements, 32, core::IndexSpan{0, 0});
  // The caches may share one buffer (interleaved K and V pages), but not the same elements: V would overwrite K.
  const auto same = [](const Layout& x, const Layout& y) {
    return x.offset == y.offset && x.batch_stride == y.batch_stride && x.head_stride == y.head_stride &&
           x.row_stride == y.row_stride;
  };
  ATTNKIT_REQUIRE(!rows || a.k_cache.data != a.v_cache.data || !same(p.k_cache, p.v_cache), "v_cache",
                  "is the same memory as k_cache (same buffer and layout): its rows would overwrite K's");
  // The new rows, the cos / sin caches and the scales are read while the caches are written: they must not share
  // a byte.
  const auto scale_span = [&](KvQuant quant, std::int64_t dim) {
    return core::IndexSpan{0, core::kv_scale_count(quant, p.kv_heads, dim) - 1};
  };
  const std::tuple<const char*, const void*, core::IndexSpan, std::int64_t> inputs[] = {
      {"k_new", a.k_new.data, s.k_new, bits},
      {"v_new", a.v_new.data, s.v_new, bits},
      {"cos_cache", a.cos_cache.data, rotary, bits},
      {"sin_cache", a.sin_cache.data, rotary, bits},
      {"k_scale", a.k_scale.data, scale_span(p.k_storage.quant, p.head_dim), 32},
      {"v_scale", a.v_scale.data, scale_span(p.v_storage.quant, p.v_head_dim), 32}};
  for (const auto& [in_name, in, in_span, in_bits] : inputs) {
    for (const auto& [cache_name, cache, cache_span, cache_bits] :
         {std::tuple{"k_cache", a.k_cache.data, s.k_cache, k_bits},
          std::tuple{"v_cache", a.v_cache.data, s.v_cache, v_bits}}) {
      ATTNKIT_REQUIRE(!rows || !core::bytes_overlap(in, in_span, in_bits, cache, cache_span, cache_bits), in_name,
                      std::string("overlaps ") + cache_name +
                          ": what append_kv reads must not share memory with the caches");
    }
  }
}

// Host scales: each finite and > 0 (a value x is stored as rint(x * (1 / scale))), as the GQA op requires.
void check_host_scales(const char* name, const ConstBuffer& scales, KvQuant quant, std::int64_t kv_heads,
                       std::int64_t dim) {
  const auto* s = static_cast<const float*>(scales.data);
  const std::int64_t count = core::kv_scale_count(quant, kv_heads, dim);
  for (std::int64_t i = 0; i < count; ++i) {
    ATTNKIT_REQUIRE(std::isfinite(s[i]) && s[i] > 0.0f, std::string(name) + "[" + str(i) + "]",
                    "= " + std::to_string(s[i]) + " must be finite and > 0 (a value x is stored as rint(x / scale))");
  }
}

// Host values: every entry's rows in range, else an Error naming the value and the entry (nothing written yet).
void check_host_values(const KvAppendProblem& p, const KvAppendArgs& a) {
  const core::KvAppendGeometry g = core::append_geometry(p);
  const auto* positions = static_cast<const std::int32_t*>(a.positions.data);
  const auto* lengths = static_cast<const std::int32_t*>(a.new_lengths.data);
  const auto* table = static_cast<const std::int32_t*>(a.block_table.data);
  check_host_scales("k_scale", a.k_scale, p.k_storage.quant, p.kv_heads, p.head_dim);
  check_host_scales("v_scale", a.v_scale, p.v_storage.quant, p.kv_heads, p.v_head_dim);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t rows = p.kv_heads == 0 ? 0 : lengths != nullptr ? lengths[b] : p.new_len;
    if (core::append_entry_valid(g, table, b, positions[b], rows)) continue;
    const std::string entry = "[" + str(b) + "]";
    ATTNKIT_REQUIRE(rows >= 0 && rows <= p.new_len, "new_lengths" + entry,
                    "must be in [0, new_len = " + str(p.new_len) + "] (got " + str(rows) + ")");
    ATTNKIT_REQUIRE(positions[b] >= 0 && positions[b] + rows <= g.capacity, "positions" + entry,
                    "the entry's rows [" + str(positions[b]) + ", " + str(positions[b] + rows) +
                        ") must lie in [0, " + str(g.capacity) + ") (the entry's capacity)");
    ATTNKIT_REQUIRE(core::append_rotary_in_range(g, positions[b], rows), "positions" + entry,
                    "the entry's rows [" + str(positions[b]) + ", " + str(positions[b] + rows) +
                        ") reach past the cos / sin caches' " + str(g.rotary_positions) + " rows (rotary_positions)");
    throw Error("block_table" + entry, "the pages the entry's new rows reach must be in [0, num_pages = " +
                                           str(p.num_pages) + ")");
  }
}

bool any_device_pointer(const KvAppendArgs& a) {
  for (const void* ptr : std::initializer_list<const void*>{a.k_new.data, a.v_new.data, a.k_cache.data, a.v_cache.data, a.block_table.data,
                          a.positions.data, a.new_lengths.data, a.status.data, a.cos_cache.data,
                          a.sin_cache.data, a.k_scale.data, a.v_scale.data}) {
    if (ptr != nullptr && cuda::is_device_pointer(ptr)) return true;
  }
  return false;
}

}  // namespace

void append_kv(const KvAppendProblem& problem, const KvAppendArgs& args, Backend backend) {
  core::check_config(1, backend, "append_kv");
  const KvAppendProblem p = normalize(problem);
  check_buffers(p, args);
  const bool device = any_device_pointer(args);
  if (backend == Backend::Auto) backend = device ? Backend::Cuda : Backend::Cpu;
  switch (backend) {
    case Backend::Cuda:
      ATTNKIT_REQUIRE(cuda::available(), "backend", "the CUDA backend is not available (not built, or no device)");
      return cuda::append_kv(p, args);
    case Backend::Vulkan:
      throw Error("backend", "append_kv has no Vulkan implementation: use the CPU (host buffers) or CUDA");
    default:
      ATTNKIT_REQUIRE(!device, "backend", "a buffer is CUDA device memory: run append_kv with Backend::Cuda or Auto");
      check_host_values(p, args);
      cpu::append_kv(p, args);
      if (args.status.data != nullptr) *static_cast<std::int32_t*>(args.status.data) = -1;
  }
}

}  // namespace attnkit
