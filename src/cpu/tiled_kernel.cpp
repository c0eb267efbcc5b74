// The tiled CPU kernel (see tiled_kernel.hpp for the design). Highway compiles the SIMD part of this file
// once per x86 target and picks the best at run time; the planning and the thread loop are compiled once.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/tiled_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "../core/kv_quant.hpp"
#include "../core/online_softmax.hpp"
#include "../core/score_transform.hpp"
#include "../core/visibility.hpp"
#include "amx_staging-inl.h"
#include "amx_tiles.hpp"
#include "bf16_dot.hpp"
#include "register_tiles-inl.h"
#include "row_prefetch.hpp"
#include "tiled_kernel.hpp"
#include "tiled_workspace.hpp"
#include "softmax_exp-inl.h"
#include "widen-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace attnkit::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;

// Tile `tile` of the job's K/V head into the thread's widened copy, unless it is there already (a copy of another
// head is dropped first). Only keys below the entry's key length are read (past it a ragged or paged entry's rows
// are not its own).
void widen_tile_once(const ItemJob& job, std::int64_t tile, bool k_too, bool v_too) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  hold_head_copy(job);
  if (w.widened_ready[tile] != 0) return;
  const float* k_scales = kv_head_scales(a.k_scale, p.k_storage, job.kvh, p.head_dim);
  const float* v_scales = kv_head_scales(a.v_scale, p.v_storage, job.kvh, p.v_head_dim);
  const std::int64_t end = std::min((tile + 1) * kKeyTile, job.seq.key_length);
  for (std::int64_t j = tile * kKeyTile; j < end; ++j) {
    if (k_too) {
      widen_kv_row(a.k.data, job.seqs->key_index(p.k, job.seq, job.b, job.kvh, j), p.k_storage, p.dtype, p.head_dim,
                   k_scales, w.widened_k + j * p.head_dim);
    }
    if (v_too) {
      widen_kv_row(a.v.data, job.seqs->key_index(p.v, job.seq, job.b, job.kvh, j), p.v_storage, p.dtype, p.v_head_dim,
                   v_scales, w.widened_v + j * p.v_head_dim);
    }
  }
  w.widened_ready[tile] = 1;
}

// w.row = column r of O^T times acc_scale (0: zeros, whatever O^T holds), a vector of dims at a time.
void gather_output_row(const Workspace& w, std::int64_t r, std::int64_t dv, float acc_scale) {
  const DF df;
  const DI di;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  if (acc_scale == 0.0f) {
    std::fill(w.row, w.row + dv, 0.0f);
    return;
  }
  const auto column = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(kRowBlock)));
  const VF scale = hn::Set(df, acc_scale);
  std::int64_t d = 0;
  for (; d + L <= dv; d += L) {
    hn::StoreU(hn::Mul(hn::GatherIndex(df, w.ot + d * kRowBlock + r, column), scale), df, w.row + d);
  }
  for (; d < dv; ++d) w.row[d] = w.ot[d * kRowBlock + r] * acc_scale;
}

