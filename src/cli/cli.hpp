// The attnkit command-line tool as a library: `info`, `verify` and `bench`.
//
// `run` is the whole program: it parses the arguments, runs one subcommand and returns the exit code
// (0: success; 1: a check failed or a run broke; 2 and CLI11's codes: bad command-line input). It keeps no
// global state and never calls std::exit, so the executable (main.cpp) and the Python extension share it.
#pragma once

#include <functional>
#include <iosfwd>

namespace attnkit::cli {

// argv[0] is the program name, as in main(). Output goes to std::cout, messages to std::cerr.
int run(int argc, const char* const* argv);

// The same, writing to the given streams (for callers that capture the output).
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// The same, asking `stop` between work items (cases of verify and bench) whether to stop: when it says so, the
// run ends there with exit code 130 (the shell's code for Ctrl-C). The Python extension checks for signals.
int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err, const std::function<bool()>& stop);

}  // namespace attnkit::cli
