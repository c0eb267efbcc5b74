// What the GQA tests share: a call built from a few options (random inputs in the caller's memory, the views
// the op takes), and an independent float64 GroupQueryAttention written from the contract
// (/work/shared/SPEC-gqa.md), step by step, in token space: it never looks at the library's GQA code.
#pragma once

#include <algorithm>
#include <attnkit/gqa.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <testing/case_data.hpp>
#include <vector>

namespace attnkit::test {

inline ElementType element_type_of(DType t) {
  return t == DType::f32 ? ElementType::float32 : t == DType::f16 ? ElementType::float16 : ElementType::bfloat16;
}
inline std::string dtype_str(DType t) { return std::string(dtype_name(t)); }

struct GqaOptions {
  DType dtype = DType::f32;
  std::int64_t batch = 2, seq = 1, heads = 4, kv_heads = 2, head_size = 16;
  std::vector<std::int32_t> lengths;  // T_b per batch entry (seqlens_k + 1)
  std::int32_t total = 0;             // total_sequence_length (0: max length)
  bool has_past = true;
  std::int64_t past_rows = 0;     // past cache rows (0: present rows)
  std::int64_t present_rows = 0;  // present cache rows (0: max(total, past_rows))
  bool shared = false;
  bool packed = false;
  bool rotary = false, interleaved = false;
  std::int64_t rotary_half = 0;  // 0: head_size / 2
  std::int64_t max_len = 0;      // cos/sin rows (0: total + 3)
  bool position_ids = false;     // random positions in [0, max_len)
  bool norm = false;
  bool bias = false;
  std::int64_t bias_batch = 0, bias_heads = 0;  // 0: full
  bool head_sink = false;
  std::int64_t smooth_softmax = -1;
  float softcap = 0.0f, scale = 0.0f;
  std::int64_t window = -1;
  std::int64_t causal = 1;
  std::string k_quant = "NONE", v_quant = "NONE";
  std::int64_t bits = 8;
  bool sliding = false;
  std::int64_t qk_output = 0;
  std::uint64_t seed = 1;
};

// One call: attributes, inputs and outputs in vectors this object owns.
struct GqaCall {
  GqaOptions o;
  GqaAttributes attrs;
  std::vector<std::byte> query, key, value, past_key, past_value, cos, sin, bias, sink, q_norm, k_norm;
  std::vector<std::int32_t> seqlens;
  std::int32_t total = 0;
  std::vector<std::int64_t> positions;
  std::vector<float> k_scale, v_scale;
  std::vector<std::byte> output, present_key, present_value, output_qk;
  std::vector<std::byte> past_key_before, past_value_before;  // the past caches as they were (shared: overwritten)
  std::int64_t H = 0, P = 0, C = 0, rot_half = 0, max_len = 0;
  std::vector<std::int64_t> query_shape, cache_k_shape, cache_v_shape;

  bool first_prompt() const { return o.seq == total; }
  std::size_t es() const { return dtype_size(o.dtype); }
  bool k_quantized() const { return o.k_quant != "NONE"; }
  bool v_quantized() const { return o.v_quant != "NONE"; }
  // Bytes of one cache row: H values of the type, H int8, or (H + 1) / 2 int4 bytes.
  std::int64_t row_bytes(bool quantized) const {
    if (!quantized) return H * static_cast<std::int64_t>(es());
    return o.bits == 8 ? H : (H + 1) / 2;
  }
  std::int64_t last_dim(bool quantized) const { return quantized && o.bits == 4 ? (H + 1) / 2 : H; }
  ElementType cache_type(bool quantized) const {
    return !quantized ? element_type_of(o.dtype) : o.bits == 8 ? ElementType::int8 : ElementType::uint8;
  }

