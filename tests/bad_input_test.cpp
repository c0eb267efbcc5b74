// Bad input: every rule of core::normalize_and_check / core::check_args and of Attention's constructor.
// For each rule a valid call is broken in exactly one way, and the test requires that
//   - attnkit::Error is thrown (not another exception, not a crash, not a silent run),
//   - e.argument() names the field, and what() is "<argument>: <rule>" with the rule stated,
//   - the poisoned O and LSE bytes are unchanged (nothing is written before every check has passed).
// The unbroken call is run first and must succeed, so each rejection is due to the one change alone; where a
// rule has a boundary, the value just inside it is accepted.
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <typeinfo>
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <limits>

namespace attnkit::test {
namespace {

using testing::LayoutKind;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int64_t k2to31 = std::int64_t{1} << 31;

// The valid call every test breaks: float32, 2 batch entries, 4 heads reading 2 K/V heads, 5 queries,
// 7 keys, head_dim 8, v_head_dim 6, with a full mask, key lengths, a sink and the LSE, so that every
// buffer rule has a buffer to break.
Manual base() {
  Manual m(2, 4, 2, 5, 7, 8, 6, DType::f32);
  m.randomize(1);
  m.add_mask();
  m.add_key_lengths(7);
  m.lengths = {7, 3};
  m.add_sink(0.5f);
  m.p.return_lse = true;
  return m;
}

using Mutation = std::function<void(Manual&, AttentionProblem&, AttentionArgs&, AttentionConfig&)>;

// Runs `mutate`d copies of the base call and checks the rejection. `extra` is memory the mutation points
// an output into (an overlap test): it must be unchanged too.
void expect_rejected(const std::string& what, const Mutation& mutate, const std::string& argument,
                     const std::string& phrase, std::vector<std::byte>* extra = nullptr) {
  SCOPED_TRACE(what);
  Manual m = base();
  AttentionProblem p = m.p;
  AttentionArgs a = m.args();
  AttentionConfig c;
  {  // the unbroken call runs
    m.poison();
    ASSERT_NO_THROW(Attention(p, c).run(a));
  }
  m.poison();
  mutate(m, p, a, c);
  const std::vector<std::byte> o_before = m.o;
  const std::vector<float> lse_before = m.lse;
  const std::vector<std::byte> extra_before = extra != nullptr ? *extra : std::vector<std::byte>{};
  try {
    Attention op(p, c);
    op.run(a);
    ADD_FAILURE() << "accepted; expected an Error naming '" << argument << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    const std::string text = e.what();
    EXPECT_EQ(text.rfind(argument + ": ", 0), 0u) << text;
    EXPECT_NE(text.find(phrase), std::string::npos) << "'" << text << "' does not state the rule ('" << phrase << "')";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a " << typeid(e).name() << " instead of attnkit::Error: " << e.what();
  }
  EXPECT_TRUE(m.o == o_before) << "O was written by a rejected call";
  EXPECT_EQ(std::memcmp(m.lse.data(), lse_before.data(), m.lse.size() * sizeof(float)), 0) << "LSE was written";
  if (extra != nullptr) {
    EXPECT_TRUE(*extra == extra_before) << "an aliased output was written by a rejected call";
  }
}

void expect_accepted(const std::string& what, const Mutation& mutate) {
  SCOPED_TRACE(what);
  Manual m = base();
  AttentionProblem p = m.p;
  AttentionArgs a = m.args();
  AttentionConfig c;
  m.poison();
  mutate(m, p, a, c);
  EXPECT_NO_THROW(Attention(p, c).run(a));
}

// ---- shapes and options (the constructor) ----

TEST(BadInput, Sizes) {
  expect_rejected("batch -1", [](auto&, auto& p, auto&, auto&) { p.batch = -1; }, "batch", "must be >= 0");
  expect_rejected("heads 0", [](auto&, auto& p, auto&, auto&) { p.heads = 0; }, "heads", "must be >= 1");
  expect_rejected("heads -4", [](auto&, auto& p, auto&, auto&) { p.heads = -4; }, "heads", "must be >= 1");
  expect_rejected("kv_heads -2", [](auto&, auto& p, auto&, auto&) { p.kv_heads = -2; }, "kv_heads", "must be >= 1");
  expect_rejected("heads 4 % kv_heads 3", [](auto&, auto& p, auto&, auto&) { p.kv_heads = 3; }, "kv_heads",
                  "must be a multiple of kv_heads");
  expect_rejected("heads 4 % kv_heads 8", [](auto&, auto& p, auto&, auto&) { p.kv_heads = 8; }, "kv_heads",
                  "must be a multiple of kv_heads");
  expect_rejected("q_len -1", [](auto&, auto& p, auto&, auto&) { p.q_len = -1; }, "q_len", "must be >= 0");
  expect_rejected("k_len -1", [](auto&, auto& p, auto&, auto&) { p.k_len = -1; }, "k_len", "must be >= 0");
  expect_rejected("q_len 2^31", [](auto&, auto& p, auto&, auto&) { p.q_len = k2to31; }, "q_len", "below 2^31");
  expect_rejected("k_len 2^31", [](auto&, auto& p, auto&, auto&) { p.k_len = k2to31; }, "k_len", "below 2^31");
  expect_rejected("k_len 2^40", [](auto&, auto& p, auto&, auto&) { p.k_len = std::int64_t{1} << 40; }, "k_len", "below 2^31");
  expect_rejected("head_dim 0", [](auto&, auto& p, auto&, auto&) { p.head_dim = 0; }, "head_dim", "[1, 256]");
  expect_rejected("head_dim 257", [](auto&, auto& p, auto&, auto&) { p.head_dim = 257; }, "head_dim", "[1, 256]");
  expect_rejected("head_dim -8", [](auto&, auto& p, auto&, auto&) { p.head_dim = -8; }, "head_dim", "[1, 256]");
  expect_rejected("v_head_dim 257", [](auto&, auto& p, auto&, auto&) { p.v_head_dim = 257; }, "v_head_dim", "[1, 256]");
  expect_rejected("v_head_dim -1", [](auto&, auto& p, auto&, auto&) { p.v_head_dim = -1; }, "v_head_dim", "[1, 256]");
  expect_rejected("dtype out of range", [](auto&, auto& p, auto&, auto&) { p.dtype = static_cast<DType>(7); }, "dtype",
                  "float32, float16 or bfloat16");
}

// The largest lengths the rule allows are accepted by the constructor (the plan is made; nothing is run or
// allocated for them).
// Plan overrides (AttentionConfig::plan) with an unknown kernel or feature, or a negative count, are rejected by
// the field's name on every backend, before any work; known ones are accepted where a backend ignores them.
TEST(BadInput, PlanOverridesAreCheckedByName) {
  const AttentionProblem p = AttentionProblem::head_first(1, 2, 2, 8, 8, 16);
  auto argument_of = [&](const PlanOverrides& o) -> std::string {
    try {
      Attention op(p, AttentionConfig{Backend::Cpu, 0, o});
    } catch (const Error& e) {
      return e.argument();
    }
    return "";
  };
  PlanOverrides kernel;
  kernel.kernel = "fast";
  EXPECT_EQ(argument_of(kernel), "config.plan.kernel");
  PlanOverrides off;
  off.off = {"plain", "turbo"};
  EXPECT_EQ(argument_of(off), "config.plan.off");
  PlanOverrides splits;
  splits.splits = -1;
  EXPECT_EQ(argument_of(splits), "config.plan.splits");
  PlanOverrides fine;
  fine.kernel = "mma";
  fine.off = {"plain"};
  EXPECT_EQ(argument_of(fine), "");
  EXPECT_THROW(parse_plan_overrides("kernel=mma,colour=red"), Error);
}

TEST(BadInput, LengthsJustBelow2To31AreAccepted) {
  for (bool keys : {false, true}) {
    AttentionProblem p = AttentionProblem::head_first(1, 2, 1, keys ? 1 : k2to31 - 1, keys ? k2to31 - 1 : 1, 8);
    EXPECT_NO_THROW(Attention{p}) << (keys ? "k_len" : "q_len");
  }
}

TEST(BadInput, Options) {
  expect_rejected("scale NaN", [](auto&, auto& p, auto&, auto&) { p.scale = kNaN; }, "scale", "must be finite");
  expect_rejected("scale +inf", [](auto&, auto& p, auto&, auto&) { p.scale = kInf; }, "scale", "must be finite");
  expect_rejected("scale -inf", [](auto&, auto& p, auto&, auto&) { p.scale = -kInf; }, "scale", "must be finite");
  expect_rejected("softcap 0", [](auto&, auto& p, auto&, auto&) { p.softcap = 0.0f; }, "softcap", "finite and > 0");
  expect_rejected("softcap -1", [](auto&, auto& p, auto&, auto&) { p.softcap = -1.0f; }, "softcap", "finite and > 0");
  expect_rejected("softcap NaN", [](auto&, auto& p, auto&, auto&) { p.softcap = kNaN; }, "softcap", "finite and > 0");
  expect_rejected("softcap inf", [](auto&, auto& p, auto&, auto&) { p.softcap = kInf; }, "softcap", "finite and > 0");
  expect_rejected("window without causal", [](auto&, auto& p, auto&, auto&) { p.window = 3; }, "window",
                  "needs causal = true");
  expect_rejected("window 0", [](auto&, auto& p, auto&, auto&) { p.causal = true, p.window = 0; }, "window", "must be >= 1");
  expect_rejected("window -2", [](auto&, auto& p, auto&, auto&) { p.causal = true, p.window = -2; }, "window", "must be >= 1");
  expect_rejected("work_budget -1", [](auto&, auto& p, auto&, auto&) { p.work_budget = -1; }, "work_budget", "must be >= 0");
  expect_rejected("threads -1", [](auto&, auto&, auto&, auto& c) { c.threads = -1; }, "config.threads", "must be >= 0");
  // Inside the rules: a negative scale and causal offset, window 1, threads 1, a tiny softcap are fine.
  expect_accepted("scale -0.1, offset -3, window 1, softcap 1e-3, threads 1", [](auto&, auto& p, auto&, auto& c) {
    p.scale = -0.1f, p.causal = true, p.causal_offset = -3, p.window = 1, p.softcap = 1e-3f, c.threads = 1;
  });
}

// Per-batch causal offsets (int32[batch], with causal): the flag needs causal, the buffer needs the flag and
// must hold batch entries. Any int32 value is a valid offset (a row may see nothing, or everything).
void with_offsets(Manual& m, AttentionProblem& p, AttentionArgs& a) {
  m.offsets = {1, -2};
  p.causal = true;
  p.has_causal_offsets = true;
  a.causal_offsets = {m.offsets.data(), 2};
}

TEST(BadInput, PerBatchCausalOffsets) {
  expect_accepted("offsets {1, -2}", [](auto& m, auto& p, auto& a, auto&) { with_offsets(m, p, a); });
  expect_accepted("offsets INT32_MIN, INT32_MAX", [](auto& m, auto& p, auto& a, auto&) {
    with_offsets(m, p, a);
    m.offsets = {std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max()};
  });
  expect_rejected("offsets without causal", [](auto& m, auto& p, auto& a, auto&) {
    with_offsets(m, p, a);
    p.causal = false;
  }, "has_causal_offsets", "need causal = true");
  expect_rejected("offsets buffer without the flag", [](auto& m, auto& p, auto& a, auto&) {
    with_offsets(m, p, a);
    p.has_causal_offsets = false;
  }, "causal_offsets", "problem.has_causal_offsets is false");
  expect_rejected("offsets null", [](auto& m, auto& p, auto& a, auto&) {
    with_offsets(m, p, a);
    a.causal_offsets = {};
  }, "causal_offsets", "is null");
  expect_rejected("offsets one short", [](auto& m, auto& p, auto& a, auto&) {
    with_offsets(m, p, a);
    a.causal_offsets.elements = 1;
  }, "causal_offsets", "the layout reaches element 1");
}

TEST(BadInput, CudaBackendUnavailable) {
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), Backend::Cuda) != backends.end())
    GTEST_SKIP() << "this machine runs the CUDA backend";
  expect_rejected("Backend::Cuda", [](auto&, auto&, auto&, auto& c) { c.backend = Backend::Cuda; }, "config.backend",
                  "CUDA");
}

