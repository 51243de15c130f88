"""Checkers for chapter 0 (how this book works).

Exercise 0.1 normalises rows (the mechanics of an exercise), 0.2 predicts shapes before
running anything (the shape comments), 0.3 is a test of the learner's own that must accept
healthy attention weights, rounding and all, and reject broken ones (the checks and the floats
of the chapter).
"""

from __future__ import annotations

import numbers
from functools import partial

import torch

from ..attention import softmax
from .feedback import (
    Outcome,
    call,
    call_in_private_order,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = ["check_row_normalise", "check_predicted_shapes", "check_weight_matrix_test"]


# --------------------------------------------------------------------------- 0.1 row_normalise

_ROW_HINT = ("Sum along the last dim (dim=-1), one sum per row, and keep that dim as size 1 "
             "(keepdim=True), so that each row's sum lines up with the whole of its row.")


def _row_mistakes(x: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """What the usual slips give on ``x``, with the hint for each."""
    mistakes = [
        (x / x.sum(dim=0, keepdim=True),
         "Every column of your result sums to 1, not every row: dim=0 runs down the columns. "
         "The rows are along the last dim, dim=-1."),
        (x / x.sum(),
         "You divided by the sum of the whole matrix, so the matrix sums to 1 but its rows "
         "do not. Each row needs its own sum."),
        (x / x.amax(dim=-1, keepdim=True),
         "You divided each row by its largest entry, which makes the largest entry 1; the "
         "exercise asks for rows that sum to 1."),
        (softmax(x),
         "That is the softmax: it exponentiates first. The exercise is only its last step: "
         "divide the numbers as they are."),
    ]
    if (x.sum(dim=-1) < 1).any():  # rows that must grow
        mistakes.append((
            x / x.sum(dim=-1, keepdim=True).clamp(min=1),
            "Rows whose sum is below 1 must grow: divide every row by its own sum, whatever "
            "its size. A clamp (or max(sum, 1)) leaves those rows as they were."))
    if x.size(-1) == x.size(-2):  # a square matrix: the sum without keepdim still broadcasts
        mistakes.append((
            x / x.sum(dim=-1),
            "You divided column j by the sum of row j. Without keepdim=True, x.sum(dim=-1) has "
            "shape (T,), and broadcasting lines a shape (T,) up with the *last* dim, the "
            "columns. keepdim=True keeps shape (T, 1), one sum per row, which divides each row "
            "by its own sum."))
    return mistakes


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(value, 4) for value in values.detach().tolist()]


@checker
def check_row_normalise(fn) -> None:
    """Check ``fn(x)`` divides each row of a matrix of positive numbers by the row's sum.

    A square matrix comes first, where the usual slip (summing without ``keepdim``) runs
    without an error and gives wrong values, so its hint can name it; then a (4, 5) matrix,
    and a (3, 5) matrix of small numbers whose rows sum to less than 1.

    Args:
        fn: the learner's ``row_normalise``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 0 (the exercise format).
    """
    torch.manual_seed(0)
    for x in (torch.rand(4, 4) * 5 + 0.5, torch.rand(4, 5) + 0.1, torch.rand(3, 5) * 0.1 + 0.01):
        label = f"the normalised {tuple(x.shape)} matrix"
        out = call(fn, x.clone(), prop=f"row_normalise runs on a {tuple(x.shape)} matrix")
        expect_shape(label, out, x.shape,
                     hint="Return a tensor of the same shape as x: one weight per entry.")
        expected = x / x.sum(dim=-1, keepdim=True)
        if not torch.allclose(out.detach().to(x.dtype), expected, atol=1e-5, rtol=1e-4):
            for wrong, hint in _row_mistakes(x):
                if torch.allclose(out.detach().to(x.dtype), wrong, atol=1e-5, rtol=1e-4):
                    fail(f"each row of {label} is divided by its own sum",
                         expected=f"row 0 = {_rounded(expected[0])}, and every row sums to 1",
                         actual=f"row 0 = {_rounded(out[0])}, rows summing to "
                                f"{_rounded(out.sum(dim=-1))}", hint=hint)
        expect_close(label, out, expected, hint=_ROW_HINT)
    passed("every row is divided by its own sum, so each row sums to 1.")


# --------------------------------------------------------------------------- 0.2 shapes

#: The shapes of exercise 0.2's tensors, for ``x = torch.zeros(3, 5, 4)``.
_SHAPES = {"last": (3, 4), "scores": (3, 5, 5), "totals": (3, 4), "row_sums": (3, 5, 1)}

_SHAPE_HINTS = {
    "last": {
        (3, 1, 4): "An integer index such as -1 removes its axis; only a slice (-1:) would "
                   "keep it, with size 1.",
        (3, 5): "x[:, -1, :] indexes the middle axis, T: the first ':' keeps the batch axis "
                "and the last ':' keeps d_in.",
        (4,): "The first ':' keeps the whole batch axis: one row per sequence of the batch.",
        (5, 4): "-1 picks the last token of every sequence, not the last sequence.",
    },
    "scores": {
        (3, 4, 4): "a @ b joins the last axis of a with the second-to-last of b; here "
                   "(T, d_in) @ (d_in, T) for each sequence of the batch.",
        (5, 5): "The @ operator works on the last two axes and keeps the leading ones: the "
                "batch axis stays.",
        (3, 5, 4): "transpose(-2, -1) swaps the last two axes, so the product is "
                   "(T, d_in) @ (d_in, T): one score for every pair of tokens.",
    },
    "totals": {
        (3, 5): "Axes count from 0: dim=1 is T, the middle axis of (B, T, d_in). Summing "
                "removes that axis.",
        (3, 1, 4): "Without keepdim=True the summed axis disappears.",
        (5, 4): "dim=1 is the second axis, T; dim=0 would be the batch.",
    },
    "row_sums": {
        (3, 5): "keepdim=True keeps the summed axis, with size 1.",
        (3, 1, 5): "dim=-1 is the last axis: each row of a sequence's (T, T) scores gets one "
                   "sum.",
        (3, 5, 4): "scores is not x: look again at the shape you found for scores.",
    },
}


def _as_shape(value: object) -> tuple[int, ...] | None:
    if isinstance(value, (tuple, list, torch.Size)) and all(
            isinstance(size, numbers.Integral) and not isinstance(size, bool) for size in value):
        return tuple(int(size) for size in value)
    return None


@checker(reveal=False)  # a prediction: the expected shapes are kept back
def check_predicted_shapes(fn) -> None:
    """Check ``fn()``, the predicted shapes of the four tensors of exercise 0.2.

    ``fn()`` returns a dict with the keys ``"last"``, ``"scores"``, ``"totals"`` and
    ``"row_sums"``, each a tuple of ints. A wrong shape gets the property that failed, the
    learner's shape and a hint for the usual slip, never the right shape.

    Args:
        fn: the learner's ``predicted_shapes``.

    Returns:
        True when all four shapes are right (the decorator prints the feedback).

    Taught in chapter 0 (shape comments).
    """
    answer = call(fn, prop="predicted_shapes() runs without an error")
    expect_true("predicted_shapes returns a dict with the keys last, scores, totals, row_sums",
                isinstance(answer, dict) and set(answer) == set(_SHAPES),
                expected="{'last': (...), 'scores': (...), 'totals': (...), 'row_sums': (...)}",
                actual=repr(answer)[:80] if isinstance(answer, dict) else type(answer).__name__,
                hint="Return a dict with exactly these four keys, each a tuple of whole numbers.",
                reveal=True)
    for name, right in _SHAPES.items():
        shape = _as_shape(answer[name])
        expect_true(f"the prediction for {name} is a tuple of whole numbers", shape is not None,
                    expected="a tuple such as (2, 7)", actual=repr(answer[name])[:60],
                    hint="Write each shape as a tuple of ints, as torch prints it.", reveal=True)
        if shape != right:
            fail(f"the shape of {name}", expected="another shape", actual=shape,
                 hint=_SHAPE_HINTS[name].get(
                     shape, "Go through the line axis by axis, as the chapter's shape comments "
                            "do: (B, T, d_in) is (3, 5, 4)."))
    passed("last (3, 4), scores (3, 5, 5), totals (3, 4), row_sums (3, 5, 1). Now run the "
           "code and compare: a shape comment is a prediction that an assert can check.")


# --------------------------------------------------------------------------- 0.3 weight test


def _healthy_weights() -> list[tuple[str, torch.Tensor]]:
    """Attention weights a good test accepts, each with what it is."""
    torch.manual_seed(3)
    batch = torch.softmax(torch.randn(2, 4, 6), dim=-1)  # (B, T, T_k), float32
    # The lesson of the chapter: float32 rows sum to 1 only up to rounding. Whether a softmax
    # row sums to exactly 1 depends on the order of the additions, so one row is set to
    # weights whose sum is 1 + 2**-22 in any order (both are float32 numbers, and so is 1 +
    # 2**-22): what rounding leaves, which a test with == 1 rejects.
    batch[1, 2] = torch.tensor([0.5, 0.5 + 2**-22, 0.0, 0.0, 0.0, 0.0])
    causal = torch.softmax(torch.randn(5, 5).masked_fill(
        torch.ones(5, 5, dtype=torch.bool).triu(diagonal=1), float("-inf")), dim=-1)  # (T, T)
    return [
        ("softmax weights of a batch, (2, 4, 6) in float32, whose rows sum to 1 only up to "
         "rounding", batch),
        ("causal weights, (5, 5), with zeros above the diagonal", causal),
        ("one-hot rows, (3, 4): each query takes one key", torch.eye(3, 4)),
        ("a single row of weights, (1, 3), in float64",
         torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)),
    ]


