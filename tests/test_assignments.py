"""Every chapter becomes an nbgrader assignment that hides its solutions.

``build_assignments`` copies *every* chapter into ``source/`` of a course folder outside the
clone (created with ``new=True``, as ``make assignments … NEW=1`` does) and runs ``nbgrader
generate_assignment``; every student version is checked for leaked solution or hidden-test
text, for the ``raise NotImplementedError()`` stub in each answer cell, and for the checker
call still in each check cell. Nothing is written into the repository.

That every chapter's solutions get full marks and its student version zero, graded as the
course grades (in clean processes), is ``tests/test_classroom_clean.py``; the whole course
workflow with nbgrader, students and cheats is ``tests/test_classroom_scenario.py``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import (
    BEGIN_SOLUTION,
    build_assignments,
    chapter_number,
    find_chapters,
    leaked_solution_text,
    main,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)
@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A temporary nbgrader course with every chapter generated."""
    return tmp_path_factory.mktemp("classroom") / "course"


@pytest.fixture(scope="module")
def released(course) -> dict[str, Path]:
    """Generate the student version of every chapter (``make assignments``)."""
    build = build_assignments(ROOT, course, new=True)
    assert build.skipped == {}
    return build.released


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


def test_chapter_00_is_there():
    assert any(chapter_number(path) == 0 for path in CHAPTERS), "chapters/00_*.ipynb is missing"


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
    assert main(["generate", "--root", str(tmp_path / "repo"), "--course-dir", str(course),
                 "--new"]) == 1
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
                 "--chapters", "02", "99", "--new"]) == 1
    err = capsys.readouterr().err
    assert "no chapter matches '99'" in err and "02_dot_product_attention" in err


def test_a_typo_in_the_course_folder_never_starts_a_new_course(tmp_path, capsys):
    course = tmp_path / "attention-cuorse"
    assert main(["generate", "--root", str(ROOT), "--course-dir", str(course),
                 "--chapters", "02"]) == 1
    err = capsys.readouterr().err
    assert "no course at" in err and "NEW=1" in err  # and how to create one
    assert not course.exists()