// ---- layouts ----

Layout& layout_of(AttentionProblem& p, const std::string& t) {
  if (t == "q") return p.q;
  if (t == "k") return p.k;
  if (t == "v") return p.v;
  if (t == "o") return p.o;
  if (t == "mask") return p.mask;
  return p.lse;
}

TEST(BadInput, NegativeOffsetsAndStrides) {
  for (const std::string t : {"q", "k", "v", "o", "mask", "lse"}) {
    for (const std::string f : {"offset", "batch_stride", "head_stride", "row_stride"}) {
      expect_rejected(t + "." + f + " = -1", [&](auto&, auto& p, auto&, auto&) {
        Layout& l = layout_of(p, t);
        (f == "offset" ? l.offset : f == "batch_stride" ? l.batch_stride : f == "head_stride" ? l.head_stride : l.row_stride) = -1;
      }, t + "." + f, "must be >= 0");
    }
  }
}

TEST(BadInput, QueryRowsMustAdvance) {
  expect_rejected("q.row_stride 0 with q_len 5", [](auto&, auto& p, auto&, auto&) { p.q.row_stride = 0; }, "q.row_stride",
                  "must be >= 1 when q_len > 1");
  // One query row needs no row stride.
  expect_accepted("q.row_stride 0 with q_len 1", [](auto& m, auto& p, auto& a, auto&) {
    p.q_len = 1;
    p.q.row_stride = 0;
    (void)m, (void)a;
  });
}

