"""Chapter 0's checkers, and the feedback conventions every checker shares (``exercises/feedback.py``).

Each checker gets the right answer and each typical wrong one; a wrong one must fail with the
property, expected vs actual and a hint aimed at that mistake. A prediction's checker
(``@checker(reveal=False)``) must never print the value it expects until the answer is right.
"""

from __future__ import annotations

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, assert_rejected, unwritten

from attention_book.exercises import (
    check_predicted_shapes,
    check_row_normalise,
    check_weight_matrix_test,
)
from attention_book.exercises.feedback import KEPT_BACK, checker, expect_close, fail

# --------------------------------------------------------------------------- 0.1 and feedback


def test_right_answer_passes(capsys):
    assert_passes(check_row_normalise, lambda x: x / x.sum(dim=-1, keepdim=True), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda x: x / x.sum(dim=0, keepdim=True), "Every column of your result sums to 1"),
    (lambda x: x / x.sum(), "sum of the whole matrix"),
    (lambda x: x / x.amax(dim=-1, keepdim=True), "largest entry"),
    (lambda x: torch.softmax(x, dim=-1), "That is the softmax"),
    # The most common slip: without keepdim the sums line up with the columns.
    (lambda x: x / x.sum(dim=-1), "Without keepdim=True"),
])
def test_each_usual_slip_gets_its_own_hint(answer, phrase, capsys):
    out = assert_fails(check_row_normalise, answer, capsys, phrase)
    assert out.startswith("Not yet. The check that failed: each row of the normalised (4, 4) "
                          "matrix is divided by its own sum")


def test_a_sum_clamped_at_1_fails_on_rows_that_sum_to_less(capsys):
    """The recheck's D11: rows summing below 1 must grow; every matrix had sums above 1."""
    assert_rejected(check_row_normalise, lambda x: x / x.sum(dim=-1, keepdim=True).clamp(min=1),
                    capsys, "Rows whose sum is below 1 must grow", "(3, 5)")


def test_a_wrong_answer_without_a_named_slip_gets_values_and_the_general_hint(capsys):
    assert_fails(check_row_normalise, lambda x: x / (x.sum(dim=-1, keepdim=True) + 1), capsys,
                 "the values of the normalised (4, 4) matrix match the reference", "dim=-1")


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
    assert "expected: (4, 4)\n  actual:   (4,)" in out


def test_nan_is_reported_with_its_place(capsys):
    assert check_row_normalise(lambda x: x * torch.nan) is False
    assert "there is no NaN in" in capsys.readouterr().out


def test_an_answer_the_checker_cannot_use_is_feedback_not_a_crash(capsys):
    assert_fails(check_row_normalise, lambda x: "not a tensor", capsys, "a tensor comes back")


def test_a_square_only_answer_fails_on_the_rectangular_matrix(capsys):
    """An answer fitted to the square case (summing with dim=0 of the transpose) fails on (4, 5)."""
    assert_fails(check_row_normalise, lambda x: (x.T / x.sum(dim=1)).T if x.size(0) == x.size(1)
                 else x, capsys, "(4, 5)")


# --------------------------------------------------------------------------- reveal=False


def test_a_prediction_checker_keeps_the_expected_value_back_and_structure_stays_shown(capsys):
    @checker(reveal=False)
    def check_guess(value):
        expect_close("your guess", torch.as_tensor([value]), torch.tensor([0.1978]),
                     hint="compute it by hand")

    assert check_guess(0.2) is False
    out = capsys.readouterr().out
    assert f"expected: {KEPT_BACK}" in out and "0.1978" not in out and "actual:   0.2" in out
    assert check_guess([1.0, 2.0]) is False  # a shape is part of the question: it is shown
    assert "expected: (1,)" in capsys.readouterr().out

    @checker
    def check_value(value):
        fail("the value", expected=0.1978, actual=value, hint="h")

    assert check_value(0.2) is False  # an ordinary checker still shows it
    assert "expected: 0.1978" in capsys.readouterr().out
    assert check_guess(0.2) is False  # and the mode does not leak from one checker to the next
    assert "0.1978" not in capsys.readouterr().out


