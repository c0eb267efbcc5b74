"""attnkit.append_kv with rotary on K and int8 / int4 caches: the caches equal what attnkit.group_query_attention
leaves in its own caches for the same new rows (shared buffer, each entry's rows at lengths[b] - S), bit for bit,
dense and paged; bad rotary or quantization arguments raise by name and write nothing; torch tensors (eager and
torch.compile) give the NumPy caches."""

import re

import numpy as np
import pytest

import attnkit
from conftest import np_dtype

B, S, N, NKV, C, PAGE = 2, 3, 4, 2, 16, 4
LENGTHS = np.array([8, 13], np.int32)


def _last_dim(quant, bits, H):
    return (H + 1) // 2 if quant != "NONE" and bits == 4 else H


def _cache(rng, randn, dtype, quant, bits, H):
    shape = (B, NKV, C, _last_dim(quant, bits, H))
    if quant == "NONE":
        return randn(shape, dtype)
    if bits == 8:
        return rng.integers(-127, 128, shape).astype(np.int8)
    return rng.integers(0, 256, shape).astype(np.uint8)


def _scales(rng, quant, bits, H):
    if quant == "NONE":
        return None
    top = 127.0 if bits == 8 else 7.0
    count = 1 if quant == "PER_TENSOR" else NKV * H
    return (rng.uniform(2.5, 4.5, count) / top).astype(np.float32)


def _case(rng, randn, dtype, H, half, interleaved, k_quant, v_quant, bits):
    x = {"key": randn((B, S, NKV * H), dtype), "value": randn((B, S, NKV * H), dtype)}
    pos = np.arange(20, dtype=np.float64)[:, None] * 10000.0 ** (-np.arange(half) / half)[None, :] if half else None
    rot = {} if not half else {"cos_cache": np.cos(pos).astype(np_dtype(dtype)), "sin_cache": np.sin(pos).astype(np_dtype(dtype))}
    quant = {"k_scale": _scales(rng, k_quant, bits, H), "v_scale": _scales(rng, v_quant, bits, H)}
    caches = (_cache(rng, randn, dtype, k_quant, bits, H), _cache(rng, randn, dtype, v_quant, bits, H))
    attrs = {"rotary_interleaved": int(interleaved), "k_quant_type": k_quant, "v_quant_type": v_quant,
             "kv_cache_bit_width": bits if "PER" in k_quant + v_quant else 0}
    return x, rot, quant, caches, attrs


def _gqa_caches(rng, randn, dtype, x, rot, quant, caches, attrs, H):
    ck, cv = caches[0].copy(), caches[1].copy()
    query = randn((B, S, N * H), dtype)
    attnkit.group_query_attention(query, x["key"], x["value"], ck, cv, LENGTHS - 1, int(LENGTHS.max()), **rot,
                                  **quant, num_heads=N, kv_num_heads=NKV, do_rotary=int(bool(rot)), **attrs,
                                  present_key=ck, present_value=cv)
    return ck, cv


