"""Rejected calls: each raises ValueError/TypeError with the library's "argument: rule" message and writes nothing."""

import re

import numpy as np
import pytest

import attnkit
from conftest import np_dtype
from fake_dlpack import FakeDLPack as _FakeDLPack

POISON = 1234.5


@pytest.fixture
def inputs(randn):
    """q, k, v [2, 4, 6, 8] float32 (k/v with 2 heads) and a poisoned out."""
    q, k, v = randn((2, 4, 6, 8)), randn((2, 2, 10, 8)), randn((2, 2, 10, 8))
    return q, k, v


def rejects(exc, message, q, k, v, **kwargs):
    """Runs a call that must fail with `exc` matching `message`, into a poisoned out that must stay poisoned."""
    out = kwargs.pop("out", None)
    if out is None:
        out = np.full((2, 4, 6, 8), POISON, np.float32)  # what the `inputs` fixture gives
    before = np.array(out, copy=True)
    with pytest.raises(exc, match=re.escape(message)):
        attnkit.attention(q, k, v, out=out, **kwargs)
    assert np.array_equal(np.asarray(out), before, equal_nan=True), "a rejected call wrote into out"


def test_shapes(inputs, randn):
    q, k, v = inputs
    rejects(ValueError, "q: must be 4-D [B, H, S, D]", q[0], k, v)
    rejects(ValueError, "k: must be 4-D [B, S, H, D] (layout \"bshd\")", q, k[0], v, layout="bshd")
    rejects(ValueError, "k: head_dim (dimension 3) is 9 but q gives 8", q, randn((2, 2, 10, 9)), v)
    rejects(ValueError, "v: k_len (dimension 2) is 9 but k gives 10", q, k, randn((2, 2, 9, 8)))
    rejects(ValueError, "v: heads (dimension 1) is 1 but k gives 2", q, k, randn((2, 1, 10, 8)))
    rejects(ValueError, "k: batch (dimension 0) is 1 but q gives 2", q, k[:1], v)
    rejects(ValueError, "out: shape (2, 4, 6, 7) must be (2, 4, 6, 8)", q, k, v, out=np.zeros((2, 4, 6, 7), np.float32))


def test_library_rules(inputs, randn):
    q, k, v = inputs
    # These come from the C++ checks (attnkit::Error), message and all.
    rejects(ValueError, "kv_heads: heads (4) must be a multiple of kv_heads (3)", q, randn((2, 3, 10, 8)),
            randn((2, 3, 10, 8)))
    big = randn((1, 1, 2, 300))
    with pytest.raises(ValueError, match=re.escape("head_dim: must be in [1, 256] (got 300)")):
        attnkit.attention(big, big, big)
    rejects(ValueError, "window: a sliding window needs causal = true", q, k, v, window=3)
    rejects(ValueError, "window: must be >= 1 when set (got 0)", q, k, v, causal=True, window=0)
    rejects(ValueError, "softcap: must be finite and > 0 when set", q, k, v, softcap=-1.0)
    rejects(ValueError, "scale: must be finite", q, k, v, scale=float("nan"))
    rejects(ValueError, "config.threads: must be >= 0", q, k, v, threads=-1)
    # Checked when the op runs, before anything is written.
    rejects(ValueError, "key_lengths[1]: = 11 is outside [0, k_len = 10]", q, k, v,
            key_lengths=np.array([3, 11], np.int32))
    rejects(ValueError, "key_lengths[0]: = -1 is outside", q, k, v, key_lengths=np.array([-1, 2], np.int32))


def test_options(inputs):
    q, k, v = inputs
    rejects(ValueError, "masked_rows: must be \"nan\" or \"zero\", got \"inf\"", q, k, v, masked_rows="inf")
    rejects(ValueError, "layout: must be \"bhsd\"", q, k, v, layout="sbhd")
    rejects(ValueError, "backend: must be \"auto\", \"cpu\", \"reference\", \"cuda\" or \"vulkan\", got \"gpu\"", q, k, v,
            backend="gpu")
    rejects(ValueError, "causal_offset: is set but causal is False", q, k, v, causal_offset=1)
    rejects(ValueError, "backend: \"cuda\" runs CUDA arrays, but q is on cpu", q, k, v, backend="cuda")
    rejects(TypeError, "window: must be an integer or None, got float", q, k, v, causal=True, window=2.5)
    rejects(TypeError, "scale: must be a real number or None, got str", q, k, v, scale="0.1")
    rejects(TypeError, "layout: must be one of", q, k, v, layout=1)


def test_dtypes(inputs, randn):
    q, k, v = inputs
    rejects(TypeError, "q: dtype float64 is not supported", q.astype(np.float64), k, v)
    rejects(TypeError, "k: dtype float16 does not match q's dtype float32", q, k.astype(np.float16), v)
    rejects(TypeError, "v: dtype int32 does not match q's dtype float32", q, k, v.astype(np.int32))
    rejects(TypeError, "out: dtype float16 does not match q's dtype float32", q, k, v,
            out=np.full((2, 4, 6, 8), POISON, np.float16))
    rejects(TypeError, "mask: dtype float64 is not supported: the mask is float32", q, k, v,
            mask=np.zeros((6, 10)))
    rejects(TypeError, "mask: dtype uint8 is not supported", q, k, v, mask=np.ones((6, 10), np.uint8))
    rejects(TypeError, "key_lengths: dtype int16 is not supported: key_lengths is int32", q, k, v,
            key_lengths=np.array([1, 2], np.int16))  # int64 is taken (test_inputs.py)
    rejects(TypeError, "head_sink: dtype float64 is not supported", q, k, v, head_sink=np.zeros(4))
    rejects(TypeError, "causal_offset: dtype int64 is not supported: per-batch causal offsets are int32", q, k, v,
            causal=True, causal_offset=np.array([1, 2]))
    rejects(TypeError, "causal_offset: must be an integer, an int32 array [B] or None, got float", q, k, v,
            causal=True, causal_offset=1.5)
    bf16 = np_dtype("bfloat16")
    rejects(TypeError, "k: dtype bfloat16 does not match q's dtype float32", q, k.astype(bf16), v)
    rejects(TypeError, "q: dtype complex64 is not supported", q.astype(np.complex64), k, v)


