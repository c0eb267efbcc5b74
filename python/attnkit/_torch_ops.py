"""attnkit's ops as PyTorch custom ops: ``torch.ops.attnkit.attention`` and ``torch.ops.attnkit.group_query_attention``.

Imported (and so registered) by ``import attnkit`` when torch is already imported, by ``import attnkit.torch``, and
by the first ``attnkit.attention`` / ``attnkit.group_query_attention`` call on a torch tensor. Each op has a fake
kernel (shapes, dtypes and strides of its outputs without running it), so ``torch.compile(fullgraph=True)``,
``torch.export`` and ``make_fx`` see one opaque node; the GQA op names the caches it appends to in place as mutated.
CUDA tensors run on the caller's current stream with outputs and scratch from torch's allocator, so a call can be
captured into a CUDA graph.

An eager call on plain tensors (no tracing, no compiling, no dispatch mode) runs the same implementation directly,
without the dispatcher's round trip: a tiny call's cost is then the binding's alone. Everything else goes through
``torch.ops.attnkit.*``. There is no backward: a tensor that requires grad is refused, naming the argument.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch.utils.dlpack import to_dlpack

from . import _attnkit

_INT32_MAX = 2**31 - 1


def refuse_grad(**tensors: Any) -> None:
    """Raises when any tensor requires grad (attnkit has no backward; detaching silently would cut the graph)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(f"{name}: requires grad, but attnkit has no backward (its result would silently cut "
                               f"the gradient); call it under torch.no_grad() or pass {name}.detach()")


def _plain_eager(tensors: Sequence[Any]) -> bool:
    """Whether this call can skip the dispatcher: eager, untraced, no dispatch mode, plain tensors only."""
    if torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None:
        return False
    if torch._C._len_torch_dispatch_stack() != 0:
        return False
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor:
            return False
    return True


def _as_tensor(a: Any) -> Optional[torch.Tensor]:
    """A small input given as a NumPy array (or scalar) beside torch tensors, as a CPU tensor; ml_dtypes bfloat16,
    which torch.as_tensor refuses, through its 16-bit pattern."""
    if a is None or isinstance(a, torch.Tensor):
        return a
    import numpy as np

    arr = np.asarray(a)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint16)).view(torch.bfloat16)
    return torch.as_tensor(arr)


def _capsule(t: Any) -> Any:
    """A tensor as a DLPack capsule made by torch's C function (one exchange, no Python ``__dlpack__``); another
    array (a NumPy scalar input beside a torch query) as it is."""
    return to_dlpack(t) if isinstance(t, torch.Tensor) else t


# The raw pointer of the current stream, without building a torch.cuda.Stream object (a few microseconds of a tiny
# call's cost); torch.cuda's public way where the private function is missing.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: torch.Tensor) -> int:
    """The caller's current CUDA stream on t's device (0 for a CPU tensor)."""
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return int(_raw_stream(t.get_device()))
    return int(torch.cuda.current_stream(t.device).cuda_stream)


def _allocator(like: torch.Tensor):
    def alloc(shape, what_or_dtype: str):
        if what_or_dtype in ("lse", "scratch"):
            dtype = torch.float32
        elif what_or_dtype == "out":
            dtype = like.dtype
        else:
            dtype = getattr(torch, what_or_dtype)
        return torch.empty(tuple(shape), dtype=dtype, device=like.device)

    return alloc


def _refuse_allocation(shape, what):
    """The allocator of a host call whose outputs were all made beforehand (the binding then asks for nothing)."""
    raise AssertionError(f"{what}: attnkit asked for an array it was given")


