// Random ragged (packed) batches and paged K/V caches (AttentionProblem::sequences) and the check that every
// sequence of a call equals that sequence alone in a dense call, against the float64 reference: shared by the
// CPU tests (tests/sequences_test.cpp) and the GPU tests (tests/cuda/sequences_test.cpp), which run the same
// batches through a runner that mirrors the buffers on the device.
#pragma once

#include <attnkit/attention.hpp>
#include <attnkit/error.hpp>

#include <core/kv_quant.hpp>
#include <core/problem_check.hpp>
#include <cpu/reference.hpp>
#include <testing/case_data.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace attnkit {
namespace {

struct BatchSpec {
  DType dtype = DType::f32;
  std::int64_t heads = 4, kv_heads = 2, head_dim = 24, v_head_dim = 24;
  std::vector<std::int64_t> q_lens, k_lens;  // per sequence
  bool ragged_q = true, ragged_k = true;     // dense queries: every q_len equal; dense keys: key lengths
  std::int64_t page_size = 0;                // > 0: paged K/V (then ragged_k is false)
  bool heads_before_pages_rows = false;      // paged: [pages, kv_heads, page_size, dim] (HND) instead of NHD
  bool shared_prefix = false;                // paged: sequence 1 reads sequence 0's first page
  KvType kv_type = KvType::Float;
  KvQuant kv_quant = KvQuant::None;
  bool causal = false;
  std::optional<std::int64_t> window;
  std::optional<float> softcap;
  bool sink = false, lse = true;
  MaskedRows masked_rows = MaskedRows::Nan;
  std::int64_t work_budget = 0;
};

inline std::int64_t value_bits(const BatchSpec& s) {
  return s.kv_type == KvType::Int8 ? 8 : s.kv_type == KvType::Int4 ? 4 : 8 * static_cast<std::int64_t>(dtype_size(s.dtype));
}

// Random bytes of `values` K/V values (float types: normal floats; int8 / int4: uniform codes).
inline std::vector<std::uint8_t> random_kv(const BatchSpec& s, std::int64_t values, std::mt19937& rng) {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>((values * value_bits(s) + 7) / 8));
  if (s.kv_type != KvType::Float) {
    std::uniform_int_distribution<int> any(0, 255);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(any(rng));
    return bytes;
  }
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < values; ++i) store_from_float(bytes.data(), s.dtype, i, normal(rng));
  return bytes;
}

inline void copy_values(const std::vector<std::uint8_t>& from, std::int64_t from_index, std::vector<std::uint8_t>& to,
                 std::int64_t to_index, std::int64_t count, std::int64_t bits) {
  // (every row starts on a byte: int4 rows have an even head dim here)
  std::memcpy(&to[static_cast<std::size_t>(to_index * bits / 8)], &from[static_cast<std::size_t>(from_index * bits / 8)],
              static_cast<std::size_t>(count * bits / 8));
}

// One random batch in its ragged / paged form, and each sequence gathered into a dense call of its own.
class Batch {
 public:
  Batch(const BatchSpec& spec, std::uint64_t seed) : s_(spec), rng_(seed) {
    batch_ = static_cast<std::int64_t>(s_.q_lens.size());
    max_q_ = *std::max_element(s_.q_lens.begin(), s_.q_lens.end());
    max_k_ = *std::max_element(s_.k_lens.begin(), s_.k_lens.end());
    build_problem();
    fill_inputs();
  }

  const AttentionProblem& problem() const { return p_; }
  std::int64_t batch() const { return batch_; }

  // Where a buffer of the call lives: the host vector itself, or (place) a device copy of its bytes.
  using Place = std::function<void*(const void* host, std::size_t bytes)>;

