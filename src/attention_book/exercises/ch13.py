"""Checkers for chapter 13 (masks as rules, FlexAttention, sliding windows, attention sinks)."""

from __future__ import annotations

import math
import warnings

import torch

from ..attention import causal_mask, scaled_dot_product_attention, sliding_window_mask
from ..flash import partial_attention
from ..mods import apply_score_mod, materialize
from .feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = [
    "check_chunked_attention_rule",
    "check_relative_bias_mod",
    "check_window_tile_prediction",
    "check_flex_attention_with_sink",
]


def _first_difference(mask: torch.Tensor, expected: torch.Tensor) -> tuple[int, int]:
    q, k = (int(i) for i in torch.nonzero(mask != expected)[0])
    return q, k


# --------------------------------------------------------------------------- exercise 13.1


@checker
def check_chunked_attention_rule(fn) -> None:
    """Check ``fn(chunk_size)``, which returns the chunked-attention rule ``allowed(b, h, q, k)``.

    The rule is called the way ``mods.materialize`` and FlexAttention call it: on whole
    grids of indices at once, and on single indices (0-d tensors).

    Taught in chapter 13 (Exercise 13.1).
    """
    for chunk_size, num_tokens in ((3, 8), (2, 5), (4, 4), (1, 3), (5, 12)):
        rule = call(fn, chunk_size)
        expect_true("chunked_rule returns a rule", callable(rule),
                    expected="a function allowed(b, h, q_idx, kv_idx)",
                    actual=type(rule).__name__,
                    hint="define `def allowed(b, h, q_idx, kv_idx): ...` inside chunked_rule "
                         "and return it, without calling it")
        positions = torch.arange(num_tokens)
        same_chunk = positions[:, None] // chunk_size == positions[None, :] // chunk_size
        expected = same_chunk & causal_mask(num_tokens)  # (T, T)
        try:
            mask = materialize(rule, 1, 1, num_tokens)[0, 0]  # (T, T)
        except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
            fail("the rule works on whole grids of indices", expected="no error",
                 actual=f"{type(error).__name__}: {error}",
                 hint="use tensor operations only (&, |, ==, <=, //), not `and`, `or`, `if` "
                      "or int(): the rule receives tensors of indices, and FlexAttention "
                      "cannot follow Python's control flow through them")
        if bool((mask & ~causal_mask(num_tokens)).any()):
            fail(f"no query sees a future key (chunk_size={chunk_size})",
                 expected="False above the diagonal", actual="True somewhere above it",
                 hint="within a chunk attention is still causal: also require kv_idx <= q_idx")
        if not torch.equal(mask, expected):
            q, k = _first_difference(mask, expected)
            fail(f"query {q} and key {k} with chunk_size={chunk_size}",
                 expected=bool(expected[q, k]), actual=bool(mask[q, k]),
                 hint="two positions share a chunk when q_idx // chunk_size equals "
                      "kv_idx // chunk_size; a sliding window (q_idx - kv_idx < chunk_size) "
                      "is a different mask")
        for q, k in ((num_tokens - 1, 0), (num_tokens - 1, num_tokens - 1)):
            single = call(rule, torch.tensor(0), torch.tensor(0), torch.tensor(q), torch.tensor(k),
                          prop="the rule works on single indices (0-d tensors)")
            expect_true(f"the rule on the single pair query {q}, key {k} (chunk_size="
                        f"{chunk_size})", bool(torch.as_tensor(single)) == bool(expected[q, k]),
                        expected=bool(expected[q, k]), actual=bool(torch.as_tensor(single)),
                        hint="the rule must give the same answer for one pair as for a grid")
    passed("causal attention inside each chunk, written as a rule that works on index grids.")


# --------------------------------------------------------------------------- exercise 13.2


def _pair_grids(pairs: list[tuple[int, int]], num_heads: int):
    """Index tensors for the given (query, key) pairs, every head: shapes (1, H, P)."""
    q_idx = torch.tensor([q for q, _ in pairs]).view(1, 1, -1)  # (1, 1, P)
    kv_idx = torch.tensor([k for _, k in pairs]).view(1, 1, -1)  # (1, 1, P)
    h = torch.arange(num_heads).view(1, -1, 1)  # (1, H, 1)
    return torch.zeros(1, 1, 1, dtype=torch.long), h, q_idx, kv_idx


