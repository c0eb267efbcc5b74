// Every rule of the GQA contract (/work/shared/SPEC-gqa.md; docs/gqa.md): attributes once, then inputs and
// outputs per call, each failure an Error that names the input and states the rule. Nothing here writes.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>

#include "../core/checked_int.hpp"
#include "../core/kv_quant.hpp"
#include "../core/visibility.hpp"
#include "../core/require.hpp"
#include "gqa_plan.hpp"

namespace attnkit::gqa {
namespace {

constexpr std::int64_t kMaxHeadSize = 256;  // the attention core's limit

std::string str(std::int64_t v) { return std::to_string(v); }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::optional<DType> float_type(ElementType t) {
  switch (t) {
    case ElementType::float32: return DType::f32;
    case ElementType::float16: return DType::f16;
    case ElementType::bfloat16: return DType::bf16;
    default: return std::nullopt;
  }
}

ElementType element_of(DType t) {
  switch (t) {
    case DType::f32: return ElementType::float32;
    case DType::f16: return ElementType::float16;
    case DType::bf16: return ElementType::bfloat16;
  }
  return ElementType::float32;
}

std::string type_name(ElementType t) { return std::string(element_type_name(t)); }

// A present tensor: sane dimensions, the rank it must have, and data unless it is empty.
// Dimensions >= 0 whose product, in bytes, fits an address space: then elements() and every byte offset into the
// tensor fit int64 and a pointer difference.
template <class View>
void check_dimensions(const View& t, const std::string& name) {
  std::int64_t elements = 1;
  for (std::int64_t d : t.shape) {
    ATTNKIT_REQUIRE(d >= 0, name, "dimensions must be >= 0, got shape " + shape_string(t.shape));
    ATTNKIT_REQUIRE(!__builtin_mul_overflow(elements, d, &elements), name,
            "shape " + shape_string(t.shape) + " holds more elements than fit int64 (every index must be below 2^63)");
  }
  const std::int64_t size = static_cast<std::int64_t>(element_size(t.type));
  ATTNKIT_REQUIRE(size > 0, name, "has an element type outside ElementType, the value " +
                                      str(static_cast<int>(t.type)));
  ATTNKIT_REQUIRE(elements <= std::numeric_limits<std::ptrdiff_t>::max() / size, name,
          "shape " + shape_string(t.shape) + " of " + type_name(t.type) + " holds more bytes than an address space");
}

template <class View>
void check_tensor(const View& t, const std::string& name, std::size_t rank) {
  check_dimensions(t, name);
  ATTNKIT_REQUIRE(t.shape.size() == rank, name,
          "must have rank " + str(static_cast<std::int64_t>(rank)) + ", got shape " + shape_string(t.shape));
  ATTNKIT_REQUIRE(t.data != nullptr || t.elements() == 0, name, "has no data but shape " + shape_string(t.shape));
}

template <class View>
void check_shape(const View& t, const std::string& name, const std::vector<std::int64_t>& want,
                 const std::string& meaning) {
  check_tensor(t, name, want.size());
  ATTNKIT_REQUIRE(t.shape == want, name,
          "must have shape " + meaning + " = " + shape_string(want) + ", got " + shape_string(t.shape));
}

template <class View>
void check_type(const View& t, const std::string& name, ElementType want, const std::string& why) {
  ATTNKIT_REQUIRE(t.type == want, name, "must be " + type_name(want) + " (" + why + "), got " + type_name(t.type));
}

void check_flag(std::int64_t v, const char* name) { ATTNKIT_REQUIRE(v == 0 || v == 1, name, "must be 0 or 1, got " + str(v)); }

KvQuant parse_quant(const std::string& s, const char* name) {
  if (s == "NONE") return KvQuant::None;
  if (s == "PER_TENSOR") return KvQuant::PerTensor;
  if (s == "PER_CHANNEL") return KvQuant::PerChannel;
  throw Error(name, "must be NONE, PER_TENSOR or PER_CHANNEL, got '" + s + "'");
}

// The element type a cache tensor of `format` has, and the ones it may have (int4 bytes: uint8 or int8).
ElementType cache_element(const CacheFormat& f) {
  switch (f.storage.type) {
    case KvType::Int8: return ElementType::int8;
    case KvType::Int4: return ElementType::uint8;
    case KvType::Float: break;
  }
  return element_of(f.dtype);
}
void check_cache_type(const TensorView& t, const std::string& name, const CacheFormat& f) {
  if (f.storage.type == KvType::Int4) {
    ATTNKIT_REQUIRE(t.type == ElementType::uint8 || t.type == ElementType::int8, name,
            "must be uint8 (an int4 cache: two 4-bit values per byte), got " + type_name(t.type));
    return;
  }
  const std::string why = f.storage.type == KvType::Int8 ? "an int8 cache" : "the cache has the query's type";
  check_type(t, name, cache_element(f), why);
}

// The BNSH shape of a cache tensor: (B, Nkv, rows, last_dim); returns rows.
std::int64_t check_cache_shape(const TensorView& t, const std::string& name, const CacheFormat& f, std::int64_t batch,
                               std::int64_t kv_heads) {
  check_tensor(t, name, 4);
  const std::string last = f.storage.type == KvType::Int4 ? "(head_size + 1) / 2 bytes" : "head_size";
  ATTNKIT_REQUIRE(t.shape[0] == batch && t.shape[1] == kv_heads && t.shape[3] == f.last_dim(), name,
          "must have shape (batch, kv_num_heads, rows, " + last + ") = (" + str(batch) + ", " + str(kv_heads) +
              ", rows, " + str(f.last_dim()) + "), got " + shape_string(t.shape));
  return t.shape[2];
}

// k_scale / v_scale: float32, as many values as the quantization needs, each finite and > 0.
const float* check_scales(const TensorView& t, const char* name, const char* attribute, KvQuant quant,
                          std::int64_t kv_heads, std::int64_t head_size) {
  if (quant == KvQuant::None) {
    ATTNKIT_REQUIRE(!t.present(), name, std::string("is given but ") + attribute + " is NONE (the cache is not quantized)");
    return nullptr;
  }
  ATTNKIT_REQUIRE(t.present(), name, std::string("is required when ") + attribute + " is not NONE");
  check_dimensions(t, name);
  check_type(t, name, ElementType::float32, "dequantization scales");
  const std::int64_t need = core::kv_scale_count(quant, kv_heads, head_size);
  ATTNKIT_REQUIRE(t.elements() == need, name,
          quant == KvQuant::PerTensor ? "must hold 1 value for PER_TENSOR, got shape " + shape_string(t.shape)
                                      : "must hold kv_num_heads * head_size = " + str(need) +
                                            " values for PER_CHANNEL, got shape " + shape_string(t.shape));
  ATTNKIT_REQUIRE(t.data != nullptr, name, "has no data");
  const auto* s = static_cast<const float*>(t.data);
  for (std::int64_t i = 0; i < need; ++i) {
    ATTNKIT_REQUIRE(std::isfinite(s[i]) && s[i] > 0.0f, std::string(name) + "[" + str(i) + "]",
            "= " + std::to_string(s[i]) + " must be finite and > 0 (a value x is stored as round(x / scale))");
  }
  return s;
}

// Two tensors of one call may share memory only as a shared past/present cache (the same pointer and size).
struct Region {
  std::string name;
  const void* data;
  std::int64_t bytes;
  bool written;
};

void check_overlaps(const std::vector<Region>& regions, const void* shared_key, const void* shared_value) {
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& w = regions[i];
    if (!w.written || w.data == nullptr || w.bytes <= 0) continue;
    for (std::size_t j = 0; j < regions.size(); ++j) {
      const Region& r = regions[j];
      if (i == j || r.data == nullptr || r.bytes <= 0 || (r.written && j < i)) continue;
      const bool alias = w.data == r.data && w.bytes == r.bytes && (w.data == shared_key || w.data == shared_value) &&
                         w.data != nullptr;
      if (alias && ((w.name == "present_key" && r.name == "past_key") ||
                    (w.name == "present_value" && r.name == "past_value"))) {
        continue;
      }
      // 128-bit: an address plus a size never wraps to a low address here.
      const auto w0 = static_cast<unsigned __int128>(reinterpret_cast<std::uintptr_t>(w.data));
      const auto r0 = static_cast<unsigned __int128>(reinterpret_cast<std::uintptr_t>(r.data));
      const bool overlap = w0 < r0 + static_cast<unsigned __int128>(r.bytes) &&
                           r0 < w0 + static_cast<unsigned __int128>(w.bytes);
      ATTNKIT_REQUIRE(!overlap, w.name,
              "must not overlap " + r.name +
                  " (outputs may share memory with no other tensor, except a present cache that is its past "
                  "cache: the same pointer and shape)");
    }
  }
}

}  // namespace

