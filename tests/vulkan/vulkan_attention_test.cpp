// The Vulkan backend against the float64 reference on every case of cases/*.json, with every kernel the device
// accepts (chosen through AttentionConfig::kernel), plus the properties every backend owes: bit-identical reruns,
// cut calls equal to whole calls, forced key splits, float32 at 16k keys, bad input rejected by name with nothing
// written. Every test ends by asserting that the validation layers reported no error (vulkan_main.cpp turns
// them on). Without a Vulkan device every test skips.
#include "test_support.hpp"
#include "vulkan_fixture.hpp"

#include <attnkit/vulkan.hpp>
#include <vulkan/vulkan_plan.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace attnkit::test {
namespace {

using testing::KeyLengths;
using testing::LayoutKind;
using testing::MaskKind;
using testing::tolerance;

// The kernels the device runs `problem` with: each one the plan accepts when forced.
std::vector<std::string> accepted_kernels(const AttentionProblem& problem) {
  std::vector<std::string> out;
  for (const char* k : {"rows", "coopmat"}) {
    try {
      Attention op(problem, vulkan_config(k));
      out.push_back(k);
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "config.plan.kernel") << e.what();
    }
  }
  return out;
}

double lse_bound(DType t) { return t == DType::f32 ? kLseTolerance : tolerance(t); }

void expect_matches(CaseData& data, const cpu::ReferenceResult& ref, const AttentionConfig& config) {
  const Outcome r = run_and_measure(data, ref, config);
  std::printf("%-34s %-9s %-8s err %.2e lse %.2e  %s\n", data.spec().name.c_str(),
              std::string(dtype_name(data.dtype())).c_str(), config.plan.kernel.c_str(), r.err, r.lse_err, r.describe.c_str());
  EXPECT_LE(r.err, tolerance(data.dtype())) << r.describe;
  EXPECT_LE(r.lse_err, lse_bound(data.dtype())) << r.describe;
  EXPECT_EQ(r.unwritten, 0) << r.describe;
  EXPECT_TRUE(r.gaps_untouched) << r.describe;
}

// ---- the case list ----

struct CaseParam {
  CaseSpec spec;
  DType dtype;
};
void PrintTo(const CaseParam& c, std::ostream* os) { *os << c.spec.name << " " << dtype_name(c.dtype); }

