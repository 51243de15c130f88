"""Checkers for chapter 2's exercises (softmax and dot-product attention)."""

from __future__ import annotations

import math
import sys

import torch
from torch.overrides import TorchFunctionMode

from .. import attention
from .feedback import (
    ExerciseFailure,
    call,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = [
    "check_stable_softmax", "check_predicted_cross_attention", "check_cosine_attention_weights",
    "check_fixed_attention",
]


class _LibrarySoftmaxWatch(TorchFunctionMode):
    """Note the first call of a library softmax while an answer runs.

    Every torch function whose name contains ``softmax`` counts (``torch.softmax``,
    ``Tensor.softmax``, ``F.softmax``, ``nn.Softmax``, ``torch.special.softmax``,
    ``log_softmax``), and so does any torch call made from inside ``attention_book.softmax``
    (found on the call stack, so an alias such as ``from attention_book import softmax as s``
    is caught too).
    """

    _BOOK_CODES = frozenset({attention.softmax.__code__})

    def __init__(self):
        super().__init__()
        self.used: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.used is None:
            name = getattr(func, "__name__", "")
            if "softmax" in name:
                self.used = f"torch's {name}"
            else:
                frame = sys._getframe(1)
                while frame is not None:
                    if frame.f_code in self._BOOK_CODES:
                        self.used = "attention_book.softmax"
                        break
                    frame = frame.f_back
        return func(*args, **(kwargs or {}))


def _call_own_softmax(fn, *args, **kwargs):
    """``call(fn, ...)``, failing with a clear message if ``fn`` used a library softmax."""
    watch = _LibrarySoftmaxWatch()
    failure = None
    with watch:
        try:
            result = call(fn, *args, **kwargs)
        except ExerciseFailure as error:
            failure = error
    if watch.used:
        fail("your softmax is built from exp, a maximum and a sum",
             expected="no call of a library softmax", actual=f"a call of {watch.used}",
             hint="This exercise asks you to write the softmax yourself, so torch.softmax, "
                  "F.softmax, x.softmax and attention_book.softmax are off limits here.")
    if failure is not None:
        raise failure
    return result


def _as_float64(value, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Turn a predicted list or tensor into a float64 tensor, with feedback if it is not one."""
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        fail(f"{what} is a table of numbers", expected=f"a nested list or tensor of shape {shape}",
             actual=type(value).__name__,
             hint="Write the numbers you computed by hand as a list of rows.")


@checker
def check_stable_softmax(fn) -> None:
    """Check ``fn(x, dim=-1)`` is a softmax along ``dim`` that does not overflow.

    The answer may not call a library softmax: the checker watches every torch call while
    the answer runs.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    square = torch.randn(5, 5)  # (5, 5)
    weights = _call_own_softmax(fn, square)
    expect_shape("the softmax of a (5, 5) tensor", weights, (5, 5),
                 hint="The softmax keeps the shape of its input.")
    shifted = square - square.amax(dim=-1)  # the maximum broadcast along the wrong dim
    without_keepdim = torch.exp(shifted) / torch.exp(shifted).sum(dim=-1)
    if torch.allclose(weights, without_keepdim, atol=1e-5):
        fail("each row of the softmax of a (5, 5) tensor sums to 1",
             expected=[1.0] * 5, actual=[round(v, 4) for v in weights.sum(dim=-1).tolist()],
             hint="Pass keepdim=True to amax and sum: without it the (5,) result broadcasts "
                  "along the wrong dim and divides the columns instead of the rows.")
    expect_close(
        "the softmax of a (5, 5) tensor", weights, torch.softmax(square, dim=-1),
        hint="Divide the exp of each score by the sum of the exps of its row "
             "(dim=-1, keepdim=True).",
    )
    x = torch.randn(4, 3)  # (4, 3)
    expect_close(
        "the softmax of a (4, 3) tensor", _call_own_softmax(fn, x), torch.softmax(x, dim=-1),
        hint="Divide the exp of each score by the sum of the exps of its row "
             "(dim=-1, keepdim=True).",
    )
    large = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0]])  # (2, 3)
    weights = _call_own_softmax(fn, large)
    expect_shape("the softmax of large scores", weights, (2, 3),
                 hint="The softmax keeps the shape of its input.")
    finite = torch.isfinite(weights).all(dim=-1)  # (2,)
    if bool(finite[0]) and not bool(finite[1]):
        fail("large scores of either sign give finite weights", expected="finite numbers",
             actual=weights.tolist(),
             hint="Subtract the maximum of each row, not of the whole tensor: the second row "
                  "lies 2000 below the overall maximum, and exp(-2000) is 0 in float32.")
    expect_true(
        "large scores give finite weights", bool(finite.all()),
        expected="finite numbers", actual=weights.tolist(),
        hint="Subtract the row maximum (x.amax(dim=dim, keepdim=True)) before torch.exp, so "
             "that the largest exponent is 0.",
    )
    expect_close(
        "the softmax of large scores", weights, torch.softmax(large, dim=-1),
        hint="Subtract the maximum of each row, not of the whole tensor.",
    )
    batch = torch.randn(2, 3, 4) * 50  # (2, 3, 4)
    result = _call_own_softmax(fn, batch, dim=1)
    if isinstance(result, torch.Tensor) and torch.allclose(
            result, torch.softmax(batch, dim=-1), atol=1e-5):
        fail("softmax(x, dim=1) normalises along dim 1", expected="sums of 1 along dim 1",
             actual="sums of 1 along the last dim",
             hint="Your function ignores its dim argument: use dim both for the maximum and "
                  "for the sum.")
    expect_close(
        "the softmax along dim=1 of a (2, 3, 4) tensor", result, torch.softmax(batch, dim=1),
        hint="Use the dim argument both for the maximum and for the sum.",
    )
    passed("your softmax matches torch.softmax, along any dim, even for scores of 1000.")