// An output whose elements share addresses (by its strides) is rejected, naming the stride at fault.
TEST(BadInput, OutputSelfOverlap) {
  // o is head-first [2, 4, 5, 6]: row stride 6, head stride 30, batch stride 120.
  expect_rejected("o rows overlap", [](auto&, auto& p, auto&, auto&) { p.o.row_stride = 5; }, "o.row_stride",
                  "must not share addresses");
  expect_rejected("o heads overlap", [](auto&, auto& p, auto&, auto&) { p.o.head_stride = 29; }, "o.head_stride",
                  "must not share addresses");
  expect_rejected("o heads broadcast", [](auto&, auto& p, auto&, auto&) { p.o.head_stride = 0; }, "o.head_stride",
                  "must not share addresses");
  expect_rejected("o batch overlaps", [](auto&, auto& p, auto&, auto&) { p.o.batch_stride = 100; }, "o.batch_stride",
                  "must not share addresses");
  // lse is [2, 4, 5]: row stride 1, head stride 5, batch stride 20.
  expect_rejected("lse rows overlap", [](auto&, auto& p, auto&, auto&) { p.lse.row_stride = 0; }, "lse.row_stride",
                  "must not share addresses");
  expect_rejected("lse heads overlap", [](auto&, auto& p, auto&, auto&) { p.lse.head_stride = 4; }, "lse.head_stride",
                  "must not share addresses");
  // Strides that only just step over the inner dimensions, in another order (positions-first), are fine.
  expect_accepted("o positions-first", [](auto&, auto& p, auto&, auto&) { p.o = Layout::positions_first(4, 5, 6); });
  // An extent of 1 may have any stride (it is never stepped).
  expect_accepted("o with one batch entry, batch stride 0", [](auto&, auto& p, auto& a, auto&) {
    p.batch = 1;
    p.o.batch_stride = 0;
    (void)a;
  });
}