def additive_mask(mask: Optional[torch.Tensor], q: torch.Tensor) -> Optional[torch.Tensor]:
    """A boolean mask (True: visible, as SDPA) as an additive one in q's dtype (float16/bfloat16) or float32; float
    masks as they are (the binding names any dtype it refuses)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.float32
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def int32_lengths(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """int64 lengths (torch's default integer type) as the int32 the kernels read. A value past int32 is clamped to
    int32's limit, which the library's own range check then refuses."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        return t
    return t.clamp(-1, _INT32_MAX).to(torch.int32)


# ---- the ops' registration ----

# Each op is defined by torch.library's own registration: its schema from the function's annotations
# (torch.library.infer_schema, as custom_op makes it), the function as its kernel on every device
# (CompositeExplicitAutograd) and a fake kernel beside it (torch.library.register_fake). custom_op would also put
# an autograd layer of its own around every call; attnkit has no backward (refuse_grad raises before a kernel runs),
# and on a small call that layer was half of the time through torch's dispatcher, which is the path compiled and
# traced code takes (bench/python_call_overhead.py).
_LIBRARY = torch.library.Library("attnkit", "DEF")


def _define_op(name: str, mutates_args: Sequence[str] = ()):
    """Decorator: defines attnkit::<name> with the function as its kernel; gives back torch.ops.attnkit.<name>, so
    that a call of the name goes through the dispatcher (what tracing, compiling and dispatch modes see)."""
    def define(fn):
        _LIBRARY.define(name + torch.library.infer_schema(fn, mutates_args=tuple(mutates_args)))
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return getattr(torch.ops.attnkit, name).default
    return define


def _fake(name: str):
    return torch.library.register_fake("attnkit::" + name)


# ---- attention ----

def _attention_impl(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window, softcap,
                    scale, masked_rows, return_lse, layout, threads, backend, out=None):
    # (Written flat: this is the whole Python cost of a small eager call; bench/python_call_overhead.py times it.)
    if mask is not None:
        mask = _capsule(additive_mask(mask, q))
    if key_lengths is not None:
        key_lengths = _capsule(int32_lengths(key_lengths))
    if causal_offsets is not None:
        causal_offsets = _capsule(int32_lengths(causal_offsets))
    if head_sink is not None:
        head_sink = _capsule(head_sink)
    # The outputs are made here, dense, and go in as capsules like the inputs: one DLPack exchange per array and
    # no callback (the binding still asks `alloc` for CUDA scratch, and for outputs of a q it will refuse anyway).
    o = out
    lse = None
    if q.dim() == 4 and v.dim() == 4:
        shape = q.shape
        if o is None:
            o = q.new_empty((shape[0], shape[1], shape[2], v.shape[3]))
        if return_lse:
            lse = q.new_empty((shape[0], shape[1], shape[2]) if layout == "bhsd" else (shape[0], shape[2], shape[1]),
                              dtype=torch.float32)
    result = _attnkit.attention(
        to_dlpack(q), to_dlpack(k), to_dlpack(v), mask, key_lengths, head_sink, causal, causal_offset,
        causal_offsets, window, softcap, scale, masked_rows, return_lse, None if o is None else to_dlpack(o), layout,
        threads, backend, _stream(q),
        _allocator(q) if q.is_cuda or o is None or (return_lse and lse is None) else _refuse_allocation,
        None if lse is None else to_dlpack(lse))
    if o is None:
        o = result[0]
    if lse is None and return_lse:
        lse = result[1]
    return o, lse


@_define_op("attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                 key_lengths: Optional[torch.Tensor], head_sink: Optional[torch.Tensor], causal: bool,
                 causal_offset: Optional[int], causal_offsets: Optional[torch.Tensor], window: Optional[int],
                 softcap: Optional[float], scale: Optional[float], masked_rows: str, return_lse: bool, layout: str,
                 threads: Optional[int], backend: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """attnkit.attention on torch tensors; returns (out, lse), lse of shape (0,) unless return_lse."""
    o, lse = _attention_impl(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window,
                             softcap, scale, masked_rows, return_lse, layout, threads, backend)
    return o, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


def _out_shape(q: torch.Tensor, v: torch.Tensor, layout: str) -> List[int]:
    shape = list(q.shape)
    if len(shape) == 4 and v.dim() == 4:
        shape[3] = v.shape[3]
    return shape


@_fake("attention")
def _attention_fake(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window, softcap,
                    scale, masked_rows, return_lse, layout, threads, backend):
    torch._check(q.dim() == 4, lambda: f"q: must be 4-D, got shape {tuple(q.shape)}")
    out = q.new_empty(_out_shape(q, v, layout))
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    b, h, s = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty((b, h, s), dtype=torch.float32)


@_define_op("attention_out", mutates_args=("out",))
def attention_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                     key_lengths: Optional[torch.Tensor], head_sink: Optional[torch.Tensor], causal: bool,
                     causal_offset: Optional[int], causal_offsets: Optional[torch.Tensor], window: Optional[int],
                     softcap: Optional[float], scale: Optional[float], masked_rows: str, return_lse: bool,
                     layout: str, threads: Optional[int], backend: str, out: torch.Tensor) -> torch.Tensor:
    """attnkit.attention into ``out`` (written in place); returns lse, of shape (0,) unless return_lse."""
    lse = _attention_impl(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window,
                          softcap, scale, masked_rows, return_lse, layout, threads, backend, out)[1]
    return lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@_fake("attention_out")
def _attention_out_fake(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window,
                        softcap, scale, masked_rows, return_lse, layout, threads, backend, out):
    return _attention_fake(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window,
                           softcap, scale, masked_rows, return_lse, layout, threads, backend)[1]


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_dispatch_depth = torch._C._len_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled


def plain_attention(q, k, v, causal, causal_offset, scale, masked_rows, layout, threads, backend):
    """attnkit.attention's plainest eager call (no option but causal, an int causal_offset, scale, masked_rows,
    layout, threads and backend; plain tensors; not traced, compiled or under a dispatch mode) straight into the
    binding, which checks every value; None for any other call (the caller then takes the general path)."""
    if (type(k) is not _Tensor or type(v) is not _Tensor or q.dim() != 4 or v.dim() != 4 or _is_compiling()
            or _tracing_state() is not None or _dispatch_depth() != 0):
        return None
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        refuse_grad(q=q, k=k, v=v)
    shape = q.shape
    o = q.new_empty((shape[0], shape[1], shape[2], v.shape[3]))
    cuda = q.is_cuda
    _attnkit.attention(to_dlpack(q), to_dlpack(k), to_dlpack(v), None, None, None, causal, causal_offset, None, None,
                       None, scale, masked_rows, False, to_dlpack(o), layout, threads, backend,
                       _stream(q),
                       _allocator(q) if cuda else _refuse_allocation, None)
    return o


def attention(q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window, softcap, scale,
              masked_rows, return_lse, out, layout, threads, backend):
    """attnkit.attention's path for torch tensors (arguments already checked and normalised by attnkit.attention)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or mask is not None
                                    or head_sink is not None or out is not None):
        refuse_grad(q=q, k=k, v=v, mask=mask, head_sink=head_sink, out=out)
    args = (q, k, v, mask, key_lengths, head_sink, causal, causal_offset, causal_offsets, window, softcap, scale,
            masked_rows, return_lse, layout, threads, backend)
    if _plain_eager((q, k, v, mask, key_lengths, head_sink, causal_offsets, out)):
        o, lse = _attention_impl(*args, out=out)
    elif out is None:
        o, lse = attention_op(*args)
    else:
        lse = attention_out_op(*args, out)
        o = out
    return (o, lse) if return_lse else o


# ---- group_query_attention ----

GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
              "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
              "k_norm_weight")


def _gqa_impl(inputs: Sequence[Optional[torch.Tensor]], total_sequence_length: int, in_place: bool,
              outputs: Sequence[Optional[torch.Tensor]], attrs: Tuple, threads: Optional[int]) -> List[torch.Tensor]:
    query = inputs[0]
    total = torch.tensor(total_sequence_length, dtype=torch.int32)
    arrays = list(inputs[:6]) + [total] + list(inputs[6:])
    arrays[5] = int32_lengths(arrays[5])
    output, present_key, present_value, output_qk = outputs
    if in_place:
        present_key, present_value = arrays[3], arrays[4]
    results = _attnkit.group_query_attention(
        tuple(_capsule(a) for a in arrays), *attrs, _capsule(output), _capsule(present_key),
        _capsule(present_value), _capsule(output_qk), threads, _stream(query), _allocator(query))
    given = (output, present_key, present_value, output_qk)
    fresh = []
    for i in range(4):
        r = results[i] if i < len(results) else None
        fresh.append(query.new_empty((0,)) if given[i] is not None or r is None else r)
    return fresh


# The op's schema lists the inputs one by one (torch.library takes no tuple of optional tensors with names).
@_define_op("group_query_attention",
            mutates_args=("past_key", "past_value", "output", "present_key", "present_value", "output_qk"))
def gqa_op(query: torch.Tensor, key: Optional[torch.Tensor], value: Optional[torch.Tensor],
           past_key: Optional[torch.Tensor], past_value: Optional[torch.Tensor], seqlens_k: torch.Tensor,
           total_sequence_length: int, cos_cache: Optional[torch.Tensor], sin_cache: Optional[torch.Tensor],
           position_ids: Optional[torch.Tensor], attention_bias: Optional[torch.Tensor],
           head_sink: Optional[torch.Tensor], k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
           q_norm_weight: Optional[torch.Tensor], k_norm_weight: Optional[torch.Tensor],
           output: Optional[torch.Tensor], present_key: Optional[torch.Tensor], present_value: Optional[torch.Tensor],
           output_qk: Optional[torch.Tensor], in_place_cache: bool, num_heads: int, kv_num_heads: int, scale: float,
           softcap: float, local_window_size: int, causal: int, do_rotary: int, rotary_interleaved: int,
           smooth_softmax: int, qk_output: int, k_quant_type: str, v_quant_type: str, kv_cache_bit_width: int,
           sliding_window_cache: int, qk_norm_epsilon: float, threads: Optional[int]
           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """attnkit.group_query_attention on torch tensors. ``in_place_cache``: present_key / present_value are
    past_key / past_value themselves (appended in place). Returns [output, present_key, present_value, output_qk]
    for those the op allocated; an output passed in (or absent) comes back as an empty placeholder."""
    inputs = (query, key, value, past_key, past_value, seqlens_k, cos_cache, sin_cache, position_ids,
              attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight)
    attrs = (num_heads, kv_num_heads, scale, softcap, local_window_size, causal, do_rotary, rotary_interleaved,
             smooth_softmax, qk_output, k_quant_type, v_quant_type, kv_cache_bit_width, sliding_window_cache,
             qk_norm_epsilon)
    return tuple(_gqa_impl(inputs, total_sequence_length, in_place_cache,
                           (output, present_key, present_value, output_qk), attrs, threads))


def _new_cache_format(query: torch.Tensor, quant: str, bit_width: int, head_size: int):
    """(dtype, last dimension) of a present cache made without a past cache."""
    if quant != "NONE":
        return (torch.int8, head_size) if bit_width == 8 else (torch.uint8, (head_size + 1) // 2)
    return query.dtype, head_size


@_fake("group_query_attention")
def _gqa_fake(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache,
              position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight, output,
              present_key, present_value, output_qk, in_place_cache, num_heads, kv_num_heads, scale, softcap,
              local_window_size, causal, do_rotary, rotary_interleaved, smooth_softmax, qk_output, k_quant_type,
              v_quant_type, kv_cache_bit_width, sliding_window_cache, qk_norm_epsilon, threads):
    # The shapes ONNX Runtime infers (src/gqa/gqa_check.cpp: output_specs).
    batch, seq, hidden = query.shape
    head_size = hidden // (num_heads + 2 * kv_num_heads) if key is None else hidden // num_heads
    empty = lambda: query.new_empty((0,))  # noqa: E731 - a placeholder each: outputs must not alias
    fresh = [query.new_empty((batch, seq, num_heads * head_size)) if output is None else empty()]
    past_rows = past_key.shape[2] if past_key is not None and past_key.dim() == 4 else 0
    rows = past_rows if past_rows and sliding_window_cache else max(total_sequence_length, past_rows)
    for past, given, quant in ((past_key, present_key, k_quant_type), (past_value, present_value, v_quant_type)):
        if in_place_cache or given is not None:
            fresh.append(empty())
        elif past is not None and past.dim() == 4:
            fresh.append(query.new_empty((batch, kv_num_heads, rows, past.shape[3]), dtype=past.dtype))
        else:
            dtype, last = _new_cache_format(query, quant, kv_cache_bit_width, head_size)
            fresh.append(query.new_empty((batch, kv_num_heads, rows, last), dtype=dtype))
    produced = qk_output != 0 and output_qk is None
    fresh.append(query.new_empty((batch, num_heads, seq, total_sequence_length)) if produced else empty())
    return tuple(fresh)


def _same_memory(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.data_ptr() == b.data_ptr()
            and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype)


def _total_as_int(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.item())  # data-dependent: under torch.compile pass a Python int instead
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        import numpy as np

        return int(np.asarray(value))
    return int(value)


def group_query_attention(inputs: Sequence[Any], total_sequence_length: Any, outputs: Sequence[Any], attrs: Tuple,
                          threads: Optional[int]) -> Tuple[torch.Tensor, ...]:
    """attnkit.group_query_attention's path for a torch query (inputs in ONNX Runtime's order but for
    total_sequence_length, which comes separately; attributes already checked)."""
    refuse_grad(**{name: t for name, t in zip(GQA_INPUTS[:6] + GQA_INPUTS[7:], inputs)})
    output, present_key, present_value, output_qk = outputs
    past_key, past_value = inputs[3], inputs[4]
    in_place = _same_memory(present_key, past_key) and _same_memory(present_value, past_value)
    if in_place:
        present_key = present_value = None
    total = _total_as_int(total_sequence_length)
    qk_output = attrs[9]
    if not _plain_eager(list(inputs) + [output, present_key, present_value, output_qk]):
        inputs = tuple(_as_tensor(t) for t in inputs)
    if _plain_eager(list(inputs) + [output, present_key, present_value, output_qk]):
        fresh = _gqa_impl(inputs, total, in_place, (output, present_key, present_value, output_qk), attrs, threads)
    else:
        fresh = gqa_op(*inputs[:6], total, *inputs[6:], output, present_key, present_value, output_qk, in_place,
                       *attrs, threads)
    given = (output, past_key if in_place else present_key, past_value if in_place else present_value, output_qk)
    results = tuple(g if g is not None else f for g, f in zip(given, fresh))
    return results if qk_output != 0 else results[:3]


# ---- append_kv ----

def _int32(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An int64 index tensor as int32 (a device op where it lies, no read-back); past int32: int32's limit, which
    the checks refuse."""
    if t is not None and t.dtype == torch.int64:
        return t.clamp(-1, _INT32_MAX).to(torch.int32)
    return t


