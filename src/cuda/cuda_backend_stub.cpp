// The CUDA backend when the build has no CUDA: nothing is available, and asking for it is an error.
#include "cuda_backend.hpp"

namespace attnkit::cuda {

bool available() { return false; }
bool is_device_pointer(const void*) { return false; }
CudaPlan plan(const AttentionProblem&) { throw Error("config.backend", "the CUDA backend is not part of this build"); }
std::string describe(const CudaPlan&) { return "cuda (not built)"; }
void run(const AttentionProblem&, const AttentionArgs&, const CudaPlan&, void*) {
  throw Error("config.backend", "the CUDA backend is not part of this build");
}
void* device_alloc(std::size_t) { return nullptr; }
void device_free(void*) {}

}  // namespace attnkit::cuda
