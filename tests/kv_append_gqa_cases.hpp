// append_kv with rotary and quantized caches, set up as the cache update of a GroupQueryAttention call
// (gqa_support.hpp's GqaCall, shared buffer): the same new rows, cos / sin caches and scales, each entry's rows at
// positions lengths[b] - seq. The CPU test compares the appended rows with the op's cache bit for bit, the CUDA
// test the CUDA append with the CPU append.
#pragma once

#include "gqa_support.hpp"

#include <attnkit/kv_append.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace attnkit::test {

enum class AppendCache { Dense, PagedNhd, PagedHnd };

inline KvStorage storage_of(const std::string& quant, std::int64_t bits) {
  if (quant == "NONE") return {};
  return {bits == 8 ? KvType::Int8 : KvType::Int4, quant == "PER_TENSOR" ? KvQuant::PerTensor : KvQuant::PerChannel};
}

// One side's cache (K or V) as append_kv sees it: values per row, bytes per value, the poison of unused rows.
struct AppendSide {
  KvStorage storage;
  std::int64_t row_values = 0;  // int4: head size rounded up to even
  std::int64_t row_bytes = 0;   // the GQA op's row
  std::size_t value_offset_bytes(std::int64_t index, std::size_t es) const {
    return storage.type == KvType::Int4 ? static_cast<std::size_t>(index / 2)
           : storage.type == KvType::Int8 ? static_cast<std::size_t>(index)
                                          : static_cast<std::size_t>(index) * es;
  }
};

struct GqaAppendCase {
  GqaCall call;  // the op's call; call.past_key_before / past_value_before are the caches before it
  AppendCache kind = AppendCache::Dense;
  KvAppendProblem p;
  AppendSide k_side, v_side;
  std::vector<std::int32_t> block_table, positions, new_lengths;
  std::vector<std::byte> k_cache, v_cache;  // append_kv's caches, before the append: the op's rows scattered
  std::string name;

  static constexpr std::int64_t kPage = 4;

  GqaAppendCase(const GqaOptions& options, AppendCache cache_kind, bool ragged, unsigned seed)
      : call(make_call(options)), kind(cache_kind) {
    const GqaCall& c = call;
    const GqaOptions& o = c.o;
    std::mt19937 rng(seed);
    k_side = {storage_of(o.k_quant, o.bits), 0, c.row_bytes(c.k_quantized())};
    v_side = {storage_of(o.v_quant, o.bits), 0, c.row_bytes(c.v_quantized())};
    for (AppendSide* s : {&k_side, &v_side}) s->row_values = s->storage.type == KvType::Int4 ? 2 * s->row_bytes : c.H;
    p.dtype = o.dtype;
    p.batch = o.batch;
    p.kv_heads = o.kv_heads;
    p.new_len = o.seq;
    p.head_dim = p.v_head_dim = c.H;
    p.k_new = p.v_new = Layout::positions_first(o.kv_heads, o.seq, c.H);  // the op's (B, S, Nkv * H)
    p.k_storage = k_side.storage;
    p.v_storage = v_side.storage;
    if (o.rotary) {
      p.rotary_dim = 2 * c.rot_half;
      p.rotary_interleaved = o.interleaved;
      p.rotary_positions = c.max_len;
    }
    if (kind == AppendCache::Dense) {  // the op's own layout: [B, Nkv, C, row]
      p.capacity = c.C;
      p.k_cache = Layout::head_first(o.kv_heads, c.C, k_side.row_values);
      p.v_cache = Layout::head_first(o.kv_heads, c.C, v_side.row_values);
    } else {
      p.page_size = kPage;
      p.max_pages_per_seq = (c.C + kPage - 1) / kPage;
      p.num_pages = o.batch * p.max_pages_per_seq + 2;  // two pages no entry uses
      const bool nhd = kind == AppendCache::PagedNhd;
      const auto layout = [&](std::int64_t row) {
        return nhd ? Layout::positions_first(o.kv_heads, kPage, row) : Layout::head_first(o.kv_heads, kPage, row);
      };
      p.k_cache = layout(k_side.row_values);
      p.v_cache = layout(v_side.row_values);
      std::vector<std::int32_t> pages(static_cast<std::size_t>(p.num_pages));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      block_table.assign(pages.begin(), pages.begin() + o.batch * p.max_pages_per_seq);
    }
    for (std::int64_t b = 0; b < o.batch; ++b) {
      positions.push_back(static_cast<std::int32_t>(o.lengths[static_cast<std::size_t>(b)] - o.seq));
      if (ragged) new_lengths.push_back(static_cast<std::int32_t>(rng() % (o.seq + 1)));
    }
    p.has_new_lengths = ragged;
    k_cache = scatter(k_side, c.past_key_before, p.k_cache);
    v_cache = scatter(v_side, c.past_value_before, p.v_cache);
    const char* cache = kind == AppendCache::Dense ? " dense" : kind == AppendCache::PagedNhd ? " NHD" : " HND";
    const std::string rotary = o.rotary ? " rotary/" + std::to_string(2 * c.rot_half) + (o.interleaved ? "i" : "") : "";
    name = std::string(dtype_name(o.dtype)) + cache + " H" + std::to_string(c.H) + rotary +
           " K " + o.k_quant + " V " + o.v_quant + " bits " + std::to_string(o.bits) + (ragged ? " ragged" : "");
  }