  GqaInputs inputs() const {
    GqaInputs in;
    const ElementType t = element_type_of(o.dtype);
    in.query = {query.data(), t, query_shape};
    if (!o.packed) {
      in.key = {key.data(), t, {o.batch, o.seq, o.kv_heads * H}};
      in.value = {value.data(), t, {o.batch, o.seq, o.kv_heads * H}};
    }
    if (o.has_past) {
      in.past_key = {o.shared ? present_key.data() : past_key.data(),
                     cache_type(k_quantized()),
                     {o.batch, o.kv_heads, P, last_dim(k_quantized())}};
      in.past_value = {o.shared ? present_value.data() : past_value.data(),
                       cache_type(v_quantized()),
                       {o.batch, o.kv_heads, P, last_dim(v_quantized())}};
    }
    in.seqlens_k = {seqlens.data(), ElementType::int32, {o.batch}};
    in.total_sequence_length = {&total, ElementType::int32, {1}};
    if (o.rotary) {
      in.cos_cache = {cos.data(), t, {max_len, rot_half}};
      in.sin_cache = {sin.data(), t, {max_len, rot_half}};
    }
    if (o.position_ids) in.position_ids = {positions.data(), ElementType::int64, {o.batch, o.seq}};
    if (o.bias) in.attention_bias = {bias.data(), t, {o.bias_batch, o.bias_heads, o.seq, total}};
    if (o.head_sink) in.head_sink = {sink.data(), t, {o.heads}};
    if (k_quantized()) in.k_scale = {k_scale.data(), ElementType::float32, {static_cast<std::int64_t>(k_scale.size())}};
    if (v_quantized()) in.v_scale = {v_scale.data(), ElementType::float32, {static_cast<std::int64_t>(v_scale.size())}};
    if (o.norm) {
      in.q_norm_weight = {q_norm.data(), t, {H}};
      in.k_norm_weight = {k_norm.data(), t, {H}};
    }
    return in;
  }
  GqaOutputs outputs() {
    GqaOutputs out;
    const ElementType t = element_type_of(o.dtype);
    out.output = {output.data(), t, {o.batch, o.seq, o.heads * H}};
    out.present_key = {
        present_key.data(), cache_type(k_quantized()), {o.batch, o.kv_heads, C, last_dim(k_quantized())}};
    out.present_value = {
        present_value.data(), cache_type(v_quantized()), {o.batch, o.kv_heads, C, last_dim(v_quantized())}};
    if (o.qk_output != 0) out.output_qk = {output_qk.data(), t, {o.batch, o.heads, o.seq, total}};
    return out;
  }

  float at(const std::vector<std::byte>& buf, std::int64_t i) const { return load_as_float(buf.data(), o.dtype, i); }

