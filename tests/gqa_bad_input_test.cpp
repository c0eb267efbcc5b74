// Bad input to the GQA op: every rule of the contract. For each, a valid call is broken in exactly one way and
// the test requires that
//   - attnkit::Error is thrown, naming the input (or attribute, or output) and stating the rule,
//   - no output and no cache changed: output / output_qk keep their poison, present caches (and a shared
//     past) their bytes.
// The unbroken call runs first and must succeed, so each rejection is due to the one change.
#include "gqa_support.hpp"

#include <gtest/gtest.h>

#include <functional>

namespace attnkit::test {
namespace {

using Mutation = std::function<void(GqaCall&, GqaAttributes&, GqaInputs&, GqaOutputs&, GqaConfig&)>;

// A decode step that carries every input: separate caches, rotary with its tables, Q/K norm, a full bias, head
// sinks, a per-channel int8 K cache with its scales, and output_qk.
GqaOptions base() {
  GqaOptions o;
  o.batch = 3, o.seq = 1, o.heads = 4, o.kv_heads = 2, o.head_size = 16;
  o.lengths = {6, 3, 1};
  o.past_rows = 8, o.present_rows = 8;
  o.rotary = true, o.norm = true, o.bias = true, o.head_sink = true;
  o.k_quant = "PER_CHANNEL", o.bits = 8;
  o.qk_output = 1;
  return o;
}

void expect_rejected(const GqaOptions& options, const Mutation& mutate, const std::string& argument,
                     const std::string& phrase) {
  GqaCall c = make_call(options);
  {
    GqaOutputs out = c.outputs();
    ASSERT_NO_THROW(GroupQueryAttention(c.attrs).run(c.inputs(), out)) << "the unbroken call must run";
  }
  c.poison();
  GqaAttributes attrs = c.attrs;
  GqaInputs in = c.inputs();
  GqaOutputs out = c.outputs();
  GqaConfig config;
  mutate(c, attrs, in, out, config);
  const std::vector<std::vector<std::byte>> before{c.output, c.output_qk, c.present_key, c.present_value,
                                                   c.past_key, c.past_value, c.query, c.key, c.value};
  try {
    GroupQueryAttention op(attrs, config);
    op.run(in, out);
    ADD_FAILURE() << "accepted; expected an Error naming '" << argument << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    const std::string text = e.what();
    EXPECT_EQ(text.rfind(argument + ": ", 0), 0u) << text;
    EXPECT_NE(text.find(phrase), std::string::npos) << "'" << text << "' does not state the rule ('" << phrase << "')";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-attnkit::Error: " << e.what();
  }
  const std::vector<std::vector<std::byte>> after{c.output, c.output_qk, c.present_key, c.present_value,
                                                  c.past_key, c.past_value, c.query, c.key, c.value};
  const char* names[] = {"output", "output_qk", "present_key", "present_value", "past_key", "past_value",
                         "query", "key", "value"};
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i] == after[i]) << names[i] << " was written";
}

struct Rule {
  const char* what;
  Mutation mutate;
  const char* argument;
  const char* phrase;
};

void run_rules(const GqaOptions& options, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    SCOPED_TRACE(r.what);
    expect_rejected(options, r.mutate, r.argument, r.phrase);
  }
}

#define MUT [](GqaCall & c, GqaAttributes & a, GqaInputs & in, GqaOutputs & out, GqaConfig & cfg)

