// append_kv on the CPU: the rows copied into the host caches (the values were checked before: kv_append.cpp).
#pragma once

#include <attnkit/kv_append.hpp>

namespace attnkit::cpu {

void append_kv(const KvAppendProblem& problem, const KvAppendArgs& args);

}  // namespace attnkit::cpu
