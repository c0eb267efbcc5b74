"""attnkit.group_query_attention against ONNX Runtime's CPU provider (the one-node com.microsoft model), and
against the float64 reference where ONNX Runtime rejects a case: a seeded random sweep plus a few large shapes.

ONNX Runtime's version is in the session header (conftest.py); the sweep's tally (cases run against ONNX
Runtime, cases checked against the reference and why) is printed at the end of the session."""

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from gqa_onnx import schema_is_new_enough  # noqa: E402

if not schema_is_new_enough():
    pytest.skip("this onnxruntime's GroupQueryAttention predates the contract's schema", allow_module_level=True)

import gqa_cases  # noqa: E402
from gqa_cases import LARGE, check_case, large_case, random_case  # noqa: E402

SWEEP = 320
CASES = [random_case(i) for i in range(SWEEP)]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_sweep(case):
    check_case(case)


@pytest.mark.parametrize("spec", LARGE, ids=[s["name"] for s in LARGE])
def test_large(spec):
    check_case(large_case(spec))


# ---- a generation loop: a prompt, then decode steps feeding each step's present caches back as the past ---------

LOOPS = [
    dict(name="shared-f32-rotary", dtype="float32", lengths=[21, 13, 7], steps=10, heads=(6, 3), H=64, rotary="plain",
         cache="shared"),
    dict(name="separate-f16-packed-interleaved", dtype="float16", lengths=[9, 16], steps=8, heads=(9, 3), H=32,
         rotary="interleaved", packed=True, cache="separate"),
    dict(name="window-cache-f32", dtype="float32", lengths=[6, 6], steps=12, heads=(6, 6), H=32, window=8,
         sliding=True, cache="shared"),
    dict(name="int8-per-channel-shared", dtype="float32", lengths=[12, 12, 4], steps=8, heads=(16, 1), H=64,
         quant=(8, "PER_CHANNEL"), cache="shared", softcap=20.0),
    dict(name="int4-per-tensor-separate", dtype="float16", lengths=[10, 3], steps=8, heads=(6, 3), H=32,
         quant=(4, "PER_TENSOR"), cache="separate", window=6),
]


