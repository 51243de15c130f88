"""The messages between ranks that the attention algorithms use, each counted by the meters.

An all-gather along the sequence (its backward: a reduce-scatter), an all-to-all that trades
one split for another (its backward: the reverse all-to-all), and one hop around a ring. Each
records its bytes in the open :func:`attention_book.distributed.count_traffic` meters.

Taught in chapter 17.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .traffic import record_message

__all__ = ["process_group", "all_gather_sequence", "all_to_all", "pass_along_ring", "unpack"]


def process_group(group=None) -> tuple[object, int, int]:
    """``(group, this rank in it, its size)``, with clear errors for a group that cannot be used.

    Args:
        group: a process group, or ``None`` for every rank.

    Shapes:
        none.

    Returns:
        The group (``dist.group.WORLD`` for ``None``), this process's rank in it and its size.

    Raises:
        ValueError: ``torch.distributed`` is not initialised, or this process is not a member.

    Taught in chapter 17.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialised: call this function inside the ranks "
            "(e.g. in a function run by attention_book.distributed.run_on_ranks) or after "
            "torch.distributed.init_process_group(...)")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of "
                         "the group it was given")
    return group, rank, dist.get_world_size(group)


class _AllGatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 2); its backward is a reduce-scatter."""

    @staticmethod
    def forward(ctx, shard_, group, world_size):
        ctx.group, ctx.world_size = group, world_size
        shard_ = shard_.contiguous()
        pieces = [torch.empty_like(shard_) for _ in range(world_size)]
        dist.all_gather(pieces, shard_, group=group)
        nbytes = (world_size - 1) * shard_.nbytes
        record_message("all_gather", nbytes, nbytes)
        return torch.cat(pieces, dim=2)  # (B, H, T, d), in rank order

    @staticmethod
    def backward(ctx, grad_whole):
        # Every rank used every shard, so a shard's gradient is the sum over all ranks of
        # their gradient for it: a reduce-scatter of the (B, H, T, d) gradients. It is written
        # as an all-to-all (piece j to rank j) and a sum, the same messages, because the gloo
        # backend of older PyTorch releases has no reduce_scatter.
        pieces = torch.stack(grad_whole.chunk(ctx.world_size, dim=2))  # (P, B, H, T/P, d)
        received = torch.empty_like(pieces)  # (P, B, H, T/P, d): piece j from rank j
        dist.all_to_all_single(received, pieces, group=ctx.group)
        grad_shard = received.sum(dim=0)  # (B, H, T/P, d), in rank order
        nbytes = (ctx.world_size - 1) * grad_shard.nbytes
        record_message("reduce_scatter", nbytes, nbytes)
        return grad_shard, None, None


def all_gather_sequence(shard: torch.Tensor, group, world_size: int) -> torch.Tensor:
    """Every rank's shard, concatenated along the sequence in rank order; differentiable.

    Args:
        shard: this rank's shard.
        group: the process group.
        world_size: its size ``P``.

    Shapes:
        shard ``(B, H, T / P, d)``; returns ``(B, H, T, d)``.

    Returns:
        The gathered tensor; its gradient flows back by a reduce-scatter.

    Taught in chapter 17.
    """
    return _AllGatherSequence.apply(shard, group, world_size)


class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``split_dim`` into ``P`` parts, send part ``j`` to rank ``j``, and
    concatenate the parts received along ``cat_dim``; the backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, group, world_size, rank, split_dim, cat_dim):
        ctx.args = (group, world_size, rank, cat_dim, split_dim)  # the reverse
        return _exchange(x, group, world_size, rank, split_dim, cat_dim)

    @staticmethod
    def backward(ctx, grad):
        return (_exchange(grad, *ctx.args), None, None, None, None, None)


def _exchange(x, group, world_size, rank, split_dim, cat_dim):
    # One tensor whose dim 0 is the destination (all_to_all_single: the gloo backend of
    # older PyTorch releases has no list all_to_all).
    outgoing = torch.stack(x.chunk(world_size, dim=split_dim))  # (P, ...): part j for rank j
    incoming = torch.empty_like(outgoing)  # (P, ...): part j from rank j
    dist.all_to_all_single(incoming, outgoing, group=group)
    part_bytes = outgoing.nbytes // world_size
    record_message("all_to_all", (world_size - 1) * part_bytes, (world_size - 1) * part_bytes)
    return torch.cat(incoming.unbind(0), dim=cat_dim)


def all_to_all(x: torch.Tensor, group, world_size: int, rank: int, split_dim: int,
               cat_dim: int) -> torch.Tensor:
    """Send part ``j`` of ``x`` (split along ``split_dim``) to rank ``j``; concatenate what
    arrives along ``cat_dim``. Differentiable: the backward is the reverse all-to-all.

    Args:
        x: this rank's tensor.
        group: the process group.
        world_size: its size ``P``.
        rank: this rank in it.
        split_dim: the dim cut into ``P`` parts (its size divisible by ``P``).
        cat_dim: the dim along which the received parts are put together.

    Shapes:
        e.g. ``(B, H, T / P, d)`` with ``split_dim=1, cat_dim=2`` returns ``(B, H / P, T, d)``.

    Returns:
        The exchanged tensor.

    Taught in chapter 17.
    """
    return _AllToAll.apply(x, group, world_size, rank, split_dim, cat_dim)


def pass_along_ring(tensors, group, world_size: int, rank: int):
    """Send the tensors to the next rank and receive the previous rank's, asynchronously.

    Args:
        tensors: what to send, packed into one message.
        group: the process group.
        world_size: its size ``P``.
        rank: this rank in it.

    Shapes:
        any; what arrives has the shapes of ``tensors`` (see :func:`unpack`).

    Returns:
        ``(requests, arriving)``: the pending requests (wait on each) and the buffer that will
        hold the previous rank's message.

    Taught in chapter 17.
    """
    # One message of bytes, so tensors of different dtypes (16-bit keys, float32 gradients)
    # travel together.
    packed = torch.cat([tensor.reshape(-1).view(torch.uint8) for tensor in tensors])  # (bytes,)
    arriving = torch.empty_like(packed)
    requests = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, packed, dist.get_global_rank(group, (rank + 1) % world_size),
                   group),
        dist.P2POp(dist.irecv, arriving, dist.get_global_rank(group, (rank - 1) % world_size),
                   group),
    ])
    record_message("send/recv", packed.nbytes, arriving.nbytes)
    return requests, arriving


def unpack(packed: torch.Tensor, like) -> list[torch.Tensor]:
    """Cut one received message of bytes back into tensors shaped like ``like``.

    Args:
        packed: the flat message.
        like: the tensors that were packed, for their shapes.

    Shapes:
        packed ``(bytes,)`` (uint8); returns tensors of the shapes and dtypes of ``like``.

    Returns:
        Views of ``packed``.

    Taught in chapter 17.
    """
    tensors, start = [], 0
    for tensor in like:
        piece = packed[start:start + tensor.nbytes]  # (nbytes,)
        if start % tensor.element_size():
            piece = piece.clone()  # a fresh, aligned buffer for the dtype's view
        tensors.append(piece.view(tensor.dtype).view(tensor.shape))
        start += tensor.nbytes
    return tensors
