// A case's buffers on the CUDA device, so that a CaseData runs through the CUDA backend and every CaseData check
// (scaled error, poison, untouched gaps, bit-identical reruns) applies unchanged: the inputs are uploaded once;
// before each run the outputs are poisoned on the host and copied up, after it they are copied back.
// Used by the GPU tests and `attnkit verify --backend cuda`. Without a device (or CUDA in the build) the
// constructor throws attnkit::Error.
#pragma once

#include "case_data.hpp"

#include <attnkit/attention.hpp>

#include <vector>

namespace attnkit::testing {

class DeviceMirror {
 public:
  explicit DeviceMirror(CaseData& data);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  // Poisons the outputs, runs `op` on the device buffers (or on `args`, device buffers the caller changed),
  // waits for the device and copies O and LSE back into the case, also when the run throws.
  void run(Attention& op);
  void run(Attention& op, const AttentionArgs& args);
  // The device buffers, for callers that change one (a bad key length) or run a backend on them directly.
  AttentionArgs& device_args() { return device_; }
  // The case's (poisoned) outputs up to the device, and the device's back (after waiting for the device): for a
  // caller that runs the op itself (a CUDA graph's replay).
  void upload_outputs();
  void download();

 private:
  const void* upload(const void* host, std::int64_t bytes);

  CaseData& data_;
  AttentionArgs host_;
  AttentionArgs device_;
  std::vector<void*> owned_;
};

}  // namespace attnkit::testing
