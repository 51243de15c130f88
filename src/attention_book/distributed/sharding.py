"""Which positions of a sequence each rank holds: the contiguous and zig-zag layouts.

Context parallelism splits a sequence of ``T`` positions over ``P`` ranks, ``T / P`` each.
:func:`shard_positions` says which: a ``"contiguous"`` block, or the ``"zigzag"`` pair of
chunks ``r`` and ``2P - 1 - r`` that gives every rank the same causal work. :func:`shard` cuts
a rank's positions out of a whole sequence and :func:`unshard` puts the ranks' pieces back.
:func:`shard_runs` gives the same positions as runs of consecutive positions, the tiles the
attention algorithms classify (:func:`attention_book.flash.tile_kind`) without building a tensor.

Taught in chapter 17.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["LAYOUTS", "check_layout", "shard_runs", "shard_positions", "shard", "unshard"]

LAYOUTS = ("contiguous", "zigzag")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_layout(layout: object) -> None:
    """Raise ``ValueError`` unless ``layout`` is one of :data:`LAYOUTS`.

    Args:
        layout: the name of a layout.

    Shapes:
        none.

    Returns:
        None.

    Taught in chapter 17.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_divisible(seq_len: int, world_size: int, layout: str) -> None:
    if seq_len % world_size:
        raise ValueError(
            f"the sequence length T = {seq_len} is not divisible by world_size = "
            f"{world_size}: every rank must hold the same number of positions")
    if layout == "zigzag" and seq_len % (2 * world_size):
        raise ValueError(
            f"layout 'zigzag' cuts the sequence into 2 * world_size = {2 * world_size} "
            f"chunks, but T = {seq_len} is not divisible by {2 * world_size}")


def shard_runs(seq_len: int, world_size: int, rank: int,
               layout: str = "contiguous") -> list[range]:
    """The positions one rank holds, as runs of consecutive positions, in the rank's order.

    ``"contiguous"``: one run, ``r * T/P … (r + 1) * T/P - 1``. ``"zigzag"``: two runs of
    ``T / 2P``, chunks ``r`` and ``2P - 1 - r``.

    Args:
        seq_len: ``T``, the length of the whole sequence.
        world_size: ``P``, the number of ranks.
        rank: which rank, ``0 <= rank < P``.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        none: Python ``range`` objects.

    Returns:
        The runs; concatenated, they are :func:`shard_positions`.

    Raises:
        ValueError: ``T`` is not divisible by ``P`` (by ``2P`` for zigzag), or ``rank`` is
            out of range.

    Taught in chapter 17.
    """
    _check_int("seq_len", seq_len, 1)
    _check_int("world_size", world_size, 1)
    _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    check_layout(layout)
    _check_divisible(seq_len, world_size, layout)
    if layout == "contiguous":
        size = seq_len // world_size
        return [range(rank * size, (rank + 1) * size)]
    chunk = seq_len // (2 * world_size)
    late = 2 * world_size - 1 - rank
    return [range(rank * chunk, (rank + 1) * chunk), range(late * chunk, (late + 1) * chunk)]


def shard_positions(seq_len: int, world_size: int, rank: int, layout: str = "contiguous", *,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """The sequence positions that one rank holds.

    ``"contiguous"``: rank ``r`` holds the block ``r * T/P … (r + 1) * T/P - 1``.
    ``"zigzag"``: the sequence is cut into ``2P`` chunks of ``T / 2P`` and rank ``r`` holds
    chunks ``r`` and ``2P - 1 - r``, an early and a late one, so that with a causal mask every
    rank has the same work (the layout Llama 3's context parallelism uses).

    Args:
        seq_len: ``T``, the length of the whole sequence.
        world_size: ``P``, the number of ranks.
        rank: which rank, ``0 <= rank < P``.
        layout: ``"contiguous"`` or ``"zigzag"``.
        device: where to create the positions (default: torch's default device).

    Shapes:
        returns ``(T / P,)``.

    Returns:
        The positions in increasing order, an int64 tensor.

    Raises:
        ValueError: ``T`` is not divisible by ``P`` (by ``2P`` for zigzag), or ``rank`` is
            out of range.

    Taught in chapter 17.
    """
    runs = shard_runs(seq_len, world_size, rank, layout)
    return torch.cat([torch.arange(run.start, run.stop, device=device) for run in runs])  # (T/P,)


def shard(x: torch.Tensor, world_size: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """The positions of ``x`` that one rank holds (dim -2 is the sequence).

    Args:
        x: a whole sequence, e.g. the queries of every position.
        world_size: ``P``.
        rank: which rank.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        x ``(..., T, d)``; returns ``(..., T / P, d)``.

    Returns:
        ``x[..., shard_positions(T, P, rank, layout), :]``, a new tensor on ``x``'s device.

    Taught in chapter 17.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError("x must be a tensor of at least 2 dims (..., T, d)")
    positions = shard_positions(x.size(-2), world_size, rank, layout, device=x.device)  # (T/P,)
    return x[..., positions, :]  # (..., T/P, d)


def unshard(shards: Sequence[torch.Tensor], layout: str = "contiguous") -> torch.Tensor:
    """Put the ranks' shards back into one sequence: the inverse of :func:`shard`.

    Args:
        shards: one tensor per rank, in rank order.
        layout: the layout they were cut with.

    Shapes:
        each shard ``(..., T / P, d)``; returns ``(..., T, d)``.

    Returns:
        The whole sequence, each shard at the positions its rank holds.

    Taught in chapter 17.
    """
    check_layout(layout)
    if not shards or any(not isinstance(s, torch.Tensor) or s.dim() < 2 for s in shards):
        raise ValueError("shards must be a non-empty list of tensors (..., T / P, d)")
    world_size, local = len(shards), shards[0].size(-2)
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"the shards must have one shape, got {[tuple(s.shape) for s in shards]}")
    seq_len = world_size * local
    whole = shards[0].new_empty(*shards[0].shape[:-2], seq_len, shards[0].size(-1))  # (..., T, d)
    for rank, piece in enumerate(shards):
        positions = shard_positions(seq_len, world_size, rank, layout, device=piece.device)
        whole[..., positions, :] = piece
    return whole
