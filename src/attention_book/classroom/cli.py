"""``python -m attention_book.classroom``: the course commands behind ``make assignments``.

Sub-commands (each takes ``--course-dir``, a folder outside the clone)::

    generate [--chapters 02 04] [--new] [--root .] [--course-id ID]
        student versions of the chosen chapters (default: all); safe to rerun; ``--new``
        creates the course folder the first time (without it a missing course is an error)
    autograde ASSIGNMENT [--student ID ...] [--jobs N] [--unsafe-no-isolation]
        grade every submission in clean processes, N students at a time (nbgrader then
        re-runs each notebook in a sandboxed kernel for the feedback); ASSIGNMENT may be a
        chapter number (02); without kernel-enforced isolation it refuses unless told
        --unsafe-no-isolation
    feedback ASSIGNMENT [--student ID ...]
        feedback pages for students (hidden tests and package tracebacks left out)
    export [--assignment ID ...]
        grades.csv and exercises.csv of the assignments handed in
    sandbox
        say which kernel-enforced layers this machine gives graded code

Not taught in a chapter: the instructor guide (``instructor_guide.md``) shows every command.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat

from .course import COURSE_ID, NbgraderError, build_assignments
from .feedback import write_feedback
from .format import chapter_number, exercise_format_problems, summarise_exercises
from .grading import autograde, autograde_summary, export_grades
from .integrity import PackageChanged


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
    generate.add_argument("--new", action="store_true",
                          help="create the course folder (the first time only)")
    generate.add_argument("--root", default=".", help="repository root (default: .)")
    generate.add_argument("--course-id", default=COURSE_ID,
                          help=f"nbgrader course id (default: {COURSE_ID})")
    for name, text in [("autograde", "grade every submission in clean processes"),
                       ("feedback", "feedback pages for students")]:
        sub = command(name, text)
        sub.add_argument("assignment", nargs="?", default="",
                         help="assignment id or chapter number, e.g. 02_dot_product_attention "
                              "or 02")
        sub.add_argument("--student", action="append", default=None,
                         help="only this student id (repeat for several)")
        if name == "autograde":
            sub.add_argument("--jobs", type=int, default=None,
                             help="students graded at once (default: the number of cores)")
            sub.add_argument("--unsafe-no-isolation", action="store_true",
                             help="grade even without kernel-enforced isolation; every grade "
                                  "of the run is marked UNPROTECTED")
    export = command("export", "grades.csv and exercises.csv of the handed-in assignments")
    export.add_argument("--assignment", action="append", default=None,
                        help="only this assignment (repeat; default: every one handed in)")
    command("sandbox", "which kernel-enforced layers graded code gets here")
    return parser


def _students(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    names = [name for value in values for name in value.split() if name]
    return names or None


def _generate(options) -> int:
    root = Path(options.root)
    chapters = options.chapters if options.chapters else None
    if chapters and len(chapters) == 1 and " " in chapters[0]:
        chapters = chapters[0].split()
    build = build_assignments(root, options.course_dir, chapters, options.course_id,
                              new=options.new)
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


def _autograde(options) -> int:
    if options.jobs is not None and options.jobs < 1:
        raise ValueError(f"--jobs must be a positive number of students, got {options.jobs}")
    report = autograde(options.course_dir, options.assignment, _students(options.student),
                       jobs=options.jobs, unsafe=options.unsafe_no_isolation)
    count = len(report.students)
    print(f"graded {count} submission(s) of {report.assignment} in {report.seconds:.0f} s "
          f"({report.seconds / max(count, 1):.1f} s a student)")
    for line in autograde_summary(report):
        print(f"  {line}")
    print(f"every exercise of every student, with its cause: {report.summary}")
    return 0


def _feedback(options) -> int:
    written = write_feedback(options.course_dir, options.assignment, _students(options.student))
    for line in written:
        print(line)
    return 0


def _export(options) -> int:
    grades, exercises = export_grades(options.course_dir, options.assignment)
    print(f"wrote {grades.name} and {exercises.name} in {grades.parent}")
    return 0


def _sandbox(options) -> int:
    from .sandbox import available_layers

    layers = available_layers()
    print(f"graded code here runs under: {layers.describe()}")
    if not layers.protected:
        print("autograde refuses to grade here unless told --unsafe-no-isolation; see the "
              "instructor guide")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one course command; see the module docstring for the sub-commands.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when nbgrader or the input failed, 2 for usage.
    """
    options = _parser().parse_args(argv)
    if options.command == "sandbox":
        return _sandbox(options)
    if not options.course_dir:
        print("error: name the course folder with --course-dir or COURSE_DIR, a folder "
              "outside the clone, e.g. COURSE_DIR=$HOME/attention-course", file=sys.stderr)
        return 2
    handlers = {"generate": _generate, "autograde": _autograde, "feedback": _feedback,
                "export": _export}
    try:
        return handlers[options.command](options)
    except (ValueError, TypeError, NbgraderError, PackageChanged) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


__all__ = ["main"]
