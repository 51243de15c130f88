"""The exercise format of the book's chapters, checked without running nbgrader.

Every chapter notebook is the *instructor* version of an nbgrader assignment; this module
finds the chapters and lists every way their exercises break the format of
``CONTRIBUTING.md`` (:func:`exercise_format_problems`).

Not taught in a chapter: chapter 0 shows the exercise format.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import textwrap
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
#: The kinds of exercise (the prompt cell's ``metadata.exercise.kind``); all but
#: ``practice`` are transfer tasks, and they carry at least half of a chapter's points.
KINDS = ("practice", "variant", "prediction", "bug-hunt", "property-test")
TRANSFER_KINDS = frozenset(KINDS) - {"practice"}
MIN_TRANSFER_SHARE = 0.5

_PROMPT = re.compile(
    r"^> \*\*Exercise (?P<chapter>\d+)\.(?P<number>\d+) — [^\n]*\((?P<points>\d+) points?\)\*\*$"
)
_LOOSE_PROMPT = re.compile(r"Exercise\s+\d+\.\d+\b[^\n]*\(\d+\s+points?\)")
_GRADE_ID = re.compile(r"^ch(?P<chapter>\d{2})-ex(?P<number>\d+)-[a-z0-9-]+$")
_BUILTINS = frozenset(dir(builtins))
# What a hidden test must not touch: an answer cell could have replaced any of these.
_UNTRUSTED = re.compile(r"\bcheck_\w+|attention_book\.exercises|\btesting\b|exercises\.feedback|_feedback")


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


def nbgrader_metadata(cell) -> dict | None:
    """A cell's nbgrader metadata, or None for a cell nbgrader does not know.

    Args:
        cell: a notebook cell (a dict or an ``nbformat`` node).

    Returns:
        The ``metadata.nbgrader`` dict, or None.
    """
    return cell.get("metadata", {}).get("nbgrader")


def marker_region(source: str, begin: str, end: str) -> tuple[list[str], list[str]]:
    """Split ``source`` into the lines inside ``begin``/``end`` regions and the lines outside.

    Args:
        source: a cell's source.
        begin: the line marker that opens a region (e.g. ``### BEGIN SOLUTION``).
        end: the line marker that closes it.

    Returns:
        ``(inside, outside)``, two lists of lines; the marker lines are in neither.
    """
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


# --------------------------------------------------------------------------- summary


@dataclass
class ExerciseSummary:
    """The graded exercises of one chapter: points per exercise number, and their kinds."""

    chapter: int
    points: dict[int, float] = field(default_factory=dict)
    autograded: dict[int, float] = field(default_factory=dict)
    written: dict[int, float] = field(default_factory=dict)
    kinds: dict[int, str | None] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """All points of the chapter."""
        return sum(self.points.values())

    @property
    def transfer(self) -> float:
        """Points of the exercises whose kind is a transfer task (not ``practice``)."""
        return sum(points for number, points in self.points.items()
                   if self.kinds.get(number) in TRANSFER_KINDS)


_EXERCISE_OF = re.compile(r"^(?P<exercise>ch\d+-ex\d+)-")


def exercise_of(grade_id: str) -> str:
    """Return the exercise a grade id belongs to: ``"ch02-ex3-check"`` -> ``"ch02-ex3"``.

    Args:
        grade_id: an nbgrader grade id; ids outside the book's ``chNN-exK-…`` scheme are
            their own exercise.

    Returns:
        The exercise key.
    """
    if not isinstance(grade_id, str):
        raise TypeError(f"grade_id must be a str, got {type(grade_id).__name__}")
    match = _EXERCISE_OF.match(grade_id)
    return match["exercise"] if match else grade_id


def prompt_match(cell) -> re.Match | None:
    """The exercise title of a prompt cell (its first line), or None for any other cell."""
    if cell.cell_type != "markdown":
        return None
    lines = cell.source.splitlines()
    return _PROMPT.match(lines[0]) if lines else None


def summarise_exercises(notebook, chapter: int) -> ExerciseSummary:
    """Add up the points of each graded exercise (cells ``chNN-exK-…``) of a notebook.

    Args:
        notebook: an ``nbformat`` notebook.
        chapter: its chapter number.

    Returns:
        An :class:`ExerciseSummary`: autograded (code) and written (markdown) points apart,
        and the kind of each exercise, read from its prompt cell.
    """
    summary = ExerciseSummary(chapter)
    for cell in notebook.cells:
        prompt = prompt_match(cell)
        if prompt:
            summary.kinds[int(prompt["number"])] = cell.metadata.get("exercise", {}).get("kind")
        meta = nbgrader_metadata(cell)
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


# --------------------------------------------------------------------------- cell rules


def defined_names(source: str) -> set[str]:
    """The top-level functions and classes that an answer cell's student version defines."""
    lines = source.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN_SOLUTION]
    ends = [i for i, line in enumerate(lines) if line.strip() == END_SOLUTION]
    if len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0]:
        indent = lines[begins[0]][: len(lines[begins[0]]) - len(lines[begins[0]].lstrip())]
        lines = lines[: begins[0]] + [indent + "raise NotImplementedError()"] + lines[ends[0] + 1:]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}