def _cross_attention_reference(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)  # (T_q=2, d_k=2)
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # (3, 2)
    values = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)  # (T_k=3, d_v=1)
    weights = torch.softmax(queries @ keys.T * scale, dim=-1)  # (2, 3)
    return weights @ values, weights  # (2, 1), (2, 3)


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_cross_attention(fn) -> None:
    """Check the hand-computed cross-attention of 2 queries over 3 keys (scale ``1/√2``).

    The prediction is accepted within 0.002 of the exact numbers.

    Taught in chapter 2.
    """
    value = call(fn, prop="predicted_cross_attention() runs without an error")
    expect_true(
        "predicted_cross_attention returns a pair",
        isinstance(value, (tuple, list)) and len(value) == 2,
        expected="(context_vecs, attn_weights)", actual=type(value).__name__,
        hint="End with `return context_vecs, attn_weights`.",
    )
    context, weights = (_as_float64(value[0], "your context vectors", (2, 1)),
                        _as_float64(value[1], "your weights", (2, 3)))
    expect_shape("your predicted attn_weights", weights, (2, 3),
                 hint="Give one row per query and one column per key: shape (2, 3).")
    right_context, right_weights = _cross_attention_reference(1 / math.sqrt(2))
    a, b = right_weights[0, 0].item(), right_weights[0, 1].item()
    wrong_weights = [
        (_cross_attention_reference(1.0)[1],
         "These are the weights of unscaled scores. The package divides every score by "
         "sqrt(d_k) = sqrt(2) before the softmax."),
        (_cross_attention_reference(0.5)[1],
         "You divided the scores by d_k = 2; the package divides them by sqrt(d_k) = sqrt(2)."),
        (torch.softmax(torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
                       / math.sqrt(2), dim=0),
         "Each query's row of weights sums to 1: the softmax runs over the keys (along a row), "
         "not over the queries."),
        (torch.tensor([[b, a, a], [a, b, a]], dtype=torch.float64),
         "Row 0 belongs to the first query, (1, 0). Its dot products with the keys are "
         "1, 0 and 1."),
        (torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.5, 0.5]], dtype=torch.float64),
         "The softmax exponentiates each scaled score before normalising, so a score of 0 "
         "still gets a weight above 0."),
    ]
    for table, hint in wrong_weights:
        if torch.allclose(weights, table, atol=2e-3):
            fail("your weights are the softmax of the scaled scores", expected="other numbers",
                 actual=[[round(v, 4) for v in row] for row in weights.tolist()], hint=hint)
    expect_close("your predicted attn_weights", weights, right_weights, atol=2e-3, rtol=0,
                 hint="Compute the scores q . k, divide them by sqrt(2), and apply the softmax "
                      "to each query's row; e^0.7071 is about 2.0281.")
    expect_true(
        "your context vectors hold one number per query", context.numel() == 2,
        expected="shape (2, 1): each value is one number", actual=tuple(context.shape),
        hint="Weight the values (1, 2 and 3), not the keys: the output has the size of a value.",
    )
    context = context.reshape(2, 1)
    if torch.allclose(context, right_context.flip(0), atol=2e-3):
        fail("row q of the context vectors belongs to query q", expected="query 0 first",
             actual="the two rows swapped",
             hint="The first row is the first query's weighted sum of the values.")
    expect_close("your predicted context_vecs", context, right_context, atol=2e-3, rtol=0,
                 hint="Each output is the weighted sum of the values 1, 2 and 3, with that "
                      "query's row of weights.")
    passed("you computed scaled dot-product cross-attention by hand: 2 queries, 3 keys.")


