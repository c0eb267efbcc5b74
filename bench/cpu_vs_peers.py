#!/usr/bin/env python3
"""attnkit's CPU backend against the CPU peers a user would pick, in one process, on the same inputs:
PyTorch's `F.scaled_dot_product_attention` (its CPU flash-attention kernel) and ONNX Runtime's CPU provider
(`com.microsoft.MultiHeadAttention`, and `GroupQueryAttention` for the grouped Llama shapes), each with the same
thread count.

Every case is checked against a float64 reference (NumPy) first, then the implementations take turns in blocks of
calls after warm-up, with a pause between blocks (every runtime here keeps its threads spinning a while after a
call); the median call is reported, and the ratio peer / attnkit (> 1: attnkit is faster). --runs repeats the
whole table; the summary gives each run's ratio and their median.

Inputs: Q, K and V live once, positions first ([B, S, H, D], what ONNX Runtime's MultiHeadAttention takes as
[B, S, H * D]); PyTorch and attnkit read the same memory through transposed views. The Llama rows keep K/V in a
cache [B, Hkv, capacity, D] that ONNX Runtime's GroupQueryAttention appends to in place (past and present bound to
one buffer, as a generation loop runs it), and that attnkit and PyTorch read as it is. bfloat16 has no ONNX
Runtime column: its CPU provider has no bfloat16 kernel of either op.

    .venv/bin/python bench/cpu_vs_peers.py                    # all cases, 3 runs, bench/results/cpu-peers-<stamp>.md
    .venv/bin/python bench/cpu_vs_peers.py --case whisper --dtype float32 --runs 1 --min-time 0.2 --out -
    .venv/bin/python bench/cpu_vs_peers.py --workloads         # real models' calls outside the table
    .venv/bin/python bench/cpu_vs_peers.py --random 24 --random-seed 1   # calls drawn from real models' space

PyTorch and ONNX Runtime are optional: a missing one leaves its column empty (`pip install torch onnxruntime onnx`).
"""

import argparse
import datetime
import math
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

# name, batch, query heads, kv heads, queries, keys, head dim, causal (bottom-right: the last query sees every key)
CASES = [
    ("minilm_b1_s128", 1, 12, 12, 128, 128, 32, False),
    ("minilm_b8_s128", 8, 12, 12, 128, 128, 32, False),
    ("bert_b1_s128", 1, 12, 12, 128, 128, 64, False),
    ("bert_b1_s512", 1, 12, 12, 512, 512, 64, False),
    ("bert_b8_s128", 8, 12, 12, 128, 128, 64, False),
    ("bert_b8_s512", 8, 12, 12, 512, 512, 64, False),
    ("whisper_enc_1500", 1, 12, 12, 1500, 1500, 64, False),
    ("whisper_dec_448", 1, 12, 12, 1, 448, 64, True),
    ("whisper_cross_1q", 1, 12, 12, 1, 1500, 64, False),
    ("llama8b_decode_b1_k4k", 1, 32, 8, 1, 4096, 128, True),
    ("llama8b_decode_b8_k4k", 8, 32, 8, 1, 4096, 128, True),
    ("llama8b_prefill_512", 1, 32, 8, 512, 512, 128, True),
    ("llama8b_chunk128_k4k", 1, 32, 8, 128, 4096, 128, True),
]
# --workloads: real models' calls outside the table above (other head dims, GQA ratios, batch sizes, odd lengths,
# verify steps and chunks), sized for a CPU: the cliffs a user finds by choosing another model.
WORKLOADS = [
    ("phi2_prefill_s512_d80", 1, 32, 32, 512, 512, 80, True),
    ("phi3_prefill_s512_d96", 1, 32, 32, 512, 512, 96, True),
    ("gemma7b_prefill_s512_d256", 1, 16, 16, 512, 512, 256, True),
    ("mistral_prefill_s1k_gqa4", 1, 32, 8, 1024, 1024, 128, True),
    ("qwen2_0p5b_prefill_s512_gqa7", 1, 14, 2, 512, 512, 64, True),
    ("sd15_self_1024_d40", 2, 8, 8, 1024, 1024, 40, False),
    ("sd15_self_1024_d80", 2, 8, 8, 1024, 1024, 80, False),
    ("sd15_cross_1024x77_d40", 2, 8, 8, 1024, 77, 40, False),
    ("vit_b16_b8_s197", 8, 12, 12, 197, 197, 64, False),
    ("t5_small_b4_s512_d64", 4, 8, 8, 512, 512, 64, False),
    ("tiny_d16_b4_s256", 4, 4, 4, 256, 256, 16, False),
    ("llama8b_verify_b4_q5_k2k", 4, 32, 8, 5, 2048, 128, True),
    ("llama8b_chunk64_k2k", 1, 32, 8, 64, 2048, 128, True),
    ("llama8b_decode_b1_k1k", 1, 32, 8, 1, 1024, 128, True),
    ("qwen2_7b_decode_b4_k2k_gqa7", 4, 28, 4, 1, 2048, 128, True),
    ("gemma2b_decode_b1_k4k_mqa_d256", 1, 8, 1, 1, 4096, 256, True),
    ("falcon7b_decode_b1_k2k_mqa71", 1, 71, 1, 1, 2048, 64, True),
    ("phi3_decode_b4_k2k_d96", 4, 32, 32, 1, 2048, 96, True),
]
DTYPES = ("float32", "bfloat16", "float16")
# --random: calls drawn as on the GPU (bench/random_calls.py), each at most 4 GFLOP and 150 MB of K/V at 2 bytes an
# element, so that a call of the slowest peer takes tens of milliseconds on two cores.
RANDOM_MAX_FLOPS = 4e9
RANDOM_MAX_KV_BYTES = 1.5e8
_random_specs = []


