"""Checkers for chapter 12 (positions inside attention: RoPE and ALiBi)."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ..bug_zoo import RotaryCacheRestartsPositions
from ..modules import GroupedQueryAttention, MultiHeadAttention
from ..positions import rotary_embedding
from .feedback import (
    call,
    call_in_private_order,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = [
    "check_alibi_slopes",
    "check_changed_scores",
    "check_rope_2d",
    "check_fixed_rope",
    "check_decodes_like_full_pass",
]


def _scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    return queries @ keys.transpose(-2, -1)  # (..., T_q, T_k)


def _close(a: object, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a.detach().to(b.dtype), b, atol=atol, rtol=1e-4))


# --------------------------------------------------------------------------- exercise 12.1


def _geometric(count: int) -> list[float]:
    """The paper's slopes for a power of two: 2^(-8/n), 2^(-16/n), ... (n = count)."""
    return [2.0 ** (-8.0 * (h + 1) / count) for h in range(count)]


def _paper_slopes(num_heads: int) -> list[float]:
    # Press et al.'s reference rule, kept here to grade against; the book's package has it too.
    lower = 2 ** (num_heads.bit_length() - 1)
    return _geometric(lower) + _geometric(2 * lower)[0::2][: num_heads - lower]


_HEAD_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 40, 64, 96)


def _as_slopes(value: object, num_heads: int) -> torch.Tensor:
    try:
        slopes = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        fail(f"alibi_slopes({num_heads}) returns the slopes", expected="a tensor or list of numbers",
             actual=type(value).__name__, hint="return torch.tensor(slopes), one slope per head")
    expect_shape(f"alibi_slopes({num_heads})", slopes, (num_heads,),
                 hint="return one slope per head, a 1-D tensor of num_heads numbers")
    return slopes


@checker
def check_alibi_slopes(fn) -> None:
    """Check ``fn(num_heads)``: ALiBi's slopes for any head count, as in Press et al.'s code.

    Taught in chapter 12 (Exercise 12.1).
    """
    results = {n: _as_slopes(call(fn, n), n) for n in _HEAD_COUNTS}
    for n in (1, 2, 4, 8, 16, 64):  # the powers of two first: the chapter's rule
        slopes, expected = results[n], torch.tensor(_geometric(n), dtype=torch.float64)
        if torch.allclose(slopes, expected, rtol=1e-5, atol=0):
            continue
        if torch.allclose(slopes, torch.tensor([2.0 ** (-8.0 * h / n) for h in range(n)],
                                                         dtype=torch.float64), rtol=1e-5, atol=0):
            hint = "the first head's slope is 2^(-8/n) itself, not 2^0 = 1"
        elif torch.allclose(slopes, expected.flip(0), rtol=1e-5, atol=0):
            hint = "head 0 gets the steepest slope, 2^(-8/n); the slopes shrink from there"
        else:
            hint = ("for n a power of two the slopes are 2^(-8/n), 2^(-16/n), ..., 2^(-8): "
                    "a geometric sequence whose first term and ratio are both 2^(-8/n)")
        fail(f"alibi_slopes({n}) follows the rule for a power of two",
             expected=_round(expected), actual=_round(slopes), hint=hint)
    for n in _HEAD_COUNTS:
        slopes, expected = results[n], torch.tensor(_paper_slopes(n), dtype=torch.float64)
        if torch.allclose(slopes, expected, rtol=1e-5, atol=0):
            continue
        lower = 2 ** (n.bit_length() - 1)
        prop = f"alibi_slopes({n}) equals the slopes of Press et al.'s code"
        if torch.allclose(slopes, torch.tensor(_geometric(n), dtype=torch.float64), rtol=1e-5,
                          atol=0):
            hint = (f"2^(-8/{n}) with its own ratio is the obvious extension, but not the "
                    f"paper's: keep the {lower} slopes of {lower} heads unchanged, and take the "
                    f"other {n - lower} from the slopes of {2 * lower} heads")
        elif torch.allclose(slopes.sort(descending=True).values,
                            expected.sort(descending=True).values, rtol=1e-5, atol=0):
            hint = (f"the right slopes in the wrong order: the {lower} slopes of {lower} heads "
                    f"come first, as they are, and the extra ones follow (the paper does not "
                    "sort them)")
        elif torch.allclose(slopes, torch.tensor(_geometric(2 * lower)[:n], dtype=torch.float64),
                            rtol=1e-5, atol=0):
            hint = (f"the first {n} slopes of {2 * lower} heads never reach the gentle end, "
                    f"2^(-8): keep all {lower} slopes of {lower} heads, which run from "
                    f"2^(-8/{lower}) to 2^(-8), and add slopes of {2 * lower} heads that lie "
                    "between them")
        elif len(set(slopes.tolist())) < n:
            hint = (f"some slopes repeat: every second slope of {2 * lower} heads is already "
                    f"one of the slopes of {lower} heads; take the ones that lie between them")
        else:
            hint = (f"keep the {lower} slopes of {lower} heads (the largest power of two "
                    f"below {n}), then add the first {n - lower} of the slopes of {2 * lower} "
                    f"heads that are not already among them, steepest first")
        fail(prop, expected=_round(expected), actual=_round(slopes), hint=hint)
    passed("the slopes of every head count from 1 to 96 equal the paper's. For n that is not "
           "a power of two, the heads of the power of two below n keep their slopes and the "
           "others fall halfway between them (on a log scale), so no two heads share a slope.")


