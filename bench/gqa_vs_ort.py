#!/usr/bin/env python3
"""attnkit.group_query_attention against ONNX Runtime's CPU GroupQueryAttention, in one process, on the same inputs.

Cases (float32, Llama-3-8B attention: 32 query heads, 8 kv heads, head size 128, rotary on, causal):
  decode   one new token after 1024 / 4096 past tokens, batch 1 and 8
  prefill  a 512-token first prompt, batch 1

Both ops append to one shared KV buffer in place (past and present are the same memory: attnkit gets the same
array twice, ONNX Runtime the same OrtValue bound as past_key input and present_key output through IOBinding),
which is how a generation loop runs them; outputs go to preallocated arrays. Each case is checked first (the
scaled error of attnkit's output against ONNX Runtime's), then timed: the two ops take turns in blocks of calls
(with a pause between blocks: both keep their threads spinning for a while after a call) until each has
--min-samples calls and --min-time seconds; the median call is reported.

    .venv/bin/python bench/gqa_vs_ort.py                     # writes bench/results/gqa-cpu-<UTC date>T<HHMM>Z.md
    .venv/bin/python bench/gqa_vs_ort.py --out - --min-time 0.2
"""

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

N, NKV, H = 32, 8, 128
CASES = [
    dict(name="decode b1 past1k", B=1, S=1, past=1024),
    dict(name="decode b1 past4k", B=1, S=1, past=4096),
    dict(name="decode b8 past1k", B=8, S=1, past=1024),
    dict(name="decode b8 past4k", B=8, S=1, past=4096),
    dict(name="prefill b1 s512", B=1, S=512, past=0),
]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode != 0
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load_average():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "unknown"


