"""attnkit.attention with backend="vulkan" on NumPy arrays against the float64 reference: dense calls, ragged
batches (attention_varlen) and paged K/V (block_table), with their bad values refused by name (skipped without a
Vulkan device; CI runs it on lavapipe)."""

import numpy as np
import pytest

import attnkit
from conftest import DTYPES, TOLERANCE
from reference import attention_ref, paged_entry_kv, scaled_error

pytestmark = pytest.mark.skipif("vulkan" not in attnkit.available_backends(), reason="no Vulkan device")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_vulkan_matches_the_reference(randn, dtype, layout):
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 9, 300, 40
    shape = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
    q, k, v = randn(shape(H, Sq), dtype), randn(shape(Hkv, Sk), dtype), randn(shape(Hkv, Sk), dtype)
    out, lse = attnkit.attention(q, k, v, layout=layout, causal=True, return_lse=True, backend="vulkan")
    view = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(0, 2, 1, 3))
    ref_out, ref_lse = attention_ref(view(q), view(k), view(v), causal=True)
    assert out.dtype == q.dtype
    assert scaled_error(view(out), ref_out) <= TOLERANCE[str(q.dtype)]
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    again = attnkit.attention(q, k, v, layout=layout, causal=True, backend="vulkan")
    assert np.array_equal(out, again)


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


# The scalar kernel, and float16 on the matrix kernel (the plan's choice for it on a device with cooperative
# matrices; the emulated build elsewhere), whose LSE is within float16's bound: it sums the rounded probabilities.
@pytest.mark.parametrize("dtype,kernel", [(d, "rows") for d in DTYPES] + [("float16", "coopmat")])
def test_vulkan_varlen_matches_each_sequence_alone(rng, randn, dtype, kernel):
    H, Hkv, D = 4, 2, 32
    plan = "kernel=" + kernel
    lse_tolerance = 1e-5 if kernel == "rows" else TOLERANCE[dtype]
    q_lens, k_lens = np.array([0, 1, 30, 9, 17]), np.array([12, 40, 7, 0, 25])  # (30 queries over 7 keys)
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    q = randn((cu_q[-1] + 2, H, D), dtype)  # two rows past the last sequence: never written
    k, v = randn((cu_k[-1], Hkv, D), dtype), randn((cu_k[-1], Hkv, D), dtype)
    out = np.full((q.shape[0], H, D), 7.0, dtype=q.dtype)
    o, lse = attnkit.attention_varlen(q, k, v, cu_q, cu_k, 30, 40, causal=True, return_lse=True, out=out,
                                      backend="vulkan", plan=plan)
    assert o is out and lse.shape == (H, q.shape[0])
    for b in range(5):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref, ref_lse = attention_ref(q[qs].transpose(1, 0, 2)[None], k[ks].transpose(1, 0, 2)[None],
                                     v[ks].transpose(1, 0, 2)[None], causal=True)
        assert scaled_error(o[qs].transpose(1, 0, 2)[None], ref) <= TOLERANCE[dtype], f"sequence {b}"
        seen = np.isfinite(ref_lse[0])
        np.testing.assert_allclose(lse[:, qs][seen], ref_lse[0][seen], rtol=lse_tolerance, atol=lse_tolerance)
    assert (o[cu_q[-1]:].astype(np.float32) == 7.0).all(), "rows past the sequences were written"
    again = attnkit.attention_varlen(q, k, v, cu_q, cu_k, 30, 40, causal=True, backend="vulkan", plan=plan)
    assert np.array_equal(o[:cu_q[-1]], again[:cu_q[-1]], equal_nan=True)


@pytest.mark.parametrize("page_size", [1, 5])
@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_vulkan_paged_attention_matches_dense(rng, randn, page_size, kv_layout):
    B, H, Hkv, D, Sq = 3, 4, 2, 16, 2
    k_lens = np.array([9, 23, 2])
    max_pages = (k_lens.max() + page_size - 1) // page_size + 1
    num_pages = B * max_pages + 2
    pages = rng.permutation(num_pages).astype(np.int32)
    table = np.full((B, max_pages), -1, np.int32)
    for b in range(B):
        n = (k_lens[b] + page_size - 1) // page_size
        table[b, :n] = pages[b * max_pages: b * max_pages + n]
    table[1, 0] = table[0, 0]  # two sequences sharing their first page
    shape = (num_pages, page_size, Hkv, D) if kv_layout == "nhd" else (num_pages, Hkv, page_size, D)
    k_pages, v_pages = randn(shape, "float16"), randn(shape, "float16")
    q = randn((B, H, Sq, D), "float16")
    o = attnkit.attention(q, k_pages, v_pages, block_table=table, key_lengths=k_lens.astype(np.int32), causal=True,
                          kv_layout=kv_layout, backend="vulkan")
    for b in range(B):
        kd, vd = paged_entry_kv(k_pages, v_pages, table, b, k_lens[b], page_size, kv_layout)
        ref, _ = attention_ref(q[b:b + 1], kd[None], vd[None], causal=True)
        assert scaled_error(o[b:b + 1], ref) <= TOLERANCE["float16"], f"entry {b}"


def test_vulkan_bad_sequences_are_rejected_by_name(randn):
    q, k, v = randn((6, 2, 8)), randn((9, 2, 8)), randn((9, 2, 8))
    good_q, good_k = np.array([0, 2, 6], np.int32), np.array([0, 4, 9], np.int32)
    out = np.full((6, 2, 8), 3.0, np.float32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q\[2\]: "):
        attnkit.attention_varlen(q, k, v, np.array([0, 4, 2], np.int32), good_k, 4, 5, out=out, backend="vulkan")
    with pytest.raises(ValueError, match=r"^block_table\[0\]: "):
        attnkit.attention_varlen(q, randn((2, 4, 2, 8)), randn((2, 4, 2, 8)), good_q, good_k, 4, 5,
                                 block_table=np.array([[5, 0], [0, 1]], np.int32), out=out, backend="vulkan")
    with pytest.raises(ValueError, match=r"^config\.plan\.kernel: "):
        attnkit.attention_varlen(q, k, v, good_q, good_k, 4, 5, out=out, backend="vulkan", plan="kernel=coopmat")
    assert (out == 3.0).all(), "an output was written before the error"