TEST(GqaBadInput, Attributes) {
  run_rules(base(), {
      {"num_heads 0", MUT { a.num_heads = 0; }, "num_heads", "must be >= 1"},
      {"kv_num_heads 0", MUT { a.kv_num_heads = 0; }, "kv_num_heads", "must be >= 1"},
      {"heads not a multiple", MUT { a.kv_num_heads = 3; }, "kv_num_heads", "must be a multiple of kv_num_heads"},
      {"scale NaN", MUT { a.scale = std::nanf(""); }, "scale", "must be finite"},
      {"softcap negative", MUT { a.softcap = -1.0f; }, "softcap", ">= 0"},
      {"causal 2", MUT { a.causal = 2; }, "causal", "must be 0 or 1"},
      {"do_rotary 2", MUT { a.do_rotary = 2; }, "do_rotary", "must be 0 or 1"},
      {"rotary_interleaved -1", MUT { a.rotary_interleaved = -1; }, "rotary_interleaved", "must be 0 or 1"},
      {"sliding_window_cache 5", MUT { a.sliding_window_cache = 5; }, "sliding_window_cache", "must be 0 or 1"},
      {"smooth_softmax 2", MUT { a.smooth_softmax = 2; }, "smooth_softmax", "must be -1, 0 (off) or 1"},
      {"qk_output 3", MUT { a.qk_output = 3; }, "qk_output", "must be 0 (none), 1"},
      {"local_window_size 0", MUT { a.local_window_size = 0; }, "local_window_size", "must be -1 (off) or >= 1"},
      {"local_window_size -2", MUT { a.local_window_size = -2; }, "local_window_size", "must be -1 (off) or >= 1"},
      {"window without causal", MUT { a.causal = 0, a.local_window_size = 4; },
       "local_window_size", "must be -1 when causal = 0"},
      {"sliding cache without window", MUT { a.sliding_window_cache = 1; },
       "sliding_window_cache", "needs local_window_size >= 1"},
      {"qk_norm_epsilon 0", MUT { a.qk_norm_epsilon = 0.0f; }, "qk_norm_epsilon", "finite and > 0"},
      {"quant type unknown", MUT { a.v_quant_type = "INT8"; }, "v_quant_type", "NONE, PER_TENSOR or PER_CHANNEL"},
      {"bit width 16", MUT { a.kv_cache_bit_width = 16; }, "kv_cache_bit_width", "must be 8 or 4"},
      {"threads -1", MUT { cfg.threads = -1; }, "config.threads", ">= 0"},
  });
  // On a machine without a GPU (CI) the CUDA backend is refused by name.
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), Backend::Cuda) == backends.end()) {
    run_rules(base(), {{"CUDA backend", MUT { cfg.backend = Backend::Cuda; }, "config.backend", "no CUDA device"}});
  }
}

TEST(GqaBadInput, QueryKeyValue) {
  run_rules(base(), {
      {"query absent", MUT { in.query = {}; }, "query", "is required"},
      {"query rank 2", MUT { in.query.shape = {3, 64}; }, "query", "must have rank 3"},
      {"query int32", MUT { in.query.type = ElementType::int32; }, "query", "must be float32, float16 or bfloat16"},
      {"query null data", MUT { in.query.data = nullptr; }, "query", "has no data"},
      {"negative dimension", MUT { in.query.shape[1] = -1; }, "query", "dimensions must be >= 0"},
      {"batch 0", MUT { in.query.shape[0] = 0; }, "query", "dimension 0 (batch) must be >= 1"},
      {"width not a multiple of num_heads", MUT { in.query.shape[2] = 63; },
       "query", "must be a multiple of num_heads"},
      {"head size over 256", MUT { a.num_heads = 1, a.kv_num_heads = 1; in.query.shape[2] = 4 * 16 * 5; },
       "query", "must be in [1, 256]"},
      {"value absent", MUT { in.value = {}; }, "value", "must both be given"},
      {"key absent", MUT { in.key = {}; }, "key", "must both be given"},
      {"key wrong heads", MUT { in.key.shape[2] = 16; },
       "key", "must have shape (batch, sequence_length, kv_num_heads * head_size)"},
      {"key wrong sequence", MUT { in.key.shape[1] = 2; }, "key", "must have shape"},
      {"value float16", MUT { in.value.type = ElementType::float16; }, "value", "the query's type"},
  });
  GqaOptions packed = base();
  packed.packed = true;
  run_rules(packed, {
      {"packed width", MUT { in.query.shape[2] = 8 * 16 + 1; },
       "query", "packed QKV: dimension 2 (129) must be a multiple of num_heads + 2 * kv_num_heads = 8"},
  });
}