  // The call's arguments over this batch's buffers, with `o` and `lse` as outputs (placed by `place`, if given).
  AttentionArgs args(std::vector<std::uint8_t>& o, std::vector<float>& lse, const Place& place = {}) const {
    const auto at = [&](const auto& v) -> void* {
      using E = typename std::decay_t<decltype(v)>::value_type;
      return place ? place(v.data(), v.size() * sizeof(E)) : const_cast<E*>(v.data());
    };
    AttentionArgs a;
    a.q = {at(q_), q_rows_ * s_.heads * s_.head_dim};
    a.k = {at(k_), k_values_};
    a.v = {at(v_), v_values_};
    a.o = {at(o), q_rows_ * s_.heads * s_.v_head_dim};
    if (s_.lse) a.lse = {at(lse), static_cast<std::int64_t>(lse.size())};
    if (s_.sink) a.head_sink = {at(sinks_), s_.heads};
    if (s_.kv_quant != KvQuant::None) {
      a.k_scale = {at(k_scales_), static_cast<std::int64_t>(k_scales_.size())};
      a.v_scale = {at(v_scales_), static_cast<std::int64_t>(v_scales_.size())};
    }
    if (s_.ragged_q) a.cu_seqlens_q = {at(cu_q_), batch_ + 1};
    if (s_.ragged_k) a.cu_seqlens_k = {at(cu_k_), batch_ + 1};
    if (s_.page_size > 0) a.block_table = {at(table_), static_cast<std::int64_t>(table_.size())};
    if (p_.has_key_lengths) a.key_lengths = {at(key_lengths_), batch_};
    return a;
  }
  // The sequence arrays, for tests that change them between runs (their sizes stay).
  std::vector<std::int32_t>& cu_seqlens_k() { return cu_k_; }
  std::vector<std::int32_t>& cu_seqlens_q() { return cu_q_; }
  std::vector<std::int32_t>& block_table() { return table_; }
  std::vector<std::int32_t>& key_lengths() { return key_lengths_; }
  std::vector<std::uint8_t> output_buffer() const {
    return std::vector<std::uint8_t>(static_cast<std::size_t>(q_rows_ * s_.heads * s_.v_head_dim) * dtype_size(s_.dtype), 0xA5);
  }
  std::vector<float> lse_buffer() const { return std::vector<float>(static_cast<std::size_t>(q_rows_ * s_.heads), -7.0f); }

  // Query row i of sequence b as the call lays it out (positions first): its first element in Q / O, its LSE.
  std::int64_t query_row(std::int64_t b, std::int64_t i) const { return s_.ragged_q ? cu_q_[b] + i : b * max_q_ + i; }

