// The tiled kernel's operand staging around its AMX products (amx_tiles.hpp has the layouts): Q rows into pairs,
// a key tile's K rows and V transposed in key pairs, and P as bfloat16 terms. Included once per Highway
// target by tiled_kernel.cpp (the per-target include guard below).
//
// Key tiles are absolute (keys [t * kKeyTile, (t + 1) * kKeyTile) of the entry, cut at its key length and the
// item's key range): every row block of a K/V head stages the same tiles, so a thread may keep a head's staged
// tiles for the row blocks it runs of that head (TiledPlan::widened_keys with TiledPlan::amx), and the products
// of a key do not depend on where a row block's visible keys begin.
#if defined(ATTNKIT_CPU_AMX_STAGING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNKIT_CPU_AMX_STAGING_INL_H_
#undef ATTNKIT_CPU_AMX_STAGING_INL_H_
#else
#define ATTNKIT_CPU_AMX_STAGING_INL_H_
#endif

#include <hwy/highway.h>

#include "amx_tiles.hpp"
#include "row_prefetch.hpp"
#include "tiled_workspace.hpp"
#include "widen-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline std::int64_t round_up(std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; }
// Tiles of a problem's key range (TiledPlan::widened_keys / kKeyTile where that is not 0).
inline std::int64_t ceil_div_tiles(std::int64_t keys) {
  return round_up(std::max<std::int64_t>(keys, 1), kKeyTile) / kKeyTile;
}

// Makes the thread's head copy (Workspace::widened_*, staged_*) the job's K/V head's: a copy of another head is
// dropped (no tile of it ready).
inline void hold_head_copy(const ItemJob& job) {
  const Workspace& w = *job.ws;
  if (w.widened_for[0] == job.b && w.widened_for[1] == job.kvh) return;
  std::fill(w.widened_ready, w.widened_ready + ceil_div_tiles(job.problem->k_len), std::uint8_t{0});
  w.widened_for[0] = job.b;
  w.widened_for[1] = job.kvh;
}

// A float16 row's two bfloat16 terms (amx_tiles.hpp): hi = its top 8 significant bits, lo = the rest, exact.
// `scratch` holds n floats.
inline void split_float16_row(const std::uint16_t* row, std::int64_t n, float* scratch, std::uint16_t* hi,
                              std::uint16_t* lo) {
  widen_row(row, DType::f16, n, scratch);
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  const auto top = hn::Set(di, static_cast<std::int32_t>(0xFFFF0000u));
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {  // (the shifted bits fit 16 bits: the saturating demotion keeps them)
    const auto x = hn::LoadU(df, scratch + i);
    const auto hi_bits = hn::And(hn::BitCast(di, x), top);
    const auto rest = hn::Sub(x, hn::BitCast(df, hi_bits));
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<decltype(df)>(), hi_bits)))), d16, hi + i);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<decltype(df)>(), rest)))), d16, lo + i);
  }
  for (; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, scratch + i, sizeof(bits));
    const std::uint32_t hi_bits = bits & 0xFFFF0000u;
    float hi_value;
    std::memcpy(&hi_value, &hi_bits, sizeof(hi_value));
    const float rest = scratch[i] - hi_value;  // (inf - inf: NaN, a bad value either way)
    std::uint32_t rest_bits;
    std::memcpy(&rest_bits, &rest, sizeof(rest_bits));
    hi[i] = static_cast<std::uint16_t>(hi_bits >> 16);
    lo[i] = static_cast<std::uint16_t>(rest_bits >> 16);
  }
}

// One K or Q row as the score product's extended row (amx_tiles.hpp): bfloat16 as it is; float16's terms as
// [kh, kh, kl, kl] (K) or [qh, ql, qh, ql] (Q). Writes amx::score_dims(t, dim) values; returns a pointer to them
// (`row` itself for bfloat16, else w.amx_row).
inline const std::uint16_t* extended_row(const Workspace& w, const std::uint16_t* row, DType t, std::int64_t dim,
                                         bool is_query) {
  if (t != DType::f16) return row;
  std::uint16_t* hi = w.amx_row + 4 * dim;  // (the two terms after the four-part row)
  std::uint16_t* lo = hi + dim;
  split_float16_row(row, dim, w.row, hi, lo);
  const std::uint16_t* parts[4] = {hi, is_query ? lo : hi, is_query ? hi : lo, lo};
  for (int part = 0; part < 4; ++part) std::copy(parts[part], parts[part] + dim, w.amx_row + part * dim);
  return w.amx_row;
}