def test_long_floats_in_a_list_are_shown_to_four_significant_digits(capsys):
    @checker
    def check_gather(values):
        fail("the gathered keys", expected=[1.257474660873413, -0.5259637832641602],
             actual=values, hint="h")

    assert check_gather([[0.123456789, 2], (3.0000001,)]) is False
    out = capsys.readouterr().out
    assert "expected: [1.257, -0.526]" in out and "actual:   [[0.1235, 2], (3.0,)]" in out


# --------------------------------------------------------------------------- 0.2 shapes

RIGHT_SHAPES = {"last": (3, 4), "scores": (3, 5, 5), "totals": (3, 4), "row_sums": (3, 5, 1)}


def test_the_predicted_shapes_are_those_torch_computes():
    x = torch.zeros(3, 5, 4)
    scores = x @ x.transpose(-2, -1)
    assert {"last": tuple(x[:, -1, :].shape), "scores": tuple(scores.shape),
            "totals": tuple(x.sum(dim=1).shape),
            "row_sums": tuple(scores.sum(dim=-1, keepdim=True).shape)} == RIGHT_SHAPES


def test_right_shapes_pass_also_as_lists_or_sizes(capsys):
    assert_passes(check_predicted_shapes, lambda: RIGHT_SHAPES, capsys)
    as_lists = {name: list(shape) for name, shape in RIGHT_SHAPES.items()}
    assert_passes(check_predicted_shapes, lambda: as_lists, capsys)
    assert_passes(check_predicted_shapes,
                  lambda: {name: torch.Size(shape) for name, shape in RIGHT_SHAPES.items()}, capsys)


@pytest.mark.parametrize(("name", "shape", "phrase"), [
    ("last", (3, 1, 4), "An integer index such as -1 removes its axis"),
    ("last", (3, 5), "indexes the middle axis"),
    ("scores", (3, 4, 4), "joins the last axis of a with the second-to-last of b"),
    ("scores", (5, 5), "the batch axis stays"),
    ("totals", (3, 5), "dim=1 is T"),
    ("totals", (3, 1, 4), "Without keepdim=True"),
    ("row_sums", (3, 5), "keepdim=True keeps the summed axis"),
    ("row_sums", (3, 5, 4), "scores is not x"),
    ("row_sums", (7, 7), "axis by axis"),
])
def test_a_wrong_shape_is_named_with_a_hint_and_the_right_one_kept_back(name, shape, phrase, capsys):
    answer = {**RIGHT_SHAPES, name: shape}
    out = assert_fails(check_predicted_shapes, lambda: answer, capsys,
                       f"the shape of {name}", f"actual:   {shape}", phrase, KEPT_BACK)
    right = RIGHT_SHAPES[name]
    assert str(right) not in out.replace(f"actual:   {shape}", ""), out


def test_the_first_wrong_shape_is_reported_and_the_message_reveals_no_other(capsys):
    answer = {"last": (3, 1, 4), "scores": (5, 5), "totals": (3, 5), "row_sums": (3, 5)}
    out = assert_fails(check_predicted_shapes, lambda: answer, capsys, "the shape of last")
    for right in RIGHT_SHAPES.values():
        assert str(right) not in out


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda: [(3, 4), (3, 5, 5), (3, 4), (3, 5, 1)], "returns a dict"),
    (lambda: {"last": (3, 4)}, "returns a dict"),
    (lambda: {**RIGHT_SHAPES, "scores": "(3, 5, 5)"}, "a tuple of whole numbers"),
    (unwritten, "You have not written"),
])
def test_an_answer_of_the_wrong_form_is_told_the_form(answer, phrase, capsys):
    assert_fails(check_predicted_shapes, answer, capsys, phrase,
                 sections=() if answer is unwritten else ("expected:", "actual:", "hint:"))


# --------------------------------------------------------------------------- 0.3 weight test


def good_test(w):
    return bool((w >= 0).all() and torch.allclose(w.sum(dim=-1), torch.ones(w.shape[:-1], dtype=w.dtype)))


