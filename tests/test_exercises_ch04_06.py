"""The checkers of chapters 4-6 accept a right answer and reject typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from attention_book.exercises import ch04, ch05, ch06

# ---------------------------------------------------------------- chapter 4


def _scaled_scores(queries, keys):
    return queries @ keys.transpose(-2, -1) / math.sqrt(queries.size(-1))  # (..., T_q, T_k)


def test_scaled_scores_accepts_right_answer(capsys):
    assert ch04.check_scaled_scores(_scaled_scores)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda q, k: q @ k.transpose(-2, -1), "no scaling"),
        (lambda q, k: q @ k.transpose(-2, -1) / q.size(-1), "instead of sqrt(d_k)"),
        (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.numel()), "number of elements"),
        (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.size(1) * q.size(-1)), "d_model"),
        (lambda q, k: q @ k.transpose(-2, -1) / math.sqrt(q.size(-2)), "sqrt(T)"),
        (lambda q, k: q @ k / math.sqrt(q.size(-1)), "(2, 4, 5, 8)"),
        (lambda q, k: (q @ k.transpose(-2, -1)).sum(1) / math.sqrt(q.size(-1)), "shape"),
    ],
)
def test_scaled_scores_rejects_wrong_divisors(wrong, named_in_feedback, capsys):
    assert not ch04.check_scaled_scores(wrong)
    assert named_in_feedback in capsys.readouterr().out


def test_softmax_entropy_accepts_right_answer(capsys):
    assert ch04.check_softmax_entropy(lambda w: -torch.special.xlogy(w, w).sum(dim=-1))
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda w: -(w * torch.log(w)).sum(dim=-1), "not NaN"),
        (lambda w: (torch.special.xlogy(w, w)).sum(dim=-1), "uniform"),
        (lambda w: -(torch.special.xlogy(w, w) / math.log(2)).sum(dim=-1), "uniform"),
        (lambda w: -torch.special.xlogy(w, w).sum(), "shape"),
    ],
)
def test_softmax_entropy_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch04.check_softmax_entropy(wrong)
    assert named_in_feedback in capsys.readouterr().out


def test_softmax_jacobian_accepts_right_answer(capsys):
    assert ch04.check_softmax_jacobian(lambda w: torch.diag(w) - torch.outer(w, w))
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda w: torch.diag(w), "off-diagonal"),
        (lambda w: torch.outer(w, w) - torch.diag(w), "sign"),
        (lambda w: torch.diag(w) - w * w, "values"),
        (lambda w: torch.diag(w) - w @ w, "values"),
        (lambda w: w.sum(), "shape"),
        (lambda w: torch.eye(w.numel()) - torch.outer(w, w), "values"),
    ],
)
def test_softmax_jacobian_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch04.check_softmax_jacobian(wrong)
    assert named_in_feedback in capsys.readouterr().out

# ---------------------------------------------------------------- chapter 5


def _ones(num_tokens):
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool)


def test_causal_mask_accepts_right_answer(capsys):
    assert ch05.check_causal_mask(lambda t: torch.tril(_ones(t)))
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda t: torch.triu(_ones(t), diagonal=1), "polarity is inverted"),
        (lambda t: torch.tril(_ones(t), diagonal=-1), "may not attend to itself"),
        (lambda t: torch.triu(_ones(t)), "sees the future"),
        (lambda t: torch.tril(torch.ones(t, t)), "boolean"),
        (lambda t: torch.tril(_ones(5)), "use the argument"),
        (lambda t: torch.tril(_ones(t))[0], "shape"),
    ],
)
def test_causal_mask_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_causal_mask(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _masked_softmax(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0)


def _renormalised(scores, mask):
    weights = torch.softmax(scores, dim=-1) * mask
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))


@pytest.mark.parametrize("right", [_masked_softmax, _renormalised])
def test_masked_softmax_accepts_right_answers(right, capsys):
    assert ch05.check_masked_softmax(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1), "not NaN"),
        (lambda s, m: torch.softmax(s * m, dim=-1), "set to 0, not -inf"),
        (lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), dim=-1), "polarity"),
        (lambda s, m: torch.softmax(s, dim=-1) * m, "not renormalised"),
        (lambda s, m: _masked_softmax(s, m).sum(dim=-1), "shape"),
        (lambda s, m: _masked_softmax(s.transpose(-2, -1), m), "values"),
    ],
)
def test_masked_softmax_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_masked_softmax(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _key_is_real(lengths, max_len):
    return torch.arange(max_len) < torch.as_tensor(lengths).unsqueeze(1)  # (B, T)


def _batch_mask(lengths, max_len):
    return torch.tril(_ones(max_len)) & _key_is_real(lengths, max_len)[:, None, None, :]


def test_batch_mask_accepts_right_answer(capsys):
    assert ch05.check_batch_mask(_batch_mask)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda lengths, t: _batch_mask(lengths, t)[:, 0], "(B, 1, T, T)"),
        (lambda lengths, t: torch.tril(_ones(t)).expand(len(lengths), 1, t, t), "only the causal"),
        (lambda lengths, t: _key_is_real(lengths, t)[:, None, None, :].expand(-1, 1, t, t),
         "only the padding"),
        (lambda lengths, t: ~_batch_mask(lengths, t), "polarity"),
        (lambda lengths, t: _batch_mask(lengths, t) & _key_is_real(lengths, t)[:, None, :, None],
         "padding *queries*"),
        (lambda lengths, t: _batch_mask(lengths, t).float(), "boolean"),
        (lambda lengths, t: torch.tril(_ones(t)) & _key_is_real(lengths, t)[:, None, :], "shape"),
    ],
)
def test_batch_mask_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_batch_mask(wrong)
    assert named_in_feedback in capsys.readouterr().out

# ---------------------------------------------------------------- chapter 6


def _inverted_dropout(weights, p):
    keep = torch.rand(weights.shape) >= p
    return weights * keep / (1 - p)


@pytest.mark.parametrize(
    "right",
    [
        _inverted_dropout,
        lambda w, p: torch.nn.functional.dropout(w, p, training=True),
        lambda w, p: w * torch.bernoulli(torch.full_like(w, 1 - p)) / (1 - p),
    ],
)
def test_inverted_dropout_accepts_right_answers(right, capsys):
    assert ch06.check_inverted_dropout(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda w, p: w * (torch.rand(w.shape) >= p) / p if p else w, "1 / p"),
        (lambda w, p: w * (torch.rand(w.shape) >= p), "not scaled"),
        (lambda w, p: w * (torch.rand(w.shape) < p) / (1 - p), "probability 1 - p"),
        (lambda w, p: w * (torch.rand(w.shape) >= p / 2) / (1 - p), "zeroed with probability"),
        (lambda w, p: w / (1 - p), "zeroed with probability"),
        (lambda w, p: _inverted_dropout(w, p).sum(dim=-1), "shape"),
    ],
)
def test_inverted_dropout_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_inverted_dropout(wrong)
    assert named_in_feedback in capsys.readouterr().out


def test_mean_tolerance_accepts_right_answer(capsys):
    assert ch06.check_mean_tolerance(lambda w, p, n, z: z * w * math.sqrt(p / ((1 - p) * n)))
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda w, p, n, z: z * w * math.sqrt(p * (1 - p) / n), "1 / (1 - p) scaling"),
        (lambda w, p, n, z: z * w * p / ((1 - p) * n), "1 / sqrt(num_draws)"),
        (lambda w, p, n, z: z * w * math.sqrt(p / (1 - p)) / n, "1 / sqrt(num_draws)"),
        (lambda w, p, n, z: w * math.sqrt(p / ((1 - p) * n)), "the tolerance for"),
        (lambda w, p, n, z: None, "a number"),  # forgot to return
    ],
)
def test_mean_tolerance_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_mean_tolerance(wrong)
    assert named_in_feedback in capsys.readouterr().out


def test_weights_with_dropout_accepts_right_answer(capsys):
    def right(scores, p, training):
        weights = torch.softmax(scores, dim=-1)
        return torch.nn.functional.dropout(weights, p, training=training)

    assert ch06.check_weights_with_dropout(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        # F.dropout's training argument defaults to True: drops in evaluation too
        (lambda s, p, training: torch.nn.functional.dropout(torch.softmax(s, -1), p),
         "evaluation"),
        # dropout on the scores, before the softmax
        (lambda s, p, training: torch.softmax(
            torch.nn.functional.dropout(s, p, training=training), -1), "after the softmax"),
        # dropout but without the 1 / (1 - p) scaling
        (lambda s, p, training: torch.softmax(s, -1) * (torch.rand(s.shape) >= p)
         if training else torch.softmax(s, -1), "not scaled"),
        (lambda s, p, training: torch.softmax(s, 0), "evaluation"),
    ],
)
def test_weights_with_dropout_rejects_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_weights_with_dropout(wrong)
    assert named_in_feedback in capsys.readouterr().out
