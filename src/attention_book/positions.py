"""Positions inside attention: rotary embeddings (RoPE) and ALiBi biases.

Chapter 1 added a position vector to each token *before* attention, so every
projection mixes what a token is with where it sits. The two methods here put
position inside attention instead, so that the score of a query and a key
depends on their contents and on their *distance*, not on where the pair sits:

* :func:`rotary_embedding` turns each pair of query and key features by an
  angle proportional to the token's position (Su et al., 2021); the dot
  product of two turned vectors then depends only on the difference of the
  angles;
* :func:`alibi_bias` adds to each score a penalty proportional to the distance
  between query and key, with one slope per head (Press et al., 2022).

Like the functional core, this module imports only the core's helpers:
:mod:`attention_book.modules` builds ``rope=True`` on top of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .checks import broadcast_shape, check_base, check_positive_int, require_float

__all__ = ["rotary_embedding", "alibi_bias", "alibi_slopes"]




def _angle_dtype(device: torch.device) -> torch.dtype:
    # float64 keeps the angle of a far position exact to ~1e-12 (float32: ~1e-4 at 1000);
    # MPS has no float64.
    return torch.float32 if device.type == "mps" else torch.float64


def rotary_embedding(
    x: torch.Tensor,
    positions: torch.Tensor | Sequence[int] | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
) -> torch.Tensor:
    """Rotate each pair of features of ``x`` by an angle proportional to its token's position.

    Pair ``i`` of the token at position ``m`` turns by ``m * base ** (-2i / head_dim)``:
    the first pairs turn fast, the last ones slowly. Rotating queries and keys this
    way makes their dot product depend on the two positions only through ``m - n``.
    ``interleaved=False`` pairs feature ``i`` with feature ``i + head_dim/2`` (the
    split-half pairing of GPT-NeoX, of Llama as Hugging Face ships it, and of Hugging
    Face's ``rotate_half``); ``interleaved=True`` pairs features ``2i`` and ``2i + 1``
    (GPT-J, the RoFormer paper and Meta's own Llama code). The two give different results
    for the same ``x``: weights trained with one pairing are wrong under the other. The
    angles are computed in float64 (float32 on MPS) and the result has the dtype of ``x``.

    Args:
        x: the queries or keys of one or more heads.
        positions: the integer position of each token; default ``0 … T-1``.
        base: sets the slowest frequency; 10000 in the original paper and in Llama 2.
        interleaved: pair neighbouring features (GPT-J) instead of the two halves.

    Shapes:
        x ``(..., T, head_dim)`` with an even ``head_dim``; ``positions`` broadcastable
        to ``(..., T)``; returns ``(..., T, head_dim)``.

    Returns:
        The rotated tensor, the same shape and dtype as ``x``.

    Taught in chapter 12.
    """
    require_float("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, head_dim), got shape {tuple(x.shape)}")
    num_tokens, head_dim = x.shape[-2], x.shape[-1]
    if head_dim % 2:
        raise ValueError(
            f"rotary_embedding turns pairs of features, so head_dim ({head_dim}) must be even "
            f"(x has shape {tuple(x.shape)})"
        )
    base = check_base(base)
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
    if positions is None:
        positions = torch.arange(num_tokens, device=x.device)  # (T,)
    positions = torch.as_tensor(positions, device=x.device)
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must hold integers, got dtype {positions.dtype}")
    token_shape = x.shape[:-1]  # (..., T)
    if broadcast_shape(positions.shape, token_shape) != token_shape:
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} do not broadcast to (..., T) = "
            f"{tuple(token_shape)}, the tokens of x of shape {tuple(x.shape)}"
        )

    half = head_dim // 2
    dtype = _angle_dtype(x.device)
    pair_index = torch.arange(half, device=x.device, dtype=dtype)  # (head_dim/2,)
    frequencies = base ** (-2.0 * pair_index / head_dim)  # (head_dim/2,)
    angles = positions.to(dtype).unsqueeze(-1) * frequencies  # (..., T, head_dim/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # each (..., T, head_dim/2)
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]  # each (..., T, head_dim/2)
    else:
        first, second = x[..., :half], x[..., half:]  # each (..., T, head_dim/2)
    turned_first = first * cos - second * sin  # (..., T, head_dim/2)
    turned_second = first * sin + second * cos  # (..., T, head_dim/2)
    if interleaved:
        return torch.stack((turned_first, turned_second), dim=-1).flatten(-2)  # (..., T, head_dim)
    return torch.cat((turned_first, turned_second), dim=-1)  # (..., T, head_dim)


def alibi_slopes(num_heads: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The slope of each head's ALiBi penalty, from the ALiBi paper.

    For ``n`` heads, a power of two, the slopes are the geometric sequence that starts
    at ``2 ** (-8 / n)`` with that same ratio: ``1/2, 1/4, …, 1/256`` for 8 heads, largest
    first. For other head counts the result equals the paper's reference code for every
    ``n`` (chapter 12's exercise 12.1 derives its rule); it is then not sorted, and no two
    heads share a slope.

    Args:
        num_heads: the number of heads ``n``.
        device: where to create the slopes.

    Shapes:
        returns ``(num_heads,)``.

    Returns:
        A float32 tensor of slopes between 0 and 1, one per head.

    Taught in chapter 12.
    """
    check_positive_int("num_heads", num_heads)

    def power_of_two(count: int) -> list[float]:
        start = 2.0 ** (-8.0 / count)
        return [start ** (h + 1) for h in range(count)]

    lower = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(lower)
    if lower != num_heads:
        slopes += power_of_two(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32, device=device)  # (num_heads,)


def alibi_bias(
    num_heads: int,
    num_queries: int,
    num_keys: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ALiBi bias: each head subtracts ``slope * distance`` from every score.

    Query ``i`` and key ``j`` are ``|i - j|`` tokens apart, with the queries aligned
    bottom-right as in :func:`attention_book.causal_mask` (the queries are the last
    ``num_queries`` positions of the keys, as when decoding with a cache). Add the bias
    to the scores before the softmax; a causal layer still masks the keys after the
    query, where the bias would count the distance forward.

    Args:
        num_heads: the number of heads; the slopes are :func:`alibi_slopes`.
        num_queries: number of query positions ``T_q``.
        num_keys: number of key positions ``T_k`` (default ``T_q``).
        device: where to create the bias.

    Shapes:
        returns ``(num_heads, T_q, T_k)``, which broadcasts against scores of shape
        ``(B, num_heads, T_q, T_k)``.

    Returns:
        A float32 tensor, 0 on the (bottom-right) diagonal and negative elsewhere.

    Taught in chapter 12.
    """
    if num_keys is None:
        num_keys = num_queries
    for name, value in (("num_queries", num_queries), ("num_keys", num_keys)):
        check_positive_int(name, value)
    slopes = alibi_slopes(num_heads, device=device)  # (num_heads,)
    query_positions = torch.arange(num_keys - num_queries, num_keys, device=device)  # (T_q,)
    key_positions = torch.arange(num_keys, device=device)  # (T_k,)
    distance = (query_positions[:, None] - key_positions[None, :]).abs()  # (T_q, T_k)
    # Negate the integer distance, not the product: 0 stays +0.0 instead of printing -0.0.
    return slopes[:, None, None] * -distance  # (num_heads, T_q, T_k)
