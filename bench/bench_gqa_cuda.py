#!/usr/bin/env python3
"""GroupQueryAttention on attnkit's CUDA backend (attnkit.group_query_attention on torch CUDA tensors) side by side
with PyTorch's scaled_dot_product_attention (cuDNN and flash backends), in one process, on Llama-3-8B attention
(32 query heads, 8 KV heads, head size 128, rotary on).

Cases:
  decode   one new token per sequence (S = 1): batch 64 x cache 4096 and batch 8 x cache 32768, on one shared
           buffer per cache (present_key IS past_key, appended in place), caches float16, bfloat16, and int8 /
           int4 per channel (float16 queries)
  prefill  a 4096-token causal first prompt (no past), batch 1, float16 and bfloat16

A step passes seqlens_k, total_sequence_length and the quantization scales on the host (NumPy), so it runs
without synchronisations (the op reads device copies of those back). Every case is verified first: attnkit's output
against the same call on attnkit's CPU backend (decode: batch entries 0 and 1, which are independent of the rest;
prefill: the whole call); the table prints the max abs error and the scaled error. Then each variant gets warm-up
calls, then CUDA-graph replay (triton.testing.do_bench_cudagraph, median: the GPU's time per call with the launch
and host overhead out, as the attention benchmark and PERF.md time the peers); "wall" is the host's time per call
over a plain loop of calls (what an eager caller sees when the host does not keep ahead). Should capture fail, the
row falls back to the median of CUDA-event-timed calls and its notes say "events".

The peers: SDPA on the same shapes, q (B, 32, S, 128) and k / v (B, 8, T, 128) (the caches themselves, BNSH) with
enable_gqa=True; where a backend refuses that, K / V expanded to 32 heads with repeat_interleave (the table says
so: it reads 4x the bytes). The peers compute attention only; attnkit's step also rotates Q and the new K and
appends the new K / V rows (quantizing them for int caches). Quantized rows are compared with the peer on float16
K / V of the same shape.

Decode: bytes = the K and V rows attended, in their stored format (int4: half a byte per value; the scales are
negligible); TB/s = bytes / time; tokens/s = batch / time; "vs f16" = tokens/s over the float16 cache's.
Prefill: TFLOP/s with the causal flops 4 * S * S * H * N / 2.

Run (on a GPU machine, with attnkit built with CUDA installed or on PYTHONPATH):
  python3 bench/bench_gqa_cuda.py [--quick] [--out DIR]    # writes DIR/<UTC date>-h200-gqa-cuda.{md,csv}
"""
import argparse
import csv
import datetime
import math
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnkit

HERE = os.path.dirname(os.path.abspath(__file__))
N, NKV, H = 32, 8, 128
DECODE = [("decode b64 cache4k", 64, 4096), ("decode b8 cache32k", 8, 32768)]
CACHES = ["float16", "bfloat16", "int8", "int4"]
PREFILL = [("prefill b1 s4096", 1, 4096)]
REP_MS = 100  # CUDA-graph replay time per measurement (main sets it)
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}  # scaled error against the CPU op (two backends' roundings)


def time_step(fn, reps, warmup, rep_ms):
    """(median µs of a call in CUDA-graph replay -- the GPU's time, launch and host overhead out, as the attention
    benchmark and PERF.md time -- or, where capture fails, of CUDA-event-timed calls; wall µs per call of a plain
    loop; "graph" or "events")."""
    events, wall = time_cuda(fn, reps, warmup)
    try:
        import triton.testing as tt
        return 1000.0 * tt.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"), wall, "graph"
    except Exception as e:  # noqa: BLE001 -- the table says which timing a row has
        print(f"  (CUDA-graph capture failed: {type(e).__name__}: {str(e)[:160]})", flush=True)
        torch.cuda.synchronize()
    try:  # the same replay, captured in relaxed mode (host-side CUDA queries allowed while capturing)
        return graph_replay_us(fn, rep_ms, "relaxed"), wall, "graph (relaxed capture)"
    except Exception as e:  # noqa: BLE001
        print(f"  (relaxed capture failed too: {type(e).__name__}: {str(e)[:160]}; CUDA-event timing)", flush=True)
        torch.cuda.synchronize()
        return events, wall, "events"


