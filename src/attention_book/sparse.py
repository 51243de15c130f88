"""Sparse attention picked by a cheap scorer: top-k attention and DeepSeek's lightning indexer.

DeepSeek Sparse Attention (DSA, DeepSeek-AI, 2025) puts a small scorer, the *lightning
indexer*, in front of attention. For a query token ``t`` and every earlier token ``s`` it
computes an index score

    I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s])

with a few indexer heads ``j`` (their queries ``q[t, j]`` and weights ``w[t, j]`` come from
token ``t``) and one key ``k[s]`` per token, shared by the heads. Attention then reads only
the ``top_k`` keys with the highest index scores: :func:`topk_attention`. That is dense
attention with ``-inf`` at every key outside the selected set (:func:`topk_mask` gives the
set), computed on the gathered keys only. The selection is a comparison, so no gradient
reaches the index scores through it; DSA trains the indexer by distilling the main
attention's weights, summed over its heads, into the softmax of the index scores with a
KL loss (:func:`indexer_distillation_loss`).

A kernel that works on tiles can select whole tiles instead of single keys:
:func:`block_topk_mask` keeps, for every block of queries, its own block and the
``top_k_blocks - 1`` earlier key blocks with the highest pooled index score, as a
FlexAttention block mask (chapter 13), and :func:`block_topk_attention` runs FlexAttention
with it.

Causal alignment is bottom-right throughout, as in the rest of the book: query ``i`` of
``T_q`` sits at position ``i + T_k - T_q`` of the keys.

This module imports the functional core and the argument checks; FlexAttention is imported
where it is used.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import nn

from .attention import causal_mask, softmax
from .checks import check_positive_int, require_float

__all__ = [
    "topk_mask",
    "topk_attention",
    "lightning_indexer_scores",
    "LightningIndexer",
    "indexer_distillation_loss",
    "block_topk_mask",
    "block_topk_attention",
]

# Rows of queries handled at once: bounds the memory of the selection and of the gathered
# keys and values (about 2**22 scores and 2**24 gathered numbers per step).
_SCORE_BUDGET = 2**22
_GATHER_BUDGET = 2**24


def _check_top_k(top_k: object, name: str = "top_k", what: str = "keys each query") -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"{name} must be an int, got {type(top_k).__name__}")
    if top_k < 1:
        raise ValueError(f"{name} must be >= 1 (the number of {what} reads), got {top_k}")
    return top_k


def _check_index_scores(index_scores: object, batch_size: int | None, num_queries: int | None,
                        num_keys: int | None) -> torch.Tensor:
    require_float("index_scores", index_scores)
    expected = (batch_size, num_queries, num_keys)
    shape = tuple(index_scores.shape)
    if index_scores.dim() != 3 or any(
        want is not None and got != want for got, want in zip(shape, expected, strict=True)
    ):
        want = ", ".join("?" if size is None else str(size) for size in expected)
        raise ValueError(
            f"index_scores must have shape (B, T_q, T_k) = ({want}), one score per query and "
            f"key shared by every head, got shape {shape}"
        )
    # amax propagates NaN, and a full reduction allocates nothing the size of the scores
    # (isnan(...).any() would make a (B, T_q, T_k) bool tensor: 256 MiB at 16k tokens).
    if index_scores.numel() and bool(torch.isnan(index_scores.amax())):
        raise ValueError("index_scores holds NaN: every score must be a number (-inf never selects)")
    return index_scores


def _visible(num_queries: int, num_keys: int, rows: slice, is_causal: bool,
             device: torch.device) -> torch.Tensor | None:
    """The keys each query of ``rows`` may see: ``(rows, T_k)`` bottom-right causal, or None."""
    if not is_causal:
        return None
    # Only these rows of the causal mask: building all T_q x T_k of it for every block of
    # queries would cost more than the attention itself.
    start, stop, _ = rows.indices(num_queries)
    queries = torch.arange(start, stop, device=device)  # (rows,)
    keys = torch.arange(num_keys, device=device)  # (T_k,)
    return keys[None, :] <= queries[:, None] + (num_keys - num_queries)  # (rows, T_k)


def _select(scores: torch.Tensor, top_k: int, visible: torch.Tensor | None) -> torch.Tensor:
    """The chosen keys of each row of ``scores`` ``(B, rows, T_k)``: bool, same shape.

    Among the visible keys whose score is not ``-inf``, the ``top_k`` highest; where scores
    tie at the boundary, the earlier positions win.
    """
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))  # (B, rows, T_k)
    k = min(top_k, scores.size(-1))
    threshold = scores.topk(k, dim=-1).values[..., -1:]  # (B, rows, 1): the k-th highest
    above = scores > threshold  # (B, rows, T_k): certainly chosen
    tied = scores == threshold  # (B, rows, T_k): chosen from the left while places remain
    places = k - above.sum(dim=-1, keepdim=True)  # (B, rows, 1)
    chosen = above | (tied & (tied.cumsum(dim=-1) <= places))  # (B, rows, T_k)
    return chosen & (scores > float("-inf"))  # a -inf score (masked) is never chosen


def _selected_positions(chosen: torch.Tensor, top_k: int) -> torch.Tensor:
    """Positions of the chosen keys in increasing order, ``-1`` in the empty places.

    Shapes: chosen ``(B, rows, T_k)`` -> ``(B, rows, min(top_k, T_k))``.
    """
    num_keys = chosen.size(-1)
    k = min(top_k, num_keys)
    # Chosen keys rank by -position (earliest first); the others rank below every chosen one.
    rank = torch.where(chosen, num_keys - torch.arange(num_keys, device=chosen.device), 0)
    best = rank.topk(k, dim=-1)  # (B, rows, k), sorted by rank: earliest chosen key first
    return torch.where(best.values > 0, num_keys - best.values, -1)  # (B, rows, k)


def _row_blocks(num_queries: int, per_row: int, budget: int) -> int:
    return max(1, min(num_queries, budget // max(1, per_row)))


def topk_mask(index_scores: torch.Tensor, top_k: int, *, is_causal: bool = True) -> torch.Tensor:
    """The keys that top-k attention reads: for each query, its ``top_k`` best-scored keys.

    A key is a candidate when the query may see it (bottom-right causal with
    ``is_causal=True``) and its index score is not ``-inf``. Of the candidates, the
    ``top_k`` with the highest scores are chosen; among equal scores at the boundary the
    earlier positions win. A query with fewer candidates than ``top_k`` gets all of them.

    Args:
        index_scores: one score per query and key, shared by every head (the lightning
            indexer's).
        top_k: how many keys each query reads (>= 1).
        is_causal: only keys at or before the query's position are candidates.

    Shapes:
        index_scores ``(B, T_q, T_k)``; returns ``(B, T_q, T_k)``.

    Returns:
        A ``torch.bool`` tensor, True at the chosen keys.

    Taught in chapter 19.
    """
    _check_index_scores(index_scores, None, None, None)
    top_k = _check_top_k(top_k)
    batch_size, num_queries, num_keys = index_scores.shape
    chosen = []
    rows_per_step = _row_blocks(num_queries, batch_size * num_keys, _SCORE_BUDGET)
    for start in range(0, num_queries, rows_per_step):
        rows = slice(start, start + rows_per_step)
        visible = _visible(num_queries, num_keys, rows, is_causal, index_scores.device)
        chosen.append(_select(index_scores[:, rows], top_k, visible))  # (B, rows, T_k)
    if not chosen:
        return torch.zeros(index_scores.shape, dtype=torch.bool, device=index_scores.device)
    return torch.cat(chosen, dim=1)  # (B, T_q, T_k)


def _check_grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[int, ...]:
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        require_float(name, tensor)
        if tensor.dim() != 4:
            raise ValueError(f"{name} must have shape (B, heads, T, head_dim), got shape "
                             f"{tuple(tensor.shape)}")
    batch_size, num_heads, _, head_dim = query.shape
    if key.shape[:1] != query.shape[:1] or value.shape[:1] != query.shape[:1]:
        raise ValueError(f"query, key and value must have the same batch size B: query "
                         f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
    if key.size(-1) != head_dim:
        raise ValueError(f"query and key must have the same head_dim: query has {head_dim} "
                         f"(shape {tuple(query.shape)}), key has {key.size(-1)} "
                         f"(shape {tuple(key.shape)})")
    if key.shape[1:3] != value.shape[1:3]:
        raise ValueError(f"key and value must have the same heads and length (B, H_kv, T_k, .): "
                         f"key {tuple(key.shape)}, value {tuple(value.shape)}")
    num_kv_heads = key.size(1)
    if num_heads % num_kv_heads:
        raise ValueError(f"the query heads ({num_heads}) must be a multiple of the key/value "
                         f"heads ({num_kv_heads}): each key/value head serves a group of query heads")
    return batch_size, num_heads, num_kv_heads


def topk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index_scores: torch.Tensor,
    top_k: int,
    *,
    is_causal: bool = True,
    return_indices: bool = False,
):
    """Attention in which each query reads only the ``top_k`` keys its index scores rank highest.

    The keys are chosen as :func:`topk_mask` chooses them (bottom-right causal, ``-inf``
    never chosen, ties to the earlier position), gathered, and attended with the scaled
    softmax ``softmax(q . k / sqrt(head_dim))``: the result equals dense attention with
    ``-inf`` at every score outside the chosen set, and dense attention itself when
    ``top_k`` is at least the number of keys a query sees. One set of keys per query is
    shared by every head, as in DSA; ``key`` and ``value`` may have fewer heads than
    ``query`` (grouped heads: key/value head ``g`` serves query heads
    ``g * group … (g + 1) * group - 1``). The work grows like ``T_q * top_k``, not
    ``T_q * T_k``; the queries are processed in blocks so that the gathered keys stay small.
    No gradient flows to ``index_scores``: choosing is a comparison.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        index_scores: one score per query and key, shared by the heads.
        top_k: how many keys each query reads (>= 1).
        is_causal: a query reads only keys at or before its position (bottom-right).
        return_indices: also return the chosen positions.

    Shapes:
        query ``(B, H, T_q, head_dim)``; key ``(B, H_kv, T_k, head_dim)`` and value
        ``(B, H_kv, T_k, d_v)`` with ``H`` a multiple of ``H_kv``; index_scores
        ``(B, T_q, T_k)``. Returns ``(B, H, T_q, d_v)`` and, with ``return_indices``,
        ``(B, T_q, min(top_k, T_k))`` positions in increasing order (``-1`` where a query
        sees fewer than ``top_k`` keys).

    Returns:
        The output, or ``(output, indices)`` with ``return_indices=True``. A query that
        sees no key gets a zero row.

    Taught in chapter 19.
    """
    batch_size, num_heads, num_kv_heads = _check_grouped(query, key, value)
    num_queries, num_keys = query.size(2), key.size(2)
    _check_index_scores(index_scores, batch_size, num_queries, num_keys)
    top_k = _check_top_k(top_k)
    if index_scores.device != query.device:
        raise ValueError(f"index_scores is on {index_scores.device}, query on {query.device}")
    group = num_heads // num_kv_heads
    head_dim, value_dim = query.size(-1), value.size(-1)
    k = min(top_k, num_keys)
    scale = 1.0 / math.sqrt(head_dim)
    outputs, all_indices = [], []
    per_row = max(batch_size * num_keys * 4, batch_size * num_kv_heads * k * (head_dim + value_dim))
    rows_per_step = _row_blocks(num_queries, per_row, _GATHER_BUDGET)
    for start in range(0, num_queries, rows_per_step):
        rows = slice(start, start + rows_per_step)
        visible = _visible(num_queries, num_keys, rows, is_causal, query.device)
        chosen = _select(index_scores[:, rows].detach(), top_k, visible)  # (B, rows, T_k)
        indices = _selected_positions(chosen, top_k)  # (B, rows, k)
        num_rows = indices.size(1)
        flat = indices.clamp_min(0).reshape(batch_size, 1, num_rows * k, 1)  # (B, 1, rows k, 1)
        picked_keys = key.gather(2, flat.expand(-1, num_kv_heads, -1, head_dim)).view(
            batch_size, num_kv_heads, num_rows, k, head_dim)  # (B, H_kv, rows, k, head_dim)
        picked_values = value.gather(2, flat.expand(-1, num_kv_heads, -1, value_dim)).view(
            batch_size, num_kv_heads, num_rows, k, value_dim)  # (B, H_kv, rows, k, d_v)
        queries = query[:, :, rows].reshape(batch_size, num_kv_heads, group, num_rows,
                                            head_dim)  # (B, H_kv, group, rows, head_dim)
        scores = torch.einsum("bhgtd,bhtkd->bhgtk", queries, picked_keys) * scale
        # scores (B, H_kv, group, rows, k); the empty places (-1) take no weight
        scores = scores.masked_fill((indices < 0)[:, None, None], float("-inf"))
        weights = softmax(scores, dim=-1)  # (B, H_kv, group, rows, k)
        output = torch.einsum("bhgtk,bhtkd->bhgtd", weights, picked_values)
        outputs.append(output.reshape(batch_size, num_heads, num_rows, value_dim))  # (B, H, rows, d_v)
        all_indices.append(indices)
    if not outputs:
        output = query.new_zeros(batch_size, num_heads, 0, value_dim)  # (B, H, 0, d_v)
        indices = torch.zeros(batch_size, 0, k, dtype=torch.long, device=query.device)
    else:
        output = torch.cat(outputs, dim=2)  # (B, H, T_q, d_v)
        indices = torch.cat(all_indices, dim=1)  # (B, T_q, k)
    return (output, indices) if return_indices else output


def lightning_indexer_scores(
    index_queries: torch.Tensor, index_keys: torch.Tensor, head_weights: torch.Tensor
) -> torch.Tensor:
    """The lightning indexer's score of every key for every query: ``sum_j w_j ReLU(q_j . k)``.

    DeepSeek-V3.2's equation (1): indexer head ``j`` of query token ``t`` has a query
    ``q[t, j]`` and a weight ``w[t, j]``; every key token ``s`` has one key ``k[s]``, shared
    by the heads. The score is unscaled: DeepSeek's model multiplies it by
    ``head_dim ** -0.5 * num_heads ** -0.5``, and :class:`LightningIndexer` does the same.
    No causal mask is applied (:func:`topk_attention` applies it).

    Args:
        index_queries: the indexer's queries, ``H_I`` heads per token.
        index_keys: one indexer key per token.
        head_weights: one weight per query token and indexer head.

    Shapes:
        index_queries ``(B, T_q, H_I, d_I)``, index_keys ``(B, T_k, d_I)``, head_weights
        ``(B, T_q, H_I)``; returns ``(B, T_q, T_k)``.

    Returns:
        The index scores, in the dtype of the inputs.

    Taught in chapter 19.
    """
    for name, tensor, dims in (("index_queries", index_queries, "(B, T_q, H_I, d_I)"),
                               ("index_keys", index_keys, "(B, T_k, d_I)"),
                               ("head_weights", head_weights, "(B, T_q, H_I)")):
        require_float(name, tensor)
        if tensor.dim() != dims.count(",") + 1:
            raise ValueError(f"{name} must have shape {dims}, got shape {tuple(tensor.shape)}")
    batch_size, num_queries, num_heads, head_dim = index_queries.shape
    if index_keys.size(0) != batch_size or index_keys.size(-1) != head_dim:
        raise ValueError(
            f"index_keys must have shape (B, T_k, d_I) = ({batch_size}, T_k, {head_dim}) to match "
            f"index_queries {tuple(index_queries.shape)}, got {tuple(index_keys.shape)}")
    if tuple(head_weights.shape) != (batch_size, num_queries, num_heads):
        raise ValueError(
            f"head_weights must have shape (B, T_q, H_I) = ({batch_size}, {num_queries}, "
            f"{num_heads}), one weight per query and indexer head, got "
            f"{tuple(head_weights.shape)}")
    num_keys = index_keys.size(1)
    keys_t = index_keys.transpose(1, 2).unsqueeze(1)  # (B, 1, d_I, T_k)
    scores = []
    rows_per_step = _row_blocks(num_queries, batch_size * num_heads * num_keys, _GATHER_BUDGET)
    for start in range(0, max(num_queries, 1), rows_per_step):
        rows = slice(start, start + rows_per_step)
        per_head = torch.relu(index_queries[:, rows] @ keys_t)  # (B, rows, H_I, T_k)
        weighted = head_weights[:, rows].unsqueeze(-2) @ per_head  # (B, rows, 1, T_k)
        scores.append(weighted.squeeze(-2))  # (B, rows, T_k)
    return torch.cat(scores, dim=1)  # (B, T_q, T_k)


class LightningIndexer(nn.Module):
    """A lightning indexer: a few small ReLU heads that score every key for every query.

    From each token ``x`` it projects ``num_heads`` queries of ``head_dim`` features
    (``W_query``), one key (``W_key``, then a LayerNorm, ``key_norm``, as DeepSeek-V3.2
    does) and one weight per head (``W_weights``), and returns
    :func:`lightning_indexer_scores` times ``head_dim ** -0.5 * num_heads ** -0.5``, the
    scaling of DeepSeek's model. DeepSeek's indexer also rotates part of its queries and
    keys with RoPE, reads its queries from the attention's compressed query, and runs in
    FP8; this one has none of that.

    Args:
        d_model: size of each token vector.
        num_heads: indexer heads ``H_I``.
        head_dim: features per indexer query and key, ``d_I``.
        device: where to create the parameters.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(B, T, d_model)`` -> index scores ``(B, T, T)`` (no mask applied); with
        ``context`` ``(B, T_k, d_model)`` the keys come from it: ``(B, T, T_k)``.

    Returns:
        ``forward(x, context=None)`` returns the index scores.

    Taught in chapter 19.
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_positive_int(name, value)
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.W_query = nn.Linear(d_model, num_heads * head_dim, bias=False, **factory)
        self.W_key = nn.Linear(d_model, head_dim, bias=False, **factory)
        self.key_norm = nn.LayerNorm(head_dim, **factory)
        self.W_weights = nn.Linear(d_model, num_heads, bias=False, **factory)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        source = x if context is None else context  # (B, T_k, d_model): where keys come from
        for name, tensor in (("x", x), ("context", source)):
            require_float(name, tensor)
            if tensor.dim() != 3 or tensor.size(-1) != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got "
                                 f"shape {tuple(tensor.shape)}")
        batch_size, num_tokens, _ = x.shape
        queries = self.W_query(x).view(batch_size, num_tokens, self.num_heads,
                                       self.head_dim)  # (B, T, H_I, d_I)
        keys = self.key_norm(self.W_key(source))  # (B, T_k, d_I)
        weights = self.W_weights(x)  # (B, T, H_I)
        scores = lightning_indexer_scores(queries, keys, weights)  # (B, T, T_k)
        return scores * (self.head_dim ** -0.5 * self.num_heads ** -0.5)


