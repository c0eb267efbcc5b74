// The CPU kernel's item for few query rows (at most kMaxFewRows: a decode step, one query per head of a K/V group,
// or cross-attention of one token). With rows across SIMD lanes (tiled_kernel.cpp) most lanes would idle, so
// this item runs the other way round:
// - scores: dot products along the head dim, four keys at a time, their four sums reduced together;
// - softmax: per row along the tile's keys (a vector of keys at a time: one exp per lane that is a key);
// - values: each key's V row loaded once for every row, summed into fresh registers per tile (blockwise sums)
//   and added to the running output after one rescale.
// float16 / bfloat16 K and V are widened in registers as they are read (no buffer round trip); int8 / int4 cache
// rows are dequantized per tile first. Sums along the head dim depend on the vector width: the bits may differ
// between SIMD targets, never between runs or thread counts. The state it leaves (max, sum, poison,
// accumulator) is the tiled item's, so the split-K merge and the finish are shared.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/few_rows_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "../core/online_softmax.hpp"
#include "../core/visibility.hpp"
#include "few_rows_bf16.hpp"
#include "row_prefetch.hpp"
#include "tiled_kernel.hpp"
#include "softmax_exp-inl.h"
#include "tiled_workspace.hpp"
#include "widen-inl.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace {

constexpr int kKeysPerGroup = 4;     // keys whose dot products are reduced together
// Vectors of output dims per pass over a tile's V rows: rows x kChunk accumulators and kChunk V vectors stay in
// registers (32 of them with AVX-512, 16 with AVX2 / SSE4).
#if HWY_TARGET <= HWY_AVX3
constexpr int kChunk = 4;
#else
constexpr int kChunk = 2;
#endif

// A vector of elements at `p` (float32, float16 or bfloat16), as float32.
template <class T>
HWY_INLINE VF load_float(const T* HWY_RESTRICT p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

// The first n (0 < n < a vector's lanes) elements at p as float32, zeros in the other lanes, reading nothing past
// p[n - 1]: a head dim's last partial vector (40 = 2 x 16 + 8 with AVX-512). Element by element, those dims made
// the few-rows item 2.2x slower at head dim 40 than at 48 (bench/results/cpu-2026-12-07-zen4-random-calls.md).
// Masked loads where the target's cannot fault, else a copy into a zeroed vector.
template <class T>
HWY_INLINE VF load_float_first(const T* HWY_RESTRICT p, std::int64_t n) {
#if !HWY_MEM_OPS_MIGHT_FAULT
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::MaskedLoad(hn::FirstN(df, static_cast<std::size_t>(n)), df, p);
  } else {
    const hn::Rebind<std::uint16_t, DF> du;
    const auto bits = hn::MaskedLoad(hn::FirstN(du, static_cast<std::size_t>(n)), du,
                                     reinterpret_cast<const std::uint16_t*>(p));
    return hn::PromoteTo(df, hn::BitCast(hn::Rebind<T, DF>(), bits));
  }
#else
  T padded[HWY_MAX_BYTES / sizeof(float)] = {};
  std::memcpy(padded, p, static_cast<std::size_t>(n) * sizeof(T));
  return load_float(padded);
#endif
}

// Stores the first n (0 < n < lanes) lanes of v at p, writing nothing past p[n - 1].
HWY_INLINE void store_first(VF v, float* HWY_RESTRICT p, std::int64_t n) {
  const DF df;
#if !HWY_MEM_OPS_MIGHT_FAULT
  hn::BlendedStore(v, hn::FirstN(df, static_cast<std::size_t>(n)), df, p);
#else
  float padded[HWY_MAX_BYTES / sizeof(float)];
  hn::StoreU(v, df, padded);
  std::memcpy(p, padded, static_cast<std::size_t>(n) * sizeof(float));
#endif
}

// The sum of each of four vectors' lanes, in lanes 0..3 of a 128-bit vector: pairs of lanes, then pairs of
// pairs within each 128-bit block, then the blocks (one fixed order for a given vector width).
#if HWY_TARGET != HWY_SCALAR
template <class D, class V>
HWY_INLINE auto sum_blocks_to_128(D d, V v) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return sum_blocks_to_128(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}

