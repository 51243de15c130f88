"""Chapter 13's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten

from attention_book import causal_mask, sliding_window_mask
from attention_book.exercises import (
    check_chunked_attention_rule,
    check_fixed_absorbed_attention,
    check_sink_weights_prediction,
    check_streaming_sink_mask,
)


@pytest.mark.parametrize("checker", [check_streaming_sink_mask, check_chunked_attention_rule,
                                     check_sink_weights_prediction,
                                     check_fixed_absorbed_attention])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 13.1


def streaming_mask(num_tokens, window, num_sinks):
    sinks = causal_mask(num_tokens) & (torch.arange(num_tokens) < num_sinks)
    return sliding_window_mask(num_tokens, window) | sinks


def test_streaming_mask_right_answer(capsys):
    assert_passes(check_streaming_sink_mask, streaming_mask, capsys)


def test_streaming_mask_sinks_seen_by_earlier_queries(capsys):
    def leaky(num_tokens, window, num_sinks):
        return sliding_window_mask(num_tokens, window) | (torch.arange(num_tokens) < num_sinks)

    assert_fails(check_streaming_sink_mask, leaky, capsys, "future key", "causal mask")


def test_streaming_mask_window_off_by_one(capsys):
    def short(num_tokens, window, num_sinks):
        sinks = causal_mask(num_tokens) & (torch.arange(num_tokens) < num_sinks)
        return sliding_window_mask(num_tokens, max(window - 1, 1)) | sinks

    assert_fails(check_streaming_sink_mask, short, capsys, "counts the query's own position")


def test_streaming_mask_without_sinks(capsys):
    def no_sinks(num_tokens, window, num_sinks):
        return sliding_window_mask(num_tokens, window)

    assert_fails(check_streaming_sink_mask, no_sinks, capsys, "first num_sinks keys stay visible")


def test_streaming_mask_float(capsys):
    assert_fails(check_streaming_sink_mask, lambda *a: streaming_mask(*a).float(), capsys, "boolean")


# ----------------------------------------------------------------------------- 13.2


def chunked_rule(chunk_size):
    def allowed(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx // chunk_size == kv_idx // chunk_size)

    return allowed


def test_chunked_rule_right_answer(capsys):
    assert_passes(check_chunked_attention_rule, chunked_rule, capsys)


def test_chunked_rule_not_causal(capsys):
    def both_ways(chunk_size):
        return lambda b, h, q, k: q // chunk_size == k // chunk_size

    assert_fails(check_chunked_attention_rule, both_ways, capsys, "future key", "kv_idx <= q_idx")


def test_chunked_rule_is_a_window(capsys):
    def window(chunk_size):
        return lambda b, h, q, k: (k <= q) & (q - k < chunk_size)

    assert_fails(check_chunked_attention_rule, window, capsys, "sliding window")


def test_chunked_rule_python_logic(capsys):
    def python_and(chunk_size):
        return lambda b, h, q, k: (k <= q) and (q // chunk_size == k // chunk_size)

    assert_fails(check_chunked_attention_rule, python_and, capsys, "tensor operations only")


def test_chunked_rule_returns_a_mask_not_a_rule(capsys):
    assert_fails(check_chunked_attention_rule, lambda chunk_size: torch.ones(3, 3), capsys,
                 "returns a rule")


# ----------------------------------------------------------------------------- 13.3


def test_sink_prediction_right_answer(capsys):
    assert_passes(check_sink_weights_prediction, lambda: ([3 / 9, 1 / 9, 1 / 9, 2 / 9], 2 / 9), capsys)


def test_sink_prediction_plain_softmax(capsys):
    assert_fails(check_sink_weights_prediction, lambda: ([3 / 7, 1 / 7, 1 / 7, 2 / 7], 0.0), capsys,
                 "sum to less than 1")


def test_sink_prediction_wrong_share(capsys):
    assert_fails(check_sink_weights_prediction, lambda: ([3 / 9, 1 / 9, 1 / 9, 2 / 9], 7 / 9), capsys,
                 "sink's share")


def test_sink_prediction_sigmoid_gate(capsys):
    gate = 1 / (1 + 2.0)  # sigmoid(-ln 2)
    assert_fails(check_sink_weights_prediction,
                 lambda: ([w * gate for w in (3 / 7, 1 / 7, 1 / 7, 2 / 7)], 1 - gate), capsys,
                 "match the reference")


def test_sink_prediction_not_a_pair(capsys):
    assert_fails(check_sink_weights_prediction, lambda: [3 / 9, 1 / 9, 1 / 9, 2 / 9], capsys,
                 "returns a pair")


# ----------------------------------------------------------------------------- 13.4


def _absorbed(queries, latents, key_up, value_up, scale_dim=None, causal=True):
    absorbed = queries @ key_up
    latent_heads = latents.unsqueeze(1)
    size = queries.size(-1) if scale_dim is None else scale_dim
    scores = absorbed @ latent_heads.transpose(-2, -1) / math.sqrt(size)
    if causal:
        scores = scores.masked_fill(~causal_mask(scores.size(-1)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ latent_heads @ value_up.transpose(-2, -1)


def test_absorbed_right_answer(capsys):
    assert_passes(check_fixed_absorbed_attention, _absorbed, capsys)


def test_absorbed_blog_bug_latent_scale(capsys):
    def blog(queries, latents, key_up, value_up):
        return _absorbed(queries, latents, key_up, value_up, scale_dim=key_up.size(-1))

    assert_fails(check_fixed_absorbed_attention, blog, capsys, "1/sqrt(latent_dim)")


def test_absorbed_mask_dropped(capsys):
    def no_mask(queries, latents, key_up, value_up):
        return _absorbed(queries, latents, key_up, value_up, causal=False)

    assert_fails(check_fixed_absorbed_attention, no_mask, capsys, "causal mask")


def test_absorbed_latent_context_returned(capsys):
    def no_up(queries, latents, key_up, value_up):
        absorbed = queries @ key_up
        scores = absorbed @ latents.unsqueeze(1).transpose(-2, -1) / 2.0
        return torch.softmax(scores, dim=-1) @ latents.unsqueeze(1)

    assert_fails(check_fixed_absorbed_attention, no_up, capsys, "value_up")


def test_absorbed_other_error(capsys):
    def no_scale(queries, latents, key_up, value_up):
        return _absorbed(queries, latents, key_up, value_up, scale_dim=1)

    assert_fails(check_fixed_absorbed_attention, no_scale, capsys, "match the reference")