// Rows [0, rows) of O^T times each row's scale into `out` row-major ([rows][dv]; 0 where a row's scale is 0,
// whatever O^T holds), for an item of more than a few rows: four dims of a vector of rows at a time, transposed by
// an interleaved store and moved into the rows by 16-byte copies. (One gather per vector of a row's dims fetched
// each value from its own cache line of O^T: a seventh of a MiniLM-size float32 call.) The products are the ones
// gather_output_row takes, so the bits are the same.
void transpose_output_rows(const Workspace& w, std::int64_t rows, std::int64_t dv, const float* scale, float* out) {
  const DF df;
  const hn::CappedTag<float, 4> d4;
  const std::int64_t L = static_cast<std::int64_t>(hn::Lanes(df));
  HWY_ALIGN float quad[4 * (HWY_MAX_BYTES / sizeof(float))];
  const std::int64_t dv4 = dv / 4 * 4;
  for (std::int64_t r0 = 0; r0 < rows; r0 += L) {  // (lanes past `rows` are in O^T's kRowBlock columns, unread)
    const std::int64_t n = std::min(L, rows - r0);
    const VF s = hn::LoadU(df, scale + r0);
    for (std::int64_t d = 0; d < dv4; d += 4) {
      const float* col = w.ot + d * kRowBlock + r0;
      hn::StoreInterleaved4(hn::Mul(hn::LoadU(df, col), s), hn::Mul(hn::LoadU(df, col + kRowBlock), s),
                            hn::Mul(hn::LoadU(df, col + 2 * kRowBlock), s),
                            hn::Mul(hn::LoadU(df, col + 3 * kRowBlock), s), df, quad);
      for (std::int64_t i = 0; i < n; ++i) hn::StoreU(hn::Load(d4, quad + 4 * i), d4, out + (r0 + i) * dv + d);
    }
    for (std::int64_t d = dv4; d < dv; ++d) {
      for (std::int64_t i = 0; i < n; ++i) out[(r0 + i) * dv + d] = w.ot[d * kRowBlock + r0 + i] * scale[r0 + i];
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    if (scale[r] == 0.0f) std::fill(out + r * dv, out + (r + 1) * dv, 0.0f);
  }
}

// Normalises the item's rows and writes O (and the LSE): out = acc * acc_scale, or NaN / 0 for a row that
// saw no key, NaN for a poisoned row. An item of more than a few rows transposes O^T into its row buffer
// (`orows`, free outside few-rows items) first; a few-rows item gathers each row.
void finish_rows(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const auto* sinks = static_cast<const float*>(a.head_sink.data);
  const std::int64_t dv = p.v_head_dim;
  const std::size_t es = dtype_size(p.dtype);
  const bool transposed = job.rows > kMaxFewRows;
  HWY_ALIGN float scale[kRowBlock + (HWY_MAX_BYTES / sizeof(float))] = {};
  float lse[kRowBlock];
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::int64_t h = job.kvh * job.group + (job.first_row + r) / job.seq.queries;
    const core::RowState state{w.max[r], w.sum[r], w.poison[r] != 0.0f};
    const float sink = p.has_head_sink ? sinks[h] : 0.0f;
    const core::RowFinish fin = p.return_lse ? core::finish_row(state, p.has_head_sink, sink, p.masked_rows)
                                             : core::finish_row<false>(state, p.has_head_sink, sink, p.masked_rows);
    scale[r] = fin.acc_scale;
    lse[r] = fin.lse;
  }
  if (transposed) transpose_output_rows(w, job.rows, dv, scale, w.orows);
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::int64_t pair = job.first_row + r;
    const std::int64_t h = job.kvh * job.group + pair / job.seq.queries;
    const std::int64_t i = pair % job.seq.queries;
    const float* row = w.orows + r * dv;
    if (!transposed) {
      gather_output_row(w, r, dv, scale[r]);
      row = w.row;
    }
    narrow_row(row, p.dtype, dv,
               static_cast<char*>(a.o.data) + job.seqs->query_index(p.o, job.seq, job.b, h, i) * static_cast<std::int64_t>(es));
    if (p.return_lse) static_cast<float*>(a.lse.data)[job.seqs->query_index(p.lse, job.seq, job.b, h, i)] = lse[r];
  }
}

// The item's query rows (read when it starts) or output rows (written at its end, unless it is a split's part;
// asked for before its last tile, so that they arrive under that tile's work). A row of a positions-first tensor
// is a head's slice of a position, one or two cache lines a few KB from the next row's: read and written one after
// the other, each waited on memory (a fifth of a BERT-size call in float32).
void prefetch_item_rows(const ItemJob& job, bool output) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  if (output && job.partial != nullptr) return;
  for (std::int64_t r = 0; r < job.rows; ++r) {
    const std::int64_t pair = job.first_row + r;
    const std::int64_t h = job.kvh * job.group + pair / job.seq.queries;
    const std::int64_t i = pair % job.seq.queries;
    if (output) {
      prefetch_row_for_write(static_cast<char*>(a.o.data) + job.seqs->query_index(p.o, job.seq, job.b, h, i) * es,
                             p.v_head_dim * es);
    } else {
      prefetch_row(static_cast<const char*>(a.q.data) + job.seqs->query_index(p.q, job.seq, job.b, h, i) * es,
                   p.head_dim * es);
    }
  }
}

// Rows [0, rows) of a float32 item's queries (row r at q + q_index[r]) into qt ([dim][lane]), a vector of rows at
// a time: a gather of one dim from each row, stored whole (the per-row copy stored each value a line from the
// last). Returns the rows staged (from 0; the rest are copied row by row).
std::int64_t stage_query_columns_gathered(const Workspace& w, const float* q, const std::int64_t* q_index,
                                          std::int64_t rows, std::int64_t dim) {
  const DF df;
  const DI di;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t r0 = 0;
  for (; r0 + lanes <= rows; r0 += lanes) {
    hn::Vec<DI> offset;
    if (!gather_row_offsets(di, q, q_index, r0, 4, 4, offset)) break;
    const float* base = q + q_index[r0];
    for (std::int64_t d = 0; d < dim; ++d) hn::Store(hn::GatherOffset(df, base + d, offset), df, w.qt + d * kRowBlock + r0);
  }
  return r0;
}

