"""Chapter 12's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten

from attention_book import KVCache, causal_mask, rotary_embedding, scaled_dot_product_attention
from attention_book.exercises import (
    check_changed_scores,
    check_decodes_like_full_pass,
    check_fixed_rope,
    check_masked_cross_attention,
    check_rope_2d,
)


@pytest.mark.parametrize("checker", [check_masked_cross_attention, check_changed_scores, check_rope_2d,
                                     check_fixed_rope, check_decodes_like_full_pass])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 12.1


def cross_attention(x, context, W_query, W_key, W_value, context_mask=None):
    mask = None if context_mask is None else context_mask[:, None, :]
    return scaled_dot_product_attention(x @ W_query, context @ W_key, context @ W_value, mask)


def test_cross_attention_right_answer(capsys):
    assert_passes(check_masked_cross_attention, cross_attention, capsys)


def test_cross_attention_with_a_causal_mask(capsys):
    def causal(x, context, W_query, W_key, W_value, context_mask=None):
        allowed = causal_mask(x.size(-2), context.size(-2))  # (T, T_ctx)
        if context_mask is not None:
            allowed = allowed & context_mask[:, None, :]
        return scaled_dot_product_attention(x @ W_query, context @ W_key, context @ W_value,
                                            allowed)

    assert_fails(check_masked_cross_attention, causal, capsys, "every query sees every real context token",
                 "no causal mask")


def test_cross_attention_ignoring_the_padding_mask(capsys):
    def unmasked(x, context, W_query, W_key, W_value, context_mask=None):
        return scaled_dot_product_attention(x @ W_query, context @ W_key, context @ W_value)

    assert_fails(check_masked_cross_attention, unmasked, capsys, "padded context tokens get zero weight",
                 "context_mask[:, None, :]")


def test_cross_attention_with_keys_from_x(capsys):
    def self_attention(x, context, W_query, W_key, W_value, context_mask=None):
        return scaled_dot_product_attention(x @ W_query, x @ W_key, x @ W_value)

    assert_fails(check_masked_cross_attention, self_attention, capsys,
                 "the shape of the weights is (2, 3, 5)", "the keys come from the context")


def test_cross_attention_without_the_scale(capsys):
    def unscaled(x, context, W_query, W_key, W_value, context_mask=None):
        mask = None if context_mask is None else context_mask[:, None, :]
        return scaled_dot_product_attention(x @ W_query, context @ W_key, context @ W_value, mask,
                                            scale=1.0)

    assert_fails(check_masked_cross_attention, unscaled, capsys, "the values of the weights", "1/sqrt(d_out)")


def test_cross_attention_returning_only_the_output(capsys):
    assert_fails(check_masked_cross_attention, lambda *args: cross_attention(*args)[0], capsys,
                 "returns the pair (output, weights)")


# ----------------------------------------------------------------------------- 12.2


def test_the_right_prediction(capsys):
    out = assert_passes(check_changed_scores, lambda: ~torch.eye(4, dtype=torch.bool), capsys)
    assert "only the diagonal keeps its scores" in out
    # A nested list of bools is a prediction too.
    table = [[m != n for n in range(4)] for m in range(4)]
    assert_passes(check_changed_scores, lambda: table, capsys)


def test_predicting_that_everything_changes(capsys):
    assert_fails(check_changed_scores, lambda: torch.ones(4, 4, dtype=torch.bool), capsys,
                 "same position keep their value", "True at (0, 0), (1, 1), (2, 2), (3, 3)")


def test_predicting_that_nothing_changes(capsys):
    assert_fails(check_changed_scores, lambda: torch.zeros(4, 4, dtype=torch.bool), capsys,
                 "the pairing matters for some scores")


def test_predicting_that_position_zero_is_safe(capsys):
    prediction = ~torch.eye(4, dtype=torch.bool)
    prediction[0, :] = False
    prediction[:, 0] = False
    assert_fails(check_changed_scores, lambda: prediction, capsys,
                 "False at (0, 1), (0, 2), (0, 3), (1, 0)", "at position 0 nothing turns")


def test_predicting_only_the_causal_half(capsys):
    assert_fails(check_changed_scores, lambda: torch.ones(4, 4, dtype=torch.bool).tril(-1), capsys,
                 "scores of tokens at different positions change", "before a causal mask hides them")


def test_predicting_a_few_changes(capsys):
    prediction = torch.zeros(4, 4, dtype=torch.bool)
    prediction[0, 1] = prediction[2, 3] = True
    assert_fails(check_changed_scores, lambda: prediction, capsys, "False at (0, 2), (0, 3), (1, 0)",
                 "two different rotations")


def test_a_prediction_of_the_wrong_shape(capsys):
    assert_fails(check_changed_scores, lambda: [True, False], capsys, "the shape of your prediction")


# ----------------------------------------------------------------------------- 12.3


def rope_2d(x, rows, cols):
    half = x.size(-1) // 2
    return torch.cat((rotary_embedding(x[..., :half], rows),
                      rotary_embedding(x[..., half:], cols)), dim=-1)


def test_rope_2d_right_answer(capsys):
    assert_passes(check_rope_2d, rope_2d, capsys)


def test_rope_2d_with_rows_and_columns_swapped(capsys):
    assert_fails(check_rope_2d, lambda x, rows, cols: rope_2d(x, cols, rows), capsys,
                 "the first half of the features turns with the rows")


def test_rope_2d_with_added_positions(capsys):
    # One rotation by rows + cols: not shift-invariant per axis, so the property names it.
    assert_fails(check_rope_2d, lambda x, rows, cols: rotary_embedding(x, rows * 3 + cols), capsys,
                 "the values of rope_2d")


def test_rope_2d_not_relative(capsys):
    def absolute(x, rows, cols):
        return rope_2d(x, rows, cols) + 0.1 * rows[:, None]  # adds an absolute position

    assert_fails(check_rope_2d, absolute, capsys, "scores depend only on the row and column distances")


def test_rope_2d_interleaved(capsys):
    def interleaved(x, rows, cols):
        half = x.size(-1) // 2
        return torch.cat((rotary_embedding(x[..., :half], rows, interleaved=True),
                          rotary_embedding(x[..., half:], cols, interleaved=True)), dim=-1)

    assert_fails(check_rope_2d, interleaved, capsys, "each half uses the split-half pairing")


# ----------------------------------------------------------------------------- 12.4


def rope_from_a_blog(x, positions):
    """The buggy code of the exercise, as the chapter shows it."""
    head_dim = x.size(-1)
    frequencies = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * frequencies
    cos = angles.cos().repeat_interleave(2, dim=-1).to(x.dtype)
    sin = angles.sin().repeat_interleave(2, dim=-1).to(x.dtype)
    first, second = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def fixed_rope(x, positions):
    head_dim = x.size(-1)
    frequencies = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[:, None] * frequencies
    cos = torch.cat((angles, angles), dim=-1).cos().to(x.dtype)
    sin = torch.cat((angles, angles), dim=-1).sin().to(x.dtype)
    first, second = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def test_fixed_rope_right_answer(capsys):
    assert_passes(check_fixed_rope, fixed_rope, capsys)


def test_the_blogs_bug_is_caught_by_the_shift(capsys):
    assert_fails(check_fixed_rope, rope_from_a_blog, capsys,
                 "the scores stay the same when every position shifts by 7", "cos and sin")


def test_fixed_rope_with_the_interleaved_pairing(capsys):
    assert_fails(check_fixed_rope, lambda x, p: rotary_embedding(x, p, interleaved=True), capsys,
                 "the fix keeps the split-half pairing")


def test_fixed_rope_turning_the_wrong_way(capsys):
    assert_fails(check_fixed_rope, lambda x, p: rotary_embedding(x, -p), capsys,
                 "the pairs turn by +angle")


def test_fixed_rope_with_other_frequencies(capsys):
    assert_fails(check_fixed_rope, lambda x, p: rotary_embedding(x, p, base=100.0), capsys,
                 "the values of fixed_rope")


# ----------------------------------------------------------------------------- 12.5


def decodes_like_full_pass(layer, x):
    cache = KVCache(x.size(-2))
    with torch.no_grad():
        full = layer(x)
        steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(x.size(-2))]
    return torch.allclose(torch.cat(steps, dim=-2), full, atol=1e-5)


def test_property_test_right_answer(capsys):
    out = assert_passes(check_decodes_like_full_pass, decodes_like_full_pass, capsys)
    assert "catches both broken ones" in out


def test_property_test_that_always_passes(capsys):
    assert_fails(check_decodes_like_full_pass, lambda layer, x: True, capsys,
                 "your test catches a broken layer: bug_zoo.RotaryCacheRestartsPositions")


def test_property_test_that_always_fails(capsys):
    assert_fails(check_decodes_like_full_pass, lambda layer, x: False, capsys,
                 "a healthy layer passes your test: MultiHeadAttention(rope=True)")


def test_property_test_comparing_only_the_first_token(capsys):
    def first_only(layer, x):
        cache = KVCache(x.size(-2))
        with torch.no_grad():
            return torch.allclose(layer(x[:, :1], kv_cache=cache), layer(x)[:, :1], atol=1e-5)

    assert_fails(check_decodes_like_full_pass, first_only, capsys, "RotaryCacheRestartsPositions",
                 "the first token is right")


def test_property_test_feeding_everything_in_one_call(capsys):
    def one_call(layer, x):
        with torch.no_grad():
            return torch.allclose(layer(x, kv_cache=KVCache(x.size(-2))), layer(x), atol=1e-5)

    assert_fails(check_decodes_like_full_pass, one_call, capsys, "RotaryCacheRestartsPositions")


def test_property_test_comparing_exactly(capsys):
    def exact(layer, x):
        cache = KVCache(x.size(-2))
        with torch.no_grad():
            steps = [layer(x[:, t:t + 1], kv_cache=cache) for t in range(x.size(-2))]
            return torch.equal(torch.cat(steps, dim=-2), layer(x))

    assert_fails(check_decodes_like_full_pass, exact, capsys, "a healthy layer passes your test",
                 "within a tolerance")


def test_property_test_returning_a_tensor_is_accepted(capsys):
    def as_tensor(layer, x):
        return torch.tensor(decodes_like_full_pass(layer, x))

    assert_passes(check_decodes_like_full_pass, as_tensor, capsys)


def test_property_test_returning_a_number(capsys):
    assert_fails(check_decodes_like_full_pass, lambda layer, x: math.pi, capsys,
                 "the test returns True or False")