def answer_cell_problems(source: str) -> list[str]:
    """Why an answer cell's solution region is not the body of a documented function.

    The ``def`` (or ``class``) line and its docstring sit above ``### BEGIN SOLUTION``, which
    is indented inside that definition, so that the student version keeps the signature; and
    the student version (the region replaced by ``raise NotImplementedError()``) is valid
    Python.

    Args:
        source: the answer cell's source.

    Returns:
        The problems, as sentences; empty when the cell is right.
    """
    lines = source.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN_SOLUTION]
    ends = [i for i, line in enumerate(lines) if line.strip() == END_SOLUTION]
    if len(begins) != 1 or len(ends) != 1:
        return [f"needs exactly one '{BEGIN_SOLUTION}' and one '{END_SOLUTION}' line"]
    begin, end = begins[0], ends[0]
    if begin > end:
        return [f"'{END_SOLUTION}' comes before '{BEGIN_SOLUTION}'"]
    indent = len(lines[begin]) - len(lines[begin].lstrip())
    student = "\n".join(lines[:begin] + [" " * indent + "raise NotImplementedError()"]
                        + lines[end + 1:])
    try:
        tree = ast.parse(student)
    except SyntaxError as error:
        return ["the student version (the solution replaced by raise NotImplementedError()) "
                f"is not valid Python: {error.msg}"]
    stub_line = begin + 1  # ast counts lines from 1
    owners = [node for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              and node.body[0].lineno <= stub_line <= node.end_lineno]
    if not owners:
        return [f"the 'def' line and its docstring sit above '{BEGIN_SOLUTION}', which goes "
                "inside the function, so that the student version keeps the signature"]
    innermost = max(owners, key=lambda node: node.lineno)
    if ast.get_docstring(innermost) is None:
        return [f"give {innermost.name} a docstring above '{BEGIN_SOLUTION}': the student "
                "version keeps it as the description of the task"]
    return []