def graph_replay_us(fn, rep_ms, mode):
    """Median µs per call of a CUDA graph of n back-to-back calls (n from one captured call's time, ~rep_ms of
    replay), replayed 10 times between CUDA events on a side stream, like triton's do_bench_cudagraph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream, capture_error_mode=mode):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        n = max(1, int(rep_ms / (start.elapsed_time(end) / 5)))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream, capture_error_mode=mode):
            for _ in range(n):
                fn()
        times = []
        for _ in range(10):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / n)
    return statistics.median(times)


def time_cuda(fn, reps, warmup):
    """(median µs between CUDA events around each call, wall µs per call over the timed loop)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    t0 = time.perf_counter()
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / reps * 1e6
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)), wall


def rotary_tables(rows, half, dtype):
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().to(dtype).cuda(), angles.sin().to(dtype).cuda()


def make_call(B, S, T, cache, rotary, shared):
    """The inputs and attributes of one call on the GPU (a first prompt when S == T): {name: value}."""
    qdt = torch.bfloat16 if cache == "bfloat16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(B * 7919 + T)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda").to(qdt)  # noqa: E731
    kw = dict(query=r(B, S, N * H), key=r(B, S, NKV * H), value=r(B, S, NKV * H),
              seqlens_k=np.full(B, T - 1, np.int32), total_sequence_length=T, num_heads=N, kv_num_heads=NKV,
              output=torch.empty(B, S, N * H, device="cuda", dtype=qdt))
    if rotary:
        kw["cos_cache"], kw["sin_cache"] = rotary_tables(T, H // 2, qdt)
        kw["do_rotary"] = 1
    if cache in ("int8", "int4"):
        bits = 8 if cache == "int8" else 4
        kw.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=bits)
        rng = np.random.default_rng(T)
        qmax = 127 if bits == 8 else 7
        for s in ("k_scale", "v_scale"):  # host memory: no read-back
            kw[s] = (3.5 / qmax * rng.uniform(0.6, 1.6, (1, NKV, 1, H))).astype(np.float32)
        shape = (B, NKV, T, H if bits == 8 else H // 2)
        make = lambda: (torch.randint(-128, 128, shape, generator=g, device="cuda", dtype=torch.int8) if bits == 8  # noqa: E731
                        else torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8))
    else:
        make = lambda: r(B, NKV, T, H)  # noqa: E731
    if shared:
        kw["past_key"], kw["past_value"] = make(), make()
        kw["present_key"], kw["present_value"] = kw["past_key"], kw["past_value"]
    else:  # a first prompt: no past; the present caches are passed in (nothing is allocated per step)
        kw["present_key"], kw["present_value"] = make(), make()
    return kw


def cpu_copy(kw, batch):
    """The call on the host for batch entries [0, batch): CPU tensors (attnkit's CPU backend), caches copied as they
    are now (before the GPU's step)."""
    out = {}
    for n, v in kw.items():
        if isinstance(v, torch.Tensor) and n not in ("cos_cache", "sin_cache"):
            v = v[:batch]
        out[n] = v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v
    if isinstance(kw.get("seqlens_k"), np.ndarray):
        out["seqlens_k"] = kw["seqlens_k"][:batch].copy()
    if "past_key" in kw and kw["past_key"] is kw["present_key"]:
        out["present_key"], out["present_value"] = out["past_key"], out["past_value"]
    return out


def verify(kw, batch):
    """attnkit on the GPU against attnkit on the CPU (batch entries [0, batch)): (max abs error, scaled error)."""
    host = cpu_copy(kw, batch)
    want = attnkit.group_query_attention(**host)[0].double()
    got = attnkit.group_query_attention(**kw)[0]
    torch.cuda.synchronize()
    got = got[:batch].double().cpu()
    if not torch.isfinite(got).all():
        return float("inf"), float("inf")
    diff = (got - want).abs().max().item()
    return diff, diff / max(want.abs().max().item(), 1e-30)