std::int64_t GqaPlan::position(std::int64_t b, std::int64_t s) const {
  if (position_ids != nullptr) return position_ids[b * position_row + s];
  return rows[static_cast<std::size_t>(b)].past + s;
}

GqaSettings check_attributes(const GqaAttributes& a) {
  GqaSettings st;
  ATTNKIT_REQUIRE(a.num_heads >= 1, "num_heads", "must be >= 1, got " + str(a.num_heads));
  ATTNKIT_REQUIRE(a.kv_num_heads >= 1, "kv_num_heads", "must be >= 1, got " + str(a.kv_num_heads));
  ATTNKIT_REQUIRE(a.num_heads % a.kv_num_heads == 0, "kv_num_heads",
          "num_heads (" + str(a.num_heads) + ") must be a multiple of kv_num_heads (" + str(a.kv_num_heads) + ")");
  // The heads of a packed QKV token, num_heads + 2 * kv_num_heads, in checked arithmetic.
  const std::optional<std::int64_t> kv_twice = core::checked_mul(a.kv_num_heads, 2);
  ATTNKIT_REQUIRE(kv_twice && core::checked_add(a.num_heads, *kv_twice), "num_heads",
          "num_heads + 2 * kv_num_heads (" + str(a.num_heads) + " + 2 * " + str(a.kv_num_heads) +
              ") does not fit int64");
  ATTNKIT_REQUIRE(std::isfinite(a.scale), "scale", "must be finite (0: 1 / sqrt(head_size))");
  ATTNKIT_REQUIRE(std::isfinite(a.softcap) && a.softcap >= 0.0f, "softcap", "must be finite and >= 0 (0: off)");
  check_flag(a.causal, "causal");
  check_flag(a.do_rotary, "do_rotary");
  check_flag(a.rotary_interleaved, "rotary_interleaved");
  check_flag(a.sliding_window_cache, "sliding_window_cache");
  ATTNKIT_REQUIRE(a.smooth_softmax == -1 || a.smooth_softmax == 0 || a.smooth_softmax == 1, "smooth_softmax",
          "must be -1, 0 (off) or 1, got " + str(a.smooth_softmax));
  ATTNKIT_REQUIRE(a.qk_output >= 0 && a.qk_output <= 2, "qk_output",
          "must be 0 (none), 1 (before softmax) or 2 (after softmax), got " + str(a.qk_output));
  ATTNKIT_REQUIRE(a.local_window_size == -1 || a.local_window_size >= 1, "local_window_size",
          "must be -1 (off) or >= 1 (the keys each query sees, itself included), got " + str(a.local_window_size));
  ATTNKIT_REQUIRE(
      a.causal == 1 || a.local_window_size == -1, "local_window_size",
      "must be -1 when causal = 0 (a window is measured back from the causal limit), got " + str(a.local_window_size));
  ATTNKIT_REQUIRE(a.sliding_window_cache == 0 || a.local_window_size >= 1, "sliding_window_cache",
          "= 1 needs local_window_size >= 1 (the window the cache keeps)");
  ATTNKIT_REQUIRE(std::isfinite(a.qk_norm_epsilon) && a.qk_norm_epsilon > 0.0f, "qk_norm_epsilon", "must be finite and > 0");

  st.k_quant = parse_quant(a.k_quant_type, "k_quant_type");
  st.v_quant = parse_quant(a.v_quant_type, "v_quant_type");
  if (st.k_quant != KvQuant::None || st.v_quant != KvQuant::None) {
    ATTNKIT_REQUIRE(a.kv_cache_bit_width == 8 || a.kv_cache_bit_width == 4, "kv_cache_bit_width",
            "must be 8 or 4 when k_quant_type or v_quant_type is not NONE, got " + str(a.kv_cache_bit_width));
    st.quant_type = a.kv_cache_bit_width == 8 ? KvType::Int8 : KvType::Int4;
  }
  st.heads = a.num_heads;
  st.kv_heads = a.kv_num_heads;
  st.scale = a.scale;
  st.softcap = a.softcap;
  st.window = a.local_window_size > 0 ? a.local_window_size : 0;
  st.causal = a.causal == 1;
  st.rotary = a.do_rotary == 1;
  st.interleaved = a.rotary_interleaved == 1;
  st.smooth_softmax = a.smooth_softmax == 1;
  st.qk_output = static_cast<QkOutput>(a.qk_output);
  st.sliding_window_cache = a.sliding_window_cache == 1;
  st.norm_epsilon = a.qk_norm_epsilon;
  return st;
}

