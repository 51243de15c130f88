"""Masks and score changes as small functions of the indices: FlexAttention's ``mask_mod`` and ``score_mod``.

Every mask of the book answers one question for each (sequence ``b``, head ``h``,
query ``q_idx``, key ``kv_idx``): *may this query attend to this key?* Written as a
function ``allowed(b, h, q_idx, kv_idx) -> bool`` it is a *mask rule*, the
``mask_mod`` of PyTorch's FlexAttention (Dong et al., 2024). A *score rule*
``score_mod(score, b, h, q_idx, kv_idx) -> new score`` changes a score instead
(ALiBi's distance penalty, Gemma 2's soft-capping). The rules below use only
tensor operations (``&``, ``|``, comparisons, indexing a tensor with an index),
so the same function works element by element inside FlexAttention and on
whole grids of indices in :func:`materialize` and :func:`apply_score_mod`.

The rules index positions within one sequence, query ``i`` at position ``i``
(queries and keys are the same tokens, ``T_q == T_k``).

This module imports only the functional core's helpers and :mod:`attention_book.positions`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checks import check_positive_int, require_float
from .positions import alibi_slopes

__all__ = [
    "causal",
    "sliding_window",
    "prefix_lm",
    "padding",
    "document",
    "materialize",
    "soft_cap",
    "alibi",
    "apply_score_mod",
]

MaskRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
           kv_idx: torch.Tensor) -> torch.Tensor:
    """The causal rule: a query may attend to its own position and to earlier ones.

    Args:
        b: sequence index (unused).
        h: head index (unused).
        q_idx: query position.
        kv_idx: key position.

    Shapes:
        the indices broadcast together; the result has their broadcast shape.

    Returns:
        A boolean tensor, True where ``kv_idx <= q_idx``.

    Taught in chapter 13.
    """
    return q_idx >= kv_idx


def sliding_window(window: int) -> MaskRule:
    """The sliding-window rule: causal, and at most ``window`` keys back, the query's own included.

    Args:
        window: how many keys each query may see, its own position included (>= 1).

    Shapes:
        (the rule's indices broadcast together)

    Returns:
        A rule ``allowed(b, h, q_idx, kv_idx)``: True where ``0 <= q_idx - kv_idx < window``,
        the rule of :func:`attention_book.sliding_window_mask`.

    Taught in chapter 13.
    """
    check_positive_int("window", window)

    def allowed(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < window)

    return allowed


def prefix_lm(prefix_length: int) -> MaskRule:
    """The prefix-LM rule: the first ``prefix_length`` tokens (the prompt) are seen by every query.

    Inside the prefix attention is bidirectional; after it, causal (as in T5's
    prefix language model and in vision-language models, whose image tokens all
    see one another).

    Args:
        prefix_length: how many tokens at the start form the prefix (>= 0).

    Shapes:
        (the rule's indices broadcast together)

    Returns:
        A rule ``allowed(b, h, q_idx, kv_idx)``: True where the key is in the prefix
        or ``kv_idx <= q_idx``.

    Taught in chapter 13.
    """
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int):
        raise TypeError(f"prefix_length must be an int, got {type(prefix_length).__name__}")
    if prefix_length < 0:
        raise ValueError(f"prefix_length must be >= 0, got {prefix_length}")

    def allowed(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_length) | (q_idx >= kv_idx)

    return allowed


def padding(lengths: torch.Tensor) -> MaskRule:
    """The padding rule: sequence ``b`` has ``lengths[b]`` real tokens; no query sees a padding key.

    Args:
        lengths: the real length of each sequence of the batch (integers).

    Shapes:
        lengths ``(B,)``.

    Returns:
        A rule ``allowed(b, h, q_idx, kv_idx)``: True where ``kv_idx < lengths[b]``,
        the rule of :func:`attention_book.padding_mask`.

    Taught in chapter 13.
    """
    if not isinstance(lengths, torch.Tensor) or lengths.is_floating_point() or lengths.dim() != 1:
        raise TypeError("lengths must be a 1-D integer tensor (B,), e.g. torch.tensor([5, 3])")

    def allowed(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return allowed


def document(document_ids: torch.Tensor) -> MaskRule:
    """The document rule: several documents packed in one sequence attend only within themselves.

    ``document_ids[t]`` names the document of token ``t``; a query may attend to a
    key of the same document. Drawn over the positions, the mask is block-diagonal.
    Combine it with :func:`causal` for packed causal training (``&`` of the two rules).

    Args:
        document_ids: the document of each token (integers).

    Shapes:
        document_ids ``(T,)``.

    Returns:
        A rule ``allowed(b, h, q_idx, kv_idx)``: True where
        ``document_ids[q_idx] == document_ids[kv_idx]``.

    Taught in chapter 13.
    """
    if (not isinstance(document_ids, torch.Tensor) or document_ids.is_floating_point()
            or document_ids.dim() != 1):
        raise TypeError("document_ids must be a 1-D integer tensor (T,), e.g. torch.tensor([0, 0, 1])")

    def allowed(b, h, q_idx, kv_idx):
        return document_ids[q_idx] == document_ids[kv_idx]

    return allowed


def _index_grids(batch_size: int, num_heads: int, num_queries: int, num_keys: int, device):
    """Four index tensors that broadcast to ``(B, H, T_q, T_k)``."""
    b = torch.arange(batch_size, device=device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
    h = torch.arange(num_heads, device=device).view(1, -1, 1, 1)  # (1, H, 1, 1)
    q_idx = torch.arange(num_queries, device=device).view(1, 1, -1, 1)  # (1, 1, T_q, 1)
    kv_idx = torch.arange(num_keys, device=device).view(1, 1, 1, -1)  # (1, 1, 1, T_k)
    return b, h, q_idx, kv_idx


def materialize(
    rule: MaskRule,
    batch_size: int,
    num_heads: int,
    num_queries: int,
    num_keys: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The boolean mask a rule describes, evaluated on every (b, h, q_idx, kv_idx) at once.

    The rule is called once with four index tensors that broadcast to the whole
    grid, so it must be written with tensor operations (as every rule here is).

    Args:
        rule: ``allowed(b, h, q_idx, kv_idx) -> bool``.
        batch_size: ``B``.
        num_heads: ``H``.
        num_queries: ``T_q``.
        num_keys: ``T_k`` (default ``T_q``).
        device: where to create the mask.

    Shapes:
        returns ``(B, H, T_q, T_k)``.

    Returns:
        A ``torch.bool`` tensor, True where the rule allows attending: the mask that
        :func:`attention_book.scaled_dot_product_attention` takes.

    Taught in chapter 13.
    """
    if num_keys is None:
        num_keys = num_queries
    for name, value in (("batch_size", batch_size), ("num_heads", num_heads),
                        ("num_queries", num_queries), ("num_keys", num_keys)):
        check_positive_int(name, value)
    grids = _index_grids(batch_size, num_heads, num_queries, num_keys, device)
    allowed = torch.as_tensor(rule(*grids), device=device)
    if allowed.dtype != torch.bool:
        raise TypeError(f"a mask rule must return booleans, got dtype {allowed.dtype}")
    return allowed.expand(batch_size, num_heads, num_queries, num_keys)  # (B, H, T_q, T_k)


def soft_cap(cap: float) -> ScoreRule:
    """Gemma 2's soft-capping: squash each score smoothly into ``(-cap, cap)``.

    ``cap * tanh(score / cap)`` leaves small scores almost unchanged and keeps
    large ones from growing without bound.

    Args:
        cap: the largest absolute score (> 0).

    Shapes:
        (the rule's score and indices broadcast together)

    Returns:
        A rule ``score_mod(score, b, h, q_idx, kv_idx) -> new score``.

    Taught in chapter 13.
    """
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise ValueError(f"cap must be a positive number, got {cap!r}")

    def capped(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return capped


def alibi(num_heads: int, *, device: torch.device | str | None = None) -> ScoreRule:
    """ALiBi as a score rule: subtract ``slope[h] * |q_idx - kv_idx|`` from each score.

    The slopes are :func:`attention_book.alibi_slopes`, so the rule adds the bias
    of :func:`attention_book.alibi_bias` (chapter 12).

    Args:
        num_heads: number of heads, one slope each.
        device: where the slopes live (the device of the scores).

    Shapes:
        (the rule's score and indices broadcast together; ``h`` indexes ``(num_heads,)``)

    Returns:
        A rule ``score_mod(score, b, h, q_idx, kv_idx) -> new score``.

    Taught in chapter 13.
    """
    slopes = alibi_slopes(num_heads, device=device)  # (num_heads,)

    def biased(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    return biased


def apply_score_mod(scores: torch.Tensor, score_mod: ScoreRule) -> torch.Tensor:
    """Apply a score rule to a whole tensor of scores, as FlexAttention does score by score.

    Args:
        scores: scaled attention scores.
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> new score``.

    Shapes:
        scores ``(B, H, T_q, T_k)``; returns the same shape.

    Returns:
        The modified scores, in the dtype of ``scores``.

    Taught in chapter 13.
    """
    require_float("scores", scores)
    if scores.dim() != 4:
        raise ValueError(f"scores must have shape (B, H, T_q, T_k), got {tuple(scores.shape)}")
    grids = _index_grids(*scores.shape, scores.device)
    modified = score_mod(scores, *grids)  # (B, H, T_q, T_k)
    return modified.to(scores.dtype).expand(scores.shape)
