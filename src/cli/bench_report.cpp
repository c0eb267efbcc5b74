// The renderings of a bench run: a compact terminal table, JSON (every number, for scripts) and Markdown
// (for bench/results/). All three show the same rows; the columns are explained in bench/results/README.md.
#include "cli/bench.hpp"

#include "cli/commands.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace attnkit::cli {
namespace {

using Json = nlohmann::ordered_json;

std::string fixed(const std::optional<double>& v, const char* fmt) { return v ? strprintf(fmt, *v) : "-"; }

// One row's cells, shared by the table and the Markdown.
struct Cells {
  std::string fused_ms, fused_gflops, fused_gbps, unfused_ms, unfused_gflops, speedup, pct_sgemm, fused_err,
      unfused_err;
};

Cells cells_of(const BenchRow& r, const BenchHeader& h) {
  Cells c;
  auto opt = [](bool has, double v) { return has ? std::optional<double>(v) : std::nullopt; };
  c.fused_ms = fixed(opt(r.fused.has_value(), r.fused ? r.fused->median_s * 1e3 : 0), "%.4g");
  c.fused_gflops = fixed(opt(r.fused.has_value(), r.fused ? r.gflops(*r.fused) : 0), "%.1f");
  c.fused_gbps = fixed(opt(r.fused.has_value(), r.fused ? r.gbps(*r.fused) : 0), "%.1f");
  c.unfused_ms = fixed(opt(r.unfused.has_value(), r.unfused ? r.unfused->median_s * 1e3 : 0), "%.4g");
  c.unfused_gflops = fixed(opt(r.unfused.has_value(), r.unfused ? r.gflops(*r.unfused) : 0), "%.1f");
  c.speedup = fixed(r.speedup(), "%.2f");
  c.pct_sgemm = fixed(opt(r.fused.has_value() && h.sgemm_gflops > 0,
                          r.fused ? 100.0 * r.gflops(*r.fused) / h.sgemm_gflops : 0),
                      "%.1f");
  c.fused_err = fixed(r.fused_error, "%.1e");
  c.unfused_err = fixed(r.unfused_error, "%.1e");
  return c;
}

Json timing_json(const BenchRow& r, const std::optional<Timing>& t, const std::optional<double>& error) {
  Json j;
  j["error"] = error ? Json(*error) : Json(nullptr);
  if (!t) {
    j["ms"] = nullptr;
    return j;
  }
  j["ms"] = t->median_s * 1e3;
  j["min_ms"] = t->min_s * 1e3;
  j["gflops"] = r.gflops(*t);
  j["gbps"] = r.gbps(*t);
  j["samples"] = t->samples;
  j["runs_per_sample"] = t->runs_per_sample;
  return j;
}

// Markdown cells must not contain '|'.
std::string md_escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

void print_table(std::ostream& out, const BenchHeader& h, const std::vector<BenchRow>& rows) {
  std::size_t width = 4;
  for (const auto& r : rows) width = std::max(width, r.label.size());
  const int w = static_cast<int>(width);
  out << strprintf("%-*s  %-8s  %10s  %8s  %7s  %10s  %8s  %8s  %7s  %9s  %9s  %s\n", w, "case", "dtype", "fused ms",
                   "GFLOP/s", "GB/s", "unfused ms", "GFLOP/s", "speed-up", "%sgemm", "err fused", "err unfus",
                   "status");
  for (const auto& r : rows) {
    const Cells c = cells_of(r, h);
    out << strprintf("%-*s  %-8s  %10s  %8s  %7s  %10s  %8s  %8s  %7s  %9s  %9s  %s\n", w, r.label.c_str(),
                     r.dtype.c_str(), c.fused_ms.c_str(), c.fused_gflops.c_str(), c.fused_gbps.c_str(),
                     c.unfused_ms.c_str(), c.unfused_gflops.c_str(), c.speedup.c_str(), c.pct_sgemm.c_str(),
                     c.fused_err.c_str(), c.unfused_err.c_str(), r.status.c_str());
  }
  out << strprintf("%d threads, %s; %%sgemm: fused GFLOP/s over OpenBLAS sgemm %d^3 (%.1f GFLOP/s); medians of %.2g s "
                   "per op\n",
                   h.threads, h.simd_target.c_str(), h.sgemm_n, h.sgemm_gflops, h.min_time_s);
}

void write_json(std::ostream& out, const BenchHeader& h, const std::vector<BenchRow>& rows) {
  Json doc;
  Json& head = doc["header"];
  head["date_utc"] = h.date_utc;
  head["cpu"] = h.cpu;
  head["threads"] = h.threads;
  head["simd_target"] = h.simd_target;
  head["blas"] = h.blas;
  head["sgemm_n"] = h.sgemm_n;
  head["sgemm_gflops"] = h.sgemm_gflops;
  head["git_commit"] = h.git_commit;
  head["command"] = h.command;
  head["attnkit_version"] = h.version;
  head["min_time_s"] = h.min_time_s;
  head["seed"] = h.seed;
  Json& results = doc["results"];
  results = Json::array();
  for (const auto& r : rows) {
    Json j;
    j["case"] = r.label;
    j["file"] = r.file;
    j["dtype"] = r.dtype;
    j["kernel"] = r.kernel;
    j["flops"] = r.flops;
    j["min_bytes"] = r.min_bytes;
    j["bound"] = r.bound;
    j["fused"] = timing_json(r, r.fused, r.fused_error);
    j["unfused"] = timing_json(r, r.unfused, r.unfused_error);
    const auto s = r.speedup();
    j["speedup"] = s ? Json(*s) : Json(nullptr);
    j["pct_sgemm"] = r.fused && h.sgemm_gflops > 0 ? Json(100.0 * r.gflops(*r.fused) / h.sgemm_gflops) : Json(nullptr);
    j["status"] = r.status;
    results.push_back(std::move(j));
  }
  out << doc.dump(2) << "\n";
}

void write_markdown(std::ostream& out, const BenchHeader& h, const std::vector<BenchRow>& rows) {
  out << "# attnkit CPU benchmark, " << h.date_utc << "\n\n"
      << "| | |\n|---|---|\n"
      << "| date (UTC) | " << h.date_utc << " |\n"
      << "| CPU | " << md_escape(h.cpu) << " |\n"
      << "| threads | " << h.threads << " |\n"
      << "| SIMD target | " << h.simd_target << " |\n"
      << "| BLAS | " << md_escape(h.blas) << " |\n"
      << "| OpenBLAS sgemm " << h.sgemm_n << "³ | " << strprintf("%.1f", h.sgemm_gflops) << " GFLOP/s |\n"
      << "| git commit | " << h.git_commit << " |\n"
      << "| attnkit | " << h.version << " |\n"
      << "| timing | warm-up, then the median of samples filling " << strprintf("%.2g", h.min_time_s)
      << " s per op, fused and unfused alternating; seed " << h.seed << " |\n"
      << "| command | `" << md_escape(h.command) << "` |\n\n";
  out << "| case | dtype | fused ms | fused GFLOP/s | fused GB/s | unfused ms | unfused GFLOP/s | speed-up | % of sgemm "
         "| error fused | error unfused | status | kernel |\n"
      << "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|\n";
  for (const auto& r : rows) {
    const Cells c = cells_of(r, h);
    out << "| " << md_escape(r.label) << " | " << r.dtype << " | " << c.fused_ms << " | " << c.fused_gflops << " | "
        << c.fused_gbps << " | " << c.unfused_ms << " | " << c.unfused_gflops << " | " << c.speedup << " | "
        << c.pct_sgemm << " | " << c.fused_err << " | " << c.unfused_err << " | " << md_escape(r.status) << " | "
        << md_escape(r.kernel) << " |\n";
  }
}

void write_csv(std::ostream& out, const std::vector<BenchRow>& rows) {
  out << "case,file,dtype,fused_ms,unfused_ms,speedup,fused_gflops,fused_gbps,fused_error,unfused_error,bound,status\n";
  auto num = [](bool has, double v, const char* fmt) { return has ? strprintf(fmt, v) : std::string(); };
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const BenchRow& r : rows) {
    const auto speedup = r.speedup();
    out << quoted(r.label) << ',' << quoted(r.file) << ',' << r.dtype << ','
        << num(r.fused.has_value(), r.fused ? r.fused->median_s * 1e3 : 0, "%.6g") << ','
        << num(r.unfused.has_value(), r.unfused ? r.unfused->median_s * 1e3 : 0, "%.6g") << ','
        << num(speedup.has_value(), speedup.value_or(0), "%.4f") << ','
        << num(r.fused.has_value(), r.fused ? r.gflops(*r.fused) : 0, "%.4g") << ','
        << num(r.fused.has_value(), r.fused ? r.gbps(*r.fused) : 0, "%.4g") << ','
        << num(r.fused_error.has_value(), r.fused_error.value_or(0), "%.3e") << ','
        << num(r.unfused_error.has_value(), r.unfused_error.value_or(0), "%.3e") << ',' << strprintf("%.1e", r.bound)
        << ',' << quoted(r.status) << '\n';
  }
}

}  // namespace attnkit::cli
