// Case selection and machine facts shared by the subcommands (see commands.hpp).
#include "cli/commands.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace attnkit::cli {

// ---- small helpers ----

std::string strprintf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string s(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, args);
  va_end(args);
  return s;
}

std::string dtype_string(DType t) { return std::string(dtype_name(t)); }

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? separator : "") + parts[i];
  return s;
}

std::optional<double> parse_number(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

int resolve_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

// ---- case selection ----

namespace {
constexpr double kMaxThreads = 65536;
}  // namespace

void add_selection_options(CLI::App& cmd, SelectionOptions& opts, const std::string& default_tag) {
  cmd.add_option("--cases", opts.cases_dir, "Directory of case files (*.json)")->capture_default_str();
  cmd.add_option("--tag", opts.tag,
                 default_tag.empty() ? "Only cases with this tag (default: every case)"
                                     : "Only cases with this tag (default: " + default_tag + ")")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd.add_option("--case", opts.names, "Only these cases, by name (several allowed)");
  cmd.add_option("--dtype", opts.dtypes, "Only these dtypes: float32 float16 bfloat16 (default: each case's list)");
  cmd.add_option("--threads", opts.threads, "Worker threads (0: all cores)")
      ->check(CLI::Validator(
          [](const std::string& s) {
            const auto v = parse_number(s);
            const bool ok = v && *v >= 0 && *v <= kMaxThreads && *v == std::floor(*v);
            return ok ? std::string() : std::string("must be a whole number from 0 (all cores) to 65536");
          },
          ""))
      ->capture_default_str();
  cmd.add_option("--seed", opts.seed, "Seed of the random inputs")->capture_default_str();
  cmd.add_flag("--list", opts.list, "Print the selected cases and dtypes, run nothing");
}

std::vector<testing::CaseSpec> load_case_files(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw UsageError("--cases: '" + dir + "' is not a directory");
  try {
    return testing::load_cases(dir, testing::LargeCases::Include);
  } catch (const std::exception& e) {
    throw UsageError("cannot read the cases in '" + dir + "': " + e.what());
  }
}

namespace {
// Levenshtein distance, for "did you mean".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Up to three known names near `name`: within a third of its length in edits, or containing it.
std::vector<std::string> closest_names(const std::string& name, const std::map<std::string, int>& known) {
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& [k, count] : known) {
    const std::size_t d = edit_distance(name, k);
    if (d <= std::max<std::size_t>(2, name.size() / 3) || k.find(name) != std::string::npos) scored.emplace_back(d, k);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(scored[i].second);
  return out;
}
}  // namespace

std::vector<Job> select_jobs(const SelectionOptions& opts, const std::string& default_tag) {
  std::vector<DType> wanted;
  for (const std::string& d : opts.dtypes) {
    const auto t = testing::parse_dtype(d);
    if (!t) throw UsageError("--dtype: unknown dtype '" + d + "' (use float32, float16 or bfloat16)");
    if (std::find(wanted.begin(), wanted.end(), *t) == wanted.end()) wanted.push_back(*t);
  }

  const std::vector<testing::CaseSpec> all = load_case_files(opts.cases_dir);
  if (all.empty()) throw UsageError("no case files (*.json) in '" + opts.cases_dir + "'");
  std::map<std::string, int> defined;  // how many files define each name
  for (const auto& c : all) ++defined[c.name];
  if (!opts.tag.empty() && std::none_of(all.begin(), all.end(), [&](const auto& c) { return c.has_tag(opts.tag); })) {
    std::set<std::string> tags;
    for (const auto& c : all) tags.insert(c.tags.begin(), c.tags.end());
    throw UsageError("--tag: no case in '" + opts.cases_dir + "' has the tag '" + opts.tag + "' (tags: " +
                     (tags.empty() ? "none" : join({tags.begin(), tags.end()}, ", ")) + ")");
  }

  // Which cases, each with whether it was named explicitly.
  std::vector<std::pair<const testing::CaseSpec*, bool>> chosen;
  if (!opts.names.empty()) {
    std::set<std::string> seen;
    for (const std::string& name : opts.names) {
      if (!seen.insert(name).second) continue;
      std::vector<const testing::CaseSpec*> matches;
      for (const auto& c : all)
        if (c.name == name && (opts.tag.empty() || c.has_tag(opts.tag))) matches.push_back(&c);
      if (matches.empty()) {
        if (defined.count(name) != 0) throw UsageError("--case: '" + name + "' does not have the tag '" + opts.tag + "'");
        const std::vector<std::string> close = closest_names(name, defined);
        throw UsageError("--case: unknown case '" + name + "' in '" + opts.cases_dir + "'" +
                         (close.empty() ? "" : "; did you mean " + join(close, ", ") + "?") +
                         " (--list shows the " + std::to_string(defined.size()) + " cases)");
      }
      if (matches.size() > 1 && !default_tag.empty()) {  // several files define it: prefer the command's tag
        std::vector<const testing::CaseSpec*> tagged;
        for (const auto* c : matches)
          if (c->has_tag(default_tag)) tagged.push_back(c);
        if (!tagged.empty()) matches = tagged;
      }
      for (const auto* c : matches) chosen.emplace_back(c, true);
    }
  } else {
    const std::string tag = opts.tag.empty() ? default_tag : opts.tag;
    // Without a tag, every case but the large ones (GPU shapes: named, or --tag large).
    for (const auto& c : all)
      if (tag.empty() ? !c.has_tag(testing::kLargeTag) : c.has_tag(tag)) chosen.emplace_back(&c, false);
    if (chosen.empty()) throw UsageError("no case in '" + opts.cases_dir + "' has the tag '" + tag + "'");
  }

  std::vector<Job> jobs;
  for (const auto& [spec, named] : chosen) {
    const std::string label = defined[spec->name] > 1 ? spec->name + "@" + spec->file : spec->name;
    std::vector<DType> dtypes;
    if (wanted.empty()) {
      dtypes = spec->dtypes;
    } else if (named) {
      dtypes = wanted;
    } else {
      for (DType t : spec->dtypes)
        if (std::find(wanted.begin(), wanted.end(), t) != wanted.end()) dtypes.push_back(t);
    }
    for (DType t : dtypes) jobs.push_back({*spec, t, label});
  }
  if (jobs.empty()) throw UsageError("no selected case lists the dtype(s) " + join(opts.dtypes, ", "));
  return jobs;
}

void print_jobs(std::ostream& out, const std::vector<Job>& jobs) {
  for (const Job& j : jobs) {
    const auto& s = j.spec;
    out << strprintf("%-32s %-9s %-16s b%lld h%lld/%lld q%lld k%lld d%lld  mask %s%s  tags [%s]\n", j.label.c_str(),
                     dtype_string(j.dtype).c_str(), s.file.c_str(), static_cast<long long>(s.batch),
                     static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads ? s.kv_heads : s.heads),
                     static_cast<long long>(s.q_len), static_cast<long long>(s.k_len),
                     static_cast<long long>(s.head_dim), testing::mask_name(s.mask).c_str(),
                     s.causal ? ", causal" : "", join(s.tags, ", ").c_str());
  }
  out << jobs.size() << " case/dtype pairs\n";
}

