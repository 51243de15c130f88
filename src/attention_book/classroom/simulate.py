"""Synthetic students for rehearsing a course: right, wrong, blank and cheating submissions.

Everything is derived from the instructor notebook, so a rehearsal (or a test) keeps
working when a chapter's exercises change: the right answer is the solution region of each
answer cell; a subtle mistake wraps that solution so its result is 10 % off; a cheat edits
a check cell, rebinds a checker, patches the feedback helpers, deletes a check cell or
hard-codes the value that the checker's first visible test expects.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) mentions rehearsals.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import io
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


def mistaken(exercise: CodeExercise) -> str:
    """A plausible wrong answer: the right one, with every number it returns 10 % too large.

    Args:
        exercise: an exercise whose solution defines exactly one function.

    Returns:
        The answer cell's source.

    Raises:
        ValueError: the solution does not define exactly one function.
    """
    tree = ast.parse(exercise.solution)
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if len(functions) != 1:
        raise ValueError(f"{exercise.exercise}: a mistake needs a solution with one function, "
                         f"got {[f.name for f in functions]}")
    name = functions[0].name
    return (f"{exercise.solution}\n\n\n_first_try = {name}\n\n\n"
            f"def {name}(*args, **kwargs):\n"
            "    import torch as _torch\n\n"
            "    def _off(value):\n"
            "        if _torch.is_tensor(value) and value.is_floating_point():\n"
            "            return value * 1.1\n"
            "        if isinstance(value, int | float) and not isinstance(value, bool):\n"
            "            return value * 1.1 + 0.1\n"
            "        if isinstance(value, list | tuple):\n"
            "            return type(value)(_off(item) for item in value)\n"
            "        return value\n\n"
            "    return _off(_first_try(*args, **kwargs))\n")


def chapter_imports(instructor) -> str:
    """The chapter's top-level import statements, from its code cells without nbgrader metadata.

    Args:
        instructor: the chapter notebook.

    Returns:
        Python source with one import per line.
    """
    lines = []
    for cell in instructor.cells:
        if cell.cell_type != "code" or _meta(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        lines += [ast.unparse(node) for node in tree.body
                  if isinstance(node, ast.Import | ast.ImportFrom)]
    return "\n".join(dict.fromkeys(lines))


def first_checked_value(exercise: CodeExercise, imports: str):
    """The value the right answer returns on the checker's first call (what a cheat copies).

    Runs the solution and the checker in this process, with the chapter's imports.

    Args:
        exercise: an exercise whose solution defines one function and whose check calls a
            checker.
        imports: the chapter's imports (:func:`chapter_imports`).

    Returns:
        The first return value (a tensor, or a tuple of tensors).
    """
    from .. import exercises as checkers

    if len(exercise.functions) != 1 or not exercise.checkers:
        raise ValueError(f"{exercise.exercise}: needs one function and a checker")
    namespace: dict = {}
    code = compile(imports + "\n" + exercise.solution, f"<{exercise.answer_id}>", "exec")
    exec(code, namespace)  # noqa: S102 - the instructor's own solution
    function = namespace[exercise.functions[0]]
    calls = []

    def spy(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(result)
        return result

    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(AssertionError):
        getattr(checkers, exercise.checkers[0])(spy)
    if not calls:
        raise ValueError(f"{exercise.exercise}: {exercise.checkers[0]} never called the answer")
    return calls[0]


def hard_coded(exercise: CodeExercise, imports: str) -> str:
    """A cheat: the function ignores its input and returns the first checked value.

    Args:
        exercise: as for :func:`first_checked_value`.
        imports: the chapter's imports.

    Returns:
        The answer cell's source.
    """
    import torch

    value = first_checked_value(exercise, imports)
    function = next(node for node in ast.parse(exercise.solution).body
                    if isinstance(node, ast.FunctionDef))

    def literal(item) -> str:
        if torch.is_tensor(item):
            return f"torch.tensor({item.tolist()!r}, dtype={item.dtype})"
        return repr(item)

    body = (f"({', '.join(literal(v) for v in value)},)" if isinstance(value, tuple)
            else literal(value))
    return (f"import torch\n\n\ndef {function.name}({ast.unparse(function.args)}):\n"
            f"    return {body}\n")


def notebook_with(release, answers: dict[str, str] | None = None,
                  checks: dict[str, str | None] | None = None, append: list[str] | None = None):
    """A copy of the student version with some cells changed, as a student hands it in.

    Args:
        release: the student version (``nbformat``).
        answers: grade id of an answer cell -> its new source.
        checks: grade id of a locked cell -> new source, or ``None`` to delete the cell.
        append: sources of scratch code cells added at the end.

    Returns:
        The new notebook.
    """
    import nbformat

    answers, checks = answers or {}, checks or {}
    notebook = copy.deepcopy(release)
    cells = []
    for cell in notebook.cells:
        grade_id = _meta(cell).get("grade_id")
        if grade_id in checks:
            if checks[grade_id] is None:
                continue
            cell.source = checks[grade_id]
        elif grade_id in answers:
            cell.source = answers[grade_id]
        cells.append(cell)
    cells += [nbformat.v4.new_code_cell(source) for source in append or []]
    notebook.cells = cells
    return notebook


PATCH_HELPERS = ("import torch\n"
                 "import attention_book.exercises._feedback as _fb\n"
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
