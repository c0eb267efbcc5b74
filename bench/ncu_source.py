#!/usr/bin/env python3
"""Where one attention kernel's warps wait, instruction by instruction (Nsight Compute's PC sampling).

Runs the timing tool (bench/cuda_timing.cpp) under `ncu` with the SourceCounters section, caches left warm
(`--cache-control none`: a kernel in a model runs after others, not after a flush) and the sampling interval at
its shortest, on one launch of the attention kernel after ten; then prints the stall reasons summed over the
kernel and the SASS instructions with the most samples, each with its two largest reasons. The raw source page
goes to OUT/<name>.csv.gz.

    usage: bench/ncu_source.py TIMING_BINARY CASE [DTYPE] [--top N] [--out DIR]
"""
import argparse
import collections
import csv
import gzip
import io
import os
import subprocess
import sys


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timing")
    ap.add_argument("case")
    ap.add_argument("dtype", nargs="?", default="float16")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    name = f"ncu_source_{args.case}_{args.dtype}"
    rep = os.path.join("/tmp", name)
    collect = run(["ncu", "--clock-control", "none", "--cache-control", "none", "--kernel-name", "regex:attention",
                   "--launch-skip", "10", "--launch-count", "1", "--section", "SourceCounters", "--section",
                   "WarpStateStats", "--warp-sampling-interval", "0", "--force-overwrite", "-o", rep, args.timing,
                   args.case, args.dtype])
    if not os.path.exists(rep + ".ncu-rep"):
        print(collect.stdout[-3000:], collect.stderr[-3000:])
        return 1
    page = run(["ncu", "--import", rep + ".ncu-rep", "--page", "source", "--print-source", "sass", "--csv"])
    with gzip.open(os.path.join(args.out, name + ".csv.gz"), "wt") as f:
        f.write(page.stdout)
    lines = page.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if start is None:
        print("no source table in ncu's output:", page.stdout[:2000], page.stderr[:2000])
        return 1
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    columns = list(rows[0].keys()) if rows else []
    total_col = next((c for c in columns if c.startswith("Warp Stall Sampling (All")), None)
    if total_col is None:
        print("columns:", columns)
        return 1
    # Per-reason sample columns: "stall_<reason>" style names differ between versions; take every column whose
    # name holds "Stall" or "stalled" other than the totals.
    reason_cols = [c for c in columns if c != total_col and ("stall" in c.lower()) and "Sampling" not in c]
    total = sum(number(r[total_col]) for r in rows)
    print(f"## {args.case} ({args.dtype}): {total:.0f} samples over {len(rows)} SASS instructions")
    sums = collections.Counter()
    for r in rows:
        for c in reason_cols:
            sums[c] += number(r[c])
    if sums:
        print("\n| stall reason | share of samples |\n|---|---|")
        for c, v in sums.most_common(12):
            print(f"| {c} | {100 * v / max(total, 1):.1f}% |")
    print(f"\n| address | SASS | samples | share | top reasons |\n|---|---|---|---|---|")
    ranked = sorted(rows, key=lambda r: -number(r[total_col]))[: args.top]
    for r in ranked:
        v = number(r[total_col])
        top = sorted(((number(r[c]), c) for c in reason_cols), reverse=True)[:2]
        reasons = ", ".join(f"{c} {x:.0f}" for x, c in top if x > 0)
        print(f"| {r.get('Address', '?')} | `{r.get('Source', '?').strip()[:60]}` | {v:.0f} | "
              f"{100 * v / max(total, 1):.1f}% | {reasons} |")
    # Samples in address order, in buckets of 64 instructions: where along the code the time goes.
    print("\n| instructions | samples | share |\n|---|---|---|")
    bucket = collections.Counter()
    for i, r in enumerate(rows):
        bucket[i // 64] += number(r[total_col])
    for b in sorted(bucket):
        if bucket[b] >= 0.01 * total:
            first = rows[b * 64].get("Address", str(b * 64))
            print(f"| {first} + 64 | {bucket[b]:.0f} | {100 * bucket[b] / max(total, 1):.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
