"""Feedback helpers shared by every chapter's checkers.

A public checker is a function decorated with :func:`checker`. Inside it, the helpers below
stop at the first property that fails by raising :class:`ExerciseFailure`; the decorator
turns that into one printed report (the property, expected vs actual, a hint) and returns
``False``, or prints ``Correct: …`` and returns ``True``. A check cell asserts the result::

    from attention_book.exercises import check_row_normalise

    assert check_row_normalise(row_normalise)

so the learner reads each message once, above a one-line ``AssertionError`` from their own
cell, never a traceback through this package; and nbgrader marks a failed check as failed.

**Predictions keep their answer back.** An exercise that asks the learner to predict a value
before running anything ("on paper", "by hand") is checked by a checker decorated with
``@checker(reveal=False)``. Its failures still name the property that failed, show what the
learner gave and give a hint, but the expected value is replaced by :data:`KEPT_BACK`; only
the success message, once the prediction is right, states the value. Structural
properties (the answer is a function, returns a tensor of the shape the exercise names, runs
without an error) are shown as usual: they are part of the question, not of its answer.
"""

from __future__ import annotations

import contextvars
import functools
import numbers
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "ExerciseFailure", "checker", "fail", "passed", "expect_shape", "expect_close",
    "expect_true", "expect_int", "call", "on_cpu", "number_from_config", "KEPT_BACK",
    "hand_over", "HAND_OVER", "WATCHERS", "in_private_order", "call_in_private_order",
    "Outcome",
]

#: What a prediction's checker shows instead of the expected value while the answer is wrong.
KEPT_BACK = ("kept back, since this exercise asks for your own prediction: work it out again "
             "with the hint; the value is shown once yours is right")

# False while a checker of a prediction runs (``@checker(reveal=False)``).
_REVEAL = contextvars.ContextVar("attention_book_exercises_reveal", default=True)


class ExerciseFailure(AssertionError):
    """An exercise answer broke a property; the message says which and how to fix it."""


def checker(check: Callable | None = None, *, reveal: bool = True) -> Callable:
    """Make ``check`` print its feedback once and return ``True`` (right) or ``False``.

    Used bare, ``@checker``, or for a prediction exercise as ``@checker(reveal=False)``.

    Args:
        check: a function that raises :class:`ExerciseFailure` at the first broken property
            and calls :func:`passed` at the end.
        reveal: False for a prediction: while ``check`` runs, a failure shows
            :data:`KEPT_BACK` instead of the expected value (see :func:`fail`).

    Returns:
        The wrapped checker, with the same name and docstring and a ``reveal`` attribute
        equal to ``reveal`` (or, called with ``reveal`` only, a decorator that makes one).
    """
    if check is None:
        return functools.partial(checker, reveal=reveal)

    @functools.wraps(check)
    def run(*args, **kwargs) -> bool:
        mode = _REVEAL.set(reveal)
        try:
            check(*args, **kwargs)
            verdict = True
        except ExerciseFailure as failure:
            print(failure)
            verdict = False
        except Exception as error:  # noqa: BLE001 - an odd answer must not crash the checker
            print(f"Not yet. The checker could not use your answer: "
                  f"{type(error).__name__}: {error}\n"
                  "  hint:     return what the exercise asks for (a tensor of the given shape, "
                  "or the pair it names)")
            verdict = False
        finally:
            _REVEAL.reset(mode)
        for watch in tuple(WATCHERS):
            watch(run, args, kwargs, verdict)
        return verdict

    run.reveal = reveal  # read by the tests: every prediction's checker keeps its answer back
    return run


#: Functions called after every checker with ``(checker, args, kwargs, verdict)``. Empty in a
#: notebook; the book's tests add one that grades each answer a checker calls right with the
#: exercise's hidden tests too (``tests/checker_agreement.py``).
WATCHERS: list[Callable] = []