  // Sequence b alone: a dense problem (batch 1, positions first) and its inputs gathered from the batch.
  struct Dense {
    AttentionProblem problem;
    std::vector<std::uint8_t> q, k, v;
  };
  Dense dense(std::int64_t b) const {
    Dense d;
    const std::int64_t nq = s_.q_lens[b], nk = s_.k_lens[b];
    AttentionProblem& p = d.problem;
    p = AttentionProblem::positions_first(1, s_.heads, s_.kv_heads, nq, nk, s_.head_dim, s_.dtype);
    p.v_head_dim = s_.v_head_dim;
    p.v = Layout::positions_first(s_.kv_heads, nk, s_.v_head_dim);
    p.o = Layout::positions_first(s_.heads, nq, s_.v_head_dim);
    p.k_storage = p.v_storage = {s_.kv_type, s_.kv_quant};
    copy_common_options(p);
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(s_.dtype)), bits = value_bits(s_);
    d.q.resize(static_cast<std::size_t>(std::max<std::int64_t>(nq, 1) * s_.heads * s_.head_dim * es));
    std::memcpy(d.q.data(), &q_[static_cast<std::size_t>(query_row(b, 0) * s_.heads * s_.head_dim * es)],
                static_cast<std::size_t>(nq * s_.heads * s_.head_dim * es));
    d.k.resize(static_cast<std::size_t>((std::max<std::int64_t>(nk, 1) * s_.kv_heads * s_.head_dim * bits + 7) / 8));
    d.v.resize(static_cast<std::size_t>((std::max<std::int64_t>(nk, 1) * s_.kv_heads * s_.v_head_dim * bits + 7) / 8));
    for (std::int64_t j = 0; j < nk; ++j) {
      for (std::int64_t h = 0; h < s_.kv_heads; ++h) {
        copy_values(k_, key_element(p_.k, b, h, j), d.k, (j * s_.kv_heads + h) * s_.head_dim, s_.head_dim, bits);
        copy_values(v_, key_element(p_.v, b, h, j), d.v, (j * s_.kv_heads + h) * s_.v_head_dim, s_.v_head_dim, bits);
      }
    }
    return d;
  }
  AttentionArgs dense_args(Dense& d, std::vector<std::uint8_t>& o, std::vector<float>& lse) const {
    const std::int64_t nq = d.problem.q_len, nk = d.problem.k_len;
    o.assign(static_cast<std::size_t>(std::max<std::int64_t>(nq, 1) * s_.heads * s_.v_head_dim) * dtype_size(s_.dtype), 0);
    lse.assign(static_cast<std::size_t>(std::max<std::int64_t>(nq, 1) * s_.heads), 0.0f);
    AttentionArgs a;
    const std::int64_t kv = (s_.kv_type == KvType::Int4 ? 2 : 1);
    a.q = {d.q.data(), nq * s_.heads * s_.head_dim};
    a.k = {d.k.data(), static_cast<std::int64_t>(d.k.size()) * kv / static_cast<std::int64_t>(s_.kv_type == KvType::Float ? dtype_size(s_.dtype) : 1)};
    a.v = {d.v.data(), static_cast<std::int64_t>(d.v.size()) * kv / static_cast<std::int64_t>(s_.kv_type == KvType::Float ? dtype_size(s_.dtype) : 1)};
    (void)nk;
    a.o = {o.data(), nq * s_.heads * s_.v_head_dim};
    if (s_.lse) a.lse = {lse.data(), nq * s_.heads};
    if (s_.sink) a.head_sink = {sinks_.data(), s_.heads};
    if (s_.kv_quant != KvQuant::None) {
      a.k_scale = {k_scales_.data(), static_cast<std::int64_t>(k_scales_.size())};
      a.v_scale = {v_scales_.data(), static_cast<std::int64_t>(v_scales_.size())};
    }
    return a;
  }

 private:
  void copy_common_options(AttentionProblem& p) const {
    p.causal = s_.causal;
    p.window = s_.window;
    p.softcap = s_.softcap;
    p.has_head_sink = s_.sink;
    p.masked_rows = s_.masked_rows;
    p.return_lse = s_.lse;
    p.lse = Layout{0, 0, 1, s_.heads};  // [rows, heads] (positions first)
    p.lse.batch_stride = p.q_len * s_.heads;
  }

  void build_problem() {
    const std::int64_t H = s_.heads, Hkv = s_.kv_heads, D = s_.head_dim, Dv = s_.v_head_dim;
    p_ = AttentionProblem{};
    p_.batch = batch_;
    p_.heads = H;
    p_.kv_heads = Hkv;
    p_.q_len = max_q_;
    p_.k_len = max_k_;
    p_.head_dim = D;
    p_.v_head_dim = Dv;
    p_.dtype = s_.dtype;
    p_.k_storage = p_.v_storage = {s_.kv_type, s_.kv_quant};
    p_.work_budget = s_.work_budget;
    SequenceLayout& seq = p_.sequences;
    cu_q_.assign(1, 0);
    cu_k_.assign(1, 0);
    for (std::int64_t b = 0; b < batch_; ++b) {
      cu_q_.push_back(static_cast<std::int32_t>(cu_q_.back() + s_.q_lens[b]));
      cu_k_.push_back(static_cast<std::int32_t>(cu_k_.back() + s_.k_lens[b]));
    }
    q_rows_ = s_.ragged_q ? cu_q_.back() + 2 : batch_ * max_q_;  // (ragged: two spare rows past the last sequence)
    seq.ragged_q = s_.ragged_q;
    if (s_.ragged_q) seq.total_q = q_rows_;
    p_.q = Layout{0, s_.ragged_q ? 0 : max_q_ * H * D, D, H * D};
    p_.o = Layout{0, s_.ragged_q ? 0 : max_q_ * H * Dv, Dv, H * Dv};
    p_.return_lse = s_.lse;
    p_.lse = Layout{0, s_.ragged_q ? 0 : max_q_ * H, 1, H};
    p_.causal = s_.causal;
    p_.window = s_.window;
    p_.softcap = s_.softcap;
    p_.has_head_sink = s_.sink;
    p_.masked_rows = s_.masked_rows;
    if (s_.page_size > 0) {
      build_pages();
    } else if (s_.ragged_k) {
      seq.ragged_k = true;
      seq.total_k = cu_k_.back();
      p_.k = Layout{0, 0, D, Hkv * D};
      p_.v = Layout{0, 0, Dv, Hkv * Dv};
      k_values_ = std::max<std::int64_t>(seq.total_k, 1) * Hkv * D;
      v_values_ = std::max<std::int64_t>(seq.total_k, 1) * Hkv * Dv;
    } else {  // dense keys, padded to the longest, with key lengths
      p_.has_key_lengths = true;
      p_.k = Layout{0, max_k_ * Hkv * D, D, Hkv * D};
      p_.v = Layout{0, max_k_ * Hkv * Dv, Dv, Hkv * Dv};
      k_values_ = std::max<std::int64_t>(batch_ * max_k_, 1) * Hkv * D;
      v_values_ = std::max<std::int64_t>(batch_ * max_k_, 1) * Hkv * Dv;
    }
    for (std::int64_t b = 0; b < batch_; ++b) key_lengths_.push_back(static_cast<std::int32_t>(s_.k_lens[b]));
  }

  // Pages: every sequence's in a random order among spare pages, sequence 1's first page sequence 0's when shared.
  void build_pages() {
    const std::int64_t ps = s_.page_size, Hkv = s_.kv_heads, D = s_.head_dim, Dv = s_.v_head_dim;
    SequenceLayout& seq = p_.sequences;
    seq.page_size = ps;
    seq.max_pages_per_seq = std::max<std::int64_t>(1, (max_k_ + ps - 1) / ps + 1);  // one spare column
    std::int64_t needed = 0;
    for (std::int64_t k : s_.k_lens) needed += (k + ps - 1) / ps;
    seq.num_pages = needed + 3;
    std::vector<std::int32_t> order(static_cast<std::size_t>(seq.num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    table_.assign(static_cast<std::size_t>(batch_ * seq.max_pages_per_seq), -1);  // unread entries: out of range
    std::size_t next = 0;
    for (std::int64_t b = 0; b < batch_; ++b) {
      for (std::int64_t i = 0; i < (s_.k_lens[b] + ps - 1) / ps; ++i) {
        table_[static_cast<std::size_t>(b * seq.max_pages_per_seq + i)] = order[next++];
      }
    }
    if (s_.shared_prefix && batch_ > 1 && s_.k_lens[0] > 0 && s_.k_lens[1] > 0) table_[seq.max_pages_per_seq] = table_[0];
    p_.has_key_lengths = true;
    if (s_.heads_before_pages_rows) {
      p_.k = Layout{0, Hkv * ps * D, ps * D, D};
      p_.v = Layout{0, Hkv * ps * Dv, ps * Dv, Dv};
    } else {
      p_.k = Layout{0, ps * Hkv * D, D, Hkv * D};
      p_.v = Layout{0, ps * Hkv * Dv, Dv, Hkv * Dv};
    }
    k_values_ = seq.num_pages * ps * Hkv * D;
    v_values_ = seq.num_pages * ps * Hkv * Dv;
  }

  void fill_inputs() {
    std::normal_distribution<float> normal;
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(s_.dtype));
    q_.resize(static_cast<std::size_t>(std::max<std::int64_t>(q_rows_, 1) * s_.heads * s_.head_dim * es));
    for (std::int64_t i = 0; i < q_rows_ * s_.heads * s_.head_dim; ++i) store_from_float(q_.data(), s_.dtype, i, normal(rng_));
    k_ = random_kv(s_, k_values_, rng_);
    v_ = random_kv(s_, v_values_, rng_);
    for (std::int64_t h = 0; h < s_.heads; ++h) sinks_.push_back(normal(rng_));
    if (s_.kv_quant != KvQuant::None) {
      std::uniform_real_distribution<float> scale(0.01f, 0.05f);
      const std::int64_t nk = core::kv_scale_count(s_.kv_quant, s_.kv_heads, s_.head_dim);
      const std::int64_t nv = core::kv_scale_count(s_.kv_quant, s_.kv_heads, s_.v_head_dim);
      for (std::int64_t i = 0; i < nk; ++i) k_scales_.push_back(scale(rng_));
      for (std::int64_t i = 0; i < nv; ++i) v_scales_.push_back(scale(rng_));
    }
  }

  // The element of K or V (by `l`) where key j of sequence b, head h, starts.
  std::int64_t key_element(const Layout& l, std::int64_t b, std::int64_t h, std::int64_t j) const {
    if (s_.page_size > 0) {
      const std::int32_t page = table_[static_cast<std::size_t>(b * p_.sequences.max_pages_per_seq + j / s_.page_size)];
      return l.index(page, h, j % s_.page_size);
    }
    return s_.ragged_k ? l.index(0, h, cu_k_[b] + j) : l.index(b, h, j);
  }

  BatchSpec s_;
  std::mt19937 rng_;
  std::int64_t batch_ = 0, max_q_ = 0, max_k_ = 0, q_rows_ = 0, k_values_ = 0, v_values_ = 0;
  AttentionProblem p_;
  std::vector<std::int32_t> cu_q_, cu_k_, table_, key_lengths_;
  std::vector<std::uint8_t> q_, k_, v_;
  std::vector<float> sinks_, k_scales_, v_scales_;
};

