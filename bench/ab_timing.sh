#!/usr/bin/env bash
# A/B of builds of the timing tool (bench/cuda_timing.cpp) in one device run: DIR holds timing_<variant> binaries
# (and lib/ with the shared libraries they need, from scripts/gpu-bundle); every variant runs every case three
# times, alternating, and the table keeps each one's fastest CUDA-graph time (float16). Raw lines: $OUT/ab.txt.
# A variant `name@VAR=value` runs timing_name with that environment variable set (a plan switch, say); a case
# shape:B,H,HKV,SQ,SK,D[,causal] times that shape.
#   usage: bench/ab_timing.sh DIR variant [variant ...]   (the ratio column: last variant / first)
set -euo pipefail
dir=$1; shift
OUT=${OUT:-.}
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cases=${AB_CASES:-"minilm_b1_s128 minilm_b8_s128 bert_b1_s128 bert_b8_s128 bert_b1_s512 bert_b8_s512 whisper_enc whisper_dec whisper_cross llama8b_decode_b8 fa3_h64_s4k"}
for round in 1 2 3; do
  for v in "$@"; do
    bin=${v%%@*} setting=()
    [[ "$v" == *@* ]] && setting=("${v#*@}")
    # (a shape:B,H,... case prints as "shape": its spec names it in the table)
    for c in $cases; do
      env "${setting[@]}" "$dir/timing_$bin" "$c" float16 | tail -n +2 | sed "s/^shape /$c /; s/^/$v r$round /"
    done
  done
done >"$OUT/ab.txt"
python3 - "$OUT/ab.txt" <<'PY'
import collections, sys
rows = collections.defaultdict(list)
variants, cases = [], []
for line in open(sys.argv[1]):
    f = line.split()  # variant round case dtype eager graph ...
    rows[(f[2], f[0])].append(float(f[5]))
    variants += [f[0]] if f[0] not in variants else []
    cases += [f[2]] if f[2] not in cases else []
print("| case | " + " | ".join(f"{v} graph us (min of 3)" for v in variants) + " | ratio |")
print("|---|" + "---|" * (len(variants) + 1))
for c in cases:
    vals = [min(rows[(c, v)]) for v in variants]
    print(f"| {c} | " + " | ".join(f"{x:.2f}" for x in vals) + f" | {vals[-1] / vals[0]:.3f} |")
PY
