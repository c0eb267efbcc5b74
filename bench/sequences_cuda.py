#!/usr/bin/env python3
"""Ragged batches and paged K/V on the CUDA backend, against the same batch run dense (one process, same inputs,
CUDA-graph replay, median: triton.testing.do_bench_cudagraph).

- Paged decode: Llama-3-8B heads (32 query / 8 K/V heads, head dim 128), bfloat16, key lengths uniform in
  [1024, 8192]; the dense call reads a right-padded cache [B, 8192, Hkv, D] with device key lengths, the paged
  calls the same keys in shuffled pages of 16, 32, 64 and 256 tokens through a device block table, on the plan's
  kernel and forced onto the mma.sync kernel. Reported: the visible K/V's bandwidth and paged / dense bandwidth.
- Varlen decode: the dense call alone at batch 32, key lengths uniform in [1, 8192] (device key lengths).
- Ragged prefill: 8 sequences of 256-4096 tokens, causal, packed (attention_varlen), against the same sequences
  right-padded to the longest (device key lengths), on the plan's kernel and on mma.sync, and against PyTorch's
  varlen attention where this PyTorch has it. TFLOP/s count the visible (causal) pairs of the real tokens only.

Each sequences call is first checked against the dense call (rows within the dtype's tolerance).

    python bench/sequences_cuda.py --out bench/results/<date>-h200-cuda-sequences.md
"""

import argparse
import datetime
import os
import subprocess
import sys

import torch
import triton.testing as tt

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
import attnkit  # noqa: E402

HQ, HKV, D = 32, 8, 128
TOL = 8e-3  # bfloat16 (docs/numerics.md)


def timed(fn, rep):
    fn()
    torch.cuda.synchronize()
    return 1000.0 * tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")  # µs


def close(a, b, what):
    err = ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
    if not err <= TOL:
        raise ValueError(f"{what}: scaled error {err:.2e} above {TOL}")
    return err


