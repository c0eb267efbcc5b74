#!/usr/bin/env python3
"""The fixed cost of a Python call into attnkit on the CPU: calls so small that the arithmetic is negligible (one
head, head size 8, 16 keys), so what is timed is the wrapper, the argument conversion, the checks and the plan.
One thread, NumPy inputs and outputs passed in. Prints the median over rounds of µs per call.

With torch installed it also times the issue's tiny call (1 x 4 x 1 x 64 over 16 keys, float32) on torch tensors
beside F.scaled_dot_product_attention in the same process: attnkit.attention, the drop-in
attnkit.torch.scaled_dot_product_attention, and the registered op through torch's dispatcher
(torch.ops.attnkit.attention, the path compiled and traced code takes); each with its ratio to SDPA. On a machine
with CUDA (and attnkit's CUDA backend) the same on CUDA tensors, synchronised once per round.

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


def torch_calls(device):
    """(name, call) pairs on torch tensors of the issue's tiny shape, SDPA first."""
    import torch
    import torch.nn.functional as F

    import attnkit.torch as akt

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 64, generator=g).to(device)
    k = torch.randn(1, 4, 16, 64, generator=g).to(device)
    v = torch.randn(1, 4, 16, 64, generator=g).to(device)
    threads = 1 if device == "cpu" else None
    op = torch.ops.attnkit.attention.default
    return [
        ("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v)),
        ("attnkit.attention", lambda: attnkit.attention(q, k, v, threads=threads)),
        ("attnkit.torch.scaled_dot_product_attention", lambda: akt.scaled_dot_product_attention(q, k, v)),
        ("torch.ops.attnkit.attention (dispatcher)",
         lambda: op(q, k, v, None, None, None, False, None, None, None, None, None, "nan", False, "bhsd", threads,
                    "auto")),
    ]


def time_calls(calls_by_name, calls, rounds, sync=None):
    """Median µs per call of each, the rounds interleaved (round r times every call once), so that a machine whose
    load changes over the run slows all of them alike and the ratios hold."""
    for _, call in calls_by_name:
        for _ in range(100):
            call()
    times = {name: [] for name, _ in calls_by_name}
    for _ in range(rounds):
        for name, call in calls_by_name:
            start = time.perf_counter()
            for _ in range(calls):
                call()
            if sync:
                sync()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return [(name, statistics.median(times[name])) for name, _ in calls_by_name]


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
    try:
        import torch
    except ImportError:
        print("torch: not installed (no torch rows)")
        return
    torch.set_num_threads(1)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and "cuda" in attnkit.available_backends() else [])
    for device in devices:
        sync = torch.cuda.synchronize if device == "cuda" else None
        rows = time_calls(torch_calls(device), args.calls, args.rounds, sync)
        sdpa = rows[0][1]
        print(f"torch {torch.__version__}, {device} tensors 1 x 4 x 1 x 64 over 16 keys, float32 (median of "
              f"{args.rounds} interleaved rounds of {args.calls}):")
        for name, us in rows:
            print(f"  {name}: {us:.1f} us per call, {us / sdpa:.2f}x SDPA")


if __name__ == "__main__":
    main()
