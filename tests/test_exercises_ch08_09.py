"""Chapters 8 and 9's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import math

import torch

from attention_book.exercises import (
    check_attention_to_cue,
    check_gather_word,
    check_mean_pool,
    check_previous_token_score,
    check_top_head,
    check_weights_from_projections,
)


def test_checkers_are_reexported():
    import attention_book.exercises as exercises
    from attention_book.exercises import ch08, ch09

    for module in (ch08, ch09):
        assert len(module.__all__) >= 3
        for name in module.__all__:
            assert getattr(exercises, name) is getattr(module, name)


def _fails(checker, answer, *fragments, capsys):
    assert checker(answer) is False
    out = capsys.readouterr().out
    for fragment in fragments:
        assert fragment in out
    assert "hint:" in out


# --- chapter 8 --------------------------------------------------------------------------------


def top_head_right(attentions, query_index, key_index):
    stacked = torch.stack(list(attentions))[:, 0]  # (layers, heads, T, T)
    link = stacked[:, :, query_index, key_index]
    return divmod(link.argmax().item(), link.shape[1])


def top_head_swapped(attentions, query_index, key_index):
    layer, head = top_head_right(attentions, query_index, key_index)
    return head, layer


def top_head_wrong_direction(attentions, query_index, key_index):
    return top_head_right(attentions, key_index, query_index)


def test_top_head(capsys):
    assert check_top_head(top_head_right)
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_top_head, top_head_swapped, "(layer, head), in that order", capsys=capsys)
    _fails(check_top_head, top_head_wrong_direction, "largest weight", capsys=capsys)
    _fails(check_top_head, lambda a, q, k: 3, "a pair (layer, head)", capsys=capsys)


def test_previous_token_score(capsys):
    assert check_previous_token_score(
        lambda w: torch.diagonal(w, offset=-1, dim1=-2, dim2=-1).mean(-1))
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_previous_token_score,
           lambda w: torch.diagonal(w, offset=1, dim1=-2, dim2=-1).mean(-1),
           "*previous* token", capsys=capsys)
    _fails(check_previous_token_score,
           lambda w: torch.diagonal(w, offset=-1, dim1=-2, dim2=-1).sum(-1),
           "match the reference", capsys=capsys)
    _fails(check_previous_token_score,
           lambda w: torch.diagonal(w, offset=-1, dim1=-2, dim2=-1),
           "the shape of", capsys=capsys)


def _weights_from_projections(scale_by):
    def answer(queries, keys, num_heads):
        batch, num_tokens, d_out = queries.shape
        head_dim = d_out // num_heads
        q = queries.view(batch, num_tokens, num_heads, head_dim).transpose(1, 2)
        k = keys.view(batch, num_tokens, num_heads, head_dim).transpose(1, 2)
        scale = {"head_dim": math.sqrt(head_dim), "d_out": math.sqrt(d_out), "none": 1.0}
        return torch.softmax(q @ k.transpose(-2, -1) / scale[scale_by], dim=-1)

    return answer


def _no_transpose(queries, keys, num_heads):
    batch, num_tokens, d_out = queries.shape
    head_dim = d_out // num_heads
    q = queries.view(batch, num_heads, num_tokens, head_dim)
    k = keys.view(batch, num_heads, num_tokens, head_dim)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim), dim=-1)


def test_weights_from_projections(capsys):
    assert check_weights_from_projections(_weights_from_projections("head_dim"))
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_weights_from_projections, _weights_from_projections("d_out"),
           "1/sqrt(head_dim)", capsys=capsys)
    _fails(check_weights_from_projections, _weights_from_projections("none"),
           "scores are scaled", capsys=capsys)
    _fails(check_weights_from_projections, _no_transpose, "match the reference", capsys=capsys)


# --- chapter 9 --------------------------------------------------------------------------------


def _mean_pool_right(x, lengths):
    real = (torch.arange(x.shape[1]) < lengths[:, None]).unsqueeze(-1)  # (B, T, 1)
    return (x * real).sum(1) / lengths[:, None]


def test_mean_pool(capsys):
    assert check_mean_pool(_mean_pool_right)
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_mean_pool, lambda x, lengths: x.mean(dim=1), "padding is left out",
           capsys=capsys)
    _fails(check_mean_pool, lambda x, lengths: _mean_pool_right(x, lengths)[:, None],
           "the shape of", capsys=capsys)


def test_gather_word(capsys):
    assert check_gather_word(lambda c, i: c[torch.arange(c.shape[0]), i])
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_gather_word, lambda c, i: c[:, i], "one vector per sentence", capsys=capsys)
    _fails(check_gather_word, lambda c, i: c[:, 0], "match the reference", capsys=capsys)


def test_attention_to_cue(capsys):
    def right(weights, word_index, cue_index):
        rows = torch.arange(weights.shape[0])
        return weights[rows, :, word_index][rows, :, cue_index]

    def reversed_direction(weights, word_index, cue_index):
        return right(weights, cue_index, word_index)

    assert check_attention_to_cue(right)
    assert capsys.readouterr().out.startswith("Correct:")
    _fails(check_attention_to_cue, reversed_direction, "*from* the word *to* the cue",
           capsys=capsys)
    _fails(check_attention_to_cue, lambda w, i, c: w[:, :, 0, 0], "match the reference", capsys=capsys)
    _fails(check_attention_to_cue, lambda w, i, c: w[:, 0, 0, 0], "the shape of", capsys=capsys)
