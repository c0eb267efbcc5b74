// The case list (cases/*.json): shapes, layouts, masks and dtypes, read alike by the tests, `attnkit verify`
// and `attnkit bench`, so a case added once is tested, verified and timed.
#pragma once

#include <attnkit/attention.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnkit::testing {

// How the Q, K, V and O tensors sit in memory.
enum class LayoutKind {
  HeadFirst,       // [B, H, S, D], contiguous
  PositionsFirst,  // [B, S, H, D], what a projection leaves
  PackedQkv,       // Q, K, V slices of one [B, S, (H + 2 Hkv) D] buffer; O positions-first
  Padded,          // head-first with an offset, padded rows and gaps between heads and batch entries
  BroadcastKv,     // head-first Q/O; one K/V shared by every batch entry (batch stride 0)
};

// Which additive mask the case carries.
enum class MaskKind {
  None,
  KeyPadding,   // [B, 1, 1, K]: 0 for each batch entry's valid keys, -inf past a random length
  Random,       // [B, H, Q, K]: normal noise with about 10% -inf
  RandomShared, // [B, 1, Q, K]: the same, shared by every head (head stride 0)
  MaskedRows,   // [B, H, Q, K]: like Random, with every third query row entirely -inf
};

enum class KeyLengths { None, Random, Zero };

struct CaseSpec {
  std::string name;
  std::string file;  // the cases/*.json it came from
  std::int64_t batch = 1, heads = 1, kv_heads = 0, q_len = 1, k_len = 1, head_dim = 64, v_head_dim = 0;
  LayoutKind layout = LayoutKind::HeadFirst;
  std::vector<DType> dtypes{DType::f32};
  MaskKind mask = MaskKind::None;
  KeyLengths key_lengths = KeyLengths::None;
  bool causal = false;
  std::optional<std::int64_t> causal_offset;
  bool causal_offsets = false;  // per-batch offsets, random in [-q_len, k_len]
  std::optional<std::int64_t> window;
  std::optional<float> softcap;
  std::optional<float> scale;
  bool head_sink = false;
  MaskedRows masked_rows = MaskedRows::Nan;
  bool lse = false;
  double input_std = 1.0;  // inputs are normal(0, input_std), rounded to the dtype
  // "model" (a reference model shape), "bench" (timed by attnkit bench), "long", "large" (an LLM-size shape:
  // GPU benchmarks, left out of load_cases by default)
  std::vector<std::string> tags;

  bool has_tag(const std::string& tag) const;
};

// Which cases load_cases returns: the large ones (tag "large", cases/llm.json) are GPU benchmark shapes whose
// float64 reference of every output takes minutes; the test suites that check every output leave them out.
enum class LargeCases { Skip, Include };
inline constexpr const char* kLargeTag = "large";

// Reads every cases/*.json under `dir` (default: the source tree's cases/), in file-name order.
std::vector<CaseSpec> load_cases(const std::string& dir = ATTNKIT_CASES_DIR, LargeCases large = LargeCases::Skip);
// Parses one JSON document (an array of cases, or {"cases": [...]}); throws std::runtime_error naming the case.
std::vector<CaseSpec> parse_cases(const std::string& json_text, const std::string& file_name);

std::string layout_name(LayoutKind k);
std::string mask_name(MaskKind k);
std::optional<DType> parse_dtype(const std::string& s);

}  // namespace attnkit::testing
