// The Vulkan tests' main: turns the Khronos validation layers on (when installed) before any test makes the
// backend's context, so that every test's Vulkan calls are validated; `--no-validation` leaves them off (for
// timing runs).
#include <attnkit/vulkan.hpp>

#include <gtest/gtest.h>

#include <cstring>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bool validation = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-validation") == 0) validation = false;
  }
  attnkit::vulkan::Options options;
  options.validation = validation && attnkit::vulkan::validation_available();
  attnkit::vulkan::configure(options);
  return RUN_ALL_TESTS();
}