@checker
def check_relative_bias_mod(fn) -> None:
    """Check ``fn(bias)``, which returns a ``score_mod`` adding ``bias[h, min(q - k, D - 1)]``.

    Taught in chapter 13 (Exercise 13.2).
    """
    num_heads, max_distance, num_tokens = 3, 4, 7
    generator = torch.Generator().manual_seed(13)
    bias = torch.randn(num_heads, max_distance, generator=generator)  # (H, D)
    score_mod = call(fn, bias.clone())
    expect_true("relative_bias_mod returns a score rule", callable(score_mod),
                expected="a function score_mod(score, b, h, q_idx, kv_idx)",
                actual=type(score_mod).__name__,
                hint="define the score rule inside relative_bias_mod and return it, without "
                     "calling it")
    allowed = [(q, k) for q in range(num_tokens) for k in range(q + 1)]
    b, h, q_idx, kv_idx = _pair_grids(allowed, num_heads)
    scores = torch.randn(1, num_heads, len(allowed), generator=generator)  # (1, H, P)
    distance = (q_idx - kv_idx).clamp(max=max_distance - 1)  # (1, 1, P)
    expected = scores + bias[h, distance]  # (1, H, P)
    try:
        result = score_mod(scores.clone(), b, h, q_idx, kv_idx)
    except IndexError as error:
        fail("the rule works for every key a query may see", expected="no error",
             actual=f"IndexError: {error}",
             hint=f"a key {num_tokens - 1} positions back is farther than bias has columns "
                  f"({max_distance}): farther keys share the last column, so clip the distance "
                  f"at max_distance - 1 with tensor operations (torch.clamp or .clamp(max=...))")
    except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
        fail("the rule works on tensors of indices", expected="no error",
             actual=f"{type(error).__name__}: {error}",
             hint="use tensor operations only (q_idx - kv_idx, .clamp, indexing bias with "
                  "tensors), not min(), `if` or int(): FlexAttention passes tensors")
    expect_shape("the modified scores", result, tuple(expected.shape),
                 hint="return the score plus one bias per (head, distance): it keeps the "
                      "shape of the score")
    result = result.to(expected.dtype)
    reversed_sign = scores + bias[h, (kv_idx - q_idx).clamp(min=0, max=max_distance - 1)]
    if torch.allclose(result, reversed_sign, atol=1e-6) and not torch.allclose(
            result, expected, atol=1e-6):
        fail("a key d positions back gets column d of its head's row",
             expected="bias[h, q_idx - kv_idx] (clipped)",
             actual="the bias of the opposite distance, kv_idx - q_idx",
             hint="the query comes after the key: the distance back is q_idx - kv_idx")
    if torch.allclose(result, scores + bias[:, :1].view(1, num_heads, 1), atol=1e-6):
        fail("the bias depends on the distance", expected="one column per distance",
             actual="column 0 for every key",
             hint="the distance q_idx - kv_idx picks the column; clamp it, don't replace it")
    expect_close("the scores of the keys a query may see", result, expected, hint=(
        "add bias[h, d] with d = q_idx - kv_idx, clipped at max_distance - 1, to each score; "
        "the head index h picks the row"))

    everywhere = [(q, k) for q in range(num_tokens) for k in range(num_tokens)]
    b, h, q_idx, kv_idx = _pair_grids(everywhere, num_heads)
    try:
        result = score_mod(torch.zeros(1, num_heads, len(everywhere)), b, h, q_idx, kv_idx)
    except IndexError as error:
        fail("the rule works for keys in the future too", expected="no error",
             actual=f"IndexError: {error}",
             hint="FlexAttention calls a score_mod for every (q_idx, kv_idx) of the tiles it "
                  "computes, also for the future keys the mask then blocks, where "
                  "q_idx - kv_idx is negative: clip the distance at 0 as well")
    except Exception as error:  # noqa: BLE001
        fail("the rule works for keys in the future too", expected="no error",
             actual=f"{type(error).__name__}: {error}",
             hint="clip the distance into 0 … max_distance - 1 with tensor operations")
    expect_true("the rule gives a number for every pair",
                isinstance(result, torch.Tensor) and bool(torch.isfinite(result).all()),
                expected="finite scores", actual="a non-finite score or no tensor",
                hint="leave blocking the future keys to the mask: the score rule only adds a bias")

    grid_scores = torch.randn(1, num_heads, num_tokens, num_tokens, generator=generator)
    applied = call(apply_score_mod, grid_scores, score_mod,
                   prop="the rule works on whole (B, H, T, T) grids, as FlexAttention needs")
    rows = torch.arange(num_tokens)
    grid_distance = (rows[:, None] - rows[None, :]).clamp(0, max_distance - 1)  # (T, T)
    grid_expected = grid_scores + bias[:, grid_distance].unsqueeze(0)  # (1, H, T, T)
    keep = causal_mask(num_tokens)
    expect_true("the rule on a whole grid of indices", torch.allclose(
        applied[..., keep], grid_expected[..., keep], atol=1e-5),
        expected="the same bias as for single pairs", actual="a different bias",
        hint="index bias with the head and the clipped distance, e.g. bias[h, distance], so "
             "that the indices broadcast")
    passed("each head adds its own learned number for each distance, farther keys share the "
           "last one, and the rule is safe on the blocked future keys too.")


