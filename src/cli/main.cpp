// The `attnkit` executable: everything lives in attnkit_cli_lib (cli.hpp).
#include "cli/cli.hpp"

int main(int argc, char** argv) { return attnkit::cli::run(argc, argv); }
