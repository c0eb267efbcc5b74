// The one exception type of the library: every rejected input names the argument and the rule it broke.
#pragma once

#include <stdexcept>
#include <string>

namespace attnkit {

class Error : public std::invalid_argument {
 public:
  Error(std::string argument, const std::string& rule)
      : std::invalid_argument(argument + ": " + rule), argument_(std::move(argument)) {}
  // The argument (or field) that broke the rule, e.g. "q.row_stride" or "key_lengths[3]".
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

// Raised when a backend fails while running (a CUDA error, say); input problems raise Error.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace attnkit
