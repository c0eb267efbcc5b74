#!/usr/bin/env bash
# Times a list of shapes under several plan overrides with the bundle's attnkit_cuda_timing (graph replay,
# median), one line per (shape, plan): the kernel-only A/B behind a plan heuristic, without Python or peers.
#   usage: bench/cuda_timing_sweep.sh SPEC_FILE [timing-binary]
#   SPEC_FILE lines: label | shape:... or pshape:... | dtype | plan;plan;...   ("" in the plan list: the plan's own)
set -uo pipefail
spec=$1
bin=${2:-build/gpu-bundle/attnkit_cuda_timing}
printf '%-34s %-34s %10s  %s\n' label plan "graph us" kernel
while IFS='|' read -r label shape dtype plans; do
  label=$(echo "$label" | xargs); shape=$(echo "$shape" | xargs); dtype=$(echo "$dtype" | xargs)
  [[ -z "$label" || "$label" == \#* ]] && continue
  IFS=';' read -ra list <<<"$plans"
  for plan in "${list[@]}"; do
    plan=$(echo "$plan" | xargs)
    line=$(timeout 60 "$bin" "$shape" "$dtype" "$plan" 2>&1 | tail -1)
    us=$(echo "$line" | awk '{print $4}')
    kernel=$(echo "$line" | cut -c80- | cut -c1-150)
    printf '%-34s %-34s %10s  %s\n' "$label" "${plan:-(plan)}" "$us" "$kernel"
  done
done <"$spec"
