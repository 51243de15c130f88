"""Chapter 13's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests
from torch.nn.attention.flex_attention import (
    AuxRequest,
    and_masks,
    create_block_mask,
    flex_attention,
    or_masks,
)

from attention_book import mods
from attention_book.exercises import (
    check_chunked_attention_rule,
    check_flex_attention_with_sink,
    check_relative_bias_mod,
    check_streaming_prediction,
    check_streaming_rule,
    check_window_tile_prediction,
)

NOTEBOOK = "13_windows_and_sinks.ipynb"


@pytest.mark.parametrize("checker", [check_chunked_attention_rule, check_relative_bias_mod,
                                     check_window_tile_prediction,
                                     check_flex_attention_with_sink, check_streaming_prediction,
                                     check_streaming_rule])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 13.1


def chunked_rule(chunk_size):
    def allowed(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx // chunk_size == kv_idx // chunk_size)

    return allowed


def test_chunked_rule_right_answer(capsys):
    out = assert_passes(check_chunked_attention_rule, chunked_rule, capsys)
    assert "create_block_mask" in out
    assert passes_hidden_tests(NOTEBOOK, "ch13-ex1-check", chunked_rule=chunked_rule)


def shape_branching_rule(chunk_size):
    """Right on grids and on single indices, but it asks a tensor for a Python bool (review N3)."""
    def allowed(b, h, q_idx, kv_idx):
        if q_idx.dim() == 0:
            return bool(kv_idx <= q_idx) and bool(q_idx // chunk_size == kv_idx // chunk_size)
        return (kv_idx <= q_idx) & (q_idx // chunk_size == kv_idx // chunk_size)

    return allowed


def test_a_rule_that_breaks_in_create_block_mask_fails_the_checker_and_the_hidden_tests(capsys):
    assert_fails(check_chunked_attention_rule, shape_branching_rule, capsys,
                 "in FlexAttention's create_block_mask", "under vmap", "tensor operations only")
    assert not passes_hidden_tests(NOTEBOOK, "ch13-ex1-check", chunked_rule=shape_branching_rule)


def test_chunked_rule_returning_numbers(capsys):
    def as_int(chunk_size):
        return lambda b, h, q, k: ((k <= q) & (q // chunk_size == k // chunk_size)).int()

    assert_fails(check_chunked_attention_rule, as_int, capsys, "return a bool tensor",
                 "drop the .int()")


def test_chunked_rule_right_answer_works_in_flex_attention():
    """The checker's grid and single-index calls stand for FlexAttention's: the same rule runs."""
    from torch.nn.attention.flex_attention import create_mask

    vmapped = create_mask(chunked_rule(3), 1, 1, 8, 8, device="cpu")  # FlexAttention's vmap
    assert torch.equal(vmapped, mods.materialize(chunked_rule(3), 1, 1, 8))


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


def test_chunked_rule_that_only_works_on_grids(capsys):
    def grid_only(chunk_size):
        def allowed(b, h, q_idx, kv_idx):
            if q_idx.dim() == 0:
                return torch.tensor(True)
            return (kv_idx <= q_idx) & (q_idx // chunk_size == kv_idx // chunk_size)

        return allowed

    assert_fails(check_chunked_attention_rule, grid_only, capsys, "single pair")


# ----------------------------------------------------------------------------- 13.2


def relative_bias_mod(bias):
    max_distance = bias.size(-1)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h, (q_idx - kv_idx).clamp(0, max_distance - 1)]

    return biased


def test_relative_bias_right_answer(capsys):
    assert_passes(check_relative_bias_mod, relative_bias_mod, capsys)


def test_relative_bias_right_answer_runs_in_flex_attention():
    bias = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    query, key, value = torch.randn(3, 1, 2, 6, 4, generator=torch.Generator().manual_seed(1))
    block_mask = create_block_mask(mods.causal, None, None, 6, 6, device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        output = flex_attention(query, key, value, score_mod=relative_bias_mod(bias),
                                block_mask=block_mask)
    rows = torch.arange(6)
    scores = query @ key.transpose(-2, -1) / 2 + bias[:, (rows[:, None] - rows).clamp(0, 2)]
    scores = scores.masked_fill(rows[:, None] < rows, float("-inf"))
    torch.testing.assert_close(output, torch.softmax(scores, -1) @ value)


def test_relative_bias_without_clipping_the_far_keys(capsys):
    def unclipped(bias):
        return lambda score, b, h, q, k: score + bias[h, (q - k).clamp(min=0)]

    assert_fails(check_relative_bias_mod, unclipped, capsys, "farther keys share the last column")


def test_relative_bias_that_breaks_on_future_keys(capsys):
    def future_unsafe(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[h, (q - k).clamp(max=last)]

    assert_fails(check_relative_bias_mod, future_unsafe, capsys, "keys in the future too",
                 "clip the distance at 0")


def test_relative_bias_with_the_distance_reversed(capsys):
    def reversed_distance(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[h, (k - q).clamp(0, last)]

    assert_fails(check_relative_bias_mod, reversed_distance, capsys, "q_idx - kv_idx")


def test_relative_bias_off_by_one(capsys):
    def shifted(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[h, (q - k - 1).clamp(0, last)]

    assert_fails(check_relative_bias_mod, shifted, capsys, "match the reference")


def test_relative_bias_python_min(capsys):
    def python_min(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[h, min(q - k, last)]

    assert_fails(check_relative_bias_mod, python_min, capsys, "tensor operations only")


def test_relative_bias_chained_indexing(capsys):
    def chained(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[h][(q - k).clamp(0, last)]

    assert_fails(check_relative_bias_mod, chained, capsys, "fewer than max_distance positions back",
                 "bias[h][d]")


def test_relative_bias_same_row_for_every_head(capsys):
    def head_zero(bias):
        last = bias.size(-1) - 1
        return lambda score, b, h, q, k: score + bias[0, (q - k).clamp(0, last)]

    assert_fails(check_relative_bias_mod, head_zero, capsys, "the head index h picks the row")


# ----------------------------------------------------------------------------- 13.3


def test_tile_prediction_right_answer(capsys):
    assert_passes(check_window_tile_prediction, lambda: (26, 19), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    ((21, 14), "key tile i - 3"),
    ((30, 12), "window of 300"),
    ((26, 7), "you counted the full ones"),
    ((26, 8), "far edge"),
    ((26, 13), "tiles two back"),
    ((26, 20), "a tile is full only when"),
    ((32, 19), "no keys before 0"),
    ((26.5, 19), "whole numbers"),
    ((26,), "returns a pair"),
])
def test_tile_prediction_wrong_answers(answer, phrase, capsys):
    assert_fails(check_window_tile_prediction, lambda: answer, capsys, phrase)


def test_tile_prediction_matches_the_package():
    from attention_book import tile_plan

    plan = tile_plan(1024, 1024, 128, window=300)
    assert (int((plan > 0).sum()), int((plan == 2).sum())) == (26, 19)


# ----------------------------------------------------------------------------- 13.4


def _flex(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


def _flex_with_gate(gate_of, window_of=lambda window: window):
    def answer(query, key, value, window, sink_logit):
        num_tokens = query.size(-2)
        block_mask = create_block_mask(mods.sliding_window(window_of(window)), None, None,
                                       num_tokens, num_tokens, device="cpu")
        output, aux = _flex(query, key, value, block_mask=block_mask,
                            return_aux=AuxRequest(lse=True))
        return output * gate_of(aux.lse, sink_logit)

    return answer


def _right_gate(lse, sink):
    return torch.sigmoid(lse - sink.view(1, -1, 1)).unsqueeze(-1)


def test_flex_sink_right_answer(capsys):
    assert_passes(check_flex_attention_with_sink, _flex_with_gate(_right_gate), capsys)


def test_flex_sink_deprecated_return_lse_also_passes(capsys):
    def with_return_lse(query, key, value, window, sink_logit):
        num_tokens = query.size(-2)
        block_mask = create_block_mask(mods.sliding_window(window), None, None, num_tokens,
                                       num_tokens, device="cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output, lse = flex_attention(query, key, value, block_mask=block_mask,
                                         return_lse=True)
        return output * torch.sigmoid(lse - sink_logit.view(1, -1, 1)).unsqueeze(-1)

    assert_passes(check_flex_attention_with_sink, with_return_lse, capsys)


def test_flex_sink_without_a_gate(capsys):
    assert_fails(check_flex_attention_with_sink, _flex_with_gate(lambda lse, sink: 1.0), capsys,
                 "as if there were no sink")


def test_flex_sink_as_a_fixed_sigmoid(capsys):
    out = assert_fails(check_flex_attention_with_sink,
                       _flex_with_gate(lambda lse, sink: torch.sigmoid(-sink).view(1, -1, 1, 1)),
                       capsys, "sigmoid-of-the-sink bug", "log-sum-exp left out")
    assert "13.4" in out


def test_flex_sink_inverted_gate(capsys):
    assert_fails(check_flex_attention_with_sink,
                 _flex_with_gate(lambda lse, sink: torch.sigmoid(sink.view(1, -1, 1) - lse)
                                 .unsqueeze(-1)), capsys, "the sink's own share")


def test_flex_sink_log2_lse(capsys):
    assert_fails(check_flex_attention_with_sink,
                 _flex_with_gate(lambda lse, sink: torch.sigmoid(lse / math.log(2)
                                                                 - sink.view(1, -1, 1))
                                 .unsqueeze(-1)), capsys, "natural-log")


def test_flex_sink_per_query_instead_of_per_head(capsys):
    assert_fails(check_flex_attention_with_sink,
                 _flex_with_gate(lambda lse, sink: torch.sigmoid(lse - sink[0]).unsqueeze(-1)),
                 capsys, "that head's own sink")


def test_flex_sink_window_off_by_one(capsys):
    assert_fails(check_flex_attention_with_sink,
                 _flex_with_gate(_right_gate, window_of=lambda window: window + 1), capsys,
                 "the query's own included")


def test_flex_sink_wrong_shape(capsys):
    assert_fails(check_flex_attention_with_sink,
                 lambda query, key, value, window, sink: query[..., 0], capsys,
                 "(B, heads, T, head_dim)")


# ----------------------------------------------------------------------------- 13.5


def test_streaming_prediction_right_answer(capsys):
    answer = (torch.tensor([0.5, 0.8]), [0.625, 0.0], 0.8)
    out = assert_passes(check_streaming_prediction, lambda: answer, capsys)
    assert "exactly what tokens 2 ... 5 added" in out
    assert passes_hidden_tests(NOTEBOOK, "ch13-ex5-check", predicted_streaming=lambda: answer)


@pytest.mark.parametrize(("answer", "phrase"), [
    (((0.5, 0.0), (0.625, 0.0), 0.8), "full attention still sees tokens 2 ... 5"),
    (((0.5, 0.8), (0.5, 0.0), 0.8), "scaled up to sum to 1"),
    (((0.5, 0.8), (0.5, 0.8), 0.0), "have left the cache"),
    (((0.5, 0.8), (0.625, 0.0), 0.0), "cannot give it a second feature"),
    (((0.5, 0.8), (0.625, 0.0), (0.125**2 + 0.8**2) ** 0.5), "the error without a sink"),
    (((0.5, 0.8), (0.625, 0.0), 0.125), "closest one to full_output"),
    # the review's wrong answer (D12): the squared distance, which 1.0 could not tell apart
    (((0.5, 0.8), (0.625, 0.0), 0.64), "squared length"),
    (((0.5, 0.8), (0.625, 0.0)), "returns three things"),
    (((0.5, 0.8, 0.0), (0.625, 0.0), 0.8), "is a pair of numbers"),
])
def test_streaming_prediction_wrong_answers(answer, phrase, capsys):
    assert_fails(check_streaming_prediction, lambda: answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch13-ex5-check", predicted_streaming=lambda: answer)


# ----------------------------------------------------------------------------- 13.6


def _sinks(num_sinks):
    return lambda b, h, q_idx, kv_idx: kv_idx < num_sinks


def streaming_rule(num_sinks, window):
    return and_masks(mods.causal, or_masks(_sinks(num_sinks), mods.sliding_window(window)))


def test_streaming_rule_right_answers(capsys):
    out = assert_passes(check_streaming_rule, streaming_rule, capsys)
    assert "what the cache has forgotten" in out

    def by_hand(num_sinks, window):
        def allowed(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & ((kv_idx < num_sinks) | (q_idx - kv_idx < window))

        return allowed

    assert_passes(check_streaming_rule, by_hand, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch13-ex6-check", streaming_rule=by_hand)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda n, w: or_masks(_sinks(n), mods.sliding_window(w)), "a sink is a key like any other"),
    (lambda n, w: and_masks(mods.causal, or_masks(_sinks(n), mods.sliding_window(w + 1))),
     "the query's own included"),
    (lambda n, w: mods.sliding_window(w), "stay visible to every later query"),
    (lambda n, w: and_masks(mods.causal, or_masks(_sinks(n - 1), mods.sliding_window(w))),
     "stay visible to every later query"),
    (lambda n, w: shape_branching_rule(w), "query"),
    (lambda n, w: torch.ones(3, 3, dtype=torch.bool), "returns a rule"),
])
def test_streaming_rule_wrong_answers(answer, phrase, capsys):
    assert_fails(check_streaming_rule, answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch13-ex6-check", streaming_rule=answer)


def test_a_streaming_rule_that_breaks_in_create_block_mask(capsys):
    def branching(num_sinks, window):
        right = streaming_rule(num_sinks, window)

        def allowed(b, h, q_idx, kv_idx):
            if q_idx.dim() == 0:
                return bool(right(b, h, q_idx, kv_idx))
            return right(b, h, q_idx, kv_idx)

        return allowed

    assert_fails(check_streaming_rule, branching, capsys, "in FlexAttention's create_block_mask")
    assert not passes_hidden_tests(NOTEBOOK, "ch13-ex6-check", streaming_rule=branching)
