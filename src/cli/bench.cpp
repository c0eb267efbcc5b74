// `attnkit bench`: for each bench case x dtype, verify the fused op and the unfused BLAS chain against the
// float64 reference, then time both on the same inputs in this process (PERF.md, Method): warm-up, then
// blocks of samples, the two ops taking turns, until each has filled --min-time; the median is reported.
#include "cli/bench.hpp"

#include "cli/blas_core.hpp"

#include "cli/commands.hpp"

#include <cpu/tiled_kernel.hpp>
#include <testing/case_data.hpp>
#include <testing/unfused_blas.hpp>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <thread>

namespace attnkit::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The compute ceiling: OpenBLAS sgemm of this size, best of a few (PERF.md quotes 2048^3, both cores).
constexpr int kSgemmN = 2048;
constexpr int kSgemmRepeats = 5;
// Warm-up: at least this many runs and this long, so caches, page faults and thread pools settle.
constexpr int kWarmupRuns = 2;
constexpr double kWarmupSeconds = 0.05;
// A sample is enough back-to-back runs to last this long, so the clock's cost and resolution vanish on
// microsecond-sized problems (a decoder step).
constexpr double kSampleSeconds = 1e-3;
constexpr int kMinSamples = 5;
constexpr int kMaxSamples = 100000;
// The ops take turns in blocks of samples this long, with a pause before each block: OpenBLAS's threads (and
// OpenMP's) spin for a while after a call, and on a small machine an op that starts while the other's threads
// still spin loses cores to them (the fused times came out 10-30% slow when samples simply alternated).
constexpr double kBlockSeconds = 0.05;
constexpr double kPauseSeconds = 0.1;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Times one op: warm-up, then samples on request.
class Sampler {
 public:
  explicit Sampler(std::function<void()> op) : op_(std::move(op)) {}

  void warm_up() {
    double estimate = 1e30;
    const auto start = Clock::now();
    for (int i = 0; i < kWarmupRuns || seconds_since(start) < kWarmupSeconds; ++i) {
      const auto t0 = Clock::now();
      op_();
      estimate = std::min(estimate, seconds_since(t0));
    }
    runs_per_sample_ = static_cast<int>(std::clamp(std::ceil(kSampleSeconds / std::max(estimate, 1e-9)), 1.0, 1e6));
  }

  // Samples for about `seconds` (at least one), after the pause.
  void take_block(double seconds, double min_time) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kPauseSeconds));
    op_();  // untimed: the first call after a pause wakes the thread pool
    const auto start = Clock::now();
    do {
      take_sample();
    } while (!done(min_time) && seconds_since(start) < seconds);
  }

  void take_sample() {
    const auto t0 = Clock::now();
    for (int i = 0; i < runs_per_sample_; ++i) op_();
    const double s = seconds_since(t0);
    total_ += s;
    samples_.push_back(s / runs_per_sample_);
  }

  bool done(double min_time) const {
    const auto n = static_cast<int>(samples_.size());
    return n >= kMaxSamples || (n >= kMinSamples && total_ >= min_time);
  }

  Timing result() const {
    std::vector<double> s = samples_;
    std::sort(s.begin(), s.end());
    const std::size_t n = s.size();
    Timing t;
    t.median_s = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    t.min_s = s.front();
    t.samples = static_cast<int>(n);
    t.runs_per_sample = runs_per_sample_;
    return t;
  }

 private:
  std::function<void()> op_;
  int runs_per_sample_ = 1;
  double total_ = 0.0;
  std::vector<double> samples_;
};

