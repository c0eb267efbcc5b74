"""attnkit.attention with backend="vulkan" on NumPy arrays against the float64 reference (skipped without a
Vulkan device; CI runs it on lavapipe)."""

import numpy as np
import pytest

import attnkit
from conftest import DTYPES, TOLERANCE
from reference import attention_ref, scaled_error

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
