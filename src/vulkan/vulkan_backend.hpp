// The Vulkan backend's interface to the dispatcher (attention.cpp). No Vulkan types here: without Vulkan in the
// build (vulkan_backend_stub.cpp) available() is false and planning throws.
#pragma once

#include <attnkit/attention.hpp>

#include <memory>
#include <string>

namespace attnkit::vulkan {

struct PlanOverride;

// True when the backend is built and a usable Vulkan device is present.
bool available();

// A planned problem on the device: its plan, pipelines, device buffers, descriptor set and recorded command
// buffers (host-buffer calls: upload, run, download). Made once; run() allocates nothing.
class Session;
std::shared_ptr<Session> plan(const AttentionProblem& problem, const std::string& kernel, std::int64_t key_splits);
std::string describe(const Session& session);
// Copies the inputs from the host buffers of `args`, runs, copies O (and the LSE) back; waits for the device.
void run(Session& session, const AttentionArgs& args);

}  // namespace attnkit::vulkan
