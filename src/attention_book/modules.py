"""Attention layers as ``nn.Module``s, built on the functional core.

Every layer names its projections ``W_query``, ``W_key`` and ``W_value`` and
its ``forward(x, mask=None, return_weights=False)`` takes ``x`` of shape
``(..., T, d_in)``. ``mask`` is boolean with True = may attend and combines
with the causal mask of the causal layers. The headed layers also decode with
any cache of the cache protocol (:class:`~attention_book.kv_cache.AttentionCache`:
chapter 10's :class:`~attention_book.kv_cache.KVCache`, chapter 16's paged view),
rotate their queries and keys with RoPE (``rope=True``) and attend to another
sequence (``context=``, cross-attention), both from chapter 12, and give each
head a learned attention sink (``sink=True``, chapter 13).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import (
    causal_mask,
    scaled_dot_product_attention,
)
from .checks import (
    broadcast_shape,
    check_base,
    check_dropout,
    check_layer_input,
    check_mask,
    check_positive_int,
    require_float,
)
from .fused import fused_attention
from .kv_cache import AttentionCache, KVCache, check_cache, position_mask
from .layout import merge_heads, split_heads
from .positions import rotary_embedding

__all__ = [
    "SelfAttention",
    "CausalSelfAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "GroupedQueryAttention",
]


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
        output_gate: bool = False,
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
        if not isinstance(output_gate, bool):
            raise TypeError(f"output_gate must be a bool, got {type(output_gate).__name__}")
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
        # Gated attention (chapter 19): a sigmoid gate per head and feature, from the query's token.
        self.W_gate = nn.Linear(d_in, d_out, bias=qkv_bias, **factory) if output_gate else None
        if causal and context_length is not None:
            self.register_buffer("mask", causal_mask(context_length, device=device),
                                 persistent=False)

    def _causal(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        if hasattr(self, "mask"):
            return self.mask[:num_tokens, :num_tokens]  # (T, T)
        return causal_mask(num_tokens, device=device)  # (T, T)

    def _fused(self, queries, keys, values, allowed, square_causal, dropout_p, lower_right):
        """PyTorch's fused attention, told as much as possible about the mask and the groups.

        ``allowed`` is the whole mask, or None when it is only causal: square
        (``square_causal``), or bottom-right (``lower_right``: the keys are positions
        ``0 … T_k - 1`` of a KVCache and the queries the last ones).
        """
        num_tokens, num_keys = queries.size(-2), keys.size(-2)
        if self.sink_logit is not None:
            if square_causal:
                allowed = self._causal(num_tokens, queries.device)  # (T, T)
            return fused_attention(queries, keys, values, allowed, dropout_p=dropout_p,
                                   sink_logit=self.sink_logit)  # (..., num_heads, T, head_dim)
        attn_mask, is_causal = allowed, False
        if square_causal or (lower_right and num_tokens == num_keys):
            # is_causal lets the fused kernel skip the tiles above the diagonal.
            attn_mask, is_causal = None, True
        elif lower_right:
            # Decoding with a KVCache: its keys are positions 0 … T_k - 1 and the queries the
            # last ones, so the diagonal is aligned bottom-right. causal_lower_right says so
            # without a mask tensor; a GPU kernel can then skip the blocks above the diagonal
            # (on the CPU, PyTorch builds the mask from it, as chapter 10 shows).
            from torch.nn.attention.bias import causal_lower_right  # imports TorchDynamo: ~1 s

            attn_mask = causal_lower_right(num_tokens, num_keys)
        # Grouped heads: the kernel broadcasts each key/value head over its group of query
        # heads (enable_gqa), instead of materialising num_heads copies as repeat_interleave does.
        return fused_attention(queries, keys, values, attn_mask, is_causal=is_causal,
                               dropout_p=dropout_p)  # (..., num_heads, T, head_dim)

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
        if broadcast_shape(lead, context.shape[:-2]) != lead:
            raise ValueError(
                f"the leading (batch) dims of context {tuple(context.shape)} do not broadcast "
                f"to those of x {tuple(x.shape)}"
            )
        return context.size(-2)

    def _rope_positions(
        self, num_tokens: int, kv_cache: AttentionCache | None, device: torch.device
    ) -> torch.Tensor:
        """The positions of the new tokens: they continue after the tokens already cached."""
        if kv_cache is None:
            return torch.arange(num_tokens, device=device)  # (T,)
        positions = kv_cache.positions(num_tokens, device)  # (T,) or (B, T)
        # A row of positions per sequence: (B, 1, T) broadcasts over the heads.
        return positions if positions.dim() == 1 else positions.unsqueeze(-2)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
        *,
        kv_cache: AttentionCache | None = None,
        context: torch.Tensor | None = None,
    ):
        """Attend from ``x``; with ``kv_cache``, decode; with ``context``, cross-attend.

        With a cache, ``x`` holds only the new tokens: their keys and values are
        appended to it and the queries attend over every cached token, the causal
        mask aligned bottom-right (the new tokens are the last ones), so decoding
        one token at a time reproduces the full causal forward pass (chapter 10).
        The cache may be any :class:`~attention_book.kv_cache.AttentionCache`: the layer
        reads the new tokens' positions from it (``(T,)``, or ``(B, T)`` when the rows of
        a batch have different lengths) and builds the mask from them and the keys'
        positions (:func:`~attention_book.kv_cache.position_mask`).
        With ``rope=True`` the new tokens take the cache's positions (``len(cache) …`` for
        a :class:`KVCache`) and the cache stores their rotated keys (chapter 12). With a ``context`` of shape
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
            num_keys = check_cache(kv_cache, num_tokens, self.context_length)
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
        queries = split_heads(self.W_query(x), self.num_heads, self.head_dim)
        # (..., num_kv_heads, T_k, head_dim)
        keys = split_heads(self.W_key(source), self.num_kv_heads, self.head_dim)
        # (..., num_kv_heads, T_k, hd)
        values = split_heads(self.W_value(source), self.num_kv_heads, self.head_dim)
        # A KVCache holds positions 0 … T_k - 1, the new tokens last: for the fused kernel its
        # causal mask is PyTorch's bottom-right one, which needs no mask tensor (_fused).
        lower_right = (isinstance(kv_cache, KVCache) and self.backend == "sdpa" and self.causal
                       and mask is None and self.sink_logit is None)
        if kv_cache is not None and not lower_right:
            # Read the positions before the cache grows: the new tokens come after its tokens.
            query_positions = kv_cache.positions(num_tokens, x.device)  # (T,) or (B, T)
        if self.rope:
            positions = self._rope_positions(num_tokens, kv_cache, x.device)  # (T,) or (B, 1, T)
            queries = rotary_embedding(queries, positions, base=self.rope_base)  # same shape
            keys = rotary_embedding(keys, positions, base=self.rope_base)  # same shape
        square_causal = False  # a causal mask on T x T, which the fused kernel needs no tensor for
        if kv_cache is not None:
            # The cache stores num_kv_heads heads: grouped-query attention's memory saving.
            keys, values = kv_cache.update(keys, values)  # (..., num_kv_heads, T_k, head_dim)
        if lower_right:
            allowed = None
        elif kv_cache is not None:
            # Bottom-right causal by positions; a slot of the cache that holds no token is hidden.
            allowed = position_mask(query_positions, kv_cache.key_positions(x.device),
                                    causal=self.causal)  # (T, T_k) or (B, T, T_k)
            if allowed.dim() > 2:
                allowed = allowed.unsqueeze(-3)  # (B, 1, T, T_k): the same for every head
            allowed = allowed if mask is None else allowed & mask
        elif self.causal and mask is None and self.backend == "sdpa":
            allowed, square_causal = None, True
        elif self.causal:
            causal = self._causal(num_tokens, x.device)  # (T, T)
            allowed = causal if mask is None else causal & mask
        else:
            allowed = mask
        group_size = self.num_heads // self.num_kv_heads
        dropout_p = self.dropout_p if self.training else 0.0

        if self.backend == "sdpa":
            context_vec = self._fused(queries, keys, values, allowed, square_causal, dropout_p,
                                      lower_right)  # (..., num_heads, T, head_dim)
            attn_weights = None
        else:
            if group_size > 1:
                # Each key/value head serves `group_size` consecutive query heads.
                keys = keys.repeat_interleave(group_size, dim=-3)  # (..., num_heads, T_k, head_dim)
                values = values.repeat_interleave(group_size, dim=-3)  # (..., num_heads, T_k, hd)
            context_vec, attn_weights = scaled_dot_product_attention(
                queries, keys, values, allowed, dropout_p=dropout_p, sink_logit=self.sink_logit
            )  # (..., num_heads, T, head_dim), (..., num_heads, T, T_k)

        context_vec = merge_heads(context_vec)  # (..., T, d_out)
        if self.W_gate is not None:
            context_vec = context_vec * torch.sigmoid(self.W_gate(x))  # (..., T, d_out)
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
        output_gate: multiply each head's output, feature by feature, by
            ``sigmoid(W_gate(x))`` before the output projection (gated attention, as in
            Qwen3-Next; ``W_gate`` is ``(d_out, d_in)``, with a bias when ``qkv_bias``).

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, d_out)``, weights
        ``(..., num_heads, T, T)``; ``mask`` broadcastable to ``(..., num_heads, T, T)``
        (``padding_mask`` gives ``(B, 1, 1, T)``). With ``context`` ``(..., T_ctx, d_in)``
        the weights are ``(..., num_heads, T, T_ctx)`` and ``mask`` broadcasts to them.

    Returns:
        ``forward`` returns the output, or ``(output, weights)`` when ``return_weights=True``;
        ``forward(x_new, kv_cache=cache)`` decodes with a :class:`KVCache` (chapter 10) or any
        other :class:`~attention_book.kv_cache.AttentionCache` (a paged view, chapter 16);
        ``forward(x, context=ctx)`` is cross-attention (a non-causal layer, chapter 12).

    Taught in chapter 7 (the KV cache in chapter 10; RoPE and cross-attention in chapter 12;
    the sink in chapter 13; the output gate in chapter 19).
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
        output_gate: bool = False,
    ):
        super().__init__(
            d_in, d_out, num_heads, num_heads, context_length, dropout, qkv_bias, causal, backend,
            device, dtype, rope, rope_base, sink, output_gate,
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
        ``forward(x_new, kv_cache=cache)`` decodes with a :class:`KVCache` (chapter 10) or any
        other :class:`~attention_book.kv_cache.AttentionCache` (a paged view, chapter 16);
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