def _round(slopes: torch.Tensor) -> list[float]:
    return [round(value, 4) for value in slopes.tolist()]


# --------------------------------------------------------------------------- exercise 12.2


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_changed_scores(fn) -> None:
    """Check the prediction ``fn()``: which of 4 x 4 scores change when the pairing is swapped.

    Taught in chapter 12 (Exercise 12.2).
    """
    prediction = call(fn)
    try:
        predicted = torch.as_tensor(prediction, dtype=torch.bool)
    except (TypeError, ValueError, RuntimeError):
        fail("the prediction is a 4 x 4 table of True/False", expected="a (4, 4) bool tensor",
             actual=type(prediction).__name__,
             hint="return torch.tensor([[...], ...], dtype=torch.bool), one row per query position")
    expect_shape("your prediction", predicted, (4, 4),
                 hint="one entry per (query position m, key position n), m and n from 0 to 3")
    # The prediction is checked against a measurement, not against a stored answer.
    torch.manual_seed(0)
    queries, keys = torch.randn(2, 4, 8, dtype=torch.float64).unbind(0)  # each (T, head_dim)
    split = _scores(rotary_embedding(queries), rotary_embedding(keys))  # (T, T)
    swapped = _scores(rotary_embedding(queries, interleaved=True),
                      rotary_embedding(keys, interleaved=True))  # (T, T)
    changed = (split - swapped).abs() > 1e-9  # (T, T)
    if torch.equal(predicted, changed):
        passed("only the diagonal keeps its scores. When m = n both vectors turn by the same "
               "rotation, which never changes a dot product, whichever pairing built it; "
               "when m != n the two pairings turn different features together.")
        return
    same_position = torch.eye(4, dtype=torch.bool)
    if not predicted.any():
        fail("the pairing matters for some scores", expected="True for some (m, n)",
             actual="False everywhere", hint=(
                 "the chapter showed that the two pairings are not interchangeable with the "
                 "same weights; which scores did its example change?"))
    if predicted[same_position].any():
        fail("scores of a query and a key at the same position keep their value",
             expected="False where m == n", actual=f"True at {_cells(predicted & same_position)}",
             hint=("when m == n the query and the key turn by one and the same rotation; what "
                   "does turning two vectors by the same rotation do to their dot product?"))
    missed = changed & ~predicted
    off_zero = missed.clone()
    off_zero[0, :] = False
    off_zero[:, 0] = False
    if torch.equal(missed, changed.triu()):
        hint = ("the scores above the diagonal exist before a causal mask hides them, and the "
                "question is about every score")
    elif not off_zero.any():
        hint = ("at position 0 nothing turns, but the other vector does, and the features it "
                "turns together depend on the pairing")
    else:
        hint = ("for m != n the score compares two different rotations, and the two pairings "
                "turn different features together")
    fail("scores of tokens at different positions change", expected="True where m != n",
         actual=f"False at {_cells(missed)}", hint=hint)


def _cells(table: torch.Tensor) -> str:
    return ", ".join(f"({m}, {n})" for m, n in torch.nonzero(table).tolist())


# --------------------------------------------------------------------------- exercise 12.3


def _rope_2d_reference(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                      half: int, interleaved: bool = False) -> torch.Tensor:
    """The first ``half`` features turned by the rows, the rest by the columns."""
    return torch.cat((rotary_embedding(x[..., :half], rows, interleaved=interleaved),
                      rotary_embedding(x[..., half:], cols, interleaved=interleaved)), dim=-1)