inline std::string describe(const BatchSpec& s) {
  std::string t = std::string(dtype_name(s.dtype)) + " H=" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) +
                  " D=" + std::to_string(s.head_dim) + "/" + std::to_string(s.v_head_dim) + " q=";
  for (auto n : s.q_lens) t += std::to_string(n) + ",";
  t += " k=";
  for (auto n : s.k_lens) t += std::to_string(n) + ",";
  t += std::string(s.ragged_q ? " ragged_q" : "") + (s.ragged_k ? " ragged_k" : "") +
       (s.page_size > 0 ? " page=" + std::to_string(s.page_size) + (s.heads_before_pages_rows ? " HND" : " NHD") : "") +
       (s.shared_prefix ? " shared" : "") + (s.causal ? " causal" : "") + (s.window ? " window" : "") +
       (s.softcap ? " softcap" : "") + (s.sink ? " sink" : "") + (s.kv_type != KvType::Float ? " quantized" : "");
  return t;
}

// Runs `op` over the batch's buffers, `o` and `lse` its outputs (on the host: op.run(batch.args(o, lse))).
using BatchRunner = std::function<void(Attention& op, const Batch& batch, std::vector<std::uint8_t>& o,
                                       std::vector<float>& lse)>;
inline void run_on_host(Attention& op, const Batch& batch, std::vector<std::uint8_t>& o, std::vector<float>& lse) {
  op.run(batch.args(o, lse));
}

