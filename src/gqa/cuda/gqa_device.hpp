// The GQA op's device side (gqa_kernels.cu): the cache moves and the fused pre-pass (Q/K RMS norm, rotary, cache
// append with quantization) as kernels, and the memory the op keeps between calls. Compiled by the host compiler
// too (no CUDA types here); without CUDA in the build every function throws (cuda_backend_stub.cpp).
#pragma once

#include <attnkit/attention.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace attnkit::cuda {

// One KV cache tensor on the device: [batch][kv_heads][capacity] rows of row_bytes bytes.
struct DeviceCache {
  std::byte* data = nullptr;
  KvType type = KvType::Float;
  KvQuant quant = KvQuant::None;
  std::int64_t capacity = 0;
  std::int64_t row_bytes = 0;
  const float* scales = nullptr;  // device: 1 or kv_heads * head_size (quantized)
};

// Per batch entry, on the device: the append of one call (gqa_plan.hpp's BatchPlan).
struct DeviceBatchRows {
  std::int32_t past_rows;  // past rows holding tokens
  std::int32_t drop;       // of those, evicted from the front (a full window cache)
  std::int32_t write_row;  // present row of new token 0
  std::int32_t past;       // position of new token 0 (rotary without position_ids)
};

// Separate buffers: present rows [0, kept) = past rows [drop, past_rows), rows after the new ones zeroed.
// Shared buffer with drops: kept rows slide to the front in place.
struct CacheMove {
  bool separate = false;  // else a shared buffer (only its window slide moves rows)
  const std::byte* past_key = nullptr;  // separate buffers with a past; else null
  const std::byte* past_value = nullptr;
  std::int64_t past_capacity = 0;
  DeviceCache key, value;
  std::int64_t batch = 0, kv_heads = 0, new_rows = 0;
  const DeviceBatchRows* rows = nullptr;  // device
};
void launch_cache_move(const CacheMove& m, void* stream);

// The fused pre-pass over this call's tokens: each head row of Q (when q_out is set), K and V read from the
// inputs, normalised and rotated (Q and K, when on), rounded to the query's type, then Q' stored to q_out
// ([batch][seq][heads][head_size]) and K / V stored (quantized) at their cache rows.
struct AppendStep {
  DType dtype = DType::f32;
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_size = 0;
  const void* query = nullptr;
  const void* key = nullptr;
  const void* value = nullptr;
  Layout q_in, k_in, v_in;  // element layouts [b, head, s] of the inputs (packed or not)
  void* q_out = nullptr;    // null: Q is read in place by the attention (no norm, no rotary)
  bool rotary = false;
  bool interleaved = false;
  const void* cos_cache = nullptr;
  const void* sin_cache = nullptr;
  std::int64_t rotary_half = 0;
  const std::int64_t* position_ids = nullptr;  // device, or null
  std::int64_t position_row = 0;
  bool qk_norm = false;
  const void* q_norm_weight = nullptr;
  const void* k_norm_weight = nullptr;
  float norm_epsilon = 1e-6f;
  DeviceCache key_cache, value_cache;
  const DeviceBatchRows* rows = nullptr;  // device
  bool vector_allowed = true;  // false: the general kernel even where the vector one applies (PlanOverrides)
};
// Takes gqa_prepass_vector.cu's kernel where prepass_vector_supports says so, else the general one.
void launch_append(const AppendStep& s, void* stream);
// The pre-pass with 16-byte lanes: head sizes 8..256 that are powers of two, rotary halves a multiple of 8,
// inputs, Q' and cache rows on 16-byte (cache: 8 / 4-byte for int8 / int4) boundaries.
bool prepass_vector_supports(const AppendStep& s);
void launch_prepass_vector(const AppendStep& s, void* stream);

// Device memory the op keeps between calls, and a pinned host stage for the small per-call arrays (lengths,
// offsets, sinks, scales) so that a decode step uploads them without waiting for the stream.
class DeviceWorkspace {
 public:
  DeviceWorkspace();
  ~DeviceWorkspace();
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;

  // Starts a call on `stream` and says whether that stream is capturing a CUDA graph. A call on another stream
  // than the last one that ran (not captured) first waits, on the device, for that call's work: the memory is
  // shared. A capturing call must not allocate (device() throws) and uploads everything by kernel parameters, which
  // the graph keeps; once a call was captured, upload_kept uploads on every call (a replay rewrites those bytes)
  // and memory that has to grow is kept, not freed, until the workspace goes (a graph may still use it).
  bool begin_call(void* stream);
  // Ends the call begun on `stream` (records where the next call on another stream must wait).
  void end_call(void* stream);
  // A device buffer of at least `bytes` (256-byte aligned parts are the caller's business).
  std::byte* device(std::size_t bytes);
  // A host buffer of at least `bytes`, free to fill: up to 32,512 bytes a plain one (upload() passes it as
  // kernel parameters), else the next slot of a small pinned ring, once the last upload from that slot has run.
  // by_kernel: small arrays may ride as kernel parameters (false: always a copy; PlanOverrides "upload-kernel").
  std::byte* stage(std::size_t bytes, bool by_kernel = true);
  // Queues a copy of stage()[0, bytes) to `device_dst` on `stream` (a one-block kernel or a copy).
  void upload(void* device_dst, std::size_t bytes, void* stream);
  // The same for arrays that seldom change (scales, sinks): queued only when `host` differs from what the last
  // upload_kept put at `device_dst`, or the device buffer was allocated anew since. Uses the stage.
  void upload_kept(void* device_dst, const std::byte* host, std::size_t bytes, void* stream);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Copies device memory to the host in `stream`'s order and waits for it (the op's checks read small device
// inputs this way, after whatever the caller queued to produce them).
void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes, void* stream);

}  // namespace attnkit::cuda
