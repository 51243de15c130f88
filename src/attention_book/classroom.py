"""Turn the book's chapters into nbgrader assignments for a class.

Every chapter notebook (``chapters/NN_name.ipynb``) is the *instructor* version of an
assignment: its exercises carry nbgrader's cell metadata and markers (see
``CONTRIBUTING.md``). This module builds an nbgrader course folder from them and runs
``nbgrader generate_assignment``, which writes the *student* versions: solutions replaced
by ``raise NotImplementedError()``, hidden tests removed, the checkers still there.

Run it with ``make assignments`` or ``python -m attention_book.classroom``; by default the
course folder is ``build/classroom`` (not committed)::

    build/classroom/
        nbgrader_config.py      course settings (gradebook inside this folder)
        gradebook.db            nbgrader's SQLite gradebook
        source/NN_name/NN_name.ipynb    instructor versions (copied from chapters/)
        release/NN_name/NN_name.ipynb   student versions (generated)

The module also checks what tests rely on: that every chapter's exercises follow the
format (:func:`exercise_format_problems`) and that no solution or hidden-test text
survives in a student version (:func:`leaked_solution_text`).

nbgrader is an instructor tool, not a dependency of the package: it is only imported
(or run) by the functions that need it.

Not taught in a chapter: chapter 0 shows the exercise format, the instructor guide
(``instructor_guide.md``) shows how to use this module with nbgrader.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

__all__ = [
    "ExerciseSummary",
    "autograded_scores",
    "build_assignments",
    "exercise_format_problems",
    "find_chapters",
    "generate_assignments",
    "leaked_solution_text",
    "prepare_course",
    "run_nbgrader",
    "summarise_exercises",
]

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
# What nbgrader puts in place of a solution (its defaults, which the course config keeps).
STUBS = frozenset({"# YOUR CODE HERE", "raise NotImplementedError()", "YOUR ANSWER HERE"})

MIN_EXERCISES, MAX_EXERCISES = 3, 6  # graded exercises per chapter (chapter 0 is exempt)
ROUND_POINTS = 5  # a chapter's points add up to a multiple of this (chapter 0 is exempt)

_COURSE_CONFIG = '''\
# nbgrader settings for the course built from the book's chapters.
# Written by `python -m attention_book.classroom`; run nbgrader from this folder.
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file
c.CourseDirectory.course_id = "attention-step-by-step"
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
# A chapter cell may train a small model: give each cell up to five minutes.
c.Execute.timeout = 300
'''

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
    from . import exercises

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


# --------------------------------------------------------------------------- nbgrader


def run_nbgrader(course_dir: str | os.PathLike, *args: str) -> subprocess.CompletedProcess:
    """Run ``nbgrader <args>`` inside ``course_dir`` with this Python environment.

    The kernel that autograding starts is ``python`` from ``PATH``; this environment's
    ``bin`` folder goes first on ``PATH`` so that kernel sees the same packages.

    Args:
        course_dir: the nbgrader course folder (holds ``nbgrader_config.py``).
        *args: the nbgrader sub-command and its arguments.

    Returns:
        The finished process (stdout and stderr captured).

    Raises:
        RuntimeError: nbgrader failed; the message holds the end of its log.
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # no debugger warning in the kernel
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course_dir, env=env, capture_output=True, text=True, check=False,
    )
    log = result.stdout + result.stderr
    if result.returncode != 0 or " | ERROR]" in log:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed (exit {result.returncode}):\n"
                           + log[-4000:])
    return result


def prepare_course(course_dir: str | os.PathLike, chapters: Sequence[str | os.PathLike]) -> list[str]:
    """Write an nbgrader course folder whose ``source/`` holds a copy of each chapter.

    ``source/`` is rebuilt from the chapters each time; the gradebook is kept.

    Args:
        course_dir: where to build the course (created if missing).
        chapters: instructor notebooks, e.g. from :func:`find_chapters`.

    Returns:
        The assignment ids (each chapter's file stem, e.g. ``"03_trainable_qkv"``).
    """
    course = Path(course_dir).resolve()
    course.mkdir(parents=True, exist_ok=True)
    config = _COURSE_CONFIG.format(root=str(course),
                                   db_url=f"sqlite:///{course / 'gradebook.db'}")
    (course / "nbgrader_config.py").write_text(config, encoding="utf-8")
    shutil.rmtree(course / "source", ignore_errors=True)
    ids = []
    for chapter in chapters:
        assignment = Path(chapter).stem
        target = course / "source" / assignment
        target.mkdir(parents=True)
        shutil.copyfile(chapter, target / f"{assignment}.ipynb")
        ids.append(assignment)
    return ids


