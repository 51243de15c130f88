"""Adapters that bring other calling conventions to the book's, for :func:`diagnose`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..attention import causal_mask


def blocked_mask_adapter(fn: Callable) -> Callable:
    """Wrap ``fn(q, k, v, mask)`` whose boolean mask means True = *blocked*.

    ``diagnose`` passes masks with True = may attend; the adapter inverts them.

    Args:
        fn: an attention function whose mask marks the positions to hide.

    Returns:
        A function ``(query, key, value, mask=None)`` in the book's convention.

    Taught in chapter 11.
    """

    def adapted(query, key, value, mask=None):
        return fn(query, key, value) if mask is None else fn(query, key, value, ~mask)

    adapted.__name__ = f"blocked_mask_adapter({getattr(fn, '__name__', 'fn')})"
    return adapted


def additive_mask_adapter(fn: Callable) -> Callable:
    """Wrap ``fn(q, k, v, mask)`` whose mask is a float *added* to the scores.

    A boolean mask (True = may attend) becomes 0 where allowed and ``-inf``
    where blocked, the convention of Hugging Face models and of a float
    ``attn_mask`` in ``torch.nn.functional.scaled_dot_product_attention``.
    The float mask has the query's dtype and device.

    Args:
        fn: an attention function that adds its mask to the scores.

    Returns:
        A function ``(query, key, value, mask=None)`` in the book's convention.

    Taught in chapter 11.
    """

    def adapted(query, key, value, mask=None):
        if mask is None:
            return fn(query, key, value)
        additive = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        return fn(query, key, value, additive.masked_fill(~mask, float("-inf")))

    adapted.__name__ = f"additive_mask_adapter({getattr(fn, '__name__', 'fn')})"
    return adapted


class MultiheadAttentionAdapter(nn.Module):
    """``torch.nn.MultiheadAttention`` as a self-attention module ``x -> output``."""

    def __init__(self, attention: nn.MultiheadAttention, causal: bool):
        super().__init__()
        self.attention = attention
        self.causal = causal
        self.d_in = attention.embed_dim

    def forward(self, x, mask=None, return_weights=False):
        num_tokens = x.shape[-2]
        allowed = causal_mask(num_tokens, device=x.device) if self.causal else None  # (T, T)
        if mask is not None:
            mask = mask.expand(num_tokens, num_tokens) if mask.dim() <= 2 else mask
            allowed = mask if allowed is None else allowed & mask
        blocked = None if allowed is None else ~allowed  # PyTorch: True = blocked
        if not self.attention.batch_first:
            x = x.transpose(0, 1)  # (T, B, d_in)
        output, weights = self.attention(x, x, x, attn_mask=blocked, need_weights=True,
                                         average_attn_weights=False)
        if not self.attention.batch_first:
            output = output.transpose(0, 1)  # (B, T, d_out)
        return (output, weights) if return_weights else output


def torch_multihead_adapter(attention: nn.MultiheadAttention, causal: bool = False) -> nn.Module:
    """Wrap ``torch.nn.MultiheadAttention`` as a self-attention module for :func:`diagnose`.

    The wrapper calls ``attention(x, x, x)``, turns the book's mask (True = may
    attend) into PyTorch's ``attn_mask`` (True = blocked), adds the causal mask
    when ``causal`` is True and returns the per-head weights on request.

    Args:
        attention: the PyTorch layer.
        causal: apply a causal mask.

    Shapes:
        x ``(B, T, embed_dim)`` -> output ``(B, T, embed_dim)``.

    Returns:
        An ``nn.Module`` with ``forward(x, mask=None, return_weights=False)``.

    Taught in chapter 11.
    """
    if not isinstance(attention, nn.MultiheadAttention):
        raise TypeError(
            f"expected torch.nn.MultiheadAttention, got {type(attention).__name__}"
        )
    return MultiheadAttentionAdapter(attention, causal)