@checker
def check_rope_2d(fn) -> None:
    """Check ``fn(x, rows, cols)``: 2-D RoPE, the first half by rows and the second by columns.

    It is checked at ``head_dim`` 8, 12 and 16, so that a half written as a fixed number is
    wrong somewhere.

    Taught in chapter 12 (Exercise 12.3).
    """
    rows = torch.tensor([0, 0, 0, 1, 1, 1])  # (T,): 6 patches of a 2 x 3 image
    cols = torch.tensor([0, 1, 2, 0, 1, 2])  # (T,)
    for head_dim in (8, 12, 16):
        torch.manual_seed(head_dim)
        x = torch.randn(2, 6, head_dim)  # (B, T, head_dim)
        half = head_dim // 2
        expected = _rope_2d_reference(x, rows, cols, half)  # (B, T, head_dim)
        label = f"rope_2d(x, rows, cols) with head_dim = {head_dim}"
        out = call(fn, x, rows, cols)
        expect_shape(label, out, x.shape, hint="return a tensor shaped like x")
        shifted = call(fn, x, rows + 3, cols + 5)
        moved = (_scores(out[0], out[1]) - _scores(shifted[0], shifted[1])).abs().max().item()
        expect_true(f"scores depend only on the row and column distances (head_dim = "
                    f"{head_dim})", moved <= 1e-4,
                    expected="the same scores when the whole grid moves by 3 rows and 5 columns",
                    actual=f"scores change by up to {moved:.3g}", hint=(
                        "rotate each half with rotary_embedding (its positions are the rows, "
                        "or the columns); do not add or mix positions before rotating"))
        if _close(out, _rope_2d_reference(x, cols, rows, half)):
            fail("the first half of the features turns with the rows", expected="rows first",
                 actual="the first half turns with the columns",
                 hint="swap rows and cols: x[..., :head_dim // 2] goes with the rows")
        if _close(out, _rope_2d_reference(x, rows, cols, half, interleaved=True)):
            fail("each half uses the split-half pairing", expected="interleaved=False",
                 actual="the interleaved pairing", hint="use rotary_embedding's default pairing")
        for fixed in (4, 8):
            if fixed != half and fixed < head_dim and _close(out, _rope_2d_reference(x, rows, cols, fixed)):
                fail(f"the halves are head_dim // 2 = {half} features each ({label})",
                     expected=f"{half} features turned by the rows, {half} by the columns",
                     actual=f"the first {fixed} features turned by the rows, the other "
                            f"{head_dim - fixed} by the columns",
                     hint=f"read the half from the input, x.size(-1) // 2, instead of writing "
                          f"{fixed}: rope_2d must work for every head_dim that is a multiple "
                          "of 4")
        expect_close(label, out, expected, hint=(
            "split the features in two halves of head_dim/2; each half is rotated as a head of "
            "its own with rotary_embedding, the first by rows, the second by cols"))
    passed("each half turns by its own axis, so a score depends only on (row distance, "
           "column distance): moving the whole grid leaves it unchanged, whatever the head_dim.")


# --------------------------------------------------------------------------- exercise 12.4


@checker
def check_fixed_rope(fn) -> None:
    """Check ``fn(x, positions)``: the blog's split-half RoPE with its bug fixed.

    Taught in chapter 12 (Exercise 12.4).
    """
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)  # (B, T, head_dim)
    positions = torch.arange(5)  # (T,)
    out = call(fn, x, positions)
    expect_shape("fixed_rope(x, positions)", out, x.shape, hint="return a tensor shaped like x")
    shifted = call(fn, x, positions + 7)
    moved = (_scores(out[0], out[1]) - _scores(shifted[0], shifted[1])).abs().max().item()
    expect_true("the scores stay the same when every position shifts by 7", moved <= 1e-4,
                expected="scores that depend only on m - n", actual=f"scores change by {moved:.3g}",
                hint=("in a rotation both features of a pair turn by the same angle; with "
                      "split-half pairs, feature i and feature i + head_dim/2 must share their "
                      "cos and sin: look at how cos and sin are laid out"))
    if _close(out, rotary_embedding(x, positions, interleaved=True)):
        fail("the fix keeps the split-half pairing", expected="features i and i + head_dim/2 "
             "turn together", actual="the interleaved pairing (features 2i and 2i + 1)",
             hint="keep the blog's rotate_half; change only how cos and sin are laid out")
    if _close(out, rotary_embedding(x, -positions)):
        fail("the pairs turn by +angle", expected="x1 cos - x2 sin and x2 cos + x1 sin",
             actual="a turn by -angle", hint="keep the signs of the blog's rotate_half")
    expect_close("fixed_rope(x, positions)", out, rotary_embedding(x, positions), hint=(
        "change only the line that builds cos and sin; the angles, the pairing and the "
        "rotate_half are right"))
    passed("cos and sin repeat the angles as [angles, angles], matching rotate_half's halves, "
           "so the scores depend only on m - n.")