// Runs the batch with `config` (through `runner`) and checks every sequence's rows against its dense float64
// reference (and, on the Reference backend, the dense Reference backend's bits). Returns the call's output bytes.
inline std::vector<std::uint8_t> check_batch(const Batch& batch, const BatchSpec& s, const AttentionConfig& config,
                                      const BatchRunner& runner = run_on_host) {
  const Backend backend = config.backend;
  SCOPED_TRACE(describe(s) + " on " + backend_name(backend) + " " + config.plan.kernel);
  std::vector<std::uint8_t> o = batch.output_buffer();
  std::vector<float> lse = batch.lse_buffer();
  const std::vector<std::uint8_t> poison = o;
  Attention op(batch.problem(), config);
  runner(op, batch, o, lse);
  const std::size_t es = dtype_size(s.dtype);
  std::vector<bool> written(o.size() / es, false);
  // The LSE is float32, but the CUDA tensor-core kernels and the Vulkan matrix kernel sum probabilities rounded to
  // the element type (so that numerator and denominator agree), which moves it by about that type's rounding (the
  // contract's bound for float16 / bfloat16, docs/numerics.md); the other kernels hold the CPU's tighter bound.
  const bool rounded_p = backend == Backend::Cuda || (backend == Backend::Vulkan && config.plan.kernel == "coopmat");
  const double lse_bound = rounded_p && s.dtype != DType::f32 ? testing::tolerance(s.dtype) : testing::cpu_lse_tolerance(s.dtype);
  for (std::int64_t b = 0; b < batch.batch(); ++b) {
    Batch::Dense d = batch.dense(b);
    std::vector<std::uint8_t> dense_o;
    std::vector<float> dense_lse;
    const AttentionArgs da = batch.dense_args(d, dense_o, dense_lse);
    const AttentionProblem dp = core::normalize_and_check(d.problem);
    const cpu::ReferenceResult ref = cpu::reference_attention(dp, da);
    AttentionConfig rc;
    rc.backend = Backend::Reference;
    attention(d.problem, da, rc);
    double max_diff = 0.0, max_ref = 0.0;
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < s.q_lens[b]; ++i) {
        const std::int64_t row = (batch.query_row(b, i) * s.heads + h) * s.v_head_dim;
        for (std::int64_t c = 0; c < s.v_head_dim; ++c) {
          written[static_cast<std::size_t>(row + c)] = true;
          const double r = ref.out[static_cast<std::size_t>((h * s.q_lens[b] + i) * s.v_head_dim + c)];
          const double got = load_as_float(o.data(), s.dtype, row + c);
          if (std::isnan(r)) {
            EXPECT_TRUE(std::isnan(got)) << "sequence " << b << " head " << h << " row " << i;
            continue;
          }
          EXPECT_TRUE(std::isfinite(got)) << "sequence " << b << " head " << h << " row " << i;
          max_diff = std::max(max_diff, std::abs(got - r));
          max_ref = std::max(max_ref, std::abs(r));
          if (backend == Backend::Reference) {
            const std::int64_t dense_at = (i * s.heads + h) * s.v_head_dim + c;
            EXPECT_EQ(std::memcmp(&o[static_cast<std::size_t>(row + c) * es], &dense_o[static_cast<std::size_t>(dense_at) * es], es), 0)
                << "sequence " << b << ": the Reference backend's row differs from the dense call's";
          }
        }
        if (s.lse) {
          const double r = ref.lse[static_cast<std::size_t>(h * s.q_lens[b] + i)];
          const float got = lse[static_cast<std::size_t>(batch.query_row(b, i) * s.heads + h)];
          if (std::isnan(r)) EXPECT_TRUE(std::isnan(got));
          else if (std::isinf(r)) EXPECT_EQ(got, static_cast<float>(r));
          else EXPECT_LE(std::abs(got - r) / std::max(1.0, std::abs(r)), lse_bound) << "lse, sequence " << b;
        }
      }
    }
    const double err = max_ref > 0.0 ? max_diff / max_ref : max_diff;
    EXPECT_LE(err, testing::tolerance(s.dtype)) << "sequence " << b;
  }
  for (std::size_t e = 0; e < written.size(); ++e) {  // rows no sequence owns keep the caller's bytes
    if (!written[e]) EXPECT_EQ(std::memcmp(&o[e * es], &poison[e * es], es), 0) << "element " << e << " was written";
  }
  return o;
}