def _append_kv_impl(k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd, cos_cache, sin_cache,
                    rotary_interleaved, k_scale, v_scale, k_quant_type, v_quant_type, kv_cache_bit_width,
                    backend) -> None:
    positions, block_table, new_lengths = _int32(positions), _int32(block_table), _int32(new_lengths)
    optional = [None if t is None else _capsule(t) for t in (block_table, new_lengths, cos_cache, sin_cache, k_scale,
                                                            v_scale)]
    _attnkit.append_kv(_capsule(k_new), _capsule(v_new), _capsule(k_cache), _capsule(v_cache), _capsule(positions),
                       *optional[:2], hnd, *optional[2:4], rotary_interleaved, *optional[4:], k_quant_type,
                       v_quant_type, kv_cache_bit_width, backend, _stream(k_new))


@_define_op("append_kv", mutates_args=("k_cache", "v_cache"))
def append_kv_op(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 positions: torch.Tensor, block_table: Optional[torch.Tensor], new_lengths: Optional[torch.Tensor],
                 hnd: bool, cos_cache: Optional[torch.Tensor], sin_cache: Optional[torch.Tensor],
                 rotary_interleaved: bool, k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
                 k_quant_type: str, v_quant_type: str, kv_cache_bit_width: int, backend: str) -> None:
    """attnkit.append_kv: the new rows (rotary on K, quantized where a cache is) written into k_cache / v_cache in
    place."""
    _append_kv_impl(k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd, cos_cache, sin_cache,
                    rotary_interleaved, k_scale, v_scale, k_quant_type, v_quant_type, kv_cache_bit_width, backend)


