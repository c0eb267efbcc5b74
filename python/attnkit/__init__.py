"""attnkit: fused attention kernels for NumPy arrays and any DLPack tensor.

``attnkit.attention(q, k, v)`` computes ``softmax(scale * q @ k^T + mask) @ v`` for every batch entry and
head in one fused pass, reading the arrays where they lie (zero-copy, any non-negative strides whose
innermost dimension is contiguous). See ``help(attnkit.attention)``.

``attnkit.group_query_attention(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, ...)``
is ONNX Runtime's ``com.microsoft.GroupQueryAttention`` operator (inputs, attributes and outputs by its names) on
host arrays (the CPU backend) or CUDA arrays (the CUDA backend). See ``help(attnkit.group_query_attention)``.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, List, Optional, Tuple, Union

from . import _attnkit

__all__ = ["attention", "attention_varlen", "append_kv", "group_query_attention", "available_backends", "__version__"]

__version__: str = _attnkit.__version__

_TORCH_OPS: Any = None  # attnkit._torch_ops once loaded (it imports torch and registers torch.ops.attnkit.*)
_TORCH_TENSOR: Any = None  # torch.Tensor, likewise (None before: no type is it)


def _load_torch_ops() -> Any:
    global _TORCH_OPS, _TORCH_TENSOR
    from . import _torch_ops

    _TORCH_OPS = _torch_ops
    _TORCH_TENSOR = _torch_ops.torch.Tensor
    return _torch_ops


# torch.ops.attnkit.* exist as soon as both are imported (torch.export.load needs them before any call).
if sys.modules.get("torch") is not None:
    _load_torch_ops()


def available_backends() -> List[str]:
    """Backends this build can run now, e.g. ``['cpu', 'reference']``."""
    return list(_attnkit.available_backends())


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


def _fast_dlpack(x: Any) -> Any:
    """A PyTorch tensor as a DLPack capsule made by torch's C function (``torch.utils.dlpack.to_dlpack``); anything
    else as it is. The extension imports either alike; a tensor's own ``__dlpack__`` is Python code that cost ~3.5
    µs a call on the H200 machine's host (cProfile, bench/profile_gqa.py), and a decode step passes 7 inputs. A
    tensor torch will not export this way is passed as it is, for the extension's own message."""
    if x is None or not _is_torch_tensor(x):
        return x
    from torch.utils.dlpack import to_dlpack

    try:
        return to_dlpack(x)
    except Exception:  # noqa: BLE001 - the extension reports it with the argument's name
        return x


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
        return (_TORCH_OPS or _load_torch_ops())._stream(q)
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


_INT64 = (-(2**63), 2**63 - 1)
_INT32 = (-(2**31), 2**31 - 1)


def _in_range(name: str, n: int, bounds: Tuple[int, int]) -> int:
    """n, or ValueError naming the argument when the C++ side cannot hold it (int64, or int32 for ``threads``)."""
    lo, hi = bounds
    if not lo <= n <= hi:
        bits = 64 if bounds == _INT64 else 32
        raise ValueError(f"{name}: = {n} does not fit in int{bits} (must be in [{lo}, {hi}])")
    return n


def _optional_int(name: str, value: Any, bounds: Tuple[int, int] = _INT64) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: must be an integer or None, got bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: must be an integer or None, got {type(value).__name__}") from None
    return _in_range(name, n, bounds)


def _causal_offset(value: Any) -> Tuple[Optional[int], Any]:
    """(one offset for every batch entry, or None; a per-batch int32 array [B], or None)."""
    if value is None or isinstance(value, bool):
        return _optional_int("causal_offset", value), None
    try:
        n = operator.index(value)
    except TypeError:
        pass
    else:
        return _in_range("causal_offset", n, _INT64), None
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


def _host_mask(mask: Any, q: Any) -> Any:
    """A NumPy boolean mask (True: visible, as SDPA) as an additive mask (float16/bfloat16 like q, else float32)."""
    if mask is None or str(getattr(mask, "dtype", "")) != "bool" or _on_cuda(mask):
        return mask
    import numpy as np

    dtype = _numpy_dtype(q) if str(getattr(q, "dtype", "")) in ("float16", "bfloat16") else np.float32
    return np.where(np.asarray(mask), np.zeros((), dtype), np.full((), -np.inf, dtype))