inline std::vector<std::uint8_t> check_batch(const Batch& batch, const BatchSpec& s, Backend backend, int threads = 0) {
  AttentionConfig config;
  config.backend = backend;
  config.threads = threads;
  return check_batch(batch, s, config);
}

// Whether every value of sequence b's output rows is NaN (masked rows), or keeps the poison bytes of
// batch.output_buffer() (rows never written): what an out-of-range device value leaves in its entry.
inline bool rows_are(const Batch& batch, const BatchSpec& s, const std::vector<std::uint8_t>& o, std::int64_t b,
                     bool nan) {
  const std::size_t es = dtype_size(s.dtype);
  const std::vector<std::uint8_t> poison = batch.output_buffer();
  for (std::int64_t i = 0; i < s.q_lens[b]; ++i) {
    for (std::int64_t e = 0; e < s.heads * s.v_head_dim; ++e) {
      const std::int64_t at = batch.query_row(b, i) * s.heads * s.v_head_dim + e;
      const auto byte = static_cast<std::size_t>(at) * es;
      const bool ok = nan ? std::isnan(load_as_float(o.data(), s.dtype, at)) : std::memcmp(&o[byte], &poison[byte], es) == 0;
      if (!ok) return false;
    }
  }
  return true;
}

inline std::vector<std::int64_t> random_lengths(std::mt19937& rng, std::int64_t n, std::int64_t longest) {
  std::vector<std::int64_t> lens;
  std::uniform_int_distribution<std::int64_t> any(0, longest);
  for (std::int64_t i = 0; i < n; ++i) lens.push_back(any(rng));
  // The edges: an empty sequence, a one-row one and the longest.
  if (n > 2) lens[0] = 0, lens[1] = 1, lens[2] = longest;
  return lens;
}

