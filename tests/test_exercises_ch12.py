"""Chapter 12's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, assert_rejected, unwritten
from hidden_tests import passes_hidden_tests

import attention_book as ab
from attention_book import KVCache, rotary_embedding
from attention_book.exercises import (
    check_alibi_slopes,
    check_changed_scores,
    check_decodes_like_full_pass,
    check_fixed_rope,
    check_rope_2d,
)


@pytest.mark.parametrize("checker", [check_alibi_slopes, check_changed_scores, check_rope_2d,
                                     check_fixed_rope, check_decodes_like_full_pass])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 12.1


def alibi_slopes(num_heads):
    """A learner's answer, written from the prompt's rule."""
    def geometric(count):
        return [2.0 ** (-8 * (h + 1) / count) for h in range(count)]

    lower = 1
    while 2 * lower <= num_heads:
        lower *= 2
    return torch.tensor(geometric(lower) + geometric(2 * lower)[0::2][: num_heads - lower])


def test_alibi_slopes_right_answer(capsys):
    out = assert_passes(check_alibi_slopes, alibi_slopes, capsys)
    assert "from 1 to 96" in out
    # A list of floats is an answer too, and so is float32.
    assert_passes(check_alibi_slopes, lambda n: alibi_slopes(n).tolist(), capsys)
    assert_passes(check_alibi_slopes, lambda n: alibi_slopes(n).float(), capsys)


def test_alibi_slopes_match_the_package_and_the_paper_for_every_head_count():
    """The checker's reference is the paper's rule: it equals ab.alibi_slopes for n = 1 ... 128."""
    for n in range(1, 129):
        torch.testing.assert_close(alibi_slopes(n).float(), ab.alibi_slopes(n))
    assert [round(s, 4) for s in alibi_slopes(6).tolist()] == [0.25, 0.0625, 0.0156, 0.0039, 0.5,
                                                                0.125]


def test_alibi_slopes_with_the_obvious_extension(capsys):
    def geometric(n):
        return torch.tensor([2.0 ** (-8 * (h + 1) / n) for h in range(n)])

    assert_fails(check_alibi_slopes, geometric, capsys, "alibi_slopes(3) equals the slopes of Press",
                 "obvious extension, but not the paper's")


def test_alibi_slopes_sorted(capsys):
    assert_fails(check_alibi_slopes, lambda n: alibi_slopes(n).sort(descending=True).values,
                 capsys, "alibi_slopes(3)", "the wrong order")


def test_alibi_slopes_from_the_wrong_half(capsys):
    def duplicates(num_heads):
        lower = 2 ** (num_heads.bit_length() - 1)
        extra = [2.0 ** (-8 * (h + 1) / (2 * lower)) for h in range(2 * lower)][1::2]
        return torch.tensor([2.0 ** (-8 * (h + 1) / lower) for h in range(lower)]
                            + extra[: num_heads - lower])

    assert_fails(check_alibi_slopes, duplicates, capsys, "some slopes repeat")


def test_alibi_slopes_truncating_the_next_power_of_two(capsys):
    def truncated(num_heads):
        upper = 1 << (num_heads - 1).bit_length()
        return torch.tensor([2.0 ** (-8 * (h + 1) / upper) for h in range(upper)][:num_heads])

    assert_fails(check_alibi_slopes, truncated, capsys, "alibi_slopes(3)",
                 "never reach the gentle end")


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda n: torch.tensor([2.0 ** (-8 * h / n) for h in range(n)]), "not 2^0 = 1"),
    (lambda n: alibi_slopes(n).flip(0), "head 0 gets the steepest slope"),
    (lambda n: 2 * alibi_slopes(n), "a geometric sequence whose first term and ratio"),
])
def test_alibi_slopes_wrong_for_a_power_of_two(answer, phrase, capsys):
    assert_fails(check_alibi_slopes, answer, capsys, "follows the rule for a power of two", phrase)


def test_alibi_slopes_of_the_wrong_length_or_type(capsys):
    assert_fails(check_alibi_slopes, lambda n: alibi_slopes(n)[:-1], capsys,
                 "the shape of alibi_slopes(1) is (1,)")
    assert_fails(check_alibi_slopes, lambda n: "slopes", capsys,
                 "returns the slopes")


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
    out = assert_passes(check_rope_2d, rope_2d, capsys)
    assert "whatever the head_dim" in out
    assert passes_hidden_tests("12_positions_in_attention.ipynb", "ch12-ex3-check", rope_2d=rope_2d)


def rope_2d_half_four(x, rows, cols):
    """Right for head_dim = 8 only: the half is written as a number (review M4)."""
    return torch.cat((rotary_embedding(x[..., :4], rows), rotary_embedding(x[..., 4:], cols)), dim=-1)


def test_rope_2d_with_a_hard_coded_half_fails_the_checker_and_the_hidden_tests(capsys):
    assert_fails(check_rope_2d, rope_2d_half_four, capsys,
                 "the halves are head_dim // 2 = 6 features each", "x.size(-1) // 2")
    assert not passes_hidden_tests("12_positions_in_attention.ipynb", "ch12-ex3-check",
                                   rope_2d=rope_2d_half_four)


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
    assert "catches all 10 broken ones" in out
    assert passes_hidden_tests("12_positions_in_attention.ipynb", "ch12-ex5-check",
                               decodes_like_full_pass=decodes_like_full_pass)


def test_property_test_with_a_prefill_of_two_tokens_is_right_too(capsys):
    """The chapter's decode(): two tokens in the first call, then one per call."""
    def prefill_two(layer, x):
        cache = KVCache(x.size(-2))
        with torch.no_grad():
            steps = [layer(x[:, :2], kv_cache=cache)]
            steps += [layer(x[:, t:t + 1], kv_cache=cache) for t in range(2, x.size(-2))]
            return torch.allclose(torch.cat(steps, dim=-2), layer(x), atol=1e-5)

    assert_passes(check_decodes_like_full_pass, prefill_two, capsys)