def random_specs(n, seed):
    from random_calls import draw

    _random_specs[:] = [(c["name"], c["b"], c["hq"], c["hkv"], c["sq"], c["sk"], c["d"], c["causal"])
                        for c in draw(n, seed, RANDOM_MAX_FLOPS, RANDOM_MAX_KV_BYTES)]
    return list(_random_specs)


def spec_index(spec):
    """A case's place in the tables (random calls after them): part of its inputs' seed."""
    named = CASES + WORKLOADS
    return named.index(spec) if spec in named else len(named) + _random_specs.index(spec)
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}  # docs/numerics.md, scaled error


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


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


class Case:
    """One shape in one dtype: the inputs (positions first), the K/V cache for the grouped shapes, outputs."""

    def __init__(self, spec, dtype, rng):
        self.name, self.B, self.H, self.Hkv, self.Sq, self.Sk, self.D, self.causal = spec
        self.dtype = dtype
        self.grouped = self.H != self.Hkv
        t = np_dtype(dtype)
        r = lambda *s: rng.standard_normal(s, dtype=np.float32).astype(t)  # noqa: E731
        B, H, Hkv, Sq, Sk, D = self.B, self.H, self.Hkv, self.Sq, self.Sk, self.D
        self.q = r(B, Sq, H, D)
        if self.grouped:
            # ONNX Runtime's GQA appends the new rows (the last Sq keys) to a BNSH cache; the others read it.
            self.past = Sk - Sq
            self.capacity = Sk
            self.k_cache, self.v_cache = r(B, Hkv, Sk, D), r(B, Hkv, Sk, D)
            self.k_new = np.ascontiguousarray(self.k_cache[:, :, self.past:].transpose(0, 2, 1, 3))
            self.v_new = np.ascontiguousarray(self.v_cache[:, :, self.past:].transpose(0, 2, 1, 3))
            self.k_bhsd, self.v_bhsd = self.k_cache, self.v_cache
        else:
            self.k, self.v = r(B, Sk, Hkv, D), r(B, Sk, Hkv, D)
            self.k_bhsd, self.v_bhsd = self.k.transpose(0, 2, 1, 3), self.v.transpose(0, 2, 1, 3)
        self.q_bhsd = self.q.transpose(0, 2, 1, 3)

    def flops(self):
        pairs = self.Sq * self.Sk
        if self.causal:
            off = self.Sk - self.Sq
            pairs = sum(min(self.Sk, i + off + 1) for i in range(self.Sq))
        return 4 * self.B * self.H * pairs * self.D

    def reference(self):
        """float64 O in [B, Sq, H, D] from the same rounded inputs."""
        q = self.q_bhsd.astype(np.float64)
        group = self.H // self.Hkv
        k = np.repeat(self.k_bhsd.astype(np.float64), group, axis=1)
        v = np.repeat(self.v_bhsd.astype(np.float64), group, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.D)
        if self.causal:
            off = self.Sk - self.Sq
            hidden = np.arange(self.Sk)[None, :] > np.arange(self.Sq)[:, None] + off
            s[..., hidden] = -np.inf
        s -= s.max(-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(-1, keepdims=True)
        return (p @ v).transpose(0, 2, 1, 3)


def scaled_error(out_bshd, ref):
    o = np.asarray(out_bshd).astype(np.float64)
    return float(np.abs(o - ref).max() / np.abs(ref).max())


# ---------------------------------------------------------------------------------------------------- runners
# Each returns (run, output_as_numpy_bshd) or raises; run() computes one call into preallocated memory where the
# API allows it.

def attnkit_runner(case, threads, plan=""):
    import attnkit

    out = np.empty((case.B, case.Sq, case.H, case.D), case.q.dtype)
    out_bhsd = out.transpose(0, 2, 1, 3)
    q, k, v = case.q_bhsd, case.k_bhsd, case.v_bhsd

    def run():
        attnkit.attention(q, k, v, causal=case.causal, out=out_bhsd, threads=threads, plan=plan)

    return run, lambda: out


def attnkit_gqa_runner(case, threads):
    """attnkit.group_query_attention on the ORT GQA inputs (its own copy of the cache, appended in place)."""
    import attnkit

    k_cache, v_cache = case.k_cache.copy(), case.v_cache.copy()
    B, Sq = case.B, case.Sq
    out = np.empty((B, Sq, case.H * case.D), case.q.dtype)
    query = case.q.reshape(B, Sq, case.H * case.D)
    key = case.k_new.reshape(B, Sq, case.Hkv * case.D)
    value = case.v_new.reshape(B, Sq, case.Hkv * case.D)
    seqlens = np.full(B, case.Sk - 1, np.int32)
    total = np.array(case.Sk, np.int32)

    def run():
        attnkit.group_query_attention(query, key, value, k_cache, v_cache, seqlens, total, num_heads=case.H,
                                      kv_num_heads=case.Hkv, present_key=k_cache, present_value=v_cache,
                                      output=out, threads=threads)

    return run, lambda: out.reshape(B, Sq, case.H, case.D)


def torch_runner(case, threads):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)

    def tensor(a):
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    q, k, v = tensor(case.q_bhsd), tensor(case.k_bhsd), tensor(case.v_bhsd)
    mask = None
    is_causal = False
    if case.causal and case.Sq > 1:
        if case.Sq == case.Sk:
            is_causal = True  # torch's is_causal is top-left aligned: the same rule only for a square problem
        else:
            off = case.Sk - case.Sq
            mask = torch.from_numpy(np.arange(case.Sk)[None, :] <= np.arange(case.Sq)[:, None] + off)
    kwargs = dict(enable_gqa=True) if case.grouped else {}
    holder = {}

    def run():
        with torch.no_grad():
            holder["o"] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, **kwargs)

    def output():
        o = holder["o"].transpose(1, 2)
        return o.float().numpy() if o.dtype == torch.bfloat16 else o.numpy()

    return run, output


