"""Caches for decoding one token at a time, and the one protocol every cache follows.

When a decoder generates text, step ``t`` needs the keys and values of tokens
``0 … t``; all but the newest were already computed at earlier steps. A
:class:`KVCache` keeps them, so each step projects only the new token and
attends over what is stored. :class:`attention_book.MultiHeadAttention` and
:class:`attention_book.GroupedQueryAttention` accept one through
``forward(x, kv_cache=cache)``; so does
:class:`attention_book.latent.MultiHeadLatentAttention` (chapter 14), which
stores one latent vector per token in place of a key and a value.

**The cache protocol.** A layer never asks *which* cache it was given. It reads
the new tokens' positions, hands over this step's keys and values, and gets back
what to attend to and where those keys sit (:class:`LayerCache`,
:class:`AttentionCache`). From the two position tensors it builds its mask
(:func:`position_mask`): a query sees the keys at its own position or before,
and no query sees an empty slot. So the same layer code decodes with a
contiguous :class:`KVCache` (chapter 10), a cache of latents (chapter 14) and a
view of a paged cache that holds a batch of sequences of different lengths
(:class:`attention_book.serving.PagedBatchView`, chapter 16).

This module imports only the argument checks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .checks import check_positive_int, require_float

__all__ = [
    "EMPTY_POSITION",
    "LayerCache",
    "AttentionCache",
    "KVCache",
    "position_mask",
    "check_cache",
    "kv_cache_bytes",
]

EMPTY_POSITION = -1
"""The key position of a slot that holds no token: :func:`position_mask` hides it from every query."""


@runtime_checkable
class LayerCache(Protocol):
    """What the model asks of every layer's cache: how many tokens it holds, and where new ones go.

    A model with ``L`` layers decodes with a list of ``L`` caches, one per layer, and hands
    layer ``i`` its own cache without looking inside it (the ``kv_caches`` argument of
    :class:`~attention_book.model.TinyGPT`). Every cache answers two questions:

    * ``len(cache)``: the tokens it holds (the longest sequence's count when the sequences
      of a batch have different lengths); the model checks ``len(cache) + T_new`` against
      its ``context_length``.
    * ``cache.positions(num_new, device)``: the positions the next ``num_new`` tokens take,
      asked *before* they are added. It is ``(T_new,)`` when the whole batch shares one
      length (``len(cache), …, len(cache) + T_new - 1``) and ``(B, T_new)`` when every row
      has its own. The learned position embedding and RoPE read their positions here.

    An attention layer needs more, and takes an :class:`AttentionCache`. A layer that is no
    attention at all, such as linear attention, whose memory is one fixed-size state of
    shape ``(B, H, d_k, d_v)`` per layer, takes a cache of its own kind that
    answers these two questions and keeps whatever else its layer needs; the model treats it
    like any other. A layer says which kind it needs with ``new_cache(max_length)``
    (see :class:`~attention_book.model.TokenMixer`).

    Args:
        (none: a protocol is implemented by a class, not built)

    Shapes:
        ``positions`` returns ``(T_new,)`` or ``(B, T_new)`` integer positions.

    Returns:
        (a protocol) any object with ``__len__`` and ``positions`` satisfies it;
        ``isinstance(obj, LayerCache)`` checks that they exist.

    Taught in chapter 10.
    """

    def __len__(self) -> int: ...

    def positions(self, num_new: int, device: torch.device | str | None) -> torch.Tensor: ...


@runtime_checkable
class AttentionCache(LayerCache, Protocol):
    """The cache protocol of an attention layer: append keys and values, read what to attend to.

    Like transformers' ``Cache.update(key_states, value_states, layer_idx)``, with one cache
    object per layer. A layer decoding ``T_new`` new tokens calls, in this order:

    1. ``query_positions = cache.positions(T_new, device)``: where the new tokens sit
       (:class:`LayerCache`);
    2. ``keys, values = cache.update(new_keys, new_values)``: stores the new tokens and
       returns the keys and values of every token to attend to, the new ones included;
       ``new_values=None`` stores keys alone (a latent that serves as both, chapter 14)
       and returns ``None`` for the values;
    3. ``key_positions = cache.key_positions(device)``: the position of each returned key,
       ``EMPTY_POSITION`` (−1) for a slot that holds no token (the padding of a shorter
       sequence in a batch). An empty slot must hold finite numbers (zeros, say): its
       weight is 0, but 0 times NaN is NaN.

    The layer then builds its mask with :func:`position_mask` (bottom-right causal by
    positions), so it needs to know nothing else about how or where the cache stores.

    Args:
        (none: a protocol is implemented by a class, not built)

    Shapes:
        new keys ``(..., heads, T_new, d_k)`` and values ``(..., heads, T_new, d_v)``;
        ``update`` returns ``(..., heads, T_k, d_k)`` and ``(..., heads, T_k, d_v)``;
        ``key_positions`` returns ``(T_k,)`` (one length for the batch) or ``(B, T_k)``.

    Returns:
        (a protocol) :class:`KVCache` implements it, and so does a view of the paged cache
        of chapter 16 (:class:`~attention_book.serving.PagedBatchView`).

    Taught in chapter 10 (the paged view in chapter 16).
    """

    def update(
        self, keys: torch.Tensor, values: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def key_positions(self, device: torch.device | str | None) -> torch.Tensor: ...


# The methods a class must define to follow each protocol.
_MEMBERS = {LayerCache: ("__len__", "positions"),
            AttentionCache: ("__len__", "positions", "update", "key_positions")}


def follows_protocol(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for :class:`LayerCache` and :class:`AttentionCache`, fast.

    A class that defines every method of the protocol answers at once; anything else gets
    ``isinstance``, which on Python 3.11 collects the protocol's members again on every call
    (some 20 microseconds: a layer asks on every decoding step).

    Args:
        obj: the object to check.
        protocol: :class:`LayerCache` or :class:`AttentionCache`.

    Shapes:
        (no tensors)

    Returns:
        Whether ``obj`` has every method of ``protocol``.
    """
    cls = type(obj)
    if all(callable(getattr(cls, name, None)) for name in _MEMBERS[protocol]):
        return True
    return isinstance(obj, protocol)