// The same for float16 / bfloat16 query rows (row r's bits at q + q_index[r]): one gather of a 32-bit word (two
// dims) from each row, widened exactly into the two dims' columns, where the rows' words are 4-byte aligned.
std::int64_t stage_half_query_columns_gathered(const Workspace& w, const std::uint16_t* q, const std::int64_t* q_index,
                                               std::int64_t rows, std::int64_t dim, DType t) {
  const DF df;
  const DI di;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<std::uint16_t, DF> du16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t words = dim / 2;
  std::int64_t r0 = 0;
  for (; r0 + lanes <= rows; r0 += lanes) {
    hn::Vec<decltype(di)> offset;
    if (!gather_row_offsets(di, q, q_index, r0, 2, 4, offset)) break;
    const auto* base = reinterpret_cast<const std::int32_t*>(q + q_index[r0]);
    const auto low_half = hn::Set(du, 0xFFFFu);
    for (std::int64_t d = 0; d < words; ++d) {
      const auto word = hn::BitCast(du, hn::GatherOffset(di, base + d, offset));
      VF even, odd;
      if (t == DType::bf16) {  // (a bfloat16 is the top half of its float32)
        even = hn::BitCast(df, hn::ShiftLeft<16>(word));
        odd = hn::BitCast(df, hn::AndNot(low_half, word));
      } else {
        even = hn::PromoteTo(df, hn::BitCast(dh, hn::TruncateTo(du16, word)));
        odd = hn::PromoteTo(df, hn::BitCast(dh, hn::TruncateTo(du16, hn::ShiftRight<16>(word))));
      }
      hn::Store(even, df, w.qt + 2 * d * kRowBlock + r0);
      hn::Store(odd, df, w.qt + (2 * d + 1) * kRowBlock + r0);
    }
    if (dim % 2 != 0) {  // an odd head dim's last value
      for (std::int64_t i = 0; i < lanes; ++i) {
        widen_row(q + q_index[r0 + i] + dim - 1, t, 1, w.qt + (dim - 1) * kRowBlock + r0 + i);
      }
    }
  }
  return r0;
}

// What every key tile of an item reads, set up once by run_item.
struct ItemTiles {
  std::size_t nvec;           // query vectors in use
  std::int64_t union_begin;   // the item's rows see keys in [union_begin, union_end) between them
  std::int64_t union_end;
  bool mask_per_key;          // the mask is one row for all of the item's rows (added as a broadcast)
  const float* k_scales;      // quantized K / V: the K/V head's scales
  const float* v_scales;
};

// Rows: where each lane's query, output, mask row and LSE live and which keys it sees in the item's range; the
// queries staged for the score product. Returns the union of the rows' key ranges and whether one head holds them.
ItemTiles set_up_rows(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const std::size_t L = hn::Lanes(DF());
  const std::int64_t rows = job.rows, dim = p.head_dim;
  const std::size_t nvec = (static_cast<std::size_t>(rows) + L - 1) / L;
  const std::int64_t lanes_used = static_cast<std::int64_t>(nvec * L);
  const bool pairs = job.amx || job.bf16_dot;  // (the scores read Q's pairs; qt is not used)
  ItemTiles t{nvec, job.key_end, job.key_begin, false, nullptr, nullptr};
  bool single_head = true;
  // Query rows go into their operand after the loop, a vector of rows at a time: bfloat16 into the pairs (AMX,
  // vdpbf16ps), every type into qt on the SIMD path. (Float16 pairs take extended rows, built row by row.)
  const bool gathered = pairs && p.dtype == DType::bf16;
  const bool gathered_f32 = !pairs && p.dtype == DType::f32;
  const bool gathered_half = !pairs && (p.dtype == DType::f16 || p.dtype == DType::bf16);
  std::int64_t q_index_of[kRowBlock] = {};
  for (std::int64_t r = 0; r < lanes_used; ++r) {
    if (r >= rows) {
      w.begin[r] = 0;
      w.end[r] = 0;
      for (std::int64_t d = 0; d < dim && !pairs; ++d) w.qt[d * kRowBlock + r] = 0.0f;
      continue;
    }
    const std::int64_t pair = job.first_row + r;
    const std::int64_t h = job.kvh * job.group + pair / job.seq.queries;
    const std::int64_t i = pair % job.seq.queries;
    w.head[r] = h;
    w.query[r] = i;
    if (h != w.head[0]) single_head = false;
    const core::KeyRange range = job.seq.rule.for_row(i, job.seq.key_length);
    const std::int64_t begin = std::max(range.begin, job.key_begin);
    const std::int64_t end = std::max(begin, std::min(range.end, job.key_end));
    w.begin[r] = static_cast<std::int32_t>(begin);
    w.end[r] = static_cast<std::int32_t>(end);
    if (begin < end) {
      t.union_begin = std::min(t.union_begin, begin);
      t.union_end = std::max(t.union_end, end);
    }
    const std::int64_t q_index = job.seqs->query_index(p.q, job.seq, job.b, h, i);
    if (gathered || gathered_f32 || gathered_half) {
      q_index_of[r] = q_index;
      continue;
    }
    if (pairs) {
      stage_query_pairs(w, r, static_cast<const std::uint16_t*>(a.q.data) + q_index, p.dtype, dim);
      continue;
    }
    widen_row(static_cast<const char*>(a.q.data) + q_index * static_cast<std::int64_t>(dtype_size(p.dtype)),
              p.dtype, dim, w.row);
    for (std::int64_t d = 0; d < dim; ++d) w.qt[d * kRowBlock + r] = w.row[d];
  }
  if (gathered_half) {
    const auto* q = static_cast<const std::uint16_t*>(a.q.data);
    for (std::int64_t r = stage_half_query_columns_gathered(w, q, q_index_of, rows, dim, p.dtype); r < rows; ++r) {
      widen_row(q + q_index_of[r], p.dtype, dim, w.row);
      for (std::int64_t d = 0; d < dim; ++d) w.qt[d * kRowBlock + r] = w.row[d];
    }
  }
  if (gathered_f32) {
    const auto* q = static_cast<const float*>(a.q.data);
    for (std::int64_t r = stage_query_columns_gathered(w, q, q_index_of, rows, dim); r < rows; ++r) {
      for (std::int64_t d = 0; d < dim; ++d) w.qt[d * kRowBlock + r] = q[q_index_of[r] + d];
    }
  }
  if (gathered) {
    const auto* q = static_cast<const std::uint16_t*>(a.q.data);
    for (std::int64_t r = stage_query_pairs_gathered(w, q, q_index_of, rows, dim); r < rows; ++r) {
      stage_query_pairs(w, r, q + q_index_of[r], p.dtype, dim);
    }
  }
  t.mask_per_key = p.has_mask && p.mask.row_stride == 0 && (p.mask.head_stride == 0 || single_head);
  t.k_scales = kv_head_scales(a.k_scale, p.k_storage, job.kvh, dim);
  t.v_scales = kv_head_scales(a.v_scale, p.v_storage, job.kvh, p.v_head_dim);
  return t;
}

