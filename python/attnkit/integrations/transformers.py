"""attnkit as a Hugging Face transformers attention implementation.

    import attnkit.integrations.transformers as ak_hf
    ak_hf.register()  # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attnkit")

``register()`` adds ``"attnkit"`` to transformers' ``AttentionInterface`` (the attention function below) and to its
``AttentionMaskInterface`` (SDPA's mask function: boolean masks, True = visible, or none where causality alone
does it), so padded batches, sliding windows and caches behave as under ``"sdpa"``. Grouped-query heads are read
in place (no ``repeat_kv`` copy), a softcap (Gemma 2) runs inside the kernel, and the output is written straight
in the ``(batch, seq, heads, head_dim)`` order the model's projection reads. Inference only: attnkit has no
backward, so run the model under ``torch.no_grad()`` (``generate()`` does) and ``dropout`` must be 0 (eval mode).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

import attnkit
from attnkit import torch as _attnkit_torch  # noqa: F401 - registers torch.ops.attnkit.*

NAME = "attnkit"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, position_bias: Optional[torch.Tensor] = None,
                      softcap: Optional[float] = None, **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query ``(B, H, L, D)``, key/value ``(B, Hkv, S, D)`` ->
    ``((B, L, H, Dv), None)``; the rules of ``sdpa_attention_forward`` (a missing mask with ``L > 1`` means causal,
    top-left aligned, as SDPA's ``is_causal``)."""
    if dropout != 0.0:
        raise ValueError(f"dropout: = {dropout}, but attnkit has no dropout (put the model in eval mode)")
    q_length = query.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = q_length > 1 and attention_mask is None and bool(is_causal)
    if position_bias is not None:
        from transformers.integrations.sdpa_attention import create_position_bias_mask

        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
        is_causal = False
    out = attnkit.attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), mask=attention_mask, causal=is_causal,
        causal_offset=0 if is_causal else None, scale=scaling, softcap=softcap if softcap else None,
        masked_rows="zero", layout="bshd")
    return out, None


def register() -> None:
    """Makes ``attn_implementation="attnkit"`` available to every transformers model in this process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