def position_mask(
    query_positions: torch.Tensor, key_positions: torch.Tensor, *, causal: bool = True
) -> torch.Tensor:
    """Which keys each query may see, from positions: bottom-right causal, empty slots hidden.

    Query ``i`` at position ``p_i`` sees key ``j`` at position ``k_j`` when ``k_j >= 0``
    (the slot holds a token) and, if ``causal``, ``k_j <= p_i``. With a contiguous cache of
    ``T_k`` keys and ``T_new`` new queries this is the bottom-right causal mask
    ``causal_mask(T_new, T_k)`` of chapter 10; with per-row positions it is each sequence's
    own mask, so sequences of different lengths share one batch.

    Args:
        query_positions: the positions of the queries.
        key_positions: the positions of the keys, ``EMPTY_POSITION`` (−1) for an empty slot.
        causal: hide the keys after each query's position.

    Shapes:
        query_positions ``(..., T_q)`` and key_positions ``(..., T_k)``, with leading dims
        that broadcast; returns ``(..., T_q, T_k)``.

    Returns:
        A boolean mask, True where the query may attend to the key.

    Taught in chapter 10.
    """
    for name, positions in (("query_positions", query_positions), ("key_positions", key_positions)):
        if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or (
                positions.dtype.is_complex or positions.dtype == torch.bool):
            raise TypeError(f"{name} must be a tensor of integer positions, got "
                            f"{getattr(positions, 'dtype', type(positions).__name__)}")
        if positions.dim() == 0:
            raise ValueError(f"{name} must have shape (..., T), got a 0-d tensor")
    keys = key_positions.unsqueeze(-2)  # (..., 1, T_k)
    queries = query_positions.unsqueeze(-1)  # (..., T_q, 1)
    if causal:
        return (keys >= 0) & (keys <= queries)  # (..., T_q, T_k)
    return (keys >= 0) & torch.ones_like(queries, dtype=torch.bool)  # (..., T_q, T_k)