def test_not_arrays(inputs):
    q, k, v = inputs
    rejects(TypeError, "q: expected an array that supports DLPack or the buffer protocol", q.tolist(), k, v)
    rejects(TypeError, "v: expected an array that supports DLPack or the buffer protocol", q, k, "v")
    rejects(TypeError, "mask: expected an array", q, k, v, mask=0.0)


def test_strides_are_never_copied(inputs, randn):
    q, k, v = inputs
    wide = randn((2, 4, 6, 16))
    rejects(ValueError, "q: the last dimension must be contiguous (stride 1 element), got stride 2", wide[..., ::2], k, v)
    rejects(ValueError, "q: stride -8 of dimension 2 is negative", q[:, :, ::-1], k, v)
    rejects(ValueError, "k: stride -80 of dimension 1 is negative", q, k[:, ::-1], v)
    rejects(ValueError, "mask: the last dimension must be contiguous", q, k, v, mask=randn((10, 6)).T)
    # A Fortran-ordered array has stride 1 on its first axis only.
    rejects(ValueError, "v: the last dimension must be contiguous", q, k, np.asfortranarray(v))
    # A misaligned float32 view of a byte buffer.
    raw = np.zeros(2 * 4 * 6 * 8 * 4 + 1, np.uint8)
    odd = raw[1:].view(np.float32).reshape(2, 4, 6, 8)
    rejects(ValueError, "q: data is not aligned to its 4-byte elements", odd, k, v)


def test_masks_and_vectors(inputs, randn):
    q, k, v = inputs
    rejects(ValueError, "mask: shape (3, 10) does not broadcast to [batch, heads, q_len, k_len] = (2, 4, 6, 10)", q, k,
            v, mask=randn((3, 10)))
    rejects(ValueError, "mask: the last dimension must be k_len = 10 (the key dimension does not broadcast)", q, k, v,
            mask=randn((2, 4, 6, 1)))
    rejects(ValueError, "mask: must have 1 to 4 dimensions", q, k, v, mask=randn((1, 2, 4, 6, 10)))
    rejects(ValueError, "key_lengths: must be 1-D of length 2", q, k, v, key_lengths=np.zeros(3, np.int32))
    rejects(ValueError, "head_sink: must be 1-D of length 4", q, k, v, head_sink=np.zeros((2,), np.float32))
    rejects(ValueError, "causal_offset: must be 1-D of length 2", q, k, v, causal=True,
            causal_offset=np.zeros((1, 2), np.int32))
    rejects(ValueError, "causal_offset: is set but causal is False", q, k, v, causal_offset=np.zeros(2, np.int32))
    rejects(ValueError, "key_lengths: the last dimension must be contiguous", q, k, v,
            key_lengths=np.array([1, 0, 2, 0], np.int32)[::2])


def test_bad_out(inputs):
    q, k, v = inputs
    ro = np.full((2, 4, 6, 8), POISON, np.float32)
    ro.flags.writeable = False
    rejects(ValueError, "out: is read-only but is written", q, k, v, out=ro)
    rejects(ValueError, "out: is read-only", q, k, v, out=np.broadcast_to(np.float32(POISON), (2, 4, 6, 8)))
    # A writable out whose elements share addresses (stride 0): the library refuses it.
    base = np.full((2, 1, 6, 8), POISON, np.float32)
    shared = np.lib.stride_tricks.as_strided(base, shape=(2, 4, 6, 8), strides=(base.strides[0], 0) + base.strides[2:])
    rejects(ValueError, "o.head_stride: an output's elements must not share addresses", q, k, v, out=shared)
    assert (base == POISON).all()
    # An out that aliases an input.
    q_copy = np.array(q)
    with pytest.raises(ValueError, match=re.escape("o: must not overlap q")):
        attnkit.attention(q_copy, q_copy, q_copy, out=q_copy)
    assert np.array_equal(q_copy, q)
    rejects(ValueError, "out: the last dimension must be contiguous", q, k, v,
            out=np.full((2, 4, 6, 16), POISON, np.float32)[..., ::2])


def test_fake_dlpack_host_producer_works(inputs):
    q, k, v = inputs
    out = attnkit.attention(_FakeDLPack(q, 1), _FakeDLPack(k, 1), _FakeDLPack(v, 1))
    np.testing.assert_array_equal(out, attnkit.attention(q, k, v))


@pytest.mark.skipif("cuda" in attnkit.available_backends(), reason="the CUDA backend is present")
def test_device_arrays_are_refused_without_cuda(inputs):
    q, k, v = inputs
    # Says whether the backend is missing from the build or finds no device.
    with pytest.raises(ValueError, match=r"q: is a CUDA array \(cuda:0\) but (this build of attnkit has no CUDA "
                                         r"backend|attnkit's CUDA backend finds no usable CUDA device); pass a CPU array"):
        attnkit.attention(_FakeDLPack(q, 2), _FakeDLPack(k, 2), _FakeDLPack(v, 2))
    rejects(ValueError, "k: lives on metal:1; attnkit runs on CPU and CUDA arrays only", q, _FakeDLPack(k, 8, 1), v)
