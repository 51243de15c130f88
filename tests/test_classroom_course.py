"""The course workflow's parts that need no nbgrader run: config, chapters, errors, feedback.

The end-to-end runs are ``tests/test_classroom_scenario.py`` (four students, local) and
``tests/test_jupyterhub.py`` (a real hub); these fast tests pin down the rules they rely on.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from traitlets.config.loader import PyFileConfigLoader

from attention_book.classroom import nbgrader_errors, select_chapters, write_course_config
from attention_book.classroom.course import BOOK_CONFIG, check_course_dir
from attention_book.classroom.feedback import (
    HIDDEN_NOTE,
    StudentFeedback,
    shorten_paths,
    strip_hidden_tests,
)
from attention_book.classroom.hub import course_roster_lines, exchange_config, jupyterhub_config

ROOT = Path(__file__).resolve().parents[1]


def _load(course: Path):
    return PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()


# --------------------------------------------------------------------------- config


def test_config_is_written_once_and_loads_the_books_settings(tmp_path):
    done = write_course_config(tmp_path)
    assert any("wrote nbgrader_config.py" in line for line in done)
    config = _load(tmp_path)
    assert config.OverwriteCells.add_missing_cells is True
    assert config.CourseDirectory.course_id == "attention-step-by-step"
    assert "attention_book.classroom.feedback.StudentFeedback" in \
        config.GenerateFeedback.preprocessors

    instructor = tmp_path / "nbgrader_config.py"
    instructor.write_text(instructor.read_text() + 'c.Exchange.root = "/srv/ex"\n'
                          'c.CourseDirectory.course_id = "my-course"\n')
    (tmp_path / BOOK_CONFIG).write_text("c = get_config()\n")  # stale: generate rewrites it
    done = write_course_config(tmp_path)
    assert any("kept your nbgrader_config.py" in line for line in done)
    config = _load(tmp_path)
    assert config.Exchange.root == "/srv/ex"
    assert config.CourseDirectory.course_id == "my-course"  # the instructor's line wins
    assert config.OverwriteCells.add_missing_cells is True


def test_an_old_config_gets_the_load_line_and_keeps_every_line(tmp_path):
    old = ('c = get_config()\nc.CourseDirectory.root = "/old"\n'
           'c.Exchange.root = "/srv/nbgrader/exchange"\n')
    (tmp_path / "nbgrader_config.py").write_text(old)
    done = write_course_config(tmp_path)
    assert any("added one line" in line for line in done)
    text = (tmp_path / "nbgrader_config.py").read_text()
    assert all(line in text for line in old.splitlines())
    config = _load(tmp_path)
    assert config.Exchange.root == "/srv/nbgrader/exchange"
    assert config.CourseDirectory.root == "/old"
    assert config.OverwriteCells.add_missing_cells is True


def test_course_id_is_checked(tmp_path):
    with pytest.raises(ValueError, match="course_id"):
        write_course_config(tmp_path, "two words")


def test_course_folder_must_be_outside_the_clone(tmp_path):
    assert check_course_dir(tmp_path / "course", ROOT) == (tmp_path / "course").resolve()
    for inside in (ROOT, ROOT / "build" / "classroom"):
        with pytest.raises(ValueError, match="inside the repository"):
            check_course_dir(inside, ROOT)


# --------------------------------------------------------------------------- chapters


def test_chapters_are_chosen_by_number_or_name():
    chosen = select_chapters(ROOT, ["04", "2", "02_dot_product_attention"])
    assert [path.stem[:2] for path in chosen] == ["02", "04"]
    assert select_chapters(ROOT, "02 04") == chosen
    assert len(select_chapters(ROOT)) == len(list((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")))
    with pytest.raises(ValueError, match="no chapter matches 'ch2'"):
        select_chapters(ROOT, ["ch2"])
    with pytest.raises(TypeError):
        select_chapters(ROOT, [2])


# --------------------------------------------------------------------------- nbgrader's log


def test_the_real_cause_is_picked_out_of_nbgrader_log():
    log = """[GenerateAssignmentApp | WARNING] Removing existing assignment: /c/release/a