# --------------------------------------------------------------------------- exercise 13.3


@checker
def check_window_tile_prediction(fn) -> None:
    """Check ``fn()``, the predicted ``(tiles_computed, tiles_masked)`` of exercise 13.3.

    Taught in chapter 13 (Exercise 13.3).
    """
    result = call(fn)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        fail("predicted_window_tiles returns a pair", expected="(tiles_computed, tiles_masked)",
             actual=type(result).__name__, hint="return two whole numbers")
    try:
        computed, masked = (int(value) for value in result)
        exact = all(float(value) == int(value) for value in result)
    except (TypeError, ValueError):
        fail("the prediction holds two numbers", expected="two whole numbers",
             actual=repr(result)[:80], hint="count tiles: whole numbers such as 12")
    expect_true("the prediction holds whole numbers", exact, expected="whole numbers",
                actual=repr(result)[:80], hint="a tile is computed or not: count whole tiles")
    if computed == 21:
        fail("the tiles each query tile computes", expected="more tiles per query tile",
             actual="21 tiles: 3 per query tile",
             hint="the oldest key the first query of tile i may see is 128 i - 299, which lies "
                  "in key tile i - 3, not i - 2: round the reach of 300 keys up to whole tiles")
    if computed == 30:
        fail("the tiles each query tile computes", expected="fewer tiles per query tile",
             actual="30 tiles: the count of the chapter's window of 512",
             hint="redo the count for a window of 300: how far back does the first query of a "
                  "tile see?")
    expect_true("the number of tiles computed", computed == 26,
                expected="a different count", actual=computed,
                hint="for query tile i, list the key tiles j with some pair inside the window: "
                     "0 <= query - key < 300; tiles before it and in the future are skipped. "
                     "The first query tiles see fewer tiles, because there are no keys before 0")
    if masked == 7:
        fail("the tiles that need the mask", expected="the partial tiles, not the full ones",
             actual="7, the number of full tiles",
             hint="the masked (partial) tiles are those where some pairs are allowed and "
                  "others not; you counted the full ones")
    if masked == 8:
        fail("the tiles that need the mask", expected="more than the diagonal tiles",
             actual="8, one per query tile",
             hint="the window's far edge cuts tiles too: a tile with some pairs more than 299 "
                  "positions apart and some fewer needs the mask")
    if masked == 13:
        fail("the tiles that need the mask", expected="more masked tiles", actual=13,
             hint="look again at the tiles two back (j = i - 2): their pairs lie 129 to 383 "
                  "positions apart, and a window of 300 keeps only some of them")
    expect_true("the number of tiles that need the mask", masked == 19,
                expected="a different count", actual=masked,
                hint="a tile is full only when every query of it may see every key of it: "
                     "distances from 128 (i - j) - 127 to 128 (i - j) + 127 must all lie in "
                     "0 … 299. Check the diagonal tile, and the tiles one, two and three back")
    passed("a window that is not a multiple of the tile leaves most computed tiles partial, "
           "so the kernel runs mask_mod on most of them.")