// The item's query row r (bfloat16 or float16 bits at `row`) into the pairs operand (of the AMX and the bf16-dot
// scores): dims 2d and 2d + 1 of the (extended) row are one 32-bit word of the pairs, at [d][r]. An odd count's
// last value pairs with a 0.
inline void stage_query_pairs(const Workspace& w, std::int64_t r, const std::uint16_t* row, DType t, std::int64_t dim) {
  const std::uint16_t* ext = extended_row(w, row, t, dim, true);
  const std::int64_t n = amx::score_dims(t, dim);
  auto* pairs = reinterpret_cast<std::uint32_t*>(w.q_pairs);
  std::int64_t d = 0;
  for (; d + 2 <= n; d += 2) {
    std::uint32_t word;
    std::memcpy(&word, ext + d, sizeof(word));
    pairs[(d / 2) * kRowBlock + r] = word;
  }
  if (d < n) pairs[(d / 2) * kRowBlock + r] = ext[d];
}

// Rows [0, rows) of a bfloat16 item's queries (row r's bits at q + q_index[r]) into the pairs operand, as
// stage_query_pairs leaves them, a vector of rows at a time where the rows' words are 4-byte aligned: a gather
// of one word (two dims) from each row, stored whole at [d][r0, r0 + lanes). The per-row copy wrote each row's
// words a line apart, one store per word. Returns the rows staged (from 0; the rest take stage_query_pairs).
inline std::int64_t stage_query_pairs_gathered(const Workspace& w, const std::uint16_t* q, const std::int64_t* q_index,
                                               std::int64_t rows, std::int64_t dim) {
  const hn::ScalableTag<std::int32_t> di;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(di));
  auto* pairs = reinterpret_cast<std::int32_t*>(w.q_pairs);
  const std::int64_t words = dim / 2;
  std::int64_t r0 = 0;
  for (; r0 + lanes <= rows; r0 += lanes) {
    hn::Vec<decltype(di)> offset;
    if (!gather_row_offsets(di, q, q_index, r0, 2, 4, offset)) break;
    const auto* base = reinterpret_cast<const std::int32_t*>(q + q_index[r0]);
    for (std::int64_t d = 0; d < words; ++d) {
      hn::StoreU(hn::GatherOffset(di, base + d, offset), di, pairs + d * kRowBlock + r0);
    }
    if (dim % 2 != 0) {  // an odd head dim's last value, paired with a 0
      for (std::int64_t i = 0; i < lanes; ++i) pairs[words * kRowBlock + r0 + i] = q[q_index[r0 + i] + dim - 1];
    }
  }
  return r0;
}

// Where one key tile's staged operands are: K rows [kKeyTile][dim32], V^T [v_terms][dv16][kKeyTile], and the
// tile's keys whose V holds inf or NaN (staged as 0, added back by amx_value_tile).
struct AmxTile {
  const std::uint16_t* k;
  const std::uint16_t* vt;
  const std::int32_t* bad_keys;
  std::int64_t bad = 0;
};

