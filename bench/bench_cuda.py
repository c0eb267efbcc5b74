"""attnkit's CUDA backend side by side with PyTorch's SDPA backends (FlashAttention-2 build, cuDNN, memory-
efficient) and the unfused GEMM + softmax + GEMM chain, in one process, on the shapes of shared/PERF.md.

Every case is verified first (scaled error against a float64 reference computed on the GPU), then each variant
is timed with CUDA-graph replay (triton.testing.do_bench_cudagraph, median), so launch overhead drops out.
attnkit is timed twice: as it runs (a plain call's kernel is a programmatic dependent launch, so in the graph each
call starts under the tail of the one before) and with ordinary launches, as the peers run.
Writes a CSV, a Markdown table and (with --plot) a PNG of attnkit's time ratio to the best peer per case.

Run (on a GPU machine, with attnkit installed or on PYTHONPATH):
  python3 bench/bench_cuda.py --csv out.csv --markdown out.md --plot out.png [--quick] [--cases a,b]
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

CASES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases")


def load_cases(file_name, tag):
    """The cases of cases/FILE tagged TAG as (name, batch, query heads, kv heads, q_len, k_len, head_dim, causal):
    the shapes the tests and the CLI read too."""
    with open(os.path.join(CASES_DIR, file_name)) as f:
        doc = json.load(f)
    cases = doc["cases"] if isinstance(doc, dict) else doc
    return [(c["name"], c["batch"], c["heads"], c.get("kv_heads", c["heads"]), c["q_len"], c["k_len"], c["head_dim"],
             bool(c.get("causal", False))) for c in cases if tag in c.get("tags", [])]


# The seed's shapes (every dtype) and the language-model shapes (float16 / bfloat16, as in PERF.md).
SEED = load_cases("models.json", "bench")
LLM = load_cases("llm.json", "large")
PEERS = ("flash", "cudnn", "efficient")


def visible_pairs(sq, sk, causal):
    if not causal or sq == 1:
        return sq * sk  # a single query with the default offset k_len - q_len sees every key
    return sum(min(sk, sk - sq + i + 1) for i in range(sq))


def reference(q, k, v, causal, rows=None):
    """float64 on the GPU: GEMM + softmax + GEMM, bottom-right causal alignment (offset k_len - q_len); with
    `rows` (a tensor of query positions), the output of those rows only."""
    hq, hkv = q.shape[1], k.shape[1]
    sq, sk = q.shape[2], k.shape[2]
    if rows is not None:
        q = q[:, :, rows]
    q, k, v = q.double(), k.double(), v.double()
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        positions = rows if rows is not None else torch.arange(sq, device=q.device)
        visible = torch.arange(sk, device=q.device)[None, :] <= positions[:, None] + (sk - sq)
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sampled_rows(sq, device):
    """The query positions a large case is checked on: its first and last 128 (all of a short one)."""
    if sq <= 256:
        return torch.arange(sq, device=device)
    return torch.cat([torch.arange(128, device=device), torch.arange(sq - 128, sq, device=device)])


def unfused(q, k, v, causal):
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal and q.shape[2] > 1:
        sq, sk = q.shape[2], k.shape[2]
        visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def peer(name, q, k, v, causal):
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]

    def run():
        with sdpa_kernel([backend]):
            # PyTorch's causal is top-left aligned; for a single query (decode) every key is visible anyway.
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[2] > 1,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return run


def scaled_error(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def main():
    import attnkit  # here, not at the top: bench/peer_kernels.py imports the cases without attnkit

    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true", help="shorter timing windows")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    args = ap.parse_args()
    rep = 25 if args.quick else 100
    only = set(args.cases.split(",")) if args.cases else None
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    dev = torch.cuda.get_device_name()
    header = (f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | {dev} | driver "
              f"{driver_version()} | torch {torch.__version__} | cuDNN "
              f"{torch.backends.cudnn.version()} | attnkit {attnkit.__version__} | commit {git_commit()} | "
              f"timing: CUDA-graph replay median (rep {rep} ms) | command: {' '.join(sys.argv)}")
    print(header, flush=True)
    rows = []
    for (name, b, hq, hkv, sq, sk, d, causal) in SEED + LLM:
        if only and name not in only:
            continue
        for dt in dtypes:
            if dt == torch.float32 and (name, b, hq, hkv, sq, sk, d, causal) in LLM:
                continue  # the LLM shapes are float16 / bfloat16 only, as in PERF.md
            torch.manual_seed(0)
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=dt)
            k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
            v = torch.randn(b, hkv, sk, d, device="cuda", dtype=dt)
            o = torch.empty_like(q)
            flops = 4.0 * b * hq * visible_pairs(sq, sk, causal) * d
            nbytes = q.element_size() * (2 * q.numel() + 2 * k.numel())
            # A large case is checked on sampled query rows (the full float64 scores would not fit).
            big = b * hq * sq * sk > 2e9
            rows_checked = sampled_rows(sq, q.device) if big else None
            ref = reference(q, k, v, causal, rows_checked)
            row = {"case": name, "dtype": str(dt).split(".")[-1], "flops": flops, "bytes": nbytes}
            call = lambda: attnkit.attention(q, k, v, causal=causal, out=o)
            # attnkit twice: as it runs (a plain call's kernel starts under the tail of the kernel before it,
            # here our own previous call in the graph), and with ordinary launches like the peers'
            # (the plan override off=call-pdl).
            ordinary = lambda: attnkit.attention(q, k, v, causal=causal, out=o, plan="off=call-pdl")
            variants = [("attnkit", call), ("attnkit_ordinary", ordinary)]
            if not big:
                variants.append(("unfused", lambda: unfused(q, k, v, causal)))
            variants += [(p, peer(p, q, k, v, causal)) for p in PEERS]
            for vname, fn in variants:
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    row[vname + "_err"] = scaled_error(out if rows_checked is None else out[:, :, rows_checked], ref)
                    row[vname + "_us"] = 1000.0 * tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
                except Exception as e:  # a peer that refuses the case (dtype, head dim)
                    row[vname + "_us"] = float("nan")
                    row[vname + "_err"] = float("nan")
                    row[vname + "_note"] = type(e).__name__
            peers = [row.get(p + "_us", float("nan")) for p in PEERS]
            peers = [t for t in peers if not math.isnan(t)]
            row["best_peer_us"] = min(peers) if peers else float("nan")
            rows.append(row)
            print(fmt_row(row), flush=True)
            del q, k, v, o, ref
            torch.cuda.empty_cache()
    write_outputs(rows, header, args)
    print_table(rows)


def git_commit():
    """The commit measured: ATTNKIT_COMMIT (scripts/gpu-check passes the bundle's), else git, else unknown."""
    if os.environ.get("ATTNKIT_COMMIT"):
        return os.environ["ATTNKIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def driver_version():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def fmt(x, spec):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def fmt_row(r):
    t = r.get("attnkit_us", float("nan"))
    return (f"{r['case']:28s} {r['dtype']:8s} attnkit {fmt(t, '9.1f')} us {fmt(r['flops'] / t / 1e6, '6.1f')} TF/s "
            f"{fmt(r['bytes'] / t / 1e3, '6.0f')} GB/s err {fmt(r.get('attnkit_err'), '.1e')} | flash "
            f"{fmt(r.get('flash_us'), '.1f')} cudnn {fmt(r.get('cudnn_us'), '.1f')} eff {fmt(r.get('efficient_us'), '.1f')} "
            f"unfused {fmt(r.get('unfused_us'), '.1f')} | best/attnkit {fmt(r['best_peer_us'] / t, '.2f')}")


COLUMNS = ["case", "dtype", "attnkit_us", "attnkit_tflops", "attnkit_gbps", "attnkit_err", "flash_us", "cudnn_us",
           "efficient_us", "unfused_us", "speedup_vs_flash", "speedup_vs_best_peer", "attnkit_ordinary_us",
           "ordinary_speedup_vs_best_peer"]


def derived(r):
    t = r.get("attnkit_us", float("nan"))
    return {"attnkit_tflops": r["flops"] / t / 1e6, "attnkit_gbps": r["bytes"] / t / 1e3,
            "speedup_vs_flash": r.get("flash_us", float("nan")) / t, "speedup_vs_best_peer": r["best_peer_us"] / t,
            "ordinary_speedup_vs_best_peer": r["best_peer_us"] / r.get("attnkit_ordinary_us", float("nan"))}


def write_outputs(rows, header, args):
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(header + "\n" + ",".join(COLUMNS) + "\n")
            for r in rows:
                d = {**r, **derived(r)}
                f.write(",".join(str(d.get(c, "")) for c in COLUMNS) + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header.lstrip("# ") + "\n\n")
            f.write("| case | dtype | attnkit µs | TFLOP/s | GB/s | err | torch flash µs | cuDNN µs | efficient µs | "
                    "unfused µs | vs flash | vs best peer | attnkit µs, ordinary launches | vs best peer, ordinary |\n|" +
                    "---|" * 14 + "\n")
            for r in rows:
                d = derived(r)
                f.write(f"| {r['case']} | {r['dtype']} | {fmt(r.get('attnkit_us'), '.1f')} | {fmt(d['attnkit_tflops'], '.1f')} | "
                        f"{fmt(d['attnkit_gbps'], '.0f')} | {fmt(r.get('attnkit_err'), '.1e')} | {fmt(r.get('flash_us'), '.1f')} | "
                        f"{fmt(r.get('cudnn_us'), '.1f')} | {fmt(r.get('efficient_us'), '.1f')} | {fmt(r.get('unfused_us'), '.1f')} | "
                        f"{fmt(d['speedup_vs_flash'], '.2f')}x | {fmt(d['speedup_vs_best_peer'], '.2f')}x | "
                        f"{fmt(r.get('attnkit_ordinary_us'), '.1f')} | {fmt(d['ordinary_speedup_vs_best_peer'], '.2f')}x |\n")
    if args.plot:
        if not args.csv:
            raise SystemExit("--plot draws from the CSV: give --csv too")
        from plot_ratios import plot_csv
        plot_csv(args.csv, args.plot)


def print_table(rows):
    print("\ncase                         dtype     attnkit_us  TFLOP/s   flash_us  cudnn_us    eff_us  vs_flash  vs_best"
          "  ordinary_us  vs_best")
    for r in rows:
        d = derived(r)
        print(f"{r['case']:28s} {r['dtype']:8s} {fmt(r.get('attnkit_us'), '10.1f')} {fmt(d['attnkit_tflops'], '8.1f')} "
              f"{fmt(r.get('flash_us'), '10.1f')} {fmt(r.get('cudnn_us'), '9.1f')} {fmt(r.get('efficient_us'), '9.1f')} "
              f"{fmt(d['speedup_vs_flash'], '8.2f')}x {fmt(d['speedup_vs_best_peer'], '7.2f')}x "
              f"{fmt(r.get('attnkit_ordinary_us'), '12.1f')} {fmt(d['ordinary_speedup_vs_best_peer'], '7.2f')}x")


if __name__ == "__main__":
    main()