class _Names(ast.NodeVisitor):
    """The names a block of code reads and the names it binds, anywhere in it."""

    def __init__(self):
        self.loaded: set[str] = set()
        self.bound: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        (self.bound if isinstance(node.ctx, (ast.Store, ast.Del)) else self.loaded).add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)

    def visit_Import(self, node) -> None:
        for alias in node.names:
            self.bound.add(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_FunctionDef(self, node) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    visit_ClassDef = visit_AsyncFunctionDef = visit_FunctionDef


def _top_level_bindings(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        else:
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    names.add(target.id)
    return names


_HAND_OVER = re.compile(r"^[ \t]*from attention_book\.exercises import hand_over as _hand_over"
                        r"[ \t]*$", re.MULTILINE)


def hidden_test_problems(hidden: str, answer_names: set[str]) -> list[str]:
    """Why a check cell's hidden tests are not self-contained (see ``CONTRIBUTING.md``).

    Hidden tests read only what they bind themselves, builtins, and the functions the
    exercise asks for (``answer_names``); they bind only names that start with ``_``; they
    assert something; and they never touch a checker, ``attention_book.exercises`` (but its
    ``hand_over``, imported as ``_hand_over``) or ``torch.testing``, which an answer cell could
    have replaced.

    Args:
        hidden: the code between the hidden-test markers.
        answer_names: the names the exercise's answer cells define.

    Returns:
        The problems, as sentences; empty when the tests are self-contained.
    """
    code = textwrap.dedent(hidden)
    if not code.strip():
        return ["has no hidden tests: every graded check cell needs some (CONTRIBUTING.md)"]
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return [f"its hidden tests are not valid Python: {error.msg}"]
    names = _Names()
    names.visit(tree)
    problems = []
    outside = sorted(names.loaded - names.bound - _BUILTINS - set(answer_names))
    if outside:
        problems.append(f"its hidden tests read notebook globals {outside}, which a learner may "
                        "have rebound; import or build what the tests need inside them")
    unprefixed = sorted(name for name in _top_level_bindings(tree) if not name.startswith("_"))
    if unprefixed:
        problems.append(f"its hidden tests bind {unprefixed}: start every name with '_', so "
                        "that the tests never overwrite a learner's variables")
    if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
        problems.append("its hidden tests contain no assert")
    # hand_over (the grader builds what it hands to an answer in the answer's sandbox) is the
    # one name of the checkers' package a hidden test may use: it changes no comparison
    untrusted = sorted(set(_UNTRUSTED.findall(_HAND_OVER.sub("", code))))
    if untrusted:
        problems.append(f"its hidden tests use {untrusted}, which an answer cell could have "
                        "replaced; compare with plain asserts")
    return problems


def _visible_check(visible: str) -> tuple[list[str], list[str], list[str]]:
    """Problems of a check cell's visible part, the checkers it asserts, the names it passes."""
    try:
        tree = ast.parse(visible)
    except SyntaxError as error:
        return [f"its visible part is not valid Python: {error.msg}"], [], []
    imported = {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "attention_book.exercises"
                for alias in node.names}
    asserted, passed_names = [], []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Call)
                and isinstance(node.test.func, ast.Name)
                and node.test.func.id.startswith("check_")):
            asserted.append(node.test.func.id)
            passed_names += [arg.id for arg in node.test.args if isinstance(arg, ast.Name)]
    problems = []
    if not asserted:
        problems.append("a check cell asserts a checker's result outside the hidden tests: "
                        "'assert check_…(answer)'")
    for name in asserted:
        if name not in imported:
            problems.append(f"import {name} in the check cell itself ('from "
                            "attention_book.exercises import …'), so that an answer cell "
                            "that rebinds the name changes nothing")
    return problems, asserted, passed_names


# --------------------------------------------------------------------------- format