namespace {

// The query (and key/value): batch, sequence length, head size, type, where each token's heads are.
void plan_tokens(const GqaSettings& st, const GqaInputs& in, GqaPlan& g) {
  const TensorView& q = in.query;
  ATTNKIT_REQUIRE(q.present(), "query", "is required");
  check_tensor(q, "query", 3);
  const std::optional<DType> dt = float_type(q.type);
  ATTNKIT_REQUIRE(dt.has_value(), "query", "must be float32, float16 or bfloat16, got " + type_name(q.type));
  g.dtype = *dt;
  g.batch = q.shape[0];
  g.seq = q.shape[1];
  g.heads = st.heads;
  g.kv_heads = st.kv_heads;
  ATTNKIT_REQUIRE(g.batch >= 1, "query", "dimension 0 (batch) must be >= 1, got shape " + shape_string(q.shape));
  ATTNKIT_REQUIRE(g.seq >= 1, "query", "dimension 1 (sequence length) must be >= 1, got shape " + shape_string(q.shape));
  ATTNKIT_REQUIRE(in.key.present() == in.value.present(), in.key.present() ? "value" : "key",
          "key and value must both be given, or both be absent (QKV packed in query)");
  g.packed = !in.key.present();
  const std::int64_t width = q.shape[2];
  const std::int64_t heads_in_query = g.packed ? g.heads + 2 * g.kv_heads : g.heads;
  ATTNKIT_REQUIRE(width % heads_in_query == 0, "query",
          g.packed ? "packed QKV: dimension 2 (" + str(width) +
                         ") must be a multiple of num_heads + 2 * kv_num_heads = " + str(heads_in_query)
                   : "dimension 2 (" + str(width) + ") must be a multiple of num_heads = " + str(heads_in_query));
  g.head_size = width / heads_in_query;
  ATTNKIT_REQUIRE(g.head_size >= 1 && g.head_size <= kMaxHeadSize, "query",
          "head size " + str(g.head_size) + " must be in [1, 256]");
  g.query = q.data;
  if (g.packed) {
    g.key = g.value = q.data;
    g.q_in = Layout::packed_qkv_q(g.heads, g.kv_heads, g.seq, g.head_size);
    g.k_in = Layout::packed_qkv_k(g.heads, g.kv_heads, g.seq, g.head_size);
    g.v_in = Layout::packed_qkv_v(g.heads, g.kv_heads, g.seq, g.head_size);
    return;
  }
  const std::vector<std::int64_t> kv_shape{g.batch, g.seq, g.kv_heads * g.head_size};
  for (const auto& [t, name] : {std::pair{&in.key, "key"}, std::pair{&in.value, "value"}}) {
    check_shape(*t, name, kv_shape, "(batch, sequence_length, kv_num_heads * head_size)");
    check_type(*t, name, q.type, "the query's type");
  }
  g.key = in.key.data;
  g.value = in.value.data;
  g.q_in = Layout::positions_first(g.heads, g.seq, g.head_size);
  g.k_in = Layout::positions_first(g.kv_heads, g.seq, g.head_size);
  g.v_in = Layout::positions_first(g.kv_heads, g.seq, g.head_size);
}

// seqlens_k and total_sequence_length: which step this is.
const std::int32_t* plan_lengths(const GqaInputs& in, GqaPlan& g) {
  ATTNKIT_REQUIRE(in.seqlens_k.present(), "seqlens_k", "is required");
  check_shape(in.seqlens_k, "seqlens_k", {g.batch}, "(batch)");
  check_type(in.seqlens_k, "seqlens_k", ElementType::int32, "ONNX Runtime's type M");
  const TensorView& t = in.total_sequence_length;
  ATTNKIT_REQUIRE(t.present(), "total_sequence_length", "is required");
  check_type(t, "total_sequence_length", ElementType::int32, "ONNX Runtime's type M");
  ATTNKIT_REQUIRE(t.shape.size() <= 1 && t.elements() == 1 && t.data != nullptr, "total_sequence_length",
          "must hold one element (shape () or (1,)), got shape " + shape_string(t.shape));
  g.total = *static_cast<const std::int32_t*>(t.data);
  ATTNKIT_REQUIRE(g.total >= 1, "total_sequence_length", "= " + str(g.total) + " must be >= 1");
  g.first_prompt = g.seq == g.total;
  return static_cast<const std::int32_t*>(in.seqlens_k.data);
}

// The caches: formats, shapes, types, shared or separate, scales.
void plan_caches(const GqaSettings& st, const GqaInputs& in, const GqaOutputs& out, GqaPlan& g) {
  CacheFormat kf{{st.k_quant == KvQuant::None ? KvType::Float : st.quant_type, st.k_quant}, g.dtype, g.head_size};
  CacheFormat vf{{st.v_quant == KvQuant::None ? KvType::Float : st.quant_type, st.v_quant}, g.dtype, g.head_size};
  const float* k_scales = check_scales(in.k_scale, "k_scale", "k_quant_type", st.k_quant, g.kv_heads, g.head_size);
  const float* v_scales = check_scales(in.v_scale, "v_scale", "v_quant_type", st.v_quant, g.kv_heads, g.head_size);

  ATTNKIT_REQUIRE(in.past_key.present() == in.past_value.present(), in.past_key.present() ? "past_value" : "past_key",
          "past_key and past_value must both be given, or both be absent");
  g.has_past = in.past_key.present();
  std::int64_t past_rows = 0;
  if (g.has_past) {
    past_rows = check_cache_shape(in.past_key, "past_key", kf, g.batch, g.kv_heads);
    check_cache_type(in.past_key, "past_key", kf);
    const std::int64_t v_rows = check_cache_shape(in.past_value, "past_value", vf, g.batch, g.kv_heads);
    check_cache_type(in.past_value, "past_value", vf);
    ATTNKIT_REQUIRE(v_rows == past_rows, "past_value",
            "must have past_key's dimension 2 (" + str(past_rows) + " rows), got " + str(v_rows));
  }
  ATTNKIT_REQUIRE(out.present_key.present(), "present_key", "is required (the attention reads the cache it holds)");
  ATTNKIT_REQUIRE(out.present_value.present(), "present_value", "is required (the attention reads the cache it holds)");
  const std::int64_t capacity = check_cache_shape(out.present_key.view(), "present_key", kf, g.batch, g.kv_heads);
  check_cache_type(out.present_key.view(), "present_key", kf);
  const std::int64_t v_capacity = check_cache_shape(out.present_value.view(), "present_value", vf, g.batch, g.kv_heads);
  check_cache_type(out.present_value.view(), "present_value", vf);
  ATTNKIT_REQUIRE(v_capacity == capacity, "present_value",
          "must have present_key's dimension 2 (" + str(capacity) + " rows), got " + str(v_capacity));

  const bool k_shared = g.has_past && in.past_key.data != nullptr && in.past_key.data == out.present_key.data;
  const bool v_shared = g.has_past && in.past_value.data != nullptr && in.past_value.data == out.present_value.data;
  ATTNKIT_REQUIRE(k_shared == v_shared, k_shared ? "present_value" : "present_key",
          "past and present must share memory for both key and value, or for neither");
  g.shared = k_shared;
  if (g.shared) {
    ATTNKIT_REQUIRE(in.past_key.shape == out.present_key.shape && in.past_key.type == out.present_key.type, "present_key",
            "shares past_key's memory (an in-place cache), so it must have past_key's shape " +
                shape_string(in.past_key.shape) + " and type, got " + shape_string(out.present_key.shape));
  }
  auto bytes = [](const void* p) { return static_cast<std::byte*>(const_cast<void*>(p)); };
  g.past_key = {bytes(in.past_key.data), kf, g.kv_heads, past_rows, k_scales};
  g.past_value = {bytes(in.past_value.data), vf, g.kv_heads, past_rows, v_scales};
  g.present_key = {bytes(out.present_key.data), kf, g.kv_heads, capacity, k_scales};
  g.present_value = {bytes(out.present_value.data), vf, g.kv_heads, capacity, v_scales};
}

// Per batch entry: lengths against the step and the caches (where every row goes).
void plan_rows(const GqaSettings& st, const std::int32_t* seqlens, GqaPlan& g) {
  const std::int64_t capacity = g.present_key.capacity;
  g.sliding = st.sliding_window_cache;
  ATTNKIT_REQUIRE(g.seq <= capacity, "present_key",
          "holds " + str(capacity) + " rows per head, fewer than the " + str(g.seq) + " tokens of this call");
  g.rows.assign(static_cast<std::size_t>(g.batch), BatchPlan{});
  for (std::int64_t b = 0; b < g.batch; ++b) {
    const std::string name = "seqlens_k[" + str(b) + "]";
    const std::int64_t sk = seqlens[b];
    ATTNKIT_REQUIRE(sk >= 0, name, "= " + str(sk) + " must be >= 0 (it is the sequence's total length minus one)");
    const std::int64_t total = sk + 1;
    ATTNKIT_REQUIRE(
        total <= g.total, name,
        "= " + str(sk) + ": the sequence's " + str(total) + " tokens exceed total_sequence_length = " + str(g.total));
    std::int64_t past = 0;
    // A first prompt has sequence_length == total_sequence_length, so the rule above keeps its lengths <= S.
    if (!g.first_prompt) {
      ATTNKIT_REQUIRE(total >= g.seq, name,
              "= " + str(sk) + " gives a total length of " + str(total) + ", fewer than the " + str(g.seq) +
                  " new tokens (it counts past and new tokens, minus one)");
      past = total - g.seq;
    }
    ATTNKIT_REQUIRE(past == 0 || g.has_past, "past_key",
            "is absent but " + name + " = " + str(sk) + " implies " + str(past) + " earlier tokens");
    BatchPlan& r = g.rows[static_cast<std::size_t>(b)];
    r.total = static_cast<std::int32_t>(total);
    r.past = static_cast<std::int32_t>(past);
    if (!g.sliding) {
      if (g.has_past && !g.shared) {
        ATTNKIT_REQUIRE(past <= g.past_key.capacity, name,
                "= " + str(sk) + " implies " + str(past) + " earlier tokens but past_key holds only " +
                    str(g.past_key.capacity) + " rows");
      }
      if (!g.first_prompt) {
        ATTNKIT_REQUIRE(total <= capacity, name,
                "= " + str(sk) + " exceeds the cache capacity " + str(capacity) + " (present_key dimension 2): the " +
                    "sequence needs " + str(total) + " rows");
      }
      r.past_rows = r.past;
      r.write_row = r.past;
    } else {
      const std::int64_t past_capacity = g.has_past ? g.past_key.capacity : 0;
      const std::int64_t past_rows = std::min(past, past_capacity);
      const std::int64_t drop = std::max<std::int64_t>(0, past_rows + g.seq - capacity);
      const std::int64_t first = past - past_rows + drop;
      const std::int64_t needed = std::max<std::int64_t>(0, past + 1 - st.window);
      ATTNKIT_REQUIRE(
          first <= needed, "present_key",
          "sliding_window_cache: batch entry " + str(b) + " keeps tokens from " + str(first) +
              " on, but its first query (position " + str(past) + ") sees tokens from " + str(needed) +
              " on: the window cache needs local_window_size - 1 + sequence_length = " +
              str(core::saturating_add(st.window - 1, g.seq)) +
              " rows (it has " + str(capacity) + ", and past_key " + str(past_capacity) + ")");
      r.past_rows = static_cast<std::int32_t>(past_rows);
      r.drop = static_cast<std::int32_t>(drop);
      r.write_row = static_cast<std::int32_t>(past_rows - drop);
      r.first = static_cast<std::int32_t>(first);
    }
    r.key_rows = static_cast<std::int32_t>(total - r.first);
  }
}

// cos/sin caches, position ids, Q/K norm weights.
void plan_rotary_and_norm(const GqaSettings& st, const GqaInputs& in, GqaPlan& g) {
  const ElementType qt = in.query.type;
  ATTNKIT_REQUIRE(in.cos_cache.present() == in.sin_cache.present(), in.cos_cache.present() ? "sin_cache" : "cos_cache",
          "cos_cache and sin_cache must both be given, or both be absent");
  g.rotary = st.rotary;
  g.interleaved = st.interleaved;
  if (st.rotary) ATTNKIT_REQUIRE(in.cos_cache.present(), "cos_cache", "is required when do_rotary = 1 (with sin_cache)");
  if (in.cos_cache.present()) {
    check_tensor(in.cos_cache, "cos_cache", 2);
    check_type(in.cos_cache, "cos_cache", qt, "the query's type");
    check_shape(in.sin_cache, "sin_cache", in.cos_cache.shape, "cos_cache's shape");
    check_type(in.sin_cache, "sin_cache", qt, "the query's type");
    const std::int64_t half = in.cos_cache.shape[1];
    ATTNKIT_REQUIRE(half >= 1 && 2 * half <= g.head_size, "cos_cache",
            "dimension 1 (rotary_dim / 2 = " + str(half) + ") must be in [1, head_size / 2 = " + str(g.head_size / 2) +
                "]");
    g.cos_cache = in.cos_cache.data;
    g.sin_cache = in.sin_cache.data;
    g.rotary_half = half;
    g.rotary_max_len = in.cos_cache.shape[0];
  }
  if (in.position_ids.present()) {
    check_tensor(in.position_ids, "position_ids", 2);
    check_type(in.position_ids, "position_ids", ElementType::int64, "ONNX Runtime's type");
    ATTNKIT_REQUIRE(in.position_ids.shape[0] == g.batch && in.position_ids.shape[1] >= g.seq, "position_ids",
            "must have shape (batch, >= sequence_length) = (" + str(g.batch) + ", >= " + str(g.seq) + "), got " +
                shape_string(in.position_ids.shape));
    g.position_ids = static_cast<const std::int64_t*>(in.position_ids.data);
    g.position_row = in.position_ids.shape[1];
  }
  if (g.rotary) {
    for (std::int64_t b = 0; b < g.batch; ++b) {
      for (std::int64_t s = 0; s < g.seq; ++s) {
        const std::int64_t p = g.position(b, s);
        if (p >= 0 && p < g.rotary_max_len) continue;
        if (g.position_ids != nullptr) {
          throw Error("position_ids[" + str(b) + "][" + str(s) + "]",
                      "= " + str(p) + " is outside [0, " + str(g.rotary_max_len) + ") (cos_cache dimension 0)");
        }
        throw Error("cos_cache", "holds " + str(g.rotary_max_len) + " positions but batch entry " + str(b) +
                                     " needs position " + str(p) + " (dimension 0 must exceed every position)");
      }
    }
  }
  ATTNKIT_REQUIRE(in.q_norm_weight.present() == in.k_norm_weight.present(),
          in.q_norm_weight.present() ? "k_norm_weight" : "q_norm_weight",
          "q_norm_weight and k_norm_weight must both be given, or both be absent");
  if (in.q_norm_weight.present()) {
    for (const auto& [t, name] :
         {std::pair{&in.q_norm_weight, "q_norm_weight"}, std::pair{&in.k_norm_weight, "k_norm_weight"}}) {
      check_shape(*t, name, {g.head_size}, "(head_size)");
      check_type(*t, name, qt, "the query's type");
    }
    g.qk_norm = true;
    g.q_norm_weight = in.q_norm_weight.data;
    g.k_norm_weight = in.k_norm_weight.data;
  }
  g.norm_epsilon = st.norm_epsilon;
}

// attention_bias, head_sink and the outputs.
void plan_extras_and_outputs(const GqaSettings& st, const GqaInputs& in, const GqaOutputs& out, GqaPlan& g) {
  const ElementType qt = in.query.type;
  if (in.attention_bias.present()) {
    const TensorView& t = in.attention_bias;
    check_tensor(t, "attention_bias", 4);
    check_type(t, "attention_bias", qt, "the query's type");
    ATTNKIT_REQUIRE((t.shape[0] == 1 || t.shape[0] == g.batch) && (t.shape[1] == 1 || t.shape[1] == g.heads) &&
                t.shape[2] == g.seq && t.shape[3] == g.total,
            "attention_bias",
            "must have shape (batch or 1, num_heads or 1, sequence_length, total_sequence_length) = (" + str(g.batch) +
                " or 1, " + str(g.heads) + " or 1, " + str(g.seq) + ", " + str(g.total) + "), got " +
                shape_string(t.shape));
    g.bias = t.data;
    g.bias_batch = t.shape[0];
    g.bias_heads = t.shape[1];
  }
  if (in.head_sink.present()) {
    ATTNKIT_REQUIRE(!st.smooth_softmax, "head_sink", "must be absent when smooth_softmax = 1 (each adds a sink; use one)");
    check_shape(in.head_sink, "head_sink", {g.heads}, "(num_heads)");
    check_type(in.head_sink, "head_sink", qt, "the query's type");
    g.sink = SinkMode::HeadSink;
    g.head_sink = in.head_sink.data;
  } else if (st.smooth_softmax) {
    g.sink = SinkMode::Smooth;
  }

  ATTNKIT_REQUIRE(out.output.present(), "output", "is required");
  check_shape(out.output, "output", {g.batch, g.seq, g.heads * g.head_size},
              "(batch, sequence_length, num_heads * head_size)");
  check_type(out.output, "output", qt, "the query's type");
  g.output = out.output.data;
  g.qk_output = st.qk_output;
  if (st.qk_output != QkOutput::None) {
    ATTNKIT_REQUIRE(out.output_qk.present(), "output_qk",
            "is required when qk_output = " + str(static_cast<int>(st.qk_output)));
    check_shape(out.output_qk, "output_qk", {g.batch, g.heads, g.seq, g.total},
                "(batch, num_heads, sequence_length, total_sequence_length)");
    check_type(out.output_qk, "output_qk", qt, "the query's type");
    g.output_qk = out.output_qk.data;
  } else {
    ATTNKIT_REQUIRE(!out.output_qk.present(), "output_qk", "is given but qk_output = 0 (nothing would be written to it)");
  }
}

// Every present tensor passed check_dimensions (plan_call's checks name each one), so this fits; an unchecked
// one (none today) would count as reaching every address.
std::int64_t byte_size(const TensorView& t) {
  if (!t.present()) return 0;
  std::int64_t bytes = static_cast<std::int64_t>(element_size(t.type));
  for (std::int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return core::kInt64Max;
  }
  return bytes;
}

}  // namespace

