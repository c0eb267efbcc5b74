"""The GroupQueryAttention conformance sweep: seeded random cases, their inputs, and the checks of one case against
ONNX Runtime's CPU provider or, where that rejects the case, the float64 reference (gqa_reference.py).

A case is a dict of plain values (so that it prints as a test id); `make_inputs(case)` turns it into arrays;
`check_case(case)` runs attnkit and the oracle and asserts. `ort_rejects(case)` predicts, from what ONNX Runtime
1.32's CPU kernel was found to accept, whether ONNX Runtime runs the case; a case predicted to run that ONNX
Runtime rejects fails the test (the prediction, or the model, is wrong).
"""

import math
import zlib

import numpy as np

import attnkit
import gqa_reference as ref

HEADS = [(6, 6), (6, 3), (9, 3), (32, 8), (16, 1)]
HEAD_SIZES = [32, 48, 64, 80, 96, 128, 160, 256]  # multiples of 16 (ORT's rotary rule); 40 / 72 / 24 below
ODD_HEAD_SIZES = [20, 25, 40, 72, 100]           # ORT: head_size % 8 (and % 16 with rotary): reference only
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}
EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}

# The largest shapes: a handful, kept few (CI has 2 cores).
LARGE = [
    dict(name="prompt2048", dtype="float32", B=1, S=2048, heads=(6, 3), H=64, step="prompt", rotary="plain"),
    dict(name="decode4096", dtype="float16", B=4, heads=(32, 8), H=128, step="decode", past=4095, rotary="plain",
         cache="shared"),
    dict(name="decode4096_int8", dtype="float32", B=2, heads=(32, 8), H=128, step="decode", past=4000,
         quant=(8, "PER_CHANNEL", "PER_CHANNEL")),
    dict(name="prompt1024_window", dtype="float16", B=2, S=1024, heads=(16, 1), H=128, step="prompt", window=256),
]


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.999)))))


def cost(c):
    """Multiply-adds of Q K^T and P V (the causal half for a prompt)."""
    T = max(c["T"])
    work = c["B"] * c["N"] * c["S"] * T * c["H"] * 2
    return work / 2 if c["step"] == "prompt" and c["causal"] else work