@checker
def check_cosine_attention_weights(fn) -> None:
    """Check ``fn(x)`` is the softmax of cosine similarities, so length cannot matter.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    x = torch.randn(5, 3)  # (T, d)
    unit = x / x.norm(dim=-1, keepdim=True)  # (T, d)
    expected = torch.softmax(unit @ unit.T, dim=-1)  # (T, T)
    weights = call(fn, x)
    expect_shape("the cosine attention weights", weights, (5, 5),
                 hint="Return one row of weights per token and one column per token: (T, T).")
    if torch.allclose(weights, unit @ unit.T, atol=1e-5):
        fail("each row of the weights sums to 1", expected=[1.0] * 5,
             actual=[round(v, 4) for v in weights.sum(dim=-1).tolist()],
             hint="These are the cosine similarities themselves: apply the softmax over the "
                  "keys (dim=-1) to turn them into weights.")
    if torch.allclose(weights, torch.softmax(x @ x.T, dim=-1), atol=1e-5):
        fail("the weights use cosine similarities", expected="scores between -1 and 1",
             actual="the plain dot products of chapter 2",
             hint="Divide every row of x by its length before the dot products.")
    expect_close(
        "the cosine attention weights", weights, expected,
        hint="Normalise every row by its own norm, x.norm(dim=-1, keepdim=True), before the "
             "dot products; one norm for the whole matrix, or norms along dim=0, is not a "
             "cosine.",
    )
    longer = x.clone()
    longer[2] = 10.0 * x[2]  # same direction, ten times as long
    expect_close(
        "the weights after one vector gets ten times longer", call(fn, longer), expected,
        hint="Normalise each row by its own norm: x.norm(dim=-1, keepdim=True).",
    )
    passed("only the directions of the vectors decide the weights, not their lengths.")


@checker
def check_fixed_attention(fn) -> None:
    """Check ``fn(x)`` is chapter 2's dot-product attention with both of the colleague's bugs fixed.

    The colleague subtracted the maximum of the whole score matrix (rows far below it
    underflow to 0/0) and computed the context vectors as ``attn_weights.T @ x``.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    x = torch.rand(6, 3)  # (T, d)
    result = call(fn, x)
    expect_true(
        "fixed_attention returns a pair", isinstance(result, tuple) and len(result) == 2,
        expected="(context_vecs, attn_weights)", actual=type(result).__name__,
        hint="Keep the colleague's `return context_vecs, attn_weights`.",
    )
    context_vecs, attn_weights = result
    expected_weights = torch.softmax(x @ x.T, dim=-1)  # (T, T)
    expect_shape("attn_weights", attn_weights, (6, 6),
                 hint="Keep one row per query and one column per key: (T, T).")
    expect_close(
        "the row sums of attn_weights", attn_weights.sum(dim=-1), torch.ones(6),
        hint="Normalise over the keys, along each row (dim=-1), so that every row sums to 1.",
    )
    if torch.allclose(attn_weights, torch.softmax(x @ x.T / math.sqrt(3), dim=-1), atol=1e-5):
        fail("the weights are the softmax of the plain dot products",
             expected="no scaling", actual="scores divided by sqrt(d)",
             hint="The chapter's attention does not scale the scores; keep them as they are.")
    expect_close("attn_weights", attn_weights, expected_weights,
                 hint="The weights are the softmax of x @ x.T along each row.")
    expect_shape("context_vecs", context_vecs, (6, 3),
                 hint="Keep one context vector per token: (T, d).")
    if torch.allclose(context_vecs, expected_weights.T @ x, atol=1e-5):
        fail("row q of context_vecs is the sum of w[q, k] * x[k] over the keys k",
             expected="attn_weights @ x", actual="the weights of the other direction",
             hint="The transposed weight matrix mixes the tokens with the columns of the "
                  "weights, not the rows; compare with ab.scaled_dot_product_attention(x, x, x, "
                  "scale=1.0) to find which line does it.")
    expect_close("context_vecs", context_vecs, expected_weights @ x,
                 hint="Row q of the context vectors is the weighted sum of the rows of x, with "
                      "row q of the weights.")
    long_vector = torch.tensor([[12.0, 0.0], [0.0, 0.1], [0.3, 0.2]])  # one long, two short
    context_vecs, attn_weights = call(fn, long_vector, prop="fixed_attention runs on a "
                                      "sequence with one long vector")
    expect_true(
        "a sequence with one long vector gives finite weights",
        bool(torch.isfinite(attn_weights).all()), expected="finite numbers",
        actual=attn_weights.tolist(),
        hint="The long vector's score with itself is 144; subtracting that one number from "
             "every score pushes the short tokens' rows so low that every exp underflows to 0. "
             "Shift each row by its own maximum.",
    )
    expect_close("the weights of a sequence with one long vector", attn_weights,
                 torch.softmax(long_vector @ long_vector.T, dim=-1),
                 hint="Shift each row of scores by that row's maximum before the exp.")
    passed("both bugs are fixed: no row underflows, and each query mixes the tokens with its "
           "own row of weights.")
