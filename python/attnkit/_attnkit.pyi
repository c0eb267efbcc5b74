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
) -> Tuple[Any, Optional[Any]]:
    """Runs the attention op; see attnkit.attention. Returns (out, lse or None)."""

def available_backends() -> list[str]:
    """Backends this build can run now, e.g. ['cpu', 'reference']."""

def _cli(argv: Sequence[str]) -> int:
    """Runs the attnkit command-line tool in-process (argv[0] is the program name); returns its exit code."""