template <class D, class V>
HWY_INLINE auto sums_of_four(D d, V a, V b, V c, V e) {
  const hn::Repartition<double, D> dd;
  const V ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const V ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  const V abce = hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, hn::BitCast(dd, ab), hn::BitCast(dd, ce))),
                         hn::BitCast(d, hn::InterleaveUpper(dd, hn::BitCast(dd, ab), hn::BitCast(dd, ce))));
  return sum_blocks_to_128(d, abce);
}
#endif

// s[r * kKeyTile + j] = q_r · K[j] for R rows and n keys; K[j] at k[j].
// The rows of pf are asked for along the way.
template <int R, class T>
HWY_INLINE void score_tile(const float* HWY_RESTRICT q, std::int64_t dim, const T* const* k, std::int64_t n,
                           const RowPrefetch& pf, float* HWY_RESTRICT s) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t full = dim / L * L;
  std::int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) >= 4) {
    for (; j + kKeysPerGroup <= n; j += kKeysPerGroup) {
      prefetch_keys(pf, j, j + kKeysPerGroup);
      VF acc[R][kKeysPerGroup];
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < kKeysPerGroup; ++g) acc[r][g] = hn::Zero(df);
      for (std::int64_t d = 0; d < full; d += L) {
        VF kv[kKeysPerGroup];
        for (int g = 0; g < kKeysPerGroup; ++g) kv[g] = load_float(k[j + g] + d);
        for (int r = 0; r < R; ++r) {
          const VF qv = hn::LoadU(df, q + r * dim + d);
          for (int g = 0; g < kKeysPerGroup; ++g) acc[r][g] = hn::MulAdd(qv, kv[g], acc[r][g]);
        }
      }
      if (full < dim) {  // the last partial vector, zeros past the dim
        VF kv[kKeysPerGroup];
        for (int g = 0; g < kKeysPerGroup; ++g) kv[g] = load_float_first(k[j + g] + full, dim - full);
        for (int r = 0; r < R; ++r) {
          const VF qv = load_float_first(q + r * dim + full, dim - full);
          for (int g = 0; g < kKeysPerGroup; ++g) acc[r][g] = hn::MulAdd(qv, kv[g], acc[r][g]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const auto sums = sums_of_four(df, acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        hn::StoreU(sums, hn::Full128<float>(), s + r * kKeyTile + j);
      }
    }
  }
#endif
  prefetch_rest(pf, j);
  for (; j < n; ++j) {
    VF acc[R];
    for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
    for (std::int64_t d = 0; d < full; d += L) {
      const VF kv = load_float(k[j] + d);
      for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * dim + d), kv, acc[r]);
    }
    if (full < dim) {
      const VF kv = load_float_first(k[j] + full, dim - full);
      for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(load_float_first(q + r * dim + full, dim - full), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) s[r * kKeyTile + j] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
  }
}