TEST(GqaBadInput, LengthsAndSteps) {
  run_rules(base(), {
      {"seqlens_k absent", MUT { in.seqlens_k = {}; }, "seqlens_k", "is required"},
      {"seqlens_k shape", MUT { in.seqlens_k.shape = {2}; }, "seqlens_k", "must have shape (batch)"},
      {"seqlens_k int64", MUT { in.seqlens_k.type = ElementType::int64; }, "seqlens_k", "must be int32"},
      {"total absent", MUT { in.total_sequence_length = {}; }, "total_sequence_length", "is required"},
      {"total two elements", MUT { in.total_sequence_length.shape = {2}; },
       "total_sequence_length", "must hold one element"},
      {"total float", MUT { in.total_sequence_length.type = ElementType::float32; },
       "total_sequence_length", "must be int32"},
      {"total 0", MUT { c.total = 0; }, "total_sequence_length", "= 0 must be >= 1"},
      {"seqlens_k negative", MUT { c.seqlens[1] = -1; }, "seqlens_k[1]", "must be >= 0"},
      {"length above total", MUT { c.seqlens[0] = 6; }, "seqlens_k[0]", "exceed total_sequence_length = 6"},
      {"past beyond past_key", MUT { c.seqlens[0] = 9, c.total = 10; }, "seqlens_k[0]", "past_key holds only 8 rows"},
      {"past absent but needed", MUT { in.past_key = {}, in.past_value = {}; },
       "past_key", "is absent but seqlens_k[0] = 5 implies 5 earlier tokens"},
      {"shorter than the new tokens", MUT {
         c.seqlens[2] = 0, c.total = 7;
         for (auto* t : {&in.query, &in.key, &in.value}) t->shape[1] = 2;
       },
       "seqlens_k[2]", "fewer than the 2 new tokens"},
  });
  // A shared cache of 8 rows: the contract's example.
  GqaOptions shared = base();
  shared.shared = true;
  run_rules(shared, {
      {"over capacity", MUT { c.seqlens[2] = 900; c.total = 901; },
       "seqlens_k[2]", "= 900 exceeds the cache capacity 8"},
  });
  // A first prompt: lengths at most S, and S rows must fit.
  GqaOptions prompt = base();
  prompt.seq = 4, prompt.lengths = {4, 2, 3}, prompt.has_past = false, prompt.present_rows = 4, prompt.qk_output = 0;
  run_rules(prompt, {
      {"prompt length above S", MUT { c.seqlens[1] = 4; }, "seqlens_k[1]", "5 tokens exceed total_sequence_length = 4"},
      {"prompt rows above capacity", MUT { out.present_key.shape[2] = out.present_value.shape[2] = 3; }, "present_key",
       "fewer than the 4 tokens of this call"},
  });
}

TEST(GqaBadInput, Caches) {
  run_rules(base(), {
      {"past_value absent", MUT { in.past_value = {}; }, "past_value", "must both be given"},
      {"past_key heads", MUT { in.past_key.shape[1] = 4; },
       "past_key", "must have shape (batch, kv_num_heads, rows, head_size)"},
      {"past_key float32 for an int8 cache", MUT { in.past_key.type = ElementType::float32; },
       "past_key", "must be int8"},
      {"past_value rows differ", MUT { in.past_value.shape[2] = 7; }, "past_value", "must have past_key's dimension 2"},
      {"present_key absent", MUT { out.present_key = {}; }, "present_key", "is required"},
      {"present_value absent", MUT { out.present_value = {}; }, "present_value", "is required"},
      {"present last dimension", MUT { out.present_value.shape[3] = 8; }, "present_value", "must have shape"},
      {"present type", MUT { out.present_value.type = ElementType::float16; }, "present_value", "must be float32"},
      {"present rows differ", MUT { out.present_value.shape[2] = 7; },
       "present_value", "must have present_key's dimension 2"},
      {"key shared, value not", MUT { out.present_key.data = const_cast<void*>(in.past_key.data); }, "present_value",
       "share memory for both key and value, or for neither"},
      {"k_scale absent", MUT { in.k_scale = {}; }, "k_scale", "is required when k_quant_type is not NONE"},
      {"v_scale for a float cache", MUT { in.v_scale = {c.k_scale.data(), ElementType::float32, {1}}; }, "v_scale",
       "is given but v_quant_type is NONE"},
      {"k_scale count", MUT { in.k_scale.shape = {16}; }, "k_scale", "must hold kv_num_heads * head_size = 32 values"},
      {"k_scale type", MUT { in.k_scale.type = ElementType::float16; }, "k_scale", "must be float32"},
      {"k_scale zero", MUT { c.k_scale[5] = 0.0f; }, "k_scale[5]", "must be finite and > 0"},
      {"k_scale NaN", MUT { c.k_scale[0] = std::nanf(""); }, "k_scale[0]", "must be finite and > 0"},
      {"past_key without data", MUT { in.past_key.data = nullptr; }, "past_key", "has no data"},
      {"v_scale per tensor, two values", MUT {
         static float s[2] = {0.1f, 0.1f};
         a.v_quant_type = "PER_TENSOR";
         in.v_scale = {s, ElementType::float32, {2}};
       }, "v_scale", "must hold 1 value for PER_TENSOR"},
  });
  GqaOptions shared = base();
  shared.shared = true;
  run_rules(shared, {
      {"shared with another shape", MUT { out.present_key.shape[2] = out.present_value.shape[2] = 6; }, "present_key",
       "must have past_key's shape"},
  });
  GqaOptions int4 = base();
  int4.bits = 4;
  run_rules(int4, {
      {"int4 cache rows of H bytes", MUT { out.present_key.shape[3] = 16; },
       "present_key", "(head_size + 1) / 2 bytes"},
      {"int4 cache float", MUT { in.past_key.type = ElementType::float32; },
       "past_key", "must be uint8 (an int4 cache"},
  });
  GqaOptions window = base();
  window.sliding = true, window.window = 4, window.present_rows = 4, window.past_rows = 4;
  window.lengths = {9, 3, 1}, window.total = 9, window.bias = false, window.qk_output = 0;
  run_rules(window, {
      {"window cache too small for a chunk", MUT {
         c.seqlens = {9, 3, 2}; c.total = 10;
         for (auto* t : {&in.query, &in.key, &in.value}) t->shape[1] = 2;
         out.output.shape[1] = 2;
       }, "present_key", "needs local_window_size - 1 + sequence_length = 5 rows"},
  });
}