std::vector<CaseParam> all_params() {
  std::vector<CaseParam> out;
  for (const CaseSpec& s : testing::load_cases())
    for (DType t : s.dtypes) out.push_back({s, t});
  return out;
}
std::string param_name(const ::testing::TestParamInfo<CaseParam>& info) {
  std::string n = info.param.spec.name + "_" + std::string(dtype_name(info.param.dtype));
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class VulkanCases : public VulkanTest, public ::testing::WithParamInterface<CaseParam> {};

// Every kernel the device accepts, in the plan's own split and, on the small edge cases, forced into three key
// ranges merged by the merge pass.
TEST_P(VulkanCases, MatchesReference) {
  const CaseParam& c = GetParam();
  SCOPED_TRACE(spec_string(c.spec));
  CaseData data(c.spec, c.dtype, 20261201);
  const auto ref = data.reference();
  const AttentionProblem normalized = core::normalize_and_check(data.problem());
  const auto kernels = accepted_kernels(data.problem());
  ASSERT_FALSE(kernels.empty());
  for (const std::string& k : kernels) {
    expect_matches(data, ref, vulkan_config(k));
    if (c.spec.has_tag("edge") && normalized.k_len >= 96) expect_matches(data, ref, vulkan_config(k, 3));
  }
}
INSTANTIATE_TEST_SUITE_P(Cases, VulkanCases, ::testing::ValuesIn(all_params()), param_name);

// ---- determinism and cuts ----

CaseSpec det_spec(std::int64_t batch, std::int64_t heads, std::int64_t kv, std::int64_t q, std::int64_t k,
                  std::int64_t d, bool causal) {
  CaseSpec s;
  s.name = "det";
  s.batch = batch, s.heads = heads, s.kv_heads = kv, s.q_len = q, s.k_len = k, s.head_dim = d;
  s.causal = causal, s.lse = true, s.mask = MaskKind::Random;
  return s;
}

std::vector<std::byte> run_bytes(CaseData& data, const AttentionProblem& problem, const AttentionConfig& config,
                                 std::string* describe = nullptr) {
  data.poison_outputs();
  Attention op(problem, config);
  op.run(data.args());
  if (describe != nullptr) *describe = op.describe();
  return data.output_bytes();
}

// Two runs of one plan, a second plan, and the call cut into one-workgroup launches by the work budget give the
// same bytes; so does a forced split, cut and whole.
TEST_F(VulkanTest, DeterministicAndCutEqualsWhole) {
  for (const CaseSpec& s : {det_spec(2, 8, 2, 1, 3000, 64, true), det_spec(1, 6, 6, 150, 200, 64, false),
                            det_spec(2, 4, 1, 77, 129, 40, true)}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(spec_string(s) + " " + std::string(dtype_name(t)));
      CaseData data(s, t, 7);
      const auto ref = data.reference();
      for (const std::string& k : accepted_kernels(data.problem())) {
        std::string kernel;
        Attention op(data.problem(), vulkan_config(k));
        data.poison_outputs();
        op.run(data.args());
        const auto first = data.output_bytes();
        EXPECT_LE(data.scaled_error(ref), tolerance(t)) << op.describe();
        data.poison_outputs();
        op.run(data.args());
        EXPECT_EQ(first, data.output_bytes()) << "two runs differ: " << op.describe();
        EXPECT_EQ(first, run_bytes(data, data.problem(), vulkan_config(k))) << "a second plan differs";
        AttentionProblem cut = data.problem();
        cut.work_budget = 1;
        EXPECT_EQ(first, run_bytes(data, cut, vulkan_config(k), &kernel)) << "cut differs: " << kernel;
        EXPECT_NE(kernel.find("launches"), std::string::npos) << kernel;
        const auto split = run_bytes(data, data.problem(), vulkan_config(k, 4), &kernel);
        EXPECT_NE(kernel.find("split-k="), std::string::npos) << kernel;
        EXPECT_EQ(split, run_bytes(data, cut, vulkan_config(k, 4))) << "cut split differs";
        EXPECT_LE(data.scaled_error(ref), tolerance(t)) << kernel;
      }
    }
  }
}

// ---- float32 at 16k keys (blockwise sums) ----

// The plan the backend's own rule gives `problem` on the device the context runs on (what splits the keys
// depends on the device: a CPU device keeps ranges short, a GPU splits when few workgroups would run).
vulkan::VulkanPlan device_plan(const AttentionProblem& problem) {
  const vulkan::DeviceInfo dev = vulkan::current_device();
  vulkan::VulkanTraits traits;
  traits.cpu_device = dev.type == "cpu";
  traits.cooperative_matrix = dev.cooperative_matrix;
  traits.subgroup_size = dev.subgroup_size;
  traits.shared_memory_bytes = dev.shared_memory_bytes;
  return vulkan::plan_for(core::normalize_and_check(problem), traits);
}

