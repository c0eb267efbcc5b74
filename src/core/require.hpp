// The one way a rule of the contract is checked. A macro so that the message (often built with std::to_string)
// is assembled only when the check fails: a plan runs dozens of checks on every call of a decode loop.
#pragma once

#include <attnkit/error.hpp>

#define ATTNKIT_REQUIRE(ok, argument, rule)                                   \
  do {                                                                        \
    if (!(ok)) throw ::attnkit::Error((argument), (rule));                   \
  } while (0)
