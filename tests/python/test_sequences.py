"""attnkit.attention_varlen and attnkit.attention(..., block_table=...): ragged batches and paged K/V caches, each
sequence checked against the float64 NumPy oracle of that sequence alone."""

import numpy as np
import pytest

import attnkit
from conftest import CPU_LSE_TOLERANCE, DTYPES, TOLERANCE, np_dtype
from reference import attention_ref, paged_entry_kv, scaled_error


def _lengths(rng, n, longest):
    lens = rng.integers(0, longest + 1, n)
    lens[:3] = [0, 1, longest]  # an empty sequence, a one-row one, the longest
    return lens


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_each_sequence_alone(rng, randn, dtype, causal):
    H, Hkv, D = 4, 2, 32
    q_lens, k_lens = _lengths(rng, 5, 40), _lengths(rng, 5, 90)
    k_lens[[0, 4]] = k_lens[[4, 0]]
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    q = randn((cu_q[-1] + 2, H, D), dtype)  # two rows past the last sequence: never written
    k, v = randn((cu_k[-1], Hkv, D), dtype), randn((cu_k[-1], Hkv, D), dtype)
    out = np.full((q.shape[0], H, D), 7.0, dtype=np_dtype(dtype))
    o, lse = attnkit.attention_varlen(q, k, v, cu_q, cu_k, int(q_lens.max()), int(k_lens.max()), causal=causal,
                                      return_lse=True, out=out)
    assert o is out and lse.shape == (H, q.shape[0])
    for b in range(5):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref, ref_lse = attention_ref(q[qs].transpose(1, 0, 2)[None], k[ks].transpose(1, 0, 2)[None],
                                     v[ks].transpose(1, 0, 2)[None], causal=causal)
        assert scaled_error(o[qs].transpose(1, 0, 2)[None], ref) <= TOLERANCE[dtype], f"sequence {b}"
        finite = np.isfinite(ref_lse[0])
        lse_tol = CPU_LSE_TOLERANCE[dtype]
        assert np.allclose(lse[:, qs][finite], ref_lse[0][finite], rtol=lse_tol, atol=lse_tol)
    assert (o[cu_q[-1]:].astype(np.float32) == 7.0).all(), "rows past the sequences were written"


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_paged_decode_and_chunks_match_dense(rng, randn, page_size, kv_layout):
    B, H, Hkv, D, Sq = 4, 8, 2, 64, 3
    k_lens = _lengths(rng, B, 70)
    k_lens[0] = 4  # (every entry needs a key for its causal chunk of 3 queries to see one)
    max_pages = (k_lens.max() + page_size - 1) // page_size + 1
    num_pages = B * max_pages + 2
    pages = rng.permutation(num_pages).astype(np.int32)
    table = np.full((B, max_pages), -1, np.int32)
    for b in range(B):
        n = (k_lens[b] + page_size - 1) // page_size
        table[b, :n] = pages[b * max_pages: b * max_pages + n]
    shape = (num_pages, page_size, Hkv, D) if kv_layout == "nhd" else (num_pages, Hkv, page_size, D)
    k_pages, v_pages = randn(shape, "float16"), randn(shape, "float16")
    q = randn((B, H, Sq, D), "float16")
    o = attnkit.attention(q, k_pages, v_pages, block_table=table, key_lengths=k_lens.astype(np.int64), causal=True,
                          kv_layout=kv_layout)
    assert o.shape == (B, H, Sq, D)
    for b in range(B):
        kd, vd = paged_entry_kv(k_pages, v_pages, table, b, k_lens[b], page_size, kv_layout)
        ref, _ = attention_ref(q[b:b + 1], kd[None], vd[None], causal=True)
        assert scaled_error(o[b:b + 1], ref) <= TOLERANCE["float16"], f"entry {b}"


