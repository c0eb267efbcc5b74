// The attention core reading quantized K/V caches in place (int8, int4; per tensor, per channel), and a
// float16 / bfloat16 additive mask:
//   - against dequantize-then-attend: the same call on a float32 copy of the dequantized cache must give the
//     same bits (every reader computes the same float q * scale, and the kernel's arithmetic after widening
//     is the float32 path's);
//   - against the float64 reference, within the contract's bound;
//   - independent of the thread count;
//   - a half / bfloat16 mask gives the bits of a float32 mask holding the same values;
//   - the core's new rules reject bad storage descriptions with an Error naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <core/kv_quant.hpp>
#include <core/problem_check.hpp>
#include <cpu/reference.hpp>
#include <cstring>
#include <random>
#include <testing/case_data.hpp>
#include <vector>

namespace attnkit::test {
namespace {

struct Storage {
  KvType type;
  KvQuant quant;
};
std::string storage_name(Storage s) {
  if (s.type == KvType::Float) return "float";
  return std::string(core::kv_type_name(s.type)) + (s.quant == KvQuant::PerTensor ? "/tensor" : "/channel");
}

// A head-first problem whose K and V are stored as `ks` / `vs`, with a dequantized float32 copy of each.
struct QuantCase {
  AttentionProblem p;
  std::vector<std::byte> q, k, v, o;
  std::vector<float> k_scale, v_scale;
  std::vector<float> k_float, v_float;  // dequantized copies, dense head-first [B, Hkv, K, D]
  std::vector<std::int32_t> lengths;

  AttentionArgs args() {
    AttentionArgs a;
    const auto es = static_cast<std::int64_t>(dtype_size(p.dtype));
    a.q = {q.data(), static_cast<std::int64_t>(q.size()) / es};
    a.k = {k.data(), values(p.k_storage, k)};
    a.v = {v.data(), values(p.v_storage, v)};
    a.o = {o.data(), static_cast<std::int64_t>(o.size()) / es};
    if (!k_scale.empty()) a.k_scale = {k_scale.data(), static_cast<std::int64_t>(k_scale.size())};
    if (!v_scale.empty()) a.v_scale = {v_scale.data(), static_cast<std::int64_t>(v_scale.size())};
    if (p.has_key_lengths) a.key_lengths = {lengths.data(), static_cast<std::int64_t>(lengths.size())};
    return a;
  }
  std::int64_t values(KvStorage s, const std::vector<std::byte>& b) const {
    return s.type == KvType::Int4 ? 2 * static_cast<std::int64_t>(b.size())
                                  : static_cast<std::int64_t>(b.size()) /
                                        (s.type == KvType::Int8 ? 1 : static_cast<std::int64_t>(dtype_size(p.dtype)));
  }
  // The same problem with K and V replaced by their float32 dequantized copies (Q and O keep the dtype; only a
  // float32 problem can take float32 K/V, so this is for dtype float32).
  AttentionProblem float_problem() const {
    AttentionProblem f = p;
    f.k_storage = f.v_storage = KvStorage{};
    f.k = Layout::head_first(p.kv_heads, p.k_len, p.head_dim);
    f.v = Layout::head_first(p.kv_heads, p.k_len, p.v_head_dim);
    return f;
  }
  AttentionArgs float_args() {
    AttentionArgs a = args();
    a.k = {k_float.data(), static_cast<std::int64_t>(k_float.size())};
    a.v = {v_float.data(), static_cast<std::int64_t>(v_float.size())};
    a.k_scale = a.v_scale = {};
    return a;
  }
};

// Builds one tensor [B, Hkv, rows, dim] in storage `s` from normal values, and its dequantized copy.
void build_tensor(Storage s, DType dtype, std::int64_t B, std::int64_t Hkv, std::int64_t rows, std::int64_t dim,
                  std::mt19937_64& rng, std::vector<std::byte>& out, std::vector<float>& scales,
                  std::vector<float>& deq, Layout& layout) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  const std::int64_t row_values = s.type == KvType::Int4 ? (dim + 1) / 2 * 2 : dim;
  layout = Layout::head_first(Hkv, rows, row_values);
  const std::int64_t n = B * Hkv * rows * row_values;
  const double top = s.type == KvType::Int4 ? 7.0 : 127.0;
  if (s.quant == KvQuant::PerTensor) scales = {static_cast<float>(3.0 / top)};
  if (s.quant == KvQuant::PerChannel)
    for (std::int64_t i = 0; i < Hkv * dim; ++i) scales.push_back(static_cast<float>(3.0 * uniform(rng) / top));
  out.assign(static_cast<std::size_t>(s.type == KvType::Int4   ? n / 2
                                      : s.type == KvType::Int8 ? n
                                                               : n * static_cast<std::int64_t>(dtype_size(dtype))),
             std::byte{0});
  deq.assign(static_cast<std::size_t>(B * Hkv * rows * dim), 0.0f);
  for (std::int64_t bh = 0; bh < B * Hkv; ++bh) {
    const std::int64_t h = bh % Hkv;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const std::int64_t at = (bh * rows + r) * row_values + d;
        float value = 0.0f;
        if (s.type == KvType::Float) {
          store_from_float(out.data(), dtype, at, static_cast<float>(normal(rng)));
          value = load_as_float(out.data(), dtype, at);
        } else {
          const int lo = s.type == KvType::Int4 ? -8 : -128, hi = s.type == KvType::Int4 ? 7 : 127;
          const int q = static_cast<int>(std::clamp<double>(std::nearbyint(normal(rng) * top / 3.0), lo, hi));
          if (s.type == KvType::Int8) {
            reinterpret_cast<std::int8_t*>(out.data())[at] = static_cast<std::int8_t>(q);
          } else {
            auto& byte = reinterpret_cast<std::uint8_t*>(out.data())[at / 2];
            byte = static_cast<std::uint8_t>(at % 2 ? (byte & 0x0F) | ((q + 8) << 4) : (byte & 0xF0) | (q + 8));
          }
          // Dequantized as the contract says: q * scale in float32.
          value = static_cast<float>(q) *
                  scales[s.quant == KvQuant::PerChannel ? static_cast<std::size_t>(h * dim + d) : 0];
        }
        deq[static_cast<std::size_t>((bh * rows + r) * dim + d)] = value;
      }
    }
  }
}

