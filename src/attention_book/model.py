"""Attention inside a model: a pre-LayerNorm Transformer block and a tiny decoder-only GPT.

A :class:`TransformerBlock` reads the *residual stream* ``x`` and adds two things to it: what
its causal :class:`~attention_book.modules.MultiHeadAttention` finds in the other tokens, and
what a small per-token MLP computes, each from a LayerNorm-ed copy of ``x``
(``x + attn(ln(x))``, then ``x + mlp(ln(x))``). :class:`TinyGPT` stacks such blocks between
a token embedding plus a learned position embedding (or, with ``rope=True``, no position
vector at all and chapter 12's rotary embedding inside every attention layer) and a final
LayerNorm and output layer, and generates greedily, with or without chapter 10's
:class:`~attention_book.kv_cache.KVCache`.

The attention of a block is one kind of *token mixer*, the part of a block that moves
information between tokens. A block can hold another (:class:`TokenMixer`: grouped-query or
latent attention, or a layer that is no attention at all, such as linear attention), and a
:class:`TinyGPT` can choose one per layer (``mixers=``). The model decodes with one cache per
layer, of whatever kind that layer's mixer asks for, and never looks inside it: it reads the
new tokens' positions from the first layer's cache
(:class:`~attention_book.kv_cache.LayerCache`) and hands every layer its own.

This module imports the layers and the caches; nothing else of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from .checks import check_dropout, check_positive_int
from .kv_cache import KVCache, LayerCache, follows_protocol
from .modules import MultiHeadAttention

__all__ = ["TokenMixer", "TransformerBlock", "TinyGPT", "gpt_parameter_count"]


@runtime_checkable
class TokenMixer(Protocol):
    """What a :class:`TransformerBlock` asks of the layer that mixes information across tokens.

    Every attention layer of the package is one (:class:`~attention_book.MultiHeadAttention`,
    :class:`~attention_book.GroupedQueryAttention`,
    :class:`~attention_book.MultiHeadLatentAttention`), and so is any ``nn.Module`` with:

    * ``forward(x, mask=None, return_weights=False, *, kv_cache=None)``: ``x`` is
      ``(B, T, d_model)``, the output has the same shape; with ``return_weights=True`` it
      returns ``(output, weights)``, where ``weights`` may be ``None`` for a mixer that has
      no attention weights. With a cache, ``x`` holds only the new tokens and the mixer
      reads and updates the cache: it must continue exactly where the cache left off, so
      that decoding equals the full forward pass.
    * optionally ``new_cache(max_length)``: an empty cache of the kind the mixer reads (a
      :class:`~attention_book.kv_cache.LayerCache`, for example a recurrent state of fixed
      size). Without it the block gives the mixer a :class:`~attention_book.KVCache`.

    Args:
        (none: a protocol is implemented by a class, not built)

    Shapes:
        x ``(B, T, d_model)`` -> ``(B, T, d_model)``; weights ``(B, num_heads, T, T_k)`` or None.

    Returns:
        (a protocol) ``isinstance(module, TokenMixer)`` checks that ``forward`` exists.

    Taught in chapter 15.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_weights: bool = False, *, kv_cache: LayerCache | None = None): ...


