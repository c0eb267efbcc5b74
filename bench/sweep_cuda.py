#!/usr/bin/env python3
"""Which CUDA kernel and key split is fastest per shape: attnkit's plan against every kernel it could take
(plan override kernel=) and, for few-row shapes (decode), every split count (splits=), with PyTorch's
flash and cuDNN backends beside them, in one process. A tuning tool for the plan's heuristics (cuda_backend.cu),
not the benchmark of record (bench_cuda.py is).

Every setting is checked against a float64 reference (scaled error) before it is timed (CUDA-graph replay,
median). Prints one line per (case, setting) and, per case, the fastest setting and the plan's own.

--ab OVERRIDES[;OVERRIDES...] times the plan with and without each set of plan overrides instead (an A/B of the
plan's features, e.g. "off=merge-pdl", in one process).

Run (on a GPU machine, with attnkit built with CUDA on PYTHONPATH):
  python3 bench/sweep_cuda.py [--cases a,b] [--rep 10] [--out FILE.csv] [--ab "off=plain;off=cluster"]
"""
import argparse
import csv
import math
import os
import sys

import torch
import triton.testing as tt

import attnkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import LLM, SEED, peer, reference, scaled_error  # noqa: E402

SPLITS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
KERNELS = ["mma", "wgmma", "decode"]
DEFAULT_CASES = ["llama8b_decode_b64_k4k_gqa", "llama8b_decode_b8_k32k_gqa", "whisper_dec_448", "whisper_cross_1q",
                 "bert_b8_s512", "bert_b1_s512", "whisper_enc_1500", "fa3_h128_s1k", "minilm_b8_s128",
                 "bert_b8_s128"]


def settings(sq, group, ab=None):
    """(label, plan overrides) pairs to try: the plan, each kernel, and for few rows each split of each kernel;
    with `ab`, the plan and the plan under each of those override sets."""
    out = [("plan", "")]
    if ab:
        return out + [(f"plan {o}", o) for o in ab]
    for kern in KERNELS:
        out.append((kern, f"kernel={kern}"))
        splits = SPLITS if sq * group <= 16 else ([1, 2, 4] if kern != "decode" else [])
        out += [(f"{kern} x{s}", f"kernel={kern},splits={s}") for s in splits]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--rep", type=int, default=10, help="timing window per setting, ms")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--out", help="CSV of every timing")
    ap.add_argument("--ab", help="OVERRIDES;...: the plan with and without each override set (no kernel or split sweep)")
    args = ap.parse_args()
    ab = None
    if args.ab:
        ab = [o for o in args.ab.split(";") if o]
    dt = getattr(torch, args.dtype)
    table = {c[0]: c for c in SEED + LLM}
    rows = []
    for name in args.cases.split(","):
        _, b, hq, hkv, sq, sk, d, causal = table[name]
        torch.manual_seed(0)
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=dt)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
        o = torch.empty_like(q)
        ref = reference(q, k, v, causal)
        times = {}
        for pname in ("flash", "cudnn"):
            try:
                fn = peer(pname, q, k, v, causal)
                fn()
                times[pname] = 1000.0 * tt.do_bench_cudagraph(fn, rep=args.rep, return_mode="median")
            except Exception:  # noqa: BLE001 -- a peer that refuses the shape
                times[pname] = math.nan
        for label, plan in settings(sq, hq // hkv, ab):
            try:
                fn = lambda: attnkit.attention(q, k, v, causal=causal, out=o, plan=plan)  # noqa: E731
                o.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = scaled_error(o, ref)
                us = 1000.0 * tt.do_bench_cudagraph(fn, rep=args.rep, return_mode="median") if err < 1e-2 else math.nan
            except Exception as e:  # noqa: BLE001 -- reported
                err, us = math.nan, math.nan
                label += f" ({type(e).__name__})"
            times[label] = us
            rows.append(dict(case=name, setting=label, us=us, err=err))
            print(f"{name:28s} {label:18s} {us:9.2f} us  err {err:.1e}", flush=True)
        best = min((t, s) for s, t in times.items() if not math.isnan(t) and s not in ("flash", "cudnn"))
        print(f"## {name}: plan {times['plan']:.2f} us, best {best[1]} {best[0]:.2f} us, flash {times['flash']:.2f}, "
              f"cudnn {times['cudnn']:.2f}", flush=True)
        del q, k, v, o, ref
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["case", "setting", "us", "err"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