QuantCase make_case(DType dtype, Storage ks, Storage vs, std::int64_t B, std::int64_t H, std::int64_t Hkv,
                    std::int64_t Sq, std::int64_t Sk, std::int64_t D, std::int64_t Dv, std::uint64_t seed) {
  QuantCase c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  c.p = AttentionProblem::head_first(B, H, Hkv, Sq, Sk, D, dtype);
  c.p.v_head_dim = Dv;
  c.p.o = Layout::head_first(H, Sq, Dv);
  c.p.k_storage = {ks.type, ks.quant};
  c.p.v_storage = {vs.type, vs.quant};
  c.q.resize(static_cast<std::size_t>(B * H * Sq * D) * dtype_size(dtype));
  for (std::int64_t i = 0; i < B * H * Sq * D; ++i)
    store_from_float(c.q.data(), dtype, i, static_cast<float>(normal(rng)));
  c.o.resize(static_cast<std::size_t>(B * H * Sq * Dv) * dtype_size(dtype));
  build_tensor(ks, dtype, B, Hkv, Sk, D, rng, c.k, c.k_scale, c.k_float, c.p.k);
  build_tensor(vs, dtype, B, Hkv, Sk, Dv, rng, c.v, c.v_scale, c.v_float, c.p.v);
  return c;
}

const Storage kQuantized[] = {{KvType::Int8, KvQuant::PerTensor},
                              {KvType::Int8, KvQuant::PerChannel},
                              {KvType::Int4, KvQuant::PerTensor},
                              {KvType::Int4, KvQuant::PerChannel}};

std::vector<std::byte> run_cpu(QuantCase& c, const AttentionProblem& p, const AttentionArgs& a, int threads = 0) {
  std::fill(c.o.begin(), c.o.end(), std::byte{0x7f});
  Attention(p, AttentionConfig{Backend::Cpu, threads}).run(a);
  return c.o;
}

struct Shape {
  const char* name;
  std::int64_t B, H, Hkv, Sq, Sk, D, Dv;
  bool causal;
  bool lengths;
};
// Prefill-like (several row blocks, partial key tiles), a decode step long enough to split the keys, an odd
// head size (int4 rows padded to a whole byte), and per-batch key lengths.
const Shape kShapes[] = {
    {"prefill causal", 2, 4, 2, 70, 70, 32, 32, true, false},
    {"decode split-k", 1, 8, 2, 1, 1500, 64, 64, false, true},
    {"odd head size", 2, 2, 1, 5, 37, 15, 9, false, false},
    {"key lengths", 3, 4, 4, 4, 130, 16, 16, true, true},
};

QuantCase shaped(const Shape& s, DType dtype, Storage ks, Storage vs, std::uint64_t seed) {
  QuantCase c = make_case(dtype, ks, vs, s.B, s.H, s.Hkv, s.Sq, s.Sk, s.D, s.Dv, seed);
  c.p.causal = s.causal;
  if (s.lengths) {
    c.p.has_key_lengths = true;
    for (std::int64_t b = 0; b < s.B; ++b) c.lengths.push_back(static_cast<std::int32_t>(s.Sk - 17 * b));
  }
  return c;
}

