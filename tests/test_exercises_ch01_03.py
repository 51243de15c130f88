"""The checkers of chapters 1-3 accept a right answer and reject typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_book.exercises import ch01, ch02, ch03

# ---------------------------------------------------------------- chapter 1


def _average_so_far(x):
    counts = torch.arange(1, x.shape[-2] + 1, dtype=x.dtype)  # (T,)
    return torch.cumsum(x, dim=-2) / counts.unsqueeze(-1)  # (..., T, d)


def _window_average(x, window):
    num_tokens = x.shape[0]
    query_pos = torch.arange(num_tokens).unsqueeze(1)  # (T, 1)
    key_pos = torch.arange(num_tokens).unsqueeze(0)  # (1, T)
    visible = (key_pos <= query_pos) & (key_pos > query_pos - window)  # (T, T)
    scores = torch.zeros(num_tokens, num_tokens).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ x  # (T, d)


def _offset_matrix(offset, d_model, sign=1.0):
    matrix = torch.zeros(d_model, d_model)
    for pair in range(d_model // 2):
        angle = offset * 10000.0 ** (-2 * pair / d_model)
        cos, sin = math.cos(angle), sign * math.sin(angle)
        matrix[2 * pair : 2 * pair + 2, 2 * pair : 2 * pair + 2] = torch.tensor(
            [[cos, sin], [-sin, cos]]
        )
    return matrix


def test_average_so_far_accepts_right_answer(capsys):
    assert ch01.check_average_so_far(_average_so_far)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        # the mean over the whole sequence: looks into the future
        lambda x: x.mean(dim=-2, keepdim=True).expand_as(x),
        # divides every running sum by T instead of t + 1
        lambda x: torch.cumsum(x, dim=-2) / x.shape[-2],
        # only right for 2-D input: cumsum over dim 0
        lambda x: torch.cumsum(x, dim=0)
        / torch.arange(1, x.shape[0] + 1, dtype=x.dtype).reshape(-1, *[1] * (x.dim() - 1)),
    ],
)
def test_average_so_far_rejects_wrong_answers(wrong, capsys):
    assert not ch01.check_average_so_far(wrong)
    assert "Not yet" in capsys.readouterr().out


def test_window_average_accepts_right_answer(capsys):
    assert ch01.check_window_average(_window_average)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        # ignores the window: the average so far
        lambda x, window: _average_so_far(x),
        # a window one token too long
        lambda x, window: _window_average(x, window + 1),
        # a centred window that looks at future tokens
        lambda x, window: _window_average(x.flip(0), window).flip(0),
    ],
)
def test_window_average_rejects_wrong_answers(wrong):
    assert not ch01.check_window_average(wrong)


def test_offset_matrix_accepts_right_answer(capsys):
    assert ch01.check_offset_matrix(_offset_matrix)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        lambda offset, d_model: _offset_matrix(offset, d_model, sign=-1.0),  # rotates backwards
        lambda offset, d_model: _offset_matrix(offset, d_model).T[:, :-1],  # wrong shape
        lambda offset, d_model: torch.eye(d_model),  # ignores the offset
    ],
)
def test_offset_matrix_rejects_wrong_answers(wrong):
    assert not ch01.check_offset_matrix(wrong)


def test_checker_turns_an_exception_into_feedback(capsys):
    def broken(x):
        raise RuntimeError("shape mismatch")

    assert not ch01.check_average_so_far(broken)
    assert "RuntimeError: shape mismatch" in capsys.readouterr().out


# ---------------------------------------------------------------- chapter 2


def _stable_softmax(x, dim=-1):
    exp = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return exp / exp.sum(dim=dim, keepdim=True)


def _naive_softmax(x, dim=-1):
    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)


def _attend(queries, memory):
    attn_weights = torch.softmax(queries @ memory.T, dim=-1)  # (T_q, T_k)
    return attn_weights @ memory, attn_weights


def _cosine_attention_weights(x):
    unit = x / x.norm(dim=-1, keepdim=True)  # (T, d)
    return torch.softmax(unit @ unit.T, dim=-1)  # (T, T)


def test_stable_softmax_accepts_right_answer(capsys):
    assert ch02.check_stable_softmax(_stable_softmax)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        _naive_softmax,  # overflows to nan on large scores
        # subtracts the maximum of the whole tensor: underflows to 0/0 on the second row
        lambda x, dim=-1: _naive_softmax(x - x.max(), dim=dim),
        lambda x, dim=-1: _stable_softmax(x, dim=-1),  # ignores dim
        lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum(),  # normalises over everything
    ],
)
def test_stable_softmax_rejects_wrong_answers(wrong, capsys):
    assert not ch02.check_stable_softmax(wrong)
    assert "hint:" in capsys.readouterr().out


def test_attend_accepts_right_answer(capsys):
    assert ch02.check_attend(_attend)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        lambda q, m: _attend(q, m)[0],  # returns only the context vectors
        lambda q, m: (torch.softmax(q @ m.T, dim=0) @ m, torch.softmax(q @ m.T, dim=0)),
        lambda q, m: (_attend(q, m)[0], q @ m.T),  # scores instead of weights
        lambda q, m: _attend(q / q.shape[-1] ** 0.5, m),  # scaled scores
        lambda q, m: (_attend(q, m)[1] @ q[:, :1].expand(-1, m.shape[0]).T, _attend(q, m)[1]),
    ],
)
def test_attend_rejects_wrong_answers(wrong):
    assert not ch02.check_attend(wrong)


def test_cosine_attention_accepts_right_answer(capsys):
    assert ch02.check_cosine_attention_weights(_cosine_attention_weights)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        lambda x: torch.softmax(x @ x.T, dim=-1),  # plain dot products
        lambda x: torch.softmax(x @ x.T / x.norm() ** 2, dim=-1),  # one global norm
        lambda x: torch.softmax((x / x.norm(dim=0, keepdim=True)) @ x.T, dim=-1),  # wrong dim
    ],
)
def test_cosine_attention_rejects_wrong_answers(wrong):
    assert not ch02.check_cosine_attention_weights(wrong)


# ---------------------------------------------------------------- chapter 3


def _linear_from_parameter(W, transpose=True, bias=False):
    d_in, d_out = W.shape
    layer = nn.Linear(d_in, d_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(W.T if transpose else W)
    return layer


def _attention_scores(x, W_query, W_key):
    return (x @ W_query) @ (x @ W_key).transpose(-2, -1)  # (..., T, T)


def _split_merged(merged, d_out):
    U, S, Vh = torch.linalg.svd(merged)
    return U[:, :d_out] * S[:d_out], Vh[:d_out].T


def test_linear_from_parameter_accepts_right_answer(capsys):
    assert ch03.check_linear_from_parameter(_linear_from_parameter)
    assert capsys.readouterr().out.startswith("Correct:")


def _untransposed_square_only(W):
    # Passes the shape check on non-square W by reshaping, but never transposes.
    d_in, d_out = W.shape
    layer = nn.Linear(d_in, d_out, bias=False)
    with torch.no_grad():
        layer.weight.copy_(W.T if d_in != d_out else W)
    return layer


@pytest.mark.parametrize(
    "wrong",
    [
        lambda W: W,  # returns the tensor, not a layer
        lambda W: _linear_from_parameter(W, bias=True),  # a (random) bias
        lambda W: nn.Linear(*W.shape, bias=False),  # forgets to copy W
        _untransposed_square_only,  # the missing transpose on a square matrix
    ],
)
def test_linear_from_parameter_rejects_wrong_answers(wrong):
    assert not ch03.check_linear_from_parameter(wrong)


def test_linear_from_parameter_reports_wrong_weight_shape(capsys):
    assert not ch03.check_linear_from_parameter(
            lambda W: _linear_from_parameter(W.T, transpose=True)  # a (d_in, d_out) weight
        )
    assert "(d_out, d_in)" in capsys.readouterr().out


def test_attention_scores_accepts_right_answer(capsys):
    assert ch03.check_attention_scores(_attention_scores)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        lambda x, Wq, Wk: (x @ Wq) @ (x @ Wk).transpose(0, 1),  # only right in 2-D
        lambda x, Wq, Wk: _attention_scores(x, Wq, Wk) / Wq.shape[-1] ** 0.5,  # scaled
        lambda x, Wq, Wk: _attention_scores(x, Wk, Wq),  # queries and keys swapped
        lambda x, Wq, Wk: x @ x.transpose(-2, -1),  # chapter 2's scores
    ],
)
def test_attention_scores_rejects_wrong_answers(wrong):
    assert not ch03.check_attention_scores(wrong)


def test_scaled_scores_get_a_specific_hint(capsys):
    assert not ch03.check_attention_scores(
            lambda x, Wq, Wk: _attention_scores(x, Wq, Wk) / Wq.shape[-1] ** 0.5
        )
    assert "leave out the scaling" in capsys.readouterr().out


def test_split_merged_accepts_right_answer(capsys):
    assert ch03.check_split_merged(_split_merged)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    "wrong",
    [
        lambda M, d_out: (M, torch.eye(M.shape[0])),  # right product, wrong shapes
        lambda M, d_out: (_split_merged(M, d_out)[0], _split_merged(M, d_out)[0]),  # tied
        lambda M, d_out: (torch.linalg.svd(M)[0][:, :d_out],
                          torch.linalg.svd(M)[2][:d_out].T),  # forgets the singular values
        lambda M, d_out: _split_merged(M, d_out)[0],  # returns one matrix
    ],
)
def test_split_merged_rejects_wrong_answers(wrong):
    assert not ch03.check_split_merged(wrong)