// `longest`: the fewest keys one workgroup must walk (where the plan is not already splitting for the device's
// sake), so that the blockwise sums are what holds float32 to 1e-5.
void check_long(const CaseSpec& spec, bool expect_split, std::int64_t longest) {
  SCOPED_TRACE(spec_string(spec));
  CaseData data(spec, DType::f32, 16384 + static_cast<std::uint64_t>(spec.input_std * 10));
  const auto ref = data.reference();
  const Outcome r = run_and_measure(data, ref, vulkan_config());
  std::printf("%-16s err %.2e lse %.2e  %s\n", spec.name.c_str(), r.err, r.lse_err, r.describe.c_str());
  EXPECT_LE(r.err, 1e-5);
  EXPECT_LE(r.lse_err, kLseTolerance);
  const vulkan::VulkanPlan expected = device_plan(data.problem());
  const std::string want = vulkan::describe(expected);
  EXPECT_EQ(r.describe.substr(0, want.size()), want) << "the plan's rule gives: " << want;
  EXPECT_EQ(expected.splits > 1, expect_split || vulkan::current_device().type == "cpu") << want;
  if (vulkan::current_device().type != "cpu") EXPECT_GE(expected.split_keys, longest) << want;
}
CaseSpec long_spec(const char* name, std::int64_t batch, std::int64_t heads, std::int64_t q, double std_dev) {
  CaseSpec s;
  s.name = name;
  s.batch = batch, s.heads = heads, s.q_len = q, s.k_len = 16384, s.head_dim = 64, s.input_std = std_dev, s.lse = true;
  if (batch > 1) s.layout = LayoutKind::BroadcastKv;
  return s;
}
TEST_F(VulkanTest, Float32At16kKeysSplit) {
  check_long(long_spec("split_std1", 1, 2, 4, 1.0), true, 128);
  check_long(long_spec("split_std3", 1, 2, 4, 3.0), true, 128);
}
// 256 batch entries sharing one K/V: as many workgroups as the plan wants on a GPU, so none splits and one
// walks all 16384 keys. A CPU device keeps ranges short whatever the shape (vulkan_plan.cpp), so 64 entries
// do there (a quarter of the time on lavapipe). The expectation is the plan's rule on this device.
TEST_F(VulkanTest, Float32At16kKeysWhole) {
  const bool cpu = vulkan::current_device().type == "cpu";
  check_long(long_spec("whole_std2", cpu ? 64 : 256, 1, 1, 2.0), false, 16384);
}

// ---- bad input: Error naming the argument, nothing written ----

TEST_F(VulkanTest, BadKeyLengthRejectedWithNothingWritten) {
  CaseSpec s = det_spec(3, 2, 2, 5, 40, 16, false);
  s.key_lengths = KeyLengths::Random;
  CaseData data(s, DType::f32, 3);
  Attention op(data.problem(), vulkan_config());
  AttentionArgs a = data.args();
  std::vector<std::int32_t> lengths(3, 10);
  lengths[1] = 41;  // past k_len
  a.key_lengths.data = lengths.data();
  data.poison_outputs();
  const auto poisoned = data.output_bytes();
  try {
    op.run(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument().rfind("key_lengths", 0), 0u) << e.what();
  }
  EXPECT_EQ(poisoned, data.output_bytes());
  a = data.args();
  a.q.data = nullptr;
  try {
    op.run(a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument().rfind("q", 0), 0u) << e.what();
  }
  EXPECT_EQ(poisoned, data.output_bytes());
}

// Non-finite values reach only their own rows, on every kernel, whole and split (docs/numerics.md): a NaN in a query
// row makes that row's scores NaN, a +inf in the mask makes its row's score +inf, and each such row is NaN; NaN in K
// and V past the key length (keys outside every row's range) reaches no row; every other row is the reference's.
TEST_F(VulkanTest, NonFiniteValuesStayInTheirRows) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (DType t : {DType::f16, DType::f32}) {
    Manual m(1, 4, 1, 24, 200, 64, 64, t);
    m.randomize(5);
    m.add_mask();
    m.add_key_lengths(180);
    for (std::int64_t d = 0; d < 64; ++d) {
      m.set(m.k, m.k_at(0, 0, 195, d), kNan);
      m.set(m.v, m.v_at(0, 0, 190, d), kNan);
    }
    m.set(m.q, m.q_at(0, 3, 0, 7), kNan);  // head 3, query 0: NaN scores
    m.mask_at(0, 1, 5, 30) = kInf;         // head 1, query 5: a +inf score
    const auto ref = m.reference();
    auto nan_row = [](std::int64_t h, std::int64_t i) { return (h == 3 && i == 0) || (h == 1 && i == 5); };
    for (const std::string& kernel : accepted_kernels(m.p)) {
      for (const std::int64_t splits : {std::int64_t{0}, std::int64_t{3}}) {
        SCOPED_TRACE(kernel + " " + std::string(dtype_name(t)) + " splits " + std::to_string(splits));
        m.run(vulkan_config(kernel, splits));
        for (std::int64_t h = 0; h < 4; ++h) {
          for (std::int64_t i = 0; i < 24; ++i) {
            for (std::int64_t d = 0; d < 64; d += 9) {
              EXPECT_EQ(std::isnan(m.out(0, h, i, d)), nan_row(h, i)) << "head " << h << " query " << i;
            }
          }
        }
        EXPECT_LE(m.scaled_error(ref), tolerance(t));
      }
    }
  }
}