// One pass over a tile's V rows for C vectors of output dims from d0: o_r[d] = o_r[d] · alpha[r] + Σ_j p[r][j] ·
// V[j][d] for R rows, with rows r's output at o + r * dv. The R x C sums stay in registers over the tile's n
// keys (blockwise sums) and meet the running output once. kSkipZeros: a zero weight skips the key (0 · inf would be
// NaN for a key this row cannot see); a tile none of whose weights is zero needs no test.
template <int R, int C, bool kSkipZeros, class T>
HWY_INLINE void value_vectors(const float* HWY_RESTRICT p, std::int64_t n, const T* const* v, std::int64_t d0,
                              std::int64_t dv, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o) {
  const DF df;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  for (std::int64_t j = 0; j < n; ++j) {
    const T* row = v[j] + d0;
    VF vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load_float(row + c * L);
    for (int r = 0; r < R; ++r) {
      const float w = p[r * kKeyTile + j];
      if constexpr (kSkipZeros) {
        if (w == 0.0f) continue;
      }
      const VF wv = hn::Set(df, w);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(wv, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = o + r * dv + d0;
    const VF a = hn::Set(df, alpha[r]);
    for (int c = 0; c < C; ++c) hn::StoreU(hn::MulAdd(hn::LoadU(df, out + c * L), a, acc[r][c]), df, out + c * L);
  }
}

// The output dims [d0, dv) past the last whole vector (fewer than a vector's lanes), as value_vectors with one
// partial vector.
template <int R, bool kSkipZeros, class T>
HWY_INLINE void value_last_vector(const float* HWY_RESTRICT p, std::int64_t n, const T* const* v, std::int64_t d0,
                                  std::int64_t dv, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT o) {
  const DF df;
  const std::int64_t m = dv - d0;
  VF acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  for (std::int64_t j = 0; j < n; ++j) {
    const VF vv = load_float_first(v[j] + d0, m);
    for (int r = 0; r < R; ++r) {
      const float w = p[r * kKeyTile + j];
      if constexpr (kSkipZeros) {
        if (w == 0.0f) continue;
      }
      acc[r] = hn::MulAdd(hn::Set(df, w), vv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = o + r * dv + d0;
    store_first(hn::MulAdd(load_float_first(out, m), hn::Set(df, alpha[r]), acc[r]), out, m);
  }
}

template <int R, int C, class T>
HWY_INLINE void value_vectors_for(bool zero_weights, const float* p, std::int64_t n, const T* const* v,
                                  std::int64_t d0, std::int64_t dv, const float* alpha, float* o) {
  if (zero_weights) {
    value_vectors<R, C, true>(p, n, v, d0, dv, alpha, o);
  } else {
    value_vectors<R, C, false>(p, n, v, d0, dv, alpha, o);
  }
}

// o_r = o_r · alpha[r] + Σ_j p[r][j] · V[j] for R rows, n keys, dv dims, V[j] at v[j], row r's output at
// o + r * dv: kChunk vectors of dims per pass over the tile, then the last vectors and dims.
template <int R, class T>
HWY_INLINE void value_tile(const float* HWY_RESTRICT p, std::int64_t n, const T* const* v, std::int64_t dv,
                           const float* HWY_RESTRICT alpha, bool zero_weights, float* HWY_RESTRICT o) {
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(DF()));
  std::int64_t d0 = 0;
  for (; d0 + kChunk * L <= dv; d0 += kChunk * L) value_vectors_for<R, kChunk>(zero_weights, p, n, v, d0, dv, alpha, o);
  switch ((dv - d0) / L) {
    case 0: break;
    case 1: value_vectors_for<R, 1>(zero_weights, p, n, v, d0, dv, alpha, o); break;
    case 2: value_vectors_for<R, 2>(zero_weights, p, n, v, d0, dv, alpha, o); break;
    default: value_vectors_for<R, 3>(zero_weights, p, n, v, d0, dv, alpha, o); break;
  }
  d0 += (dv - d0) / L * L;
  if (d0 < dv) {
    if (zero_weights) {
      value_last_vector<R, true>(p, n, v, d0, dv, alpha, o);
    } else {
      value_last_vector<R, false>(p, n, v, d0, dv, alpha, o);
    }
  }
}

// The rows of one item: where each query lives, which keys of the item's range it sees.
struct RowsSetup {
  std::int64_t head[kMaxFewRows];
  std::int64_t query[kMaxFewRows];
  std::int64_t begin[kMaxFewRows];
  std::int64_t end[kMaxFewRows];
  std::int64_t union_begin;
  std::int64_t union_end;
};

RowsSetup set_up_rows(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const core::VisibilityRule& rule = job.seq.rule;
  const std::int64_t key_length = job.seq.key_length;
  RowsSetup rs{};
  rs.union_begin = job.key_end;
  rs.union_end = job.key_begin;
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::int64_t pair = job.first_row + r;
    const std::int64_t h = job.kvh * job.group + pair / job.seq.queries;
    const std::int64_t i = pair % job.seq.queries;
    rs.head[r] = h;
    rs.query[r] = i;
    const core::KeyRange range = rule.for_row(i, key_length);
    rs.begin[r] = std::max(range.begin, job.key_begin);
    rs.end[r] = std::max(rs.begin[r], std::min(range.end, job.key_end));
    if (rs.begin[r] < rs.end[r]) {
      rs.union_begin = std::min(rs.union_begin, rs.begin[r]);
      rs.union_end = std::max(rs.union_end, rs.end[r]);
    }
    const std::int64_t q_index = job.seqs->query_index(p.q, job.seq, job.b, h, i);
    widen_row(static_cast<const char*>(a.q.data) + q_index * static_cast<std::int64_t>(dtype_size(p.dtype)),
              p.dtype, p.head_dim, w.qrows + r * p.head_dim);
    w.max[r] = core::kNegInf;
    w.sum[r] = 0.0f;
    w.poison[r] = 0.0f;
    std::fill(w.orows + r * p.v_head_dim, w.orows + (r + 1) * p.v_head_dim, 0.0f);
  }
  return rs;
}

// The item's running output from its row-major buffer into the [dim][lane] layout the finish and the split-K merge
// read.
void move_output_to_lanes(const Workspace& w, std::int64_t rows, std::int64_t dv) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < dv; ++d) w.ot[d * kRowBlock + r] = w.orows[r * dv + d];
  }
}

