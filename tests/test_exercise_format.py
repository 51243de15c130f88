"""Every chapter's exercises follow the nbgrader format of CONTRIBUTING.md (fast, no nbgrader run).

Per chapter: answer cells carry solution markers, nbgrader metadata and the ``hide-input``
tag; check cells are locked, carry points and call an ``attention_book.exercises`` checker;
grade ids are unique; chapters 01..11 have 3–6 graded exercises whose points add up to a
multiple of 5 (chapter 00 demonstrates the format and may have fewer). The rules live in
:func:`attention_book.classroom.exercise_format_problems`; the synthetic notebooks below
show that each rule can fail.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attention_book import exercises
from attention_book.classroom import (
    chapter_number,
    exercise_format_problems,
    find_chapters,
    summarise_exercises,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)
CHECKERS = sorted(
    name
    for module in pkgutil.iter_modules(exercises.__path__)
    if module.name.startswith("ch")
    for name in importlib.import_module(f"attention_book.exercises.{module.name}").__all__
)


def test_every_checker_is_reexported_under_a_name_no_other_chapter_uses():
    """``attention_book.exercises`` re-exports every chapter with ``import *``: a name two
    chapters share would silently hand one chapter the other chapter's checker."""
    modules = {module.name: importlib.import_module(f"attention_book.exercises.{module.name}")
               for module in pkgutil.iter_modules(exercises.__path__) if module.name.startswith("ch")}
    owners: dict[str, list[str]] = {}
    for chapter, module in modules.items():
        assert chapter == "ch00" or len(module.__all__) >= 3, f"{chapter}: {module.__all__}"
        for name in module.__all__:
            owners.setdefault(name, []).append(chapter)
    shared = {name: chapters for name, chapters in owners.items() if len(chapters) > 1}
    assert not shared, f"checker names exported by more than one chapter module: {shared}"
    for name, (chapter,) in owners.items():
        assert getattr(exercises, name) is getattr(modules[chapter], name), f"{name} is not {chapter}'s"


def test_chapters_are_found():
    assert CHAPTERS, "no chapters/NN_*.ipynb found"
    assert [chapter_number(path) for path in CHAPTERS] == sorted(
        chapter_number(path) for path in CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_chapter_exercises_follow_the_format(chapter):
    notebook = nbformat.read(chapter, as_version=4)
    assert exercise_format_problems(notebook, chapter_number(chapter)) == []


@pytest.mark.parametrize("chapter", [p for p in CHAPTERS if chapter_number(p) >= 1],
                         ids=lambda path: path.stem)
def test_chapter_has_graded_exercises(chapter):
    summary = summarise_exercises(nbformat.read(chapter, as_version=4), chapter_number(chapter))
    assert 3 <= len(summary.points) <= 6, summary
    assert summary.autograded, f"{chapter.name} has no autograded exercise"


def _prediction_checkers(chapter: Path) -> list[tuple[str, str]]:
    """(exercise title, checker name) for each exercise of kind "prediction" in ``chapter``."""
    cells = nbformat.read(chapter, as_version=4).cells
    found = []
    for index, cell in enumerate(cells):
        if cell.metadata.get("exercise", {}).get("kind") != "prediction":
            continue
        title = cell.source.splitlines()[0] if cell.cell_type == "markdown" else f"cell {index}"
        names = [match.group(1) for later in cells[index + 1:] if later.cell_type == "code"
                 for match in [re.search(r"from attention_book\.exercises import (check_\w+)",
                                         later.source)] if match]
        found.append((title, names[0] if names else ""))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda path: path.stem)
def test_every_prediction_keeps_its_answer_back(chapter):
    """A prediction ("work it out on paper") is checked by a ``@checker(reveal=False)``.

    Otherwise its first wrong try prints the expected value, and the exercise is over before
    the learner has reasoned (newcomer trial v2, L1).
    """
    predictions = _prediction_checkers(chapter)
    for title, name in predictions:
        assert name, f"{chapter.name}: no check cell after {title!r}"
        assert getattr(exercises, name).reveal is False, (
            f"{chapter.name}: {title!r} is a prediction, but {name} shows its expected value on "
            "a wrong answer: decorate it with @checker(reveal=False)")


def test_predictions_are_found():
    counts = {chapter.stem: len(_prediction_checkers(chapter)) for chapter in CHAPTERS}
    assert sum(counts.values()) >= 10 and counts["13_windows_and_sinks"] == 2, counts