// ---- buffers (run) ----

TEST(BadInput, NullPointers) {
  expect_rejected("q null", [](auto&, auto&, auto& a, auto&) { a.q.data = nullptr; }, "q", "is null");
  expect_rejected("k null", [](auto&, auto&, auto& a, auto&) { a.k.data = nullptr; }, "k", "is null");
  expect_rejected("v null", [](auto&, auto&, auto& a, auto&) { a.v.data = nullptr; }, "v", "is null");
  expect_rejected("o null", [](auto&, auto&, auto& a, auto&) { a.o.data = nullptr; }, "o", "is null");
  expect_rejected("mask null", [](auto&, auto&, auto& a, auto&) { a.mask.data = nullptr; }, "mask", "is null");
  expect_rejected("key_lengths null", [](auto&, auto&, auto& a, auto&) { a.key_lengths.data = nullptr; }, "key_lengths", "is null");
  expect_rejected("head_sink null", [](auto&, auto&, auto& a, auto&) { a.head_sink.data = nullptr; }, "head_sink", "is null");
  expect_rejected("lse null", [](auto&, auto&, auto& a, auto&) { a.lse.data = nullptr; }, "lse", "is null");
  // Empty tensors need no buffer: K and V with no keys, everything with no queries.
  expect_accepted("k_len 0: K, V, mask null", [](auto&, auto& p, auto& a, auto&) {
    p.k_len = 0;
    p.mask = Layout::mask(2, 4, 5, 0);
    p.k = p.v = Layout{};
    a.k = a.v = a.mask = {};
    p.has_key_lengths = false;
    a.key_lengths = {};
  });
  expect_accepted("q_len 0: only the sink and key lengths are read", [](auto&, auto& p, auto& a, auto&) {
    p.q_len = 0;
    a.q = a.k = a.v = a.mask = {};
    a.o = {};
    a.lse = {};
  });
}

TEST(BadInput, BuffersWithoutTheirFlag) {
  expect_rejected("mask given, has_mask false", [](auto&, auto& p, auto&, auto&) { p.has_mask = false; }, "mask",
                  "problem.has_mask is false");
  expect_rejected("key lengths given, has_key_lengths false", [](auto&, auto& p, auto&, auto&) { p.has_key_lengths = false; },
                  "key_lengths", "problem.has_key_lengths is false");
  expect_rejected("sink given, has_head_sink false", [](auto&, auto& p, auto&, auto&) { p.has_head_sink = false; },
                  "head_sink", "problem.has_head_sink is false");
  expect_rejected("lse given, return_lse false", [](auto&, auto& p, auto&, auto&) { p.return_lse = false; }, "lse",
                  "problem.return_lse is false");
}

// A buffer one element short of what its layout reaches is rejected; exactly long enough is accepted.
TEST(BadInput, BuffersTooShort) {
  auto shorten = [](const std::string& name, std::int64_t by) {
    return [name, by](auto&, auto&, AttentionArgs& a, auto&) {
      auto& e = name == "q" ? a.q.elements : name == "k" ? a.k.elements : name == "v" ? a.v.elements
              : name == "o" ? a.o.elements : name == "mask" ? a.mask.elements : name == "key_lengths" ? a.key_lengths.elements
              : name == "head_sink" ? a.head_sink.elements : a.lse.elements;
      e -= by;
    };
  };
  for (const std::string name : {"q", "k", "v", "o", "mask", "key_lengths", "head_sink", "lse"}) {
    expect_rejected(name + " one short", shorten(name, 1), name, "the layout reaches element");
  }
  // A broadcast mask [B, 1, 1, K] needs only B * K elements; one fewer is too few.
  expect_accepted("key-padding mask, exactly B * K", [](auto&, auto& p, auto& a, auto&) {
    p.mask = Layout::mask(2, 1, 1, 7);
    a.mask.elements = 14;
  });
  expect_rejected("key-padding mask, B * K - 1", [](auto&, auto& p, auto& a, auto&) {
    p.mask = Layout::mask(2, 1, 1, 7);
    a.mask.elements = 13;
  }, "mask", "the layout reaches element 13");
}

