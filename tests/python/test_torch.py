"""PyTorch tensors through DLPack (skipped when torch is not installed)."""

import numpy as np
import pytest

import attnkit
from conftest import TOLERANCE
from reference import attention_ref, scaled_error

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_tensors(dtype):
    g = torch.Generator().manual_seed(7)
    td = getattr(torch, dtype)
    q = torch.randn(2, 9, 4, 16, generator=g).to(td)  # positions-first
    k = torch.randn(2, 12, 2, 16, generator=g).to(td)
    v = torch.randn(2, 12, 2, 16, generator=g).to(td)
    out = attnkit.attention(q, k, v, layout="bshd", causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == td and out.shape == (2, 9, 4, 16)
    f64 = lambda t: t.to(torch.float64).numpy().transpose(0, 2, 1, 3)
    ref, _ = attention_ref(f64(q), f64(k), f64(v), causal=True)
    assert scaled_error(f64(out), ref) <= TOLERANCE[dtype]
    # Strided views (a transpose) and out= into a torch tensor.
    o = torch.empty(2, 4, 9, 16, dtype=td)
    res, lse = attnkit.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, out=o,
                                 return_lse=True)
    assert res is o and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    assert torch.equal(o.transpose(1, 2), out)


def test_torch_errors():
    q = torch.randn(1, 2, 3, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="q: requires grad, but attnkit has no backward"):
        attnkit.attention(q, q.detach(), q.detach())  # never a silent detach (test_torch_ops.py has more)
    x = torch.randn(1, 2, 3, 8)
    with pytest.raises(TypeError, match="does not match q's dtype"):
        attnkit.attention(x, x.double(), x)
    if torch.cuda.is_available() and "cuda" not in attnkit.available_backends():
        with pytest.raises(ValueError, match="no CUDA backend"):
            attnkit.attention(x.cuda(), x.cuda(), x.cuda())