TEST(GqaBadInput, RotaryNormBiasSink) {
  run_rules(base(), {
      {"do_rotary without tables", MUT { in.cos_cache = {}, in.sin_cache = {}; },
       "cos_cache", "is required when do_rotary = 1"},
      {"cos without sin", MUT { in.sin_cache = {}; }, "sin_cache", "must both be given"},
      {"cos rank 3", MUT { in.cos_cache.shape = {1, 9, 8}; }, "cos_cache", "must have rank 2"},
      {"cos type", MUT { in.cos_cache.type = ElementType::float16; }, "cos_cache", "the query's type"},
      {"sin shape", MUT { in.sin_cache.shape = {8, 8}; }, "sin_cache", "cos_cache's shape"},
      {"rotary wider than the head", MUT { in.cos_cache.shape = {4, 9}; in.sin_cache.shape = {4, 9}; }, "cos_cache",
       "must be in [1, head_size / 2 = 8]"},
      {"positions past the tables", MUT { in.cos_cache.shape[0] = 5; in.sin_cache.shape[0] = 5; }, "cos_cache",
       "holds 5 positions but batch entry 0 needs position 5"},
      {"position_ids type", MUT {
         static std::int64_t p[3];
         p[0] = 0, p[1] = 1, p[2] = 2;
         in.position_ids = {p, ElementType::int32, {3, 1}};
       },
       "position_ids", "must be int64"},
      {"position_ids shape", MUT {
         static std::int64_t p[3];
         p[0] = 0, p[1] = 1, p[2] = 2;
         in.position_ids = {p, ElementType::int64, {1, 3}};
       }, "position_ids",
       "must have shape (batch, >= sequence_length)"},
      {"position out of range", MUT {
         static std::int64_t p[3];
         p[0] = 0, p[1] = 9, p[2] = 2;
         in.position_ids = {p, ElementType::int64, {3, 1}};
       }, "position_ids[1][0]",
       "= 9 is outside [0, 9)"},
      {"negative position", MUT {
         static std::int64_t p[3];
         p[0] = 0, p[1] = 1, p[2] = -2;
         in.position_ids = {p, ElementType::int64, {3, 1}};
       }, "position_ids[2][0]",
       "is outside"},
      {"q norm alone", MUT { in.k_norm_weight = {}; }, "k_norm_weight", "must both be given"},
      {"norm weight shape", MUT { in.q_norm_weight.shape = {8}; }, "q_norm_weight", "must have shape (head_size)"},
      {"norm weight type", MUT { in.k_norm_weight.type = ElementType::bfloat16; }, "k_norm_weight", "the query's type"},
      {"bias rank", MUT { in.attention_bias.shape = {3, 4, 6}; }, "attention_bias", "must have rank 4"},
      {"bias batch 2", MUT { in.attention_bias.shape[0] = 2; },
       "attention_bias", "(batch or 1, num_heads or 1, sequence_length, total_sequence_length)"},
      {"bias columns", MUT { in.attention_bias.shape[3] = 7; }, "attention_bias", "must have shape"},
      {"bias type", MUT { in.attention_bias.type = ElementType::float16; }, "attention_bias", "the query's type"},
      {"sink with smooth softmax", MUT { a.smooth_softmax = 1; },
       "head_sink", "must be absent when smooth_softmax = 1"},
      {"sink shape", MUT { in.head_sink.shape = {2}; }, "head_sink", "must have shape (num_heads)"},
      {"sink type", MUT { in.head_sink.type = ElementType::float16; }, "head_sink", "the query's type"},
  });
}