// The sizes of the ragged variants (ragged_variant) a backend's tests run.
struct RaggedSizes {
  std::int64_t head_dim;            // of variants 1, 2, 4 and 5 (variant 3: 40)
  std::int64_t first_head_dim;      // of variant 0
  std::int64_t narrow_v_head_dim;   // variant 4's V dim
  std::int64_t longest_q, longest_q_of_variant_5, longest_k;
};

// Ragged batch variant 0-5 of six sequences: 4 / 2 or 6 / 1 heads, one dim of 40 and one narrower V dim, causal or
// not, a window, a softcap, a head sink, zero masked rows; each draws its lengths from `rng`, with an empty
// sequence, a one-row one and the longest (queries with no keys, keys with no queries).
inline BatchSpec ragged_variant(std::mt19937& rng, DType t, int variant, const RaggedSizes& z) {
  BatchSpec s;
  s.dtype = t;
  s.heads = variant % 2 == 0 ? 4 : 6;
  s.kv_heads = variant % 2 == 0 ? 2 : 1;
  s.head_dim = variant == 3 ? 40 : variant == 0 ? z.first_head_dim : z.head_dim;
  s.v_head_dim = variant == 4 ? z.narrow_v_head_dim : s.head_dim;
  s.q_lens = random_lengths(rng, 6, variant == 5 ? z.longest_q_of_variant_5 : z.longest_q);
  s.k_lens = random_lengths(rng, 6, z.longest_k);
  std::swap(s.k_lens[0], s.k_lens[5]);
  s.causal = variant % 3 != 0;
  if (variant == 2) s.window = 17;
  if (variant == 1) s.softcap = 5.0f;
  s.sink = variant == 4;
  s.masked_rows = variant == 5 ? MaskedRows::Zero : MaskedRows::Nan;
  return s;
}

// The small batches of the bad-input tests (every backend's): three sequences, ragged or paged by 4 keys.
BatchSpec small_ragged() {
  BatchSpec s;
  s.q_lens = {3, 5, 2};
  s.k_lens = {4, 6, 9};
  s.causal = true;
  return s;
}
BatchSpec small_paged() {
  BatchSpec s = small_ragged();
  s.ragged_k = false;
  s.page_size = 4;
  return s;
}

// A copy of an int32 array the arguments point at, changed at one index.
void replace_array(ConstBuffer& buffer, std::vector<std::int32_t>& storage, std::size_t at, std::int32_t value) {
  const auto* from = static_cast<const std::int32_t*>(buffer.data);
  storage.assign(from, from + buffer.elements);
  storage[at] = value;
  buffer.data = storage.data();
}

