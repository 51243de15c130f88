"""The layout of heads: one model-wide feature vector per token, or one vector per head.

A projection gives every token one vector of ``num_heads * head_dim`` features,
``(..., T, d_out)``. Attention runs per head, on ``(..., num_heads, T, head_dim)``: the
features are cut into ``num_heads`` slices and the head dim moves in front of the tokens.
:func:`split_heads` does that; :func:`merge_heads` undoes it after attention. Every headed
layer of the package (chapter 7's :class:`~attention_book.MultiHeadAttention`, chapter 14's
:class:`~attention_book.MultiHeadLatentAttention`) uses these two.

This module imports nothing of the package.
"""

from __future__ import annotations

import torch

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Cut each token's features into heads and put the head dim before the tokens.

    Args:
        x: one feature vector per token, ``num_heads * head_dim`` features.
        num_heads: how many heads.
        head_dim: features per head.

    Shapes:
        x ``(..., T, num_heads * head_dim)`` -> ``(..., num_heads, T, head_dim)``.

    Returns:
        A view of ``x`` (no copy): head ``h`` holds features ``h * head_dim … (h + 1) * head_dim - 1``.

    Taught in chapter 7.
    """
    *lead, num_tokens, _ = x.shape
    x = x.view(*lead, num_tokens, num_heads, head_dim)  # (..., T, num_heads, head_dim)
    return x.transpose(-3, -2)  # (..., num_heads, T, head_dim)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Put the heads of each token side by side again: the inverse of :func:`split_heads`.

    Args:
        x: one vector per head and token.

    Shapes:
        x ``(..., num_heads, T, head_dim)`` -> ``(..., T, num_heads * head_dim)``.

    Returns:
        A new tensor (the transpose makes the memory non-contiguous, so it reshapes).

    Taught in chapter 7.
    """
    x = x.transpose(-3, -2)  # (..., T, num_heads, head_dim)
    return x.reshape(*x.shape[:-2], x.size(-2) * x.size(-1))  # (..., T, num_heads * head_dim)