def random_case(index, seed=20251129, budget=1e8):
    """Case `index` of the sweep: every feature drawn at random, shrunk until its cost is under `budget`."""
    rng = np.random.default_rng([seed, index])
    c = {"index": index}
    r = rng.random
    c["dtype"] = "float32" if r() < 0.55 else ("float16" if r() < 0.9 else "bfloat16")
    c["N"], c["Nkv"] = HEADS[rng.integers(len(HEADS))]
    c["H"] = int(rng.choice(HEAD_SIZES)) if r() < 0.92 else int(rng.choice(ODD_HEAD_SIZES))
    c["step"] = rng.choice(["prompt", "decode", "chunk"], p=[0.35, 0.45, 0.2]).item()
    c["B"] = int(rng.integers(1, 6)) if c["step"] != "chunk" or r() < 0.3 else 1
    c["causal"] = 1 if c["step"] != "prompt" or r() < 0.85 else 0
    c["sliding"] = c["step"] != "prompt" and c["causal"] == 1 and r() < 0.12
    c["window"] = -1
    if c["causal"] and (c["sliding"] or r() < 0.2):
        c["window"] = _log_uniform(rng, 1 if not c["sliding"] else 2, 300)
    c["quant"] = None
    if c["step"] != "prompt" or r() < 0.3:
        if r() < 0.25:
            bits = 8 if r() < 0.6 else 4
            modes = ["PER_TENSOR", "PER_CHANNEL"]
            km = modes[rng.integers(2)]
            vm = km if r() < 0.85 else ("NONE" if r() < 0.5 else modes[rng.integers(2)])
            c["quant"] = (bits, km, vm)
    c["packed"] = r() < 0.25
    rot = r()
    c["rotary"] = None if rot < 0.45 else ("plain" if rot < 0.75 else "interleaved")
    c["rot_half"] = 0
    if c["rotary"]:
        half = c["H"] // 2
        if r() < 0.3:  # partial rotary
            choices = [h for h in range(8, half, 8)] or [max(1, half // 2)]
            half = int(rng.choice(choices)) if r() < 0.8 else int(rng.integers(1, half + 1))
        c["rot_half"] = half
    c["position_ids"] = c["rotary"] is not None and r() < 0.3
    c["softcap"] = float(rng.choice([0.0, 0.0, 0.0, 5.0, 30.0]))
    c["sink"] = r() < 0.15
    c["smooth"] = not c["sink"] and r() < 0.15
    c["bias"] = rng.choice([None, "11", "1N", "B1", "BN"], p=[0.7, 0.075, 0.075, 0.075, 0.075])
    c["bias"] = None if c["bias"] is None else str(c["bias"])
    c["qk_norm"] = r() < 0.08
    c["qk_output"] = int(rng.choice([0, 1, 2], p=[0.85, 0.075, 0.075]))
    c["scale"] = 0.0 if r() < 0.8 else float(np.float32(rng.uniform(0.02, 0.3)))
    c["cache"] = rng.choice(["shared", "separate", "separate_given"], p=[0.4, 0.35, 0.25]).item()

    _draw_lengths(c, rng)
    # Over budget: shrink the batch, then the heads, then the head size, then the lengths.
    while cost(c) > budget:
        if c["B"] > 1:
            c["B"] -= 1
            c["T"], c["past"] = c["T"][:c["B"]], c["past"][:c["B"]]
            if c["step"] == "prompt":
                c["T"][0] = c["S"]  # the longest sequence defines total_sequence_length = S
        elif c["N"] > 9:
            c["N"], c["Nkv"] = HEADS[rng.integers(3)]
        elif c["H"] > 64:
            c["H"] = 64
        elif c["H"] > 32 and c["H"] % 8 == 0:
            c["H"] = 32
        elif c["step"] == "prompt":
            c["S"] = max(1, c["S"] // 2)
            c["T"] = [min(t, c["S"]) for t in c["T"]]
            c["T"][0] = c["S"]
        else:
            c["past"] = [p // 2 for p in c["past"]]
            if c["step"] == "chunk" and c["S"] > 16:
                c["S"] //= 2
            c["T"] = [p + c["S"] for p in c["past"]]
    if c["rot_half"]:
        c["rot_half"] = min(c["rot_half"], c["H"] // 2)
        if c["rot_half"] % 8 and c["rot_half"] != c["H"] // 2 and c["rot_half"] >= 8 and rng.random() < 0.8:
            c["rot_half"] = c["rot_half"] // 8 * 8
    return _finish(c, rng)


def _draw_lengths(c, rng):
    hi_prompt, hi_past = 2048, 4096
    B = c["B"]
    if c["step"] == "prompt":
        S = _log_uniform(rng, 1, hi_prompt)
        T = [S] * B
        for b in range(1, B):  # right padding: shorter sequences (the first keeps total = S)
            if rng.random() < 0.4:
                T[b] = int(rng.integers(1, S + 1))
        rng.shuffle(T)
        c["S"], c["T"], c["past"] = S, [int(t) for t in T], [0] * B
    elif c["step"] == "decode":
        past = [_log_uniform(rng, 1, hi_past) for _ in range(B)]
        if B > 1 and rng.random() < 0.2:
            past[int(rng.integers(B))] = 0  # a sequence that starts now
        c["S"], c["past"] = 1, past
        c["T"] = [p + 1 for p in past]
        if max(c["T"]) == 1:
            c["T"][0], c["past"][0] = 2, 1
    else:
        S = _log_uniform(rng, 2, 256)
        past = [_log_uniform(rng, 1, 1024) for _ in range(B)]
        c["S"], c["past"], c["T"] = S, past, [p + S for p in past]


def _finish(c, rng):
    """Capacities and the sliding-window rules; the case's id."""
    S, T, past = c["S"], c["T"], c["past"]
    if c["window"] > 0 and not c["sliding"] and rng.random() < 0.7:
        c["window"] = int(rng.integers(1, max(T) + 1))  # a window shorter than the sequence: it hides keys
    if c["sliding"]:
        W = c["window"]
        if S > 1:
            c["B"], c["T"], c["past"] = 1, T[:1], past[:1]
        # Capacity: at least W - 1 + S (every query keeps its window) and W (ONNX Runtime's rule).
        C = max(W - 1 + S, W) + (0 if rng.random() < 0.5 else int(rng.integers(1, 16)))
        c["C"] = c["P"] = C
        # ONNX Runtime evicts G = C - W + 1 rows at a time (its layout: L(T) rows). Keep the past where both
        # layouts agree (past <= C, or a full cache whose eviction just happened), so one past cache means the
        # same to both; the present layouts are compared token by token.
        G = C - W + 1
        fixed = []
        for p in c["past"]:
            if p > C and (p - C) % G:
                p = C + (p - C) // G * G
            fixed.append(p)
        c["past"] = fixed
        c["T"] = [p + S for p in fixed]
    elif c["step"] == "prompt":
        c["P"] = 0
        c["C"] = S if c["cache"] != "shared" else S + int(rng.integers(0, 9))
        if c["cache"] == "shared" or c["quant"]:
            c["P"] = c["C"] if c["cache"] == "shared" else 0
    else:
        # ONNX Runtime: a separate past must hold exactly the past rows of a prompt chunk (its "dynamic cache").
        extra = 0 if rng.random() < 0.6 or c["step"] == "chunk" else int(rng.integers(1, 9))
        c["P"] = max(past) + extra
        c["C"] = max(max(c["T"]) + (0 if rng.random() < 0.5 else int(rng.integers(1, 9))), c["P"])
        if c["cache"] == "shared":
            c["P"] = c["C"]
    if c["quant"] and c["step"] == "prompt" and c["cache"] != "shared":
        c["P"] = 0  # an empty past (ONNX Runtime infers a quantized present only from a past)
    c["id"] = case_id(c)
    return c


def case_id(c):
    parts = [f"{c['index']:03d}" if c.get("index") is not None else c.get("name", "case"), c["step"], {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[c["dtype"]],
             f"B{c['B']}S{c['S']}T{max(c['T'])}", f"{c['N']}x{c['Nkv']}x{c['H']}"]
    if c["packed"]:
        parts.append("packed")
    if c["rotary"]:
        parts.append(("rot" if c["rotary"] == "plain" else "irot") + (f"{2 * c['rot_half']}" if 2 * c["rot_half"] < c["H"] else ""))
    if c["position_ids"]:
        parts.append("pos")
    if c["window"] > 0:
        parts.append(f"w{c['window']}")
    if c["sliding"]:
        parts.append(f"swc{c['C']}")
    if not c["causal"]:
        parts.append("noncausal")
    if c["softcap"]:
        parts.append(f"cap{c['softcap']:g}")
    if c["sink"]:
        parts.append("sink")
    if c["smooth"]:
        parts.append("smooth")
    if c["bias"]:
        parts.append("bias" + c["bias"])
    if c["qk_norm"]:
        parts.append("qknorm")
    if c["qk_output"]:
        parts.append(f"qk{c['qk_output']}")
    if c["quant"]:
        bits, km, vm = c["quant"]
        parts.append(f"int{bits}" + "".join(m[4] if m != "NONE" else "n" for m in (km, vm)).lower())
    if c["scale"]:
        parts.append("scale")
    parts.append(c["cache"])
    return "-".join(parts)


def large_case(spec):
    c = dict(index=None, name=spec["name"], dtype=spec["dtype"], B=spec["B"], N=spec["heads"][0], Nkv=spec["heads"][1],
             H=spec["H"], step=spec["step"], causal=1, sliding=False, window=spec.get("window", -1),
             quant=spec.get("quant"), packed=False, rotary=spec.get("rotary"), position_ids=False, softcap=0.0,
             sink=False, smooth=False, bias=None, qk_norm=False, qk_output=0, scale=0.0,
             cache=spec.get("cache", "separate"))
    c["rot_half"] = c["H"] // 2 if c["rotary"] else 0
    rng = np.random.default_rng(zlib.crc32(spec["name"].encode()))
    if c["step"] == "prompt":
        c["S"], c["T"], c["past"] = spec["S"], [spec["S"]] * c["B"], [0] * c["B"]
    else:
        c["S"] = 1
        c["past"] = [spec["past"] - 37 * b for b in range(c["B"])]
        c["T"] = [p + 1 for p in c["past"]]
    c = _finish(c, rng)
    c["id"] = "large-" + c["id"]
    return c


# ---- what ONNX Runtime's CPU provider takes ---------------------------------------------------------------------

def ort_rejects(c):
    """Why ONNX Runtime's CPU provider rejects (or means something else by) this case; None when it runs it."""
    if c["dtype"] == "bfloat16":
        return "bfloat16 (no CPU kernel)"
    if c["qk_norm"]:
        return "q_norm_weight / k_norm_weight (CUDA / WebGPU only)"
    if c["H"] % 8:
        return "head_size % 8 != 0"
    if c["rotary"] and c["H"] % 16:
        return "rotary with head_size % 16 != 0"
    if c["rotary"] and c["rot_half"] % 8:
        return "rotary_dim / 2 % 8 != 0"
    if c["step"] == "chunk" and c["B"] > 1:
        return "prompt chunk (S > 1 with a past) with batch > 1"
    if c["quant"] and len({m for m in c["quant"][1:]}) > 1:
        return "k_quant_type != v_quant_type (incl. one cache float)"
    if c["sliding"] and c["qk_output"]:
        return "qk_output with sliding_window_cache (not implemented)"
    if c["sliding"] and c["quant"] and c["quant"][0] == 4 and c["H"] % 32:
        return "int4 window cache with head_size % 32 != 0"
    if c["position_ids"] and c["step"] == "prompt" and c["B"] > 1:
        return DIFFERS_POSITION_IDS
    return None


# Cases ONNX Runtime runs but means something else by: not run on it (the reference checks them).
DIFFERS_POSITION_IDS = "position_ids on a batched first prompt (ORT reads position_ids[0][0] + s for every entry)"
DIFFERS = {DIFFERS_POSITION_IDS}


# ---- inputs ------------------------------------------------------------------------------------------------------

def rotary_tables(rows, half, dtype):
    inv = 10000.0 ** (-np.arange(half) / half)
    angles = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def make_inputs(c):
    """(inputs {name: array or None}, attrs {ONNX attribute: value}, attnkit's present_key / present_value
    arguments). Caches hold junk in every row the call does not define."""
    rng = np.random.default_rng([20251129, zlib.crc32(c["id"].encode())])
    dt = np_dtype(c["dtype"])
    B, S, N, Nkv, H = c["B"], c["S"], c["N"], c["Nkv"], c["H"]
    total = max(c["T"])

    def randn(*shape, std=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dt)

    x = {}
    if c["packed"]:
        x["query"] = randn(B, S, (N + 2 * Nkv) * H)
    else:
        x["query"], x["key"], x["value"] = randn(B, S, N * H), randn(B, S, Nkv * H), randn(B, S, Nkv * H)
    x["seqlens_k"] = np.array([t - 1 for t in c["T"]], np.int32)
    x["total_sequence_length"] = np.array(total, np.int32)
    attrs = dict(num_heads=N, kv_num_heads=Nkv)
    if c["scale"]:
        attrs["scale"] = c["scale"]
    if c["softcap"]:
        attrs["softcap"] = c["softcap"]
    if c["window"] > 0:
        attrs["local_window_size"] = c["window"]
    if not c["causal"]:
        attrs["causal"] = 0
    if c["smooth"]:
        attrs["smooth_softmax"] = 1
    if c["qk_output"]:
        attrs["qk_output"] = c["qk_output"]
    if c["sliding"]:
        attrs["sliding_window_cache"] = 1

    # Caches: float in the query's type, or int8 / int4 codes with scales.
    fmt = {}
    if c["quant"]:
        bits, km, vm = c["quant"]
        attrs["kv_cache_bit_width"] = bits
        for which, mode in (("k", km), ("v", vm)):
            attrs[which + "_quant_type"] = mode
            if mode == "NONE":
                continue
            qmax = 127 if bits == 8 else 7
            base = 3.5 / qmax
            if mode == "PER_TENSOR":
                x[which + "_scale"] = np.array([base * rng.uniform(0.8, 1.25)], np.float32)
            else:
                s = (base * rng.uniform(0.6, 1.6, Nkv * H)).astype(np.float32)
                x[which + "_scale"] = s.reshape(1, Nkv, 1, H) if rng.random() < 0.7 else s
            fmt[which] = (bits, mode)
    P = c["P"]
    have_past = c["step"] != "prompt" or c["cache"] == "shared" or c["quant"] is not None or c["sliding"]

    def cache(which, rows):
        if which in fmt:
            bits, _ = fmt[which]
            if bits == 8:
                return rng.integers(-128, 128, (B, Nkv, rows, H)).astype(np.int8)
            return rng.integers(0, 256, (B, Nkv, rows, (H + 1) // 2)).astype(np.uint8)
        return randn(B, Nkv, rows, H)

    if have_past:
        x["past_key"], x["past_value"] = cache("k", P), cache("v", P)
    if c["rotary"]:
        attrs["do_rotary"] = 1
        if c["rotary"] == "interleaved":
            attrs["rotary_interleaved"] = 1
        rows = total + int(rng.integers(0, 40))
        if c["position_ids"]:
            if c["step"] == "prompt":
                p0 = int(rng.integers(0, 50))
                pos = np.tile(p0 + np.arange(S), (B, 1))
                if ort_rejects(c) is not None and B > 1:  # per-row positions where ORT is not the oracle
                    pos = rng.integers(0, total + 50, (B, S))
            else:
                pos = rng.integers(0, total + 50, (B, S))
            x["position_ids"] = pos.astype(np.int64)
            rows = max(rows, int(pos.max()) + 1)
        x["cos_cache"], x["sin_cache"] = rotary_tables(rows, c["rot_half"], dt)
    if c["bias"]:
        shape = {"11": (1, 1), "1N": (1, N), "B1": (B, 1), "BN": (B, N)}[c["bias"]]
        x["attention_bias"] = randn(*shape, S, total, std=2.0)
    if c["sink"]:
        x["head_sink"] = randn(N, std=2.0)
    if c["qk_norm"]:
        x["q_norm_weight"] = (1.0 + 0.3 * rng.standard_normal(H)).astype(dt)
        x["k_norm_weight"] = (1.0 + 0.3 * rng.standard_normal(H)).astype(dt)
        attrs["qk_norm_epsilon"] = float(np.float32(rng.choice([1e-6, 1e-5, 1e-3])))

    present_key = present_value = None
    if c["cache"] == "shared" and have_past:
        present_key, present_value = x["past_key"], x["past_value"]
    elif c["cache"] == "separate_given":
        rows = c["C"] + (0 if c["sliding"] else int(rng.integers(0, 4)))

        def poisoned(which, like):
            a = cache(which, rows)
            if a.dtype.kind == "f":
                a[...] = np.nan
            return a

        present_key, present_value = poisoned("k", rows), poisoned("v", rows)
    return x, attrs, present_key, present_value


# ---- checks ------------------------------------------------------------------------------------------------------

def _cache_codes_or_values(a, c, which):
    """Codes (quantized) or float64 values of a cache tensor."""
    if c["quant"] and c["quant"][1 if which == "k" else 2] != "NONE":
        return ref.codes_of(a, c["quant"][0], c["H"]), True
    with np.errstate(invalid="ignore"):  # NaN-poisoned rows
        return np.asarray(a, np.float64), False


def _compare_rows(got, want, quantized, prepared, dtype, what):
    """Cache rows: exact, except rows that went through norm / rotary (a rounding of the query's type apart) and
    quantized codes of such rows (one code apart where x / scale sits at a rounding boundary)."""
    if quantized:
        diff = np.abs(got - want)
        bad = diff > (1 if prepared else 0)
        assert not bad.any(), f"{what}: {int(bad.sum())} codes differ (max {int(diff.max())})"
        frac = float((diff > 0).mean()) if diff.size else 0.0
        assert frac <= 0.01, f"{what}: {frac:.2%} of the codes are one apart"
        return
    if not prepared:
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{what}: {int((~same).sum())} values differ, max {np.nanmax(np.abs(got - want)):.3g}"
        return
    tol = 4 * EPS[dtype] * np.maximum(np.abs(want), 1.0)
    bad = ~(np.abs(got - want) <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} values differ beyond the type's rounding, max {np.nanmax(np.abs(got - want)):.3g}"


def attnkit_layout(c):
    """First token held by present row 0, and the resident rows, per batch entry (attnkit / the contract)."""
    out = []
    for b in range(c["B"]):
        T, past = c["T"][b], c["past"][b]
        if not c["sliding"]:
            out.append((0, T))
            continue
        kept = min(past, c["P"])
        resident = min(kept + c["S"], c["C"])
        out.append((T - resident, resident))
    return out


def ort_layout(c):
    """ONNX Runtime's window cache: L(T) = T if T <= C, else T - G * ceil((T - C) / G), G = C - W + 1."""
    if not c["sliding"]:
        return [(0, t) for t in c["T"]]
    C, W = c["C"], c["window"]
    G = C - W + 1
    out = []
    for T in c["T"]:
        L = T if T <= C else T - G * -(-(T - C) // G)
        out.append((T - L, L))
    return out


def valid_query_rows(c):
    """[B, S] mask of the query rows with a defined output (a padded first prompt's rows past T_b are not)."""
    rows = np.ones((c["B"], c["S"]), bool)
    if c["step"] == "prompt":
        for b, T in enumerate(c["T"]):
            rows[b, T:] = False
    return rows


STATS = {"cases": 0, "ort": 0, "reference": 0, "both": 0, "reasons": {}, "seconds": 0.0}


def check_case(c, threads=None, compare_reference=None):
    """Runs case c through attnkit, then checks it against ONNX Runtime (or the reference): output, both present
    caches, output_qk. Always checks the present caches against the contract's whole-tensor layout."""
    import time

    from gqa_onnx import run_ort

    t0 = time.perf_counter()
    x, attrs, pk_arg, pv_arg = make_inputs(c)
    past_k = None if x.get("past_key") is None else x["past_key"].copy()
    past_v = None if x.get("past_value") is None else x["past_value"].copy()
    inputs_before = {n: (None if a is None else a.copy()) for n, a in x.items()}

    res = attnkit.group_query_attention(**x, **attrs, present_key=pk_arg, present_value=pv_arg, threads=threads)
    assert len(res) == (4 if c["qk_output"] else 3)
    out, pk, pv = res[:3]
    qk = res[3] if c["qk_output"] else None
    dt = np_dtype(c["dtype"])
    assert out.dtype == dt and out.shape == (c["B"], c["S"], c["N"] * c["H"])
    if pk_arg is not None:
        assert pk is pk_arg and pv is pv_arg, "a present cache passed in is returned as it is"
    for n, a in x.items():  # inputs are read only (a shared cache is its present: checked below)
        if n in ("past_key", "past_value") and c["cache"] == "shared":
            continue
        assert np.array_equal(np.asarray(a).reshape(-1).view(np.uint8), np.asarray(inputs_before[n]).reshape(-1).view(np.uint8)), f"{n} was written"

    # The caches against the contract (every row: copied, appended, zero, or untouched).
    prep = ref.prepare(x, attrs)
    prepared = bool(c["rotary"]) or c["qk_norm"]
    first_a = [f for f, _ in attnkit_layout(c)]
    for which, got, past in (("k", pk, past_k), ("v", pv, past_v)):
        name = "present_key" if which == "k" else "present_value"
        want, defined = ref.expected_cache(prep, x, attrs, "key" if which == "k" else "value", got.shape,
                                           c["cache"] == "shared" and past is not None, past)
        g, quantized = _cache_codes_or_values(got, c, which)
        rows = lambda a: a.transpose(0, 2, 1, 3)[defined]  # noqa: E731 -- [defined rows, Nkv, H]
        _compare_rows(rows(g), rows(want), quantized, prepared and which == "k", c["dtype"], f"{name} vs the contract")

    reason = ort_rejects(c)
    valid = valid_query_rows(c)
    tol = TOLERANCE[c["dtype"]]
    ort = None
    try:
        if reason not in DIFFERS:
            ort = run_ort(inputs_before, attrs)  # the inputs as they were (a shared cache is updated in place)
    except Exception as e:  # noqa: BLE001 -- ONNX Runtime's errors have no common public type
        if reason is None:
            raise AssertionError(f"ONNX Runtime rejected a case it was predicted to run: {str(e).splitlines()[0]}")
    if ort is not None:
        STATS["ort"] += 1
        err = ref.scaled_error(out, ort["output"], valid)
        assert err <= tol, f"output vs ONNX Runtime: scaled error {err:.3g} > {tol:g}"
        # Caches token by token (ORT's window cache evicts in blocks; otherwise row r is token r for both).
        first_o = ort_layout(c)
        for which, got in (("k", pk), ("v", pv)):
            name = "present_key" if which == "k" else "present_value"
            g, quantized = _cache_codes_or_values(got, c, which)
            o, _ = _cache_codes_or_values(ort[name], c, which)
            for b in range(c["B"]):
                (fa, ra), (fo, ro) = attnkit_layout(c)[b], first_o[b]
                lo, hi = max(fa, fo), min(fa + ra, fo + ro)
                assert hi - lo >= min(c["T"][b], c["window"] if c["sliding"] else c["T"][b]), "resident windows differ"
                _compare_rows(g[b, :, lo - fa:hi - fa], o[b, :, lo - fo:hi - fo], quantized,
                              prepared and which == "k", c["dtype"], f"{name}[{b}] vs ONNX Runtime")
        if qk is not None:
            mask = np.zeros(qk.shape, bool)
            for b in range(c["B"]):
                (fa, ra), (fo, ro) = attnkit_layout(c)[b], first_o[b]
                mask[b, :, valid[b], max(fa, fo):c["T"][b]] = True
            err = ref.scaled_error(qk, ort["output_qk"], mask)
            assert err <= tol, f"output_qk vs ONNX Runtime: scaled error {err:.3g} > {tol:g}"
    else:
        STATS["reference"] += 1
        STATS["reasons"][reason] = STATS["reasons"].get(reason, 0) + 1
    if compare_reference is None:
        compare_reference = ort is None or cost(c) <= 4e6
    if compare_reference:
        STATS["both"] += ort is not None
        # The attention over attnkit's own (just checked) caches, dequantized.
        kq = ref.cache_values(pk, attrs, "k", x.get("k_scale"), c["H"])
        vq = ref.cache_values(pv, attrs, "v", x.get("v_scale"), c["H"])
        want, want_qk = ref.attention(prep, x, attrs, kq, vq, first_a)
        err = ref.scaled_error(out, want, valid)
        assert err <= tol, f"output vs the float64 reference: scaled error {err:.3g} > {tol:g}"
        if qk is not None:
            mask = np.zeros(qk.shape, bool)
            for b in range(c["B"]):
                mask[b, :, valid[b], :] = True
            err = ref.scaled_error(qk, want_qk, mask)
            assert err <= tol, f"output_qk vs the float64 reference: scaled error {err:.3g} > {tol:g}"
    STATS["cases"] += 1
    STATS["seconds"] += time.perf_counter() - t0
    return "ort" if ort is not None else "reference"
