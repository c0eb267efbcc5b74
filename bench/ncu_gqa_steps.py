#!/usr/bin/env python3
"""GroupQueryAttention decode steps for Nsight Compute: each case of bench_gqa_cuda.py's decode table named on
the command line, called twice (a warm-up and the step ncu measures; ncu's --launch-skip / --launch-count pick).

Run (on a GPU machine, attnkit built with CUDA on PYTHONPATH), e.g.:
  ncu --clock-control none --kernel-name regex:decode_mma --launch-skip 1 --launch-count 1 \\
      python3 bench/ncu_gqa_steps.py b64:int8
Cases: <b64|b8>:<float16|bfloat16|int8|int4> (b64: batch 64 x 4k cache, b8: batch 8 x 32k).
"""
import os
import sys

import torch

import attnkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gqa_cuda import make_call  # noqa: E402

SHAPES = {"b64": (64, 4096), "b8": (8, 32768)}


def main():
    for case in sys.argv[1:]:
        shape, cache = case.split(":")
        batch, cache_len = SHAPES[shape]
        kw = make_call(batch, 1, cache_len, cache, True, True)
        for _ in range(2):
            attnkit.group_query_attention(**kw)
        torch.cuda.synchronize()
        del kw
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
