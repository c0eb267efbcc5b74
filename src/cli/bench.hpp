// `attnkit bench` results and their three renderings (terminal table, JSON, Markdown). Internal to
// attnkit_cli_lib: bench.cpp measures, bench_report.cpp writes.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace attnkit::cli {

// Where and how a bench run was made: the header of every report.
struct BenchHeader {
  std::string date_utc;
  std::string cpu;
  int threads = 0;
  std::string simd_target;
  std::string blas;
  double sgemm_gflops = 0.0;  // OpenBLAS sgemm kSgemmN^3 on `threads` threads, best of kSgemmRepeats
  int sgemm_n = 0;
  std::string git_commit;
  std::string command;
  std::string version;
  double min_time_s = 0.0;
  std::uint64_t seed = 0;
};

// One op's timing: the median (and fastest) of `samples` samples, each `runs_per_sample` back-to-back runs.
struct Timing {
  double median_s = 0.0;
  double min_s = 0.0;
  int samples = 0;
  int runs_per_sample = 0;
};

// One case x dtype. Errors are scaled errors against the float64 reference; times exist only for rows whose
// fused output passed.
struct BenchRow {
  std::string label;
  std::string file;
  std::string dtype;
  std::string kernel;  // Attention::describe()
  double flops = 0.0;        // CaseData::flops()
  double min_bytes = 0.0;    // Q, K, V (and mask, key lengths, sinks) read once, O (and LSE) written once
  double bound = 0.0;        // testing::tolerance(dtype)
  std::optional<double> fused_error, unfused_error;
  std::optional<Timing> fused, unfused;
  std::string status = "ok";  // "ok", or what failed
  bool failed = false;

  double gflops(const Timing& t) const { return flops / t.median_s / 1e9; }
  double gbps(const Timing& t) const { return min_bytes / t.median_s / 1e9; }
  std::optional<double> speedup() const {
    if (!fused || !unfused) return std::nullopt;
    return unfused->median_s / fused->median_s;
  }
};

// The compact table printed last.
void print_table(std::ostream& out, const BenchHeader& header, const std::vector<BenchRow>& rows);
// The same results with the header, as JSON and as Markdown.
void write_json(std::ostream& out, const BenchHeader& header, const std::vector<BenchRow>& rows);
void write_markdown(std::ostream& out, const BenchHeader& header, const std::vector<BenchRow>& rows);
// One line per case/dtype pair under a header line (every number, empty where none; no header block).
void write_csv(std::ostream& out, const std::vector<BenchRow>& rows);

}  // namespace attnkit::cli
