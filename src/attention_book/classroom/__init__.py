"""Turn the book's chapters into nbgrader assignments and run a course with them.

Every chapter notebook (``chapters/NN_name.ipynb``) is the *instructor* version of an
assignment: its exercises carry nbgrader's cell metadata and markers (see
``CONTRIBUTING.md``). This package builds an nbgrader course folder from them, outside the
clone, and wraps the nbgrader commands that need the book's care:

- :mod:`.course`: ``generate`` -- the configuration (the instructor's ``nbgrader_config.py``
  is written once and kept; the book's own settings live in ``attention_book_config.py``),
  student versions of the chosen chapters only, chapters with submissions left alone, the
  real cause printed when nbgrader refuses;
- :mod:`.clean`, :mod:`.remote` and :mod:`.sandbox`: each exercise graded in clean
  processes (the answer cell alone, sandboxed, called from the trusted hidden tests);
  :mod:`.scan`: what the grader reads in an answer's source before it runs (forbidden names,
  reflection); :mod:`.processes`: every process of a run ends with it;
- :mod:`.grading`: ``autograde`` (nbgrader's run for the feedback, the clean grade, flags
  that no rerun undoes) and ``export`` (only what was handed in, one row per exercise);
- :mod:`.feedback`: feedback without hidden tests, package tracebacks or endless output;
- :mod:`.sanitise`: what the formgrader and a feedback page show of a student's notebook,
  with every output and written answer made inert;
- :mod:`.hub`: the configuration of a JupyterHub course;
- :mod:`.format` and :mod:`.leaks`: the exercise format and the leak check.

Run it with ``make assignments COURSE_DIR=… CHAPTERS="02 04"`` or
``python -m attention_book.classroom COMMAND`` (see :mod:`.cli`)::

    $COURSE_DIR/
        nbgrader_config.py          yours: written once, loads the book's settings first
        attention_book_config.py    the book's settings (rewritten by every generate)
        gradebook.db                nbgrader's SQLite gradebook
        source/NN_name/NN_name.ipynb    instructor versions (copied from chapters/)
        release/NN_name/NN_name.ipynb   student versions (generated)

nbgrader is an instructor tool, not a dependency of the package: it is only imported
(or run) by the functions that need it.

Not taught in a chapter: chapter 0 shows the exercise format, the instructor guide
(``instructor_guide.md``) shows how to run a course.
"""

from __future__ import annotations

import importlib

# What each public name is imported from. The names load on first use (PEP 562), so that
# importing one module of the package (the grading process imports .clean, a kernel
# .sandbox) does not import the rest: .cli and .course import nbformat, whose schema
# checker takes a second to import.
_MODULES = ("clean", "cli", "course", "feedback", "format", "grading", "handover", "hub",
            "integrity", "landlock", "leaks", "practice", "processes", "remote", "sandbox",
            "sanitise", "scan", "simulate", "syscalls")
_WHERE = {
    "ExerciseResult": "clean",
    "Limits": "clean",
    "grade_submissions": "clean",
    "main": "cli",
    "COURSE_ID": "course",
    "CourseBuild": "course",
    "NbgraderError": "course",
    "build_assignments": "course",
    "check_course_dir": "course",
    "generate_assignments": "course",
    "nbgrader_errors": "course",
    "prepare_course": "course",
    "run_nbgrader": "course",
    "select_chapters": "course",
    "submissions_of": "course",
    "write_course_config": "course",
    "write_feedback": "feedback",
    "BEGIN_HIDDEN": "format",
    "BEGIN_SOLUTION": "format",
    "END_HIDDEN": "format",
    "END_SOLUTION": "format",
    "STUBS": "format",
    "ExerciseSummary": "format",
    "chapter_number": "format",
    "exercise_format_problems": "format",
    "exercise_of": "format",
    "find_chapters": "format",
    "summarise_exercises": "format",
    "AutogradeReport": "grading",
    "StudentGrade": "grading",
    "autograde": "grading",
    "course_folder": "grading",
    "exercise_scores": "grading",
    "export_grades": "grading",
    "read_flags": "grading",
    "released_assignments": "grading",
    "resolve_assignment": "grading",
    "leaked_solution_text": "leaks",
}


__all__ = [
    "COURSE_ID",
    "AutogradeReport",
    "CourseBuild",
    "ExerciseResult",
    "Limits",
    "NbgraderError",
    "StudentGrade",
    "autograde",
    "check_course_dir",
    "course_folder",
    "export_grades",
    "exercise_of",
    "exercise_scores",
    "grade_submissions",
    "nbgrader_errors",
    "read_flags",
    "released_assignments",
    "resolve_assignment",
    "write_feedback",
    "select_chapters",
    "submissions_of",
    "write_course_config",
    "BEGIN_HIDDEN",
    "BEGIN_SOLUTION",
    "END_HIDDEN",
    "END_SOLUTION",
    "STUBS",
    "ExerciseSummary",
    "chapter_number",
    "main",
    "build_assignments",
    "exercise_format_problems",
    "find_chapters",
    "generate_assignments",
    "leaked_solution_text",
    "prepare_course",
    "run_nbgrader",
    "summarise_exercises",
]


def __getattr__(name: str):
    if name in _MODULES:  # a module of the package, as `import attention_book.classroom` gave
        return importlib.import_module(f".{name}", __name__)
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # the next use finds it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE) | set(_MODULES))
