"""attnkit: fused attention kernels for NumPy arrays and any DLPack tensor.

``attnkit.attention(q, k, v)`` computes ``softmax(scale * q @ k^T + mask) @ v`` for every batch entry and
head in one fused pass, reading the arrays where they lie (zero-copy, any non-negative strides whose
innermost dimension is contiguous). See ``help(attnkit.attention)``.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Tuple, Union

from . import _attnkit

__all__ = ["attention", "available_backends", "__version__"]

__version__: str = _attnkit.__version__


def available_backends() -> List[str]:
    """Backends this build can run now, e.g. ``['cpu', 'reference']``."""
    return list(_attnkit.available_backends())


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


def _numpy_dtype(like: Any):
    """The NumPy dtype matching the element type of ``like`` (NumPy, or anything with a named dtype)."""
    import numpy as np

    if isinstance(like, np.ndarray):
        return like.dtype
    name = str(getattr(like, "dtype", "float32")).rsplit(".", 1)[-1]  # "torch.float16" -> "float16"
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_MANAGED = 1, 2, 13  # DLPack device types


def _dlpack_device(x: Any) -> Tuple[int, int]:
    """(DLPack device type, device id) of an array; (1, 0) (the CPU) when it does not say."""
    try:
        kind, index = x.__dlpack_device__()
        return int(kind), int(index)
    except Exception:
        return _DLPACK_CPU, 0


def _on_cuda(x: Any) -> bool:
    return _dlpack_device(x)[0] in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED)


def _current_stream(q: Any) -> int:
    """The caller's current CUDA stream for q's framework and device (0: the default stream)."""
    if not _on_cuda(q):
        return 0
    if _is_torch_tensor(q):
        import torch

        return int(torch.cuda.current_stream(q.device).cuda_stream)
    if type(q).__module__.startswith("cupy"):
        import cupy

        with cupy.cuda.Device(_dlpack_device(q)[1]):
            return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _allocator(q: Any):
    """``alloc(shape, what)`` for the outputs: arrays of q's kind on q's device (a torch tensor for torch input,
    a CuPy array for CuPy input, a NumPy array for host input of any other kind)."""

    def alloc(shape: Tuple[int, ...], what: str):
        if _is_torch_tensor(q):
            import torch

            dtype = torch.float32 if what in ("lse", "scratch") else q.dtype
            return torch.empty(shape, dtype=dtype, device=q.device)
        if _on_cuda(q):
            if type(q).__module__.startswith("cupy"):
                import cupy

                with cupy.cuda.Device(_dlpack_device(q)[1]):
                    return cupy.empty(shape, dtype="float32" if what in ("lse", "scratch") else q.dtype)
            raise TypeError(f"{what}: cannot allocate a CUDA output for q of type {type(q).__module__}."
                            f"{type(q).__qualname__}: pass out= (and return_lse needs torch or CuPy input)")
        import numpy as np

        return np.empty(shape, dtype=np.float32 if what in ("lse", "scratch") else _numpy_dtype(q))

    return alloc


def _optional_int(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: must be an integer or None, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: must be an integer or None, got {type(value).__name__}") from None


def _causal_offset(value: Any) -> Tuple[Optional[int], Any]:
    """(one offset for every batch entry, or None; a per-batch int32 array [B], or None)."""
    if value is None or isinstance(value, bool):
        return _optional_int("causal_offset", value), None
    try:
        return operator.index(value), None
    except TypeError:
        pass
    if isinstance(value, (float, str, bytes)):
        raise TypeError(f"causal_offset: must be an integer, an int32 array [B] or None, got {type(value).__name__}")
    return None, value  # an array: checked (int32, [B], device, strides) by the binding


def _optional_float(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name}: must be a real number or None, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: must be a real number or None, got {type(value).__name__}") from None


def _choice(name: str, value: Any, choices: Tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: must be one of {', '.join(map(repr, choices))}, got {type(value).__name__}")
    return value


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    key_lengths: Any = None,
    causal: bool = False,
    causal_offset: Any = None,
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    scale: Optional[float] = None,
    masked_rows: str = "nan",
    return_lse: bool = False,
    out: Any = None,
    layout: str = "bhsd",
    head_sink: Any = None,
    threads: Optional[int] = None,
    backend: str = "auto",
) -> Union[Any, Tuple[Any, Any]]:
    """Fused attention: ``O = softmax(scale * Q K^T + mask) V`` for every batch entry and head.

    Arrays are taken as they are, without copies: any object supporting DLPack or the buffer protocol
    (NumPy, PyTorch, CuPy, JAX, ...), with any non-negative strides as long as the innermost dimension is
    contiguous (a packed-QKV slice, a transposed or sliced view all work). A stride the kernel cannot take is an
    error, never a silent copy. The arrays' device picks the backend: host arrays run on the CPU kernel, CUDA
    arrays on the CUDA backend (on the caller's current stream: PyTorch's or CuPy's, else the default stream),
    and a CUDA array raises ValueError when this build has no CUDA backend or it finds no device. All arrays
    must be on one device.

    Args:
        q: queries, ``[B, H, Sq, D]`` (layout ``"bhsd"``) or ``[B, Sq, H, D]`` (``"bshd"``); float32,
            float16 or bfloat16 (NumPy bfloat16 arrays use ``ml_dtypes.bfloat16``).
        k: keys, ``[B, Hkv, Sk, D]`` (or ``[B, Sk, Hkv, D]``), q's dtype. ``H`` must be a multiple of ``Hkv``:
            query head ``h`` reads key/value head ``h // (H // Hkv)`` (grouped / multi-query attention).
        v: values, ``[B, Hkv, Sk, Dv]`` (or ``[B, Sk, Hkv, Dv]``), q's dtype; ``Dv`` may differ from ``D``.
        mask: additive float32 mask broadcastable (NumPy rules) to ``[B, H, Sq, Sk]`` whatever the layout; the
            key dimension must be ``Sk``. ``-inf`` hides a key.
        key_lengths: int32 ``[B]``: keys at or past ``key_lengths[b]`` are hidden.
        causal: query ``i`` sees key ``j`` only when ``j <= i + causal_offset``.
        causal_offset: defaults to ``Sk - Sq`` (the last query sees every key); needs ``causal=True``. An int,
            or an int32 array ``[B]`` of per-batch offsets (a right-padded batch whose queries sit at different
            positions).
        window: sliding window (needs ``causal``): query ``i`` sees only the ``window`` keys ending at its
            causal limit.
        softcap: ``c > 0``: every scaled score ``s`` becomes ``c * tanh(s / c)`` before the mask is added.
        scale: score scale, default ``1 / sqrt(D)``.
        masked_rows: what a query row with no visible key gives: ``"nan"`` (default, what softmax over an
            all ``-inf`` row gives) or ``"zero"``.
        return_lse: also return the float32 log-sum-exp of every row, ``[B, H, Sq]`` (natural log, in
            scaled-score units; ``-inf`` for a row with no visible key).
        out: output buffer, ``[B, H, Sq, Dv]`` (or ``[B, Sq, H, Dv]``), q's dtype, writable, on q's device;
            any non-negative strides with a contiguous last dimension. It must not overlap any input. On any
            error it is left untouched. Default: a new array of q's kind (a torch tensor for torch input, a
            NumPy array otherwise; CUDA arrays of other frameworks need out=).
        layout: ``"bhsd"`` or ``"bshd"``: the axis order of q, k, v and out.
        head_sink: float32 ``[H]``: a logit per query head that joins every row's softmax denominator only.
        threads: CPU worker threads (default: all cores); the result does not depend on it.
        backend: ``"auto"`` (the arrays' device decides), ``"cpu"`` (the tiled SIMD kernel),
            ``"reference"`` (float64, slow: the oracle of the tests) or ``"cuda"`` (CUDA arrays only).

    Returns:
        ``out``, or ``(out, lse)`` when ``return_lse`` is true.

    Raises:
        TypeError: an argument is not an array, or has the wrong dtype.
        ValueError: a shape, stride, device or option is not accepted; the message is the library's
            (``"argument: rule"``). Nothing is written.
    """
    o, lse = _attnkit.attention(
        q,
        k,
        v,
        mask,
        key_lengths,
        head_sink,
        bool(causal),
        *_causal_offset(causal_offset),
        _optional_int("window", window),
        _optional_float("softcap", softcap),
        _optional_float("scale", scale),
        _choice("masked_rows", masked_rows, ("nan", "zero")),
        bool(return_lse),
        out,
        _choice("layout", layout, ("bhsd", "bshd")),
        _optional_int("threads", threads),
        _choice("backend", backend, ("auto", "cpu", "reference", "cuda")),
        _current_stream(q),
        _allocator(q),
    )
    return (o, lse) if return_lse else o
