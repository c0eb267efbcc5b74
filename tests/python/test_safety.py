"""Issue 36 from Python: out-of-range integers and strides get a clear error, and the GQA op cache is safe under many
threads and under re-entrant __dlpack__ calls (results bit-identical to single-threaded calls)."""

import threading

import numpy as np
import pytest

import attnkit


def _qkv(rng, B=1, H=2, S=5, D=8):
    r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    return r(B, H, S, D), r(B, H, S, D), r(B, H, S, D)


# ---- out-of-range Python integers: ValueError naming the argument, not nanobind's "incompatible arguments" ----


@pytest.mark.parametrize("name,value", [("window", 2**64), ("window", -(2**63) - 1), ("threads", 2**40),
                                        ("causal_offset", 2**63)])
def test_attention_int_out_of_range(rng, name, value):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=rf"^{name}: = {value} does not fit in int(32|64)"):
        attnkit.attention(q, k, v, causal=True, **{name: value})


def _gqa_decode(rng, B=2, P=8, N=4, Nkv=2, H=16):
    r = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    return dict(query=r(B, 1, N * H), key=r(B, 1, Nkv * H), value=r(B, 1, Nkv * H), past_key=r(B, Nkv, P, H),
                past_value=r(B, Nkv, P, H), seqlens_k=np.array([P - 3, P], np.int32)[:B],
                total_sequence_length=P + 1), dict(num_heads=N, kv_num_heads=Nkv)


@pytest.mark.parametrize("name,value", [("num_heads", 2**63), ("local_window_size", -(2**70)), ("threads", 2**31)])
def test_gqa_int_out_of_range(rng, name, value):
    x, attrs = _gqa_decode(rng)
    attrs[name] = value
    with pytest.raises(ValueError, match=rf"^{name}: = {value} does not fit in int(32|64)"):
        attnkit.group_query_attention(**x, **attrs)


def test_threads_above_the_bound_is_refused_by_the_library(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match=r"^config.threads: must be >= 0 and at most 1024"):
        attnkit.attention(q, k, v, threads=4000)


# ---- strides whose extent overflows int64 (as_strided): a ValueError, not a SIGSEGV ----


def test_attention_as_strided_extent_overflow(rng):
    base = np.zeros(64, np.float32)
    q = np.lib.stride_tricks.as_strided(base, shape=(16, 16, 4, 8), strides=(2**62, 2**61, 32, 4))
    k = v = rng.standard_normal((16, 16, 4, 8), dtype=np.float32)
    out = np.full((16, 16, 4, 8), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"^q[.:].*(int64|2\^63)"):
        attnkit.attention(q, k, v, out=out)
    assert (out == 7.0).all()


def test_gqa_as_strided_extent_overflow(rng):
    x, attrs = _gqa_decode(rng)
    base = np.zeros(64, np.float32)
    x["query"] = np.lib.stride_tricks.as_strided(base, shape=(16, 2**20, 64), strides=(2**62, 2**44, 4))
    with pytest.raises(ValueError, match=r"^query: .*(2\^63|int64)"):
        attnkit.group_query_attention(**x, **attrs)


# ---- the GQA op cache under many threads and re-entrant calls ----

SCALES = [0.0] + [0.05 * (i + 1) for i in range(40)]  # 41 attribute sets: more than the cache's 32 ops


def _run(x, attrs, scale, softcap=0.0):
    out, pk, pv = attnkit.group_query_attention(**x, **attrs, scale=scale, softcap=softcap, threads=1)
    return out


def test_many_threads_mixed_attributes_are_bit_identical(rng):
    x, attrs = _gqa_decode(rng, B=2, P=40, N=4, Nkv=2, H=32)
    sets = [(s, c) for s in SCALES for c in (0.0, 30.0)]
    expected = {sc: _run(x, attrs, *sc) for sc in sets}  # single-threaded
    errors, mismatches = [], []

    def worker(index):
        try:
            local = np.random.default_rng(index)
            for _ in range(60):
                sc = sets[local.integers(len(sets))] if index % 2 else sets[index % 4]  # half cycle all sets
                got = _run(x, attrs, *sc)
                if not np.array_equal(got.view(np.uint32), expected[sc].view(np.uint32)):
                    mismatches.append(sc)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert not mismatches, f"{len(mismatches)} results differ from single-threaded calls"


class ReentrantArray:
    """An array whose __dlpack__ runs the op 40 times with other attributes (evicting every cached op) before it
    hands its memory over: the outer call's op must survive."""

    def __init__(self, array, x, attrs):
        self.array, self.x, self.attrs, self.calls = array, x, attrs, 0

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        self.calls += 1
        for s in SCALES[1:]:
            _run(self.x, self.attrs, s, softcap=5.0)
        return self.array.__dlpack__(*args, **kwargs)


def test_reentrant_dlpack_does_not_free_the_running_op(rng):
    x, attrs = _gqa_decode(rng)
    expected = _run(x, attrs, 0.0)
    for name in ("key", "value", "past_key", "seqlens_k"):  # imported after the op is looked up
        y = dict(x)
        y[name] = ReentrantArray(x[name], x, attrs)
        got = _run(y, attrs, 0.0)
        assert y[name].calls >= 1, name
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32)), name


# ---- a 0 from an array's shape is not AttentionProblem's "same as" default ----


@pytest.mark.parametrize("which,shape,message", [("k", (1, 0, 5, 8), r"^k: heads \(dimension 1\) is 0"),
                                                 ("v", (1, 2, 5, 0), r"^v: head_dim \(dimension 3\) is 0")])
def test_zero_kv_heads_or_v_head_dim_is_named(rng, which, shape, message):
    q, k, v = _qkv(rng)
    arrays = dict(k=k, v=v)
    arrays[which] = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=message):
        attnkit.attention(q, arrays["k"], arrays["v"])
