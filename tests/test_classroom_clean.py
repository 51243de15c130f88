"""Grading in clean processes (``attention_book.classroom.clean``).

Two parts:

- every chapter's instructor key gets full marks and its student version zero, through the
  clean grader (one grading process for all chapters);
- a small notebook written here, with one exercise whose prompt forbids the library's
  softmax, graded for an honest student and for one student per strategy of the classroom
  trial (``../shared/reviews/classroom-trial-v2.md``) and others: every strategy earns 0, an
  integrity one is flagged, honest scratch work costs nothing.
"""

from __future__ import annotations

import copy
import json
import sysconfig
from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import find_chapters
from attention_book.classroom.clean import (
    Limits,
    chapter_setup,
    grade_many,
    grade_submissions,
    preamble_for,
    read_answers,
    read_exercises,
)
from attention_book.classroom.simulate import blank_answers, code_exercises

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()


def _with_answers(notebook, answers: dict[str, str]):
    copied = copy.deepcopy(notebook)
    for cell in copied.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return json.loads(nbformat.writes(copied))


# --------------------------------------------------------------------------- every chapter


@pytest.fixture(scope="module")
def chapters_graded():
    requests = []
    for path in find_chapters(ROOT):
        instructor = nbformat.read(path, as_version=4)
        requests.append((json.loads(nbformat.writes(instructor)),
                         {"key": json.loads(nbformat.writes(instructor)),
                          "blank": _with_answers(instructor, blank_answers(instructor))}))
    results, jailed = grade_many(requests, limits=Limits(seconds=120))
    return [path.stem for path in find_chapters(ROOT)], results, jailed


def test_every_chapters_key_gets_full_marks_in_clean_processes(chapters_graded):
    names, results, jailed = chapters_graded
    assert jailed
    for name, graded in zip(names, results, strict=True):
        for exercise in graded["key"]:
            failed = [(c.grade_id, c.detail, c.output[-300:]) for c in exercise.cells
                      if not c.passed]
            assert exercise.score == exercise.points > 0 and not failed, (name, failed)
            assert not exercise.flags and not exercise.cause, (name, exercise.key,
                                                                exercise.flags, exercise.cause)


def test_every_chapters_student_version_gets_zero(chapters_graded):
    names, results, _ = chapters_graded
    for name, graded in zip(names, results, strict=True):
        for exercise in graded["blank"]:
            assert exercise.score == 0, (name, exercise.key)
            assert "not written" in exercise.cause, (name, exercise.key, exercise.cause)


# --------------------------------------------------------------------------- a notebook of one exercise


SOFTMAX = '''def stable_softmax(x, dim=-1):
    """The softmax of x along dim, without overflow."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    weights = shifted.exp()
    return weights / weights.sum(dim=dim, keepdim=True)
'''
HIDDEN = '''import torch as _torch

_x = _torch.tensor([[1000.0, 999.0], [0.0, 0.0]])
_e = 1 / (1 + 2.718281828459045 ** -1)
assert _torch.allclose(stable_softmax(_x), _torch.tensor([[_e, 1 - _e], [0.5, 0.5]]))
'''
FORBIDDEN = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
             "attention_book.softmax"]
JUNK = 'def stable_softmax(x, dim=-1):\n    """doc"""\n    return x * 0\n'


def small_notebook():
    cells = [
        nbformat.v4.new_markdown_cell("# 2. A notebook for the grader's tests"),
        nbformat.v4.new_code_cell("import torch\nimport attention_book as ab"),
        nbformat.v4.new_markdown_cell(
            "> **Exercise 2.1 — Stable softmax (2 points)**\n>\n> Without torch.softmax.",
            metadata={"exercise": {"kind": "variant", "forbidden": FORBIDDEN}}),
        nbformat.v4.new_code_cell(SOFTMAX, metadata={"nbgrader": {
            "grade": False, "grade_id": "ch02-ex1-answer", "locked": False,
            "schema_version": 3, "solution": True, "task": False}}),
        nbformat.v4.new_code_cell(
            "from attention_book.exercises import check_stable_softmax\n\n"
            "assert check_stable_softmax(stable_softmax)\n### BEGIN HIDDEN TESTS\n" + HIDDEN
            + "### END HIDDEN TESTS",
            metadata={"nbgrader": {"grade": True, "grade_id": "ch02-ex1-check", "locked": True,
                                   "points": 2, "schema_version": 3, "solution": False,
                                   "task": False}}),
    ]
    return nbformat.v4.new_notebook(cells=cells)


