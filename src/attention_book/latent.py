"""Multi-head latent attention (MLA): cache one small latent per token, not keys and values.

Multi-head attention caches ``2 * d_out`` numbers per token and layer: a key and a
value for every head. DeepSeek-V2 (DeepSeek-AI, 2024) caches a single latent
vector of ``latent_dim`` numbers instead. Every token is first projected *down*
to its latent, ``latent = x W_down_kv``; the keys and values of all heads are
projected back *up* from it, ``keys = latent W_key`` and ``values = latent W_value``.
Since the up-projections are fixed matrices, attention can also run on the
latents directly (the *absorbed* form): the score of head ``h``,
``q_h . (W_key_h latent)``, equals ``(W_key_h^T q_h) . latent``, and the output
``sum_j w_j (W_value_h latent_j)`` equals ``W_value_h (sum_j w_j latent_j)``.
``forward(..., absorb=True)`` computes that way and gives the same output.

DeepSeek's decoupled RoPE (a few extra rotated query and key features, the key part
shared by the heads and cached beside the latent) is explained in chapter 14 and
not built here: this layer has no positions of its own.

This module imports the functional core, the cache protocol, the head layout and the fused
backend.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import (
    causal_mask,
    scaled_dot_product_attention,
)
from .checks import check_dropout, check_layer_input, check_mask, check_positive_int
from .fused import fused_attention
from .kv_cache import AttentionCache, check_cache, position_mask
from .layout import merge_heads, split_heads

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention: keys and values projected up from a cached latent.

    Each token's ``latent`` (``latent_dim`` numbers) is all that a
    :class:`~attention_book.KVCache` keeps; the keys and values of the
    ``num_heads`` heads are computed from it by the up-projections ``W_key`` and
    ``W_value``. With ``absorb=True`` the up-projections are folded into the
    queries and the outputs instead, and attention runs on the latents: the same
    output, without ever building the keys and values of the cached tokens.

    Args:
        d_in: size of each input token vector.
        d_out: model width; must be divisible by ``num_heads``.
        num_heads: number of heads; ``head_dim = d_out // num_heads``.
        latent_dim: size of the latent cached per token (DeepSeek's ``d_c``).
        context_length: the longest sequence accepted (None: any length).
        dropout: probability of zeroing an attention weight in training.
        causal: apply the causal mask.
        backend: ``"naive"`` (the book's attention, returns weights) or ``"sdpa"``
            (``torch.nn.functional.scaled_dot_product_attention``).
        sink: give each head a learned attention sink ``sink_logit`` ``(num_heads,)``,
            as in :class:`~attention_book.MultiHeadAttention`.
        device: where to create the parameters and the mask buffer.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(..., T, d_in)`` -> output ``(..., T, d_out)``, weights
        ``(..., num_heads, T, T_k)``; ``W_down_kv`` maps ``d_in -> latent_dim``,
        ``W_key`` and ``W_value`` map ``latent_dim -> d_out``; the cache holds
        ``(..., 1, T_cached, latent_dim)``.

    Returns:
        ``forward`` returns the output, or ``(output, weights)`` when
        ``return_weights=True``; ``forward(x_new, kv_cache=cache)`` decodes.

    Taught in chapter 14.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        num_heads: int,
        latent_dim: int,
        context_length: int | None = None,
        dropout: float = 0.0,
        causal: bool = True,
        backend: str = "naive",
        *,
        sink: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out), ("num_heads", num_heads),
                            ("latent_dim", latent_dim)):
            check_positive_int(name, value)
        if context_length is not None:
            check_positive_int("context_length", context_length)
        check_dropout(dropout)
        if d_out % num_heads != 0:
            raise ValueError(f"d_out ({d_out}) must be divisible by num_heads ({num_heads})")
        if backend not in ("naive", "sdpa"):
            raise ValueError(f"backend must be 'naive' or 'sdpa', got {backend!r}")
        if not isinstance(sink, bool):
            raise TypeError(f"sink must be a bool, got {type(sink).__name__}")
        self.d_in = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.latent_dim = latent_dim
        self.context_length = context_length
        self.dropout_p = float(dropout)
        self.causal = causal
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        self.W_query = nn.Linear(d_in, d_out, bias=False, **factory)
        self.W_down_kv = nn.Linear(d_in, latent_dim, bias=False, **factory)
        self.W_key = nn.Linear(latent_dim, d_out, bias=False, **factory)
        self.W_value = nn.Linear(latent_dim, d_out, bias=False, **factory)
        self.out_proj = nn.Linear(d_out, d_out, **factory)
        self.sink_logit = nn.Parameter(torch.zeros(num_heads, **factory)) if sink else None
        if causal and context_length is not None:
            self.register_buffer("mask", causal_mask(context_length, device=device),
                                 persistent=False)

    def _up_projection(self, linear: nn.Linear) -> torch.Tensor:
        """An up-projection's weight, one ``(head_dim, latent_dim)`` block per head."""
        return linear.weight.view(self.num_heads, self.head_dim, self.latent_dim)  # (H, hd, latent)

    def _allowed(self, mask, num_tokens: int, device) -> torch.Tensor | None:
        """The mask without a cache: the causal triangle (if causal) and ``mask``."""
        if not self.causal:
            return mask
        if hasattr(self, "mask"):
            causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
        else:
            causal = causal_mask(num_tokens, device=device)  # (T, T)
        return causal if mask is None else causal & mask

    def _attend(self, queries, keys, values, allowed, dropout_p, scale):
        """Attention with either backend; the sdpa backend returns no weights."""
        if self.backend == "naive":
            return scaled_dot_product_attention(
                queries, keys, values, allowed, dropout_p=dropout_p, scale=scale,
                sink_logit=self.sink_logit)
        return fused_attention(queries, keys, values, allowed, dropout_p=dropout_p, scale=scale,
                               sink_logit=self.sink_logit), None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
        *,
        kv_cache: AttentionCache | None = None,
        absorb: bool = False,
    ):
        """Attend from ``x``; with ``kv_cache``, decode; ``absorb`` picks the form of the computation.

        With a cache, ``x`` holds only the new tokens: their latents are appended
        to it (``latent_dim`` numbers per token) and the queries attend over every
        cached token, the causal mask aligned bottom-right. ``absorb=False`` projects
        every latent up into keys and values; ``absorb=True`` folds ``W_key`` into
        the queries and ``W_value`` into the outputs and attends over the latents;
        both give the same output and weights. ``mask`` broadcasts to
        ``(..., num_heads, T, T_k)``.
        """
        num_tokens = check_layer_input(x, self.d_in, self.context_length)
        if not isinstance(absorb, bool):
            raise TypeError(f"absorb must be a bool, got {type(absorb).__name__}")
        num_keys = num_tokens
        if kv_cache is not None:
            num_keys = check_cache(kv_cache, num_tokens, self.context_length)
        if return_weights and self.backend == "sdpa":
            raise ValueError(
                "backend='sdpa' does not return attention weights; build the layer with "
                "backend='naive' to get them"
            )
        lead = x.shape[:-2]
        if mask is not None:
            check_mask(mask, torch.Size((*lead, self.num_heads, num_tokens, num_keys)))

        # (..., num_heads, T, head_dim)
        queries = split_heads(self.W_query(x), self.num_heads, self.head_dim)
        latent = self.W_down_kv(x).unsqueeze(-3)  # (..., 1, T, latent_dim): shared by the heads
        if kv_cache is not None:
            query_positions = kv_cache.positions(num_tokens, x.device)  # (T,) or (B, T)
            # The cache keeps the latent alone: latent_dim numbers per token, not 2 * d_out.
            latent, _ = kv_cache.update(latent)  # (..., 1, T_k, latent_dim)
            # Bottom-right causal by positions, as in MultiHeadAttention; empty slots hidden.
            allowed = position_mask(query_positions, kv_cache.key_positions(x.device),
                                    causal=self.causal)  # (T, T_k) or (B, T, T_k)
            if allowed.dim() > 2:
                allowed = allowed.unsqueeze(-3)  # (B, 1, T, T_k): the same for every head
            allowed = allowed if mask is None else allowed & mask
        else:
            allowed = self._allowed(mask, num_tokens, x.device)  # (T, T) or mask's shape
        dropout_p = self.dropout_p if self.training else 0.0
        scale = 1.0 / math.sqrt(self.head_dim)  # the heads' keys have head_dim features

        if absorb:
            # q_h . (W_key_h c) = (W_key_h^T q_h) . c: queries moved into the latent space.
            queries = queries @ self._up_projection(self.W_key)  # (..., num_heads, T, latent_dim)
            context_latent, attn_weights = self._attend(
                queries, latent, latent, allowed, dropout_p, scale)  # (..., num_heads, T, latent_dim)
            # sum_j w_j (W_value_h c_j) = W_value_h (sum_j w_j c_j): up-project once, at the end.
            value_up = self._up_projection(self.W_value)  # (num_heads, head_dim, latent_dim)
            context_vec = context_latent @ value_up.transpose(-2, -1)  # (..., num_heads, T, head_dim)
        else:
            latent = latent.squeeze(-3)  # (..., T_k, latent_dim)
            # (..., num_heads, T_k, head_dim)
            keys = split_heads(self.W_key(latent), self.num_heads, self.head_dim)
            # (..., num_heads, T_k, head_dim)
            values = split_heads(self.W_value(latent), self.num_heads, self.head_dim)
            context_vec, attn_weights = self._attend(
                queries, keys, values, allowed, dropout_p, scale)  # (..., num_heads, T, head_dim)

        context_vec = merge_heads(context_vec)  # (..., T, d_out)
        output = self.out_proj(context_vec)  # (..., T, d_out)
        return (output, attn_weights) if return_weights else output