// The running state of the item's rows at its start: no key seen, nothing summed.
void reset_state(const Workspace& w, std::size_t nvec, std::int64_t dv) {
  const DF df;
  const std::size_t L = hn::Lanes(df);
  for (std::size_t v = 0; v < nvec; ++v) {
    hn::Store(hn::Set(df, core::kNegInf), df, w.max + v * L);
    hn::Store(hn::Zero(df), df, w.sum + v * L);
    hn::Store(hn::Zero(df), df, w.poison + v * L);
  }
  // Only the lanes in use (the last row block of a problem may hold fewer than kRowBlock).
  const std::int64_t lanes_used = static_cast<std::int64_t>(nvec * L);
  for (std::int64_t d = 0; d < dv; ++d) std::fill(w.ot + d * kRowBlock, w.ot + d * kRowBlock + lanes_used, 0.0f);
}

// Where the float32 products read keys [k0, k0 + n) (w.krow / w.vrow, or w.kbits for the bf16-dot scores): in
// place, from the thread's widened copy of the head, or widened / dequantized into the item's buffers.
void load_tile_rows(const ItemJob& job, const ItemTiles& it, std::int64_t t0, std::int64_t k0, std::int64_t n) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const std::int64_t dim = p.head_dim, dv = p.v_head_dim;
  if (job.widened) {  // rows from the thread's widened copy of the head (in place where no widening is needed)
    const bool k_copy = job.widened_k, v_copy = job.widened_v;
    widen_tile_once(job, t0 / kKeyTile, k_copy, v_copy);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t key = k0 + j;
      if (job.bf16_dot) {
        w.kbits[j] = static_cast<const std::uint16_t*>(a.k.data) + job.seqs->key_index(p.k, job.seq, job.b, job.kvh, key);
      } else {
        w.krow[j] = k_copy ? w.widened_k + key * dim
                           : static_cast<const float*>(a.k.data) + job.seqs->key_index(p.k, job.seq, job.b, job.kvh, key);
      }
      w.vrow[j] = v_copy ? w.widened_v + key * dv
                         : static_cast<const float*>(a.v.data) + job.seqs->key_index(p.v, job.seq, job.b, job.kvh, key);
    }
    return;
  }
  const bool k_in_place = p.dtype == DType::f32 && p.k_storage.type == KvType::Float;
  const bool v_in_place = p.dtype == DType::f32 && p.v_storage.type == KvType::Float;
  const bool both_float = p.k_storage.type == KvType::Float && p.v_storage.type == KvType::Float;
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t krow = job.seqs->key_index(p.k, job.seq, job.b, job.kvh, k0 + j);
    const std::int64_t vrow = job.seqs->key_index(p.v, job.seq, job.b, job.kvh, k0 + j);
    if (job.bf16_dot) {  // K read in place by the scores; V widened for the float32 P V
      w.kbits[j] = static_cast<const std::uint16_t*>(a.k.data) + krow;
      widen_kv_row(a.v.data, vrow, p.v_storage, p.dtype, dv, it.v_scales, w.vbuf + j * dv);
      w.vrow[j] = w.vbuf + j * dv;
    } else if (k_in_place && v_in_place) {
      w.krow[j] = static_cast<const float*>(a.k.data) + krow;
      w.vrow[j] = static_cast<const float*>(a.v.data) + vrow;
    } else if (both_float) {  // float16 / bfloat16: the path as it was before quantized caches (inlined widening)
      const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
      widen_row(static_cast<const char*>(a.k.data) + krow * es, p.dtype, dim, w.kbuf + j * dim);
      widen_row(static_cast<const char*>(a.v.data) + vrow * es, p.dtype, dv, w.vbuf + j * dv);
      w.krow[j] = w.kbuf + j * dim;
      w.vrow[j] = w.vbuf + j * dv;
    } else {  // a quantized K and/or V: dequantized into the same buffers
      widen_kv_row(a.k.data, krow, p.k_storage, p.dtype, dim, it.k_scales, w.kbuf + j * dim);
      widen_kv_row(a.v.data, vrow, p.v_storage, p.dtype, dv, it.v_scales, w.vbuf + j * dv);
      w.krow[j] = w.kbuf + j * dim;
      w.vrow[j] = w.vbuf + j * dv;
    }
  }
}