GqaPlan plan_call(const GqaSettings& st, const GqaInputs& in, const GqaOutputs& out) {
  GqaPlan g;
  plan_tokens(st, in, g);
  const std::int32_t* seqlens = plan_lengths(in, g);
  plan_caches(st, in, out, g);
  plan_rows(st, seqlens, g);
  plan_rotary_and_norm(st, in, g);
  plan_extras_and_outputs(st, in, out, g);
  g.scale = st.scale != 0.0f ? st.scale : 1.0f / std::sqrt(static_cast<float>(g.head_size));
  g.softcap = st.softcap;
  g.window = st.window;
  g.causal = st.causal;

  std::vector<Region> regions;
  for (int i = 0; i < GqaInputs::kCount; ++i) {
    const TensorView& t = in.input(i);
    regions.push_back({std::string(gqa_input_name(i)), t.data, byte_size(t), false});
  }
  for (int i = 0; i < GqaOutputs::kCount; ++i) {
    const MutableTensorView& t = out.output_at(i);
    regions.push_back({std::string(gqa_output_name(i)), t.data, byte_size(t.view()), true});
  }
  check_overlaps(regions, g.shared ? in.past_key.data : nullptr, g.shared ? in.past_value.data : nullptr);
  return g;
}

std::array<GqaOutputSpec, GqaOutputs::kCount> output_specs(const GqaSettings& st, const GqaInputs& in) {
  GqaPlan g;
  plan_tokens(st, in, g);
  plan_lengths(in, g);
  const CacheFormat kf{{st.k_quant == KvQuant::None ? KvType::Float : st.quant_type, st.k_quant}, g.dtype, g.head_size};
  const CacheFormat vf{{st.v_quant == KvQuant::None ? KvType::Float : st.quant_type, st.v_quant}, g.dtype, g.head_size};
  std::array<GqaOutputSpec, GqaOutputs::kCount> specs;
  specs[0] = {true, in.query.type, {g.batch, g.seq, g.heads * g.head_size}};
  // ONNX Runtime's present length: max(total_sequence_length, past rows); a window cache keeps its size.
  const bool past = in.past_key.present() && in.past_key.shape.size() == 4;
  const std::int64_t past_rows = past ? in.past_key.shape[2] : 0;
  const std::int64_t rows = past && st.sliding_window_cache ? past_rows : std::max<std::int64_t>(g.total, past_rows);
  specs[1] = {true, cache_element(kf), {g.batch, g.kv_heads, rows, kf.last_dim()}};
  specs[2] = {true, cache_element(vf), {g.batch, g.kv_heads, specs[1].shape[2], vf.last_dim()}};
  if (st.qk_output != QkOutput::None) specs[3] = {true, in.query.type, {g.batch, g.heads, g.seq, g.total}};
  return specs;
}

}  // namespace attnkit::gqa
