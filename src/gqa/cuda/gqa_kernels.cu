// The GQA op's kernels besides attention (gqa_device.hpp): the cache moves and the fused pre-pass for any head
// size (a warp per head row, one value per lane at a time); gqa_prepass_vector.cu is the pre-pass of the usual
// head sizes with 16-byte lanes. Both compute what the CPU units compute (qk_norm.cpp, rotary.cpp,
// kv_cache.cpp) with the same operations in the same precision (gqa_rows.cuh): the RMS norm in float64, rotary
// products without contraction into FMAs, quantization as rint(x * (1 / scale)).
#include "gqa/cuda/gqa_device.hpp"
#include "gqa/cuda/gqa_rows.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace attnkit::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHead = 256;
constexpr int kPerLane = kMaxHead / 32;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// ---- cache moves ----

// Copies `bytes` from src to dst, 16 bytes at a time when both ends allow it. With `distance` > 0 the ranges
// may overlap (dst = src - distance): each pass reads at most `distance` bytes before any thread writes them.
__device__ void block_copy(std::byte* dst, const std::byte* src, std::int64_t bytes, std::int64_t distance) {
  const bool wide = (reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | bytes) % 16 == 0;
  const std::int64_t unit = wide ? 16 : 1;
  std::int64_t pass = unit * kThreads;
  if (distance > 0) pass = min64(pass, distance / unit * unit);
  if (pass <= 0) pass = unit;  // distance < 16 with wide copies cannot happen: rows are whole
  for (std::int64_t at = 0; at < bytes; at += pass) {
    const std::int64_t mine = at + threadIdx.x * unit;
    const bool in = threadIdx.x * unit < pass && mine < bytes;
    uint4 w{};
    std::byte b{};
    if (in) {
      if (wide) w = *reinterpret_cast<const uint4*>(src + mine);
      else b = src[mine];
    }
    if (distance > 0) __syncthreads();
    if (in) {
      if (wide) *reinterpret_cast<uint4*>(dst + mine) = w;
      else dst[mine] = b;
    }
    if (distance > 0) __syncthreads();
  }
}

__device__ void block_fill(std::byte* dst, std::int64_t bytes, unsigned char value) {
  for (std::int64_t i = threadIdx.x; i < bytes; i += kThreads) dst[i] = std::byte{value};
}

// blockIdx.x: (b, kv head); blockIdx.y: 0 key, 1 value.
__global__ void __launch_bounds__(kThreads) cache_move_kernel(const CacheMove m) {
  const std::int64_t bh = blockIdx.x;
  const std::int64_t b = bh / m.kv_heads;
  const bool is_key = blockIdx.y == 0;
  const DeviceCache& cache = is_key ? m.key : m.value;
  const std::byte* past = is_key ? m.past_key : m.past_value;
  const DeviceBatchRows r = m.rows[b];
  const std::int64_t rb = cache.row_bytes;
  std::byte* head = cache.data + bh * cache.capacity * rb;
  const std::int64_t kept = r.past_rows - r.drop;
  if (m.separate) {
    if (kept > 0 && past != nullptr) block_copy(head, past + (bh * m.past_capacity + r.drop) * rb, kept * rb, 0);
    const std::int64_t end = r.write_row + m.new_rows;
    block_fill(head + end * rb, (cache.capacity - end) * rb, cache.type == KvType::Int4 ? core::kInt4ZeroByte : 0);
  } else if (r.drop > 0 && kept > 0) {  // a full window cache: slide the kept rows to the front
    block_copy(head, head + r.drop * rb, kept * rb, r.drop * rb);
  }
}

// ---- the pre-pass ----

