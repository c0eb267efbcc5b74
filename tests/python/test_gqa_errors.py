"""Rejected group_query_attention calls: each raises ValueError / TypeError with a message naming the input and
the rule, and writes nothing: the poisoned output, present caches and output_qk passed in (and a shared cache,
which is the past) are unchanged, bit for bit."""

import re

import numpy as np
import pytest

import attnkit

B, S, P, N, NKV, H = 2, 1, 8, 4, 2, 16


def base(shared=False, quant=None, rng=None):
    """A valid decode step (B=2, 4 query heads, 2 kv heads, head size 16; totals 6 and 9) with poisoned outputs."""
    rng = rng or np.random.default_rng(7)

    def randn(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    rows = 16 if shared else P
    kw = dict(query=randn(B, S, N * H), key=randn(B, S, NKV * H), value=randn(B, S, NKV * H),
              seqlens_k=np.array([5, 8], np.int32), total_sequence_length=np.array(9, np.int32),
              num_heads=N, kv_num_heads=NKV)
    if quant:
        kw.update(past_key=rng.integers(-128, 128, (B, NKV, rows, H)).astype(np.int8),
                  past_value=rng.integers(-128, 128, (B, NKV, rows, H)).astype(np.int8),
                  k_scale=np.array([0.03], np.float32), v_scale=np.array([0.03], np.float32),
                  k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
    else:
        kw.update(past_key=randn(B, NKV, rows, H), past_value=randn(B, NKV, rows, H))
    if shared:
        kw.update(present_key=kw["past_key"], present_value=kw["past_value"])
    elif quant:
        kw.update(present_key=np.full((B, NKV, 9, H), 99, np.int8), present_value=np.full((B, NKV, 9, H), 99, np.int8))
    else:
        kw.update(present_key=np.full((B, NKV, 9, H), np.nan, np.float32),
                  present_value=np.full((B, NKV, 9, H), np.nan, np.float32))
    kw["output"] = np.full((B, S, N * H), np.nan, np.float32)
    return kw


def rejects(exc, message, shared=False, quant=None, **overrides):
    """The call base() + overrides must raise `exc` whose message contains `message`, writing nothing."""
    kw = base(shared=shared, quant=quant)
    kw.update(overrides)
    watched = {n: kw[n] for n in ("output", "present_key", "present_value", "output_qk", "past_key", "past_value")
               if isinstance(kw.get(n), np.ndarray)}
    before = {n: a.copy() for n, a in watched.items()}
    with pytest.raises(exc, match=re.escape(message)):
        attnkit.group_query_attention(**kw)
    for n, a in watched.items():
        assert np.array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8), before[n].reshape(-1).view(np.uint8)), \
            f"a rejected call wrote into {n}"


def test_the_base_call_runs():
    for shared in (False, True):
        for quant in (None, True):
            kw = base(shared=shared, quant=quant)
            out, pk, pv = attnkit.group_query_attention(**kw)
            assert out is kw["output"] and pk is kw["present_key"] and pv is kw["present_value"]
            assert np.isfinite(out).all()


# ---- shapes and ranks --------------------------------------------------------------------------------------------

