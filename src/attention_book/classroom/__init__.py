"""Turn the book's chapters into nbgrader assignments and run a course with them.

Every chapter notebook (``chapters/NN_name.ipynb``) is the *instructor* version of an
assignment: its exercises carry nbgrader's cell metadata and markers (see
``CONTRIBUTING.md``). This package builds an nbgrader course folder from them, outside the
clone, and wraps the nbgrader commands that need the book's care:

- :mod:`.course`: ``generate`` -- the configuration (the instructor's ``nbgrader_config.py``
  is written once and kept; the book's own settings live in ``attention_book_config.py``),
  student versions of the chosen chapters only, chapters with submissions left alone, the
  real cause printed when nbgrader refuses;
- :mod:`.tamper`: the tamper scan of submissions (answer and scratch cells that switch a
  check off);
- :mod:`.grading`: ``autograde`` (nbgrader, then tainted exercises set to 0) and ``export``
  (only what was handed in, plus one row per exercise);
- :mod:`.feedback`: feedback without hidden tests or the package's tracebacks;
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

from .cli import main
from .course import (
    COURSE_ID,
    CourseBuild,
    NbgraderError,
    autograded_scores,
    build_assignments,
    check_course_dir,
    generate_assignments,
    nbgrader_errors,
    prepare_course,
    run_nbgrader,
    select_chapters,
    submissions_of,
    write_course_config,
)
from .format import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    END_HIDDEN,
    END_SOLUTION,
    STUBS,
    ExerciseSummary,
    chapter_number,
    exercise_format_problems,
    find_chapters,
    summarise_exercises,
)
from .grading import autograde, exercise_scores, export_grades, released_assignments
from .leaks import leaked_solution_text
from .tamper import Finding, ScanReport, scan_notebook, scan_source

__all__ = [
    "COURSE_ID",
    "CourseBuild",
    "Finding",
    "NbgraderError",
    "ScanReport",
    "autograde",
    "check_course_dir",
    "export_grades",
    "exercise_scores",
    "nbgrader_errors",
    "released_assignments",
    "scan_notebook",
    "scan_source",
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