// blockIdx.x: a token (b, s). Its rows: Q heads (when q_out), then K heads, then V heads, a warp each.
template <class T>
__global__ void __launch_bounds__(kThreads) append_kernel(const AppendStep st) {
  __shared__ float row_smem[kWarps][kMaxHead];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t b = blockIdx.x / st.seq;
  const std::int64_t s = blockIdx.x % st.seq;
  const std::int64_t H = st.head_size;
  const DeviceBatchRows br = st.rows[b];
  const std::int64_t q_rows = st.q_out != nullptr ? st.heads : 0;
  const std::int64_t rows = q_rows + 2 * st.kv_heads;
  float* x = row_smem[warp];

  for (std::int64_t r = warp; r < rows; r += kWarps) {
    const bool is_q = r < q_rows;
    const bool is_k = !is_q && r < q_rows + st.kv_heads;
    const std::int64_t h = is_q ? r : (is_k ? r - q_rows : r - q_rows - st.kv_heads);
    const T* src = static_cast<const T*>(is_q ? st.query : is_k ? st.key : st.value) +
                   (is_q ? st.q_in : is_k ? st.k_in : st.v_in).index(b, h, s);
    float v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const std::int64_t d = lane + 32 * i;
      v[i] = d < H ? to_float(src[d]) : 0.0f;
    }
    const bool prepare = is_q || is_k;
    if (prepare && st.qk_norm) {
      // x * rsqrt(mean(x^2) + eps) * w, in float64 like the CPU unit.
      double squares = 0.0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) squares += static_cast<double>(v[i]) * v[i];
#pragma unroll
      for (int o = 16; o >= 1; o >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, o);
      const double inv_rms = 1.0 / sqrt(squares / static_cast<double>(H) + static_cast<double>(st.norm_epsilon));
      const T* w = static_cast<const T*>(is_q ? st.q_norm_weight : st.k_norm_weight);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const std::int64_t d = lane + 32 * i;
        if (d < H) v[i] = static_cast<float>(__dmul_rn(__dmul_rn(v[i], inv_rms), to_float(w[d])));
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const std::int64_t d = lane + 32 * i;
      if (d < H) x[d] = v[i];
    }
    __syncwarp();
    if (prepare && st.rotary) {
      const std::int64_t position = rotary_position(st, br, b, s);
      rotate_row_warp(x, static_cast<const T*>(st.cos_cache) + position * st.rotary_half,
                      static_cast<const T*>(st.sin_cache) + position * st.rotary_half, st.rotary_half, st.interleaved,
                      lane);
    }
    // Q' and the new K rows are tensors of the query's type (what a quantized cache quantizes).
    if (prepare) {
      for (std::int64_t d = lane; d < H; d += 32) x[d] = round_to<T>(x[d]);
      __syncwarp();
    }
    if (is_q) {
      T* dst = static_cast<T*>(st.q_out) + ((b * st.seq + s) * st.heads + h) * H;
      for (std::int64_t d = lane; d < H; d += 32) dst[d] = from_float<T>(x[d]);
    } else {
      const DeviceCache& cache = is_k ? st.key_cache : st.value_cache;
      std::byte* dst = cache.data + ((b * st.kv_heads + h) * cache.capacity + br.write_row + s) * cache.row_bytes;
      store_cache_row<T>(x, H, cache, h, dst, lane);
    }
    __syncwarp();
  }
}

}  // namespace

void launch_cache_move(const CacheMove& m, void* stream) {
  if (m.batch * m.kv_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(m.batch * m.kv_heads), 2);
  cache_move_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(m);
  check(cudaGetLastError(), "the cache move launch");
}

void launch_append(const AppendStep& s, void* stream) {
  if (s.batch * s.seq == 0) return;
  if (s.vector_allowed && prepass_vector_supports(s)) {
    launch_prepass_vector(s, stream);
    check(cudaGetLastError(), "the GQA pre-pass launch");
    return;
  }
  const auto grid = static_cast<unsigned>(s.batch * s.seq);
  auto st = static_cast<cudaStream_t>(stream);
  switch (s.dtype) {
    case DType::f32: append_kernel<float><<<grid, kThreads, 0, st>>>(s); break;
    case DType::f16: append_kernel<__half><<<grid, kThreads, 0, st>>>(s); break;
    case DType::bf16: append_kernel<__nv_bfloat16><<<grid, kThreads, 0, st>>>(s); break;
  }
  check(cudaGetLastError(), "the GQA pre-pass launch");
}

// ---- memory ----

