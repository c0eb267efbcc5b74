#!/usr/bin/env bash
# Times a list of shapes under several plan overrides with the bundle's attnkit_cuda_timing (graph replay,
# median), one line per (shape, plan): the kernel-only A/B behind a plan heuristic, without Python or peers.
# With a second timing binary (another build), each (shape, plan) runs on both in turn, A then B, in the same
# device run: an A/B of two builds. A timing binary of a bundle links that bundle's shared library: each runs with
# the lib/ folder beside it first on the library path (copy a B bundle whole, binary and lib/, to its own folder).
#   usage: bench/cuda_timing_sweep.sh SPEC_FILE [timing-binary [timing-binary-B]]
#   SPEC_FILE lines: label | shape:... or pshape:... | dtype | plan;plan;...   ("" in the plan list: the plan's own)
set -uo pipefail
# The bundle's libraries (Highway, the C++ runtime) where the GPU image lacks them, as scripts/gpu-check sets them.
[ -d build/gpu-bundle/lib ] && export LD_LIBRARY_PATH="$PWD/build/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
spec=$1
bin=${2:-build/gpu-bundle/attnkit_cuda_timing}
bin_b=${3:-}
# The graph-replay microseconds and the plan's description of one run of a timing binary.
time_one() {
  local line
  line=$(LD_LIBRARY_PATH="$(cd "$(dirname "$1")" && pwd)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 60 "$1" "$2" "$3" "$4" 2>&1 | tail -1)
  # (columns: case, dtype, eager us, graph us, TFLOP/s, GB/s, then the plan's description)
  echo "$(echo "$line" | awk '{print $4}')|$(echo "$line" | sed -E 's/^([^ ]+ +){6}//' | cut -c1-150)"
}
if [ -n "$bin_b" ]; then
  printf '%-30s %-32s %9s %9s %6s  %s\n' label plan "A us" "B us" "A/B" "kernel (B)"
else
  printf '%-30s %-32s %9s  %s\n' label plan "graph us" kernel
fi
trim() { sed -E 's/^[[:space:]]+|[[:space:]]+$//g' <<<"$1"; }  # (not xargs: a quote in a comment line breaks it)
while IFS='|' read -r label shape dtype plans; do
  label=$(trim "$label"); shape=$(trim "$shape"); dtype=$(trim "$dtype")
  [[ -z "$label" || "$label" == \#* ]] && continue
  IFS=';' read -ra list <<<"$plans"
  [ "${#list[@]}" -eq 0 ] && list=("")
  for plan in "${list[@]}"; do
    plan=$(trim "$plan")
    IFS='|' read -r us kernel <<<"$(time_one "$bin" "$shape" "$dtype" "$plan")"
    if [ -n "$bin_b" ]; then
      IFS='|' read -r us_b kernel_b <<<"$(time_one "$bin_b" "$shape" "$dtype" "$plan")"
      ratio=$(awk -v a="$us" -v b="$us_b" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
      printf '%-30s %-32s %9s %9s %6s  %s\n' "$label" "${plan:-(plan)}" "$us" "$us_b" "$ratio" "$kernel_b"
    else
      printf '%-30s %-32s %9s  %s\n' "$label" "${plan:-(plan)}" "$us" "$kernel"
    fi
  done
done <"$spec"
