"""Attention over part of the keys, and how two parts merge: the idea behind tiling, sinks and rings.

The attention of chapters 2-7 materialises the whole ``(T_q, T_k)`` matrix of
scores. This module computes it one block of keys at a time. The attention of
the queries over one block, normalised within the block, is a pair
``(output, log_sum_exp)``: :func:`partial_attention`. Two such pairs over
disjoint keys merge into the pair over all of them: :func:`merge_partials`, whose
normaliser is chapter 10's online-softmax step (:func:`online_softmax_update`)
applied to the two log-sum-exps. Everything later in the book is this one merge:

- :func:`tiled_attention`, FlashAttention's forward pass, merges tile after tile
  (chapter 10);
- an attention sink is one more "part" with output 0 and log-sum-exp ``s``, so it
  scales the output by ``sigmoid(L - s)`` (:func:`add_sink`, chapter 13);
- ring attention merges the blocks of keys that travel from rank to rank
  (chapter 17, :mod:`attention_book.distributed`).

With 16-bit inputs (bfloat16, float16) the scores, the log-sum-exp and every
merge are computed in float32 (:func:`accumulation_dtype`), as FlashAttention
and ring-flash-attention do; outputs come back in the inputs' dtype and the
log-sum-exp stays float32.

This module imports only the argument checks, :mod:`attention_book.checks`;
:mod:`attention_book.attention` builds its softmax with a sink on it.
"""

from __future__ import annotations

import math

import torch

from .checks import broadcast_shape, check_positive_int, check_qkv, require_float

__all__ = [
    "SKIPPED",
    "FULL",
    "DIAGONAL",
    "accumulation_dtype",
    "tile_kind",
    "block_scores",
    "shifted_exp",
    "partial_attention",
    "empty_partial",
    "merge_partials",
    "sink_column",
    "add_sink",
    "online_softmax_update",
    "online_softmax",
    "tile_plan",
    "tiled_attention",
]

# What tiled attention does with one (query block, key block) tile.
SKIPPED = 0  # no query may see any key of the block (future, or before the window): never computed
FULL = 1  # every query may see every key: no mask needed
DIAGONAL = 2  # the causal diagonal (or the window's far edge) crosses the tile: mask it

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which partial attention results are computed and merged.

    16-bit floats keep too few bits for a sum of many exponentials or a running
    output updated block after block, so they accumulate in float32; float32 and
    float64 accumulate in themselves.

    Args:
        dtype: the inputs' dtype.

    Shapes:
        none.

    Returns:
        ``torch.float32`` for ``float16`` and ``bfloat16``, else ``dtype``.

    Taught in chapter 10.
    """
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _common_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the tensors promote to (without a call into torch when they agree)."""
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        if tensor.dtype != dtype:
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def tile_kind(query_first: int, query_last: int, key_first: int, key_last: int, *,
              is_causal: bool = False, window: int | None = None) -> int:
    """Classify a tile of consecutive query and key positions: skip it, compute it, or mask it.

    Query position ``p`` may see key position ``j`` when ``0 <= p - j`` (causal) and,
    with a ``window``, ``p - j < window``. The tile's queries hold the positions
    ``query_first … query_last`` and its keys ``key_first … key_last``, each run
    consecutive, so the smallest and largest distances ``p - j`` in the tile decide.

    Args:
        query_first: the position of the tile's first query.
        query_last: the position of its last query.
        key_first: the position of its first key.
        key_last: the position of its last key.
        is_causal: apply the causal rule.
        window: also hide keys ``window`` or more positions back (implies causal).

    Shapes:
        none: plain integers.

    Returns:
        :data:`SKIPPED` (no query sees any key), :data:`FULL` (every query sees every
        key) or :data:`DIAGONAL` (the mask is needed).

    Taught in chapter 10 (the window in chapter 13; the ring's tiles in chapter 17).
    """
    if window is None and not is_causal:
        return FULL
    nearest = query_first - key_last  # the smallest distance p - j in the tile
    farthest = query_last - key_first  # the largest
    if farthest < 0 or (window is not None and nearest >= window):
        return SKIPPED  # all in the future, or all before the window
    if nearest >= 0 and (window is None or farthest < window):
        return FULL
    return DIAGONAL