def test_ranks_and_shapes():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, S, N * H), dtype=np.float32)
    rejects(ValueError, "query: must have rank 3, got shape (2, 64)", query=q[:, 0])
    rejects(ValueError, "key: must have rank 3, got shape (2, 32)", key=np.zeros((B, NKV * H), np.float32))
    rejects(ValueError, "value: must have shape (batch, sequence_length, kv_num_heads * head_size) = (2, 1, 32), got (2, 1, 48)",
            value=np.zeros((B, S, 48), np.float32))
    rejects(ValueError, "query: dimension 2 (62) must be a multiple of num_heads = 4", query=np.zeros((B, S, 62), np.float32))
    rejects(ValueError, "query: head size 300 must be in [1, 256]", query=np.zeros((B, S, N * 300), np.float32))
    rejects(ValueError, "past_key: must have shape (batch, kv_num_heads, rows, head_size) = (2, 2, rows, 16), got (2, 2, 8, 8)",
            past_key=np.zeros((B, NKV, P, 8), np.float32))
    rejects(ValueError, "past_key: must have rank 4", past_key=np.zeros((B, P, NKV * H), np.float32))
    rejects(ValueError, "past_value: must have past_key's dimension 2 (8 rows), got 7",
            past_value=np.zeros((B, NKV, 7, H), np.float32))
    rejects(ValueError, "seqlens_k: must have shape (batch) = (2,), got (3,)", seqlens_k=np.array([1, 2, 3], np.int32))
    rejects(ValueError, "output: must have shape (batch, sequence_length, num_heads * head_size) = (2, 1, 64), got (2, 1, 63)",
            output=np.full((B, S, 63), np.nan, np.float32))
    rejects(ValueError, "attention_bias: must have shape (batch or 1, num_heads or 1, sequence_length, total_sequence_length)",
            attention_bias=np.zeros((1, 1, 1, 8), np.float32))
    rejects(ValueError, "attention_bias: must have shape", attention_bias=np.zeros((1, 3, 1, 9), np.float32))
    rejects(ValueError, "head_sink: must have shape (num_heads) = (4,), got (2,)", head_sink=np.zeros(2, np.float32))
    rejects(ValueError, "position_ids: must have shape (batch, >= sequence_length)", position_ids=np.zeros((1, 1), np.int64))


def test_head_counts():
    rejects(ValueError, "kv_num_heads: num_heads (4) must be a multiple of kv_num_heads (3)", kv_num_heads=3)
    rejects(ValueError, "num_heads: must be >= 1, got 0", num_heads=0)
    rejects(ValueError, "kv_num_heads: must be >= 1, got -2", kv_num_heads=-2)
    # kv_num_heads = 1 reads key width 16, not 32: the key no longer matches.
    rejects(ValueError, "key: must have shape (batch, sequence_length, kv_num_heads * head_size) = (2, 1, 16)", kv_num_heads=1)
    # Packed QKV whose width does not split into num_heads + 2 * kv_num_heads heads.
    rejects(ValueError, "query: packed QKV: dimension 2 (100) must be a multiple of num_heads + 2 * kv_num_heads = 8",
            query=np.zeros((B, S, 100), np.float32), key=None, value=None)


# ---- lengths -----------------------------------------------------------------------------------------------------

def test_seqlens():
    rejects(ValueError, "seqlens_k[1]: = 20 exceeds the cache capacity 16", shared=True,
            seqlens_k=np.array([5, 20], np.int32), total_sequence_length=np.array(21, np.int32))
    rejects(ValueError, "seqlens_k[1]: = 9: the sequence's 10 tokens exceed total_sequence_length = 9",
            seqlens_k=np.array([5, 9], np.int32))
    rejects(ValueError, "seqlens_k[0]: = -1 must be >= 0", seqlens_k=np.array([-1, 8], np.int32))
    rejects(ValueError, "seqlens_k[0]: = 12 implies 12 earlier tokens but past_key holds only 8 rows",
            seqlens_k=np.array([12, 8], np.int32), total_sequence_length=np.array(13, np.int32),
            present_key=np.full((B, NKV, 13, H), np.nan, np.float32),
            present_value=np.full((B, NKV, 13, H), np.nan, np.float32))
    rejects(ValueError, "past_key: is absent but seqlens_k[0] = 5 implies 5 earlier tokens", past_key=None,
            past_value=None)
    rejects(ValueError, "total_sequence_length: = 0 must be >= 1", total_sequence_length=0)
    rejects(ValueError, "total_sequence_length: must hold one element", total_sequence_length=np.array([9, 9], np.int32))
    rejects(ValueError, "seqlens_k: must be int32 (ONNX Runtime's type M), got int64", seqlens_k=np.array([5, 8], np.int64))
    rejects(ValueError, "total_sequence_length: must be int32", total_sequence_length=np.array(9, np.float32))


# ---- quantized caches --------------------------------------------------------------------------------------------