// Scores of keys [k0, k0 + n) in st ([kKeyTile][lane]): scaled, capped, masked and hidden where a row cannot see
// a key, in place; their max folded into tile_max ([lane]); a row with a visible NaN or +inf score poisoned.
void prepare_tile(const ItemJob& job, const ItemTiles& it, std::int64_t k0, std::int64_t n, float* st,
                  float* tile_max) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const Workspace& w = *job.ws;
  const DF df;
  const DI di;
  const std::size_t L = hn::Lanes(df);
  const VF scale = hn::Set(df, *p.scale);
  const float softcap = p.softcap.value_or(0.0f);
  const VF cap = hn::Set(df, softcap);
  const VF neg_inf = hn::Set(df, core::kNegInf);
  const VF pos_inf = hn::Set(df, std::numeric_limits<float>::infinity());
  const std::int64_t k1 = k0 + n;
  bool all_visible = true;
  for (std::int64_t r = 0; r < job.rows; ++r) all_visible &= w.begin[r] <= k0 && w.end[r] >= k1;
  // Scores: scale, softcap, then the additive mask (per element when it differs between rows).
  const bool mask_per_row = p.has_mask && !it.mask_per_key;
  if (mask_per_row) {
    for (std::size_t v = 0; v < it.nvec; ++v) {
      for (std::int64_t j = 0; j < n; ++j) {
        float* s = st + j * kRowBlock + v * L;
        VF x = hn::Mul(hn::Load(df, s), scale);
        if (softcap > 0.0f) x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
        hn::Store(x, df, s);
      }
    }
    for (std::int64_t r = 0; r < job.rows; ++r) {
      const float* m = mask_values(p, a, p.mask.index(job.b, w.head[r], w.query[r]) + k0, n, w.mrow);
      for (std::int64_t j = 0; j < n; ++j) st[j * kRowBlock + r] += m[j];
    }
  }
  const float* key_mask = it.mask_per_key ? mask_values(p, a, p.mask.index(job.b, w.head[0], 0) + k0, n, w.mrow) : nullptr;
  const bool plain = !p.has_mask && softcap == 0.0f && all_visible;
  for (std::size_t v = 0; v < it.nvec; ++v) {
    const auto lane_begin = hn::Load(di, w.begin + v * L);
    const auto lane_end = hn::Load(di, w.end + v * L);
    VF max = hn::Load(df, tile_max + v * L);
    auto all_below_inf = hn::Lt(neg_inf, pos_inf);  // (all true)
    // The plain case (no mask, softcap or hidden key) is its own loop: nothing in it is decided per key.
    auto prepare = [&](auto plain_tag) {
      constexpr bool kPlain = decltype(plain_tag)::value;
      for (std::int64_t j = 0; j < n; ++j) {
        float* s = st + j * kRowBlock + v * L;
        VF x = hn::Load(df, s);
        if (kPlain || !mask_per_row) {
          x = hn::Mul(x, scale);
          if (!kPlain && softcap > 0.0f) x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
          if (!kPlain && key_mask != nullptr) x = hn::Add(x, hn::Set(df, key_mask[j]));
        }
        if (!kPlain && !all_visible) {
          const auto key = hn::Set(di, static_cast<std::int32_t>(k0 + j));
          const auto seen = hn::AndNot(hn::Lt(key, lane_begin), hn::Lt(key, lane_end));
          x = hn::IfThenElse(hn::RebindMask(df, seen), x, neg_inf);
        }
        // NaN or +inf among the visible scores poisons the row (exp() below would turn them into 0).
        all_below_inf = hn::And(all_below_inf, hn::Lt(x, pos_inf));
        max = hn::Max(max, x);
        hn::Store(x, df, s);
      }
    };
    if (plain) {
      prepare(std::true_type{});
    } else {
      prepare(std::false_type{});
    }
    hn::Store(hn::IfThenElse(all_below_inf, hn::Load(df, w.poison + v * L), hn::Set(df, 1.0f)), df, w.poison + v * L);
    hn::Store(max, df, tile_max + v * L);
  }
}

