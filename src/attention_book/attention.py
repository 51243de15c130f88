"""The functional core: softmax, scaled dot-product attention and masks.

This module imports only the argument checks and, for the attention sink of
chapter 13, the partial-attention merge of :mod:`attention_book.flash`: the
modules, the pictures and the checkers are all built on top of it. Chapter 13
adds the sliding-window mask and the softmax with an attention sink.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .checks import check_mask, check_positive_int, check_qkv, require_float
from .flash import add_sink, shifted_exp

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "softmax_with_sink",
]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax, written from scratch.

    Subtracting the row maximum before ``exp`` changes nothing mathematically
    (the factor ``exp(-max)`` cancels) but keeps ``exp`` from overflowing.
    A slice that is entirely ``-inf`` (every position masked) gives zeros
    instead of NaN.

    Args:
        x: scores, any floating-point tensor.
        dim: the dimension that is normalised (the keys, for attention).

    Shapes:
        x: any shape ``(...)``; the result has the same shape.

    Returns:
        A tensor of non-negative weights that sum to 1 along ``dim``
        (or to 0 where the whole slice was ``-inf``).

    Taught in chapter 2.
    """
    require_float("x", x)
    row_max = x.amax(dim=dim, keepdim=True)
    # A slice of all -inf has max -inf; -inf - (-inf) is NaN, so shift by 0 there.
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    exp = torch.exp(x - row_max)
    total = exp.sum(dim=dim, keepdim=True)
    # Where every entry was -inf the total is 0: return zero weights, not 0/0.
    safe_total = torch.where(total > 0, total, 1.0)
    return exp / safe_total


def softmax_with_sink(
    scores: torch.Tensor, sink_logit: float | torch.Tensor, dim: int = -1
) -> torch.Tensor:
    """Softmax whose denominator also holds ``exp(sink_logit)``: an attention sink.

    ``weights[j] = exp(scores[j]) / (exp(sink_logit) + sum_k exp(scores[k]))``. The
    sink is one more score that has no value: it takes part of each row's weight,
    so the weights sum to ``1 - exp(sink) / (exp(sink) + sum_k exp(scores[k]))``,
    less than 1, and a query whose keys all score low can give most of its weight
    to the sink instead of to some key. It equals the softmax over the scores with
    the sink appended as one more column, with that column dropped afterwards.
    ``sink_logit = -inf`` gives the plain :func:`softmax`; a fully masked row gets
    zero weights. Computed stably: the largest of the row's scores and the sink is
    subtracted before ``exp``.

    Args:
        scores: attention scores, masked positions already ``-inf``.
        sink_logit: a number, or a tensor with one sink per leading index (one per
            head), shared by every query row.
        dim: the dimension that is normalised (the keys).

    Shapes:
        scores ``(..., T_q, T_k)`` (with ``dim`` the keys); ``sink_logit`` ``()`` or a
        shape that broadcasts to ``(...)``, e.g. ``(num_heads,)`` for scores
        ``(B, num_heads, T_q, T_k)``. The result has the shape of ``scores``.

    Returns:
        Non-negative weights that sum to less than 1 along ``dim``.

    Taught in chapter 13.
    """
    require_float("scores", scores)
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dim to normalise, got a 0-d tensor")
    rows = scores.movedim(dim, -1)  # (..., T_q, n)
    squeeze = rows.dim() == 1
    if squeeze:
        rows = rows.unsqueeze(0)  # (1, n): a single row
    # A sink is one more part with output 0 and log-sum-exp s: merging it in scales each row
    # by sigmoid(L - s), L the row's log-sum-exp (the merge of chapter 10, flash.add_sink).
    exp, row_sum, log_sum_exp = shifted_exp(rows)  # (..., T_q, n), (..., T_q), (..., T_q)
    weights, _ = add_sink(exp / row_sum.unsqueeze(-1), log_sum_exp, sink_logit)  # (..., T_q, n)
    if squeeze:
        weights = weights.squeeze(0)  # (n,)
    return weights.movedim(-1, dim)


