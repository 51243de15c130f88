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

from .course import (
    autograded_scores,
    build_assignments,
    generate_assignments,
    main,
    prepare_course,
    run_nbgrader,
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
from .leaks import leaked_solution_text

__all__ = [
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
