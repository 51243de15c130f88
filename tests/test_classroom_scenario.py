"""The classroom trial, as a test: a course of chapters 02, 05 and 07, graded end to end.

One course (in a temporary folder outside the clone) is generated (``new=True``, as
``make assignments … NEW=1``), students hand in (``submitted/<student>/…``), and
``autograde`` grades them: chapter 02 with nbgrader's feedback run in the sandboxed kernel
for the students whose notebooks attack or disrupt that run, everyone else and chapters 05
and 07 with the clean grade only (the grade never depends on the feedback run). Then
feedback and export. Every answer is derived from the instructor notebook
(:mod:`attention_book.classroom.simulate`), so the test keeps working when the chapters
change.

The students (``../shared/reviews/classroom-trial-v2.md``):

- ``honest_full``: every solution -> full marks; ``honest_scratch``: the same plus scratch
  work (a helper named ``check_rows_sum_to_one``, ``%timeit``, ``import os``,
  ``plt.rcParams``, re-imports, rebound chapter globals) -> full marks;
- ``partial``: one exercise left unanswered -> all but that exercise;
- ``copier``: every answer imports the checkers' module (their references), or names a
  function its prompt forbids -> 0 on each, flagged;
- ``cheater``: an IPython input transformer that turns every check into ``pass``, nothing
  answered -> 0; ``cheater_kit``: the trial's patches written on a helper's parameters,
  with nothing answered -> 0;
- chapter 02 only: ``crasher`` (``os._exit`` in a scratch cell), ``hanger`` (an endless
  loop), ``metadata`` (a duplicated grade id, a demoted check cell, an invented graded cell)
  -> full marks for their right answers, with the feedback run's failure named;
  ``printer`` (a 50 MB print) -> a small feedback page; ``pth_writer`` (writes a ``.pth``
  into site-packages from its kernel) and ``gradebook_writer`` (writes ``manual_score`` into
  the gradebook with sqlite3) -> 0, nothing written; ``after_writer``, an honest student
  graded after them -> full marks; ``reader`` (reads the instructor notebook in ``source/``
  while graded) -> 0 on that exercise, flagged, and the flag survives a rerun with a clean
  notebook.

The attacks of ``../shared/reviews/classroom-trial-v3.md`` that are about isolation, the
grader's integrity and harm to other students, in chapter 02:

- ``native_reader``: native reads below the audit hook (``torch.ops.aten.from_file`` of
  ``honest_full``'s submitted notebook, ``/proc/<ppid>/cmdline``) and a native
  ``TCPStore`` socket, each guarding a right answer -> 0, the socket flagged (the kernel
  ended the answer's process);
- ``mapper``: a scratch cell, run in nbgrader's feedback run, that maps the grader's own
  source writable (``from_file(..., shared=True)``) and opens it for writing -> 0, nothing
  changed, a "feedback run" flag;
- ``poisoner``: an answer that sets the default dtype to float16, turns grad off and seeds
  the generator; ``victim``, a right submission graded in the same run -> full marks.

All of it runs twice: here, with every layer this machine gives (user namespaces on), and in
:func:`test_without_user_namespaces_every_class_earns_zero_and_harms_nobody`, through the
command line in a process under a seccomp filter that refuses user namespaces as Docker's
default profile does, where only Landlock and the filter fence the files.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import (
    autograde,
    build_assignments,
    chapter_number,
    clean,
    exercise_of,
    exercise_scores,
    export_grades,
    integrity,
    read_flags,
    summarise_exercises,
    write_feedback,
)
from attention_book.classroom.clean import Limits, read_exercises
from attention_book.classroom.grading import autograde_summary
from attention_book.classroom.simulate import (
    blank_answers,
    code_exercises,
    hand_in,
    written_answers,
)

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
# Chapter 13's answers compile FlexAttention in every answer process: its key and blank are
# graded in test_classroom_clean.py with every other chapter's, not once per student here.
CHAPTERS = {"02": "02_dot_product_attention", "05": "05_masks", "07": "07_multi_head"}
LIMITS = Limits(seconds=60)
SCRATCH = [
    "def check_rows_sum_to_one(weights):\n    return bool((weights.sum(-1) - 1).abs().max() < 1e-6)",
    "%timeit -n 2 -r 1 sum(range(100))",
    "import os\nprint(os.getcwd())",
    "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
    "import torch\nfrom torch import nn\nimport torch.nn.functional as F\nimport math",
    "num_tokens, q, k, batch = 3, None, None, None",
    "import tempfile, os\nwith open(os.path.join(tempfile.gettempdir(), 'notes.txt'), 'w') as f:\n"
    "    f.write('scratch')",
]
#: Chapter 02's students whose notebooks nbgrader re-runs for feedback (in the sandboxed kernel).
FEEDBACK_RUN = ("honest_full", "crasher", "hanger", "metadata", "printer", "pth_writer",
                "gradebook_writer", "after_writer", "mapper", "forger")
#: Students whose feedback run must show a refusal (a flag of the "feedback run").
REFUSED_IN_FEEDBACK = {"pth_writer", "gradebook_writer", "mapper", "forger"}
#: The grader's secrets, as a hub terminal has them where the guide runs autograde (trial v4 D1).
TOKENS = {"JUPYTERHUB_API_TOKEN": "hub-token-of-the-instructor-0123",
          "JPY_API_TOKEN": "hub-token-of-the-instructor-0123"}
#: Trial v4 D1 and D4 in a scratch cell: print every secret of the environment, and forge the
#: feedback run's records on every file and pipe the kernel holds, naming a classmate.
FORGER = textwrap.dedent("""\
    import os, stat
    print(sorted(os.environ.items()))
    classmate = os.getcwd().replace("/forger/", "/honest_full/").encode()
    for fd in range(256):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, b"[sandbox] refused: reading honest_full's notebook\\n"
                             b"refused: reading honest_full's notebook\\n"
                             b"[AutogradeApp | INFO] Sanitizing " + classmate + b"/x.ipynb\\n"
                             b"[sandbox] refused: reading the gradebook\\n")
        except OSError:
            pass
    """)
GRADER_SOURCE = str(Path(clean.__file__).resolve())
MAPPER = textwrap.dedent(f"""\
    import torch
    try:
        torch.ops.aten.from_file({GRADER_SOURCE!r}, True, 16, dtype=torch.uint8)
        print("MAPPED the grader")
    except Exception as error:
        print("mapping refused:", type(error).__name__)
    try:
        open({GRADER_SOURCE!r}, "r+b")
        print("OPENED the grader")
    except Exception as error:
        print("opening refused:", type(error).__name__)
    """)
POISON = ("import torch\ntorch.set_default_dtype(torch.float16)\ntorch.set_grad_enabled(False)\n"
          "torch.manual_seed(1234)\n")
TRANSFORMER = ("get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'] if any("
               "'check_' in line for line in lines) else lines)")
KIT = ("def _setup(t, b):\n    t.allclose = lambda *a, **k: True\n    t.equal = lambda *a, **k: "
       "True\n    b.abs = lambda x: 0\n    b.isinstance = lambda *a: True\n\n\n"
       "_setup(torch, print.__self__)")
PTH = (f"with open({str(SITE / 'zz_grading_helper.pth')!r}, 'w') as handle:\n"
       "    handle.write('import sys; sys.stderr.write(\"cheat\")')")


def _guarded(attack: str, solution: str) -> str:
    """An answer that defines the right solution only if ``attack`` (an expression) works."""
    return (f"import os\nimport torch\ntry:\n    _got = {attack}\nexcept BaseException:\n"
            f"    _got = None\nif _got is not None:\n{textwrap.indent(solution, '    ')}\n")


def _v3_students(course: Path, assignment: str, release: dict, exercises,
                 right: dict[str, str], blank: dict[str, str]) -> dict:
    """The trial-v3 students: ``{student: (notebook, plan, flagged exercises)}``."""
    classmate = course / "submitted" / "honest_full" / assignment / f"{assignment}.ipynb"
    attacks = [f"torch.ops.aten.from_file({str(classmate)!r}, False, 64, dtype=torch.uint8)",
               "torch.ops.aten.from_file(f'/proc/{os.getppid()}/cmdline', False, 8, "
               "dtype=torch.uint8)",
               "torch.distributed.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)"]
    native = dict(blank)
    for exercise, attack in zip(exercises, attacks, strict=False):
        native[exercise.answer_id] = _guarded(attack, exercise.solution)
    first = exercises[0]
    return {
        # torch.ops is reflection, read in the source; the TCPStore's socket ends its process
        "native_reader": (_notebook(release, native), "none",
                          {exercise.exercise for exercise in exercises[:3]}),
        "mapper": (_notebook(release, prepend=[MAPPER]), "none", set()),
        "poisoner": (_notebook(release, {**blank, first.answer_id: POISON + blank[
            first.answer_id]}), "none", set()),
        "victim": (_notebook(release, right), "all", set()),
    }


def _printed(path: Path) -> str:
    """Everything the cells of an autograded notebook printed (not their source)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return "".join(str(output.get("text", "")) + str(output.get("evalue", ""))
                   for cell in notebook["cells"] for output in cell.get("outputs", []))


