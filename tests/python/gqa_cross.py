"""One group_query_attention call's results against another's: the CUDA backend against the same call on the CPU
(attnkit's CPU backend is the oracle: it is checked against ONNX Runtime and the float64 reference by
test_gqa_ort.py), and against ONNX Runtime's CPU provider where that runs the case. NumPy only (no torch), so the
helpers can be tried on any machine; test_cuda.py moves the arrays to and from the GPU.

Tolerances: the output within the sweep's scaled error (float32 1e-5, float16 2e-3, bfloat16 1e-2: two
backends' roundings apart, where the sweep's 8e-3 bounds one backend against the float64 reference; a quantized
cache: at least float16's). Caches: float rows bit for bit, except K rows that went through the Q/K norm or
rotary (each backend computes them in float32 and rounds once: the scaled error); quantized codes at most one
quantization step apart after dequantization (a value whose x / scale sits at a rounding tie may round either way
on the GPU), and no more than 1% of them apart (a systematic off-by-one would move half of them).
"""

import numpy as np

import gqa_reference as ref
from gqa_cases import LARGE, attnkit_layout, large_case, ort_layout, ort_rejects, random_case
from gqa_cases import valid_query_rows

TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}

# Features of the sweep a subset must still cover (each one: a case that has it).
FEATURES = {
    "float32": lambda c: c["dtype"] == "float32",
    "float16": lambda c: c["dtype"] == "float16",
    "bfloat16": lambda c: c["dtype"] == "bfloat16",
    "prompt": lambda c: c["step"] == "prompt",
    "padded prompt": lambda c: c["step"] == "prompt" and min(c["T"]) < c["S"],
    "decode": lambda c: c["step"] == "decode",
    "chunk": lambda c: c["step"] == "chunk",
    "batched chunk": lambda c: c["step"] == "chunk" and c["B"] > 1,
    "int8": lambda c: bool(c["quant"]) and c["quant"][0] == 8,
    "int4": lambda c: bool(c["quant"]) and c["quant"][0] == 4,
    "per tensor": lambda c: bool(c["quant"]) and "PER_TENSOR" in c["quant"][1:],
    "per channel": lambda c: bool(c["quant"]) and "PER_CHANNEL" in c["quant"][1:],
    "one cache float": lambda c: bool(c["quant"]) and "NONE" in c["quant"][1:],
    "window": lambda c: c["window"] > 0 and not c["sliding"],
    "window cache": lambda c: c["sliding"],
    "packed": lambda c: c["packed"],
    "rotary": lambda c: c["rotary"] == "plain",
    "interleaved rotary": lambda c: c["rotary"] == "interleaved",
    "partial rotary": lambda c: bool(c["rotary"]) and 2 * c["rot_half"] < c["H"],
    "position_ids": lambda c: c["position_ids"],
    "softcap": lambda c: c["softcap"] > 0,
    "head_sink": lambda c: c["sink"],
    "smooth_softmax": lambda c: c["smooth"],
    "bias": lambda c: c["bias"] is not None,
    "qk norm": lambda c: c["qk_norm"],
    "non-causal": lambda c: not c["causal"],
    "odd head size": lambda c: c["H"] % 8 != 0,
    "scale": lambda c: c["scale"] != 0.0,
    "shared cache": lambda c: c["cache"] == "shared",
    "separate cache": lambda c: c["cache"] == "separate",
    "given present": lambda c: c["cache"] == "separate_given",
    "16 query heads on 1": lambda c: (c["N"], c["Nkv"]) == (16, 1),
    "32 on 8, head 128": lambda c: (c["N"], c["Nkv"], c["H"]) == (32, 8, 128),
}


def cuda_cases(n=56, sweep=320, seed=20251206):
    """A seeded subset of the conformance sweep for the CUDA backend: n cases drawn at random among those without
    output_qk (refused on CUDA), plus, for each feature the draw missed, the sweep's first case that has it, plus
    the sweep's large shapes. Sorted by sweep index."""
    usable = [c for c in (random_case(i) for i in range(sweep)) if not c["qk_output"]]
    rng = np.random.default_rng(seed)
    chosen = [usable[i] for i in sorted(rng.choice(len(usable), size=min(n, len(usable)), replace=False))]
    for has in FEATURES.values():
        if not any(has(c) for c in chosen):
            extra = next((c for c in usable if has(c)), None)
            if extra is not None:
                chosen.append(extra)
    chosen.sort(key=lambda c: c["index"])
    return chosen + [large_case(spec) for spec in LARGE]


