// The whole GroupQueryAttention op against the float64 reference of gqa_support.hpp (written from the
// contract): output, both present caches (every row: appended, copied, zeroed or untouched) and output_qk,
// over every step kind, cache mode, option and element type.
#include <gtest/gtest.h>

#include "gqa_checks.hpp"

namespace attnkit::test {
namespace {

constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};


// Runs one call and checks everything it wrote against the reference.
void check_call(const GqaOptions& o, Backend backend = Backend::Cpu) {
  SCOPED_TRACE(describe(o));
  GqaCall c = make_call(o);
  GroupQueryAttention op(c.attrs, GqaConfig{backend, 0});
  ASSERT_NO_THROW(op.run(c.inputs(), c.outputs())) << describe(o);
  const GqaExpected e = gqa_reference(c, c.present_key, c.present_value);
  EXPECT_LE(scaled_error(e.output, c.output, o.dtype), testing::tolerance(o.dtype)) << op.describe();
  check_cache(c, e.present_k, c.present_key, c.k_quantized(), true, "present_key");
  check_cache(c, e.present_v, c.present_value, c.v_quantized(), false, "present_value");
  if (o.qk_output != 0) check_qk(c, e.qk);
}

// ---- steps ----

TEST(GqaOp, FirstPromptWithPaddedBatch) {
  for (DType t : kDtypes) {
    for (bool packed : {false, true}) {
      GqaOptions o;
      o.dtype = t;
      o.batch = 3, o.seq = 7, o.heads = 6, o.kv_heads = 2, o.head_size = 32;
      o.lengths = {7, 4, 1};  // right padding: entry 1 has 4 valid tokens, entry 2 one
      o.has_past = false;
      o.packed = packed;
      o.rotary = true;
      o.norm = true;
      check_call(o);
      o.present_rows = 12;  // a larger present: rows past the prompt are zero
      check_call(o);
    }
  }
}

TEST(GqaOp, DecodeSharedAndSeparateCaches) {
  for (DType t : kDtypes) {
    for (bool shared : {true, false}) {
      GqaOptions o;
      o.dtype = t;
      o.batch = 3, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
      o.lengths = {40, 7, 1};
      o.present_rows = 48;
      o.past_rows = shared ? 0 : 45;
      o.shared = shared;
      o.rotary = true;
      check_call(o);
    }
  }
}

TEST(GqaOp, PromptChunkAfterAPast) {
  // S > 1 after earlier tokens, different lengths per batch entry (ONNX Runtime allows batch 1 only here).
  for (DType t : kDtypes) {
    for (bool shared : {true, false}) {
      GqaOptions o;
      o.dtype = t;
      o.batch = 2, o.seq = 5, o.heads = 4, o.kv_heads = 4, o.head_size = 16;
      o.lengths = {20, 9};
      o.total = 22;
      o.present_rows = 24;
      o.shared = shared;
      o.rotary = true;
      o.norm = true;
      check_call(o);
    }
  }
}

TEST(GqaOp, RotaryVariants) {
  for (DType t : kDtypes) {
    for (bool interleaved : {false, true}) {
      for (std::int64_t half : {16, 8, 3}) {  // full, half, and an odd partial rotation
        for (bool ids : {false, true}) {
          GqaOptions o;
          o.dtype = t;
          o.batch = 2, o.seq = 3, o.heads = 4, o.kv_heads = 1, o.head_size = 32;
          o.lengths = {3, 2};
          o.has_past = false;
          o.rotary = true;
          o.interleaved = interleaved;
          o.rotary_half = half;
          o.position_ids = ids;
          o.max_len = 40;
          o.seed = static_cast<std::uint64_t>(half);
          check_call(o);
          o.seq = 1, o.lengths = {30, 12}, o.total = 0, o.has_past = true, o.shared = true;
          check_call(o);
        }
      }
    }
  }
}

TEST(GqaOp, WindowSoftcapBiasAndSinks) {
  for (DType t : kDtypes) {
    for (int variant = 0; variant < 6; ++variant) {
      GqaOptions o;
      o.dtype = t;
      o.batch = 2, o.seq = variant % 2 ? 1 : 6, o.heads = 4, o.kv_heads = 2, o.head_size = 16;
      o.lengths = variant % 2 ? std::vector<std::int32_t>{25, 11} : std::vector<std::int32_t>{6, 5};
      o.has_past = variant % 2 == 1;
      o.shared = true;
      o.window = 1 + variant;  // 1: each query sees only itself
      o.softcap = variant >= 2 ? 4.0f : 0.0f;
      o.scale = variant == 3 ? 0.3f : 0.0f;
      o.bias = variant != 0;
      o.bias_batch = variant == 4 ? 1 : 0;
      o.bias_heads = variant >= 4 ? 1 : 0;
      o.head_sink = variant == 2 || variant == 5;
      o.smooth_softmax = variant == 3 ? 1 : -1;
      o.seed = 100 + static_cast<std::uint64_t>(variant);
      check_call(o);
    }
  }
}

TEST(GqaOp, NonCausal) {
  for (DType t : kDtypes) {
    GqaOptions o;
    o.dtype = t;
    o.batch = 2, o.seq = 5, o.heads = 2, o.kv_heads = 1, o.head_size = 24;
    o.lengths = {5, 3};
    o.has_past = false;
    o.causal = 0;
    check_call(o);
    o.seq = 2, o.lengths = {9, 4}, o.total = 0, o.has_past = true, o.shared = false;
    check_call(o);
  }
}

// ---- quantized caches ----

TEST(GqaOp, QuantizedCachesEveryModeAndStep) {
  for (DType t : kDtypes) {
    for (std::int64_t bits : {8, 4}) {
      for (const char* kq : {"PER_TENSOR", "PER_CHANNEL"}) {
        for (int step = 0; step < 3; ++step) {  // first prompt, decode shared, chunk separate
          GqaOptions o;
          o.dtype = t;
          o.bits = bits;
          o.k_quant = kq;
          o.v_quant = std::string(kq) == "PER_TENSOR" ? "PER_CHANNEL" : "PER_TENSOR";
          o.batch = 2, o.heads = 4, o.kv_heads = 2, o.head_size = 32;
          o.rotary = step != 1;
          if (step == 0) o.seq = 6, o.lengths = {6, 3}, o.has_past = false;
          if (step == 1) o.seq = 1, o.lengths = {33, 2}, o.shared = true, o.present_rows = 40;
          if (step == 2) o.seq = 3, o.lengths = {12, 5}, o.shared = false, o.past_rows = 10, o.present_rows = 14;
          o.seed = static_cast<std::uint64_t>(step * 10 + bits);
          check_call(o);
        }
      }
    }
  }
}

TEST(GqaOp, QuantizedKeyOnlyAndOddHeadSize) {
  GqaOptions o;
  o.k_quant = "PER_CHANNEL";
  o.bits = 4;
  o.batch = 2, o.seq = 1, o.heads = 3, o.kv_heads = 1, o.head_size = 15;  // int4 rows of 8 bytes, a pad nibble
  o.lengths = {9, 4};
  o.shared = true;
  o.present_rows = 12;
  check_call(o);
  o.shared = false, o.past_rows = 10;
  check_call(o);
  o.k_quant = "NONE", o.v_quant = "PER_TENSOR", o.bits = 8;
  check_call(o);
}

// ---- the window cache ----

TEST(GqaOp, SlidingWindowCache) {
  for (DType t : {DType::f32, DType::f16}) {
    for (bool shared : {true, false}) {
      for (bool bias : {false, true}) {
        GqaOptions o;
        o.dtype = t;
        o.sliding = true;
        o.window = 4;
        o.batch = 3, o.heads = 4, o.kv_heads = 2, o.head_size = 16;
        o.present_rows = 6;
        o.past_rows = 6;
        o.shared = shared;
        o.bias = bias;
        o.rotary = true;
        // Decode: entry 0 full (drops 1), entry 1 just full, entry 2 not yet full.
        o.seq = 1, o.lengths = {30, 7, 3}, o.total = 30;
        check_call(o);
        // A chunk of 3: window - 1 + 3 = 6 rows, exactly the capacity.
        o.seq = 3, o.lengths = {40, 9, 4};
        o.total = 40;
        check_call(o);
        // A first prompt that fits.
        o.seq = 5, o.lengths = {5, 2, 4}, o.total = 5, o.has_past = false, o.shared = false;
        check_call(o);
      }
    }
  }
}

TEST(GqaOp, SlidingWindowCacheQuantized) {
  GqaOptions o;
  o.sliding = true;
  o.window = 3;
  o.k_quant = o.v_quant = "PER_CHANNEL";
  o.bits = 4;
  o.batch = 2, o.heads = 2, o.kv_heads = 1, o.head_size = 8;
  o.present_rows = o.past_rows = 4;
  o.seq = 2, o.lengths = {17, 3}, o.total = 17;
  for (bool shared : {true, false}) {
    o.shared = shared;
    check_call(o);
  }
}

// ---- output_qk ----

TEST(GqaOp, OutputQkBeforeAndAfterSoftmax) {
  for (DType t : kDtypes) {
    for (std::int64_t mode : {1, 2}) {
      GqaOptions o;
      o.dtype = t;
      o.qk_output = mode;
      o.batch = 2, o.seq = 4, o.heads = 4, o.kv_heads = 2, o.head_size = 16;
      o.lengths = {4, 2};
      o.has_past = false;
      o.window = 3;
      o.softcap = 6.0f;
      o.bias = true;
      o.head_sink = true;
      check_call(o);
      o.seq = 1, o.lengths = {10, 5}, o.total = 12, o.has_past = true, o.shared = true;  // columns past T_b
      check_call(o);
      o.sliding = true, o.window = 3, o.present_rows = o.past_rows = 4, o.seq = 2, o.lengths = {10, 3}, o.total = 10;
      check_call(o);
    }
  }
}

// ---- consistency between calls ----

// A prompt of 9 tokens in one call gives, for its last 3 rows, what a prompt of 6 then 3 decode steps give
// (shared cache, rotary, norm), and leaves the same cache.
TEST(GqaOp, DecodeStepsContinueThePrompt) {
  for (DType t : kDtypes) {
    SCOPED_TRACE(dtype_str(t));
    GqaOptions o;
    o.dtype = t;
    o.batch = 1, o.seq = 9, o.heads = 4, o.kv_heads = 2, o.head_size = 32;
    o.lengths = {9};
    o.has_past = false;
    o.present_rows = 12;
    o.rotary = true, o.norm = true;
    GqaCall whole = make_call(o);
    GroupQueryAttention op(whole.attrs);
    op.run(whole.inputs(), whole.outputs());

    // Same tokens: the prompt is whole's first 6, each step one more.
    const std::int64_t token = o.heads * o.head_size, kv_token = o.kv_heads * o.head_size;
    const std::size_t es = dtype_size(t);
    std::vector<std::byte> cache_k(whole.present_key.size(), std::byte{0}), cache_v = cache_k;
    auto step = [&](std::int64_t first, std::int64_t count, bool prompt) {
      std::vector<std::byte> q(whole.query.begin() + first * token * es,
                               whole.query.begin() + (first + count) * token * es);
      std::vector<std::byte> k(whole.key.begin() + first * kv_token * es,
                               whole.key.begin() + (first + count) * kv_token * es);
      std::vector<std::byte> v(whole.value.begin() + first * kv_token * es,
                               whole.value.begin() + (first + count) * kv_token * es);
      std::vector<std::byte> out(static_cast<std::size_t>(count * token) * es);
      std::int32_t seqlen = static_cast<std::int32_t>(first + count - 1),
                   total = static_cast<std::int32_t>(first + count);
      GqaInputs in = whole.inputs();
      const ElementType et = element_type_of(t);
      in.query = {q.data(), et, {1, count, token}};
      in.key = {k.data(), et, {1, count, kv_token}};
      in.value = {v.data(), et, {1, count, kv_token}};
      in.seqlens_k = {&seqlen, ElementType::int32, {1}};
      in.total_sequence_length = {&total, ElementType::int32, {}};
      if (!prompt) {
        in.past_key = {cache_k.data(), et, {1, o.kv_heads, 12, o.head_size}};
        in.past_value = {cache_v.data(), et, {1, o.kv_heads, 12, o.head_size}};
      }
      GqaOutputs outs;
      outs.output = {out.data(), et, {1, count, token}};
      outs.present_key = {cache_k.data(), et, {1, o.kv_heads, 12, o.head_size}};
      outs.present_value = {cache_v.data(), et, {1, o.kv_heads, 12, o.head_size}};
      op.run(in, outs);
      return out;
    };
    step(0, 6, true);
    for (std::int64_t s = 6; s < 9; ++s) {
      const std::vector<std::byte> out = step(s, 1, false);
      double diff = 0, top = 0;
      for (std::int64_t d = 0; d < token; ++d) {
        const double a = load_as_float(out.data(), t, d), b = whole.at(whole.output, s * token + d);
        diff = std::max(diff, std::abs(a - b));
        top = std::max(top, std::abs(b));
      }
      EXPECT_LE(diff / top, testing::tolerance(t)) << "token " << s;
    }
    // The caches hold the same rows 0..8 (the same rounding of the same K'), and the rest is zero.
    EXPECT_TRUE(cache_k == whole.present_key);
    EXPECT_TRUE(cache_v == whole.present_value);
  }
}

TEST(GqaOp, BitsDoNotDependOnThreadsAndReferenceBackendAgrees) {
  GqaOptions o;
  o.dtype = DType::bf16;
  o.batch = 2, o.seq = 1, o.heads = 8, o.kv_heads = 2, o.head_size = 64;
  o.lengths = {700, 300};
  o.shared = true;
  o.rotary = true;
  o.k_quant = o.v_quant = "PER_CHANNEL";
  GqaCall c = make_call(o);
  std::vector<std::vector<std::byte>> outs;
  for (int threads : {1, 2, 3}) {
    c.poison();
    GroupQueryAttention(c.attrs, GqaConfig{Backend::Cpu, threads}).run(c.inputs(), c.outputs());
    outs.push_back(c.output);
    outs.push_back(c.present_key);
  }
  EXPECT_TRUE(outs[0] == outs[2] && outs[0] == outs[4]);
  EXPECT_TRUE(outs[1] == outs[3] && outs[1] == outs[5]);
  check_call(o, Backend::Reference);
}

TEST(GqaOp, OutputSpecsAreOnnxRuntimes) {
  GqaOptions o;
  o.batch = 2, o.seq = 1, o.lengths = {5, 3};
  o.past_rows = 4;
  o.present_rows = 5;
  GqaCall c = make_call(o);
  auto specs = gqa_output_specs(c.attrs, c.inputs());
  EXPECT_EQ(specs[0].shape, (std::vector<std::int64_t>{2, 1, 4 * 16}));
  EXPECT_EQ(specs[1].shape, (std::vector<std::int64_t>{2, 2, 5, 16})) << "max(total_sequence_length, past rows)";
  EXPECT_EQ(specs[1].type, ElementType::float32);
  EXPECT_FALSE(specs[3].produced);
  o.k_quant = "PER_TENSOR", o.bits = 4, o.qk_output = 2, o.present_rows = 0, o.past_rows = 8;
  GqaCall q = make_call(o);
  specs = gqa_output_specs(q.attrs, q.inputs());
  EXPECT_EQ(specs[1].shape, (std::vector<std::int64_t>{2, 2, 8, 8})) << "int4: (H + 1) / 2 bytes";
  EXPECT_EQ(specs[1].type, ElementType::uint8);
  EXPECT_EQ(specs[2].type, ElementType::float32);
  EXPECT_TRUE(specs[3].produced);
  EXPECT_EQ(specs[3].shape, (std::vector<std::int64_t>{2, 4, 1, 5}));
  // A window cache keeps its size: present = past rows, even below total_sequence_length.
  o = GqaOptions{};
  o.batch = 1, o.lengths = {30}, o.sliding = true, o.window = 4, o.past_rows = o.present_rows = 4;
  GqaCall w = make_call(o);
  specs = gqa_output_specs(w.attrs, w.inputs());
  EXPECT_EQ(specs[1].shape, (std::vector<std::int64_t>{1, 2, 4, 16}));
}

}  // namespace
}  // namespace attnkit::test