// Every layout kind of the case library: each of Q, K, V and O one element short of its layout's reach
// (computed from the layout, not from the buffer) is rejected; exactly enough is accepted.
TEST(BadInput, ExtentsTooSmallForEachLayout) {
  for (LayoutKind kind : {LayoutKind::HeadFirst, LayoutKind::PositionsFirst, LayoutKind::PackedQkv, LayoutKind::Padded,
                          LayoutKind::BroadcastKv}) {
    CaseSpec s;
    s.name = "extents";
    s.batch = 2, s.heads = 4, s.kv_heads = 2, s.q_len = 9, s.k_len = 9, s.head_dim = 8, s.layout = kind, s.lse = true;
    for (const std::string t : {"q", "k", "v", "o"}) {
      SCOPED_TRACE(testing::layout_name(kind) + " " + t);
      CaseData data(s, DType::f16, 1);
      const AttentionProblem n = core::normalize_and_check(data.problem());
      const bool kv = t == "k" || t == "v";
      const Layout& l = t == "q" ? n.q : t == "k" ? n.k : t == "v" ? n.v : n.o;
      const std::int64_t need =
          core::index_span(l, n.batch, kv ? n.kv_heads : n.heads, kv ? n.k_len : n.q_len, t == "q" || t == "k" ? n.head_dim : n.v_head_dim)
              .highest + 1;
      AttentionArgs a = data.args();
      std::int64_t& e = t == "q" ? a.q.elements : t == "k" ? a.k.elements : t == "v" ? a.v.elements : a.o.elements;
      ASSERT_GE(e, need);
      e = need;
      data.poison_outputs();
      EXPECT_NO_THROW(Attention(data.problem()).run(a));
      e = need - 1;
      data.poison_outputs();
      const std::vector<std::byte> before = data.output_bytes();
      try {
        Attention(data.problem()).run(a);
        ADD_FAILURE() << "accepted";
      } catch (const Error& err) {
        EXPECT_EQ(err.argument(), t);
        EXPECT_NE(std::string(err.what()).find("reaches element " + std::to_string(need - 1)), std::string::npos) << err.what();
      }
      EXPECT_TRUE(data.output_bytes() == before);
    }
  }
}

TEST(BadInput, KeyLengthValues) {
  expect_rejected("key_lengths[1] = -1", [](auto& m, auto&, auto&, auto&) { m.lengths[1] = -1; }, "key_lengths[1]",
                  "outside [0, k_len = 7]");
  expect_rejected("key_lengths[0] = k_len + 1", [](auto& m, auto&, auto&, auto&) { m.lengths[0] = 8; }, "key_lengths[0]",
                  "outside [0, k_len = 7]");
  expect_rejected("key_lengths[1] = INT32_MIN", [](auto& m, auto&, auto&, auto&) {
    m.lengths[1] = std::numeric_limits<std::int32_t>::min();
  }, "key_lengths[1]", "outside [0, k_len = 7]");
  expect_accepted("key lengths 0 and k_len", [](auto& m, auto&, auto&, auto&) { m.lengths = {0, 7}; });
}

// ---- aliasing: an output may not overlap any other buffer of the call ----

// Builds an arena holding O's bytes and, `shift` bytes from O's start, a copy of the named input, then
// points O and that input into the arena. The arena is checked to be unchanged after the rejection.
TEST(BadInput, OutputOverlapsAnInput) {
  for (const std::string input : {"q", "k", "v", "mask", "key_lengths", "head_sink", "causal_offsets"}) {
    std::vector<std::byte> arena;
    expect_rejected("o overlaps " + input, [&](Manual& m, AttentionProblem& p, AttentionArgs& a, auto&) {
      if (input == "causal_offsets") with_offsets(m, p, a);
      const std::size_t o_bytes = m.o.size();
      const void* src = input == "q" ? static_cast<const void*>(m.q.data()) : input == "k" ? static_cast<const void*>(m.k.data())
                      : input == "v" ? static_cast<const void*>(m.v.data()) : input == "mask" ? static_cast<const void*>(m.mask.data())
                      : input == "key_lengths" ? static_cast<const void*>(m.lengths.data())
                      : input == "head_sink" ? static_cast<const void*>(m.sink.data()) : static_cast<const void*>(m.offsets.data());
      const std::size_t src_bytes = input == "q" ? m.q.size() : input == "k" ? m.k.size() : input == "v" ? m.v.size()
                                  : input == "mask" ? m.mask.size() * 4 : input == "key_lengths" ? m.lengths.size() * 4
                                  : input == "head_sink" ? m.sink.size() * 4 : m.offsets.size() * 4;
      const std::size_t shift = o_bytes - 8;  // the input starts inside O's last two elements
      arena.assign(shift + src_bytes, std::byte{0x7f});
      std::memcpy(arena.data() + shift, src, src_bytes);
      a.o.data = arena.data();
      const void* moved = arena.data() + shift;
      if (input == "q") a.q.data = moved;
      if (input == "k") a.k.data = moved;
      if (input == "v") a.v.data = moved;
      if (input == "mask") a.mask.data = moved;
      if (input == "key_lengths") a.key_lengths.data = moved;
      if (input == "head_sink") a.head_sink.data = moved;
      if (input == "causal_offsets") a.causal_offsets.data = moved;
    }, "o", "must not overlap " + input, &arena);
  }
}

