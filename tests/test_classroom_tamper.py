"""The tamper scan (``attention_book.classroom.tamper``): what it flags, what it leaves alone.

Fast tests on small notebooks built here, no nbgrader run. The honest side matters as much
as the cheats: a correct answer, a scratch line that reuses a chapter variable, the
chapter's own set-up cell and the chapter-11 answer that subclasses a healthy layer while
writing its own ``forward`` must stay clean, or an honest student loses points.
"""

from __future__ import annotations

import nbformat
import pytest

from attention_book.classroom import chapter_number, find_chapters, scan_notebook, scan_source
from attention_book.classroom.simulate import code_exercises, notebook_with
from attention_book.classroom.tamper import exercise_of

IMPORTED = {"torch", "math", "F", "nn", "bug_zoo", "attention_book"}

CHEATS = {
    "rebind a checker": "check_attend = lambda f: True",
    "rebind a checker with def": "def check_attend(fn):\n    return True",
    "rebind a checker by import": "from builtins import print as check_attend",
    "patch the feedback helper": "import attention_book.exercises._feedback as _fb\n"
                                 "_fb.fail = lambda *a, **k: None",
    "patch torch.testing": "torch.testing.assert_close = lambda *a, **k: None",
    "patch a tensor method": "torch.Tensor.tolist = lambda self: [[1.0]]",
    "patch through an alias": "t = torch.testing\nt.assert_close = print",
    "patch builtins": "import builtins\nbuiltins.isinstance = lambda *a: True",
    "delete a checker": "del check_attend",
    "setattr": "setattr(torch.testing, 'assert_close', print)",
    "delattr": "delattr(attention_book, 'exercises')",
    "exec": "exec('check_attend = print')",
    "eval": "eval('1')",
    "compile": "code = compile('x = 1', 'x', 'exec')",
    "__import__": "fb = __import__('attention_book.exercises._feedback')",
    "__builtins__": "__builtins__.print = None",
    "sys.modules": "import sys\nsys.modules['torch.testing'] = None",
    "importlib": "import importlib\nimportlib.reload(torch)",
    "globals() write": "globals()['check_attend'] = print",
    "globals().update": "globals().update(check_attend=print)",
    "vars() write": "vars(torch.testing)['assert_close'] = print",
    "line magic": "%run other_notebook.ipynb",
    "shell command": "!sed -i s/fail/pass/ checker.py",
    "cell magic": "%%capture\nx = 1",
    "function internals": "check_attend.__code__ = (lambda f: True).__code__",
    "module dict": "torch.testing.__dict__['assert_close'] = print",
    "file write": "open('checker.py', 'w').write('')",
    "subprocess": "import subprocess\nsubprocess.run(['true'])",
}

HONEST = {
    "a correct answer": "def attend(queries, memory):\n"
                        "    attn_scores = queries @ memory.T  # (T_q, T_k)\n"
                        "    attn_weights = torch.softmax(attn_scores, dim=-1)\n"
                        "    return attn_weights @ memory, attn_weights",
    "a scratch line": "inputs = torch.randn(2, 3)",
    "a module with parameters": "class Head(nn.Module):\n"
                                "    def __init__(self, d):\n"
                                "        super().__init__()\n"
                                "        self.W = nn.Linear(d, d)\n"
                                "        self.W.weight.data.zero_()",
    "reading globals": "names = [n for n in globals() if n.startswith('check_')]\n"
                       "ok = 'attend' in globals()\nx = globals()['inputs']",
    "re-importing a checker": "from attention_book.exercises import check_attend",
    "torch.compile and re.compile": "import re\nfast = torch.compile(lambda x: x)\n"
                                    "pattern = re.compile('a+')",
    "a healthy base with its own forward": (
        "class DropoutFixed(bug_zoo.HealthyCausalAttention):\n"
        "    def forward(self, x):\n"
        "        return self.W_value(x)"),
    "a syntax error": "def broken(:\n    pass",
}

HEALTHY_ANSWERS = {
    "the healthy function": "attention_fixed = bug_zoo.healthy_attention",
    "the healthy function, imported": "from attention_book.bug_zoo import healthy_attention\n"
                                      "def attention_fixed(q, k, v, mask=None):\n"
                                      "    return healthy_attention(q, k, v, mask)",
    "the healthy class, inherited": "class DropoutFixed(bug_zoo.HealthyCausalAttention):\n"
                                    "    pass",
    "the healthy forward, called": "class DropoutFixed(bug_zoo.HealthyCausalAttention):\n"
                                   "    def forward(self, x):\n"
                                   "        return super().forward(x)",
    "the answer bound to a library function": "stable_softmax = torch.softmax",
    "a forward borrowed from the package": "class FixedBlogAttention(nn.Module):\n"
                                           "    forward = attention_book.modules.MultiHeadAttention.forward",
}


@pytest.mark.parametrize("source", CHEATS.values(), ids=CHEATS.keys())
def test_every_cheat_is_flagged_on_its_line(source):
    hits = scan_source(source, is_answer=True, imported=IMPORTED)
    assert hits, f"not flagged: {source!r}"
    last = len(source.splitlines())
    assert all(1 <= line <= last for line, _ in hits)


