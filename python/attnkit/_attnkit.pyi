"""Type stubs of attnkit's compiled core (python/src/module.cpp)."""

from typing import Any, Callable, Optional, Sequence, Tuple

__version__: str
has_cli: bool

def attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    key_lengths: Any,
    head_sink: Any,
    causal: bool,
    causal_offset: Optional[int],
    causal_offsets: Any,
    window: Optional[int],
    softcap: Optional[float],
    scale: Optional[float],
    masked_rows: str,
    return_lse: bool,
    out: Any,
    layout: str,
    threads: Optional[int],
    backend: str,
    stream: int,
    alloc: Callable[[Tuple[int, ...], str], Any],
    lse: Any = None,
) -> Tuple[Any, Optional[Any]]:
    """Runs the attention op; see attnkit.attention. Returns (out, lse or None)."""

def attention_sequences(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    block_table: Any,
    key_lengths: Any,
    head_sink: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    window: Optional[int],
    softcap: Optional[float],
    scale: Optional[float],
    masked_rows_zero: bool,
    return_lse: bool,
    out: Any,
    hnd: bool,
    threads: Optional[int],
    backend: str,
    alloc: Callable[[Tuple[int, ...], str], Any],
) -> Tuple[Any, Optional[Any]]:
    """Ragged batches and paged K/V (host arrays); see attnkit.attention_varlen. Returns (out, lse or None)."""

def append_kv(
    k_new: Any,
    v_new: Any,
    k_cache: Any,
    v_cache: Any,
    positions: Any,
    block_table: Any,
    new_lengths: Any,
    hnd: bool,
    cos_cache: Any,
    sin_cache: Any,
    rotary_interleaved: bool,
    k_scale: Any,
    v_scale: Any,
    k_quant_type: str,
    v_quant_type: str,
    kv_cache_bit_width: int,
    backend: str,
    stream: int,
) -> None:
    """New K/V rows into paged or dense caches, in place (host or CUDA arrays), optionally rotary on K and int8 /
    int4 caches; see attnkit.append_kv."""

def available_backends() -> list[str]:
    """Backends this build can run now, e.g. ['cpu', 'reference']."""

def _cli(argv: Sequence[str]) -> int:
    """Runs the attnkit command-line tool in-process (argv[0] is the program name); returns its exit code."""

def group_query_attention(
    inputs: Sequence[Any],
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    softcap: float,
    local_window_size: int,
    causal: int,
    do_rotary: int,
    rotary_interleaved: int,
    smooth_softmax: int,
    qk_output: int,
    k_quant_type: str,
    v_quant_type: str,
    kv_cache_bit_width: int,
    sliding_window_cache: int,
    qk_norm_epsilon: float,
    output: Any,
    present_key: Any,
    present_value: Any,
    output_qk: Any,
    threads: Optional[int],
    stream: int,
    alloc: Callable[[Tuple[int, ...], str], Any],
) -> Tuple[Any, ...]:
    """Runs ONNX Runtime's GroupQueryAttention on host arrays (CPU) or CUDA arrays (CUDA, on `stream`: a
    cudaStream_t as an integer, 0 for the default stream); see attnkit.group_query_attention. `inputs` holds the 16
    inputs in ONNX Runtime's order (None: absent); outputs not passed in are allocated through
    `alloc(shape, dtype_name)`. Returns (output, present_key, present_value[, output_qk])."""