def test_varlen_against_pages_equals_varlen_against_packed_keys(rng, randn):
    H, Hkv, D, page = 4, 4, 16, 8
    q_lens, k_lens = _lengths(rng, 4, 20), _lengths(rng, 4, 50)
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    q, k, v = randn((cu_q[-1], H, D)), randn((cu_k[-1], Hkv, D)), randn((cu_k[-1], Hkv, D))
    packed = attnkit.attention_varlen(q, k, v, cu_q, cu_k, 20, 50, causal=True)
    max_pages = 50 // page + 1
    k_pages = np.zeros((4 * max_pages, page, Hkv, D), np.float32)
    v_pages = np.zeros_like(k_pages)
    table = np.zeros((4, max_pages), np.int32)
    order = rng.permutation(4 * max_pages)
    for b in range(4):
        for j in range(k_lens[b]):
            p = order[b * max_pages + j // page]
            table[b, j // page] = p
            k_pages[p, j % page], v_pages[p, j % page] = k[cu_k[b] + j], v[cu_k[b] + j]
    paged = attnkit.attention_varlen(q, k_pages, v_pages, cu_q, cu_k, 20, 50, causal=True, block_table=table)
    np.testing.assert_allclose(paged, packed, rtol=0, atol=2e-6)


def test_bad_sequences_are_rejected_by_name(randn):
    q, k, v = randn((6, 2, 8)), randn((9, 2, 8)), randn((9, 2, 8))
    good_q, good_k = np.array([0, 2, 6], np.int32), np.array([0, 4, 9], np.int32)
    out = np.full((6, 2, 8), 3.0, np.float32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q\[2\]: "):
        attnkit.attention_varlen(q, k, v, np.array([0, 4, 2], np.int32), good_k, 4, 5, out=out)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k\[2\]: "):
        attnkit.attention_varlen(q, k, v, good_q, good_k, 4, 4, out=out)  # sequence 1 has 5 keys
    with pytest.raises(ValueError, match=r"^block_table\[0\]: "):
        attnkit.attention_varlen(q, randn((2, 4, 2, 8)), randn((2, 4, 2, 8)), good_q, good_k, 4, 5,
                                 block_table=np.array([[5, 0], [0, 1]], np.int32), out=out)
    with pytest.raises(ValueError, match=r"^q: must be 3-D"):
        attnkit.attention_varlen(q[None], k, v, good_q, good_k, 4, 5)
    with pytest.raises(ValueError, match=r"^backend: "):
        attnkit.attention_varlen(q, k, v, good_q, good_k, 4, 5, backend="cuda")
    assert (out == 3.0).all(), "an output was written before the error"


def test_misspelt_flags_are_refused(rng, randn):
    cu = np.array([0, 3], np.int32)
    q = k = v = randn((3, 2, 16), "float32")
    with pytest.raises(ValueError, match="^kv_layout: must be 'nhd' or 'hnd'"):
        attnkit.attention_varlen(q, k, v, cu, cu, 3, 3, kv_layout="bshd")
    with pytest.raises(ValueError, match="^masked_rows: must be 'nan' or 'zero'"):
        attnkit.attention_varlen(q, k, v, cu, cu, 3, 3, masked_rows="zeros")


def test_torch_compile_of_ragged_and_paged_calls(rng, randn):
    torch = pytest.importorskip("torch")
    H, Hkv, D, page = 4, 2, 32, 8
    lens = np.array([5, 0, 19], np.int32)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))  # (int64: converted)
    q = torch.from_numpy(randn((int(lens.sum()), H, D), "float32"))
    k = torch.from_numpy(randn((int(lens.sum()), Hkv, D), "float32"))
    v = torch.from_numpy(randn((int(lens.sum()), Hkv, D), "float32"))
    pages = torch.from_numpy(randn((6, page, Hkv, D), "float32"))
    table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    qd = torch.from_numpy(randn((2, 1, H, D), "float32"))
    key_lengths = torch.tensor([20, 7], dtype=torch.int32)

    def step(q, k, v, cu, qd, pages, table, key_lengths, out):
        o, lse = attnkit.attention_varlen(q, k, v, cu, cu, 19, 19, causal=True, return_lse=True)
        paged = attnkit.attention(qd, pages, pages, block_table=table, key_lengths=key_lengths, layout="bshd")
        attnkit.attention_varlen(q, k, v, cu, cu, 19, 19, out=out)
        return o, lse, paged

    out_eager, out_compiled = torch.zeros_like(q), torch.zeros_like(q)
    want = step(q, k, v, cu, qd, pages, table, key_lengths, out_eager)
    got = torch.compile(step, fullgraph=True)(q, k, v, cu, qd, pages, table, key_lengths, out_compiled)
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    assert torch.equal(out_eager, out_compiled)
