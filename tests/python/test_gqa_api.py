"""attnkit.group_query_attention as a Python API: names, zero-copy caches, allocated outputs, dtypes, threads."""

import inspect

import numpy as np
import pytest

import attnkit
import gqa_reference as ref
from conftest import np_dtype

INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
          "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
          "k_norm_weight")
ATTRIBUTES = ("num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "causal", "do_rotary",
              "rotary_interleaved", "smooth_softmax", "qk_output", "k_quant_type", "v_quant_type",
              "kv_cache_bit_width", "sliding_window_cache", "qk_norm_epsilon")


def test_signature_has_onnx_runtimes_names():
    params = inspect.signature(attnkit.group_query_attention).parameters
    names = list(params)
    assert tuple(names[:16]) == INPUTS  # positional, in ONNX Runtime's order
    for a in ATTRIBUTES + ("present_key", "present_value", "output", "output_qk", "threads"):
        assert params[a].kind is inspect.Parameter.KEYWORD_ONLY, a
    assert params["causal"].default == 1 and params["local_window_size"].default == -1
    assert params["smooth_softmax"].default == -1 and params["qk_norm_epsilon"].default == 1e-6
    assert "GroupQueryAttention" in attnkit.group_query_attention.__doc__
    assert "group_query_attention" in attnkit.__all__


