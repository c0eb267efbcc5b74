"""The oracle of the Python tests: attention in NumPy float64, written from the contract, not from the C++ code."""

import numpy as np


def attention_ref(q, k, v, *, mask=None, key_lengths=None, causal=False, causal_offset=None, window=None,
                  softcap=None, scale=None, head_sink=None, masked_rows="nan"):
    """q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (head-first, any dtype) -> (out, lse) in float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    k = np.repeat(k, H // k.shape[1], axis=1)  # query head h reads kv head h // group
    v = np.repeat(v, H // v.shape[1], axis=1)
    scale = np.float32(1.0 / np.sqrt(D) if scale is None else scale)
    s = np.einsum("bhid,bhjd->bhij", q, k) * float(scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + np.asarray(mask, dtype=np.float64)
    i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
    visible = np.ones((B, 1, Sq, Sk), dtype=bool)
    if key_lengths is not None:
        visible &= (j < np.asarray(key_lengths)[:, None, None, None])
    if causal:
        offset = Sk - Sq if causal_offset is None else np.asarray(causal_offset).reshape(-1, 1, 1, 1)  # int or [B]
        limit = i + offset
        visible &= j <= limit
        if window is not None:
            visible &= j > limit - window
    s = np.where(visible, s, -np.inf)
    sink = None if head_sink is None else np.asarray(head_sink, np.float64)[None, :, None, None]
    m = s.max(axis=-1, keepdims=True) if Sk else np.full((B, H, Sq, 1), -np.inf)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - m)
        denom = p.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
        with np.errstate(divide="ignore"):
            out = (p @ v) / denom
            lse = (np.log(denom) + m)[..., 0]
    empty = denom[..., 0] == 0  # no visible key and no sink
    out[empty] = 0.0 if masked_rows == "zero" else np.nan
    lse[empty] = -np.inf
    return out, lse


def scaled_error(out, ref):
    """max |out - ref| / max |ref| over the finite reference entries; NaNs must sit where the reference has them."""
    out = np.asarray(out, dtype=np.float64)
    assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN pattern differs from the reference"
    finite = ~np.isnan(ref)
    if not finite.any():
        return 0.0
    return float(np.abs(out[finite] - ref[finite]).max() / max(np.abs(ref[finite]).max(), 1e-30))


def paged_entry_kv(k_pages, v_pages, table, b, length, page_size, kv_layout):
    """Entry b's first `length` K and V rows out of NHD or HND pages through its block table, as [Hkv, length, D]."""
    rows = [table[b, j // page_size] for j in range(length)]
    at = [j % page_size for j in range(length)]
    if kv_layout == "nhd":
        return k_pages[rows, at].transpose(1, 0, 2), v_pages[rows, at].transpose(1, 0, 2)
    return k_pages[rows, :, at].transpose(1, 0, 2), v_pages[rows, :, at].transpose(1, 0, 2)