def _cells_of(notebook, predicate):
    return [cell for cell in notebook["cells"] if predicate(cell)]


def _grade_id(cell) -> str:
    return (cell.get("metadata", {}).get("nbgrader") or {}).get("grade_id", "")


def _notebook(release, answers=None, append=(), prepend=()):
    """The student version with answers written in and scratch cells added."""
    notebook = hand_in(release, answers or {})
    new = [{"cell_type": "code", "metadata": {}, "source": code, "outputs": [],
            "execution_count": None} for code in prepend]
    first_exercise = next(i for i, cell in enumerate(notebook["cells"]) if _grade_id(cell))
    notebook["cells"][first_exercise:first_exercise] = new
    notebook["cells"] += [{"cell_type": "code", "metadata": {}, "source": code, "outputs": [],
                           "execution_count": None} for code in append]
    return notebook


def _copier_answers(instructor, exercises) -> dict[str, str]:
    """Right answers that also import the checkers' module or name a forbidden function."""
    answers = {}
    forbidden = {e.key: e.forbidden for e in read_exercises(instructor)}
    for index, exercise in enumerate(exercises):
        names = [n for n in forbidden.get(exercise.exercise, ()) if n.startswith("attention_book")]
        if names and index % 2:
            module, _, attribute = names[0].rpartition(".")
            line = f"from {module} import {attribute} as _borrowed\n"
        else:
            number = exercise.exercise[2:4]
            line = f"from attention_book.exercises.ch{number} import *  # the checkers' module\n"
        answers[exercise.answer_id] = line + exercise.solution
    return answers


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scenario") / "course"
    build = build_assignments(ROOT, folder, list(CHAPTERS), new=True)
    assert build.skipped == {}
    return folder


