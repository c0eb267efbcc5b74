// Layouts and the problem's own defaults: the named Layout constructors against the index formulas they
// name, the packed QKV slices (disjoint, together exactly the projection), the mask's broadcast strides,
// AttentionProblem's named constructors, the defaults Attention::problem() fills in, and the case-file
// parser.
#include <attnkit/attention.hpp>
#include <testing/cases.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace attnkit::test {
namespace {

constexpr std::int64_t B = 2, H = 6, Hkv = 2, S = 5, D = 4;

TEST(Layout, HeadFirstAndPositionsFirst) {
  const Layout hf = Layout::head_first(H, S, D);
  const Layout pf = Layout::positions_first(H, S, D);
  std::vector<int> hf_hits(B * H * S * D), pf_hits(B * H * S * D);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s) {
        EXPECT_EQ(hf.index(b, h, s), ((b * H + h) * S + s) * D);
        EXPECT_EQ(pf.index(b, h, s), ((b * S + s) * H + h) * D);
        for (std::int64_t d = 0; d < D; ++d) {
          ++hf_hits[static_cast<std::size_t>(hf.index(b, h, s) + d)];
          ++pf_hits[static_cast<std::size_t>(pf.index(b, h, s) + d)];
        }
      }
  // Dense: every element of [B, H, S, D] reached exactly once.
  for (int n : hf_hits) EXPECT_EQ(n, 1);
  for (int n : pf_hits) EXPECT_EQ(n, 1);
  EXPECT_EQ(hf.offset, 0);
  EXPECT_EQ(pf.offset, 0);
}

// One projection [B, S, (H + 2 Hkv) D], per token [Q heads | K heads | V heads]: the three slices are
// disjoint and together cover the buffer exactly; each head's D elements sit where the formula says.
TEST(Layout, PackedQkvSlices) {
  const Layout q = Layout::packed_qkv_q(H, Hkv, S, D);
  const Layout k = Layout::packed_qkv_k(H, Hkv, S, D);
  const Layout v = Layout::packed_qkv_v(H, Hkv, S, D);
  const std::int64_t token = (H + 2 * Hkv) * D;
  std::vector<int> owner(B * S * token, -1);
  auto mark = [&](const Layout& l, std::int64_t heads, int who) {
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t d = 0; d < D; ++d) {
            int& o = owner[static_cast<std::size_t>(l.index(b, h, s) + d)];
            EXPECT_EQ(o, -1) << "element reached twice";
            o = who;
          }
  };
  mark(q, H, 0);
  mark(k, Hkv, 1);
  mark(v, Hkv, 2);
  for (int o : owner) EXPECT_NE(o, -1);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t t = (b * S + s) * token;
      for (std::int64_t h = 0; h < H; ++h) EXPECT_EQ(q.index(b, h, s), t + h * D);
      for (std::int64_t h = 0; h < Hkv; ++h) {
        EXPECT_EQ(k.index(b, h, s), t + (H + h) * D);
        EXPECT_EQ(v.index(b, h, s), t + (H + Hkv + h) * D);
      }
    }
}

// A mask [mb, mh, mr, K]: a dimension of size 1 broadcasts (stride 0), the others are dense.
TEST(Layout, MaskBroadcastStrides) {
  const std::int64_t Q = 3, K = 7;
  for (std::int64_t mb : {std::int64_t{1}, B})
    for (std::int64_t mh : {std::int64_t{1}, H})
      for (std::int64_t mr : {std::int64_t{1}, Q}) {
        SCOPED_TRACE(std::to_string(mb) + "x" + std::to_string(mh) + "x" + std::to_string(mr));
        const Layout m = Layout::mask(mb, mh, mr, K);
        EXPECT_EQ(m.offset, 0);
        EXPECT_EQ(m.batch_stride == 0, mb == 1);
        EXPECT_EQ(m.head_stride == 0, mh == 1);
        EXPECT_EQ(m.row_stride == 0, mr == 1);
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < Q; ++i) {
              const std::int64_t bb = mb == 1 ? 0 : b, hh = mh == 1 ? 0 : h, ii = mr == 1 ? 0 : i;
              EXPECT_EQ(m.index(b, h, i), ((bb * mh + hh) * mr + ii) * K);
            }
      }
  // The key-padding mask of the seed, [B, 1, 1, K].
  const Layout kp = Layout::mask(B, 1, 1, K);
  EXPECT_EQ(kp.batch_stride, K);
  EXPECT_EQ(kp.head_stride, 0);
  EXPECT_EQ(kp.row_stride, 0);
}

