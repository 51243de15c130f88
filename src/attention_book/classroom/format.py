"""The exercise format of the book's chapters, checked without running nbgrader.

Every chapter notebook is the *instructor* version of an nbgrader assignment; this module
finds the chapters and lists every way their exercises break the format of
``CONTRIBUTING.md`` (:func:`exercise_format_problems`).

Not taught in a chapter: chapter 0 shows the exercise format.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
# What nbgrader puts in place of a solution (its defaults, which the course config keeps).
STUBS = frozenset({"# YOUR CODE HERE", "raise NotImplementedError()", "YOUR ANSWER HERE"})

MIN_EXERCISES, MAX_EXERCISES = 3, 6  # graded exercises per chapter (chapter 0 is exempt)
ROUND_POINTS = 5  # a chapter's points add up to a multiple of this (chapter 0 is exempt)

_PROMPT = re.compile(
    r"Exercise\s+(?P<chapter>\d+)\.(?P<number>\d+)\b[^\n]*\((?P<points>\d+)\s+points?\)"
)
_GRADE_ID = re.compile(r"^ch(?P<chapter>\d{2})-ex(?P<number>\d+)-[a-z0-9-]+$")
_CHECKER_CALL = re.compile(r"\b(check_\w+)\s*\(")



# --------------------------------------------------------------------------- chapters


def find_chapters(root: str | os.PathLike = ".") -> list[Path]:
    """Return every chapter notebook ``root/chapters/NN_*.ipynb``, sorted by number.

    Args:
        root: the repository root.

    Returns:
        The notebook paths; chapters are discovered, never listed by hand.
    """
    chapters = sorted(Path(root, "chapters").glob("[0-9][0-9]_*.ipynb"))
    return [path for path in chapters if ".ipynb_checkpoints" not in path.parts]


def chapter_number(path: str | os.PathLike) -> int:
    """Return the chapter number of ``chapters/NN_name.ipynb`` (the two leading digits)."""
    name = Path(path).name
    if not re.match(r"^\d{2}_", name):
        raise ValueError(f"chapter file names start with two digits and '_', got {name!r}")
    return int(name[:2])


def _nbgrader(cell) -> dict | None:
    return cell.get("metadata", {}).get("nbgrader")


def _marker_region(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """Split ``source`` into (lines inside begin/end regions, lines outside)."""
    inside, outside, within = [], [], False
    for line in source.splitlines():
        if begin in line:
            within = True
        elif end in line:
            within = False
        elif within:
            inside.append(line)
        else:
            outside.append(line)
    return inside, outside


# --------------------------------------------------------------------------- format


@dataclass
class ExerciseSummary:
    """The graded exercises of one chapter: points per exercise number."""

    chapter: int
    points: dict[int, float] = field(default_factory=dict)
    autograded: dict[int, float] = field(default_factory=dict)
    written: dict[int, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """All points of the chapter."""
        return sum(self.points.values())


def summarise_exercises(notebook, chapter: int) -> ExerciseSummary:
    """Add up the points of each graded exercise (cells ``chNN-exK-…``) of a notebook.

    Args:
        notebook: an ``nbformat`` notebook.
        chapter: its chapter number.

    Returns:
        An :class:`ExerciseSummary`; autograded (code) and written (markdown) points apart.
    """
    summary = ExerciseSummary(chapter)
    for cell in notebook.cells:
        meta = _nbgrader(cell)
        if not meta or not meta.get("grade"):
            continue
        match = _GRADE_ID.match(str(meta.get("grade_id", "")))
        if not match:
            continue
        number, points = int(match["number"]), float(meta.get("points", 0))
        summary.points[number] = summary.points.get(number, 0) + points
        kind = summary.autograded if cell.cell_type == "code" else summary.written
        kind[number] = kind.get(number, 0) + points
    return summary


def exercise_format_problems(notebook, chapter: int) -> list[str]:
    """List every way a chapter's exercises break the book's nbgrader format.

    The format (``CONTRIBUTING.md``): a markdown prompt in an ``exercise`` admonition
    titled ``Exercise N.K — … (P points)``; a code answer cell tagged ``hide-input`` whose
    solution sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION``; a locked check
    cell with points that calls a checker from ``attention_book.exercises`` (and may hide
    instructor tests between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``).
    A written answer is a markdown solution cell with points whose model answer is folded
    in a ``{dropdown}``. Grade ids are ``chNN-exK-…`` and unique; chapters 1 and later
    have 3–6 graded exercises whose points add up to a multiple of 5.

    Args:
        notebook: an ``nbformat`` notebook.
        chapter: its chapter number (``NN``).

    Returns:
        Human-readable problems; an empty list means the format is right.
    """
    from .. import exercises

    problems: list[str] = []
    seen_ids: dict[str, int] = {}
    answers: dict[int, int] = {}  # exercise number -> index of its code answer cell
    checks: dict[int, list[int]] = {}
    prompts: dict[int, int] = {}
    for index, cell in enumerate(notebook.cells):
        where = f"cell {index}"
        source = cell.source
        for match in _PROMPT.finditer(source if cell.cell_type == "markdown" else ""):
            if ":class: exercise" not in source:
                problems.append(f"{where}: the prompt of Exercise {match['chapter']}."
                                f"{match['number']} is not in an admonition with ':class: exercise'")
            if int(match["chapter"]) != chapter:
                problems.append(f"{where}: Exercise {match['chapter']}.{match['number']} is "
                                f"numbered for chapter {int(match['chapter'])}, not {chapter}")
            prompts[int(match["number"])] = int(match["points"])
        meta = _nbgrader(cell)
        has_solution_marker = BEGIN_SOLUTION in source or END_SOLUTION in source
        has_hidden_marker = BEGIN_HIDDEN in source or END_HIDDEN in source
        if not meta:
            if has_solution_marker or has_hidden_marker:
                problems.append(f"{where}: has nbgrader markers but no nbgrader metadata "
                                "(nbgrader fails on it, or hands the text out to students)")
            continue
        grade_id = str(meta.get("grade_id", ""))
        where = f"cell {index} ({grade_id or 'no grade_id'})"
        if grade_id in seen_ids:
            problems.append(f"{where}: grade_id also used by cell {seen_ids[grade_id]}")
        seen_ids[grade_id] = index
        if meta.get("schema_version") != 3:
            problems.append(f"{where}: nbgrader schema_version is not 3")
        if meta.get("task"):
            problems.append(f"{where}: task cells are not used in this book")
        match = _GRADE_ID.match(grade_id)
        if not match or int(match["chapter"]) != chapter:
            problems.append(f"{where}: grade_id should look like 'ch{chapter:02d}-exK-answer' "
                            f"or 'ch{chapter:02d}-exK-check'")
            continue
        number = int(match["number"])
        solution, grade = bool(meta.get("solution")), bool(meta.get("grade"))
        points = meta.get("points")
        if has_hidden_marker and (solution or not grade):
            problems.append(f"{where}: hidden tests belong in a check cell only")
        if has_solution_marker and not solution:
            problems.append(f"{where}: solution markers in a cell that is not a solution cell")
        if solution and cell.cell_type == "code":
            answers[number] = index
            if grade or meta.get("locked"):
                problems.append(f"{where}: a code answer cell has grade false and locked false")
            lines = [line.strip() for line in source.splitlines()]
            if lines.count(BEGIN_SOLUTION) != 1 or lines.count(END_SOLUTION) != 1:
                problems.append(f"{where}: needs exactly one '{BEGIN_SOLUTION}' and one "
                                f"'{END_SOLUTION}' line")
            elif lines.index(BEGIN_SOLUTION) > lines.index(END_SOLUTION):
                problems.append(f"{where}: '{END_SOLUTION}' comes before '{BEGIN_SOLUTION}'")
            if "hide-input" not in cell.metadata.get("tags", []):
                problems.append(f"{where}: answer cells are tagged 'hide-input' so the website "
                                "folds the solution")
        elif solution:  # a written answer, graded by hand
            if not grade or not points or points <= 0:
                problems.append(f"{where}: a written answer is graded (grade true, points > 0)")
            if "{dropdown}" not in source and ":class: dropdown" not in source:
                problems.append(f"{where}: fold the model answer in a {{dropdown}} so the "
                                "website hides it")
        elif grade:
            if cell.cell_type != "code":
                problems.append(f"{where}: a graded cell that is not a solution must be code")
                continue
            checks.setdefault(number, []).append(index)
            if not meta.get("locked"):
                problems.append(f"{where}: check cells are locked")
            if not points or points <= 0:
                problems.append(f"{where}: check cells carry points > 0")
            _, visible = _marker_region(source, BEGIN_HIDDEN, END_HIDDEN)
            called = _CHECKER_CALL.findall("\n".join(visible))
            if not called:
                problems.append(f"{where}: a check cell calls a checker from "
                                "attention_book.exercises (check_…(...)) outside hidden tests")
            for name in called:
                if not callable(getattr(exercises, name, None)):
                    problems.append(f"{where}: {name} is not in attention_book.exercises")
            if source.count(BEGIN_HIDDEN) != source.count(END_HIDDEN):
                problems.append(f"{where}: unbalanced hidden-test markers")
    for number, index in answers.items():
        if not any(check > index for check in checks.get(number, [])):
            problems.append(f"exercise {chapter}.{number}: no check cell after its answer cell "
                            f"(cell {index})")
    summary = summarise_exercises(notebook, chapter)
    for number, total in summary.points.items():
        if number not in prompts:
            problems.append(f"exercise {chapter}.{number}: no prompt titled "
                            f"'Exercise {chapter}.{number} — … ({total:g} points)'")
        elif prompts[number] != total:
            problems.append(f"exercise {chapter}.{number}: the prompt says {prompts[number]} "
                            f"points, the graded cells carry {total:g}")
    count = len(summary.points)
    if chapter == 0:
        if count < 1:
            problems.append("chapter 0 shows the format: it needs at least one graded exercise")
    else:
        if not MIN_EXERCISES <= count <= MAX_EXERCISES:
            problems.append(f"chapter {chapter} has {count} graded exercises; "
                            f"aim for {MIN_EXERCISES}–{MAX_EXERCISES}")
        if summary.total % ROUND_POINTS:
            split = ", ".join(f"{chapter}.{k}: {v:g}" for k, v in sorted(summary.points.items()))
            problems.append(f"chapter {chapter}: points add up to {summary.total:g} ({split}), "
                            f"not a multiple of {ROUND_POINTS}; e.g. make them total 10")
    return problems