# --------------------------------------------------------------------------- exercise 12.5


class _ForgetsTheCache(nn.Module):
    """A broken layer for the checker: it accepts a cache and never uses it."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        return self.layer(x, mask, return_weights)


class _DecodesWrongSomewhere(nn.Module):
    """A broken layer for the checker: correct without a cache; while decoding, some keys are
    hidden from some queries, so the outputs go wrong only at some depths of the cache.

    ``hidden(query_position, key_position) -> bool`` says which keys a query loses.
    """

    def __init__(self, layer: nn.Module, hidden):
        super().__init__()
        self.layer = layer
        self.hidden = hidden

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        if kv_cache is None:
            return self.layer(x, mask, return_weights)
        start, num_tokens = len(kv_cache), x.size(-2)
        queries = torch.arange(start, start + num_tokens)[:, None]  # (T, 1)
        keys = torch.arange(start + num_tokens)[None, :]  # (1, T_k)
        allowed = ~self.hidden(queries, keys)  # (T, T_k)
        if mask is not None:
            allowed = allowed & mask
        return self.layer(x, allowed, return_weights, kv_cache=kv_cache)


class _Subject(nn.Module):
    """A layer for the checker: right without a cache; while decoding, ``change(position,
    output)`` rewrites the output of each decoded position (``output`` is ``(B, d_out)``)."""

    def __init__(self, layer: nn.Module, change):
        super().__init__()
        self.layer = layer
        self.change = change

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        if kv_cache is None:
            return self.layer(x, mask, return_weights)
        start = len(kv_cache)
        out = self.layer(x, mask, False, kv_cache=kv_cache)  # (B, T, d_out)
        out = torch.stack([self.change(start + t, out[:, t]) for t in range(out.size(1))], dim=1)
        return (out, None) if return_weights else out


def _cancelling(position: int, output: torch.Tensor) -> torch.Tensor:
    """Token 2 comes out off by +e and token 3 by -e, with e summing to 0 over the features:
    every mean of the outputs (over tokens, over features, over both) is unchanged."""
    signs = torch.ones(output.size(-1), dtype=output.dtype)
    signs[1::2] = -1.0  # (d_out,): +1, -1, +1, ...; sums to 0 for an even d_out
    step = {2: 0.05, 3: -0.05}.get(position, 0.0)
    return output + step * signs


def _reordered(position: int, output: torch.Tensor) -> torch.Tensor:
    """Token 4 comes out with its features in reverse order: its mean, its norm and its sorted
    values are unchanged."""
    return output.flip(-1) if position == 4 else output


def _later_rows(position: int, output: torch.Tensor) -> torch.Tensor:
    """Token 3 comes out with its features reversed in every sequence of the batch but the
    first (``output`` is ``(B, d_out)``): a bug that a test of one sequence never sees."""
    if position != 3:
        return output
    return torch.cat([output[:1], output[1:].flip(-1)])


def _last_feature_dropped(position: int, output: torch.Tensor) -> torch.Tensor:
    """Every decoded token comes out with its last feature 0: an output written one feature
    short."""
    out = output.clone()
    out[..., -1] = 0.0
    return out


def _fast_path_behind(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One-token calls while the cache holds 2 to 4 tokens take a fast path whose mask is one
    step behind: the token loses its own key. Calls of several tokens are right."""
    one_token = queries.numel() == 1
    return one_token & (queries >= 2) & (queries <= 4) & (keys == queries)