def _loop_inputs(spec, rng):
    dt = gqa_cases.np_dtype(spec["dtype"])
    N, Nkv = spec["heads"]
    H = spec["H"]
    attrs = dict(num_heads=N, kv_num_heads=Nkv)
    if spec.get("rotary"):
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = int(spec["rotary"] == "interleaved")
    if spec.get("window"):
        attrs["local_window_size"] = spec["window"]
    if spec.get("sliding"):
        attrs["sliding_window_cache"] = 1
    if spec.get("softcap"):
        attrs["softcap"] = spec["softcap"]
    extra = {}
    if spec.get("quant"):
        bits, mode = spec["quant"]
        attrs.update(kv_cache_bit_width=bits, k_quant_type=mode, v_quant_type=mode)
        n = 1 if mode == "PER_TENSOR" else Nkv * H
        qmax = 127 if bits == 8 else 7
        extra["k_scale"] = (3.5 / qmax * rng.uniform(0.7, 1.4, n)).astype(np.float32).reshape((1, Nkv, 1, H) if n > 1 else (1,))
        extra["v_scale"] = (3.5 / qmax * rng.uniform(0.7, 1.4, n)).astype(np.float32).reshape(extra["k_scale"].shape)
    if spec.get("rotary"):
        extra["cos_cache"], extra["sin_cache"] = gqa_cases.rotary_tables(max(spec["lengths"]) + spec["steps"] + 5,
                                                                          H // 2, dt)
    return dt, attrs, extra


def _empty_cache(spec, B, rows, dt):
    N, Nkv = spec["heads"]
    H = spec["H"]
    if spec.get("quant"):
        bits = spec["quant"][0]
        return np.zeros((B, Nkv, rows, H if bits == 8 else H // 2), np.int8 if bits == 8 else np.uint8)
    return np.zeros((B, Nkv, rows, H), dt)


@pytest.mark.parametrize("spec", LOOPS, ids=[s["name"] for s in LOOPS])
def test_generation_loop(spec):
    from gqa_onnx import run_ort
    import attnkit

    rng = np.random.default_rng(len(spec["name"]))
    dt, attrs, extra = _loop_inputs(spec, rng)
    N, Nkv = spec["heads"]
    H = spec["H"]
    lengths = list(spec["lengths"])
    B, S0 = len(lengths), max(lengths)
    capacity = spec["window"] if spec.get("sliding") else S0 + spec["steps"]
    tol = gqa_cases.TOLERANCE[spec["dtype"]]
    quantized = bool(spec.get("quant"))

    # attnkit's caches: one shared buffer per tensor (appended in place), or each step's present fed back.
    shared = spec["cache"] == "shared"
    ak_k = ak_v = None
    if shared:
        ak_k = rng.standard_normal(_empty_cache(spec, B, capacity, dt).shape).astype(dt) if not quantized else \
            _empty_cache(spec, B, capacity, dt)
        ak_v = ak_k.copy()
    # ONNX Runtime's: separate buffers (its window cache keeps its capacity; otherwise they grow).
    ort_rows = capacity if spec.get("sliding") else 0
    ort_k, ort_v = _empty_cache(spec, B, ort_rows, dt), _empty_cache(spec, B, ort_rows, dt)
    T = [0] * B
    for step in range(spec["steps"] + 1):
        S = S0 if step == 0 else 1
        new = [lengths[b] if step == 0 else 1 for b in range(B)]
        T = [T[b] + new[b] for b in range(B)]
        width = (N + 2 * Nkv) * H if spec.get("packed") else N * H
        x = dict(query=rng.standard_normal((B, S, width), dtype=np.float32).astype(dt))
        if not spec.get("packed"):
            x["key"] = rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt)
            x["value"] = rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt)
        x["seqlens_k"] = np.array([t - 1 for t in T], np.int32)
        x["total_sequence_length"] = np.array(max(T), np.int32)
        x.update(extra)
        ort_in = dict(x, past_key=ort_k, past_value=ort_v)
        if step == 0 and not spec.get("sliding") and not quantized:
            ort_in["past_key"] = ort_in["past_value"] = None
        want = run_ort(ort_in, attrs)
        if shared:
            got = attnkit.group_query_attention(**x, past_key=ak_k, past_value=ak_v, present_key=ak_k,
                                                present_value=ak_v, **attrs)
            assert got[1] is ak_k and got[2] is ak_v
        else:
            got = attnkit.group_query_attention(**x, past_key=ak_k, past_value=ak_v, **attrs)
            ak_k, ak_v = got[1], got[2]
        valid = np.ones((B, S), bool)
        if step == 0:
            for b in range(B):
                valid[b, T[b]:] = False
        err = gqa_cases.ref.scaled_error(got[0], want["output"], valid)
        assert err <= tol, f"step {step}: output scaled error {err:.3g} > {tol:g}"
        for name, g in (("present_key", got[1]), ("present_value", got[2])):
            o = want[name]
            for b in range(B):
                rows = min(T[b], capacity)  # window cache: C == W, so both keep the newest min(T, C) rows
                a, r = g[b, :, :rows], o[b, :, :rows]
                if quantized:
                    bits = spec["quant"][0]
                    a, r = gqa_cases.ref.codes_of(a, bits, H), gqa_cases.ref.codes_of(r, bits, H)
                    assert np.abs(a - r).max(initial=0) <= (1 if name == "present_key" and spec.get("rotary") else 0)
                elif name == "present_key" and spec.get("rotary"):
                    np.testing.assert_allclose(a.astype(np.float64), r.astype(np.float64),
                                               atol=4 * gqa_cases.EPS[spec["dtype"]] * 4, rtol=0)
                else:
                    assert np.array_equal(a, r), f"step {step}: {name}[{b}] rows differ from ONNX Runtime's"
        ort_k, ort_v = want["present_key"], want["present_value"]
