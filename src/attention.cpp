// The attention op's front door: normalises and checks the problem, picks the backend, owns the scratch
// when the caller gives none, and checks every buffer before a backend writes anything.
#include <attnkit/attention.hpp>

#include "core/problem_check.hpp"
#include "cpu/reference.hpp"
#include "cpu/tiled_kernel.hpp"
#include "cuda/host/cuda_backend.hpp"
#include "vulkan/vulkan_backend.hpp"

#include <omp.h>

#include <array>
#include <mutex>
#include <cstdint>
#include <utility>
#include <vector>

namespace attnkit {

namespace {
constexpr std::size_t kScratchAlign = 64;

AttentionProblem dense_problem(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t q_len,
                               std::int64_t k_len, std::int64_t head_dim, DType dtype, bool positions_first) {
  AttentionProblem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads == 0 ? heads : kv_heads;
  p.q_len = q_len;
  p.k_len = k_len;
  p.head_dim = head_dim;
  p.dtype = dtype;
  auto make = positions_first ? Layout::positions_first : Layout::head_first;
  p.q = make(heads, q_len, head_dim);
  p.k = make(p.kv_heads, k_len, head_dim);
  p.v = make(p.kv_heads, k_len, head_dim);
  p.o = make(heads, q_len, head_dim);
  p.lse = Layout::rows_only(heads, q_len);
  return p;
}
}  // namespace

AttentionProblem AttentionProblem::head_first(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                              std::int64_t q_len, std::int64_t k_len, std::int64_t head_dim,
                                              DType dtype) {
  return dense_problem(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, false);
}

AttentionProblem AttentionProblem::positions_first(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                                   std::int64_t q_len, std::int64_t k_len, std::int64_t head_dim,
                                                   DType dtype) {
  return dense_problem(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, true);
}

std::string backend_name(Backend b) {
  switch (b) {
    case Backend::Auto: return "auto";
    case Backend::Cpu: return "cpu";
    case Backend::Reference: return "reference";
    case Backend::Cuda: return "cuda";
    case Backend::Vulkan: return "vulkan";
  }
  return "?";
}

bool backend_available(Backend b) {
  switch (b) {
    case Backend::Cuda: return cuda::available();
    case Backend::Vulkan: return vulkan::available();
    default: return true;
  }
}

std::vector<Backend> available_backends() {
  std::vector<Backend> b{Backend::Cpu, Backend::Reference};
  if (cuda::available()) b.push_back(Backend::Cuda);
  if (vulkan::available()) b.push_back(Backend::Vulkan);
  return b;
}

struct Attention::Impl {
  AttentionProblem problem;
  Backend backend = Backend::Cpu;
  cpu::TiledPlan plan;
  cuda::CudaPlan cuda_plan;
  PlanOverrides overrides;
  std::shared_ptr<vulkan::Session> vulkan_session;
  // The op's own scratch, for runs that pass none; `own_scratch_lock` is held for the whole of such a run, so
  // concurrent runs on one object take turns on it (runs with their own scratch share nothing and run at once).
  std::mutex own_scratch_lock;
  std::vector<std::byte> own_scratch;  // CPU: kept between runs when the caller passes no scratch
  void* own_device_scratch = nullptr;  // CUDA: likewise, in device memory
  std::size_t own_device_bytes = 0;
  ~Impl() {
    if (own_device_scratch != nullptr) cuda::device_free(own_device_scratch);
  }
};

namespace {
// Every buffer of a call, by argument name (for the checks of where they live).
std::array<std::pair<const char*, const void*>, 16> named_buffers(const AttentionArgs& a) {
  return {{{"q", a.q.data},
           {"k", a.k.data},
           {"v", a.v.data},
           {"o", a.o.data},
           {"mask", a.mask.data},
           {"key_lengths", a.key_lengths.data},
           {"head_sink", a.head_sink.data},
           {"causal_offsets", a.causal_offsets.data},
           {"k_scale", a.k_scale.data},
           {"v_scale", a.v_scale.data},
           {"lse", a.lse.data},
           {"status", a.status.data},
           {"cu_seqlens_q", a.cu_seqlens_q.data},
           {"cu_seqlens_k", a.cu_seqlens_k.data},
           {"block_table", a.block_table.data},
           {"scratch", a.scratch}}};
}

// A host backend handed device memory would fault: say so instead.
void reject_device_pointers(const AttentionArgs& a) {
  for (const auto& [name, ptr] : named_buffers(a)) {
    if (cuda::is_device_pointer(ptr)) throw Error(name, "is CUDA device memory: run it with Backend::Cuda");
  }
}

// The CUDA backend's kernels read every buffer on the device: a host pointer is refused by name (a kernel would
// fault on it, after the output may have been partly written).
void require_device_pointers(const AttentionArgs& a) {
  for (const auto& [name, ptr] : named_buffers(a)) {
    if (ptr != nullptr && !cuda::is_device_pointer(ptr)) {
      throw Error(name, "is host memory: the CUDA backend reads CUDA device (or managed) memory only");
    }
  }
}
// The names of a PlanOverrides set in C++ (not parsed from text): the parse of its text form checks them.
void check_plan_overrides(const PlanOverrides& o) {
  if (o.splits < 0) throw Error("config.plan.splits", "must be >= 0 (0: the plan's choice)");
  if (o.persistent_blocks < 0) throw Error("config.plan.persistent_blocks", "must be >= 0 (0: the plan's choice)");
  if (o.heavy_group < 0) throw Error("config.plan.heavy_group", "must be >= 0 (0: the plan's choice)");
  // (the names: through the text form's parse, which lists the ones there are)
  const auto check = [](const std::string& text, const char* field) {
    try {
      (void)parse_plan_overrides(text);
    } catch (const Error& e) {
      throw Error(field, std::string(e.what()).substr(e.argument().size() + 2));
    }
  };
  if (!o.kernel.empty()) check("kernel=" + o.kernel, "config.plan.kernel");
  for (const std::string& f : o.off) check("off=" + f, "config.plan.off");
}
}  // namespace

Attention::Attention(const AttentionProblem& problem, const AttentionConfig& config) : impl_(std::make_unique<Impl>()) {
  core::check_config(config.threads, config.backend, "config");
  impl_->problem = core::normalize_and_check(problem);
  check_plan_overrides(config.plan);
  impl_->overrides = config.plan;
  switch (config.backend) {
    case Backend::Auto:
    case Backend::Cpu: impl_->backend = Backend::Cpu; break;
    case Backend::Reference: impl_->backend = Backend::Reference; break;
    case Backend::Cuda: impl_->backend = Backend::Cuda; break;
    case Backend::Vulkan: impl_->backend = Backend::Vulkan; break;
  }
  if (impl_->backend == Backend::Cpu) {
    const int threads = config.threads > 0 ? config.threads : omp_get_max_threads();
    impl_->plan = cpu::plan_tiled(impl_->problem, threads, config.plan);
  } else if (impl_->backend == Backend::Cuda) {
    impl_->cuda_plan = cuda::plan(impl_->problem, config.plan);
  } else if (impl_->backend == Backend::Vulkan) {
    impl_->vulkan_session = vulkan::plan(impl_->problem, config.plan.kernel, config.plan.splits);
  }
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

const AttentionProblem& Attention::problem() const { return impl_->problem; }
Backend Attention::backend() const { return impl_->backend; }

std::string Attention::describe() const {
  switch (impl_->backend) {
    case Backend::Reference: return "reference (float64, one row at a time)";
    case Backend::Cuda: return cuda::describe(impl_->cuda_plan);
    case Backend::Vulkan: return vulkan::describe(*impl_->vulkan_session);
    default: return cpu::describe(impl_->plan);
  }
}

std::size_t Attention::scratch_bytes() const {
  switch (impl_->backend) {
    case Backend::Cpu: return impl_->plan.scratch_bytes;
    case Backend::Cuda: return impl_->cuda_plan.scratch_bytes;
    default: return 0;
  }
}

// The status word, where given: one int32 (AttentionArgs::status).
static void check_status_buffer(const AttentionArgs& a) {
  if (a.status.data != nullptr && a.status.elements < 1) {
    throw Error("status", "holds " + std::to_string(a.status.elements) + " elements; it needs 1 (int32)");
  }
}

void Attention::run(const AttentionArgs& args) {
  const AttentionProblem& p = impl_->problem;
  check_status_buffer(args);
  if (impl_->backend == Backend::Cuda) {
    require_device_pointers(args);
    core::check_args(p, args, scratch_bytes(), /*host_key_lengths=*/false);
    void* scratch = args.scratch;
    const std::size_t need = impl_->cuda_plan.scratch_bytes;
    std::unique_lock<std::mutex> own_lock;  // held until the kernels are queued (stream order does the rest)
    if (scratch == nullptr && need > 0) {
      own_lock = std::unique_lock<std::mutex>(impl_->own_scratch_lock);
      if (impl_->own_device_bytes < need) {
        if (impl_->own_device_scratch != nullptr) cuda::device_free(impl_->own_device_scratch);
        impl_->own_device_scratch = cuda::device_alloc(need);
        impl_->own_device_bytes = need;
      }
      scratch = impl_->own_device_scratch;
    }
    cuda::run(p, args, impl_->cuda_plan, scratch);
    return;
  }
  reject_device_pointers(args);
  core::check_args(p, args, scratch_bytes());
  if (args.status.data != nullptr) *static_cast<std::int32_t*>(args.status.data) = -1;  // (lengths checked above)
  if (impl_->backend == Backend::Reference) {
    cpu::run_reference(p, args);
    return;
  }
  if (impl_->backend == Backend::Vulkan) {
    vulkan::run(*impl_->vulkan_session, args);
    return;
  }
  std::byte* scratch = static_cast<std::byte*>(args.scratch);
  std::unique_lock<std::mutex> own_lock;  // held until run_tiled returns: the scratch is this run's till then
  if (scratch == nullptr && impl_->plan.scratch_bytes > 0) {
    own_lock = std::unique_lock<std::mutex>(impl_->own_scratch_lock);
    auto& own = impl_->own_scratch;
    if (own.size() < impl_->plan.scratch_bytes + kScratchAlign) own.resize(impl_->plan.scratch_bytes + kScratchAlign);
    const auto address = reinterpret_cast<std::uintptr_t>(own.data());
    scratch = own.data() + (kScratchAlign - address % kScratchAlign) % kScratchAlign;
  }
  cpu::run_tiled(p, args, impl_->plan, scratch);
}

void attention(const AttentionProblem& problem, const AttentionArgs& args, const AttentionConfig& config) {
  Attention(problem, config).run(args);
}

}  // namespace attnkit
