#!/usr/bin/env python3
"""Can a GroupQueryAttention step be captured in a CUDA graph? Captures one decode step (bench_gqa_cuda.py's
make_call) in each torch capture mode and prints what each gives, then checks that the replayed step writes the
eager step's bits. A diagnostic for the benchmark's CUDA-graph timing.

Run (on a GPU machine, with attnkit built with CUDA on PYTHONPATH):  python3 bench/capture_probe.py
"""
import os
import sys

import torch

import attnkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gqa_cuda import make_call  # noqa: E402


def main():
    for cache in ("float16", "int8"):
        kw = make_call(8, 1, 4096, cache, True, True)
        out = torch.empty(8, 1, 32 * 128, dtype=torch.float16, device="cuda")
        kw["output"] = out
        attnkit.group_query_attention(**kw)
        torch.cuda.synchronize()
        eager = out.clone()
        for mode in ("global", "thread_local", "relaxed"):
            stream = torch.cuda.Stream()
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.stream(stream):
                    with torch.cuda.graph(g, stream=stream, capture_error_mode=mode):
                        attnkit.group_query_attention(**kw)
                out.zero_()
                g.replay()
                torch.cuda.synchronize()
                same = torch.equal(out, eager)
                print(f"{cache:8s} {mode:12s} captured; replay writes the eager bits: {same}", flush=True)
            except Exception as e:  # noqa: BLE001 -- the point is to print it
                print(f"{cache:8s} {mode:12s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                torch.cuda.synchronize()


if __name__ == "__main__":
    main()
