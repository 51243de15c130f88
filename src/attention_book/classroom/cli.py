"""``python -m attention_book.classroom``: the course commands behind ``make assignments``.

Sub-commands (each takes ``--course-dir``, a folder outside the clone)::

    generate [--chapters 02 04] [--root .] [--course-id ID]
        student versions of the chosen chapters (default: all); safe to rerun
    scan ASSIGNMENT [--student ID ...]
        the tamper scan of every submission, without grading
    autograde ASSIGNMENT [--student ID ...]
        nbgrader autograde, then the tamper scan sets tainted exercises to 0
    feedback ASSIGNMENT [--student ID ...]
        nbgrader generate_feedback (hidden tests and package tracebacks left out)
    export [--assignment ID ...]
        grades.csv and exercises.csv of the assignments handed in

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows every command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

from .course import COURSE_ID, NbgraderError, build_assignments, run_nbgrader
from .format import chapter_number, exercise_format_problems, summarise_exercises
from .grading import autograde, autograde_summary, export_grades, quiet_log, scan_submissions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attention_book.classroom",
        description="Run a course with the book's chapters as nbgrader assignments.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("--course-dir", default=os.environ.get("COURSE_DIR"),
                         help="the nbgrader course folder, outside the clone "
                              "(default: $COURSE_DIR)")
        return sub

    generate = command("generate", "generate the student versions of the chosen chapters")
    generate.add_argument("--chapters", nargs="*", default=None,
                          help="chapter numbers or names, e.g. 02 04 (default: all)")
    generate.add_argument("--root", default=".", help="repository root (default: .)")
    generate.add_argument("--course-id", default=COURSE_ID,
                          help=f"nbgrader course id (default: {COURSE_ID})")
    for name, text in [("scan", "tamper scan of every submission, without grading"),
                       ("autograde", "nbgrader autograde plus the tamper scan"),
                       ("feedback", "nbgrader generate_feedback for students")]:
        sub = command(name, text)
        sub.add_argument("assignment", help="assignment id, e.g. 02_dot_product_attention")
        sub.add_argument("--student", action="append", default=None,
                         help="only this student id (repeat for several)")
    export = command("export", "grades.csv and exercises.csv of the handed-in assignments")
    export.add_argument("--assignment", action="append", default=None,
                        help="only this assignment (repeat; default: every one handed in)")
    return parser


def _generate(options) -> int:
    root = Path(options.root)
    chapters = options.chapters if options.chapters else None
    if chapters and len(chapters) == 1 and " " in chapters[0]:
        chapters = chapters[0].split()
    build = build_assignments(root, options.course_dir, chapters, options.course_id)
    course = Path(options.course_dir).resolve()
    for line in build.config:
        print(line)
    print(f"{'assignment':<32} {'exercises':>9} {'auto':>5} {'written':>7} {'total':>5}  status")
    for assignment in sorted(set(build.released) | set(build.skipped)):
        instructor = nbformat.read(course / "source" / assignment / f"{assignment}.ipynb", 4)
        number = chapter_number(f"{assignment}.ipynb")
        for problem in exercise_format_problems(instructor, number):
            print(f"warning: {assignment}: {problem}", file=sys.stderr)
        summary = summarise_exercises(instructor, number)
        status = (f"generated: release/{assignment}/" if assignment in build.released
                  else f"SKIPPED: {build.skipped[assignment]}")
        print(f"{assignment:<32} {len(summary.points):>9} {sum(summary.autograded.values()):>5g} "
              f"{sum(summary.written.values()):>7g} {summary.total:>5g}  {status}")
    print(f"\nCourse folder: {course}  (run nbgrader from there: cd {course})")
    return 0


def _scan(options) -> int:
    results = scan_submissions(options.course_dir, options.assignment, options.student)
    if not results:
        print(f"no submissions of {options.assignment} to scan")
    for result in results:
        scan = result.scan
        status = "clean" if scan.clean else f"{len(scan.findings)} flagged line(s)"
        print(f"{result.student}: {status}")
        for finding in scan.findings:
            print(f"  {finding.describe()}")
        for exercise, _ in scan.tainted.items():
            print(f"  would set {exercise} to 0")
        for grade_id in scan.edited_locked:
            print(f"  edited the locked cell {grade_id} (nbgrader grades the original)")
        for grade_id in scan.missing_locked:
            print(f"  deleted the locked cell {grade_id} (nbgrader adds it back)")
    return 0


def _autograde(options) -> int:
    results = autograde(options.course_dir, options.assignment, options.student)
    log = Path(options.course_dir, "logs", f"autograde-{options.assignment}.log")
    for line in quiet_log(log.read_text(encoding="utf-8")) if log.exists() else []:
        print(line)
    summary = autograde_summary(results)
    print(f"autograded {len(results)} submission(s) of {options.assignment}; "
          f"tamper scan: {sum(1 for r in results if r.scan.clean)} clean")
    for line in summary:
        print(f"  {line}")
    print("(nbgrader's 'checksum has changed' warnings are left out: every check cell with "
          "hidden tests gives one; the real edits are listed above)")
    return 0


def _feedback(options) -> int:
    args = ["generate_feedback", options.assignment, "--force"]
    for student in options.student or [None]:
        run_nbgrader(options.course_dir, *args, *(["--student", student] if student else []),
                     log_name=f"feedback-{options.assignment}.log")
    print(f"feedback written to feedback/<student>/{options.assignment}/ "
          f"(nbgrader release_feedback {options.assignment} hands it out on a hub)")
    return 0


def _export(options) -> int:
    grades, exercises = export_grades(options.course_dir, options.assignment)
    print(f"wrote {grades.name} and {exercises.name} in {grades.parent}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one course command; see the module docstring for the sub-commands.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when nbgrader or the input failed, 2 for usage.
    """
    options = _parser().parse_args(argv)
    if not options.course_dir:
        print("error: name the course folder with --course-dir or COURSE_DIR, a folder "
              "outside the clone, e.g. COURSE_DIR=$HOME/attention-course", file=sys.stderr)
        return 2
    handlers = {"generate": _generate, "scan": _scan, "autograde": _autograde,
                "feedback": _feedback, "export": _export}
    try:
        return handlers[options.command](options)
    except (ValueError, TypeError, NbgraderError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


__all__ = ["main", "run_nbgrader"]