def missing_features(cases):
    return [name for name, has in FEATURES.items() if not any(has(c) for c in cases)]


def output_tolerance(c):
    tol = TOLERANCE[c["dtype"]]
    return max(tol, TOLERANCE["float16"]) if c["quant"] else tol


def same_cache(got, want, c, which, prepared, what):
    """Cache tensors (`which` 'k' / 'v', NumPy) of the same call from two backends; see the module's note."""
    mode = c["quant"][1 if which == "k" else 2] if c["quant"] else "NONE"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if mode != "NONE":
        bits = c["quant"][0]
        diff = np.abs(ref.codes_of(got, bits, c["H"]) - ref.codes_of(want, bits, c["H"]))
        worst = int(diff.max(initial=0))
        assert worst <= 1, f"{what}: codes up to {worst} quantization steps apart"
        frac = float((diff > 0).mean()) if diff.size else 0.0
        assert frac <= 0.01, f"{what}: {frac:.2%} of the codes are one quantization step apart"
        return
    with np.errstate(invalid="ignore"):
        g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not prepared:
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (f"{what}: {int((~same).sum())} of {same.size} values differ, max "
                            f"{np.nanmax(np.abs(g - w)):.3g}")
        return
    err = ref.scaled_error(g, w)
    assert err <= TOLERANCE[c["dtype"]], f"{what}: scaled error {err:.3g} > {TOLERANCE[c['dtype']]:g}"


def compare_results(c, got, want, who):
    """(output, present_key, present_value) of case c from the backend under test (`got`) and the oracle
    (`want`), all NumPy: the output on the rows it defines, the caches whole (the same layout on both sides)."""
    tol = output_tolerance(c)
    err = ref.scaled_error(got[0], want[0], valid_query_rows(c))
    assert err <= tol, f"output vs {who}: scaled error {err:.3g} > {tol:g}"
    prepared = bool(c["rotary"]) or c["qk_norm"]
    for which, i, name in (("k", 1, "present_key"), ("v", 2, "present_value")):
        same_cache(got[i], want[i], c, which, prepared and which == "k", f"{name} vs {who}")
    return err


def ort_outputs(c, inputs, attrs):
    """ONNX Runtime's outputs for case c on its inputs as made (a shared cache not yet updated), or None where its
    CPU provider does not run the case (predicted by ort_rejects, or refused by this onnxruntime: the conformance
    suite, not this check, holds ONNX Runtime to the prediction)."""
    from gqa_onnx import run_ort

    if ort_rejects(c) is not None:  # includes the cases ONNX Runtime means something else by (DIFFERS)
        return None
    try:
        return run_ort(inputs, attrs)
    except Exception:  # noqa: BLE001 -- ONNX Runtime's errors have no common public type
        return None


def compare_with_ort(c, got, ort):
    """The backend under test (NumPy results) against ONNX Runtime's outputs: the output, and the caches token by
    token (ONNX Runtime's window cache evicts in blocks; otherwise row r is token r on both sides)."""
    tol = output_tolerance(c)
    err = ref.scaled_error(got[0], ort["output"], valid_query_rows(c))
    assert err <= tol, f"output vs ONNX Runtime: scaled error {err:.3g} > {tol:g}"
    prepared = bool(c["rotary"]) or c["qk_norm"]
    ours, theirs = attnkit_layout(c), ort_layout(c)
    for which, i, name in (("k", 1, "present_key"), ("v", 2, "present_value")):
        for b in range(c["B"]):
            (fa, ra), (fo, ro) = ours[b], theirs[b]
            lo, hi = max(fa, fo), min(fa + ra, fo + ro)
            same_cache(got[i][b, :, lo - fa:hi - fa], ort[name][b, :, lo - fo:hi - fo], c, which,
                       prepared and which == "k", f"{name}[{b}] vs ONNX Runtime")
    return err