TEST(Layout, RowsOnly) {
  const Layout l = Layout::rows_only(H, S);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s) EXPECT_EQ(l.index(b, h, s), (b * H + h) * S + s);
}

TEST(Problem, NamedConstructors) {
  for (bool positions : {false, true}) {
    const AttentionProblem p = positions ? AttentionProblem::positions_first(B, H, Hkv, 3, 9, D, DType::bf16)
                                         : AttentionProblem::head_first(B, H, 0, 3, 9, D, DType::f16);
    const auto make = positions ? Layout::positions_first : Layout::head_first;
    const std::int64_t kv = positions ? Hkv : H;  // kv_heads 0 means "same as heads"
    EXPECT_EQ(p.batch, B);
    EXPECT_EQ(p.heads, H);
    EXPECT_EQ(p.kv_heads, kv);
    EXPECT_EQ(p.q_len, 3);
    EXPECT_EQ(p.k_len, 9);
    EXPECT_EQ(p.head_dim, D);
    EXPECT_EQ(p.dtype, positions ? DType::bf16 : DType::f16);
    auto same = [](const Layout& a, const Layout& b) {
      return a.offset == b.offset && a.batch_stride == b.batch_stride && a.head_stride == b.head_stride &&
             a.row_stride == b.row_stride;
    };
    EXPECT_TRUE(same(p.q, make(H, 3, D)));
    EXPECT_TRUE(same(p.k, make(kv, 9, D)));
    EXPECT_TRUE(same(p.v, make(kv, 9, D)));
    EXPECT_TRUE(same(p.o, make(H, 3, D)));
    EXPECT_TRUE(same(p.lse, Layout::rows_only(H, 3)));
    EXPECT_FALSE(p.has_mask || p.has_key_lengths || p.causal || p.has_head_sink || p.return_lse);
  }
}

// Attention::problem() is the problem with every default filled in.
TEST(Problem, DefaultsAreFilledIn) {
  AttentionProblem p = AttentionProblem::head_first(1, 8, 0, 3, 10, 64);
  p.v_head_dim = 0;
  p.causal = true;
  const AttentionProblem n = Attention(p).problem();  // a copy: the op is a temporary
  EXPECT_EQ(n.kv_heads, 8);
  EXPECT_EQ(n.v_head_dim, 64);
  ASSERT_TRUE(n.scale.has_value());
  EXPECT_EQ(*n.scale, 1.0f / std::sqrt(64.0f));
  ASSERT_TRUE(n.causal_offset.has_value());
  EXPECT_EQ(*n.causal_offset, 10 - 3);
  EXPECT_EQ(n.masked_rows, MaskedRows::Nan);
  EXPECT_EQ(n.work_budget, 0);
  // Given values are kept.
  p.kv_heads = 2;
  p.v_head_dim = 5;
  p.o = Layout::head_first(8, 3, 5);
  p.v = Layout::head_first(2, 10, 5);
  p.scale = 0.3f;
  p.causal_offset = -4;
  const AttentionProblem g = Attention(p).problem();
  EXPECT_EQ(g.kv_heads, 2);
  EXPECT_EQ(g.v_head_dim, 5);
  EXPECT_EQ(*g.scale, 0.3f);
  EXPECT_EQ(*g.causal_offset, -4);
}

