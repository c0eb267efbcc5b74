// The README's C++ example, compiled with the project so that it stays true.
#include <attnkit/attention.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

int main() {
  using namespace attnkit;
  // BERT-base self-attention, as a projection leaves it: [batch, seq, heads, dim], float32.
  AttentionProblem p = AttentionProblem::positions_first(/*batch*/ 8, /*heads*/ 12, /*kv_heads*/ 12,
                                                         /*q_len*/ 512, /*k_len*/ 512, /*head_dim*/ 64);
  p.has_key_lengths = true;                     // right padding: keys past each length are hidden
  std::vector<float> q(8 * 512 * 12 * 64, 0.1f), k(q), v(q), o(q.size());
  std::vector<int> lengths{512, 300, 512, 17, 512, 512, 1, 512};
  Attention op(p);                              // checks the problem, plans the kernel
  std::vector<std::byte> scratch(op.scratch_bytes() + 64);  // optional: run() never allocates with it
  AttentionArgs a;
  a.q = {q.data(), (long)q.size()}; a.k = {k.data(), (long)k.size()}; a.v = {v.data(), (long)v.size()};
  a.o = {o.data(), (long)o.size()};
  a.key_lengths = {lengths.data(), (long)lengths.size()};
  a.scratch = scratch.data() + (64 - reinterpret_cast<std::uintptr_t>(scratch.data()) % 64) % 64;
  a.scratch_bytes = op.scratch_bytes();
  op.run(a);                                    // throws attnkit::Error (naming the argument) before writing anything
}
