#include "device_mirror.hpp"

#include <cuda/host/cuda_backend.hpp>
#include <gqa/cuda/gqa_device.hpp>

namespace attnkit::testing {
namespace {

std::int64_t element_bytes(DType t) { return static_cast<std::int64_t>(dtype_size(t)); }

}  // namespace

DeviceMirror::DeviceMirror(CaseData& data) : data_(data), host_(data.args()) {
  if (!cuda::available()) throw Error("backend", "no CUDA device is present (or this build has no CUDA backend)");
  const AttentionProblem& p = data.problem();
  const std::int64_t e = element_bytes(p.dtype);
  device_ = host_;
  try {
    device_.q.data = upload(host_.q.data, host_.q.elements * e);
    device_.k.data = upload(host_.k.data, host_.k.elements * e);
    device_.v.data = upload(host_.v.data, host_.v.elements * e);
    device_.mask.data = upload(host_.mask.data, host_.mask.elements * element_bytes(p.mask_dtype));
    device_.key_lengths.data = upload(host_.key_lengths.data, host_.key_lengths.elements * 4);
    device_.head_sink.data = upload(host_.head_sink.data, host_.head_sink.elements * 4);
    device_.causal_offsets.data = upload(host_.causal_offsets.data, host_.causal_offsets.elements * 4);
    device_.o.data = const_cast<void*>(upload(host_.o.data, host_.o.elements * e));
    device_.lse.data = const_cast<void*>(upload(host_.lse.data, host_.lse.elements * 4));
  } catch (...) {
    for (void* d : owned_) cuda::device_free(d);
    throw;
  }
}

DeviceMirror::~DeviceMirror() {
  for (void* d : owned_) cuda::device_free(d);
}

const void* DeviceMirror::upload(const void* host, std::int64_t bytes) {
  if (host == nullptr || bytes <= 0) return nullptr;
  void* d = cuda::device_alloc(static_cast<std::size_t>(bytes));
  owned_.push_back(d);
  cuda::copy_to_device(d, host, static_cast<std::size_t>(bytes));
  return d;
}

void DeviceMirror::run(Attention& op) { run(op, device_); }

void DeviceMirror::upload_outputs() {
  const std::int64_t e = element_bytes(data_.problem().dtype);
  if (device_.o.data != nullptr) {
    cuda::copy_to_device(device_.o.data, host_.o.data, static_cast<std::size_t>(host_.o.elements * e));
  }
  if (device_.lse.data != nullptr) {
    cuda::copy_to_device(device_.lse.data, host_.lse.data, static_cast<std::size_t>(host_.lse.elements * 4));
  }
}

void DeviceMirror::run(Attention& op, const AttentionArgs& args) {
  data_.poison_outputs();
  upload_outputs();
  try {
    op.run(args);
  } catch (...) {
    download();  // what the device holds after a refused call: the tests check that nothing was written
    throw;
  }
  download();
}

void DeviceMirror::download() {
  cuda::synchronize();
  const std::int64_t e = element_bytes(data_.problem().dtype);
  if (device_.o.data != nullptr) {
    cuda::copy_to_host(host_.o.data, device_.o.data, static_cast<std::size_t>(host_.o.elements * e), nullptr);
  }
  if (device_.lse.data != nullptr) {
    cuda::copy_to_host(host_.lse.data, device_.lse.data, static_cast<std::size_t>(host_.lse.elements * 4), nullptr);
  }
}

}  // namespace attnkit::testing
