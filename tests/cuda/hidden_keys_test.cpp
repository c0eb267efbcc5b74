// Keys outside every row's range of a block never reach its output (docs/numerics.md), on every kernel that
// accepts the problem: NaN (all-ones bits) in K and V at such keys leaves the rows' bits as they were with the
// clean inputs. The tile kernels read those keys where a block's range starts or ends inside a tile (its first
// and last tiles), and must zero their V rows before O += P V (0 x NaN is NaN): a causal block's last tile, a
// sliding window's first tile, a batch entry's key length inside a tile.
//
// A row is checked where no row of its 128-row chunk of the K/V head's rows (the rows of a K/V head in
// (query, head) order, as the kernels' blocks take them; every block is such a chunk or part of one) sees a
// poisoned key; rows that may share a block with a row that sees one are left out (a key hidden from one row of
// a block but seen by another may bring NaN into the hidden row on the tensor-core kernels, as documented).
#include <testing/case_data.hpp>
#include <testing/device_mirror.hpp>

#include "forced_plan.hpp"
#include "gpu_test_support.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace attnkit::testing {
namespace {

constexpr std::int64_t kChunkRows = 128;

// The keys [begin, end) of batch entry b, poisoned (in K and V of every K/V head).
struct Poison {
  std::int64_t begin, end;
};

struct Scenario {
  std::string name;
  CaseSpec spec;
  // The poisoned keys of batch entry b.
  std::function<Poison(std::int64_t b)> poison;
  // Whether query i of entry b sees no poisoned key (the rule, from the case's own terms).
  std::function<bool(std::int64_t b, std::int64_t i)> query_clean;
};

// NaN in K and V at entry b's poisoned keys of every K/V head, on the device.
void poison_keys(const CaseData& data, DeviceMirror& dev, const Scenario& s) {
  const AttentionProblem& p = data.problem();
  const std::size_t es = dtype_size(data.dtype());
  AttentionArgs& args = dev.device_args();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Poison keys = s.poison(b);
    if (keys.begin >= keys.end) continue;
    for (std::int64_t h = 0; h < p.kv_heads; ++h) {
      struct Cache { const void* data; Layout layout; std::int64_t dim; };
      for (const Cache& c : {Cache{args.k.data, p.k, p.head_dim}, Cache{args.v.data, p.v, p.v_head_dim}}) {
        auto* at = static_cast<char*>(const_cast<void*>(c.data)) + c.layout.index(b, h, keys.begin) * es;
        check(cudaMemset(at, 0xff, ((keys.end - keys.begin - 1) * c.layout.row_stride + c.dim) * es));
      }
    }
  }
}

// Whether output row (b, h, i) is checked: every query of its 128-row chunk of the K/V head's rows sees no
// poisoned key.
bool row_checked(const AttentionProblem& p, const Scenario& s, std::int64_t b, std::int64_t h, std::int64_t i) {
  const std::int64_t group = p.heads / p.kv_heads;
  const std::int64_t row = i * group + h % group;
  const std::int64_t first = row / kChunkRows * kChunkRows;
  const std::int64_t last = std::min(first + kChunkRows, p.q_len * group) - 1;
  for (std::int64_t q = first / group; q <= last / group; ++q) {
    if (!s.query_clean(b, q)) return false;
  }
  return true;
}

// The scenario on the plan's kernel and every other kernel that accepts it: the clean inputs' outputs, then the
// poisoned inputs' on the same kernels; the checked rows' bytes must match (and be the reference's, clean).
void check_scenario(const Scenario& s, DType t) {
  SCOPED_TRACE(s.name + " d " + std::to_string(s.spec.head_dim) + " " + std::string(dtype_name(t)));
  CaseData data(s.spec, t, 83);
  const AttentionProblem& p = data.problem();
  DeviceMirror dev(data);
  std::vector<std::string> plans{"", "off=plain"};
  for (const std::string& k : plan_kernel_names()) plans.push_back("kernel=" + k);
  std::vector<Attention> ops;
  std::vector<std::string> shown;
  for (const std::string& plan : plans) {
    Attention op(p, cuda_config(plan));
    if (std::find(shown.begin(), shown.end(), op.describe()) != shown.end()) continue;
    shown.push_back(op.describe());
    ops.push_back(std::move(op));
  }
  const auto ref = data.reference();
  std::vector<std::vector<std::byte>> clean;
  for (Attention& op : ops) {
    dev.run(op);
    EXPECT_LE(data.scaled_error(ref), tolerance(t)) << op.describe();
    clean.push_back(data.output_bytes());
  }
  poison_keys(data, dev, s);
  const std::size_t es = dtype_size(t);
  for (std::size_t k = 0; k < ops.size(); ++k) {
    dev.run(ops[k]);
    const std::vector<std::byte> poisoned = data.output_bytes();
    std::int64_t checked = 0, differing = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t i = 0; i < p.q_len; ++i) {
          if (!row_checked(p, s, b, h, i)) continue;
          const std::size_t at = static_cast<std::size_t>(p.o.index(b, h, i)) * es;
          ++checked;
          differing += std::memcmp(&clean[k][at], &poisoned[at], static_cast<std::size_t>(p.v_head_dim) * es) != 0;
        }
      }
    }
    EXPECT_GT(checked, p.batch * p.heads * p.q_len / 4) << "too few rows clear of the poisoned keys";
    EXPECT_EQ(differing, 0) << "rows of " << checked << " changed by keys they cannot see: " << ops[k].describe();
  }
}

TEST(CudaHiddenKeys, KeysOutsideEveryRowOfABlockNeverReachItsOutputOnEveryKernel) {
  SKIP_WITHOUT_GPU();
  for (const std::int64_t d : {64, 128, 256}) {
    CaseSpec base;
    base.name = "hidden";
    base.batch = 2; base.heads = 16; base.kv_heads = 4; base.q_len = 333; base.k_len = 333; base.head_dim = d;
    // Causal: the last keys, hidden from every query before them (a block ending at query 287 reads the tile
    // of keys 256-383 and must zero keys 288 on).
    Scenario tail{"causal, last keys poisoned", base, [](std::int64_t) { return Poison{300, 333}; },
                  [](std::int64_t, std::int64_t i) { return i < 300; }};
    tail.spec.causal = true;
    // A sliding window of 64 keys (query i sees keys i - 63 to i): the first keys, behind every window from
    // query 79 on (a block of queries 96-127 starts at key 33, inside the tile of keys 0-127).
    Scenario head{"window, first keys poisoned", base, [](std::int64_t) { return Poison{0, 16}; },
                  [](std::int64_t, std::int64_t i) { return i - 63 >= 16; }};
    head.spec.causal = true;
    head.spec.window = 64;
    // Key lengths: every key past an entry's length (one inside a tile), no rule.
    Scenario lengths{"key lengths, keys past them poisoned", base, nullptr,
                     [](std::int64_t, std::int64_t) { return true; }};
    lengths.spec.q_len = 200;
    lengths.spec.key_lengths = KeyLengths::Random;
    for (DType t : {DType::f16, DType::bf16}) {
      check_scenario(tail, t);
      check_scenario(head, t);
      CaseData probe(lengths.spec, t, 83);  // (the case's own lengths, drawn from its seed)
      const std::vector<std::int32_t> k_lens = probe.key_lengths();
      lengths.poison = [k_lens](std::int64_t b) { return Poison{k_lens[b], 333}; };
      check_scenario(lengths, t);
    }
  }
}

}  // namespace
}  // namespace attnkit::testing