[GenerateAssignmentApp | ERROR] There was an error processing assignment: /c/source/./a
[GenerateAssignmentApp | ERROR] Traceback (most recent call last):
      File "/v/nbgrader/preprocessors/savecells.py", line 36, in _create_notebook
        raise RuntimeError(
        ^^^^^^^^^^^^^^^^^^^
    RuntimeError: Cannot add or remove cells for notebook 'a' because there are submissions

[GenerateAssignmentApp | ERROR] There was an error processing assignment 'a' for student '.'
[GenerateAssignmentApp | ERROR] Please see the the above traceback for details on the specific errors.
"""
    causes = nbgrader_errors(log)
    assert causes[-1] == ("RuntimeError: Cannot add or remove cells for notebook 'a' because "
                          "there are submissions")
    assert not any("above traceback" in cause for cause in causes)
    assert nbgrader_errors("[AutogradeApp | INFO] all good\n") == []
    with pytest.raises(TypeError):
        nbgrader_errors(None)


# --------------------------------------------------------------------------- feedback


def test_hidden_tests_are_replaced_by_one_note():
    source = ("from x import check_f\n\nassert check_f(f)\n### BEGIN HIDDEN TESTS\n"
              "_x = f(2)\nassert _x == 4\n### END HIDDEN TESTS\nprint('after')")
    stripped = strip_hidden_tests(source)
    assert "_x" not in stripped and "HIDDEN TESTS" not in stripped
    assert stripped.splitlines() == ["from x import check_f", "", "assert check_f(f)",
                                     HIDDEN_NOTE, "print('after')"]


def test_paths_are_shortened():
    text = "File /root/.venv/lib/python3.11/site-packages/attention_book/x.py:12 and /tmp/a/b"
    assert shorten_paths(text) == "File …/x.py:12 and …/b"
    assert shorten_paths("see https://example.org/a/b") == "see https://example.org/a/b"


def _error_cell(source, count, frames, ename, evalue, printed=""):
    cell = nbformat.v4.new_code_cell(source)
    cell.execution_count = count
    cell.metadata["mystnb"] = {"image": {"alt": "A heatmap."}}
    outputs = []
    if printed:
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=printed))
    outputs.append(nbformat.v4.new_output("error", ename=ename, evalue=evalue,
                                          traceback=["\x1b[0;31m----\x1b[0m header", *frames,
                                                     f"{ename}: {evalue}"]))
    cell.outputs = outputs
    return cell


def test_feedback_tracebacks_keep_the_notebook_and_lose_the_package():
    source = ("check_f(f)\n### BEGIN HIDDEN TESTS\n_y = f(3)\nassert _y == 9\n"
              "### END HIDDEN TESTS")
    message = "Not yet: f(2) is 4\n  expected: 4\n  actual:   5"
    frames = ["Cell In[7], line 1\n----> 1 check_f(f)\n      2 ### BEGIN HIDDEN TESTS\n"
              "      3 _y = f(3)",
              "File /opt/venv/lib/python3.11/site-packages/attention_book/exercises/feedback.py:33,"
              " in fail\n---> 33 raise ExerciseFailure(message)"]
    visible = _error_cell(source, 7, frames, "ExerciseFailure", message, printed=message + "\n")
    hidden = _error_cell(source, 8, ["Cell In[8], line 4\n----> 4 assert _y == 9"],
                         "AssertionError", "")
    blank = _error_cell("f(1)", 9, [], "NotImplementedError", "")
    notebook = nbformat.v4.new_notebook(cells=[visible, hidden, blank])
    notebook, _ = StudentFeedback().preprocess(notebook, {})
    first = notebook.cells[0].outputs[-1]["traceback"]
    text = "\n".join(first)
    assert "check_f(f)" in text and "_y = f(3)" not in text and "HIDDEN" not in text
    assert "/opt/venv" not in text and "exercises/feedback.py" not in text
    assert first[-1] == "ExerciseFailure: see the message printed above"
    assert notebook.cells[0].source.splitlines() == ["check_f(f)", HIDDEN_NOTE]
    second = notebook.cells[1].outputs[-1]["traceback"]
    assert second[0].startswith("In a hidden test") and "_y == 9" not in "\n".join(second)
    assert "not answered yet" in notebook.cells[2].outputs[-1]["traceback"][-1]
    assert notebook.cells[0].metadata["alt"] == "A heatmap."


# --------------------------------------------------------------------------- hub config


def test_hub_config_names_the_course_accounts_and_the_proxy():
    text = jupyterhub_config(students=["ann", "bob"], instructors=["ida"],
                             bind_url="http://127.0.0.1:9000", proxy_command=["/x/chp"],
                             service_token="t0k")
    namespace = {"get_config": lambda: _Recorder()}
    exec(compile(text, "jupyterhub_config.py", "exec"), namespace)  # noqa: S102 - our own text
    assert "c.Authenticator.admin_users = {'ida'}" in text
    assert "'/x/chp'" in text and "course-admin" in text
    with pytest.raises(ValueError, match="students"):
        jupyterhub_config(students=[], instructors=["ida"])
    with pytest.raises(ValueError, match="user name"):
        jupyterhub_config(students=["a b"], instructors=["ida"])
    assert "c.Exchange.root = '/srv/ex'" in exchange_config("/srv/ex")
    assert "{'id': 'ann'}" in course_roster_lines(["ann"])


class _Recorder:
    """Accepts any ``c.X.y = value`` a config file writes."""

    def __getattr__(self, name):
        value = _Recorder()
        object.__setattr__(self, name, value)
        return value


def test_a_submission_waiting_in_the_exchange_counts(tmp_path):
    """generate must not regenerate a chapter that students submitted but nobody collected."""
    from attention_book.classroom import submissions_of

    course = tmp_path / "course"
    write_course_config(course)
    inbound = tmp_path / "exchange" / "attention-step-by-step" / "inbound"
    (inbound / "ann+02_dot_product_attention+2026-11-20 10:00:00.000000 UTC").mkdir(parents=True)
    config = course / "nbgrader_config.py"
    config.write_text(config.read_text() + f'c.Exchange.root = "{tmp_path / "exchange"}"\n')
    assert submissions_of(course, "02_dot_product_attention") == ["ann"]
    assert submissions_of(course, "04_scaling") == []


# --------------------------------------------------------------------------- autograde's rules


def _course(tmp_path: Path) -> Path:
    """A course folder with one submission of chapter 02 (the release is not needed here)."""
    course = tmp_path / "course"
    write_course_config(course)
    source = course / "source" / "02_dot_product_attention"
    source.mkdir(parents=True)
    (source / "02_dot_product_attention.ipynb").write_text(
        (ROOT / "chapters" / "02_dot_product_attention.ipynb").read_text())
    submitted = course / "submitted" / "ann" / "02_dot_product_attention"
    submitted.mkdir(parents=True)
    (submitted / "02_dot_product_attention.ipynb").write_text("{}")
    return course


def test_autograde_refuses_without_kernel_isolation_unless_told(tmp_path, monkeypatch):
    from attention_book.classroom import grading, sandbox

    course = _course(tmp_path)
    monkeypatch.setattr(sandbox, "available_layers", lambda **kwargs: sandbox.Layers())
    with pytest.raises(ValueError, match="--unsafe-no-isolation"):
        grading.autograde(course, "02")
    assert not (course / "grading" / "summary-02_dot_product_attention.csv").exists()


def test_a_package_changed_after_an_unprotected_run_is_refused(tmp_path):
    import json

    from attention_book.classroom import grading, integrity

    course = _course(tmp_path)
    now = integrity.fingerprint()
    assert integrity.changed_files(now, now) == []
    record = course / "grading" / "package.json"
    record.parent.mkdir(exist_ok=True)
    old = {**now, "classroom/clean.py": "0" * 64}
    record.write_text(json.dumps({"fingerprint": old, "protected": True}))
    grading._check_package(course, now)  # after a protected run: your own update, accepted
    record.write_text(json.dumps({"fingerprint": old, "protected": False}))
    with pytest.raises(integrity.PackageChanged, match="classroom/clean.py"):
        grading.autograde(course, "02")
    with pytest.raises(integrity.PackageChanged, match="package.json"):
        grading._check_package(course, now)


def test_two_runs_on_one_course_wait_for_each_other(tmp_path):
    import os
    import time

    from attention_book.classroom import grading

    course = _course(tmp_path)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the first run
        with grading._course_lock(course):
            os.write(write, b"locked")
            time.sleep(1.5)
        os._exit(0)
    assert os.read(read, 6) == b"locked"
    start = time.monotonic()
    with grading._course_lock(course):
        waited = time.monotonic() - start
    os.waitpid(pid, 0)
    assert waited > 1.0


def test_flags_are_written_whole_and_none_is_ever_dropped(tmp_path):
    from attention_book.classroom import grading, read_flags

    course = _course(tmp_path)
    first = {"assignment": "a", "student": "ann", "exercise": "ch02-ex1", "flag": "one"}
    known = grading._record_flags(course, [first])
    (course / "grading" / "flags.json").write_text('{"flags": []}')  # as a cheat would
    second = {**first, "flag": "two"}
    grading._record_flags(course, [second], known)
    assert {f["flag"] for f in read_flags(course)} == {"one", "two"}
    assert [p.name for p in (course / "grading").iterdir() if p.name.startswith(".")] == []


def test_the_summary_prints_the_score_of_record_and_every_manual_score(tmp_path, monkeypatch):
    """Trial v4, D12: the summary printed a student's autograded 10 / 10 while the gradebook
    held a manual 0 (what `export` wrote), and named a manual score only below full marks."""
    import csv
    import os
    import sys

    from nbgrader.api import Gradebook

    from attention_book.classroom import grading, sandbox
    from attention_book.classroom.clean import CellResult, ExerciseResult

    # nbgrader runs `alembic` from PATH when it creates a gradebook
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    course = tmp_path / "course"
    write_course_config(course)
    cells = (("ch02-ex1-check", 2, "code"), ("ch02-ex2-check", 3, "code"),
             ("ch02-ex3-answer", 1, "markdown"))
    scores = {  # (student, grade id): (auto, manual, extra credit)
        ("ann", "ch02-ex1-check"): (2.0, 0.0, None),  # full marks, then a manual 0
        ("ann", "ch02-ex2-check"): (3.0, None, None),
        ("ann", "ch02-ex3-answer"): (None, 1.0, None),  # a written answer, scored by hand
        ("bob", "ch02-ex1-check"): (2.0, None, None),
        ("bob", "ch02-ex2-check"): (0.0, 3.0, 0.5),  # below full marks, a manual 3 + extra
        ("bob", "ch02-ex3-answer"): (None, None, None),  # not scored yet
    }
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment("a")
        gradebook.add_notebook("a", "a")
        for grade_id, points, kind in cells:
            gradebook.add_grade_cell(grade_id, "a", "a", max_score=points, cell_type=kind)
        for student in ("ann", "bob"):
            gradebook.add_student(student)
            with gradebook.db.no_autoflush:
                gradebook.add_submission("a", student)
        for (student, grade_id), (auto, manual, extra) in scores.items():
            grade = gradebook.find_grade(grade_id, "a", "a", student)
            grade.auto_score, grade.manual_score, grade.extra_credit = auto, manual, extra
        gradebook.db.commit()

    def graded(student: str) -> grading.StudentGrade:
        return grading.StudentGrade(student, "a", exercises=[ExerciseResult(
            f"ch02-ex{n}", "", [CellResult(f"ch02-ex{n}-check", points,
                                           scores[(student, f"ch02-ex{n}-check")][0] == points)],
            cause="" if scores[(student, f"ch02-ex{n}-check")][0] == points else "Not yet.")
            for n, points in ((1, 2.0), (2, 3.0))])

    grades = [graded("ann"), graded("bob")]
    summary = grading._write_summary(course, "a", grades, sandbox.Layers())
    lines = grading.autograde_summary(grading.AutogradeReport("a", grades, True, summary, 1.0))
    assert "ann: 5 / 5 autograded; score of record 4 / 6" in lines
    assert "  ch02-ex1-check: keeps your manual score 0 of 2 (autograded: 2)" in lines
    assert "  written answers, scored by hand: ch02-ex3-answer: 1 of 1" in lines
    assert "bob: 2 / 5 autograded; score of record 5.5 / 6" in lines
    assert ("  ch02-ex2-check: keeps your manual score 3 of 3 (autograded: 0), + 0.5 extra "
            "credit") in lines
    assert any(line.startswith("score of record: what the gradebook counts") for line in lines)

    with summary.open(encoding="utf-8") as handle:
        rows = {(row["student"], row["exercise"]): row for row in csv.DictReader(handle)}
    assert rows[("ann", "ch02-ex1")]["score"] == "2"
    assert rows[("ann", "ch02-ex1")]["score_of_record"] == "0"
    assert rows[("ann", "ch02-ex1")]["manual_scores"] == "ch02-ex1-check: 0 of 2"
    assert rows[("ann", "ch02-ex3")]["score"] == "" and rows[("ann", "ch02-ex3")][
        "score_of_record"] == "1"
    assert rows[("bob", "ch02-ex2")]["manual_scores"] == "ch02-ex2-check: 3 of 3 + 0.5 extra"
    # the score of record is what the export writes
    exported: dict[tuple[str, str], float] = {}
    for row in grading.exercise_scores(course, ["a"]):
        key = (row["student"], row["exercise"])
        exported[key] = exported.get(key, 0.0) + row["score"]
    assert exported == {key: float(row["score_of_record"]) for key, row in rows.items()}

    # a summary without a readable gradebook still names what the run kept
    grades[0].recorded, grades[0].kept_manual = [], ["ch02-ex1-check"]
    lines = grading.autograde_summary(grading.AutogradeReport("a", grades[:1], True, summary, 1.0))
    assert lines[:2] == ["ann: 5 / 5", "  ch02-ex1-check: keeps your manual score"]
