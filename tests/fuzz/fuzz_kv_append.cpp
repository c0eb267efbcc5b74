// Fuzz target: an append_kv problem (paged or dense cache, layouts, extents biased to the edges of int32 / int64;
// sometimes rotary on K and int8 / int4 caches, any storage values) and its buffers, allocated at exactly their
// stated sizes, with positions, new lengths and block-table entries near the edges of the caches, cos / sin rows
// near the positions, and scales usually valid. The oracles: no sanitizer report, no exception but
// attnkit::Error, and a rejected call leaves both caches as they were.
#include "fuzz_support.hpp"

#include <attnkit/kv_append.hpp>

#include <cstddef>
#include <cstdint>

namespace attnkit::fuzz {
namespace {

// int32 values near [lo, hi] (the edges a rule compares with), sometimes anything.
Arg draw_values(FuzzedDataProvider& in, std::int64_t count, std::int64_t lo, std::int64_t hi) {
  Arg a = draw_arg(in, count, 32);
  if (a.null || a.elements > count) return a;
  constexpr std::int64_t kEdge = std::int64_t{1} << 31;
  lo = std::clamp<std::int64_t>(lo, -kEdge, kEdge);
  hi = std::clamp<std::int64_t>(hi, -kEdge, kEdge);
  auto* v = reinterpret_cast<std::int32_t*>(a.buffer.data());
  for (std::int64_t i = 0; i < a.elements; ++i) {
    v[i] = in.ConsumeBool() ? in.ConsumeIntegral<std::int32_t>()
                            : static_cast<std::int32_t>(std::clamp<std::int64_t>(
                                  in.ConsumeIntegralInRange<std::int64_t>(lo - 2, std::max(lo, hi) + 2), -kEdge,
                                  kEdge - 1));
  }
  return a;
}

// float32 scales: usually in (0, 1] (the quantized paths run), sometimes whatever the input says.
Arg draw_scales(FuzzedDataProvider& in, KvQuant quant, std::int64_t kv_heads, std::int64_t dim) {
  if (quant == KvQuant::None && in.ConsumeIntegralInRange<int>(0, 15) != 0) return {};
  const __int128 channels = static_cast<__int128>(std::max<std::int64_t>(kv_heads, 0)) * std::max<std::int64_t>(dim, 0);
  const __int128 count = quant == KvQuant::PerChannel ? channels : 1;
  Arg a = draw_arg(in, count > kMaxElements ? kMaxElements : static_cast<std::int64_t>(count), 32);
  if (a.null || a.elements > kMaxElements || in.ConsumeIntegralInRange<int>(0, 7) == 0) return a;
  auto* v = reinterpret_cast<float*>(a.buffer.data());
  for (std::int64_t i = 0; i < a.elements; ++i) v[i] = static_cast<float>(in.ConsumeIntegralInRange<int>(1, 1000)) / 1000.0f;
  return a;
}

// A cache's buffer restated in elements of `to_bits` bits (an alias of it that the overlap rules must refuse).
std::int64_t restated(const Arg& cache, std::int64_t from_bits, std::int64_t to_bits) {
  return static_cast<std::int64_t>(static_cast<__int128>(cache.elements) * from_bits / to_bits);
}

// Values one cache row spans: an int4 row is whole bytes.
std::int64_t row_values(const KvStorage& s, std::int64_t dim) {
  return s.type == KvType::Int4 && dim < kInt64Max ? dim + (dim & 1) : dim;
}

void run_one(FuzzedDataProvider& in) {
  KvAppendProblem p;
  p.dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 3));
  p.batch = edgy_int(in, 0, 5);
  p.kv_heads = edgy_int(in, 0, 4);
  p.new_len = edgy_int(in, 0, 20);
  p.head_dim = edgy_int(in, 1, 40);
  p.v_head_dim = in.ConsumeBool() ? 0 : edgy_int(in, 1, 40);
  const bool paged = in.ConsumeBool();
  if (paged) {
    p.page_size = edgy_int(in, 1, 9);
    p.num_pages = edgy_int(in, 0, 12);
    p.max_pages_per_seq = edgy_int(in, 0, 6);
  } else {
    p.capacity = edgy_int(in, 0, 40);
  }
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) p.capacity = edgy_int(in, 0, 40);  // (wrong on paged)
  p.has_new_lengths = in.ConsumeBool();
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {  // int8 / int4 caches, and storage values out of the enums
    for (KvStorage* s : {&p.k_storage, &p.v_storage}) {
      s->type = static_cast<KvType>(in.ConsumeIntegralInRange<int>(0, 3));
      s->quant = static_cast<KvQuant>(in.ConsumeIntegralInRange<int>(0, 3));
    }
  }
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {  // rotary: odd, past head_dim, few cos / sin rows
    p.rotary_dim = in.ConsumeBool() ? 2 * in.ConsumeIntegralInRange<std::int64_t>(0, 20) : edgy_int(in, 0, 42);
    p.rotary_interleaved = in.ConsumeBool();
    p.rotary_positions = edgy_int(in, 0, 48);
  }
  const std::int64_t dv = p.v_head_dim == 0 ? p.head_dim : p.v_head_dim;
  const std::int64_t lead = paged ? p.num_pages : p.batch;
  const std::int64_t rows = paged ? p.page_size : p.capacity;
  const std::int64_t k_row = row_values(p.k_storage, p.head_dim), v_row = row_values(p.v_storage, dv);
  p.k_new = draw_layout(in, p.kv_heads, p.new_len, p.head_dim);
  p.v_new = draw_layout(in, p.kv_heads, p.new_len, dv);
  p.k_cache = draw_layout(in, p.kv_heads, rows, k_row);
  p.v_cache = draw_layout(in, p.kv_heads, rows, v_row);
  const int backend = in.ConsumeIntegralInRange<int>(0, 9);
  const Backend b = backend < 8 ? Backend::Cpu : backend == 8 ? Backend::Auto : static_cast<Backend>(backend);

  const std::int64_t bits = static_cast<std::int64_t>(dtype_size(p.dtype)) * 8;
  const auto cache_bits = [&](const KvStorage& s) { return s.type == KvType::Int8 ? 8 : s.type == KvType::Int4 ? 4 : bits; };
  const Arg k_new = draw_arg(in, reach(p.k_new, p.batch, p.kv_heads, p.new_len, p.head_dim), bits);
  const Arg v_new = draw_arg(in, reach(p.v_new, p.batch, p.kv_heads, p.new_len, dv), bits);
  Arg k_cache = draw_arg(in, reach(p.k_cache, lead, p.kv_heads, rows, k_row), cache_bits(p.k_storage));
  Arg v_cache = draw_arg(in, reach(p.v_cache, lead, p.kv_heads, rows, v_row), cache_bits(p.v_storage));
  const Arg k_scale = draw_scales(in, p.k_storage.quant, p.kv_heads, p.head_dim);
  const Arg v_scale = draw_scales(in, p.v_storage.quant, p.kv_heads, dv);
  const bool rotary = p.rotary_dim != 0 || in.ConsumeIntegralInRange<int>(0, 15) == 0;  // (tables without rotary)
  const __int128 table_values = static_cast<__int128>(std::clamp<std::int64_t>(p.rotary_positions, 0, kMaxElements)) *
                                std::clamp<std::int64_t>(p.rotary_dim / 2, 0, kMaxElements);
  const std::int64_t cos_values = table_values > kMaxElements ? kMaxElements : static_cast<std::int64_t>(table_values);
  const Arg cos = rotary ? draw_arg(in, cos_values, bits) : Arg{};
  const Arg sin = rotary ? draw_arg(in, cos_values, bits) : Arg{};
  const std::int64_t entries = std::clamp<std::int64_t>(p.batch, 0, kMaxElements);
  const __int128 table_entries = static_cast<__int128>(entries) * std::max<std::int64_t>(p.max_pages_per_seq, 0);
  const auto small = [](std::int64_t x) { return std::clamp<std::int64_t>(x, 0, 1 << 20); };  // (no overflow below)
  const std::int64_t capacity = paged ? small(p.max_pages_per_seq) * small(p.page_size) : p.capacity;
  const Arg positions = draw_values(in, entries, 0, capacity);
  const Arg lengths = p.has_new_lengths || in.ConsumeIntegralInRange<int>(0, 15) == 0 ? draw_values(in, entries, 0, p.new_len) : Arg{};
  const Arg table = paged || in.ConsumeIntegralInRange<int>(0, 15) == 0
                        ? draw_values(in, table_entries > kMaxElements ? kMaxElements : static_cast<std::int64_t>(table_entries), 0, p.num_pages)
                        : Arg{};
  std::int32_t status = 5;

  KvAppendArgs a;
  a.k_new = {ptr(k_new), k_new.elements};
  a.v_new = {ptr(v_new), v_new.elements};
  a.k_cache = {const_cast<void*>(ptr(k_cache)), k_cache.elements};
  a.v_cache = {const_cast<void*>(ptr(v_cache)), v_cache.elements};
  a.positions = {ptr(positions), positions.elements};
  a.new_lengths = {ptr(lengths), lengths.elements};
  a.block_table = {ptr(table), table.elements};
  a.cos_cache = {ptr(cos), cos.elements};
  a.sin_cache = {ptr(sin), sin.elements};
  a.k_scale = {ptr(k_scale), k_scale.elements};
  a.v_scale = {ptr(v_scale), v_scale.elements};
  if (in.ConsumeBool()) a.status = {&status, 1};
  // The new rows sometimes inside a cache (an overlap the checks must refuse).
  const std::int64_t k_bits = cache_bits(p.k_storage), v_bits = cache_bits(p.v_storage);
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) a.k_new = {a.k_cache.data, restated(k_cache, k_bits, bits)};
  // The cos table or the scales sometimes inside a cache too.
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) a.cos_cache = {a.v_cache.data, restated(v_cache, v_bits, bits)};
  if (in.ConsumeIntegralInRange<int>(0, 31) == 0) a.k_scale = {a.k_cache.data, restated(k_cache, k_bits, 32)};

  const std::vector<std::byte> k_before = k_cache.buffer.copy(), v_before = v_cache.buffer.copy();
  try {
    append_kv(p, a, b);
  } catch (const Error&) {
    require_unchanged(k_cache.buffer, k_before);
    require_unchanged(v_cache.buffer, v_before);
  }
}

}  // namespace
}  // namespace attnkit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  attnkit::fuzz::run_one(in);
  return 0;
}
