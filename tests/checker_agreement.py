"""A checker's "Correct" is full marks: every answer a checker accepts passes the hidden tests.

A learner reads the checker's verdict in the notebook; the grader runs the same check cell,
whose hidden tests decide the points. If the two disagree, a learner reads "Correct" and then
scores 0. The hook below (registered in ``tests/conftest.py``) makes that impossible for every
answer the book's checker tests try, in every exercise: while a test of
``tests/test_exercises_*.py`` runs, it notes each answer that a chapter's checker accepts;
when the test has passed, it runs the hidden tests of that exercise's check cell on each of
them (in this process, as ``hidden_tests.py`` does) and fails the test when one does not pass.

Each chapter's checker tests try the right answers and the typical and reviewed wrong ones,
so a checker that accepts a wrong answer the hidden tests reject fails here. Answers the
checker rejects are not graded by the hidden tests here: the visible ``assert check_...``
line of the same cell already scores them 0 (``checker_asserts.assert_rejected`` checks the
reviews' wrong answers against both).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass

import pytest
import torch
from hidden_tests import CHAPTERS, hidden_test_failure

from attention_book.exercises import feedback

_WATCHED_FILES = re.compile(r"(^|/)tests/test_exercises_[^/]*\.py$")


@dataclass(frozen=True)
class CheckCell:
    """A graded check cell: ``assert <checker>(<answer>)`` and its hidden tests."""

    notebook: str
    grade_id: str
    answer: str  # the name the hidden tests call the answer by


@functools.cache
def check_cells() -> dict[str, tuple[CheckCell, ...]]:
    """Every checker the chapters' check cells call, with the cells that call it."""
    cells: dict[str, list[CheckCell]] = {}
    for path in sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell["cell_type"] != "code" or not meta.get("grade"):
                continue
            visible = "".join(cell["source"]).split("### BEGIN HIDDEN TESTS")[0]
            for node in ast.walk(ast.parse(visible)):
                if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Call)
                        and isinstance(node.test.func, ast.Name)
                        and node.test.func.id.startswith("check_")
                        and len(node.test.args) == 1 and isinstance(node.test.args[0], ast.Name)):
                    cells.setdefault(node.test.func.id, []).append(
                        CheckCell(path.name, meta["grade_id"], node.test.args[0].id))
    return {name: tuple(found) for name, found in cells.items()}


def _checker_name(checker) -> str | None:
    module = getattr(checker, "__module__", "") or ""
    if not module.startswith("attention_book.exercises."):
        return None
    name = getattr(checker, "__name__", "")
    return name if name in check_cells() else None


def cells_of(name: str, module: str | None = None) -> tuple[CheckCell, ...]:
    """The check cells that call checker ``name``; with ``module`` (``...exercises.chNN``),
    only those of chapter NN, the chapter whose module defines the checker."""
    cells = check_cells().get(name, ())
    chapter = re.search(r"\.ch(\d\d)$", module or "")
    return tuple(cell for cell in cells if chapter is None or cell.notebook[:2] == chapter[1])


def disagreements(accepted: list[tuple[str, object]]) -> list[str]:
    """For each ``(checker name, answer)`` a checker accepted, why its hidden tests fail it.
    A name may carry its module, ``"attention_book.exercises.ch00.check_row_normalise"``."""
    problems = []
    for qualified, answer in accepted:
        module, _, name = qualified.rpartition(".")
        for cell in cells_of(name, module or None):
            with torch.random.fork_rng():  # hidden tests seed; the next test's draws stay its own
                failure = hidden_test_failure(cell.notebook, cell.grade_id,
                                              **{cell.answer: answer})
            if failure is not None:
                problems.append(f"{name} says Correct to {getattr(answer, '__name__', answer)!r}, "
                                f"but the hidden tests of {cell.notebook} {cell.grade_id} fail "
                                f"it: {failure}")
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Around each checker test: note what the checkers accept, then grade it with the hidden
    tests (only when the test itself passed)."""
    if not _WATCHED_FILES.search(item.nodeid.split("::")[0]):
        return (yield)
    accepted: list[tuple[str, object]] = []

    def watch(checker, args, kwargs, verdict):
        name = _checker_name(checker)
        if verdict and name is not None and len(args) == 1 and not kwargs:
            name = f"{checker.__module__}.{name}"
            if all(answer is not args[0] for seen, answer in accepted if seen == name):
                accepted.append((name, args[0]))

    feedback.WATCHERS.append(watch)
    try:
        result = yield
    finally:
        feedback.WATCHERS.remove(watch)
    problems = disagreements(accepted)
    if problems:
        raise AssertionError("a checker and the hidden tests of its exercise disagree:\n"
                             + "\n".join(problems))
    return result