TEST(BadInput, OutputsOverlapEachOther) {
  std::vector<std::byte> arena;
  // O and the LSE in one buffer (the LSE's first row is O's last element): reported on O, the first output.
  expect_rejected("o overlaps lse", [&](Manual& m, auto&, AttentionArgs& a, auto&) {
    arena.assign(m.o.size() + m.lse.size() * 4, std::byte{0x7f});
    a.o.data = arena.data();
    a.lse.data = arena.data() + m.o.size() - 4;
  }, "o", "must not overlap lse", &arena);
  // The LSE over an input.
  expect_rejected("lse overlaps mask", [&](Manual& m, auto&, AttentionArgs& a, auto&) {
    arena.assign(m.mask.size() * 4, std::byte{0});
    std::memcpy(arena.data(), m.mask.data(), arena.size());
    a.mask.data = arena.data();
    a.lse.data = arena.data() + 16;
  }, "lse", "must not overlap mask", &arena);
  expect_rejected("lse overlaps q", [&](Manual& m, auto&, AttentionArgs& a, auto&) {
    arena.assign(m.q.size() + m.lse.size() * 4, std::byte{0});
    std::memcpy(arena.data(), m.q.data(), m.q.size());
    a.q.data = arena.data();
    a.lse.data = arena.data() + m.q.size() - 4;
  }, "lse", "must not overlap q", &arena);
}

// Scratch: 64-byte aligned, at least scratch_bytes(), and not overlapping anything else.
TEST(BadInput, Scratch) {
  // Sized from the plan of this exact problem and config (the scratch size depends on the thread count).
  const std::size_t need = [] {
    Manual m = base();
    return Attention(m.p).scratch_bytes();
  }();
  ASSERT_GT(need, 0u);
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  const std::size_t room = (need + 4096 + 63) / 64 * 64;
  std::unique_ptr<std::byte, Free> block(static_cast<std::byte*>(std::aligned_alloc(64, room)));
  std::byte* s = block.get();
  expect_accepted("scratch exactly scratch_bytes()", [&](auto&, auto&, auto& a, auto&) {
    a.scratch = s;
    a.scratch_bytes = need;
  });
  expect_rejected("scratch misaligned", [&](auto&, auto&, auto& a, auto&) {
    a.scratch = s + 32;
    a.scratch_bytes = need;
  }, "scratch", "aligned to 64 bytes");
  expect_rejected("scratch one byte short", [&](auto&, auto&, auto& a, auto&) {
    a.scratch = s;
    a.scratch_bytes = need - 1;
  }, "scratch_bytes", "but this problem needs " + std::to_string(need));
  expect_rejected("scratch overlaps o", [&](Manual& m, auto&, AttentionArgs& a, auto&) {
    a.scratch = s;
    a.scratch_bytes = need;
    a.o.data = s + need - 4;  // O's first element is the scratch's last four bytes
    (void)m;
  }, "o", "must not overlap scratch");
  expect_rejected("scratch overlaps q", [&](Manual& m, auto&, AttentionArgs& a, auto&) {
    a.scratch = s;
    a.scratch_bytes = need;
    std::memcpy(s + need - 64, m.q.data(), 64);  // Q starts in the scratch's last 64 bytes
    a.q.data = s + need - 64;
    a.q.elements = static_cast<std::int64_t>((room - (need - 64)) / 4);
  }, "scratch", "must not overlap q");
}

// ---- the index rule: every index a problem reaches fits int64 (issue 36's reproducers) ----