def fail(prop: str, *, expected: object, actual: object, hint: str,
         reveal: bool | None = None) -> None:
    """Stop the check: ``prop`` (a statement that should hold) does not, with a hint.

    Args:
        prop: the property that failed, as a statement.
        expected: what the property needs.
        actual: what the answer gave.
        hint: how to fix it, without the answer.
        reveal: whether to show ``expected``; None (the default) follows the checker
            (``@checker(reveal=False)`` keeps it back), True always shows it (a structural
            property, such as a shape the exercise names).
    """
    if not (_REVEAL.get() if reveal is None else reveal):
        expected = KEPT_BACK
    raise ExerciseFailure(
        f"Not yet. The check that failed: {prop}.\n"
        f"  expected: {_readable(expected)}\n"
        f"  actual:   {_readable(actual)}\n"
        f"  hint:     {hint}"
    )


def _readable(value: object) -> object:
    """Floats inside a list or tuple to 4 significant digits, as the book prints numbers."""
    if isinstance(value, (list, tuple)):
        return type(value)(float(f"{item:.4g}") if isinstance(item, float) else _readable(item)
                           for item in value)
    return value


def passed(what: str) -> None:
    """Print the one-line success message of a checker."""
    print(f"Correct: {what}")


def on_cpu(value):
    """``value`` with every tensor in it (nested in tuples, lists and dicts) on the CPU.

    The checkers build their inputs and references on the CPU, while an answer may compute
    wherever it likes (a GPU on Colab): what it returns is compared where the references are.
    A tensor already on the CPU comes back as it is, the same object.

    Args:
        value: what an answer returned.

    Returns:
        The same structure, its tensors on the CPU.

    Taught in the instructor guide (how exercises are graded).
    """
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (list, tuple)):
        items = [on_cpu(item) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value  # nothing moved: the very object, whatever its type
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, dict):
        items = {key: on_cpu(item) for key, item in value.items()}
        return value if all(items[key] is value[key] for key in value) else items
    return value


def call(fn: Callable, *args, prop: str = "your function runs without an error", **kwargs):
    """Call the learner's ``fn``; an exception becomes feedback, not a bare traceback.

    What ``fn`` returns comes back with its tensors on the CPU (:func:`on_cpu`), where the
    checker's references are, whatever device the answer computed on."""
    if not callable(fn):
        fail("the answer is a function", expected="a function", actual=type(fn).__name__,
             hint="pass the function itself, without calling it", reveal=True)
    try:
        return on_cpu(fn(*args, **kwargs))
    except NotImplementedError:
        name = getattr(fn, "__name__", "your function")
        raise ExerciseFailure(
            f"Not yet. You have not written `{name}` yet: replace `raise NotImplementedError()` "
            "in its answer cell with your code, run that cell, then run this check again."
        ) from None
    except Exception as error:  # noqa: BLE001 - any error in learner code becomes feedback
        fail(prop, expected="no error", actual=f"{type(error).__name__}: {error}",
             hint="Run your function on a small input in a cell of its own and read the "
                  "error message.", reveal=True)


def number_from_config(fn: Callable, config: dict, *args, name: str, config_name: str,
                       key_hints: dict[str, str], returns: str) -> float:
    """Run the learner's ``fn(config, *args)`` on a copy of a model's config; return a float.

    A missing key becomes the hint ``key_hints`` gives for it; any other error, and a result
    that is no number, become feedback naming the function ``name`` and ``config_name``
    (e.g. "the Llama 3 config").
    """
    try:
        result = fn(dict(config), *args)
    except KeyError as error:
        key = str(error).strip("'\"")
        fail(f"{name} reads {config_name}", expected="no error", actual=f"KeyError: {error}",
             hint=key_hints.get(key, "not every config has every key: use config.get(key) "
                                     "for the optional ones"))
    except ExerciseFailure:
        raise
    except Exception as error:  # noqa: BLE001 - the learner's code becomes feedback
        fail(f"{name} runs on {config_name}", expected="no error",
             actual=f"{type(error).__name__}: {error}",
             hint="Run your function on this config in a cell of its own and read the "
                  "error message.")
    try:
        return float(result)
    except (TypeError, ValueError):
        fail(f"{name} returns a number ({config_name})", expected="a number of bytes",
             actual=type(result).__name__, hint=returns)


