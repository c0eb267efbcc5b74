// `attnkit verify`: every selected case x dtype against the float64 reference, the way the tests check it:
// poisoned outputs, scaled error under the contract's bound, gaps between rows untouched, and two runs
// bit-identical.
#include "cli/commands.hpp"

#include <testing/case_data.hpp>
#include <testing/device_mirror.hpp>

#include <chrono>
#include <cmath>
#include <memory>

namespace attnkit::cli {
namespace {

// The LSE output is float32 whatever the dtype; its error is relative to max(1, |lse|) (see
// CaseData::lse_error), so float32's bound applies.
constexpr double kLseTolerance = 1e-5;

struct Outcome {
  bool pass = false;
  double error = 0.0;
  double bound = 0.0;
  std::string describe;
  std::vector<std::string> problems;
};

// A backend by name; one this build cannot run here is a usage error, not 300 failed cases.
Backend parse_backend(const std::string& name) {
  std::vector<std::string> available{"auto"};
  for (Backend b : available_backends()) {
    available.push_back(backend_name(b));
    if (backend_name(b) == name) return b;
  }
  if (name == "auto") return Backend::Auto;
  for (Backend b : {Backend::Cpu, Backend::Reference, Backend::Cuda, Backend::Vulkan}) {
    if (backend_name(b) == name)
      throw UsageError("--backend: '" + name + "' is not available here (available: " + join(available, ", ") + ")");
  }
  throw UsageError("--backend: unknown backend '" + name + "' (available: " + join(available, ", ") + ")");
}

Outcome verify_one(const Job& job, Backend backend, const SelectionOptions& sel) {
  Outcome r;
  r.bound = testing::tolerance(job.dtype);
  try {
    testing::CaseData data(job.spec, job.dtype, sel.seed);
    AttentionConfig config;
    config.backend = backend;
    config.threads = sel.threads;
    Attention op(data.problem(), config);
    r.describe = op.describe();
    const auto ref = data.reference();
    // The CUDA backend runs on device copies of the case (outputs poisoned, run, copied back).
    std::unique_ptr<testing::DeviceMirror> device;
    if (backend == Backend::Cuda) device = std::make_unique<testing::DeviceMirror>(data);
    auto run_once = [&] {
      if (device) {
        device->run(op);
      } else {
        data.poison_outputs();
        op.run(data.args());
      }
    };

    run_once();
    r.error = data.scaled_error(ref);
    if (!(r.error <= r.bound)) r.problems.push_back("error above bound");
    if (job.spec.lse) {
      const double lse = data.lse_error(ref);
      if (!(lse <= kLseTolerance)) r.problems.push_back(strprintf("lse error %.2e above %.0e", lse, kLseTolerance));
    }
    if (!data.gaps_untouched()) r.problems.push_back("wrote outside the output layout");
    const std::vector<std::byte> first = data.output_bytes();

    run_once();
    if (data.output_bytes() != first) r.problems.push_back("second run differs bitwise");
  } catch (const std::exception& e) {
    r.error = std::nan("");
    r.problems.push_back(std::string("threw: ") + e.what());
  }
  r.pass = r.problems.empty();
  return r;
}

}  // namespace

CLI::App* add_verify_command(CLI::App& app, VerifyOptions& opts) {
  CLI::App* cmd = app.add_subcommand("verify", "Check every selected case x dtype against the float64 reference");
  add_selection_options(*cmd, opts.select, "");
  cmd->add_option("--backend", opts.backend, "Backend to check: cpu, reference, cuda, vulkan or auto")->capture_default_str();
  return cmd;
}

int run_verify(const VerifyOptions& opts, Context& ctx) {
  const Backend backend = parse_backend(opts.backend);
  const std::vector<Job> jobs = select_jobs(opts.select, "");
  if (opts.select.list) {
    print_jobs(ctx.out, jobs);
    return kExitOk;
  }

  ctx.out << strprintf("verify: %zu case/dtype pairs, %s backend, %d threads, seed %llu\n", jobs.size(),
                       opts.backend.c_str(), resolve_threads(opts.select.threads),
                       static_cast<unsigned long long>(opts.select.seed));
  std::size_t width = 4;
  for (const Job& j : jobs) width = std::max(width, j.label.size());
  const auto start = std::chrono::steady_clock::now();
  int passed = 0, failed = 0;
  for (const Job& job : jobs) {
    if (ctx.should_stop()) {
      ctx.out << strprintf("interrupted: %d passed, %d failed, %zu not run", passed, failed,
                           jobs.size() - static_cast<std::size_t>(passed + failed))
              << std::endl;
      return kExitInterrupted;
    }
    const Outcome r = verify_one(job, backend, opts.select);
    std::string line = progress(static_cast<std::size_t>(passed + failed + 1), jobs.size(), start) +
                       strprintf(" %s  %-*s  %-8s  err %.2e  bound %.0e", r.pass ? "PASS" : "FAIL",
                                 static_cast<int>(width), job.label.c_str(), dtype_string(job.dtype).c_str(), r.error,
                                 r.bound);
    if (!r.describe.empty()) line += "  " + r.describe;
    if (!r.pass) line += "  [" + join(r.problems, "; ") + "]";
    ctx.out << line << std::endl;  // flushed: a long run shows progress
    (r.pass ? passed : failed) += 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ctx.out << strprintf("%d passed, %d failed in %.1f s", passed, failed, seconds) << std::endl;
  return failed == 0 ? kExitOk : kExitFailed;
}

}  // namespace attnkit::cli
