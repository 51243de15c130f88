"""Chapter 10's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import math

import torch

from attention_book import causal_mask
from attention_book.exercises import (
    check_attention_flops,
    check_decoding_mask,
    check_kv_cache_size,
    check_online_max_and_sum,
)


def test_checkers_are_reexported():
    import attention_book.exercises as exercises
    from attention_book.exercises import ch10

    for name in ch10.__all__:
        assert getattr(exercises, name) is getattr(ch10, name)


def _fails_with(checker, answer, capsys, *phrases):
    assert checker(answer) is False
    out = capsys.readouterr().out
    for phrase in phrases:
        assert phrase in out, out


# --- attention_flops ---------------------------------------------------------------------------


def test_flops_right(capsys):
    assert check_attention_flops(lambda b, h, t, d: 4 * b * h * t * t * d)
    assert capsys.readouterr().out.startswith("Correct:")


def test_flops_half(capsys):
    _fails_with(check_attention_flops, lambda b, h, t, d: 2 * b * h * t * t * d, capsys,
                "Not yet. The check that failed: attention_flops", "half the answer")


def test_flops_linear_in_t(capsys):
    _fails_with(check_attention_flops, lambda b, h, t, d: 4 * b * h * t * d, capsys,
                "grows with T squared")


def test_flops_float(capsys):
    _fails_with(check_attention_flops, lambda b, h, t, d: 4.0 * b * h * t * t * d, capsys,
                "is an int")


# --- online max and sum ------------------------------------------------------------------------


def online_right(scores):
    running_max, running_sum = -math.inf, 0.0
    for x in scores.tolist():
        new_max = max(running_max, x)
        running_sum = running_sum * math.exp(running_max - new_max) + math.exp(x - new_max)
        running_max = new_max
    return running_max, running_sum


def online_no_rescale(scores):
    running_max, running_sum = -math.inf, 0.0
    for x in scores.tolist():
        running_max = max(running_max, x)
        running_sum += math.exp(x - running_max)
    return running_max, running_sum


def online_raw_exp(scores):
    return scores.max(), torch.exp(scores).sum() / torch.exp(scores.max())


def test_online_right(capsys):
    assert check_online_max_and_sum(online_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_online_without_rescaling(capsys):
    _fails_with(check_online_max_and_sum, online_no_rescale, capsys,
                "rescaled when the maximum grows", "exp(m - m_new)")


def test_online_overflows(capsys):
    _fails_with(check_online_max_and_sum, online_raw_exp, capsys, "is finite")


def test_online_not_a_pair(capsys):
    _fails_with(check_online_max_and_sum, lambda scores: scores.max(), capsys, "is a pair")


def test_online_pair_of_non_numbers(capsys):
    _fails_with(check_online_max_and_sum, lambda scores: (None, None), capsys,
                "holds two numbers")


# --- kv cache size -----------------------------------------------------------------------------


def test_kv_size_right(capsys):
    assert check_kv_cache_size(lambda layers, b, kv_heads, d, t, nbytes: 2 * layers * b * kv_heads * d
                        * t * nbytes)
    assert capsys.readouterr().out.startswith("Correct:")


def test_kv_size_forgets_values(capsys):
    _fails_with(check_kv_cache_size,
                lambda layers, b, kv_heads, d, t, nbytes: layers * b * kv_heads * d * t * nbytes,
                capsys, "counts keys and values")


def test_kv_size_forgets_bytes(capsys):
    _fails_with(check_kv_cache_size,
                lambda layers, b, kv_heads, d, t, nbytes: 2 * layers * b * kv_heads * d * t,
                capsys, "is in bytes", "bytes_per_element")


# --- decoding mask -----------------------------------------------------------------------------


def test_mask_right(capsys):
    assert check_decoding_mask(lambda new, keys: causal_mask(new, keys))
    assert capsys.readouterr().out.startswith("Correct:")


def test_mask_top_left(capsys):
    _fails_with(check_decoding_mask,
                lambda new, keys: torch.ones(new, keys, dtype=torch.bool).tril(), capsys,
                "aligned bottom-right", "is_causal")


def test_mask_wrong_polarity(capsys):
    _fails_with(check_decoding_mask, lambda new, keys: ~causal_mask(new, keys), capsys,
                "has the right entries")


def test_mask_float(capsys):
    _fails_with(check_decoding_mask, lambda new, keys: causal_mask(new, keys).float(), capsys,
                "is boolean")