def test_names_match_the_onnx_runtime_schema():
    """Every input and attribute of the contract is one of ONNX Runtime's (its schema may have more)."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    schema = next(s for s in C.get_all_operator_schema() if s.name == "GroupQueryAttention" and s.domain == "com.microsoft")
    ort_inputs = [i.name for i in schema.inputs]
    assert ort_inputs[:16] == list(INPUTS), ort.__version__
    assert set(ATTRIBUTES) <= set(schema.attributes), sorted(set(ATTRIBUTES) - set(schema.attributes))


def _decode(rng, B=2, P=8, N=4, Nkv=2, H=16, dtype="float32", rows=None):
    dt = np_dtype(dtype)
    r = lambda *s: rng.standard_normal(s, dtype=np.float32).astype(dt)  # noqa: E731
    return dict(query=r(B, 1, N * H), key=r(B, 1, Nkv * H), value=r(B, 1, Nkv * H), past_key=r(B, Nkv, rows or P, H),
                past_value=r(B, Nkv, rows or P, H), seqlens_k=np.array([P - 3, P], np.int32)[:B],
                total_sequence_length=P + 1), dict(num_heads=N, kv_num_heads=Nkv)


def test_shared_buffer_is_appended_in_place(rng):
    x, attrs = _decode(rng, rows=32)
    parent = np.zeros((3,) + x["past_key"].shape, np.float32)
    parent[1] = x["past_key"]
    cache_k = parent[1]  # a contiguous view into a larger allocation
    cache_v = x["past_value"]
    before_k, before_v = cache_k.copy(), cache_v.copy()
    x.update(past_key=cache_k, past_value=cache_v)
    out, pk, pv = attnkit.group_query_attention(**x, **attrs, present_key=cache_k, present_value=cache_v)
    assert pk is cache_k and pv is cache_v
    for b, T in enumerate([6, 9]):
        # Row T - 1 is the new token; every other row is untouched.
        np.testing.assert_array_equal(np.delete(cache_k[b], T - 1, axis=1), np.delete(before_k[b], T - 1, axis=1))
        np.testing.assert_array_equal(np.delete(cache_v[b], T - 1, axis=1), np.delete(before_v[b], T - 1, axis=1))
        np.testing.assert_array_equal(cache_v[b, :, T - 1], x["value"][b, 0].reshape(2, 16))
    assert np.shares_memory(parent, pk) and np.array_equal(parent[1], cache_k)
    # The same call on separate buffers gives the same output and the same valid rows.
    x2 = dict(x, past_key=before_k, past_value=before_v)
    out2, pk2, pv2 = attnkit.group_query_attention(**x2, **attrs)
    np.testing.assert_array_equal(out, out2)
    assert pk2.shape == (2, 2, 32, 16)  # ONNX Runtime's shape: max(total_sequence_length, past rows)
    for b, T in enumerate([6, 9]):
        np.testing.assert_array_equal(pk2[b, :, :T], cache_k[b, :, :T])
        assert not pk2[b, :, T:].any()  # separate buffers: rows past the sequence are zero


def test_allocated_outputs(rng):
    x, attrs = _decode(rng)
    out, pk, pv = attnkit.group_query_attention(**x, **attrs)
    assert out.shape == (2, 1, 64) and out.dtype == np.float32 and out.flags.c_contiguous
    assert pk.shape == pv.shape == (2, 2, 9, 16)
    # A first prompt without a past: present (B, Nkv, total_sequence_length, H).
    first = dict(query=x["query"], key=x["key"], value=x["value"], seqlens_k=np.array([0, 0], np.int32),
                 total_sequence_length=1)
    out, pk, pv = attnkit.group_query_attention(**first, **attrs)
    assert pk.shape == (2, 2, 1, 16)
    # int4 caches: uint8, (H + 1) // 2 bytes per row; output_qk with qk_output.
    q = dict(first, past_key=np.zeros((2, 2, 0, 8), np.uint8), past_value=np.zeros((2, 2, 0, 8), np.uint8),
             k_scale=np.array([0.5], np.float32), v_scale=np.array([0.5], np.float32))
    res = attnkit.group_query_attention(**q, **attrs, k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR",
                                        kv_cache_bit_width=4, qk_output=2)
    assert len(res) == 4
    out, pk, pv, qk = res
    assert pk.dtype == np.uint8 and pk.shape == (2, 2, 1, 8) and qk.shape == (2, 4, 1, 1)
    np.testing.assert_allclose(qk, 1.0)  # one key: probability 1
    # Destinations passed in are returned as they are.
    o, k, v = np.empty((2, 1, 64), np.float32), np.empty((2, 2, 12, 16), np.float32), np.empty((2, 2, 12, 16), np.float32)
    res = attnkit.group_query_attention(**x, **attrs, output=o, present_key=k, present_value=v)
    assert res[0] is o and res[1] is k and res[2] is v


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtypes_and_threads(rng, dtype):
    x, attrs = _decode(rng, B=2, P=40, N=8, Nkv=2, H=64, dtype=dtype)
    one = attnkit.group_query_attention(**x, **attrs, threads=1)
    two = attnkit.group_query_attention(**x, **attrs, threads=2)
    for a, b in zip(one, two):
        assert a.dtype == np_dtype(dtype)
        assert np.array_equal(a.view(np.uint16 if a.itemsize == 2 else np.uint32),
                              b.view(np.uint16 if b.itemsize == 2 else np.uint32))
    p = ref.prepare(x, attrs)
    want, _ = ref.attention(p, x, attrs, np.asarray(one[1], np.float64), np.asarray(one[2], np.float64), [0, 0])
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}[dtype]
    assert ref.scaled_error(one[0], want) <= tol


def test_odd_head_size_int4_against_the_reference(rng):
    """int4 rows of an odd head size: (H + 1) // 2 bytes, the last high nibble a zero value (byte 0x8_)."""
    B, S, N, Nkv, H = 2, 5, 6, 3, 7
    x = dict(query=rng.standard_normal((B, S, N * H), dtype=np.float32),
             key=rng.standard_normal((B, S, Nkv * H), dtype=np.float32),
             value=rng.standard_normal((B, S, Nkv * H), dtype=np.float32),
             past_key=np.zeros((B, Nkv, 0, 4), np.uint8), past_value=np.zeros((B, Nkv, 0, 4), np.uint8),
             seqlens_k=np.array([4, 2], np.int32), total_sequence_length=5,
             k_scale=np.full(Nkv * H, 0.45, np.float32), v_scale=np.array([0.5], np.float32))
    attrs = dict(num_heads=N, kv_num_heads=Nkv, k_quant_type="PER_CHANNEL", v_quant_type="PER_TENSOR",
                 kv_cache_bit_width=4)
    out, pk, pv = attnkit.group_query_attention(**x, **attrs)
    assert pk.shape == (B, Nkv, 5, 4) and pk.dtype == np.uint8
    assert ((pk[..., 3] >> 4) == 8).all()  # the pad nibble holds the value 0
    p = ref.prepare(dict(x, total_sequence_length=np.array(5, np.int32)), attrs)
    for which, got in (("key", pk), ("value", pv)):
        want, _ = ref.expected_cache(p, x, attrs, which, got.shape, False, x["past_" + which])
        assert np.array_equal(ref.codes_of(got, 4, H), want)
    kq = ref.cache_values(pk, attrs, "k", x["k_scale"], H)
    vq = ref.cache_values(pv, attrs, "v", x["v_scale"], H)
    want, _ = ref.attention(p, x, attrs, kq, vq, [0, 0])
    valid = np.array([[True] * 5, [True] * 3 + [False] * 2])
    assert ref.scaled_error(out, want, valid) <= 1e-5