@_fake("append_kv")
def _append_kv_fake(k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd, cos_cache, sin_cache,
                    rotary_interleaved, k_scale, v_scale, k_quant_type, v_quant_type, kv_cache_bit_width,
                    backend) -> None:
    return None


def append_kv(k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd: bool, cos_cache, sin_cache,
              rotary_interleaved: bool, k_scale, v_scale, k_quant_type: str, v_quant_type: str,
              kv_cache_bit_width: int, backend: str) -> None:
    """attnkit.append_kv's path for torch tensors: the binding directly in plain eager calls, else the custom op
    (torch.compile, export, dispatch modes see a mutation of the two caches)."""
    refuse_grad(k_new=k_new, v_new=v_new)
    args = (k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, hnd, cos_cache, sin_cache,
            rotary_interleaved, k_scale, v_scale, k_quant_type, v_quant_type, kv_cache_bit_width, backend)
    if _plain_eager((k_new, v_new, k_cache, v_cache, positions, block_table, new_lengths, cos_cache, sin_cache,
                     k_scale, v_scale)):
        _append_kv_impl(*args)
    else:
        append_kv_op(*args)


# ---- ragged batches and paged K/V (attnkit.attention_varlen, attention(..., block_table=)) ----

def _sequences_impl(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window, softcap,
                    scale, masked_zero, return_lse, out, hnd, threads, backend):
    o, lse = _attnkit.attention_sequences(
        q, k, v, _int32(cu_q), _int32(cu_k), _int32(block_table), _int32(key_lengths), head_sink, max_q, max_k,
        causal, window, softcap, scale, masked_zero, return_lse, out, hnd, threads, backend, _stream(q),
        _allocator(q), "")
    return (out if out is not None else o), lse


