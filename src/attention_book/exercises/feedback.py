"""Feedback helpers shared by every chapter's checkers.

A public checker is a function decorated with :func:`checker`. Inside it, the helpers below
stop at the first property that fails by raising :class:`ExerciseFailure`; the decorator
turns that into one printed report (the property, expected vs actual, a hint) and returns
``False``, or prints ``Correct: …`` and returns ``True``. A check cell asserts the result::

    from attention_book.exercises import check_row_normalise

    assert check_row_normalise(row_normalise)

so the learner reads each message once, above a one-line ``AssertionError`` from their own
cell, never a traceback through this package; and nbgrader marks a failed check as failed.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "ExerciseFailure", "checker", "fail", "passed", "expect_shape", "expect_close",
    "expect_true", "expect_int", "call", "hand_over", "HAND_OVER",
]


class ExerciseFailure(AssertionError):
    """An exercise answer broke a property; the message says which and how to fix it."""


def checker(check: Callable) -> Callable:
    """Make ``check`` print its feedback once and return ``True`` (right) or ``False``.

    Args:
        check: a function that raises :class:`ExerciseFailure` at the first broken property
            and calls :func:`passed` at the end.

    Returns:
        The wrapped checker, with the same name and docstring.
    """

    @functools.wraps(check)
    def run(*args, **kwargs) -> bool:
        try:
            check(*args, **kwargs)
        except ExerciseFailure as failure:
            print(failure)
            return False
        except Exception as error:  # noqa: BLE001 - an odd answer must not crash the checker
            print(f"Not yet. The checker could not use your answer: "
                  f"{type(error).__name__}: {error}\n"
                  "  hint:     return what the exercise asks for (a tensor of the given shape, "
                  "or the pair it names)")
            return False
        return True

    return run


def fail(prop: str, *, expected: object, actual: object, hint: str) -> None:
    """Stop the check: ``prop`` (a statement that should hold) does not, with a hint."""
    raise ExerciseFailure(
        f"Not yet. The check that failed: {prop}.\n"
        f"  expected: {expected}\n"
        f"  actual:   {actual}\n"
        f"  hint:     {hint}"
    )


def passed(what: str) -> None:
    """Print the one-line success message of a checker."""
    print(f"Correct: {what}")


def call(fn: Callable, *args, prop: str = "your function runs without an error", **kwargs):
    """Call the learner's ``fn``; an exception becomes feedback, not a bare traceback."""
    if not callable(fn):
        fail("the answer is a function", expected="a function", actual=type(fn).__name__,
             hint="pass the function itself, without calling it")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        name = getattr(fn, "__name__", "your function")
        raise ExerciseFailure(
            f"Not yet. You have not written `{name}` yet: replace `raise NotImplementedError()` "
            "in its answer cell with your code, run that cell, then run this check again."
        ) from None
    except Exception as error:  # noqa: BLE001 - any error in learner code becomes feedback
        fail(prop, expected="no error", actual=f"{type(error).__name__}: {error}",
             hint="Run your function on a small input in a cell of its own and read the "
                  "error message.")


def expect_true(prop: str, condition: bool, *, expected: object, actual: object, hint: str) -> None:
    """Fail with feedback unless ``condition`` holds."""
    if not condition:
        fail(prop, expected=expected, actual=actual, hint=hint)


def expect_int(name: str, value: object, hint: str) -> None:
    """Fail unless ``value`` is an integer (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(f"{name} is an int", expected="an int", actual=type(value).__name__, hint=hint)


def expect_shape(name: str, tensor: object, shape: Sequence[int], *, hint: str) -> None:
    """Fail unless ``tensor`` is a tensor of exactly ``shape``."""
    if not isinstance(tensor, torch.Tensor):
        fail(f"a tensor comes back for {name}", expected=f"a torch.Tensor of shape {tuple(shape)}",
             actual=type(tensor).__name__, hint=hint)
    if tuple(tensor.shape) != tuple(shape):
        fail(f"the shape of {name} is {tuple(shape)}", expected=tuple(shape),
             actual=tuple(tensor.shape), hint=hint)


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
    actual = actual.detach().to(dtype=expected.dtype, device=expected.device)
    if torch.isnan(actual).any():
        where = tuple(torch.nonzero(torch.isnan(actual))[0].tolist())
        fail(f"there is no NaN in {name}", expected="finite values",
             actual=f"NaN, for example at index {where}", hint=hint)
    if not torch.allclose(actual, expected, atol=atol, rtol=rtol):
        gap = (actual - expected).abs()
        where = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
        fail(f"the values of {name} match the reference", expected=(
                 f"{expected[where].item():.4g} at index {where} (and every value within "
                 f"{atol:g} of the reference)"),
             actual=f"{actual[where].item():.4g} at index {where}", hint=hint)


#: While the book grades in a clean process, the grader puts here the function that builds an
#: object in the answer's sandbox (see :func:`hand_over`); in a notebook it stays empty.
HAND_OVER: list[Callable] = []


def hand_over(obj):
    """``obj`` as the answer will hold it, for a check that reads back what the answer did.

    In a notebook this is ``obj`` itself. While the book grades, the grading process lends
    none of its own objects to an answer: an object a check passes to the answer is rebuilt
    in the answer's sandbox from a description, so what the answer does to it never reaches
    the check's own ``obj``. Pass ``hand_over(obj)`` instead when the check must see the
    result (the weights the answer loaded, the tokens it appended): it builds that copy once
    and returns a handle whose attributes and methods give back data.

    Args:
        obj: an object of the book or of PyTorch (a module, a cache), or a test double.

    Returns:
        ``obj``, or the handle of its copy in the answer's sandbox.

    Taught in the instructor guide (how exercises are graded).
    """
    return HAND_OVER[-1](obj) if HAND_OVER else obj