def _host_int32(lengths: Any) -> Any:
    """NumPy int64 lengths as int32; a value past int32 becomes int32's limit, which the range check refuses."""
    if lengths is None or str(getattr(lengths, "dtype", "")) != "int64" or _on_cuda(lengths):
        return lengths
    import numpy as np

    return np.clip(np.asarray(lengths), -1, 2**31 - 1).astype(np.int32)


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
    plan: str = "",
    block_table: Any = None,
    kv_layout: str = "nhd",
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
        mask: additive mask (float32, float16 or bfloat16; ``-inf`` hides a key) or boolean mask (True: visible,
            as SDPA's; made into an additive one), broadcastable (NumPy rules) to ``[B, H, Sq, Sk]`` whatever the
            layout; the key dimension must be ``Sk``.
        key_lengths: int32 or int64 ``[B]``: keys at or past ``key_lengths[b]`` are hidden.
        causal: query ``i`` sees key ``j`` only when ``j <= i + causal_offset``: by default bottom-right aligned
            (the last query sees every key). SDPA's ``is_causal`` is top-left (``causal_offset=0``); see
            ``attnkit.torch.scaled_dot_product_attention`` for SDPA's semantics.
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
        threads: CPU worker threads, at most 1024 (default: all cores); the result does not depend on it.
        plan: plan overrides for tests and benchmarks that compare kernels on one problem, e.g.
            ``"kernel=mma,splits=4,off=plain+call-pdl"`` (the C++ ``PlanOverrides`` text form); ``""`` (default):
            the plan's own choices. A bad name raises ValueError. With torch tensors a non-empty ``plan`` calls
            the binding directly (eager and CUDA-graph capture; not through the torch custom op, so not under
            ``torch.compile``).
        block_table: int32 ``[B, max_pages_per_seq]``: K and V are a paged cache, ``k`` and ``v`` its pages
            ``[num_pages, page_size, Hkv, D]`` (``kv_layout="nhd"``) or ``[num_pages, Hkv, page_size, D]``
            (``"hnd"``); key ``j`` of batch entry ``b`` is row ``j % page_size`` of page
            ``block_table[b, j // page_size]``. ``key_lengths`` gives each entry's keys (default: every page
            of its row); causal is bottom-right per entry. Host or CUDA arrays (as attention_varlen); no mask.
        kv_layout: the pages' axis order with ``block_table``: ``"nhd"`` or ``"hnd"``.
        backend: ``"auto"`` (the arrays' device decides), ``"cpu"`` (the tiled SIMD kernel),
            ``"reference"`` (float64, slow: the oracle of the tests), ``"cuda"`` (CUDA arrays only) or
            ``"vulkan"`` (host arrays, uploaded to the first Vulkan GPU, else a CPU Vulkan device, and copied back).

    Returns:
        ``out``, or ``(out, lse)`` when ``return_lse`` is true.

    Raises:
        TypeError: an argument is not an array, or has the wrong dtype.
        ValueError: a shape, stride, device or option is not accepted; the message is the library's
            (``"argument: rule"``). Nothing is written.
    """
    # The plainest eager call on torch tensors first, its checks flat: a tiny call's cost is mostly this Python
    # (bench/python_call_overhead.py). plain_attention gives None for anything else (tracing, compiling, a
    # tensor subclass), which takes the general path below.
    if (type(q) is _TORCH_TENSOR and mask is None and key_lengths is None and head_sink is None and out is None
            and (causal_offset is None or type(causal_offset) is int) and window is None and softcap is None
            and not return_lse and not plan and block_table is None and (scale is None or type(scale) is float)
            and (threads is None or type(threads) is int) and type(masked_rows) is str and type(layout) is str
            and type(backend) is str):
        o = _TORCH_OPS.plain_attention(q, k, v, bool(causal), causal_offset, scale, masked_rows, layout, threads,
                                       backend)
        if o is not None:
            return o
    if block_table is not None:
        return _paged_attention(q, k, v, block_table, key_lengths, causal, causal_offset, window, softcap, scale,
                                masked_rows, return_lse, out, layout, head_sink, threads, backend, mask, kv_layout, plan)
    if _is_torch_tensor(q) and not plan:  # (plan overrides, for benchmarks: the binding itself, eager calls only)
        ops = _TORCH_OPS or _load_torch_ops()
        # The common call (every option of its plain type) without the checks below: a small eager call's cost is
        # mostly Python (bench/python_call_overhead.py); the binding still checks every value.
        if (causal_offset is None and window is None and softcap is None and (scale is None or type(scale) is float)
                and (threads is None or type(threads) is int) and type(masked_rows) is str and type(layout) is str
                and type(backend) is str):
            return ops.attention(q, k, v, mask, key_lengths, head_sink, bool(causal), None, None, None, None, scale,
                                 masked_rows, bool(return_lse), out, layout, threads, backend)
        return ops.attention(
            q, k, v, mask, key_lengths, head_sink, bool(causal), *_causal_offset(causal_offset),
            _optional_int("window", window), _optional_float("softcap", softcap), _optional_float("scale", scale),
            _choice("masked_rows", masked_rows, ("nan", "zero")), bool(return_lse), out,
            _choice("layout", layout, ("bhsd", "bshd")), _optional_int("threads", threads),
            _choice("backend", backend, ("auto", "cpu", "reference", "cuda")))
    mask, key_lengths = _host_mask(mask, q), _host_int32(key_lengths)
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
        _optional_int("threads", threads, _INT32),
        _choice("backend", backend, ("auto", "cpu", "reference", "cuda", "vulkan")),
        _current_stream(q),
        _allocator(q),
        None,
        str(plan),
    )
    return (o, lse) if return_lse else o


def _swap_seq_heads(x: Any) -> Any:
    """A view of a 4-D array with axes 1 and 2 swapped (``[B, H, S, D]`` <-> ``[B, S, H, D]``)."""
    if x is None:
        return None
    if _is_torch_tensor(x):
        return x.transpose(1, 2)
    import numpy as np

    return np.swapaxes(x, 1, 2)


def _index_array(x: Any) -> Any:
    """An int64 index array (NumPy, or torch on the host or a CUDA device: a device op, no read-back) as int32;
    others as they are (the binding checks). A value past int32 becomes int32's limit, which the checks refuse."""
    if _is_torch_tensor(x) and str(x.dtype) == "torch.int64":
        import torch

        return x.clamp(-1, 2**31 - 1).to(torch.int32)
    return _host_int32(x)


def _run_sequences(q, k, v, cu_q, cu_k, block_table, key_lengths, max_q, max_k, causal, window, softcap, scale,
                   masked_rows, return_lse, out, head_sink, threads, backend, kv_layout, plan=""):
    # (The binding takes these two as flags: a misspelt value must not pass for the default.)
    if _choice("kv_layout", kv_layout, ("nhd", "hnd")) not in ("nhd", "hnd"):
        raise ValueError(f"kv_layout: must be 'nhd' or 'hnd', got {kv_layout!r}")
    if _choice("masked_rows", masked_rows, ("nan", "zero")) not in ("nan", "zero"):
        raise ValueError(f"masked_rows: must be 'nan' or 'zero', got {masked_rows!r}")
    if _is_torch_tensor(q) and not plan:  # the custom ops (torch.compile); plan overrides: the binding itself
        ops = _TORCH_OPS or _load_torch_ops()
        return ops.sequences(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, operator.index(max_q),
                             operator.index(max_k), bool(causal), _optional_int("window", window),
                             _optional_float("softcap", softcap), _optional_float("scale", scale),
                             masked_rows == "zero", bool(return_lse), out, kv_layout == "hnd",
                             _optional_int("threads", threads, _INT32),
                             _choice("backend", backend, ("auto", "cpu", "reference", "cuda")))
    return _attnkit.attention_sequences(
        q, k, v, _index_array(cu_q), _index_array(cu_k), _index_array(block_table), _index_array(key_lengths), head_sink,
        operator.index(max_q), operator.index(max_k), bool(causal), _optional_int("window", window),
        _optional_float("softcap", softcap), _optional_float("scale", scale),
        _choice("masked_rows", masked_rows, ("nan", "zero")) == "zero", bool(return_lse), out,
        _choice("kv_layout", kv_layout, ("nhd", "hnd")) == "hnd", _optional_int("threads", threads, _INT32),
        _choice("backend", backend, ("auto", "cpu", "reference", "cuda", "vulkan")), _current_stream(q), _allocator(q),
        str(plan))


def _paged_attention(q, k, v, block_table, key_lengths, causal, causal_offset, window, softcap, scale, masked_rows,
                     return_lse, out, layout, head_sink, threads, backend, mask, kv_layout, plan):
    if mask is not None:
        raise ValueError("mask: is not supported with block_table (paged K/V)")
    if causal_offset is not None:
        raise ValueError("causal_offset: with block_table causal is bottom-right per batch entry; leave it unset")
    bshd = _choice("layout", layout, ("bhsd", "bshd")) == "bshd"
    qv = q if bshd else _swap_seq_heads(q)
    ov = out if bshd or out is None else _swap_seq_heads(out)
    o, lse = _run_sequences(qv, k, v, None, None, block_table, key_lengths, qv.shape[1], -1, causal, window, softcap,
                            scale, masked_rows, return_lse, ov, head_sink, threads, backend, kv_layout, plan)
    o = o if bshd or out is not None else _swap_seq_heads(o)
    o = out if out is not None else o
    return (o, lse) if return_lse else o


def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    scale: Optional[float] = None,
    head_sink: Any = None,
    masked_rows: str = "nan",
    return_lse: bool = False,
    out: Any = None,
    block_table: Any = None,
    kv_layout: str = "nhd",
    threads: Optional[int] = None,
    backend: str = "auto",
    plan: str = "",
) -> Union[Any, Tuple[Any, Any]]:
    """Attention over a ragged (packed) batch, in flash-attn's varlen convention.

    Sequence ``b``'s queries are rows ``cu_seqlens_q[b]`` to ``cu_seqlens_q[b + 1] - 1`` of ``q``
    ``[total_q, H, D]``, its keys rows ``cu_seqlens_k[b]`` to ``cu_seqlens_k[b + 1] - 1`` of ``k`` / ``v``
    ``[total_k, Hkv, D]`` (any strides with a contiguous last dimension). Causal is bottom-right per sequence
    (its last query sees every key of its sequence). With ``block_table`` (int32 ``[B, max_pages_per_seq]``),
    ``k`` and ``v`` are a paged cache instead (see :func:`attention`) and ``cu_seqlens_k`` gives each
    sequence's key count. Returns ``out`` ``[total_q, H, Dv]`` (rows no sequence owns are not written), and
    with ``return_lse`` the float32 LSE ``[H, total_q]``. Host arrays run on the CPU backend (or, with
    ``backend="vulkan"`` on NumPy arrays, on the Vulkan backend, which checks the values as the CPU does); CUDA
    arrays on the CUDA backend, which reads ``cu_seqlens_*``, ``block_table`` and key lengths on the device only
    (no synchronisation: the call captures in a CUDA graph; the plan comes from ``max_seqlen_q`` /
    ``max_seqlen_k`` and the cache's capacity). Out-of-range device values cannot raise: the sequence they
    belong to gives masked rows (bad keys) or no rows (bad queries); see docs/numerics.md.

    Raises:
        TypeError: an argument is not an array, or has the wrong dtype.
        ValueError: a shape, option or value (cu_seqlens not increasing, a sequence longer than its maximum, a
            block-table entry past the pages) is not accepted; nothing is written.
    """
    key_lengths = None
    if block_table is not None:
        if _is_torch_tensor(cu_seqlens_k):
            key_lengths = cu_seqlens_k.diff() if cu_seqlens_k.ndim == 1 and cu_seqlens_k.numel() > 0 else cu_seqlens_k
        else:
            import numpy as np

            cu_k = np.asarray(cu_seqlens_k).astype(np.int64)
            key_lengths = np.diff(cu_k) if cu_k.ndim == 1 and cu_k.size > 0 else cu_k
        cu_seqlens_k = None
    o, lse = _run_sequences(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, key_lengths, max_seqlen_q,
                            max_seqlen_k, causal, window, softcap, scale, masked_rows, return_lse, out, head_sink,
                            threads, backend, kv_layout, plan)
    return (o, lse) if return_lse else o


def append_kv(
    k_new: Any,
    v_new: Any,
    k_cache: Any,
    v_cache: Any,
    positions: Any,
    *,
    block_table: Any = None,
    new_lengths: Any = None,
    kv_layout: str = "nhd",
    cos_cache: Any = None,
    sin_cache: Any = None,
    rotary_interleaved: bool = False,
    k_scale: Any = None,
    v_scale: Any = None,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    kv_cache_bit_width: int = 0,
    backend: str = "auto",
) -> None:
    """Writes new K/V rows into paged or dense caches, in place: the cache update of a serving step.

    ``k_new`` / ``v_new`` are ``[B, new_len, Hkv, D]`` (the projections' layout; any strides with a contiguous
    last dimension). Row ``r`` of entry ``b`` goes to position ``positions[b] + r`` of that entry (int32 or int64
    ``[B]``; ``new_lengths`` ``[B]``: entry ``b`` appends only its first ``new_lengths[b]`` rows). With
    ``block_table`` (int32 ``[B, max_pages_per_seq]``) the caches are pages, ``[num_pages, page_size, Hkv, D]``
    (``kv_layout="nhd"``) or ``[num_pages, Hkv, page_size, D]`` (``"hnd"``), as :func:`attention` reads them:
    position ``p`` is row ``p % page_size`` of page ``block_table[b, p // page_size]``. Without it they are dense,
    ``[B, capacity, Hkv, D]`` (``"nhd"``) or ``[B, Hkv, capacity, D]`` (``"hnd"``). Rows are copied as they are
    (same dtype: float32, float16 or bfloat16) unless one of the options below says otherwise; both are the
    GroupQueryAttention op's (:func:`group_query_attention`: the same arguments, the same bits in the caches).

    Rotary: ``cos_cache`` / ``sin_cache`` ``[max_position, rotary_dim / 2]`` of the rows' dtype rotate the first
    ``rotary_dim`` values of each new K row (``rotary_dim <= D``) at its own position ``positions[b] + r``, pairs
    ``(x[i], x[i + rotary_dim / 2])`` or, with ``rotary_interleaved``, ``(x[2i], x[2i + 1])``; V is not rotated.

    Quantized caches: ``k_quant_type`` / ``v_quant_type`` ``"PER_TENSOR"`` or ``"PER_CHANNEL"`` (``"NONE"``: a
    cache of the rows' dtype) with ``kv_cache_bit_width`` 8 (an int8 cache) or 4 (a uint8 cache of int4 pairs,
    last dimension ``(D + 1) // 2`` bytes); ``k_scale`` / ``v_scale`` float32 ``[1]`` or ``[Hkv * D]``, finite and
    > 0. A value ``x`` is stored as ``clamp(rint(x / scale))``.

    Host arrays run on the CPU: a position, new length or page out of range (or past ``cos_cache``'s rows) raises
    ``ValueError`` before anything is written. CUDA arrays run on the current stream and the values are read on the
    device only (no synchronisation: the call captures in a CUDA graph); an entry with a value out of range writes
    nothing. torch tensors go through the custom op ``torch.ops.attnkit.append_kv`` (mutating ``k_cache`` and
    ``v_cache``), so ``torch.compile`` and CUDA graphs capture it.

    Raises:
        TypeError: an argument is not an array, or has the wrong dtype.
        ValueError: a shape, layout or (host) value is not accepted; nothing is written.
    """
    if _choice("kv_layout", kv_layout, ("nhd", "hnd")) not in ("nhd", "hnd"):
        raise ValueError(f"kv_layout: must be 'nhd' or 'hnd', got {kv_layout!r}")
    hnd = kv_layout == "hnd"
    backend = _choice("backend", backend, ("auto", "cpu", "cuda"))
    interleaved = _int_attribute("rotary_interleaved", rotary_interleaved)
    if interleaved not in (0, 1):
        raise ValueError(f"rotary_interleaved: must be a bool (or 0 / 1), got {rotary_interleaved!r}")
    quant = (_string_attribute("k_quant_type", k_quant_type), _string_attribute("v_quant_type", v_quant_type),
             _int_attribute("kv_cache_bit_width", kv_cache_bit_width))
    if _is_torch_tensor(k_new):
        ops = _TORCH_OPS or _load_torch_ops()
        ops.append_kv(k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd, cos_cache, sin_cache,
                      bool(interleaved), k_scale, v_scale, *quant, backend)
        return
    _attnkit.append_kv(k_new, v_new, k_cache, v_cache, _index_array(positions), _index_array(block_table),
                       _index_array(new_lengths), hnd, cos_cache, sin_cache, bool(interleaved), k_scale, v_scale,
                       *quant, backend, _current_stream(k_new))


def _int_attribute(name: str, value: Any) -> int:
    """An integer attribute (a bool counts as 0 / 1, as ONNX flags do)."""
    if isinstance(value, bool):
        return int(value)
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: must be an integer, got {type(value).__name__}") from None
    return _in_range(name, n, _INT64)


def _float_attribute(name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__}") from None


def _string_attribute(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: must be a string ('NONE', 'PER_TENSOR' or 'PER_CHANNEL'), got {type(value).__name__}")
    return value


def _total_sequence_length(value: Any) -> Any:
    """An int becomes the int32 scalar array ONNX Runtime takes; an array is passed as it is."""
    if value is None:
        raise TypeError("total_sequence_length: is required (int32 scalar: the longest sequence's total length, "
                        "past + new)")
    if isinstance(value, bool):
        raise TypeError("total_sequence_length: must be an int or an int32 array, got bool")
    try:
        n = operator.index(value)
    except TypeError:
        return value
    import numpy as np

    if not -(2**31) <= n < 2**31:
        raise ValueError(f"total_sequence_length: = {n} does not fit in int32")
    return np.array(n, dtype=np.int32)


def _gqa_allocator(query: Any):
    """``alloc(shape, dtype_name)`` for the outputs not passed in, on query's device: torch tensors for torch input
    (CPU or CUDA), CuPy arrays for CuPy input, NumPy arrays for host input of any other kind."""

    def alloc(shape: Tuple[int, ...], dtype_name: str):
        if _is_torch_tensor(query):
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtype_name), device=query.device)
        if _on_cuda(query):
            if type(query).__module__.startswith("cupy") and dtype_name != "bfloat16":  # CuPy has no bfloat16
                import cupy

                with cupy.cuda.Device(_dlpack_device(query)[1]):
                    return cupy.empty(shape, dtype=dtype_name)
            raise TypeError(f"output: cannot allocate a {dtype_name} {shape} CUDA array for a query of type "
                            f"{type(query).__module__}.{type(query).__qualname__}: pass output=, present_key= and "
                            "present_value= (outputs are allocated for torch tensors, and CuPy arrays other than "
                            "bfloat16)")
        import numpy as np

        if dtype_name == "bfloat16":
            import ml_dtypes

            return np.empty(shape, dtype=ml_dtypes.bfloat16)
        return np.empty(shape, dtype=np.dtype(dtype_name))

    return alloc