def strategies(secret: Path) -> dict[str, tuple[str, list[str], bool]]:
    """Student -> (answer cell, extra scratch cells, flagged?)."""
    softmax_alias = "from torch import softmax as s\n\n\ndef stable_softmax(x, dim=-1):\n" \
                    "    return s(x, dim)\n"
    return {
        "honest": (SOFTMAX, [], False),
        "honest_scratch": (SOFTMAX + "\n%timeit stable_softmax(torch.randn(4, 4))\nimport os\n"
                           "print(os.getcwd())\n", [
                               "def check_rows_sum_to_one(w):\n    return True",
                               "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
                               "torch = None"], False),
        "library_softmax": ("def stable_softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n",
                            [], True),
        "alias_softmax": (softmax_alias, [], True),
        "method_softmax": ("def stable_softmax(x, dim=-1):\n    return x.softmax(dim)\n", [], True),
        "package_softmax": ("def stable_softmax(x, dim=-1):\n    return ab.softmax(x, dim)\n",
                            [], True),
        "answer_key": ("from attention_book.exercises.ch02 import check_stable_softmax as c\n"
                       + JUNK, [], True),
        "patch_inside": ("def stable_softmax(x, dim=-1):\n    import builtins\n"
                         "    torch.allclose = lambda *a, **k: True\n"
                         "    builtins.abs = lambda v: 0\n    return x * 0\n", [], False),
        "helper_parameters": ("def _setup(t, b):\n    t.allclose = lambda *a, **k: True\n"
                              "    b.isinstance = lambda *a: True\n\n\n"
                              "_setup(torch, print.__self__)\n" + JUNK, [], False),
        "input_transformer": ("_ = get_ipython().input_transformers_post.append(lambda l: "
                              "['pass\\n'])\n" + JUNK,
                              ["get_ipython().input_transformers_post.append(lambda l: "
                               "['pass\\n'] if any('check_' in x for x in l) else l)"], False),
        "globals_chain": ("globals()['torch'].allclose = lambda *a, **k: True\n" + JUNK, [], False),
        "builtins_exec": ("print.__self__.exec('import torch; torch.allclose = lambda *a, **k: "
                          "True')\n" + JUNK, [], False),
        "pickle": ("import pickle\n\n\nclass R:\n    def __reduce__(self):\n        return (exec, "
                   "('import torch; torch.allclose = lambda *a, **k: True',))\n\n\n"
                   "_ = pickle.loads(pickle.dumps(R()))\n" + JUNK, [], False),
        "shipped_module": ("import notes\n\n\ndef stable_softmax(x, dim=-1):\n"
                           "    return notes.softmax(x, dim)\n", [], False),
        "reads_course": (f"_KEY = open({str(secret)!r}).read()\n" + JUNK, [], True),
        "gradebook": (f"import sqlite3\n_db = sqlite3.connect({str(secret)!r})\n" + JUNK, [], True),
        "site_packages": (f"_ = open({str(SITE / 'zz_grading.pth')!r}, 'w').write('import os')\n"
                          + JUNK, [], True),
        "subprocess": ("import subprocess\n_ = subprocess.run(['true'])\n" + JUNK, [], True),
        "liar": ("class L:\n    def __eq__(self, other):\n        return True\n\n"
                 "    def __getattr__(self, name):\n        return lambda *a, **k: self\n\n\n"
                 "def stable_softmax(x, dim=-1):\n    return L()\n", [], False),
        "tensor_subclass": ("class T(torch.Tensor):\n    pass\n\n\n"
                            "def stable_softmax(x, dim=-1):\n    return (x * 0).as_subclass(T)\n",
                            [], False),
        "exits": ("def stable_softmax(x, dim=-1):\n    import os\n    os._exit(0)\n", [], False),
        "hangs": ("def stable_softmax(x, dim=-1):\n    while True:\n        pass\n", [], False),
        "memory": ("def stable_softmax(x, dim=-1):\n    return torch.ones(2**33)\n", [], False),
        "helper_elsewhere": ("def stable_softmax(x, dim=-1):\n    return my_softmax(x, dim)\n",
                             [SOFTMAX.replace("stable_softmax", "my_softmax")], False),
    }


