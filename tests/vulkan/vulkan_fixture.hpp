// The Vulkan test programs' fixture: every test skips without a Vulkan device, and fails when any of its Vulkan
// calls drew a validation-layer error (vulkan_main.cpp turns the Khronos layers on where they are installed).
#pragma once

#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace attnkit::test {

// Whether the program asked the backend for its pipelines' statistics (vulkan_main.cpp: --pipeline-statistics);
// inline, one flag for every file of the program.
inline bool& pipeline_statistics_asked() {
  static bool asked = false;
  return asked;
}

namespace {

bool have_vulkan() {
  static const bool present = [] {
    const auto b = available_backends();
    return std::find(b.begin(), b.end(), Backend::Vulkan) != b.end();
  }();
  return present;
}

// The Vulkan backend, with a kernel and a key split forced through the plan overrides ("", 0: the plan's own).
AttentionConfig vulkan_config(const std::string& kernel = "", std::int64_t splits = 0) {
  AttentionConfig c;
  c.backend = Backend::Vulkan;
  c.plan.kernel = kernel;
  c.plan.splits = splits;
  return c;
}

class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_vulkan()) GTEST_SKIP() << "no Vulkan device";
  }
  void TearDown() override {
    if (!have_vulkan()) return;
    for (const auto& e : vulkan::validation_errors()) ADD_FAILURE() << "validation layer: " << e;
  }
};

}  // namespace
}  // namespace attnkit::test
