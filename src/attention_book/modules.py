"""Attention layers as ``nn.Module``s, built on the functional core.

Every layer names its projections ``W_query``, ``W_key`` and ``W_value`` and
its ``forward(x, mask=None, return_weights=False)`` takes ``x`` of shape
``(..., T, d_in)``. ``mask`` is boolean with True = may attend and combines
with the causal mask of the causal layers. The headed layers also decode with
a key/value cache (chapter 10), rotate their queries and keys with RoPE
(``rope=True``) and attend to another sequence (``context=``, cross-attention),
both from chapter 12, and give each head a learned attention sink (``sink=True``,
chapter 13).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from .attention import (
    causal_mask,
    scaled_dot_product_attention,
)
from .checks import (
    check_base,
    check_dropout,
    check_layer_input,
    check_mask,
    check_positive_int,
    require_float,
)
from .flash import sink_column
from .kv_cache import KVCache
from .positions import rotary_embedding

__all__ = [
    "SelfAttention",
    "CausalSelfAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "GroupedQueryAttention",
]


def _fused_with_sink(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    allowed: torch.Tensor | None,
    sink_logit: torch.Tensor,
    dropout_p: float,
    scale: float | None = None,
) -> torch.Tensor:
    """PyTorch's fused attention with an attention sink, which it has no argument for.

    One extra key of zeros scores 0 against every query; an additive mask of
    ``sink_logit`` on its column makes that score the sink, and its value of zeros
    adds nothing to the output: exactly ``exp(sink)`` more in each row's denominator.
    """
    num_queries, num_keys = queries.size(-2), keys.size(-2)
    lead = queries.shape[:-2]  # (..., heads)
    bias = queries.new_zeros(*lead, num_queries, num_keys)  # (..., heads, T, T_k)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))  # (..., heads, T, T_k)
    sink = sink_column(sink_logit, bias).expand(*lead, num_queries, 1)  # (..., heads, T, 1)
    bias = torch.cat([bias, sink], dim=-1)  # (..., heads, T, T_k + 1)
    keys = torch.cat([keys, keys.new_zeros(*keys.shape[:-2], 1, keys.size(-1))], dim=-2)  # (..., T_k + 1, d)
    values = torch.cat([values, values.new_zeros(*values.shape[:-2], 1, values.size(-1))],
                       dim=-2)  # (..., T_k + 1, d_v)
    return torch.nn.functional.scaled_dot_product_attention(
        queries, keys, values, attn_mask=bias, dropout_p=dropout_p, scale=scale,
        enable_gqa=keys.size(-3) != queries.size(-3),
    )  # (..., heads, T, d_v)


class SelfAttention(nn.Module):
    """Single-head self-attention with trainable query, key and value projections.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and of the output.
        qkv_bias: give the three projections a bias.
        device: where to create the parameters (as for ``nn.Linear``).
        dtype: the parameters' floating dtype (as for ``nn.Linear``).

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, d_out)``, weights ``(..., T, T)``;
        ``mask`` broadcastable to ``(..., T, T)``.

    Returns:
        ``forward`` returns the context vectors, or ``(context vectors, weights)``
        when ``return_weights=True``.

    Taught in chapter 3.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        self.d_in = d_in
        self.d_out = d_out
        factory = {"device": device, "dtype": dtype}
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias, **factory)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias, **factory)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias, **factory)

    def _allowed(self, num_tokens: int, mask: torch.Tensor | None) -> torch.Tensor | None:
        return mask

    def _dropout_p(self) -> float:
        return 0.0

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_weights: bool = False
    ):
        num_tokens = check_layer_input(x, self.d_in, getattr(self, "context_length", None))
        if mask is not None:
            check_mask(mask, torch.Size((*x.shape[:-1], num_tokens)))
        queries = self.W_query(x)  # (..., T, d_out)
        keys = self.W_key(x)  # (..., T, d_out)
        values = self.W_value(x)  # (..., T, d_out)
        context_vec, attn_weights = scaled_dot_product_attention(
            queries, keys, values, self._allowed(num_tokens, mask), dropout_p=self._dropout_p()
        )  # (..., T, d_out), (..., T, T)
        return (context_vec, attn_weights) if return_weights else context_vec


