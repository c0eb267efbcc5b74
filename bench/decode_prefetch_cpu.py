#!/usr/bin/env python3
"""The few-rows kernel's prefetches on and off: a decode step (Llama-3-8B heads: 32 query / 8 K/V heads, head dim
128) of attnkit's CPU backend with the plan's own choices and with plan overrides, timed in turns in one process
(7 rounds of >= 0.25 s each, median of the round medians), for each (dtype, layout, batch, keys) given.

    .venv/bin/python bench/decode_prefetch_cpu.py [--plans ";off=prefetch-v+prefetch-ahead"] [--out FILE.md]
        [--case float16:bhsd:8:4096 ...]
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time

import ml_dtypes
import numpy as np

import attnkit

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
CASES = ["float32:bhsd:8:4096", "float16:bhsd:8:4096", "bfloat16:bhsd:8:4096", "float16:bshd:8:4096",
         "float32:bshd:8:4096", "float16:bhsd:1:2048", "float16:bhsd:1:4096", "float16:bshd:2:4096"]
H, HKV, D = 32, 8, 128


def time_case(spec, plans, rounds):
    name, layout, batch, keys = spec.split(":")
    dt, B, K = DTYPES[name], int(batch), int(keys)
    rng = np.random.default_rng(0)
    shape = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
    q = rng.standard_normal(shape(H, 1)).astype(dt)
    k = rng.standard_normal(shape(HKV, K)).astype(dt)
    v = rng.standard_normal(shape(HKV, K)).astype(dt)
    out = attnkit.attention(q, k, v, layout=layout)
    results = {p: [] for p in plans}
    for _ in range(rounds):
        for p in plans:
            attnkit.attention(q, k, v, layout=layout, out=out, plan=p)
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < 0.25:
                t = time.perf_counter()
                attnkit.attention(q, k, v, layout=layout, out=out, plan=p)
                times.append(time.perf_counter() - t)
            results[p].append(statistics.median(times))
    kv_mb = (k.nbytes + v.nbytes) / 1e6
    return [(spec, kv_mb, p, statistics.median(results[p])) for p in plans]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", default=";off=prefetch-v;off=prefetch-ahead;off=prefetch-v+prefetch-ahead")
    ap.add_argument("--case", action="append")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    plans = args.plans.split(";")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    lines = [f"# Few-rows prefetches on and off ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC)", "",
             f"- commit {commit}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"load {os.getloadavg()}",
             "- command: `.venv/bin/python bench/decode_prefetch_cpu.py" + (f" --plans \"{args.plans}\"" if args.plans
                                                                          else "") + "`",
             "- decode step, 32 query / 8 K/V heads, head dim 128; plans timed in turns, median of "
             f"{args.rounds} rounds; ratio: the first plan's time / this plan's (< 1: slower than the plan)", "",
             "| dtype:layout:batch:keys | K/V MB | plan | ms | GB/s | ratio |", "|---|---|---|---|---|---|"]
    for spec in args.case or CASES:
        rows = time_case(spec, plans, args.rounds)
        base = rows[0][3]
        for s, mb, p, t in rows:
            line = f"| {s} | {mb:.1f} | `{p or '(plan)'}` | {t * 1e3:.3f} | {mb / 1e3 / t:.1f} | {base / t:.2f} |"
            print(line, flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