// Scale, softcap, mask and visibility of row r's scores over keys [k0, k0 + n), then its online-softmax step:
// s becomes p = exp(s - max), the running max and sum move on, alpha[r] is the rescale of the running output.
// Returns whether any of the n weights is zero (a hidden key, or one whose exp underflowed).
bool softmax_row(const ItemJob& job, const RowsSetup& rs, int r, std::int64_t k0, std::int64_t n, float* s) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const DF df;
  const DI di;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const VF neg_inf = hn::Set(df, core::kNegInf);
  const VF pos_inf = hn::Set(df, std::numeric_limits<float>::infinity());
  const VF scale = hn::Set(df, *p.scale);
  const float softcap = p.softcap.value_or(0.0f);
  const VF cap = hn::Set(df, softcap);
  const float* mask =
      p.has_mask ? mask_values(p, a, p.mask.index(job.b, rs.head[r], rs.query[r]) + k0, n, w.mrow) : nullptr;
  if (mask != nullptr && n % L != 0) {  // whole vectors below: pad a copy (the row may end at the array's end)
    const std::int64_t padded = (n + L - 1) / L * L;
    if (mask != w.mrow) std::copy(mask, mask + n, w.mrow);
    std::fill(w.mrow + n, w.mrow + padded, 0.0f);
    mask = w.mrow;
  }
  const auto begin = hn::Set(di, static_cast<std::int32_t>(rs.begin[r] - k0));
  const auto end = hn::Set(di, static_cast<std::int32_t>(rs.end[r] - k0));
  const bool all_visible = rs.begin[r] <= k0 && rs.end[r] >= k0 + n;
  const VF one = hn::Set(df, 1.0f);
  VF vmax = neg_inf;
  VF poison = hn::Zero(df);
  for (std::int64_t j = 0; j < n; j += L) {
    const auto idx = hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(j)));
    const auto in_tile = hn::RebindMask(df, hn::Lt(idx, hn::Set(di, static_cast<std::int32_t>(n))));
    VF x = hn::Mul(hn::LoadU(df, s + j), scale);
    if (softcap > 0.0f) x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
    if (mask != nullptr) x = hn::Add(x, hn::LoadU(df, mask + j));
    auto seen = in_tile;
    if (!all_visible) seen = hn::And(seen, hn::RebindMask(df, hn::AndNot(hn::Lt(idx, begin), hn::Lt(idx, end))));
    x = hn::IfThenElse(seen, x, neg_inf);
    poison = hn::Or(poison, hn::IfThenZeroElse(hn::Lt(x, pos_inf), one));  // NaN or +inf among the visible scores
    vmax = hn::Max(vmax, x);
    hn::StoreU(x, df, s + j);
  }
  if (hn::GetLane(hn::MaxOfLanes(df, poison)) != 0.0f) w.poison[r] = 1.0f;
  const float old_max = w.max[r];
  const float new_max = std::max(old_max, hn::GetLane(hn::MaxOfLanes(df, vmax)));
  const float use_max = core::usable_max(new_max);
  const float alpha = core::rescale_factor(old_max, new_max);
  const VF m = hn::Set(df, use_max);
  VF vsum = hn::Zero(df);
  auto zeros = hn::FirstN(df, 0);
  for (std::int64_t j = 0; j < n; j += L) {
    const VF x = hn::Sub(hn::LoadU(df, s + j), m);
    const VF e = exp_of_nonpositive(df, x);
    vsum = hn::Add(vsum, e);
    const auto in_tile = hn::RebindMask(df, hn::Lt(hn::Add(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(j))),
                                                  hn::Set(di, static_cast<std::int32_t>(n))));
    zeros = hn::Or(zeros, hn::And(in_tile, hn::Eq(e, hn::Zero(df))));
    hn::StoreU(e, df, s + j);
  }
  w.max[r] = new_max;
  w.sum[r] = std::fma(w.sum[r], alpha, hn::GetLane(hn::SumOfLanes(df, vsum)));
  w.alpha[r] = alpha;
  return !hn::AllFalse(df, zeros);
}

