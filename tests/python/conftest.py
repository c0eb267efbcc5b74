import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # reference.py

DTYPES = ["float32", "float16", "bfloat16"]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}


def np_dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(array):
    return str(array.dtype)


@pytest.fixture
def rng(request):
    """A generator seeded from the test's own name: fresh inputs per test, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def randn(rng):
    def make(shape, dtype="float32", std=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np_dtype(dtype))

    return make