def rotary_tables(rows, half):
    inv = 10000.0 ** (-np.arange(half) / half)
    angles = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class Case:
    def __init__(self, spec, rng, capacity):
        self.spec = spec
        B, S, past = spec["B"], spec["S"], spec["past"]
        self.B, self.S, self.T = B, S, past + S
        r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
        self.query, self.key, self.value = r(B, S, N * H), r(B, S, NKV * H), r(B, S, NKV * H)
        self.seqlens_k = np.full(B, self.T - 1, np.int32)
        self.total = np.array(self.T, np.int32)
        self.cos, self.sin = rotary_tables(capacity, H // 2)
        # One KV buffer per op (each appends in place), with the same past rows.
        past_k, past_v = r(B, NKV, capacity, H), r(B, NKV, capacity, H)
        self.ak_k, self.ak_v = past_k.copy(), past_v.copy()
        self.ort_k, self.ort_v = past_k, past_v
        self.ak_out = np.empty((B, S, N * H), np.float32)
        self.ort_out = np.empty((B, S, N * H), np.float32)
        self.attrs = dict(num_heads=N, kv_num_heads=NKV, do_rotary=1)

    def kv_bytes(self):
        """K and V rows the step reads: B * Nkv * T * H floats each."""
        return 2 * self.B * NKV * self.T * H * 4

    def flops(self):
        pairs = self.S * self.T - (self.S * (self.S - 1)) // 2  # causal (query, key) pairs per head
        return 4 * self.B * N * pairs * H


def attnkit_runner(case, threads):
    import attnkit

    def run():
        attnkit.group_query_attention(case.query, case.key, case.value, case.ak_k, case.ak_v, case.seqlens_k,
                                      case.total, case.cos, case.sin, **case.attrs, present_key=case.ak_k,
                                      present_value=case.ak_v, output=case.ak_out, threads=threads)

    return run


def ort_runner(case, threads):
    import onnxruntime as ort
    from gqa_onnx import build_model

    feeds = dict(query=case.query, key=case.key, value=case.value, past_key=case.ort_k, past_value=case.ort_v,
                 seqlens_k=case.seqlens_k, total_sequence_length=case.total, cos_cache=case.cos, sin_cache=case.sin)
    types = {n: (a.dtype, a.shape) for n, a in feeds.items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    sess = ort.InferenceSession(build_model(types, case.attrs), options, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    values = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in feeds.items()}  # CPU: no copies
    for n, v in values.items():
        binding.bind_ortvalue_input(n, v)
    # past and present are one buffer: ONNX Runtime appends in place (its past_present_share_buffer path).
    binding.bind_ortvalue_output("present_key", values["past_key"])
    binding.bind_ortvalue_output("present_value", values["past_value"])
    binding.bind_ortvalue_output("output", ort.OrtValue.ortvalue_from_numpy(case.ort_out))

    def run():
        sess.run_with_iobinding(binding)

    return run


def time_pair(runs, min_time, min_samples, block_time=0.25, pause=0.05):
    """Median seconds per call of each runner. The runners take turns in blocks (two untimed calls, then timed
    calls for block_time), with a pause between blocks: ONNX Runtime's intra-op threads and attnkit's OpenMP
    workers both spin for a while after a call, and on a small machine a call that starts while the other op's
    threads still spin loses its cores. Blocks alternate, so drift hits both alike."""
    samples = [[] for _ in runs]
    spent = [0.0 for _ in runs]
    while min(len(s) for s in samples) < min_samples or min(spent) < min_time:
        for i, run in enumerate(runs):
            time.sleep(pause)
            run()
            run()
            start = time.perf_counter()
            n = 0
            while n < 3 or time.perf_counter() - start < block_time:
                t0 = time.perf_counter()
                run()
                samples[i].append(time.perf_counter() - t0)
                n += 1
            spent[i] += time.perf_counter() - start
    return [statistics.median(s) for s in samples], [len(s) for s in samples]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of both ops (default: all cores)")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds of samples per op and case")
    parser.add_argument("--min-samples", type=int, default=15)
    parser.add_argument("--pause", type=float, default=0.05,
                        help="seconds between blocks, for the other op's threads to stop spinning (default %(default)s)")
    parser.add_argument("--seed", type=int, default=2025)
    parser.add_argument("--case", action="append", help="run only cases whose name contains this (repeatable)")
    parser.add_argument("--out", help="Markdown file (default bench/results/gqa-cpu-<UTC date>T<HHMM>Z.md; '-': stdout)")
    args = parser.parse_args()

    import onnxruntime as ort

    import attnkit
    from gqa_reference import scaled_error

    now = datetime.datetime.now(datetime.timezone.utc)
    out_path = args.out or os.path.join(HERE, "results", f"gqa-cpu-{now:%Y-%m-%dT%H%MZ}.md")
    load_start = load_average()
    rows = []
    for spec in CASES:
        if args.case and not any(c in spec["name"] for c in args.case):
            continue
        rng = np.random.default_rng([args.seed, spec["B"], spec["S"], spec["past"]])
        case = Case(spec, rng, capacity=max(4096, spec["past"]) + 8)
        ak, ortr = attnkit_runner(case, args.threads), ort_runner(case, args.threads)
        ak()
        ortr()
        err = scaled_error(case.ak_out, case.ort_out)
        T = case.T
        cache_err = max(scaled_error(case.ak_k[:, :, :T], case.ort_k[:, :, :T]),
                        scaled_error(case.ak_v[:, :, :T], case.ort_v[:, :, :T]))
        (t_ak, t_ort), (n_ak, n_ort) = time_pair([ak, ortr], args.min_time, args.min_samples, pause=args.pause)
        row = dict(name=spec["name"], B=case.B, S=case.S, past=spec["past"], ak_ms=t_ak * 1e3, ort_ms=t_ort * 1e3,
                   ratio=t_ort / t_ak, err=err, cache_err=cache_err, samples=min(n_ak, n_ort),
                   ak_gbs=case.kv_bytes() / t_ak / 1e9, ort_gbs=case.kv_bytes() / t_ort / 1e9,
                   ak_gflops=case.flops() / t_ak / 1e9, ort_gflops=case.flops() / t_ort / 1e9)
        rows.append(row)
        print(f"{row['name']:18s} attnkit {row['ak_ms']:8.3f} ms  ORT {row['ort_ms']:8.3f} ms  "
              f"ORT/attnkit {row['ratio']:5.2f}x  err {err:.1e}", flush=True)
    load_end = load_average()

    command = " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable,
                        os.path.relpath(os.path.abspath(__file__), ROOT)] + sys.argv[1:])
    lines = [
        "# attnkit vs ONNX Runtime: GroupQueryAttention on the CPU",
        "",
        "| field | value |",
        "|---|---|",
        f"| date (UTC) | {now:%Y-%m-%d %H:%M} |",
        f"| CPU | {cpu_name()} ({os.cpu_count()} logical cores) |",
        f"| threads | {args.threads} for both (ONNX Runtime: intra_op_num_threads, inter_op 1) |",
        f"| load average (1/5/15 min) | start {load_start}, end {load_end} |",
        f"| ONNX Runtime | {ort.__version__}, CPUExecutionProvider |",
        f"| attnkit | {attnkit.__version__}, git commit {git_commit()} |",
        f"| NumPy / Python | {np.__version__} / {platform.python_version()} |",
        f"| shape | Llama-3-8B attention: num_heads {N}, kv_num_heads {NKV}, head_size {H}, float32, do_rotary 1, causal |",
        "| cache | one shared past/present buffer per op (4104 rows; ORT: same OrtValue bound as past_key input and "
        "present_key output), appended in place; preallocated outputs |",
        f"| timing | median call time; the ops take turns in blocks of >= 0.25 s (2 untimed calls first, a 50 ms "
        f"pause between blocks, so neither starts while the other's threads still spin), until each has "
        f">= {args.min_samples} calls and >= {args.min_time:g} s per case |",
        f"| command | `{command}` |",
        "",
        "| case | B | S | past | attnkit ms | ORT ms | ORT / attnkit | attnkit KV GB/s | ORT KV GB/s | attnkit GFLOP/s "
        "| ORT GFLOP/s | output error | cache error | samples |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['B']} | {r['S']} | {r['past']} | {r['ak_ms']:.3f} | {r['ort_ms']:.3f} | "
                     f"{r['ratio']:.2f}x | {r['ak_gbs']:.1f} | {r['ort_gbs']:.1f} | {r['ak_gflops']:.1f} | "
                     f"{r['ort_gflops']:.1f} | {r['err']:.1e} | {r['cache_err']:.1e} | {r['samples']} |")
    lines += [
        "",
        "ORT / attnkit above 1: attnkit is faster. KV GB/s: the bytes of K and V rows a step reads, 2 · B · "
        "kv_num_heads · (past + S) · head_size · 4, per second. GFLOP/s: 4 · B · num_heads · causal (query, key) pairs "
        "· head_size per second. Output error: max |attnkit − ORT| / max |ORT| over the output; cache error: the same "
        "over the valid rows of both caches after the call.",
        "",
    ]
    text = "\n".join(lines)
    if out_path == "-":
        print(text)
    else:
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(out_path, ROOT)}")


if __name__ == "__main__":
    main()
