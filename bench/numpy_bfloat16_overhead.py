#!/usr/bin/env python3
"""What a NumPy bfloat16 (ml_dtypes) call costs over the same call in float16, through attnkit.attention.

The op's work is the same in both dtypes (Whisper's decoder step: 12 heads, 448 keys, head dim 64, causal), so the
difference is the binding's import of ml_dtypes arrays (which reach it through a uint16 view) and the kernels' own
dtype paths. One thread, so that no thread team's wake-up enters the times; the dtypes take turns in blocks of calls
and the median of the blocks' differences is printed. Then the binding's part alone: a call whose output shape is
wrong, refused after the four arrays are imported (mean of many calls, each dtype twice).

    .venv/bin/python bench/numpy_bfloat16_overhead.py [--rounds 30] [--calls 300]
"""

import argparse
import statistics
import time
import timeit

import ml_dtypes
import numpy as np

import attnkit


def whisper_decoder_step(dtype, rng):
    q = rng.random((1, 12, 1, 64)).astype(dtype)
    k = rng.random((1, 12, 448, 64)).astype(dtype)
    v = rng.random((1, 12, 448, 64)).astype(dtype)
    out = np.empty((1, 1, 12, 64), dtype).transpose(0, 2, 1, 3)
    return lambda: attnkit.attention(q, k, v, causal=True, out=out, threads=1)


def block_median_us(call, calls):
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def refused_call(dtype):
    """A call refused after the binding imported its arrays (v's head dim differs from out's)."""
    q = np.zeros((1, 12, 1, 64), dtype)
    k = np.zeros((1, 12, 448, 64), dtype)
    v = np.zeros((1, 12, 448, 32), dtype)
    out = np.empty((1, 12, 1, 64), dtype)

    def call():
        try:
            attnkit.attention(q, k, v, out=out, threads=1)
        except ValueError:
            pass

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    calls = {"float16": whisper_decoder_step(np.float16, rng), "bfloat16": whisper_decoder_step(ml_dtypes.bfloat16, rng)}
    for call in calls.values():
        block_median_us(call, 50)
    medians = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            medians[name].append(block_median_us(call, args.calls))
    difference = statistics.median(b - a for a, b in zip(medians["float16"], medians["bfloat16"]))
    print("float16 %.1f us, bfloat16 %.1f us (best block medians); bfloat16 - float16: %.2f us (median of %d rounds)"
          % (min(medians["float16"]), min(medians["bfloat16"]), difference, args.rounds))
    calls = 20000
    for dtype in (np.float16, ml_dtypes.bfloat16) * 2:
        seconds = timeit.timeit(refused_call(dtype), number=calls)
        print("refused after the imports, %s: %.2f us a call" % (np.dtype(dtype).name, seconds / calls * 1e6))


if __name__ == "__main__":
    main()