def paged(k, v, lengths, page, gen):
    """The dense caches' [B, cap, Hkv, D] visible keys in shuffled pages [pages, page, Hkv, D] and a block table."""
    B, cap = k.shape[0], k.shape[1]
    per = (cap + page - 1) // page
    order = torch.randperm(B * per, generator=gen).tolist()
    k_pages = torch.zeros(B * per, page, HKV, D, dtype=k.dtype, device=k.device)
    v_pages = torch.zeros_like(k_pages)
    table = torch.zeros(B, per, dtype=torch.int32)
    for b in range(B):
        for i in range((int(lengths[b]) + page - 1) // page):
            p = order[b * per + i]
            table[b, i] = p
            n = min(page, cap - i * page)
            k_pages[p, :n] = k[b, i * page:i * page + n]
            v_pages[p, :n] = v[b, i * page:i * page + n]
    return k_pages, v_pages, table.cuda()


def decode_rows(rep, gen):
    rows = []
    B, cap = 64, 8192
    lengths = torch.randint(1024, cap + 1, (B,), generator=gen, dtype=torch.int32)
    q = torch.randn(B, 1, HQ, D, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(B, cap, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(B, cap, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    lens = lengths.cuda()
    visible_bytes = 2 * int(lengths.sum()) * HKV * D * 2
    dense = lambda: attnkit.attention(q, k, v, key_lengths=lens, layout="bshd")  # noqa: E731
    ref = dense()
    dense_us = timed(dense, rep)
    rows.append(("paged decode: dense cache, key lengths", B, dense_us, visible_bytes / dense_us / 1e6, 1.0, 0.0))
    # The kernel the sequences calls run (mma.sync), on the dense cache: what the pages themselves cost.
    dense_mma = lambda: attnkit.attention(q, k, v, key_lengths=lens, layout="bshd", plan="kernel=mma")  # noqa: E731
    err = close(dense_mma(), ref, "dense on mma.sync")
    us = timed(dense_mma, rep)
    rows.append(("paged decode: dense cache on the mma.sync kernel", B, us, visible_bytes / us / 1e6, dense_us / us, err))
    for page in (16, 32, 64, 256):
        k_pages, v_pages, table = paged(k, v, lengths, page, gen)
        for plan, shown in (("", ""), ("kernel=mma", " on the mma.sync kernel")):
            call = lambda: attnkit.attention(q, k_pages, v_pages, block_table=table, key_lengths=lens,  # noqa: E731
                                             layout="bshd", plan=plan)
            err = close(call(), ref, f"paged {page}{shown}")
            us = timed(call, rep)
            rows.append((f"paged decode: pages of {page}{shown}", B, us, visible_bytes / us / 1e6, dense_us / us, err))
        del k_pages, v_pages
    B = 32
    lengths = torch.randint(1, cap + 1, (B,), generator=gen, dtype=torch.int32)
    lens = lengths.cuda()
    q2, k2, v2 = q[:B].contiguous(), k[:B].contiguous(), v[:B].contiguous()
    call = lambda: attnkit.attention(q2, k2, v2, key_lengths=lens, layout="bshd")  # noqa: E731
    us = timed(call, rep)
    rows.append(("varlen decode: dense cache, lengths in [1, 8192]", B, us,
                 2 * int(lengths.sum()) * HKV * D * 2 / us / 1e6, None, 0.0))
    return rows


def torch_varlen():
    try:
        from torch.nn.attention import varlen  # noqa: F401

        return varlen
    except Exception:
        return None


def prefill_rows(rep, gen):
    rows = []
    lengths = torch.randint(256, 4097, (8,), generator=gen).tolist()
    B, longest, total = len(lengths), max(lengths), sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32).cuda()
    q = torch.randn(total, HQ, D, generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn(total, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(total, HKV, D, generator=gen).to(torch.bfloat16).cuda()
    qp = torch.zeros(B, longest, HQ, D, dtype=q.dtype, device="cuda")
    kp = torch.zeros(B, longest, HKV, D, dtype=q.dtype, device="cuda")
    vp = torch.zeros_like(kp)
    starts = [0] + list(torch.tensor(lengths).cumsum(0).tolist())
    for b, n in enumerate(lengths):
        qp[b, :n], kp[b, :n], vp[b, :n] = q[starts[b]:starts[b] + n], k[starts[b]:starts[b] + n], v[starts[b]:starts[b] + n]
    lens = torch.tensor(lengths, dtype=torch.int32).cuda()
    flops = sum(4 * HQ * D * n * (n + 1) / 2 for n in lengths)
    padded = lambda: attnkit.attention(qp, kp, vp, key_lengths=lens, causal=True, layout="bshd")  # noqa: E731
    ragged = lambda: attnkit.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)  # noqa: E731
    ref = padded()
    out = ragged()
    err = max(close(out[starts[b]:starts[b] + n], ref[b, :n], f"ragged sequence {b}") for b, n in enumerate(lengths))
    padded_us = timed(padded, rep)
    ragged_us = timed(ragged, rep)
    rows.append(("ragged prefill: padded dense, key lengths", B, padded_us, flops / padded_us / 1e6, 1.0, 0.0))
    padded_mma = lambda: attnkit.attention(qp, kp, vp, key_lengths=lens, causal=True, layout="bshd", plan="kernel=mma")  # noqa: E731
    us = timed(padded_mma, rep)
    rows.append(("ragged prefill: padded dense on the mma.sync kernel", B, us, flops / us / 1e6, padded_us / us, 0.0))
    rows.append(("ragged prefill: attention_varlen", B, ragged_us, flops / ragged_us / 1e6, padded_us / ragged_us, err))
    ragged_mma = lambda: attnkit.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True, plan="kernel=mma")  # noqa: E731
    err = max(close(ragged_mma()[starts[b]:starts[b] + n], ref[b, :n], f"ragged {b} on mma.sync")
              for b, n in enumerate(lengths))
    us = timed(ragged_mma, rep)
    rows.append(("ragged prefill: attention_varlen on the mma.sync kernel", B, us, flops / us / 1e6, padded_us / us, err))
    varlen = torch_varlen()
    if varlen is not None and hasattr(varlen, "varlen_attn"):
        kr = k.repeat_interleave(HQ // HKV, dim=1)
        vr = v.repeat_interleave(HQ // HKV, dim=1)
        import inspect

        params = inspect.signature(varlen.varlen_attn).parameters
        # (causal: this PyTorch takes a window (left, right), -1 unbounded; right 0 is causal, bottom-right)
        causal_kw = ({"is_causal": True} if "is_causal" in params else
                     {"window_size": (-1, 0)} if "window_size" in params else {"causal": True})
        peer = lambda: varlen.varlen_attn(q, kr, vr, cu, cu, longest, longest, **causal_kw)  # noqa: E731
        try:
            err_peer = max(close(peer()[starts[b]:starts[b] + n], ref[b, :n], "torch varlen") for b, n in enumerate(lengths))
            us = timed(peer, rep)
            rows.append(("ragged prefill: torch.nn.attention.varlen (K/V repeated to 32 heads)", B, us,
                         flops / us / 1e6, padded_us / us, err_peer))
        except Exception as e:  # pragma: no cover (the peer's own limits)
            rows.append((f"ragged prefill: torch varlen failed ({type(e).__name__}: {str(e)[:80]})", B, None, None, None, None))
    else:
        rows.append(("ragged prefill: torch.nn.attention.varlen not in this PyTorch", B, None, None, None, None))
    return rows, lengths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rep", type=int, default=200, help="ms of replays per timing")
    ap.add_argument("--out", help="markdown file to write")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(2026)
    rows = decode_rows(args.rep, gen)
    prefill, lengths = prefill_rows(args.rep, gen)
    rows += prefill
    # (the bundle's commit where the binaries came from one: scripts/gpu-check exports it)
    commit = os.environ.get("ATTNKIT_COMMIT") or subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# CUDA sequences (ragged, paged) against dense, {datetime.date.today()}", "",
             f"device: {torch.cuda.get_device_name()} | commit: {commit} | torch {torch.__version__} | "
             f"timing: CUDA-graph replay median (rep {args.rep} ms) | command: {' '.join(sys.argv)}", "",
             f"Llama-3-8B heads ({HQ} / {HKV}, d {D}), bfloat16. Prefill sequence lengths: {lengths}.", "",
             "| case | batch | µs | TB/s of visible K/V (decode) or TFLOP/s (prefill) | dense time / this time | scaled error |",
             "|---|---|---|---|---|---|"]
    for name, b, us, rate, ratio, err in rows:
        f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
        unit = f(rate, ".2f") if "decode" in name else f(rate, ".0f")
        lines.append(f"| {name} | {b} | {f(us, '.1f')} | {unit} | {f(ratio, '.2f')} | {f(err, '.1e')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
