"""Checkers for chapter 13 (masks as rules, FlexAttention, sliding windows, attention sinks)."""

from __future__ import annotations

import functools
import math
import types
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
    "check_streaming_prediction",
    "check_streaming_rule",
]


def _first_difference(mask: torch.Tensor, expected: torch.Tensor) -> tuple[int, int]:
    q, k = (int(i) for i in torch.nonzero(mask != expected)[0])
    return q, k


# --------------------------------------------------------------------------- exercise 13.1


_TENSOR_OPERATIONS_HINT = (
    "use tensor operations only (&, |, ==, <=, //), not `and`, `or`, `if` or int(): the rule "
    "receives tensors of indices, and FlexAttention cannot follow Python's control flow "
    "through them")


def _rule_failure(where: str, error: Exception) -> None:
    """Turn an error raised while evaluating a learner's mask rule into feedback."""
    message = str(error)
    if isinstance(error, TypeError) and "must return booleans" in message:
        hint = ("the rule answers yes or no: return a bool tensor (comparisons combined with "
                "& and |), not numbers; drop the .int() or .float()")
    elif "data-dependent control flow" in message:
        hint = ("FlexAttention's create_block_mask runs the rule under vmap, where a tensor "
                "has no single True or False: no `if`, `and`, `or`, bool() or a branch on "
                "the indices' shape; " + _TENSOR_OPERATIONS_HINT)
    else:
        hint = _TENSOR_OPERATIONS_HINT
    fail(f"the rule works {where}", expected="no error",
         actual=f"{type(error).__name__}: {message.splitlines()[0] if message else ''}",
         hint=hint)


def _block_mask_dense(rule, num_tokens: int) -> torch.Tensor | None:
    """The mask FlexAttention builds from ``rule``: ``create_block_mask``'s own evaluation.

    ``create_block_mask`` traces the rule with ``vmap``, which needs the rule's code in this
    process. A rule that lives in another process (a grader's proxy, whose calls carry plain
    tensors) cannot be traced: then this returns None, and the grid and single-index calls
    are the checks.
    """
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    # type(), not isinstance(): a proxy may report a function's class as its own.
    if type(rule) not in (types.FunctionType, types.MethodType, functools.partial):
        return None
    create_block_mask(rule, None, None, num_tokens, num_tokens, device="cpu")
    return create_mask(rule, None, None, num_tokens, num_tokens, device="cpu")[0, 0]  # (T, T)


@checker
def check_chunked_attention_rule(fn) -> None:
    """Check ``fn(chunk_size)``, which returns the chunked-attention rule ``allowed(b, h, q, k)``.

    The rule is called the way ``mods.materialize`` and FlexAttention call it: on whole
    grids of indices at once, on single indices (0-d tensors), and through FlexAttention's
    own ``create_block_mask``, which evaluates it under ``vmap``.

    Taught in chapter 13 (Exercise 13.1).
    """
    traced = True
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
            _rule_failure("on whole grids of indices", error)
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
        try:
            flex_mask = _block_mask_dense(rule, num_tokens)  # (T, T)
        except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
            _rule_failure(f"in FlexAttention's create_block_mask (chunk_size={chunk_size})",
                          error)
        traced = traced and flex_mask is not None
        if flex_mask is not None and not torch.equal(flex_mask, expected):
            q, k = _first_difference(flex_mask, expected)
            fail(f"create_block_mask builds the same mask (chunk_size={chunk_size})",
                 expected=f"query {q} and key {k}: {bool(expected[q, k])}",
                 actual=f"{bool(flex_mask[q, k])} in the mask FlexAttention evaluated",
                 hint="FlexAttention calls the rule with index tensors of its own shapes; "
                      "write it so that it broadcasts (q_idx and kv_idx may be 0-d or have "
                      "any shape) and never inspects the shapes")
    passed("causal attention inside each chunk, written as a rule that works on index grids "
           + ("and in FlexAttention's create_block_mask." if traced else
              "and on single indices (create_block_mask was not run: your rule lives in "
              "another process here, which vmap cannot trace)."))


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
    near = [(q, k) for q in range(num_tokens) for k in range(q + 1) if q - k < max_distance]
    try:  # every distance has its own column here: an IndexError is not about clipping
        score_mod(torch.zeros(1, num_heads, len(near)), *_pair_grids(near, num_heads))
    except IndexError as error:
        fail("the rule works for keys fewer than max_distance positions back",
             expected="no error", actual=f"IndexError: {error}",
             hint="index bias once, with the head and the distance together: bias[h, d]. "
                  "Chained indexing, bias[h][d], first picks whole rows (one per head index, "
                  "which keeps the indices' dimensions), then indexes those rows' first "
                  "dimension with d")
    except Exception:  # noqa: BLE001 - reported with its hint by the call below
        pass
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