TEST_F(VulkanTest, PlanOverridesAndUnsupportedStorageRejectedByName) {
  AttentionProblem p = AttentionProblem::head_first(1, 2, 2, 8, 8, 16, DType::f32);
  auto argument_of = [](const AttentionProblem& problem, const AttentionConfig& config) -> std::string {
    try {
      Attention op(problem, config);
    } catch (const Error& e) {
      return e.argument();
    }
    return "";
  };
  EXPECT_EQ(argument_of(p, vulkan_config("bogus")), "config.plan.kernel");
  EXPECT_EQ(argument_of(p, vulkan_config("coopmat")), "config.plan.kernel");  // float32: never the matrix kernel
  EXPECT_EQ(argument_of(p, vulkan_config("", -1)), "config.plan.splits");
  AttentionProblem q8 = p;
  q8.k_storage = {KvType::Int8, KvQuant::PerTensor};
  EXPECT_EQ(argument_of(q8, vulkan_config()), "k_storage.type");
  EXPECT_EQ(argument_of(p, vulkan_config()), "");
}

// The plan names its kernel and why; the device list names the device the context runs on.
TEST_F(VulkanTest, DescribeNamesKernelAndDevice) {
  const AttentionProblem p = AttentionProblem::head_first(1, 12, 12, 1, 1500, 64, DType::f16);
  Attention op(p, vulkan_config());
  const std::string d = op.describe();
  const vulkan::DeviceInfo dev = vulkan::current_device();
  EXPECT_NE(d.find(dev.name), std::string::npos) << d;
  // float16: the matrix kernel where the device has cooperative matrices, else rows (vulkan_plan.cpp)
  EXPECT_NE(d.find(dev.cooperative_matrix ? "vulkan.coopmat" : "vulkan.rows"), std::string::npos) << d;
  EXPECT_NE(d.find("split-k"), std::string::npos) << d;  // 12 workgroups of one decode row: split
  const auto all = vulkan::devices();
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const vulkan::DeviceInfo& x) { return x.name == dev.name; }));
}

// The driver's statistics of the pipelines a run made: nothing unless asked for (vulkan_main.cpp's
// --pipeline-statistics, which scripts/gpu-check passes on a GPU); asked for, none where the device does not offer
// VK_KHR_pipeline_executable_properties (lavapipe), else lines "shader [constants] executable: name = value",
// among them the kernel that ran.
TEST_F(VulkanTest, PipelineStatisticsOnlyWhenAskedAndNameTheKernels) {
  CaseSpec s = det_spec(1, 4, 4, 70, 90, 64, false);
  CaseData data(s, DType::f16, 3);
  Attention op(data.problem(), vulkan_config("rows"));
  op.run(data.args());
  const std::vector<std::string> lines = vulkan::pipeline_statistics();
  std::printf("%zu statistics lines (%s)\n", lines.size(), pipeline_statistics_asked() ? "asked for" : "not asked for");
  if (!pipeline_statistics_asked()) {
    EXPECT_TRUE(lines.empty()) << lines.front();
    return;
  }
  for (const std::string& line : lines) {
    std::printf("  %s\n", line.c_str());
    EXPECT_TRUE(line.rfind("attention_", 0) == 0 || line.rfind("split_merge", 0) == 0) << line;
    EXPECT_NE(line.find("] "), std::string::npos) << line;
    EXPECT_NE(line.find(" = "), std::string::npos) << line;
  }
  if (!lines.empty()) {
    EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
      return l.rfind("attention_rows", 0) == 0;
    })) << "no line for the rows kernel that ran";
  }
}

}  // namespace
}  // namespace attnkit::test
