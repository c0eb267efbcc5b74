// The program: one CLI11 app built per call (no global state), one subcommand run, an exit code returned.
#include "cli/cli.hpp"

#include "cli/commands.hpp"

#include <attnkit/error.hpp>

#include <iostream>

namespace attnkit::cli {

int run(int argc, const char* const* argv) { return run(argc, argv, std::cout, std::cerr); }

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  return run(argc, argv, out, err, std::function<bool()>{});
}

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err, const std::function<bool()>& stop) {
  CLI::App app{"attnkit: fused attention kernels. Describe the machine, verify the case list against the "
               "float64 reference, time the fused op against GEMM + softmax + GEMM, or run GroupQueryAttention's prefill and "
               "decode steps.",
               "attnkit"};
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", library_version());

  InfoOptions info_opts;
  VerifyOptions verify_opts;
  BenchOptions bench_opts;
  GqaBenchOptions gqa_opts;
  CLI::App* info = add_info_command(app, info_opts);
  CLI::App* verify = add_verify_command(app, verify_opts);
  CLI::App* bench = add_bench_command(app, bench_opts);
  CLI::App* gqa = add_gqa_command(app, gqa_opts);

  // An embedding caller may pass no program name; CLI11 expects one.
  const char* const fallback[] = {"attnkit"};
  if (argc < 1 || argv == nullptr) {
    argc = 1;
    argv = fallback;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err);  // --help and --version land here too, with code 0
  }

  Context ctx{out, err, quote_command_line(argc, argv), stop};
  try {
    if (info->parsed()) return run_info(info_opts, ctx);
    if (verify->parsed()) return run_verify(verify_opts, ctx);
    if (bench->parsed()) return run_bench(bench_opts, ctx);
    if (gqa->parsed()) return run_gqa(gqa_opts, ctx);
  } catch (const UsageError& e) {
    out.flush();
    err << "attnkit: error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    out.flush();
    err << "attnkit: failed: " << e.what() << "\n";
    return kExitFailed;
  }
  err << "attnkit: error: no subcommand\n";
  return kExitUsage;
}

}  // namespace attnkit::cli