TEST(Problem, Backends) {
  EXPECT_EQ(backend_name(Backend::Auto), "auto");
  EXPECT_EQ(backend_name(Backend::Cpu), "cpu");
  EXPECT_EQ(backend_name(Backend::Reference), "reference");
  EXPECT_EQ(backend_name(Backend::Cuda), "cuda");
  const auto b = available_backends();
  EXPECT_NE(std::find(b.begin(), b.end(), Backend::Cpu), b.end());
  EXPECT_NE(std::find(b.begin(), b.end(), Backend::Reference), b.end());
  for (Backend x : {Backend::Cpu, Backend::Reference, Backend::Cuda, Backend::Vulkan}) {
    EXPECT_EQ(backend_available(x), std::find(b.begin(), b.end(), x) != b.end()) << backend_name(x);
  }
  const AttentionProblem p = AttentionProblem::head_first(1, 1, 0, 2, 2, 4);
  AttentionConfig c;
  c.backend = Backend::Reference;
  EXPECT_EQ(Attention(p, c).backend(), Backend::Reference);
  c.backend = Backend::Cpu;
  EXPECT_EQ(Attention(p, c).backend(), Backend::Cpu);
  c.backend = Backend::Auto;
  EXPECT_NE(Attention(p, c).backend(), Backend::Auto);  // Auto resolves to a real backend
}

// ---- the case-file parser (cases/*.json) ----

TEST(CaseParser, FieldsAndDefaults) {
  const auto cases = testing::parse_cases(
      R"([{"name": "a"},
          {"name": "b", "batch": 2, "heads": 4, "kv_heads": 2, "q_len": 3, "k_len": 9, "head_dim": 17, "v_head_dim": 5,
           "layout": "padded", "dtypes": ["float16", "bf16"], "mask": "masked_rows", "key_lengths": "zero",
           "causal": true, "causal_offset": -2, "window": 4, "softcap": 3.5, "scale": 0.25, "head_sink": true,
           "masked_rows": "zero", "lse": true, "input_std": 2.5, "tags": ["edge", "x"], "comment": "ignored"}])",
      "t.json");
  ASSERT_EQ(cases.size(), 2u);
  const auto& a = cases[0];
  EXPECT_EQ(a.file, "t.json");
  EXPECT_EQ(a.batch, 1);
  EXPECT_EQ(a.layout, testing::LayoutKind::HeadFirst);
  EXPECT_EQ(a.dtypes, std::vector<DType>{DType::f32});
  EXPECT_EQ(a.mask, testing::MaskKind::None);
  EXPECT_FALSE(a.causal_offset.has_value());
  const auto& b = cases[1];
  EXPECT_EQ(b.kv_heads, 2);
  EXPECT_EQ(b.v_head_dim, 5);
  EXPECT_EQ(b.layout, testing::LayoutKind::Padded);
  EXPECT_EQ(b.dtypes, (std::vector<DType>{DType::f16, DType::bf16}));
  EXPECT_EQ(b.mask, testing::MaskKind::MaskedRows);
  EXPECT_EQ(b.key_lengths, testing::KeyLengths::Zero);
  EXPECT_EQ(*b.causal_offset, -2);
  EXPECT_EQ(*b.window, 4);
  EXPECT_EQ(*b.softcap, 3.5f);
  EXPECT_EQ(*b.scale, 0.25f);
  EXPECT_TRUE(b.head_sink);
  EXPECT_EQ(b.masked_rows, MaskedRows::Zero);
  EXPECT_TRUE(b.lse);
  EXPECT_EQ(b.input_std, 2.5);
  EXPECT_TRUE(b.has_tag("x"));
  EXPECT_FALSE(b.has_tag("model"));
  // The object form.
  EXPECT_EQ(testing::parse_cases(R"({"cases": [{"name": "c"}]})", "o.json").size(), 1u);
}

TEST(CaseParser, RejectsTyposNamingTheCase) {
  auto message = [](const std::string& json) {
    try {
      testing::parse_cases(json, "bad.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(R"([{"name": "t", "heads": 2, "head_dims": 8}])").find("case 't': unknown field 'head_dims'"), std::string::npos);
  EXPECT_NE(message(R"([{"name": "t", "layout": "rows_first"}])").find("unknown layout 'rows_first'"), std::string::npos);
  EXPECT_NE(message(R"([{"name": "t", "dtypes": ["fp8"]}])").find("unknown dtype 'fp8'"), std::string::npos);
  EXPECT_NE(message(R"([{"name": "t", "mask": "causal"}])").find("unknown mask 'causal'"), std::string::npos);
  EXPECT_NE(message(R"([{"name": "t", "masked_rows": "inf"}])").find("unknown masked_rows 'inf'"), std::string::npos);
}

}  // namespace
}  // namespace attnkit::test
