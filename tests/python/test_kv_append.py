"""attnkit.append_kv: new K/V rows into paged and dense caches, in place, against a NumPy loop of the rule; a
prompt appended in chunks then attended through the pages equals the dense call; bad input raises by name and
writes nothing; torch tensors (eager and torch.compile) give the same caches."""

import re

import numpy as np
import pytest

import attnkit
from conftest import np_dtype


def _expected(k_new, v_new, k_cache, v_cache, positions, table, lengths, hnd):
    k, v = k_cache.copy(), v_cache.copy()
    for b in range(k_new.shape[0]):
        rows = k_new.shape[1] if lengths is None else int(lengths[b])
        for r in range(rows):
            pos = int(positions[b]) + r
            if table is None:
                lead, row = b, pos
            else:
                page_size = k_cache.shape[2 if hnd else 1]
                lead, row = int(table[b, pos // page_size]), pos % page_size
            if hnd:
                k[lead, :, row], v[lead, :, row] = k_new[b, r], v_new[b, r]
            else:
                k[lead, row], v[lead, row] = k_new[b, r], v_new[b, r]
    return k, v


def _case(rng, randn, dtype, paged, hnd, ragged, B=3, n=7, Hkv=2, D=24, Dv=16, page=4, pages_per_seq=5):
    k_new, v_new = randn((B, n, Hkv, D), dtype), randn((B, n, Hkv, Dv), dtype)
    cap = page * pages_per_seq
    lead = B * pages_per_seq + 2 if paged else B
    rows = page if paged else cap
    shape = (lambda d: (lead, Hkv, rows, d)) if hnd else (lambda d: (lead, rows, Hkv, d))
    k_cache = np.full(shape(D), 3.0, dtype=np_dtype(dtype))
    v_cache = np.full(shape(Dv), -3.0, dtype=np_dtype(dtype))
    table = rng.permutation(lead)[: B * pages_per_seq].reshape(B, pages_per_seq).astype(np.int32) if paged else None
    lengths = rng.integers(0, n + 1, B).astype(np.int32) if ragged else None
    used = lengths if ragged else np.full(B, n)
    positions = np.array([rng.integers(0, cap - u + 1) for u in used], dtype=np.int64)  # (int64: converted)
    return k_new, v_new, k_cache, v_cache, positions, table, lengths


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("paged,hnd", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("ragged", [False, True])
def test_append_matches_the_rule(rng, randn, dtype, paged, hnd, ragged):
    k_new, v_new, k_cache, v_cache, positions, table, lengths = _case(rng, randn, dtype, paged, hnd, ragged)
    want_k, want_v = _expected(k_new, v_new, k_cache, v_cache, positions, table, lengths, hnd)
    assert attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table=table, new_lengths=lengths,
                             kv_layout="hnd" if hnd else "nhd") is None
    assert np.array_equal(k_cache.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(v_cache.view(np.uint8), want_v.view(np.uint8))


def test_appended_pages_attend_like_the_dense_rows(rng, randn):
    Hkv, H, D, L, page = 2, 4, 32, 29, 8
    k, v = randn((1, L, Hkv, D), "float16"), randn((1, L, Hkv, D), "float16")
    table = np.array([[5, 0, 3, 1]], np.int32)
    k_pages = np.zeros((6, page, Hkv, D), np.float16)
    v_pages = np.zeros((6, page, Hkv, D), np.float16)
    for first, last in [(0, 11), (11, 29)]:  # a prompt in two chunks
        attnkit.append_kv(k[:, first:last], v[:, first:last], k_pages, v_pages, np.array([first], np.int32),
                          block_table=table)
    q = randn((1, 1, H, D), "float16")
    dense = attnkit.attention(q, k, v, layout="bshd")
    paged = attnkit.attention(q, k_pages, v_pages, block_table=table, key_lengths=np.array([L], np.int32),
                              layout="bshd")
    assert np.array_equal(dense, paged)


@pytest.mark.parametrize("mutate,argument", [
    (lambda c: c["positions"].__setitem__(1, 19), "positions[1]"),  # rows [19, 26) of 20
    (lambda c: c["positions"].__setitem__(0, -1), "positions[0]"),
    (lambda c: c["table"].__setitem__((2, 0), 99), "block_table[2]"),
])
def test_bad_values_raise_by_name_and_write_nothing(rng, randn, mutate, argument):
    k_new, v_new, k_cache, v_cache, positions, table, _ = _case(rng, randn, "float16", True, False, False)
    positions[:] = [0, 0, 0]
    c = {"positions": positions, "table": table}
    mutate(c)
    k0, v0 = k_cache.copy(), v_cache.copy()
    with pytest.raises(ValueError, match="^" + re.escape(argument) + ": "):
        attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table=table)
    assert np.array_equal(k_cache, k0) and np.array_equal(v_cache, v0)


def test_bad_shapes_and_types(rng, randn):
    k_new, v_new, k_cache, v_cache, positions, table, _ = _case(rng, randn, "float16", True, False, False)
    with pytest.raises(ValueError, match="^v_cache: shape"):
        attnkit.append_kv(k_new, v_new, k_cache, v_cache[:-1], positions, block_table=table)
    with pytest.raises(TypeError, match="does not match k_new's dtype"):
        attnkit.append_kv(k_new, v_new.astype(np.float32), k_cache, v_cache, positions, block_table=table)
    with pytest.raises(ValueError, match="^k_cache: a dense cache"):
        attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions)
    with pytest.raises(ValueError, match="^kv_layout"):
        attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table=table, kv_layout="bshd")
    with pytest.raises(ValueError, match="read-only"):
        k_cache.flags.writeable = False
        attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table=table)


def _torch_case(rng, randn, device):
    torch = pytest.importorskip("torch")
    arrays = _case(rng, randn, "float16", True, True, True)
    want = _expected(*arrays, True)
    k_new, v_new, k_cache, v_cache, positions, table, lengths = (torch.from_numpy(a).to(device) for a in arrays)
    return torch, (k_new, v_new, k_cache, v_cache, positions, table, lengths), want


def test_torch_eager_and_compiled(rng, randn):
    torch, (k_new, v_new, k_cache, v_cache, positions, table, lengths), (want_k, want_v) = _torch_case(rng, randn, "cpu")
    k2, v2 = k_cache.clone(), v_cache.clone()
    attnkit.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table=table, new_lengths=lengths, kv_layout="hnd")
    assert np.array_equal(k_cache.numpy(), want_k) and np.array_equal(v_cache.numpy(), want_v)

    @torch.compile(fullgraph=True)
    def step(kn, vn, kc, vc, pos, tab, lens):
        attnkit.append_kv(kn, vn, kc, vc, pos, block_table=tab, new_lengths=lens, kv_layout="hnd")
        return kc.sum()

    step(k_new, v_new, k2, v2, positions, table, lengths)
    assert torch.equal(k2, k_cache) and torch.equal(v2, v_cache)