// The least traffic the op needs: every input element read once, every output element written once.
double min_bytes(const AttentionProblem& p) {
  const double es = static_cast<double>(dtype_size(p.dtype));
  const double B = static_cast<double>(p.batch), H = static_cast<double>(p.heads);
  const double Hkv = static_cast<double>(p.kv_heads), Sq = static_cast<double>(p.q_len);
  const double Sk = static_cast<double>(p.k_len), D = static_cast<double>(p.head_dim);
  const double Dv = static_cast<double>(p.v_head_dim);
  const double kv_batches = p.k.batch_stride == 0 && p.v.batch_stride == 0 ? 1.0 : B;  // broadcast K/V
  double bytes = es * (B * H * Sq * D + kv_batches * Hkv * Sk * (D + Dv) + B * H * Sq * Dv);
  if (p.has_mask) {  // a stride of 0 broadcasts that dimension: it is read once
    const double mb = p.mask.batch_stride ? B : 1.0, mh = p.mask.head_stride ? H : 1.0;
    const double mr = p.mask.row_stride ? Sq : 1.0;
    bytes += 4.0 * mb * mh * mr * Sk;
  }
  if (p.has_key_lengths) bytes += 4.0 * B;
  if (p.has_head_sink) bytes += 4.0 * H;
  if (p.return_lse) bytes += 4.0 * B * H * Sq;
  return bytes;
}

double measure_sgemm(int threads) {
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  const double g = testing::sgemm_gflops(kSgemmN, kSgemmRepeats);
  openblas_set_num_threads(saved);
  return g;
}

std::string ms(const std::optional<Timing>& t) { return t ? strprintf("%.4g ms", t->median_s * 1e3) : "-"; }

