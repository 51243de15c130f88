"""FlashAttention's forward pass in plain PyTorch: an online softmax over tiles.

The attention of chapters 2-7 materialises the whole ``(T_q, T_k)`` matrix of
scores. Here the keys and values are visited one block at a time while three
running quantities per query are kept up to date: the largest score seen so
far, the sum of the exponentials (rescaled whenever that maximum grows) and
the weighted sum of the values. At the end, dividing the running output by
the running sum gives exactly ``softmax(scores) @ value``. Only blocks of
scores ever exist, so the extra memory no longer grows with ``T_q * T_k``.

Chapter 13 adds a sliding window, whose tiles that lie wholly before the
window are skipped like the causal tiles in the future, and an attention sink,
one more score per row that starts the online softmax.

This module imports only the functional core, :mod:`attention_book.attention`.
"""

from __future__ import annotations

import math

import torch

from .attention import _sink_column
from .checks import check_positive_int, check_qkv, require_float

__all__ = ["online_softmax_update", "online_softmax", "tile_plan", "tiled_attention"]

# What tiled attention does with one (query block, key block) tile.
SKIPPED = 0  # no query may see any key of the block (future, or before the window): never computed
FULL = 1  # every query may see every key: no mask needed
DIAGONAL = 2  # the causal diagonal (or the window's far edge) crosses the tile: mask it


