"""attnkit.attention against the NumPy float64 reference: dtypes, layouts, views, masks, options, outputs."""

import numpy as np
import pytest

import attnkit
from conftest import CPU_LSE_TOLERANCE, DTYPES, TOLERANCE, np_dtype
from reference import attention_ref, scaled_error


def bhsd(x, layout):
    """The head-first view of a Q/K/V/O array given in `layout`."""
    return x if layout == "bhsd" else x.transpose(0, 2, 1, 3)


def check(out, q, k, v, layout="bhsd", lse=None, **options):
    ref_out, ref_lse = attention_ref(bhsd(q, layout), bhsd(k, layout), bhsd(v, layout), **options)
    tol = TOLERANCE[str(q.dtype)]
    err = scaled_error(bhsd(out, layout), ref_out)
    assert err <= tol, f"scaled error {err:.3g} over {tol:g}"
    if lse is not None:
        assert lse.dtype == np.float32 and lse.shape == ref_lse.shape
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
        finite = np.isfinite(ref_lse)
        lse_tol = CPU_LSE_TOLERANCE[str(q.dtype)]
        np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=lse_tol, atol=lse_tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_dtypes_layouts_grouped_heads(randn, dtype, layout, heads, kv_heads):
    B, Sq, Sk, D, Dv = 2, 7, 19, 16, 24
    shape = (lambda h, s, d: (B, h, s, d)) if layout == "bhsd" else (lambda h, s, d: (B, s, h, d))
    q, k, v = randn(shape(heads, Sq, D), dtype), randn(shape(kv_heads, Sk, D), dtype), randn(shape(kv_heads, Sk, Dv), dtype)
    out = attnkit.attention(q, k, v, layout=layout)
    assert type(out) is np.ndarray and out.dtype == q.dtype and out.shape == shape(heads, Sq, Dv)
    assert out.flags.c_contiguous
    check(out, q, k, v, layout)


@pytest.mark.parametrize("backend", ["cpu", "reference", "auto"])
def test_backends_agree(randn, backend):
    q, k, v = randn((2, 3, 33, 40)), randn((2, 3, 70, 40)), randn((2, 3, 70, 40))
    out = attnkit.attention(q, k, v, backend=backend, causal=True)
    check(out, q, k, v, causal=True)


def test_threads_do_not_change_the_result(randn):
    q, k, v = randn((1, 2, 64, 32)), randn((1, 2, 300, 32)), randn((1, 2, 300, 32))
    one = attnkit.attention(q, k, v, threads=1)
    assert np.array_equal(one, attnkit.attention(q, k, v))
    assert np.array_equal(one, attnkit.attention(q, k, v, threads=2))
    assert "cpu" in attnkit.available_backends() and "reference" in attnkit.available_backends()


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views(randn, dtype):
    # Steps in batch, head and sequence; a padded head dimension; an offset into a larger buffer.
    big_q = randn((5, 7, 30, 24), dtype)
    big_kv = randn((4, 3, 50, 2, 32), dtype)
    q = big_q[1::2, ::3, 2::3, 3:19]        # (2, 3, 10, 16), every stride non-trivial
    k = big_kv[::2, :, 1::2, 0, :16]        # (2, 3, 25, 16)
    v = big_kv[1::2, :, ::2, 1, 8:28]       # (2, 3, 25, 20)
    for x, base in ((q, big_q), (k, big_kv), (v, big_kv)):
        assert np.shares_memory(x, base) and not x.flags.c_contiguous
    out = attnkit.attention(q, k, v)
    check(out, q, k, v)


