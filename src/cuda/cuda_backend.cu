// The CUDA backend's host side: device discovery, the plan (kernel, key split, scratch), the launch sequence
// (key-length check, main kernel in work-budget cuts, merge pass) and error reporting.
#include "cuda_backend.hpp"
#include "kernel_launchers.hpp"

#include "../core/work_rounds.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace attnkit::cuda {
namespace {

constexpr std::int64_t kRowBlock = 64;
constexpr std::int64_t kSplitGranule = 64;   // key ranges are multiples of every kernel's key tile
constexpr std::int64_t kMinSplitKeys = 256;  // shorter ranges cost more in the merge than they gain
// Many-row shapes (prefill) on tensor cores split a key range only when it is long: the partials of every row
// are written and merged. On the H200 a 512-key BERT layer ran 13.1 us whole and 22.5 us in two ranges with 96
// blocks (mma.sync), 12.1 and 23.4 us with 48 (wgmma), bench/sweep_cuda.py. The SIMT kernel (float32), slower
// per block, still gains from the split there (132 against 199 us).
constexpr std::int64_t kMinTileSplitKeys = 2048;
constexpr std::int64_t kMaxSplits = 64;
constexpr std::int64_t kFloatDecodeRows = 8;       // rows per K/V head up to which a float cache decodes
constexpr std::int64_t kQuantizedDecodeRows = 64;  // likewise for a quantized cache
constexpr std::size_t kFlagBytes = 256;      // the key-length check's flag, at the start of scratch

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The tensor-core kernel copies rows in 16-byte chunks: every row of Q, K and V must start on 16 bytes.
bool layout_aligned16(const Layout& l) {
  constexpr std::int64_t kElems = 8;  // 16 bytes of a 2-byte type
  return l.offset % kElems == 0 && l.batch_stride % kElems == 0 && l.head_stride % kElems == 0 &&
         l.row_stride % kElems == 0;
}
bool pointer_aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

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

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
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
  k.rule = core::VisibilityRule{p.causal, *p.causal_offset, p.window.value_or(0)};
  const bool heavy_first = p.causal && plan.row_blocks > 1 && env_value("ATTNKIT_CUDA_BLOCK_ORDER") != "index";
  std::int64_t heavy_group = 0;
  if (heavy_first) {
    // Pairs whose K and V fill at most a sixth of L2: blocks in flight of one pair are at different keys, and Q
    // and O stream through too. On the H200 (60 MiB of L2, 2 MiB pairs of a 4k prompt) that is 5 pairs: the
    // 64-head 4k causal case ran in 688 us (groups of 4: 682, of 15 (a half of L2): 703, of all 64: 756, index
    // order: 706; bench/results/2026-11-30-h200-heavy-first-ab.md). ATTNKIT_CUDA_HEAVY_GROUP=n sets the group.
    const auto row_bytes = [&](const KvStorage& s, std::int64_t dim) -> std::int64_t {
      if (s.type == KvType::Int4) return (dim + 1) / 2;
      return s.type == KvType::Int8 ? dim : dim * static_cast<std::int64_t>(dtype_size(p.dtype));
    };
    const std::int64_t pair_bytes = std::max<std::int64_t>(
        p.k_len * (row_bytes(p.k_storage, p.head_dim) + row_bytes(p.v_storage, p.v_head_dim)), 1);
    const std::string forced = env_value("ATTNKIT_CUDA_HEAVY_GROUP");
    heavy_group = forced.empty() ? device_attribute(cudaDevAttrL2CacheSize) / 6 / pair_bytes
                                 : std::atoll(forced.c_str());
  }
  set_block_order(k, heavy_first, heavy_group);
  k.transform = core::ScoreTransform{*p.scale, p.softcap.value_or(0.0f)};
  k.has_mask = p.has_mask;
  k.has_key_lengths = p.has_key_lengths;
  k.has_sink = p.has_head_sink;
  k.return_lse = p.return_lse;
  k.masked_rows = p.masked_rows;
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

// The decode kernel reads a lane's 16 values of a row with 16-byte (int4: 8-byte) loads.
bool decode_aligned(const Layout& l, KvType type, DType dtype) {
  const std::int64_t m = decode_value_alignment(type, dtype);
  return l.offset % m == 0 && l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
}

// The tensor-core kernel copies rows in 16-byte chunks (of the element type, or of int8 / int4 values).
bool mma_aligned(const Layout& l, KvType type) {
  if (type == KvType::Float) return layout_aligned16(l);
  const std::int64_t m = type == KvType::Int8 ? 16 : 32;
  return l.offset % m == 0 && l.batch_stride % m == 0 && l.head_stride % m == 0 && l.row_stride % m == 0;
}

// Switches for benchmarks and tests that compare kernels or key splits on the same shapes (the test suite's
// small shapes would otherwise rarely reach some kernels), not tuning knobs; read at every plan so that one
// process can compare them:
//   ATTNKIT_CUDA_DECODE=0 / ATTNKIT_CUDA_WGMMA=0 keep the decode / wgmma kernel out of every plan;
//   ATTNKIT_CUDA_WGMMA=all puts the wgmma kernel on every shape it supports;
//   ATTNKIT_CUDA_KERNEL=simt|mma|wgmma|decode|tf32|decode-mma takes that kernel wherever it supports the shape;
//   ATTNKIT_CUDA_DECODE_MMA=0 keeps the decode-mma kernel out of every plan;
//   ATTNKIT_CUDA_TF32=0 keeps float32 off the tensor cores (the SIMT kernel runs it);
//   ATTNKIT_CUDA_QUERY_ROTARY=0 leaves the GQA op's rotary of Q to its pre-pass (rotates_query says no);
//   ATTNKIT_CUDA_PDL=0 launches every kernel after the previous one has finished (no programmatic overlap);
//   ATTNKIT_CUDA_MERGE_PDL=0 does so for the split-K merge pass only;
//   ATTNKIT_CUDA_SPLITS=n splits every key range n ways (at most k_len / 64; the decode kernel's range limit
//   still holds);
//   ATTNKIT_CUDA_BLOCK_ORDER=index runs causal row blocks in index order (not heavy-first, block_coord);
//   ATTNKIT_CUDA_HEAVY_GROUP=n orders n (batch, K/V head) pairs together in the heavy-first order.

// allow_special: the decode and wgmma kernels may be chosen (both need 16-byte-aligned base pointers, which
// only the run sees; the run falls back to the plan without them).
CudaPlan::Kernel choose_kernel(const AttentionProblem& p, std::int64_t group_rows, std::int64_t sms,
                               bool allow_special) {
  const bool quantized = p.k_storage.type != KvType::Float || p.v_storage.type != KvType::Float;
  const bool decode_ok = allow_special && decode_supports(p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
                         decode_aligned(p.k, p.k_storage.type, p.dtype) &&
                         decode_aligned(p.v, p.v_storage.type, p.dtype);
  const bool warpgroup_ok =
      allow_special && warpgroup_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
      layout_aligned16(p.q) && mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type) &&
      device_is_sm90();
  const bool mma_ok = mma_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
                      layout_aligned16(p.q) && mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type);
  // float32 rows on 16 bytes: 4 floats.
  const auto aligned4 = [](const Layout& l) {
    return l.offset % 4 == 0 && l.batch_stride % 4 == 0 && l.head_stride % 4 == 0 && l.row_stride % 4 == 0;
  };
  const bool tf32_ok = tf32_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type) &&
                       aligned4(p.q) && aligned4(p.k) && aligned4(p.v);
  const bool decode_mma_ok = allow_special &&
                             decode_mma_supports(p.dtype, p.head_dim, p.v_head_dim, p.k_storage.type, p.v_storage.type,
                                                 p.has_mask) &&
                             mma_aligned(p.k, p.k_storage.type) && mma_aligned(p.v, p.v_storage.type);
  const std::string forced = env_value("ATTNKIT_CUDA_KERNEL");
  if (forced == "decode-mma" && decode_mma_ok) return CudaPlan::Kernel::DecodeMma;
  if (forced == "tf32" && tf32_ok) return CudaPlan::Kernel::Tf32;
  if (forced == "wgmma" && warpgroup_ok) return CudaPlan::Kernel::Warpgroup;
  if (forced == "mma" && mma_ok) return CudaPlan::Kernel::TensorCore;
  if (forced == "decode" && decode_ok) return CudaPlan::Kernel::Decode;
  if (forced == "simt") return CudaPlan::Kernel::Simt;
  // Few rows per K/V head: the work is streaming the cache, which the decode kernel does at full width (a
  // 64-row tile would leave most of its rows empty). A quantized cache takes it up to 64 rows (a prompt chunk)
  // since the other kernels dequantize value by value.
  // Tensor cores first wherever they apply: even a decode step with 4 of a tile's 64 rows used reads the cache
  // faster through them than the CUDA-core decode kernel, whose 8 multiply-adds per K/V element (4 rows)
  // leave it compute-bound (docs/benchmarks.md).
  // On Hopper, shapes with more than one 64-row tile per K/V head (prefill) take the wgmma kernel when its
  // grid (one 128-row block per SM at a time) fills its last wave to 80% or more, or is one wave of a quarter of
  // the SMs or more: a grid just past a whole number of waves (whisper's 144 blocks on 132 SMs) runs faster as
  // the mma.sync kernel's smaller blocks, two or more per SM, while a grid of one partial wave does not (BERT's
  // 96 blocks of 128 keys: 7.0 against 7.4 us; 48 blocks of 512 keys: 11.9 against 13.1 us), unless it is
  // tiny (12 blocks of 128 keys: 6.4 against 5.7 us, twice the blocks on twice the SMs; bench/sweep_cuda.py).
  // A few rows per K/V head over a long cache (a decode step) take it too: its TMA ring keeps more of the cache
  // in flight per SM than the mma.sync kernel's two cp.async stages (4.0 against 3.7 TB/s on the H200's
  // Llama decode shapes, bench/sweep_cuda.py); a short cache (whisper's 448 keys) stays with mma.sync.
  const std::string warpgroup_switch = env_value("ATTNKIT_CUDA_WGMMA");
  // A quantized cache under a decode step's few rows: the keys on the MMA's M side, so that the tensor-core work
  // follows the keys, not 16 or 64 padded rows (the wgmma kernel's int8 step took as long as its float16 one).
  // ATTNKIT_CUDA_WGMMA=all leaves it to the wgmma kernel (the tests run that kernel on these shapes so).
  if (decode_mma_ok && quantized && group_rows <= 2 * kDecodeMmaRows && warpgroup_switch != "all" &&
      env_value("ATTNKIT_CUDA_DECODE_MMA") != "0") {
    return CudaPlan::Kernel::DecodeMma;
  }
  const std::int64_t warpgroup_blocks = p.batch * p.kv_heads * ceil_div(group_rows, kWarpgroupRows);
  const bool whole_waves =
      (warpgroup_blocks <= sms && warpgroup_blocks * 4 >= sms) ||
      warpgroup_blocks * 5 >= ceil_div(warpgroup_blocks, sms) * sms * 4;
  const bool long_stream = group_rows <= 16 && p.batch * p.kv_heads * p.k_len >= sms * 4096;
  // A quantized cache runs the wgmma kernel's 64-row blocks on one consumer warpgroup (the other converts its
  // tiles): a decode step's way, not a prefill's.
  const bool warpgroup_wanted =
      warpgroup_switch == "all" ||
      (warpgroup_switch != "0" && ((!quantized && group_rows > kRowBlock && whole_waves) || long_stream));
  if (warpgroup_ok && warpgroup_wanted) return CudaPlan::Kernel::Warpgroup;
  if (mma_ok) return CudaPlan::Kernel::TensorCore;
  if (decode_ok && env_value("ATTNKIT_CUDA_DECODE") != "0" &&
      group_rows <= (quantized ? kQuantizedDecodeRows : kFloatDecodeRows)) {
    return CudaPlan::Kernel::Decode;
  }
  // float32 beyond a decode step's few rows: on the tensor cores at float32 accuracy.
  if (tf32_ok && env_value("ATTNKIT_CUDA_TF32") != "0") return CudaPlan::Kernel::Tf32;
  return CudaPlan::Kernel::Simt;
}