def _check_block_size(block_size: object) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def online_softmax_update(
    running_max: torch.Tensor, running_sum: torch.Tensor, scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one block of scores into a running maximum and a running sum of exponentials.

    The invariant is ``running_sum == sum(exp(seen - running_max))`` over every
    score seen so far. When the new block raises the maximum from ``m`` to
    ``m'``, each old term ``exp(s - m)`` must become ``exp(s - m')``, so the old
    sum is multiplied by ``exp(m - m')`` before the new block's terms are added
    (Milakov and Gimelshein's online normaliser).

    Args:
        running_max: the largest score seen so far (``-inf`` before any score).
        running_sum: ``sum(exp(seen - running_max))`` (0 before any score).
        scores: the next block of scores; its last dim is the block.

    Shapes:
        running_max ``(...)``, running_sum ``(...)``, scores ``(..., n)``;
        returns two tensors of shape ``(...)``.

    Returns:
        ``(new_max, new_sum)`` with the same invariant over the old and new scores.
        A slice that has only seen ``-inf`` keeps max ``-inf`` and sum 0.

    Taught in chapter 10.
    """
    for name, tensor in (("running_max", running_max), ("running_sum", running_sum),
                         ("scores", scores)):
        require_float(name, tensor)
    if scores.dim() < 1 or running_max.shape != scores.shape[:-1] or (
        running_sum.shape != running_max.shape
    ):
        raise ValueError(
            f"running_max {tuple(running_max.shape)} and running_sum "
            f"{tuple(running_sum.shape)} must both have the shape of scores "
            f"{tuple(scores.shape)} without its last dim"
        )
    new_max = torch.maximum(running_max, scores.amax(dim=-1))  # (...)
    # While everything seen is -inf, shift by 0 so that exp(-inf - 0) = 0, not NaN.
    shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))  # (...)
    rescale = torch.exp(running_max - shift)  # (...)
    block_sum = torch.exp(scores - shift.unsqueeze(-1)).sum(dim=-1)  # (...)
    return new_max, running_sum * rescale + block_sum


def online_softmax(x: torch.Tensor, dim: int = -1, *, block_size: int = 1) -> torch.Tensor:
    """Softmax whose maximum and normaliser are found in a single pass over blocks.

    The classic stable softmax reads its input three times (maximum, sum,
    divide); the online version finds the maximum and the sum together in one
    pass, ``block_size`` entries at a time, with :func:`online_softmax_update`,
    then writes the weights. It equals :func:`attention_book.softmax`,
    including zeros for a slice that is entirely ``-inf``.

    Args:
        x: scores, any floating-point tensor.
        dim: the dimension that is normalised.
        block_size: how many entries each step of the pass folds in.

    Shapes:
        x any shape ``(...)``; the result has the same shape.

    Returns:
        Non-negative weights that sum to 1 along ``dim`` (0 for an all ``-inf`` slice).

    Taught in chapter 10.
    """
    require_float("x", x)
    _check_block_size(block_size)
    if x.dim() == 0:
        raise ValueError("x must have at least one dim to normalise, got a 0-d tensor")
    x_last = x.movedim(dim, -1)  # (..., n)
    running_max = x_last.new_full(x_last.shape[:-1], float("-inf"))  # (...)
    running_sum = x_last.new_zeros(x_last.shape[:-1])  # (...)
    for start in range(0, x_last.size(-1), block_size):
        block = x_last[..., start:start + block_size]  # (..., block_size)
        running_max, running_sum = online_softmax_update(running_max, running_sum, block)
    shift = torch.where(torch.isfinite(running_max), running_max, torch.zeros_like(running_max))
    safe_sum = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))
    weights = torch.exp(x_last - shift.unsqueeze(-1)) / safe_sum.unsqueeze(-1)  # (..., n)
    return weights.movedim(-1, dim)


def _tile_kind(q_start: int, q_end: int, k_start: int, k_end: int, offset: int,
               is_causal: bool, window: int | None = None) -> int:
    """Classify one tile; query ``i`` sees key ``j`` when ``0 <= i + offset - j (< window)``."""
    if window is None and not is_causal:
        return FULL
    nearest = q_start + offset - (k_end - 1)  # the smallest distance i + offset - j in the tile
    farthest = q_end - 1 + offset - k_start  # the largest
    if farthest < 0 or (window is not None and nearest >= window):
        return SKIPPED  # all in the future, or all before the window
    if nearest >= 0 and (window is None or farthest < window):
        return FULL
    return DIAGONAL


def _check_window(window: object) -> None:
    if window is not None:
        check_positive_int("window", window)


def tile_plan(num_queries: int, num_keys: int, block_size: int, *,
              is_causal: bool = False, window: int | None = None) -> torch.Tensor:
    """Which tiles :func:`tiled_attention` computes, masks, or skips.

    Args:
        num_queries: ``T_q``.
        num_keys: ``T_k``.
        block_size: the tile side, as in :func:`tiled_attention`.
        is_causal: use the bottom-right aligned causal mask.
        window: use :func:`attention_book.sliding_window_mask` (causal, at most
            ``window`` keys per query) instead; chapter 13.

    Shapes:
        returns ``(ceil(T_q / block_size), ceil(T_k / block_size))``.

    Returns:
        An integer tensor: 0 = skipped (entirely above the diagonal, or entirely before
        the window), 1 = computed without a mask, 2 = computed with the mask (the
        diagonal or the window's far edge crosses it).

    Taught in chapter 10 (the window in chapter 13).
    """
    _check_block_size(block_size)
    _check_window(window)
    for name, value in (("num_queries", num_queries), ("num_keys", num_keys)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    offset = num_keys - num_queries
    q_starts = range(0, num_queries, block_size)
    k_starts = range(0, num_keys, block_size)
    plan = [
        [_tile_kind(q0, min(q0 + block_size, num_queries), k0, min(k0 + block_size, num_keys),
                    offset, is_causal, window) for k0 in k_starts]
        for q0 in q_starts
    ]
    return torch.tensor(plan, dtype=torch.int64).reshape(len(q_starts), len(k_starts))


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    block_size: int = 128,
    is_causal: bool = False,
    scale: float | None = None,
    window: int | None = None,
    sink_logit: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention computed tile by tile with an online softmax (FlashAttention's forward pass).

    For each block of ``block_size`` queries, the keys and values are visited
    ``block_size`` at a time. Each query keeps a running maximum ``m`` of its
    scores, a running sum ``l = sum(exp(score - m))`` and a running output
    ``o = sum(exp(score - m) * value)``; when a new block raises ``m``, ``l`` and
    ``o`` are rescaled by ``exp(m_old - m_new)``. The answer is ``o / l``. The
    full ``(T_q, T_k)`` matrix is never built: the extra memory is a few
    ``(block_size, block_size)`` tiles per head. With ``is_causal``, tiles that
    lie entirely above the (bottom-right aligned) diagonal are skipped; with a
    ``window``, so are the tiles that lie entirely before it, and the key loop of
    each query block starts at the first tile the window reaches. A ``sink_logit``
    is one more score per row with no value: it starts the running maximum and sum,
    before any key is seen.

    Args:
        query: the queries.
        key: the keys; the same feature size as ``query``.
        value: the values; the same length as ``key``.
        block_size: the side of a tile (queries per block and keys per block).
        is_causal: apply :func:`attention_book.causal_mask` (bottom-right aligned:
            query ``i`` sees keys ``0 … i + T_k - T_q``), which is PyTorch's
            ``is_causal`` when ``T_q == T_k``.
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.
        window: attend as :func:`attention_book.sliding_window_mask` does (causal,
            at most ``window`` keys per query, its own included); implies the causal
            mask, whatever ``is_causal`` says.
        sink_logit: an attention sink, as in :func:`attention_book.softmax_with_sink`:
            a number, or one per leading index (per head).

    Shapes:
        query ``(..., T_q, d_k)``, key ``(..., T_k, d_k)``, value ``(..., T_k, d_v)``;
        the leading dims broadcast; ``sink_logit`` ``()`` or broadcastable to ``(...)``.
        Returns ``(..., T_q, d_v)``.

    Returns:
        The attention output, equal to ``scaled_dot_product_attention``'s (with the
        same mask and sink); a query that may see no key gets a zero row. No weights
        are returned: they are never stored.

    Taught in chapter 10 (the window and the sink in chapter 13).
    """
    _check_block_size(block_size)
    _check_window(window)
    lead = check_qkv(query, key, value)

    num_queries, d_k = query.shape[-2:]
    num_keys, d_v = value.shape[-2:]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    query = query.expand(*lead, num_queries, d_k)  # (..., T_q, d_k)
    key = key.expand(*lead, num_keys, d_k)  # (..., T_k, d_k)
    value = value.expand(*lead, num_keys, d_v)  # (..., T_k, d_v)
    offset = num_keys - num_queries  # query i sees key j when j <= i + offset
    output = query.new_zeros(*lead, num_queries, d_v)  # (..., T_q, d_v)
    sink = None
    if sink_logit is not None:
        sink = _sink_column(sink_logit, output)  # (..., 1, 1)
    track_grad = torch.is_grad_enabled() and any(
        tensor.requires_grad for tensor in (query, key, value, *([] if sink is None else [sink])))

    for q_start in range(0, num_queries, block_size):
        q_end = min(q_start + block_size, num_queries)
        q_block = query[..., q_start:q_end, :] * scale  # (..., Bq, d_k)
        if sink is None:
            running_max = q_block.new_full((*lead, q_end - q_start, 1), float("-inf"))  # (..., Bq, 1)
            running_sum = q_block.new_zeros((*lead, q_end - q_start, 1))  # (..., Bq, 1)
        else:
            # The sink is a score seen before any key: exp(sink - sink) = 1 (0 for a -inf sink).
            running_max = sink.expand(*lead, q_end - q_start, 1)  # (..., Bq, 1)
            running_sum = torch.isfinite(running_max).to(q_block.dtype)  # (..., Bq, 1)
        running_out = q_block.new_zeros((*lead, q_end - q_start, d_v))  # (..., Bq, d_v)
        first_key = 0
        if window is not None:
            # The earliest key any query of this block may see; start at its tile.
            first_key = max(0, q_start + offset - window + 1) // block_size * block_size
        for k_start in range(first_key, num_keys, block_size):
            k_end = min(k_start + block_size, num_keys)
            kind = _tile_kind(q_start, q_end, k_start, k_end, offset, is_causal, window)
            if kind == SKIPPED:
                if k_start > q_end - 1 + offset:
                    break  # every later key block lies even further in the future
                continue  # before the window of every query of the block
            k_block = key[..., k_start:k_end, :]  # (..., Bk, d_k)
            v_block = value[..., k_start:k_end, :]  # (..., Bk, d_v)
            attn_scores = q_block @ k_block.transpose(-2, -1)  # (..., Bq, Bk)
            if kind == DIAGONAL:
                rows = torch.arange(q_start, q_end, device=query.device) + offset  # (Bq,)
                cols = torch.arange(k_start, k_end, device=query.device)  # (Bk,)
                distance = rows.unsqueeze(1) - cols.unsqueeze(0)  # (Bq, Bk): how far back key j is
                blocked = distance < 0  # (Bq, Bk): the future
                if window is not None:
                    blocked = blocked | (distance >= window)  # (Bq, Bk): before the window
                attn_scores = attn_scores.masked_fill(blocked, float("-inf"))
            new_max = torch.maximum(running_max, attn_scores.amax(dim=-1, keepdim=True))
            if kind == FULL:
                shift = new_max  # every row saw a key of this tile: the maximum is finite
            else:
                # A row that has seen only masked keys keeps max -inf: shift it by 0, not -inf.
                shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            rescale = torch.exp(running_max - shift)  # (..., Bq, 1)
            if track_grad:
                unnormalised = torch.exp(attn_scores - shift)  # (..., Bq, Bk)
            else:
                # In place: the scores are not needed again, so no second tile is allocated.
                unnormalised = attn_scores.sub_(shift).exp_()  # (..., Bq, Bk)
            running_sum = running_sum * rescale + unnormalised.sum(dim=-1, keepdim=True)
            running_out = running_out * rescale + unnormalised @ v_block  # (..., Bq, d_v)
            running_max = new_max
        safe_sum = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))
        output[..., q_start:q_end, :] = running_out / safe_sum  # (..., Bq, d_v)
    return output
