"""Run the hidden tests of a chapter's check cell against an answer, as the grader does.

The grader runs a check cell's hidden tests with the learner's answer names bound; here they
run in this process, with the answers given as keyword arguments, so that a checker's tests
can show that a weak answer fails the hidden tests as well as the checker.
"""

from __future__ import annotations

import functools
import json
import traceback
from pathlib import Path

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def hidden_tests(notebook: str, grade_id: str) -> str:
    """The source between the hidden-test markers of the check cell ``grade_id``."""
    return _compiled(notebook, grade_id)[0]


@functools.cache
def _hidden_sources(notebook: str, mtime_ns: int) -> dict[str, str]:
    sources = {}
    for cell in json.loads((CHAPTERS / notebook).read_text())["cells"]:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        source = "".join(cell["source"])
        if grade_id and "### BEGIN HIDDEN TESTS" in source:
            sources[grade_id] = source.split("### BEGIN HIDDEN TESTS", 1)[1].split(
                "### END HIDDEN TESTS")[0]
    return sources


def _compiled(notebook: str, grade_id: str):
    """The hidden tests' source and code (each notebook read once while it is unchanged)."""
    sources = _hidden_sources(notebook, (CHAPTERS / notebook).stat().st_mtime_ns)
    if grade_id not in sources:
        raise KeyError(f"{notebook} has no cell {grade_id}")
    return sources[grade_id], _compile(sources[grade_id], f"{notebook}:{grade_id}")


@functools.cache
def _compile(source: str, filename: str):
    return compile(source, filename, "exec")


def hidden_test_failure(notebook: str, grade_id: str, **answers) -> str | None:
    """None when the hidden tests of ``grade_id`` pass with ``answers`` as the answer names,
    else what failed: the exception and the line of the hidden tests it came from.

    The same answers (the very objects) are graded once while the notebook is unchanged: the
    checker tests and the agreement hook (``checker_agreement.py``) ask again for the same
    right answers, and hidden tests are deterministic."""
    code = _compiled(notebook, grade_id)[1]
    try:
        key = (code, tuple(sorted(answers.items())))
        hash(key)
    except TypeError:  # an answer that cannot be a key (an unhashable object): grade it now
        return _failure(code, answers)
    if key not in _GRADED:
        _GRADED[key] = _failure(code, answers)
    return _GRADED[key]


# (hidden tests' code, answers) -> their failure; the key keeps each answer alive, so an id
# is never reused for another object while the entry exists.
_GRADED: dict[tuple, str | None] = {}


def _failure(code, answers: dict) -> str | None:
    try:
        exec(code, dict(answers))
    except Exception as error:  # noqa: BLE001 - the grader scores any failure as 0
        lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
                 if frame.filename == code.co_filename]
        where = f" (hidden tests, line {lines[-1]})" if lines else ""
        return f"{type(error).__name__}: {error}{where}"
    return None


def passes_hidden_tests(notebook: str, grade_id: str, **answers) -> bool:
    """True when the hidden tests of ``grade_id`` pass with ``answers`` as the answer names."""
    return hidden_test_failure(notebook, grade_id, **answers) is None
