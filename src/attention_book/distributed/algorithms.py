"""Three ways to attend over a sequence split across ranks, and the ring simulated in one process.

Each rank holds ``T / P`` positions of the queries, keys and values, ``(B, H, T / P, d)``, and
returns its positions of the output. Attention needs every key for every query, so the ranks
must exchange something:

- :func:`allgather_kv_attention`: every rank gathers all keys and values, then attends
  with its own queries (the Llama 3 way);
- :func:`ring_attention`: the key/value blocks travel around a ring of ranks, one hop per
  step, and each rank merges every block into its running result (Ring Attention);
- :func:`ulysses_attention`: an all-to-all turns the split by positions into a split by
  heads, each rank attends over the whole sequence for its heads, and a second all-to-all
  turns the output back (DeepSpeed-Ulysses).

All three are chapter 10's partial attention: each tile of a rank's queries against a run of
consecutive key positions is :func:`attention_book.flash.partial_attention`, masked by the
true positions of the layout, and :func:`attention_book.flash.merge_partials` merges the tiles
(and the ring's steps) in float32 for 16-bit inputs. Grouped key/value heads are allowed:
``H`` query heads and ``H_kv`` key/value heads, ``H`` a multiple of ``H_kv``; the ring and
the all-gather then move only the ``H_kv`` heads.

Taught in chapter 17.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..flash import (
    DIAGONAL,
    SKIPPED,
    block_scores,
    empty_partial,
    merge_partials,
    partial_attention,
    tile_kind,
)
from .collectives import all_gather_sequence, all_to_all, pass_along_ring, process_group, unpack
from .sharding import check_layout, shard_runs, unshard
from .traffic import record_step, record_work

__all__ = [
    "METHODS",
    "check_heads",
    "allgather_kv_attention",
    "ring_attention",
    "ulysses_attention",
    "simulate_ring_attention",
]


# --------------------------------------------------------------------------- checks


def check_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                what: str = "a shard (B, H, T / P, d)") -> None:
    """Check the tensors of a context-parallel call: dtypes, dims, and (grouped) heads.

    The simulator and the per-rank functions call this one check, so the same input gets the
    same error from all of them.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        what: how the message names the expected tensor.

    Shapes:
        query ``(B, H, T, d)``, key ``(B, H_kv, T, d)``, value ``(B, H_kv, T, d_v)``, with
        ``H`` a multiple of ``H_kv``.

    Returns:
        None.

    Raises:
        TypeError: not floating-point tensors of one dtype.
        ValueError: not 4-D, or the sizes do not fit together (the message names them).

    Taught in chapter 17.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be {what}, got shape {tuple(tensor.shape)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, "
                        f"{key.dtype} and {value.dtype}")
    batch, num_heads, length = query.shape[:3]
    kv_heads = key.size(1)
    if (key.size(0), key.size(2)) != (batch, length) or key.shape[:3] != value.shape[:3] or (
            num_heads % kv_heads):
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} must share B and T, and key and value their H_kv heads, "
            f"which must divide the H query heads (grouped-query attention)")
    if query.size(-1) != key.size(-1):
        raise ValueError(f"query and key must have the same head_dim, got {query.size(-1)} "
                         f"and {key.size(-1)}")