// The pinned stage is a ring of a few slots, each with the event recorded after its last upload: a call waits
// only for the upload of the call kStageSlots - 1 before it, so the host may queue that many decode steps ahead
// of the GPU (with one slot, each call waited for the previous call's upload, which runs after the call before
// that: the host could never be more than a step ahead, and its time per call showed in the step's time).
//
// Small enough arrays skip the copy engine: they ride to the device as the parameters of a one-block kernel that
// stores them (a copy in the stream costs the step its own latency plus two waits between engines; a kernel
// before the pre-pass costs one kernel-to-kernel step). The host buffer is then free again once the launch
// returns (the parameters are copied at launch), so no slot waits. PlanOverrides' "upload-kernel" off keeps the copy.
template <int N>
struct UploadParams {
  std::byte* dst;
  std::uint32_t bytes;  // a multiple of 16, at most N
  alignas(16) unsigned char data[N];
};
template <int N>
__global__ void __launch_bounds__(256) upload_kernel(const __grid_constant__ UploadParams<N> p) {
  const auto* src = reinterpret_cast<const uint4*>(p.data);
  auto* dst = reinterpret_cast<uint4*>(p.dst);
  for (std::uint32_t i = threadIdx.x; i < p.bytes / 16; i += blockDim.x) dst[i] = src[i];
}
// Kernel parameters are limited to 32,764 bytes (CUDA 12.1+, Volta and later); smaller classes launch faster.
constexpr std::size_t kUploadClasses[] = {2048, 8192, 32512};
template <int N>
void launch_upload(void* device_dst, const std::byte* host, std::size_t bytes, cudaStream_t stream) {
  thread_local UploadParams<N> p;  // up to 32 KB: not on the stack
  p.dst = static_cast<std::byte*>(device_dst);
  p.bytes = static_cast<std::uint32_t>((bytes + 15) / 16 * 16);
  std::memcpy(p.data, host, bytes);
  upload_kernel<N><<<1, 256, 0, stream>>>(p);
  check(cudaGetLastError(), "the small-array upload launch");
}

struct DeviceWorkspace::State {
  static constexpr int kStageSlots = 4;
  void* device = nullptr;
  std::size_t device_bytes = 0;
  struct Slot {
    void* host = nullptr;
    std::size_t bytes = 0;
    cudaEvent_t uploaded = nullptr;  // recorded after the last upload from `host`
    bool pending = false;
  };
  Slot slots[kStageSlots];
  int current = 0;  // the slot stage() handed out, which upload() copies from
  std::vector<std::byte> params;  // the stage of an upload by kernel parameters
  bool by_params = false;         // what the last stage() handed out
  std::uint64_t generation = 0;   // counts the allocations of `device`
  // What the last upload_kept put where, and in which allocation of `device`.
  std::vector<std::byte> kept;
  void* kept_dst = nullptr;
  std::uint64_t kept_generation = 0;
  // Streams and graphs (begin_call).
  cudaStream_t last_stream = nullptr;
  cudaEvent_t last_done = nullptr;  // recorded at the end of the last call that ran (not captured)
  bool has_last = false;
  bool capturing = false;         // this call's stream is capturing a graph
  bool captured = false;          // some call was captured: a graph may hold `device` and rewrite the kept arrays
  std::vector<void*> retired;     // device buffers a graph may still use, freed with the workspace
};

DeviceWorkspace::DeviceWorkspace() : state_(std::make_unique<State>()) {}

DeviceWorkspace::~DeviceWorkspace() {
  for (State::Slot& slot : state_->slots) {
    if (slot.uploaded != nullptr) {
      cudaEventSynchronize(slot.uploaded);
      cudaEventDestroy(slot.uploaded);
    }
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
  if (state_->last_done != nullptr) cudaEventDestroy(state_->last_done);
  // Kernels of the last call may still read this memory: cudaFree waits for the device.
  if (state_->device != nullptr) cudaFree(state_->device);
  for (void* old : state_->retired) cudaFree(old);
}

bool DeviceWorkspace::begin_call(void* stream) {
  State& s = *state_;
  const auto st = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(st, &status), "cudaStreamIsCapturing");
  s.capturing = status != cudaStreamCaptureStatusNone;
  s.captured = s.captured || s.capturing;
  // A captured call runs at the graph's replays, which the caller orders; only a call that runs now waits.
  if (!s.capturing && s.has_last && s.last_stream != st) {
    check(cudaStreamWaitEvent(st, s.last_done, 0), "cudaStreamWaitEvent");
  }
  return s.capturing;
}

