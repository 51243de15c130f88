"""Count what each rank sends, receives and computes: the meters of chapter 17.

:func:`count_traffic` opens a meter, a :class:`Traffic`, for a block of code; the collectives
(:mod:`attention_book.distributed.collectives`) record every message they pass and the
algorithms record every tile of scores they compute, into every meter that is open. The meters
only count: they change nothing about what the ranks do.

Taught in chapter 17.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

__all__ = ["Traffic", "count_traffic", "record_message", "record_work", "record_step"]


@dataclasses.dataclass
class Traffic:
    """What one rank sent, received and computed while :func:`count_traffic` was open.

    The bytes are those of the attention tensors the algorithms pass to the collectives
    (queries, keys, values, outputs and their gradients), counted as each rank's share:
    an all-gather of ``n`` bytes per rank sends ``n`` to each of the ``P - 1`` others and
    receives ``P - 1`` pieces of ``n``. The small exchange of shapes that each attention
    call starts with, to check its input, is not counted.

    Attributes:
        bytes_sent: bytes this rank sent to the others.
        bytes_received: bytes this rank received.
        score_pairs: (query, key) scores this rank computed, all batches and heads together
            (the masked ones of a tile crossed by the causal diagonal included).
        tiles: blocks of scores computed; a block wholly in the future is skipped.
        pairs_per_step: for :func:`attention_book.distributed.ring_attention`, the scores
            computed at each ring step.
        calls: ``(collective, bytes sent, bytes received)`` for each call, in order.

    Taught in chapter 17.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    score_pairs: int = 0
    tiles: int = 0
    pairs_per_step: list[int] = dataclasses.field(default_factory=list)
    calls: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


_METERS: list[Traffic] = []


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes and the scores of the attention calls made inside the block.

    Args:
        none.

    Shapes:
        none.

    Returns:
        A context manager that yields a :class:`Traffic`, filled in as the block runs
        (forward passes, and backward passes that run inside the block).

    Taught in chapter 17.
    """
    traffic = Traffic()
    _METERS.append(traffic)
    try:
        yield traffic
    finally:
        _METERS.remove(traffic)


def record_message(name: str, sent: int, received: int) -> None:
    """Add one collective call to every open meter.

    Args:
        name: the collective, e.g. ``"all_gather"``.
        sent: the bytes this rank sent in it.
        received: the bytes this rank received.

    Shapes:
        none.

    Returns:
        None.

    Taught in chapter 17.
    """
    for traffic in _METERS:
        traffic.bytes_sent += sent
        traffic.bytes_received += received
        traffic.calls.append((name, sent, received))


def record_work(score_pairs: int, tiles: int) -> None:
    """Add computed scores and tiles to every open meter.

    Args:
        score_pairs: the (query, key) scores computed, batches and heads together.
        tiles: the tiles of scores computed.

    Shapes:
        none.

    Returns:
        None.

    Taught in chapter 17.
    """
    for traffic in _METERS:
        traffic.score_pairs += score_pairs
        traffic.tiles += tiles


def record_step(score_pairs: int) -> None:
    """Append the scores of one ring step to every open meter.

    Args:
        score_pairs: the scores computed at this step.

    Shapes:
        none.

    Returns:
        None.

    Taught in chapter 17.
    """
    for traffic in _METERS:
        traffic.pairs_per_step.append(score_pairs)
