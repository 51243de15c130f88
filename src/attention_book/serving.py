"""Serving many requests at once: a paged KV cache, shared prefixes and continuous batching.

Chapter 10's :class:`~attention_book.kv_cache.KVCache` reserves room for ``max_length`` tokens
the moment a sequence starts. A server that keeps one such cache per request reserves memory
for tokens that will never exist. PagedAttention (Kwon et al., SOSP 2023) stores keys and
values in a *pool* of fixed-size blocks instead, and gives each sequence a *block table*: the
list of the blocks that hold its tokens, in order. A sequence takes one more block only when
its last one is full; sequences that share a prompt share its blocks, counted by reference,
and a shared block is copied the first time one of them writes into it (copy-on-write).

* :class:`PagedKVCache`: the pool, the block tables, the reference counts;
* :class:`PagedBatchView`: one layer's view of a batch of sequences of different lengths in
  the pool, which follows the cache protocol of chapter 10
  (:class:`~attention_book.kv_cache.AttentionCache`), so that a model's layers decode with it
  as they do with a :class:`~attention_book.kv_cache.KVCache`;
* :func:`paged_attention`: causal attention of the newest tokens of several sequences of
  different lengths, reading each one's keys and values through its block table;
* :func:`paged_forward`: the model's own forward pass (:class:`~attention_book.model.TinyGPT`)
  with one paged view per layer as its caches; this module has no layer code of its own;
* :class:`ContinuousBatcher` and :func:`generate_batch`: greedy generation for many requests,
  each step one batched forward that decodes a token for every running request, new requests
  joining as soon as there is room and leaving when they are done (continuous batching).

This module imports the functional core, the cache protocol, the layers and the model; only
the package's ``__init__`` imports it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .attention import scaled_dot_product_attention
from .checks import check_positive_int, require_float
from .kv_cache import EMPTY_POSITION, position_mask
from .latent import MultiHeadLatentAttention
from .model import TinyGPT
from .modules import GroupedQueryAttention, MultiHeadAttention

__all__ = [
    "OutOfBlocksError",
    "PagedKVCache",
    "PagedBatchView",
    "paged_attention",
    "paged_forward",
    "new_sequence_states",
    "StepRecord",
    "ContinuousBatcher",
    "generate_batch",
]


class OutOfBlocksError(RuntimeError):
    """The pool of a :class:`PagedKVCache` has too few free blocks; nothing was changed.

    Taught in chapter 16.
    """


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)  # ceil without floats


class PagedKVCache:
    """Keys and values of many sequences in one pool of fixed-size blocks, with block tables.

    The pool holds ``num_blocks`` blocks of ``block_size`` token slots, for every layer at
    once: block ``b`` of the pool is ``key_blocks[:, b]`` and ``value_blocks[:, b]``. Each
    sequence has a block table, the ids of its blocks in order, so its token ``t`` lives in
    block ``table[t // block_size]`` at slot ``t % block_size``. Appending takes a free block
    (the lowest id) only when the last one is full; :meth:`free` gives a sequence's blocks
    back. :meth:`fork` starts a sequence that shares every block of another one (their
    reference counts go up); the first write into a shared block copies it to a private one
    first (copy-on-write). When the pool has too few free blocks for an append, it raises
    :class:`OutOfBlocksError` before changing anything. With ``store_values=False`` the pool
    holds keys alone: the latent of multi-head latent attention (chapter 14), which serves
    as both key and value, pages like any key.

    Args:
        num_blocks: blocks in the pool.
        block_size: token slots per block.
        num_kv_heads: key/value heads per layer.
        head_dim: features per head (keys and values alike).
        num_layers: layers whose keys and values the pool holds; the layers of a sequence
            share its block table, each layer counts its own tokens.
        dtype: the floating dtype of the pool.
        device: where to allocate the pool.
        store_values: hold values beside the keys (False: keys only, ``value_blocks`` is None).

    Shapes:
        ``key_blocks`` and ``value_blocks``: ``(num_layers, num_blocks, block_size,
        num_kv_heads, head_dim)``. :meth:`append` takes keys and values of shape
        ``(num_kv_heads, T_new, head_dim)``; :meth:`gather` returns two tensors of shape
        ``(num_kv_heads, length, head_dim)``.

    Returns:
        (a class) ``blocks_in_use`` counts the blocks that some sequence holds;
        ``block_nbytes`` is the bytes of one block (keys, and values when stored, of every
        layer);
        :meth:`batch_views` gives a model one cache per layer.

    Taught in chapter 16.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        num_layers: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        store_values: bool = True,
    ):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_layers", num_layers)):
            check_positive_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if not isinstance(store_values, bool):
            raise TypeError(f"store_values must be a bool, got {type(store_values).__name__}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.num_layers = num_layers
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.key_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.value_blocks = (torch.zeros(shape, dtype=dtype, device=device) if store_values
                             else None)
        self._free = list(range(num_blocks))  # a heap: the lowest free id is taken first
        self._ref_counts = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, list[int]] = {}  # tokens held, per layer
        self._freed: set[Hashable] = set()

    # ------------------------------------------------------------------ bookkeeping

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the pool."""
        return self.key_blocks.dtype

    @property
    def device(self) -> torch.device:
        """Where the pool lives."""
        return self.key_blocks.device

    @property
    def store_values(self) -> bool:
        """True when the pool holds values beside the keys."""
        return self.value_blocks is not None

    @property
    def blocks_in_use(self) -> int:
        """Blocks that at least one sequence holds (a shared block counts once)."""
        return self.num_blocks - len(self._free)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return len(self._free)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block: the keys (and values, if stored) of ``block_size`` tokens, every layer."""
        return (2 if self.store_values else 1) * self.key_blocks[:, 0].nbytes

    @property
    def seq_ids(self) -> list:
        """The sequences the cache holds, in the order they were added."""
        return list(self._tables)

    def __contains__(self, seq_id: object) -> bool:
        try:
            return seq_id in self._tables
        except TypeError:
            return False

    def __repr__(self) -> str:
        return (f"PagedKVCache(sequences={len(self._tables)}, blocks_in_use={self.blocks_in_use}"
                f"/{self.num_blocks}, block_size={self.block_size})")

    def _check_layer(self, layer: object) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {type(layer).__name__}")
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must lie in [0, num_layers={self.num_layers}), got {layer}")
        return layer

    def _check_seq(self, seq_id: object) -> Hashable:
        try:
            known = seq_id in self._tables
        except TypeError:
            raise TypeError(
                f"seq_id must be hashable (an int or a str), got {type(seq_id).__name__}"
            ) from None
        if not known:
            if seq_id in self._freed:
                raise ValueError(f"seq_id {seq_id!r} was freed: its blocks went back to the "
                                 "pool; add_sequence it again to start over")
            held = list(self._tables)
            shown = ", ".join(map(repr, held[:10])) + (", ..." if len(held) > 10 else "")
            raise ValueError(f"unknown seq_id {seq_id!r}: the cache holds {len(held)} "
                             f"sequences [{shown}]")
        return seq_id

    def _check_new(self, seq_id: object, what: str) -> Hashable:
        try:
            hash(seq_id)
        except TypeError:
            raise TypeError(
                f"{what} must be hashable (an int or a str), got {type(seq_id).__name__}"
            ) from None
        if seq_id in self._tables:
            raise ValueError(f"{what} {seq_id!r} is already in the cache")
        return seq_id

    def length(self, seq_id: Hashable, layer: int = 0) -> int:
        """The number of tokens ``seq_id`` holds in ``layer``.

        Args:
            seq_id: a sequence of the cache.
            layer: which layer's count (they agree after a whole forward pass).

        Shapes:
            (numbers only)

        Returns:
            An int.
        """
        return self._lengths[self._check_seq(seq_id)][self._check_layer(layer)]

    def block_table(self, seq_id: Hashable) -> list[int]:
        """The ids of the blocks that hold ``seq_id``'s tokens, in order (a copy).

        Args:
            seq_id: a sequence of the cache.

        Shapes:
            (numbers only)

        Returns:
            A list of block ids; token ``t`` lives in block ``table[t // block_size]``.
        """
        return list(self._tables[self._check_seq(seq_id)])

    def ref_count(self, block: int) -> int:
        """How many sequences hold ``block`` (0 for a free block).

        Args:
            block: a block id in ``[0, num_blocks)``.

        Shapes:
            (numbers only)

        Returns:
            An int.
        """
        if isinstance(block, bool) or not isinstance(block, int):
            raise TypeError(f"block must be an int, got {type(block).__name__}")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block must lie in [0, num_blocks={self.num_blocks}), got {block}")
        return self._ref_counts[block]

    # ------------------------------------------------------------------ the pool

    def _allocate(self) -> int:
        block = heapq.heappop(self._free)
        self._ref_counts[block] = 1
        # A block comes back zeroed, so the slots past a sequence's length never hold another
        # sequence's keys and values (a NaN there would survive a zero attention weight).
        self.key_blocks[:, block] = 0.0
        if self.value_blocks is not None:
            self.value_blocks[:, block] = 0.0
        return block

    def _release(self, block: int) -> None:
        self._ref_counts[block] -= 1
        if self._ref_counts[block] == 0:
            heapq.heappush(self._free, block)

    def _copy_block(self, source: int, target: int) -> None:
        self.key_blocks[:, target] = self.key_blocks[:, source]
        if self.value_blocks is not None:
            self.value_blocks[:, target] = self.value_blocks[:, source]

    def _blocks_needed(self, seq_ids: Sequence[Hashable], num_new: int, layer: int) -> int:
        """New blocks plus copies of shared blocks for appending ``num_new`` tokens to each."""
        needed = 0
        given_up: dict[int, int] = {}  # shared block -> sequences that will have copied it
        for seq_id in seq_ids:
            table, count = self._tables[seq_id], self._lengths[seq_id][layer]
            end = count + num_new
            if num_new == 0:
                continue
            blocks_after = _blocks_for(end, self.block_size)
            needed += max(0, blocks_after - len(table))
            for index in range(count // self.block_size, min(len(table), blocks_after)):
                block = table[index]
                if self._ref_counts[block] - given_up.get(block, 0) > 1:
                    needed += 1
                    given_up[block] = given_up.get(block, 0) + 1
        return needed

    def _make_room(self, seq_id: Hashable, num_new: int, layer: int) -> None:
        """Copy the shared blocks that the append writes into; add the blocks it needs."""
        table, count = self._tables[seq_id], self._lengths[seq_id][layer]
        blocks_after = _blocks_for(count + num_new, self.block_size)
        for index in range(count // self.block_size, min(len(table), blocks_after)):
            shared = table[index]
            if self._ref_counts[shared] > 1:  # copy-on-write
                private = self._allocate()
                self._copy_block(shared, private)
                self._release(shared)
                table[index] = private
        while len(table) < blocks_after:
            table.append(self._allocate())

    def _slots(self, seq_id: Hashable, start: int, num_new: int) -> torch.Tensor:
        positions = torch.arange(start, start + num_new, device=self.device)  # (T_new,)
        table = torch.tensor(self._tables[seq_id], dtype=torch.long, device=self.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def _reserve(self, seq_ids: list, num_new: int, layer: int) -> torch.Tensor:
        """Take the blocks for ``num_new`` more tokens of each sequence: all or nothing.

        Copies the shared blocks the tokens will be written into (copy-on-write) and adds
        the blocks they need; returns the pool slots of the new tokens, sequence by sequence,
        ``(len(seq_ids) * num_new,)``. When the pool is short it raises
        :class:`OutOfBlocksError` before changing anything.
        """
        needed = self._blocks_needed(seq_ids, num_new, layer)
        if needed > len(self._free):
            counts = [self._lengths[seq_id][layer] for seq_id in seq_ids]
            raise OutOfBlocksError(
                f"appending {num_new} token(s) to {len(seq_ids)} sequence(s) holding "
                f"{counts} tokens (layer {layer}) needs {needed} more block(s) of "
                f"{self.block_size} tokens (new blocks and copies of shared ones), but only "
                f"{len(self._free)} of the {self.num_blocks} blocks are free; nothing was "
                "changed: free a sequence or build a larger pool"
            )
        if num_new == 0 or not seq_ids:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        slots = []
        for seq_id in seq_ids:
            start = self._lengths[seq_id][layer]
            self._make_room(seq_id, num_new, layer)
            slots.append(self._slots(seq_id, start, num_new))
        return torch.cat(slots)  # (B * T_new,)

    def _write_slots(self, seq_ids: list, slots: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor | None, layer: int) -> None:
        """Write new tokens into slots that ``_reserve`` chose (for the same tokens)."""
        shape = (-1, self.num_kv_heads, self.head_dim)
        # (B, H_kv, T_new, head_dim) -> one row of (H_kv, head_dim) per token, in the slot order
        self.key_blocks[layer].view(shape)[slots] = keys.transpose(1, 2).reshape(shape)
        if values is not None:
            self.value_blocks[layer].view(shape)[slots] = values.transpose(1, 2).reshape(shape)
        for seq_id in seq_ids:
            self._lengths[seq_id][layer] += keys.size(2)

    def _padded_tables(self, seq_ids: Sequence[Hashable]) -> torch.Tensor:
        """The block tables as one ``(B, max_blocks)`` tensor on the pool's device.

        A short table is padded with its own last block, whose extra copies
        :func:`~attention_book.kv_cache.position_mask` hides (their key positions are
        ``EMPTY_POSITION``): the padding reads no other sequence's keys and values.
        """
        tables = [self._tables[seq_id] for seq_id in seq_ids]
        width = max(1, *(len(table) for table in tables))
        rows = [table + table[-1:] * (width - len(table)) if table else [0] * width
                for table in tables]
        return torch.tensor(rows, dtype=torch.long, device=self.device)  # (B, max_blocks)

    def _read(self, pool: torch.Tensor, tables: torch.Tensor, num_keys: int) -> torch.Tensor:
        """The first ``num_keys`` token slots of each row's blocks, ``(B, H_kv, num_keys, d)``."""
        blocks = pool[tables]  # (B, max_blocks, block_size, H_kv, head_dim)
        tokens = blocks.flatten(1, 2)[:, :num_keys]  # (B, num_keys, H_kv, head_dim)
        return tokens.transpose(1, 2)  # (B, H_kv, num_keys, head_dim)

    # ------------------------------------------------------------------ the public operations

    def add_sequence(self, seq_id: Hashable) -> None:
        """Start an empty sequence; it takes no block until its first append.

        Args:
            seq_id: a new, hashable id (an int or a str).

        Shapes:
            (no tensors)

        Returns:
            None.
        """
        seq_id = self._check_new(seq_id, "seq_id")
        self._tables[seq_id] = []
        self._lengths[seq_id] = [0] * self.num_layers
        self._freed.discard(seq_id)

    def append(self, seq_id: Hashable, keys: torch.Tensor, values: torch.Tensor | None,
               layer: int = 0) -> None:
        """Write the keys and values of ``T_new`` new tokens after the tokens ``seq_id`` holds.

        A block is taken from the pool when the last one is full; a block the sequence shares
        with another is copied before the first write into it. When the pool has too few
        free blocks, :class:`OutOfBlocksError` is raised and nothing changes.

        Args:
            seq_id: a sequence of the cache.
            keys: the new tokens' keys.
            values: the new tokens' values (None for a pool of keys only).
            layer: which layer's keys and values these are.

        Shapes:
            keys and values ``(num_kv_heads, T_new, head_dim)``.

        Returns:
            None.
        """
        seq_id = self._check_seq(seq_id)
        layer = self._check_layer(layer)
        self._check_keys_values(keys, values, 3, "(num_kv_heads, T_new, head_dim)")
        slots = self._reserve([seq_id], keys.size(1), layer)
        self._write_slots([seq_id], slots, keys[None], None if values is None else values[None],
                          layer)

    def _check_keys_values(self, keys: object, values: object, dims: int, layout: str) -> None:
        """New keys, and values exactly when the pool stores them, of the pool's layout."""
        self._check_new_tokens("keys", keys, dims, layout)
        if not self.store_values:
            if values is not None:
                raise ValueError("this PagedKVCache stores keys only (store_values=False): "
                                 "pass values=None")
            return
        if values is None:
            raise ValueError("this PagedKVCache stores keys and values: pass both")
        self._check_new_tokens("values", values, keys.dim(), layout)
        if keys.shape != values.shape:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} "
                             f"must have the same shape {layout}")

    def _check_new_tokens(self, name: str, tensor: object, dims: int, layout: str) -> None:
        require_float(name, tensor)
        expected = (self.num_kv_heads, self.head_dim)
        if tensor.dim() != dims or (tensor.size(-3), tensor.size(-1)) != expected:
            raise ValueError(
                f"{name} must have shape {layout} with num_kv_heads={self.num_kv_heads} and "
                f"head_dim={self.head_dim}, got {tuple(tensor.shape)}"
            )
        if tensor.dtype != self.dtype:
            raise TypeError(f"the cache stores {self.dtype}, got {name} of dtype {tensor.dtype}")
        if tensor.device != self.device:
            raise ValueError(f"the cache lives on {self.device}, got {name} on {tensor.device}")

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Start ``child_id`` as a copy of ``parent_id`` that shares all its blocks.

        Nothing is copied now: each shared block's reference count goes up by one, and the
        first write into a shared block copies it (copy-on-write). A fork never needs a free
        block.

        Args:
            parent_id: a sequence of the cache.
            child_id: a new, hashable id.

        Shapes:
            (no tensors)

        Returns:
            None.
        """
        parent_id = self._check_seq(parent_id)
        child_id = self._check_new(child_id, "child_id")
        self._tables[child_id] = list(self._tables[parent_id])
        self._lengths[child_id] = list(self._lengths[parent_id])
        for block in self._tables[child_id]:
            self._ref_counts[block] += 1
        self._freed.discard(child_id)

    def free(self, seq_id: Hashable) -> None:
        """Forget ``seq_id``; each of its blocks that no other sequence holds goes back to the pool.

        Args:
            seq_id: a sequence of the cache.

        Shapes:
            (no tensors)

        Returns:
            None.
        """
        seq_id = self._check_seq(seq_id)
        for block in self._tables.pop(seq_id):
            self._release(block)
        del self._lengths[seq_id]
        self._freed.add(seq_id)

    def gather(self, seq_id: Hashable,
               layer: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The keys and values ``seq_id`` holds in ``layer``, read through its block table.

        Args:
            seq_id: a sequence of the cache.
            layer: which layer.

        Shapes:
            returns keys and values, each ``(num_kv_heads, length, head_dim)``.

        Returns:
            ``(keys, values)``, new tensors (not views of the pool); ``values`` is None for a
            pool of keys only.
        """
        seq_id = self._check_seq(seq_id)
        layer = self._check_layer(layer)
        table = torch.tensor(self._tables[seq_id], dtype=torch.long, device=self.device)
        length = self._lengths[seq_id][layer]
        gathered = []
        for pool in (self.key_blocks, self.value_blocks):
            if pool is None:
                gathered.append(None)
                continue
            blocks = pool[layer][table]  # (num_table_blocks, block_size, H_kv, head_dim)
            tokens = blocks.reshape(-1, self.num_kv_heads, self.head_dim)[:length]  # (T, H_kv, hd)
            gathered.append(tokens.transpose(0, 1).contiguous())  # (H_kv, T, head_dim)
        return gathered[0], gathered[1]

    def batch_views(self, seq_ids: Sequence[Hashable], num_new: int) -> list[PagedBatchView]:
        """Make room for ``num_new`` tokens of each sequence; one cache view per layer for the model.

        The blocks for the new tokens of every sequence are taken now, for every layer at
        once (all or nothing: :class:`OutOfBlocksError` before anything changes, as in
        :meth:`append`). Each view follows the cache protocol
        (:class:`~attention_book.kv_cache.AttentionCache`), so a model's own forward pass runs
        on them: ``model(idx, kv_caches=cache.batch_views(seq_ids, T_new))``.

        Args:
            seq_ids: the sequences of the batch, each named once, each holding the same
                number of tokens in every layer.
            num_new: the new tokens of each sequence, ``T_new``.

        Shapes:
            (no tensors)

        Returns:
            A list of ``num_layers`` :class:`PagedBatchView`, one per layer.
        """
        seq_ids = _check_seq_ids(seq_ids)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids must name each sequence once, got {seq_ids}")
        if isinstance(num_new, bool) or not isinstance(num_new, int) or num_new < 0:
            raise ValueError(f"num_new must be an int >= 0, got {num_new!r}")
        starts = []
        for seq_id in seq_ids:
            counts = self._lengths[self._check_seq(seq_id)]
            if len(set(counts)) != 1:
                raise ValueError(f"sequence {seq_id!r} holds {counts} tokens in its layers; "
                                 "a batch of views needs the same number in every layer")
            starts.append(counts[0])
        slots = self._reserve(seq_ids, num_new, 0)
        step = _PagedStep(self, seq_ids, num_new, starts, slots)
        return [PagedBatchView(step, layer) for layer in range(self.num_layers)]


def _key_positions(held: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Row ``b`` holds ``held[b]`` tokens in slots ``0 …``; the slots after them hold none.

    ``held`` ``(B,)`` -> ``(B, num_keys)``: the slot's position, or ``EMPTY_POSITION``.
    """
    slot = torch.arange(num_keys, device=held.device)  # (T_k,)
    return torch.where(slot < held[:, None], slot, EMPTY_POSITION)  # (B, T_k)


class _PagedStep:
    """What the views of one :meth:`PagedKVCache.batch_views` call share: slots, tables, positions."""

    def __init__(self, cache: PagedKVCache, seq_ids: list, num_new: int, starts: list[int],
                 slots: torch.Tensor):
        self.cache = cache
        self.seq_ids = seq_ids
        self.num_new = num_new
        self.starts = starts
        self.slots = slots  # (B * T_new,)
        device = cache.device
        # The tables are final once the blocks are reserved: every layer reads through them.
        self.tables = cache._padded_tables(seq_ids) if seq_ids else None  # (B, max_blocks)
        self.num_keys = max(starts, default=0) + num_new  # the longest row after the step
        start = torch.tensor(starts, dtype=torch.long, device=device)  # (B,)
        self.query_positions = start[:, None] + torch.arange(num_new, device=device)  # (B, T_new)
        self.key_positions = _key_positions(start + num_new, self.num_keys)  # (B, T_k)


class PagedBatchView:
    """One layer's view of a batch of sequences in a :class:`PagedKVCache`: the cache protocol.

    Made by :meth:`PagedKVCache.batch_views`, which reserves the blocks of the whole step
    first. The model then treats each view like a :class:`~attention_book.KVCache`
    (:class:`~attention_book.kv_cache.AttentionCache`): ``positions`` gives each sequence's
    own positions, ``update`` writes the new keys and values into the reserved slots of
    its layer and returns every sequence's keys and values read through its block table,
    padded to the longest, and ``key_positions`` marks the padding ``EMPTY_POSITION`` (−1),
    so the layer's mask hides it. A sequence of 5 tokens and one of 9 decode in one batch.

    Args:
        step: what the views of one step share (made by :meth:`PagedKVCache.batch_views`).
        layer: the layer this view reads and writes.

    Shapes:
        ``positions(T_new, device)`` ``(B, T_new)``; ``update`` takes keys and values
        ``(B, num_kv_heads, T_new, head_dim)`` and returns ``(B, num_kv_heads, T_k, head_dim)``
        with ``T_k`` the longest sequence's length; ``key_positions(device)`` ``(B, T_k)``.

    Returns:
        (a class) ``len(view)`` is the longest sequence's length in its layer.

    Taught in chapter 16.
    """

    def __init__(self, step: _PagedStep, layer: int):
        self._step = step
        self.layer = layer
        self._updated = False

    def __len__(self) -> int:
        lengths = self._step.cache._lengths
        return max((lengths[seq_id][self.layer] for seq_id in self._step.seq_ids), default=0)

    def __repr__(self) -> str:
        return (f"PagedBatchView(layer={self.layer}, seq_ids={self._step.seq_ids}, "
                f"num_new={self._step.num_new})")

    def positions(self, num_new: int, device: torch.device | str | None = None) -> torch.Tensor:
        """Each sequence's positions for its new tokens: they follow the tokens it holds.

        Args:
            num_new: the new tokens per sequence; must be the ``num_new`` reserved.
            device: where the positions are wanted.

        Shapes:
            returns ``(B, T_new)``.

        Returns:
            Row ``b``: ``L_b, …, L_b + T_new - 1`` for a sequence that held ``L_b`` tokens.
        """
        if num_new != self._step.num_new:
            raise ValueError(f"the blocks of this step were reserved for {self._step.num_new} "
                             f"new token(s) per sequence, not {num_new}")
        return self._step.query_positions.to(device)  # (B, T_new)

    def update(self, keys: torch.Tensor,
               values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write the new tokens' keys and values into the reserved slots; return every token's.

        Args:
            keys: the new tokens' keys, one row per sequence.
            values: the new tokens' values (None for a pool of keys only).

        Shapes:
            keys and values ``(B, num_kv_heads, T_new, head_dim)``; returns two tensors
            ``(B, num_kv_heads, T_k, head_dim)``, ``T_k`` the longest sequence's length.

        Returns:
            ``(all_keys, all_values)``; a shorter sequence's row is padded with slots that
            :meth:`key_positions` marks empty; ``all_values`` is None for a pool of keys only.
        """
        step, cache = self._step, self._step.cache
        if self._updated:
            raise ValueError(f"layer {self.layer}'s view was already updated in this step: "
                             "call batch_views again for the next tokens")
        layout = "(B, num_kv_heads, T_new, head_dim)"
        cache._check_keys_values(keys, values, 4, layout)
        if keys.shape[0] != len(step.seq_ids) or keys.shape[2] != step.num_new:
            raise ValueError(f"keys must have shape {layout} with B={len(step.seq_ids)} "
                             f"and T_new={step.num_new}, got {tuple(keys.shape)}")
        self._updated = True
        cache._write_slots(step.seq_ids, step.slots, keys, values, self.layer)
        all_keys = cache._read(cache.key_blocks[self.layer], step.tables, step.num_keys)
        if values is None:
            return all_keys, None  # (B, H_kv, T_k, head_dim): a latent serves as both
        return all_keys, cache._read(cache.value_blocks[self.layer], step.tables, step.num_keys)

    def key_positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The position of each key :meth:`update` returned; ``EMPTY_POSITION`` for padding.

        Args:
            device: where the positions are wanted.

        Shapes:
            returns ``(B, T_k)``.

        Returns:
            Row ``b``: ``0 … L_b - 1``, then −1 up to the longest sequence's length.
        """
        return self._step.key_positions.to(device)  # (B, T_k)


def _check_seq_ids(seq_ids: object) -> list:
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
        raise TypeError(f"seq_ids must be a list of sequence ids, got {type(seq_ids).__name__}")
    return list(seq_ids)


def paged_attention(queries: torch.Tensor, cache: PagedKVCache, seq_ids: Sequence[Hashable],
                    *, layer: int = 0) -> torch.Tensor:
    """Causal attention of the newest tokens of several sequences over a paged cache.

    Sequence ``i`` holds ``L_i`` tokens in ``layer`` (its new tokens already appended); its
    ``T_new`` queries are positions ``L_i - T_new … L_i - 1`` and each sees the keys up to its
    own position (the causal mask aligned bottom-right, as in chapter 10). The keys and values
    are read through each sequence's block table; the result equals attention over contiguous
    keys and values. Query head ``h`` uses key/value head ``h // (num_heads / num_kv_heads)``
    (grouped-query attention, chapter 7).

    Args:
        queries: the queries of the last ``T_new`` tokens of each sequence.
        cache: the paged cache holding the sequences.
        seq_ids: the sequences, one per row of ``queries``.
        layer: which layer of the cache to read.

    Shapes:
        queries ``(len(seq_ids), num_heads, T_new, head_dim)`` with ``num_heads`` a multiple
        of the cache's ``num_kv_heads``; returns ``(len(seq_ids), num_heads, T_new, head_dim)``.

    Returns:
        The context vectors of the new tokens.

    Taught in chapter 16.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    seq_ids = _check_seq_ids(seq_ids)
    layer = cache._check_layer(layer)
    require_float("queries", queries)
    if queries.dim() != 4:
        raise ValueError(f"queries must have shape (len(seq_ids), num_heads, T_new, head_dim), "
                         f"got {tuple(queries.shape)}")
    batch_size, num_heads, num_new, head_dim = queries.shape
    if batch_size != len(seq_ids):
        raise ValueError(f"queries has {batch_size} rows (shape {tuple(queries.shape)}) but "
                         f"seq_ids names {len(seq_ids)} sequences")
    if head_dim != cache.head_dim:
        raise ValueError(f"queries have head_dim={head_dim} (shape {tuple(queries.shape)}) but "
                         f"the cache stores head_dim={cache.head_dim}")
    if num_heads % cache.num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of the cache's "
                         f"num_kv_heads ({cache.num_kv_heads})")
    if queries.dtype != cache.dtype:
        raise TypeError(f"the cache stores {cache.dtype}, got queries of dtype {queries.dtype}")
    if not cache.store_values:
        raise ValueError("the cache stores keys only (store_values=False), so there are no "
                         "values to attend to; a latent layer attends through paged_forward")
    for seq_id in seq_ids:
        held = cache.length(seq_id, layer)
        if held < num_new:
            raise ValueError(
                f"sequence {seq_id!r} holds {held} tokens in layer {layer}, fewer than the "
                f"T_new={num_new} queries: append the new tokens' keys and values first"
            )
    if batch_size == 0 or num_new == 0:
        return queries.new_zeros(queries.shape)
    counts = [cache.length(seq_id, layer) for seq_id in seq_ids]
    held = torch.tensor(counts, dtype=torch.long, device=cache.device)  # (B,)
    tables = cache._padded_tables(seq_ids)  # (B, max_blocks)
    keys = cache._read(cache.key_blocks[layer], tables, max(counts))  # (B, H_kv, T_k, head_dim)
    values = cache._read(cache.value_blocks[layer], tables, max(counts))  # (B, H_kv, T_k, hd)
    # The queries are each sequence's last T_new positions: bottom-right causal by positions.
    query_positions = held[:, None] - num_new + torch.arange(num_new, device=cache.device)
    allowed = position_mask(query_positions, _key_positions(held, max(counts)))  # (B, T_new, T_k)
    group_size = num_heads // cache.num_kv_heads
    # Each key/value head serves group_size consecutive query heads (grouped-query attention).
    keys = keys.repeat_interleave(group_size, dim=1)  # (B, num_heads, T_k, head_dim)
    values = values.repeat_interleave(group_size, dim=1)  # (B, num_heads, T_k, head_dim)
    context, _ = scaled_dot_product_attention(queries, keys, values, allowed[:, None])
    return context  # (B, num_heads, T_new, head_dim)


# ---------------------------------------------------------------------- the model on a paged cache


_PAGED_MIXERS = (MultiHeadAttention, GroupedQueryAttention, MultiHeadLatentAttention)


def _paged_layers(model: TinyGPT) -> list[int]:
    """The blocks whose mixer pages keys and values; the others keep one state per sequence.

    A hybrid model (chapter 18) mixes attention layers with recurrent ones. An attention
    layer's keys and values go into the pool; a recurrent layer's fixed-size state does not
    grow, so there is nothing to page: each sequence keeps its own state beside the pool, and
    a step stacks the states of its batch (``type(state).stack``, e.g.
    :meth:`~attention_book.RecurrentState.stack`).
    """
    paged = []
    for index, block in enumerate(model.blocks):
        if isinstance(block.attention, _PAGED_MIXERS):
            paged.append(index)
            continue
        state = block.new_cache(model.context_length)
        if not callable(getattr(type(state), "stack", None)):
            raise ValueError(
                f"block {index}'s mixer is a {type(block.attention).__name__}, whose cache "
                f"(a {type(state).__name__}) has no stack() to batch the states of several "
                "sequences; a server pages the keys and values of MultiHeadAttention, "
                "GroupedQueryAttention and MultiHeadLatentAttention layers and stacks the "
                "per-sequence states of the others (RecurrentState.stack)"
            )
    if not paged:
        raise ValueError("the model has no attention layer, so no keys and values to page: "
                         "generate with model.generate, whose states are already fixed in size")
    return paged


@dataclass(frozen=True)
class _Layout:
    """What a paged cache needs for a model: which blocks it pages, and the shape of a token."""

    paged: tuple[int, ...]  # the blocks whose keys and values go into the pool
    num_kv_heads: int
    head_dim: int
    store_values: bool


def _cache_layout(model: TinyGPT) -> _Layout:
    """What a paged cache needs for ``model``.

    Multi-head and grouped-query attention store keys and values of their key/value heads;
    multi-head latent attention stores one latent per token, as a key of one head and no
    value. Every attention layer must need the same: one pool holds one layout. (A recurrent
    layer's state is not paged; see :func:`_paged_layers`.)
    """
    paged = _paged_layers(model)
    layouts = set()
    for index in paged:
        attention = model.blocks[index].attention
        if isinstance(attention, MultiHeadLatentAttention):
            layouts.add((1, attention.latent_dim, False))
        else:
            layouts.add((attention.num_kv_heads, attention.head_dim, True))
        if not attention.causal:
            raise ValueError(f"block {index}'s attention is not causal; a decoder's cache "
                             "needs causal attention")
    if len(layouts) != 1:
        raise ValueError(f"the layers need different cache layouts (num_kv_heads, head_dim, "
                         f"store_values) {sorted(layouts)}; one PagedKVCache holds one layout")
    return _Layout(tuple(paged), *layouts.pop())


def new_sequence_states(model: TinyGPT) -> list:
    """The empty states one sequence keeps beside the paged pool, one per recurrent layer.

    A model whose blocks are all attention keeps none (the list is empty); a hybrid model
    (chapter 18) keeps one per block that is not attention, in block order: what
    :func:`paged_forward`'s ``states`` holds for each sequence.

    Args:
        model: a :class:`~attention_book.model.TinyGPT`.

    Shapes:
        (no tensors)

    Returns:
        A list of empty caches (each a :class:`~attention_book.RecurrentState` for chapter 18's
        layers).

    Taught in chapter 16 (the hybrid models in chapter 18).
    """
    paged = _check_model(model).paged
    return [block.new_cache(model.context_length)
            for index, block in enumerate(model.blocks) if index not in paged]


def _check_model(model: object) -> _Layout:
    """Check that ``model`` is a TinyGPT in eval mode that a paged cache can serve; return its
    layout."""
    if not isinstance(model, TinyGPT):
        raise TypeError(f"model must be a TinyGPT, got {type(model).__name__}")
    if model.training:
        raise ValueError(
            "the model is in training mode: its dropout would make every run different and "
            "the tokens would not match model.generate; call model.eval() first"
        )
    return _cache_layout(model)


def _check_tokens(model: TinyGPT, idx: object, name: str = "idx") -> None:
    if not isinstance(idx, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of token ids, got {type(idx).__name__}")
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {idx.dtype}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= model.vocab_size):
        raise ValueError(f"token ids of {name} must lie in [0, vocab_size={model.vocab_size}), "
                         f"got ids from {int(idx.min())} to {int(idx.max())}")


def _check_cache_fits(model: TinyGPT, layout: _Layout, cache: PagedKVCache) -> None:
    dtype = next(model.parameters()).dtype
    store_values = layout.store_values
    expected = (len(layout.paged), layout.num_kv_heads, layout.head_dim, dtype)
    actual = (cache.num_layers, cache.num_kv_heads, cache.head_dim, cache.dtype)
    if expected != actual:
        raise ValueError(
            f"the cache (num_layers, num_kv_heads, head_dim, dtype) = {actual} does not fit the "
            f"model, which needs {expected}"
        )
    if cache.store_values != store_values:
        raise ValueError(f"the model's layers need a cache with store_values={store_values}, "
                         f"got one with store_values={cache.store_values}")


@torch.no_grad()
def paged_forward(model: TinyGPT, cache: PagedKVCache, seq_ids: Sequence[Hashable],
                  idx: torch.Tensor, *,
                  states: Mapping[Hashable, Sequence] | None = None) -> torch.Tensor:
    """Run ``model`` on the next ``T_new`` tokens of several sequences, with a paged cache.

    The tokens of sequence ``i`` take the positions after the ones it holds. The blocks for
    them are reserved in every layer first (:meth:`PagedKVCache.batch_views`; if the pool
    runs out, :class:`OutOfBlocksError` is raised before any layer writes), then the model's
    own forward pass runs with one :class:`PagedBatchView` per attention layer as its caches:
    each attention layer writes its keys and values into the pool and attends over its
    sequence's cached tokens, with each sequence's own positions (the learned position
    embedding, or RoPE). A hybrid model's recurrent layers (chapter 18) get the stack of the
    batch's own states instead (``states``; :meth:`~attention_book.RecurrentState.stack`),
    and advance each. So the logits equal those of ``model(whole sequence)`` at the new
    positions, for any mixer the model's blocks hold (multi-head, grouped-query or latent
    attention, with learned positions or RoPE, with or without a sink; recurrent layers).

    Args:
        model: a :class:`~attention_book.model.TinyGPT` in eval mode.
        cache: a :class:`PagedKVCache` with the model's attention layers, key/value heads,
            head size and dtype, holding every sequence of ``seq_ids`` (the same length in
            every layer).
        seq_ids: the sequences, one per row of ``idx``, each named once.
        idx: the new token ids.
        states: for a model with recurrent layers, each sequence's states
            (:func:`new_sequence_states`, then as this function leaves them), by sequence id;
            each has read as many tokens as the sequence holds in the pool.

    Shapes:
        idx ``(len(seq_ids), T_new)`` -> logits ``(len(seq_ids), T_new, vocab_size)``.

    Returns:
        The logits at the new positions.

    Taught in chapter 16 (the hybrid models in chapter 18).
    """
    layout = _check_model(model)
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    _check_cache_fits(model, layout, cache)
    seq_ids = _check_seq_ids(seq_ids)
    _check_tokens(model, idx)
    if idx.dim() != 2 or idx.size(0) != len(seq_ids):
        raise ValueError(f"idx must have shape (len(seq_ids)={len(seq_ids)}, T_new), got "
                         f"{tuple(idx.shape)}")
    batch_size, num_new = idx.shape
    longest = max((cache.length(seq_id) for seq_id in seq_ids), default=0)
    if longest + num_new > model.context_length:
        raise ValueError(f"a sequence holding {longest} tokens plus T_new={num_new} makes "
                         f"{longest + num_new}, which exceeds "
                         f"context_length={model.context_length}")
    paged = layout.paged
    rows = _sequence_states(len(model.blocks) - len(paged), cache, seq_ids, states)
    views = iter(cache.batch_views(seq_ids, num_new))  # reserves every layer's slots, or raises
    if batch_size == 0 or num_new == 0:
        return torch.zeros(batch_size, num_new, model.vocab_size, dtype=cache.dtype,
                           device=idx.device)
    stacked = iter(type(layer[0]).stack(layer) for layer in zip(*rows, strict=True))
    caches = [next(views) if index in paged else next(stacked)
              for index in range(len(model.blocks))]
    return model(idx, kv_caches=caches)  # (B, T_new, vocab_size)


def _sequence_states(needed: int, cache: PagedKVCache, seq_ids: list,
                     states: Mapping[Hashable, Sequence] | None) -> list[list]:
    """Each sequence's ``needed`` states (one per recurrent layer), checked against the pool
    before anything changes."""
    if needed == 0:
        return [[] for _ in seq_ids]
    if not isinstance(states, Mapping):
        raise TypeError(f"the model has {needed} recurrent layer(s), whose states are not "
                        "paged: pass states={seq_id: new_sequence_states(model), ...}, got "
                        f"{type(states).__name__}")
    rows = []
    for seq_id in seq_ids:
        if seq_id not in states:
            raise ValueError(f"states holds nothing for sequence {seq_id!r}")
        row = list(states[seq_id])
        if len(row) != needed:
            raise ValueError(f"states[{seq_id!r}] holds {len(row)} state(s); the model has "
                             f"{needed} recurrent layer(s)")
        lengths = [len(state) for state in row]
        if any(length != cache.length(seq_id) for length in lengths):
            raise ValueError(f"the states of sequence {seq_id!r} have read {lengths} tokens but "
                             f"the pool holds {cache.length(seq_id)} of its tokens")
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- continuous batching


@dataclass
class StepRecord:
    """What one step of a :class:`ContinuousBatcher` did.

    Attributes:
        step: the step's index, from 0.
        decoded: requests that got a token from the step's one batched decoding forward.
        admitted: requests whose prompt (and tokens so far) was prefilled this step; each got
            its next token from that forward pass.
        finished: requests that generated their last token this step.
        preempted: requests sent back to the queue to free their blocks.
        blocks_in_use: blocks of the pool in use after the step.

    Taught in chapter 16.
    """

    step: int
    decoded: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    blocks_in_use: int = 0


@dataclass
class _Request:
    prompt: torch.Tensor  # (T_prompt,)
    max_new_tokens: int
    generated: list[int] = field(default_factory=list)

    def tokens(self) -> torch.Tensor:
        new = torch.tensor(self.generated, dtype=torch.long, device=self.prompt.device)
        return torch.cat([self.prompt, new])  # (T_prompt + generated,), as model.generate's

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_new_tokens


class ContinuousBatcher:
    """Greedy generation for many requests that arrive and finish at different times.

    Each :meth:`step` first runs **one** batched forward pass that decodes the next token of
    every running request (:func:`paged_forward` with one new token per sequence), retires
    the requests that are done and frees their blocks, then admits waiting requests in
    arrival order while the pool has room: each admitted request's prompt is prefilled in a
    forward pass of its own, which also gives its first token. A request is admitted only if
    the blocks for its prompt, plus the blocks that the running requests and it will need at
    the next step, are free.

    When a decoding step needs more blocks than are free, the most recently admitted running
    request is **preempted**: its blocks go back to the pool and it returns to the front of
    the queue; when it is admitted again, its prompt and the tokens generated so far are
    prefilled again (recomputation), so its tokens do not change. A request that could not fit
    in the pool even alone is refused at :meth:`submit` with :class:`OutOfBlocksError`.

    Args:
        model: a :class:`~attention_book.model.TinyGPT` in eval mode.
        block_size: token slots per block.
        num_blocks: blocks in the pool.
        max_batch_size: the most requests that run at once (default: as many as fit).

    Shapes:
        :meth:`submit` takes a prompt ``(T_prompt,)`` of token ids; :meth:`output` returns
        ``(T_prompt + tokens generated so far,)``.

    Returns:
        (a class) ``history`` holds one :class:`StepRecord` per step; ``cache`` is the
        :class:`PagedKVCache`.

    Taught in chapter 16.
    """

    def __init__(self, model: TinyGPT, *, block_size: int = 16, num_blocks: int,
                 max_batch_size: int | None = None):
        layout = _check_model(model)
        self.model = model
        check_positive_int("block_size", block_size)
        check_positive_int("num_blocks", num_blocks)
        if max_batch_size is not None:
            check_positive_int("max_batch_size", max_batch_size)
        parameter = next(model.parameters())
        self.cache = PagedKVCache(num_blocks, block_size, layout.num_kv_heads, layout.head_dim,
                                  num_layers=len(layout.paged), dtype=parameter.dtype,
                                  device=parameter.device, store_values=layout.store_values)
        self.max_batch_size = max_batch_size
        self.history: list[StepRecord] = []
        self._requests: list[_Request] = []
        self._waiting: deque[int] = deque()
        self._running: list[int] = []  # in the order they were admitted
        # a hybrid model's recurrent layers: each running request's states, beside the pool
        self.states: dict[int, list] = {}

    @property
    def num_waiting(self) -> int:
        """Requests submitted (or preempted) and not running."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests whose tokens are in the cache."""
        return len(self._running)

    @property
    def done(self) -> bool:
        """True when no request waits or runs."""
        return not self._waiting and not self._running

    def submit(self, prompt: torch.Tensor, max_new_tokens: int) -> int:
        """Queue a request: ``prompt`` followed by up to ``max_new_tokens`` greedy tokens.

        Args:
            prompt: the request's token ids.
            max_new_tokens: how many tokens to generate.

        Shapes:
            prompt ``(T_prompt,)``, ``T_prompt >= 1``.

        Returns:
            The request id (0, 1, 2, … in the order of submission).
        """
        _check_tokens(self.model, prompt, "prompt")
        if prompt.dim() != 1 or prompt.numel() == 0:
            raise ValueError(f"prompt must have shape (T_prompt,) with T_prompt >= 1, got "
                             f"{tuple(prompt.shape)}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
                max_new_tokens < 0):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        total = prompt.numel() + max_new_tokens
        if total > self.model.context_length:
            raise ValueError(f"a prompt of {prompt.numel()} tokens plus max_new_tokens="
                             f"{max_new_tokens} makes {total}, which exceeds "
                             f"context_length={self.model.context_length}")
        # The last generated token is never fed back, so it needs no slot.
        blocks = _blocks_for(total - 1, self.cache.block_size)
        if blocks > self.cache.num_blocks:
            raise OutOfBlocksError(
                f"a request of {prompt.numel()} prompt tokens and up to {max_new_tokens} new "
                f"ones needs {blocks} blocks of {self.cache.block_size} tokens, but the pool "
                f"has only {self.cache.num_blocks}"
            )
        self._requests.append(_Request(prompt.clone(), max_new_tokens))
        request_id = len(self._requests) - 1
        if max_new_tokens > 0:
            self._waiting.append(request_id)
        return request_id

    def output(self, request_id: int) -> torch.Tensor:
        """The prompt of ``request_id`` followed by the tokens generated so far.

        Args:
            request_id: an id returned by :meth:`submit`.

        Shapes:
            returns ``(T_prompt + tokens generated so far,)``.

        Returns:
            A tensor of token ids.
        """
        if isinstance(request_id, bool) or not isinstance(request_id, int) or not (
                0 <= request_id < len(self._requests)):
            raise ValueError(f"unknown request_id {request_id!r}: {len(self._requests)} "
                             "requests were submitted")
        return self._requests[request_id].tokens()

    def _next_need(self, request_id: int) -> int:
        """Blocks the request's next decoding step takes: 1 when its last block is full."""
        return int(self.cache.length(request_id) % self.cache.block_size == 0)

    def _preempt(self, request_id: int, record: StepRecord) -> None:
        self._running.remove(request_id)
        self.cache.free(request_id)
        self.states.pop(request_id, None)  # recomputed with the prompt when it is admitted again
        self._waiting.appendleft(request_id)
        record.preempted.append(request_id)

    def _retire(self, request_id: int, record: StepRecord) -> None:
        self.cache.free(request_id)
        self.states.pop(request_id, None)
        record.finished.append(request_id)

    def _decode(self, record: StepRecord) -> None:
        while self._running and sum(map(self._next_need, self._running)) > (
                self.cache.num_free_blocks):
            self._preempt(self._running[-1], record)
        if not self._running:
            return
        batch = list(self._running)
        last = torch.stack([self._requests[i].tokens()[-1:] for i in batch])  # (B, 1)
        logits = paged_forward(self.model, self.cache, batch, last,
                               states=self.states)  # (B, 1, vocab_size)
        next_tokens = logits[:, -1].argmax(dim=-1).tolist()  # B ints
        for request_id, token in zip(batch, next_tokens, strict=True):
            request = self._requests[request_id]
            request.generated.append(token)
            record.decoded.append(request_id)
            if request.done:
                self._running.remove(request_id)
                self._retire(request_id, record)

    def _admit(self, record: StepRecord) -> None:
        block_size = self.cache.block_size
        while self._waiting and (self.max_batch_size is None
                                 or len(self._running) < self.max_batch_size):
            request_id = self._waiting[0]
            request = self._requests[request_id]
            tokens = request.tokens()  # the prompt, and after a preemption the tokens so far
            needed = (_blocks_for(tokens.numel(), block_size)
                      + int(tokens.numel() % block_size == 0)
                      + sum(map(self._next_need, self._running)))
            if needed > self.cache.num_free_blocks and self._running:
                break
            if _blocks_for(tokens.numel(), block_size) > self.cache.num_free_blocks:
                break
            self._waiting.popleft()
            self.cache.add_sequence(request_id)
            self.states[request_id] = new_sequence_states(self.model)
            logits = paged_forward(self.model, self.cache, [request_id], tokens[None],
                                   states=self.states)
            request.generated.append(int(logits[0, -1].argmax()))
            record.admitted.append(request_id)
            if request.done:
                self._retire(request_id, record)
            else:
                self._running.append(request_id)

    def step(self) -> StepRecord:
        """Decode one token for every running request, retire the finished, admit the waiting.

        Args:
            (none)

        Shapes:
            (no tensors)

        Returns:
            The :class:`StepRecord` of this step (also appended to ``history``).
        """
        record = StepRecord(step=len(self.history))
        self._decode(record)
        self._admit(record)
        record.blocks_in_use = self.cache.blocks_in_use
        self.history.append(record)
        return record

    def run(self) -> list[StepRecord]:
        """Call :meth:`step` until no request waits or runs.

        Args:
            (none)

        Shapes:
            (no tensors)

        Returns:
            The records of the steps this call ran.
        """
        first = len(self.history)
        while not self.done:
            self.step()
        return self.history[first:]


def generate_batch(model: TinyGPT, prompts: Sequence[torch.Tensor],
                   max_new_tokens: int | Sequence[int], *, block_size: int = 16,
                   num_blocks: int | None = None) -> list[torch.Tensor]:
    """Generate greedily for many prompts at once, with a paged cache and continuous batching.

    Every prompt is submitted to a :class:`ContinuousBatcher` at once, and steps run until all
    are done. Each result equals ``model.generate(prompt[None], n)[0]``: the same greedy
    tokens, computed in batches. (Batched arithmetic rounds differently from one sequence at a
    time; in float64 the logits agree to about 1e-15, in float32 to about 1e-6, so a near-tie
    between the two most likely tokens could, rarely, resolve differently in float32.)

    Args:
        model: a :class:`~attention_book.model.TinyGPT` in eval mode.
        prompts: the prompts, of any lengths.
        max_new_tokens: tokens to generate, one int for all prompts or one per prompt.
        block_size: token slots per block of the cache.
        num_blocks: blocks in the pool; default: enough for every request at once. With fewer,
            requests wait for room, and running ones may be preempted and recomputed.

    Shapes:
        each prompt ``(T_i,)`` -> each result ``(T_i + n_i,)``.

    Returns:
        A list of token-id tensors, one per prompt, in the order of ``prompts``.

    Taught in chapter 16.
    """
    _check_model(model)
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2:
        prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of 1-D token tensors, got "
                        f"{type(prompts).__name__}")
    if isinstance(max_new_tokens, Sequence):
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"max_new_tokens names {len(max_new_tokens)} counts for "
                             f"{len(prompts)} prompts")
        counts = list(max_new_tokens)
    else:
        counts = [max_new_tokens] * len(prompts)
    check_positive_int("block_size", block_size)
    for index, prompt in enumerate(prompts):
        _check_tokens(model, prompt, f"prompts[{index}]")
        if prompt.dim() != 1 or prompt.numel() == 0:
            raise ValueError(f"prompts[{index}] must have shape (T,) with T >= 1, got "
                             f"{tuple(prompt.shape)}")
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"max_new_tokens must be ints >= 0, got {count!r}")
    if num_blocks is None:
        num_blocks = max(1, sum(_blocks_for(max(0, prompt.numel() + count - 1), block_size)
                                for prompt, count in zip(prompts, counts, strict=True)))
    batcher = ContinuousBatcher(model, block_size=block_size, num_blocks=num_blocks)
    request_ids = [batcher.submit(prompt, count)
                   for prompt, count in zip(prompts, counts, strict=True)]
    batcher.run()
    return [batcher.output(request_id) for request_id in request_ids]