def expect_true(prop: str, condition: bool, *, expected: object, actual: object, hint: str,
                reveal: bool | None = None) -> None:
    """Fail with feedback unless ``condition`` holds (``reveal``: as in :func:`fail`)."""
    if not condition:
        fail(prop, expected=expected, actual=actual, hint=hint, reveal=reveal)


def expect_int(name: str, value: object, hint: str) -> None:
    """Fail unless ``value`` is an integer (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(f"{name} is an int", expected="an int", actual=type(value).__name__, hint=hint,
             reveal=True)


def expect_shape(name: str, tensor: object, shape: Sequence[int], *, hint: str) -> None:
    """Fail unless ``tensor`` is a tensor of exactly ``shape``."""
    if not isinstance(tensor, torch.Tensor):
        fail(f"a tensor comes back for {name}", expected=f"a torch.Tensor of shape {tuple(shape)}",
             actual=type(tensor).__name__, hint=hint, reveal=True)
    if tuple(tensor.shape) != tuple(shape):
        fail(f"the shape of {name} is {tuple(shape)}", expected=tuple(shape),
             actual=tuple(tensor.shape), hint=hint, reveal=True)


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


def in_private_order(items) -> list:
    """``items`` in an order drawn from the operating system's generator, for each call anew.

    A property test's checker hands the learner's test its healthy and broken subjects in this
    order (through :func:`call_in_private_order`), so that no answer can tell them apart by
    counting calls: not the published order of the checker, and not torch's generator either,
    whose state the grader sends to an answer with every call. Report the verdicts in a fixed
    order afterwards, so the feedback stays the same from one run to the next.

    Args:
        items: what to hand over, e.g. ``(name, subject)`` pairs.

    Returns:
        A new list of the same items.

    Taught in the instructor guide (how exercises are graded).
    """
    import random

    items = list(items)
    return random.SystemRandom().sample(items, len(items))


class Outcome:
    """What one call of the learner's function gave: its result, or the failure it raised."""

    __slots__ = ("_result", "_failure")

    def __init__(self, result: object = None, failure: Exception | None = None):
        self._result, self._failure = result, failure

    def get(self) -> object:
        """The call's result; a call that failed raises its failure here, at its turn."""
        if self._failure is not None:
            raise self._failure
        return self._result


def call_in_private_order(calls: Sequence[Callable[[], object]]) -> list[Outcome]:
    """Make each of ``calls`` once, in a private order; their outcomes in the order given.

    A property test's checker calls the learner's test on every subject first, through this,
    then judges the outcomes in its fixed order: ``outcome.get()`` gives a result or raises
    the failure of that call (from :func:`call`), so the feedback is the same whatever the
    order was. The order comes from :func:`in_private_order`, so counting calls tells an
    answer nothing, and every call starts from the same state of torch's generator, so a
    test that draws inputs without a seed of its own gets the same verdict in any order, and
    the generator ends as it began.

    Args:
        calls: functions without arguments, each calling the learner's function on one
            subject (e.g. ``functools.partial(call, fn, subject)``).

    Returns:
        One :class:`Outcome` per call, in the order of ``calls``.

    Taught in the instructor guide (how exercises are graded).
    """
    outcomes: dict[int, Outcome] = {}
    state = torch.random.get_rng_state()
    try:
        for index in in_private_order(range(len(calls))):
            torch.random.set_rng_state(state)
            try:
                outcomes[index] = Outcome(calls[index]())
            except Exception as failure:  # noqa: BLE001 - raised again at its turn by .get()
                outcomes[index] = Outcome(failure=failure)
    finally:
        torch.random.set_rng_state(state)
    return [outcomes[index] for index in range(len(calls))]
