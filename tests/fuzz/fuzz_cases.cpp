// Fuzz target: the cases/*.json reader (testing::parse_cases) on any bytes, and each case it accepts made concrete
// (testing::CaseData: the layouts, buffers and inputs the tests, `attnkit verify` and `attnkit bench` build from
// it) and run on the CPU kernel when it is small enough for a fuzzing step. The oracles: no sanitizer report, and
// no exception but the reader's std::runtime_error / nlohmann::json's errors (a bad file), CaseData's
// std::runtime_error (a case it cannot build) or attnkit::Error (a case the op refuses).
#include <attnkit/attention.hpp>
#include <testing/case_data.hpp>
#include <testing/cases.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace {

constexpr __int128 kMaxElements = 1 << 16;  // per tensor of a case made concrete
constexpr int kMaxCasesRun = 4;              // cases of one input made concrete and run

// Whether CaseData may be built: every extent in a sane range and each tensor small (CaseData allocates them).
bool small_enough(const attnkit::testing::CaseSpec& s) {
  const std::int64_t dims[] = {s.batch, s.heads, s.kv_heads, s.q_len, s.k_len, s.head_dim, s.v_head_dim};
  for (std::int64_t d : dims) {
    if (d < 0 || d > 4096) return false;
  }
  const __int128 kv = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const __int128 dv = s.v_head_dim > 0 ? s.v_head_dim : s.head_dim;
  const __int128 pad = 16;  // the padded layout's extra columns and rows
  const __int128 q = static_cast<__int128>(s.batch) * (s.heads + 2 * kv) * (s.q_len + pad) * (s.head_dim + dv + pad);
  const __int128 k = static_cast<__int128>(s.batch) * (kv + 2) * (s.k_len + pad) * (s.head_dim + dv + pad);
  const __int128 mask = static_cast<__int128>(s.batch) * s.heads * s.q_len * s.k_len;
  return q <= kMaxElements && k <= kMaxElements && mask <= kMaxElements;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<attnkit::testing::CaseSpec> cases;
  try {
    cases = attnkit::testing::parse_cases(text, "fuzz.json");
  } catch (const nlohmann::json::exception&) {
    return 0;
  } catch (const std::runtime_error&) {
    return 0;
  }
  // A file of many cases (cases/edges.json has dozens) parses in full, but only its first few small cases are run:
  // a fuzzing step stays well under a second.
  int run = 0;
  for (const attnkit::testing::CaseSpec& spec : cases) {
    if (!small_enough(spec) || run++ >= kMaxCasesRun) continue;
    for (attnkit::DType dtype : spec.dtypes) {
      try {
        attnkit::testing::CaseData data(spec, dtype, 1);
        attnkit::AttentionConfig config;
        config.threads = 1;
        attnkit::Attention op(data.problem(), config);
        op.run(data.args());
      } catch (const attnkit::Error&) {
      } catch (const std::runtime_error&) {  // a case CaseData cannot build (packed_qkv with q_len != k_len)
      }
    }
  }
  return 0;
}
