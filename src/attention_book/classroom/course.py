"""Build an nbgrader course from the chapters and run nbgrader in it.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows how to use it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

from .format import chapter_number, exercise_format_problems, find_chapters, summarise_exercises
from .leaks import leaked_solution_text

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

