"""Checkers for chapter 0 (how this book works)."""

from __future__ import annotations

import torch

from ..attention import softmax
from .feedback import call, checker, expect_close, passed

__all__ = ["check_row_normalise"]


@checker
def check_row_normalise(fn) -> None:
    """Check ``fn(x)`` divides each row of a non-negative matrix by its sum.

    Taught in chapter 0 (the exercise format).
    """
    torch.manual_seed(0)
    x = torch.rand(4, 5) + 0.1
    expected = x / x.sum(dim=-1, keepdim=True)
    hint = (
        "divide x by x.sum(dim=-1, keepdim=True); keepdim keeps the shape (4, 1) so it broadcasts"
    )
    expect_close("the normalised matrix", call(fn, x), expected, hint=hint)
    scores = torch.log(x)
    expect_close("the normalised matrix exp(scores)", call(fn, torch.exp(scores)),
                 softmax(scores), hint=hint)
    passed("every row is divided by its own sum, so each row sums to 1.")
