// Fuzz target: an AttentionProblem, its config and its buffers, decoded from the input, through Attention's
// constructor and run(). Every buffer is allocated at exactly the size the args state (a caller's stated sizes are
// trusted; its layouts, extents, options and values are not), so an access past a buffer is an ASan report. The
// oracles: no sanitizer report, no exception but attnkit::Error, and a rejected call leaves O and the LSE as they
// were. Problems whose arithmetic is too large to run in a fuzzing step are planned and their buffers checked
// (core::check_args), not run.
#include "fuzz_support.hpp"

#include <attnkit/attention.hpp>
#include <core/kv_quant.hpp>
#include <core/problem_check.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace attnkit::fuzz {
namespace {

constexpr long double kMaxRunWork = 1 << 19;                   // b * h * q * k * (d + dv) a step may run




long double work(const AttentionProblem& p) {
  return static_cast<long double>(std::max<std::int64_t>(p.batch, 0)) * std::max<std::int64_t>(p.heads, 0) *
         std::max<std::int64_t>(p.q_len, 0) * std::max<std::int64_t>(p.k_len, 1) *
         (std::max<std::int64_t>(p.head_dim, 0) + std::max<std::int64_t>(p.v_head_dim, 0) + 1);
}

// Ragged and paged sequences (AttentionProblem::sequences), sometimes: edgy sizes, each tensor's rows as the
// sequences lay them out.
void draw_sequences(FuzzedDataProvider& in, AttentionProblem& p) {
  SequenceLayout& s = p.sequences;
  s.ragged_q = in.ConsumeBool();
  if (s.ragged_q || in.ConsumeIntegralInRange<int>(0, 7) == 0) s.total_q = edgy_int(in, 0, 200);
  const int keys = in.ConsumeIntegralInRange<int>(0, 2);  // 0: dense, 1: ragged, 2: paged
  s.ragged_k = keys == 1 || in.ConsumeIntegralInRange<int>(0, 15) == 0;
  if (s.ragged_k || in.ConsumeIntegralInRange<int>(0, 7) == 0) s.total_k = edgy_int(in, 0, 400);
  if (keys == 2 || in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    s.page_size = edgy_int(in, 0, 70);
    s.num_pages = edgy_int(in, 0, 40);
    s.max_pages_per_seq = edgy_int(in, 0, 40);
  }
}

// The rows of the queries' and the keys' tensors per leading index (what the layouts are drawn for).
struct Rows {
  std::int64_t leading, rows;
};
Rows query_rows(const AttentionProblem& p) {
  return p.sequences.ragged_q ? Rows{1, p.sequences.total_q} : Rows{p.batch, p.q_len};
}
Rows key_rows(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  return s.paged() ? Rows{s.num_pages, s.page_size} : s.ragged_k ? Rows{1, s.total_k} : Rows{p.batch, p.k_len};
}

// A sequence array: as drawn (any values), or mostly valid ones (cu_seqlens rising by at most `step`; block-table
// entries below `below`) so that runs get past the checks.

void run_one(FuzzedDataProvider& in) {
  AttentionProblem p;
  p.batch = edgy_int(in, 0, 3);
  p.heads = edgy_int(in, 1, 4);
  p.kv_heads = in.ConsumeBool() ? 0 : edgy_int(in, 1, 4);
  p.q_len = edgy_int(in, 0, 70);
  p.k_len = edgy_int(in, 0, 300);
  p.head_dim = edgy_int(in, 1, 40);
  p.v_head_dim = in.ConsumeBool() ? 0 : edgy_int(in, 1, 40);
  p.dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 3));
  const std::int64_t kvh = p.kv_heads == 0 ? p.heads : p.kv_heads;
  const std::int64_t dv = p.v_head_dim == 0 ? p.head_dim : p.v_head_dim;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) draw_sequences(in, p);
  const Rows qr = query_rows(p), kr = key_rows(p);
  p.q = draw_layout(in, p.heads, qr.rows, p.head_dim);
  p.k = draw_layout(in, kvh, kr.rows, p.head_dim);
  p.v = draw_layout(in, kvh, kr.rows, dv);
  p.o = draw_layout(in, p.heads, qr.rows, dv);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const auto quant = [&](KvStorage& s) {
      s.type = static_cast<KvType>(in.ConsumeIntegralInRange<int>(0, 3));
      s.quant = static_cast<KvQuant>(in.ConsumeIntegralInRange<int>(0, 3));
    };
    quant(p.k_storage);
    quant(p.v_storage);
  }
  if (in.ConsumeBool()) p.scale = in.ConsumeFloatingPoint<float>();
  p.has_mask = in.ConsumeBool();
  if (p.has_mask) {
    p.mask_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 3));
    p.mask = draw_layout(in, p.heads, p.q_len, p.k_len);
  }
  p.has_key_lengths = in.ConsumeBool();
  p.causal = in.ConsumeBool();
  if (in.ConsumeBool()) p.causal_offset = edgy_int(in, -80, 300);
  p.has_causal_offsets = p.causal && in.ConsumeIntegralInRange<int>(0, 3) == 0;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) p.window = edgy_int(in, -2, 300);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) p.softcap = in.ConsumeFloatingPoint<float>();
  p.has_head_sink = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  p.masked_rows = static_cast<MaskedRows>(in.ConsumeIntegralInRange<int>(0, 2));
  p.return_lse = in.ConsumeBool();
  if (p.return_lse) p.lse = draw_layout(in, p.heads, qr.rows, 1);
  if (in.ConsumeIntegralInRange<int>(0, 7) == 0) p.work_budget = edgy_int(in, 0, 100000);

  AttentionConfig config;
  const int backend = in.ConsumeIntegralInRange<int>(0, 9);
  config.backend = backend < 6 ? Backend::Cpu : backend < 9 ? Backend::Reference : static_cast<Backend>(backend);
  config.threads = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? static_cast<int>(edgy_int(in, 0, 4)) : 1;

  const std::int64_t bits = static_cast<std::int64_t>(dtype_size(p.dtype)) * 8;
  const auto kv_bits = [&](KvStorage s) {
    return s.type == KvType::Int8 ? 8 : s.type == KvType::Int4 ? 4 : bits;
  };
  const Arg q = draw_arg(in, reach(p.q, qr.leading, p.heads, qr.rows, p.head_dim), bits);
  const Arg k = draw_arg(in, reach(p.k, kr.leading, kvh, kr.rows, p.head_dim), kv_bits(p.k_storage));
  const Arg v = draw_arg(in, reach(p.v, kr.leading, kvh, kr.rows, dv), kv_bits(p.v_storage));
  Arg o = draw_arg(in, reach(p.o, qr.leading, p.heads, qr.rows, dv), bits);
  const std::int64_t mask_bits = static_cast<std::int64_t>(dtype_size(p.mask_dtype)) * 8;
  const Arg mask = p.has_mask ? draw_arg(in, reach(p.mask, p.batch, p.heads, p.q_len, p.k_len), mask_bits) : Arg{};
  const Arg lengths = p.has_key_lengths ? draw_arg(in, p.batch, 32) : Arg{};
  const Arg offsets = p.has_causal_offsets ? draw_arg(in, p.batch, 32) : Arg{};
  const Arg sink = p.has_head_sink ? draw_arg(in, p.heads, 32) : Arg{};
  Arg lse = p.return_lse ? draw_arg(in, reach(p.lse, qr.leading, p.heads, qr.rows, 1), 32) : Arg{};
  const SequenceLayout& seq = p.sequences;
  const std::int64_t entries = std::min<std::int64_t>(std::max<std::int64_t>(p.batch, 0), kMaxElements);
  const Arg cu_q = seq.ragged_q ? draw_sequence_array(in, entries + 1, p.q_len, 0, true) : Arg{};
  const Arg cu_k = seq.ragged_k ? draw_sequence_array(in, entries + 1, p.k_len, 0, true) : Arg{};
  const __int128 table_entries = static_cast<__int128>(entries) * std::max<std::int64_t>(seq.max_pages_per_seq, 0);
  const Arg table = seq.paged() ? draw_sequence_array(in, table_entries > kMaxElements ? kMaxElements : static_cast<std::int64_t>(table_entries),
                                                      0, seq.num_pages, false)
                                : Arg{};
  const auto scales = [&](KvQuant quant, std::int64_t dim) {
    const __int128 count = quant == KvQuant::PerTensor ? 1 : static_cast<__int128>(kvh) * dim;
    return quant == KvQuant::None ? Arg{} : draw_arg(in, count > kMaxElements ? kMaxElements : static_cast<std::int64_t>(count), 32);
  };
  const Arg k_scale = scales(p.k_storage.quant, p.head_dim);
  const Arg v_scale = scales(p.v_storage.quant, dv);

  AttentionArgs a;
  a.q = {ptr(q), q.elements};
  a.k = {ptr(k), k.elements};
  a.v = {ptr(v), v.elements};
  a.o = {const_cast<void*>(ptr(o)), o.elements};
  a.mask = {ptr(mask), mask.elements};
  a.key_lengths = {ptr(lengths), lengths.elements};
  a.causal_offsets = {ptr(offsets), offsets.elements};
  a.head_sink = {ptr(sink), sink.elements};
  a.lse = {const_cast<void*>(ptr(lse)), lse.elements};
  a.k_scale = {ptr(k_scale), k_scale.elements};
  a.v_scale = {ptr(v_scale), v_scale.elements};
  a.cu_seqlens_q = {ptr(cu_q), cu_q.elements};
  a.cu_seqlens_k = {ptr(cu_k), cu_k.elements};
  a.block_table = {ptr(table), table.elements};

  const std::vector<std::byte> o_before = o.buffer.copy();
  const std::vector<std::byte> lse_before = lse.buffer.copy();
  try {
    Attention op(p, config);
    const long double limit = op.backend() == Backend::Reference ? kMaxRunWork / 16 : kMaxRunWork;
    if (work(op.problem()) <= limit) {
      op.run(a);
    } else {
      core::check_args(op.problem(), a, op.scratch_bytes());
    }
  } catch (const Error&) {
    require_unchanged(o.buffer, o_before);
    require_unchanged(lse.buffer, lse_before);
  }
}

}  // namespace
}  // namespace attnkit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  attnkit::fuzz::run_one(in);
  return 0;
}
