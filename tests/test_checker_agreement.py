"""The checker of every exercise and the hidden tests of its check cell agree on the answers the
book's tests try: a learner who reads "Correct" gets the points.

The agreement itself is checked by the hook of ``checker_agreement.py`` around every test of
``tests/test_exercises_*.py``, on every answer a checker accepts there (the right answers, and
any wrong one a checker would let through). This file checks that the hook can fail, and that
no exercise escapes it: every autograded exercise's checker has tests that feed it answers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from checker_agreement import _WATCHED_FILES, cells_of, check_cells, disagreements
from checker_asserts import assert_rejected
from hidden_tests import hidden_test_failure

from attention_book import exercises
from attention_book.exercises import check_cow_is_safe, check_row_normalise, feedback

ROOT = Path(__file__).resolve().parents[1]


def _graded_code_cells() -> list[tuple[str, str, str]]:
    """(notebook, grade id, visible source) of every autograded check cell of the book."""
    cells = []
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell["cell_type"] == "code" and meta.get("grade"):
                visible = "".join(cell["source"]).split("### BEGIN HIDDEN TESTS")[0]
                cells.append((path.name, meta["grade_id"], visible))
    return cells


def test_every_check_cell_asserts_one_checker_on_one_answer():
    """The form the hook reads: ``assert check_<name>(<answer>)``, so that it knows which
    hidden tests grade the answers a checker accepts."""
    found = {cell.grade_id for cells in check_cells().values() for cell in cells}
    graded = _graded_code_cells()
    assert len(graded) >= 70
    assert {grade_id for _, grade_id, _ in graded} == found
    # a checker's answers are graded by the cells of its own chapter only
    assert [cell.grade_id for cell in cells_of("check_row_normalise",
                                               "attention_book.exercises.ch00")] == [
        "ch00-ex1-check"]
    assert cells_of("check_row_normalise", "attention_book.exercises.ch05") == ()


def test_every_checker_is_tried_by_the_exercise_tests():
    """No exercise escapes the agreement: each checker of a check cell has tests that call it
    (with the right answer and wrong ones), which the hook watches."""
    sources = "\n".join(path.read_text()
                        for path in sorted((ROOT / "tests").glob("test_exercises_*.py")))
    missing = sorted(name for name in check_cells() if name not in sources)
    assert not missing, f"checkers without tests in tests/test_exercises_*.py: {missing}"
    assert _WATCHED_FILES.search("tests/test_exercises_ch00.py")
    assert not _WATCHED_FILES.search("tests/test_devices.py")


def test_a_checker_that_says_correct_to_an_answer_the_hidden_tests_reject_is_reported():
    """What the hook reports when a checker and its hidden tests disagree: here a wrong answer
    posing as one a checker accepted (no checker of the book accepts it any more)."""
    right = disagreements([("check_row_normalise", lambda x: x / x.sum(dim=-1, keepdim=True))])
    assert right == []
    wrong = disagreements([("check_row_normalise", lambda x: x / x.sum(-1, keepdim=True).clamp(
        min=1))])
    assert len(wrong) == 1
    assert "check_row_normalise says Correct" in wrong[0]
    assert "00_how_to_use.ipynb ch00-ex1-check" in wrong[0]
    assert "AssertionError" in wrong[0] and "hidden tests, line" in wrong[0]


def test_every_checker_tells_its_watchers_what_it_decided(capsys):
    """The hook learns each verdict from ``feedback.WATCHERS``: checkers call them with the
    checker, its arguments and the verdict, right or wrong, and notebooks leave the list empty."""
    seen = []

    def watch(checker, args, kwargs, verdict):
        seen.append((checker.__name__, args, verdict))

    def right(x):
        return x / x.sum(dim=-1, keepdim=True)

    feedback.WATCHERS.append(watch)
    try:
        check_row_normalise(right)
        check_row_normalise(torch.softmax)
    finally:
        feedback.WATCHERS.remove(watch)
    capsys.readouterr()
    assert seen == [("check_row_normalise", (right,), True),
                    ("check_row_normalise", (torch.softmax,), False)]
    assert feedback.WATCHERS == [] or all(w is not watch for w in feedback.WATCHERS)


# --------------------------------------------------------------------------- property tests
# A property test's checker and hidden tests hand the learner's test healthy and broken
# subjects (classroom trial v4, D9). An answer that knows the order they come in, or tells
# them apart by their kind, scores without testing anything: so the order is drawn anew from
# the operating system's generator (``random.SystemRandom``) at every run, and the subjects
# of an exercise are one kind. Below, that generator is replaced by one that keeps the order
# as written (where counting calls passes, which shows the verdicts below are the right ones)
# and by one that moves it by one place (where counting fails, as it does in any other order).

ORDER_BLIND = "TTTTTTTT" "TTTTTTTT" "FFFFFFFF" "FFTFFFFF" "FTFFFFTF" "FTFFFFTF" "FTTFFFTF" "FFTFFFFF"

#: For every property-test exercise's checker: what a right test returns for each subject, in
#: the order of the checker's code (the order it published before it drew one), and in the
#: order of the hidden tests' code ("T" True, "F" False, or the values themselves).
PROPERTY_TESTS = {
    "check_weight_matrix_test": ("TTTT" "FFFFFF", "TTTT" "FFFFFF"),
    "check_batch_consistency_test": ("TT" "FFFFFFF", "T" "FFFFF"),
    "check_is_causal_layer": ("TT" "FFFFFFFF", "TT" "FFFFFFF"),
    "check_is_order_blind": (ORDER_BLIND, ORDER_BLIND),
    "check_leaks_future": ([None] * 5 + [(0, 1), (0, 1), (2, 4), (3, 5), (0, 1), (0, 4)],
                           [None, None, (1, 3), (2, 3), (0, 1), (1, 4)]),
    "check_decodes_like_full_pass": ("TTT" "FFFFFFFFFF", "TTT" "FFFFFFFFFF"),
    "check_is_induction_head": ("TTT" "FFFF" "TF", "TFFF" "TF"),
    "check_generates_like_full_pass": ("TTT" "FFFF", "TTT" "FFFF"),
    "check_cow_is_safe": ("FFFFFF" "TT", "FFFFF" "TT"),
    "check_matches_whole_sequence": ("FFFFFFFFF" "TTT", "T" "FFFFFFF"),
}


class _AsWritten:
    """In place of ``random.SystemRandom``: every order drawn is the order given."""

    def sample(self, population, k):
        assert k == len(population)
        return list(population)


class _MovedByOne(_AsWritten):
    """In place of ``random.SystemRandom``: every order drawn is the given one moved by one
    place, which changes the order of verdicts that are not all the same."""

    def sample(self, population, k):
        items = super().sample(population, k)
        return items[1:] + items[:1]


def _verdicts(spec) -> list:
    return [letter == "T" for letter in spec] if isinstance(spec, str) else list(spec)


def _by_count(verdicts: list, kinds: list | None = None):
    """A cheat: the answer to the n-th call is ``verdicts[n]``, whatever the call is about;
    it notes in ``kinds`` whether each subject (the first argument) is a class."""
    answers = iter(verdicts)

    def cheat(subject, *args, **kwargs):
        if kinds is not None:
            kinds.append(isinstance(subject, type))
        return next(answers, "no verdict left")

    return cheat


def _property_test_checkers() -> set[str]:
    """The checker of every exercise whose prompt says ``"kind": "property-test"``."""
    checker_of = {cell.grade_id: name for name, cells in check_cells().items() for cell in cells}
    found = set()
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        property_test = False
        for cell in json.loads(path.read_text())["cells"]:
            kind = cell.get("metadata", {}).get("exercise", {}).get("kind")
            if kind is not None:
                property_test = kind == "property-test"
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if property_test and grade_id in checker_of:
                found.add(checker_of[grade_id])
                property_test = False
    return found


def test_every_property_test_is_tried_below():
    assert _property_test_checkers() == set(PROPERTY_TESTS)


@pytest.mark.parametrize("name", sorted(PROPERTY_TESTS))
def test_a_property_test_is_not_passed_by_counting_calls(name, monkeypatch, capsys):
    """An answer that returns the verdicts by the number of the call (the checker's, then the
    hidden tests') passes both in the order of their code, and neither in another order; every
    subject is one kind, so ``isinstance(subject, type)`` tells none apart either."""
    checker = getattr(exercises, name)
    (cell,) = cells_of(name, checker.__module__)
    checked, hidden = (_verdicts(spec) for spec in PROPERTY_TESTS[name])
    with torch.random.fork_rng(devices=[]):
        monkeypatch.setattr(random, "SystemRandom", _AsWritten)
        kinds: list[bool] = []
        cheat = _by_count(checked + hidden, kinds)
        assert checker(cheat) is True, capsys.readouterr().out
        assert hidden_test_failure(cell.notebook, cell.grade_id, **{cell.answer: cheat}) is None
        assert len(kinds) == len(checked) + len(hidden)
        assert len(set(kinds[:len(checked)])) == len(set(kinds[len(checked):])) == 1, kinds
        capsys.readouterr()

        monkeypatch.setattr(random, "SystemRandom", _MovedByOne)
        assert_rejected(checker, _by_count(checked + hidden), capsys)


@pytest.mark.parametrize("says", [True, False])
def test_cow_is_safe_is_not_passed_by_the_kind_of_its_subjects(says, capsys):
    """The trial's answer to Ex 16.4: a class is broken, a function healthy (or the reverse)."""

    def by_kind(make_cache):
        return isinstance(make_cache, type) is says

    assert_rejected(check_cow_is_safe, by_kind, capsys)
