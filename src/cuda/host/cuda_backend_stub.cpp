// The CUDA backend when the build has no CUDA: nothing is available, and asking for it is an error.
#include "cuda/host/cuda_backend.hpp"
#include "gqa/cuda/gqa_device.hpp"

namespace attnkit::cuda {

bool available() { return false; }
bool is_device_pointer(const void*) { return false; }
CudaPlan plan(const AttentionProblem&, const PlanOverrides&) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
std::string describe(const CudaPlan&) { return "cuda (not built)"; }
void run(const AttentionProblem&, const AttentionArgs&, const CudaPlan&, void*, bool, const QueryRotary*, bool) {
  throw Error("config.backend", "the CUDA backend is not part of this build");
}
bool rotates_query(const AttentionProblem&, const AttentionArgs&, const CudaPlan&, const QueryRotary&) { return false; }
void write_output_qk(const AttentionProblem&, const AttentionArgs&, bool, const std::int32_t*, std::int64_t, void*) {
  throw Error("config.backend", "the CUDA backend is not part of this build");
}
void* device_alloc(std::size_t) { return nullptr; }
void device_free(void*) {}
void copy_to_device(void*, const void*, std::size_t) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
void synchronize() {}
void append_kv(const KvAppendProblem&, const KvAppendArgs&) {
  throw Error("backend", "the CUDA backend is not part of this build");
}

// The GQA op's device side (gqa_device.hpp): unreachable without a device (the op checks available() first).
void launch_cache_move(const CacheMove&, void*) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
void launch_append(const AppendStep&, void*) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
struct DeviceWorkspace::State {};
DeviceWorkspace::DeviceWorkspace() = default;
DeviceWorkspace::~DeviceWorkspace() = default;
bool DeviceWorkspace::begin_call(void*) { return false; }
void DeviceWorkspace::end_call(void*) {}
std::byte* DeviceWorkspace::device(std::size_t) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
std::byte* DeviceWorkspace::stage(std::size_t, bool) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
void DeviceWorkspace::upload(void*, std::size_t, void*) {}
void DeviceWorkspace::upload_kept(void*, const std::byte*, std::size_t, void*) {}
void copy_to_host(void*, const void*, std::size_t, void*) { throw Error("config.backend", "the CUDA backend is not part of this build"); }

}  // namespace attnkit::cuda