def _sequences_lse_fake(q, cu_q, return_lse):
    if not return_lse:
        return q.new_empty((0,), dtype=torch.float32)
    if cu_q is not None:  # packed queries [total_q, H, D]: lse [H, total_q]
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)  # [B, Sq, H, D]: [B, H, Sq]


@_define_op("attention_sequences", mutates_args=())
def sequences_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Optional[torch.Tensor],
                 cu_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                 key_lengths: Optional[torch.Tensor], head_sink: Optional[torch.Tensor], max_q: int, max_k: int,
                 causal: bool, window: Optional[int], softcap: Optional[float], scale: Optional[float],
                 masked_zero: bool, return_lse: bool, hnd: bool, threads: Optional[int],
                 backend: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ragged / paged attention on torch tensors; returns (out, lse), lse of shape (0,) unless return_lse."""
    o, lse = _sequences_impl(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window,
                             softcap, scale, masked_zero, return_lse, None, hnd, threads, backend)
    return o, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@_fake("attention_sequences")
def _sequences_fake(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window, softcap,
                    scale, masked_zero, return_lse, hnd, threads, backend):
    shape = list(q.shape)
    shape[-1] = v.shape[-1]
    return q.new_empty(shape), _sequences_lse_fake(q, cu_q, return_lse)


@_define_op("attention_sequences_out", mutates_args=("out",))
def sequences_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: Optional[torch.Tensor],
                     cu_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                     key_lengths: Optional[torch.Tensor], head_sink: Optional[torch.Tensor], max_q: int, max_k: int,
                     causal: bool, window: Optional[int], softcap: Optional[float], scale: Optional[float],
                     masked_zero: bool, return_lse: bool, hnd: bool, threads: Optional[int], backend: str,
                     out: torch.Tensor) -> torch.Tensor:
    """Ragged / paged attention into ``out`` (in place); returns lse, of shape (0,) unless return_lse."""
    lse = _sequences_impl(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window,
                          softcap, scale, masked_zero, return_lse, out, hnd, threads, backend)[1]
    return lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@_fake("attention_sequences_out")
def _sequences_out_fake(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window,
                        softcap, scale, masked_zero, return_lse, hnd, threads, backend, out):
    return _sequences_lse_fake(q, cu_q, return_lse)


def sequences(q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window, softcap, scale,
              masked_zero, return_lse, out, hnd, threads, backend):
    """The ragged / paged path for a torch query: the binding in plain eager calls, else the custom ops (so that
    torch.compile, export and dispatch modes see them). Returns (out, lse or None)."""
    refuse_grad(q=q, k=k, v=v, head_sink=head_sink)
    args = (q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, max_q, max_k, causal, window, softcap, scale,
            masked_zero, return_lse)
    if _plain_eager((q, k, v, cu_q, cu_k, block_table, key_lengths, head_sink, out)):
        return _sequences_impl(*args, out, hnd, threads, backend)
    if out is None:
        o, lse = sequences_op(*args, hnd, threads, backend)
    else:
        o, lse = out, sequences_out_op(*args, hnd, threads, backend, out)
    return o, (lse if return_lse else None)
