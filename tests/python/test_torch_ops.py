"""attnkit as PyTorch custom ops: opcheck, torch.compile(fullgraph=True), torch.export, the gradient error, the SDPA
drop-in against F.scaled_dot_product_attention, and the new input types (skipped when torch is not installed)."""

import numpy as np
import pytest

import attnkit
from conftest import TOLERANCE
from reference import attention_ref, scaled_error

torch = pytest.importorskip("torch")
F = torch.nn.functional
import attnkit.torch as akt  # noqa: E402

ATTN_DEFAULTS = dict(mask=None, key_lengths=None, head_sink=None, causal=False, causal_offset=None,
                     causal_offsets=None, window=None, softcap=None, scale=None, masked_rows="nan", return_lse=False,
                     layout="bhsd", threads=None, backend="auto")


def _attention_args(q, k, v, **kw):
    a = dict(ATTN_DEFAULTS, **kw)
    return (q, k, v, a["mask"], a["key_lengths"], a["head_sink"], a["causal"], a["causal_offset"],
            a["causal_offsets"], a["window"], a["softcap"], a["scale"], a["masked_rows"], a["return_lse"],
            a["layout"], a["threads"], a["backend"])


def _qkv(g, B=2, H=4, Hkv=2, Sq=5, Sk=9, D=16, dtype=torch.float32):
    return (torch.randn(B, H, Sq, D, generator=g).to(dtype), torch.randn(B, Hkv, Sk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Sk, D, generator=g).to(dtype))


def _f64(t):
    return t.detach().to(torch.float64).numpy()


@pytest.mark.parametrize("case", ["plain", "mask_lse", "lengths_causal", "bshd_window_softcap"])
def test_opcheck_attention(case):
    g = torch.Generator().manual_seed(1)
    q, k, v = _qkv(g)
    kw = {
        "plain": {},
        "mask_lse": dict(mask=torch.randn(1, 4, 5, 9, generator=g), return_lse=True),
        "lengths_causal": dict(key_lengths=torch.tensor([9, 4], dtype=torch.int32), causal=True, masked_rows="zero"),
        "bshd_window_softcap": dict(layout="bshd", causal=True, window=3, softcap=20.0),
    }[case]
    if case == "bshd_window_softcap":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    torch.library.opcheck(torch.ops.attnkit.attention.default, _attention_args(q, k, v, **kw))
    out = torch.empty_like(q)
    torch.library.opcheck(torch.ops.attnkit.attention_out.default, _attention_args(q, k, v, **kw) + (out,))


def _gqa_decode(g, B=2, P=8, N=4, Nkv=2, H=16, rows=32):
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cache_k, cache_v = r(B, Nkv, rows, H), r(B, Nkv, rows, H)
    return dict(query=r(B, 1, N * H), key=r(B, 1, Nkv * H), value=r(B, 1, Nkv * H), past_key=cache_k,
                past_value=cache_v, seqlens_k=torch.tensor([P - 3, P], dtype=torch.int32), total_sequence_length=P + 1)


def _gqa_op_args(x, *, in_place, present=(None, None), qk_output=0, N=4, Nkv=2):
    return (x["query"], x["key"], x["value"], x["past_key"], x["past_value"], x["seqlens_k"],
            x["total_sequence_length"], None, None, None, None, None, None, None, None, None, None, present[0],
            present[1], None, in_place, N, Nkv, 0.0, 0.0, -1, 1, 0, 0, -1, qk_output, "NONE", "NONE", 0, 0, 1e-6,
            None)


@pytest.mark.parametrize("in_place", [True, False])
def test_opcheck_group_query_attention(in_place):
    g = torch.Generator().manual_seed(2)
    x = _gqa_decode(g)
    torch.library.opcheck(torch.ops.attnkit.group_query_attention.default,
                          _gqa_op_args(x, in_place=in_place, qk_output=0 if in_place else 2))