def _forgot_return(*args, **kwargs):
    """The most common wrong answer: the work is done but nothing is returned."""
    return None


@pytest.mark.parametrize("name", CHECKERS)
def test_checker_feedback_is_actionable(name, capsys):
    """A wrong answer gets the failed property, expected vs actual and a hint, never a crash."""
    checker = getattr(exercises, name)
    required = [p for p in inspect.signature(checker).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert checker(*[_forgot_return] * len(required)) is False
    message = capsys.readouterr().out
    for part in ("Not yet.", "expected:", "actual:", "hint:"):
        assert message.count(part) == 1, message


# --------------------------------------------------------------------------- the rules fail

ANSWER = ('def f(x):\n    """Divide each row of x by its sum."""\n'
          '    ### BEGIN SOLUTION\n    return x / x.sum(dim=-1, keepdim=True)\n'
          '    ### END SOLUTION')
CHECK = ("from attention_book.exercises import check_row_normalise\n\n"
         "assert check_row_normalise(f)\n"
         "### BEGIN HIDDEN TESTS\n"
         "import torch as _torch\n\n"
         "_rows = f(_torch.tensor([[1.0, 3.0]]))\n"
         "assert _rows.tolist() == [[0.25, 0.75]]\n"
         "### END HIDDEN TESTS")


def _exercise(number: int, points: int, chapter: int = 1, kind: str = "variant") -> list:
    prompt = new_markdown_cell(
        f"> **Exercise {chapter}.{number} — Normalise ({points} points)**\n>\n> Write `f(x)`.")
    prompt.metadata["exercise"] = {"kind": kind}
    answer = new_code_cell(ANSWER)
    answer.metadata["tags"] = ["hide-input"]
    answer.metadata["nbgrader"] = {
        "grade": False, "grade_id": f"ch{chapter:02d}-ex{number}-answer", "locked": False,
        "schema_version": 3, "solution": True, "task": False}
    check = new_code_cell(CHECK)
    check.metadata["nbgrader"] = {
        "grade": True, "grade_id": f"ch{chapter:02d}-ex{number}-check", "locked": True,
        "points": points, "schema_version": 3, "solution": False, "task": False}
    return [prompt, answer, check]


def _good_chapter() -> nbformat.NotebookNode:
    cells = [new_markdown_cell("# 1. A chapter")]
    for number, points, kind in [(1, 2, "practice"), (2, 3, "variant"), (3, 5, "bug-hunt")]:
        cells += _exercise(number, points, kind=kind)
    return new_notebook(cells=cells)


def _written(number: int, points: int, body: str) -> list:
    prompt = new_markdown_cell(
        f"> **Exercise 1.{number} — Explain ({points} points)**\n>\n> Why?")
    prompt.metadata["exercise"] = {"kind": "prediction"}
    answer = new_markdown_cell(body)
    answer.metadata["nbgrader"] = {
        "grade": True, "grade_id": f"ch01-ex{number}-written", "locked": False,
        "points": points, "schema_version": 3, "solution": True, "task": False}
    return [prompt, answer]


def test_a_good_chapter_passes():
    assert exercise_format_problems(_good_chapter(), 1) == []
    summary = summarise_exercises(_good_chapter(), 1)
    assert (summary.total, summary.transfer) == (10, 8)


def test_a_written_answer_in_details_passes():
    notebook = _good_chapter()
    notebook.cells[-3:] = _written(
        3, 5, "<details><summary>Model answer and marking guide</summary>\n\nBecause.\n\n"
              "</details>")
    assert exercise_format_problems(notebook, 1) == []
    assert summarise_exercises(notebook, 1).written == {3: 5.0}


def _problems_after(edit) -> list[str]:
    notebook = copy.deepcopy(_good_chapter())
    edit(notebook)
    return exercise_format_problems(notebook, 1)


def _set(cell_index: int, source: str):
    return lambda nb: setattr(nb.cells[cell_index], "source", source)


def _hidden(code: str) -> str:
    return CHECK.split("### BEGIN HIDDEN TESTS")[0] + f"### BEGIN HIDDEN TESTS\n{code}\n### END HIDDEN TESTS"


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda nb: nb.cells[2].metadata.update(tags=[]), "hide-input"),
    (_set(2, "def f(x):\n    return x"), "BEGIN SOLUTION"),
    (_set(2, "### BEGIN SOLUTION\ndef f(x):\n    return x\n### END SOLUTION"), "sit above"),
    (_set(2, "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION"),
     "docstring"),
    (lambda nb: nb.cells[3].metadata["nbgrader"].update(grade_id="ch01-ex1-answer"),
     "grade_id also used"),
    (lambda nb: nb.cells[3].metadata["nbgrader"].update(locked=False), "locked"),
    (lambda nb: nb.cells[3].metadata["nbgrader"].update(points=0), "points > 0"),
    (_set(3, _hidden("assert f").replace("assert check_row_normalise(f)", "f(1)")),
     "asserts a checker"),
    (_set(3, _hidden("assert f").replace("assert check_row_normalise(f)",
                                         "check_row_normalise(f)")), "asserts a checker"),
    (_set(3, _hidden("assert f").replace("from attention_book.exercises import "
                                         "check_row_normalise\n", "")), "import check_row"),
    (_set(3, _hidden("assert f").replace("check_row_normalise", "check_nothing_real")),
     "not in attention"),
    (_set(3, _hidden("assert f").replace("(f)", "(g)")), "does not define"),
    (_set(3, CHECK.split("### BEGIN")[0]), "hidden-test region"),
    (_set(3, _hidden("assert f(inputs).sum() == 1")), "notebook globals ['inputs']"),
    (_set(3, _hidden("import torch\nassert f(torch.ones(1, 2)).sum() == 1")), "bind ['torch']"),
    (_set(3, _hidden("_y = f\n_y")), "no assert"),
    (_set(3, _hidden("import torch as _t\n_t.testing.assert_close(f(_t.ones(1)), _t.ones(1))\n"
                     "assert f")), "replaced"),
    (_set(3, _hidden("assert check_row_normalise(f)")), "replaced"),
    (lambda nb: nb.cells[3].metadata["nbgrader"].update(points=3), "the prompt says 2"),
    (lambda nb: nb.cells[3].metadata["nbgrader"].update(grade_id="ex1-check"), "grade_id should"),
    (lambda nb: nb.cells.__delitem__(3), "no check cell"),
    (lambda nb: nb.cells.__delitem__(1), "no prompt"),
    (_set(1, ":::{admonition} Exercise 1.1 — Normalise (2 points)\n:class: exercise\n:::"),
     "a blockquote"),
    (lambda nb: nb.cells[1].metadata.pop("exercise"), "exercise.kind"),
    (lambda nb: nb.cells[1].metadata["exercise"].update(kind="retype"), "exercise.kind"),
    (lambda nb: nb.cells.append(new_markdown_cell("```\n### BEGIN SOLUTION\n```")),
     "no nbgrader metadata"),
    (lambda nb: nb.cells.extend(_written(4, 5, "Because.")), "details"),
    (lambda nb: nb.cells.extend(_exercise(4, 1) + _exercise(5, 2) + _exercise(6, 2)
                                + _exercise(7, 5)), "7 graded exercises"),
    (lambda nb: nb.cells.extend(_exercise(4, 1)), "not a multiple of 5"),
    (lambda nb: nb.cells.__setitem__(slice(4, None), []), "1 graded exercises"),
    (lambda nb: [nb.cells[i].metadata["exercise"].update(kind="practice") for i in (4, 7)],
     "transfer tasks carry 0 of 10"),
])
def test_each_rule_catches_its_mistake(edit, expected):
    problems = _problems_after(edit)
    assert any(expected in problem for problem in problems), problems


def test_hidden_tests_may_read_the_answer_and_builtins_only():
    from attention_book.classroom.format import hidden_test_problems

    good = "import torch as _torch\n_out = [f(_torch.ones(2)) for _ in range(2)]\nassert len(_out) == 2"
    assert hidden_test_problems(good, {"f"}) == []
    assert hidden_test_problems(good, set()) != []


def test_chapter_zero_may_have_one_exercise_of_any_points():
    notebook = new_notebook(cells=_exercise(1, 2, chapter=0, kind="practice"))
    assert exercise_format_problems(notebook, 0) == []
    assert exercise_format_problems(new_notebook(cells=[]), 0) != []


def test_chapter_number_reads_the_file_name():
    assert chapter_number("chapters/07_multi_head.ipynb") == 7
    with pytest.raises(ValueError, match="two digits"):
        chapter_number("chapters/intro.ipynb")