class CausalSelfAttention(SelfAttention):
    """Single-head causal self-attention with dropout on the weights.

    Token ``t`` attends only to tokens ``0 … t``. The causal mask is a
    registered buffer: it follows ``.to(device)``, is sliced to the current
    length, and is not saved in the state dict because it is not learned.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and of the output.
        context_length: the longest sequence the layer accepts.
        dropout: probability of zeroing an attention weight in training.
        qkv_bias: give the three projections a bias.
        device: where to create the parameters and the mask buffer.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(..., T, d_in)`` with ``T <= context_length`` -> output ``(..., T, d_out)``,
        weights ``(..., T, T)``; ``mask`` broadcastable to ``(..., T, T)``.

    Returns:
        ``forward`` returns the context vectors, or ``(context vectors, weights)``.

    Taught in chapters 5 and 6.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float = 0.0,
        qkv_bias: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(d_in, d_out, qkv_bias, device=device, dtype=dtype)
        check_positive_int("context_length", context_length)
        check_dropout(dropout)
        self.context_length = context_length
        self.dropout_p = float(dropout)
        self.register_buffer("mask", causal_mask(context_length, device=device), persistent=False)

    def _allowed(self, num_tokens: int, mask: torch.Tensor | None) -> torch.Tensor:
        causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
        return causal if mask is None else causal & mask

    def _dropout_p(self) -> float:
        return self.dropout_p if self.training else 0.0


class MultiHeadAttentionWrapper(nn.Module):
    """Several independent :class:`CausalSelfAttention` heads, concatenated.

    Args:
        d_in: size of each input token vector.
        d_out: output size of *each* head.
        context_length: the longest sequence the layer accepts.
        dropout: dropout probability on each head's weights.
        num_heads: number of heads.
        qkv_bias: give the projections a bias.
        device: where to create the parameters.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, num_heads * d_out)``,
        weights ``(..., num_heads, T, T)``.

    Returns:
        ``forward`` returns the concatenated outputs, or ``(output, weights)``.

    Taught in chapter 7.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        check_positive_int("num_heads", num_heads)
        self.heads = nn.ModuleList(
            CausalSelfAttention(d_in, d_out, context_length, dropout, qkv_bias,
                                device=device, dtype=dtype)
            for _ in range(num_heads)
        )

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, return_weights: bool = False
    ):
        results = [head(x, mask, return_weights=True) for head in self.heads]
        output = torch.cat([out for out, _ in results], dim=-1)  # (..., T, num_heads * d_out)
        attn_weights = torch.stack([w for _, w in results], dim=-3)  # (..., num_heads, T, T)
        return (output, attn_weights) if return_weights else output


