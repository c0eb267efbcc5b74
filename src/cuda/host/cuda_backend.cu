// The CUDA backend's host side: device discovery, the plan (kernel, key split, scratch), the launch sequence
// (key-length check, main kernel in work-budget cuts, merge pass) and error reporting.
#include "cuda/host/cuda_backend.hpp"
#include "cuda/config/tile_table.hpp"
#include "cuda/plan/cuda_plan.hpp"
#include "cuda/host/kernel_launchers.hpp"

#include "core/work_rounds.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace attnkit::cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

bool pointer_aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether every Q, K and V row starts on 16 bytes (given aligned bases) and both dims are whole 16-byte chunks:
// the mma.sync and TF32 kernels' chunk copies; otherwise they load by elements.
bool rows_in_chunks(const AttentionProblem& p) {
  const auto m = static_cast<std::int64_t>(16 / dtype_size(p.dtype));  // elements per chunk
  const auto chunked = [m](const Layout& l) {
    return l.offset % m == 0 && l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
  };
  return p.head_dim % m == 0 && p.v_head_dim % m == 0 && chunked(p.q) && chunked(p.k) && chunked(p.v);
}

int device_attribute(cudaDeviceAttr attr) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  int value = 0;
  check_cuda(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

// The wgmma kernel is built for sm_90a, which runs on compute capability 9.0 only.
bool device_is_sm90() {
  return device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
         device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
}

KernelParams make_params(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& plan, float* partial) {
  KernelParams k{};
  k.q = a.q.data;
  k.k = a.k.data;
  k.v = a.v.data;
  k.o = a.o.data;
  k.mask = a.mask.data;
  k.mask_dtype = p.mask_dtype;
  k.k_type = p.k_storage.type;
  k.v_type = p.v_storage.type;
  k.k_quant = p.k_storage.quant;
  k.v_quant = p.v_storage.quant;
  k.k_scale = static_cast<const float*>(a.k_scale.data);
  k.v_scale = static_cast<const float*>(a.v_scale.data);
  k.key_lengths = static_cast<const std::int32_t*>(a.key_lengths.data);
  k.sinks = static_cast<const float*>(a.head_sink.data);
  k.causal_offsets = static_cast<const std::int32_t*>(a.causal_offsets.data);
  k.lse = static_cast<float*>(a.lse.data);
  k.partial = partial;
  k.lq = to_device(p.q);
  k.lk = to_device(p.k);
  k.lv = to_device(p.v);
  k.lo = to_device(p.o);
  k.lmask = to_device(p.mask);
  k.llse = to_device(p.lse);
  k.batch = p.batch;
  k.heads = p.heads;
  k.kv_heads = p.kv_heads;
  k.q_len = p.q_len;
  k.k_len = p.k_len;
  k.head_dim = p.head_dim;
  k.v_head_dim = p.v_head_dim;
  k.group = plan.group;
  k.group_rows = plan.group_rows;
  k.row_blocks = plan.row_blocks;
  k.splits = plan.splits;
  k.split_keys = plan.split_keys;
  k.tail_block = plan.tail_block;
  k.tail_pieces = plan.tail_pieces;
  k.tail_piece_keys = plan.tail_piece_keys;
  k.three_per_sm = plan.three_per_sm;
  k.kv_copies = plan.kv_copies;
  k.narrow = plan.narrow;
  k.rule = core::VisibilityRule{p.causal, *p.causal_offset, p.window.value_or(0)};
  const bool heavy_first = p.causal && plan.row_blocks > 1 && !plan.overrides.is_off("heavy-first");
  std::int64_t heavy_group = 0;
  if (heavy_first) {
    // Pairs whose K and V fill at most a sixth of L2: blocks in flight of one pair are at different keys, and Q
    // and O stream through too. On the H200 (60 MiB of L2, 2 MiB pairs of a 4k prompt) that is 5 pairs: the
    // 64-head 4k causal case ran in 688 us (groups of 4: 682, of 15 (a half of L2): 703, of all 64: 756, index
    // order: 706; bench/results/2026-11-30-h200-heavy-first-ab.md). PlanOverrides::heavy_group sets the group.
    const auto row_bytes = [&](const KvStorage& s, std::int64_t dim) -> std::int64_t {
      if (s.type == KvType::Int4) return (dim + 1) / 2;
      return s.type == KvType::Int8 ? dim : dim * static_cast<std::int64_t>(dtype_size(p.dtype));
    };
    const std::int64_t pair_bytes = std::max<std::int64_t>(
        p.k_len * (row_bytes(p.k_storage, p.head_dim) + row_bytes(p.v_storage, p.v_head_dim)), 1);
    heavy_group = plan.overrides.heavy_group > 0 ? plan.overrides.heavy_group
                                                 : device_attribute(cudaDevAttrL2CacheSize) / 6 / pair_bytes;
  }
  set_block_order(k, heavy_first, heavy_group);
  k.transform = core::ScoreTransform{*p.scale, p.softcap.value_or(0.0f)};
  k.has_mask = p.has_mask;
  k.has_key_lengths = p.has_key_lengths;
  k.has_sink = p.has_head_sink;
  k.return_lse = p.return_lse;
  k.masked_rows = p.masked_rows;
  const std::int64_t d = p.head_dim, dv = p.v_head_dim;
  k.bucketed = plan.kernel == CudaPlan::Kernel::TensorCore ? !(mma_bucket(d, dv) == HeadDimBucket{int(d), int(dv)})
               : plan.kernel == CudaPlan::Kernel::Warpgroup ? warpgroup_bucket(warpgroup_width(d, dv)) != d ||
                                                                  warpgroup_bucket(warpgroup_width(d, dv)) != dv
               : plan.kernel == CudaPlan::Kernel::Tf32      ? !(tf32_bucket(d, dv) == HeadDimBucket{int(d), int(dv)})
                                                            : false;
  k.has_sequences = p.sequences.any();
  k.keys_end_per_entry = k.has_key_lengths || k.has_sequences;
  if (k.has_sequences) {
    k.seq = core::sequence_access(p, a);
    k.total_q = p.sequences.total_q;
    k.total_k = p.sequences.total_k;
    k.num_pages = p.sequences.num_pages;
  }
  k.element_loads = !(pointer_aligned16(a.q.data) && pointer_aligned16(a.k.data) && pointer_aligned16(a.v.data) &&
                      rows_in_chunks(p));
  return k;
}

}  // namespace