  std::size_t es() const { return dtype_size(p.dtype); }
  std::int64_t cache_leading() const { return p.page_size > 0 ? p.num_pages : p.batch; }

  // The cache append_kv fills holding the op's cache rows (`dense`: [B, Nkv, C, row bytes]) at the same positions;
  // rows no position maps to hold a poison pattern.
  std::vector<std::byte> scatter(const AppendSide& side, const std::vector<std::byte>& dense, const Layout& l) const {
    const GqaCall& c = call;
    const std::size_t bytes = side.value_offset_bytes(cache_leading() * l.batch_stride, es());
    std::vector<std::byte> out(bytes, std::byte{0xC3});
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.kv_heads; ++h) {
        for (std::int64_t pos = 0; pos < c.C; ++pos) {  // (a paged entry's pages hold at least C rows)
          std::copy_n(dense.begin() + ((b * p.kv_heads + h) * c.C + pos) * side.row_bytes, side.row_bytes,
                      out.begin() + static_cast<std::ptrdiff_t>(side.value_offset_bytes(cache_index(l, b, h, pos), es())));
        }
      }
    }
    return out;
  }
  // The value index of position `pos` of entry b, head h, by the rule of kv_append.hpp.
  std::int64_t cache_index(const Layout& l, std::int64_t b, std::int64_t h, std::int64_t pos) const {
    if (p.page_size == 0) return l.index(b, h, pos);
    return l.index(block_table[static_cast<std::size_t>(b * p.max_pages_per_seq + pos / p.page_size)], h, pos % p.page_size);
  }

  // The op's cache after the call with, where ragged, the rows past each entry's new length as they were before.
  std::vector<std::byte> op_rows(const AppendSide& side, const std::vector<std::byte>& after,
                                 const std::vector<std::byte>& before) const {
    if (!p.has_new_lengths) return after;
    std::vector<std::byte> mixed = before;
    const GqaCall& c = call;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.kv_heads; ++h) {
        for (std::int64_t r = 0; r < new_lengths[static_cast<std::size_t>(b)]; ++r) {
          const std::int64_t at = ((b * p.kv_heads + h) * c.C + positions[static_cast<std::size_t>(b)] + r) * side.row_bytes;
          std::copy_n(after.begin() + at, side.row_bytes, mixed.begin() + at);
        }
      }
    }
    return mixed;
  }

  std::int64_t values(const AppendSide& side, const std::vector<std::byte>& buf) const {
    const auto n = static_cast<std::int64_t>(buf.size());
    if (side.storage.type == KvType::Int4) return 2 * n;
    return side.storage.type == KvType::Int8 ? n : n / static_cast<std::int64_t>(es());
  }

  KvAppendArgs args() {
    GqaCall& c = call;
    KvAppendArgs a;
    const auto n = [&](const std::vector<std::byte>& v) { return static_cast<std::int64_t>(v.size() / es()); };
    a.k_new = {c.key.data(), n(c.key)};
    a.v_new = {c.value.data(), n(c.value)};
    a.k_cache = {k_cache.data(), values(k_side, k_cache)};
    a.v_cache = {v_cache.data(), values(v_side, v_cache)};
    if (!block_table.empty()) a.block_table = {block_table.data(), static_cast<std::int64_t>(block_table.size())};
    a.positions = {positions.data(), static_cast<std::int64_t>(positions.size())};
    if (p.has_new_lengths) a.new_lengths = {new_lengths.data(), static_cast<std::int64_t>(new_lengths.size())};
    if (p.rotary_dim > 0) {
      a.cos_cache = {c.cos.data(), n(c.cos)};
      a.sin_cache = {c.sin.data(), n(c.sin)};
    }
    if (c.k_quantized()) a.k_scale = {c.k_scale.data(), static_cast<std::int64_t>(c.k_scale.size())};
    if (c.v_quantized()) a.v_scale = {c.v_scale.data(), static_cast<std::int64_t>(c.v_scale.size())};
    return a;
  }
};