  // Fills every output with a NaN pattern no computation writes; a shared cache is restored to its past.
  void poison() {
    const auto fill = [&](std::vector<std::byte>& b) {
      for (std::size_t i = 0; i + 1 < b.size(); i += 2) {
        b[i] = std::byte{0x5a};
        b[i + 1] = std::byte{0x7f};  // 0x7f5a: a float16 / bfloat16 NaN; pairs make 0x7f5a7f5a, a float32 NaN
      }
    };
    fill(output);
    fill(output_qk);
    if (o.shared) {
      present_key = past_key_before;
      present_value = past_value_before;
    } else {
      for (auto& b : present_key) b = std::byte{0xA5};
      for (auto& b : present_value) b = std::byte{0xA5};
    }
  }
};

inline GqaCall make_call(const GqaOptions& opt) {
  GqaCall c;
  c.o = opt;
  GqaOptions& o = c.o;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  c.H = o.head_size;
  if (o.lengths.empty()) o.lengths.assign(static_cast<std::size_t>(o.batch), static_cast<std::int32_t>(o.seq));
  c.total = o.total > 0 ? o.total : *std::max_element(o.lengths.begin(), o.lengths.end());
  for (std::int32_t len : o.lengths) c.seqlens.push_back(len - 1);
  c.C = o.present_rows > 0 ? o.present_rows : std::max<std::int64_t>(c.total, o.past_rows);
  c.P = o.has_past ? (o.shared ? c.C : (o.past_rows > 0 ? o.past_rows : c.C)) : 0;
  c.rot_half = o.rotary_half > 0 ? o.rotary_half : c.H / 2;
  c.max_len = o.max_len > 0 ? o.max_len : c.total + 3;
  if (o.bias_batch == 0) o.bias_batch = o.batch;
  if (o.bias_heads == 0) o.bias_heads = o.heads;

  c.attrs.num_heads = o.heads;
  c.attrs.kv_num_heads = o.kv_heads;
  c.attrs.scale = o.scale;
  c.attrs.softcap = o.softcap;
  c.attrs.local_window_size = o.window;
  c.attrs.causal = o.causal;
  c.attrs.do_rotary = o.rotary ? 1 : 0;
  c.attrs.rotary_interleaved = o.interleaved ? 1 : 0;
  c.attrs.smooth_softmax = o.smooth_softmax;
  c.attrs.qk_output = o.qk_output;
  c.attrs.k_quant_type = o.k_quant;
  c.attrs.v_quant_type = o.v_quant;
  c.attrs.kv_cache_bit_width = (o.k_quant != "NONE" || o.v_quant != "NONE") ? o.bits : 0;
  c.attrs.sliding_window_cache = o.sliding ? 1 : 0;

  const std::size_t es = c.es();
  auto random_floats = [&](std::vector<std::byte>& buf, std::int64_t count, double std_dev, double mean = 0.0) {
    buf.resize(static_cast<std::size_t>(count) * es);
    for (std::int64_t i = 0; i < count; ++i)
      store_from_float(buf.data(), o.dtype, i, static_cast<float>(mean + std_dev * normal(rng)));
  };
  const std::int64_t width = o.packed ? (o.heads + 2 * o.kv_heads) * c.H : o.heads * c.H;
  c.query_shape = {o.batch, o.seq, width};
  random_floats(c.query, o.batch * o.seq * width, 1.0);
  if (!o.packed) {
    random_floats(c.key, o.batch * o.seq * o.kv_heads * c.H, 1.0);
    random_floats(c.value, o.batch * o.seq * o.kv_heads * c.H, 1.0);
  }
  // Scales: a range that holds about 3.5 standard deviations of the (unit-variance) K and V.
  auto make_scales = [&](const std::string& quant, std::vector<float>& s) {
    const double top = o.bits == 8 ? 127.0 : 7.0;
    if (quant == "PER_TENSOR") s = {static_cast<float>(3.5 / top)};
    if (quant == "PER_CHANNEL") {
      for (std::int64_t i = 0; i < o.kv_heads * c.H; ++i)
        s.push_back(static_cast<float>((2.5 + 2.0 * uniform(rng)) / top));
    }
  };
  make_scales(o.k_quant, c.k_scale);
  make_scales(o.v_quant, c.v_scale);
  auto random_cache = [&](std::vector<std::byte>& buf, bool quantized, std::int64_t rows) {
    const std::int64_t heads_rows = o.batch * o.kv_heads * rows;
    if (!quantized) {
      random_floats(buf, heads_rows * c.H, 1.0);
      return;
    }
    buf.resize(static_cast<std::size_t>(heads_rows * c.row_bytes(true)));
    for (auto& b : buf) {
      b = static_cast<std::byte>(o.bits == 8
                                     ? static_cast<int>(std::clamp(std::lround(normal(rng) * 127 / 3.5), -127l, 127l))
                                     : static_cast<int>(rng() & 0xFF));
    }
  };
  if (o.has_past) {
    random_cache(c.past_key, c.k_quantized(), c.P);
    random_cache(c.past_value, c.v_quantized(), c.P);
  }
  c.past_key_before = c.past_key;
  c.past_value_before = c.past_value;
  c.present_key.resize(static_cast<std::size_t>(o.batch * o.kv_heads * c.C * c.row_bytes(c.k_quantized())));
  c.present_value.resize(static_cast<std::size_t>(o.batch * o.kv_heads * c.C * c.row_bytes(c.v_quantized())));
  if (o.rotary) {
    c.cos.resize(static_cast<std::size_t>(c.max_len * c.rot_half) * es);
    c.sin.resize(c.cos.size());
    for (std::int64_t p = 0; p < c.max_len; ++p) {
      for (std::int64_t i = 0; i < c.rot_half; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * static_cast<double>(i) / (2.0 * c.rot_half));
        store_from_float(c.cos.data(), o.dtype, p * c.rot_half + i, static_cast<float>(std::cos(angle)));
        store_from_float(c.sin.data(), o.dtype, p * c.rot_half + i, static_cast<float>(std::sin(angle)));
      }
    }
  }
  if (o.position_ids) {
    std::uniform_int_distribution<std::int64_t> pos(0, c.max_len - 1);
    for (std::int64_t i = 0; i < o.batch * o.seq; ++i) c.positions.push_back(pos(rng));
  }
  if (o.bias) {
    const std::int64_t n = o.bias_batch * o.bias_heads * o.seq * c.total;
    random_floats(c.bias, n, 1.0);
    for (std::int64_t i = 0; i < n; i += 7)
      store_from_float(c.bias.data(), o.dtype, i, -std::numeric_limits<float>::infinity());
  }
  if (o.head_sink) random_floats(c.sink, o.heads, 1.0);
  if (o.norm) {
    random_floats(c.q_norm, c.H, 0.2, 1.0);
    random_floats(c.k_norm, c.H, 0.2, 1.0);
  }
  c.output.resize(static_cast<std::size_t>(o.batch * o.seq * o.heads * c.H) * es);
  if (o.qk_output != 0) c.output_qk.resize(static_cast<std::size_t>(o.batch * o.heads * o.seq * c.total) * es);
  if (o.shared) {
    c.present_key = c.past_key;
    c.present_value = c.past_value;
  }
  c.poison();
  return c;
}

