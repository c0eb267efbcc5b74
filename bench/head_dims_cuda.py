"""attnkit's CUDA backend across head dims, side by side with PyTorch's SDPA backends (cuDNN, FlashAttention-2 where
it takes the dim, memory-efficient) in one process: prefill (batch 4 x 16 heads x 2048 tokens, positions-first
tensors as a projection leaves them) at head dims 16-256 and (192, 128), causal and not, and a decode step (batch
32, 32 query heads on 8 K/V heads, 8k keys) per head dim.

Every case is verified against a float64 reference first, then timed with CUDA-graph replay (median). Writes a
CSV, a Markdown table (TFLOP/s, or TB/s of K/V read for decode, and the time ratio cuDNN / attnkit) and, with
--plot, a PNG of TFLOP/s against head dim, one line per implementation.

Run (on a GPU machine, with attnkit on PYTHONPATH):
  python3 bench/head_dims_cuda.py --csv out.csv --markdown out.md --plot out.png [--quick] [--dims 16,40,...]
"""
import argparse
import datetime
import math
import os
import sys

import torch
import triton.testing as tt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import driver_version, git_commit, peer, scaled_error  # noqa: E402

PREFILL_DIMS = [16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256]
DECODE_DIMS = [64, 80, 96, 128, 192, 256]
PEERS = ("cudnn", "flash", "efficient")  # (bench_cuda.peer's names)


def reference(q, k, v, causal):
    """float64 GEMM + softmax + GEMM on [b, h, s, d] views, bottom-right causal (offset k_len - q_len)."""
    hq, hkv = q.shape[1], k.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    if hq != hkv:
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def time_us(fn, rep):
    return 1000.0 * tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def measure(attnkit, case, dt, rep, kernels=False):
    """One case: every implementation's error and median time."""
    b, hq, hkv, sq, sk, d, dv, causal = case
    torch.manual_seed(0)
    # positions-first storage [b, s, h, d], viewed as [b, h, s, d] (what attnkit and SDPA both take)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt).transpose(1, 2)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dt).transpose(1, 2)
    o = torch.empty(b, sq, hq, dv, device="cuda", dtype=dt).transpose(1, 2)
    ref = reference(q, k, v, causal) if b * hq * sq * sk <= 2 ** 31 else None
    row = {}
    impls = [("attnkit", lambda: attnkit.attention(q, k, v, causal=causal, out=o))]
    if kernels:  # each tensor-core kernel forced (where it declines the problem, the plan's choice runs)
        impls += [(f"attnkit_{kn}", lambda kn=kn: attnkit.attention(q, k, v, causal=causal, out=o, plan=f"kernel={kn}"))
                  for kn in ("mma", "wgmma")]
    impls += [(name, peer(name, q, k, v, causal)) for name in PEERS]
    for name, fn in impls:
        try:
            out = fn()
            torch.cuda.synchronize()
            row[name + "_err"] = scaled_error(out, ref) if ref is not None else float("nan")
            row[name + "_us"] = time_us(fn, rep)
        except Exception:  # noqa: BLE001 -- a peer that refuses the dim
            row[name + "_us"], row[name + "_err"] = float("nan"), float("nan")
    del q, k, v, o, ref
    torch.cuda.empty_cache()
    return row


