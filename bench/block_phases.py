#!/usr/bin/env python3
"""Sums up the cycle marks a build with ATTNKIT_CUDA_PHASES prints (src/cuda/block_phases.cuh): per kernel, the
median and range of each phase's cycles over the printed blocks, and of the blocks' global-timer durations.

  usage: attnkit_cuda_timing_phases CASE DTYPE | python3 bench/block_phases.py [--markdown]
"""
import re
import statistics
import sys

# What each mark ends (the mark numbers in attention_wgmma.cu / attention_mma.cu).
NAMES = {
    "wgmma": ["block coordinates", "barriers, early copies", "row setup", "Q landed", "tile 0 (S, softmax)",
              "later tiles", "last P V", "finish (normalise, store)", "-"],
    "mma": ["block coordinates", "row setup", "Q and tile 0 landed", "tile 0", "later tiles",
            "finish (normalise, store)", "-", "-", "-"],
}
LINE = re.compile(r"^phases (\S+) block (\d+) start_ns (\d+) end_ns (\d+) cycles(.*)$")


def main():
    markdown = "--markdown" in sys.argv
    per_kernel = {}
    for line in sys.stdin:
        m = LINE.match(line.strip())
        if not m:
            continue
        kernel, _, start, end, rest = m.groups()
        values = [None if v == "-" else int(v) for v in rest.split()]
        per_kernel.setdefault(kernel, []).append((int(end) - int(start), values))
    for kernel, rows in per_kernel.items():
        names = NAMES.get(kernel, [f"mark {i}" for i in range(1, 10)])
        out = [f"{kernel}: {len(rows)} blocks printed"]
        if markdown:
            out += ["", "| phase | median cycles | range |", "|---|---|---|"]
        for i, name in enumerate(names):
            seen = [v[i] for _, v in rows if i < len(v) and v[i] is not None]
            if name == "-" or not seen:
                continue
            med, lo, hi = statistics.median(seen), min(seen), max(seen)
            out.append(f"| {name} | {med:.0f} | {lo}-{hi} |" if markdown else f"  {name:28s} {med:8.0f}  ({lo}-{hi})")
        ns = [d for d, _ in rows]
        block = f"{statistics.median(ns) / 1000:.2f} us ({min(ns) / 1000:.2f}-{max(ns) / 1000:.2f})"
        out.append(f"| block, start to end | {block} | |" if markdown else f"  {'block, start to end':28s} {block}")
        print("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