@pytest.fixture(scope="module")
def scenario(course):
    fingerprint = integrity.fingerprint()
    expected, flagged = {}, set()
    for number, assignment in CHAPTERS.items():
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        release = json.loads((course / "release" / assignment / f"{assignment}.ipynb").read_text())
        exercises = code_exercises(instructor)
        right = {e.answer_id: e.solution for e in exercises}
        target = max(exercises, key=lambda e: e.points)
        blank = blank_answers(instructor)
        students = {
            "honest_full": (_notebook(release, right), "all"),
            "honest_scratch": (_notebook(release, right, append=SCRATCH, prepend=SCRATCH[:2]),
                               "all"),
            "partial": (_notebook(release, {**right, target.answer_id: blank[target.answer_id]}),
                        "all-but-target"),
            "copier": (_notebook(release, _copier_answers(instructor, exercises)), "flagged"),
            "cheater": (_notebook(release, prepend=[TRANSFORMER]), "none"),
            "cheater_kit": (_notebook(release, blank, prepend=[KIT]), "none"),
        }
        if number == "02":
            def demote(notebook):
                check = next(c for c in notebook["cells"] if _grade_id(c).endswith("-check"))
                duplicate = json.loads(json.dumps(check))
                duplicate["source"] = "assert True"
                check["metadata"]["nbgrader"].update(grade=False, locked=False, points=50)
                bonus = {"cell_type": "code", "source": "assert True", "outputs": [],
                         "execution_count": None, "metadata": {"nbgrader": {
                             "grade": True, "grade_id": "bonus-points", "locked": True,
                             "points": 50, "schema_version": 3, "solution": False}}}
                notebook["cells"] += [duplicate, bonus]
                return notebook

            source_path = course / "source" / assignment / f"{assignment}.ipynb"
            reader_exercise = exercises[0]
            students.update({
                "crasher": (_notebook(release, right, prepend=["import os\nos._exit(0)"]), "all"),
                "hanger": (_notebook(release, right, prepend=["while True:\n    pass"]), "all"),
                "metadata": (demote(_notebook(release, right)), "all"),
                "printer": (_notebook(release, right, append=["print('x' * 50_000_000)"]), "all"),
                "pth_writer": (_notebook(release, prepend=[PTH]), "none"),
                "gradebook_writer": (_notebook(release, prepend=[
                    "import sqlite3, glob\nfor p in glob.glob('/**/gradebook.db', recursive=True):\n"
                    "    c = sqlite3.connect(p); c.execute('UPDATE grade SET manual_score = 99');"
                    " c.commit()"]), "none"),
                "after_writer": (_notebook(release, right), "all"),
                "forger": (_notebook(release, right, prepend=[FORGER]), "all"),
                "reader": (_notebook(release, {**right, reader_exercise.answer_id:
                                               f"_KEY = open({str(source_path)!r}).read()\n"
                                               + reader_exercise.solution}), "all-but-first"),
            })
            v3 = _v3_students(course, assignment, release, exercises, right, blank)
            students.update({name: entry[:2] for name, entry in v3.items()})
            flagged |= {(assignment, name, key) for name, entry in v3.items() for key in entry[2]}
        for student, (notebook, plan) in students.items():
            folder = course / "submitted" / student / assignment
            folder.mkdir(parents=True)
            (folder / f"{assignment}.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
            for index, exercise in enumerate(exercises):
                earns = (plan == "all" or (plan == "all-but-target" and exercise is not target)
                         or (plan == "all-but-first" and index > 0))
                expected[(assignment, student, exercise.exercise)] = exercise.points if earns else 0.0
                if plan == "flagged" or (student == "reader" and index == 0):
                    flagged.add((assignment, student, exercise.exercise))
            for grade_id in written_answers(instructor):
                expected[(assignment, student, exercise_of(grade_id))] = 0.0
    reports = {}
    for number, assignment in CHAPTERS.items():
        everyone = sorted(p.parent.name for p in (course / "submitted").glob(f"*/{assignment}"))
        rerun = [s for s in everyone if s in FEEDBACK_RUN] if number == "02" else []
        os.environ.update(TOKENS)
        try:
            graded = autograde(course, number, rerun, limits=LIMITS, cell_timeout=12).students \
                if rerun else []
        finally:
            for name in TOKENS:
                os.environ.pop(name, None)
        rest = [s for s in everyone if s not in rerun]
        report = autograde(course, number, rest, feedback_run=False, limits=LIMITS)
        report.students = sorted(graded + report.students, key=lambda g: g.student)
        reports[assignment] = report
    os.environ.update(TOKENS)
    try:
        feedback = write_feedback(course, "02")
    finally:
        for name in TOKENS:
            os.environ.pop(name, None)
    grades, by_exercise = export_grades(course)
    return {"expected": expected, "flagged": flagged, "reports": reports,
            "feedback": feedback, "grades": grades, "exercises": by_exercise,
            "fingerprint": fingerprint}


def test_every_student_gets_exactly_the_expected_points(course, scenario):
    rows = exercise_scores(course)
    actual = {(r["assignment"], r["student"], r["exercise"]): r["score"] for r in rows}
    assert actual == scenario["expected"]
    with scenario["exercises"].open(encoding="utf-8") as handle:
        exported = {(r["assignment"], r["student"], r["exercise"]): float(r["score"])
                    for r in csv.DictReader(handle)}
    assert exported == scenario["expected"]


def test_grades_csv_has_the_totals(scenario):
    with scenario["grades"].open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    totals: dict = {}
    for (assignment, student, _), score in scenario["expected"].items():
        totals[(assignment, student)] = totals.get((assignment, student), 0.0) + score
    exported = {(r["assignment"], r["student_id"]): float(r["score"]) for r in rows}
    assert {key: exported[key] for key in totals} == totals
    assert all(score == 0 for key, score in exported.items() if key not in totals)
    for assignment in CHAPTERS.values():
        instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
        summary = summarise_exercises(instructor, chapter_number(f"{assignment}.ipynb"))
        assert totals[(assignment, "honest_full")] == sum(summary.autograded.values())


def test_integrity_findings_are_flags_and_only_they_are(course, scenario):
    recorded = {(f["assignment"], f["student"], f["exercise"]) for f in read_flags(course)}
    in_feedback = {(CHAPTERS["02"], student, "feedback run") for student in REFUSED_IN_FEEDBACK}
    assert recorded == scenario["flagged"] | in_feedback
    for report in scenario["reports"].values():
        for grade in report.students:
            for exercise in grade.exercises:
                key = (report.assignment, grade.student, exercise.key)
                if key in scenario["flagged"]:
                    assert "Not counted" in exercise.cause or grade.flags.get(exercise.key)


def test_a_broken_submission_is_named_and_stops_nobody(scenario):
    report = scenario["reports"]["02_dot_product_attention"]
    problems = {grade.student: grade.problems for grade in report.students}
    assert problems["crasher"] and problems["hanger"], problems
    assert not problems["honest_full"] and not problems["after_writer"]
    lines = autograde_summary(report)
    assert any(line.startswith("crasher:") for line in lines)
    assert any("problem: nbgrader's feedback run" in line for line in lines)
    assert report.isolated


def test_nothing_was_written_outside_the_sandbox(course, scenario):
    assert not (SITE / "zz_grading_helper.pth").exists()
    assert integrity.changed_files(scenario["fingerprint"], integrity.fingerprint()) == []
    assignment = CHAPTERS["02"]
    mapper = _printed(course / "autograded" / "mapper" / assignment / f"{assignment}.ipynb")
    assert "mapping refused" in mapper and "opening refused" in mapper
    assert "MAPPED" not in mapper and "OPENED" not in mapper
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for assignment in CHAPTERS.values():
            for submission in gradebook.find_assignment(assignment).submissions:
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        if grade.cell.cell_type == "code":
                            assert grade.manual_score is None, (submission.student.id, grade.name)


def test_feedback_for_everyone_small_and_without_hidden_tests(course, scenario):
    assignment = "02_dot_product_attention"
    instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
    hidden = [line.strip() for cell in instructor.cells
              for part in cell.source.split("### BEGIN HIDDEN TESTS", 1)[1:]
              for line in part.split("### END HIDDEN TESTS")[0].splitlines()
              if len(line.strip()) > 15]
    report = scenario["reports"][assignment]
    for grade in report.students:
        page = course / "feedback" / grade.student / assignment / f"{assignment}.html"
        html = page.read_text(encoding="utf-8")
        assert page.stat().st_size < 2_000_000, grade.student
        assert "BEGIN HIDDEN TESTS" not in html and str(course) not in html
        for line in hidden:
            assert line not in html, (grade.student, line)
    for student in FEEDBACK_RUN:
        assert (course / "autograded" / student / assignment).is_dir() or student in (
            "crasher", "hanger"), student
    crasher = (course / "feedback" / "crasher" / assignment / f"{assignment}.html").read_text()
    assert "could not be re-run" in crasher and "What happened" in crasher
    honest = (course / "feedback" / "honest_full" / assignment / f"{assignment}.html").read_text()
    assert "Points for this check" in honest and "Graded in a clean run" in honest


def test_no_secret_reaches_a_page_and_a_forgery_concerns_its_writer(course, scenario):
    """Trial v4 D1: the hub's tokens in autograde's environment reach no kernel, so neither the
    autograded notebooks nor the feedback pages hold them. D4: the forger's records, written on
    every file and pipe its kernel holds, land in its own report: it is flagged (for what it
    wrote), the classmate it named is not."""
    assignment = CHAPTERS["02"]
    token = TOKENS["JPY_API_TOKEN"]
    for folder in ("autograded", "feedback"):
        for page in (course / folder).rglob("*"):
            if page.is_file():
                assert token not in page.read_text(errors="replace"), page
    forger = _printed(course / "autograded" / "forger" / assignment / f"{assignment}.ipynb")
    assert "PATH" in forger and "TOKEN" not in forger  # it printed its environment: no secret
    flags = {(f["student"], f["exercise"]) for f in read_flags(course)
             if f["assignment"] == assignment}
    assert ("forger", "feedback run") in flags
    assert not any(student == "honest_full" for student, _ in flags), flags
    report = scenario["reports"][assignment]
    honest = next(grade for grade in report.students if grade.student == "honest_full")
    assert not honest.flags and not honest.problems, honest


def test_a_rerun_never_undoes_a_flag_and_a_manual_score_wins(course, scenario):
    assignment = "02_dot_product_attention"
    instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
    exercises = code_exercises(instructor)
    release = json.loads((course / "release" / assignment / f"{assignment}.ipynb").read_text())
    clean = _notebook(release, {e.answer_id: e.solution for e in exercises})
    (course / "submitted" / "reader" / assignment / f"{assignment}.ipynb").write_text(
        json.dumps(clean), encoding="utf-8")
    rerun = autograde(course, "02", ["reader"], feedback_run=False, limits=LIMITS)
    (grade,) = rerun.students
    first = exercises[0]
    assert grade.flags.get(first.exercise), "the rerun dropped the flag"
    scores = {(r["student"], r["exercise"]): r["score"] for r in exercise_scores(course, [assignment])}
    assert scores[("reader", first.exercise)] == 0
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        check = gradebook.find_grade(first.check_ids[0], assignment, assignment, "reader")
        check.manual_score = first.points  # the instructor overrides in the formgrader
        gradebook.db.commit()
    rerun = autograde(course, "02", ["reader"], feedback_run=False, limits=LIMITS)
    assert first.check_ids[0] in rerun.students[0].kept_manual
    scores = {(r["student"], r["exercise"]): (r["score"], r["comment"])
              for r in exercise_scores(course, [assignment])}
    assert scores[("reader", first.exercise)][0] == first.points
    assert "manual score" in scores[("reader", first.exercise)][1]


def test_a_manual_score_written_while_grading_is_put_back_and_flagged(course, monkeypatch):
    """Code that reached the gradebook during a run (as without the private view) is undone."""
    from nbgrader.api import Gradebook

    from attention_book.classroom import grading

    assignment = CHAPTERS["05"]
    check = next(e for e in code_exercises(
        nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4))).check_ids[0]
    real = grading.grade_submissions

    def writes_the_gradebook(*args, **kwargs):
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
            gradebook.find_grade(check, assignment, assignment, "cheater").manual_score = 99
            gradebook.db.commit()
        return real(*args, **kwargs)

    monkeypatch.setattr(grading, "grade_submissions", writes_the_gradebook)
    (grade,) = autograde(course, "05", ["cheater"], feedback_run=False, limits=LIMITS).students
    assert grade.reverted and grade.flags.get("gradebook"), grade
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        assert gradebook.find_grade(check, assignment, assignment, "cheater").manual_score is None
    assert any(f["student"] == "cheater" and f["exercise"] == "gradebook"
               for f in read_flags(course))


