"""The feedback helpers and chapter 0's checker: right answers pass, wrong ones explain."""

import pytest
import torch

from attention_book.exercises import ExerciseFailure, check_row_normalise
from attention_book.exercises._feedback import call, expect_close, expect_shape


def test_right_answer_passes(capsys):
    check_row_normalise(lambda x: x / x.sum(dim=-1, keepdim=True))
    assert capsys.readouterr().out.startswith("Correct:")


def test_wrong_axis_explains_what_failed(capsys):
    with pytest.raises(AssertionError) as info:
        check_row_normalise(lambda x: x / x.sum(dim=0, keepdim=True))
    message = str(info.value)
    assert "expected" in message and "actual" in message and "hint" in message
    assert "largest difference" in message
    assert capsys.readouterr().out.startswith("Not yet:")


def test_unfinished_answer_propagates_not_implemented():
    def unfinished(x):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check_row_normalise(unfinished)


def test_crash_in_learner_code_becomes_feedback():
    with pytest.raises(ExerciseFailure, match="ZeroDivisionError"):
        call(lambda: 1 / 0)


def test_shape_feedback_names_both_shapes():
    with pytest.raises(AssertionError, match=r"expected: \(2, 3\)\n  actual:   \(3, 2\)"):
        expect_shape("weights", torch.zeros(3, 2), (2, 3), hint="transpose?")
    with pytest.raises(AssertionError, match="has no NaN"):
        expect_close("out", torch.full((2,), float("nan")), torch.zeros(2), hint="h")
