"""End to end: the chapters become nbgrader assignments, and autograding them works.

What runs (once per test session, in a temporary nbgrader course, nothing written into
the repository):

1. ``build_assignments`` copies *every* chapter into ``source/`` of a course folder outside
   the clone and runs ``nbgrader generate_assignment``; every student version is checked for leaked
   solution or hidden-test text, for the ``raise NotImplementedError()`` stub in each
   answer cell, and for the checker call still in each check cell.
2. For a representative subset of chapters, two submissions are autograded with
   ``nbgrader autograde``: the instructor notebook (solutions in) as student
   ``instructor-key`` and the untouched student notebook as student ``blank-student``.
   Scores are read from the gradebook: the key gets full marks on every autograded cell,
   the blank notebook gets zero on every one, and the tamper scan finds nothing in either.

The autograde subset (autograding executes a whole chapter twice, and all chapters
would take too long on 2 cores): chapter 00, which demonstrates the exercise format,
plus the first and the last chapter numbered 01 or above that exist when the test
runs -- the first chapters are the simplest code, the last ones build on everything
before, so the two ends cover both kinds of exercises. :func:`autograde_subset` is the
rule; generation and the leak check still cover every chapter.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import (
    BEGIN_SOLUTION,
    autograded_scores,
    build_assignments,
    chapter_number,
    find_chapters,
    leaked_solution_text,
    main,
    run_nbgrader,
)
from attention_book.classroom.grading import scan_submissions

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)
KEY, BLANK = "instructor-key", "blank-student"


def autograde_subset(chapters: list[Path]) -> list[Path]:
    """Chapter 00 plus the first and last chapter numbered 01 or above (see module doc)."""
    demo = [path for path in chapters if chapter_number(path) == 0]
    real = [path for path in chapters if chapter_number(path) >= 1]
    ends = [real[0], real[-1]] if real else []
    return list(dict.fromkeys(demo + ends))


SUBSET = autograde_subset(CHAPTERS)


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A temporary nbgrader course with every chapter generated."""
    return tmp_path_factory.mktemp("classroom") / "course"


@pytest.fixture(scope="module")
def released(course) -> dict[str, Path]:
    """Generate the student version of every chapter (``make assignments``)."""
    build = build_assignments(ROOT, course)
    assert build.skipped == {}
    return build.released


@pytest.fixture(scope="module")
def autograded(course, released) -> Path:
    """Submit the key and the blank notebook for the subset, then autograde them all."""
    for chapter in SUBSET:
        assignment = chapter.stem
        for student, notebook in [(KEY, chapter), (BLANK, released[assignment])]:
            folder = course / "submitted" / student / assignment
            folder.mkdir(parents=True)
            shutil.copyfile(notebook, folder / f"{assignment}.ipynb")
    run_nbgrader(course, "autograde", "*", "--force")
    return course


def _cells(path: Path, *, solution: bool | None = None, grade: bool | None = None):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader")
        if not meta:
            continue
        if solution is not None and bool(meta.get("solution")) != solution:
            continue
        if grade is not None and bool(meta.get("grade")) != grade:
            continue
        yield cell


def _without_hidden_tests(source: str):
    hidden = False
    for line in source.splitlines():
        if "### BEGIN HIDDEN TESTS" in line:
            hidden = True
        elif "### END HIDDEN TESTS" in line:
            hidden = False
        elif not hidden:
            yield line


def test_chapter_00_is_there_to_autograde():
    assert any(chapter_number(path) == 0 for path in CHAPTERS), "chapters/00_*.ipynb is missing"
    assert len(SUBSET) >= 2, f"autograde subset too small: {[p.name for p in SUBSET]}"


def test_every_chapter_has_a_student_version(released):
    assert sorted(released) == sorted(path.stem for path in CHAPTERS)
    for student in released.values():
        assert student.exists()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_student_version_hides_solutions_and_keeps_checkers(chapter, released):
    instructor = nbformat.read(chapter, as_version=4)
    student_path = released[chapter.stem]
    student = nbformat.read(student_path, as_version=4)
    assert leaked_solution_text(instructor, student) == []
    assert all(not cell.get("outputs") for cell in student.cells), "outputs must be cleared"
    for cell in _cells(student_path, solution=True):
        if cell.cell_type == "code":
            assert "raise NotImplementedError()" in cell.source, cell.source
        else:
            assert cell.source.strip() == "YOUR ANSWER HERE", cell.source
    # Each check cell keeps its visible part, which calls an attention_book checker.
    key_checks = {cell.metadata["nbgrader"]["grade_id"]: cell.source
                  for cell in _cells(chapter, solution=False, grade=True)}
    student_checks = {cell.metadata["nbgrader"]["grade_id"]: cell.source
                      for cell in _cells(student_path, solution=False, grade=True)}
    assert student_checks.keys() == key_checks.keys()
    for grade_id, source in student_checks.items():
        assert "check_" in source, f"{grade_id} lost its checker call"
        visible = list(_without_hidden_tests(key_checks[grade_id]))
        assert source.strip() == "\n".join(visible).strip()