// Whether the few-rows items copy each tile's K/V rows into the workspace: a quantized cache (dequantized). Float
// rows are read in place through a pointer per key (a tile may span pages), in the dense call's order.
bool gathers_kv_rows(const AttentionProblem& p) {
  return p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float;
}



// The tile steps of one item: its rows' online softmax over key tiles [t0, t0 + kKeyTile), one tile per step().
template <int R, class T>
class TileSteps {
 public:
  TileSteps(const ItemJob& job, const RowsSetup& rs)
      : job_(job), rs_(rs), p_(*job.problem), a_(*job.args), w_(*job.ws), gathered_(gathers_kv_rows(p_)),
        k_scales_(kv_head_scales(a_.k_scale, p_.k_storage, job.kvh, p_.head_dim)),
        v_scales_(kv_head_scales(a_.v_scale, p_.v_storage, job.kvh, p_.v_head_dim)),
        // bfloat16 scores by vdpbf16ps where the CPU has it, from the query rows as given (what qrows holds widened).
        bf16_dot_(std::is_same_v<T, hwy::bfloat16_t> && cpu_kernel_features().avx512_bf16) {
    if (bf16_dot_) {
      for (int r = 0; r < R; ++r) {
        q_bf16_[r] = static_cast<const std::uint16_t*>(a_.q.data) +
                     job.seqs->query_index(p_.q, job.seq, job.b, rs.head[r], rs.query[r]);
      }
    }
  }
  // The first tile of the item's keys (its end, when it sees none).
  std::int64_t first_tile() const {
    return rs_.union_begin < rs_.union_end ? rs_.union_begin / kKeyTile * kKeyTile : rs_.union_end;
  }
  std::int64_t end() const { return rs_.union_end; }

  // One tile's K/V rows (in place, or copied into the workspace) and what its scores ask the caches for.
  struct TileRows {
    std::int64_t k0 = 0;
    std::int64_t n = 0;
    const T* krows[kKeyTile];
    const T* vrows[kKeyTile];
    const T* next_krows[kKeyTile];
    const T* next_vrows[kKeyTile];
    RowPrefetch pf;
  };

  void step(std::int64_t t0) const {
    TileRows t;
    begin_tile(t0, t);
    score_keys(t, 0, t.n, t.pf);
    finish_tile(t);
  }

  // Whether the tile's parts may interleave with other heads' (rows read in place: nothing in the shared workspace).
  bool reads_in_place() const { return !gathered_; }
  bool interleaves_scores() const { return job_.interleaved_scores; }

  void begin_tile(std::int64_t t0, TileRows& t) const {
    const std::int64_t dim = p_.head_dim, dv = p_.v_head_dim;
    t.k0 = std::max(t0, rs_.union_begin);
    t.n = std::min(t0 + kKeyTile, rs_.union_end) - t.k0;
    const core::SequenceAccess& seqs = *job_.seqs;
    if constexpr (std::is_same_v<T, float>) {
      if (gathered_) {
        for (std::int64_t j = 0; j < t.n; ++j) {
          widen_kv_row(a_.k.data, seqs.key_index(p_.k, job_.seq, job_.b, job_.kvh, t.k0 + j), p_.k_storage,
                       p_.dtype, dim, k_scales_, w_.kbuf + j * dim);
          widen_kv_row(a_.v.data, seqs.key_index(p_.v, job_.seq, job_.b, job_.kvh, t.k0 + j), p_.v_storage,
                       p_.dtype, dv, v_scales_, w_.vbuf + j * dv);
          t.krows[j] = w_.kbuf + j * dim;
          t.vrows[j] = w_.vbuf + j * dv;
        }
      }
    }
    if (!gathered_) {
      in_place_rows(t.k0, t.n, t.krows, t.vrows);
      if (job_.prefetch_v) pf_list(t.pf, 0, t.vrows, t.n, dv);
      const std::int64_t next_n = std::min(t0 + 2 * kKeyTile, rs_.union_end) - (t0 + kKeyTile);
      if (job_.prefetch_ahead && next_n > 0) {
        in_place_rows(t0 + kKeyTile, next_n, t.next_krows, t.next_vrows);
        pf_list(t.pf, 1, t.next_krows, next_n, dim);
      }
    }
  }

