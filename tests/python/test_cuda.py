"""CUDA tensors (PyTorch) on the CUDA backend, on the caller's current stream. Skipped without a GPU."""

import time
import zlib

import numpy as np
import pytest

import attnkit
import gqa_cross
import gqa_reference
from conftest import TOLERANCE
from gqa_cases import make_inputs, np_dtype, rotary_tables
from gqa_onnx import schema_is_new_enough
from reference import attention_ref, scaled_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in attnkit.available_backends(),
    reason="needs a CUDA device and attnkit's CUDA backend")


def f64(t, layout="bhsd"):
    a = t.detach().to("cpu", torch.float64).numpy()
    return a if layout == "bhsd" else a.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_cuda_tensors(dtype, layout):
    g = torch.Generator(device="cuda").manual_seed(3)
    td = getattr(torch, dtype)
    B, H, Hkv, Sq, Sk, D = 2, 8, 2, 37, 70, 64
    shape = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
    q = torch.randn(shape(H, Sq), generator=g, device="cuda").to(td)
    k = torch.randn(shape(Hkv, Sk), generator=g, device="cuda").to(td)
    v = torch.randn(shape(Hkv, Sk), generator=g, device="cuda").to(td)
    mask = torch.randn(B, 1, Sq, Sk, generator=g, device="cuda")
    lengths = torch.tensor([70, 33], dtype=torch.int32, device="cuda")
    out, lse = attnkit.attention(q, k, v, mask=mask, key_lengths=lengths, causal=True, layout=layout,
                                 return_lse=True)
    assert out.is_cuda and out.dtype == td and out.shape == q.shape and lse.is_cuda and lse.shape == (B, H, Sq)
    ref, ref_lse = attention_ref(f64(q, layout), f64(k, layout), f64(v, layout), mask=f64(mask),
                                 key_lengths=lengths.cpu().numpy(), causal=True)
    torch.cuda.synchronize()
    assert scaled_error(f64(out, layout), ref) <= TOLERANCE[dtype]
    if dtype == "float32":
        np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-5, atol=1e-5)


def test_cuda_strided_views_and_packed_qkv():
    B, S, H, Hkv, D = 2, 50, 4, 2, 32
    qkv = torch.randn(B, S, (H + 2 * Hkv) * D, device="cuda", dtype=torch.float16)
    heads = qkv.view(B, S, H + 2 * Hkv, D)
    q, k, v = heads[:, :, :H], heads[:, :, H:H + Hkv], heads[:, :, H + Hkv:]
    out = torch.full((B, H, S, 48), float("nan"), device="cuda", dtype=torch.float16)[..., 8:40]  # strided out
    res = attnkit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out=out, causal=True)
    assert res is out
    ref, _ = attention_ref(f64(q, "bshd"), f64(k, "bshd"), f64(v, "bshd"), causal=True)
    torch.cuda.synchronize()
    assert scaled_error(f64(out), ref) <= TOLERANCE["float16"]


def test_cuda_runs_on_the_current_stream():
    q = torch.randn(1, 2, 16, 32, device="cuda")
    ref, _ = attention_ref(f64(q), f64(q), f64(q))
    side = torch.cuda.Stream()  # a non-blocking stream: it does not wait for the default stream
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of work queued on the default stream
    with torch.cuda.stream(side):
        out = torch.full_like(q, float("nan"))
        attnkit.attention(q, q, q, out=out)
    side.synchronize()  # had the kernel gone to the default stream, it would still wait behind the sleep
    assert scaled_error(f64(out), ref) <= TOLERANCE["float32"]
    torch.cuda.synchronize()