// Packs one key pair's V rows (each term's bits at even[t] / odd[t]; null: past the tile's keys, zeros) into the
// term's pairs, [kKeyTile / 2][dv16] 32-bit words (key 2 jp's value low, 2 jp + 1's high): PromoteTo and a shift
// keep the columns in order. A value that is inf or NaN goes in as 0 and sets even_bad / odd_bad.
inline void pack_value_pair(const std::uint16_t* even, const std::uint16_t* odd, std::int64_t dv, std::int64_t dv16,
                            std::uint32_t* out, bool& even_bad, bool& odd_bad) {
  const hn::ScalableTag<std::uint32_t> du;
  const hn::Rebind<std::uint16_t, decltype(du)> d16;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(du));
  const auto exponent = hn::Set(du, 0x7F80u);  // all ones: inf or NaN
  std::int64_t d = 0;
  for (; d + L <= dv; d += L) {
    auto lo = even != nullptr ? hn::PromoteTo(du, hn::LoadU(d16, even + d)) : hn::Zero(du);
    auto hi = odd != nullptr ? hn::PromoteTo(du, hn::LoadU(d16, odd + d)) : hn::Zero(du);
    const auto lo_bad = hn::Eq(hn::And(lo, exponent), exponent), hi_bad = hn::Eq(hn::And(hi, exponent), exponent);
    if (!hn::AllFalse(du, hn::Or(lo_bad, hi_bad))) {
      even_bad |= !hn::AllFalse(du, lo_bad);
      odd_bad |= !hn::AllFalse(du, hi_bad);
      lo = hn::IfThenZeroElse(lo_bad, lo);
      hi = hn::IfThenZeroElse(hi_bad, hi);
    }
    hn::StoreU(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, out + d);
  }
  for (; d < dv16; ++d) {
    std::uint32_t lo = even != nullptr && d < dv ? even[d] : 0u, hi = odd != nullptr && d < dv ? odd[d] : 0u;
    if ((lo & 0x7F80u) == 0x7F80u) even_bad = true, lo = 0;
    if ((hi & 0x7F80u) == 0x7F80u) odd_bad = true, hi = 0;
    out[d] = lo | hi << 16;
  }
}

// Keys [k0, k0 + n) of the job's K/V head into k_dst (extended rows) and vt_dst (each of V's terms): rows and
// columns past the keys and dims are zeros (their P is zero, and a stale value must not be inf or NaN there, nor a
// padding dim of K). A V value that is inf or NaN goes in as 0 and its key (relative to k0) into bad_dst; returns
// how many: on the tiles 0 x inf would be NaN even where P is 0, and a key a row cannot see must not change its
// output.
inline std::int64_t stage_amx_tile(const ItemJob& job, std::int64_t k0, std::int64_t n, std::uint16_t* k_dst,
                                   std::uint16_t* vt_dst, std::int32_t* bad_dst) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const DType t = p.dtype;
  const int terms = amx::input_terms(t);
  const std::int64_t dim = p.head_dim, ext = amx::score_dims(t, dim), dim32 = amx::score_dim32(t, dim);
  const std::int64_t dv = p.v_head_dim, dv16 = round_up(dv, 16);
  const auto* k = static_cast<const std::uint16_t*>(a.k.data);
  const auto* v = static_cast<const std::uint16_t*>(a.v.data);
  // The next tile's rows, asked for now so that they arrive while this tile is staged and its scores run: rows of
  // a positions-first tensor lie a few KB apart, on a new page every few keys, where the hardware prefetchers stop.
  const std::int64_t next_end = std::min(k0 + n + kKeyTile, std::min(job.seq.key_length, job.key_end));
  for (std::int64_t j = k0 + n; j < next_end; ++j) {
    prefetch_row(k + job.seqs->key_index(p.k, job.seq, job.b, job.kvh, j), dim * 2);
    prefetch_row(v + job.seqs->key_index(p.v, job.seq, job.b, job.kvh, j), dv * 2);
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const std::uint16_t* krow = extended_row(w, k + job.seqs->key_index(p.k, job.seq, job.b, job.kvh, k0 + j), t, dim, false);
    std::memcpy(k_dst + j * dim32, krow, static_cast<std::size_t>(ext) * sizeof(std::uint16_t));
    std::fill(k_dst + j * dim32 + ext, k_dst + (j + 1) * dim32, std::uint16_t{0});
  }
  std::fill(k_dst + n * dim32, k_dst + kKeyTile * dim32, std::uint16_t{0});

  auto* pairs = reinterpret_cast<std::uint32_t*>(w.tile_pv);  // [terms][kKeyTile / 2][dv16] (free until P V)
  const std::int64_t term_words = kKeyTile / 2 * dv16;
  std::int64_t bad = 0;
  for (std::int64_t jp = 0; jp < kKeyTile / 2; ++jp) {
    const std::int64_t j = 2 * jp;
    const std::uint16_t* rows[2][2] = {};  // [even / odd][term]
    for (int side = 0; side < 2; ++side) {
      if (j + side >= n) continue;
      const std::uint16_t* row = v + job.seqs->key_index(p.v, job.seq, job.b, job.kvh, k0 + j + side);
      if (terms == 1) {
        rows[side][0] = row;
      } else {  // (w.amx_row: even's terms, then odd's)
        std::uint16_t* hi = w.amx_row + side * 2 * dv;
        split_float16_row(row, dv, w.row, hi, hi + dv);
        rows[side][0] = hi;
        rows[side][1] = hi + dv;
      }
    }
    bool even_bad = false, odd_bad = false;
    for (int term = 0; term < terms; ++term) {
      pack_value_pair(rows[0][term], rows[1][term], dv, dv16, pairs + term * term_words + jp * dv16, even_bad, odd_bad);
    }
    if (even_bad) bad_dst[bad++] = static_cast<std::int32_t>(j);
    if (odd_bad) bad_dst[bad++] = static_cast<std::int32_t>(j + 1);
  }
  for (int term = 0; term < terms; ++term) {
    amx::transpose_pairs(pairs + term * term_words, dv16, vt_dst + term * dv16 * kKeyTile);
  }
  return bad;
}