def _check_shards(query, key, value, is_causal, group, layout) -> tuple[object, int, int, int]:
    """Check the local shards and that every rank holds the same shapes; return the group."""
    check_heads(query, key, value)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    check_layout(layout)
    group, rank, world_size = process_group(group)
    # Every rank checks every rank's shapes, so all of them raise the same error together
    # instead of some of them blocking in a collective that the others never join.
    mine = torch.tensor([*query.shape, key.size(1), value.size(-1)], dtype=torch.int64,
                        device=query.device)  # (6,)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=group)
    everyone = [shape.tolist() for shape in everyone]
    local_lengths = [shape[2] for shape in everyone]
    if len(set(local_lengths)) > 1:
        raise ValueError(
            f"the ranks hold {local_lengths} positions: a sequence of T = {sum(local_lengths)} "
            f"is not divisible by world_size = {world_size}, so it cannot be split evenly")
    if any(shape != everyone[0] for shape in everyone):
        raise ValueError("the ranks' shards differ in (B, H, T / P, head_dim, H_kv, value dim): "
                         f"{[tuple(shape) for shape in everyone]}")
    if layout == "zigzag" and query.size(2) % 2:
        raise ValueError(
            f"layout 'zigzag' cuts the sequence into 2 * world_size = {2 * world_size} "
            f"chunks, but T = {world_size * query.size(2)} is not divisible by "
            f"{2 * world_size}")
    return group, rank, world_size, world_size * query.size(2)


# --------------------------------------------------------------------------- local attention


def _pieces(runs: list[range]) -> list[tuple[slice, range]]:
    """Each run of positions with the slice of the local tensor that holds it."""
    pieces, start = [], 0
    for run in runs:
        pieces.append((slice(start, start + len(run)), run))
        start += len(run)
    return pieces


def _positions(run: range, device: torch.device) -> torch.Tensor:
    return torch.arange(run.start, run.stop, device=device)  # (len(run),)


def _attend(query, q_runs, key, k_runs, value, is_causal, states=None):
    """Merge the tiles of ``query`` against one set of keys into the running states.

    ``q_runs`` and ``k_runs`` are the runs of consecutive positions that the local query and
    key tensors hold, in order; a tile is one query run against one key run. ``states`` holds
    one ``(output, log_sum_exp)`` per query run (the empty result before any key). The number
    of scores and tiles computed is recorded in the open meters. Differentiable.
    """
    q_pieces, k_pieces = _pieces(q_runs), _pieces(k_runs)
    if states is None:
        states = [empty_partial(query[..., q_local, :], value.size(-1)) for q_local, _ in q_pieces]
    states = list(states)
    pairs = tiles = 0
    batch_heads = query.size(0) * query.size(1)
    for index, (q_local, q_run) in enumerate(q_pieces):
        for k_local, k_run in k_pieces:
            kind = tile_kind(q_run[0], q_run[-1], k_run[0], k_run[-1], is_causal=is_causal)
            if kind == SKIPPED:
                continue
            positions = {}
            if kind == DIAGONAL:  # masked by the true positions of the layout
                positions = {"query_positions": _positions(q_run, query.device),
                             "key_positions": _positions(k_run, query.device)}
            part = partial_attention(query[..., q_local, :], key[..., k_local, :],
                                     value[..., k_local, :], is_causal=kind == DIAGONAL,
                                     **positions)  # (B, H, Cq, d_v), (B, H, Cq)
            states[index] = merge_partials(*states[index], *part)
            pairs += batch_heads * len(q_run) * len(k_run)
            tiles += 1
    record_work(pairs, tiles)
    return states, pairs