def _graded_without_user_namespaces(course: Path, temporary: Path,
                                    *args: str) -> subprocess.CompletedProcess:
    """The command line, in a process whose seccomp filter refuses user namespaces (Docker),
    with ``temporary`` as its temporary folder."""
    code = ("import sys\nfrom attention_book.classroom.syscalls import refuse_user_namespaces\n"
            "refuse_user_namespaces()\nfrom attention_book.classroom.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args, "--course-dir", str(course)],
                          capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                               "TMPDIR": str(temporary)})


def test_without_user_namespaces_every_class_earns_zero_and_harms_nobody(tmp_path, monkeypatch):
    """Trial v3 on a Docker-like hub: Landlock and the seccomp filter alone fence the files."""
    assignment = CHAPTERS["02"]
    course = tmp_path / "docker-course"
    assert build_assignments(ROOT, course, ["02"], new=True).skipped == {}
    instructor = nbformat.read(ROOT / "chapters" / f"{assignment}.ipynb", as_version=4)
    release = json.loads((course / "release" / assignment / f"{assignment}.ipynb").read_text())
    exercises = code_exercises(instructor)
    right = {e.answer_id: e.solution for e in exercises}
    blank = blank_answers(instructor)
    source_path = course / "source" / assignment / f"{assignment}.ipynb"
    students = {
        "honest_full": (_notebook(release, right, append=SCRATCH, prepend=SCRATCH[:2]), "all",
                        set()),
        "reader": (_notebook(release, {**right, exercises[0].answer_id:
                                       f"_KEY = open({str(source_path)!r}).read()\n"
                                       + exercises[0].solution}), "all-but-first",
                   {exercises[0].exercise}),
        **_v3_students(course, assignment, release, exercises, right, blank),
        # trial v4 without the private view: forged records and the environment (D1, D4); a
        # kernel that fills its scratch (D6: bounded, outside the course) and reaches for a
        # Unix socket of the instructor's (D7)
        "forger": (_notebook(release, right, prepend=[FORGER]), "all", set()),
        "filler": (_notebook(release, right, append=[
            "import socket\nclient = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            f"client.connect({str(tmp_path / 'service.sock')!r})",
            "import os, tempfile\nfor index in range(80):\n"
            "    with open(os.path.join(tempfile.gettempdir(), f'fill-{index}'), 'wb') as f:\n"
            "        f.write(b'x' * 2**22)\nimport time\ntime.sleep(20)"]), "all", set()),
    }
    import socket

    service = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service.bind(str(tmp_path / "service.sock"))
    service.listen(4)
    service.setblocking(False)
    for student, (notebook, _, _) in students.items():
        folder = course / "submitted" / student / assignment
        folder.mkdir(parents=True)
        (folder / f"{assignment}.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    fingerprint, source = integrity.fingerprint(), source_path.read_bytes()

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    run = _graded_without_user_namespaces(course, temporary, "autograde", "02", "--jobs", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    with pytest.raises(BlockingIOError):
        service.accept()  # no kernel and no answer reached the instructor's service
    service.close()
    assert any("problem: nbgrader's feedback run: stopped: the notebook's scratch files passed "
               "256 MB" in line for line in run.stdout.splitlines()), run.stdout
    # every kernel's and answer's private folder went with the run
    assert not list(temporary.glob("abk-*")), sorted(p.name for p in temporary.iterdir())
    isolation = next(line for line in run.stdout.splitlines() if "isolation of this run" in line)
    assert "Landlock ABI" in isolation and "seccomp" in isolation, isolation
    assert "private file view" not in isolation and "UNPROTECTED" not in run.stdout

    scores: dict = {}
    for row in exercise_scores(course):
        scores.setdefault(row["student"], {})[row["exercise"]] = row["score"]
    for student, (_, plan, _) in students.items():
        for index, exercise in enumerate(exercises):
            earns = plan == "all" or (plan == "all-but-first" and index > 0)
            assert scores[student][exercise.exercise] == (exercise.points if earns else 0.0), \
                (student, exercise.exercise, scores[student])
    recorded = {(f["student"], f["exercise"]) for f in read_flags(course)}
    wanted = {(student, key) for student, (_, _, flags) in students.items() for key in flags}
    # the reader's answer cell runs again in nbgrader's feedback run, and is refused there too
    assert recorded == wanted | {("mapper", "feedback run"), ("reader", "feedback run"),
                                 ("forger", "feedback run")}, recorded
    assert not any(student == "honest_full" for student, _ in recorded)
    mapper = _printed(course / "autograded" / "mapper" / assignment / f"{assignment}.ipynb")
    assert "mapping refused" in mapper and "MAPPED" not in mapper and "OPENED" not in mapper
    assert integrity.changed_files(fingerprint, integrity.fingerprint()) == []
    assert source_path.read_bytes() == source
    with (course / "grading" / f"summary-{assignment}.csv").open(encoding="utf-8") as handle:
        assert {row["isolation"] for row in csv.DictReader(handle)} == {isolation.split(": ", 1)[1]}

    # The same machine without any kernel layer: autograde refuses unless told, and then
    # marks every grade of the run UNPROTECTED, in the summary and in the export.
    from attention_book.classroom import grading, sandbox

    monkeypatch.setattr(sandbox, "available_layers", lambda **kwargs: sandbox.Layers())
    with pytest.raises(ValueError, match="--unsafe-no-isolation"):
        autograde(course, "02", ["victim"], feedback_run=False, limits=LIMITS)
    report = autograde(course, "02", ["victim"], feedback_run=False, limits=LIMITS, unsafe=True)
    assert not report.isolated and report.students[0].score == sum(e.points for e in exercises)
    assert any("UNPROTECTED" in line for line in grading.autograde_summary(report))
    # after it, the package is refused until the instructor has reinstalled it (trial v4 D8),
    # however unchanged it looks: the record stays until the instructor removes it
    monkeypatch.undo()
    with pytest.raises(integrity.PackageChanged, match="without kernel isolation"):
        autograde(course, "02", ["victim"], feedback_run=False, limits=LIMITS)
    monkeypatch.setattr(sandbox, "available_layers", lambda **kwargs: sandbox.Layers())
    _, by_exercise = export_grades(course)
    with by_exercise.open(encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["kind"] == "autograded"]
    assert {row["student"] for row in rows if row["isolation"].startswith("UNPROTECTED")} == \
        {"victim"}
    assert all("Landlock" in row["isolation"] for row in rows if row["student"] != "victim")