def test_quantization_scales():
    rejects(ValueError, "k_scale: must hold kv_num_heads * head_size = 32 values for PER_CHANNEL, got shape (1,)",
            quant=True, k_quant_type="PER_CHANNEL")
    rejects(ValueError, "v_scale: must hold 1 value for PER_TENSOR, got shape (32,)", quant=True,
            v_scale=np.full(32, 0.03, np.float32))
    rejects(ValueError, "k_scale[0]: = 0.000000 must be finite and > 0", quant=True, k_scale=np.zeros(1, np.float32))
    rejects(ValueError, "v_scale[0]: = nan must be finite and > 0", quant=True, shared=True,
            v_scale=np.full(1, np.nan, np.float32))
    rejects(ValueError, "k_scale: is required when k_quant_type is not NONE", quant=True, k_scale=None)
    rejects(ValueError, "k_scale: is given but k_quant_type is NONE", k_scale=np.ones(1, np.float32))
    rejects(ValueError, "k_scale: must be float32 (dequantization scales), got float16", quant=True,
            k_scale=np.ones(1, np.float16))
    rejects(ValueError, "kv_cache_bit_width: must be 8 or 4 when k_quant_type or v_quant_type is not NONE, got 0",
            quant=True, kv_cache_bit_width=0)
    rejects(ValueError, "k_quant_type: must be NONE, PER_TENSOR or PER_CHANNEL, got 'INT8'", quant=True, k_quant_type="INT8")
    rejects(ValueError, "past_key: must be float32 (the cache has the query's type), got int8", quant=True,
            k_quant_type="NONE", v_quant_type="NONE", k_scale=None, v_scale=None)
    rejects(ValueError, "past_key: must be int8 (an int8 cache), got float32", k_quant_type="PER_TENSOR",
            kv_cache_bit_width=8, k_scale=np.ones(1, np.float32))
    # int4: (H + 1) / 2 bytes per row.
    rejects(ValueError, "past_key: must have shape (batch, kv_num_heads, rows, (head_size + 1) / 2 bytes) = (2, 2, rows, 8)",
            quant=True, kv_cache_bit_width=4)


# ---- attributes --------------------------------------------------------------------------------------------------

def test_attribute_rules():
    rejects(ValueError, "head_sink: must be absent when smooth_softmax = 1", head_sink=np.zeros(N, np.float32),
            smooth_softmax=1)
    rejects(ValueError, "local_window_size: must be -1 when causal = 0", causal=0, local_window_size=4)
    rejects(ValueError, "local_window_size: must be -1 (off) or >= 1", local_window_size=0)
    rejects(ValueError, "causal: must be 0 or 1, got 2", causal=2)
    rejects(ValueError, "do_rotary: must be 0 or 1, got 3", do_rotary=3)
    rejects(ValueError, "smooth_softmax: must be -1, 0 (off) or 1, got 2", smooth_softmax=2)
    rejects(ValueError, "qk_output: must be 0 (none), 1 (before softmax) or 2 (after softmax), got 3", qk_output=3)
    rejects(ValueError, "softcap: must be finite and >= 0", softcap=-1.0)
    rejects(ValueError, "scale: must be finite", scale=float("inf"))
    rejects(ValueError, "qk_norm_epsilon: must be finite and > 0", qk_norm_epsilon=0.0)
    rejects(ValueError, "sliding_window_cache: = 1 needs local_window_size >= 1", sliding_window_cache=1)
    rejects(ValueError, "config.threads: must be >= 0", threads=-1)
    rejects(ValueError, "output_qk: is given but qk_output = 0", output_qk=np.full((B, N, S, 9), np.nan, np.float32))
    rejects(ValueError, "output_qk: must have shape (batch, num_heads, sequence_length, total_sequence_length) = (2, 4, 1, 9)",
            qk_output=1, output_qk=np.full((B, N, S, 8), np.nan, np.float32))


def test_python_argument_types():
    rejects(TypeError, "num_heads: must be an integer, got str", num_heads="4")
    rejects(TypeError, "scale: must be a real number, got str", scale="0.1")
    rejects(TypeError, "k_quant_type: must be a string", k_quant_type=8)
    rejects(TypeError, "seqlens_k: is required", seqlens_k=None)
    rejects(TypeError, "total_sequence_length: is required", total_sequence_length=None)
    rejects(TypeError, "key: expected an array that supports DLPack or the buffer protocol", key=[[1.0]])
    rejects(TypeError, "query: dtype float64 is not supported", query=np.zeros((B, S, N * H)))
    rejects(TypeError, "attention_bias: dtype complex64 is not supported",
            attention_bias=np.zeros((1, 1, 1, 9), np.complex64))


