"""Chapter 10's checkers accept right answers and explain each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from checker_asserts import assert_fails, assert_passes
from torch.nn.attention.bias import causal_lower_right

from attention_book import causal_mask
from attention_book.exercises import (
    check_attention_flops,
    check_cached_attention,
    check_combine,
    check_predicted_cache_bytes,
)

# --- 10.1 attention_flops with T_q != T_k --------------------------------------------------------


def _flops(b, h, tq, tk, d, causal=False, *, top_left=False, half=False, no_diagonal=False):
    if not causal:
        return 4 * b * h * tq * tk * d
    if half:
        return 2 * b * h * tq * tk * d
    offset = 0 if top_left else tk - tq
    pairs = sum(min(i + offset + 1, tk) for i in range(tq))
    return 4 * b * h * d * (pairs - (tq if no_diagonal else 0))


def test_flops_right(capsys):
    assert_passes(check_attention_flops, _flops, capsys)
    assert_passes(check_attention_flops,  # the closed form, and the mask counted by the package
                  lambda b, h, tq, tk, d, causal=False: 4 * b * h * d * (
                      tq * (tk - tq) + tq * (tq + 1) // 2 if causal else tq * tk), capsys)
    assert_passes(check_attention_flops, lambda b, h, tq, tk, d, causal=False: 4 * b * h * d * (
        int(causal_mask(tq, tk).sum()) if causal else tq * tk), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda b, h, tq, tk, d, causal=False: 4 * b * h * tk * tk * d, "You counted a square"),
    (lambda b, h, tq, tk, d, causal=False: 4 * b * h * tq * tq * d, "You counted the queries twice"),
    (lambda b, h, tq, tk, d, causal=False: 2 * b * h * tq * tk * d, "half the answer"),
    (lambda b, h, tq, tk, d, causal=False: 4.0 * b * h * tq * tk * d, "is an int"),
    (lambda b, h, tq, tk, d, causal=False: 4 * b * h * (tq + tk) * d, "Count the two products"),
    (lambda b, h, tq, tk, d: 4 * b * h * tq * tk * d, "unexpected keyword argument 'causal'"),
    (lambda b, h, tq, tk, d, causal=False: _flops(b, h, tq, tk, d), "count only the (query, key)"),
    (lambda b, h, tq, tk, d, causal=False: _flops(b, h, tq, tk, d, causal, top_left=True),
     "aligned top-left"),
    (lambda b, h, tq, tk, d, causal=False: _flops(b, h, tq, tk, d, causal, half=True),
     "Half of the T_q x T_k pairs is not the count"),
    (lambda b, h, tq, tk, d, causal=False: _flops(b, h, tq, tk, d, causal, no_diagonal=True),
     "count the diagonal too"),
])
def test_flops_wrong(answer, phrase, capsys):
    assert_fails(check_attention_flops, answer, capsys, phrase)


def test_flops_unwritten(capsys):
    def attention_flops(batch_size, num_heads, num_queries, num_keys, head_dim, causal=False):
        raise NotImplementedError()

    assert_fails(check_attention_flops, attention_flops, capsys,
                 "You have not written `attention_flops` yet", sections=())


# --- 10.2 predicted cache bytes ----------------------------------------------------------------

RIGHT_BYTES = 2 * 1 * 2 * 40 * 8 * 4  # keys and values, B, H_kv, max_length, head_dim, float32


def test_prediction_right(capsys):
    assert_passes(check_predicted_cache_bytes, lambda: RIGHT_BYTES, capsys)


@pytest.mark.parametrize(("value", "phrase"), [
    (2 * 1 * 2 * 16 * 8 * 4, "You counted the 16 tokens"),
    (1 * 1 * 2 * 40 * 8 * 4, "half the size"),  # keys only (or 2 bytes a number)
    (2 * 1 * 8 * 40 * 8 * 4, "four times the size"),  # every query head
    (2 * 1 * 2 * 40 * 32 * 4, "four times the size"),  # head_dim = d_out / num_kv_heads
    (2 * 1 * 2 * 40 * 8 * 8, "twice the size"),  # float64
    (RIGHT_BYTES * 8, "bits instead of bytes"),
    (RIGHT_BYTES // 4, "a quarter of the size"),  # numbers, not bytes
    (12345, "Work through the cache's buffers"),
])
def test_prediction_wrong_never_reveals_the_answer(value, phrase, capsys):
    out = assert_fails(check_predicted_cache_bytes, lambda: value, capsys, phrase)
    assert str(RIGHT_BYTES) not in out


def test_prediction_not_an_int(capsys):
    assert_fails(check_predicted_cache_bytes, lambda: "5 KiB", capsys, "is an int")


# --- 10.3 combine two partial softmax states -------------------------------------------------


def combine_right(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    shift = torch.where(m.isfinite(), m, 0.0)
    scale_a, scale_b = torch.exp(m_a - shift), torch.exp(m_b - shift)
    return m, l_a * scale_a + l_b * scale_b, o_a * scale_a + o_b * scale_b


def combine_without_shift(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * scale_a + l_b * scale_b, o_a * scale_a + o_b * scale_b


def combine_no_rescale(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    return torch.maximum(m_a, m_b), l_a + l_b, o_a + o_b


def combine_inverted(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m - m_a), torch.exp(m - m_b)
    return m, l_a * scale_a + l_b * scale_b, o_a * scale_a + o_b * scale_b


def combine_l_only(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * scale_a + l_b * scale_b, o_a + o_b


def combine_o_only(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a + l_b, o_a * scale_a + o_b * scale_b


def combine_average(state_a, state_b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    return torch.maximum(m_a, m_b), torch.ones_like(l_a), (o_a / l_a + o_b / l_b) / 2


def combine_normalised(state_a, state_b):
    m, total, o = combine_right(state_a, state_b)
    return m, torch.ones_like(total), o / total


def combine_raw_exp(state_a, state_b):
    """Right on paper, but exp(m) overflows for large scores."""
    (m_a, l_a, o_a), (m_b, l_b, o_b) = state_a, state_b
    m = torch.maximum(m_a, m_b)
    scale_a, scale_b = torch.exp(m_a) / torch.exp(m), torch.exp(m_b) / torch.exp(m)
    return m, l_a * scale_a + l_b * scale_b, o_a * scale_a + o_b * scale_b


def combine_sum_m(state_a, state_b):
    m, total, o = combine_right(state_a, state_b)
    return m + 1.0, total, o


def test_combine_right(capsys):
    assert_passes(check_combine, combine_right, capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (combine_no_rescale, "You added the two states as they are"),
    (combine_inverted, "upside down"),
    (combine_l_only, "You rescaled l but not o"),
    (combine_o_only, "You rescaled o but not l"),
    (combine_average, "equal weight"),
    (combine_normalised, "Return the unnormalised state"),
    (combine_sum_m, "the larger of the two"),
    (combine_raw_exp, "Never exponentiate a raw maximum"),
    (combine_without_shift, "exp(-inf - (-inf)) is NaN"),
    (lambda a, b: a[2], "a tuple (m, l, o)"),
    (lambda a, b: (a[0].squeeze(-1), a[1], a[2]), "the shape of m"),
])
def test_combine_wrong(answer, phrase, capsys):
    assert_fails(check_combine, answer, capsys, phrase)


# --- 10.4 cached attention (bug hunt) --------------------------------------------------------


def cached_right(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    mask = causal_mask(query_new.size(-2), keys.size(-2))
    return F.scaled_dot_product_attention(query_new, keys, values, attn_mask=mask)


def cached_lower_right(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    bias = causal_lower_right(query_new.size(-2), keys.size(-2))
    return F.scaled_dot_product_attention(query_new, keys, values, attn_mask=bias)


def cached_by_hand(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    num_new, num_keys = query_new.size(-2), keys.size(-2)
    scores = query_new @ keys.transpose(-2, -1) / math.sqrt(query_new.size(-1))
    allowed = torch.ones(num_new, num_keys, dtype=torch.bool).tril(num_keys - num_new)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ values


def cached_buggy(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    return F.scaled_dot_product_attention(query_new, keys, values, is_causal=True)


def cached_no_mask(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    return F.scaled_dot_product_attention(query_new, keys, values)


def cached_no_update(query_new, key_new, value_new, cache):
    return F.scaled_dot_product_attention(query_new, key_new, value_new, is_causal=True)


def cached_new_keys_only(query_new, key_new, value_new, cache):
    cache.update(key_new, value_new)
    return F.scaled_dot_product_attention(query_new, key_new, value_new, is_causal=True)


def cached_twice(query_new, key_new, value_new, cache):
    cache.update(key_new, value_new)
    return cached_right(query_new, key_new, value_new, cache)


def cached_returns_pair(query_new, key_new, value_new, cache):
    return cached_right(query_new, key_new, value_new, cache), None


def cached_inverted(query_new, key_new, value_new, cache):
    keys, values = cache.update(key_new, value_new)
    mask = ~causal_mask(query_new.size(-2), keys.size(-2))
    scores = query_new @ keys.transpose(-2, -1) / math.sqrt(query_new.size(-1))
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num()
    return weights @ values


@pytest.mark.parametrize("answer", [cached_right, cached_lower_right, cached_by_hand])
def test_cached_right(answer, capsys):
    assert_passes(check_cached_attention, answer, capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (cached_buggy, "top-left"),
    (cached_no_mask, "you still need a causal mask"),
    (cached_no_update, "cache.update(key_new, value_new)"),
    (cached_new_keys_only, "not over the new ones alone"),
    (cached_twice, "exactly once per call"),
    (cached_returns_pair, "the new positions only"),
    (cached_inverted, "aligned bottom-right: new query i may see keys"),
])
def test_cached_wrong(answer, phrase, capsys):
    assert_fails(check_cached_attention, answer, capsys, phrase)