def _mask_sizes(num_queries: object, num_keys: object) -> int:
    """Check the sizes of a mask (non-negative ints) and return ``T_k`` (default ``T_q``)."""
    if num_keys is None:
        num_keys = num_queries
    for name, value in (("num_queries", num_queries), ("num_keys", num_keys)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return num_keys


def causal_mask(
    num_queries: int, num_keys: int | None = None, *, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean causal mask, True where a query may attend to a key.

    When there are more keys than queries the mask is aligned bottom-right:
    the queries are the *last* ``num_queries`` positions of the key sequence,
    so query ``i`` may attend to keys ``0 … i + num_keys - num_queries``.
    That is what decoding with a key/value cache needs.

    Args:
        num_queries: number of query positions ``T_q``.
        num_keys: number of key positions ``T_k`` (default ``T_q``).
        device: where to create the mask.

    Shapes:
        returns ``(T_q, T_k)``.

    Returns:
        A ``torch.bool`` tensor, True on and below the (shifted) diagonal.

    Taught in chapter 5.
    """
    num_keys = _mask_sizes(num_queries, num_keys)
    ones = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=num_keys - num_queries)  # (T_q, T_k)


def sliding_window_mask(
    num_queries: int,
    window: int,
    num_keys: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean sliding-window mask: each query sees only the ``window`` most recent keys.

    Query ``i`` sits at position ``p = i + T_k - T_q`` of the key sequence
    (bottom-right alignment, as in :func:`causal_mask`) and may attend to key
    ``j`` when ``0 <= p - j < window``: never to the future, and back at most
    ``window - 1`` positions. ``window`` counts the query's own position, so
    ``window=1`` lets each query see only itself, and ``window >= T_k`` gives
    the causal mask.

    Args:
        num_queries: number of query positions ``T_q``.
        window: how many keys each query may see, its own position included (>= 1).
        num_keys: number of key positions ``T_k`` (default ``T_q``).
        device: where to create the mask.

    Shapes:
        returns ``(T_q, T_k)``.

    Returns:
        A ``torch.bool`` tensor, True on a band of ``window`` diagonals ending at
        the (shifted) main diagonal.

    Taught in chapter 13.
    """
    num_keys = _mask_sizes(num_queries, num_keys)
    check_positive_int("window", window)
    positions = torch.arange(num_queries, device=device) + (num_keys - num_queries)  # (T_q,)
    keys = torch.arange(num_keys, device=device)  # (T_k,)
    distance = positions.unsqueeze(1) - keys.unsqueeze(0)  # (T_q, T_k): how far back key j is
    return (distance >= 0) & (distance < window)  # (T_q, T_k)


def padding_mask(lengths: Sequence[int] | torch.Tensor, max_len: int) -> torch.Tensor:
    """Boolean padding mask for a batch of sequences of different lengths.

    Args:
        lengths: the real (unpadded) length of each sequence in the batch.
        max_len: the padded length ``T`` of the batch.

    Shapes:
        lengths: ``(B,)``; returns ``(B, 1, 1, max_len)``, which broadcasts
        against attention scores of shape ``(B, num_heads, T_q, T_k)``.

    Returns:
        A ``torch.bool`` tensor, True for real tokens and False for padding.

    Taught in chapter 5.
    """
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if isinstance(max_len, bool) or not isinstance(max_len, int):
        raise TypeError(f"max_len must be an int, got {type(max_len).__name__}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(
            f"every length must lie in [0, max_len={max_len}], got lengths {lengths.tolist()}"
        )
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    keep = positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, max_len)
    return keep[:, None, None, :]  # (B, 1, 1, max_len)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sink_logit: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention that returns its weights.

    ``softmax(query @ key^T * scale) @ value``, with masked positions set to
    ``-inf`` before the softmax. A query whose every key is masked gets zero
    weights and a zero output row, never NaN.

    Args:
        query: the queries.
        key: the keys; the same feature size as ``query``.
        value: the values; the same length as ``key``.
        mask: optional boolean mask, **True = may attend** (the polarity of
            ``torch.nn.functional.scaled_dot_product_attention``), broadcastable
            to ``(..., T_q, T_k)``.
        is_causal: also apply :func:`causal_mask` (bottom-right aligned).
        dropout_p: probability of zeroing each weight after the softmax; the
            survivors are scaled by ``1 / (1 - dropout_p)``. Pass 0 in evaluation.
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.
        sink_logit: an attention sink (chapter 13): :func:`softmax_with_sink` replaces
            the softmax, so ``exp(sink_logit)`` joins each row's denominator and the
            weights sum to less than 1. A number, or one sink per head.

    Shapes:
        query ``(..., T_q, d_k)``, key ``(..., T_k, d_k)``, value ``(..., T_k, d_v)``;
        the leading dims broadcast. ``sink_logit`` ``()`` or broadcastable to the
        leading dims ``(...)``, e.g. ``(num_heads,)``.

    Returns:
        ``(output, weights)``: output ``(..., T_q, d_v)`` and weights ``(..., T_q, T_k)``.

    Taught in chapters 2-6 (scores, scaling, masks, dropout; the sink in chapter 13).
    """
    check_qkv(query, key, value)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    d_k = query.size(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    attn_scores = query @ key.transpose(-2, -1) * scale  # (..., T_q, T_k)

    allowed = None
    if mask is not None:
        check_mask(mask, attn_scores.shape)
        allowed = mask
    if is_causal:
        causal = causal_mask(query.size(-2), key.size(-2), device=query.device)  # (T_q, T_k)
        allowed = causal if allowed is None else allowed & causal

    if allowed is not None:
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
    if sink_logit is None:
        attn_weights = softmax(attn_scores, dim=-1)  # (..., T_q, T_k)
    else:
        attn_weights = softmax_with_sink(attn_scores, sink_logit, dim=-1)  # (..., T_q, T_k)
    if dropout_p > 0.0:
        attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout_p, training=True)
    output = attn_weights @ value  # (..., T_q, d_v)
    return output, attn_weights