// Verifies, then times, one case x dtype.
BenchRow bench_one(const Job& job, const BenchOptions& opts, int threads) {
  BenchRow row;
  row.label = job.label;
  row.file = job.spec.file;
  row.dtype = dtype_string(job.dtype);
  row.bound = testing::tolerance(job.dtype);
  try {
    testing::CaseData data(job.spec, job.dtype, opts.select.seed);
    AttentionConfig config;
    config.backend = opts.backend == "vulkan" ? Backend::Vulkan : Backend::Cpu;
    config.threads = threads;
    Attention fused(data.problem(), config);
    testing::UnfusedBlas unfused(fused.problem(), threads);
    const AttentionArgs args = data.args();
    row.kernel = fused.describe();
    row.flops = data.flops();
    row.min_bytes = min_bytes(fused.problem());

    // Verify before timing: never time a wrong result.
    const auto ref = data.reference();
    data.poison_outputs();
    fused.run(args);
    row.fused_error = data.scaled_error(ref);
    data.poison_outputs();
    unfused.run(args);
    row.unfused_error = data.scaled_error(ref);
    std::vector<std::string> problems;
    if (!(*row.fused_error <= row.bound)) problems.push_back("FAIL: fused error above bound");
    if (!(*row.unfused_error <= row.bound)) problems.push_back("FAIL: unfused error above bound");
    if (!(*row.fused_error <= row.bound)) {
      row.status = join(problems, "; ");
      row.failed = true;
      return row;
    }

    Sampler f([&] { fused.run(args); });
    Sampler u([&] { unfused.run(args); });
    f.warm_up();
    u.warm_up();
    while (!f.done(opts.min_time) || !u.done(opts.min_time)) {  // take turns, so drift hits both alike
      if (!f.done(opts.min_time)) f.take_block(kBlockSeconds, opts.min_time);
      if (!u.done(opts.min_time)) u.take_block(kBlockSeconds, opts.min_time);
    }
    row.fused = f.result();
    row.unfused = u.result();
    if (!problems.empty()) {
      row.status = join(problems, "; ");
      row.failed = true;
    }
  } catch (const std::exception& e) {
    row.status = std::string("FAIL: threw: ") + e.what();
    row.failed = true;
  }
  return row;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions& opts) {
  CLI::App* cmd = app.add_subcommand(
      "bench", "Verify, then time the fused op against GEMM + softmax + GEMM (OpenBLAS) on each bench case x dtype");
  add_selection_options(*cmd, opts.select, "bench");
  cmd->add_option("--backend", opts.backend, "The fused op's backend: cpu or vulkan (host buffers, copies timed too)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  cmd->add_option("--min-time", opts.min_time, "Seconds of timed runs per op and case (after warm-up)")
      ->check(CLI::Validator(
          [](const std::string& s) {
            const auto v = parse_number(s);
            return v && *v > 0 ? std::string() : std::string("must be a number of seconds above 0");
          },
          ""))
      ->capture_default_str();
  cmd->add_option("--json", opts.json_path, "Also write the results as JSON to this file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--markdown", opts.markdown_path, "Also write the results as a Markdown table to this file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--csv", opts.csv_path, "Also write the results as CSV (one line per case and dtype) to this file")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  return cmd;
}

int run_bench(const BenchOptions& opts, Context& ctx) {
  const std::vector<Job> jobs = select_jobs(opts.select, "bench");
  if (opts.select.list) {
    print_jobs(ctx.out, jobs);
    return kExitOk;
  }
  // Open the report files first: a bad path should fail before minutes of timing, not after.
  std::ofstream json, markdown, csv;
  if (!opts.json_path.empty()) {
    json.open(opts.json_path);
    if (!json) throw UsageError("--json: cannot write '" + opts.json_path + "'");
  }
  if (!opts.markdown_path.empty()) {
    markdown.open(opts.markdown_path);
    if (!markdown) throw UsageError("--markdown: cannot write '" + opts.markdown_path + "'");
  }
  if (!opts.csv_path.empty()) {
    csv.open(opts.csv_path);
    if (!csv) throw UsageError("--csv: cannot write '" + opts.csv_path + "'");
  }

  BenchHeader h;
  h.date_utc = utc_timestamp();
  h.cpu = cpu_model();
  h.threads = resolve_threads(opts.select.threads);
  h.simd_target = cpu::simd_target_name();
  h.blas = testing::blas_info();
  if (const std::string note = blas_core_note(); !note.empty()) h.blas += "; " + note;
  h.git_commit = git_commit();
  h.command = ctx.command_line;
  h.version = library_version();
  h.min_time_s = opts.min_time;
  h.seed = opts.select.seed;
  h.sgemm_n = kSgemmN;
  h.sgemm_gflops = measure_sgemm(h.threads);
  ctx.out << strprintf("attnkit %s bench: %zu case/dtype pairs, %d threads, %s, %s\n", h.version.c_str(), jobs.size(),
                       h.threads, h.simd_target.c_str(), h.cpu.c_str())
          << strprintf("OpenBLAS sgemm %d^3: %.1f GFLOP/s (%s)\n", h.sgemm_n, h.sgemm_gflops, h.blas.c_str())
          << std::flush;

  std::vector<BenchRow> rows;
  bool failed = false;
  const auto start = std::chrono::steady_clock::now();
  for (const Job& job : jobs) {
    if (ctx.should_stop()) {
      ctx.out << strprintf("interrupted: %zu of %zu case/dtype pairs timed", rows.size(), jobs.size()) << std::endl;
      return kExitInterrupted;
    }
    BenchRow row = bench_one(job, opts, h.threads);
    failed = failed || row.failed;
    std::string line = progress(rows.size() + 1, jobs.size(), start) +
                       strprintf(" %s %s: fused %s, unfused %s", row.label.c_str(), row.dtype.c_str(),
                                 ms(row.fused).c_str(), ms(row.unfused).c_str());
    if (const auto s = row.speedup()) line += strprintf(", speed-up %.2fx", *s);
    if (row.fused_error && row.unfused_error)
      line += strprintf(", err %.1e / %.1e (bound %.0e)", *row.fused_error, *row.unfused_error, row.bound);
    if (row.status != "ok") line += "  [" + row.status + "]";
    if (!row.kernel.empty()) line += "\n    " + row.kernel;
    ctx.out << line << std::endl;
    rows.push_back(std::move(row));
  }

  if (json.is_open()) {
    write_json(json, h, rows);
    json.close();
    if (!json) throw std::runtime_error("writing '" + opts.json_path + "' failed");
    ctx.out << "wrote " << opts.json_path << "\n";
  }
  if (markdown.is_open()) {
    write_markdown(markdown, h, rows);
    markdown.close();
    if (!markdown) throw std::runtime_error("writing '" + opts.markdown_path + "' failed");
    ctx.out << "wrote " << opts.markdown_path << "\n";
  }
  if (csv.is_open()) {
    write_csv(csv, rows);
    csv.close();
    if (!csv) throw std::runtime_error("writing '" + opts.csv_path + "' failed");
    ctx.out << "wrote " << opts.csv_path << "\n";
  }
  ctx.out << "\n";
  print_table(ctx.out, h, rows);
  return failed ? kExitFailed : kExitOk;
}

}  // namespace attnkit::cli