@pytest.mark.parametrize("chapter", SUBSET, ids=lambda path: path.stem)
def test_instructor_key_gets_full_marks(chapter, autograded):
    scores = autograded_scores(autograded, chapter.stem, KEY)
    assert scores, f"{chapter.name} has no autograded cells"
    missed = {name: score for name, score in scores.items() if score[0] != score[1]}
    assert missed == {}, f"the solutions lose points in {chapter.name}: {missed}"


@pytest.mark.parametrize("chapter", SUBSET, ids=lambda path: path.stem)
def test_untouched_student_notebook_gets_zero(chapter, autograded):
    scores = autograded_scores(autograded, chapter.stem, BLANK)
    assert scores, f"{chapter.name} has no autograded cells"
    earned = {name: score for name, score in scores.items() if score[0] != 0}
    assert earned == {}, f"an empty answer earns points in {chapter.name}: {earned}"


@pytest.mark.parametrize("chapter", SUBSET, ids=lambda path: path.stem)
def test_key_and_blank_submissions_scan_clean(chapter, autograded):
    results = scan_submissions(autograded, chapter.stem)
    assert sorted(r.student for r in results) == sorted([KEY, BLANK])
    for result in results:
        assert result.scan.findings == [], [f.describe() for f in result.scan.findings]
        assert result.scan.missing_locked == []


def test_leak_detector_finds_solution_text():
    """The leak check itself can fail: a student copy with the solution in is caught."""
    answer = nbformat.v4.new_code_cell(
        f"def f(x):\n    {BEGIN_SOLUTION}\n    secret = x * 2\n    return secret\n"
        "    ### END SOLUTION")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "ch00-ex1-answer"}
    check = nbformat.v4.new_code_cell(
        "check_f(f)\n### BEGIN HIDDEN TESTS\nassert f(1) == 2\n### END HIDDEN TESTS")
    check.metadata["nbgrader"] = {"solution": False, "grade": True, "grade_id": "ch00-ex1-check"}
    instructor = nbformat.v4.new_notebook(cells=[answer, check])
    clean = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()"),
        nbformat.v4.new_code_cell("check_f(f)"),
    ])
    assert leaked_solution_text(instructor, clean) == []
    leaky = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(x):\n    secret = x * 2"),
        nbformat.v4.new_code_cell("check_f(f)\nassert f(1) == 2"),
    ])
    assert leaked_solution_text(instructor, leaky) == ["secret = x * 2", "assert f(1) == 2"]
    assert leaked_solution_text(instructor, instructor) != []


def test_command_fails_clearly_without_chapters(tmp_path, capsys):
    (tmp_path / "repo" / "chapters").mkdir(parents=True)
    course = tmp_path / "course"
    assert main(["generate", "--root", str(tmp_path / "repo"), "--course-dir", str(course)]) == 1
    assert "no chapter notebooks" in capsys.readouterr().err
    assert not (course / "source").exists()


def test_command_needs_a_course_folder_outside_the_clone(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COURSE_DIR", raising=False)
    assert main(["generate", "--root", str(ROOT)]) == 2
    assert "COURSE_DIR" in capsys.readouterr().err
    assert main(["generate", "--root", str(ROOT), "--course-dir", str(ROOT / "build" / "c")]) == 1
    assert "inside the repository" in capsys.readouterr().err
    assert not (ROOT / "build" / "c").exists()


def test_command_names_an_unknown_chapter(tmp_path, capsys):
    assert main(["generate", "--root", str(ROOT), "--course-dir", str(tmp_path / "c"),
                 "--chapters", "02", "99"]) == 1
    err = capsys.readouterr().err
    assert "no chapter matches '99'" in err and "02_dot_product_attention" in err