// One host value of a valid ragged or paged batch made bad, and the argument the Error must name.
struct BadSequenceValue {
  std::string argument;
  BatchSpec spec;
  std::function<void(AttentionProblem&, AttentionArgs&, std::vector<std::int32_t>&)> change;
};

// Every backend that checks host values before it writes anything runs the same list (sequences_test.cpp on the
// CPU, vulkan_sequences_test.cpp on the Vulkan backend).
std::vector<BadSequenceValue> bad_sequence_values() {
  using S = std::vector<std::int32_t>;
  using P = AttentionProblem;
  using A = AttentionArgs;
  return {
      {"cu_seqlens_q[2]", small_ragged(), [](P&, A& a, S& st) { replace_array(a.cu_seqlens_q, st, 2, 2); }},  // < cu[1] = 3
      {"cu_seqlens_k[2]", small_ragged(), [](P&, A& a, S& st) { replace_array(a.cu_seqlens_k, st, 2, 3); }},  // < cu[1] = 4
      // (sequence 1 becomes 10 keys long, more than k_len 9)
      {"cu_seqlens_k[2]", small_ragged(), [](P&, A& a, S& st) { replace_array(a.cu_seqlens_k, st, 1, 0); }},
      {"cu_seqlens_q[0]", small_ragged(), [](P&, A& a, S& st) { replace_array(a.cu_seqlens_q, st, 0, -1); }},
      {"cu_seqlens_q[3]", small_ragged(), [](P& p, A&, S&) { p.sequences.total_q = 9; }},  // the last ends at row 10
      {"cu_seqlens_q", small_ragged(), [](P&, A& a, S&) { a.cu_seqlens_q.elements = 3; }},
      {"cu_seqlens_q", small_ragged(), [](P&, A& a, S&) { a.cu_seqlens_q.data = nullptr; }},
      {"cu_seqlens_k", small_ragged(), [](P&, A& a, S&) { a.cu_seqlens_k.data = nullptr; }},
      // (max_pages_per_seq is 4: entry 4 is sequence 1's first page; entries 1-3, past sequence 0's one page, are
      // never read and hold -1)
      {"block_table[4]", small_paged(),
       [](P& p, A& a, S& st) { replace_array(a.block_table, st, 4, static_cast<std::int32_t>(p.sequences.num_pages)); }},
      {"block_table[0]", small_paged(), [](P&, A& a, S& st) { replace_array(a.block_table, st, 0, -1); }},
      {"block_table", small_paged(), [](P&, A& a, S&) { a.block_table.elements -= 1; }},
      // (past k_len 9, and past the block table's pages)
      {"key_lengths[1]", small_paged(), [](P&, A& a, S& st) { replace_array(a.key_lengths, st, 1, 10); }},
      // (pages of no rows, num_pages and max_pages_per_seq still set)
      {"sequences.page_size", small_paged(), [](P& p, A&, S&) { p.sequences.page_size = 0; }},
      {"k", small_paged(), [](P&, A& a, S&) { a.k.elements -= 1; }},         // the pages' extent
      {"o", small_ragged(), [](P&, A& a, S&) { a.o.elements -= 1; }},        // total_q rows
  };
}

// Runs a bad value's arguments with `config`; expects an Error naming its argument, and O and the LSE untouched.
void expect_rejected(const BadSequenceValue& bad, const AttentionConfig& config) {
  SCOPED_TRACE(bad.argument);
  const Batch batch(bad.spec, 9);
  std::vector<std::uint8_t> o = batch.output_buffer();
  std::vector<float> lse = batch.lse_buffer();
  const auto o_before = o;
  const auto lse_before = lse;
  AttentionProblem p = batch.problem();
  AttentionArgs a = batch.args(o, lse);
  std::vector<std::int32_t> storage;
  bad.change(p, a, storage);
  try {
    attention(p, a, config);
    ADD_FAILURE() << "accepted; expected an Error naming " << bad.argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), bad.argument) << e.what();
  }
  EXPECT_EQ(o, o_before) << "O was written before the error";
  EXPECT_EQ(lse, lse_before) << "the LSE was written before the error";
}

}  // namespace
}  // namespace attnkit
