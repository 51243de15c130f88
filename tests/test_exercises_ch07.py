"""Chapter 7's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import pytest
import torch

from attention_book import MultiHeadAttention
from attention_book.exercises import (
    check_expand_kv,
    check_merge_heads,
    check_mha_param_count,
    check_split_heads,
)


def test_checkers_are_reexported():
    import attention_book.exercises as exercises
    from attention_book.exercises import ch07

    for name in ch07.__all__:
        assert getattr(exercises, name) is getattr(ch07, name)


# --- split_heads -----------------------------------------------------------------------------


def split_heads_right(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_tokens, num_heads, d_out // num_heads).transpose(1, 2)


def split_heads_no_transpose(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_heads, num_tokens, d_out // num_heads)


def split_heads_wrong_shape(x, num_heads):
    batch, num_tokens, d_out = x.shape
    return x.view(batch, num_tokens, num_heads, d_out // num_heads)


def test_split_heads_accepts_right_answer(capsys):
    assert check_split_heads(split_heads_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_split_heads_explains_view_without_transpose(capsys):
    assert not check_split_heads(split_heads_no_transpose)
    out = capsys.readouterr().out
    assert "Not yet. The check that failed: each head holds the features of the right token" in out
    assert "transpose(1, 2)" in out


def test_split_heads_reports_wrong_shape(capsys):
    assert not check_split_heads(split_heads_wrong_shape)
    out = capsys.readouterr().out
    assert "the shape of" in out
    assert "(2, 3, 5, 2)" in out and "(2, 5, 3, 2)" in out


def test_split_heads_turns_an_error_into_feedback(capsys):
    def crashes(x, num_heads):
        return x.view(-1, num_heads, 7)

    assert not check_split_heads(crashes)
    assert "RuntimeError" in capsys.readouterr().out


def test_split_heads_not_written_yet_is_feedback(capsys):
    def unanswered(x, num_heads):
        raise NotImplementedError()

    assert check_split_heads(unanswered) is False
    assert "You have not written `unanswered` yet" in capsys.readouterr().out


# --- merge_heads -----------------------------------------------------------------------------


def merge_heads_right(context):
    batch, num_heads, num_tokens, head_dim = context.shape
    return context.transpose(1, 2).reshape(batch, num_tokens, num_heads * head_dim)


def merge_heads_contiguous_view(context):
    batch, num_heads, num_tokens, head_dim = context.shape
    return context.transpose(1, 2).contiguous().view(batch, num_tokens, num_heads * head_dim)


def merge_heads_no_transpose(context):
    batch, num_heads, num_tokens, head_dim = context.shape
    return context.view(batch, num_tokens, num_heads * head_dim)


def merge_heads_wrong_order(context):
    # Concatenates head_dim-major instead of head-major.
    batch, num_heads, num_tokens, head_dim = context.shape
    return context.permute(0, 2, 3, 1).reshape(batch, num_tokens, num_heads * head_dim)


@pytest.mark.parametrize("answer", [merge_heads_right, merge_heads_contiguous_view])
def test_merge_heads_accepts_right_answers(answer, capsys):
    assert check_merge_heads(answer)
    assert capsys.readouterr().out.startswith("Correct:")


def test_merge_heads_explains_view_without_transpose(capsys):
    assert not check_merge_heads(merge_heads_no_transpose)
    out = capsys.readouterr().out
    assert "Not yet. The check that failed: each output row is one token's heads side by side" in out
    assert "transpose(1, 2)" in out


def test_merge_heads_rejects_wrong_feature_order(capsys):
    assert not check_merge_heads(merge_heads_wrong_order)
    assert "match the reference" in capsys.readouterr().out


# --- parameter count -------------------------------------------------------------------------


def count_right(d_in, d_out, num_heads, qkv_bias):
    return 3 * (d_in * d_out + (d_out if qkv_bias else 0)) + d_out * d_out + d_out


def count_by_building(d_in, d_out, num_heads, qkv_bias):
    layer = MultiHeadAttention(d_in, d_out, num_heads, qkv_bias=qkv_bias)
    return sum(p.numel() for p in layer.parameters())


def count_without_out_proj(d_in, d_out, num_heads, qkv_bias):
    return 3 * (d_in * d_out + (d_out if qkv_bias else 0))


def count_out_proj_without_bias(d_in, d_out, num_heads, qkv_bias):
    return count_right(d_in, d_out, num_heads, qkv_bias) - d_out


def count_per_head_projections(d_in, d_out, num_heads, qkv_bias):
    return num_heads * count_right(d_in, d_out, num_heads, qkv_bias)


def count_as_float(d_in, d_out, num_heads, qkv_bias):
    return float(count_right(d_in, d_out, num_heads, qkv_bias))


@pytest.mark.parametrize("answer", [count_right, count_by_building])
def test_param_count_accepts_right_answers(answer, capsys):
    assert check_mha_param_count(answer)
    out = capsys.readouterr().out
    assert out.startswith("Correct:")
    assert "2,362,368" in out


def test_gpt2_numbers_match_the_package():
    assert count_by_building(768, 768, 12, True) == 2_362_368
    assert count_by_building(768, 768, 12, False) == 2_360_064


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        (count_without_out_proj, "you left out out_proj"),
        (count_out_proj_without_bias, "out_proj always has a bias"),
        (count_per_head_projections, "does not grow with num_heads"),
        (count_as_float, "return an int"),
    ],
)
def test_param_count_explains_typical_mistakes(answer, hint, capsys):
    assert not check_mha_param_count(answer)
    assert hint in capsys.readouterr().out


def test_param_count_names_expected_and_actual(capsys):
    assert not check_mha_param_count(lambda d_in, d_out, num_heads, qkv_bias: 1)
    out = capsys.readouterr().out
    assert "expected: 2,362,368" in out
    assert "actual:   1" in out


# --- expand_kv -------------------------------------------------------------------------------


def expand_kv_right(kv, num_heads):
    return kv.repeat_interleave(num_heads // kv.size(1), dim=1)


def expand_kv_by_index(kv, num_heads):
    group_size = num_heads // kv.size(1)
    return kv[:, torch.arange(num_heads) // group_size]


def expand_kv_tiled(kv, num_heads):
    return kv.repeat(1, num_heads // kv.size(1), 1, 1)


def expand_kv_unchanged(kv, num_heads):
    return kv


@pytest.mark.parametrize("answer", [expand_kv_right, expand_kv_by_index])
def test_expand_kv_accepts_right_answers(answer, capsys):
    assert check_expand_kv(answer)
    assert capsys.readouterr().out.startswith("Correct:")


def test_expand_kv_explains_tiling(capsys):
    assert not check_expand_kv(expand_kv_tiled)
    out = capsys.readouterr().out
    assert "Not yet. The check that failed: consecutive query heads share a key/value head" in out
    assert "[0, 0, 0, 1, 1, 1]" in out and "[0, 1, 0, 1, 0, 1]" in out
    assert "repeat_interleave" in out


def test_expand_kv_reports_missing_expansion(capsys):
    assert not check_expand_kv(expand_kv_unchanged)
    out = capsys.readouterr().out
    assert "the shape of" in out
    assert "(2, 6, 3, 2)" in out