bool available() {
  static const bool present = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    if (!ok) cudaGetLastError();
    return ok;
  }();
  return present;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr || !available()) return false;
  // The query touches no stream, but a capture in global mode (PyTorch's default) counts it as potentially
  // unsafe and fails the whole capture: this thread asks in relaxed mode, then puts its mode back.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaPointerAttributes attr{};
  const bool known = cudaPointerGetAttributes(&attr, p) == cudaSuccess;
  if (!known) cudaGetLastError();  // clear the sticky "invalid value" of a plain host pointer on old runtimes
  cudaThreadExchangeStreamCaptureMode(&mode);
  return known && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged);
}

namespace {

// What the plan needs of the current device: its SM count, whether the wgmma kernel's sm_90a code runs, and
// the blocks of a kernel (this problem's instance) one SM holds at once (occupancy at the plan's shared memory).
DeviceTraits device_traits(const AttentionProblem& p) {
  DeviceTraits d;
  d.sm_count = device_attribute(cudaDevAttrMultiProcessorCount);
  d.sm90 = device_is_sm90();
  d.resident_blocks = [&p](CudaPlan::Kernel kernel) {
    switch (kernel) {
      case CudaPlan::Kernel::TensorCore:
        return mma_resident_blocks(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type);
      case CudaPlan::Kernel::Decode: return decode_resident_blocks(p.dtype, p.k_storage.type);
      case CudaPlan::Kernel::DecodeMma: return decode_mma_resident_blocks(p.dtype, p.head_dim, p.k_storage.type);
      case CudaPlan::Kernel::Warpgroup:
        return warpgroup_resident_blocks(p.dtype, warpgroup_width(p.head_dim, p.v_head_dim), p.k_storage.type);
      case CudaPlan::Kernel::Simt:
      case CudaPlan::Kernel::Tf32: break;
    }
    return 2;
  };
  if (warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim)) == 64 && p.k_storage.type == KvType::Float &&
      (p.dtype == DType::f16 || p.dtype == DType::bf16) && d.sm90) {
    d.warpgroup_three_resident = warpgroup_resident_blocks(p.dtype, 64, p.k_storage.type, true);
  }
  return d;
}

}  // namespace

