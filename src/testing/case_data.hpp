// One case made concrete: random inputs of one dtype in the case's layout, the problem, the buffers, and
// the checks every consumer applies (scaled error against the float64 reference, poison, untouched gaps).
#pragma once

#include "cases.hpp"

#include <attnkit/attention.hpp>

#include <cpu/reference.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace attnkit::testing {

// The accuracy bounds of the contract (scaled error).
double tolerance(DType dtype);
// The CPU's LSE bound (|lse - ref| / max(1, |ref|)) per element type: 1e-5, except bfloat16, which the AMX tiles
// take with P rounded to bfloat16 (docs/numerics.md): the row's sum adds the rounded values, each within 2^-9 of P
// (relative), so the sum is within 2^-9 and its logarithm within 2^-9 (absolute) of the exact one; 2^-8 leaves
// room for the float32 roundings. (CPUs without AMX hold a bfloat16 LSE to 1e-5; this is the bound either way.)
double cpu_lse_tolerance(DType dtype);

class CaseData {
 public:
  // Fresh inputs drawn from `seed` (normal, std spec.input_std, rounded to `dtype`).
  CaseData(const CaseSpec& spec, DType dtype, std::uint64_t seed);

  const CaseSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }
  // The problem as the case describes it (not yet normalised).
  const AttentionProblem& problem() const { return problem_; }
  // Buffers of this case; `o` and `lse` point at this object's output buffers.
  AttentionArgs args();

  // Fills O and LSE (every element, gaps included) with a NaN pattern that no kernel writes.
  void poison_outputs();
  // True when every element of the O and LSE buffers that the layout does not reach still holds the poison.
  bool gaps_untouched() const;
  // A copy of the O and LSE buffers, to compare two runs bit for bit.
  std::vector<std::byte> output_bytes() const;

  // The float64 reference of these inputs.
  cpu::ReferenceResult reference() const;
  // max |out - ref| / max |ref| over the output (NaN where the reference is NaN is a match; NaN or inf
  // elsewhere, or a number where the reference is NaN, gives +inf).
  double scaled_error(const cpu::ReferenceResult& ref) const;
  // The same for the LSE output (absolute error, since LSE values are O(1) to O(log k_len)).
  double lse_error(const cpu::ReferenceResult& ref) const;

  // The per-batch key lengths (empty without them), and new ones for the next reference (a test that rewrites
  // the lengths a device run reads).
  const std::vector<std::int32_t>& key_lengths() const { return key_lengths_; }
  void set_key_lengths(std::vector<std::int32_t> lengths) { key_lengths_ = std::move(lengths); }

  // Estimated floating-point operations: 4 * B * H * visible (q, k) pairs * head_dim.
  double flops() const;

 private:
  CaseSpec spec_;
  DType dtype_;
  AttentionProblem problem_;
  AttentionProblem normalized_;
  std::vector<std::byte> qkv_;  // Q, K, V (one buffer for packed layouts, else three regions)
  std::int64_t q_elems_ = 0, k_elems_ = 0, v_elems_ = 0;
  std::int64_t q_base_ = 0, k_base_ = 0, v_base_ = 0;  // element offset of each tensor's region
  std::vector<std::byte> o_;
  std::int64_t o_elems_ = 0;
  std::vector<float> mask_;
  std::vector<std::int32_t> key_lengths_;
  std::vector<float> sinks_;
  std::vector<std::int32_t> offsets_;
  std::vector<float> lse_;
};

}  // namespace attnkit::testing