// ---- machine facts ----

std::string library_version() { return ATTNKIT_VERSION; }

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? "unknown" : line.substr(begin);
  }
  return "unknown";
}

namespace {
// The first line a shell command prints, or "" when it fails.
std::string first_line_of(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) text += buf;
  const int status = pclose(pipe);
  if (status != 0) return "";
  const auto end = text.find('\n');
  return text.substr(0, end);
}
}  // namespace

std::string git_commit() {
  const std::string git = "git -C '" ATTNKIT_SOURCE_DIR "' ";
  const std::string hash = first_line_of(git + "rev-parse --short HEAD 2>/dev/null");
  if (hash.empty()) return "unknown";
  // Tracked files changed since that commit make the numbers belong to no commit: say so.
  const std::string dirty = first_line_of(git + "status --porcelain --untracked-files=no 2>/dev/null");
  return dirty.empty() ? hash : hash + "-dirty";
}

std::string quote_command_line(int argc, const char* const* argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i] ? argv[i] : "";
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                         "0123456789-_./=:,+@%") == std::string::npos;
    if (i) s += ' ';
    if (plain) {
      s += a;
    } else {  // single-quote it, closing and reopening around each single quote
      s += '\'';
      for (char c : a) s += c == '\'' ? std::string("'\\''") : std::string(1, c);
      s += '\'';
    }
  }
  return s;
}

}  // namespace attnkit::cli

namespace attnkit::cli {

std::string progress(std::size_t done, std::size_t total, std::chrono::steady_clock::time_point start) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double left = done > 0 && done < total ? elapsed / static_cast<double>(done) * static_cast<double>(total - done)
                                               : 0.0;
  return strprintf("[%zu/%zu, %.1f s, ~%.1f s left]", done, total, elapsed, left);
}

}  // namespace attnkit::cli