// ---- the float64 reference, written from the contract ----

struct GqaExpected {
  std::vector<double> output;  // (B, S, N*H)
  std::vector<double> qk;      // (B, N, S, T)
  // Per cache: the value every present value must hold (float caches: the number; quantized: the integer q),
  // and whether it is defined (rows a shared cache leaves untouched hold what they held, also defined).
  std::vector<double> present_k, present_v;
  std::vector<std::int64_t> key_first;  // per batch: the token held by present row 0
};

inline int ref_int4(std::uint8_t byte, bool high) { return (high ? byte >> 4 : byte & 0xF) - 8; }

// The quantized integer of a cache value, read from `bytes` (value index `index`).
inline int ref_quantized_at(const std::vector<std::byte>& bytes, std::int64_t bits, std::int64_t row_bytes,
                            std::int64_t row, std::int64_t d) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data()) + row * row_bytes;
  return bits == 8 ? static_cast<int>(static_cast<std::int8_t>(p[d])) : ref_int4(p[d / 2], d % 2 == 1);
}

// The reference. `present_k_read` / `present_v_read`: the op's present caches, read back for a quantized
// cache's attention (its values are checked against `present_k` / `present_v` separately): the attention is
// then exactly dequantize-then-attend on what the op stored.
inline GqaExpected gqa_reference(const GqaCall& c, const std::vector<std::byte>& present_k_read,
                                 const std::vector<std::byte>& present_v_read) {
  const GqaOptions& o = c.o;
  const std::int64_t B = o.batch, S = o.seq, N = o.heads, Nkv = o.kv_heads, H = c.H, T = c.total;
  const DType dt = o.dtype;
  const bool first_prompt = c.first_prompt();
  const double scale = o.scale != 0.0f ? o.scale : 1.0 / std::sqrt(static_cast<double>(H));
  constexpr double kInf = std::numeric_limits<double>::infinity();
  GqaExpected e;
  e.output.assign(static_cast<std::size_t>(B * S * N * H), 0.0);
  e.qk.assign(static_cast<std::size_t>(B * N * S * T), 0.0);
  e.key_first.assign(static_cast<std::size_t>(B), 0);

  // Step 2-3: RMS norm then rotary, in float64, rounded to T (Q' and K' are tensors of type T).
  const std::int64_t token = o.packed ? (N + 2 * Nkv) * H : N * H;
  auto new_row = [&](const std::vector<std::byte>& src, std::int64_t at, const std::vector<std::byte>* w,
                     std::int64_t pos, bool transform) {
    std::vector<double> x(static_cast<std::size_t>(H));
    for (std::int64_t d = 0; d < H; ++d) x[d] = c.at(src, at + d);
    if (!transform) return x;
    if (o.norm) {
      double ms = 0.0;
      for (double v : x) ms += v * v;
      ms /= static_cast<double>(H);
      for (std::int64_t d = 0; d < H; ++d) x[d] = x[d] / std::sqrt(ms + 1e-6) * c.at(*w, d);
    }
    if (o.rotary) {
      const std::int64_t half = c.rot_half;
      std::vector<double> y = x;
      for (std::int64_t i = 0; i < half; ++i) {
        const double cs = c.at(c.cos, pos * half + i), sn = c.at(c.sin, pos * half + i);
        const std::int64_t a = o.interleaved ? 2 * i : i, b = o.interleaved ? 2 * i + 1 : i + half;
        y[a] = x[a] * cs - x[b] * sn;
        y[b] = x[b] * cs + x[a] * sn;
      }
      x = y;
    }
    for (double& v : x) v = round_to(dt, static_cast<float>(v));
    return x;
  };

  const auto quant_value = [&](double x, const std::vector<float>& s, std::int64_t kvh, std::int64_t d) {
    const double sc = s.size() == 1 ? s[0] : s[static_cast<std::size_t>(kvh * H + d)];
    const double top = o.bits == 8 ? 127 : 7, bottom = o.bits == 8 ? -128 : -8;
    return std::clamp(std::nearbyint(x / sc), bottom, top);
  };
  const auto scale_of = [&](const std::vector<float>& s, std::int64_t kvh, std::int64_t d) {
    return static_cast<double>(s.size() == 1 ? s[0] : s[static_cast<std::size_t>(kvh * H + d)]);
  };

  e.present_k.assign(static_cast<std::size_t>(B * Nkv * c.C * H), 0.0);
  e.present_v.assign(e.present_k.size(), 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t total = o.lengths[static_cast<std::size_t>(b)];
    const std::int64_t past = first_prompt ? 0 : total - S;
    auto position = [&](std::int64_t s) {
      return o.position_ids ? c.positions[static_cast<std::size_t>(b * S + s)] : past + s;
    };
    // The rows the past cache holds: tokens [past - past_rows, past). A window cache keeps the newest.
    const std::int64_t past_rows = o.sliding ? std::min(past, c.P) : past;
    const std::int64_t past_first = past - past_rows;
    // Step 4: after the append the present holds past_rows + S rows, minus what a full window cache drops.
    const std::int64_t drop = o.sliding ? std::max<std::int64_t>(0, past_rows + S - c.C) : 0;
    const std::int64_t first = past_first + drop;
    e.key_first[static_cast<std::size_t>(b)] = first;

    for (std::int64_t kvh = 0; kvh < Nkv; ++kvh) {
      // Token -> K, V value (double) as the cache holds it, and as integers for a quantized cache.
      std::map<std::int64_t, std::vector<double>> kt, vt, kq, vq;
      const std::int64_t head = (b * Nkv + kvh);
      for (std::int64_t r = 0; r < past_rows; ++r) {
        const std::int64_t row = head * c.P + r;
        std::vector<double> k(H), v(H), kqi(H), vqi(H);
        for (std::int64_t d = 0; d < H; ++d) {
          if (c.k_quantized()) {
            kqi[d] = ref_quantized_at(c.past_key_before, o.bits, c.row_bytes(true), row, d);
            k[d] = kqi[d] * scale_of(c.k_scale, kvh, d);
          } else {
            k[d] = c.at(c.past_key_before, row * H + d);
          }
          if (c.v_quantized()) {
            vqi[d] = ref_quantized_at(c.past_value_before, o.bits, c.row_bytes(true), row, d);
            v[d] = vqi[d] * scale_of(c.v_scale, kvh, d);
          } else {
            v[d] = c.at(c.past_value_before, row * H + d);
          }
        }
        kt[past_first + r] = k, vt[past_first + r] = v, kq[past_first + r] = kqi, vq[past_first + r] = vqi;
      }
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t tok = b * S * token + s * token;
        const std::int64_t k_at = o.packed ? tok + (N + kvh) * H : (b * S + s) * Nkv * H + kvh * H;
        const std::int64_t v_at = o.packed ? tok + (N + Nkv + kvh) * H : (b * S + s) * Nkv * H + kvh * H;
        std::vector<double> k = new_row(o.packed ? c.query : c.key, k_at, &c.k_norm, position(s), true);
        std::vector<double> v = new_row(o.packed ? c.query : c.value, v_at, nullptr, 0, false);
        std::vector<double> kqi(H), vqi(H);
        for (std::int64_t d = 0; d < H; ++d) {
          if (c.k_quantized())
            kqi[d] = quant_value(k[d], c.k_scale, kvh, d), k[d] = kqi[d] * scale_of(c.k_scale, kvh, d);
          if (c.v_quantized())
            vqi[d] = quant_value(v[d], c.v_scale, kvh, d), v[d] = vqi[d] * scale_of(c.v_scale, kvh, d);
        }
        kt[past + s] = k, vt[past + s] = v, kq[past + s] = kqi, vq[past + s] = vqi;
      }
      // The expected present rows: row r holds token first + r up to past + S; then zeros (separate) or the
      // shared buffer's old content.
      for (std::int64_t r = 0; r < c.C; ++r) {
        const std::int64_t tok = first + r;
        const std::size_t at = static_cast<std::size_t>((head * c.C + r) * H);
        const bool held = tok < past + S && kt.count(tok) > 0;
        for (std::int64_t d = 0; d < H; ++d) {
          double ek = 0.0, ev = 0.0;
          if (held) {
            ek = c.k_quantized() ? kq[tok][d] : kt[tok][d];
            ev = c.v_quantized() ? vq[tok][d] : vt[tok][d];
          } else if (o.shared) {  // untouched: what the buffer held
            ek = c.k_quantized() ? ref_quantized_at(c.past_key_before, o.bits, c.row_bytes(true), head * c.C + r, d)
                                 : c.at(c.past_key_before, (head * c.C + r) * H + d);
            ev = c.v_quantized() ? ref_quantized_at(c.past_value_before, o.bits, c.row_bytes(true), head * c.C + r, d)
                                 : c.at(c.past_value_before, (head * c.C + r) * H + d);
          }
          e.present_k[at + d] = ek;
          e.present_v[at + d] = ev;
        }
      }
      // A quantized cache's attention reads what the op stored (checked against the integers above).
      if (c.k_quantized() || c.v_quantized()) {
        for (auto& [tok, k] : kt) {
          if (tok < first || tok >= past + S) continue;
          const std::int64_t row = head * c.C + (tok - first);
          for (std::int64_t d = 0; d < H; ++d) {
            if (c.k_quantized())
              k[d] = ref_quantized_at(present_k_read, o.bits, c.row_bytes(true), row, d) * scale_of(c.k_scale, kvh, d);
            if (c.v_quantized())
              vt[tok][d] =
                  ref_quantized_at(present_v_read, o.bits, c.row_bytes(true), row, d) * scale_of(c.v_scale, kvh, d);
          }
        }
      }

      // Steps 5-8 for every query head of this kv head.
      for (std::int64_t g = 0; g < N / Nkv; ++g) {
        const std::int64_t h = kvh * (N / Nkv) + g;
        for (std::int64_t i = 0; i < S; ++i) {
          const std::int64_t q_at = o.packed ? b * S * token + i * token + h * H : (b * S + i) * N * H + h * H;
          const std::vector<double> q = new_row(c.query, q_at, &c.q_norm, position(i), true);
          const std::int64_t p = past + i;
          std::vector<std::pair<std::int64_t, double>> scores;
          double max = -kInf;
          for (std::int64_t j = 0; j < total; ++j) {
            if (o.causal == 1 && j > p) continue;
            if (o.window > 0 && j <= p - o.window) continue;
            double dot = 0.0;
            for (std::int64_t d = 0; d < H; ++d) dot += q[d] * kt.at(j)[d];
            double sc = scale * dot;
            if (o.softcap > 0) sc = o.softcap * std::tanh(sc / o.softcap);
            if (o.bias) {
              const std::int64_t bb = o.bias_batch == 1 ? 0 : b, bh = o.bias_heads == 1 ? 0 : h;
              sc += c.at(c.bias, ((bb * o.bias_heads + bh) * S + i) * T + j);
            }
            scores.push_back({j, sc});
            max = std::max(max, sc);
          }
          const std::size_t qk_row = static_cast<std::size_t>(((b * N + h) * S + i) * T);
          if (o.qk_output == 1)
            for (auto [j, sc] : scores) e.qk[qk_row + static_cast<std::size_t>(j)] = sc;
          const bool sink = o.head_sink || o.smooth_softmax == 1;
          const double sink_logit = o.head_sink ? c.at(c.sink, h) : 0.0;
          const double m = sink ? std::max(max, sink_logit) : max;
          double denominator = sink ? std::exp(sink_logit - m) : 0.0;
          for (auto& [j, sc] : scores) denominator += sc == -kInf ? 0.0 : std::exp(sc - m);
          for (auto [j, sc] : scores) {
            const double w = denominator > 0 && sc != -kInf ? std::exp(sc - m) / denominator : 0.0;
            if (o.qk_output == 2) e.qk[qk_row + static_cast<std::size_t>(j)] = w;
            for (std::int64_t d = 0; d < H; ++d)
              e.output[static_cast<std::size_t>(((b * S + i) * N + h) * H + d)] += w * vt.at(j)[d];
          }
        }
      }
    }
  }
  return e;
}

// max |x - ref| / max |ref| over `ref` (NaN or inf in x, where ref is finite, gives +inf).
inline double scaled_error(const std::vector<double>& ref, const std::vector<std::byte>& got, DType t) {
  double diff = 0.0, top = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double x = load_as_float(got.data(), t, static_cast<std::int64_t>(i));
    if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(x - ref[i]));
    top = std::max(top, std::abs(ref[i]));
  }
  return top > 0.0 ? diff / top : diff;
}

}  // namespace attnkit::test