# ---- types -------------------------------------------------------------------------------------------------------

def test_types():
    rejects(ValueError, "key: must be float32 (the query's type), got float16", key=np.zeros((B, S, NKV * H), np.float16))
    rejects(ValueError, "head_sink: must be float32 (the query's type), got float16", head_sink=np.zeros(N, np.float16))
    # ONNX Runtime takes a float16 cache under float32 queries; the contract keeps caches in the query's type.
    rejects(ValueError, "past_key: must be float32 (the cache has the query's type), got float16",
            past_key=np.zeros((B, NKV, P, H), np.float16), past_value=np.zeros((B, NKV, P, H), np.float16))
    rejects(ValueError, "present_key: must be float32 (the cache has the query's type), got float16",
            present_key=np.zeros((B, NKV, 9, H), np.float16))
    rejects(ValueError, "output: must be float32 (the query's type), got float16", output=np.zeros((B, S, N * H), np.float16))
    rejects(ValueError, "query: must be float32, float16 or bfloat16, got int32", query=np.zeros((B, S, N * H), np.int32))


# ---- rotary, norm, window cache ----------------------------------------------------------------------------------

def test_rotary_and_norm():
    cos = np.ones((16, 8), np.float32)
    rejects(ValueError, "cos_cache: is required when do_rotary = 1", do_rotary=1)
    rejects(ValueError, "sin_cache: cos_cache and sin_cache must both be given", do_rotary=1, cos_cache=cos)
    rejects(ValueError, "cos_cache: holds 8 positions but batch entry 1 needs position 8", shared=True, do_rotary=1,
            cos_cache=cos[:8], sin_cache=cos[:8])
    rejects(ValueError, "position_ids[1][0]: = 99 is outside [0, 16)", shared=True, do_rotary=1, cos_cache=cos,
            sin_cache=cos, position_ids=np.array([[3], [99]], np.int64))
    rejects(ValueError, "cos_cache: dimension 1 (rotary_dim / 2 = 9) must be in [1, head_size / 2 = 8]", do_rotary=1,
            cos_cache=np.ones((16, 9), np.float32), sin_cache=np.ones((16, 9), np.float32))
    rejects(ValueError, "k_norm_weight: q_norm_weight and k_norm_weight must both be given", q_norm_weight=np.ones(H, np.float32))
    rejects(ValueError, "q_norm_weight: must have shape (head_size) = (16,), got (8,)", q_norm_weight=np.ones(8, np.float32),
            k_norm_weight=np.ones(H, np.float32))


def test_window_cache_capacity():
    # A window cache of 8 rows cannot serve a window of 8 keys to a chunk of 2 new tokens (it needs 9 rows).
    kw = base()
    rejects(ValueError, "present_key: sliding_window_cache: batch entry 0 keeps tokens from", local_window_size=8,
            sliding_window_cache=1, query=np.zeros((B, 2, N * H), np.float32), key=np.zeros((B, 2, NKV * H), np.float32),
            value=np.zeros((B, 2, NKV * H), np.float32), seqlens_k=np.array([11, 11], np.int32),
            total_sequence_length=np.array(12, np.int32), present_key=np.full((B, NKV, P, H), np.nan, np.float32),
            present_value=np.full((B, NKV, P, H), np.nan, np.float32), past_key=kw["past_key"], past_value=kw["past_value"])


# ---- buffers -----------------------------------------------------------------------------------------------------

