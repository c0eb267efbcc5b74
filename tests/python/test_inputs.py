"""Input types beyond the kernels' own: float16/bfloat16/bool masks (True: visible) and int64 key lengths, from
NumPy (and torch, when installed)."""

import numpy as np
import pytest

import attnkit
from conftest import TOLERANCE
from reference import attention_ref, scaled_error


@pytest.mark.parametrize("mask_dtype", ["float16", "bfloat16", "bool"])
def test_mask_dtypes_and_int64_lengths_from_numpy_and_torch(mask_dtype, randn, rng):
    q, k, v = randn((2, 3, 4, 8)), randn((2, 3, 6, 8)), randn((2, 3, 6, 8))
    lengths = np.array([6, 3], np.int64)
    if mask_dtype == "bool":
        visible = rng.random((2, 1, 4, 6)) > 0.3
        visible[..., 0] = True
        np_mask, additive = visible, np.where(visible, 0.0, -np.inf)
    else:
        np_mask = randn((1, 3, 4, 6), mask_dtype)
        additive = np.asarray(np_mask, np.float64)
    want, _ = attention_ref(q, k, v, mask=additive, key_lengths=lengths)
    got = attnkit.attention(q, k, v, mask=np_mask, key_lengths=lengths)
    assert scaled_error(got, want) <= TOLERANCE["float32"]
    torch = pytest.importorskip("torch")
    t_mask = torch.from_numpy(np_mask) if mask_dtype != "bfloat16" else torch.from_numpy(
        np.asarray(np_mask, np.float32)).to(torch.bfloat16)
    got_t = attnkit.attention(*(torch.from_numpy(a) for a in (q, k, v)), mask=t_mask,
                              key_lengths=torch.from_numpy(lengths))
    assert scaled_error(got_t.numpy(), want) <= TOLERANCE["float32"]



def test_numpy_int64_lengths_past_int32_are_refused(randn):
    x = randn((1, 1, 2, 8))
    with pytest.raises(ValueError, match=r"key_lengths\[0\]"):
        attnkit.attention(x, x, x, key_lengths=np.array([2**33]))