def test_a_good_test_passes(capsys):
    assert_passes(check_weight_matrix_test, good_test, capsys)
    # Other right ways: an explicit tolerance, a tensor result, isclose per row.
    assert_passes(check_weight_matrix_test, lambda w: (w >= 0).all()
                  & ((w.sum(dim=-1) - 1).abs() < 1e-5).all(), capsys)
    assert_passes(check_weight_matrix_test, lambda w: bool(
        torch.isclose(w.sum(-1), torch.tensor(1.0, dtype=w.dtype)).all() and w.min() >= 0), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    # exact equality: float32 rows sum to 1 only up to rounding
    (lambda w: bool((w >= 0).all() and (w.sum(dim=-1) == 1).all()), "your test accepts softmax weights"),
    # a tolerance too loose for float32
    (lambda w: bool((w >= 0).all() and ((w.sum(dim=-1) - 1).abs() <= 1e-2).all()),
     "Your tolerance is too loose"),
    # sums only
    (lambda w: bool(torch.allclose(w.sum(dim=-1), torch.ones(w.shape[:-1], dtype=w.dtype))),
     "every entry is at least 0"),
    # columns instead of rows (broadcasts on the square ones, so it gets that far)
    (lambda w: bool((w >= 0).all() and torch.allclose(w.sum(dim=-2), torch.ones_like(w.sum(dim=-2)))),
     "your test accepts"),
    # "no sum is far from 1" lets NaN through
    (lambda w: not bool(((w.sum(dim=-1) - 1).abs() > 1e-5).any() or (w < 0).any()), "NaN"),
    # the first matrix of a batch only
    (lambda w: good_test(w.reshape(-1, w.size(-2), w.size(-1))[0]), "every matrix in the batch"),
    # strictly positive entries: rejects the causal zeros
    (lambda w: bool((w > 0).all() and torch.allclose(w.sum(-1), torch.ones(w.shape[:-1], dtype=w.dtype))),
     "allow entries equal to 0"),
    # a float32 reference for a float64 matrix
    (lambda w: bool((w >= 0).all() and torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]))),
     "is_weight_matrix runs on"),
])
def test_each_weak_test_fails_with_the_case_it_got_wrong(answer, phrase, capsys):
    assert_fails(check_weight_matrix_test, answer, capsys, phrase)


# The recheck's D3 (chapters-12-17-recheck-v2): tests that average the rows, or bound the
# entries above only, passed the checker (and the last one failed only the hidden tests).
@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda w: bool((w >= 0).all() and torch.isclose(
        w.sum(), torch.tensor(float(w[..., 0].numel()), dtype=w.dtype))), "average 1"),
    (lambda w: bool((w >= 0).all() and torch.isclose(
        w.sum(dim=-1).mean(), torch.tensor(1.0, dtype=w.dtype))), "average 1"),
    (lambda w: bool(torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1))) and (w <= 1).all()),
     "[0.75, 0.5, -0.25]"),
])
def test_tests_of_averaged_rows_or_an_upper_bound_fail_the_checker_and_the_hidden_tests(
        answer, phrase, capsys):
    assert_rejected(check_weight_matrix_test, answer, capsys, phrase)


def test_the_rejected_columns_case_names_columns(capsys):
    def columns_only(w):  # rows, or else columns: lets the column-normalised matrix through
        columns = w.dim() == 2 and torch.allclose(w.sum(dim=0), torch.ones(w.size(1), dtype=w.dtype))
        return good_test(w) or bool(columns and (w >= 0).all())

    out = assert_fails(check_weight_matrix_test, columns_only, capsys, "columns sum to 1")
    assert "dim=-1" in out


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda w: (w >= 0) & torch.isclose(w.sum(-1, keepdim=True), torch.tensor(1.0, dtype=w.dtype)),
     "returns True or False"),
    (lambda w: None, "returns True or False"),
    (lambda w: "yes", "returns True or False"),
])
def test_a_test_must_answer_with_one_bool(answer, phrase, capsys):
    assert_fails(check_weight_matrix_test, answer, capsys, phrase)


def test_the_healthy_float32_case_really_misses_one_by_rounding():
    """The case that fails `== 1` exists: without it an exact comparison would pass."""
    from attention_book.exercises.ch00 import _healthy_weights

    batch = _healthy_weights()[0][1]
    assert batch.dtype == torch.float32 and (batch.sum(dim=-1) != 1).any()
    assert torch.allclose(batch.sum(dim=-1), torch.ones(2, 4))