def _check_positions(name: str, positions: object, length: int) -> None:
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or (
            positions.dtype == torch.bool):
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise TypeError(f"{name} must be an integer tensor, got {got}")
    if positions.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), one position per row, got "
                         f"{tuple(positions.shape)}")


def _grouped(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """Views that let query head ``h`` attend with key/value head ``h // group``.

    Returns ``(query, key, value, num_heads)``; ``num_heads`` is ``None`` when the heads
    are not grouped (equal, or broadcast from 1).
    """
    if min(query.dim(), key.dim(), value.dim()) < 3:
        return query, key, value, None
    num_heads, kv_heads = query.size(-3), key.size(-3)
    if kv_heads in (1, num_heads) or value.size(-3) != kv_heads:
        return query, key, value, None
    if num_heads % kv_heads:
        raise ValueError(
            f"query has {num_heads} heads (dim -3) and key and value {kv_heads}: grouped "
            f"key/value heads need the query heads to be a multiple of them")
    group = num_heads // kv_heads
    query = query.unflatten(-3, (kv_heads, group))  # (..., H_kv, group, T_q, d_k)
    return query, key.unsqueeze(-3), value.unsqueeze(-3), num_heads  # (..., H_kv, 1, T_k, d)


def block_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The scaled scores of the queries against one block of keys, masked by positions.

    ``(query * scale) @ key^T``, computed in :func:`accumulation_dtype`. With
    ``is_causal`` a key is visible to a query when ``key_position <= query_position``;
    with a ``window`` also when ``query_position - key_position < window``; a hidden
    score is ``-inf``. Without positions the queries are the last ``T_q`` positions of
    the ``T_k`` keys (bottom-right, as :func:`attention_book.causal_mask`). The
    backward pass of ring attention rebuilds its tiles of weights from these scores.

    Args:
        query: the queries.
        key: the keys of the block.
        query_positions: the sequence position of each query (used only by a mask).
        key_positions: the sequence position of each key.
        is_causal: hide the keys after each query's position.
        window: hide the keys ``window`` or more positions back too (implies causal).
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.

    Shapes:
        query ``(..., T_q, d_k)``, key ``(..., T_k, d_k)`` (leading dims broadcast),
        positions ``(T_q,)`` and ``(T_k,)``; returns ``(..., T_q, T_k)``.

    Returns:
        The scores, float32 for 16-bit inputs, else in the inputs' dtype.

    Taught in chapter 10 (positions and windows in chapters 13 and 17).
    """
    if window is not None:
        check_positive_int("window", window)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    num_queries, num_keys = query.size(-2), key.size(-2)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    dtype = accumulation_dtype(_common_dtype(query, key))
    query = query.to(dtype)
    if scale != 1.0:  # a caller that scaled its queries once passes scale=1.0
        query = query * scale
    scores = query @ key.to(dtype).transpose(-2, -1)  # (..., T_q, T_k)
    if not is_causal and window is None:
        return scores
    if query_positions is None:
        query_positions = torch.arange(num_keys - num_queries, num_keys, device=query.device)
    if key_positions is None:
        key_positions = torch.arange(num_keys, device=query.device)
    _check_positions("query_positions", query_positions, num_queries)
    _check_positions("key_positions", key_positions, num_keys)
    distance = (query_positions.to(scores.device)[:, None]
                - key_positions.to(scores.device)[None, :])  # (T_q, T_k): how far back each key
    hidden = distance < 0  # (T_q, T_k): the future
    if window is not None:
        hidden = hidden | (distance >= window)  # (T_q, T_k): before the window
    return scores.masked_fill(hidden, float("-inf"))  # (..., T_q, T_k)


def shifted_exp(scores: torch.Tensor, *, in_place: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's exponentials measured from its maximum, their sum, and its log-sum-exp.

    ``exp(s - m)`` with ``m`` the row's largest score, so nothing overflows; the row's
    sum ``l``; and ``L = m + log(l)``. A row of only ``-inf`` (no visible key) is
    measured from the lowest float, not ``-inf``, so it gives exponentials 0, a sum of 1
    (safe to divide by) and ``L = -inf``, never NaN, also in the backward pass.

    Args:
        scores: the scores, hidden ones ``-inf``; the last dim is normalised.
        in_place: overwrite ``scores`` with the exponentials (only without autograd).

    Shapes:
        scores ``(..., n)``; returns ``(..., n)``, ``(...)`` and ``(...)``.

    Returns:
        ``(exponentials, row_sum, log_sum_exp)``; ``exponentials / row_sum`` is the softmax.

    Taught in chapter 10.
    """
    require_float("scores", scores)
    row_max = scores.amax(dim=-1, keepdim=True)  # (..., 1)
    # A row of -inf is measured from the lowest float, not from -inf: its exponentials are 0.
    shift = row_max.clamp_min(torch.finfo(scores.dtype).min)  # (..., 1)
    unnormalised = scores.sub_(shift).exp_() if in_place else torch.exp(scores - shift)
    # A row that sees a key sums to at least 1 (its largest term is exp(0)); an empty row
    # sums to 0 and is divided by 1 instead, and its L = -inf + log(1) stays -inf.
    row_sum = unnormalised.sum(dim=-1).clamp_min(1.0)  # (...)
    log_sum_exp = row_max.squeeze(-1) + row_sum.log()  # (...)
    return unnormalised, row_sum, log_sum_exp


def partial_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the queries over one block of keys: its output and its log-sum-exp.

    The weights are normalised within the block, so ``output`` is what attention
    would give if these were the only keys, and ``log_sum_exp``,
    ``L = log(sum_j exp(s_j)) = m + log(l)`` (the online softmax's maximum and sum
    folded into one number), is all :func:`merge_partials` needs to combine it with
    the result of other keys. A query that sees no key of the block gets output 0
    and ``L = -inf``, never NaN. Masking as :func:`block_scores`. Grouped key/value
    heads are allowed: with ``H`` query heads and ``H_kv`` key/value heads
    (``H`` a multiple of ``H_kv``), query head ``h`` uses key/value head
    ``h // (H / H_kv)``, without copying the keys.

    Args:
        query: the queries.
        key: the keys of the block.
        value: the values of the block.
        query_positions: the sequence position of each query (used only by a mask).
        key_positions: the sequence position of each key.
        is_causal: hide the keys after each query's position.
        window: hide the keys ``window`` or more positions back too (implies causal).
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.

    Shapes:
        query ``(..., H, T_q, d_k)``, key ``(..., H or H_kv, T_k, d_k)``, value
        ``(..., H or H_kv, T_k, d_v)`` (leading dims broadcast); positions ``(T_q,)`` and
        ``(T_k,)``. Returns output ``(..., H, T_q, d_v)`` and log-sum-exp ``(..., H, T_q)``.

    Returns:
        ``(output, log_sum_exp)``, both in :func:`accumulation_dtype`: float32 for 16-bit
        inputs, so that a result merged block after block is rounded to 16 bits once, at
        the end (each algorithm returns its output in the inputs' dtype), else the inputs'.

    Taught in chapter 10 (sinks in chapter 13, ring steps in chapter 17).
    """
    grouped_query, key, value, num_heads = _grouped(query, key, value)
    check_qkv(grouped_query, key, value)
    dtype = accumulation_dtype(_common_dtype(query, key, value))
    if key.size(-2) == 0:  # no key at all: the empty result
        return empty_partial(query.to(dtype), value.size(-1))
    scores = block_scores(grouped_query, key, query_positions=query_positions,
                          key_positions=key_positions, is_causal=is_causal, window=window,
                          scale=scale)  # (..., T_q, T_k)
    needs_grad = torch.is_grad_enabled() and any(
        tensor.requires_grad for tensor in (query, key, value))
    # In place without autograd: the scores are not needed again, so no second tile is made.
    unnormalised, row_sum, log_sum_exp = shifted_exp(scores, in_place=not needs_grad)
    output = (unnormalised @ value.to(dtype)) / row_sum.unsqueeze(-1)  # (..., T_q, d_v)
    if num_heads is not None:
        output = output.flatten(-4, -3)  # (..., H, T_q, d_v)
        log_sum_exp = log_sum_exp.flatten(-3, -2)  # (..., H, T_q)
    return output, log_sum_exp


def empty_partial(query: torch.Tensor, value_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The result of attending over no key at all: output 0 and log-sum-exp ``-inf``.

    It is where every running merge starts: merging it with any partial result gives
    that result back exactly. It is made in :func:`accumulation_dtype`, so a running
    result that starts here stays float32 through every merge for 16-bit inputs.

    Args:
        query: the queries (for their leading dims, length, dtype and device).
        value_dim: ``d_v``, the size of one value vector.

    Shapes:
        query ``(..., T_q, d_k)``; returns ``(..., T_q, d_v)`` and ``(..., T_q)``.

    Returns:
        ``(zeros, full of -inf)`` on the query's device.

    Taught in chapter 10.
    """
    require_float("query", query)
    dtype = accumulation_dtype(query.dtype)
    rows = query.shape[:-1]  # (..., T_q)
    output = torch.zeros(*rows, value_dim, dtype=dtype, device=query.device)  # (..., T_q, d_v)
    return output, torch.full(rows, float("-inf"), dtype=dtype, device=query.device)


def merge_partials(
    output_a: torch.Tensor, lse_a: torch.Tensor, output_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the attention results of two disjoint sets of keys into the result over both.

    Each part is normalised within its own keys; the union's weights are the parts'
    weights times ``exp(L_a - L)`` and ``exp(L_b - L)``, with ``L = log(e^{L_a} + e^{L_b})``.
    The normaliser is the online softmax of chapter 10: :func:`online_softmax_update` with
    part ``a``'s log-sum-exp as the running maximum (its sum measured from itself, 1)
    and part ``b``'s as the one new score. This is the only function in the package that
    merges two partial results: tiling, sinks, the ring and its all-gather and Ulysses
    siblings all call it (vLLM's ``merge_attn_states``, ring-flash-attention's
    ``update_out_and_lse``). A row empty in both parts stays output 0 (an empty part's
    output is 0, as :func:`partial_attention` gives it) and ``L = -inf``, never NaN.

    Args:
        output_a: one part's output, normalised within its keys.
        lse_a: its log-sum-exp.
        output_b: the other part's output.
        lse_b: its log-sum-exp.

    Shapes:
        outputs ``(..., T_q, d_v)``, log-sum-exps ``(..., T_q)``, the same in both parts;
        returns the same shapes.

    Returns:
        ``(output, log_sum_exp)`` over both parts' keys: computed in
        :func:`accumulation_dtype`; the output in the two outputs' promoted dtype (a
        float32 running result stays float32), the log-sum-exp in the accumulation dtype.

    Taught in chapter 10 (sinks in chapter 13, ring steps in chapter 17).
    """
    for name, tensor in (("output_a", output_a), ("lse_a", lse_a), ("output_b", output_b),
                         ("lse_b", lse_b)):
        require_float(name, tensor)
    if output_a.shape != output_b.shape or lse_a.shape != lse_b.shape or (
            output_a.dim() < 1 or lse_a.shape != output_a.shape[:-1]):
        raise ValueError(
            f"the two parts must have the same shapes, outputs (..., T_q, d_v) and log-sum-exps "
            f"(..., T_q): got output_a {tuple(output_a.shape)}, lse_a {tuple(lse_a.shape)}, "
            f"output_b {tuple(output_b.shape)}, lse_b {tuple(lse_b.shape)}")
    out_dtype = _common_dtype(output_a, output_b)
    dtype = accumulation_dtype(_common_dtype(output_a, output_b, lse_a, lse_b))
    lse_a, lse_b = lse_a.to(dtype), lse_b.to(dtype)
    # Part a is a running state whose maximum is L_a and whose sum, measured from it, is 1
    # (an empty part, L_a = -inf, is rescaled to 0); part b is one new "score", L_b.
    new_max, total = online_softmax_update(lse_a, torch.ones_like(lse_a),
                                           lse_b.unsqueeze(-1))  # (..., T_q) each
    # A row that has seen a key has total >= 1 (its largest term is exp(0)); a row empty in
    # both parts has total 0 and max -inf, so L = -inf + log(1) = -inf, without a NaN.
    log_sum_exp = new_max + total.clamp_min(1.0).log()  # (..., T_q)
    # Part b's share of the weight, exp(L_b - L); part a keeps the rest, exp(L_a - L).
    share_b = torch.exp(lse_b - log_sum_exp.clamp_min(torch.finfo(dtype).min))  # (..., T_q)
    share_b = share_b.unsqueeze(-1)  # (..., T_q, 1)
    output = torch.lerp(output_a.to(dtype), output_b.to(dtype), share_b)  # (..., T_q, d_v)
    return output.to(out_dtype), log_sum_exp


def sink_column(sink_logit: float | torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Check a sink logit and shape it as a column ``(..., 1, 1)`` that broadcasts to ``rows``.

    A number serves every row; a tensor holds one sink per leading index (per head),
    shared by all the query rows, and must broadcast to ``rows.shape[:-2]``.

    Args:
        sink_logit: a number, or a floating-point tensor with one sink per head.
        rows: the tensor the sink joins, ``(..., T_q, n)``, for its dtype, device and
            leading dims.

    Shapes:
        rows ``(..., T_q, n)``; ``sink_logit`` ``()`` or broadcastable to ``(...)``;
        returns a column that broadcasts to ``(..., 1, 1)``.

    Returns:
        The sink in ``rows``' dtype and on its device.

    Taught in chapter 13.
    """
    if isinstance(sink_logit, torch.Tensor):
        require_float("sink_logit", sink_logit)
        sink = sink_logit.to(dtype=rows.dtype, device=rows.device)
    elif isinstance(sink_logit, (int, float)) and not isinstance(sink_logit, bool):
        sink = torch.tensor(float(sink_logit), dtype=rows.dtype, device=rows.device)
    else:
        raise TypeError(
            f"sink_logit must be a number or a floating-point tensor, got "
            f"{type(sink_logit).__name__}"
        )
    if sink.dim() == 0:
        return sink.reshape(*([1] * rows.dim()))  # (1, ..., 1)
    leading = rows.shape[:-2]
    fits = rows.dim() >= sink.dim() + 2 and broadcast_shape(sink.shape, leading) == leading
    if not fits:
        raise ValueError(
            f"sink_logit of shape {tuple(sink.shape)} must broadcast to the dims before the "
            f"query and key dims of the scores {tuple(rows.shape)} (..., T_q, T_k), which are "
            f"{tuple(leading)}: one sink per head, shared by every query"
        )
    return sink[..., None, None]  # (..., 1, 1)


def add_sink(output: torch.Tensor, log_sum_exp: torch.Tensor,
             sink_logit: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add an attention sink to a result: merge in a part with output 0 and log-sum-exp ``s``.

    A sink is one more score per row with no value, so it is a partial result of its
    own: output 0, log-sum-exp ``s``. :func:`merge_partials` with it scales the output
    by ``exp(L - L') = sigmoid(L - s)``, the share the keys keep, and makes the
    log-sum-exp ``L' = log(e^L + e^s)``. A row that saw no key stays 0.

    Args:
        output: a result normalised over its keys.
        log_sum_exp: its log-sum-exp.
        sink_logit: a number, or one sink per leading index (per head), as in
            :func:`attention_book.softmax_with_sink`.

    Shapes:
        output ``(..., T_q, d_v)``, log_sum_exp ``(..., T_q)``; ``sink_logit`` ``()`` or
        broadcastable to ``(...)``; returns the same shapes.

    Returns:
        ``(output, log_sum_exp)`` with the sink in the denominator, dtypes as
        :func:`merge_partials` gives them.

    Taught in chapter 13.
    """
    require_float("log_sum_exp", log_sum_exp)
    sink = sink_column(sink_logit, log_sum_exp.unsqueeze(-1))  # (..., 1, 1), the LSE's dtype
    sink_lse = sink[..., 0].expand(log_sum_exp.shape)  # (..., T_q)
    return merge_partials(output, log_sum_exp, torch.zeros_like(output), sink_lse)


def _check_block_size(block_size: object) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def online_softmax_update(
    running_max: torch.Tensor, running_sum: torch.Tensor, scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one block of scores into a running maximum and a running sum of exponentials.

    The invariant is ``running_sum == sum(exp(seen - running_max))`` over every
    score seen so far. When the new block raises the maximum from ``m`` to
    ``m'``, each old term ``exp(s - m)`` must become ``exp(s - m')``, so the old
    sum is multiplied by ``exp(m - m')`` before the new block's terms are added
    (Milakov and Gimelshein's online normaliser).

    Args:
        running_max: the largest score seen so far (``-inf`` before any score).
        running_sum: ``sum(exp(seen - running_max))`` (0 before any score).
        scores: the next block of scores; its last dim is the block.

    Shapes:
        running_max ``(...)``, running_sum ``(...)``, scores ``(..., n)``;
        returns two tensors of shape ``(...)``.

    Returns:
        ``(new_max, new_sum)`` with the same invariant over the old and new scores.
        A slice that has only seen ``-inf`` keeps max ``-inf`` and sum 0.

    Taught in chapter 10.
    """
    for name, tensor in (("running_max", running_max), ("running_sum", running_sum),
                         ("scores", scores)):
        require_float(name, tensor)
    if scores.dim() < 1 or running_max.shape != scores.shape[:-1] or (
        running_sum.shape != running_max.shape
    ):
        raise ValueError(
            f"running_max {tuple(running_max.shape)} and running_sum "
            f"{tuple(running_sum.shape)} must both have the shape of scores "
            f"{tuple(scores.shape)} without its last dim"
        )
    new_max = torch.maximum(running_max, scores.amax(dim=-1))  # (...)
    # While everything seen is -inf, shift by the lowest float, not -inf, so that
    # exp(-inf - shift) = 0, not NaN.
    shift = new_max.clamp_min(torch.finfo(new_max.dtype).min)  # (...)
    rescale = torch.exp(running_max - shift)  # (...)
    block_sum = torch.exp(scores - shift.unsqueeze(-1)).sum(dim=-1)  # (...)
    return new_max, running_sum * rescale + block_sum


def online_softmax(x: torch.Tensor, dim: int = -1, *, block_size: int = 1) -> torch.Tensor:
    """Softmax whose maximum and normaliser are found in a single pass over blocks.

    The classic stable softmax reads its input three times (maximum, sum,
    divide); the online version finds the maximum and the sum together in one
    pass, ``block_size`` entries at a time, with :func:`online_softmax_update`,
    then writes the weights. It equals :func:`attention_book.softmax`,
    including zeros for a slice that is entirely ``-inf``.

    Args:
        x: scores, any floating-point tensor.
        dim: the dimension that is normalised.
        block_size: how many entries each step of the pass folds in.

    Shapes:
        x any shape ``(...)``; the result has the same shape.

    Returns:
        Non-negative weights that sum to 1 along ``dim`` (0 for an all ``-inf`` slice).

    Taught in chapter 10.
    """
    require_float("x", x)
    _check_block_size(block_size)
    if x.dim() == 0:
        raise ValueError("x must have at least one dim to normalise, got a 0-d tensor")
    x_last = x.movedim(dim, -1)  # (..., n)
    running_max = x_last.new_full(x_last.shape[:-1], float("-inf"))  # (...)
    running_sum = x_last.new_zeros(x_last.shape[:-1])  # (...)
    for start in range(0, x_last.size(-1), block_size):
        block = x_last[..., start:start + block_size]  # (..., block_size)
        running_max, running_sum = online_softmax_update(running_max, running_sum, block)
    shift = torch.where(torch.isfinite(running_max), running_max, torch.zeros_like(running_max))
    safe_sum = torch.where(running_sum > 0, running_sum, torch.ones_like(running_sum))
    weights = torch.exp(x_last - shift.unsqueeze(-1)) / safe_sum.unsqueeze(-1)  # (..., n)
    return weights.movedim(-1, dim)


def _check_window(window: object) -> None:
    if window is not None:
        check_positive_int("window", window)


def tile_plan(num_queries: int, num_keys: int, block_size: int, *,
              is_causal: bool = False, window: int | None = None) -> torch.Tensor:
    """Which tiles :func:`tiled_attention` computes, masks, or skips.

    Args:
        num_queries: ``T_q``.
        num_keys: ``T_k``.
        block_size: the tile side, as in :func:`tiled_attention`.
        is_causal: use the bottom-right aligned causal mask.
        window: use :func:`attention_book.sliding_window_mask` (causal, at most
            ``window`` keys per query) instead; chapter 13.

    Shapes:
        returns ``(ceil(T_q / block_size), ceil(T_k / block_size))``.

    Returns:
        An integer tensor: 0 = skipped (entirely above the diagonal, or entirely before
        the window), 1 = computed without a mask, 2 = computed with the mask (the
        diagonal or the window's far edge crosses it).

    Taught in chapter 10 (the window in chapter 13).
    """
    _check_block_size(block_size)
    _check_window(window)
    for name, value in (("num_queries", num_queries), ("num_keys", num_keys)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    offset = num_keys - num_queries
    q_starts = range(0, num_queries, block_size)
    k_starts = range(0, num_keys, block_size)
    plan = [
        [tile_kind(q0 + offset, min(q0 + block_size, num_queries) - 1 + offset, k0,
                   min(k0 + block_size, num_keys) - 1, is_causal=is_causal, window=window)
         for k0 in k_starts]
        for q0 in q_starts
    ]
    return torch.tensor(plan, dtype=torch.int64).reshape(len(q_starts), len(k_starts))


def tiled_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    block_size: int = 128,
    is_causal: bool = False,
    scale: float | None = None,
    window: int | None = None,
    sink_logit: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention computed tile by tile with an online softmax (FlashAttention's forward pass).

    For each block of ``block_size`` queries, the keys and values are visited
    ``block_size`` at a time. Each tile gives a partial result, the tile's output
    and log-sum-exp (:func:`partial_attention`), and :func:`merge_partials` folds it
    into the query block's running result: the online softmax's running maximum,
    sum and output, kept in log-sum-exp form (float32 for 16-bit inputs). The
    full ``(T_q, T_k)`` matrix is never built: the extra memory is a few
    ``(block_size, block_size)`` tiles per head. With ``is_causal``, tiles that
    lie entirely above the (bottom-right aligned) diagonal are skipped; with a
    ``window``, so are the tiles that lie entirely before it, and the key loop of
    each query block starts at the first tile the window reaches. A ``sink_logit``
    is one more score per row with no value: one more part to merge, with output 0
    (:func:`add_sink`).

    Args:
        query: the queries.
        key: the keys; the same feature size as ``query``.
        value: the values; the same length as ``key``.
        block_size: the side of a tile (queries per block and keys per block).
        is_causal: apply :func:`attention_book.causal_mask` (bottom-right aligned:
            query ``i`` sees keys ``0 … i + T_k - T_q``), which is PyTorch's
            ``is_causal`` when ``T_q == T_k``.
        scale: multiplies the scores; default ``1 / sqrt(d_k)``.
        window: attend as :func:`attention_book.sliding_window_mask` does (causal,
            at most ``window`` keys per query, its own included); implies the causal
            mask, whatever ``is_causal`` says.
        sink_logit: an attention sink, as in :func:`attention_book.softmax_with_sink`:
            a number, or one per leading index (per head).

    Shapes:
        query ``(..., T_q, d_k)``, key ``(..., T_k, d_k)``, value ``(..., T_k, d_v)``;
        the leading dims broadcast; ``sink_logit`` ``()`` or broadcastable to ``(...)``.
        Returns ``(..., T_q, d_v)``.

    Returns:
        The attention output, equal to ``scaled_dot_product_attention``'s (with the
        same mask and sink); a query that may see no key gets a zero row. No weights
        are returned: they are never stored.

    Taught in chapter 10 (the window and the sink in chapter 13).
    """
    _check_block_size(block_size)
    _check_window(window)
    lead = check_qkv(query, key, value)

    num_queries, d_k = query.shape[-2:]
    num_keys, d_v = value.shape[-2:]
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    query = query.expand(*lead, num_queries, d_k)  # (..., T_q, d_k)
    key = key.expand(*lead, num_keys, d_k)  # (..., T_k, d_k)
    value = value.expand(*lead, num_keys, d_v)  # (..., T_k, d_v)
    offset = num_keys - num_queries  # query i sits at position i + offset of the keys
    # The running results live in the accumulation dtype (float32 for 16-bit inputs).
    output, log_sum_exp = empty_partial(query, d_v)  # (..., T_q, d_v), (..., T_q)
    for q_start in range(0, num_queries, block_size):
        q_end = min(q_start + block_size, num_queries)
        # Scaled once per block of queries, not once per tile.
        q_block = query[..., q_start:q_end, :].to(output.dtype) * scale  # (..., Bq, d_k)
        state = empty_partial(q_block, d_v)  # (..., Bq, d_v), (..., Bq)
        first_key = 0
        if window is not None:
            # The earliest key any query of this block may see; start at its tile.
            first_key = max(0, q_start + offset - window + 1) // block_size * block_size
        for k_start in range(first_key, num_keys, block_size):
            k_end = min(k_start + block_size, num_keys)
            kind = tile_kind(q_start + offset, q_end - 1 + offset, k_start, k_end - 1,
                             is_causal=is_causal, window=window)
            if kind == SKIPPED:
                if k_start > q_end - 1 + offset:
                    break  # every later key block lies even further in the future
                continue  # before the window of every query of the block
            masked = kind == DIAGONAL
            positions = {}
            if masked:
                positions = {
                    "query_positions": torch.arange(q_start + offset, q_end + offset,
                                                    device=query.device),  # (Bq,)
                    "key_positions": torch.arange(k_start, k_end, device=query.device),  # (Bk,)
                }
            part = partial_attention(q_block, key[..., k_start:k_end, :],
                                     value[..., k_start:k_end, :], is_causal=masked,
                                     window=window if masked else None, scale=1.0,
                                     **positions)  # (..., Bq, d_v), (..., Bq)
            state = merge_partials(*state, *part)
        output[..., q_start:q_end, :] = state[0]  # (..., Bq, d_v)
        log_sum_exp[..., q_start:q_end] = state[1]  # (..., Bq)
    if sink_logit is not None:
        # The sink is one more part, output 0 and log-sum-exp s: sigmoid(L - s) of each row.
        output, log_sum_exp = add_sink(output, log_sum_exp, sink_logit)
    return output.to(query.dtype)
