"""Instructor-only text (solutions, hidden tests) that must never reach a student version.

Not taught in a chapter: the instructor guide uses it through ``make assignments``.
"""

from __future__ import annotations

from collections.abc import Iterable

from .format import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    END_HIDDEN,
    END_SOLUTION,
    STUBS,
    marker_region,
    nbgrader_metadata,
)


def _secret_lines(instructor) -> set[str]:
    """Lines that only the instructor may see: solutions and hidden tests."""
    secret, public = set(), set()
    for cell in instructor.cells:
        meta = nbgrader_metadata(cell) or {}
        source = cell.source
        if meta.get("solution") and BEGIN_SOLUTION not in source:
            inside, outside = source.splitlines(), []  # the whole cell is the answer
        else:
            inside, outside = marker_region(source, BEGIN_SOLUTION, END_SOLUTION)
        hidden, outside = marker_region("\n".join(outside), BEGIN_HIDDEN, END_HIDDEN)
        secret.update(line.strip() for line in inside + hidden)
        public.update(line.strip() for line in outside)
    return {line for line in secret - public - STUBS if line}


def _all_text_lines(notebook) -> Iterable[str]:
    for cell in notebook.cells:
        yield from cell.source.splitlines()
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            for value in output.get("data", {}).values():
                text += value if isinstance(value, str) else "\n".join(value) \
                    if isinstance(value, list) else ""
            yield from str(text).splitlines()


def leaked_solution_text(instructor, student) -> list[str]:
    """Return the instructor-only text that a student notebook still contains.

    Instructor-only lines are those between the solution or hidden-test markers (or the
    whole of a written-answer cell) that appear nowhere else in the instructor version.
    Markers left in the student version count as leaks too.

    Args:
        instructor: the chapter notebook (``nbformat``), solutions in.
        student: the generated student notebook.

    Returns:
        The leaked lines (empty when the student version is clean).
    """
    secret = _secret_lines(instructor)
    leaks = []
    for line in _all_text_lines(student):
        stripped = line.strip()
        if stripped in secret or any(marker in line for marker in
                                     (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)):
            leaks.append(stripped)
    return leaks