def test_cuda_out_of_range_device_key_length_hides_its_entry():
    # Device key lengths are never read back (the call captures in a CUDA graph): an out-of-range one hides every
    # key of its batch entry (masked rows: NaN), the other entries are exact (docs/numerics.md).
    q = torch.randn(2, 2, 8, 16, device="cuda")
    out = torch.full_like(q, 1234.5)
    attnkit.attention(q, q, q, out=out, key_lengths=torch.tensor([3, 9], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert bool(torch.isnan(out[1]).all())
    good = attnkit.attention(q[:1], q[:1], q[:1], key_lengths=torch.tensor([3], dtype=torch.int32, device="cuda"))
    assert torch.equal(out[:1], good)


def test_cuda_errors_write_nothing():
    q = torch.randn(2, 2, 8, 16, device="cuda")
    out = torch.full_like(q, 1234.5)
    with pytest.raises(ValueError, match=r"k: is on cpu but q is on cuda:0"):
        attnkit.attention(q, q.cpu(), q, out=out)
    with pytest.raises(ValueError, match=r"backend: \"cpu\" runs host arrays, but q is on cuda:0"):
        attnkit.attention(q, q, q, out=out, backend="cpu")
    with pytest.raises(ValueError, match=r"out: shape"):
        attnkit.attention(q, q, q, out=out[:, :1])
    torch.cuda.synchronize()
    assert bool((out == 1234.5).all())


# ---- GroupQueryAttention on CUDA ---------------------------------------------------------------------------------
# The oracle is the same call on the CPU through attnkit itself (checked against ONNX Runtime and the float64
# reference by test_gqa_ort.py); tolerances and the case subset are in gqa_cross.py.

# The inputs the op reads on the host (its checks and plan): host or device memory on a CUDA call.
SMALL_INPUTS = ("seqlens_k", "total_sequence_length", "position_ids", "head_sink", "k_scale", "v_scale")
GQA_CASES = gqa_cross.cuda_cases()


def dev(a, device="cuda"):
    """A NumPy array (ml_dtypes.bfloat16 too) as a new torch tensor on `device`, bit for bit."""
    a = np.array(a, copy=True, order="C")
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def host(t):
    """A torch tensor (or a NumPy array) as a NumPy array on the host (bfloat16: ml_dtypes.bfloat16)."""
    if isinstance(t, np.ndarray):
        return t
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    return t.numpy()


def bits(a):
    return np.array(host(a), copy=True).reshape(-1).view(np.uint8)


def small(a, where):
    """A small input (seqlens_k, ...) as a NumPy array, a torch CPU tensor or a CUDA tensor."""
    return np.array(a, copy=True) if where == "numpy" else dev(a, "cpu" if where == "cpu" else "cuda")


@pytest.mark.parametrize("case", GQA_CASES, ids=[c["id"] for c in GQA_CASES])
def test_gqa_sweep_matches_the_cpu(case):
    """A case of the conformance sweep on CUDA tensors against the same call on host arrays, and against ONNX
    Runtime's CPU provider where that runs it. The small inputs travel as NumPy arrays, CPU tensors or CUDA
    tensors (by case); the output is allocated, or passed in poisoned."""
    c = case
    x, attrs, pk_arg, pv_arg = make_inputs(c)
    made = {n: a.copy() for n, a in x.items()}  # the inputs as made: ONNX Runtime's, and the read-only check
    shared = c["cache"] == "shared" and pk_arg is not None

    xc = {n: a.copy() for n, a in x.items()}
    if shared:
        pkc, pvc = xc["past_key"], xc["past_value"]
    else:
        pkc, pvc = (None, None) if pk_arg is None else (pk_arg.copy(), pv_arg.copy())
    want = attnkit.group_query_attention(**xc, **attrs, present_key=pkc, present_value=pvc)

    h = zlib.crc32(c["id"].encode())
    where = ("numpy", "cpu", "cuda")[h % 3]
    xg = {n: small(a, where) if n in SMALL_INPUTS else dev(a) for n, a in x.items()}
    if shared:
        pkg, pvg = xg["past_key"], xg["past_value"]
    else:
        pkg, pvg = (None, None) if pk_arg is None else (dev(pk_arg), dev(pv_arg))
    out = dev(np.full(want[0].shape, np.nan, want[0].dtype)) if (h >> 2) % 2 else None
    got = attnkit.group_query_attention(**xg, **attrs, present_key=pkg, present_value=pvg, output=out)
    assert len(got) == 3 and all(isinstance(t, torch.Tensor) and t.is_cuda for t in got)
    assert got[0].shape == want[0].shape and got[0].dtype == getattr(torch, c["dtype"])
    if pkg is not None:
        assert got[1] is pkg and got[2] is pvg, "a present cache passed in is returned as it is"
    if out is not None:
        assert got[0] is out
    torch.cuda.synchronize()
    for n, a in xg.items():  # read only (a shared cache is its present: compared below)
        if not (shared and n in ("past_key", "past_value")):
            assert np.array_equal(bits(a), bits(made[n])), f"{n} was written"
    got = [host(t) for t in got]
    gqa_cross.compare_results(c, got, want, "the CPU")

    if schema_is_new_enough():
        ort = gqa_cross.ort_outputs(c, made, attrs)
        if ort is not None:
            gqa_cross.compare_with_ort(c, got, ort)


def test_gqa_sweep_subset_covers_the_features():
    assert gqa_cross.missing_features(GQA_CASES) == []
    assert not any(c["qk_output"] for c in GQA_CASES)


# ---- a generation loop on one shared buffer ----------------------------------------------------------------------

LOOPS = [
    dict(name="f16-rotary-llama", dtype="float16", heads=(32, 8), H=128, lengths=[37, 20, 5], rotary="plain"),
    dict(name="bf16-window-softcap-sink", dtype="bfloat16", heads=(16, 4), H=64, lengths=[50, 9],
         rotary="interleaved", window=16, softcap=30.0, sink=True),
    dict(name="f32-packed-qknorm", dtype="float32", heads=(6, 6), H=32, lengths=[11, 4], packed=True, qk_norm=True,
         rotary="plain"),
    dict(name="int8-per-channel", dtype="float16", heads=(32, 8), H=128, lengths=[40, 7], quant=(8, "PER_CHANNEL"),
         rotary="plain"),
    dict(name="int4-per-tensor", dtype="bfloat16", heads=(6, 2), H=64, lengths=[19, 3, 11], quant=(4, "PER_TENSOR")),
    dict(name="window-cache", dtype="float16", heads=(8, 2), H=64, lengths=[6, 4], window=8, sliding=True),
]
STEPS = 3


def _loop_setup(spec, rng):
    dt = np_dtype(spec["dtype"])
    N, Nkv = spec["heads"]
    H = spec["H"]
    attrs = dict(num_heads=N, kv_num_heads=Nkv)
    extra = {}
    if spec.get("rotary"):
        attrs.update(do_rotary=1, rotary_interleaved=int(spec["rotary"] == "interleaved"))
        extra["cos_cache"], extra["sin_cache"] = rotary_tables(max(spec["lengths"]) + STEPS + 8, H // 2, dt)
    if spec.get("window"):
        attrs["local_window_size"] = spec["window"]
    if spec.get("sliding"):
        attrs["sliding_window_cache"] = 1
    if spec.get("softcap"):
        attrs["softcap"] = spec["softcap"]
    if spec.get("sink"):
        extra["head_sink"] = (2 * rng.standard_normal(N)).astype(dt)
    if spec.get("qk_norm"):
        extra["q_norm_weight"] = (1 + 0.3 * rng.standard_normal(H)).astype(dt)
        extra["k_norm_weight"] = (1 + 0.3 * rng.standard_normal(H)).astype(dt)
    B, rows = len(spec["lengths"]), spec["window"] if spec.get("sliding") else max(spec["lengths"]) + STEPS + 5
    if spec.get("quant"):
        bits_, mode = spec["quant"]
        attrs.update(kv_cache_bit_width=bits_, k_quant_type=mode, v_quant_type=mode)
        n = 1 if mode == "PER_TENSOR" else Nkv * H
        qmax = 127 if bits_ == 8 else 7
        for s in ("k_scale", "v_scale"):
            extra[s] = (3.5 / qmax * rng.uniform(0.7, 1.4, n)).astype(np.float32)
        shape = (B, Nkv, rows, H if bits_ == 8 else H // 2)
        cache = [rng.integers(-128, 128, shape).astype(np.int8) if bits_ == 8 else
                 rng.integers(0, 256, shape).astype(np.uint8) for _ in range(2)]
    else:
        cache = [rng.standard_normal((B, Nkv, rows, H), dtype=np.float32).astype(dt) for _ in range(2)]
    return dt, attrs, extra, cache  # the caches start with junk in every row: only the written ones may change


@pytest.mark.parametrize("spec", LOOPS, ids=[s["name"] for s in LOOPS])
def test_gqa_shared_cache_loop_matches_the_cpu(spec):
    """A prompt and 3 decode steps appended in place to one shared buffer per cache (present is past's memory) on
    the GPU, step by step against the same loop on host arrays: every step's output and both whole caches."""
    rng = np.random.default_rng(zlib.crc32(spec["name"].encode()))
    dt, attrs, extra, (k0, v0) = _loop_setup(spec, rng)
    N, Nkv = spec["heads"]
    H, lengths = spec["H"], spec["lengths"]
    B = len(lengths)
    c = dict(dtype=spec["dtype"], quant=(spec["quant"] + (spec["quant"][1],)) if spec.get("quant") else None, H=H,
             rotary=spec.get("rotary"), qk_norm=spec.get("qk_norm", False), step="decode", B=B, S=1, T=[1] * B)
    ck, cv = k0.copy(), v0.copy()  # the CPU's buffers
    gk, gv = dev(k0), dev(v0)  # the GPU's
    gk_ptr = gk.data_ptr()
    xg_extra = {n: small(a, "numpy") if n in SMALL_INPUTS else dev(a) for n, a in extra.items()}
    T = [0] * B
    for step in range(STEPS + 1):
        S = max(lengths) if step == 0 else 1
        T = [t + (lengths[b] if step == 0 else 1) for b, t in enumerate(T)]
        width = (N + 2 * Nkv) * H if spec.get("packed") else N * H
        x = dict(query=rng.standard_normal((B, S, width), dtype=np.float32).astype(dt))
        if not spec.get("packed"):
            x["key"] = rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt)
            x["value"] = rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt)
        x["seqlens_k"] = np.array([t - 1 for t in T], np.int32)
        x["total_sequence_length"] = np.array(max(T), np.int32)
        want = attnkit.group_query_attention(**x, **extra, **attrs, past_key=ck, past_value=cv, present_key=ck,
                                             present_value=cv)
        # Small inputs on the host (the no-sync path), but seqlens_k on the device at one step.
        xg = {n: (dev(a) if n not in SMALL_INPUTS or (step == 2 and n == "seqlens_k") else a) for n, a in x.items()}
        got = attnkit.group_query_attention(**xg, **xg_extra, **attrs, past_key=gk, past_value=gv, present_key=gk,
                                            present_value=gv)
        assert got[1] is gk and got[2] is gv and gk.data_ptr() == gk_ptr
        c.update(step="prompt" if step == 0 else "decode", S=S, T=T)
        gqa_cross.compare_results(c, [host(t) for t in got], want, f"the CPU at step {step}")


# ---- refused calls write nothing ---------------------------------------------------------------------------------

def _decode_call(quant=False, shared=True):
    """A valid decode step on the GPU (B 2, 8 query heads on 2, head 64, totals 6 and 13, a 32-row cache) with a
    NaN-poisoned output; a separate present cache is poisoned too (NaN, or 0x7f bytes for int8)."""
    rng = np.random.default_rng(5)
    B, N, Nkv, H, C = 2, 8, 2, 64, 32
    r = lambda *s: dev(rng.standard_normal(s, dtype=np.float32).astype(np.float16))  # noqa: E731
    kw = dict(query=r(B, 1, N * H), key=r(B, 1, Nkv * H), value=r(B, 1, Nkv * H),
              seqlens_k=np.array([5, 12], np.int32), total_sequence_length=13, num_heads=N, kv_num_heads=Nkv,
              output=torch.full((B, 1, N * H), float("nan"), device="cuda", dtype=torch.float16))
    if quant:
        kw.update(past_key=dev(rng.integers(-128, 128, (B, Nkv, C, H)).astype(np.int8)),
                  past_value=dev(rng.integers(-128, 128, (B, Nkv, C, H)).astype(np.int8)),
                  k_scale=np.array([0.03], np.float32), v_scale=np.array([0.03], np.float32),
                  k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    else:
        kw.update(past_key=r(B, Nkv, C, H), past_value=r(B, Nkv, C, H))
    if shared:
        kw.update(present_key=kw["past_key"], present_value=kw["past_value"])
    else:
        kw.update(present_key=torch.full_like(kw["past_key"], 0x7f if quant else float("nan")),
                  present_value=torch.full_like(kw["past_value"], 0x7f if quant else float("nan")))
    return kw


def _rejects(message, quant=False, shared=True, **overrides):
    """The call must raise ValueError matching `message` and leave every output and cache as it was, bit for bit."""
    kw = _decode_call(quant, shared)
    kw.update(overrides)
    watched = {n: kw[n] for n in ("output", "present_key", "present_value", "output_qk", "past_key", "past_value")
               if isinstance(kw.get(n), torch.Tensor)}
    torch.cuda.synchronize()
    before = {n: bits(t) for n, t in watched.items()}
    with pytest.raises(ValueError, match=message):
        attnkit.group_query_attention(**kw)
    torch.cuda.synchronize()
    for n, t in watched.items():
        assert np.array_equal(bits(t), before[n]), f"a rejected call wrote into {n}"


def test_gqa_the_base_call_runs_on_cuda():
    for quant in (False, True):
        for shared in (False, True):
            kw = _decode_call(quant, shared)
            out, pk, pv = attnkit.group_query_attention(**kw)
            assert out is kw["output"] and pk is kw["present_key"] and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("quant", [False, True], ids=["float16", "int8"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
def test_gqa_bad_input_on_cuda_writes_nothing(quant, shared):
    on_gpu = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    # Beyond the 32-row cache (shared: its capacity; separate: the past's rows), on the host and on the device.
    _rejects(r"seqlens_k\[1\]: = 40 ", quant, shared, seqlens_k=np.array([5, 40], np.int32), total_sequence_length=41)
    _rejects(r"seqlens_k\[1\]: = 40 ", quant, shared, seqlens_k=on_gpu,
             total_sequence_length=torch.tensor(41, dtype=torch.int32, device="cuda"))
    _rejects(r"query: dimension 2 \(512\) must be a multiple of num_heads = 6", quant, shared, num_heads=6)
    _rejects(r"key: must have shape \(batch, sequence_length, kv_num_heads \* head_size\)", quant, shared,
             kv_num_heads=4)
    _rejects(r"head_sink: must be absent when smooth_softmax = 1", quant, shared, smooth_softmax=1,
             head_sink=torch.zeros(8, dtype=torch.float16, device="cuda"))
    # Placement: the query's device rules.
    kw = _decode_call(quant, shared)
    _rejects(r"key: lives on cpu but query is on cuda:0; every tensor but seqlens_k, total_sequence_length, "
             r"position_ids, head_sink, k_scale and v_scale must be on query's CUDA device", quant, shared,
             key=kw["key"].cpu())
    _rejects(r"output: lives on cpu but query is on cuda:0", quant, shared,
             output=torch.full((2, 1, 512), float("nan"), dtype=torch.float16))
    if not shared:
        _rejects(r"past_key: lives on cpu but query is on cuda:0", quant, shared, past_key=kw["past_key"].cpu())


def test_gqa_device_rules():
    kw = _decode_call()
    # A host query runs on the CPU: CUDA arrays are refused there.
    host_kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    host_kw["present_key"], host_kw["present_value"] = host_kw["past_key"], host_kw["past_value"]
    with pytest.raises(ValueError, match=r"past_value: lives on cuda:0 but query is on cpu"):
        attnkit.group_query_attention(**dict(host_kw, past_value=kw["past_value"]))
    with pytest.raises(ValueError, match=r"seqlens_k: lives on cuda:0 but query is on cpu"):
        attnkit.group_query_attention(**dict(host_kw, seqlens_k=torch.tensor([5, 12], dtype=torch.int32,
                                                                              device="cuda")))
    # A CUDA query: outputs it allocates are CUDA tensors on its device.
    out, pk, pv = attnkit.group_query_attention(**dict(kw, output=None, present_key=None, present_value=None))
    assert out.device == kw["query"].device and pk.device == kw["query"].device and pk.shape == (2, 2, 32, 64)


def test_gqa_output_qk_on_cuda_matches_the_cpu():
    """output_qk before and after the softmax, on a separate int8 cache and on a shared float16 one: the GPU's
    (float64 arithmetic, rounded once) against the CPU op's, and the output it came with."""
    for quant in (False, True):
        for qk_output in (1, 2):
            kw = _decode_call(quant, shared=not quant)
            kw.update(qk_output=qk_output, head_sink=np.full(8, 0.5, np.float16), softcap=20.0)
            cpu = {n: (t.cpu().clone() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
            if not quant:
                cpu["present_key"], cpu["present_value"] = cpu["past_key"], cpu["past_value"]
            want = attnkit.group_query_attention(**cpu)
            got = attnkit.group_query_attention(**kw)
            assert len(got) == 4 and got[3].device == kw["query"].device and got[3].shape == (2, 8, 1, 13)
            w, g = host(want[3]).astype(np.float64), host(got[3]).astype(np.float64)
            assert np.all(np.isfinite(g))
            assert np.max(np.abs(w - g)) <= 2e-3 * max(np.max(np.abs(w)), 1e-30), (quant, qk_output)
            assert np.array_equal(g == 0, w == 0), "the keys a row does not see hold 0 on both backends"
            o_w, o_g = host(want[0]).astype(np.float64), host(got[0]).astype(np.float64)
            assert np.max(np.abs(o_w - o_g)) <= 2e-3 * np.max(np.abs(o_w))


# ---- small inputs on the host or the device ----------------------------------------------------------------------

def test_gqa_small_inputs_on_host_or_device_give_the_same_bits():
    """seqlens_k, total_sequence_length, position_ids, head_sink and the scales as NumPy arrays, CPU tensors or
    CUDA tensors (read back by the op): the same output and caches, bit for bit. Present caches are allocated (their rows come
    from total_sequence_length, read back by the binding when it is on the device)."""
    rng = np.random.default_rng(11)
    B, S, N, Nkv, H, P = 3, 2, 16, 4, 64, 40
    dt = np.float16
    x = dict(query=rng.standard_normal((B, S, N * H), dtype=np.float32).astype(dt),
             key=rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt),
             value=rng.standard_normal((B, S, Nkv * H), dtype=np.float32).astype(dt),
             past_key=rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8),
             past_value=rng.integers(-128, 128, (B, Nkv, P, H)).astype(np.int8),
             seqlens_k=np.array([30, 41, 7], np.int32), total_sequence_length=np.array(42, np.int32),
             position_ids=rng.integers(0, 60, (B, S)).astype(np.int64), head_sink=rng.standard_normal(N).astype(dt),
             k_scale=(0.03 * rng.uniform(0.7, 1.4, (1, Nkv, 1, H))).astype(np.float32),
             v_scale=(0.03 * rng.uniform(0.7, 1.4, (1, Nkv, 1, H))).astype(np.float32))
    x["cos_cache"], x["sin_cache"] = rotary_tables(64, H // 2, dt)
    attrs = dict(num_heads=N, kv_num_heads=Nkv, do_rotary=1, k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL",
                 kv_cache_bit_width=8)
    results = []
    for placement in (dict.fromkeys(SMALL_INPUTS, "numpy"), dict.fromkeys(SMALL_INPUTS, "cuda"),
                      dict.fromkeys(SMALL_INPUTS, "cpu"), dict(dict.fromkeys(SMALL_INPUTS, "numpy"), seqlens_k="cuda")):
        xg = {n: small(a, placement[n]) if n in SMALL_INPUTS else dev(a) for n, a in x.items()}
        res = attnkit.group_query_attention(**xg, **attrs)
        assert res[1].shape == (B, Nkv, 42, H) and res[1].is_cuda  # max(total_sequence_length, past rows)
        results.append([bits(t) for t in res])
    for other in results[1:]:
        for a, b, name in zip(results[0], other, ("output", "present_key", "present_value")):
            assert np.array_equal(a, b), f"{name} depends on where the small inputs live"


# ---- the caller's stream -----------------------------------------------------------------------------------------

def test_gqa_runs_on_the_current_stream_without_waiting():
    """A decode step on a side stream while the default stream is busy for about a second: with the small inputs
    on the host it queues its kernels on the side stream and returns without waiting for the device."""
    kw = _decode_call()
    x = {n: (host(t).copy() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    x["present_key"], x["present_value"] = x["past_key"], x["past_value"]
    want = attnkit.group_query_attention(**x)  # the CPU, on a copy of the cache as it is now
    side = torch.cuda.Stream()  # a non-blocking stream: it does not wait for the default stream
    torch.cuda.synchronize()  # the inputs were made on the default stream
    with torch.cuda.stream(side):
        attnkit.group_query_attention(**kw)  # warm-up: builds the op for this stream (it appends the same row)
    torch.cuda.synchronize()
    kw["output"].fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of work queued on the default stream
    with torch.cuda.stream(side):
        t0 = time.perf_counter()
        attnkit.group_query_attention(**kw)
        took = time.perf_counter() - t0
    side.synchronize()  # had a kernel gone to the default stream, it would still wait behind the sleep
    err = gqa_reference.scaled_error(host(kw["output"]), want[0])
    assert err <= 2e-3, f"output vs the CPU: scaled error {err:.3g}"
    torch.cuda.synchronize()
    assert took < 0.5, f"the call took {took:.2f} s: it waited for the device (a synchronisation)"


def test_varlen_and_paged_on_cuda_match_the_host_call():
    """Ragged and paged calls on CUDA tensors (device cu_seqlens, block table, key lengths) give the host call's
    result within the dtype's tolerance, with the rows no sequence owns untouched."""
    g = torch.Generator().manual_seed(5)
    H, Hkv, D = 8, 2, 64
    q_lens, k_lens = [5, 0, 33, 1], [40, 7, 300, 0]
    cu_q = torch.tensor([0, 5, 5, 38, 39], dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 47, 347, 347], dtype=torch.int32)
    q = torch.randn(41, H, D, generator=g).half()
    k, v = torch.randn(347, Hkv, D, generator=g).half(), torch.randn(347, Hkv, D, generator=g).half()
    host = attnkit.attention_varlen(q, k, v, cu_q, cu_k, 33, 300, causal=True)
    out = torch.full((41, H, D), 7.0, dtype=torch.float16, device="cuda")
    got = attnkit.attention_varlen(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_k.cuda(), 33, 300, causal=True, out=out)
    assert got is out
    torch.testing.assert_close(got[:39].cpu(), host[:39], rtol=0, atol=TOLERANCE["float16"] * 8, equal_nan=True)
    assert (got[39:] == 7.0).all(), "rows no sequence owns were written"
    # Paged: the same keys in shuffled pages of 16, one query per sequence (a decode step).
    page, per = 16, 20
    perm = torch.randperm(4 * per, generator=g)
    kp = torch.zeros(4 * per, page, Hkv, D, dtype=torch.float16)
    vp = torch.zeros_like(kp)
    table = torch.zeros(4, per, dtype=torch.int32)
    for b in range(4):
        for i in range((k_lens[b] + page - 1) // page):
            p = int(perm[b * per + i])
            table[b, i] = p
            rows = slice(int(cu_k[b]) + i * page, int(cu_k[b]) + min(k_lens[b], (i + 1) * page))
            n = rows.stop - rows.start
            kp[p, :n], vp[p, :n] = k[rows], v[rows]
    qd = torch.randn(4, 1, H, D, generator=g).half()
    lengths = torch.tensor(k_lens, dtype=torch.int32)
    host = attnkit.attention(qd, kp, vp, block_table=table, key_lengths=lengths, layout="bshd")
    got = attnkit.attention(qd.cuda(), kp.cuda(), vp.cuda(), block_table=table.cuda(), key_lengths=lengths.cuda(),
                            layout="bshd")
    torch.testing.assert_close(got.cpu(), host, rtol=0, atol=TOLERANCE["float16"] * 8, equal_nan=True)


def test_paged_decode_captures_in_a_cuda_graph_and_replays_with_new_tables():
    """A paged decode step captures in torch's CUDA graph (strict capture: no read-back of the device arrays);
    the replay after new key lengths and block-table entries are written in place gives the eager call's bytes."""
    g = torch.Generator(device="cuda").manual_seed(8)
    B, H, Hkv, D, page, per = 4, 32, 8, 128, 16, 64
    q = torch.randn(B, 1, H, D, generator=g, device="cuda").bfloat16()
    kp = torch.randn(B * per, page, Hkv, D, generator=g, device="cuda").bfloat16()
    vp = torch.randn_like(kp)
    table = torch.randperm(B * per, device="cuda", generator=g).to(torch.int32).reshape(B, per)
    lengths = torch.tensor([1000, 1, 512, 77], dtype=torch.int32, device="cuda")
    run = lambda: attnkit.attention(q, kp, vp, block_table=table, key_lengths=lengths, layout="bshd")  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    lengths.copy_(torch.tensor([3, 1024, 900, 640], dtype=torch.int32))
    table.copy_(table.flip(1))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, run(), rtol=0, atol=0)
