"""Chapter 0's checker, and the feedback conventions every checker shares (``exercises/feedback.py``)."""

from __future__ import annotations

import torch

from attention_book.exercises import check_row_normalise


def test_right_answer_passes(capsys):
    assert check_row_normalise(lambda x: x / x.sum(dim=-1, keepdim=True)) is True
    assert capsys.readouterr().out.startswith("Correct:")


def test_wrong_axis_explains_what_failed_once(capsys):
    assert check_row_normalise(lambda x: x / x.sum(dim=0, keepdim=True)) is False
    out = capsys.readouterr().out
    assert out.startswith("Not yet. The check that failed: the values of the normalised matrix")
    for part in ("expected:", "actual:", "hint:"):
        assert out.count(part) == 1, out
    assert "dim=-1" in out


def test_an_unwritten_answer_says_so(capsys):
    def row_normalise(x):
        raise NotImplementedError()

    assert check_row_normalise(row_normalise) is False
    out = capsys.readouterr().out
    assert "You have not written `row_normalise` yet" in out
    assert "NotImplementedError()" in out


def test_an_error_in_the_answer_becomes_feedback(capsys):
    assert check_row_normalise(lambda x: 1 / 0) is False
    assert "ZeroDivisionError" in capsys.readouterr().out


def test_a_wrong_shape_names_both_shapes(capsys):
    assert check_row_normalise(lambda x: x.sum(dim=-1)) is False
    out = capsys.readouterr().out
    assert "expected: (4, 5)\n  actual:   (4,)" in out


def test_nan_is_reported_with_its_place(capsys):
    assert check_row_normalise(lambda x: x * torch.nan) is False
    assert "there is no NaN in" in capsys.readouterr().out


def test_an_answer_the_checker_cannot_use_is_feedback_not_a_crash(capsys):
    assert check_row_normalise(lambda x: "not a tensor") is False
    out = capsys.readouterr().out
    assert out.startswith("Not yet.")