// The blocks of `kernel` one SM holds at once (its occupancy at the plan's shared memory).
int resident_blocks(CudaPlan::Kernel kernel, const AttentionProblem& p) {
  switch (kernel) {
    case CudaPlan::Kernel::TensorCore: return mma_resident_blocks(p.dtype, p.head_dim, p.k_storage.type);
    case CudaPlan::Kernel::Decode: return decode_resident_blocks(p.dtype, p.k_storage.type);
    case CudaPlan::Kernel::DecodeMma: return decode_mma_resident_blocks(p.dtype, p.head_dim, p.k_storage.type);
    case CudaPlan::Kernel::Warpgroup: return 1;
    case CudaPlan::Kernel::Simt:
    case CudaPlan::Kernel::Tf32: break;
  }
  return 2;
}

CudaPlan plan_for(const AttentionProblem& p, bool allow_special) {
  CudaPlan plan;
  plan.sm_count = device_attribute(cudaDevAttrMultiProcessorCount);
  plan.group = p.heads / p.kv_heads;
  plan.group_rows = plan.group * p.q_len;
  plan.kernel = choose_kernel(p, plan.group_rows, plan.sm_count, allow_special);
  const bool decode = plan.kernel == CudaPlan::Kernel::Decode;
  const bool warpgroup = plan.kernel == CudaPlan::Kernel::Warpgroup;
  plan.head_dim_tile = plan.kernel == CudaPlan::Kernel::TensorCore || warpgroup ? static_cast<int>(p.head_dim) : 0;
  const bool decode_mma = plan.kernel == CudaPlan::Kernel::DecodeMma;
  plan.row_block = decode       ? kDecodeRows
                   : decode_mma ? kDecodeMmaRows
                   : warpgroup  ? warpgroup_rows(p.k_storage.type)
                                : kRowBlock;
  plan.row_blocks = ceil_div(plan.group_rows, plan.row_block);
  const std::int64_t base_blocks = p.batch * p.kv_heads * plan.row_blocks;
  plan.split_keys = std::max<std::int64_t>(p.k_len, 1);
  // Split long key ranges when the row blocks alone would not fill the GPU twice over (the tile kernels). The decode
  // kernel also holds a whole range's scores in shared memory: its ranges are at most kDecodeMaxKeys long.
  // Few rows per K/V head (a decode step): the work is streaming the cache, so the split count is chosen for
  // whole rounds of resident blocks (core::parts_for_full_rounds).
  const std::int64_t sms = plan.sm_count;
  std::int64_t most = std::min(std::max<std::int64_t>(p.k_len / kMinSplitKeys, 1), kMaxSplits);
  // A few-row grid that ranges of kMinSplitKeys would still leave mostly idle (a single decoder step: Whisper's
  // 12 heads over 448 or 1500 keys) splits down to single tiles: its merge is a few rows, and each block's
  // chain of dependent tile loads is what the step waits for (448 keys: 9.8 us whole, 7.7 us in 7 ranges;
  // 1500 keys: 11.3 us in 5 ranges, 10.2-10.5 us in 8-24; bench/sweep_cuda.py).
  if (plan.group_rows <= 16 && base_blocks * most * 2 <= sms) {
    most = std::min(std::max<std::int64_t>(p.k_len / kSplitGranule, 1), kMaxSplits);
  }
  std::int64_t want = 1;
  if (plan.group_rows <= 16 && base_blocks > 0) {
    const std::int64_t resident = sms * resident_blocks(plan.kernel, p);
    const std::int64_t least = decode ? std::min(ceil_div(p.k_len, kDecodeMaxKeys), kMaxSplits) : 1;
    want = core::parts_for_full_rounds(base_blocks, resident, least, std::max(least, most));
  } else if (base_blocks > 0 && base_blocks < 2 * sms && p.k_len >= 2 * kMinSplitKeys &&
             (plan.kernel == CudaPlan::Kernel::Simt || p.k_len >= 2 * kMinTileSplitKeys ||
              (2 * base_blocks <= sms && p.k_len >= kMinTileSplitKeys))) {
    want = std::min(ceil_div(2 * sms, base_blocks), most);
  }
  if (decode) want = std::max(want, ceil_div(p.k_len, kDecodeMaxKeys));
  const std::string forced_splits = env_value("ATTNKIT_CUDA_SPLITS");
  if (!forced_splits.empty()) {
    const std::int64_t n = std::max<std::int64_t>(std::atoll(forced_splits.c_str()), 1);
    want = std::max(std::min(n, std::max<std::int64_t>(p.k_len / kSplitGranule, 1)),
                    decode ? ceil_div(p.k_len, kDecodeMaxKeys) : 1);
  }
  if (want > 1) {
    plan.split_keys = ceil_div(ceil_div(p.k_len, want), kSplitGranule) * kSplitGranule;
    plan.splits = ceil_div(p.k_len, plan.split_keys);
  }
  plan.blocks = base_blocks * plan.splits;
  plan.smem_bytes = plan.kernel == CudaPlan::Kernel::Tf32         ? tf32_smem_bytes(p.head_dim)
                    : plan.kernel == CudaPlan::Kernel::TensorCore ? mma_smem_bytes(p.head_dim, p.k_storage.type)
                    : decode                                    ? decode_smem_bytes()
                    : decode_mma                                ? decode_mma_smem_bytes(p.head_dim, p.k_storage.type)
                    : warpgroup                                 ? warpgroup_smem_bytes(p.head_dim, p.k_storage.type)
                                                                : simt_smem_bytes(p.head_dim, p.v_head_dim);
  plan.partial_bytes =
      plan.splits > 1
          ? static_cast<std::size_t>(plan.blocks * plan.row_block * (3 + p.v_head_dim)) * sizeof(float)
          : 0;
  plan.scratch_bytes = (p.has_key_lengths || plan.partial_bytes > 0) ? kFlagBytes + plan.partial_bytes : 0;
  return plan;
}

}  // namespace