def test_transposed_views_are_taken_as_layouts(randn):
    # A positions-first array read head-first through its transpose, and the other way round.
    q_pf, k_pf, v_pf = randn((2, 9, 4, 8)), randn((2, 11, 2, 8)), randn((2, 11, 2, 8))
    out = attnkit.attention(q_pf.transpose(0, 2, 1, 3), k_pf.transpose(0, 2, 1, 3), v_pf.transpose(0, 2, 1, 3))
    check(out.transpose(0, 2, 1, 3), q_pf, k_pf, v_pf, layout="bshd")
    same = attnkit.attention(q_pf, k_pf, v_pf, layout="bshd")
    np.testing.assert_allclose(same, out.transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)
    # Fortran-ordered arrays have a contiguous first axis only: swap the axes so the rows are contiguous.
    qf = np.asfortranarray(randn((8, 5, 3, 2))).transpose(3, 2, 1, 0)  # (2, 3, 5, 8), stride 1 on the last axis
    out = attnkit.attention(qf, qf, qf)
    check(out, qf, qf, qf)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_qkv_slices(randn, dtype, kv_heads):
    B, S, H, D = 2, 13, 4, 16
    qkv = randn((B, S, (H + 2 * kv_heads) * D), dtype)  # one projection, per token [Q heads | K heads | V heads]
    heads = qkv.reshape(B, S, H + 2 * kv_heads, D)
    q, k, v = heads[:, :, :H], heads[:, :, H:H + kv_heads], heads[:, :, H + kv_heads:]
    q2 = qkv[:, :, :H * D].reshape(B, S, H, D)  # the same Q, sliced before the reshape
    for x in (q, k, v, q2):
        assert np.shares_memory(x, qkv)
    out = attnkit.attention(q, k, v, layout="bshd", causal=True)
    check(out, q, k, v, layout="bshd", causal=True)
    assert np.array_equal(out, attnkit.attention(q2, k, v, layout="bshd", causal=True))
    # Head-first reads of the packed slices too.
    out = attnkit.attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
    check(out.transpose(0, 2, 1, 3), q, k, v, layout="bshd")

@pytest.mark.parametrize("mask_shape", [(2, 3, 6, 9), (2, 1, 1, 9), (1, 3, 6, 9), (6, 9), (9,), (2, 1, 6, 9), (1, 1, 1, 9)])
def test_broadcast_masks(randn, rng, mask_shape):
    q, k, v = randn((2, 3, 6, 8)), randn((2, 3, 9, 8)), randn((2, 3, 9, 8))
    mask = randn(mask_shape)
    mask[rng.random(mask_shape) < 0.2] = -np.inf
    out = attnkit.attention(q, k, v, mask=mask, masked_rows="zero")
    check(out, q, k, v, mask=mask, masked_rows="zero")


def test_strided_and_broadcast_to_masks(randn):
    q, k, v = randn((2, 3, 6, 8)), randn((2, 3, 9, 8)), randn((2, 3, 9, 8))
    big = randn((4, 3, 12, 20))
    mask = big[::2, :, 1::2, 5:14]  # a strided view
    out = attnkit.attention(q, k, v, mask=mask)
    check(out, q, k, v, mask=mask)
    shared = np.broadcast_to(randn((1, 1, 6, 9)), (2, 3, 6, 9))  # stride-0 dimensions, read-only
    out = attnkit.attention(q, k, v, mask=shared)
    check(out, q, k, v, mask=shared)


@pytest.mark.parametrize("masked_rows", ["nan", "zero"])
def test_key_lengths_and_masked_rows(randn, masked_rows):
    q, k, v = randn((4, 2, 5, 8)), randn((4, 2, 11, 8)), randn((4, 2, 11, 8))
    lengths = np.array([11, 0, 3, 7], dtype=np.int32)
    mask = np.zeros((4, 1, 5, 11), np.float32)
    mask[2, :, 1, :] = -np.inf  # one fully hidden row in batch entry 2
    out, lse = attnkit.attention(q, k, v, key_lengths=lengths, mask=mask, masked_rows=masked_rows, return_lse=True)
    check(out, q, k, v, lse=lse, key_lengths=lengths, mask=mask, masked_rows=masked_rows)
    fill = np.isnan if masked_rows == "nan" else (lambda x: x == 0)
    assert fill(out[1]).all() and fill(out[2, :, 1]).all()
    assert np.isneginf(lse[1]).all()


@pytest.mark.parametrize("q_len,k_len,offset", [(9, 9, None), (4, 17, None), (17, 4, None), (6, 10, 2), (6, 10, -3),
                                                (1, 30, None)])
@pytest.mark.parametrize("window", [None, 1, 5])
def test_causal_offset_window(randn, q_len, k_len, offset, window):
    q, k, v = randn((2, 2, q_len, 16)), randn((2, 2, k_len, 16)), randn((2, 2, k_len, 16))
    out, lse = attnkit.attention(q, k, v, causal=True, causal_offset=offset, window=window, masked_rows="zero",
                                 return_lse=True)
    check(out, q, k, v, lse=lse, causal=True, causal_offset=offset, window=window, masked_rows="zero")