  // The scores of the tile's keys [j, j + count), asking for pf's rows along the way: rows in halves of at most
  // kFewRows (the micro-kernels' registers), the second half's K rows from the caches.
  void score_keys(const TileRows& t, std::int64_t j, std::int64_t count, const RowPrefetch& pf) const {
    score_half<kFirstHalf>(0, t, j, count, pf);
    if constexpr (R > kFewRows) score_half<R - kFewRows>(kFewRows, t, j, count, RowPrefetch{});
  }

  // The tile's softmax and P V, after its scores (P V in the same halves of rows).
  void finish_tile(const TileRows& t) const {
    bool zero_weights = false;
    for (int r = 0; r < R; ++r) zero_weights |= softmax_row(job_, rs_, r, t.k0, t.n, w_.st + r * kKeyTile);
    const std::int64_t dv = p_.v_head_dim;
    value_tile<kFirstHalf>(w_.st, t.n, t.vrows, dv, w_.alpha, zero_weights, w_.orows);
    if constexpr (R > kFewRows) {
      value_tile<R - kFewRows>(w_.st + kFewRows * kKeyTile, t.n, t.vrows, dv, w_.alpha + kFewRows, zero_weights,
                               w_.orows + kFewRows * dv);
    }
  }

 private:
  // Pointers to the K and V rows of keys [k0, k0 + n) in place, in runs of keys one row stride apart (one run
  // unless a page ends in the tile).
  void in_place_rows(std::int64_t k0, std::int64_t n, const T** krows, const T** vrows) const {
    const core::SequenceAccess& seqs = *job_.seqs;
    const T* k = static_cast<const T*>(a_.k.data);
    const T* v = static_cast<const T*>(a_.v.data);
    for (std::int64_t j0 = 0; j0 < n;) {
      const std::int64_t len = std::min(n - j0, seqs.keys_in_run(k0 + j0));
      const T* k_run = k + seqs.key_index(p_.k, job_.seq, job_.b, job_.kvh, k0 + j0);
      const T* v_run = v + seqs.key_index(p_.v, job_.seq, job_.b, job_.kvh, k0 + j0);
      for (std::int64_t i = 0; i < len; ++i) {
        krows[j0 + i] = k_run + i * p_.k.row_stride;
        vrows[j0 + i] = v_run + i * p_.v.row_stride;
      }
      j0 += len;
    }
  }
  static void pf_list(RowPrefetch& pf, int list, const T* const* rows, std::int64_t n, std::int64_t width) {
    pf.rows[list] = reinterpret_cast<const void* const*>(rows);
    pf.n[list] = n;
    pf.bytes[list] = width * static_cast<std::int64_t>(sizeof(T));
  }

  static constexpr int kFirstHalf = R < kFewRows ? R : kFewRows;

  // Scores of H rows from row r0.
  template <int H>
  void score_half(int r0, const TileRows& t, std::int64_t j, std::int64_t count, const RowPrefetch& pf) const {
    float* s = w_.st + r0 * kKeyTile + j;
    if (bf16_dot_) {
      score_tile_bf16_dpbf16(q_bf16_ + r0, H, p_.head_dim, reinterpret_cast<const std::uint16_t* const*>(t.krows + j),
                             count, pf, s, kKeyTile);
    } else {
      score_tile<H>(w_.qrows + r0 * p_.head_dim, p_.head_dim, t.krows + j, count, pf, s);
    }
  }