@checker(reveal=False)  # a prediction: the expected value is kept back
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


# --------------------------------------------------------------------------- exercise 13.5
# One query (token 9) of one head, full causal attention over tokens 0 ... 9. StreamingLLM
# keeps the 2 sink tokens 0 and 1 and a window of the last 4 (6, 7, 8, 9): tokens 2 ... 5 are
# evicted. The sinks carry nothing; the evicted tokens carry the second feature; the window
# carries the first.
_STREAM_WEIGHTS = [0.50, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.10]
_STREAM_VALUES = [(0.0, 0.0)] * 2 + [(0.0, 4.0)] * 4 + [(2.0, 0.0)] * 4
_STREAM_KEPT = [0, 1, 6, 7, 8, 9]


def _stream_answer() -> tuple[torch.Tensor, torch.Tensor, float]:
    weights = torch.tensor(_STREAM_WEIGHTS, dtype=torch.float64)  # (T,)
    values = torch.tensor(_STREAM_VALUES, dtype=torch.float64)  # (T, 2)
    full = weights @ values  # (2,)
    kept = torch.zeros(len(weights), dtype=torch.bool)
    kept[_STREAM_KEPT] = True
    streaming = (weights * kept / weights[kept].sum()) @ values  # (2,): renormalised
    # A sink logit multiplies the output by a gate g in (0, 1): the closest point g * streaming.
    gate = float((full @ streaming) / (streaming @ streaming))
    smallest = float((full - min(max(gate, 0.0), 1.0) * streaming).norm())
    return full, streaming, smallest


def _as_pair(value: object, name: str) -> torch.Tensor:
    try:
        pair = torch.as_tensor(value, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError):
        fail(f"{name} is a pair of numbers", expected="two numbers, e.g. (0.1, 0.2)",
             actual=repr(value)[:80], hint="each output is a vector of the two value features",
             reveal=True)
    expect_true(f"{name} is a pair of numbers", pair.numel() == 2, expected="two numbers",
                actual=f"{pair.numel()} numbers", hint="each output has the two features of "
                "the values: (first feature, second feature)", reveal=True)
    return pair


@checker(reveal=False)  # a prediction: the expected values are kept back
def check_streaming_prediction(fn) -> None:
    """Check ``fn()``: (full output, StreamingLLM's output, the smallest error a sink logit allows).

    Taught in chapter 13 (Exercise 13.5).
    """
    result = call(fn)
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        fail("predicted_streaming returns three things",
             expected="(full_output, streaming_output, smallest_error)",
             actual=repr(result)[:80], hint="two pairs of numbers and one number", reveal=True)
    full, streaming, smallest = _stream_answer()
    got_full = _as_pair(result[0], "full_output")
    got_streaming = _as_pair(result[1], "streaming_output")
    try:
        got_smallest = float(result[2])
    except (TypeError, ValueError):
        fail("smallest_error is a number", expected="one number (a length)",
             actual=repr(result[2])[:80], hint="the size of the error vector, a float",
             reveal=True)
    if not torch.allclose(got_full, full, atol=1e-3):
        hint = ("full attention's output is the weighted sum of every value: sum_j w_j v_j "
                "over tokens 0 ... 9")
        if torch.allclose(got_full, torch.tensor([0.5, 0.0], dtype=torch.float64), atol=1e-3):
            hint = ("full attention still sees tokens 2 ... 5: only the cache drops them, so "
                    "their values count in the full output")
        fail("full_output is full attention's output", expected="sum_j w_j v_j",
             actual=got_full.tolist(), hint=hint)
    if not torch.allclose(got_streaming, streaming, atol=1e-3):
        if torch.allclose(got_streaming, torch.tensor([0.5, 0.0], dtype=torch.float64),
                          atol=1e-3):
            hint = ("the evicted tokens' weights do not vanish: StreamingLLM's softmax runs over "
                    "the kept keys only, so their weights are scaled up to sum to 1 (divide by "
                    "the weight the kept keys had)")
        elif torch.allclose(got_streaming, full, atol=1e-3):
            hint = ("tokens 2 ... 5 have left the cache: StreamingLLM keeps the 2 sinks and the "
                    "window of the last 4 tokens only")
        else:
            hint = ("keep the weights of tokens 0, 1, 6, 7, 8 and 9, divide them by their sum "
                    "(a softmax over fewer keys), and weight the values with them")
        fail("streaming_output is StreamingLLM's output", expected="the kept keys' weights, "
             "renormalised, times their values", actual=got_streaming.tolist(), hint=hint)
    if abs(got_smallest - smallest) > 1e-3:
        error_now = float((full - streaming).norm())
        if abs(got_smallest) <= 1e-3:
            hint = ("a sink logit multiplies the whole output by one factor, sigmoid(LSE - s), "
                    "between 0 and 1 (section 13.4): it can shrink StreamingLLM's output, but "
                    "it cannot give it a second feature that none of the kept values carries")
        elif abs(got_smallest - smallest**2) <= 1e-3:
            hint = ("that is the squared length of the error: the length of a vector is the "
                    "square root of the sum of its squared components")
        elif abs(got_smallest - error_now) <= 1e-3:
            hint = ("that is the error without a sink; a sink logit scales the output by a "
                    "factor g in (0, 1): pick the g that brings g * streaming_output closest "
                    "to full_output")
        else:
            hint = ("the outputs a sink logit can give are g * streaming_output for g in "
                    "(0, 1): find the closest one to full_output and measure the length of "
                    "what is left (the Euclidean norm of the difference)")
        fail("smallest_error is the least error any sink logit leaves",
             expected="the distance from full_output to the closest g * streaming_output",
             actual=round(got_smallest, 4), hint=hint)
    passed("the sink can scale the window's part back to its full-attention size, but the "
           "second feature, which only the evicted tokens carried, stays missing: the error "
           "left is exactly what tokens 2 ... 5 added to full attention.")