TEST(QuantizedCache, SameBitsAsDequantizedFloatCopy) {
  for (const Shape& s : kShapes) {
    for (Storage ks : kQuantized) {
      for (Storage vs : {Storage{KvType::Float, KvQuant::None}, kQuantized[1], kQuantized[2]}) {
        SCOPED_TRACE(std::string(s.name) + " K " + storage_name(ks) + " V " + storage_name(vs));
        QuantCase c = shaped(s, DType::f32, ks, vs, 42);
        const std::vector<std::byte> quantized = run_cpu(c, c.p, c.args());
        const std::vector<std::byte> dequantized = run_cpu(c, c.float_problem(), c.float_args());
        EXPECT_TRUE(quantized == dequantized);
        // The float64 reference reads both forms as the same floats: identical results.
        const auto rq = cpu::reference_attention(core::normalize_and_check(c.p), c.args());
        const auto rd = cpu::reference_attention(core::normalize_and_check(c.float_problem()), c.float_args());
        EXPECT_TRUE(rq.out == rd.out);
      }
    }
  }
}

TEST(QuantizedCache, MatchesFloat64ReferenceInEveryDtype) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape& s : kShapes) {
      for (Storage ks : kQuantized) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + s.name + " K " + storage_name(ks));
        QuantCase c = shaped(s, dtype, ks, kQuantized[3], 7);
        const auto ref = cpu::reference_attention(core::normalize_and_check(c.p), c.args());
        run_cpu(c, c.p, c.args());
        double diff = 0.0, top = 0.0;
        const AttentionProblem n = core::normalize_and_check(c.p);
        std::size_t at = 0;
        for (std::int64_t b = 0; b < n.batch; ++b)
          for (std::int64_t h = 0; h < n.heads; ++h)
            for (std::int64_t i = 0; i < n.q_len; ++i)
              for (std::int64_t d = 0; d < n.v_head_dim; ++d, ++at) {
                const double x = load_as_float(c.o.data(), dtype, n.o.index(b, h, i) + d);
                ASSERT_TRUE(std::isfinite(x));
                diff = std::max(diff, std::abs(x - ref.out[at]));
                top = std::max(top, std::abs(ref.out[at]));
              }
        EXPECT_LE(diff / top, testing::tolerance(dtype));
        // The Reference backend runs quantized caches too and writes the same numbers, rounded.
        std::fill(c.o.begin(), c.o.end(), std::byte{0});
        Attention(c.p, AttentionConfig{Backend::Reference, 0}).run(c.args());
        EXPECT_EQ(load_as_float(c.o.data(), dtype, 0), round_to(dtype, static_cast<float>(ref.out[0])));
      }
    }
  }
}

TEST(QuantizedCache, BitsDoNotDependOnTheThreadCount) {
  for (Storage ks : kQuantized) {
    QuantCase c = shaped(kShapes[1], DType::bf16, ks, ks, 3);
    const std::vector<std::byte> one = run_cpu(c, c.p, c.args(), 1);
    const std::vector<std::byte> two = run_cpu(c, c.p, c.args(), 2);
    const std::vector<std::byte> five = run_cpu(c, c.p, c.args(), 5);
    EXPECT_TRUE(one == two) << storage_name(ks);
    EXPECT_TRUE(one == five) << storage_name(ks);
  }
}

// ---- half / bfloat16 masks ----