  const ItemJob& job_;
  const RowsSetup& rs_;
  const AttentionProblem& p_;
  const AttentionArgs& a_;
  const Workspace& w_;
  const bool gathered_;  // K/V rows copied (widened, dequantized) into the workspace per tile
  const float* k_scales_;
  const float* v_scales_;
  const bool bf16_dot_;
  const std::uint16_t* q_bf16_[kMaxFewRows] = {};
};

template <int R, class T>
void run_rows(const ItemJob& job, const RowsSetup& rs) {
  const TileSteps<R, T> steps(job, rs);
  for (std::int64_t t0 = steps.first_tile(); t0 < steps.end(); t0 += kKeyTile) steps.step(t0);
}

// One tile of a wide item's heads, rows read in place (TiledPlan::interleaved_scores): the scores of every head a
// group of keys at a time, so that a key's K row is read across its heads at once (interleaved heads' rows are
// contiguous: in address order), then each head's softmax and P V. A head's keys fall in the same groups as in a
// step of its own: the same bits.
template <int R, class T>
void interleaved_tile(const std::optional<TileSteps<R, T>>* steps, const int* active, int count, std::int64_t t0) {
  typename TileSteps<R, T>::TileRows tiles[kMaxKvHeadsPerItem];
  std::int64_t longest = 0;
  for (int i = 0; i < count; ++i) {
    steps[active[i]]->begin_tile(t0, tiles[i]);
    longest = std::max(longest, tiles[i].n);
  }
  const RowPrefetch none;
  for (std::int64_t j = 0; j < longest; j += kKeysPerGroup) {
    for (int i = 0; i < count; ++i) {
      const std::int64_t keys = std::min<std::int64_t>(kKeysPerGroup, tiles[i].n - j);
      if (keys <= 0) continue;
      prefetch_keys(tiles[i].pf, j, j + keys);
      steps[active[i]]->score_keys(tiles[i], j, keys, none);
    }
  }
  for (int i = 0; i < count; ++i) {
    prefetch_rest(tiles[i].pf, tiles[i].n);
    steps[active[i]]->finish_tile(tiles[i]);
  }
}

// An item over several K/V heads of one batch entry (the plan's kv_heads_per_item): the heads take turns tile by
// tile, so that rows of interleaved heads (a positions-first cache, NHD pages) are read whole, once. Each head's
// rows go through exactly the steps of an item of its own: the same bits.
template <int R, class T>
void run_rows_wide(const ItemJob* jobs, const RowsSetup* rs, int heads) {
  std::optional<TileSteps<R, T>> steps[kMaxKvHeadsPerItem];
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
  for (int h = 0; h < heads; ++h) {
    steps[h].emplace(jobs[h], rs[h]);
    if (steps[h]->first_tile() < steps[h]->end()) {
      first = std::min(first, steps[h]->first_tile());
      last = std::max(last, steps[h]->end());
    }
  }
  for (std::int64_t t0 = first; t0 < last; t0 += kKeyTile) {
    int active[kMaxKvHeadsPerItem];
    int count = 0;
    bool in_place = steps[0]->interleaves_scores();
    for (int h = 0; h < heads; ++h) {
      if (t0 >= steps[h]->first_tile() && t0 < steps[h]->end()) {
        active[count++] = h;
        in_place = in_place && steps[h]->reads_in_place();
      }
    }
    if (in_place) {
      interleaved_tile<R, T>(steps, active, count, t0);
    } else {  // (rows copied into the one workspace buffer: each head's whole step in turn)
      for (int i = 0; i < count; ++i) steps[active[i]]->step(t0);
    }
  }
}

template <class T>
void run_typed(const ItemJob& job, const RowsSetup& rs) {
  switch (job.rows) {
    case 1: run_rows<1, T>(job, rs); break;
    case 2: run_rows<2, T>(job, rs); break;
    case 3: run_rows<3, T>(job, rs); break;
    case 4: run_rows<4, T>(job, rs); break;
    case 5: run_rows<5, T>(job, rs); break;
    case 6: run_rows<6, T>(job, rs); break;
    case 7: run_rows<7, T>(job, rs); break;
    default: run_rows<8, T>(job, rs); break;
  }
}

}  // namespace