// AVX-512 builds pack P for the AMX products with AVX512_BF16's instructions (every CPU with AMX-BF16 has them,
// amx::available() checks): a function with that target added, called once per tile and query vector.
#undef ATTNKIT_BF16_PACK
#undef ATTNKIT_BF16_PACK_ATTR
#if HWY_TARGET <= HWY_AVX3 && (defined(__GNUC__) || defined(__clang__))
#define ATTNKIT_BF16_PACK 1
#define ATTNKIT_BF16_PACK_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#else
#define ATTNKIT_BF16_PACK 0
#define ATTNKIT_BF16_PACK_ATTR
#endif

// Query vector v's probabilities exp(s - use_max) of one AMX tile's n keys (st: [kKeyTile][lane] scores) into
// the tile's P pairs operand as `terms` bfloat16 terms (store_probability_terms; zeros past n), added to tile_sum
// as the values those terms sum to, and written back into st in float32 where keep_p (the tile's inf / NaN values
// of V are added back from them).
ATTNKIT_BF16_PACK_ATTR HWY_NOINLINE void amx_tile_probabilities(float* st, std::int64_t n, bool keep_p,
                                                               const float* use_max_lanes, std::uint16_t* p_pairs,
                                                               int terms, std::size_t v, float* tile_sum_lanes) {
  const DF df;
  const std::size_t L = hn::Lanes(df);
  const VF use_max = hn::Load(df, use_max_lanes);
  VF tile_sum = hn::Load(df, tile_sum_lanes);
  auto exponential = [&](std::int64_t j) {
    return j < n ? exp_of_nonpositive(df, hn::Sub(hn::Load(df, st + j * kRowBlock + v * L), use_max)) : hn::Zero(df);
  };
#if ATTNKIT_BF16_PACK
  if (terms == 1) {
    // Both keys' P rounded to nearest bfloat16 at once (even in the low 16 words, odd in the high), interleaved
    // into pairs per lane; the row's sum adds them by vdpbf16ps (times 1: odd, then even, each rounded in
    // float32 to nearest, as a float32 add would).
    const __m512i to_pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
    __m512 sum = tile_sum.raw;
    auto* pairs = reinterpret_cast<std::uint32_t*>(p_pairs);
    for (std::int64_t jp = 0; jp < kKeyTile / 2; ++jp) {
      const VF even = exponential(2 * jp), odd = exponential(2 * jp + 1);
      const __m512i packed = _mm512_permutexvar_epi16(to_pairs, (__m512i)_mm512_cvtne2ps_pbh(odd.raw, even.raw));
      _mm512_store_si512(pairs + jp * kRowBlock + v * L, packed);
      sum = _mm512_dpbf16_ps(sum, (__m512bh)packed, ones);
      if (keep_p) {
        const __m512 even_p = _mm512_castsi512_ps(_mm512_slli_epi32(packed, 16));
        const __m512 odd_p = _mm512_castsi512_ps(_mm512_and_si512(packed, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
        if (2 * jp < n) _mm512_store_ps(st + 2 * jp * kRowBlock + v * L, even_p);
        if (2 * jp + 1 < n) _mm512_store_ps(st + (2 * jp + 1) * kRowBlock + v * L, odd_p);
      }
    }
    hn::Store(VF{sum}, df, tile_sum_lanes);
    return;
  }
#endif
  for (std::int64_t jp = 0; jp < kKeyTile / 2; ++jp) {
    VF even = exponential(2 * jp), odd = exponential(2 * jp + 1);
    store_probability_terms(df, p_pairs, terms, jp, v, even, odd);
    tile_sum = hn::Add(hn::Add(tile_sum, even), odd);
    if (keep_p && 2 * jp < n) hn::Store(even, df, st + 2 * jp * kRowBlock + v * L);
    if (keep_p && 2 * jp + 1 < n) hn::Store(odd, df, st + (2 * jp + 1) * kRowBlock + v * L);
  }
  hn::Store(tile_sum, df, tile_sum_lanes);
}

// One step of the online softmax over `tiles` consecutive prepared score tiles (tile g at st + g * kKeyTile *
// kRowBlock, keys[g] keys; their max in tile_max): the running max and sum, alpha (the running state's rescale)
// and P, in place (float32 products) or as the AMX operand's terms (of which keep_p[g] keeps the float32 values
// too: the tile's inf / NaN values of V are added back from them).
void softmax_step(const ItemJob& job, const ItemTiles& it, const float* tile_max, int tiles, const std::int64_t* keys,
                  const bool* keep_p) {
  const Workspace& w = *job.ws;
  const DF df;
  const std::size_t L = hn::Lanes(df);
  const VF neg_inf = hn::Set(df, core::kNegInf);
  for (std::size_t v = 0; v < it.nvec; ++v) {
    const VF old_max = hn::Load(df, w.max + v * L);
    const VF new_max = hn::Max(old_max, hn::Load(df, tile_max + v * L));
    const VF use_max = hn::IfThenZeroElse(hn::Eq(new_max, neg_inf), new_max);
    const VF alpha = hn::IfThenZeroElse(hn::Eq(old_max, neg_inf), exp_of_nonpositive(df, hn::Sub(old_max, use_max)));
    VF tile_sum = hn::Zero(df);
    HWY_ALIGN float use_max_lanes[kRowBlock], tile_sum_lanes[kRowBlock];  // (one vector of each in use)
    if (job.amx) {  // P into the value product's operand (the row's sum adds the values P V takes)
      hn::Store(use_max, df, use_max_lanes);
      hn::Store(tile_sum, df, tile_sum_lanes);
      for (int g = 0; g < tiles; ++g) {
        amx_tile_probabilities(w.st + g * kKeyTile * kRowBlock, keys[g], keep_p[g], use_max_lanes,
                               w.p_pairs + g * job.p_terms * kKeyTile * kRowBlock, job.p_terms, v, tile_sum_lanes);
      }
      tile_sum = hn::Load(df, tile_sum_lanes);
    }
    for (int g = 0; g < tiles && !job.amx; ++g) {
      float* st = w.st + g * kKeyTile * kRowBlock;
      for (std::int64_t j = 0; j < keys[g]; ++j) {
        const VF e = exp_of_nonpositive(df, hn::Sub(hn::Load(df, st + j * kRowBlock + v * L), use_max));
        tile_sum = hn::Add(tile_sum, e);
        hn::Store(e, df, st + j * kRowBlock + v * L);
      }
    }
    hn::Store(new_max, df, w.max + v * L);
    hn::Store(hn::MulAdd(hn::Load(df, w.sum + v * L), alpha, tile_sum), df, w.sum + v * L);
    hn::Store(alpha, df, w.alpha + v * L);
  }
}

// The K and V rows of keys [k0, k1) of the job's head as stored, asked for ahead of their use. Rows of a
// positions-first tensor lie a few KB apart, a page per few keys, which the hardware prefetchers do not follow.
void prefetch_source_rows(const ItemJob& job, std::int64_t k0, std::int64_t k1) {
  const AttentionProblem& p = *job.problem;
  const AttentionArgs& a = *job.args;
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  k1 = std::min(k1, job.seq.key_length);
  for (std::int64_t key = k0; key < k1; ++key) {
    prefetch_row(static_cast<const char*>(a.k.data) + job.seqs->key_index(p.k, job.seq, job.b, job.kvh, key) * es,
                 p.head_dim * es);
    prefetch_row(static_cast<const char*>(a.v.data) + job.seqs->key_index(p.v, job.seq, job.b, job.kvh, key) * es,
                 p.v_head_dim * es);
  }
}

// The next tile's K and V rows (from t0), where they will be read from the tensors: in place over streaming K/V
// (TiledPlan::prefetch_tiles), or into the thread's widened copy of the head that does not hold them yet.
void prefetch_next_tile(const ItemJob& job, std::int64_t t0, std::int64_t end) {
  if (t0 >= end) return;
  const bool to_widen = job.prefetch_items && job.widened && !job.amx && job.ws->widened_ready[t0 / kKeyTile] == 0;
  if (job.prefetch_tiles || to_widen) prefetch_source_rows(job, t0, std::min(t0 + kKeyTile, end));
}

// Under an item's last tile: the query rows of the item the thread runs next, and where that one starts on another
// head whose rows the thread copies or streams, that head's first tile. (A guess: the next chunk of items may go
// to another thread; then these lines only cost their bandwidth.)
void prefetch_next_item(const ItemJob& job) {
  const ItemJob* next = job.next;
  if (!job.prefetch_items || next == nullptr || next->rows == 0) return;
  prefetch_item_rows(*next, false);
  const bool same_head = next->b == job.b && next->kvh == job.kvh;
  if (same_head || !(next->widened || next->prefetch_tiles)) return;
  const std::int64_t t0 = next->key_begin / kKeyTile * kKeyTile;
  prefetch_source_rows(*next, t0, std::min(t0 + kKeyTile, next->key_end));
}

// The item's keys on the float32 (or bf16-dot) products, one tile at a time.
void run_simd_tiles(const ItemJob& job, const ItemTiles& it) {
  const AttentionProblem& p = *job.problem;
  const Workspace& w = *job.ws;
  const std::size_t nvec = it.nvec;
  const std::int64_t lanes_used = static_cast<std::int64_t>(nvec * hn::Lanes(DF()));
  HWY_ALIGN float tile_max[kRowBlock];
  const bool keep_p = true;
  const std::int64_t first_tile = it.union_begin < it.union_end ? it.union_begin / kKeyTile * kKeyTile : it.union_end;
  for (std::int64_t t0 = first_tile; t0 < it.union_end; t0 += kKeyTile) {
    const std::int64_t k0 = std::max(t0, it.union_begin);
    const std::int64_t n = std::min(t0 + kKeyTile, it.union_end) - k0;
    const bool last = t0 + kKeyTile >= it.union_end;
    if (last) prefetch_item_rows(job, true);
    load_tile_rows(job, it, t0, k0, n);
    prefetch_next_tile(job, t0 + kKeyTile, it.union_end);
    if (last) prefetch_next_item(job);
    if (job.bf16_dot) {
      bf16_dot::scores(w.q_pairs, p.head_dim, w.kbits, n, lanes_used, w.st);
    } else {
      ScoreStep score{w.qt, p.head_dim, w.krow, w.st};
      tile_loop(score, n, nvec);
    }
    std::fill(tile_max, tile_max + lanes_used, core::kNegInf);
    prepare_tile(job, it, k0, n, w.st, tile_max);
    softmax_step(job, it, tile_max, 1, &n, &keep_p);
    ValueStep value{w.st, n, w.vrow, w.alpha, w.ot};
    tile_loop(value, p.v_head_dim, nvec);
  }
}

// The item's keys on the AMX products, up to amx::kTilesPerStep tiles per softmax step: the step's scores are all
// taken first, so the running output is rescaled once per step and its P V summed over the step's keys in the
// tiles (a step is the blockwise sum's block).
void run_amx_tiles(const ItemJob& job, const ItemTiles& it) {
  const AttentionProblem& p = *job.problem;
  const Workspace& w = *job.ws;
  const std::int64_t lanes_used = static_cast<std::int64_t>(it.nvec * hn::Lanes(DF()));
  const std::int64_t dim32 = amx::score_dim32(p.dtype, p.head_dim);
  // The AMX products take whole tiles (amx_staging-inl.h): keys before a row's first visible one are hidden like
  // any other.
  const std::int64_t keys_end = std::min(job.seq.key_length, job.key_end);
  const std::int64_t first_tile = it.union_begin < it.union_end ? it.union_begin / kKeyTile * kKeyTile : it.union_end;
  constexpr std::int64_t kStepKeys = amx::kTilesPerStep * kKeyTile;
  HWY_ALIGN float tile_max[kRowBlock];
  AmxTile operands[amx::kTilesPerStep];
  std::int64_t keys[amx::kTilesPerStep];
  bool keep_p[amx::kTilesPerStep];
  amx::begin();
  for (std::int64_t s0 = first_tile; s0 < it.union_end; s0 += kStepKeys) {
    const int tiles = static_cast<int>(std::min(kStepKeys, it.union_end - s0 + kKeyTile - 1) / kKeyTile);
    if (s0 + kStepKeys >= it.union_end) {
      prefetch_item_rows(job, true);
      prefetch_next_item(job);
    }
    std::fill(tile_max, tile_max + lanes_used, core::kNegInf);
    for (int g = 0; g < tiles; ++g) {
      const std::int64_t k0 = s0 + g * kKeyTile;
      keys[g] = std::min(k0 + kKeyTile, keys_end) - k0;
      operands[g] = amx_tile(job, k0, keys[g], g);
      keep_p[g] = operands[g].bad > 0;
      float* st = w.st + g * kKeyTile * kRowBlock;
      amx::scores(operands[g].k, w.q_pairs, dim32, st);
      prepare_tile(job, it, k0, keys[g], st, tile_max);
    }
    softmax_step(job, it, tile_max, tiles, keys, keep_p);
    amx_value_step(job, operands, tiles, s0, it.nvec);
  }
  amx::end();
}

// One work item: rows [first_row, first_row + rows) of K/V head (b, kvh), keys [key_begin, key_end).
void run_item(const ItemJob& job) {
  const AttentionProblem& p = *job.problem;
  const Workspace& w = *job.ws;
  if (job.amx || job.bf16_dot) {  // zeros past the dims and rows
    const std::int64_t pair_dim32 = job.amx ? amx::score_dim32(p.dtype, p.head_dim) : round_up(p.head_dim, 32);
    std::fill(w.q_pairs, w.q_pairs + pair_dim32 * kRowBlock, 0);
  }
  prefetch_item_rows(job, false);
  const ItemTiles it = set_up_rows(job);
  reset_state(w, it.nvec, p.v_head_dim);
  if (job.amx) {
    run_amx_tiles(job, it);
  } else {
    run_simd_tiles(job, it);
  }
  if (job.partial != nullptr) {  // split-K: keep the unnormalised state for the merge pass
    save_partial(w, job.rows, p.v_head_dim, job.partial);
  } else {
    finish_rows(job);
  }
}

}  // namespace attnkit::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnkit::cpu {

HWY_EXPORT(run_item);
HWY_EXPORT(finish_rows);

void run_item_dispatched(const ItemJob& job) { HWY_DYNAMIC_DISPATCH(run_item)(job); }
void finish_rows_dispatched(const ItemJob& job) { HWY_DYNAMIC_DISPATCH(finish_rows)(job); }

// Once per process: Highway 1.0's SupportedTargets() runs the CPU detection on every call, and the GQA op
// describes each call (a tiny decode step spent ~15% of its host time there).
std::string simd_target_name() {
  static const std::string name = [] {
    const std::int64_t usable = hwy::SupportedTargets() & HWY_TARGETS;
    return std::string(hwy::TargetName(usable & -usable));  // lowest bit: the best target compiled and supported
  }();
  return name;
}

}  // namespace attnkit::cpu
#endif