def sdpa(backend, q, k, v, causal):
    """A peer call and a note: enable_gqa where the backend takes it, else K / V expanded to N heads; q as the
    strided view of the query (positions-first, as a model passes it), else a contiguous copy (made once)."""
    def run(q_, k_, v_, gqa):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, enable_gqa=gqa)

    expanded = None
    last = None
    for gqa in (True, False):
        if not gqa:
            expanded = (k.repeat_interleave(N // NKV, dim=1), v.repeat_interleave(N // NKV, dim=1))
        k_, v_ = (k, v) if gqa else expanded
        for q_ in (q, q.contiguous()) if not q.is_contiguous() else (q,):
            try:
                run(q_, k_, v_, gqa)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- the backend refuses the shape, strides or flag
                last = e
                continue
            note = "enable_gqa" if gqa else "expanded K/V (4x bytes)"
            return (lambda: run(q_, k_, v_, gqa)), note + ("" if q_ is q else ", contiguous q")
    return None, f"refused ({type(last).__name__})"


def peers(q, k, v, causal, reps, warmup):
    res = {}
    for name, backend in PEERS.items():
        fn, note = sdpa(backend, q, k, v, causal)
        res[name + "_note"] = note
        res[name + "_us"] = time_step(fn, reps, warmup, REP_MS)[0] if fn else float("nan")
        del fn
    return res


def run_attnkit(row, kw, batch, reps, warmup):
    """Verifies, then times attnkit's call into `row`; a failure is noted there (the peers and other cases still
    run)."""
    try:
        row["max_abs_err"], row["scaled_err"] = verify(kw, batch)
        row["attnkit_us"], row["wall_us"], row["timing"] = time_step(lambda: attnkit.group_query_attention(**kw), reps,
                                                                      warmup, REP_MS)
    except Exception as e:  # noqa: BLE001 -- reported in the table
        row["note"] = f"attnkit: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def decode_rows(args, reps, warmup):
    rows = []
    for name, B, T in DECODE:
        f16_peers = {}
        for cache in CACHES:
            row = dict(kind="decode", case=name, cache=cache, B=B, T=T)
            row_bytes = H * 2 if cache in ("float16", "bfloat16") else (H if cache == "int8" else H // 2)
            row["bytes"] = B * NKV * T * row_bytes * 2
            kw = make_call(B, 1, T, cache, not args.no_rotary, shared=True)
            run_attnkit(row, kw, min(B, 2), reps, warmup)  # batch entries 0-1 against the CPU
            if cache in ("float16", "bfloat16"):
                q = kw["query"].view(B, 1, N, H).transpose(1, 2)
                row.update(peers(q, kw["past_key"], kw["past_value"], False, reps, warmup))
                if cache == "float16":
                    f16_peers = {k: v for k, v in row.items() if k.startswith(tuple(PEERS))}
            else:  # a quantized cache: the peers on float16 K / V of the same shape
                row.update(f16_peers)
                for p in PEERS:
                    if p + "_note" in row:
                        row[p + "_note"] = "f16 K/V, " + row[p + "_note"]
            rows.append(row)
            print(fmt_decode(row, rows), flush=True)
            del kw
            torch.cuda.empty_cache()
    return rows


def prefill_rows(args, reps, warmup):
    rows = []
    for name, B, S in PREFILL:
        for dtype in ("float16", "bfloat16"):
            row = dict(kind="prefill", case=name, cache=dtype, B=B, T=S, flops=4.0 * S * S * H * N / 2 * B)
            kw = make_call(B, S, S, dtype, not args.no_rotary, shared=False)
            run_attnkit(row, kw, B, reps, warmup)
            q = kw["query"].view(B, S, N, H).transpose(1, 2)
            row.update(peers(q, kw["present_key"], kw["present_value"], True, reps, warmup))
            rows.append(row)
            print(fmt_prefill(row), flush=True)
            del kw, q
            torch.cuda.empty_cache()
    return rows


# ---- output ------------------------------------------------------------------------------------------------------

def fmt(x, spec):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def status(r):
    tol = TOLERANCE["bfloat16" if r["cache"] == "bfloat16" else "float16"]
    return "ok" if r.get("scaled_err", float("inf")) <= tol else "FAIL"


def derived(r, rows=()):
    t = r.get("attnkit_us", float("nan"))
    d = {"status": status(r)}
    for p in PEERS:
        d[f"vs_{p}"] = t / r.get(p + "_us", float("nan"))
    if r["kind"] == "decode":
        d["tb_s"] = r["bytes"] / t / 1e6
        d["tokens_s"] = r["B"] / t * 1e6
        f16 = next((o for o in rows if o["case"] == r["case"] and o["cache"] == "float16"), None)
        d["vs_f16_cache"] = d["tokens_s"] / (f16["B"] / f16.get("attnkit_us", float("nan")) * 1e6) if f16 else float("nan")
    else:
        d["tflops"] = r["flops"] / t / 1e6
        for p in PEERS:
            d[f"{p}_tflops"] = r["flops"] / r.get(p + "_us", float("nan")) / 1e6
    return d


def fmt_decode(r, rows):
    d = derived(r, rows)
    return (f"{r['case']:20s} {r['cache']:9s} attnkit {fmt(r.get('attnkit_us'), '8.1f')} us (wall "
            f"{fmt(r.get('wall_us'), '.1f')}) {fmt(d['tb_s'], '5.2f')} TB/s {fmt(d['tokens_s'], '9.0f')} tok/s "
            f"vs f16 {fmt(d['vs_f16_cache'], '.2f')}x err {fmt(r.get('max_abs_err'), '.1e')} {d['status']} | cudnn "
            f"{fmt(r.get('cudnn_us'), '.1f')} flash {fmt(r.get('flash_us'), '.1f')} {r.get('note', '')}")


def fmt_prefill(r):
    d = derived(r)
    return (f"{r['case']:20s} {r['cache']:9s} attnkit {fmt(r.get('attnkit_us'), '8.1f')} us "
            f"{fmt(d['tflops'], '6.1f')} TFLOP/s err {fmt(r.get('max_abs_err'), '.1e')} {d['status']} | flash "
            f"{fmt(r.get('flash_us'), '.1f')} cudnn {fmt(r.get('cudnn_us'), '.1f')} {r.get('note', '')}")


def markdown(rows, header):
    dec = [r for r in rows if r["kind"] == "decode"]
    pre = [r for r in rows if r["kind"] == "prefill"]
    out = [header, ""]
    out += ["## Decode (S = 1, shared-buffer cache, rotary + append included)", "",
            "| case | cache | attnkit µs/step | wall µs/step | K+V read | TB/s | tokens/s | vs f16 cache | "
            "max abs err | check | cuDNN µs | attnkit/cuDNN | flash µs | attnkit/flash | peer notes |",
            "|" + "---|" * 15]
    for r in dec:
        d = derived(r, dec)
        notes = "; ".join(f"{p}: {r[p + '_note']}" for p in PEERS if p + "_note" in r)
        if r.get("timing", "graph") != "graph":
            notes = f"attnkit: {r['timing']}; " + notes
        if r.get("note"):
            notes = r["note"] + ("; " + notes if notes else "")
        out.append(f"| {r['case']} | {r['cache']} | {fmt(r.get('attnkit_us'), '.1f')} | {fmt(r.get('wall_us'), '.1f')} | "
                   f"{r['bytes'] / 2**20:.0f} MiB | {fmt(d['tb_s'], '.2f')} | {fmt(d['tokens_s'], '.0f')} | "
                   f"{fmt(d['vs_f16_cache'], '.2f')}x | {fmt(r.get('max_abs_err'), '.1e')} | {d['status']} | "
                   f"{fmt(r.get('cudnn_us'), '.1f')} | {fmt(d['vs_cudnn'], '.2f')} | {fmt(r.get('flash_us'), '.1f')} | "
                   f"{fmt(d['vs_flash'], '.2f')} | {notes} |")
    out += ["", "## Prefill (causal first prompt, no past; rotary + cache write included)", "",
            "| case | dtype | attnkit µs | TFLOP/s | max abs err | check | flash µs | flash TFLOP/s | attnkit/flash | "
            "cuDNN µs | cuDNN TFLOP/s | attnkit/cuDNN | peer notes |", "|" + "---|" * 13]
    for r in pre:
        d = derived(r)
        notes = "; ".join(f"{p}: {r[p + '_note']}" for p in PEERS if p + "_note" in r)
        if r.get("timing", "graph") != "graph":
            notes = f"attnkit: {r['timing']}; " + notes
        if r.get("note"):
            notes = r["note"] + ("; " + notes if notes else "")
        out.append(f"| {r['case']} | {r['cache']} | {fmt(r.get('attnkit_us'), '.1f')} | {fmt(d['tflops'], '.1f')} | "
                   f"{fmt(r.get('max_abs_err'), '.1e')} | {d['status']} | {fmt(r.get('flash_us'), '.1f')} | "
                   f"{fmt(d['flash_tflops'], '.1f')} | {fmt(d['vs_flash'], '.2f')} | {fmt(r.get('cudnn_us'), '.1f')} | "
                   f"{fmt(d['cudnn_tflops'], '.1f')} | {fmt(d['vs_cudnn'], '.2f')} | {notes} |")
    out += ["", "attnkit/peer is a time ratio (< 1: attnkit faster). Errors: attnkit's CUDA output against its CPU "
            "backend on the same inputs (decode: batch entries 0-1); check = scaled error within "
            f"{TOLERANCE['float16']:g} (float16 queries) / {TOLERANCE['bfloat16']:g} (bfloat16)."]
    return "\n".join(out) + "\n"


CSV_COLUMNS = ["kind", "case", "cache", "B", "T", "attnkit_us", "wall_us", "bytes", "tb_s", "tokens_s", "vs_f16_cache",
               "flops", "tflops", "max_abs_err", "scaled_err", "status", "cudnn_us", "vs_cudnn", "cudnn_note",
               "flash_us", "vs_flash", "flash_note", "timing", "note"]


def git_commit():
    if os.environ.get("ATTNKIT_COMMIT"):
        return os.environ["ATTNKIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=HERE, timeout=5).returncode != 0
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer warm-ups and repetitions")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="folder of the .md and .csv (default: %(default)s)")
    ap.add_argument("--no-rotary", action="store_true", help="do_rotary = 0 (attention and append only)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or "cuda" not in attnkit.available_backends():
        sys.exit("bench_gqa_cuda: needs a CUDA device and attnkit's CUDA backend "
                 f"(attnkit.available_backends() = {attnkit.available_backends()})")
    reps, warmup = (20, 3) if args.quick else (100, 10)
    global REP_MS
    REP_MS = 25 if args.quick else 100
    now = datetime.datetime.now(datetime.timezone.utc)
    device = torch.cuda.get_device_name()
    header = (f"# GroupQueryAttention on CUDA: attnkit vs PyTorch SDPA\n\n{now:%Y-%m-%d %H:%M} UTC | {device} | torch "
              f"{torch.__version__} | cuDNN {torch.backends.cudnn.version()} | attnkit {attnkit.__version__} | commit "
              f"{git_commit()} | Llama-3-8B heads {N}/{NKV}, head size {H}, rotary "
              f"{'off' if args.no_rotary else 'on'} | timing: CUDA-graph replay median (triton do_bench_cudagraph, rep "
              f"{REP_MS} ms; a row marked 'events': median of {reps} CUDA-event-timed calls after {warmup} warm-ups); "
              f"wall: host time per call of a plain loop of {reps} | command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(header, flush=True)
    rows = decode_rows(args, reps, warmup) + prefill_rows(args, reps, warmup)

    text = markdown(rows, header)
    print("\n" + text)
    os.makedirs(args.out, exist_ok=True)
    slug = "h200" if "H200" in device else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    base = os.path.join(args.out, f"{now:%Y-%m-%d}-{slug}-gqa-cuda")
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            d = {**r, **derived(r, [o for o in rows if o["kind"] == r["kind"]])}
            w.writerow([d.get(c, "") for c in CSV_COLUMNS])
    print(f"wrote {base}.md and {base}.csv")
    return 1 if any(status(r) != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
