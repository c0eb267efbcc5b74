import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # reference.py

DTYPES = ["float32", "float16", "bfloat16"]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 8e-3}
# The CPU's LSE bound (|lse - ref| <= tol * max(1, |ref|)): bfloat16 on AMX tiles rounds P to bfloat16 and sums the
# rounded values (docs/numerics.md), so its LSE is within 2^-9 of the exact one (testing::cpu_lse_tolerance).
CPU_LSE_TOLERANCE = {"float32": 1e-5, "float16": 1e-5, "bfloat16": 2.0**-8}


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


def pytest_report_header(config):
    """The oracle's version, in every session's header (the GQA conformance tests run against it)."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        return "onnxruntime: not installed (GroupQueryAttention conformance tests skip)"
    return f"onnxruntime: {onnxruntime.__version__} (CPUExecutionProvider), onnx: {onnx.__version__}"


def pytest_terminal_summary(terminalreporter):
    """The GroupQueryAttention sweep's tally: cases run against ONNX Runtime, against the reference, and why."""
    stats = getattr(sys.modules.get("gqa_cases"), "STATS", None)
    if not stats or not stats["cases"]:
        return
    tr = terminalreporter
    tr.write_sep("-", "GroupQueryAttention conformance")
    try:
        import onnxruntime

        tr.write_line(f"oracle: onnxruntime {onnxruntime.__version__}, CPUExecutionProvider")
    except ImportError:
        pass
    tr.write_line(f"{stats['cases']} cases in {stats['seconds']:.1f} s: {stats['ort']} against ONNX Runtime, "
                  f"{stats['reference']} against the float64 reference only; "
                  f"{stats['both']} of the ONNX Runtime cases also against the reference")
    for reason, n in sorted(stats["reasons"].items(), key=lambda kv: -kv[1]):
        tr.write_line(f"  reference: {n:3d} x {reason}")