def _decode_and_compare(layer, x, compare):
    """Decode x one token per call; return compare(decoded, full) for a weak test to pick."""
    cache = KVCache(x.size(-2))
    with torch.no_grad():
        full = layer(x)
        decoded = torch.cat([layer(x[:, t:t + 1], kv_cache=cache) for t in range(x.size(-2))],
                            dim=-2)
    return bool(compare(decoded, full))


def _all_close(decoded, full):
    return torch.allclose(decoded, full, atol=1e-5)


def first_two_tokens(layer, x):
    return _decode_and_compare(layer, x[:, :2], _all_close)


def first_three_tokens(layer, x):
    return _decode_and_compare(layer, x[:, :3], _all_close)


def first_four_tokens(layer, x):
    return _decode_and_compare(layer, x[:, :4], _all_close)


def last_token_only(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: _all_close(d[:, -1], f[:, -1]))


def all_but_the_last(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: _all_close(d[:, :-1], f[:, :-1]))


def ends_only(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: _all_close(d[:, [0, 1, -1]], f[:, [0, 1, -1]]))


def mean_over_tokens(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: torch.allclose(d.mean(1), f.mean(1), atol=0.1))


# Tests that compare a summary of the outputs within the right tolerance (review N-c: "compare
# only the means" passed): every broken layer but two shifts each of these summaries.
def mean_of_everything(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: torch.allclose(d.mean(), f.mean(), atol=1e-5))


def exact_mean_over_tokens(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: torch.allclose(d.mean(1), f.mean(1), atol=1e-5))


def mean_per_token(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: torch.allclose(d.mean(-1), f.mean(-1), atol=1e-5))


def norm_per_token(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: torch.allclose(d.norm(dim=-1), f.norm(dim=-1),
                                                                     atol=1e-5))


@pytest.mark.parametrize(("weak_test", "missed"), [
    (mean_of_everything, "off by +e and -e"),
    (exact_mean_over_tokens, "off by +e and -e"),
    (mean_per_token, "off by +e and -e"),
    (norm_per_token, "features reversed"),
])
def test_tests_of_a_summary_fail_the_checker_and_the_hidden_tests(weak_test, missed, capsys):
    assert_fails(check_decodes_like_full_pass, weak_test, capsys, "your test catches a broken layer",
                 missed, "not a summary such as a mean or a norm")
    assert not passes_hidden_tests("12_positions_in_attention.ipynb", "ch12-ex5-check",
                                   decodes_like_full_pass=weak_test)


# The weak tests of the review (chapters-12-14.md, defect 14: tokens 0-1, tokens 0-2, the last
# output only) and others like them: each passes every healthy layer and misses a broken one,
# and the checker names the one it missed.
@pytest.mark.parametrize(("weak_test", "missed"), [
    (first_two_tokens, "wrong from token 3 on"),
    (first_three_tokens, "wrong from token 3 on"),
    (last_token_only, "wrong in the middle only"),
    (first_four_tokens, "wrong at token 5 only"),
    (all_but_the_last, "wrong at token 5 only"),
    (ends_only, "wrong in the middle only"),
    (mean_over_tokens, "broken layer"),
])
def test_weak_property_tests_are_rejected(weak_test, missed, capsys):
    assert_fails(check_decodes_like_full_pass, weak_test, capsys,
                 "your test catches a broken layer", missed, "a bug can show at any depth")
    assert not passes_hidden_tests("12_positions_in_attention.ipynb", "ch12-ex5-check",
                                   decodes_like_full_pass=weak_test)


# The recheck's D2 (chapters-12-17-recheck-v2): three weak tests passed the checker and the
# hidden tests, because every broken layer went wrong in every call with a cache, in every
# sequence of the batch and in feature 0.
def first_sequence_only(layer, x):
    return decodes_like_full_pass(layer, x[:1])


def prefill_all_but_the_last(layer, x):
    cache = KVCache(x.size(-2))
    with torch.no_grad():
        full = layer(x)
        steps = [layer(x[:, :-1], kv_cache=cache), layer(x[:, -1:], kv_cache=cache)]
    return torch.allclose(torch.cat(steps, dim=-2), full, atol=1e-5)


def feature_zero_only(layer, x):
    return _decode_and_compare(layer, x, lambda d, f: _all_close(d[..., 0], f[..., 0]))


@pytest.mark.parametrize(("weak_test", "missed"), [
    (first_sequence_only, "wrong in every sequence of the batch but the first"),
    (prefill_all_but_the_last, "one-token calls"),
    (feature_zero_only, "last feature 0"),
])
def test_tests_of_one_sequence_one_prefill_or_one_feature_are_rejected(weak_test, missed, capsys):
    assert_rejected(check_decodes_like_full_pass, weak_test, capsys,
                    "your test catches a broken layer", missed, "every sequence of the batch")


def test_a_test_on_its_own_short_input_is_rejected(capsys):
    def own_input(layer, x):
        torch.manual_seed(0)
        return _decode_and_compare(layer, torch.randn(1, 3, x.size(-1)),
                                   lambda d, f: torch.allclose(d, f, atol=1e-5))

    assert_fails(check_decodes_like_full_pass, own_input, capsys, "wrong from token 3 on")


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
                 "compare the output of every token")


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
