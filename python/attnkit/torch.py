"""attnkit for PyTorch users: a drop-in ``scaled_dot_product_attention`` with SDPA's semantics.

Importing this module registers ``torch.ops.attnkit.attention`` and ``torch.ops.attnkit.group_query_attention``
(``torch.compile(fullgraph=True)``, ``torch.export`` and CUDA graphs see them as one op each). The ops have no
backward: a tensor that requires grad is refused (run under ``torch.no_grad()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _torch_ops  # noqa: F401 - registers torch.ops.attnkit.*
from . import attention

__all__ = ["scaled_dot_product_attention"]

_Tensor = torch.Tensor


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on attnkit's kernels, with its semantics.

    query ``(..., L, E)``, key ``(..., S, E)``, value ``(..., S, Ev)`` with 3 or 4 dimensions (``(N, H, L, E)``);
    any strides with a contiguous last dimension. ``attn_mask``: boolean (True: the key takes part) or float
    (added to the scores), broadcastable to ``(N, H, L, S)``. ``is_causal``: top-left aligned, query ``i`` sees
    keys ``j <= i`` (SDPA's rule; not with ``attn_mask``). ``scale``: default ``1 / sqrt(E)``. ``enable_gqa``:
    query heads ``H`` a multiple of key/value heads ``Hkv``, head ``h`` reading ``h // (H // Hkv)``. A query row
    that sees no key gives zeros, as SDPA does. ``dropout_p`` must be 0 (attnkit has no dropout).
    """
    # The plain call (no mask, 4-D plain tensors) straight into the binding: a tiny call's cost is this Python.
    if (attn_mask is None and type(query) is _Tensor and dropout_p == 0.0 and (scale is None or type(scale) is float)
            and query.dim() == 4 and key.dim() == 4 and (enable_gqa or query.shape[1] == key.shape[1])):
        out = _torch_ops.plain_attention(query, key, value, bool(is_causal), 0 if is_causal else None, scale, "zero",
                                         "bhsd", None, "auto")
        if out is not None:
            return out
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: = {dropout_p}, but attnkit has no dropout (pass dropout_p=0.0, e.g. in eval "
                         "mode)")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask: is set but is_causal is True (SDPA takes one or the other)")
    dims = query.dim()
    if dims not in (3, 4) or key.dim() != dims or value.dim() != dims:
        raise ValueError(f"query, key, value: must all be 3-D or 4-D (N, H, L, E), got {query.dim()}-D, "
                         f"{key.dim()}-D and {value.dim()}-D")
    if dims == 3:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(0)
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not enable_gqa:
        raise ValueError(f"key: has {kv_heads} heads but query has {heads} (pass enable_gqa=True for grouped-query "
                         "attention)")
    out = attention(query, key, value, mask=attn_mask, causal=bool(is_causal), causal_offset=0 if is_causal else None,
                    scale=scale, masked_rows="zero")
    return out.squeeze(0) if dims == 3 else out