def generate_assignments(course_dir: str | os.PathLike) -> dict[str, Path]:
    """Run ``nbgrader generate_assignment`` for every assignment in ``source/``.

    Args:
        course_dir: a course folder written by :func:`prepare_course`.

    Returns:
        Each assignment id mapped to its student notebook under ``release/``.

    Raises:
        RuntimeError: nbgrader failed, or a student notebook is missing.
    """
    course = Path(course_dir).resolve()
    ids = sorted(path.name for path in (course / "source").iterdir() if path.is_dir())
    if not ids:
        raise RuntimeError(f"no assignments in {course / 'source'}; are there chapters?")
    # One nbgrader process for all of them: "*" is a glob over source/.
    run_nbgrader(course, "generate_assignment", "*", "--force")
    released = {}
    for assignment in ids:
        student = course / "release" / assignment / f"{assignment}.ipynb"
        if not student.exists():
            raise RuntimeError(f"nbgrader wrote no student version {student}")
        released[assignment] = student
    return released


def autograded_scores(course_dir: str | os.PathLike, assignment: str,
                      student: str) -> dict[str, tuple[float | None, float]]:
    """Read one student's autograded cells of one assignment from the gradebook.

    Args:
        course_dir: the course folder (its ``gradebook.db``).
        assignment: the assignment id; its single notebook has the same name.
        student: the student id.

    Returns:
        ``{grade_id: (auto_score, max_score)}`` for every autograded (code) cell.
    """
    from nbgrader.api import Gradebook

    db_url = f"sqlite:///{Path(course_dir).resolve() / 'gradebook.db'}"
    with Gradebook(db_url) as gradebook:
        notebook = gradebook.find_submission_notebook(assignment, assignment, student)
        return {
            grade.name: (grade.auto_score, float(grade.max_score))
            for grade in notebook.grades
            if grade.cell.cell_type == "code"
        }


# --------------------------------------------------------------------------- leaks


def _secret_lines(instructor) -> set[str]:
    """Lines that only the instructor may see: solutions and hidden tests."""
    secret, public = set(), set()
    for cell in instructor.cells:
        meta = _nbgrader(cell) or {}
        source = cell.source
        if meta.get("solution") and BEGIN_SOLUTION not in source:
            inside, outside = source.splitlines(), []  # the whole cell is the answer
        else:
            inside, outside = _marker_region(source, BEGIN_SOLUTION, END_SOLUTION)
        hidden, outside = _marker_region("\n".join(outside), BEGIN_HIDDEN, END_HIDDEN)
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


# --------------------------------------------------------------------------- command


def build_assignments(root: str | os.PathLike = ".",
                      course_dir: str | os.PathLike = "build/classroom") -> dict[str, Path]:
    """Generate the student version of every chapter and check it hides the solutions.

    Args:
        root: the repository root (holds ``chapters/``).
        course_dir: the course folder to write (relative paths are relative to ``root``).

    Returns:
        Each assignment id mapped to its student notebook.

    Raises:
        RuntimeError: no chapters, nbgrader failed, or a student version leaks a solution.
    """
    chapters = find_chapters(root)
    if not chapters:
        raise RuntimeError(f"no chapter notebooks under {Path(root, 'chapters')}")
    course = Path(root, course_dir)
    prepare_course(course, chapters)
    released = generate_assignments(course)
    for chapter in chapters:
        instructor = nbformat.read(chapter, as_version=4)
        student = nbformat.read(released[chapter.stem], as_version=4)
        leaks = leaked_solution_text(instructor, student)
        if leaks:
            raise RuntimeError(f"the student version of {chapter.name} still contains "
                               f"solution text: {leaks[:5]}")
    return released


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m attention_book.classroom [--root .] [--course-dir …]``."""
    parser = argparse.ArgumentParser(
        description="Generate nbgrader student versions of every chapter.")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    parser.add_argument("--course-dir", default="build/classroom",
                        help="nbgrader course folder to write (default: build/classroom)")
    options = parser.parse_args(argv)
    for chapter in find_chapters(options.root):
        problems = exercise_format_problems(nbformat.read(chapter, as_version=4),
                                            chapter_number(chapter))
        for problem in problems:
            print(f"warning: {chapter.name}: {problem}", file=sys.stderr)
    try:
        released = build_assignments(options.root, options.course_dir)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    course = Path(options.root, options.course_dir).resolve()
    print(f"{'assignment':<32} {'exercises':>9} {'points':>6}  student version")
    for assignment, student in released.items():
        instructor = nbformat.read(course / "source" / assignment / f"{assignment}.ipynb", 4)
        summary = summarise_exercises(instructor, chapter_number(f"{assignment}.ipynb"))
        print(f"{assignment:<32} {len(summary.points):>9} {summary.total:>6g}  "
              f"{student.relative_to(course)}")
    print(f"\nCourse folder: {course}  (run nbgrader from there: cd {course})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
