#!/usr/bin/env python3
"""Sums up the cycle marks a build with ATTNKIT_CUDA_PHASES prints (src/cuda/common/block_phases.cuh): per kernel, the
median and range of each phase's cycles over the printed blocks, and of the blocks' global-timer durations.

  usage: attnkit_cuda_timing_phases CASE DTYPE | python3 bench/block_phases.py [--markdown] [--timeline]

--timeline adds every printed block's start and end on the global timer (microseconds from its launch's first
start, the median over launches): which blocks ran in which wave, and when the launch ended.
"""
import re
import statistics
import sys

# What each mark ends (the mark numbers in attention_wgmma_kernel-inl.cuh / attention_mma.cu).
NAMES = {
    "wgmma": ["block coordinates", "barriers, early copies", "row setup", "Q landed", "K tile 0 landed",
              "tile 0 (S, softmax)", "later tiles", "last P V", "finish (normalise, store)"],
    "mma": ["block coordinates", "row setup", "Q and tile 0 landed", "tile 0", "later tiles",
            "finish (normalise, store)", "-", "-", "-"],
}
LINE = re.compile(r"^phases (\S+) block (\d+) start_ns (\d+) end_ns (\d+) cycles(.*)$")


def main():
    markdown = "--markdown" in sys.argv
    timeline = "--timeline" in sys.argv
    per_kernel, spans = {}, {}
    for line in sys.stdin:
        m = LINE.match(line.strip())
        if not m:
            continue
        kernel, block, start, end, rest = m.groups()
        values = [None if v == "-" else int(v) for v in rest.split()]
        per_kernel.setdefault(kernel, []).append((int(end) - int(start), values))
        spans.setdefault(kernel, []).append((int(start), int(end), int(block)))
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
        if timeline:
            out += ["", last_launch(spans[kernel])]
        print("\n".join(out) + "\n")


def last_launch(spans):
    """Every printed block's start and end from its launch's first start (a launch starts where block 0 does),
    the median over the launches whose block 0 was printed, in block order."""
    spans = sorted(spans)
    launches, current = [], None
    for start, end, block in spans:
        if block == 0:
            current = {}
            launches.append(current)
        if current is not None:
            current[block] = (start, end)
    if not launches:
        return "(no block 0 printed)"
    per_block = {}
    for launch in launches:
        t0 = min(s for s, _ in launch.values())
        for block, (start, end) in launch.items():
            per_block.setdefault(block, []).append(((start - t0) / 1000, (end - t0) / 1000))
    rows = [f"{len(launches)} launches", "", "| block | start us | end us | launches |", "|---|---|---|---|"]
    for block in sorted(per_block):
        v = per_block[block]
        rows.append(f"| {block} | {statistics.median(x for x, _ in v):.2f} | {statistics.median(y for _, y in v):.2f} "
                    f"| {len(v)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