void DeviceWorkspace::end_call(void* stream) {
  State& s = *state_;
  if (s.capturing) return;
  if (s.last_done == nullptr) {
    check(cudaEventCreateWithFlags(&s.last_done, cudaEventDisableTiming), "cudaEventCreate");
  }
  const auto st = static_cast<cudaStream_t>(stream);
  check(cudaEventRecord(s.last_done, st), "cudaEventRecord");
  s.last_stream = st;
  s.has_last = true;
}

std::byte* DeviceWorkspace::device(std::size_t bytes) {
  if (bytes > state_->device_bytes) {
    if (state_->capturing) {
      throw Error("stream", "a CUDA graph capture cannot allocate the op's device memory (" + std::to_string(bytes) +
                                " bytes needed, " + std::to_string(state_->device_bytes) +
                                " held): run the same step once before capturing, on any stream");
    }
    if (state_->device != nullptr && state_->captured) {
      state_->retired.push_back(state_->device);  // a graph may still use it
    } else if (state_->device != nullptr) {
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the last call's kernels may use it
      check(cudaFree(state_->device), "cudaFree");
    }
    state_->device = nullptr;
    state_->device_bytes = 0;
    check(cudaMalloc(&state_->device, bytes), "cudaMalloc");
    state_->device_bytes = bytes;
    ++state_->generation;
  }
  return static_cast<std::byte*>(state_->device);
}

std::byte* DeviceWorkspace::stage(std::size_t bytes, bool by_kernel) {
  // A graph keeps kernel parameters; it would read a pinned slot only at its replays, after later calls refilled it.
  state_->by_params = state_->capturing || (by_kernel && bytes <= kUploadClasses[2]);
  if (state_->by_params) {
    if (state_->params.size() < bytes) state_->params.resize(bytes);
    return state_->params.data();
  }
  State::Slot& slot = state_->slots[state_->current];
  if (slot.pending) {
    check(cudaEventSynchronize(slot.uploaded), "cudaEventSynchronize");
    slot.pending = false;
  }
  if (bytes > slot.bytes) {
    if (slot.host != nullptr) check(cudaFreeHost(slot.host), "cudaFreeHost");
    slot.host = nullptr;
    slot.bytes = 0;
    check(cudaMallocHost(&slot.host, bytes), "cudaMallocHost");
    slot.bytes = bytes;
  }
  return static_cast<std::byte*>(slot.host);
}

void DeviceWorkspace::upload(void* device_dst, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  if (state_->by_params) {
    // In pieces of the largest class (only a capture stages more than that by parameters).
    for (std::size_t done = 0; done < bytes; done += kUploadClasses[2]) {
      const std::size_t n = std::min(bytes - done, kUploadClasses[2]);
      const std::byte* host = state_->params.data() + done;
      void* dst = static_cast<std::byte*>(device_dst) + done;
      if (n <= kUploadClasses[0]) launch_upload<kUploadClasses[0]>(dst, host, n, st);
      else if (n <= kUploadClasses[1]) launch_upload<kUploadClasses[1]>(dst, host, n, st);
      else launch_upload<kUploadClasses[2]>(dst, host, n, st);
    }
    return;
  }
  State::Slot& slot = state_->slots[state_->current];
  if (slot.uploaded == nullptr) {
    check(cudaEventCreateWithFlags(&slot.uploaded, cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaMemcpyAsync(device_dst, slot.host, bytes, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  check(cudaEventRecord(slot.uploaded, st), "cudaEventRecord");
  slot.pending = true;
  state_->current = (state_->current + 1) % State::kStageSlots;
}

void DeviceWorkspace::upload_kept(void* device_dst, const std::byte* host, std::size_t bytes, void* stream) {
  State& s = *state_;
  if (bytes == 0) {  // this call's own arrays may overwrite what an earlier call kept
    s.kept_dst = nullptr;
    return;
  }
  if (!s.captured && s.kept_dst == device_dst && s.kept_generation == s.generation && s.kept.size() == bytes &&
      std::memcmp(s.kept.data(), host, bytes) == 0) {
    return;
  }
  std::memcpy(stage(bytes), host, bytes);
  upload(device_dst, bytes, stream);
  s.kept.assign(host, host + bytes);
  s.kept_dst = device_dst;
  s.kept_generation = s.generation;
}

void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
}

}  // namespace attnkit::cuda
