"""Chapter 19's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import math

import torch
from checker_asserts import assert_fails, assert_passes, unwritten

import attention_book as ab
from attention_book.exercises import (
    check_causal_topk_attention,
    check_gated_heads,
    check_indexer_scores,
    check_largest_k,
    check_predicted_choice,
)

# --- 19.1 which keys ------------------------------------------------------------------------


def test_choice_prediction(capsys):
    assert_passes(check_predicted_choice, lambda: [(0, -1), (0, 1), (1, 2), (0, 1)], capsys)
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


def test_causal_topk_right(capsys):
    assert_passes(check_causal_topk_attention, _causal_topk, capsys)
    assert_passes(check_causal_topk_attention, ab.topk_attention, capsys)


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


# --- 19.3 indexer scores --------------------------------------------------------------------


def test_indexer_scores_right(capsys):
    def right(index_queries, index_keys, head_weights):
        per_head = torch.relu(torch.einsum("bthd,bsd->bths", index_queries, index_keys))
        return torch.einsum("bth,bths->bts", head_weights, per_head)

    assert_passes(check_indexer_scores, right, capsys)


def test_indexer_scores_typical_mistakes(capsys):
    def relu_after_weights(q, k, w):
        return torch.relu(torch.einsum("bth,bthd,bsd->bts", w, q, k))

    def no_relu(q, k, w):
        return torch.einsum("bth,bthd,bsd->bts", w, q, k)

    def batches_mixed(q, k, w):
        per_head = torch.relu(torch.einsum("bthd,csd->bths", q, k))
        return torch.einsum("bth,bths->bts", w, per_head)

    assert_fails(check_indexer_scores, relu_after_weights, capsys, "not the sum")
    assert_fails(check_indexer_scores, no_relu, capsys, "the ReLU comes before the weight")
    assert_fails(check_indexer_scores, batches_mixed, capsys, "keep the batch dimension apart")
    assert_fails(check_indexer_scores, lambda q, k, w: torch.zeros(1, 3), capsys, "(1, 1, 3)")


# --- 19.4 largest k -------------------------------------------------------------------------


def test_largest_k_right(capsys):
    def right(budget, position, indexer, attention):
        left = budget - 2 * (position + 1) * indexer
        return 0 if left < 0 else int(min(position + 1, left // (2 * attention)))

    assert_passes(check_largest_k, right, capsys)


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


# --- 19.5 gated heads -----------------------------------------------------------------------


def test_gated_heads_right(capsys):
    def right(context_vec, x, projection):
        batch_size, num_heads, num_tokens, head_dim = context_vec.shape
        merged = context_vec.transpose(1, 2).reshape(batch_size, num_tokens, -1)
        return merged * torch.sigmoid(projection(x))

    assert_passes(check_gated_heads, right, capsys)


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