def _finish(states, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The query runs' states put together: the output (in ``dtype``) and its log-sum-exp."""
    out = torch.cat([state[0] for state in states], dim=-2)  # (B, H, T_local, d_v)
    log_sum_exp = torch.cat([state[1] for state in states], dim=-1)  # (B, H, T_local)
    return out.to(dtype), log_sum_exp


# --------------------------------------------------------------------------- the three methods


def allgather_kv_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                           group=None, is_causal: bool = False,
                           layout: str = "contiguous") -> torch.Tensor:
    """Context-parallel attention that all-gathers the keys and values (the Llama 3 way).

    Each rank gathers the keys and values of every rank, ``(B, H_kv, T, d)``, and attends
    with its own queries. With ``is_causal`` the mask follows the true sequence positions of
    the layout, and tiles wholly in a query's future are skipped. Gradients flow: the backward
    of the all-gather is a reduce-scatter of the key and value gradients.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask of the whole sequence.
        layout: how the sequence was split, ``"contiguous"`` or ``"zigzag"``
            (:func:`attention_book.distributed.shard_positions`).

    Shapes:
        query ``(B, H, T / P, d)``, key ``(B, H_kv, T / P, d)``, value ``(B, H_kv, T / P, d_v)``
        (``H`` a multiple of ``H_kv``); returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output over the whole sequence.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group, layout)
    key_all = all_gather_sequence(key, group, world_size)  # (B, H_kv, T, d), rank order
    value_all = all_gather_sequence(value, group, world_size)  # (B, H_kv, T, d_v)
    k_runs = [run for source in range(world_size)
              for run in shard_runs(seq_len, world_size, source, layout)]
    q_runs = shard_runs(seq_len, world_size, rank, layout)
    states, _ = _attend(query, q_runs, key_all, k_runs, value_all, is_causal)
    return _finish(states, query.dtype)[0]  # (B, H, T/P, d_v)


def _per_query_head(block: torch.Tensor, groups: int) -> torch.Tensor:
    """Key/value heads repeated for the query heads that share them: ``(B, H, n, d)``."""
    return block if groups == 1 else block.repeat_interleave(groups, dim=1)


def _per_kv_head(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """Query heads' gradients summed over each group of heads: ``(B, H_kv, n, d)``."""
    return grad if groups == 1 else grad.unflatten(1, (-1, groups)).sum(dim=2)