def test_buffers():
    kw = base()
    rejects(ValueError, "present_value: past and present must share memory for both key and value, or for neither",
            present_key=kw["past_key"], past_key=kw["past_key"], past_value=kw["past_value"],
            present_value=np.full((B, NKV, P, H), np.nan, np.float32))
    rejects(ValueError, "present_key: must not overlap past_value", present_key=kw["past_value"], past_key=kw["past_key"],
            past_value=kw["past_value"], present_value=np.full((B, NKV, P, H), np.nan, np.float32),
            seqlens_k=np.array([5, 6], np.int32), total_sequence_length=7)
    rejects(ValueError, "output: must not overlap query", query=kw["output"], output=kw["output"])
    # A present cache that is too short for the sequences.
    rejects(ValueError, "seqlens_k[1]: = 8 exceeds the cache capacity 8", present_key=np.full((B, NKV, P, H), np.nan, np.float32),
            present_value=np.full((B, NKV, P, H), np.nan, np.float32))
    ro = np.full((B, NKV, 9, H), np.nan, np.float32)
    ro.flags.writeable = False
    rejects(ValueError, "present_key: is read-only but is written", present_key=ro)
    wide = np.full((B, S, 2 * N * H), np.nan, np.float32)
    rejects(ValueError, "output: must be C-contiguous (dense row-major)", output=wide[:, :, ::2])
    q = np.zeros((B, N * H, S), np.float32).transpose(0, 2, 1)  # only a length-1 axis moved: dense, accepted
    attnkit.group_query_attention(**dict(base(), query=q))
    rejects(ValueError, "query: must be C-contiguous", query=np.zeros((B, S, 2 * N * H), np.float32)[:, :, :N * H])


def test_a_rejected_call_leaves_the_shared_cache_alone():
    """Rules checked late (per batch entry, per position) still come before the first write into a shared cache."""
    cos = np.ones((16, 8), np.float32)
    for overrides in (dict(seqlens_k=np.array([15, 16], np.int32), total_sequence_length=np.array(17, np.int32)),
                      dict(do_rotary=1, cos_cache=cos, sin_cache=cos, position_ids=np.array([[0], [16]], np.int64)),
                      dict(attention_bias=np.zeros((B, N, S, 8), np.float32)),
                      dict(qk_output=2, output_qk=np.full((B, N, S, 9), np.nan, np.float16))):
        kw = base(shared=True, quant=True)
        kw.update(overrides)
        before = (kw["past_key"].copy(), kw["past_value"].copy(), kw["output"].copy())
        with pytest.raises(ValueError):
            attnkit.group_query_attention(**kw)
        assert np.array_equal(kw["past_key"], before[0]) and np.array_equal(kw["past_value"], before[1])
        assert np.isnan(kw["output"]).all()


# ---- devices -----------------------------------------------------------------------------------------------------
# The query's device picks the backend. These run anywhere: the arrays claim a device (fake_dlpack) but hold host
# memory, and a refused array is never read.

def test_host_query_takes_host_arrays_only():
    from fake_dlpack import FakeDLPack

    kw = base()
    rejects(ValueError, "past_key: lives on cuda:0 but query is on cpu; with a host query every array must be host "
            "memory", past_key=FakeDLPack(kw["past_key"], 2))
    rejects(ValueError, "seqlens_k: lives on cuda:0 but query is on cpu",
            seqlens_k=FakeDLPack(np.array([5, 8], np.int32), 2))
    poisoned = np.full((B, S, N * H), np.nan, np.float32)
    rejects(ValueError, "output: lives on cuda:1 but query is on cpu", output=FakeDLPack(poisoned, 2, 1))
    assert np.isnan(poisoned).all()
    rejects(ValueError, "query: lives on metal:0; attnkit runs on CPU and CUDA arrays only",
            query=FakeDLPack(kw["query"], 8))
    # The small inputs may be any host memory (CUDA pinned host memory is host memory).
    out, _, _ = attnkit.group_query_attention(**dict(kw, seqlens_k=FakeDLPack(kw["seqlens_k"], 3),
                                                     total_sequence_length=FakeDLPack(kw["total_sequence_length"], 1)))
    assert np.isfinite(out).all()


@pytest.mark.skipif("cuda" in attnkit.available_backends(), reason="the CUDA backend is present")
def test_cuda_query_without_the_cuda_backend():
    from fake_dlpack import FakeDLPack

    kw = base()
    rejects(ValueError, "query: is a CUDA array (cuda:0) but ", query=FakeDLPack(kw["query"], 2))
    with pytest.raises(ValueError, match=r"query: is a CUDA array \(cuda:0\) but (this build of attnkit has no CUDA "
                                         r"backend|attnkit's CUDA backend finds no usable CUDA device)"):
        attnkit.group_query_attention(**dict(kw, query=FakeDLPack(kw["query"], 2)))