TEST(GqaBadInput, OutputsAndOverlaps) {
  run_rules(base(), {
      {"output absent", MUT { out.output = {}; }, "output", "is required"},
      {"output shape", MUT { out.output.shape = {3, 1, 32}; },
       "output", "must have shape (batch, sequence_length, num_heads * head_size)"},
      {"output type", MUT { out.output.type = ElementType::bfloat16; }, "output", "the query's type"},
      {"output_qk absent", MUT { out.output_qk = {}; }, "output_qk", "is required when qk_output = 1"},
      {"output_qk shape", MUT { out.output_qk.shape[3] = 5; },
       "output_qk", "(batch, num_heads, sequence_length, total_sequence_length)"},
      {"output_qk unasked", MUT { a.qk_output = 0; }, "output_qk", "is given but qk_output = 0"},
      {"output_qk type", MUT { out.output_qk.type = ElementType::float16; }, "output_qk", "the query's type"},
      {"output over the query", MUT { out.output.data = c.query.data(); }, "output", "must not overlap query"},
      {"present value over present key", MUT {
         c.present_key.resize(c.present_key.size() + c.present_value.size());
         out.present_key.data = c.present_key.data();
         out.present_value.data = c.present_key.data() + 64;
       }, "present_key", "must not overlap present_value"},
      {"present over its past, shifted", MUT {
         c.past_key.resize(c.past_key.size() + 64);
         in.past_key.data = c.past_key.data();
         out.present_key.data = c.past_key.data() + 16;
       }, "present_key", "must not overlap past_key"},
      {"output_qk over output", MUT {
         c.output.resize(c.output.size() + c.output_qk.size() * 2);
         out.output.data = c.output.data();
         out.output_qk.data = c.output.data() + 8;
       }, "output", "must not overlap"},
  });
}

// The index rule (issue 36): shapes whose element counts or byte sizes do not fit int64 / an address space, and
// attributes whose packed head count overflows, are rejected by name before anything is read or written.
TEST(GqaBadInput, SizesMustFitInt64) {
  constexpr std::int64_t k2to32 = std::int64_t{1} << 32;
  run_rules(base(), {
      {"query elements wrap int64 (null data)", MUT {
         in.query.shape = {k2to32, k2to32, 64};  // 2^70 elements: the product wrapped to 0 and null data passed
         in.query.data = nullptr;
       }, "query", "more elements than fit int64"},
      {"query bytes beyond an address space", MUT { in.query.shape = {std::int64_t{1} << 56, 1, 64}; },
       "query", "more bytes than an address space"},
      {"present_key rows 2^60", MUT { out.present_key.shape[2] = std::int64_t{1} << 60; },
       "present_key", "more elements than fit int64"},
      {"k_scale elements wrap", MUT { in.k_scale.shape = {k2to32, k2to32}; }, "k_scale", "more elements than fit int64"},
      {"output_qk elements wrap", MUT { out.output_qk.shape = {k2to32, k2to32, 1, 1 << 20}; },
       "output_qk", "more elements than fit int64"},
      {"num_heads + 2 * kv_num_heads overflows", MUT {
         a.num_heads = std::int64_t{1} << 62;
         a.kv_num_heads = std::int64_t{1} << 62;
       }, "num_heads", "does not fit int64"},
      {"element type out of range", MUT { in.query.type = static_cast<ElementType>(99); },
       "query", "outside ElementType"},
      {"threads 4000", MUT { cfg.threads = 4000; }, "config.threads", "at most 1024"},
      {"backend out of range", MUT { cfg.backend = static_cast<Backend>(9); }, "config.backend",
       "must be Auto, Cpu, Reference, Cuda or Vulkan"},
  });
}

}  // namespace
}  // namespace attnkit::test
