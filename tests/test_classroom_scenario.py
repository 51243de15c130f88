"""The classroom trial's four students, as a test: chapters 02 and 04 graded end to end.

One course (in a temporary folder outside the clone) goes through ``generate`` (chapters
00, 02 and 04; 00 is never handed in), hand-in (``submitted/<student>/…``, the guide's local
path), the tamper-aware ``autograde``, manual scores for the written answers through the
gradebook API, ``feedback`` and ``export``. Every answer is derived from the instructor
notebook (:mod:`attention_book.classroom.simulate`), so the test keeps working when the
chapters' exercises change:

- A: every solution -> full marks;
- B: one subtle mistake per chapter (the solution of one exercise, 10 % off) and a partial
  written answer -> total minus that exercise's points, 3 of 5 for the written answer;
- C: the untouched student version -> 0;
- D: a different cheat in each exercise -> 0: a check cell edited to print "Correct", a
  checker rebound, the feedback helpers and ``torch.testing`` patched (next to a *correct*
  answer, so only the tamper scan takes the points), a check cell deleted (nbgrader adds it
  back), the checker's first visible value hard-coded, a rebound checker with no code at
  all; the written answer is the public model answer, which the instructor scores 0.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import (
    NbgraderError,
    autograde,
    build_assignments,
    chapter_number,
    exercise_scores,
    export_grades,
    generate_assignments,
    leaked_solution_text,
    run_nbgrader,
    summarise_exercises,
    write_course_config,
)
from attention_book.classroom.simulate import (
    PATCH_HELPERS,
    chapter_imports,
    code_exercises,
    hard_coded,
    mistaken,
    notebook_with,
    rebind_checkers,
    written_answers,
)
from attention_book.classroom.tamper import exercise_of

ROOT = Path(__file__).resolve().parents[1]
GRADED = ["02_dot_product_attention", "04_scaling"]
CHEATS = ["edit-check", "rebind", "patch-helpers", "delete-check", "hard-code",
          "rebind-no-code"]
WRITTEN = {"A": 5.0, "B": 3.0, "C": 0.0, "D": 0.0}  # the instructor's manual scores, of 5


def _mistake_target(exercises):
    """B's mistake: the exercise with the most points among one-check, one-function ones."""
    candidates = [e for e in exercises if len(e.check_ids) == 1 and len(e.functions) == 1
                  and "class " not in e.solution]
    assert candidates, "no exercise can take a subtle mistake"
    return max(reversed(candidates), key=lambda e: e.points)


