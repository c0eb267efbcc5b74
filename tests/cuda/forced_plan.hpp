// The GPU test binaries' `--plan=<overrides>` argument (PlanOverrides' text form): every op of the binary runs
// with those overrides first, so that scripts/gpu-check runs one binary with the wgmma kernel everywhere, nowhere,
// and so on, without an environment variable.
#pragma once

#include <attnkit/attention.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace attnkit::testing {

inline std::string& forced_plan() {
  static std::string plan;
  return plan;
}

// The CUDA backend, with the binary's forced plan and then `plan` (PlanOverrides' text form; a later key wins).
inline AttentionConfig cuda_config(const std::string& plan = "") {
  AttentionConfig c;
  c.backend = Backend::Cuda;
  c.plan = parse_plan_overrides(forced_plan() + "," + plan);
  return c;
}

// main() of a test binary: GoogleTest's flags, then `--plan=...`; anything else is an error.
inline int run_tests_with_plan_flag(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--plan=", 0) != 0) {
      std::fprintf(stderr, "unknown argument %s (--plan=<overrides>)\n", argv[i]);
      return 2;
    }
    forced_plan() = arg.substr(7);
  }
  return RUN_ALL_TESTS();
}

}  // namespace attnkit::testing