def _to_pages(dense, table):
    """[B, Nkv, C, d] rows scattered into NHD pages [num_pages, PAGE, Nkv, d] (unused pages: a poison byte)."""
    pages = np.full((table.size + 2, PAGE, NKV, dense.shape[3] * dense.itemsize), 0x5C, np.uint8).view(dense.dtype)
    for b in range(B):
        for pos in range(C):
            pages[table[b, pos // PAGE], pos % PAGE] = dense[b, :, pos]
    return pages


CASES = [  # head size, rotary half (0: none), interleaved, K quant, V quant, bits
    (32, 16, False, "NONE", "NONE", 8),
    (32, 8, True, "NONE", "NONE", 8),
    (64, 16, False, "PER_TENSOR", "PER_CHANNEL", 8),
    (32, 16, True, "PER_CHANNEL", "PER_TENSOR", 4),
    (15, 4, False, "PER_TENSOR", "PER_CHANNEL", 4),
    (16, 0, False, "PER_CHANNEL", "NONE", 4),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("H,half,interleaved,k_quant,v_quant,bits", CASES)
@pytest.mark.parametrize("paged", [False, True])
def test_append_equals_the_gqa_ops_cache(rng, randn, dtype, H, half, interleaved, k_quant, v_quant, bits, paged):
    x, rot, quant, caches, attrs = _case(rng, randn, dtype, H, half, interleaved, k_quant, v_quant, bits)
    want_k, want_v = _gqa_caches(rng, randn, dtype, x, rot, quant, caches, attrs, H)
    k_new, v_new = x["key"].reshape(B, S, NKV, H), x["value"].reshape(B, S, NKV, H)
    options = dict(rot, **quant, **attrs)
    positions = LENGTHS - S
    if paged:
        table = rng.permutation(B * C // PAGE + 2)[: B * C // PAGE].reshape(B, C // PAGE).astype(np.int32)
        kc, vc = _to_pages(caches[0], table), _to_pages(caches[1], table)
        attnkit.append_kv(k_new, v_new, kc, vc, positions, block_table=table, **options)
        want_k, want_v = _to_pages(want_k, table), _to_pages(want_v, table)
    else:
        kc, vc = caches[0].copy(), caches[1].copy()  # the op's own layout: a dense HND cache
        attnkit.append_kv(k_new, v_new, kc, vc, positions, kv_layout="hnd", **options)
    assert np.array_equal(kc.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), want_v.view(np.uint8))


def _bad(rng, randn, mutate, exception, pattern, dtype="float16"):
    x, rot, quant, caches, attrs = _case(rng, randn, dtype, 32, 16, False, "PER_CHANNEL", "PER_TENSOR", 4)
    call = {"k_new": x["key"].reshape(B, S, NKV, 32), "v_new": x["value"].reshape(B, S, NKV, 32),
            "k_cache": caches[0], "v_cache": caches[1], "positions": LENGTHS - S, "kv_layout": "hnd", **rot, **quant,
            **attrs}
    mutate(call)
    k0, v0 = caches[0].copy(), caches[1].copy()
    with pytest.raises(exception, match=pattern):
        attnkit.append_kv(**call)
    assert np.array_equal(caches[0], k0) and np.array_equal(caches[1], v0)


@pytest.mark.parametrize("mutate,exception,pattern", [
    (lambda c: c.pop("k_scale"), ValueError, "^k_scale: is null but the tensor is quantized"),
    (lambda c: c.update(v_scale=np.zeros(1, np.float32)), ValueError, re.escape("v_scale[0]: = 0")),
    (lambda c: c.update(k_scale=c["k_scale"].astype(np.float64)), TypeError, "^k_scale: "),
    (lambda c: c.update(v_quant_type="NONE", v_cache=np.zeros((B, NKV, C, 32), np.float16)), ValueError,
     "^v_scale: was given but the cache is not quantized"),
    (lambda c: c.update(cos_cache=c["cos_cache"].astype(np.float32)), TypeError, "^cos_cache: dtype float32 does not match"),
    (lambda c: c.pop("sin_cache"), ValueError, "^sin_cache: cos_cache and sin_cache must both be given"),
    (lambda c: c.update(cos_cache=np.zeros((20, 17), np.float16), sin_cache=np.zeros((20, 17), np.float16)),
     ValueError, re.escape("cos_cache: dimension 1 (rotary_dim / 2 = 17) must be in [1, head_dim / 2 = 16]")),
    (lambda c: c.update(cos_cache=c["cos_cache"][:12], sin_cache=c["sin_cache"][:12]), ValueError,
     re.escape("positions[1]: the entry's rows [10, 13) reach past the cos / sin caches' 12 rows")),
    (lambda c: c.update(rotary_interleaved=2), ValueError, "^rotary_interleaved: must be a bool"),
    (lambda c: (c.pop("cos_cache"), c.pop("sin_cache"), c.update(rotary_interleaved=True)), ValueError,
     "^rotary_interleaved: is set but rotary_dim is 0"),
    (lambda c: c.update(k_quant_type="PER_ROW"), ValueError, "^k_quant_type: must be 'NONE', 'PER_TENSOR' or"),
    (lambda c: c.update(kv_cache_bit_width=2), ValueError, "^kv_cache_bit_width: must be 8 .int8. or 4"),
    (lambda c: c.update(kv_cache_bit_width=8), TypeError, "^k_cache: must be int8 for k_quant_type"),
    (lambda c: c.update(v_cache=c["v_cache"][..., :-1]), ValueError, "^v_cache: last dimension 15 must be 16"),
])
def test_bad_rotary_or_quantization_raises_by_name_and_writes_nothing(rng, randn, mutate, exception, pattern):
    _bad(rng, randn, mutate, exception, pattern)


def test_torch_eager_and_compiled_equal_numpy(rng, randn):
    torch = pytest.importorskip("torch")
    x, rot, quant, caches, attrs = _case(rng, randn, "float16", 32, 8, True, "PER_TENSOR", "PER_CHANNEL", 4)
    want_k, want_v = _gqa_caches(rng, randn, "float16", x, rot, quant, caches, attrs, 32)
    t = {k: torch.from_numpy(v) for k, v in {**x, **rot, **quant}.items()}
    k_new, v_new = t["key"].reshape(B, S, NKV, 32), t["value"].reshape(B, S, NKV, 32)
    positions = torch.from_numpy(LENGTHS - S).to(torch.int64)
    options = {k: t[k] for k in ("cos_cache", "sin_cache", "k_scale", "v_scale")}
    kc, vc = torch.from_numpy(caches[0].copy()), torch.from_numpy(caches[1].copy())
    attnkit.append_kv(k_new, v_new, kc, vc, positions, kv_layout="hnd", **options, **attrs)
    assert np.array_equal(kc.numpy(), want_k) and np.array_equal(vc.numpy(), want_v)

    @torch.compile(fullgraph=True)
    def step(kn, vn, k_cache, v_cache, pos, opts):
        attnkit.append_kv(kn, vn, k_cache, v_cache, pos, kv_layout="hnd", **opts, **attrs)
        return v_cache.sum()

    k2, v2 = torch.from_numpy(caches[0].copy()), torch.from_numpy(caches[1].copy())
    step(k_new, v_new, k2, v2, positions, options)
    assert torch.equal(k2, kc) and torch.equal(v2, vc)


def test_torch_opcheck(rng, randn):
    """The custom op's schema (mutated caches, optional tables and scales) and fake kernel, by torch's opcheck."""
    torch = pytest.importorskip("torch")
    import attnkit.torch  # noqa: F401  (registers the ops)

    x, rot, quant, caches, attrs = _case(rng, randn, "bfloat16", 32, 16, False, "PER_CHANNEL", "PER_TENSOR", 8)
    t = {k: torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16) if v.dtype.itemsize == 2 else torch.from_numpy(v)
         for k, v in {**x, **rot}.items()}
    args = (t["key"].reshape(B, S, NKV, 32), t["value"].reshape(B, S, NKV, 32), torch.from_numpy(caches[0].copy()),
            torch.from_numpy(caches[1].copy()), torch.from_numpy(LENGTHS - S), None, None, True, t["cos_cache"],
            t["sin_cache"], False, torch.from_numpy(quant["k_scale"]), torch.from_numpy(quant["v_scale"]),
            "PER_CHANNEL", "PER_TENSOR", 8, "auto")
    torch.library.opcheck(torch.ops.attnkit.append_kv.default, args)
