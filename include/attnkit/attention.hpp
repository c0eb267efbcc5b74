// The attention op: O = softmax(scale * Q K^T + mask) V, fused, for every batch entry and head.
//
// Plan, then run: `Attention` checks the problem once (shapes, layouts, options) and sizes the scratch;
// `run` checks the buffers (extents, overlap, key lengths) and only then writes. Any rejected input raises
// attnkit::Error naming the argument and the rule, and nothing is written.
#pragma once

#include <attnkit/dtype.hpp>
#include <attnkit/error.hpp>
#include <attnkit/layout.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnkit {

// What a query row with no visible key gives: NaN (what softmax over an all -inf row gives) or zeros.
enum class MaskedRows : std::uint8_t { Nan, Zero };

// How K or V is stored. A quantized cache is read in place and widened one key tile at a time (value =
// q * scale in float32); it is never dequantized whole. The rules live in src/core/kv_quant.hpp.
enum class KvType : std::uint8_t {
  Float,  // problem.dtype
  Int8,   // one int8 per value
  Int4,   // signed 4-bit values in [-8, 7], two per byte: byte = ((q[2i] + 8) & 0xF) | ((q[2i+1] + 8) << 4)
};
// Which scale a quantized value uses: one float32 for the tensor, or one per (kv head, channel).
enum class KvQuant : std::uint8_t { None, PerTensor, PerChannel };
struct KvStorage {
  KvType type = KvType::Float;
  KvQuant quant = KvQuant::None;  // None exactly when type is Float
};

// Where each sequence's rows are, for ragged (packed) batches and paged K/V caches. By default batch entry b has
// q_len queries and k_len keys, batch_stride apart. CPU, Reference and CUDA backends; the Vulkan backend on host
// buffers (float K/V: the scalar kernel, float16 the cooperative-matrix one where the device has it;
// vulkan::DeviceAttention refuses it by name).
struct SequenceLayout {
  // Ragged queries (flash-attn's varlen convention): sequence b's queries are rows cu_seqlens_q[b] ..
  // cu_seqlens_q[b + 1] - 1 of Q, O and lse (args.cu_seqlens_q: int32 [batch + 1], non-decreasing, each
  // sequence at most q_len rows, the last entry at most total_q). q_len is the longest sequence (max_seqlen_q);
  // the Q, O and lse layouts' batch_stride is not used. Rows past a sequence's queries are never written.
  bool ragged_q = false;
  std::int64_t total_q = 0;  // rows of packed Q, O and lse
  // Ragged keys: sequence b's keys are rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of K and V (their length
  // is its key length: not with has_key_lengths); k_len is the longest.
  bool ragged_k = false;
  std::int64_t total_k = 0;  // rows of packed K and V
  // Paged K/V: key j of sequence b is row j % page_size of page block_table[b * max_pages_per_seq + j /
  // page_size] (args.block_table: int32 [batch * max_pages_per_seq]; the entries a sequence's keys reach lie in
  // [0, num_pages), the others are not read). The K and V layouts' batch_stride is the page stride and their
  // row stride the step within a page ([num_pages, page_size, kv_heads, dim] or [num_pages, kv_heads,
  // page_size, dim]). Key lengths from has_key_lengths, else k_len (at most max_pages_per_seq * page_size).
  std::int64_t page_size = 0;  // 0: not paged
  std::int64_t num_pages = 0;
  std::int64_t max_pages_per_seq = 0;

  bool paged() const { return page_size > 0; }
  bool any() const { return ragged_q || ragged_k || paged(); }
};

struct AttentionProblem {
  std::int64_t batch = 1;
  std::int64_t heads = 1;
  std::int64_t kv_heads = 0;  // 0: same as heads. Query head h reads K/V head h / (heads / kv_heads).
  std::int64_t q_len = 0;
  std::int64_t k_len = 0;
  std::int64_t head_dim = 0;    // 1..256, of Q and K
  std::int64_t v_head_dim = 0;  // 0: same as head_dim. 1..256, of V and O
  std::optional<float> scale;   // default 1 / sqrt(head_dim)
  DType dtype = DType::f32;     // Q, K, V and O

  // Where each tensor's elements live: Q [b, h, i, :], K/V [b, kv_h, j, :], O [b, h, i, :].
  Layout q, k, v, o;

