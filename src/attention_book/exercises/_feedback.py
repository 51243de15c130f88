"""Feedback helpers shared by every chapter's checkers.

A checker prints a short, actionable report and raises ``AssertionError``
when an answer is wrong, so that a learner sees *which* property failed, what
was expected and what came out, plus a hint; and so that nbgrader's
autograder marks the cell as failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "ExerciseFailure", "fail", "passed", "expect_shape", "expect_close", "expect_true", "call",
]


class ExerciseFailure(AssertionError):
    """An exercise answer broke a property; the message says which and how."""


def fail(prop: str, *, expected: object, actual: object, hint: str) -> None:
    """Print and raise a failure naming the property, expected vs actual, and a hint."""
    message = (
        f"Not yet: {prop}\n"
        f"  expected: {expected}\n"
        f"  actual:   {actual}\n"
        f"  hint:     {hint}"
    )
    print(message)
    raise ExerciseFailure(message)


def passed(what: str) -> None:
    """Print the one-line success message of a checker."""
    print(f"Correct: {what}")


def call(fn: Callable, *args, prop: str = "your function runs", **kwargs):
    """Call the learner's ``fn``; an exception becomes feedback, not a bare traceback."""
    if not callable(fn):
        fail(prop, expected="a function", actual=type(fn).__name__,
             hint="pass the function itself, without calling it")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - any error in learner code becomes feedback
        fail(prop, expected="no error", actual=f"{type(error).__name__}: {error}",
             hint="run your function on a small input in a cell of its own and read the error")


def expect_true(prop: str, condition: bool, *, expected: object, actual: object, hint: str) -> None:
    """Fail with feedback unless ``condition`` holds."""
    if not condition:
        fail(prop, expected=expected, actual=actual, hint=hint)


def expect_shape(name: str, tensor: object, shape: Sequence[int], *, hint: str) -> None:
    """Fail unless ``tensor`` is a tensor of exactly ``shape``."""
    if not isinstance(tensor, torch.Tensor):
        fail(f"{name} is a tensor", expected=f"a torch.Tensor of shape {tuple(shape)}",
             actual=type(tensor).__name__, hint=hint)
    if tuple(tensor.shape) != tuple(shape):
        fail(f"{name} has the right shape", expected=tuple(shape), actual=tuple(tensor.shape),
             hint=hint)


def expect_close(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    hint: str,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Fail unless ``actual`` has ``expected``'s shape and values (within tolerance)."""
    expect_shape(name, actual, expected.shape, hint=hint)
    actual = actual.detach().to(expected.dtype)
    if torch.isnan(actual).any():
        fail(f"{name} has no NaN", expected="finite values", actual="NaN at some positions",
             hint=hint)
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        worst = (actual - expected).abs().max().item()
        fail(f"{name} has the right values",
             expected=f"values within atol={atol} of the reference",
             actual=f"largest difference {worst:.4g}", hint=hint)