@pytest.fixture(scope="module")
def small_graded(tmp_path_factory):
    secret = tmp_path_factory.mktemp("course") / "gradebook.db"
    secret.write_text("every answer")
    source = small_notebook()
    submissions = {}
    plan = strategies(secret)
    for student, (answer, scratch, _) in plan.items():
        notebook = copy.deepcopy(source)
        notebook.cells[3].source = answer
        notebook.cells += [nbformat.v4.new_code_cell(code) for code in scratch]
        submissions[student] = json.loads(nbformat.writes(notebook))
    broken = json.loads(nbformat.writes(source))
    broken["cells"][3]["metadata"] = {}
    submissions["no_answer_cell"] = broken
    twice = json.loads(nbformat.writes(source))
    twice["cells"].append(copy.deepcopy(twice["cells"][3]))
    submissions["answer_twice"] = twice
    garbled = tmp_path_factory.mktemp("garbled") / "nb.ipynb"
    garbled.write_text("{ not json")
    submissions["garbled"] = garbled
    results, jailed = grade_submissions(json.loads(nbformat.writes(source)), submissions,
                                        limits=Limits(seconds=8, memory_bytes=3 * 2**30))
    return plan, results, jailed, secret


def test_honest_work_and_scratch_work_get_full_marks(small_graded):
    _, results, jailed, _ = small_graded
    assert jailed
    for student in ("honest", "honest_scratch"):
        (exercise,) = results[student]
        assert exercise.score == 2 and not exercise.flags and not exercise.cause, (
            student, exercise)


def test_every_strategy_earns_zero_and_the_integrity_ones_are_flagged(small_graded):
    plan, results, _, secret = small_graded
    for student, (_, _, flagged) in plan.items():
        if student.startswith("honest"):
            continue
        (exercise,) = results[student]
        assert exercise.score == 0, (student, exercise)
        assert exercise.cause, student
        assert bool(exercise.flags) == flagged, (student, exercise.flags)
    assert secret.read_text() == "every answer"
    assert not (SITE / "zz_grading.pth").exists()


def test_each_zero_names_its_cause(small_graded):
    _, results, _, _ = small_graded

    def cause(student):
        return results[student][0].cause

    assert "torch.softmax" in cause("library_softmax") and "Not counted" in cause("library_softmax")
    assert "attention_book.softmax" in cause("package_softmax")
    assert "attention_book.exercises" in cause("answer_key")
    assert "reading" in cause("reads_course") and "gradebook.db" in cause("reads_course")
    assert "longer than 8 s" in cause("hangs")
    assert "ended the process" in cause("exits")
    assert "memory" in cause("memory")  # the limit refused it, and the check says so
    assert "does not define" not in cause("helper_elsewhere")
    assert "my_softmax" in cause("helper_elsewhere") or "not defined" in cause("helper_elsewhere")
    assert "missing" in cause("no_answer_cell")
    assert "2 cells carry" in cause("answer_twice")
    assert "could not be read" in cause("garbled")
    assert "Not yet" in cause("patch_inside")  # the checker's own message, run cleanly


def test_an_answer_gets_the_chapters_imports_and_the_definitions_it_names():
    source = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": "import torch\nimport math as m"},
        {"cell_type": "code", "metadata": {}, "source":
            "SCALE = 2\n\n\ndef helper(x):\n    return x * SCALE\n\n\ndef unused():\n    pass\n"
            "model = torch.nn.Linear(2, 2)"},
    ]}
    imports, definitions = chapter_setup(source)
    assert imports.splitlines() == ["import torch", "import math as m"]
    assert set(definitions) == {"SCALE", "helper", "unused"}  # a call is never copied
    preamble = preamble_for("def answer(x):\n    return helper(x) + m.pi", imports, definitions)
    assert "def helper" in preamble and "SCALE = 2" in preamble and "unused" not in preamble


def test_answers_are_found_by_grade_id_whatever_else_changed():
    instructor = nbformat.read(find_chapters(ROOT)[2], as_version=4)
    exercises = read_exercises(instructor)
    assert exercises and all(e.grade_cells and e.names for e in exercises)
    answers = read_answers(json.loads(nbformat.writes(instructor)), exercises)
    assert all(a.source and not a.problem for a in answers.values())
    assert [e.key for e in exercises] == [e.exercise for e in code_exercises(instructor)]
