"""The layers' ``sdpa`` backend: PyTorch's fused attention, told what it has no argument for.

``torch.nn.functional.scaled_dot_product_attention`` runs attention in one fused kernel, and
the book's layers use it when built with ``backend="sdpa"``. It takes a mask, a causal flag
and grouped key/value heads (``enable_gqa``), but no attention sink (chapter 13).
:func:`fused_attention` adds one the only way a fused kernel allows: one extra key of zeros,
which scores 0 against every query, and an additive mask of ``sink_logit`` on its column, so
that the score of that key *is* the sink, and its value of zeros adds nothing to the output:
exactly ``exp(sink)`` more in each row's denominator. Multi-head, grouped-query and latent
attention (chapters 7 and 14) all call it.

This module imports the functional core and the sink's argument check.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from .attention import causal_mask
from .flash import sink_column

if TYPE_CHECKING:
    from torch.nn.attention.bias import CausalBias

__all__ = ["fused_attention"]


def _is_causal_bias(attn_mask: object) -> bool:
    """Whether ``attn_mask`` is one of PyTorch's ``CausalBias`` objects.

    ``torch.nn.attention.bias`` imports TorchDynamo (about a second), so it is not imported
    here: a ``CausalBias`` can only exist once someone has imported that module.
    """
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(attn_mask, bias.CausalBias)


def fused_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attn_mask: torch.Tensor | CausalBias | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sink_logit: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """PyTorch's fused attention, with grouped key/value heads and an optional attention sink.

    Without a sink it is ``F.scaled_dot_product_attention`` with ``enable_gqa`` set when the
    keys have fewer heads than the queries (each key/value head serves a group of query heads
    inside the kernel, no copies). With a sink, the keys and values get one extra token of
    zeros whose column of the additive mask holds ``sink_logit``.

    Args:
        queries: the queries.
        keys: the keys, with ``num_kv_heads`` heads dividing ``num_heads``.
        values: the values.
        attn_mask: a boolean mask (True = may attend), or PyTorch's
            ``causal_lower_right``/``causal_upper_left`` bias object (not with a sink).
        is_causal: PyTorch's causal flag (top-left aligned; with a sink, the book's
            bottom-right ``causal_mask``, the same when ``T == T_k``).
        dropout_p: dropout on the attention weights.
        scale: the score scale (default ``1 / sqrt(head_dim)``).
        sink_logit: a sink per query head (or one number), or None.

    Shapes:
        queries ``(..., num_heads, T, d)``, keys ``(..., num_kv_heads, T_k, d)``, values
        ``(..., num_kv_heads, T_k, d_v)``; ``attn_mask`` broadcastable to
        ``(..., num_heads, T, T_k)``; ``sink_logit`` ``(num_heads,)``; returns
        ``(..., num_heads, T, d_v)``.

    Returns:
        The context vectors.

    Taught in chapter 7 (the sink in chapter 13).
    """
    enable_gqa = keys.size(-3) != queries.size(-3)
    if sink_logit is None:
        return torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
        )  # (..., num_heads, T, d_v)
    if _is_causal_bias(attn_mask):
        raise TypeError("a sink needs a boolean attn_mask (or is_causal=True), not a CausalBias")
    num_queries, num_keys = queries.size(-2), keys.size(-2)
    if is_causal:
        causal = causal_mask(num_queries, num_keys, device=queries.device)  # (T, T_k)
        attn_mask = causal if attn_mask is None else causal & attn_mask
    lead = queries.shape[:-2]  # (..., num_heads)
    bias = queries.new_zeros(*lead, num_queries, num_keys)  # (..., num_heads, T, T_k)
    if attn_mask is not None:
        bias = bias.masked_fill(~attn_mask, float("-inf"))  # (..., num_heads, T, T_k)
    sink = sink_column(sink_logit, bias).expand(*lead, num_queries, 1)  # (..., num_heads, T, 1)
    bias = torch.cat([bias, sink], dim=-1)  # (..., num_heads, T, T_k + 1)
    zero_key = keys.new_zeros(*keys.shape[:-2], 1, keys.size(-1))  # (..., num_kv_heads, 1, d)
    zero_value = values.new_zeros(*values.shape[:-2], 1, values.size(-1))  # (..., H_kv, 1, d_v)
    keys = torch.cat([keys, zero_key], dim=-2)  # (..., num_kv_heads, T_k + 1, d)
    values = torch.cat([values, zero_value], dim=-2)  # (..., num_kv_heads, T_k + 1, d_v)
    return torch.nn.functional.scaled_dot_product_attention(
        queries, keys, values, attn_mask=bias, dropout_p=dropout_p, scale=scale,
        enable_gqa=enable_gqa,
    )  # (..., num_heads, T, d_v)