def ort_runner(case, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if case.dtype == "bfloat16":
        raise RuntimeError("no bfloat16 kernel in ONNX Runtime's CPU provider")
    et = TensorProto.FLOAT if case.dtype == "float32" else TensorProto.FLOAT16
    B, Sq, Sk, H, Hkv, D = case.B, case.Sq, case.Sk, case.H, case.Hkv, case.D
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    out = np.empty((B, Sq, H * D), case.q.dtype)
    feeds = {"query": case.q.reshape(B, Sq, H * D)}
    if case.grouped:
        from gqa_onnx import build_model

        past_k, past_v = case.k_cache.copy(), case.v_cache.copy()
        feeds.update(key=case.k_new.reshape(B, Sq, Hkv * D), value=case.v_new.reshape(B, Sq, Hkv * D),
                     past_key=past_k, past_value=past_v, seqlens_k=np.full(B, Sk - 1, np.int32),
                     total_sequence_length=np.array(Sk, np.int32))
        types = {n: (a.dtype, a.shape) for n, a in feeds.items()}
        model = build_model(types, dict(num_heads=H, kv_num_heads=Hkv))
    else:
        feeds.update(key=case.k.reshape(B, Sk, H * D), value=case.v.reshape(B, Sk, H * D))
        if case.causal and 1 < Sq < Sk:
            raise RuntimeError("no bottom-right causal rule in MultiHeadAttention without a past")
        causal = dict(unidirectional=1) if case.causal and Sq > 1 else {}
        node = helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"], domain="com.microsoft",
                                num_heads=H, **causal)
        graph = helper.make_graph([node], "mha",
                                  [helper.make_tensor_value_info(n, et, list(a.shape)) for n, a in feeds.items()],
                                  [helper.make_tensor_value_info("output", et, [B, Sq, H * D])])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
        m.ir_version = 10
        model = m.SerializeToString()
    sess = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    values = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in feeds.items()}
    for n, val in values.items():
        binding.bind_ortvalue_input(n, val)
    if case.grouped:  # past and present in one buffer: appended in place
        binding.bind_ortvalue_output("present_key", values["past_key"])
        binding.bind_ortvalue_output("present_value", values["past_value"])
    binding.bind_ortvalue_output("output", ort.OrtValue.ortvalue_from_numpy(out))

    def run():
        sess.run_with_iobinding(binding)

    return run, lambda: out.reshape(B, Sq, H, D)


