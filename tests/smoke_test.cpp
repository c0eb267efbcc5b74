#include <testing/case_data.hpp>

#include <gtest/gtest.h>

using namespace attnkit;
using namespace attnkit::testing;

TEST(Smoke, AllCases) {
  for (const CaseSpec& spec : load_cases()) {
    for (DType t : spec.dtypes) {
      CaseData data(spec, t, 1234);
      const auto ref = data.reference();
      Attention op(data.problem());
      op.run(data.args());
      const double err = data.scaled_error(ref);
      std::printf("%-28s %-8s err %.2e  %s\n", spec.name.c_str(), std::string(dtype_name(t)).c_str(), err, op.describe().c_str());
      EXPECT_LE(err, tolerance(t)) << spec.name;
      EXPECT_TRUE(data.gaps_untouched());
    }
  }
}