// The op's options of the cases: a shared cache of 16 rows, two entries with 3 new tokens at positions 5 and 10.
inline GqaOptions append_options(DType dtype, std::int64_t head_size, bool rotary, bool interleaved,
                                 std::int64_t rotary_half, const std::string& k_quant, const std::string& v_quant,
                                 std::int64_t bits, std::uint64_t seed) {
  GqaOptions o;
  o.dtype = dtype;
  o.batch = 2, o.seq = 3, o.heads = 4, o.kv_heads = 2, o.head_size = head_size;
  o.lengths = {8, 13};
  o.present_rows = 16;
  o.has_past = true;
  o.shared = true;
  o.rotary = rotary, o.interleaved = interleaved, o.rotary_half = rotary_half;
  o.k_quant = k_quant, o.v_quant = v_quant, o.bits = bits;
  o.seed = seed;
  return o;
}

// Every dtype; rotary full, partial and interleaved; float, int8 and int4 caches per side and quantization;
// an odd head size for int4; each cache kind; some ragged.
inline std::vector<GqaAppendCase> gqa_append_cases() {
  struct Option {
    std::int64_t head_size;
    bool rotary, interleaved;
    std::int64_t half;
    const char *k_quant, *v_quant;
    std::int64_t bits;
  };
  const Option options[] = {
      {32, true, false, 0, "NONE", "NONE", 8},          {32, true, true, 8, "NONE", "NONE", 8},
      {64, true, false, 16, "PER_TENSOR", "PER_CHANNEL", 8}, {32, true, true, 0, "PER_CHANNEL", "PER_TENSOR", 4},
      {16, false, false, 0, "PER_CHANNEL", "NONE", 4},  {15, true, false, 4, "PER_TENSOR", "PER_CHANNEL", 4},
      {24, false, false, 0, "NONE", "PER_TENSOR", 8},
  };
  std::vector<GqaAppendCase> cases;
  unsigned seed = 1;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (const Option& o : options) {
      for (AppendCache kind : {AppendCache::Dense, AppendCache::PagedNhd, AppendCache::PagedHnd}) {
        const bool ragged = seed % 3 == 0;
        cases.emplace_back(append_options(t, o.head_size, o.rotary, o.interleaved, o.half, o.k_quant, o.v_quant, o.bits, seed),
                           kind, ragged, seed);
        ++seed;
      }
    }
  }
  return cases;
}

}  // namespace attnkit::test