def _layers() -> list[tuple[str, nn.Module, bool]]:
    def seeded(build):
        torch.manual_seed(0)
        return build().eval()

    def rope_layer():
        return MultiHeadAttention(8, 8, 2, context_length=8, rope=True)

    return [
        ("MultiHeadAttention(rope=True)", seeded(rope_layer), True),
        ("GroupedQueryAttention(rope=True, backend='sdpa')",
         seeded(lambda: GroupedQueryAttention(8, 8, 4, 2, context_length=8, rope=True,
                                              backend="sdpa")), True),
        ("MultiHeadAttention without RoPE",
         seeded(lambda: MultiHeadAttention(8, 8, 2, context_length=8)), True),
        ("bug_zoo.RotaryCacheRestartsPositions (positions restart at 0)",
         seeded(lambda: RotaryCacheRestartsPositions(8, 8, 2, context_length=8, rope=True)),
         False),
        ("a layer that ignores its cache",
         seeded(lambda: _ForgetsTheCache(MultiHeadAttention(8, 8, 2, context_length=8))), False),
        ("a layer that, while decoding, sees only the last 2 cached tokens (wrong from "
         "token 3 on, once the cache holds 3)",
         seeded(lambda: _DecodesWrongSomewhere(rope_layer(), lambda q, k: q - k > 2)), False),
        ("a layer that, while decoding, sees only the last 4 cached tokens (wrong at "
         "token 5 only)",
         seeded(lambda: _DecodesWrongSomewhere(rope_layer(), lambda q, k: q - k > 4)), False),
        ("a layer that, while decoding tokens 2 and 3, loses key 0 (wrong in the middle "
         "only: the last token is right)",
         seeded(lambda: _DecodesWrongSomewhere(
             rope_layer(), lambda q, k: ((q == 2) | (q == 3)) & (k == 0))), False),
        ("a layer whose decoded tokens 2 and 3 are off by +e and -e, with e summing to 0 "
         "(errors that cancel in every mean)",
         seeded(lambda: _Subject(rope_layer(), _cancelling)), False),
        ("a layer whose decoded token 4 comes out with its features reversed (the same mean, "
         "norm and values, in the wrong places)",
         seeded(lambda: _Subject(rope_layer(), _reordered)), False),
        ("a layer whose one-token calls, while the cache holds 2 to 4 tokens, take a fast "
         "path whose mask is one step behind (wrong only when tokens come one per call: a "
         "prefill of several tokens is right)",
         seeded(lambda: _DecodesWrongSomewhere(rope_layer(), _fast_path_behind)), False),
        ("a layer whose decoded token 3 is wrong in every sequence of the batch but the first",
         seeded(lambda: _Subject(rope_layer(), _later_rows)), False),
        ("a layer whose decoded tokens come out with their last feature 0 (an output written "
         "one feature short; the other features are right)",
         seeded(lambda: _Subject(rope_layer(), _last_feature_dropped)), False),
    ]


@checker
def check_decodes_like_full_pass(fn) -> None:
    """Check the property test ``fn(layer, x) -> bool`` against healthy and broken layers.

    The broken layers go wrong at different depths of the cache: from the second token, from
    the fourth, at the sixth only, and at the third and fourth only; one only in one-token
    calls, one only in the second sequence of the batch, one only in the last feature; two
    more have errors that no mean, sum or norm of the outputs shows. ``x`` is ``(2, 6, 8)``.

    Taught in chapter 12 (Exercise 12.5).
    """
    torch.manual_seed(1)
    x = torch.randn(2, 6, 8)  # (B, T, d_in)
    layers = _layers()
    outcomes = call_in_private_order([partial(call, fn, layer, x.clone()) for _, layer, _ in layers])
    for (name, _, healthy), outcome in zip(layers, outcomes, strict=True):
        verdict = outcome.get()
        if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
            verdict = bool(verdict)
        if not isinstance(verdict, bool):
            fail("the test returns True or False", expected="a bool",
                 actual=type(verdict).__name__,
                 hint="return the result of the comparison, e.g. torch.allclose(...)")
        if healthy and not verdict:
            fail(f"a healthy layer passes your test: {name}", expected="True", actual="False",
                 hint=("compare within a tolerance (torch.allclose(..., atol=1e-5)), not "
                       "exactly: decoding adds numbers in another order; use a fresh "
                       "KVCache(T) and feed x[:, t:t+1] for t = 0 ... T-1"))
        if not healthy and verdict:
            fail(f"your test catches a broken layer: {name}", expected="False", actual="True",
                 hint=("feed every token of x, one call at a time (a decoder's path, which "
                       "a prefill of several tokens does not take), through one KVCache, "
                       "layer(x[:, t:t+1], kv_cache=cache), and compare the output of every "
                       "token with layer(x): a bug can show at any depth of the cache, from "
                       "the first cached token to the last, and only there; compare every "
                       "number (torch.allclose on the whole outputs: every sequence of the "
                       "batch, every token, every feature), not a summary such as a mean or "
                       "a norm, in which errors can cancel"))
    broken = sum(not healthy for _, _, healthy in layers)
    passed(f"your test passes the 3 healthy layers and catches all {broken} broken ones, "
           "whether they go wrong from the second token, only once the cache is deep, only "
           "in the middle of the sequence, only one token per call, only in one sequence of "
           "the batch or one feature, or in a way no average shows.")
