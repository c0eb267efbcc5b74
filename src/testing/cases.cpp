#include "cases.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace attnkit::testing {
namespace {

using nlohmann::json;

template <class E>
E parse_enum(const json& j, const char* field, std::initializer_list<std::pair<const char*, E>> names,
             const std::string& where) {
  const std::string s = j.get<std::string>();
  for (const auto& [n, e] : names)
    if (s == n) return e;
  throw std::runtime_error(where + ": unknown " + field + " '" + s + "'");
}

CaseSpec parse_case(const json& j, const std::string& file) {
  CaseSpec c;
  c.file = file;
  c.name = j.at("name").get<std::string>();
  const std::string where = file + ": case '" + c.name + "'";
  static const std::vector<std::string> known{
      "name", "batch", "heads", "kv_heads", "q_len", "k_len", "head_dim", "v_head_dim", "layout", "dtypes", "mask",
      "key_lengths", "causal", "causal_offset", "causal_offsets", "window", "softcap", "scale", "head_sink", "masked_rows", "lse",
      "input_std", "tags", "comment"};
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw std::runtime_error(where + ": unknown field '" + key + "'");
  }
  auto int_field = [&](const char* f, std::int64_t& out) {
    if (!j.contains(f)) return;
    // An integer, not a float: nlohmann converts a float out of int64's range with undefined behaviour.
    if (!j.at(f).is_number_integer()) throw std::runtime_error(where + ": " + f + " must be an integer");
    out = j.at(f).get<std::int64_t>();
  };
  int_field("batch", c.batch);
  int_field("heads", c.heads);
  int_field("kv_heads", c.kv_heads);
  int_field("q_len", c.q_len);
  int_field("k_len", c.k_len);
  int_field("head_dim", c.head_dim);
  int_field("v_head_dim", c.v_head_dim);
  if (j.contains("layout")) {
    c.layout = parse_enum<LayoutKind>(j.at("layout"), "layout",
                                      {{"head_first", LayoutKind::HeadFirst},
                                       {"positions_first", LayoutKind::PositionsFirst},
                                       {"packed_qkv", LayoutKind::PackedQkv},
                                       {"padded", LayoutKind::Padded},
                                       {"broadcast_kv", LayoutKind::BroadcastKv}},
                                      where);
  }
  if (j.contains("dtypes")) {
    c.dtypes.clear();
    for (const auto& d : j.at("dtypes")) {
      const auto t = parse_dtype(d.get<std::string>());
      if (!t) throw std::runtime_error(where + ": unknown dtype '" + d.get<std::string>() + "'");
      c.dtypes.push_back(*t);
    }
  }
  if (j.contains("mask")) {
    c.mask = parse_enum<MaskKind>(j.at("mask"), "mask",
                                  {{"none", MaskKind::None},
                                   {"key_padding", MaskKind::KeyPadding},
                                   {"random", MaskKind::Random},
                                   {"random_shared", MaskKind::RandomShared},
                                   {"masked_rows", MaskKind::MaskedRows}},
                                  where);
  }
  if (j.contains("key_lengths")) {
    c.key_lengths = parse_enum<KeyLengths>(
        j.at("key_lengths"), "key_lengths",
        {{"none", KeyLengths::None}, {"random", KeyLengths::Random}, {"zero", KeyLengths::Zero}}, where);
  }
  if (j.contains("causal")) c.causal = j.at("causal").get<bool>();
  if (j.contains("causal_offset") && !j.at("causal_offset").is_null()) {
    if (!j.at("causal_offset").is_number_integer()) throw std::runtime_error(where + ": causal_offset must be an integer");
    c.causal_offset = j.at("causal_offset").get<std::int64_t>();
  }
  if (j.contains("causal_offsets")) c.causal_offsets = j.at("causal_offsets").get<bool>();
  if (j.contains("window") && !j.at("window").is_null()) {
    if (!j.at("window").is_number_integer()) throw std::runtime_error(where + ": window must be an integer");
    c.window = j.at("window").get<std::int64_t>();
  }
  if (j.contains("softcap") && !j.at("softcap").is_null()) c.softcap = j.at("softcap").get<float>();
  if (j.contains("scale") && !j.at("scale").is_null()) c.scale = j.at("scale").get<float>();
  if (j.contains("head_sink")) c.head_sink = j.at("head_sink").get<bool>();
  if (j.contains("masked_rows")) {
    c.masked_rows = parse_enum<MaskedRows>(j.at("masked_rows"), "masked_rows",
                                           {{"nan", MaskedRows::Nan}, {"zero", MaskedRows::Zero}}, where);
  }
  if (j.contains("lse")) c.lse = j.at("lse").get<bool>();
  if (j.contains("input_std")) c.input_std = j.at("input_std").get<double>();
  if (j.contains("tags")) c.tags = j.at("tags").get<std::vector<std::string>>();
  return c;
}

}  // namespace

bool CaseSpec::has_tag(const std::string& tag) const {
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

std::optional<DType> parse_dtype(const std::string& s) {
  if (s == "float32" || s == "f32") return DType::f32;
  if (s == "float16" || s == "f16") return DType::f16;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  return std::nullopt;
}

std::string layout_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::HeadFirst: return "head_first";
    case LayoutKind::PositionsFirst: return "positions_first";
    case LayoutKind::PackedQkv: return "packed_qkv";
    case LayoutKind::Padded: return "padded";
    case LayoutKind::BroadcastKv: return "broadcast_kv";
  }
  return "?";
}

std::string mask_name(MaskKind k) {
  switch (k) {
    case MaskKind::None: return "none";
    case MaskKind::KeyPadding: return "key_padding";
    case MaskKind::Random: return "random";
    case MaskKind::RandomShared: return "random_shared";
    case MaskKind::MaskedRows: return "masked_rows";
  }
  return "?";
}

std::vector<CaseSpec> parse_cases(const std::string& text, const std::string& file) {
  const json doc = json::parse(text);
  const json& list = doc.is_object() ? doc.at("cases") : doc;
  std::vector<CaseSpec> out;
  for (const auto& j : list) out.push_back(parse_case(j, file));
  return out;
}

std::vector<CaseSpec> load_cases(const std::string& dir_in, LargeCases large) {
  // ATTNKIT_CASES_DIR in the environment overrides the source tree's path (a binary run on another machine).
  const char* env = std::getenv("ATTNKIT_CASES_DIR");
  const std::string dir = env != nullptr && *env != 0 && dir_in == ATTNKIT_CASES_DIR ? env : dir_in;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<CaseSpec> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    for (CaseSpec& c : parse_cases(ss.str(), f.filename().string())) {
      if (large == LargeCases::Include || !c.has_tag(kLargeTag)) out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace attnkit::testing
