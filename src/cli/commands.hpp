// What the subcommands share: the output streams, the case-selection options of `verify` and `bench`, the
// selection itself, and facts about the machine for the reports. Internal to attnkit_cli_lib.
#pragma once

#include <testing/cases.hpp>

#include <attnkit/dtype.hpp>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnkit::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // a check failed, or a run threw
inline constexpr int kExitUsage = 2;   // bad input on the command line (unknown case, dtype, tag, ...)
inline constexpr int kExitInterrupted = 130;  // stopped between work items (Ctrl-C)

// Where a subcommand writes, and the command line it was started with (recorded in bench reports).
struct Context {
  std::ostream& out;
  std::ostream& err;
  std::string command_line;
  std::function<bool()> stop;  // asked between work items; true: end the run (kExitInterrupted)

  bool should_stop() const { return stop && stop(); }
};

// "[3/40, 1.2 s, ~14.8 s left]": where a long run is, for the start of each result line.
std::string progress(std::size_t done, std::size_t total, std::chrono::steady_clock::time_point start);

// Bad command-line input found after parsing (an unknown case, a dtype no case has...): reported as
// "attnkit: error: <message>" with exit code kExitUsage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- case selection (verify and bench) ----

inline constexpr std::uint64_t kDefaultSeed = 20261129;

struct SelectionOptions {
  std::string cases_dir = ATTNKIT_CASES_DIR;
  std::string tag;                  // empty: the command's default
  std::vector<std::string> names;   // --case
  std::vector<std::string> dtypes;  // --dtype
  int threads = 0;                  // 0: all cores (OpenMP's max threads)
  std::uint64_t seed = kDefaultSeed;
  bool list = false;                // print the selection and stop
};

// Adds --cases, --tag, --case, --dtype, --threads, --seed and --list to `cmd`.
void add_selection_options(CLI::App& cmd, SelectionOptions& opts, const std::string& default_tag);

// One case in one dtype. `label` is the case name, or "name@file" when several files define that name.
struct Job {
  testing::CaseSpec spec;
  DType dtype = DType::f32;
  std::string label;
};

// The cases x dtypes the options select, in case-file order. Rules:
//  - --case NAME...: those cases (every file that defines NAME; when several do, the ones tagged
//    `default_tag` are preferred); --tag, when given, must also match. Unknown names are a UsageError.
//  - otherwise: every case with the tag (--tag, else `default_tag`; none: every case).
//  - --dtype: the dtypes each case lists, kept when named; a case named with --case runs each --dtype given
//    even when its file does not list it.
// Throws UsageError when the input is bad or nothing is selected.
std::vector<Job> select_jobs(const SelectionOptions& opts, const std::string& default_tag);

// Loads the case files of `dir`; a missing directory or a bad file is a UsageError.
std::vector<testing::CaseSpec> load_case_files(const std::string& dir);

// Prints one line per job (for --list).
void print_jobs(std::ostream& out, const std::vector<Job>& jobs);

// Worker threads a run with `requested` threads uses (0: OpenMP's max threads).
int resolve_threads(int requested);

// ---- small helpers ----

std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string dtype_string(DType t);
std::string join(const std::vector<std::string>& parts, const std::string& separator);
// A whole string read as a finite number, or nothing.
std::optional<double> parse_number(const std::string& s);

// ---- facts about the machine and the build, for info and the bench reports ----

std::string library_version();
std::string utc_timestamp();       // 2026-11-29T21:20:00Z
std::string cpu_model();           // "model name" of /proc/cpuinfo, or "unknown"
std::string git_commit();          // short hash of the source tree's HEAD (+ "-dirty"), or "unknown"
std::string quote_command_line(int argc, const char* const* argv);

// ---- the subcommands (each in its own file) ----

struct InfoOptions {
  std::string cases_dir = ATTNKIT_CASES_DIR;
};
CLI::App* add_info_command(CLI::App& app, InfoOptions& opts);
int run_info(const InfoOptions& opts, Context& ctx);

struct VerifyOptions {
  SelectionOptions select;
  std::string backend = "cpu";
};
CLI::App* add_verify_command(CLI::App& app, VerifyOptions& opts);
int run_verify(const VerifyOptions& opts, Context& ctx);

struct BenchOptions {
  SelectionOptions select;
  std::string backend = "cpu";  // cpu | vulkan (host buffers: its times include the upload and download)
  double min_time = 0.5;  // seconds of timed runs per op and case
  std::string json_path;
  std::string markdown_path;
  std::string csv_path;
};
CLI::App* add_bench_command(CLI::App& app, BenchOptions& opts);
int run_bench(const BenchOptions& opts, Context& ctx);

// `attnkit gqa` (gqa.cpp): GroupQueryAttention prefill + decode steps of a model shape (Llama-3-8B default).
struct GqaBenchOptions {
  std::int64_t batch = 1;
  std::int64_t prompt = 512;
  std::int64_t steps = 32;
  std::int64_t heads = 32;
  std::int64_t kv_heads = 8;
  std::int64_t head_size = 128;
  std::string dtype = "float32";  // the query's type (a float --cache sets it)
  std::string cache = "float32";  // float32 | float16 | bfloat16 | int8 | int4
  std::string quant = "per-channel";
  std::int64_t window = -1;
  bool rotary = true;
  int threads = 0;
  std::string device = "cpu";  // cpu | cuda
  std::uint64_t seed = kDefaultSeed;
  std::string json_path;  // --json: the run's settings and times
};
CLI::App* add_gqa_command(CLI::App& app, GqaBenchOptions& opts);
int run_gqa(const GqaBenchOptions& opts, Context& ctx);

}  // namespace attnkit::cli