def _cheat(kind, exercise, imports, release):
    """(answers, checks) of student D for one exercise."""
    stub = next(cell.source for cell in release.cells
                if cell.metadata.get("nbgrader", {}).get("grade_id") == exercise.answer_id)
    wrong = mistaken(exercise) if len(exercise.functions) == 1 else stub
    if kind == "edit-check":
        return {exercise.answer_id: wrong}, {cid: 'print("Correct: all checks passed")'
                                             for cid in exercise.check_ids}
    if kind == "rebind":
        return {exercise.answer_id: wrong + "\n" + rebind_checkers(exercise)}, {}
    if kind == "patch-helpers":
        return {exercise.answer_id: exercise.solution + "\n\n" + PATCH_HELPERS}, {}
    if kind == "delete-check":
        return {}, dict.fromkeys(exercise.check_ids)
    if kind == "hard-code":
        return {exercise.answer_id: hard_coded(exercise, imports)}, {}
    names = "".join(f"{name} = None\n" for name in exercise.functions)
    return {exercise.answer_id: names + rebind_checkers(exercise)}, {}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Generate, hand in, autograde, grade by hand, give feedback and export."""
    course = tmp_path_factory.mktemp("scenario") / "course"
    build = build_assignments(ROOT, course, ["00", "02", "04"])
    expected, plan, cheat_index = {}, {}, 0
    for assignment in GRADED:
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        release = nbformat.read(build.released[assignment], as_version=4)
        exercises = code_exercises(instructor)
        imports = chapter_imports(instructor)
        written = written_answers(instructor)
        right = {e.answer_id: e.solution for e in exercises}
        target = _mistake_target(exercises)
        notebooks = {
            "A": notebook_with(release, {**right, **written}),
            "B": notebook_with(release, {**right, target.answer_id: mistaken(target),
                                         **dict.fromkeys(written, "The variance grows with d_k.")}),
            "C": release,
        }
        d_answers, d_checks = dict(written), {}
        for exercise in exercises:
            kind = CHEATS[cheat_index % len(CHEATS)]
            cheat_index += 1
            if kind == "hard-code" and (len(exercise.functions) != 1 or not exercise.checkers):
                kind = "rebind"
            plan[(assignment, exercise.exercise)] = kind
            answers, checks = _cheat(kind, exercise, imports, release)
            d_answers.update(answers)
            d_checks.update(checks)
        notebooks["D"] = notebook_with(release, d_answers, d_checks)
        for student, notebook in notebooks.items():
            folder = course / "submitted" / f"student{student}" / assignment
            folder.mkdir(parents=True)
            nbformat.write(notebook, folder / f"{assignment}.ipynb")
        for exercise in exercises:
            for student in "ABCD":
                score = exercise.points if student == "A" or (
                    student == "B" and exercise is not target) else 0.0
                expected[(assignment, f"student{student}", exercise.exercise)] = score
        for grade_id in written:
            for student in "ABCD":
                expected[(assignment, f"student{student}", exercise_of(grade_id))] = \
                    WRITTEN[student]
    results = {assignment: autograde(course, assignment) for assignment in GRADED}
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for assignment in GRADED:
            instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
            for grade_id in written_answers(instructor):
                for student, score in WRITTEN.items():
                    grade = gradebook.find_grade(grade_id, assignment, assignment,
                                                 f"student{student}")
                    grade.manual_score = score
        gradebook.db.commit()
    for assignment in GRADED:
        run_nbgrader(course, "generate_feedback", assignment, "--force")
    grades, by_exercise = export_grades(course)
    return {"course": course, "build": build, "results": results, "expected": expected,
            "plan": plan, "grades": grades, "exercises": by_exercise}


def test_every_cheat_kind_is_exercised(scenario):
    assert set(scenario["plan"].values()) == set(CHEATS), scenario["plan"]


def test_exported_scores_per_exercise_are_exact(scenario):
    rows = exercise_scores(scenario["course"])
    actual = {(r["assignment"], r["student"], r["exercise"]): r["score"] for r in rows}
    assert actual == scenario["expected"]
    with scenario["exercises"].open(encoding="utf-8") as handle:
        exported = {(r["assignment"], r["student"], r["exercise"]): float(r["score"])
                    for r in csv.DictReader(handle)}
    assert exported == scenario["expected"]


def test_grades_csv_has_the_totals_and_only_handed_in_chapters(scenario):
    with scenario["grades"].open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    totals = {}
    for (assignment, student, _), score in scenario["expected"].items():
        totals[(assignment, student)] = totals.get((assignment, student), 0.0) + score
    assert {(r["assignment"], r["student_id"]): float(r["score"]) for r in rows} == totals
    assert "00_how_to_use" in scenario["build"].released  # generated, never handed in
    assert {r["assignment"] for r in rows} == set(GRADED)
    # A gets every point of the chapter; C and D get none.
    by_student = {(r["assignment"], r["student_id"]): float(r["score"]) for r in rows}
    for assignment in GRADED:
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        total = summarise_exercises(instructor, chapter_number(f"{assignment}.ipynb")).total
        assert by_student[(assignment, "studentA")] == total
        assert by_student[(assignment, "studentC")] == by_student[(assignment, "studentD")] == 0


def test_honest_submissions_are_clean_and_every_cheat_is_reported(scenario):
    for assignment, results in scenario["results"].items():
        scans = {result.student: result.scan for result in results}
        for student in ("studentA", "studentB", "studentC"):
            assert scans[student].clean, (assignment, student, scans[student].findings)
            assert scans[student].edited_locked == [] and scans[student].missing_locked == []
        kinds = {kind for (a, _), kind in scenario["plan"].items() if a == assignment}
        d = scans["studentD"]
        if "edit-check" in kinds:
            assert d.edited_locked, "the edited check cell was not reported"
        if "delete-check" in kinds:
            assert d.missing_locked, "the deleted check cell was not reported"
        if {"rebind", "patch-helpers", "rebind-no-code"} & kinds:
            assert d.findings and d.tainted


def test_the_scan_takes_the_points_of_a_correct_answer_next_to_a_patch(scenario):
    """Only the scan stops this cheat: the answer is right, the patch sits next to it."""
    (assignment, exercise), = [key for key, kind in scenario["plan"].items()
                               if kind == "patch-helpers"]
    result = next(r for r in scenario["results"][assignment] if r.student == "studentD")
    zeroed = {grade_id: old for grade_id, old in result.zeroed.items()
              if exercise_of(grade_id) == exercise}
    assert zeroed, "the patched exercise kept its autograded score"
    assert all(old and old > 0 for old in zeroed.values()), \
        f"the correct answer should have passed before the scan: {zeroed}"
    row = next(r for r in exercise_scores(scenario["course"], [assignment])
               if r["student"] == "studentD" and r["exercise"] == exercise)
    assert row["score"] == 0
    assert row["comment"].startswith("Tamper scan") and "_fb.fail" in row["comment"]


def test_feedback_hides_hidden_tests_paths_and_package_tracebacks(scenario):
    course = scenario["course"]
    for assignment in GRADED:
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        hidden = [line.strip() for cell in instructor.cells
                  for line in cell.source.split("### BEGIN HIDDEN TESTS", 1)[1:]
                  for line in line.split("### END HIDDEN TESTS")[0].splitlines()
                  if line.strip()]
        for student in ("studentA", "studentB", "studentD"):
            html = (course / "feedback" / student / assignment / f"{assignment}.html").read_text(
                encoding="utf-8")
            assert "BEGIN HIDDEN TESTS" not in html
            for line in hidden:
                assert line not in html, f"{student}'s feedback shows the hidden test {line!r}"
            assert str(course) not in html and str(ROOT) not in html
            assert "site-packages" not in html and "_feedback.py" not in html
    b = (course / "feedback" / "studentB" / GRADED[0] / f"{GRADED[0]}.html").read_text(
        encoding="utf-8")
    messages = re.findall(r"Not yet[.:][^\n<]+", b)
    assert messages, "B's feedback lost the checker's message"
    assert len(messages) == len(set(messages)), f"a message appears twice: {messages}"


def test_rerun_keeps_the_course_and_skips_chapters_with_submissions(scenario, tmp_path):
    course = tmp_path / "course"
    shutil.copytree(scenario["course"], course)
    config = course / "nbgrader_config.py"
    config.write_text(config.read_text() + 'c.Exchange.root = "/srv/exchange"\n')
    release = course / "release" / GRADED[0] / f"{GRADED[0]}.ipynb"
    before = release.read_bytes()
    build = build_assignments(ROOT, course, ["02", "04"])
    assert set(build.skipped) == set(GRADED) and build.released == {}
    assert release.read_bytes() == before
    assert 'c.Exchange.root = "/srv/exchange"' in config.read_text()
    assert "add_missing_cells = True" in (course / "attention_book_config.py").read_text()


def test_nbgrader_refusal_names_the_real_cause(scenario, tmp_path):
    """D5: an upstream change that adds a graded cell after submissions."""
    course = tmp_path / "course"
    shutil.copytree(scenario["course"], course)
    source = course / "source" / GRADED[0] / f"{GRADED[0]}.ipynb"
    notebook = nbformat.read(source, as_version=4)
    extra = nbformat.v4.new_code_cell("assert True")
    extra.metadata["nbgrader"] = {"grade": True, "grade_id": "ch02-ex9-check", "locked": True,
                                  "points": 1, "schema_version": 3, "solution": False,
                                  "task": False}
    notebook.cells.append(extra)
    nbformat.write(notebook, source)
    write_course_config(course)  # the copy's own root, as generate would write it
    with pytest.raises(NbgraderError, match="Cannot add or remove cells") as caught:
        generate_assignments(course, [GRADED[0]])
    assert "see the above traceback" not in str(caught.value).lower()


def test_student_versions_hold_no_solutions(scenario):
    for assignment, path in scenario["build"].released.items():
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        assert leaked_solution_text(instructor, nbformat.read(path, as_version=4)) == []