@pytest.mark.parametrize("source", HONEST.values(), ids=HONEST.keys())
def test_honest_code_is_not_flagged(source):
    assert scan_source(source, is_answer=True, imported=IMPORTED,
                       answer_names={"attend", "attention_fixed"}) == []


@pytest.mark.parametrize("source", HEALTHY_ANSWERS.values(), ids=HEALTHY_ANSWERS.keys())
def test_answers_taken_from_the_package_are_flagged(source):
    hits = scan_source(source, is_answer=True, imported=IMPORTED,
                       answer_names={"attention_fixed", "stable_softmax"})
    assert hits and any("package" in reason or "existing code" in reason
                        for _, reason in hits), hits


def test_scan_source_rejects_a_non_string():
    with pytest.raises(TypeError, match="source must be a str"):
        scan_source(["check_x = 1"])


def test_exercise_of():
    assert exercise_of("ch02-ex3-check") == "ch02-ex3"
    assert exercise_of("ch11-ex12-answer") == "ch11-ex12"
    assert exercise_of("my-own-cell") == "my-own-cell"
    with pytest.raises(TypeError):
        exercise_of(3)


# --------------------------------------------------------------------------- notebooks


def _cell(kind, source, grade_id=None, *, solution=False, grade=False, locked=False):
    cell = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(source)
    if grade_id:
        cell.metadata["nbgrader"] = {"grade_id": grade_id, "solution": solution, "grade": grade,
                                     "locked": locked, "points": 1 if grade else 0,
                                     "schema_version": 3, "task": False}
    return cell


def _release():
    """Set-up cell, then three exercises (answer + locked check each)."""
    cells = [_cell("code", "import sys\nif 'google.colab' in sys.modules:\n    pass\nimport torch")]
    for k in (1, 2, 3):
        cells.append(_cell("code", f"def f{k}(x):\n    raise NotImplementedError()",
                           f"ch09-ex{k}-answer", solution=True))
        cells.append(_cell("code", f"from attention_book.exercises import check_f{k}\n"
                                   f"assert check_f{k}(f{k})",
                           f"ch09-ex{k}-check", grade=True, locked=True))
    return nbformat.v4.new_notebook(cells=cells)


def test_the_chapters_own_setup_lines_are_not_reported():
    release = _release()
    report = scan_notebook(release, release)
    assert report.clean and report.tainted == {}


def test_a_flagged_answer_taints_its_exercise_and_the_later_ones():
    release = _release()
    submitted = notebook_with(release, {"ch09-ex2-answer": "def f2(x):\n    return x\n"
                                                           "check_f2 = lambda f: True"})
    report = scan_notebook(submitted, release)
    assert [(f.exercise, f.line) for f in report.findings] == [("ch09-ex2-answer", 3)]
    assert list(report.tainted) == ["ch09-ex2", "ch09-ex3"]


def test_a_scratch_cell_taints_the_checks_below_it():
    release = _release()
    submitted = notebook_with(release)
    scratch = _cell("code", "torch.testing.assert_close = print")
    submitted.cells.insert(3, scratch)  # after exercise 1's check cell
    report = scan_notebook(submitted, release)
    assert [(f.cell, f.exercise) for f in report.findings] == [(3, None)]
    assert list(report.tainted) == ["ch09-ex2", "ch09-ex3"]
    assert "scratch cell 3, line 1" in report.findings[0].describe()


def test_locked_cells_are_not_scanned_but_edits_and_deletions_are_reported():
    release = _release()
    submitted = notebook_with(release, checks={"ch09-ex1-check": "check_f1 = print",
                                               "ch09-ex3-check": None})
    report = scan_notebook(submitted, release)
    assert report.clean  # nbgrader restores locked cells before it runs anything
    assert report.edited_locked == ["ch09-ex1-check"]
    assert report.missing_locked == ["ch09-ex3-check"]


def test_a_copied_setup_line_in_an_answer_is_still_reported():
    release = _release()
    submitted = notebook_with(release, {"ch09-ex1-answer": "import sys\nsys.modules['x'] = 1"})
    assert {f.line for f in scan_notebook(submitted, release).findings} == {2}


def test_scan_notebook_rejects_what_is_not_a_notebook():
    with pytest.raises(TypeError, match="submitted must be an nbformat notebook"):
        scan_notebook({"cells": []}, _release())


@pytest.mark.parametrize("chapter", find_chapters("."), ids=lambda path: path.stem)
def test_every_chapters_solutions_scan_clean(chapter):
    """The instructor's answers, handed in as a student's, raise no flag."""
    instructor = nbformat.read(chapter, as_version=4)
    answers = {e.answer_id: e.solution for e in code_exercises(instructor)}
    submitted = notebook_with(instructor, answers)
    report = scan_notebook(submitted, instructor, instructor)
    assert report.findings == [], [f.describe() for f in report.findings]
    assert chapter_number(chapter) >= 0
