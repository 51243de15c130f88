"""Chapter 19's checkers accept right answers and explain typical wrong ones; every wrong answer
the review of chapters 18-19 quotes fails the checker and the hidden tests alike."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests

import attention_book as ab
from attention_book.exercises import (
    check_causal_topk_attention,
    check_gated_heads,
    check_keys_needed,
    check_largest_k,
    check_predicted_choice,
    check_predicted_reuse,
)

NOTEBOOK = "19_sparse_and_gated_attention.ipynb"

# --- 19.1 which keys ------------------------------------------------------------------------


def test_choice_prediction(capsys):
    right = lambda: [(0, -1), (0, 1), (1, 2), (0, 1)]  # noqa: E731
    assert_passes(check_predicted_choice, right, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex1-check", predicted_choice=right)
    for wrong in ([(0, -1), (0, 1), (1, 3), (0, 1)], [(0, 1), (0, 1), (1, 2), (0, 1)],
                  [(0, -1), (0, 1), (1, 2), (2, 3)], [(0, -1), (1, 0), (1, 2), (0, 1)],
                  [(0, -1), (0, 2), (1, 3), (0, 1)], [(0, -1), (0, 1), (2, 3), (0, 1)]):
        assert not check_predicted_choice(lambda wrong=wrong: wrong)
        assert not passes_hidden_tests(NOTEBOOK, "ch19-ex1-check",
                                       predicted_choice=lambda wrong=wrong: wrong)
    capsys.readouterr()
    # The future's 9s taken for real: query 2 reads key 3.
    assert_fails(check_predicted_choice, lambda: [(0, -1), (0, 1), (1, 3), (0, 1)], capsys,
                 "query 2", "in its future")
    # No empty place.
    assert_fails(check_predicted_choice, lambda: [(0, 1), (0, 1), (1, 2), (0, 1)], capsys,
                 "query 0", "the empty place is -1")
    # The tie of query 3 broken toward the later keys.
    assert_fails(check_predicted_choice, lambda: [(0, -1), (0, 1), (1, 2), (2, 3)], capsys,
                 "query 3", "earlier key")
    assert_fails(check_predicted_choice, lambda: [(0, -1), (1, 0), (1, 2), (0, 1)], capsys,
                 "query 1", "increasing order")
    assert_fails(check_predicted_choice, lambda: 3, capsys, "four queries")
    assert_fails(check_predicted_choice, unwritten, capsys, "You have not written", sections=())


# --- 19.2 causal top-k ----------------------------------------------------------------------


def _masked_dense(query, key, value, allowed):
    group = query.size(1) // key.size(1)
    key = key.repeat_interleave(group, dim=1)  # (B, H, T, d)
    value = value.repeat_interleave(group, dim=1)  # (B, H, T, d)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, T)
    return torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1) @ value


def _causal_topk(query, key, value, scores, top_k):
    num_tokens = scores.size(-1)
    visible = ab.causal_mask(num_tokens)
    masked = scores.masked_fill(~visible, float("-inf"))
    order = masked.sort(dim=-1, descending=True, stable=True).indices[..., :min(top_k, num_tokens)]
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, True) & visible
    return _masked_dense(query, key, value, mask)


def _places_to_the_future(query, key, value, scores, top_k):
    # The chapter's colleague: choose first, mask afterwards.
    chosen = scores.topk(min(top_k, scores.size(-1)), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True)
    return _masked_dense(query, key, value, mask & ab.causal_mask(scores.size(-1)))


def _reads_ahead(query, key, value, scores, top_k):
    # Chooses among every key and never masks the future.
    chosen = scores.topk(min(top_k, scores.size(-1)), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True)
    return _masked_dense(query, key, value, mask)


def _later_on_ties(query, key, value, scores, top_k):
    num_tokens = scores.size(-1)
    visible = ab.causal_mask(num_tokens)
    positions = torch.arange(num_tokens) * 1e-6  # a tiny push toward the later key
    masked = (scores + positions).masked_fill(~visible, float("-inf"))
    order = masked.topk(min(top_k, num_tokens), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, True) & visible
    return _masked_dense(query, key, value, mask)


def _one_head_group(query, key, value, scores, top_k):
    # Repeats the key/value heads as a block (h -> h % H_kv) instead of consecutively.
    group = query.size(1) // key.size(1)
    return _causal_topk(query, key.repeat(1, group, 1, 1), value.repeat(1, group, 1, 1),
                        scores, top_k)


def _at_most_k(query, key, value, scores, top_k):
    return _causal_topk(query, key, value, scores, min(top_k, scores.size(-1) - 1))


def _dense_causal(query, key, value, scores, top_k):
    return _masked_dense(query, key, value, ab.causal_mask(scores.size(-1))[None])


def _no_min(query, key, value, scores, top_k):
    visible = ab.causal_mask(scores.size(-1))
    order = scores.masked_fill(~visible, float("-inf")).topk(top_k, dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, True) & visible
    return _masked_dense(query, key, value, mask)


def _by_logits(query, key, value, scores, top_k):
    # Chooses by the attention logits of the first head instead of the index scores.
    logits = (query[:, 0] @ key[:, 0].transpose(-2, -1)).contiguous()  # (B, T, T)
    return _causal_topk(query, key, value, logits, top_k)


def _no_renormalisation(query, key, value, scores, top_k):
    # The dense causal weights, zeroed outside the chosen keys and not renormalised.
    num_tokens = scores.size(-1)
    visible = ab.causal_mask(num_tokens)
    order = scores.masked_fill(~visible, float("-inf")).sort(
        dim=-1, descending=True, stable=True).indices[..., :min(top_k, num_tokens)]
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, True) & visible
    group = query.size(1) // key.size(1)
    logits = query @ key.repeat_interleave(group, 1).transpose(-2, -1) / math.sqrt(query.size(-1))
    weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1) * mask[:, None]
    return weights @ value.repeat_interleave(group, 1)


def _no_scale(query, key, value, scores, top_k):
    return _causal_topk(query * math.sqrt(query.size(-1)), key, value, scores, top_k)


def _one_more(query, key, value, scores, top_k):
    return _causal_topk(query, key, value, scores, top_k + 1)


# The review's wrong answers to 19.2 (and the ones above): the checker and the hidden tests
# reject each one.
BUG_HUNT_WRONG = [_places_to_the_future, _reads_ahead, _later_on_ties, _one_head_group,
                  _at_most_k, _dense_causal, _no_min, _by_logits, _no_renormalisation, _no_scale,
                  _one_more]


def test_causal_topk_right(capsys):
    assert_passes(check_causal_topk_attention, _causal_topk, capsys)
    assert_passes(check_causal_topk_attention, ab.topk_attention, capsys)
    for right in (_causal_topk, ab.topk_attention):
        assert passes_hidden_tests(NOTEBOOK, "ch19-ex2-check", causal_topk_attention=right)


@pytest.mark.parametrize("wrong", BUG_HUNT_WRONG, ids=lambda fn: fn.__name__)
def test_causal_topk_wrong_answers_fail_the_checker_and_the_hidden_tests(wrong, capsys):
    assert check_causal_topk_attention(wrong) is False
    assert capsys.readouterr().out.startswith("Not yet.")
    assert not passes_hidden_tests(NOTEBOOK, "ch19-ex2-check", causal_topk_attention=wrong)


def test_causal_topk_typical_mistakes(capsys):
    assert_fails(check_causal_topk_attention, _places_to_the_future, capsys,
                 "rise toward the future", "the future took its places")
    assert_fails(check_causal_topk_attention, _reads_ahead, capsys, "no output reads a future")
    assert_fails(check_causal_topk_attention, _later_on_ties, capsys, "ties", "earlier key wins")
    assert_fails(check_causal_topk_attention, _one_head_group, capsys, "grouped heads",
                 "consecutive query heads")
    assert_fails(check_causal_topk_attention, _at_most_k, capsys, "more than the 5 tokens",
                 "every visible key is read")
    assert_fails(check_causal_topk_attention, unwritten, capsys, "You have not written",
                 sections=())


# --- 19.3 largest k -------------------------------------------------------------------------


def test_largest_k_right(capsys):
    def right(budget, position, indexer, attention):
        left = budget - 2 * (position + 1) * indexer
        return 0 if left < 0 else int(min(position + 1, left // (2 * attention)))

    assert_passes(check_largest_k, right, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex3-check", largest_k=right)

    def by_float_and_floor(budget, position, indexer, attention):
        left = budget - 2 * (position + 1) * indexer
        return 0 if left < 0 else min(position + 1, math.floor(left / (2 * attention)))

    assert_passes(check_largest_k, by_float_and_floor, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex3-check", largest_k=by_float_and_floor)


def test_largest_k_typical_mistakes(capsys):
    def negative(budget, position, indexer, attention):
        return int(min(position + 1, (budget - 2 * (position + 1) * indexer) // (2 * attention)))

    def uncapped(budget, position, indexer, attention):
        return max(0, int((budget - 2 * (position + 1) * indexer) // (2 * attention)))

    def rounded(budget, position, indexer, attention):
        left = budget - 2 * (position + 1) * indexer
        return 0 if left < 0 else int(min(position + 1, round(left / (2 * attention))))

    def one_flop(budget, position, indexer, attention):
        left = budget - (position + 1) * indexer
        return 0 if left < 0 else int(min(position + 1, left // attention))

    def as_float(budget, position, indexer, attention):
        left = budget - 2 * (position + 1) * indexer
        return 0.0 if left < 0 else min(position + 1, left / (2 * attention))

    assert_fails(check_largest_k, negative, capsys, "no k fits: return 0")
    assert_fails(check_largest_k, uncapped, capsys, "never exceeds the position + 1")
    assert_fails(check_largest_k, rounded, capsys, "round down")
    assert_fails(check_largest_k, one_flop, capsys, "two FLOPs")
    assert_fails(check_largest_k, as_float, capsys, "is an int")
    for wrong in (negative, uncapped, rounded, one_flop, as_float):
        assert not passes_hidden_tests(NOTEBOOK, "ch19-ex3-check", largest_k=wrong)


def test_largest_k_uses_mqa_sizes_and_the_hint_keeps_the_formula_back(capsys):
    def mha_sizes(budget, position, indexer, attention):
        # The right formula, but with the decompressed (MHA-mode) attention cost.
        attention = 40960 if attention == 139264 else attention
        left = budget - 2 * (position + 1) * indexer
        return 0 if left < 0 else int(min(position + 1, left // (2 * attention)))

    out = assert_fails(check_largest_k, mha_sizes, capsys, "DeepSeek-V3.2's sizes")
    assert "(position + 1) * indexer_per_pair" not in out
    assert not passes_hidden_tests(NOTEBOOK, "ch19-ex3-check", largest_k=mha_sizes)


# --- 19.4 gated heads -----------------------------------------------------------------------


def test_gated_heads_right(capsys):
    def right(context_vec, x, projection):
        batch_size, num_heads, num_tokens, head_dim = context_vec.shape
        merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)
        return merged * torch.sigmoid(projection(x))

    assert_passes(check_gated_heads, right, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex4-check", gated_heads=right)


def test_gated_heads_typical_mistakes(capsys):
    def merged(context_vec):
        batch_size, _, num_tokens, _ = context_vec.shape
        return context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)

    def ungated(context_vec, x, projection):
        return merged(context_vec)

    def raw_gate(context_vec, x, projection):
        return merged(context_vec) * projection(x)

    def wrong_merge(context_vec, x, projection):
        batch_size, _, num_tokens, _ = context_vec.shape
        flat = context_vec.permute(0, 2, 3, 1).reshape(batch_size, num_tokens, -1)
        return flat * torch.sigmoid(projection(x))

    assert_fails(check_gated_heads, ungated, capsys, "the gate changes the output")
    assert_fails(check_gated_heads, raw_gate, capsys, "the gate is a sigmoid")
    assert_fails(check_gated_heads, wrong_merge, capsys, "transpose to (B, T, H, head_dim)")
    assert_fails(check_gated_heads, unwritten, capsys, "You have not written", sections=())


def _feature_major(context_vec, x, projection):
    # Gate feature h + H * i for feature i of head h, instead of h * head_dim + i.
    batch_size, num_heads, num_tokens, head_dim = context_vec.shape
    merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)
    gate = projection(x).view(batch_size, num_tokens, head_dim, num_heads).transpose(-1, -2)
    return merged * torch.sigmoid(gate.reshape(batch_size, num_tokens, -1))


def _one_gate_per_head(context_vec, x, projection):
    batch_size, num_heads, num_tokens, head_dim = context_vec.shape
    merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, num_heads, head_dim)
    gate = torch.sigmoid(projection(x).view(batch_size, num_tokens, num_heads, head_dim)[..., :1])
    return (merged * gate).reshape(batch_size, num_tokens, -1)


def _no_transpose(context_vec, x, projection):
    batch_size, _, num_tokens, _ = context_vec.shape
    return context_vec.reshape(batch_size, num_tokens, -1) * torch.sigmoid(projection(x))


def _mean_token(context_vec, x, projection):
    batch_size, _, num_tokens, _ = context_vec.shape
    merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)
    return merged * torch.sigmoid(projection(x.mean(dim=1, keepdim=True)))


def _reversed_tokens(context_vec, x, projection):
    batch_size, _, num_tokens, _ = context_vec.shape
    merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)
    return merged * torch.sigmoid(projection(x.flip(1)))


def _no_sigmoid(context_vec, x, projection):
    batch_size, _, num_tokens, _ = context_vec.shape
    return context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1) * projection(x)


@pytest.mark.parametrize("wrong", [_feature_major, _one_gate_per_head, _no_transpose, _mean_token,
                                   _reversed_tokens, _no_sigmoid], ids=lambda fn: fn.__name__)
def test_gated_heads_wrong_answers_fail_the_checker_and_the_hidden_tests(wrong, capsys):
    assert check_gated_heads(wrong) is False
    assert capsys.readouterr().out.startswith("Not yet.")
    assert not passes_hidden_tests(NOTEBOOK, "ch19-ex4-check", gated_heads=wrong)


# --- 19.5 keys needed -----------------------------------------------------------------------


def _places(index_scores, needle, *, ties_to_earlier=True, count_needle=True):
    own = index_scores.gather(-1, needle[:, None])  # (B, 1)
    positions = torch.arange(index_scores.size(-1))
    tied = (index_scores == own) & (positions < needle[:, None] if ties_to_earlier
                                     else positions > needle[:, None])
    return ((index_scores > own) | tied).sum(dim=-1) + int(count_needle)  # (B,)


def _keys_by_sorting(index_scores, needle, fraction):
    places = _places(index_scores, needle).sort().values
    shares = torch.arange(1, places.numel() + 1, dtype=torch.float64) / places.numel()
    return int(places[shares >= fraction][0])


def _keys_by_topk_mask(index_scores, needle, fraction):
    # Try k = 1, 2, ... with the package's own choice.
    for k in range(1, index_scores.size(-1) + 1):
        chosen = ab.topk_mask(index_scores[:, None], k, is_causal=False)[:, 0]  # (B, T)
        if float(chosen.gather(-1, needle[:, None]).double().mean()) >= fraction:
            return k
    raise AssertionError("unreachable: k = T keeps every needle")


def _keys_from(places, fraction, rows):
    return int(places.sort().values[rows(fraction, places.numel()) - 1])


def _ties_to_later(index_scores, needle, fraction):
    return _keys_from(_places(index_scores, needle, ties_to_earlier=False), fraction,
                      lambda f, n: math.ceil(f * n))


def _zero_based(index_scores, needle, fraction):
    return _keys_from(_places(index_scores, needle, count_needle=False), fraction,
                      lambda f, n: math.ceil(f * n))


def _rows_rounded_down(index_scores, needle, fraction):
    return _keys_from(_places(index_scores, needle), fraction, lambda f, n: max(1, int(f * n)))


def _more_than_the_fraction(index_scores, needle, fraction):
    places = _places(index_scores, needle)
    return next(k for k in range(1, index_scores.size(-1) + 2)
                if (places <= k).double().mean() > fraction or k > index_scores.size(-1))


def _quantile(index_scores, needle, fraction):
    places = _places(index_scores, needle).double()
    return math.ceil(float(torch.quantile(places, fraction)))


def test_keys_needed_right(capsys):
    for right in (_keys_by_sorting, _keys_by_topk_mask):
        assert_passes(check_keys_needed, right, capsys)
        assert passes_hidden_tests(NOTEBOOK, "ch19-ex5-check", keys_needed=right)


def test_keys_needed_typical_mistakes(capsys):
    assert_fails(check_keys_needed, _ties_to_later, capsys, "ties go to the earlier key")
    assert_fails(check_keys_needed, _zero_based, capsys, "count the needle itself")
    assert_fails(check_keys_needed, _rows_rounded_down, capsys, "round the number of questions up")
    assert_fails(check_keys_needed, _more_than_the_fraction, capsys, "'at least'")
    assert_fails(check_keys_needed, _quantile, capsys, "no interpolation")
    assert_fails(check_keys_needed, lambda s, n, f: 2.0, capsys, "is an int")
    assert_fails(check_keys_needed, unwritten, capsys, "You have not written", sections=())
    for wrong in (_ties_to_later, _zero_based, _rows_rounded_down, _more_than_the_fraction,
                  _quantile):
        assert not passes_hidden_tests(NOTEBOOK, "ch19-ex5-check", keys_needed=wrong)


# --- 19.6 reuse -----------------------------------------------------------------------------


def test_reuse_prediction(capsys):
    out = assert_passes(check_predicted_reuse, lambda: (128, 1, 128), capsys)
    assert "128 multiply-adds" in out
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex6-check", predicted_reuse=lambda: (128, 1, 128))
    assert passes_hidden_tests(NOTEBOOK, "ch19-ex6-check",
                               predicted_reuse=lambda: [128.0, 1.0, 128.0])


@pytest.mark.parametrize("wrong,phrase", [
    ((64, 1, 64), "count both products"),  # the scores only
    ((256, 2, 256), "the values are loaded too"),  # the keys' numbers only
    ((128, 256, 128), "serves one query"),  # gather reused as if by k queries
    ((128, 128, 128), "serves one query"),
    ((128, 1, 1), "exactly as dense attention"),
    ((128, 1, 0.03), "exactly as dense attention"),  # the share of the tiles kept, not reuse
])
def test_reuse_wrong_predictions_keep_the_answer_back(wrong, phrase, capsys):
    out = assert_fails(check_predicted_reuse, lambda: wrong, capsys, phrase)
    assert "kept back" in out and "128" not in out.split("expected:")[1].split("\n")[0]
    assert not passes_hidden_tests(NOTEBOOK, "ch19-ex6-check", predicted_reuse=lambda: wrong)


def test_reuse_prediction_shape(capsys):
    assert_fails(check_predicted_reuse, lambda: (128, 1), capsys, "three numbers")
    assert_fails(check_predicted_reuse, lambda: ("many", 1, 128), capsys, "a number")
    assert_fails(check_predicted_reuse, unwritten, capsys, "You have not written", sections=())