def indexer_distillation_loss(
    index_scores: torch.Tensor,
    attn_weights: torch.Tensor,
    *,
    selected: torch.Tensor | None = None,
    is_causal: bool = True,
) -> torch.Tensor:
    """The KL loss that teaches the indexer where the main attention looks (DSA's warm-up).

    The target of query ``t`` is the main attention's weights summed over its heads and
    normalised to sum to 1, ``p[t]``; the indexer's distribution is the softmax of its index
    scores over the keys the query sees. The loss is ``KL(p[t] || softmax(I[t]))``, averaged
    over the queries of the batch (DeepSeek sums over the tokens; the mean does not change
    with the sequence length). The target is detached: the main model does not learn from
    this loss. With ``selected`` both distributions are restricted to the selected keys,
    as in DSA's sparse stage.

    Args:
        index_scores: the indexer's scores (unmasked: the mask is applied here).
        attn_weights: the main attention's weights.
        selected: optional boolean mask of the keys each query reads (e.g. :func:`topk_mask`).
        is_causal: only keys at or before the query's position count (bottom-right).

    Shapes:
        index_scores ``(B, T_q, T_k)``; attn_weights ``(B, H, T_q, T_k)``; selected
        ``(B, T_q, T_k)``. Returns a scalar.

    Returns:
        The mean KL divergence, in nats; 0 when the indexer's softmax equals the target.

    Taught in chapter 19.
    """
    require_float("attn_weights", attn_weights)
    if attn_weights.dim() != 4:
        raise ValueError(f"attn_weights must have shape (B, H, T_q, T_k), got shape "
                         f"{tuple(attn_weights.shape)}")
    batch_size, _, num_queries, num_keys = attn_weights.shape
    _check_index_scores(index_scores, batch_size, num_queries, num_keys)
    allowed = torch.ones(num_queries, num_keys, dtype=torch.bool, device=index_scores.device)
    if is_causal:
        allowed = causal_mask(num_queries, num_keys, device=index_scores.device)  # (T_q, T_k)
    allowed = allowed.expand(batch_size, num_queries, num_keys)  # (B, T_q, T_k)
    if selected is not None:
        if not isinstance(selected, torch.Tensor) or selected.dtype != torch.bool:
            raise TypeError("selected must be a boolean tensor (True = the query reads the key)")
        if tuple(selected.shape) != (batch_size, num_queries, num_keys):
            raise ValueError(f"selected must have shape (B, T_q, T_k) = ({batch_size}, "
                             f"{num_queries}, {num_keys}), got {tuple(selected.shape)}")
        allowed = allowed & selected
    target = (attn_weights.detach().sum(dim=1) * allowed).to(index_scores.dtype)  # (B, T_q, T_k)
    total = target.sum(dim=-1, keepdim=True)  # (B, T_q, 1)
    target = target / torch.where(total > 0, total, torch.ones_like(total))
    log_q = torch.log_softmax(index_scores.masked_fill(~allowed, float("-inf")), dim=-1)
    # KL = sum p (log p - log q); where p = 0 the term is 0, also where log q is -inf.
    terms = torch.xlogy(target, target) - torch.where(target > 0, target * log_q,
                                                      torch.zeros_like(target))
    rows = (total > 0).squeeze(-1)  # (B, T_q): queries with a target
    return terms.sum(dim=-1)[rows].mean()