CudaPlan plan(const AttentionProblem& p) {
  if (!available()) throw Error("config.backend", "no CUDA device is present");
  CudaPlan plan = plan_for(p, true);
  if (plan.kernel == CudaPlan::Kernel::Decode || plan.kernel == CudaPlan::Kernel::Warpgroup ||
      plan.kernel == CudaPlan::Kernel::DecodeMma) {
    // Rows that do not start on the decode / wgmma kernel's load width (an odd base pointer, seen only at run
    // time) take the mma.sync / SIMT plan instead: the scratch covers both.
    plan.scratch_bytes = std::max(plan.scratch_bytes, plan_for(p, false).scratch_bytes);
  }
  return plan;
}

std::string describe(const CudaPlan& plan) {
  const char* kernel = plan.kernel == CudaPlan::Kernel::Simt        ? "simt"
                       : plan.kernel == CudaPlan::Kernel::Tf32      ? "tf32"
                       : plan.kernel == CudaPlan::Kernel::Decode    ? "decode"
                       : plan.kernel == CudaPlan::Kernel::DecodeMma ? "decode-mma"
                       : plan.kernel == CudaPlan::Kernel::Warpgroup ? "wgmma"
                                                                    : "tensor-core";
  std::string s = std::string("cuda.") + kernel + " " +
                  std::to_string(plan.blocks) + " blocks of " + std::to_string(plan.row_block) + " rows, " +
                  std::to_string(plan.smem_bytes) + " B shared, " + std::to_string(plan.sm_count) + " SMs";
  if (plan.splits > 1) {
    s += ", split-k " + std::to_string(plan.splits) + " x " + std::to_string(plan.split_keys) + " keys";
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
    return decode_fits && pointer_aligned16(a.q.data) &&
           warpgroup_maps(make_params(p, a, chosen, nullptr), p.dtype, maps);
  }
  return true;
}

}  // namespace