def _split_heads(x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """``(..., T, num_heads * head_dim)`` -> ``(..., num_heads, T, head_dim)``."""
    *lead, num_tokens, _ = x.shape
    x = x.view(*lead, num_tokens, num_heads, head_dim)  # (..., T, heads, head_dim)
    return x.transpose(-3, -2)  # (..., heads, T, head_dim)


def _check_cache(kv_cache: object, num_tokens: int, context_length: int | None) -> int:
    """Validate ``kv_cache`` for ``num_tokens`` new tokens; return the tokens it will hold."""
    if not isinstance(kv_cache, KVCache):
        raise TypeError(f"kv_cache must be a KVCache, got {type(kv_cache).__name__}")
    num_keys = len(kv_cache) + num_tokens
    if context_length is not None and num_keys > context_length:
        raise ValueError(
            f"the KV cache holds {len(kv_cache)} tokens; adding {num_tokens} more makes "
            f"{num_keys}, which exceeds context_length={context_length}; "
            f"start a new cache (cache.reset()) or build the layer with a longer context"
        )
    return num_keys


class _HeadedAttention(nn.Module):
    """Shared body of multi-head and grouped-query attention."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        num_heads: int,
        num_kv_heads: int,
        context_length: int | None,
        dropout: float,
        qkv_bias: bool,
        causal: bool,
        backend: str,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        rope: bool = False,
        rope_base: float = 10000.0,
        sink: bool = False,
    ):
        super().__init__()
        check_positive_int("d_in", d_in)
        check_positive_int("d_out", d_out)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_kv_heads", num_kv_heads)
        if context_length is not None:
            check_positive_int("context_length", context_length)
        check_dropout(dropout)
        if d_out % num_heads != 0:
            raise ValueError(f"d_out ({d_out}) must be divisible by num_heads ({num_heads})")
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if backend not in ("naive", "sdpa"):
            raise ValueError(f"backend must be 'naive' or 'sdpa', got {backend!r}")
        if not isinstance(rope, bool):
            raise TypeError(f"rope must be a bool, got {type(rope).__name__}")
        if not isinstance(sink, bool):
            raise TypeError(f"sink must be a bool, got {type(sink).__name__}")
        rope_base = check_base(rope_base)
        if rope and (d_out // num_heads) % 2:
            raise ValueError(
                f"rope=True turns pairs of features, so head_dim = d_out // num_heads = "
                f"{d_out} // {num_heads} = {d_out // num_heads} must be even"
            )
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.context_length = context_length
        self.dropout_p = float(dropout)
        self.causal = causal
        self.backend = backend
        self.rope = rope
        self.rope_base = rope_base
        kv_dim = num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias, **factory)
        self.W_key = nn.Linear(d_in, kv_dim, bias=qkv_bias, **factory)
        self.W_value = nn.Linear(d_in, kv_dim, bias=qkv_bias, **factory)
        self.out_proj = nn.Linear(d_out, d_out, **factory)
        # One learned sink logit per query head (chapter 13); starts at 0, a weight of exp(0).
        self.sink_logit = nn.Parameter(torch.zeros(num_heads, **factory)) if sink else None
        if causal and context_length is not None:
            self.register_buffer("mask", causal_mask(context_length, device=device),
                                 persistent=False)

    def _causal(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        if hasattr(self, "mask"):
            return self.mask[:num_tokens, :num_tokens]  # (T, T)
        return causal_mask(num_tokens, device=device)  # (T, T)

    def _fused(self, queries, keys, values, mask, num_tokens, num_keys, dropout_p, group_size):
        """PyTorch's fused attention, told as much as possible about the mask and the groups."""
        if self.sink_logit is not None:
            allowed = mask
            if self.causal:
                causal = causal_mask(num_tokens, num_keys, device=queries.device)  # (T, T_k)
                allowed = causal if mask is None else causal & mask
            return _fused_with_sink(queries, keys, values, allowed, self.sink_logit, dropout_p)
        causal_only = self.causal and mask is None
        attn_mask, is_causal = mask, False
        if causal_only and num_tokens == num_keys:
            # is_causal lets the fused kernel skip the tiles above the diagonal.
            attn_mask, is_causal = None, True
        elif causal_only:
            # Decoding with a cache: the queries are the last positions, so the diagonal is
            # aligned bottom-right. causal_lower_right says so without a mask tensor; a GPU
            # kernel can then skip the blocks above the diagonal (on the CPU, PyTorch builds
            # the mask from it, as chapter 10 shows).
            attn_mask = causal_lower_right(num_tokens, num_keys)
        elif self.causal:
            causal = causal_mask(num_tokens, num_keys, device=queries.device)  # (T, T_k)
            attn_mask = causal & mask
        # enable_gqa broadcasts each key/value head over its group of query heads inside the
        # kernel, instead of materialising num_heads copies as repeat_interleave does.
        return torch.nn.functional.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p,
            is_causal=is_causal, enable_gqa=group_size > 1,
        )  # (..., num_heads, T, head_dim)

    def _check_context(self, context: object, x: torch.Tensor, kv_cache: object) -> int:
        """Validate a cross-attention ``context`` for the queries ``x``; return ``T_ctx``."""
        if self.causal:
            raise ValueError(
                "a causal layer cannot attend to a context: the context is another sequence, "
                "so no key lies 'in the future' of a query; build the cross-attention layer "
                "with causal=False and pass a padding mask over the context instead"
            )
        if self.rope:
            raise ValueError(
                "rope=True rotates queries and keys by their positions in one sequence; the "
                "context's positions do not share an origin with the queries', so build the "
                "cross-attention layer with rope=False"
            )
        if kv_cache is not None:
            raise ValueError(
                "kv_cache holds the keys of earlier tokens of x; with a context the keys come "
                "from the context, which is the same at every decoding step: pass it again "
                "without a kv_cache"
            )
        require_float("context", context)
        if context.dim() < 2 or context.size(-1) != self.d_in:
            raise ValueError(
                f"context must have shape (..., T_ctx, d_in={self.d_in}), got shape "
                f"{tuple(context.shape)}"
            )
        lead = x.shape[:-2]
        try:
            fits = torch.broadcast_shapes(lead, context.shape[:-2]) == lead
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"the leading (batch) dims of context {tuple(context.shape)} do not broadcast "
                f"to those of x {tuple(x.shape)}"
            )
        return context.size(-2)

    def _rope_positions(
        self, num_tokens: int, kv_cache: KVCache | None, device: torch.device
    ) -> torch.Tensor:
        """The positions of the new tokens: they continue after the tokens already cached."""
        start = 0 if kv_cache is None else len(kv_cache)
        return torch.arange(start, start + num_tokens, device=device)  # (T,)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
        *,
        kv_cache: KVCache | None = None,
        context: torch.Tensor | None = None,
    ):
        """Attend from ``x``; with ``kv_cache``, decode; with ``context``, cross-attend.

        With a cache, ``x`` holds only the new tokens: their keys and values are
        appended to it and the queries attend over every cached token, the causal
        mask aligned bottom-right (the new tokens are the last ones), so decoding
        one token at a time reproduces the full causal forward pass (chapter 10).
        With ``rope=True`` the new tokens take positions ``len(cache) …`` and the
        cache stores their rotated keys (chapter 12). With a ``context`` of shape
        ``(..., T_ctx, d_in)`` the keys and values come from the context and the
        queries from ``x`` (cross-attention, chapter 12; the layer must not be causal,
        and ``context_length`` limits ``x``, not the context).
        ``mask`` broadcasts to ``(..., num_heads, T, T_k)``, where ``T_k`` is the number
        of keys: ``T``, the tokens cached, or ``T_ctx``.
        """
        num_tokens = check_layer_input(x, self.d_in, self.context_length)
        if context is not None:
            num_keys = self._check_context(context, x, kv_cache)
        elif kv_cache is not None:
            num_keys = _check_cache(kv_cache, num_tokens, self.context_length)
        else:
            num_keys = num_tokens
        if return_weights and self.backend == "sdpa":
            raise ValueError(
                "backend='sdpa' does not return attention weights; build the layer with "
                "backend='naive' to get them"
            )
        lead = x.shape[:-2]
        if mask is not None:
            check_mask(mask, torch.Size((*lead, self.num_heads, num_tokens, num_keys)))

        source = x if context is None else context  # (..., T_k, d_in): where keys come from
        # (..., num_heads, T, head_dim)
        queries = _split_heads(self.W_query(x), self.num_heads, self.head_dim)
        # (..., num_kv_heads, T_k, head_dim)
        keys = _split_heads(self.W_key(source), self.num_kv_heads, self.head_dim)
        # (..., num_kv_heads, T_k, hd)
        values = _split_heads(self.W_value(source), self.num_kv_heads, self.head_dim)
        if self.rope:
            # Read the positions before the cache grows: the new tokens come after len(cache).
            positions = self._rope_positions(num_tokens, kv_cache, x.device)  # (T,)
            queries = rotary_embedding(queries, positions, base=self.rope_base)  # same shape
            keys = rotary_embedding(keys, positions, base=self.rope_base)  # same shape
        if kv_cache is not None:
            # The cache stores num_kv_heads heads: grouped-query attention's memory saving.
            keys, values = kv_cache.update(keys, values)  # (..., num_kv_heads, T_k, head_dim)
        group_size = self.num_heads // self.num_kv_heads
        dropout_p = self.dropout_p if self.training else 0.0

        if self.backend == "sdpa":
            context_vec = self._fused(queries, keys, values, mask, num_tokens, num_keys, dropout_p,
                                      group_size)  # (..., num_heads, T, head_dim)
            attn_weights = None
        else:
            if group_size > 1:
                # Each key/value head serves `group_size` consecutive query heads.
                keys = keys.repeat_interleave(group_size, dim=-3)  # (..., num_heads, T_k, head_dim)
                values = values.repeat_interleave(group_size, dim=-3)  # (..., num_heads, T_k, hd)
            allowed = mask
            if self.causal:
                if kv_cache is None:
                    causal = self._causal(num_tokens, x.device)  # (T, T)
                else:
                    # The new queries are the last num_tokens positions: bottom-right alignment.
                    causal = causal_mask(num_tokens, num_keys, device=x.device)  # (T, T_k)
                allowed = causal if mask is None else causal & mask
            context_vec, attn_weights = scaled_dot_product_attention(
                queries, keys, values, allowed, dropout_p=dropout_p, sink_logit=self.sink_logit
            )  # (..., num_heads, T, head_dim), (..., num_heads, T, T_k)

        # transpose makes the memory non-contiguous, so merge the heads with reshape.
        context_vec = context_vec.transpose(-3, -2)  # (..., T, num_heads, head_dim)
        context_vec = context_vec.reshape(*lead, num_tokens, self.d_out)  # (..., T, d_out)
        output = self.out_proj(context_vec)  # (..., T, d_out)
        return (output, attn_weights) if return_weights else output


