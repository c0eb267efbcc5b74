// PlanOverrides: the names a plan knows (kernels, features), their text form and its checks. The backends read
// the fields; the names live here once so that every entry point (C++, the CLI, Python) checks them alike.
#include <attnkit/attention.hpp>

#include <algorithm>
#include <charconv>
#include <string_view>

namespace attnkit {
namespace {

const std::vector<std::string>& kernel_names() {
  // CUDA's registry (cuda_plan.cu), then Vulkan's kernels (vulkan_plan.cpp), then the CPU's (tiled_driver.cpp).
  static const std::vector<std::string> names{"simt", "mma", "wgmma", "decode", "decode-mma", "tf32", "rows", "coopmat",
                                                "bf16-dot"};
  return names;
}

const std::vector<std::pair<std::string, std::string>>& feature_list() {
  static const std::vector<std::pair<std::string, std::string>> features{
      {"wgmma", "the Hopper wgmma kernel"},
      {"decode", "the CUDA-core decode kernel"},
      {"decode-mma", "the decode-mma kernel (quantized caches, keys on the MMA's M side)"},
      {"tf32", "float32 on tensor cores (the SIMT kernel runs float32)"},
      {"plain", "the tile kernels' plain build"},
      {"tail", "the split tail of the wgmma plain build"},
      {"three", "three wgmma blocks per SM at head dim 64"},
      {"persistent", "the persistent grid of the wgmma plain build"},
      {"kv-copies", "the wgmma kernel's 16-byte K/V copies where rows are not whole 32-byte sectors (TMA instead)"},
      {"narrow", "the wgmma kernel's narrow builds (MMAs over a head dim's columns of its bucket; the bucket's full MMAs instead)"},
      {"kv-tma", "the wgmma kernel's K/V tiles by TMA (its 16-byte copies instead, wherever the K/V are float)"},
      {"cluster", "the split-K merge inside thread-block clusters (the merge pass runs instead)"},
      {"pdl", "every programmatic dependent launch"},
      {"merge-pdl", "the merge pass's programmatic launch"},
      {"call-pdl", "a plain call's programmatic launch of its tile kernel"},
      {"heavy-first", "the heavy-first order of causal row blocks (index order instead)"},
      {"query-rotary", "the GQA op's rotary of Q inside the attention kernel (its pre-pass rotates Q)"},
      {"prepass-vector", "the GQA op's vector pre-pass kernel (the general one runs)"},
      {"upload-kernel", "the GQA op's small-array upload by kernel parameters (a copy runs)"},
      {"amx", "the CPU's AMX bfloat16 tiles for the tiled kernel's products (its SIMD float32 path runs)"},
      {"widened-kv", "the tiled kernel's per-thread widened (or AMX-staged) copy of a K/V head (each item widens or stages its own tiles)"},
      {"prefetch-v", "the few-rows kernel's prefetch of each tile's V rows while its scores run"},
      {"prefetch-ahead", "the CPU's prefetch of the next tile's rows over streaming K/V (few-rows items: K, while a tile's scores run; tiled items: K and V read in place)"},
      {"prefetch-items", "the CPU tiled items' early requests for the next tile they copy and the next item's rows (calls larger than a thread's L2)"},
      {"interleaved-scores", "the few-rows kernel's scores of a wide item's heads in turns by group of keys (each head's whole tile in turn)"},
      {"bf16-dot", "the CPU's vdpbf16ps scores for bfloat16 tiled items, where the plan takes them (the SIMD float32 products run)"},
      {"rounded-p", "bfloat16 on the CPU's AMX tiles: P rounded to bfloat16 for P V (P's three terms, all 24 bits, instead)"},
  };
  return features;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::int64_t parse_count(std::string_view key, std::string_view value) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size() || n < 0) {
    throw Error("plan", std::string(key) + "=" + std::string(value) + " is not a count >= 0");
  }
  return n;
}

}  // namespace

std::vector<std::string> plan_kernel_names() { return kernel_names(); }
std::vector<std::pair<std::string, std::string>> plan_features() { return feature_list(); }

bool PlanOverrides::is_off(const std::string& feature) const {
  return std::find(off.begin(), off.end(), feature) != off.end();
}

bool PlanOverrides::empty() const {
  return kernel.empty() && splits == 0 && off.empty() && persistent_blocks == 0 && heavy_group == 0;
}

std::string PlanOverrides::to_string() const {
  std::string s;
  const auto add = [&](const std::string& part) { s += (s.empty() ? "" : ",") + part; };
  if (!kernel.empty()) add("kernel=" + kernel);
  if (splits > 0) add("splits=" + std::to_string(splits));
  if (!off.empty()) {
    std::string features;
    for (const auto& f : off) features += (features.empty() ? "" : "+") + f;
    add("off=" + features);
  }
  if (persistent_blocks > 0) add("persistent=" + std::to_string(persistent_blocks));
  if (heavy_group > 0) add("heavy_group=" + std::to_string(heavy_group));
  return s;
}

PlanOverrides parse_plan_overrides(const std::string& text) {
  PlanOverrides o;
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) throw Error("plan", "'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "kernel") {
      o.kernel = std::string(value);
      const auto& names = kernel_names();
      if (std::find(names.begin(), names.end(), o.kernel) == names.end()) {
        throw Error("plan", "kernel=" + o.kernel + " is not a kernel (" + joined(names) + ")");
      }
    } else if (key == "splits") {
      o.splits = parse_count(key, value);
    } else if (key == "persistent") {
      o.persistent_blocks = parse_count(key, value);
    } else if (key == "heavy_group") {
      o.heavy_group = parse_count(key, value);
    } else if (key == "off") {
      std::string_view features = value;
      while (!features.empty()) {
        const std::size_t plus = features.find('+');
        const std::string name(features.substr(0, plus));
        features = plus == std::string_view::npos ? std::string_view{} : features.substr(plus + 1);
        const auto& list = feature_list();
        const bool known = std::any_of(list.begin(), list.end(), [&](const auto& f) { return f.first == name; });
        if (!known) {
          std::vector<std::string> names;
          for (const auto& f : list) names.push_back(f.first);
          throw Error("plan", "off=" + name + " is not a plan feature (" + joined(names) + ")");
        }
        o.off.push_back(name);
      }
    } else {
      throw Error("plan", "unknown key '" + std::string(key) + "' (kernel, splits, off, persistent, heavy_group)");
    }
  }
  return o;
}

}  // namespace attnkit
