"""Which kernels the peers launch for a case, and how: name, grid, block, registers, shared memory and the
median duration, from the PyTorch profiler's trace (kineto records the launch configuration of each kernel).

A peer's kernel name and launch shape say what tiling it chose for the shape (cuDNN's generated kernels name
their tile in the kernel name), which is where to look when one of our cases trails that peer.

Run (on a GPU machine):  python3 bench/peer_kernels.py bert_b8_s512 minilm_b8_s128 [--dtype float16] [--json F]
"""
import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import LLM, PEERS, SEED, peer  # noqa: E402  (the same cases and peer calls as the benchmark)


def kernels_of(fn, repeats):
    """The CUDA kernels fn launches: {name: {grid, block, registers, smem, durations}} over `repeats` calls."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    events = json.load(open(path)).get("traceEvents", [])
    os.unlink(path)
    found = collections.OrderedDict()
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        k = found.setdefault(e["name"], {"grid": a.get("grid"), "block": a.get("block"),
                                         "registers": a.get("registers per thread"),
                                         "smem": a.get("shared memory"), "us": []})
        k["us"].append(float(e.get("dur", 0.0)))
    for k in found.values():
        k["calls"] = len(k["us"])
        k["median_us"] = statistics.median(k.pop("us"))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+", help="case names of bench/bench_cuda.py")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="write the findings here too")
    args = ap.parse_args()
    table = {c[0]: c for c in SEED + LLM}
    dt = getattr(torch, args.dtype)
    report = {}
    for name in args.cases:
        _, b, hq, hkv, sq, sk, d, causal = table[name]
        torch.manual_seed(0)
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=dt)
        k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
        v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
        for p in PEERS:
            try:
                found = kernels_of(peer(p, q, k, v, causal), args.repeats)
            except Exception as e:  # a peer that refuses the case
                print(f"{name} {p}: refused ({type(e).__name__})")
                continue
            report[f"{name} {p}"] = found
            for kname, k_ in found.items():
                print(f"{name} {p}: {k_['median_us']:.2f} us x{k_['calls']} grid {k_['grid']} block {k_['block']} "
                      f"regs {k_['registers']} smem {k_['smem']} | {kname}")
    if args.json:
        json.dump(report, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