  // K and V storage (default: problem.dtype). Layouts of an Int4 tensor count values, two per byte: their
  // offset and strides must be even, so every row starts on a byte. Its buffer's `elements` counts values too.
  KvStorage k_storage, v_storage;

  // Additive mask [b, h, i, j] (row elements j contiguous); -inf hides a key. Broadcast by stride 0.
  bool has_mask = false;
  DType mask_dtype = DType::f32;  // float32, float16 or bfloat16, widened per element
  Layout mask;
  // Per-batch key lengths, int32[batch]: keys at or past length[b] are hidden.
  bool has_key_lengths = false;
  // Causal: query i sees key j when j <= i + offset; the offset defaults to k_len - q_len. With ragged or paged
  // sequences it is bottom-right per sequence (key length - query count: the last query sees every key) and
  // causal_offset must be left unset.
  bool causal = false;
  std::optional<std::int64_t> causal_offset;
  // Per-batch causal offsets, int32[batch] (needs causal): batch entry b uses offsets[b] instead of
  // causal_offset (sequences of a right-padded batch whose queries sit at different positions).
  bool has_causal_offsets = false;
  // Sliding window (needs causal): query i sees only the `window` keys ending at its causal limit.
  std::optional<std::int64_t> window;
  // Softcap c > 0: every scaled score s becomes c * tanh(s / c) before the mask is added.
  std::optional<float> softcap;
  // Head sink, float32[heads]: a logit that joins every row's softmax denominator only (not scaled, not
  // capped). A row with a sink and no visible key gives zeros.
  bool has_head_sink = false;

  MaskedRows masked_rows = MaskedRows::Nan;
  // Optional float32 log-sum-exp per row [b, h, i] (natural log of the denominator, in scaled-score units;
  // -inf for a row with no visible key).
  bool return_lse = false;
  Layout lse;

  // Ragged batches and paged K/V (default: neither).
  SequenceLayout sequences;

  // Work budget in estimated operations per launch (0: never cut). A cut call equals the whole call bit for bit.
  std::int64_t work_budget = 0;

  // Builds a problem whose tensors are all head-first and contiguous.
  static AttentionProblem head_first(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                     std::int64_t q_len, std::int64_t k_len, std::int64_t head_dim,
                                     DType dtype = DType::f32);
  // Same, positions-first ([batch, seq, heads, dim]: what projections leave).
  static AttentionProblem positions_first(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                          std::int64_t q_len, std::int64_t k_len, std::int64_t head_dim,
                                          DType dtype = DType::f32);
};

// A buffer and how many elements (of its own type) it holds from `data` on: every index a layout reaches
// must be below `elements`.
struct ConstBuffer {
  const void* data = nullptr;
  std::int64_t elements = 0;
};
struct MutableBuffer {
  void* data = nullptr;
  std::int64_t elements = 0;
};

struct AttentionArgs {
  ConstBuffer q, k, v;     // problem.dtype
  MutableBuffer o;         // problem.dtype
  ConstBuffer mask;        // problem.mask_dtype, when problem.has_mask
  // float32 dequantization scales of a quantized K / V: 1 value (PerTensor), or kv_heads * head_dim (K) /
  // kv_heads * v_head_dim (V) values indexed kv_head * dim + d (PerChannel).
  ConstBuffer k_scale, v_scale;
  ConstBuffer key_lengths; // int32[batch], when problem.has_key_lengths
  ConstBuffer head_sink;   // float32[heads], when problem.has_head_sink
  ConstBuffer causal_offsets;  // int32[batch], when problem.has_causal_offsets
  MutableBuffer lse;       // float32, when problem.return_lse
  // int32, when problem.sequences says (ragged_q, ragged_k, paged): [batch + 1], [batch + 1],
  // [batch * max_pages_per_seq].
  ConstBuffer cu_seqlens_q, cu_seqlens_k, block_table;
  // Optional int32[1]: the first batch entry whose key length is outside [0, k_len], or -1 (in the memory of the
  // backend: device memory on CUDA). On CUDA the lengths live on the device and run() never reads them back
  // (no host synchronisation: the call captures in a CUDA graph); such an entry sees no key (its rows are masked
  // rows) and is reported here. On the CPU, bad lengths are an Error before anything is written, and this is -1.
  MutableBuffer status;
  // Scratch of at least scratch_bytes(); null lets the op keep its own (allocated once, kept).
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
  // CUDA backend: the cudaStream_t to run on (null: the default stream). Ignored by CPU backends.
  void* stream = nullptr;
};