class TransformerBlock(nn.Module):
    """A pre-LayerNorm Transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

    The residual stream ``x`` passes through unchanged; the causal multi-head attention and
    the MLP (``d_model -> mlp_ratio * d_model -> d_model`` with a GELU) each read a
    LayerNorm-ed copy of it and *add* their output. With ``attention_only=True`` the block
    has no MLP (and no second LayerNorm): ``x + attn(ln(x))`` only.

    Args:
        d_model: width of the residual stream.
        num_heads: attention heads; must divide ``d_model``.
        context_length: the longest sequence accepted.
        dropout: dropout on the attention weights and on what each branch adds to the stream.
        mlp_ratio: the MLP's hidden width is ``mlp_ratio * d_model``.
        qkv_bias: give the query, key and value projections a bias.
        attention_only: leave out the MLP.
        rope: rotate the attention's queries and keys by their positions (RoPE, chapter 12);
            with a cache the new tokens continue from ``len(kv_cache)``.
        rope_base: the ``base`` of the rotary frequencies.
        output_gate: gate each attention head's output with a sigmoid of the token (gated
            attention, chapter 19).
        device: where to create the parameters.
        dtype: the parameters' floating dtype.
        mixer: the layer that mixes the tokens (a :class:`TokenMixer`) in place of the
            causal multi-head attention the block would build; it keeps the name
            ``block.attention`` (also ``block.mixer``), and ``num_heads``, ``qkv_bias``,
            ``rope`` and ``rope_base`` are then its own business.

    Shapes:
        x ``(B, T, d_model)`` with ``T <= context_length`` -> ``(B, T, d_model)``;
        weights ``(B, num_heads, T, T)`` (``T_cached`` keys with a cache).

    Returns:
        ``forward(x, mask=None, return_weights=False, *, kv_cache=None)`` returns the new
        residual stream, or ``(stream, attention weights)`` with ``return_weights=True``;
        ``new_cache(max_length)`` an empty cache of the kind its mixer reads.

    Taught in chapter 15.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        context_length: int,
        dropout: float = 0.0,
        mlp_ratio: int = 4,
        qkv_bias: bool = False,
        attention_only: bool = False,
        *,
        rope: bool = False,
        rope_base: float = 10000.0,
        output_gate: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        mixer: nn.Module | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("mlp_ratio", mlp_ratio)
        check_dropout(dropout)
        factory = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.attention_only = attention_only
        self.attention_norm = nn.LayerNorm(d_model, **factory)
        if mixer is None:
            mixer = MultiHeadAttention(
                d_model, d_model, num_heads, context_length=context_length, dropout=dropout,
                qkv_bias=qkv_bias, causal=True, rope=rope, rope_base=rope_base,
                output_gate=output_gate, **factory,
            )
        elif not isinstance(mixer, nn.Module):
            raise TypeError(f"mixer must be an nn.Module with forward(x, mask, return_weights, "
                            f"*, kv_cache) (a TokenMixer), got {type(mixer).__name__}")
        # The chapters call the mixer block.attention; block.mixer names the same layer.
        self.attention = mixer
        self.attention_dropout = nn.Dropout(dropout)
        if not attention_only:
            hidden = mlp_ratio * d_model
            self.mlp_norm = nn.LayerNorm(d_model, **factory)
            self.mlp = nn.Sequential(
                nn.Linear(d_model, hidden, **factory),
                nn.GELU(),
                nn.Linear(hidden, d_model, **factory),
                nn.Dropout(dropout),
            )

    @property
    def mixer(self) -> nn.Module:
        """The layer that mixes the tokens: ``block.attention`` under its general name."""
        return self.attention

    def new_cache(self, max_length: int) -> LayerCache:
        """An empty cache for this block's mixer: its own kind, or a :class:`KVCache`.

        Args:
            max_length: the most tokens the cache must hold.

        Shapes:
            (no tensors)

        Returns:
            ``mixer.new_cache(max_length)`` when the mixer defines it, else ``KVCache(max_length)``.
        """
        make = getattr(self.attention, "new_cache", None)
        return KVCache(max_length) if make is None else make(max_length)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        return_weights: bool = False,
        *,
        kv_cache: LayerCache | None = None,
    ):
        if return_weights:
            attn_out, attn_weights = self.attention(
                self.attention_norm(x), mask, return_weights=True, kv_cache=kv_cache
            )  # (B, T, d_model), (B, num_heads, T, T_k) or None
        else:  # a mixer without weights to give (a fused kernel) runs too
            attn_out = self.attention(self.attention_norm(x), mask, kv_cache=kv_cache)
        x = x + self.attention_dropout(attn_out)  # (B, T, d_model)
        if not self.attention_only:
            x = x + self.mlp(self.mlp_norm(x))  # (B, T, d_model)
        return (x, attn_weights) if return_weights else x


class TinyGPT(nn.Module):
    """A decoder-only language model: embeddings, ``num_layers`` Transformer blocks, an output layer.

    Token ``t``'s vector starts as its token embedding plus the learned embedding of its
    position; the blocks add to it; a final LayerNorm and a linear layer (no bias) turn it
    into logits over the vocabulary for the token at ``t + 1``. With ``rope=True`` there is
    no position embedding (``position_embedding`` is ``None``): every attention layer rotates
    its queries and keys by their positions instead (chapter 12), as Llama does. Every
    block's attention is causal and everything else acts on one position at a time, so the
    logits at ``t`` depend on tokens ``0 … t`` only.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream.
        num_heads: attention heads per block; must divide ``d_model``.
        num_layers: number of blocks.
        context_length: the longest sequence (the number of learned positions).
        dropout: dropout in the embeddings and the blocks (training only).
        attention_only: blocks without MLPs.
        rope: rotary position embeddings in every attention layer instead of a learned
            position embedding.
        rope_base: the ``base`` of the rotary frequencies.
        output_gate: gate each attention head's output with a sigmoid of the token (gated
            attention, chapter 19).
        device: where to create the parameters.
        dtype: the parameters' floating dtype.
        mixers: one entry per layer: a :class:`TokenMixer` that block ``i`` holds in place
            of its multi-head attention (grouped-query or latent attention, linear
            attention, …), or ``None`` for the default attention. You build them, on the
            device and dtype you want; with ``rope=True`` the model has no position
            embedding, so each mixer must handle positions itself.

    Shapes:
        idx ``(B, T)`` integer token ids, ``T <= context_length`` -> logits
        ``(B, T, vocab_size)``; weights: one ``(B, num_heads, T, T)`` per layer.

    Returns:
        ``forward(idx)`` returns the logits, or ``(logits, [weights of each layer])`` with
        ``return_weights=True``; ``forward(idx_new, kv_caches=caches)`` runs the new tokens
        with one cache per layer (any :class:`~attention_book.kv_cache.LayerCache`: a
        ``KVCache``, a paged view of chapter 16, a recurrent state);
        ``generate(idx, max_new_tokens)`` returns ``(B, T + max_new_tokens)`` token ids.

    Taught in chapter 15.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        context_length: int,
        dropout: float = 0.0,
        attention_only: bool = False,
        *,
        rope: bool = False,
        rope_base: float = 10000.0,
        output_gate: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        mixers: Sequence[nn.Module | None] | None = None,
    ):
        super().__init__()
        if not isinstance(rope, bool):
            raise TypeError(f"rope must be a bool, got {type(rope).__name__}")
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                            ("num_layers", num_layers), ("context_length", context_length)):
            check_positive_int(name, value)
        check_dropout(dropout)
        if mixers is None:
            mixers = [None] * num_layers
        elif isinstance(mixers, nn.Module) or not isinstance(mixers, Sequence):
            raise TypeError(f"mixers must be a list of one mixer (or None) per layer, got "
                            f"{type(mixers).__name__}")
        elif len(mixers) != num_layers:
            raise ValueError(f"mixers names {len(mixers)} mixers for num_layers={num_layers} "
                             "layers: give one per layer (None for the default attention)")
        factory = {"device": device, "dtype": dtype}
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.context_length = context_length
        self.rope = rope
        self.token_embedding = nn.Embedding(vocab_size, d_model, **factory)
        # With RoPE the positions live inside attention: the stream starts as the token alone.
        self.position_embedding = (None if rope else
                                   nn.Embedding(context_length, d_model, **factory))
        self.embedding_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, num_heads, context_length, dropout,
                             attention_only=attention_only, rope=rope, rope_base=rope_base,
                             output_gate=output_gate, mixer=mixer, **factory)
            for mixer in mixers
        )
        self.final_norm = nn.LayerNorm(d_model, **factory)
        self.output = nn.Linear(d_model, vocab_size, bias=False, **factory)

    def _check_idx(self, idx: torch.Tensor, start: int) -> None:
        if not isinstance(idx, torch.Tensor):
            raise TypeError(f"idx must be a tensor of token ids, got {type(idx).__name__}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got shape {tuple(idx.shape)}")
        if start + idx.size(1) > self.context_length:
            raise ValueError(
                f"sequence length T={start + idx.size(1)} exceeds "
                f"context_length={self.context_length} (idx has shape {tuple(idx.shape)})"
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, vocab_size={self.vocab_size}), got ids from "
                f"{int(idx.min())} to {int(idx.max())}"
            )

    def _forward(self, idx: torch.Tensor, kv_caches: Sequence[LayerCache] | None = None,
                 return_weights: bool = False):
        """Logits and each layer's weights of ``idx`` (no weights, an empty list, unless
        ``return_weights``); with caches, ``idx`` holds only the new tokens."""
        if kv_caches is None:
            start, positions = 0, torch.arange(idx.size(-1), device=idx.device)  # (T,)
        else:
            if isinstance(kv_caches, (str, bytes)) or not isinstance(kv_caches, Sequence):
                raise TypeError(f"kv_caches must be a list of one cache per layer, got "
                                f"{type(kv_caches).__name__}")
            if len(kv_caches) != len(self.blocks):
                raise ValueError(f"kv_caches holds {len(kv_caches)} caches for "
                                 f"{len(self.blocks)} layers: give one per layer")
            if not follows_protocol(kv_caches[0], LayerCache):
                raise TypeError(f"kv_caches[0] must be a cache (len and positions), got "
                                f"{type(kv_caches[0]).__name__}")
            # The first layer's cache says where the new tokens go: (T,), or (B, T) when
            # the rows have different lengths. Every layer holds as many tokens.
            start = len(kv_caches[0])
            positions = kv_caches[0].positions(idx.size(-1), idx.device)  # (T,) or (B, T)
        self._check_idx(idx, start)
        x = self.token_embedding(idx)  # (B, T, d_model)
        if self.position_embedding is not None:
            x = x + self.position_embedding(positions)  # (B, T, d_model)
        x = self.embedding_dropout(x)
        all_weights = []
        for layer, block in enumerate(self.blocks):
            cache = None if kv_caches is None else kv_caches[layer]
            if return_weights:
                x, attn_weights = block(x, return_weights=True, kv_cache=cache)
                # x (B, T, d_model), attn_weights (B, num_heads, T, T_k) or None
                all_weights.append(attn_weights)
            else:
                x = block(x, kv_cache=cache)  # (B, T, d_model)
        logits = self.output(self.final_norm(x))  # (B, T, vocab_size)
        return logits, all_weights

    def forward(self, idx: torch.Tensor, return_weights: bool = False, *,
                kv_caches: Sequence[LayerCache] | None = None):
        logits, all_weights = self._forward(idx, kv_caches, return_weights)
        return (logits, all_weights) if return_weights else logits

    def new_caches(self, max_length: int | None = None) -> list[LayerCache]:
        """One empty cache per layer, each of the kind its block's mixer reads.

        Args:
            max_length: the most tokens each cache must hold (default ``context_length``).

        Shapes:
            (no tensors)

        Returns:
            A list of ``num_layers`` caches, for ``forward(idx, kv_caches=...)``.
        """
        max_length = self.context_length if max_length is None else max_length
        return [block.new_cache(max_length) for block in self.blocks]

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True):
        """Extend ``idx`` greedily: append the most likely next token, ``max_new_tokens`` times.

        With ``use_cache=True`` each layer keeps a :class:`KVCache` (or the cache its mixer
        asks for, :meth:`new_caches`): the prompt is processed once, then every step feeds
        only the newest token, at its position. Without it, every
        step runs the whole sequence again. The model is put in eval mode while it generates.

        Args:
            idx: the prompts.
            max_new_tokens: how many tokens to append.
            use_cache: decode with one key/value cache per layer.

        Shapes:
            idx ``(B, T)`` -> ``(B, T + max_new_tokens)``; ``T + max_new_tokens`` must not
            exceed ``context_length``.

        Returns:
            The prompts followed by the generated token ids.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
            max_new_tokens < 0
        ):
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        self._check_idx(idx, 0)
        if idx.size(1) + max_new_tokens > self.context_length:
            raise ValueError(
                f"a prompt of {idx.size(1)} tokens plus max_new_tokens={max_new_tokens} makes "
                f"{idx.size(1) + max_new_tokens}, which exceeds "
                f"context_length={self.context_length}"
            )
        was_training = self.training
        self.eval()
        try:
            kv_caches = self.new_caches() if use_cache else None
            new_tokens = idx  # (B, T): the prompt is the first input either way
            for _ in range(max_new_tokens):
                logits, _ = self._forward(new_tokens if use_cache else idx, kv_caches)
                next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
                idx = torch.cat([idx, next_token], dim=1)  # (B, T + 1)
                new_tokens = next_token  # (B, 1)
        finally:
            self.train(was_training)
        return idx


def gpt_parameter_count(
    vocab_size: int,
    d_model: int,
    num_layers: int,
    context_length: int,
    attention_only: bool = False,
    *,
    rope: bool = False,
) -> int:
    """The number of parameters of ``TinyGPT(vocab_size, d_model, _, num_layers, context_length)``.

    Embeddings ``(V + T) d`` (``V d`` with ``rope=True``: no position table); per block,
    attention ``4 d^2 + d`` (query, key, value and output projections, a bias on the output
    only), two LayerNorms ``4 d`` and the MLP ``8 d^2 + 5 d``, so ``12 d^2 + 10 d``
    (``4 d^2 + 3 d`` without the MLP); then the final LayerNorm ``2 d`` and the output layer
    ``d V``. The head count does not matter.

    Args:
        vocab_size: ``V``.
        d_model: ``d``.
        num_layers: ``L``.
        context_length: ``T``, the number of learned positions.
        attention_only: blocks without MLPs.
        rope: the model has rotary positions and no learned position embedding.

    Shapes:
        (numbers only)

    Returns:
        ``2 V d + T d + L (12 d^2 + 10 d) + 2 d``, or with ``4 d^2 + 3 d`` per block when
        ``attention_only``, and without ``T d`` when ``rope``; an int.

    Taught in chapter 15.
    """
    for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                        ("num_layers", num_layers), ("context_length", context_length)):
        check_positive_int(name, value)
    d = d_model
    per_block = 4 * d * d + 3 * d if attention_only else 12 * d * d + 10 * d
    positions = 0 if rope else context_length * d
    return 2 * vocab_size * d + positions + num_layers * per_block + 2 * d
