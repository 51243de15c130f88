"""Autograde with the tamper scan, and export only what was handed out.

:func:`autograde` runs ``nbgrader autograde`` and then the tamper scan
(:mod:`attention_book.classroom.tamper`) on every submission: each tainted exercise gets
an autograded score of 0 in the gradebook, and its answer cell a comment that names the
line. An instructor who disagrees sets a manual score in the formgrader; a later
``autograde`` keeps it (nbgrader's manual score always wins over the autograded one).

It also explains nbgrader's noisy ``Attribute 'checksum' for cell … has changed!``
warnings: every check cell with hidden tests triggers one for every student, because the
student version lacks the hidden tests that the gradebook's copy has (nbgrader restores
them, as it should). The log keeps only the real edits, found by comparing each locked
cell with the student version.

:func:`export_grades` writes nbgrader's ``grades.csv`` for the assignments that students
have handed in (no zero rows for chapters that were never handed out) and
``exercises.csv`` with one row per student and exercise.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows how to use it.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .course import run_nbgrader, submissions_of
from .tamper import ScanReport, exercise_of, scan_notebook

TAMPER_COMMENT = "Tamper scan: score set to 0 (the instructor can override it). "
_CHECKSUM_WARNING = re.compile(r"Attribute 'checksum' for cell (?P<cell>\S+) has changed")
_NOISE = ("Kernel is running over TCP without encryption", "SAWarning", "warnings.warn(",
          "sqlalchemy", "Config option `kernel_spec_manager_class`")


@dataclass
class StudentResult:
    """One student's notebook of one assignment after the tamper-aware autograde.

    Args:
        student: the student id.
        notebook: the notebook id.
        scan: the tamper scan's report.
        zeroed: grade ids whose autograded score the scan set to 0, with the old score.
        kept_manual: grade ids the scan would zero but whose manual score the instructor set.
    """

    student: str
    notebook: str
    scan: ScanReport
    zeroed: dict[str, float | None] = field(default_factory=dict)
    kept_manual: list[str] = field(default_factory=list)


def _course(course_dir) -> Path:
    course = Path(course_dir).resolve()
    if not (course / "nbgrader_config.py").exists():
        raise ValueError(f"{course} is not a course folder (no nbgrader_config.py); "
                         "run `python -m attention_book.classroom generate` first")
    return course


def _db_url(course: Path) -> str:
    return f"sqlite:///{course / 'gradebook.db'}"


def scan_submissions(course_dir: str | os.PathLike, assignment: str,
                     students: list[str] | None = None) -> list[StudentResult]:
    """Run the tamper scan on every submitted notebook of ``assignment``.

    Args:
        course_dir: the course folder.
        assignment: the assignment id.
        students: only these student ids (default: everyone in ``submitted/``).

    Returns:
        One :class:`StudentResult` per submitted notebook (nothing zeroed yet).
    """
    course = _course(course_dir)
    release_dir = course / "release" / assignment
    if not release_dir.is_dir():
        raise ValueError(f"no student version of {assignment!r} in {release_dir}; "
                         "was it generated?")
    results = []
    for folder in sorted((course / "submitted").glob(f"*/{assignment}")):
        student = folder.parent.name
        if students and student not in students:
            continue
        for path in sorted(folder.glob("*.ipynb")):
            release = release_dir / path.name
            if not release.exists():
                continue
            source_path = course / "source" / assignment / path.name
            source = nbformat.read(source_path, as_version=4) if source_path.exists() else None
            report = scan_notebook(nbformat.read(path, as_version=4),
                                   nbformat.read(release, as_version=4), source)
            results.append(StudentResult(student, path.stem, report))
    return results


def apply_tamper_scores(course_dir: str | os.PathLike, assignment: str,
                        results: list[StudentResult]) -> None:
    """Set the autograded score of every tainted exercise to 0, with a comment.

    The comment goes on the exercise's answer cell (nbgrader shows comments on answer
    cells, in the formgrader and in the feedback). A manual score is left alone.

    Args:
        course_dir: the course folder.
        assignment: the assignment id.
        results: from :func:`scan_submissions`; their ``zeroed`` and ``kept_manual`` are
            filled in.
    """
    from nbgrader.api import Gradebook, MissingEntry

    course = _course(course_dir)
    with Gradebook(_db_url(course)) as gradebook:
        for result in results:
            if not result.scan.tainted:
                continue
            try:
                submission = gradebook.find_submission_notebook(
                    result.notebook, assignment, result.student)
            except MissingEntry:
                continue  # not autograded (yet)
            by_exercise: dict[str, list] = {}
            for grade in submission.grades:
                if grade.cell.cell_type == "code":
                    by_exercise.setdefault(exercise_of(grade.name), []).append(grade)
            answers = {exercise_of(comment.name): comment for comment in submission.comments}
            for exercise, findings in result.scan.tainted.items():
                for grade in by_exercise.get(exercise, []):
                    if grade.manual_score is not None:
                        result.kept_manual.append(grade.name)
                        continue
                    result.zeroed[grade.name] = grade.auto_score
                    grade.auto_score = 0.0
                comment = answers.get(exercise)
                if comment is not None:
                    lines = "; ".join(finding.describe() for finding in findings[:3])
                    more = f" (and {len(findings) - 3} more)" if len(findings) > 3 else ""
                    comment.auto_comment = TAMPER_COMMENT + lines + more
            gradebook.db.commit()


def autograde(course_dir: str | os.PathLike, assignment: str,
              students: list[str] | None = None, force: bool = True) -> list[StudentResult]:
    """``nbgrader autograde`` followed by the tamper scan and its zero scores.

    Args:
        course_dir: the course folder.
        assignment: the assignment id.
        students: only these student ids (default: every submission).
        force: re-grade submissions that were autograded before.

    Returns:
        One :class:`StudentResult` per submitted notebook.

    Raises:
        NbgraderError: nbgrader failed; the message holds the real cause.
    """
    if not isinstance(assignment, str) or not assignment:
        raise ValueError(f"assignment must be a non-empty str, got {assignment!r}")
    course = _course(course_dir)
    if not submissions_of(course, assignment):
        raise ValueError(f"nobody has submitted {assignment!r} yet (submitted/*/{assignment})")
    results = scan_submissions(course, assignment, students)
    args = ["autograde", assignment]
    if force:
        args.append("--force")
    for student in students or [None]:
        run_nbgrader(course, *args, *(["--student", student] if student else []),
                     log_name=f"autograde-{assignment}.log")
    apply_tamper_scores(course, assignment, results)
    return results


def autograde_summary(results: list[StudentResult]) -> list[str]:
    """Lines for the instructor: real check-cell edits, tamper findings, zeroed scores.

    Args:
        results: from :func:`autograde`.

    Returns:
        Human-readable lines (empty when every submission is clean).
    """
    lines = []
    for result in results:
        who = f"{result.student}:"
        for grade_id in result.scan.edited_locked:
            lines.append(f"{who} edited the locked cell {grade_id}; nbgrader graded the "
                         "original instead")
        for grade_id in result.scan.missing_locked:
            lines.append(f"{who} deleted the locked cell {grade_id}; nbgrader added it back "
                         "and graded it")
        for finding in result.scan.findings:
            lines.append(f"{who} {finding.describe()}")
        for grade_id, old in result.zeroed.items():
            lines.append(f"{who} {grade_id} set to 0 by the tamper scan (autograder gave "
                         f"{old if old is not None else 'no score'})")
        for grade_id in result.kept_manual:
            lines.append(f"{who} {grade_id} is tainted but keeps your manual score")
    return lines


def released_assignments(course_dir: str | os.PathLike) -> list[str]:
    """The assignments with at least one submission, in gradebook order.

    Args:
        course_dir: the course folder.

    Returns:
        Assignment ids (a chapter generated but never handed in is left out).
    """
    from nbgrader.api import Gradebook

    course = _course(course_dir)
    if not (course / "gradebook.db").exists():
        return []
    with Gradebook(_db_url(course)) as gradebook:
        return [assignment.name for assignment in gradebook.assignments
                if assignment.submissions]


def exercise_scores(course_dir: str | os.PathLike,
                    assignments: list[str] | None = None) -> list[dict[str, object]]:
    """One row per student, assignment and exercise, read from the gradebook.

    Args:
        course_dir: the course folder.
        assignments: the assignment ids (default: :func:`released_assignments`).

    Returns:
        Dicts with ``assignment``, ``student``, ``exercise``, ``kind`` (``autograded`` or
        ``written``), ``score``, ``max_score``, ``needs_manual_grade`` and ``comment``.
    """
    from nbgrader.api import Gradebook

    course = _course(course_dir)
    assignments = released_assignments(course) if assignments is None else assignments
    rows = []
    with Gradebook(_db_url(course)) as gradebook:
        for assignment in assignments:
            for submission in gradebook.find_assignment(assignment).submissions:
                for notebook in submission.notebooks:
                    comments = {exercise_of(c.name): c.comment for c in notebook.comments}
                    merged: dict[tuple[str, str], dict[str, object]] = {}
                    for grade in sorted(notebook.grades, key=lambda g: g.name):
                        kind = "autograded" if grade.cell.cell_type == "code" else "written"
                        key = (exercise_of(grade.name), kind)
                        row = merged.setdefault(key, {
                            "assignment": assignment, "student": submission.student.id,
                            "exercise": key[0], "kind": kind, "score": 0.0,
                            "max_score": 0.0, "needs_manual_grade": False,
                            "comment": comments.get(key[0]) or ""})
                        row["score"] += float(grade.score or 0.0)
                        row["max_score"] += float(grade.max_score)
                        row["needs_manual_grade"] |= bool(grade.needs_manual_grade)
                    rows += list(merged.values())
    return sorted(rows, key=lambda r: (r["assignment"], r["student"], r["exercise"], r["kind"]))


def export_grades(course_dir: str | os.PathLike, assignments: list[str] | None = None,
                  to: str = "grades.csv", exercises_to: str = "exercises.csv") -> tuple[Path, Path]:
    """Write nbgrader's ``grades.csv`` and the book's ``exercises.csv`` into the course.

    Args:
        course_dir: the course folder.
        assignments: which assignments (default: :func:`released_assignments`).
        to: file name of nbgrader's export (one row per student and assignment).
        exercises_to: file name of the per-exercise export.

    Returns:
        The two paths.

    Raises:
        ValueError: no assignment has been handed in yet.
    """
    course = _course(course_dir)
    assignments = released_assignments(course) if assignments is None else list(assignments)
    if not assignments:
        raise ValueError("no assignment has been handed in yet: nothing to export")
    args = ["export", "--to", to]
    for assignment in assignments:
        args += ["--assignment", assignment]
    run_nbgrader(course, *args, log_name="export.log")
    rows = exercise_scores(course, assignments)
    path = course / exercises_to
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["assignment", "student", "exercise", "kind",
                                                    "score", "max_score",
                                                    "needs_manual_grade", "comment"])
        writer.writeheader()
        writer.writerows(rows)
    return course / to, path


def quiet_log(log: str) -> list[str]:
    """The lines of an nbgrader autograde log an instructor needs: no checksum noise.

    Args:
        log: nbgrader's output.

    Returns:
        Its warnings and errors, without the false "checksum has changed" warnings (real
        check-cell edits are reported by the scan), kernel-transport and SQLAlchemy noise.
    """
    kept = []
    for line in log.splitlines():
        if _CHECKSUM_WARNING.search(line) or any(noise in line for noise in _NOISE):
            continue
        if "| WARNING]" in line or "| ERROR]" in line:
            kept.append(line)
    return kept