# --------------------------------------------------------------------------- exercise 13.4


def _sink_inputs(seed: int, num_heads: int, num_tokens: int):
    generator = torch.Generator().manual_seed(seed)
    shape = (2, num_heads, num_tokens, 8)
    query, key, value = (2 * torch.randn(shape, generator=generator) for _ in range(3))
    sinks = torch.linspace(-1.5, 2.5, num_heads)  # (heads,)
    return query, key, value, sinks


def _call_quietly(fn, *args):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return call(fn, *args)


@checker
def check_flex_attention_with_sink(fn) -> None:
    """Check ``fn(query, key, value, window, sink_logit)``: windowed FlexAttention with a sink.

    Taught in chapter 13 (Exercise 13.4).
    """
    for seed, num_heads, num_tokens, window in ((0, 3, 9, 4), (1, 2, 6, 6), (2, 4, 11, 1)):
        query, key, value, sinks = _sink_inputs(seed, num_heads, num_tokens)
        mask = sliding_window_mask(num_tokens, window)  # (T, T)
        expected, _ = scaled_dot_product_attention(query, key, value, mask, sink_logit=sinks)
        plain, _ = scaled_dot_product_attention(query, key, value, mask)
        output = _call_quietly(fn, query.clone(), key.clone(), value.clone(), window, sinks.clone())
        expect_shape(f"the output (T={num_tokens}, window={window})", output,
                     tuple(expected.shape), hint="the output has the shape of FlexAttention's: "
                     "(B, heads, T, head_dim)")
        output = output.detach().to(expected.dtype)
        if torch.allclose(output, plain, atol=1e-5):
            fail("the sink takes part of each row's weight",
                 expected="outputs shrunk by sigmoid(lse - sink), row by row",
                 actual="FlexAttention's output unchanged, as if there were no sink",
                 hint="ask FlexAttention for the log-sum-exp (return_aux=AuxRequest(lse=True)) "
                      "and scale each row of the output by the sink's gate")
        fixed_gate = plain * torch.sigmoid(-sinks).view(1, -1, 1, 1)
        if torch.allclose(output, fixed_gate, atol=1e-5):
            fail("the sink's share depends on the row's scores",
                 expected="the gate sigmoid(lse - sink)",
                 actual="every row scaled by sigmoid(-sink): the sigmoid-of-the-sink bug of "
                        "section 13.4",
                 hint="the gate is sigmoid(logsumexp(scores) - sink); with the log-sum-exp left "
                      "out, every row loses the same share whatever its scores")
        _, lse = partial_attention(query, key, value, window=window)  # (B, heads, T)
        inverted = plain * torch.sigmoid(sinks.view(1, -1, 1) - lse).unsqueeze(-1)
        if torch.allclose(output, inverted, atol=1e-5):
            fail("the rows keep the weight the keys win",
                 expected="the gate sigmoid(lse - sink)",
                 actual="the gate sigmoid(sink - lse): the sink's own share",
                 hint="sigmoid(sink - lse) is the share the sink takes; the keys keep the rest, "
                      "sigmoid(lse - sink)")
        log2_gate = plain * torch.sigmoid(lse / math.log(2) - sinks.view(1, -1, 1)).unsqueeze(-1)
        if torch.allclose(output, log2_gate, atol=1e-5):
            fail("the log-sum-exp is a natural logarithm",
                 expected="aux.lse as FlexAttention returns it",
                 actual="the log-sum-exp converted to base 2",
                 hint="FlexAttention returns the natural-log log-sum-exp; use it unchanged")
        expect_close(f"the output (T={num_tokens}, window={window})", output, expected, hint=(
            "check the block mask (a window of `window` keys, the query's own included, never "
            "a future key) and that each head's rows use that head's own sink; the gate of "
            "section 13.4 needs the log-sum-exp of the same row"))
    passed("FlexAttention's output times sigmoid(lse - sink) is the windowed attention with a "
           "sink in every softmax's denominator, without changing the kernel.")