def test_group_query_attention_matches_the_numpy_path():
    g = torch.Generator().manual_seed(3)
    x = _gqa_decode(g)
    np_x = {n: (t.numpy().copy() if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    want = attnkit.group_query_attention(**np_x, num_heads=4, kv_num_heads=2, present_key=np_x["past_key"],
                                         present_value=np_x["past_value"])
    seqlens64 = x["seqlens_k"].to(torch.int64)  # int64 seqlens_k: torch's default integer type
    got = attnkit.group_query_attention(**dict(x, seqlens_k=seqlens64), num_heads=4, kv_num_heads=2,
                                        present_key=x["past_key"], present_value=x["past_value"])
    assert got[1] is x["past_key"] and got[2] is x["past_value"]  # appended in place
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), b)


def test_group_query_attention_takes_numpy_small_inputs_beside_bfloat16_tensors():
    """head_sink as an ml_dtypes bfloat16 NumPy array and seqlens_k as a NumPy array beside bfloat16 torch tensors
    (torch.as_tensor refuses ml_dtypes' bfloat16): the bits of the all-NumPy call."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    g = torch.Generator().manual_seed(5)
    x = {n: (t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
         for n, t in _gqa_decode(g).items()}
    sink = (2 * np.random.default_rng(5).standard_normal(4)).astype(ml_dtypes.bfloat16)
    as_np = lambda t: t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 \
        else t.numpy()  # noqa: E731
    np_x = {n: (as_np(t).copy() if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    want = attnkit.group_query_attention(**np_x, head_sink=sink, num_heads=4, kv_num_heads=2)
    got = attnkit.group_query_attention(**dict(x, seqlens_k=x["seqlens_k"].numpy()), head_sink=sink, num_heads=4,
                                        kv_num_heads=2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(as_np(a), b)


def test_compile_fullgraph_and_export():
    g = torch.Generator().manual_seed(4)
    q, k, v = _qkv(g)
    mask = torch.rand(2, 1, 5, 9, generator=g) > 0.3
    mask[..., 0] = True

    def f(q, k, v, mask):
        return attnkit.attention(q * 2, k, v, mask=mask, causal=False) + 1

    eager = f(q, k, v, mask)
    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    torch.testing.assert_close(compiled(q, k, v, mask), eager, rtol=0, atol=1e-6)

    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return akt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    ep = torch.export.export(M(), (q, k, v))
    assert "torch.ops.attnkit.attention" in ep.graph_module.code
    torch.testing.assert_close(ep.module()(q, k, v), M()(q, k, v), rtol=0, atol=0)


def test_jit_trace_records_the_op():
    g = torch.Generator().manual_seed(10)
    q, k, v = _qkv(g)
    traced = torch.jit.trace(lambda q, k, v: attnkit.attention(q, k, v, causal=True), (q, k, v), check_trace=False)
    assert "attnkit::attention" in str(traced.graph)
    q2, k2, v2 = _qkv(g)  # new inputs: a trace that baked the first outputs in would fail here
    torch.testing.assert_close(traced(q2, k2, v2), attnkit.attention(q2, k2, v2, causal=True), rtol=0, atol=0)


def test_compile_fullgraph_group_query_attention_in_place():
    g = torch.Generator().manual_seed(5)
    x = _gqa_decode(g)
    ref_k, ref_v = x["past_key"].clone(), x["past_value"].clone()

    def step(x, cache_k, cache_v):
        y = dict(x, past_key=cache_k, past_value=cache_v)
        return attnkit.group_query_attention(**y, num_heads=4, kv_num_heads=2, present_key=cache_k,
                                             present_value=cache_v)[0]

    want = step(x, ref_k, ref_v)
    cache_k, cache_v = x["past_key"].clone(), x["past_value"].clone()
    got = torch.compile(step, fullgraph=True)(x, cache_k, cache_v)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(cache_k, ref_k, rtol=0, atol=0)  # the compiled graph appended in place too
    torch.testing.assert_close(cache_v, ref_v, rtol=0, atol=0)


def test_a_tensor_that_requires_grad_is_refused_by_name():
    g = torch.Generator().manual_seed(6)
    q, k, v = _qkv(g)
    k.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"^k: requires grad, but attnkit has no backward"):
        attnkit.attention(q, k, v)
    with pytest.raises(RuntimeError, match=r"^k: requires grad"):
        akt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    x = _gqa_decode(g)
    x["query"].requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"^query: requires grad"):
        attnkit.group_query_attention(**x, num_heads=4, kv_num_heads=2)
    with torch.no_grad():  # inference under no_grad is fine
        attnkit.attention(q, k, v)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, causal_offset=2, scale=0.25),
                                dict(layout="bshd", masked_rows="zero", threads=1)])
def test_the_plain_eager_path_gives_the_bits_of_the_op_and_of_numpy(kw):
    # attnkit.attention's plainest torch calls skip the dispatcher and the general checks (_torch_ops.plain_attention):
    # the same bits as the registered op and as NumPy input, and the binding's own errors.
    g = torch.Generator().manual_seed(12)
    q, k, v = _qkv(g, Sq=5, Sk=9)
    if kw.get("layout") == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # strided views, positions-first
    got = attnkit.attention(q, k, v, **kw)
    via_op, _ = torch.ops.attnkit.attention(*_attention_args(q, k, v, **kw))
    from_numpy = attnkit.attention(q.numpy(), k.numpy(), v.numpy(), **kw)
    assert type(got) is torch.Tensor and torch.equal(got, via_op)
    assert np.array_equal(got.numpy(), from_numpy)


def test_the_plain_eager_path_keeps_the_binding_errors():
    g = torch.Generator().manual_seed(13)
    q, k, v = _qkv(g)
    with pytest.raises(ValueError, match=r"^causal_offset: is set but causal is False"):
        attnkit.attention(q, k, v, causal_offset=1)
    with pytest.raises(TypeError, match=r"^k: dtype float16 does not match q's dtype float32"):
        attnkit.attention(q, k.half(), v)
    with pytest.raises(ValueError, match=r"^masked_rows: must be"):
        attnkit.attention(q, k, v, masked_rows="one")


SDPA_CASES = {
    "plain": dict(),
    "causal_square": dict(is_causal=True),
    "causal_sq_lt_sk": dict(is_causal=True, Sq=4, Sk=11),  # top-left: SDPA's rule
    "causal_sq_gt_sk": dict(is_causal=True, Sq=12, Sk=5),  # rows past the keys see some; none fully masked
    "bool_mask": dict(mask="bool"),
    "bool_mask_broadcast": dict(mask="bool_b"),
    "float_mask": dict(mask="float"),
    "fully_masked_rows": dict(mask="bool_rows"),
    "gqa": dict(enable_gqa=True, Hkv=2),
    "mqa_scale": dict(enable_gqa=True, Hkv=1, scale=0.3),
    "three_d": dict(three_d=True),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_drop_in_matches_torch(case, dtype):
    c = dict(SDPA_CASES[case])
    td = getattr(torch, dtype)
    g = torch.Generator().manual_seed(hash(case) % 1000)
    B, H, Sq, Sk, D = 2, 4, c.pop("Sq", 7), c.pop("Sk", 9), 16
    Hkv = c.pop("Hkv", H)
    q, k, v = _qkv(g, B, H, Hkv, Sq, Sk, D, td)
    three_d = c.pop("three_d", False)
    mask = c.pop("mask", None)
    if mask == "bool":
        mask = torch.rand(B, H, Sq, Sk, generator=g) > 0.4
        mask[..., 0] = True
    elif mask == "bool_b":
        mask = torch.rand(B, 1, 1, Sk, generator=g) > 0.4
        mask[..., 1] = True
    elif mask == "bool_rows":
        mask = torch.rand(B, 1, Sq, Sk, generator=g) > 0.5
        mask[:, :, 2] = False  # query row 2 sees nothing: SDPA gives zeros
    elif mask == "float":
        mask = torch.randn(1, H, Sq, Sk, generator=g).to(td)
    if three_d:
        q, k, v = q[0], k[0], v[0]
    got = akt.scaled_dot_product_attention(q, k, v, attn_mask=mask, **c)
    kv_rep = H // Hkv
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          attn_mask=mask.double() if mask is not None and mask.is_floating_point()
                                          else mask, **c)
    assert got.dtype == td and got.shape == want.shape
    err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1e-30)
    assert err <= TOLERANCE[dtype], (err, kv_rep)
    if case == "fully_masked_rows":
        assert (got[:, :, 2] == 0).all()


def test_sdpa_drop_in_refuses_what_it_does_not_do():
    g = torch.Generator().manual_seed(8)
    q, k, v = _qkv(g, Hkv=4)
    with pytest.raises(ValueError, match=r"^dropout_p: = 0.1, but attnkit has no dropout"):
        akt.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"^attn_mask: is set but is_causal is True"):
        akt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 9, dtype=torch.bool), is_causal=True)
    q2, k2, v2 = _qkv(g, Hkv=2)
    with pytest.raises(ValueError, match=r"^key: has 2 heads but query has 4 \(pass enable_gqa=True"):
        akt.scaled_dot_product_attention(q2, k2, v2)


def test_int64_lengths_past_int32_are_refused():
    x = torch.randn(1, 1, 2, 8)
    with pytest.raises(ValueError, match=r"key_lengths\[0\]"):
        attnkit.attention(x, x, x, key_lengths=torch.tensor([2**33]))


@pytest.mark.skipif(not torch.cuda.is_available() or "cuda" not in attnkit.available_backends(),
                    reason="needs a CUDA device and attnkit's CUDA backend")
def test_cuda_graph_capture_of_the_ops():
    g = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(2, 8, 64, 64, device="cuda", generator=g, dtype=torch.float16)
    k = torch.randn(2, 2, 256, 64, device="cuda", generator=g, dtype=torch.float16)
    v = torch.randn(2, 2, 256, 64, device="cuda", generator=g, dtype=torch.float16)
    lengths = torch.tensor([256, 100], device="cuda")
    run = lambda: attnkit.attention(q, k, v, key_lengths=lengths, causal=True)  # noqa: E731
    want = run()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up off the default stream, as torch's CUDA-graph recipe says
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, run(), rtol=0, atol=0)
    assert not torch.equal(captured, want)
    # The compiled op under mode="reduce-overhead" (CUDA graphs through torch.compile).
    f = torch.compile(lambda q, k, v: akt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        got = f(q, k, v)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available() or "cuda" not in attnkit.available_backends(),
                    reason="needs a CUDA device and attnkit's CUDA backend")
def test_cuda_graph_capture_of_a_gqa_decode_step_in_place():
    g = torch.Generator().manual_seed(11)
    x = {n: (t.cuda() if isinstance(t, torch.Tensor) and n != "seqlens_k" else t)
         for n, t in _gqa_decode(g, rows=64).items()}
    x = {n: (t.half() if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for n, t in x.items()}
    # seqlens_k stays on the host, as a decoder keeps it (a device copy would be read back: no capture).
    ref_k, ref_v = x["past_key"].clone(), x["past_value"].clone()
    step = lambda k_cache, v_cache: attnkit.group_query_attention(  # noqa: E731
        **dict(x, past_key=k_cache, past_value=v_cache), num_heads=4, kv_num_heads=2, present_key=k_cache,
        present_value=v_cache)[0]
    want = step(ref_k, ref_v)
    cache_k, cache_v = x["past_key"].clone(), x["past_value"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(cache_k.clone(), cache_v.clone())  # warm-up off the default stream
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(cache_k, cache_v)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, want, rtol=0, atol=0)
    torch.testing.assert_close(cache_k, ref_k, rtol=0, atol=0)  # appended in place by the replay
    torch.testing.assert_close(cache_v, ref_v, rtol=0, atol=0)


def test_compiled_first_call_with_attnkit_imported_before_torch():
    """`import attnkit` before torch: the first call, inside a compiled function, loads and registers the ops."""
    import subprocess
    import sys

    code = ("import attnkit\nimport torch\nassert attnkit._TORCH_OPS is None\nq = torch.randn(1, 2, 3, 8)\n"
            "f = torch.compile(lambda q: attnkit.attention(q, q, q, causal=True) + 1, fullgraph=True)\n"
            "assert torch.equal(f(q), attnkit.attention(q, q, q, causal=True) + 1)\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_compile_with_dynamic_shapes():
    """The fake kernels take symbolic sizes: one compiled graph serves several sequence lengths."""
    f = torch.compile(lambda q, k, v: akt.scaled_dot_product_attention(q, k, v, is_causal=True), fullgraph=True,
                      dynamic=True)
    g = torch.Generator().manual_seed(12)
    for length in (3, 5, 9):
        q, k, v = _qkv(g, 2, 4, 4, length, length, 16)
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        assert (f(q, k, v).double() - want).abs().max().item() <= 1e-5