def check_cache(kv_cache: object, num_tokens: int, context_length: int | None) -> int:
    """Check that ``kv_cache`` follows the attention protocol and has room for ``num_tokens``.

    Args:
        kv_cache: the cache a layer was given.
        num_tokens: the new tokens, ``T_new``.
        context_length: the longest sequence the layer accepts (None: any).

    Shapes:
        (numbers only)

    Returns:
        ``len(kv_cache) + num_tokens``: the keys the layer attends to after the update.

    Taught in chapter 10.
    """
    if not follows_protocol(kv_cache, AttentionCache):
        raise TypeError(
            "kv_cache must follow the attention cache protocol (positions, update, "
            f"key_positions and len), such as a KVCache; got {type(kv_cache).__name__}"
        )
    held = len(kv_cache)
    num_keys = held + num_tokens
    if context_length is not None and num_keys > context_length:
        raise ValueError(
            f"the KV cache holds {held} tokens; adding {num_tokens} more makes "
            f"{num_keys}, which exceeds context_length={context_length}; "
            f"start a new cache (cache.reset()) or build the layer with a longer context"
        )
    return num_keys


class KVCache:
    """The keys and values of the tokens decoded so far, in buffers of ``max_length``.

    The buffers are allocated on the first :meth:`update`, with the batch shape,
    head count, feature sizes, dtype and device of the first keys and values,
    and every later update must match them. One cache serves one attention
    layer; a model with ``L`` layers keeps ``L`` caches. It is meant for
    inference (under ``torch.no_grad()``): updates write into the buffers in place.

    Args:
        max_length: the most tokens the cache may hold (usually the layer's
            ``context_length``).

    Shapes:
        keys ``(..., num_kv_heads, T_new, d_k)`` and values ``(..., num_kv_heads, T_new, d_v)``
        go in; :meth:`update` returns ``(..., num_kv_heads, T_cached, d)`` views.

    Returns:
        (a class) ``len(cache)`` is the number of tokens held; ``cache.nbytes``
        the bytes of its two buffers (of its one buffer when it stores keys only,
        as multi-head latent attention does). It follows :class:`AttentionCache`:
        every row of the batch has the same length, so the positions are ``(T,)``.

    Taught in chapter 10 (a cache of keys only, for a latent, in chapter 14).
    """

    def __init__(self, max_length: int):
        check_positive_int("max_length", max_length)
        self.max_length = max_length
        self.keys: torch.Tensor | None = None  # (..., num_kv_heads, max_length, d_k)
        self.values: torch.Tensor | None = None  # (..., num_kv_heads, max_length, d_v)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        return f"KVCache(length={self._length}, max_length={self.max_length}, buffer={shape})"

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers (0 before the first update)."""
        if self.keys is None:
            return 0
        return self.keys.nbytes + (0 if self.values is None else self.values.nbytes)

    def reset(self) -> None:
        """Forget every token (the buffers are kept and overwritten by the next updates)."""
        self._length = 0

    def positions(self, num_new: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The positions of the next ``num_new`` tokens: they follow the ``len(cache)`` held.

        Args:
            num_new: how many tokens are about to be added.
            device: where to create the positions.

        Shapes:
            returns ``(num_new,)``, shared by every row of the batch.

        Returns:
            ``len(cache), …, len(cache) + num_new - 1``.
        """
        if isinstance(num_new, bool) or not isinstance(num_new, int) or num_new < 0:
            raise ValueError(f"num_new must be an int >= 0, got {num_new!r}")
        return torch.arange(self._length, self._length + num_new, device=device)  # (T_new,)

    def key_positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The positions of the keys :meth:`update` returned: ``0 … len(cache) - 1``.

        Args:
            device: where to create the positions.

        Shapes:
            returns ``(len(cache),)``.

        Returns:
            The positions; a contiguous cache has no empty slot.
        """
        return torch.arange(self._length, device=device)  # (T_cached,)

    def update(
        self, keys: torch.Tensor, values: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append the keys and values of new tokens; return everything cached so far.

        Args:
            keys: the new tokens' keys.
            values: the new tokens' values; ``None`` stores the keys alone (the
                latent of multi-head latent attention serves as both). The first
                update decides, and every later one must do the same.

        Shapes:
            keys ``(..., heads, T_new, d_k)``, values ``(..., heads, T_new, d_v)``;
            returns ``(..., heads, T_cached, d_k)`` and ``(..., heads, T_cached, d_v)``
            with ``T_cached = len(cache)`` after the update.

        Returns:
            ``(all_keys, all_values)``, views of the cache's buffers
            (``all_values`` is None for a cache of keys only).
        """
        if self.keys is not None and (values is None) != (self.values is None):
            stored = "keys only" if self.values is None else "keys and values"
            raise ValueError(
                f"this cache stores {stored}: pass values={'None' if self.values is None else 'a tensor'}"
                " at every update, as at the first one"
            )
        if values is None:
            require_float("keys", keys)
            if keys.dim() < 3:
                raise ValueError(
                    f"keys must have shape (..., heads, T_new, d), got {tuple(keys.shape)}"
                )
            return self._append(keys, None)
        for name, tensor in (("keys", keys), ("values", values)):
            require_float(name, tensor)
            if tensor.dim() < 3:
                raise ValueError(
                    f"{name} must have shape (..., heads, T_new, d), got {tuple(tensor.shape)}"
                )
        if keys.shape[:-1] != values.shape[:-1]:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must agree in every "
                f"dim but the last (..., heads, T_new, d)"
            )
        return self._append(keys, values)

    def _append(
        self, keys: torch.Tensor, values: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write validated keys (and values) after the tokens held; return every token's."""
        num_new = keys.size(-2)
        total = self._length + num_new
        if total > self.max_length:
            raise ValueError(
                f"the KV cache holds {self._length} tokens and cannot take {num_new} more: "
                f"{total} would exceed max_length={self.max_length}; call reset() to start over"
            )
        if self.keys is None:
            *lead, num_heads, _, d_k = keys.shape
            self.keys = keys.new_zeros(*lead, num_heads, self.max_length, d_k)
            if values is not None:
                self.values = values.new_zeros(*lead, num_heads, self.max_length, values.size(-1))
        expected_k = (*self.keys.shape[:-2], num_new, self.keys.size(-1))
        if self.values is None:
            if tuple(keys.shape) != expected_k:
                raise ValueError(
                    f"this cache holds keys of shape {tuple(self.keys.shape)} (..., heads, "
                    f"max_length, d), so new keys must be {expected_k}; got {tuple(keys.shape)}"
                )
            if keys.dtype != self.keys.dtype:
                raise TypeError(f"the cache stores {self.keys.dtype}, got keys {keys.dtype}")
            self.keys[..., self._length:total, :] = keys
            self._length = total
            return self.keys[..., :total, :], None  # (..., heads, T_cached, d)
        expected_v = (*self.values.shape[:-2], num_new, self.values.size(-1))
        if tuple(keys.shape) != expected_k or tuple(values.shape) != expected_v:
            raise ValueError(
                f"this cache holds keys of shape {tuple(self.keys.shape)} (..., heads, "
                f"max_length, d), so new keys must be {expected_k} and values {expected_v}; "
                f"got {tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if keys.dtype != self.keys.dtype or values.dtype != self.values.dtype:
            raise TypeError(
                f"the cache stores {self.keys.dtype}, got keys {keys.dtype} and "
                f"values {values.dtype}"
            )
        self.keys[..., self._length:total, :] = keys
        self.values[..., self._length:total, :] = values
        self._length = total
        return self.keys[..., :total, :], self.values[..., :total, :]  # (..., heads, T_cached, d)


def kv_cache_bytes(
    *,
    num_layers: int,
    batch_size: int,
    num_kv_heads: int,
    head_dim: int,
    context_length: int,
    bytes_per_element: int = 2,
) -> int:
    """Bytes a model's key/value caches need when full.

    Each layer stores a key and a value vector of ``head_dim`` numbers per
    key/value head, per token, per sequence: ``2 * L * B * H_kv * T * head_dim``
    numbers. Grouped-query attention shrinks it by ``num_heads / num_kv_heads``.

    Args:
        num_layers: attention layers ``L``, each with its own cache.
        batch_size: sequences decoded together ``B``.
        num_kv_heads: key/value heads per layer ``H_kv``.
        head_dim: features per head.
        context_length: tokens held ``T``.
        bytes_per_element: 2 for float16/bfloat16, 4 for float32.

    Shapes:
        (numbers only)

    Returns:
        The number of bytes, an int.

    Taught in chapter 10.
    """
    sizes = {"num_layers": num_layers, "batch_size": batch_size, "num_kv_heads": num_kv_heads,
             "head_dim": head_dim, "context_length": context_length,
             "bytes_per_element": bytes_per_element}
    for name, value in sizes.items():
        check_positive_int(name, value)
    return 2 * num_layers * batch_size * num_kv_heads * context_length * head_dim * (
        bytes_per_element
    )