enum class Backend : std::uint8_t {
  Auto,       // CUDA when the buffers are device memory and the backend is built, else the CPU kernel
  Cpu,        // the tiled SIMD kernel on all cores
  Reference,  // float64, naive and obviously right: the oracle of the tests (slow)
  Cuda,
  Vulkan,     // any Vulkan 1.2 compute device (host buffers: uploaded, run, downloaded); attnkit/vulkan.hpp
};
std::string backend_name(Backend b);
// Backends this build can run now (Reference and Cpu always; Cuda when built and a device is present).
std::vector<Backend> available_backends();
// Whether one backend can run now: asks that backend only (available_backends() also probes for a Vulkan device,
// which loads the Vulkan driver).
bool backend_available(Backend b);

// Parts of the plan that a test or benchmark forces, to compare kernels, key splits or features on one problem in
// one process. The plan never needs them: it chooses from the problem and the device alone, and every forced
// variant computes the contract's result. The CUDA backend reads them (no environment variable steers it); the
// other backends check the names and otherwise ignore them. Text form, for the CLI and Python
// (parse_plan_overrides): "kernel=mma,splits=4,off=plain+cluster,persistent=7,heavy_group=5".
struct PlanOverrides {
  // A kernel of plan_kernel_names(). CUDA: it runs the problem wherever it accepts it (else the plan's own choice
  // runs; describe() names the kernel that does). Vulkan ("rows", "coopmat"): a kernel that cannot run the
  // problem is an Error. CPU ("bf16-dot"): the tiled kernel's vdpbf16ps scores for bfloat16 wherever the CPU has
  // AVX512_BF16 (the plan takes them where they pay: AMD cores), else the plan's own choice. "": the plan's choice.
  std::string kernel;
  std::int64_t splits = 0;  // key ranges of every problem the kernel may split (0: the plan's choice)
  std::vector<std::string> off;  // plan features left out (plan_feature_names(): "plain", "cluster", ...)
  std::int64_t persistent_blocks = 0;  // a persistent grid of this many blocks where that build runs (0: plan's)
  std::int64_t heavy_group = 0;  // causal heavy-first order: (batch, K/V head) pairs per group (0: plan's)

  bool is_off(const std::string& feature) const;
  bool empty() const;
  std::string to_string() const;  // the text form, parse_plan_overrides' inverse
};
// Throws Error("plan", ...) naming the unknown key, kernel or feature (and the ones there are).
PlanOverrides parse_plan_overrides(const std::string& text);
// The CUDA, Vulkan and CPU backends' kernels, and the plan features that `off` can leave out (each with what it does).
std::vector<std::string> plan_kernel_names();
std::vector<std::pair<std::string, std::string>> plan_features();

struct AttentionConfig {
  Backend backend = Backend::Auto;
  int threads = 0;  // CPU: worker threads, 0..1024 (0: all cores). The results do not depend on it.
  PlanOverrides plan;  // for tests and benchmarks only (see PlanOverrides)
};

class Attention {
 public:
  // Checks every shape, layout and option rule; throws Error naming the field and the rule.
  explicit Attention(const AttentionProblem& problem, const AttentionConfig& config = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // The problem with every default filled in (kv_heads, v_head_dim, scale, causal_offset).
  const AttentionProblem& problem() const;
  Backend backend() const;
  // Which kernel runs and why (e.g. "cpu.tiled split-k=8: 96 row blocks under 128").
  std::string describe() const;
  // Bytes of scratch run() needs when the caller passes it (0 when none is needed).
  std::size_t scratch_bytes() const;
  // Checks the buffers (null pointers, extents, overlap, key lengths), then computes O (and the LSE).
  // Thread safety: run() may be called on one object from many threads at once. Calls that pass their own
  // scratch (args.scratch, at least scratch_bytes(), one per call) run concurrently; calls that pass none share
  // the op's own scratch and take turns on it (a lock held for the run; on CUDA until the kernels are queued, so
  // such calls must be on one stream, or pass their own scratch). Moving or destroying the object while a run
  // is in flight is not allowed.
  void run(const AttentionArgs& args);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot form: plans and runs.
void attention(const AttentionProblem& problem, const AttentionArgs& args, const AttentionConfig& config = {});

}  // namespace attnkit