TEST(HalfMask, SameBitsAsAFloat32MaskOfTheSameValues) {
  struct MaskShape {
    const char* name;
    std::int64_t mb, mh, mq;  // mask dimensions (1: broadcast)
  };
  for (DType mt : {DType::f16, DType::bf16}) {
    for (MaskShape ms :
         {MaskShape{"full", 2, 4, 9}, MaskShape{"key padding", 2, 1, 1}, MaskShape{"shared by heads", 2, 1, 9}}) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(dtype_name(mt)) + " mask " + ms.name + ", " + std::string(dtype_name(dtype)));
        QuantCase c = make_case(dtype, {KvType::Float, KvQuant::None}, {KvType::Float, KvQuant::None}, 2, 4, 2, 9, 150,
                                32, 32, 11);
        const std::int64_t n = ms.mb * ms.mh * ms.mq * 150;
        std::mt19937_64 rng(5);
        std::normal_distribution<double> normal(0.0, 2.0);
        std::vector<std::byte> half(static_cast<std::size_t>(n) * 2);
        std::vector<float> wide(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const float x = i % 11 == 3 ? -std::numeric_limits<float>::infinity() : static_cast<float>(normal(rng));
          store_from_float(half.data(), mt, i, x);
          wide[static_cast<std::size_t>(i)] = load_as_float(half.data(), mt, i);
        }
        c.p.has_mask = true;
        c.p.mask = Layout::mask(ms.mb, ms.mh, ms.mq, 150);
        AttentionProblem hp = c.p;
        hp.mask_dtype = mt;
        AttentionArgs ha = c.args(), fa = c.args();
        ha.mask = {half.data(), n};
        fa.mask = {wide.data(), n};
        const std::vector<std::byte> with_half = run_cpu(c, hp, ha);
        const std::vector<std::byte> with_float = run_cpu(c, c.p, fa);
        EXPECT_TRUE(with_half == with_float);
        const auto rh = cpu::reference_attention(core::normalize_and_check(hp), ha);
        const auto rf = cpu::reference_attention(core::normalize_and_check(c.p), fa);
        EXPECT_TRUE(rh.out == rf.out);
      }
    }
  }
}

// ---- the core's rules for storage and mask types ----

void expect_core_error(AttentionProblem p, AttentionArgs a, const std::string& argument, const std::string& phrase,
                       std::vector<std::byte>& o) {
  const std::vector<std::byte> before = o;
  try {
    Attention(p, AttentionConfig{Backend::Cpu, 0}).run(a);
    ADD_FAILURE() << "accepted; expected an Error naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
  EXPECT_TRUE(o == before) << "O written by a rejected call";
}

TEST(QuantizedCacheRules, EveryStorageRuleIsAnError) {
  QuantCase c = make_case(DType::f32, kQuantized[1], kQuantized[2], 2, 4, 2, 3, 20, 16, 16, 1);
  ASSERT_NO_THROW(Attention(c.p).run(c.args()));
  std::fill(c.o.begin(), c.o.end(), std::byte{0x7f});
  {
    AttentionProblem p = c.p;
    p.k_storage.quant = KvQuant::None;
    expect_core_error(p, c.args(), "k_storage.quant", "PerTensor or PerChannel", c.o);
  }
  {
    AttentionProblem p = c.p;
    p.v_storage = {KvType::Float, KvQuant::PerTensor};
    expect_core_error(p, c.args(), "v_storage.quant", "must be None", c.o);
  }
  {
    AttentionProblem p = c.p;
    p.v.row_stride += 1;  // an int4 row that starts mid-byte
    expect_core_error(p, c.args(), "v.row_stride", "must be even", c.o);
  }
  {
    AttentionArgs a = c.args();
    a.k_scale = {};
    expect_core_error(c.p, a, "k_scale", "is null", c.o);
  }
  {
    AttentionArgs a = c.args();
    a.k_scale.elements = 31;  // per channel needs 2 * 16
    expect_core_error(c.p, a, "k_scale", "needs kv_heads * dim = 32", c.o);
  }
  {
    AttentionArgs a = c.args();
    a.v.elements = static_cast<std::int64_t>(c.v.size());  // counted in bytes, not int4 values
    expect_core_error(c.p, a, "v", "buffer holds", c.o);
  }
  {
    AttentionProblem p = c.float_problem();
    AttentionArgs a = c.float_args();
    a.k_scale = {c.k_scale.data(), 32};
    expect_core_error(p, a, "k_scale", "not quantized", c.o);
  }
  {
    AttentionProblem p = c.p;
    p.has_mask = true;
    p.mask = Layout::mask(1, 1, 1, 20);
    p.mask_dtype = static_cast<DType>(7);
    std::vector<float> mask(20, 0.0f);
    AttentionArgs a = c.args();
    a.mask = {mask.data(), 20};
    expect_core_error(p, a, "mask_dtype", "float32, float16 or bfloat16", c.o);
  }
  {                    // an output over a quantized cache is an overlap, counted in the cache's bytes
    c.k.resize(4096);  // room for O, so that a missed overlap could not write past the vector
    AttentionArgs a = c.args();
    a.k.elements = 2 * 2 * 20 * 16;
    a.o.data = c.k.data() + 1000;  // O's first bytes fall on K's last 280
    a.o.elements = 2 * 4 * 3 * 16;
    std::vector<std::byte> k_before = c.k;
    try {
      Attention(c.p).run(a);
      ADD_FAILURE() << "an output over K was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "o");
    }
    EXPECT_TRUE(c.k == k_before);
  }
}

}  // namespace
}  // namespace attnkit::test