RUNNERS = {"attnkit": attnkit_runner, "torch": torch_runner, "ort": ort_runner}


def time_turns(runs, min_time, min_samples, block_time, pause):
    """Median seconds per call of each runner: they take turns in blocks (two untimed calls, then timed calls for
    block_time), a pause before each block so no runner starts while another's threads still spin."""
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
    return [statistics.median(s) for s in samples]


def run_case(spec, dtype, args, impls):
    rng = np.random.default_rng([args.seed, spec_index(spec), DTYPES.index(dtype)])
    case = Case(spec, dtype, rng)
    ref = case.reference()
    names, runs, row = [], [], {"case": case.name, "dtype": dtype, "gflop": case.flops() / 1e9}
    for name in impls:
        if name == "attnkit_gqa" and not case.grouped:
            continue
        factory = attnkit_gqa_runner if name == "attnkit_gqa" else RUNNERS.get(name)
        if name == "attnkit_ab":
            factory = lambda c, t: attnkit_runner(c, t, args.ab)  # noqa: E731
        try:
            run, output = factory(case, args.threads)
            run()
            err = scaled_error(output(), ref)
        except Exception as e:  # noqa: BLE001 - a peer that cannot run this case leaves its cell empty
            row[name + "_note"] = str(e).splitlines()[0][:80]
            continue
        row[name + "_err"] = err
        if err > TOLERANCE[dtype] and name.startswith("attnkit"):
            raise SystemExit(f"{case.name} {dtype}: {name} scaled error {err:.2e} > {TOLERANCE[dtype]}")
        if err > 10 * TOLERANCE[dtype]:  # a peer computing another problem is no baseline
            row[name + "_note"] = f"scaled error {err:.1e}: not timed"
            continue
        names.append(name)
        runs.append(run)
    times = time_turns(runs, args.min_time, args.min_samples, args.block_time, args.pause)
    for name, t in zip(names, times):
        row[name + "_us"] = t * 1e6
    return row


