#!/usr/bin/env python3
"""The fixed cost of a Python call into attnkit on the CPU: calls so small that the arithmetic is negligible (one
head, head size 8, 16 keys), so what is timed is the wrapper, the argument conversion, the checks and the plan.
One thread, NumPy inputs and outputs passed in. Prints the median over rounds of µs per call.

Run (with the package installed, e.g. the project venv of scripts/test):
  OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/python_call_overhead.py [--calls 3000] [--rounds 5]
(NumPy's own OpenBLAS threads otherwise spin on a 2-core machine beside the timed thread.)
"""
import argparse
import statistics
import time

import numpy as np

import attnkit


def gqa_step(rng):
    """A decode step of GroupQueryAttention: 1 query head over a shared 64-row cache holding 16 keys, rotary on."""
    B, H, D, cap = 1, 1, 8, 64
    q, k, v = (rng.standard_normal((B, 1, H * D)).astype(np.float16) for _ in range(3))
    past_k = np.zeros((B, H, cap, D), np.float16)
    past_v = np.zeros_like(past_k)
    seqlens = np.full((B,), 16, np.int32)
    cos = rng.standard_normal((cap, D // 2)).astype(np.float16)
    sin = rng.standard_normal((cap, D // 2)).astype(np.float16)
    out = np.empty((B, 1, H * D), np.float16)

    def call():
        attnkit.group_query_attention(q, k, v, past_k, past_v, seqlens_k=seqlens, total_sequence_length=17,
                                      cos_cache=cos, sin_cache=sin, num_heads=H, kv_num_heads=H, do_rotary=1,
                                      output=out, present_key=past_k, present_value=past_v, threads=1)
    return call


def attention_call(rng):
    """The attention op: 1 head, 1 query over 16 keys, head size 8."""
    q = rng.standard_normal((1, 1, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 16, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 16, 8)).astype(np.float32)

    def call():
        attnkit.attention(q, k, v, threads=1)
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for name, make in (("group_query_attention decode step", gqa_step), ("attention", attention_call)):
        call = make(rng)
        for _ in range(100):
            call()
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            times.append((time.perf_counter() - start) / args.calls * 1e6)
        print(f"{name}: {statistics.median(times):.1f} us per call (median of {args.rounds} rounds of {args.calls})")


if __name__ == "__main__":
    main()
