// `attnkit info`: what this build runs on this machine.
#include "cli/commands.hpp"

#include <attnkit/attention.hpp>
#include <attnkit/vulkan.hpp>
#include <cpu/tiled_kernel.hpp>
#include <testing/unfused_blas.hpp>

#include "cli/blas_core.hpp"

#include <omp.h>

#include <map>
#include <thread>

namespace attnkit::cli {

CLI::App* add_info_command(CLI::App& app, InfoOptions& opts) {
  CLI::App* cmd = app.add_subcommand("info", "Library version, backends, SIMD target, threads, BLAS, case list");
  cmd->add_option("--cases", opts.cases_dir, "Directory of case files (*.json)")->capture_default_str();
  return cmd;
}

int run_info(const InfoOptions& opts, Context& ctx) {
  std::ostream& out = ctx.out;
  std::vector<std::string> backends;
  for (Backend b : available_backends()) backends.push_back(backend_name(b));

  out << "attnkit " << library_version() << "\n";
  out << "  backends:    " << join(backends, ", ") << "\n";
  out << "  cpu kernel:  tiled online softmax, SIMD target " << cpu::simd_target_name()
      << " (Highway runtime dispatch), " << cpu::kRowBlock << " query rows x " << cpu::kKeyTile << "-key tiles\n";
  out << "  threads:     " << omp_get_max_threads() << " (OpenMP max threads; " << std::thread::hardware_concurrency()
      << " hardware threads)\n";
  out << "  cpu:         " << cpu_model() << "\n";
  const std::string note = blas_core_note();
  out << "  blas:        " << testing::blas_info() << (note.empty() ? "" : "; " + note) << "\n";
  // Every Vulkan device the loader finds (none without a loader, a driver or the backend in the build).
  for (const vulkan::DeviceInfo& d : vulkan::devices()) {
    out << "  vulkan:      [" << d.index << "] " << d.name << " (" << d.type << ", " << d.driver << ", Vulkan "
        << (d.api_version >> 22) << "." << ((d.api_version >> 12) & 0x3ff) << ", subgroup " << d.subgroup_size
        << (d.cooperative_matrix ? ", float16 cooperative matrices" : "") << (d.usable ? "" : ", not usable")
        << ")\n";
  }

  // The case list is a convenience here: a broken one is reported, not fatal.
  try {
    const auto cases = load_case_files(opts.cases_dir);
    std::map<std::string, int> tags;
    for (const auto& c : cases)
      for (const auto& t : c.tags) ++tags[t];
    std::vector<std::string> tag_counts;
    for (const auto& [t, n] : tags) tag_counts.push_back(t + " " + std::to_string(n));
    out << "  cases:       " << opts.cases_dir << " (" << cases.size() << " cases"
        << (tag_counts.empty() ? "" : "; tags: " + join(tag_counts, ", ")) << ")\n";
  } catch (const std::exception& e) {
    out << "  cases:       " << opts.cases_dir << " (unreadable: " << e.what() << ")\n";
  }
  return kExitOk;
}

}  // namespace attnkit::cli
