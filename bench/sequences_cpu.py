#!/usr/bin/env python3
"""Ragged batches and paged K/V on the CPU backend, against the same batch run dense (one process, same inputs).

Decode: Llama-3-8B heads (32 query / 8 K/V heads, head dim 128), key lengths uniform in [lo, hi]; the dense call
reads a right-padded cache [B, Hkv, capacity, D] with key lengths, the paged calls the same keys in shuffled pages
of 16 and 64 tokens through a block table. Ragged prefill: sequences of random lengths, causal, packed, against the
same sequences right-padded to the longest (key lengths, per-batch causal offsets). Each implementation is checked
against the dense call first (the paged and packed rows must match it within the dtype's tolerance), then they
take turns in blocks of calls; the median call is reported with the GB/s of visible K/V (decode) and the ratio
dense / sequences (> 1: the sequences call is faster).

    .venv/bin/python bench/sequences_cpu.py --out bench/results/cpu-sequences-<stamp>.md
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

import attnkit  # noqa: E402

try:
    import ml_dtypes

    DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
except ImportError:  # pragma: no cover
    DTYPES = {"float16": np.float16}
TOLERANCE = {"float16": 2e-3, "bfloat16": 8e-3}


def median_time(fn, min_time):
    fn()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 5:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def paged_copy(k_dense, v_dense, lengths, page, rng, hnd):
    """The dense caches [B, Hkv, cap, D]' visible keys in shuffled pages (NHD, or HND), and their block table."""
    B, Hkv, cap, D = k_dense.shape
    max_pages = (cap + page - 1) // page
    order = rng.permutation(B * max_pages)
    k_pages = np.zeros((B * max_pages, page, Hkv, D), k_dense.dtype)
    v_pages = np.zeros_like(k_pages)
    table = np.zeros((B, max_pages), np.int32)
    for b in range(B):
        for i in range((lengths[b] + page - 1) // page):
            p = order[b * max_pages + i]
            table[b, i] = p
            rows = slice(i * page, min((i + 1) * page, cap))
            n = rows.stop - rows.start
            k_pages[p, :n] = k_dense[b, :, rows].transpose(1, 0, 2)
            v_pages[p, :n] = v_dense[b, :, rows].transpose(1, 0, 2)
    if hnd:
        return np.ascontiguousarray(k_pages.transpose(0, 2, 1, 3)), np.ascontiguousarray(v_pages.transpose(0, 2, 1, 3)), table
    return k_pages, v_pages, table


def scaled_error(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.nanmax(np.abs(a - ref)) / max(np.nanmax(np.abs(ref)), 1e-30))


def decode_rows(dtype, B, lo, hi, min_time, rng):
    H, Hkv, D = 32, 8, 128
    lengths = rng.integers(lo, hi + 1, B).astype(np.int32)
    cap = int(hi)
    t = DTYPES[dtype]
    q = rng.standard_normal((B, H, 1, D), np.float32).astype(t)
    k = rng.standard_normal((B, Hkv, cap, D), np.float32).astype(t)
    v = rng.standard_normal((B, Hkv, cap, D), np.float32).astype(t)
    dense = lambda: attnkit.attention(q, k, v, key_lengths=lengths, causal=True)  # noqa: E731
    ref = dense()
    visible_bytes = 2 * int(lengths.sum()) * Hkv * D * np.dtype(t).itemsize
    rows = []
    t_dense = median_time(dense, min_time)
    rows.append((f"decode B={B} [{lo}, {hi}] dense", dtype, t_dense, visible_bytes / t_dense / 1e9, 1.0))
    for page in (16, 64):
        for layout in ("nhd", "hnd"):
            kp, vp, table = paged_copy(k, v, lengths, page, rng, layout == "hnd")
            paged = lambda: attnkit.attention(q, kp, vp, block_table=table, key_lengths=lengths,  # noqa: E731
                                              causal=True, kv_layout=layout)
            err = scaled_error(paged(), ref)
            assert err <= TOLERANCE[dtype], f"paged {page} {layout}: error {err}"
            tp = median_time(paged, min_time)
            rows.append((f"decode B={B} [{lo}, {hi}] {layout.upper()} pages of {page}", dtype, tp,
                         visible_bytes / tp / 1e9, t_dense / tp))
    return rows


def prefill_rows(dtype, n, lo, hi, min_time, rng):
    H, Hkv, D = 32, 8, 128
    lens = rng.integers(lo, hi + 1, n)
    longest = int(lens.max())
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = DTYPES[dtype]
    q = rng.standard_normal((cu[-1], H, D), np.float32).astype(t)
    k = rng.standard_normal((cu[-1], Hkv, D), np.float32).astype(t)
    v = rng.standard_normal((cu[-1], Hkv, D), np.float32).astype(t)
    qd = np.zeros((n, longest, H, D), t)
    kd = np.zeros((n, longest, Hkv, D), t)
    vd = np.zeros((n, longest, Hkv, D), t)
    for b in range(n):
        qd[b, :lens[b]], kd[b, :lens[b]], vd[b, :lens[b]] = q[cu[b]:cu[b + 1]], k[cu[b]:cu[b + 1]], v[cu[b]:cu[b + 1]]
    lengths = lens.astype(np.int32)
    offsets = np.zeros(n, np.int32)  # right-padded: each sequence's queries start at its keys' start
    dense = lambda: attnkit.attention(qd, kd, vd, key_lengths=lengths, causal=True, causal_offset=offsets,  # noqa: E731
                                      layout="bshd")
    packed = lambda: attnkit.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)  # noqa: E731
    ref, got = dense(), packed()
    err = max(scaled_error(got[cu[b]:cu[b + 1]], ref[b, :lens[b]]) for b in range(n))
    assert err <= TOLERANCE[dtype], f"ragged prefill: error {err}"
    flops = sum(4.0 * H * D * (int(L) * (int(L) + 1) / 2) for L in lens)
    t_dense, t_packed = median_time(dense, min_time), median_time(packed, min_time)
    name = f"prefill {n} seqs [{lo}, {hi}] causal"
    return [(name + " padded", dtype, t_dense, flops / t_dense / 1e9, 1.0),
            (name + " ragged", dtype, t_packed, flops / t_packed / 1e9, t_dense / t_packed)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    rows = []
    for dtype in DTYPES:
        rows += decode_rows(dtype, 16, 1024, 4096, args.min_time, rng)
        rows += prefill_rows(dtype, 8, 64, 512, args.min_time, rng)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Ragged batches and paged K/V on the CPU backend",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (all used)",
        f"- Command: `.venv/bin/python bench/sequences_cpu.py --min-time {args.min_time}`",
        "- Median call; decode: GB/s of visible K/V; prefill: GFLOP/s of the visible pairs; ratio = dense / this "
        "(> 1: faster than the dense call of the same batch)",
        "",
        "| case | dtype | ms | GB/s or GFLOP/s | dense / this |",
        "|---|---|---|---|---|",
    ]
    for name, dtype, t, rate, ratio in rows:
        lines.append(f"| {name} | {dtype} | {t * 1e3:.3f} | {rate:.1f} | {ratio:.2f} |")
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
        print(text)


if __name__ == "__main__":
    main()