class _RingAttention(torch.autograd.Function):
    """Ring attention: forward by merging partial results, backward recomputed from the
    log-sum-exp while the key/value blocks and their gradients travel around the ring."""

    @staticmethod
    def forward(ctx, query, key, value, group, rank, world_size, seq_len, is_causal, layout):
        q_runs = shard_runs(seq_len, world_size, rank, layout)
        states = None
        block = (key, value)
        for step in range(world_size):
            source = (rank - step) % world_size  # whose keys and values this rank holds now
            if step < world_size - 1:  # send them on while computing with them
                requests, arriving = pass_along_ring(block, group, world_size, rank)
            k_runs = shard_runs(seq_len, world_size, source, layout)
            states, pairs = _attend(query, q_runs, block[0], k_runs, block[1], is_causal,
                                    states)
            record_step(pairs)
            if step < world_size - 1:
                for request in requests:
                    request.wait()
                block = unpack(arriving, block)
        out, log_sum_exp = _finish(states, query.dtype)  # (B, H, T/P, d_v), (B, H, T/P)
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        ctx.args = (group, rank, world_size, seq_len, is_causal, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, log_sum_exp = ctx.saved_tensors
        group, rank, world_size, seq_len, is_causal, layout = ctx.args
        dtype = log_sum_exp.dtype  # the accumulation dtype: float32 for 16-bit inputs
        groups = query.size(1) // key.size(1)
        q_pieces = _pieces(shard_runs(seq_len, world_size, rank, layout))
        grad_out = grad_out.to(dtype)
        # FlashAttention-2's D_i = sum_j a_ij dP_ij = dO_i . O_i, one number per query.
        delta = (grad_out * out.to(dtype)).sum(dim=-1)  # (B, H, T/P)
        query_acc = query.to(dtype)  # (B, H, T/P, d)
        grad_query = torch.zeros_like(query_acc)  # (B, H, T/P, d)
        grad_kv = (torch.zeros_like(key, dtype=dtype), torch.zeros_like(value, dtype=dtype))
        block = (key, value, *grad_kv)
        for step in range(world_size):
            source = (rank - step) % world_size
            k_block, v_block, grad_k, grad_v = block
            grad_k, grad_v = grad_k.clone(), grad_v.clone()
            keys = _per_query_head(k_block, groups).to(dtype)  # (B, H, T/P, d)
            values = _per_query_head(v_block, groups).to(dtype)  # (B, H, T/P, d_v)
            for q_local, q_run in q_pieces:
                for k_local, k_run in _pieces(shard_runs(seq_len, world_size, source, layout)):
                    kind = tile_kind(q_run[0], q_run[-1], k_run[0], k_run[-1],
                                     is_causal=is_causal)
                    if kind == SKIPPED:
                        continue
                    positions = {}
                    if kind == DIAGONAL:
                        positions = {"query_positions": _positions(q_run, query.device),
                                     "key_positions": _positions(k_run, query.device)}
                    q_tile, k_tile = query_acc[..., q_local, :], keys[..., k_local, :]
                    scale = 1.0 / math.sqrt(q_tile.size(-1))  # as partial_attention's
                    attn_scores = block_scores(q_tile, k_tile, is_causal=kind == DIAGONAL,
                                               scale=scale, **positions)  # (B, H, Cq, Ck)
                    # The weights, rebuilt exactly from the saved log-sum-exp (chapter 10).
                    attn_weights = torch.exp(attn_scores - log_sum_exp[..., q_local, None])
                    grad_o = grad_out[..., q_local, :]  # (B, H, Cq, d_v)
                    grad_v[..., k_local, :] += _per_kv_head(
                        attn_weights.transpose(-2, -1) @ grad_o, groups)  # (B, H_kv, Ck, d_v)
                    grad_weights = grad_o @ values[..., k_local, :].transpose(-2, -1)
                    grad_scores = attn_weights * (grad_weights - delta[..., q_local, None])
                    grad_query[..., q_local, :] += grad_scores @ k_tile * scale
                    grad_k[..., k_local, :] += _per_kv_head(
                        grad_scores.transpose(-2, -1) @ q_tile * scale, groups)  # (B, H_kv, Ck, d)
            # The block moves on with its gradients; after P hops they are home again.
            if step < world_size - 1:
                moving = (k_block, v_block, grad_k, grad_v)
            else:
                moving = (grad_k, grad_v)
            if world_size > 1:
                requests, arriving = pass_along_ring(moving, group, world_size, rank)
                for request in requests:
                    request.wait()
                block = unpack(arriving, moving)
            else:
                block = moving
        grad_key, grad_value = block[-2].to(key.dtype), block[-1].to(value.dtype)
        return (grad_query.to(query.dtype), grad_key, grad_value,
                None, None, None, None, None, None)


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   group=None, is_causal: bool = False,
                   layout: str = "contiguous") -> torch.Tensor:
    """Ring attention: key/value blocks travel around the ranks and merge into each result.

    At step ``s`` rank ``r`` holds the keys and values of rank ``r - s``; it sends them on to
    rank ``r + 1`` while it attends over them (:func:`attention_book.flash.partial_attention`)
    and merges the result into its running ``(output, log_sum_exp)``
    (:func:`attention_book.flash.merge_partials`, float32 for 16-bit inputs). After ``P``
    steps it has seen every block, yet never held more than two. With ``is_causal`` a tile
    wholly in the future is skipped: with the contiguous layout the early ranks then sit idle,
    with zigzag every rank does the same work at every step. The backward pass is
    FlashAttention's: it recomputes each tile's weights from the saved log-sum-exp while the
    blocks travel around the ring again, carrying their key and value gradients back home.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask of the whole sequence.
        layout: how the sequence was split, ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        query ``(B, H, T / P, d)``, key ``(B, H_kv, T / P, d)``, value ``(B, H_kv, T / P, d_v)``
        (``H`` a multiple of ``H_kv``); returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output over the whole sequence.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group, layout)
    return _RingAttention.apply(query, key, value, group, rank, world_size, seq_len,
                                is_causal, layout)


def ulysses_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                      group=None, is_causal: bool = False) -> torch.Tensor:
    """DeepSpeed-Ulysses: trade the split by positions for a split by heads, and back.

    An all-to-all sends head group ``j`` of this rank's positions to rank ``j``; rank ``j``
    then holds all ``T`` positions of ``H / P`` heads, attends over the whole sequence (no
    layout needed: every rank has every position), and a second all-to-all sends each rank
    its positions of every head. Gradients flow: the backward of an all-to-all is the
    reverse all-to-all. The shards must be contiguous.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask.

    Shapes:
        query ``(B, H, T / P, d)``, key ``(B, H_kv, T / P, d)``, value ``(B, H_kv, T / P, d_v)``,
        ``H`` and ``H_kv`` divisible by ``P``; returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group,
                                                     "contiguous")
    num_heads, kv_heads = query.size(1), key.size(1)
    if num_heads % world_size:
        raise ValueError(
            f"ulysses_attention gives each rank num_heads / world_size heads: num_heads "
            f"({num_heads}) must be divisible by world_size ({world_size})")
    if kv_heads % world_size:
        raise ValueError(
            f"ulysses_attention gives each rank H_kv / world_size key/value heads: the "
            f"{kv_heads} key/value heads must be divisible by world_size ({world_size})")
    # Split the heads (dim 1) over the ranks and gather the sequence (dim 2).
    q_heads = all_to_all(query, group, world_size, rank, 1, 2)  # (B, H/P, T, d)
    k_heads = all_to_all(key, group, world_size, rank, 1, 2)  # (B, H_kv/P, T, d)
    v_heads = all_to_all(value, group, world_size, rank, 1, 2)  # (B, H_kv/P, T, d_v)
    # The whole sequence, in tiles of T / P positions.
    size = seq_len // world_size
    runs = [range(start, start + size) for start in range(0, seq_len, size)]
    states, _ = _attend(q_heads, runs, k_heads, runs, v_heads, is_causal)
    out_heads = _finish(states, query.dtype)[0]  # (B, H/P, T, d_v)
    return all_to_all(out_heads, group, world_size, rank, 2, 1)  # (B, H, T/P, d_v)