def _broken_weights() -> list[tuple[str, torch.Tensor, str]]:
    """Matrices a good test rejects: what each is, the matrix, the hint when it is accepted."""
    torch.manual_seed(4)
    scores = torch.rand(3, 4) + 0.1
    columns = scores / scores.sum(dim=0, keepdim=True)  # (3, 4): columns sum to 1, rows do not
    last_row_off = torch.softmax(torch.randn(2, 3, 4), dim=-1)  # (B, T, T_k)
    last_row_off[-1, -1] = torch.tensor([0.4, 0.3, 0.2, 0.2])  # the very last row sums to 1.1
    # Two rows off by +0.1 and -0.1 (in float64, so that each sum is exact enough to tell):
    # their sums average 1, and the whole (2, 2, 3) tensor sums to its number of rows, 4.
    averaged = torch.tensor([[[0.2, 0.3, 0.5], [0.5, 0.4, 0.2]],
                             [[0.1, 0.2, 0.6], [0.3, 0.3, 0.4]]], dtype=torch.float64)
    return [
        ("a row that sums to 0.999, as a masked softmax that forgot to renormalise gives",
         torch.tensor([[0.5, 0.5, 0.0], [0.6, 0.3, 0.099]]),
         "Your tolerance is too loose for float32: its rounding moves a row sum by about "
         "1e-7, so a row that misses 1 by 1e-3 is a bug, not rounding. Use a tolerance near "
         "1e-5 (torch.allclose's default rtol is 1e-5)."),
        ("a negative weight in a row that sums to 1, with no entry above 1: [0.75, 0.5, -0.25]",
         torch.tensor([[0.75, 0.5, -0.25], [0.0, 1.0, 0.0]]),
         "A weight is a share of attention: check that every entry is at least 0, not only "
         "the sums (an upper bound of 1 does not rule out a negative entry)."),
        ("two rows that sum to 1.1 and 0.9, (2, 2, 3) in float64: the row sums average 1 and "
         "the whole tensor sums to its number of rows", averaged,
         "Check each row's sum on its own, with .all() over the comparisons: an average of the "
         "row sums, or the total of the whole tensor, lets a row of 1.1 and a row of 0.9 "
         "cancel."),
        ("weights whose columns sum to 1 but whose rows do not, (3, 4)", columns,
         "Each row belongs to one query: sum along the last dim (dim=-1), not down the "
         "columns."),
        ("a row of NaN, what a softmax over a fully masked row gives",
         torch.tensor([[1.0, 0.0], [float("nan"), float("nan")]]),
         "Every comparison with NaN is False, so a test written as 'no sum is far from 1' "
         "lets NaN through. Ask for what must hold (each sum close to 1, each entry >= 0), "
         "and check with .all()."),
        ("a batch whose very last row sums to 1.1, (2, 3, 4)", last_row_off,
         "Check every row of every matrix in the batch: reduce over all of them with .all(), "
         "not only the first matrix or the first row."),
    ]


