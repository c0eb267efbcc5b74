#!/usr/bin/env python3
"""Where a GroupQueryAttention step's GPU time goes: the kernels one step launches (pre-pass, cache moves,
attention, split-K merge, copies) with their GPU time per step, from the PyTorch profiler (CUPTI), for the
steps of bench_gqa_cuda.py (Llama-3-8B heads, rotary on). A tool for finding the next thing to speed up.

Run (on a GPU machine, with attnkit built with CUDA on PYTHONPATH):
  python3 bench/profile_gqa.py [--steps 20]
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import attnkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gqa_cuda import make_call  # noqa: E402

CASES = [  # label, batch, new tokens, cache length, cache type, shared buffer
    ("prefill b1 s4096 float16", 1, 4096, 4096, "float16", False),
    ("decode b64 cache4k float16", 64, 1, 4096, "float16", True),
    ("decode b8 cache32k float16", 8, 1, 32768, "float16", True),
    ("decode b8 cache32k int8", 8, 1, 32768, "int8", True),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    for label, b, s, t, cache, shared in CASES:
        kw = make_call(b, s, t, cache, True, shared)
        for _ in range(3):
            attnkit.group_query_attention(**kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                attnkit.group_query_attention(**kw)
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                name = e.name if len(e.name) < 70 else e.name[:67] + "..."
                total, count = kernels.get(name, (0.0, 0))
                kernels[name] = (total + e.device_time, count + 1)
        step = sum(t for t, _ in kernels.values()) / args.steps
        print(f"== {label}: {step:.1f} us of GPU work per step")
        for name, (total, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
            print(f"  {total / args.steps:9.1f} us  x{count / args.steps:4.1f}  {name}")
        del kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