METHODS = {
    "allgather": allgather_kv_attention,
    "ring": ring_attention,
    "ulysses": ulysses_attention,
}


# --------------------------------------------------------------------------- one process


def simulate_ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            world_size: int, *, is_causal: bool = False,
                            layout: str = "contiguous") -> torch.Tensor:
    """Ring attention with ``P`` simulated ranks in one process, for reading and testing.

    The same algorithm as :func:`ring_attention`, with the ranks as a loop: at step ``s``
    simulated rank ``r`` merges the block of rank ``(r - s) mod P`` into its running result.
    No process is started and nothing is sent.

    Args:
        query: the queries of the whole sequence.
        key: the keys of the whole sequence.
        value: the values of the whole sequence.
        world_size: ``P``, the number of simulated ranks.
        is_causal: apply the causal mask.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        query ``(B, H, T, d)``, key ``(B, H_kv, T, d)``, value ``(B, H_kv, T, d_v)`` (``H`` a
        multiple of ``H_kv``); returns ``(B, H, T, d_v)``.

    Returns:
        The attention output of the whole sequence, put back together from the ranks.

    Taught in chapter 17.
    """
    check_heads(query, key, value, "a tensor (B, H, T, d)")
    seq_len = query.size(2)
    runs = [shard_runs(seq_len, world_size, rank, layout)
            for rank in range(world_size)]  # raises for a length that does not divide
    positions = [torch.cat([_positions(run, query.device) for run in rank_runs])
                 for rank_runs in runs]  # (T/P,) each
    states = [None] * world_size
    for step in range(world_size):
        for rank in range(world_size):
            source = (rank - step) % world_size
            states[rank], _ = _attend(query[..., positions[rank], :], runs[rank],
                                      key[..., positions[source], :], runs[source],
                                      value[..., positions[source], :], is_causal,
                                      states[rank])
    return unshard([_finish(state, query.dtype)[0] for state in states], layout)  # (B, H, T, d_v)
