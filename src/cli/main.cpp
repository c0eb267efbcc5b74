// The `attnkit` executable: everything lives in attnkit_cli_lib (cli.hpp). First, the BLAS the bench's
// baseline runs on gets its right kernels (blas_core.hpp: may run the program again with OPENBLAS_CORETYPE set).
#include "cli/blas_core.hpp"
#include "cli/cli.hpp"

int main(int argc, char** argv) {
  attnkit::cli::prefer_tuned_blas_core(argv);
  return attnkit::cli::run(argc, argv);
}