def main():
    import attnkit

    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", help="comma-separated prefill head dims (default: the sweep)")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--no-causal", action="store_true", help="only non-causal prefill")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="also time attnkit's mma.sync and wgmma kernels forced")
    args = ap.parse_args()
    rep = 20 if args.quick else 60
    dims = [int(x) for x in args.dims.split(",")] if args.dims else PREFILL_DIMS
    header = (f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | {torch.cuda.get_device_name()} | "
              f"driver {driver_version()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()} | "
              f"commit {git_commit()} | CUDA-graph replay median (rep {rep} ms) | command: {' '.join(sys.argv)}")
    print(header, flush=True)
    cases = []
    for causal in ([False] if args.no_causal else [False, True]):
        for d in dims:
            cases.append(("prefill", (4, 16, 16, 2048, 2048, d, d, causal)))
        cases.append(("prefill", (4, 16, 16, 2048, 2048, 192, 128, causal)))
    if not args.no_decode:
        for d in DECODE_DIMS:
            cases.append(("decode", (32, 32, 8, 1, 8192, d, d, True)))
    rows = []
    for dt_name in args.dtypes.split(","):
        dt = getattr(torch, dt_name)
        for kind, case in cases:
            b, hq, hkv, sq, sk, d, dv, causal = case
            r = measure(attnkit, case, dt, rep, args.kernels)
            visible = sq * sk if not causal or sq == 1 else sum(min(sk, sk - sq + i + 1) for i in range(sq))
            flops = 2.0 * b * hq * visible * (d + dv)
            kv_bytes = b * hkv * sk * (d + dv) * torch.tensor([], dtype=dt).element_size()
            r.update(kind=kind, dtype=dt_name, d=d, dv=dv, causal=causal, flops=flops, kv_bytes=kv_bytes)
            ratio = r["cudnn_us"] / r["attnkit_us"] if r["attnkit_us"] == r["attnkit_us"] else float("nan")
            r["cudnn_over_attnkit"] = ratio
            rate = (kv_bytes / r["attnkit_us"] / 1e6) if kind == "decode" else flops / r["attnkit_us"] / 1e6
            print(f"{kind:7s} {dt_name:8s} d {d:3d}/{dv:3d} {'causal' if causal else 'full  '} "
                  f"attnkit {r['attnkit_us']:9.1f} us ({rate:6.1f} {'TB/s' if kind == 'decode' else 'TFLOP/s'}, "
                  f"err {r['attnkit_err']:.1e})  cudnn {r['cudnn_us']:9.1f}  flash {r['flash_us']:9.1f}  "
                  f"efficient {r['efficient_us']:9.1f}  cudnn/attnkit {ratio:5.2f}"
                  + (f"  mma {r['attnkit_mma_us']:9.1f}  wgmma {r['attnkit_wgmma_us']:9.1f}" if args.kernels else ""),
                  flush=True)
            rows.append(r)
    write(rows, header, args)


def write(rows, header, args):
    impls = ["attnkit"] + (["attnkit_mma", "attnkit_wgmma"] if args.kernels else []) + list(PEERS)
    if args.csv:
        keys = sorted({k for r in rows for k in r})
        with open(args.csv, "w") as f:
            f.write(header + "\n" + ",".join(keys) + "\n")
            for r in rows:
                f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n\nTFLOP/s (prefill) or TB/s of K/V read (decode); ratio = cuDNN time / attnkit time "
                    "(> 1: attnkit faster).\n\n| case | dtype | d / dv | causal | " +
                    " | ".join(impls) + " | cuDNN / attnkit | attnkit err |\n|" + "---|" * (len(impls) + 6) + "\n")
            for r in rows:
                div = (r["kv_bytes"] / 1e6) if r["kind"] == "decode" else (r["flops"] / 1e6)
                cells = [f"{div / r[i + '_us']:.1f}" if r[i + "_us"] == r[i + "_us"] else "–" for i in impls]
                f.write(f"| {r['kind']} | {r['dtype']} | {r['d']} / {r['dv']} | {'yes' if r['causal'] else 'no'} | "
                        + " | ".join(cells) + f" | {r['cudnn_over_attnkit']:.2f} | {r['attnkit_err']:.1e} |\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        groups = sorted({(r["dtype"], r["causal"]) for r in rows if r["kind"] == "prefill" and r["d"] == r["dv"]})
        fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
        for ax, (dt, causal) in zip(axes[0], groups):
            sel = [r for r in rows if r["kind"] == "prefill" and r["dtype"] == dt and r["causal"] == causal
                   and r["d"] == r["dv"]]
            for impl in impls:
                pts = [(r["d"], r["flops"] / r[impl + "_us"] / 1e6) for r in sel if r[impl + "_us"] == r[impl + "_us"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=impl)
            ax.set_title(f"{dt}, {'causal' if causal else 'non-causal'}, 4 x 16 x 2048")
            ax.set_xlabel("head dim")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