// The staged operands of the key tile that starts at k0 (a multiple of kKeyTile) with n keys: from the thread's
// copy of the head (staged there the first time a row block of the head asks for it; a copy of another head is
// dropped first), or staged now into the item's own buffers of the step's tile `slot`.
inline AmxTile amx_tile(const ItemJob& job, std::int64_t k0, std::int64_t n, int slot) {
  const AttentionProblem& p = *job.problem;
  const Workspace& w = *job.ws;
  const std::int64_t dim32 = amx::score_dim32(p.dtype, p.head_dim);
  const std::int64_t vt_size = round_up(p.v_head_dim, 16) * kKeyTile * amx::input_terms(p.dtype);
  if (!job.widened) {
    std::uint16_t* k = w.k_bf16 + slot * kKeyTile * dim32;
    std::uint16_t* vt = w.vt_bf16 + slot * vt_size;
    std::int32_t* bad_keys = w.amx_bad_keys + slot * kKeyTile;
    const std::int64_t bad = stage_amx_tile(job, k0, n, k, vt, bad_keys);
    return {k, vt, bad_keys, bad};
  }
  hold_head_copy(job);
  const std::int64_t t = k0 / kKeyTile;
  std::uint16_t* k = w.staged_k + t * kKeyTile * dim32;
  std::uint16_t* vt = w.staged_vt + t * vt_size;
  std::int32_t* bad_keys = w.staged_bad_keys + t * kKeyTile;
  if (w.widened_ready[t] == 0) {
    w.staged_bad_count[t] = static_cast<std::int32_t>(stage_amx_tile(job, k0, n, k, vt, bad_keys));
    w.widened_ready[t] = 1;
  }
  return {k, vt, bad_keys, w.staged_bad_count[t]};
}

// P rounded to the nearest bfloat16 (ties to even), as float32 bits with the low 16 bits zero (P is finite).
template <class DU, class VU = hn::Vec<DU>>
HWY_INLINE VU round_to_bfloat16(DU du, VU bits) {
  const VU lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  return hn::And(hn::Add(bits, hn::Add(lsb, hn::Set(du, 0x7FFFu))), hn::Set(du, 0xFFFF0000u));
}