constexpr std::int64_t k2to62 = std::int64_t{1} << 62;
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// The reproducer: O's span, (1)(2^62 + 250) + (1)(2^62) + 5, wraps below its offset. It was taken as empty, and the
// CPU kernel wrote 1000 bytes past a 1-element O buffer. Now the layout is rejected by name before any work.
TEST(BadInput, WrappingOutputSpanIsRejected) {
  std::vector<std::byte> guard(4096, std::byte{0x5a});
  expect_rejected("o strides wrap int64", [&](Manual&, AttentionProblem& p, AttentionArgs& a, auto&) {
    p.o = Layout{0, k2to62 + 250, k2to62, 1};
    a.o = {guard.data(), 1};
  }, "o.head_stride", "does not fit int64", &guard);
  expect_rejected("o strides wrap int64, null O", [&](Manual&, AttentionProblem& p, AttentionArgs& a, auto&) {
    p.o = Layout{0, k2to62 + 250, k2to62, 1};
    a.o = {nullptr, 1};
  }, "o.head_stride", "does not fit int64", &guard);
  EXPECT_TRUE(std::all_of(guard.begin(), guard.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
}

TEST(BadInput, EveryLayoutsIndicesMustFitInt64) {
  using Field = std::int64_t Layout::*;
  const std::pair<Field, const char*> fields[] = {{&Layout::batch_stride, "batch_stride"},
                                                  {&Layout::head_stride, "head_stride"},
                                                  {&Layout::row_stride, "row_stride"}};
  const std::pair<Layout AttentionProblem::*, const char*> tensors[] = {
      {&AttentionProblem::q, "q"}, {&AttentionProblem::k, "k"}, {&AttentionProblem::v, "v"},
      {&AttentionProblem::o, "o"}, {&AttentionProblem::mask, "mask"}, {&AttentionProblem::lse, "lse"}};
  for (const auto& tensor_entry : tensors) {  // no structured bindings: clang 14 cannot capture them
    const auto tensor = tensor_entry.first;
    const std::string tname = tensor_entry.second;
    for (const auto& field_entry : fields) {
      const auto field = field_entry.first;
      const std::string fname = field_entry.second;
      // The sum overflows, and the error names the field of its largest term (every extent of the base is >= 2).
      expect_rejected(std::string(tname) + "." + fname + " = INT64_MAX",
                      [&](auto&, AttentionProblem& p, auto&, auto&) { (p.*tensor).*field = kInt64Max; },
                      std::string(tname) + "." + fname, "does not fit int64");
    }
    // offset + the last column: the offset alone is fine, the highest index is not.
    expect_rejected(std::string(tname) + ".offset near INT64_MAX",
                    [&](auto&, AttentionProblem& p, auto&, auto&) { (p.*tensor).offset = kInt64Max - 2; },
                    std::string(tname) + ".offset", "does not fit int64");
  }
  // Just inside: the highest index is INT64_MAX - 1, which fits; the call is rejected later, by the buffer size.
  expect_rejected("q.offset at the largest representable span", [](auto&, AttentionProblem& p, auto&, auto&) {
    p.q = Layout{kInt64Max - (2 * 4 * 5 * 8), 4 * 5 * 8, 5 * 8, 8};
  }, "q", "the layout reaches element");
}

// A buffer cannot hold more bytes than an address space: its stated size bounds every byte offset computed from it.
TEST(BadInput, BufferSizesBeyondAnAddressSpace) {
  expect_rejected("q.elements INT64_MAX", [](auto&, auto&, AttentionArgs& a, auto&) { a.q.elements = kInt64Max; }, "q",
                  "more than an address space holds");
  expect_rejected("o.elements 2^62 float32", [](auto&, auto&, AttentionArgs& a, auto&) { a.o.elements = k2to62; }, "o",
                  "more than an address space holds");
  expect_rejected("lse.elements 2^62", [](auto&, auto&, AttentionArgs& a, auto&) { a.lse.elements = k2to62; }, "lse",
                  "more than an address space holds");
  expect_accepted("q.elements 2^61 - 1 float32 (fits)", [](auto&, auto&, AttentionArgs& a, auto&) {
    a.q.elements = (std::int64_t{1} << 61) - 1;
  });
}

// The size rule: the logical element counts fit int64 (extents counted as at least 1), even where broadcast strides
// (0) keep every layout's span small. Huge batch counts with stride 0 used to reach the kernels (a SEGV in LoadU).
TEST(BadInput, LogicalSizesMustFitInt64) {
  auto broadcast = [](AttentionProblem& p) {
    for (Layout* l : {&p.q, &p.k, &p.v, &p.mask}) l->batch_stride = l->head_stride = 0;
  };
  expect_rejected("batch 2^62 over broadcast inputs", [&](auto&, AttentionProblem& p, auto&, auto&) {
    broadcast(p);
    p.batch = k2to62;
  }, "heads", "batch * heads * q_len * max(head_dim, v_head_dim)");
  expect_rejected("heads 2^61", [&](auto&, AttentionProblem& p, auto&, auto&) {
    broadcast(p);
    p.heads = std::int64_t{1} << 61;
    p.kv_heads = 1;
  }, "heads", "does not fit int64");
  expect_rejected("batch * kv_heads * k_len * dim", [&](auto&, AttentionProblem& p, auto&, auto&) {
    broadcast(p);
    p.batch = std::int64_t{1} << 33;
    p.q_len = 1;
    p.k_len = std::int64_t{1} << 30;
    p.heads = p.kv_heads = 1;
    p.head_dim = p.v_head_dim = 1;
    p.has_mask = false;
  }, "kv_heads", "batch * kv_heads * k_len");
  expect_rejected("batch * heads * q_len * k_len", [&](auto&, AttentionProblem& p, auto&, auto&) {
    broadcast(p);
    p.batch = std::int64_t{1} << 33;
    p.q_len = p.k_len = std::int64_t{1} << 15;
    p.heads = p.kv_heads = 1;
    p.head_dim = p.v_head_dim = 1;
    p.has_mask = false;
  }, "k_len", "batch * heads * q_len * k_len");
}

// ---- the smaller findings of issue 36 ----

TEST(BadInput, ConfigThreadsAndBackendInRange) {
  expect_rejected("threads 4000", [](auto&, auto&, auto&, AttentionConfig& c) { c.threads = 4000; }, "config.threads",
                  "must be >= 0 and at most 1024");
  expect_rejected("threads -1", [](auto&, auto&, auto&, AttentionConfig& c) { c.threads = -1; }, "config.threads",
                  "must be >= 0 and at most 1024");
  expect_accepted("threads 1024", [](auto&, auto&, auto&, AttentionConfig& c) { c.threads = 1024; });
  expect_rejected("backend 9", [](auto&, auto&, auto&, AttentionConfig& c) { c.backend = static_cast<Backend>(9); },
                  "config.backend", "must be Auto, Cpu, Reference, Cuda or Vulkan");
}

TEST(BadInput, MaskedRowsInRange) {
  expect_rejected("masked_rows 7", [](auto&, AttentionProblem& p, auto&, auto&) { p.masked_rows = static_cast<MaskedRows>(7); },
                  "masked_rows", "must be Nan or Zero");
}

// An empty problem with a huge batch: nothing to compute, and no backend loops over batch x heads (the reference
// did, and hung at batch 2^50).
TEST(BadInput, EmptyProblemWithHugeBatchReturnsAtOnce) {
  for (Backend backend : {Backend::Reference, Backend::Cpu}) {
    AttentionProblem p = AttentionProblem::head_first(std::int64_t{1} << 50, 1, 1, 0, 0, 8);
    const auto start = std::chrono::steady_clock::now();
    AttentionConfig config;
    config.backend = backend;
    ASSERT_NO_THROW(Attention(p, config).run(AttentionArgs{})) << backend_name(backend);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 1.0) << backend_name(backend);
  }
}

// A head count of 2^63 - 1 over empty sequences passes every rule (its extents fit int64); the planners' divisions
// of it must not overflow (the CPU plan's ceil_div did: UBSan, found by fuzz_attention on 2026-12-03; the input is
// tests/fuzz/regressions/fuzz_attention/crash-70d0d025...). Signed overflow is silent in a Release build: the
// sanitizer pass of CI is where this test fails without the fix.
TEST(BadInput, EmptyProblemWithAnInt64HeadCountPlansAndReturns) {
  constexpr std::int64_t kHeads = std::numeric_limits<std::int64_t>::max();
  for (Backend backend : {Backend::Reference, Backend::Cpu}) {
    for (const std::int64_t batch : {std::int64_t{0}, std::int64_t{1}}) {
      const AttentionProblem p = AttentionProblem::head_first(batch, kHeads, kHeads, 0, 0, 1);
      AttentionConfig config;
      config.backend = backend;
      ASSERT_NO_THROW(Attention(p, config).run(AttentionArgs{})) << backend_name(backend) << " batch " << batch;
    }
  }
}

// Concurrent run() on one object: calls with their own scratch run at once, calls without take turns on the op's
// scratch; every result is bit-identical to a single-threaded run.
TEST(ThreadSafety, ConcurrentRunsOnOneAttentionAreBitIdentical) {
  Manual m(2, 4, 2, 33, 700, 64, 64, DType::f32);  // 700 keys: a split-K plan, whose partials live in scratch
  m.randomize(3);
  m.p.causal = true;
  AttentionConfig config;
  config.threads = 2;
  Attention op(m.p, config);
  const AttentionArgs base_args = m.args();
  m.poison();
  op.run(base_args);
  const std::vector<std::byte> expected = m.o;
  ASSERT_GT(op.scratch_bytes(), 0u);

  constexpr int kThreads = 8, kRuns = 12;
  std::vector<std::vector<std::byte>> outs(kThreads, std::vector<std::byte>(m.o.size()));
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      const bool own_scratch = t % 2 == 0;  // half the threads pass scratch, half use the op's
      struct Free {
        void operator()(std::byte* p) const { std::free(p); }
      };
      const std::size_t bytes = (op.scratch_bytes() + 63) / 64 * 64;
      std::unique_ptr<std::byte, Free> scratch(own_scratch ? static_cast<std::byte*>(std::aligned_alloc(64, bytes))
                                                           : nullptr);
      for (int r = 0; r < kRuns; ++r) {
        std::fill(outs[t].begin(), outs[t].end(), std::byte{0x7f});
        AttentionArgs a = base_args;
        a.o = {outs[t].data(), base_args.o.elements};
        a.lse = {};
        a.scratch = scratch.get();
        a.scratch_bytes = own_scratch ? op.scratch_bytes() : 0;
        op.run(a);
        if (outs[t] != expected) ++wrong[t];
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t << " got wrong results";
}

}  // namespace
}  // namespace attnkit::test
