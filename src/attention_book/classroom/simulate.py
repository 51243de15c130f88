"""Synthetic students for rehearsing a course: right, wrong, blank and cheating submissions.

Everything is derived from the instructor notebook, so a rehearsal (or a test) keeps
working when a chapter's exercises change: the right answer is the solution region of each
answer cell (:func:`code_exercises`), a blank one the student version's stub
(:func:`blank_answers`), and a cheat rebinds a checker (:func:`rebind_checkers`) or patches
the feedback helpers (:data:`PATCH_HELPERS`).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) mentions rehearsals.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from .format import BEGIN_SOLUTION, END_SOLUTION, exercise_of

_CHECKER = re.compile(r"\b(check_\w+)\s*\(")


@dataclass(frozen=True)
class CodeExercise:
    """One autograded exercise of a chapter, read from the instructor notebook.

    Args:
        exercise: the exercise key, e.g. ``"ch02-ex1"``.
        answer_id: grade id of the answer cell.
        check_ids: grade ids of its check cells.
        points: the points of its check cells together.
        solution: the answer cell's source with the solution markers removed.
        functions: the names the solution defines at top level (functions and classes).
        checkers: the checker names its check cells call.
    """

    exercise: str
    answer_id: str
    check_ids: tuple[str, ...]
    points: float
    solution: str
    functions: tuple[str, ...]
    checkers: tuple[str, ...]


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def solution_source(source: str) -> str:
    """An answer cell's source with the ``### BEGIN/END SOLUTION`` lines removed.

    Args:
        source: the instructor's answer cell.

    Returns:
        The complete, runnable answer.
    """
    return "\n".join(line for line in source.splitlines()
                     if BEGIN_SOLUTION not in line and END_SOLUTION not in line)


def code_exercises(instructor) -> list[CodeExercise]:
    """Every autograded exercise of an instructor notebook, in notebook order.

    Args:
        instructor: the chapter notebook (``nbformat``).

    Returns:
        One :class:`CodeExercise` per code answer cell that has a check cell.
    """
    answers, checks = {}, {}
    for cell in instructor.cells:
        meta = _meta(cell)
        grade_id = meta.get("grade_id")
        if cell.cell_type != "code" or not grade_id:
            continue
        if meta.get("solution"):
            answers[exercise_of(grade_id)] = cell
        elif meta.get("grade"):
            checks.setdefault(exercise_of(grade_id), []).append(cell)
    exercises = []
    for exercise, cell in answers.items():
        if exercise not in checks:
            continue
        solution = solution_source(cell.source)
        tree = ast.parse(solution)
        functions = tuple(node.name for node in tree.body
                          if isinstance(node, ast.FunctionDef | ast.ClassDef))
        check_cells = checks[exercise]
        checkers = tuple(dict.fromkeys(
            name for check in check_cells
            for name in _CHECKER.findall(check.source.split("### BEGIN HIDDEN TESTS")[0])))
        exercises.append(CodeExercise(
            exercise, _meta(cell)["grade_id"],
            tuple(_meta(check)["grade_id"] for check in check_cells),
            sum(float(_meta(check).get("points", 0)) for check in check_cells),
            solution, functions, checkers))
    return exercises


def hand_in(notebook: dict, answers: dict[str, str]) -> dict:
    """A copy of ``notebook`` with each answer written into the cell of its grade id.

    Args:
        notebook: a notebook as JSON (usually the released student version).
        answers: ``{grade_id: source}``, e.g. from :func:`code_exercises` or
            :func:`blank_answers`; a grade id the notebook lacks is ignored.

    Returns:
        The new notebook, as JSON; ``notebook`` is unchanged.
    """
    copied = json.loads(json.dumps(notebook))
    for cell in copied["cells"]:
        grade_id = _meta(cell).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return copied


def blank_answers(instructor) -> dict[str, str]:
    """Each code answer cell's grade id mapped to its student version (the stub).

    The solution region becomes ``raise NotImplementedError()``, as nbgrader writes it.

    Args:
        instructor: the chapter notebook.

    Returns:
        ``{grade_id: source}``.
    """
    blanks = {}
    for cell in instructor.cells:
        meta = _meta(cell)
        if cell.cell_type != "code" or not meta.get("solution"):
            continue
        lines, kept, inside = cell.source.splitlines(), [], False
        for line in lines:
            if BEGIN_SOLUTION in line:
                inside = True
                kept.append(line[: len(line) - len(line.lstrip())] + "raise NotImplementedError()")
            elif END_SOLUTION in line:
                inside = False
            elif not inside:
                kept.append(line)
        blanks[meta["grade_id"]] = "\n".join(kept)
    return blanks


def written_answers(instructor) -> dict[str, str]:
    """Each written (markdown) answer's grade id mapped to the instructor's model answer.

    Args:
        instructor: the chapter notebook.

    Returns:
        ``{grade_id: markdown}``.
    """
    return {_meta(cell)["grade_id"]: cell.source for cell in instructor.cells
            if cell.cell_type == "markdown" and _meta(cell).get("solution")
            and _meta(cell).get("grade")}


PATCH_HELPERS = ("import torch\n"
                 "import attention_book.exercises.feedback as _fb\n"
                 "_fb.fail = lambda *args, **kwargs: None\n"
                 "torch.testing.assert_close = lambda *args, **kwargs: None\n")


def rebind_checkers(exercise: CodeExercise) -> str:
    """Lines that rebind each checker of ``exercise`` to one that always passes.

    Args:
        exercise: the exercise.

    Returns:
        Python source.
    """
    return "".join(f"{name} = lambda *args, **kwargs: True\n" for name in exercise.checkers)