// Keys 2 jp and 2 jp + 1's probabilities of query vector v (even, odd: float32) into the P pairs operand as `terms`
// bfloat16 terms each: every term but the last the remainder cut to its top bfloat16 bits (exact in float32, as is
// what is left), the last the remainder rounded to the nearest bfloat16. Three terms hold all 24 bits of P; one is
// P rounded to bfloat16. even and odd become the values the terms sum to (the row's sum adds those).
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE void store_probability_terms(DF df, std::uint16_t* p_pairs, int terms, std::int64_t jp, std::size_t v,
                                        VF& even, VF& odd) {
  const hn::RebindToUnsigned<DF> du;
  const std::size_t L = hn::Lanes(df);
  auto* pairs = reinterpret_cast<std::uint32_t*>(p_pairs);
  const auto high = hn::Set(du, 0xFFFF0000u);
  constexpr std::int64_t kTermPairs = kKeyTile / 2 * kRowBlock;
  VF even_rest = even, odd_rest = odd;
  for (int term = 0; term < terms; ++term) {
    const bool rounded = term + 1 == terms && terms < amx::kMaxProbabilityTerms;
    const auto even_bits = rounded ? round_to_bfloat16(du, hn::BitCast(du, even_rest)) : hn::And(hn::BitCast(du, even_rest), high);
    const auto odd_bits = rounded ? round_to_bfloat16(du, hn::BitCast(du, odd_rest)) : hn::And(hn::BitCast(du, odd_rest), high);
    hn::Store(hn::Or(hn::ShiftRight<16>(even_bits), odd_bits), du, pairs + term * kTermPairs + jp * kRowBlock + v * L);
    even_rest = hn::Sub(even_rest, hn::BitCast(df, even_bits));
    odd_rest = hn::Sub(odd_rest, hn::BitCast(df, odd_bits));
  }
  if (terms < amx::kMaxProbabilityTerms) {
    even = hn::Sub(even, even_rest);
    odd = hn::Sub(odd, odd_rest);
  }
}

// O^T = O^T * alpha + P V for a step's `tiles` key tiles on AMX (P already in w.p_pairs, and as float32 in w.st
// where a tile has inf or NaN values of V): the product, the inf or NaN values of V that staging left out added
// where their key's P is not 0 (a row that sees one gets it, one that does not keeps the bits of a finite V), then
// the update.
inline void amx_value_step(const ItemJob& job, const AmxTile* tiles_operands, int tiles, std::int64_t s0,
                           std::size_t nvec) {
  const AttentionProblem& p = *job.problem;
  const Workspace& w = *job.ws;
  const std::int64_t dv = p.v_head_dim;
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  const std::uint16_t* vt[amx::kTilesPerStep];
  for (int g = 0; g < tiles; ++g) vt[g] = tiles_operands[g].vt;
  amx::values(vt, tiles, amx::input_terms(p.dtype), w.p_pairs, job.p_terms, round_up(dv, 16), w.tile_pv);
  for (int g = 0; g < tiles; ++g) {
    const AmxTile& tile = tiles_operands[g];
    const float* st = w.st + g * kKeyTile * kRowBlock;
    for (std::int64_t i = 0; i < tile.bad; ++i) {
      const std::int64_t j = tile.bad_keys[i];
      float* vrow = w.row;
      widen_row(static_cast<const char*>(job.args->v.data) +
                    job.seqs->key_index(p.v, job.seq, job.b, job.kvh, s0 + g * kKeyTile + j) *
                        static_cast<std::int64_t>(sizeof(std::uint16_t)),
                p.dtype, dv, vrow);
      for (std::int64_t d = 0; d < dv; ++d) {
        if (std::isfinite(vrow[d])) continue;
        for (std::size_t r = 0; r < nvec * L; ++r) {
          const float weight = st[j * kRowBlock + static_cast<std::int64_t>(r)];
          if (weight != 0.0f) w.tile_pv[d * kRowBlock + static_cast<std::int64_t>(r)] += weight * vrow[d];
        }
      }
    }
  }
  // (locals: through `w` the compiler reloaded the three pointers at every store)
  float* HWY_RESTRICT ot = w.ot;
  const float* HWY_RESTRICT alpha = w.alpha;
  const float* HWY_RESTRICT tile_pv = w.tile_pv;
  for (std::int64_t d = 0; d < dv; ++d) {
    for (std::size_t v = 0; v < nvec; ++v) {
      float* o = ot + d * kRowBlock + v * L;
      hn::Store(hn::MulAdd(hn::Load(df, o), hn::Load(df, alpha + v * L), hn::Load(df, tile_pv + d * kRowBlock + v * L)), df, o);
    }
  }
}

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