def _verdict(outcome: Outcome) -> bool:
    result = outcome.get()
    if isinstance(result, torch.Tensor) and result.numel() == 1 and result.dtype == torch.bool:
        result = bool(result)
    expect_true("is_weight_matrix returns True or False", isinstance(result, bool),
                expected="a bool (a one-element bool tensor will do)",
                actual=repr(result)[:60] if isinstance(result, torch.Tensor) else type(result).__name__,
                hint="Combine the checks of every row into one answer, e.g. with .all(), and "
                     "return it.")
    return result


@checker
def check_weight_matrix_test(fn) -> None:
    """Check ``fn(w)``, a test that rows of ``w`` are attention weights, on healthy and broken ``w``.

    Each healthy matrix (float32 softmax rows that sum to 1 only up to rounding, causal zeros,
    one-hot rows, float64) must give True; each broken one (a row off by 1e-3, a negative
    weight, two rows off by +0.1 and -0.1, columns instead of rows, NaN, a bad row at the end
    of a batch) must give False.

    Args:
        fn: the learner's ``is_weight_matrix``.

    Returns:
        True when the test accepts every healthy and rejects every broken matrix (the
        decorator prints the feedback).

    Taught in chapter 0 (checks, and floats that sum to 1 only up to rounding).
    """
    healthy, broken = _healthy_weights(), _broken_weights()
    outcomes = call_in_private_order([
        partial(call, fn, weights.clone(), prop=f"is_weight_matrix runs on {what}")
        for what, weights, *_ in healthy + broken])
    for (what, weights), outcome in zip(healthy, outcomes[:len(healthy)], strict=True):
        expect_true(f"your test accepts {what}", _verdict(outcome),
                    expected=True, actual=False, hint=(
                        "Healthy weights may miss 1 by float32 rounding (about 1e-7), and "
                        "may hold zeros. Compare each row's sum with 1 within a tolerance, "
                        "never with ==, and allow entries equal to 0."
                        if weights.dtype == torch.float32 else
                        "Check the rows along the last dim, whatever the number of leading "
                        "dims, and allow entries equal to 0."))
    for (what, _, hint), outcome in zip(broken, outcomes[len(healthy):], strict=True):
        expect_true(f"your test rejects {what}", not _verdict(outcome),
                    expected=False, actual=True, hint=hint)
    passed("your test accepts float32 weights that sum to 1 only up to rounding, and rejects "
           "a row off by 1e-3, a negative weight, rows that are off in opposite directions, "
           "columns for rows, NaN and a bad row hidden at the end of a batch.")