def exercise_format_problems(notebook, chapter: int) -> list[str]:
    """List every way a chapter's exercises break the book's nbgrader format.

    The format is the one of ``CONTRIBUTING.md``: a markdown prompt whose first line is
    ``> **Exercise N.K — … (P points)**`` and whose metadata names the kind of task; a code
    answer cell tagged ``hide-input`` whose solution is the body of a documented function;
    a locked check cell with points that imports a checker from ``attention_book.exercises``,
    asserts its result and holds self-contained hidden tests. A written answer is a markdown
    solution cell with points whose model answer is folded in ``<details>``. Grade ids are
    ``chNN-exK-…`` and unique; chapters 1 and later have 3–6 graded exercises whose points
    add up to a multiple of 5, at least half of them for transfer tasks.

    Args:
        notebook: an ``nbformat`` notebook.
        chapter: its chapter number (``NN``).

    Returns:
        Human-readable problems; an empty list means the format is right.
    """
    from .. import exercises

    problems: list[str] = []
    seen_ids: dict[str, int] = {}
    answers: dict[int, list[int]] = {}  # exercise number -> its code answer cells
    checks: dict[int, list[int]] = {}
    prompts: dict[int, int] = {}
    for index, cell in enumerate(notebook.cells):
        where = f"cell {index}"
        source = cell.source
        prompt = prompt_match(cell)
        if prompt:
            number = int(prompt["number"])
            if int(prompt["chapter"]) != chapter:
                problems.append(f"{where}: Exercise {prompt['chapter']}.{number} is numbered "
                                f"for chapter {int(prompt['chapter'])}, not {chapter}")
            prompts[number] = int(prompt["points"])
            kind = cell.metadata.get("exercise", {}).get("kind")
            if kind not in KINDS:
                problems.append(f"{where}: the prompt of Exercise {chapter}.{number} needs the "
                                f"metadata exercise.kind, one of {list(KINDS)} (got {kind!r})")
        elif cell.cell_type == "markdown" and _LOOSE_PROMPT.search(source.split("\n")[0]):
            problems.append(f"{where}: an exercise prompt starts with the line "
                            "'> **Exercise N.K — Title (P points)**' (a blockquote)")
        meta = nbgrader_metadata(cell)
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
            answers.setdefault(number, []).append(index)
            if grade or meta.get("locked"):
                problems.append(f"{where}: a code answer cell has grade false and locked false")
            problems += [f"{where}: {problem}" for problem in answer_cell_problems(source)]
            if "hide-input" not in cell.metadata.get("tags", []):
                problems.append(f"{where}: answer cells are tagged 'hide-input' so the website "
                                "folds the solution")
        elif solution:  # a written answer, graded by hand
            if not grade or not points or points <= 0:
                problems.append(f"{where}: a written answer is graded (grade true, points > 0)")
            if "<details>" not in source or "<summary>" not in source:
                problems.append(f"{where}: fold the model answer in <details><summary>Model "
                                "answer and marking guide</summary> … </details>")
        elif grade:
            if cell.cell_type != "code":
                problems.append(f"{where}: a graded cell that is not a solution must be code")
                continue
            checks.setdefault(number, []).append(index)
            if not meta.get("locked"):
                problems.append(f"{where}: check cells are locked")
            if not points or points <= 0:
                problems.append(f"{where}: check cells carry points > 0")
            if source.count(BEGIN_HIDDEN) != 1 or source.count(END_HIDDEN) != 1:
                problems.append(f"{where}: needs one hidden-test region (every graded check "
                                "cell has hidden tests)")
                continue
            hidden, visible = marker_region(source, BEGIN_HIDDEN, END_HIDDEN)
            visible_problems, called, passed_names = _visible_check("\n".join(visible))
            problems += [f"{where}: {problem}" for problem in visible_problems]
            for name in called:
                if not callable(getattr(exercises, name, None)):
                    problems.append(f"{where}: {name} is not in attention_book.exercises")
            answer_names: set[str] = set()
            for answer in answers.get(number, []):
                answer_names |= defined_names(notebook.cells[answer].source)
            for name in passed_names:
                if name not in answer_names:
                    problems.append(f"{where}: the check passes {name!r}, which the answer "
                                    f"cell of exercise {chapter}.{number} does not define")
            problems += [f"{where}: {problem}"
                         for problem in hidden_test_problems("\n".join(hidden), answer_names)]
    for number, indices in answers.items():
        if not any(check > max(indices) for check in checks.get(number, [])):
            problems.append(f"exercise {chapter}.{number}: no check cell after its answer cell "
                            f"(cell {max(indices)})")
    summary = summarise_exercises(notebook, chapter)
    for number, total in summary.points.items():
        if number not in prompts:
            problems.append(f"exercise {chapter}.{number}: no prompt titled "
                            f"'> **Exercise {chapter}.{number} — … ({total:g} points)**'")
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
        if summary.total and summary.transfer < MIN_TRANSFER_SHARE * summary.total:
            problems.append(f"chapter {chapter}: transfer tasks carry {summary.transfer:g} of "
                            f"{summary.total:g} points; at least half go to tasks the chapter "
                            f"did not show (kinds {sorted(TRANSFER_KINDS)})")
    return problems