class MultiHeadAttention(_HeadedAttention):
    """Multi-head attention: one projection each for Q, K, V, split into heads.

    Args:
        d_in: size of each input token vector.
        d_out: model width; must be divisible by ``num_heads``.
        num_heads: number of heads; ``head_dim = d_out // num_heads``.
        context_length: the longest sequence accepted (None: any length).
        dropout: probability of zeroing an attention weight in training.
        qkv_bias: give the Q, K, V projections a bias.
        causal: apply the causal mask.
        backend: ``"naive"`` (the book's own attention, returns weights) or
            ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``,
            the same numbers from a fused kernel).
        device: where to create the parameters and the mask buffer.
        dtype: the parameters' floating dtype.
        rope: rotate the queries and keys of every head by their positions
            (:func:`~attention_book.positions.rotary_embedding`, split-half pairing)
            after the projection; ``head_dim`` must be even.
        rope_base: the ``base`` of the rotary frequencies.
        sink: give each head a learned attention sink, ``sink_logit`` of shape
            ``(num_heads,)`` (starting at 0): one more term in each row's softmax
            denominator, so the weights sum to less than 1 (chapter 13).

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, d_out)``, weights
        ``(..., num_heads, T, T)``; ``mask`` broadcastable to ``(..., num_heads, T, T)``
        (``padding_mask`` gives ``(B, 1, 1, T)``). With ``context`` ``(..., T_ctx, d_in)``
        the weights are ``(..., num_heads, T, T_ctx)`` and ``mask`` broadcasts to them.

    Returns:
        ``forward`` returns the output, or ``(output, weights)`` when ``return_weights=True``;
        ``forward(x_new, kv_cache=cache)`` decodes with a :class:`KVCache` (chapter 10);
        ``forward(x, context=ctx)`` is cross-attention (a non-causal layer, chapter 12).

    Taught in chapter 7 (the KV cache in chapter 10; RoPE and cross-attention in chapter 12;
    the sink in chapter 13).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        num_heads: int,
        context_length: int | None = None,
        dropout: float = 0.0,
        qkv_bias: bool = False,
        causal: bool = True,
        backend: str = "naive",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        sink: bool = False,
    ):
        super().__init__(
            d_in, d_out, num_heads, num_heads, context_length, dropout, qkv_bias, causal, backend,
            device, dtype, rope, rope_base, sink,
        )


class GroupedQueryAttention(_HeadedAttention):
    """Grouped-query attention: ``num_heads`` query heads share ``num_kv_heads`` key/value heads.

    With ``num_kv_heads == num_heads`` it is :class:`MultiHeadAttention` (the
    parameter names match, so a ``MultiHeadAttention`` state dict loads
    unchanged); with ``num_kv_heads == 1`` it is multi-query attention.

    Args:
        d_in: size of each input token vector.
        d_out: model width; must be divisible by ``num_heads``.
        num_heads: number of query heads.
        num_kv_heads: number of key/value heads; must divide ``num_heads``.
        context_length: the longest sequence accepted (None: any length).
        dropout: probability of zeroing an attention weight in training.
        qkv_bias: give the Q, K, V projections a bias.
        causal: apply the causal mask.
        backend: ``"naive"`` or ``"sdpa"``, as in :class:`MultiHeadAttention`.
        device: where to create the parameters and the mask buffer.
        dtype: the parameters' floating dtype.
        rope: rotate queries and keys by their positions, as in :class:`MultiHeadAttention`.
        rope_base: the ``base`` of the rotary frequencies.
        sink: a learned attention sink per query head, as in :class:`MultiHeadAttention`.

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, d_out)``; ``W_key`` and
        ``W_value`` map ``d_in -> num_kv_heads * head_dim``; with ``context``
        ``(..., T_ctx, d_in)`` the keys and values come from the context.

    Returns:
        ``forward`` returns the output, or ``(output, weights)`` when ``return_weights=True``;
        ``forward(x_new, kv_cache=cache)`` decodes with a :class:`KVCache` (chapter 10);
        ``forward(x, context=ctx)`` is cross-attention (a non-causal layer, chapter 12).

    Taught in chapter 7 (the KV cache in chapter 10; RoPE and cross-attention in chapter 12;
    the sink in chapter 13).
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        num_heads: int,
        num_kv_heads: int,
        context_length: int | None = None,
        dropout: float = 0.0,
        qkv_bias: bool = False,
        causal: bool = True,
        backend: str = "naive",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        sink: bool = False,
    ):
        super().__init__(
            d_in, d_out, num_heads, num_kv_heads, context_length, dropout, qkv_bias, causal, backend,
            device, dtype, rope, rope_base, sink,
        )
