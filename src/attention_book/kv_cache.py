"""A key/value cache for decoding one token at a time.

When a decoder generates text, step ``t`` needs the keys and values of tokens
``0 … t``; all but the newest were already computed at earlier steps. A
:class:`KVCache` keeps them, so each step projects only the new token and
attends over what is stored. :class:`attention_book.MultiHeadAttention` and
:class:`attention_book.GroupedQueryAttention` accept one through
``forward(x, kv_cache=cache)``; so does
:class:`attention_book.latent.MultiHeadLatentAttention` (chapter 14), which
stores one latent vector per token in place of a key and a value.

This module imports only the functional core.
"""

from __future__ import annotations

import torch

from .checks import check_positive_int, require_float

__all__ = ["KVCache", "kv_cache_bytes"]


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
        as multi-head latent attention does).

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