CudaPlan plan(const AttentionProblem& p, const PlanOverrides& overrides) {
  if (!available()) throw Error("config.backend", "no CUDA device is present");
  const DeviceTraits device = device_traits(p);
  CudaPlan plan = plan_for(p, true, device, overrides);
  if (plan.kernel == CudaPlan::Kernel::Decode || plan.kernel == CudaPlan::Kernel::Warpgroup ||
      plan.kernel == CudaPlan::Kernel::DecodeMma) {
    // Rows that do not start on the decode / wgmma kernel's load width (an odd base pointer, seen only at run
    // time) take the mma.sync / SIMT plan instead: the scratch covers both.
    plan.scratch_bytes = std::max(plan.scratch_bytes, plan_for(p, false, device, overrides).scratch_bytes);
  }
  return plan;
}

std::string describe(const CudaPlan& plan) {
  const char* kernel = kernel_shown_name(plan.kernel);
  std::string s = std::string("cuda.") + kernel + " " +
                  std::to_string(plan.blocks) + " blocks of " + std::to_string(plan.row_block) + " rows, " +
                  std::to_string(plan.smem_bytes) + " B shared, " + std::to_string(plan.sm_count) + " SMs";
  if (plan.splits > 1) {
    s += ", split-k " + std::to_string(plan.splits) + " x " + std::to_string(plan.split_keys) + " keys";
  }
  if (plan.cluster_merge) s += ", cluster merge";
  if (plan.plain) s += ", plain";
  if (plan.three_per_sm) s += ", 3 per SM";
  if (plan.kv_copies) s += ", K/V by copies";
  if (plan.narrow) s += ", narrow MMAs";
  if (plan.persistent_places > 0 && plan.blocks > plan.persistent_places) {
    s += ", persistent grid of " + std::to_string(plan.persistent_places);
  }
  if (!plan.simt_reason.empty()) s += " (" + plan.simt_reason + ")";
  if (plan.tail_pieces > 1) {
    s += ", tail of " + std::to_string((plan.blocks - plan.tail_block) / plan.tail_pieces) + " row blocks in " +
         std::to_string(plan.tail_pieces) + " x " + std::to_string(plan.tail_piece_keys) + " keys";
  }
  return s;
}

namespace {

// Whether the decode / wgmma kernel of `chosen` can run with these pointers (both need 16-byte-aligned bases,
// which only the run sees; the wgmma kernel also needs TMA descriptors of K and V, into `maps`, and a layout TMA
// cannot describe takes the fallback plan).
bool special_kernel_runs(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& chosen,
                         WarpgroupMaps& maps) {
  const bool decode_fits = pointer_aligned16(a.k.data) && pointer_aligned16(a.v.data);
  if (chosen.kernel == CudaPlan::Kernel::Decode || chosen.kernel == CudaPlan::Kernel::DecodeMma) return decode_fits;
  if (chosen.kernel == CudaPlan::Kernel::Warpgroup) {
    KernelParams params = make_params(p, a, chosen, nullptr);
    params.plain = chosen.plain;  // (the plain build's Q map)
    return decode_fits && pointer_aligned16(a.q.data) && warpgroup_maps(params, p.dtype, maps);
  }
  return true;
}

}  // namespace

bool rotates_query(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& plan, const QueryRotary& rotary) {
  WarpgroupMaps maps{};
  // (at the bucket's own head dims: the rotated chunks go straight into the tile)
  return !plan.overrides.is_off("query-rotary") && plan.kernel == CudaPlan::Kernel::Warpgroup &&
         p.head_dim == p.v_head_dim && p.head_dim == warpgroup_bucket(p.head_dim) &&
         query_rotary_loads_chunks(rotary, dtype_size(p.dtype)) && special_kernel_runs(p, a, plan, maps);
}