def group_query_attention(
    query: Any,
    key: Any = None,
    value: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    seqlens_k: Any = None,
    total_sequence_length: Any = None,
    cos_cache: Any = None,
    sin_cache: Any = None,
    position_ids: Any = None,
    attention_bias: Any = None,
    head_sink: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    q_norm_weight: Any = None,
    k_norm_weight: Any = None,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    softcap: float = 0.0,
    local_window_size: int = -1,
    causal: int = 1,
    do_rotary: int = 0,
    rotary_interleaved: int = 0,
    smooth_softmax: int = -1,
    qk_output: int = 0,
    k_quant_type: str = "NONE",
    v_quant_type: str = "NONE",
    kv_cache_bit_width: int = 0,
    sliding_window_cache: int = 0,
    qk_norm_epsilon: float = 1e-6,
    present_key: Any = None,
    present_value: Any = None,
    output: Any = None,
    output_qk: Any = None,
    threads: Optional[int] = None,
) -> Tuple[Any, ...]:
    """ONNX Runtime's ``com.microsoft.GroupQueryAttention`` (its newest schema) on the CPU or on CUDA.

    Inputs, attributes and outputs have ONNX Runtime's names, order, shapes and defaults (B batch, S new tokens,
    N = num_heads, Nkv = kv_num_heads, H head size, T total_sequence_length, C cache rows). Arrays are taken as
    they are (DLPack or the buffer protocol: NumPy, PyTorch, CuPy, ...), never copied: they must be C-contiguous,
    of the types below. Absent optional inputs are None.

    The query's device picks the backend. A host query (NumPy, a CPU tensor) runs on the CPU, and every array
    must then be host memory. A CUDA query (a PyTorch or CuPy CUDA tensor) runs on the CUDA backend, on the
    caller's current stream (PyTorch's or CuPy's, else the default stream): every array must then be on query's
    device, except seqlens_k, total_sequence_length, position_ids, head_sink, k_scale and v_scale, which may also
    be host arrays. The op reads their values on the host (its checks and plan) before it writes anything, so
    device copies of them are read back (a synchronisation); pass them on the host (NumPy, a CPU tensor, a Python
    int) and a decode step queues its kernels without waiting. A CUDA query raises
    ValueError when this build has no CUDA backend or it finds no device (``available_backends()``).

    Args:
        query: ``(B, S, N*H)``; or packed QKV ``(B, S, (N + 2*Nkv)*H)``, each token ``[Q | K | V]``, when key
            and value are None. float32, float16 or bfloat16 (NumPy: ``ml_dtypes.bfloat16``); every float input
            and output has this type.
        key, value: ``(B, S, Nkv*H)``.
        past_key, past_value: BNSH caches ``(B, Nkv, P, H)`` (int4: ``(B, Nkv, P, (H+1)//2)`` bytes): the query's
            type, int8, or uint8 (int4, two values per byte) for quantized caches.
        seqlens_k: int32 ``(B,)``: each sequence's total length (past + new) minus one. Required.
        total_sequence_length: int32 scalar (or a Python int): the longest total length. ``S == T`` is a
            first prompt (no past); otherwise sequence b has ``seqlens_k[b] + 1 - S`` past tokens. Required.
        cos_cache, sin_cache: ``(max_positions, rotary_dim/2)`` for ``do_rotary``; rotary_dim may be less than H.
        position_ids: int64 ``(B, S)``: rotary positions (default: each token's position in its sequence).
        attention_bias: ``(B or 1, N or 1, S, T)``, added to the scores (after the softcap).
        head_sink: ``(N,)``: a logit per head that joins the softmax denominator only.
        k_scale, v_scale: float32 dequantization scales: 1 value (``PER_TENSOR``) or ``Nkv*H`` values
            (``PER_CHANNEL``, any shape, e.g. ``(1, Nkv, 1, H)``).
        q_norm_weight, k_norm_weight: ``(H,)``: per-head RMS norm of Q and K before rotary (both or neither).
        num_heads, kv_num_heads: head counts; num_heads must be a multiple of kv_num_heads.
        scale: score scale (0: ``1/sqrt(H)``). softcap: ``c * tanh(s / c)`` on the scores (0: off).
        local_window_size: W >= 1: position p sees keys ``p - W < j <= p`` (W keys including itself); -1: off.
            Needs causal = 1.
        causal: 1 (default) or 0 (bidirectional over each sequence's keys).
        do_rotary, rotary_interleaved: rotary embedding of Q and the new K (pairs ``(x[i], x[i + rot/2])``, or
            ``(x[2i], x[2i+1])`` when interleaved).
        smooth_softmax: 1: a zero logit in every denominator; 0 or -1 (ONNX Runtime's default): off. Not with
            head_sink.
        qk_output: 0 (default), 1 (also return the scores before the softmax) or 2 (the probabilities after it),
            ``(B, N, S, T)``.
        k_quant_type, v_quant_type: ``"NONE"``, ``"PER_TENSOR"`` or ``"PER_CHANNEL"``.
        kv_cache_bit_width: 8 (int8) or 4 (int4) when a cache is quantized.
        sliding_window_cache: 1: the caches are fixed-size windows of C rows that drop their oldest rows from the
            front: after a call row r holds token ``T_b - L + r`` with ``L = min(T_b, C)`` (the window stays full).
            Needs ``local_window_size`` W and ``C >= W - 1 + S``. ONNX Runtime 1.32's CPU kernel evicts
            ``C - W + 1`` rows at a time instead, so with C > W the two read each other's window caches
            differently; with ``C == W`` the layouts are the same.
        qk_norm_epsilon: epsilon of the Q/K RMS norm.
        present_key, present_value: the updated caches. Pass the same arrays as past_key / past_value (a shared
            buffer of C >= every total length rows) to append in place; pass other writable arrays to have the
            past copied into them; or leave them None to get new ones (ONNX Runtime's shape: past's rows, or
            ``max(T, P)``).
        output, output_qk: optional destinations (default: new arrays of query's kind on query's device; for
            CUDA arrays of other frameworks than PyTorch and CuPy, pass every output).
        threads: CPU threads, at most 1024 (default: all cores); the result does not depend on it. Ignored on CUDA.

    Returns:
        ``(output, present_key, present_value)``, plus ``output_qk`` when qk_output != 0. A present cache passed
        in is returned as it is (for a shared buffer: past_key itself, appended in place).

    Raises:
        TypeError: an argument is not an array or has a type the op does not take.
        ValueError: a shape, length, attribute, buffer or device breaks a rule; the message names the input and
            the rule (``"seqlens_k[1]: = 900 exceeds the cache capacity 512 ..."``, ``"past_key: lives on cpu but
            query is on cuda:0; ..."``). Nothing is written: the outputs and caches passed in are unchanged.
    """
    if seqlens_k is None:
        raise TypeError("seqlens_k: is required (int32 (batch,): each sequence's total length minus one)")
    if _is_torch_tensor(query):
        _torch_ops = _TORCH_OPS or _load_torch_ops()
        if total_sequence_length is None:
            _total_sequence_length(None)
        attrs = (
            _int_attribute("num_heads", num_heads), _int_attribute("kv_num_heads", kv_num_heads),
            _float_attribute("scale", scale), _float_attribute("softcap", softcap),
            _int_attribute("local_window_size", local_window_size), _int_attribute("causal", causal),
            _int_attribute("do_rotary", do_rotary), _int_attribute("rotary_interleaved", rotary_interleaved),
            _int_attribute("smooth_softmax", smooth_softmax), _int_attribute("qk_output", qk_output),
            _string_attribute("k_quant_type", k_quant_type), _string_attribute("v_quant_type", v_quant_type),
            _int_attribute("kv_cache_bit_width", kv_cache_bit_width),
            _int_attribute("sliding_window_cache", sliding_window_cache),
            _float_attribute("qk_norm_epsilon", qk_norm_epsilon))
        return _torch_ops.group_query_attention(
            (query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
             attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight), total_sequence_length,
            (output, present_key, present_value, output_qk), attrs, _optional_int("threads", threads))
    inputs = tuple(_fast_dlpack(x) for x in (
        query, key, value, past_key, past_value, seqlens_k, _total_sequence_length(total_sequence_length), cos_cache,
        sin_cache, position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight))
    qk = _int_attribute("qk_output", qk_output)
    results = _attnkit.group_query_attention(
        inputs,
        _int_attribute("num_heads", num_heads),
        _int_attribute("kv_num_heads", kv_num_heads),
        _float_attribute("scale", scale),
        _float_attribute("softcap", softcap),
        _int_attribute("local_window_size", local_window_size),
        _int_attribute("causal", causal),
        _int_attribute("do_rotary", do_rotary),
        _int_attribute("rotary_interleaved", rotary_interleaved),
        _int_attribute("smooth_softmax", smooth_softmax),
        qk,
        _string_attribute("k_quant_type", k_quant_type),
        _string_attribute("v_quant_type", v_quant_type),
        _int_attribute("kv_cache_bit_width", kv_cache_bit_width),
        _int_attribute("sliding_window_cache", sliding_window_cache),
        _float_attribute("qk_norm_epsilon", qk_norm_epsilon),
        output,
        present_key,
        present_value,
        output_qk,
        _optional_int("threads", threads, _INT32),
        _current_stream(query),
        _gqa_allocator(query),
    )
    return tuple(results)
