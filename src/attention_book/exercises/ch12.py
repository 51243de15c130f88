"""Checkers for chapter 12 (positions inside attention: RoPE and ALiBi; cross-attention)."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from ..bug_zoo import RotaryCacheRestartsPositions
from ..modules import GroupedQueryAttention, MultiHeadAttention
from ..positions import rotary_embedding
from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = [
    "check_masked_cross_attention",
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


@checker
def check_masked_cross_attention(fn) -> None:
    """Check single-head cross-attention ``fn(x, context, W_query, W_key, W_value, context_mask)``.

    Taught in chapter 12 (Exercise 12.1).
    """
    torch.manual_seed(0)
    d_in, d_out = 4, 6
    x = torch.randn(2, 3, d_in)  # (B, T, d_in)
    context = torch.randn(2, 5, d_in)  # (B, T_ctx, d_in)
    # Small weights keep every score moderate: no weight underflows to 0 unless it is masked.
    W_query, W_key, W_value = (0.5 * torch.randn(3, d_in, d_out)).unbind(0)  # each (d_in, d_out)
    context_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])  # (B, T_ctx)
    queries, keys, values = x @ W_query, context @ W_key, context @ W_value
    expected, expected_weights = scaled_dot_product_attention(
        queries, keys, values, context_mask[:, None, :])  # (B, T, d_out), (B, T, T_ctx)

    result = call(fn, x, context, W_query, W_key, W_value, context_mask)
    if not (isinstance(result, tuple) and len(result) == 2):
        fail("cross_attention returns the pair (output, weights)", expected="a tuple of 2 tensors",
             actual=type(result).__name__,
             hint="end with `return output, weights`, as the book's scaled_dot_product_attention")
    output, weights = result
    expect_shape("the weights", weights, (2, 3, 5), hint=(
        "the weights are (B, T, T_ctx): one row per query of x, one column per token of the "
        "context; the keys come from the context, the queries from x"))
    expect_shape("the output", output, (2, 3, d_out), hint=(
        "the output has one row per query token of x: (B, T, d_out)"))
    padded = weights[1, :, 3:].detach().abs().max().item()
    expect_true("the padded context tokens get zero weight", padded <= 1e-6,
                expected="weight 0 on keys 3 and 4 of sequence 1 (context_mask is False there)",
                actual=f"weights up to {padded:.3g}", hint=(
                    "block the keys where context_mask is False before the softmax; the mask "
                    "(B, T_ctx) needs a query axis to broadcast: context_mask[:, None, :]"))
    blocked = int((weights[0].detach().abs() <= 1e-6).sum())
    expect_true("every query sees every real context token", blocked == 0,
                expected="no zero weight in sequence 0, which has no padding",
                actual=f"{blocked} weights of sequence 0 are zero", hint=(
                    "the context is another sequence, already complete: no context token lies "
                    "in the future of a query, so cross-attention has no causal mask; only "
                    "the padding mask applies"))
    hint = ("queries = x @ W_query, keys = context @ W_key, values = context @ W_value; scale "
            "the scores by 1/sqrt(d_out) before the softmax over the context tokens")
    expect_close("the weights", weights, expected_weights, hint=hint)
    expect_close("the output", output, expected, hint=hint)
    unmasked = call(fn, x, context, W_query, W_key, W_value)
    expect_close("the output without a context_mask", unmasked[0],
                 scaled_dot_product_attention(queries, keys, values)[0],
                 hint="context_mask=None means every context token is real: apply no mask")
    passed("queries from x, keys and values from the context, and only a padding mask: "
           "3 queries spread their weight over 5 context tokens, never over padding.")


# --------------------------------------------------------------------------- exercise 12.2


@checker
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


@checker
def check_rope_2d(fn) -> None:
    """Check ``fn(x, rows, cols)``: 2-D RoPE, the first half by rows and the second by columns.

    Taught in chapter 12 (Exercise 12.3).
    """
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8)  # (B, T, head_dim): 6 patches of a 2 x 3 image
    rows = torch.tensor([0, 0, 0, 1, 1, 1])  # (T,)
    cols = torch.tensor([0, 1, 2, 0, 1, 2])  # (T,)
    half = x.size(-1) // 2
    expected = torch.cat((rotary_embedding(x[..., :half], rows),
                          rotary_embedding(x[..., half:], cols)), dim=-1)  # (B, T, head_dim)
    out = call(fn, x, rows, cols)
    expect_shape("rope_2d(x, rows, cols)", out, x.shape, hint="return a tensor shaped like x")
    shifted = call(fn, x, rows + 3, cols + 5)
    moved = (_scores(out[0], out[1]) - _scores(shifted[0], shifted[1])).abs().max().item()
    expect_true("scores depend only on the row and column distances", moved <= 1e-4,
                expected="the same scores when the whole grid moves by 3 rows and 5 columns",
                actual=f"scores change by up to {moved:.3g}", hint=(
                    "rotate each half with rotary_embedding (its positions are the rows, or "
                    "the columns); do not add or mix positions before rotating"))
    swapped = torch.cat((rotary_embedding(x[..., :half], cols),
                         rotary_embedding(x[..., half:], rows)), dim=-1)
    if _close(out, swapped):
        fail("the first half of the features turns with the rows", expected="rows first",
             actual="the first half turns with the columns",
             hint="swap rows and cols: x[..., :head_dim // 2] goes with the rows")
    interleaved = torch.cat((rotary_embedding(x[..., :half], rows, interleaved=True),
                             rotary_embedding(x[..., half:], cols, interleaved=True)), dim=-1)
    if _close(out, interleaved):
        fail("each half uses the split-half pairing", expected="interleaved=False",
             actual="the interleaved pairing", hint="use rotary_embedding's default pairing")
    expect_close("rope_2d(x, rows, cols)", out, expected, hint=(
        "split the features in two halves of head_dim/2; each half is rotated as a head of "
        "its own with rotary_embedding, the first by rows, the second by cols"))
    passed("each half turns by its own axis, so a score depends only on (row distance, "
           "column distance): moving the whole grid leaves it unchanged.")


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


def _layers() -> list[tuple[str, nn.Module, bool]]:
    def seeded(build):
        torch.manual_seed(0)
        return build().eval()

    return [
        ("MultiHeadAttention(rope=True)",
         seeded(lambda: MultiHeadAttention(8, 8, 2, context_length=8, rope=True)), True),
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
    ]


@checker
def check_decodes_like_full_pass(fn) -> None:
    """Check the property test ``fn(layer, x) -> bool`` against healthy and broken layers.

    Taught in chapter 12 (Exercise 12.5).
    """
    torch.manual_seed(1)
    x = torch.randn(2, 6, 8)  # (B, T, d_in)
    for name, layer, healthy in _layers():
        verdict = call(fn, layer, x.clone())
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
                 hint=("feed the tokens one call at a time through one KVCache, "
                       "layer(x[:, t:t+1], kv_cache=cache), and compare every token's output "
                       "with layer(x): the first token is right even when later ones are not"))
    passed("your test passes the 3 healthy layers and catches both broken ones, including "
           "positions that restart at 0.")