def ratio(row, peer, ours="attnkit"):
    if peer + "_us" not in row or ours + "_us" not in row:
        return None
    return row[peer + "_us"] / row[ours + "_us"]


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def markdown(runs, args, meta):
    lines = ["# attnkit's CPU backend against PyTorch SDPA and ONNX Runtime", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta.items()]
    lines += ["", "## Summary: ratio peer time / attnkit time (> 1: attnkit faster), median of the runs "
              "(each run's ratio in brackets)", "",
              "| case | dtype | attnkit µs | torch µs | ORT µs | torch / attnkit | ORT / attnkit | best peer / attnkit |",
              "|---|---|---|---|---|---|---|---|"]
    keys = [(r["case"], r["dtype"]) for r in runs[0]]
    for i, (name, dtype) in enumerate(keys):
        rows = [run[i] for run in runs]

        def med(f):
            vals = [f(r) for r in rows]
            vals = [v for v in vals if v is not None]
            return (statistics.median(vals), vals) if vals else (None, [])

        us = {n: med(lambda r, n=n: r.get(n + "_us"))[0] for n in ("attnkit", "torch", "ort")}
        cells = []
        for peer in ("torch", "ort"):
            m, vals = med(lambda r, p=peer: ratio(r, p))
            cells.append("–" if m is None else f"{m:.2f} ({', '.join(f'{v:.2f}' for v in vals)})")
        best, vals = med(lambda r: min([x for x in (ratio(r, "torch"), ratio(r, "ort")) if x is not None],
                                       default=None))
        cells.append("–" if best is None else f"**{best:.2f}**" if best < 1.3 else f"{best:.2f}")
        lines.append(f"| {name} | {dtype} | {fmt(us['attnkit'], '.1f')} | {fmt(us['torch'], '.1f')} | "
                     f"{fmt(us['ort'], '.1f')} | " + " | ".join(cells) + " |")
    if any("attnkit_gqa_us" in r for r in runs[0]):
        lines += ["", "## attnkit's GQA op beside its attention op (same problem; ORT's GQA op beside them)", "",
                  "| case | dtype | attention µs | group_query_attention µs | GQA / attention | ORT GQA / attnkit GQA |",
                  "|---|---|---|---|---|---|"]
        for i, (name, dtype) in enumerate(keys):
            rows = [run[i] for run in runs]
            if "attnkit_gqa_us" not in rows[0]:
                continue
            a = statistics.median(r["attnkit_us"] for r in rows)
            g = statistics.median(r["attnkit_gqa_us"] for r in rows)
            o = [ratio(r, "ort", "attnkit_gqa") for r in rows]
            o = [x for x in o if x is not None]
            lines.append(f"| {name} | {dtype} | {a:.1f} | {g:.1f} | {g / a:.2f} | "
                         f"{fmt(statistics.median(o) if o else None, '.2f')} |")
    if any("attnkit_ab_us" in r for r in runs[0]):
        lines += ["", f"## attnkit with the plan overrides `{args.ab}` beside its own plan (same process, in turns)", "",
                  "| case | dtype | attnkit µs | with overrides µs | overrides / plan (median; each run) |",
                  "|---|---|---|---|---|"]
        for i, (name, dtype) in enumerate(keys):
            rows = [run[i] for run in runs if "attnkit_ab_us" in run[i]]
            if not rows:
                continue
            a = statistics.median(r["attnkit_us"] for r in rows)
            b = statistics.median(r["attnkit_ab_us"] for r in rows)
            each = ", ".join(f"{r['attnkit_ab_us'] / r['attnkit_us']:.2f}" for r in rows)
            lines.append(f"| {name} | {dtype} | {a:.1f} | {b:.1f} | {b / a:.2f} ({each}) |")
    for k, run in enumerate(runs):
        lines += ["", f"## Run {k + 1}", "",
                  "| case | dtype | GFLOP | attnkit µs | torch µs | ORT µs | attnkit GFLOP/s | torch / attnkit | "
                  "ORT / attnkit | errors (attnkit, torch, ORT) | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in run:
            errs = ", ".join(fmt(r.get(n + "_err"), ".1e") for n in ("attnkit", "torch", "ort"))
            notes = "; ".join(f"{n}: {r[n + '_note']}" for n in ("attnkit", "torch", "ort", "attnkit_gqa", "attnkit_ab")
                              if n + "_note" in r)
            gflops = r["gflop"] / (r["attnkit_us"] * 1e-6) if "attnkit_us" in r else None
            lines.append(f"| {r['case']} | {r['dtype']} | {r['gflop']:.3f} | {fmt(r.get('attnkit_us'), '.1f')} | "
                         f"{fmt(r.get('torch_us'), '.1f')} | {fmt(r.get('ort_us'), '.1f')} | {fmt(gflops, '.1f')} | "
                         f"{fmt(ratio(r, 'torch'), '.2f')} | {fmt(ratio(r, 'ort'), '.2f')} | {errs} | {notes} |")
    lines += ["", "Errors: scaled error max |out − ref| / max |ref| against the float64 reference from the same rounded "
              "inputs (bound: float32 1e-5, float16 2e-3, bfloat16 8e-3). Bold: under the 1.3x target.", ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads of every implementation (default 2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of samples per implementation and case")
    parser.add_argument("--min-samples", type=int, default=20)
    parser.add_argument("--block-time", type=float, default=0.1)
    parser.add_argument("--pause", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--case", action="append", help="only cases whose name contains this (repeatable)")
    parser.add_argument("--workloads", action="store_true",
                        help="the real models' calls outside the table (WORKLOADS) instead of the table")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="N random calls (bench/random_calls.py, sized for a CPU) instead of the table")
    parser.add_argument("--random-seed", type=int, default=1, help="the draw of --random's calls (default 1)")
    parser.add_argument("--dtype", action="append", choices=DTYPES)
    parser.add_argument("--gqa", action="store_true", help="also time attnkit.group_query_attention on the Llama rows")
    parser.add_argument("--ab", help="also time attnkit with these plan overrides (e.g. off=bf16-dot), in turns")
    parser.add_argument("--out", help="Markdown file (default bench/results/cpu-peers-<UTC stamp>.md; '-': stdout)")
    args = parser.parse_args()

    import attnkit

    impls = ["attnkit"]
    versions = {"attnkit": f"{attnkit.__version__}, git commit {git_commit()}"}
    try:
        import torch

        impls.append("torch")
        versions["PyTorch"] = f"{torch.__version__} (F.scaled_dot_product_attention; {torch.backends.cpu.get_cpu_capability()})"
    except ImportError:
        versions["PyTorch"] = "not installed"
    try:
        import onnxruntime

        impls.append("ort")
        versions["ONNX Runtime"] = f"{onnxruntime.__version__}, CPUExecutionProvider"
    except ImportError:
        versions["ONNX Runtime"] = "not installed"
    if args.gqa:
        impls.append("attnkit_gqa")
    if args.ab:
        impls.append("attnkit_ab")

    now = datetime.datetime.now(datetime.timezone.utc)
    out_path = args.out or os.path.join(HERE, "results", f"cpu-peers-{now:%Y-%m-%dT%H%MZ}.md")
    table = random_specs(args.random, args.random_seed) if args.random else WORKLOADS if args.workloads else CASES
    specs = [s for s in table if not args.case or any(c in s[0] for c in args.case)]
    dtypes = args.dtype or DTYPES
    load_start = load_average()
    runs = []
    for k in range(args.runs):
        run = []
        for spec in specs:
            for dtype in dtypes:
                row = run_case(spec, dtype, args, impls)
                run.append(row)
                print(f"run {k + 1} {row['case']:24s} {dtype:9s} attnkit {fmt(row.get('attnkit_us'), '9.1f')} µs  "
                      f"torch {fmt(row.get('torch_us'), '9.1f')}  ORT {fmt(row.get('ort_us'), '9.1f')}  "
                      f"torch/ak {fmt(ratio(row, 'torch'), '5.2f')}  ORT/ak {fmt(ratio(row, 'ort'), '5.2f')}"
                      + (f"  gqa {row['attnkit_gqa_us']:.1f}" if "attnkit_gqa_us" in row else "")
                      + (f"  ab {row['attnkit_ab_us']:.1f}" if "attnkit_ab_us" in row else ""), flush=True)
        runs.append(run)
    command = " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT) else sys.executable,
                        os.path.relpath(os.path.abspath(__file__), ROOT)] + sys.argv[1:])
    meta = {
        "date (UTC)": f"{now:%Y-%m-%d %H:%M}",
        "CPU": f"{cpu_name()} ({os.cpu_count()} logical cores), attnkit SIMD target {attnkit_target()}",
        "threads": f"{args.threads} for every implementation (torch.set_num_threads; ORT intra_op_num_threads, "
                   "inter_op 1; attnkit threads=)",
        "load average (1/5/15 min)": f"start {load_start}, end {load_average()}",
        **versions,
        "NumPy / Python": f"{np.__version__} / {platform.python_version()}",
        "timing": f"median call; implementations take turns in blocks of >= {args.block_time:g} s (2 untimed calls "
                  f"first, {args.pause * 1e3:g} ms pause before each block) until each has >= {args.min_samples} "
                  f"calls and >= {args.min_time:g} s per case; {args.runs} runs of the whole table",
        "command": f"`{command}`",
    }
    text = markdown(runs, args, meta)
    if out_path == "-":
        print(text)
    else:
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(out_path, ROOT)}")


def attnkit_target():
    """The SIMD target attnkit's CPU kernel dispatches to here, from `python -m attnkit info`."""
    try:
        out = subprocess.run([sys.executable, "-m", "attnkit", "info"], capture_output=True, text=True, timeout=60).stdout
        for line in out.splitlines():
            if "SIMD target" in line:
                return line.split("SIMD target", 1)[1].split()[0]
    except Exception:  # noqa: BLE001 - the header then says so
        pass
    return "unknown (see `attnkit info`)"


if __name__ == "__main__":
    main()
