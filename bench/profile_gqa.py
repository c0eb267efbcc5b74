#!/usr/bin/env python3
"""Where a GroupQueryAttention step's GPU time goes: the kernels one step launches (pre-pass, cache moves,
attention, split-K merge, copies) with their GPU time per step, from the PyTorch profiler (CUPTI), for the
steps of bench_gqa_cuda.py (Llama-3-8B heads, rotary on). Also the host's time per call (queued
alone and in a loop) and the CUDA calls it makes. A tool for finding the next thing to speed up.

Run (on a GPU machine, with attnkit built with CUDA on PYTHONPATH):
  python3 bench/profile_gqa.py [--steps 20]
"""
import argparse
import cProfile
import os
import pstats
import re
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import attnkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gqa_cuda import make_call  # noqa: E402

CASES = [  # label, batch, new tokens, cache length, cache type, shared buffer
    ("prefill b1 s4096 float16", 1, 4096, 4096, "float16", False),
    ("decode b64 cache4k float16", 64, 1, 4096, "float16", True),
    ("decode b64 cache4k int8", 64, 1, 4096, "int8", True),
    ("decode b8 cache32k float16", 8, 1, 32768, "float16", True),
    ("decode b8 cache32k int8", 8, 1, 32768, "int8", True),
    ("decode b64 cache4k int4", 64, 1, 4096, "int4", True),
    ("decode b8 cache32k int4", 8, 1, 32768, "int4", True),
]


def short(name):
    return name if len(name) < 70 else name[:67] + "..."


def kind(name):
    m = re.search(r"(\w+)(?:<|\()", name)  # a kernel's own name, else the operation's first words
    return m.group(1) if m else name[:16]


def gaps_between_ops(events):
    """Mean idle time of the GPU between consecutive operations of the profiled loop, by (previous, next) kind:
    what each hand-over in the stream costs (negative: the next one overlapped, e.g. a PDL launch)."""
    ops = sorted((e.time_range.start, e.time_range.end, kind(e.name)) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps = {}
    for (_, end, a), (start, _, b) in zip(ops, ops[1:]):
        total, count = gaps.get((a, b), (0.0, 0))
        gaps[(a, b)] = (total + start - end, count + 1)
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    for label, b, s, t, cache, shared in CASES:
        kw = make_call(b, s, t, cache, True, shared)
        for _ in range(3):
            attnkit.group_query_attention(**kw)
        torch.cuda.synchronize()
        # The host's time per call with the GPU idle before it (what the call costs the host to queue), and per
        # call over a loop of calls (the GPU's pace when the host keeps ahead, else the host's).
        alone = []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            attnkit.group_query_attention(**kw)
            alone.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            attnkit.group_query_attention(**kw)
        torch.cuda.synchronize()
        loop = (time.perf_counter() - t0) * 1e6 / args.steps
        # Where the host's time goes: the Python wrapper's functions and the extension call (nanobind's argument
        # conversion, the op's checks and plan, the CUDA calls), by their own time per call.
        host_profile = cProfile.Profile()
        host_profile.enable()
        for _ in range(args.steps):
            attnkit.group_query_attention(**kw)
        host_profile.disable()
        torch.cuda.synchronize()
        own = sorted(pstats.Stats(host_profile).stats.items(), key=lambda kv: -kv[1][2])[:6]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                attnkit.group_query_attention(**kw)
            torch.cuda.synchronize()
        kernels, host = {}, {}
        for e in prof.events():
            name = short(e.name)
            if e.device_type == torch.autograd.DeviceType.CUDA:
                total, count = kernels.get(name, (0.0, 0))
                kernels[name] = (total + e.device_time, count + 1)
            elif name.startswith("cu"):  # CUDA runtime / driver calls seen on the host
                total, count = host.get(name, (0.0, 0))
                host[name] = (total + e.cpu_time, count + 1)
        step = sum(t for t, _ in kernels.values()) / args.steps
        print(f"== {label}: {step:.1f} us of GPU work per step; host {statistics.median(alone):.1f} us per call "
              f"queued alone, {loop:.1f} us per call in a loop")
        for name, (total, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
            print(f"  {total / args.steps:9.1f} us  x{count / args.steps:4.1f}  {name}")
        for (a, b), (total, count) in sorted(gaps_between_ops(prof.events()).items(), key=lambda kv: -kv[1][0]):
            if count >= args.steps // 2:
                print(f"  gap {total / count:8.1f} us  x{count / args.steps:4.1f}  {a} -> {b}")
        for name, (total, count) in sorted(host.items(), key=lambda kv: -kv[1][0])[:8]:
            print(f"  host {total / args.steps:9.1f} us  x{count / args.steps:4.1f}  {name}")
        for (file, line, func), (_, calls, tottime, _, _) in own:
            print(f"  python {tottime / args.steps * 1e6:7.1f} us  x{calls / args.steps:4.1f}  {func} "
                  f"({os.path.basename(file)}:{line})")
        del kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
