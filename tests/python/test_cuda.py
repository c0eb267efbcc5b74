"""CUDA tensors (PyTorch) on the CUDA backend, on the caller's current stream. Skipped without a GPU."""

import numpy as np
import pytest

import attnkit
from conftest import TOLERANCE
from reference import attention_ref, scaled_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in attnkit.available_backends(),
    reason="needs a CUDA device and attnkit's CUDA backend")


def f64(t, layout="bhsd"):
    a = t.detach().to("cpu", torch.float64).numpy()
    return a if layout == "bhsd" else a.transpose(0, 2, 1, 3)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_cuda_tensors(dtype, layout):
    g = torch.Generator(device="cuda").manual_seed(3)
    td = getattr(torch, dtype)
    B, H, Hkv, Sq, Sk, D = 2, 8, 2, 37, 70, 64
    shape = (lambda h, s: (B, h, s, D)) if layout == "bhsd" else (lambda h, s: (B, s, h, D))
    q = torch.randn(shape(H, Sq), generator=g, device="cuda").to(td)
    k = torch.randn(shape(Hkv, Sk), generator=g, device="cuda").to(td)
    v = torch.randn(shape(Hkv, Sk), generator=g, device="cuda").to(td)
    mask = torch.randn(B, 1, Sq, Sk, generator=g, device="cuda")
    lengths = torch.tensor([70, 33], dtype=torch.int32, device="cuda")
    out, lse = attnkit.attention(q, k, v, mask=mask, key_lengths=lengths, causal=True, layout=layout,
                                 return_lse=True)
    assert out.is_cuda and out.dtype == td and out.shape == q.shape and lse.is_cuda and lse.shape == (B, H, Sq)
    ref, ref_lse = attention_ref(f64(q, layout), f64(k, layout), f64(v, layout), mask=f64(mask),
                                 key_lengths=lengths.cpu().numpy(), causal=True)
    torch.cuda.synchronize()
    assert scaled_error(f64(out, layout), ref) <= TOLERANCE[dtype]
    if dtype == "float32":
        np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, rtol=1e-5, atol=1e-5)


def test_cuda_strided_views_and_packed_qkv():
    B, S, H, Hkv, D = 2, 50, 4, 2, 32
    qkv = torch.randn(B, S, (H + 2 * Hkv) * D, device="cuda", dtype=torch.float16)
    heads = qkv.view(B, S, H + 2 * Hkv, D)
    q, k, v = heads[:, :, :H], heads[:, :, H:H + Hkv], heads[:, :, H + Hkv:]
    out = torch.full((B, H, S, 48), float("nan"), device="cuda", dtype=torch.float16)[..., 8:40]  # strided out
    res = attnkit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out=out, causal=True)
    assert res is out
    ref, _ = attention_ref(f64(q, "bshd"), f64(k, "bshd"), f64(v, "bshd"), causal=True)
    torch.cuda.synchronize()
    assert scaled_error(f64(out), ref) <= TOLERANCE["float16"]


def test_cuda_runs_on_the_current_stream():
    q = torch.randn(1, 2, 16, 32, device="cuda")
    ref, _ = attention_ref(f64(q), f64(q), f64(q))
    side = torch.cuda.Stream()  # a non-blocking stream: it does not wait for the default stream
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of work queued on the default stream
    with torch.cuda.stream(side):
        out = torch.full_like(q, float("nan"))
        attnkit.attention(q, q, q, out=out)
    side.synchronize()  # had the kernel gone to the default stream, it would still wait behind the sleep
    assert scaled_error(f64(out), ref) <= TOLERANCE["float32"]
    torch.cuda.synchronize()


def test_cuda_errors_write_nothing():
    q = torch.randn(2, 2, 8, 16, device="cuda")
    out = torch.full_like(q, 1234.5)
    with pytest.raises(ValueError, match=r"key_lengths\[1\]"):
        attnkit.attention(q, q, q, out=out, key_lengths=torch.tensor([3, 9], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match=r"k: is on cpu but q is on cuda:0"):
        attnkit.attention(q, q.cpu(), q, out=out)
    with pytest.raises(ValueError, match=r"backend: \"cpu\" runs host arrays, but q is on cuda:0"):
        attnkit.attention(q, q, q, out=out, backend="cpu")
    with pytest.raises(ValueError, match=r"out: shape"):
        attnkit.attention(q, q, q, out=out[:, :1])
    torch.cuda.synchronize()
    assert bool((out == 1234.5).all())
