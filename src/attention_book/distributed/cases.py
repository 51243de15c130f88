"""Many attention cases in one start of the ranks: what chapter 17 and its tests run.

Starting ranks takes seconds (each process imports torch), so :func:`run_attention_cases` is a
rank function that runs a whole list of :class:`AttentionCase`: on each rank it cuts the rank's
shard out of the whole-sequence inputs, runs the method, its backward pass, and counts the
traffic, returning one :class:`CaseResult` per case. ``run_on_ranks(run_attention_cases, 4,
cases)`` runs them all.

Taught in chapter 17.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .algorithms import METHODS
from .sharding import shard_positions
from .traffic import Traffic, count_traffic

__all__ = ["AttentionCase", "CaseResult", "run_attention_cases"]


@dataclasses.dataclass
class AttentionCase:
    """One attention call for :func:`run_attention_cases`: a method and whole-sequence inputs.

    Attributes:
        method: ``"allgather"``, ``"ring"`` or ``"ulysses"``.
        query: the queries of the whole sequence ``(B, H, T, d)``; each rank takes its shard.
        key: the keys ``(B, H_kv, T, d)`` (``H_kv`` dividing ``H``: grouped heads).
        value: the values ``(B, H_kv, T, d_v)``.
        is_causal: apply the causal mask.
        layout: ``"contiguous"`` or ``"zigzag"`` (Ulysses: contiguous only).
        grad_output: if given, ``(B, H, T, d_v)``: run the backward pass with it too.
        subgroups: ``None`` to run on every rank, or a partition of the ranks into groups,
            e.g. ``((0, 2), (1, 3))``: each group runs the case on its own, at the same time.

    Taught in chapter 17.
    """

    method: str
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    is_causal: bool = False
    layout: str = "contiguous"
    grad_output: torch.Tensor | None = None
    subgroups: tuple[tuple[int, ...], ...] | None = None


@dataclasses.dataclass
class CaseResult:
    """What one rank returns for one :class:`AttentionCase`.

    Attributes:
        group_ranks: the global ranks of the group that ran the case.
        rank: this rank's index in that group.
        positions: the sequence positions this rank held ``(T / P,)``.
        output: this rank's shard of the output ``(B, H, T / P, d_v)`` (``None`` on error).
        grads: the gradients of this rank's query, key and value shards, or ``None``.
        forward: the :class:`Traffic` of the forward pass.
        backward: the :class:`Traffic` of the backward pass, or ``None``.
        error: ``"ValueError: …"`` when the method rejected its input, else ``None``.

    Taught in chapter 17.
    """

    group_ranks: tuple[int, ...]
    rank: int
    positions: torch.Tensor
    output: torch.Tensor | None
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    forward: Traffic
    backward: Traffic | None
    error: str | None = None


def _case_positions(seq_len: int, world_size: int, rank: int, layout: str,
                    device: torch.device) -> torch.Tensor:
    """The rank's positions; for a length the layout cannot split, a split it can't check
    locally (uneven, or odd shards), so that the attention function itself reports it."""
    try:
        return shard_positions(seq_len, world_size, rank, layout, device=device)
    except ValueError:
        return torch.tensor_split(torch.arange(seq_len, device=device), world_size)[rank]


def run_attention_cases(rank: int, world_size: int,
                        cases: Sequence[AttentionCase]) -> list[CaseResult]:
    """Run every case on this rank: shard, attend, backward, count; a function for the ranks.

    Meant for :func:`run_on_ranks`, so that one start of the processes serves many cases:
    ``run_on_ranks(run_attention_cases, 4, cases)``. A method that rejects its input with a
    ``ValueError`` or ``TypeError`` (on every rank alike) gives a result with ``error`` set;
    any other exception fails the rank.

    Args:
        rank: this rank's global rank.
        world_size: the number of ranks.
        cases: the cases, identical on every rank.

    Shapes:
        see :class:`AttentionCase` and :class:`CaseResult`.

    Returns:
        One :class:`CaseResult` per case, in order.

    Taught in chapter 17.
    """
    groups = {}
    for case in cases:  # every rank creates every subgroup, in the same order
        if case.subgroups is not None and case.subgroups not in groups:
            groups[case.subgroups] = [dist.new_group(list(ranks)) for ranks in case.subgroups]
    results = []
    for case in cases:
        if case.subgroups is None:
            group, members = None, tuple(range(world_size))
        else:
            index = next(i for i, ranks in enumerate(case.subgroups) if rank in ranks)
            group, members = groups[case.subgroups][index], tuple(case.subgroups[index])
        group_rank, size = members.index(rank), len(members)
        positions = _case_positions(case.query.size(2), size, group_rank, case.layout,
                                     case.query.device)
        with_grad = case.grad_output is not None
        query, key, value = (tensor[..., positions, :].clone().requires_grad_(with_grad)
                             for tensor in (case.query, case.key, case.value))
        kwargs = {"group": group, "is_causal": case.is_causal}
        if case.method != "ulysses":
            kwargs["layout"] = case.layout
        method = METHODS[case.method]
        try:
            with count_traffic() as forward:
                if case.method == "ulysses" and case.layout != "contiguous":
                    raise ValueError("ulysses_attention takes contiguous shards: every rank "
                                     "ends up with the whole sequence, so it needs no layout")
                output = method(query, key, value, **kwargs)
        except (ValueError, TypeError) as error:
            results.append(CaseResult(members, group_rank, positions, None, None, forward,
                                      None, f"{type(error).__name__}: {error}"))
            continue
        backward = grads = None
        if with_grad:
            with count_traffic() as backward:
                output.backward(case.grad_output[..., positions, :])
            grads = (query.grad, key.grad, value.grad)
        results.append(CaseResult(members, group_rank, positions, output.detach(), grads,
                                  forward, backward))
    return results