void run_few_rows_item(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const RowsSetup rs = set_up_rows(job);
  if (gathers_kv_rows(p) || p.dtype == DType::f32) {
    run_typed<float>(job, rs);
  } else if (p.dtype == DType::f16) {
    run_typed<hwy::float16_t>(job, rs);
  } else {
    run_typed<hwy::bfloat16_t>(job, rs);
  }
  if (job.partial != nullptr) {  // split-K: keep the unnormalised state for the merge pass
    save_partial(*job.ws, job.rows, p.v_head_dim, job.partial);
  } else {
    move_output_to_lanes(*job.ws, job.rows, p.v_head_dim);
    finish_rows_dispatched(job);
  }
}

// The workspace of head h of a wide item: its own lanes of the running state and its own query rows.
Workspace head_view(const Workspace& w, int h, std::int64_t head_dim, std::int64_t v_head_dim) {
  Workspace v = w;
  const std::int64_t lane = static_cast<std::int64_t>(h) * kFewRows;
  v.qrows = w.qrows + lane * head_dim;
  v.max = w.max + lane;
  v.sum = w.sum + lane;
  v.poison = w.poison + lane;
  v.alpha = w.alpha + lane;
  v.st = w.st + lane * kKeyTile;  // (its rows' scores: the heads' scores of a tile are all held at once)
  v.ot = w.ot + lane;  // (element d * kRowBlock + r of the view: lane `lane + r` of column d)
  v.orows = w.orows + lane * v_head_dim;
  return v;
}

template <int R, class T>
void run_wide_typed(const ItemJob* jobs, const RowsSetup* rs, int heads) {
  run_rows_wide<R, T>(jobs, rs, heads);
}
template <class T>
void run_wide_rows(const ItemJob* jobs, const RowsSetup* rs, int heads) {
  switch (jobs[0].rows) {
    case 1: run_wide_typed<1, T>(jobs, rs, heads); break;
    case 2: run_wide_typed<2, T>(jobs, rs, heads); break;
    case 3: run_wide_typed<3, T>(jobs, rs, heads); break;
    default: run_wide_typed<4, T>(jobs, rs, heads); break;
  }
}

void run_few_rows_wide_item(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const int heads = static_cast<int>(job.kv_span);
  ItemJob jobs[kMaxKvHeadsPerItem];
  Workspace views[kMaxKvHeadsPerItem];
  RowsSetup rs[kMaxKvHeadsPerItem];
  for (int h = 0; h < heads; ++h) {
    views[h] = head_view(*job.ws, h, p.head_dim, p.v_head_dim);
    jobs[h] = job;
    jobs[h].kvh = job.kvh + h;
    jobs[h].kv_span = 1;
    jobs[h].ws = &views[h];
    if (job.partial != nullptr) jobs[h].partial = job.partial + h * job.partial_head_stride;
    rs[h] = set_up_rows(jobs[h]);
  }
  if (gathers_kv_rows(p) || p.dtype == DType::f32) {
    run_wide_rows<float>(jobs, rs, heads);
  } else if (p.dtype == DType::f16) {
    run_wide_rows<hwy::float16_t>(jobs, rs, heads);
  } else {
    run_wide_rows<hwy::bfloat16_t>(jobs, rs, heads);
  }
  for (int h = 0; h < heads; ++h) {
    if (jobs[h].partial != nullptr) {  // split-K: each head's unnormalised state into its own slot
      save_partial(views[h], jobs[h].rows, p.v_head_dim, jobs[h].partial);
    } else {
      move_output_to_lanes(views[h], jobs[h].rows, p.v_head_dim);
      finish_rows_dispatched(jobs[h]);
    }
  }
}

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnkit::cpu {

HWY_EXPORT(run_few_rows_item);
HWY_EXPORT(run_few_rows_wide_item);

void run_few_rows_dispatched(const ItemJob& job) { HWY_DYNAMIC_DISPATCH(run_few_rows_item)(job); }
void run_few_rows_wide_dispatched(const ItemJob& job) { HWY_DYNAMIC_DISPATCH(run_few_rows_wide_item)(job); }

}  // namespace attnkit::cpu
#endif