# --------------------------------------------------------------------------- exercise 13.6


@checker
def check_streaming_rule(fn) -> None:
    """Check ``fn(num_sinks, window)``: StreamingLLM's cache as a mask rule ``allowed(b, h, q, k)``.

    The rule is checked on grids, on single indices and through FlexAttention's
    ``create_block_mask``.

    Taught in chapter 13 (Exercise 13.6).
    """
    traced = True
    for num_sinks, window, num_tokens in ((4, 3, 12), (1, 1, 6), (2, 5, 9), (3, 8, 8)):
        rule = call(fn, num_sinks, window)
        expect_true("streaming_rule returns a rule", callable(rule),
                    expected="a function allowed(b, h, q_idx, kv_idx)",
                    actual=type(rule).__name__,
                    hint="define the rule inside streaming_rule and return it, without calling "
                         "it")
        positions = torch.arange(num_tokens)
        distance = positions[:, None] - positions[None, :]  # (T, T): q - k
        causal = causal_mask(num_tokens)
        sink = (positions < num_sinks)[None, :]  # (1, T)
        expected = causal & (sink | (distance < window))  # (T, T)
        label = f"num_sinks={num_sinks}, window={window}"
        try:
            mask = materialize(rule, 1, 1, num_tokens)[0, 0]  # (T, T)
        except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
            _rule_failure("on whole grids of indices", error)
        if bool((mask & ~causal).any()):
            q, k = _first_difference(mask & ~causal, torch.zeros_like(causal))
            fail(f"no query sees a future key ({label})", expected=f"query {q} cannot see key {k}",
                 actual="it can", hint="a sink is a key like any other: a query sees only the "
                 "sinks at or before it; combine the rule with kv_idx <= q_idx")
        if not torch.equal(mask, expected):
            q, k = _first_difference(mask, expected)
            hints = []
            if bool(expected[q, k]) and k < num_sinks:
                hints.append("the first num_sinks tokens stay visible to every later query")
            if (q - k) in (window - 1, window):
                hints.append("the window holds `window` keys, the query's own included: "
                             "0 <= q_idx - kv_idx < window")
            if not hints:
                hints.append("a key is allowed when it is a sink (kv_idx < num_sinks) or lies "
                             "in the window, and never in the future")
            fail(f"query {q} and key {k} ({label})", expected=bool(expected[q, k]),
                 actual=bool(mask[q, k]), hint="; ".join(hints))
        single = call(rule, torch.tensor(0), torch.tensor(0), torch.tensor(num_tokens - 1),
                      torch.tensor(0), prop="the rule works on single indices (0-d tensors)")
        expect_true(f"the rule on the single pair query {num_tokens - 1}, key 0 ({label})",
                    bool(torch.as_tensor(single)) == bool(expected[-1, 0]),
                    expected=bool(expected[-1, 0]), actual=bool(torch.as_tensor(single)),
                    hint="the rule must give the same answer for one pair as for a grid")
        try:
            flex_mask = _block_mask_dense(rule, num_tokens)  # (T, T)
        except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
            _rule_failure(f"in FlexAttention's create_block_mask ({label})", error)
        traced = traced and flex_mask is not None
        expect_true(f"create_block_mask builds the same mask ({label})",
                    flex_mask is None or torch.equal(flex_mask, expected),
                    expected="the same mask",
                    actual="another mask",
                    hint="write the rule so that its indices broadcast, whatever their shapes")
    passed("the sinks and the window, composed with |, as one rule that FlexAttention's "
           "block mask can skip tiles with; what the rule blocks is what the cache has "
           "forgotten." + ("" if traced else " (create_block_mask was not run: your rule lives "
                                             "in another process here, which vmap cannot "
                                             "trace.)"))
