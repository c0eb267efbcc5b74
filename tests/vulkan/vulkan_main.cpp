// The Vulkan tests' main: turns the Khronos validation layers on (when installed) before any test makes the
// backend's context, so that every test's Vulkan calls are validated; `--no-validation` leaves them off (for
// timing runs); `--pipeline-statistics` asks the driver for the pipelines' statistics (vulkan_attention_test checks
// them; without it, that nothing was captured).
#include "vulkan_fixture.hpp"

#include <attnkit/vulkan.hpp>

#include <gtest/gtest.h>

#include <cstring>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool validation = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-validation") == 0) validation = false;
    if (std::strcmp(argv[i], "--pipeline-statistics") == 0) attnkit::test::pipeline_statistics_asked() = true;
  }
  attnkit::vulkan::Options options;
  options.validation = validation && attnkit::vulkan::validation_available();
  options.pipeline_statistics = attnkit::test::pipeline_statistics_asked();
  attnkit::vulkan::configure(options);
  return RUN_ALL_TESTS();
}