def test_per_batch_causal_offsets(randn):
    q, k, v = randn((3, 2, 4, 16)), randn((3, 2, 12, 16)), randn((3, 2, 12, 16))
    offsets = np.array([8, 0, -2], dtype=np.int32)
    lengths = np.array([12, 5, 9], dtype=np.int32)
    out = attnkit.attention(q, k, v, causal=True, causal_offset=offsets, key_lengths=lengths, window=6,
                            masked_rows="zero")
    check(out, q, k, v, causal=True, causal_offset=offsets, key_lengths=lengths, window=6, masked_rows="zero")
    # Equal per-batch offsets are the scalar offset.
    same = attnkit.attention(q, k, v, causal=True, causal_offset=np.full(3, 3, np.int32))
    assert np.array_equal(same, attnkit.attention(q, k, v, causal=True, causal_offset=3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_scale_sink(randn, dtype):
    q, k, v = randn((2, 4, 9, 32), dtype, std=3.0), randn((2, 2, 14, 32), dtype, std=3.0), randn((2, 2, 14, 32), dtype)
    sink = randn((4,))
    opts = dict(softcap=5.0, scale=0.3, head_sink=sink, causal=True, causal_offset=-2)
    out, lse = attnkit.attention(q, k, v, return_lse=True, **opts)
    check(out, q, k, v, lse=lse if dtype == "float32" else None, **opts)
    # Rows 0 and 1 see no key but have a sink: zeros, and the LSE is the sink itself.
    assert (np.asarray(out[:, :, :2], np.float64) == 0).all()
    np.testing.assert_allclose(lse[:, :, 0], np.broadcast_to(sink, (2, 4)), rtol=1e-6)


def test_return_lse_bshd(randn):
    q, k, v = randn((2, 7, 3, 8)), randn((2, 12, 3, 8)), randn((2, 12, 3, 8))
    out, lse = attnkit.attention(q, k, v, layout="bshd", return_lse=True)
    assert lse.shape == (2, 3, 7)  # [B, H, Sq] whatever the layout
    check(out, q, k, v, layout="bshd", lse=lse)


def test_empty_keys_and_queries(randn):
    q, k = randn((1, 2, 3, 8)), randn((1, 2, 0, 8))
    out, lse = attnkit.attention(q, k, k, return_lse=True)
    assert np.isnan(out).all() and np.isneginf(lse).all()
    out = attnkit.attention(randn((1, 2, 0, 8)), randn((1, 2, 5, 8)), randn((1, 2, 5, 4)))
    assert out.shape == (1, 2, 0, 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_out_buffer(randn, dtype, layout):
    q, k, v = randn((2, 3, 5, 8), dtype), randn((2, 3, 6, 8), dtype), randn((2, 3, 6, 8), dtype)
    if layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3).copy() for x in (q, k, v))
    out = np.full(q.shape, 7.0, dtype=np_dtype(dtype))
    result = attnkit.attention(q, k, v, out=out, layout=layout)
    assert result is out
    check(out, q, k, v, layout)
    # A strided out inside a bigger buffer: every element outside the view stays as it was.
    big = np.full((2, 3, 11, 20), 9.0, dtype=np_dtype(dtype)) if layout == "bhsd" else \
        np.full((2, 11, 3, 20), 9.0, dtype=np_dtype(dtype))
    view = big[:, :, 1::2, 4:12] if layout == "bhsd" else big[:, 1::2, :, 4:12]
    result, lse = attnkit.attention(q, k, v, out=view, layout=layout, return_lse=True)
    assert result is view
    check(view, q, k, v, layout, lse=lse if dtype == "float32" else None)
    rest = np.ones(big.shape, bool)
    rest[(slice(None), slice(None), slice(1, None, 2), slice(4, 12)) if layout == "bhsd" else
         (slice(None), slice(1, None, 2), slice(None), slice(4, 12))] = False
    assert (np.asarray(big, np.float64)[rest] == 9.0).all()


def test_read_only_inputs(randn):
    q, k, v = randn((1, 2, 4, 8)), randn((1, 2, 4, 8)), randn((1, 2, 4, 8))
    for x in (q, k, v):
        x.flags.writeable = False
    check(attnkit.attention(q, k, v), q, k, v)


def test_broadcast_kv_batch_is_a_shape_error(randn):
    # K/V must have q's batch size (no implicit broadcasting of the batch dimension).
    with pytest.raises(ValueError, match="k: batch"):
        attnkit.attention(randn((2, 2, 4, 8)), randn((1, 2, 4, 8)), randn((1, 2, 4, 8)))