void run(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& chosen, void* scratch,
         bool check_key_lengths, const QueryRotary* rotary, bool overlap_previous) {
  auto stream = static_cast<cudaStream_t>(a.stream);
  auto* flag = static_cast<int*>(scratch);
  WarpgroupMaps maps{};
  const bool falls_back = !special_kernel_runs(p, a, chosen, maps);
  CudaPlan plan = falls_back ? plan_for(p, false, device_traits(p), chosen.overrides) : chosen;
  if (rotary != nullptr && (plan.kernel != CudaPlan::Kernel::Warpgroup ||
                            !query_rotary_loads_chunks(*rotary, dtype_size(p.dtype)))) {
    throw RuntimeError("a query rotary reached a CUDA plan that cannot apply it (" + describe(plan) + ")");
  }
  auto* entry_faults = reinterpret_cast<std::int32_t*>(static_cast<char*>(scratch) + kFlagBytes);
  float* partial = plan.partial_bytes > 0
                       ? reinterpret_cast<float*>(static_cast<char*>(scratch) + kFlagBytes + entry_fault_bytes(p))
                       : nullptr;
  // The lengths live on the device and are never read back (no synchronisation: the call captures in a CUDA
  // graph). A length outside [0, k_len] hides every key of its batch entry in every kernel (key_length_of); the
  // check records the first such entry in the caller's status word (AttentionArgs::status) or, without one, in the
  // scratch's flag.
  int* status = a.status.data != nullptr ? static_cast<int*>(a.status.data) : flag;
  // Ragged or paged sequences: the device check records each entry's out-of-range arrays in the scratch, where
  // every kernel after it reads them (entry_rows), and the first bad entry in the status word.
  if (p.sequences.any() && p.batch > 0) {
    check_cuda(cudaMemsetAsync(status, 0xff, sizeof(int), stream), "cudaMemsetAsync");
    KernelParams check = make_params(p, a, plan, nullptr);
    launch_check_sequences(check, entry_faults, status, stream);
    check_cuda(cudaGetLastError(), "the sequences check launch");
  } else if (check_key_lengths && p.has_key_lengths && p.batch > 0 && status != nullptr) {
    launch_check_key_lengths(static_cast<const std::int32_t*>(a.key_lengths.data), p.batch, p.k_len, status, stream);
    check_cuda(cudaGetLastError(), "the key-length check launch");
  } else if (a.status.data != nullptr) {
    check_cuda(cudaMemsetAsync(a.status.data, 0xff, sizeof(int), stream), "cudaMemsetAsync");  // -1: none bad
  }
  if (plan.blocks == 0) return;
  // Programmatic dependent launches (sm_90), where the caller says its previous kernel allows them (the GQA op's
  // pre-pass): the wgmma kernel after it, and the merge pass after that kernel. Not for the decode-mma kernel:
  // on the H200 its int8 steps took 297.5 / 172.5 µs with them and 261.3 / 169.2 µs without (batch 64 x 4k /
  // batch 8 x 32k), while the wgmma steps gained 0-2%.
  // (The capability read once per call, a driver query; `pdl` needs sm_90 anyway: the wgmma kernel runs nowhere else.)
  const bool pdl_allowed =
      !plan.overrides.is_off("pdl") && device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  const bool pdl = pdl_allowed && overlap_previous && plan.kernel == CudaPlan::Kernel::Warpgroup;
  // A plain attention call's tile kernel may start under the tail of whatever kernel precedes it: it waits for
  // that kernel before it reads anything (wait_first), so only the launch latency and the blocks' start overlap.
  // (What back-to-back calls, a model's layers or a benchmark's CUDA graph, see between two kernels.)
  // (Not after the sequences check, whose faults the kernel reads at its start.)
  const bool pdl_call = pdl_allowed && !plan.overrides.is_off("call-pdl") && !overlap_previous && !p.sequences.any() &&
                        (plan.kernel == CudaPlan::Kernel::Warpgroup || plan.kernel == CudaPlan::Kernel::TensorCore);
  KernelParams params = make_params(p, a, plan, partial);
  if (rotary != nullptr) params.rotary = *rotary;
  params.plain = plan.plain;
  params.entry_faults = entry_faults;
  params.inputs_ready = !pdl;  // (as the first launch below sets it: runs_plain reads it)
  if (plan.tail_pieces > 1 && !runs_plain(params)) {
    // Only the plain build splits a tail (an output row off 16 bytes, seen only here, keeps it out): whole
    // blocks then, with no partial; a decode step's split (a tail from the first row block) becomes the general
    // build's key split of the step (CudaPlan::fallback_splits: the same ranges but with device key lengths).
    if (plan.tail_block == 0) {
      plan.blocks = plan.blocks / plan.tail_pieces * plan.fallback_splits;
      plan.splits = plan.fallback_splits;
      plan.split_keys = plan.fallback_split_keys;
      if (plan.splits == 1) plan.partial_bytes = 0;
      plan.plain = false;
    } else {
      plan.blocks = plan.tail_block + (plan.blocks - plan.tail_block) / plan.tail_pieces;
      plan.partial_bytes = 0;
    }
    plan.tail_block = plan.tail_pieces = plan.tail_piece_keys = 0;
    params = make_params(p, a, plan, plan.partial_bytes > 0 ? partial : nullptr);
    if (rotary != nullptr) params.rotary = *rotary;
    params.plain = plan.plain;
    params.entry_faults = entry_faults;
  }
  // The work budget cuts the grid into launches of whole blocks; every block computes the same bits wherever
  // it lands, so a cut call equals the whole call.
  const std::int64_t block_cost = 4 * plan.row_block * plan.range_keys() * p.head_dim;
  std::int64_t per_launch =
      p.work_budget > 0 ? std::max<std::int64_t>(1, p.work_budget / std::max<std::int64_t>(block_cost, 1)) : plan.blocks;
  // Rows that do not start on 16 bytes (an odd base pointer, seen only here): the mma.sync kernel loads float K/V
  // by elements, a quantized cache and the TF32 kernel take the SIMT kernel.
  const bool aligned = pointer_aligned16(a.q.data) && pointer_aligned16(a.k.data) && pointer_aligned16(a.v.data);
  const bool quantized = p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float;
  const bool tensor_cores = plan.kernel == CudaPlan::Kernel::TensorCore && (aligned || !quantized);
  // A cluster merge (the mma.sync kernel only) cuts between whole clusters: a row block's ranges.
  params.cluster_merge = plan.cluster_merge && tensor_cores;
  if (params.cluster_merge) per_launch = (per_launch + plan.splits - 1) / plan.splits * plan.splits;
  const bool tf32 = plan.kernel == CudaPlan::Kernel::Tf32;
  const std::size_t simt_smem = simt_smem_bytes(p.head_dim, p.v_head_dim);
  params.persistent_places = plan.kernel == CudaPlan::Kernel::Warpgroup ? plan.persistent_places : 0;
  for (std::int64_t first = 0; first < plan.blocks; first += per_launch) {
    params.first_block = first;
    params.inputs_ready = !(first == 0 && pdl);
    params.wait_first = first == 0 && pdl_call;
    const std::int64_t blocks = std::min(per_launch, plan.blocks - first);
    if (plan.kernel == CudaPlan::Kernel::Decode) {
      launch_decode(params, p.dtype, blocks, stream);
    } else if (plan.kernel == CudaPlan::Kernel::DecodeMma) {
      launch_decode_mma(params, p.dtype, blocks, stream);
    } else if (plan.kernel == CudaPlan::Kernel::Warpgroup) {
      launch_warpgroup(params, maps, p.dtype, blocks, stream, first == 0 && (pdl || pdl_call));
    } else if (tensor_cores) {
      launch_mma(params, p.dtype, blocks, stream, params.wait_first);
    } else if (tf32) {
      launch_tf32(params, blocks, stream);
    } else {
      launch_simt(params, p.dtype, blocks, simt_smem, stream);
    }
    check_cuda(cudaGetLastError(), "the attention kernel launch");
  }
  // The merge pass waits for the attention kernel it follows (ours, in the same call) before it reads a
  // partial, so it is always launched to overlap that kernel's tail (sm_90): its launch latency passes while
  // the last blocks of the attention grid run.
  const bool merge_pdl = pdl_allowed && !plan.overrides.is_off("merge-pdl");
  if (plan.splits > 1 && !params.cluster_merge) {
    launch_merge(params, p.dtype, plan.row_block, stream, merge_pdl);
    check_cuda(cudaGetLastError(), "the split-k merge launch");
  } else if (plan.tail_pieces > 1) {
    // The split tail's row blocks: tail_pieces ranges each, their partials from the buffer's start.
    KernelParams tail = params;
    tail.splits = plan.tail_pieces;
    tail.div.splits = core::FastDivide(static_cast<std::uint32_t>(plan.tail_pieces));
    launch_merge(tail, p.dtype, plan.row_block, stream, merge_pdl, plan.tail_block);
    check_cuda(cudaGetLastError(), "the split tail's merge launch");
  }
}

void write_output_qk(const AttentionProblem& p, const AttentionArgs& a, bool after_softmax,
                     const std::int32_t* first_column, std::int64_t columns, void* out) {
  CudaPlan plan;
  plan.group = p.heads / p.kv_heads;
  plan.group_rows = plan.group * p.q_len;
  const KernelParams params = make_params(p, a, plan, nullptr);
  launch_output_qk(params, p.dtype, after_softmax, first_column, columns, out, static_cast<cudaStream_t>(a.stream));
  check_cuda(cudaGetLastError(), "the output_qk launch");
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p) { cudaFree(p); }

void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  check_cuda(cudaMemcpy(device_dst, host_src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

void synchronize() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace attnkit::cuda