bool rotates_query(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& plan, const QueryRotary& rotary) {
  WarpgroupMaps maps{};
  return env_value("ATTNKIT_CUDA_QUERY_ROTARY") != "0" && plan.kernel == CudaPlan::Kernel::Warpgroup &&
         query_rotary_loads_chunks(rotary, dtype_size(p.dtype)) && special_kernel_runs(p, a, plan, maps);
}

void run(const AttentionProblem& p, const AttentionArgs& a, const CudaPlan& chosen, void* scratch,
         bool check_key_lengths, const QueryRotary* rotary, bool overlap_previous) {
  auto stream = static_cast<cudaStream_t>(a.stream);
  auto* flag = static_cast<int*>(scratch);
  WarpgroupMaps maps{};
  const bool falls_back = !special_kernel_runs(p, a, chosen, maps);
  const CudaPlan plan = falls_back ? plan_for(p, false) : chosen;
  if (rotary != nullptr && (plan.kernel != CudaPlan::Kernel::Warpgroup ||
                            !query_rotary_loads_chunks(*rotary, dtype_size(p.dtype)))) {
    throw RuntimeError("a query rotary reached a CUDA plan that cannot apply it (" + describe(plan) + ")");
  }
  float* partial = plan.partial_bytes > 0 ? reinterpret_cast<float*>(static_cast<char*>(scratch) + kFlagBytes) : nullptr;
  if (check_key_lengths && p.has_key_lengths && p.batch > 0) {
    // The lengths live on the device: check them there, before any output is written.
    launch_check_key_lengths(static_cast<const std::int32_t*>(a.key_lengths.data), p.batch, p.k_len, flag, stream);
    check_cuda(cudaGetLastError(), "the key-length check launch");
    int bad = -1;
    check_cuda(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (bad >= 0) {
      std::int32_t value = 0;
      check_cuda(cudaMemcpy(&value, static_cast<const std::int32_t*>(a.key_lengths.data) + bad, sizeof(value),
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
      throw Error("key_lengths[" + std::to_string(bad) + "]",
                  "= " + std::to_string(value) + " is outside [0, k_len = " + std::to_string(p.k_len) + "]");
    }
  }
  if (plan.blocks == 0) return;
  KernelParams params = make_params(p, a, plan, partial);
  if (rotary != nullptr) params.rotary = *rotary;
  // The work budget cuts the grid into launches of whole blocks; every block computes the same bits wherever
  // it lands, so a cut call equals the whole call.
  const std::int64_t block_cost = 4 * plan.row_block * plan.split_keys * p.head_dim;
  const std::int64_t per_launch =
      p.work_budget > 0 ? std::max<std::int64_t>(1, p.work_budget / std::max<std::int64_t>(block_cost, 1)) : plan.blocks;
  // Rows that do not start on 16 bytes (an odd base pointer) take the SIMT kernel; the plan assumed aligned ones.
  const bool aligned = pointer_aligned16(a.q.data) && pointer_aligned16(a.k.data) && pointer_aligned16(a.v.data);
  const bool tensor_cores = plan.kernel == CudaPlan::Kernel::TensorCore && aligned;
  const bool tf32 = plan.kernel == CudaPlan::Kernel::Tf32 && aligned;
  const std::size_t simt_smem = simt_smem_bytes(p.head_dim, p.v_head_dim);
  // Programmatic dependent launches (sm_90), where the caller says its previous kernel allows them (the GQA op's
  // pre-pass): the wgmma kernel after it, and the merge pass after that kernel. (Plain attention calls keep
  // ordinary launches: nothing of theirs is known to precede them, and they are what the benchmarks capture in
  // CUDA graphs.) Not for the decode-mma kernel: on the H200 its int8 steps took 297.5 / 172.5 µs with them
  // and 261.3 / 169.2 µs without (batch 64 x 4k / batch 8 x 32k), while the wgmma steps gained 0-2%.
  const bool pdl = env_value("ATTNKIT_CUDA_PDL") != "0" && overlap_previous &&
                   plan.kernel == CudaPlan::Kernel::Warpgroup;
  for (std::int64_t first = 0; first < plan.blocks; first += per_launch) {
    params.first_block = first;
    params.inputs_ready = !(first == 0 && pdl);
    const std::int64_t blocks = std::min(per_launch, plan.blocks - first);
    if (plan.kernel == CudaPlan::Kernel::Decode) {
      launch_decode(params, p.dtype, blocks, stream);
    } else if (plan.kernel == CudaPlan::Kernel::DecodeMma) {
      launch_decode_mma(params, p.dtype, blocks, stream);
    } else if (plan.kernel == CudaPlan::Kernel::Warpgroup) {
      launch_warpgroup(params, maps, p.dtype, blocks, stream, first == 0 && pdl);
    } else if (tensor_cores) {
      launch_mma(params, p.dtype, blocks, stream);
    } else if (tf32) {
      launch_tf32(params, blocks, stream);
    } else {
      launch_simt(params, p.dtype, blocks, simt_smem, stream);
    }
    check_cuda(cudaGetLastError(), "the attention kernel launch");
  }
  if (plan.splits > 1) {
    // The merge pass waits for the attention kernel it follows (ours, in the same call) before it reads a
    // partial, so it is always launched to overlap that kernel's tail (sm_90): its launch latency passes while
    // the last blocks of the attention grid run.
    const bool merge_pdl = env_value("ATTNKIT_CUDA_PDL") != "0" && env_value("ATTNKIT_CUDA_MERGE_PDL") != "0" &&
                           device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
    launch_merge(params, p.dtype, plan.row_block, stream, merge_pdl);
    check_cuda(cudaGetLastError(), "the split-k merge launch");
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