def _pooled_earlier_tiles(index_scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """The best index score of every tile whose key block lies before its query block.

    Tile ``(i, j)`` holds queries ``i * block_size …`` and keys ``j * block_size …``. For
    ``j < i`` every pair of the tile is causally visible and both blocks are whole (only the
    last block can be short, and it is never an earlier key block), so the tile's maximum
    needs no mask. The tiles are read through views of ``index_scores`` and reduced in one
    pass: no copy of the scores, no ``T x T`` mask, nothing larger than the ``n x n`` result.
    The diagonal and later tiles are ``-inf``: the diagonal block is kept anyway, and later
    blocks are the future.

    Shapes: index_scores ``(B, T, T)`` -> ``(B, n, n)`` with ``n = ceil(T / block_size)``.
    """
    batch_size, num_tokens, _ = index_scores.shape
    num_blocks = -(-num_tokens // block_size)
    whole = num_tokens // block_size  # blocks with block_size positions
    pooled = index_scores.new_full((batch_size, num_blocks, num_blocks), float("-inf"))
    if whole:
        keys = index_scores[..., :whole * block_size].unflatten(-1, (whole, block_size))
        # keys (B, T, whole, block_size): a view, the scores' rows split into key blocks
        rows = keys[:, :whole * block_size].unflatten(1, (whole, block_size))
        # rows (B, whole, block_size, whole, block_size): a view, one entry per tile pair
        pooled[:, :whole, :whole] = rows.amax(dim=(2, 4))  # (B, whole, whole)
        if whole < num_blocks:  # the short last query block
            pooled[:, whole, :whole] = keys[:, whole * block_size:].amax(dim=(1, 3))  # (B, whole)
    blocks = torch.arange(num_blocks, device=index_scores.device)  # (n,)
    earlier = blocks[None, :] < blocks[:, None]  # (n, n): key block before the query block
    return pooled.masked_fill(~earlier, float("-inf"))  # (B, n, n)


def block_topk_mask(
    index_scores: torch.Tensor,
    top_k_blocks: int,
    *,
    block_size: int = 128,
    num_heads: int | None = None,
):
    """A FlexAttention block mask that keeps, per block of queries, its ``top_k_blocks`` best key blocks.

    The index scores are pooled over each tile of ``block_size`` queries by ``block_size``
    keys (the largest score among the tile's causally visible pairs). Every block of
    queries keeps its own, diagonal, key block (it holds each query's own position, so no
    query is left without a key) and the ``top_k_blocks - 1`` earlier key blocks with the
    highest pooled score (ties to the earlier block). The diagonal tiles are partial: the
    causal ``mask_mod`` runs on them; the other kept tiles are full. Causal self-attention
    only (``T_q == T_k``). Only the tiles before the diagonal are pooled, and they are read
    through views of ``index_scores``: nothing the size of the scores is created, only
    tables of ``n x n`` tiles (``n = ceil(T / block_size)``), so the mask's own memory grows
    like ``(T / block_size) ** 2``.

    Args:
        index_scores: one score per query and key (the lightning indexer's).
        top_k_blocks: key blocks each block of queries reads, its own included (>= 1).
        block_size: the tile size of the block mask.
        num_heads: the heads of the attention (None: the mask is the same for every head).

    Shapes:
        index_scores ``(B, T, T)``.

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` for ``flex_attention`` with
        queries and keys of length ``T``.

    Taught in chapter 19.
    """
    from torch.nn.attention.flex_attention import BlockMask

    _check_index_scores(index_scores, None, None, None)
    top_k_blocks = _check_top_k(top_k_blocks, "top_k_blocks", "key blocks each block of queries")
    check_positive_int("block_size", block_size)
    batch_size, num_queries, num_keys = index_scores.shape
    if num_queries != num_keys:
        raise ValueError(f"block_topk_mask is for causal self-attention, T_q == T_k; got "
                         f"index_scores of shape {tuple(index_scores.shape)} (use "
                         f"topk_attention for T_q != T_k)")
    device = index_scores.device
    num_blocks = -(-num_keys // block_size)
    pooled = _pooled_earlier_tiles(index_scores, block_size)  # (B, n, n)
    blocks = torch.arange(num_blocks, device=device)  # (n,)
    picked = _select(pooled, top_k_blocks - 1, None) if top_k_blocks > 1 else \
        torch.zeros_like(pooled, dtype=torch.bool)  # (B, n, n): the earlier blocks kept
    # FlexAttention lists each row's blocks first in a (..., n, n) table; the rest is unused.
    rank = torch.where(picked, num_blocks - blocks, 0)  # (B, n, n): earliest kept block first
    ordered = rank.sort(dim=-1, descending=True, stable=True).values  # (B, n, n)
    full_indices = torch.where(ordered > 0, num_blocks - ordered, 0).to(torch.int32)  # (B, n, n)
    full_counts = picked.sum(dim=-1).to(torch.int32)  # (B, n)
    heads = 1 if num_heads is None else num_heads
    shape = (batch_size, heads, num_blocks)
    partial_counts = torch.ones(shape, dtype=torch.int32, device=device)  # (B, heads, n)
    partial_indices = torch.zeros(*shape, num_blocks, dtype=torch.int32, device=device)
    partial_indices[..., 0] = blocks.to(torch.int32)  # (B, heads, n, n): the diagonal tile first

    kept = picked | torch.eye(num_blocks, dtype=torch.bool, device=device)  # (B, n, n)

    def causal_in_kept_blocks(b, h, q_idx, kv_idx):
        # The rule carries the selection too: an eager FlexAttention (and create_mask)
        # evaluates the rule on every pair and ignores the block lists.
        return (q_idx >= kv_idx) & kept[b, q_idx // block_size, kv_idx // block_size]

    return BlockMask.from_kv_blocks(
        partial_counts, partial_indices,
        full_counts[:, None].expand(shape).contiguous(),
        full_indices[:, None].expand(*shape, num_blocks).contiguous(),
        BLOCK_SIZE=block_size, mask_mod=causal_in_kept_blocks,
        seq_lengths=(num_queries, num_keys),
    )


def block_topk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index_scores: torch.Tensor,
    top_k_blocks: int,
    *,
    block_size: int = 128,
    kernel: Callable | None = None,
) -> torch.Tensor:
    """Block-sparse causal attention: FlexAttention with the mask of :func:`block_topk_mask`.

    Each block of ``block_size`` queries reads its own key block (causally) and the
    ``top_k_blocks - 1`` earlier key blocks with the highest pooled index score. The
    result equals dense attention with the same mask. Grouped heads are allowed.
    ``kernel`` is the FlexAttention function to call: by default the eager
    ``flex_attention`` (correct, but on the CPU it computes every tile and skips nothing);
    pass ``torch.compile(flex_attention)`` to get a kernel that skips the tiles the mask
    leaves out (its first call compiles, about 25 seconds on a CPU).

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        index_scores: one score per query and key, shared by the heads.
        top_k_blocks: key blocks each block of queries reads, its own included (>= 1).
        block_size: the tile size.
        kernel: the FlexAttention function (default: eager ``flex_attention``).

    Shapes:
        query ``(B, H, T, head_dim)``, key and value ``(B, H_kv, T, head_dim)``,
        index_scores ``(B, T, T)``; returns ``(B, H, T, head_dim)``.

    Returns:
        The attention output.

    Taught in chapter 19.
    """
    from torch.nn.attention.flex_attention import flex_attention

    batch_size, num_heads, num_kv_heads = _check_grouped(query, key, value)
    if query.size(2) != key.size(2):
        raise ValueError(f"block_topk_attention is causal self-attention: query and key must "
                         f"have the same length, got T_q={query.size(2)}, T_k={key.size(2)}")
    _check_index_scores(index_scores, batch_size, query.size(2), key.size(2))
    block_mask = block_topk_mask(index_scores, top_k_blocks, block_size=block_size)
    if kernel is not None:
        return kernel(query, key, value, block_mask=block_mask,
                      enable_gqa=num_heads != num_kv_heads)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(query, key, value, block_mask=block_mask,
                              enable_gqa=num_heads != num_kv_heads)  # (B, H, T, head_dim)
