"""The checkers of chapters 1-3 accept a right answer and name each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from hidden_tests import passes_hidden_tests
from torch import nn

import attention_book as ab
from attention_book.exercises import ch01, ch02, ch03


def _feedback(checker, answer, capsys) -> tuple[bool, str]:
    verdict = checker(answer)
    return verdict, capsys.readouterr().out


def _not_written(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- chapter 1


def _average_so_far(x):
    counts = torch.arange(1, x.shape[-2] + 1, dtype=x.dtype)  # (T,)
    return torch.cumsum(x, dim=-2) / counts.unsqueeze(-1)  # (..., T, d)


def _average_so_far_tril(x):
    num_tokens = x.shape[-2]
    weights = torch.tril(torch.ones(num_tokens, num_tokens))  # (T, T)
    return weights / weights.sum(dim=-1, keepdim=True) @ x


def _average_so_far_loop(x):
    out = torch.zeros_like(x)
    for t in range(x.shape[-2]):
        out[..., t, :] = x[..., : t + 1, :].mean(dim=-2)
    return out


def _window_average(x, window):
    num_tokens = x.shape[0]
    query_pos = torch.arange(num_tokens).unsqueeze(1)  # (T, 1)
    key_pos = torch.arange(num_tokens).unsqueeze(0)  # (1, T)
    visible = (key_pos <= query_pos) & (key_pos > query_pos - window)  # (T, T)
    scores = torch.zeros(num_tokens, num_tokens).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ x  # (T, d)


def _window_divided_by_window(x, window):
    return torch.stack([x[max(0, t - window + 1): t + 1].sum(dim=0) / window
                        for t in range(x.shape[0])])


def _offset_matrix(offset, d_model, sign=1.0, pair_step=2):
    matrix = torch.zeros(d_model, d_model)
    for pair in range(d_model // 2):
        angle = offset * 10000.0 ** (-pair_step * pair / d_model)
        cos, sin = math.cos(angle), sign * math.sin(angle)
        matrix[2 * pair : 2 * pair + 2, 2 * pair : 2 * pair + 2] = torch.tensor(
            [[cos, sin], [-sin, cos]]
        )
    return matrix


def test_average_so_far_accepts_right_answer(capsys):
    assert ch01.check_average_so_far(_average_so_far)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        # the mean over the whole sequence: looks into the future
        (lambda x: x.mean(dim=-2, keepdim=True).expand_as(x), "divide the running sum at t"),
        # divides every running sum by T instead of t + 1
        (lambda x: torch.cumsum(x, dim=-2) / x.shape[-2], "not by T"),
        # only right for 2-D input: cumsum over dim 0
        (lambda x: torch.cumsum(x, dim=0)
         / torch.arange(1, x.shape[0] + 1, dtype=x.dtype).reshape(-1, *[1] * (x.dim() - 1)),
         "leading batch dims are left alone"),
        # right values, but builds the (T, T) matrix the exercise forbids
        (_average_so_far_tril, "way 2 of the chapter"),
        # right values, but a Python loop over the tokens
        (_average_so_far_loop, "A Python loop over the positions"),
        (_not_written, "You have not written"),
    ],
)
def test_average_so_far_names_each_mistake(wrong, phrase, capsys):
    verdict, out = _feedback(ch01.check_average_so_far, wrong, capsys)
    assert verdict is False
    assert phrase in out, out


def test_window_average_accepts_right_answer(capsys):
    assert ch01.check_window_average(_window_average)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda x, window: _average_so_far(x), "ignores the window"),
        (lambda x, window: _window_average(x, window) if window > 1 else 2 * x,
         "window=1, token t may look only at itself"),
        (lambda x, window: _window_average(x, window + 1), "count the keys"),
        (lambda x, window: _window_average(x, max(window - 1, 1)), "count the keys"),
        # a centred window that looks at future tokens
        (lambda x, window: _window_average(x.flip(0), window).flip(0)
         if window > 1 else x, "block every key after the query"),
        (_window_divided_by_window, "the window holds fewer tokens"),
    ],
)
def test_window_average_names_each_mistake(wrong, phrase, capsys):
    verdict = ch01.check_window_average(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def test_recency_weights_accepts_the_prediction(capsys):
    assert ch01.check_recency_weights(
        lambda: [[1.0, 0.0, 0.0], [0.3333, 0.6667, 0.0], [0.1429, 0.2857, 0.5714]])
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("prediction", "phrase"),
    [
        ([[0.1429, 0.2857, 0.5714]] * 3, "The mask still applies"),
        ([[1, 0, 0], [0.6667, 0.3333, 0], [0.5714, 0.2857, 0.1429]], "A larger score"),
        ([[1, 0, 0], [0.5, 0.5, 0], [0.3333, 0.3333, 0.3333]], "plain average"),
        ([[1, 0, 0], [0, 1, 0], [0, 0.3333, 0.6667]], "exponentiates every score"),
        ([[1, 0, 0], [1, 2, 0], [1, 2, 4]], "divides each row by its sum"),
        ([[1, 0, 0], [0.3, 0.7, 0], [0.1, 0.3, 0.6]], "e^(s ln 2)"),
        ([[1, 0.5, 0], [0.3333, 0.6667, 0], [0.1429, 0.2857, 0.5714]], "e^(-inf) = 0"),
        ([1.0, 0.0, 0.0], "one row per query"),
        ("about a third", "list of three rows"),
    ],
)
def test_recency_weights_names_each_mistake(prediction, phrase, capsys):
    verdict = ch01.check_recency_weights(lambda: prediction)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def test_offset_matrix_accepts_right_answer(capsys):
    assert ch01.check_offset_matrix(_offset_matrix)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda offset, d_model: _offset_matrix(offset, d_model, sign=-1.0), "wrong way"),
        (lambda offset, d_model: _offset_matrix(offset, d_model).T, "wrong way"),
        (lambda offset, d_model: _offset_matrix(offset, d_model, pair_step=1), "uses 2i"),
        (lambda offset, d_model: _offset_matrix(offset, d_model)[:, :-1], "square"),
        (lambda offset, d_model: torch.eye(d_model), "angle-sum formulas"),
        (lambda offset, d_model: _offset_matrix(3, 8) if d_model == 8 else torch.eye(d_model),
         "not fixed numbers"),
    ],
)
def test_offset_matrix_names_each_mistake(wrong, phrase, capsys):
    verdict = ch01.check_offset_matrix(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


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


def test_stable_softmax_accepts_right_answer(capsys):
    assert ch02.check_stable_softmax(_stable_softmax)
    assert capsys.readouterr().out.startswith("Correct:")


def _softmax_by_alias(x, dim=-1):
    from attention_book import softmax as renamed  # an alias is caught too

    return renamed(x, dim=dim)


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (_naive_softmax, "Subtract the row maximum"),
        # subtracts the maximum of the whole tensor: the second row underflows to 0/0
        (lambda x, dim=-1: _naive_softmax(x - x.max(), dim=dim), "not of the whole tensor"),
        (lambda x, dim=-1: _stable_softmax(x, dim=-1), "ignores its dim argument"),
        (lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum(), "sum of the exps of its row"),
        (lambda x, dim=-1: torch.exp(x - x.amax(dim=dim))
         / torch.exp(x - x.amax(dim=dim)).sum(dim=dim), "keepdim=True"),
        # the library softmaxes the exercise forbids (classroom trial D11)
        (lambda x, dim=-1: torch.softmax(x, dim), "a library softmax"),
        (lambda x, dim=-1: x.softmax(dim), "a library softmax"),
        (lambda x, dim=-1: nn.functional.softmax(x, dim=dim), "a library softmax"),
        (lambda x, dim=-1: nn.Softmax(dim=dim)(x), "a library softmax"),
        (lambda x, dim=-1: torch.log_softmax(x, dim).exp(), "a library softmax"),
        (lambda x, dim=-1: ab.softmax(x, dim), "attention_book.softmax"),
        (_softmax_by_alias, "attention_book.softmax"),
        (_not_written, "You have not written"),
    ],
)
def test_stable_softmax_names_each_mistake(wrong, phrase, capsys):
    verdict = ch02.check_stable_softmax(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def test_library_softmax_is_reported_even_when_the_answer_also_fails(capsys):
    def broken(x, dim=-1):
        torch.softmax(x, dim)
        raise RuntimeError("later")

    assert ch02.check_stable_softmax(broken) is False
    assert "off limits" in capsys.readouterr().out


def test_library_softmax_watch_leaves_torch_as_it_was():
    before = (torch.softmax, torch.Tensor.softmax, nn.functional.softmax, ab.softmax)
    ch02.check_stable_softmax(lambda x, dim=-1: torch.softmax(x, dim))
    assert (torch.softmax, torch.Tensor.softmax, nn.functional.softmax, ab.softmax) == before
    assert torch.softmax(torch.zeros(2), dim=0).tolist() == [0.5, 0.5]


_A = math.exp(1 / math.sqrt(2)) / (2 * math.exp(1 / math.sqrt(2)) + 1)  # 0.4011
_B = 1 / (2 * math.exp(1 / math.sqrt(2)) + 1)  # 0.1978


def test_predicted_cross_attention_accepts_the_hand_computation(capsys):
    assert ch02.check_predicted_cross_attention(
        lambda: ([[2.0], [2.2033]], [[0.4011, 0.1978, 0.4011], [0.1978, 0.4011, 0.4011]]))
    assert capsys.readouterr().out.startswith("Correct:")
    assert ch02.check_predicted_cross_attention(  # tensors, and outputs of shape (2,)
        lambda: (torch.tensor([2.0, 1 + 3 * _A]), torch.tensor([[_A, _B, _A], [_B, _A, _A]])))


@pytest.mark.parametrize(
    ("prediction", "phrase"),
    [
        (([[2.0], [2.2669]], [[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223]]),
         "weights of unscaled scores"),
        (([[2.0], [2.1511]], [[0.3837, 0.2327, 0.3837], [0.2327, 0.3837, 0.3837]]),
         "divided the scores by d_k = 2"),
        (([[2.0], [2.2]], [[0.6698, 0.3302, 0.5], [0.3302, 0.6698, 0.5]]),
         "runs over the keys"),
        (([[2.2033], [2.0]], [[_B, _A, _A], [_A, _B, _A]]), "Row 0 belongs to the first query"),
        (([[2.0], [2.5]], [[0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]), "exponentiates each scaled score"),
        (([[2.0], [2.2]], [[0.4, 0.2, 0.4], [0.25, 0.35, 0.4]]), "e^0.7071"),
        (([[2.2033], [2.0]], [[_A, _B, _A], [_B, _A, _A]]), "the two rows swapped"),
        (([[2.0, 0.0], [2.2, 0.0]], [[_A, _B, _A], [_B, _A, _A]]), "not the keys"),
        (([[2.0], [2.3]], [[_A, _B, _A], [_B, _A, _A]]), "weighted sum of the values"),
        (([[2.0], [2.2]],), "return context_vecs, attn_weights"),
    ],
)
def test_predicted_cross_attention_names_each_mistake(prediction, phrase, capsys):
    verdict = ch02.check_predicted_cross_attention(lambda: prediction)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def _cosine_attention_weights(x):
    unit = x / x.norm(dim=-1, keepdim=True)  # (T, d)
    return torch.softmax(unit @ unit.T, dim=-1)  # (T, T)


def test_cosine_attention_accepts_right_answer(capsys):
    assert ch02.check_cosine_attention_weights(_cosine_attention_weights)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda x: torch.softmax(x @ x.T, dim=-1), "Divide every row of x by its length"),
        (lambda x: (x / x.norm(dim=-1, keepdim=True)) @ (x / x.norm(dim=-1, keepdim=True)).T,
         "apply the softmax"),
        (lambda x: torch.softmax(x @ x.T / x.norm() ** 2, dim=-1), "one norm for the whole"),
        (lambda x: torch.softmax((x / x.norm(dim=0, keepdim=True)) @ x.T, dim=-1),
         "its own norm"),
    ],
)
def test_cosine_attention_names_each_mistake(wrong, phrase, capsys):
    verdict = ch02.check_cosine_attention_weights(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def _colleague(x, *, global_max=True, transposed=True):
    attn_scores = x @ x.T  # (T, T)
    shift = attn_scores.max() if global_max else attn_scores.amax(dim=-1, keepdim=True)
    exp = torch.exp(attn_scores - shift)
    attn_weights = exp / exp.sum(dim=-1, keepdim=True)  # (T, T)
    context_vecs = (attn_weights.T if transposed else attn_weights) @ x  # (T, d)
    return context_vecs, attn_weights


def test_fixed_attention_accepts_the_fix(capsys):
    assert ch02.check_fixed_attention(lambda x: _colleague(x, global_max=False, transposed=False))
    assert capsys.readouterr().out.startswith("Correct:")
    assert ch02.check_fixed_attention(  # the library softmax is fine here
        lambda x: (torch.softmax(x @ x.T, dim=-1) @ x, torch.softmax(x @ x.T, dim=-1)))


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (_colleague, "compare with ab.scaled_dot_product_attention"),
        (lambda x: _colleague(x, global_max=False), "the columns of the weights"),
        (lambda x: _colleague(x, transposed=False), "Shift each row by its own maximum"),
        (lambda x: (torch.softmax(x @ x.T, dim=0) @ x, torch.softmax(x @ x.T, dim=0)),
         "every row sums to 1"),
        (lambda x: ab.scaled_dot_product_attention(x, x, x), "does not scale the scores"),
        (lambda x: _colleague(x, global_max=False, transposed=False)[0], "return context_vecs"),
    ],
)
def test_fixed_attention_names_each_mistake(wrong, phrase, capsys):
    verdict = ch02.check_fixed_attention(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


# ---------------------------------------------------------------- chapter 3


def _linear_from_parameter(W, transpose=True, bias=False):
    d_in, d_out = W.shape
    layer = nn.Linear(d_in, d_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(W.T if transpose else W)
    return layer


def _untransposed_square_only(W):
    # Passes the shape check on non-square W, but never transposes a square one.
    d_in, d_out = W.shape
    layer = nn.Linear(d_in, d_out, bias=False)
    with torch.no_grad():
        layer.weight.copy_(W.T if d_in != d_out else W)
    return layer


def test_linear_from_parameter_accepts_right_answer(capsys):
    assert ch03.check_linear_from_parameter(_linear_from_parameter)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda W: W, "Create nn.Linear"),
        (lambda W: _linear_from_parameter(W, bias=True), "bias=False"),
        (lambda W: nn.Linear(*W.shape, bias=False), "the weight must be W.T"),
        (_untransposed_square_only, "A square W hides a missing transpose"),
        (lambda W: _linear_from_parameter(W.T, transpose=True), "(d_out, d_in)"),
    ],
)
def test_linear_from_parameter_names_each_mistake(wrong, phrase, capsys):
    verdict = ch03.check_linear_from_parameter(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def _cross_attention(x_q, x_kv, W_query, W_key, W_value, transpose=None, scale=None,
                     kv_source=None, dim=-1):
    queries = x_q @ W_query  # (..., T_q, d_k)
    source = x_kv if kv_source is None else kv_source(x_q, x_kv)
    keys = source @ W_key  # (..., T_kv, d_k)
    values = source @ W_value  # (..., T_kv, d_v)
    keys_t = keys.transpose(-2, -1) if transpose is None else transpose(keys)
    scale = 1 / math.sqrt(keys.shape[-1]) if scale is None else scale
    attn_weights = torch.softmax(queries @ keys_t * scale, dim=dim)  # (..., T_q, T_kv)
    return attn_weights @ values, attn_weights


def test_cross_attention_accepts_right_answer(capsys):
    assert ch03.check_cross_attention(_cross_attention)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        # the chapter's warning: .T and transpose(0, 1) are only right in 2-D (review D17)
        (lambda *args: _cross_attention(*args, transpose=lambda k: k.T), "`.T` reverses every dim"),
        (lambda *args: _cross_attention(*args, transpose=lambda k: k.transpose(0, 1)),
         "keys.transpose(-2, -1)"),
        (lambda *args: _cross_attention(*args, scale=1.0), "keys' last dim"),
        (lambda *args: _cross_attention(*args, scale=1 / math.sqrt(args[0].shape[-1])),
         "divided by sqrt(d_in)"),
        (lambda *args: _cross_attention(*args, kv_source=lambda q, kv: q), "the keys come from x_kv"),
        (lambda *args: _cross_attention(*args, dim=-2), "each query's row sums to 1"),
        (lambda x_q, x_kv, Wq, Wk, Wv: _cross_attention(x_kv, x_q, Wq, Wk, Wv),
         "Your rows belong to x_kv"),
        (lambda *args: _cross_attention(*args)[1], "return context_vecs, attn_weights"),
        (_not_written, "You have not written"),
    ],
)
def test_cross_attention_names_each_mistake(wrong, phrase, capsys):
    verdict = ch03.check_cross_attention(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def _split_merged(merged, d_out):
    U, S, Vh = torch.linalg.svd(merged)
    return U[:, :d_out] * S[:d_out], Vh[:d_out].T


def test_split_merged_accepts_any_factorisation(capsys):
    assert ch03.check_split_merged(_split_merged)
    assert capsys.readouterr().out.startswith("Correct:")

    def rotated(merged, d_out):  # (W_q A, W_k A^-T) is as good a split
        W_query, W_key = _split_merged(merged, d_out)
        A = torch.eye(d_out) + 0.5 * torch.ones(d_out, d_out)
        return W_query @ A, W_key @ torch.linalg.inv(A).T

    assert ch03.check_split_merged(rotated)


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda M, d_out: (M, torch.eye(M.shape[0])), "Keep d_out columns"),
        (lambda M, d_out: (_split_merged(M, d_out)[0], _split_merged(M, d_out)[0]), "take W_key"),
        (lambda M, d_out: (torch.linalg.svd(M)[0][:, :d_out], torch.linalg.svd(M)[2][:d_out].T),
         "The singular values S must go"),
        (lambda M, d_out: (_split_merged(M, d_out)[0], torch.linalg.svd(M)[2][:d_out]),
         "as columns"),
        (lambda M, d_out: _split_merged(M, d_out)[0], "return W_query, W_key"),
    ],
)
def test_split_merged_names_each_mistake(wrong, phrase, capsys):
    verdict = ch03.check_split_merged(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


def _is_batch_consistent(attention_fn):
    torch.manual_seed(0)
    for shape in ((3, 5, 3), (2, 3, 4, 3)):  # one leading dim and two, B != T
        x = torch.randn(shape)
        try:
            batched = attention_fn(x)  # (..., T, d_out)
            sequences = x.reshape(-1, *shape[-2:])  # (B * G, T, d_in)
            outputs = batched.reshape(-1, *batched.shape[-2:])  # (B * G, T, d_out)
            if not all(torch.allclose(outputs[i], attention_fn(sequence), atol=1e-6)
                       for i, sequence in enumerate(sequences)):
                return False
        except Exception:  # noqa: BLE001 - a function that fails on a batch is not consistent
            return False
    return True


def test_batch_consistency_test_accepts_a_good_test(capsys):
    assert ch03.check_batch_consistency_test(_is_batch_consistent)
    assert capsys.readouterr().out.startswith("Correct:")


def _equal_is_too_strict(attention_fn):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 3)
    return all(bool((attention_fn(x)[b] == attention_fn(x[b]) + 1e-3).all()) for b in range(3))


def _square_batch(attention_fn):  # B == T hides the shape[0] scale (the recheck's weak test)
    torch.manual_seed(0)
    x = torch.randn(5, 5, 3)
    try:
        return all(torch.allclose(attention_fn(x)[b], attention_fn(x[b]), atol=1e-6)
                   for b in range(5))
    except Exception:  # noqa: BLE001
        return False


def _lets_errors_escape(attention_fn):  # no try/except (the recheck's weak test)
    x = torch.randn(3, 5, 3)
    return all(torch.allclose(attention_fn(x)[b], attention_fn(x[b]), atol=1e-6)
               for b in range(3))


def _shapes_only(attention_fn):  # the recheck's weak test: only the shape of the result
    try:
        return tuple(attention_fn(torch.randn(3, 5, 3)).shape) == (3, 5, 2)
    except Exception:  # noqa: BLE001
        return False


def _one_leading_dim_only(attention_fn):  # the chapter's earlier model answer: (B, T, 3) only
    torch.manual_seed(0)
    batch = torch.randn(3, 5, 3)
    try:
        batched = attention_fn(batch)
        return all(torch.allclose(batched[b], attention_fn(batch[b]), atol=1e-6)
                   for b in range(3))
    except Exception:  # noqa: BLE001
        return False


def _first_sequence_only(attention_fn):  # compares sequence 0 of each batch, nothing else
    torch.manual_seed(0)
    batch, grouped = torch.randn(3, 5, 3), torch.randn(2, 3, 4, 3)
    try:
        return (torch.allclose(attention_fn(batch)[0], attention_fn(batch[0]), atol=1e-6)
                and torch.allclose(attention_fn(grouped)[0, 0], attention_fn(grouped[0, 0]),
                                   atol=1e-6))
    except Exception:  # noqa: BLE001
        return False


def _loose_tolerance(attention_fn):
    torch.manual_seed(0)
    try:
        for shape in ((3, 5, 3), (2, 3, 4, 3)):
            x = torch.randn(shape)
            outputs = attention_fn(x).reshape(-1, shape[-2], 2)
            for i, sequence in enumerate(x.reshape(-1, *shape[-2:])):
                if not torch.allclose(outputs[i], attention_fn(sequence), atol=1e-2):
                    return False
        return True
    except Exception:  # noqa: BLE001
        return False


def _copies_of_one_sequence(attention_fn):  # a batch of three equal sequences hides most leaks
    torch.manual_seed(0)
    sequence = torch.randn(5, 3)
    try:
        batched = attention_fn(sequence.expand(3, 5, 3))
        return all(torch.allclose(batched[b], attention_fn(sequence), atol=1e-6)
                   for b in range(3))
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize(
    ("wrong", "phrase"),
    [
        (lambda attention_fn: True, "flattens the batch"),
        (lambda attention_fn: False, "torch.allclose"),
        (_equal_is_too_strict, "torch.allclose"),
        (_square_batch, "differs from the number of tokens T"),
        (_lets_errors_escape, "catch the error"),
        (_shapes_only, "flattens the batch"),
        (_one_leading_dim_only, "(B, G, T, 3)"),
        (_first_sequence_only, "not only the first one"),
        (_loose_tolerance, "not 1e-2"),
        (_copies_of_one_sequence, "flattens the batch"),
        (lambda attention_fn: None, "True or False"),
        (_not_written, "You have not written"),
    ],
)
def test_batch_consistency_test_names_each_mistake(wrong, phrase, capsys):
    verdict = ch03.check_batch_consistency_test(wrong)
    out = capsys.readouterr().out
    assert verdict is False
    assert phrase in out, out


@pytest.mark.parametrize("broken", [fn for fn, _ in ch03._BROKEN])
def test_each_broken_function_is_right_in_shape_on_one_sequence(broken):
    """The broken functions only misbehave on a batch, so a test must use one."""
    x = torch.randn(5, 3)
    assert broken(x).shape == (5, 2)


@pytest.mark.parametrize("broken", [ch03._first_sequence_keys, ch03._softmax_over_dim_two,
                                    ch03._batch_statistics])
def test_the_deeper_broken_functions_hide_from_a_shallow_look(broken):
    """Each deeper bug is invisible to one weak test and visible to the full property."""
    torch.manual_seed(0)
    batch = torch.randn(3, 5, 3)
    on_batch = broken(batch)
    if broken is ch03._first_sequence_keys:  # right for sequence 0, wrong for sequence 1
        assert torch.allclose(on_batch[0], broken(batch[0]), atol=1e-6)
        assert not torch.allclose(on_batch[1], broken(batch[1]), atol=1e-6)
    elif broken is ch03._softmax_over_dim_two:  # right with one leading dim, wrong with two
        assert all(torch.allclose(on_batch[b], broken(batch[b]), atol=1e-6) for b in range(3))
        grouped = torch.randn(2, 3, 5, 3)
        assert not torch.allclose(broken(grouped)[1, 2], broken(grouped[1, 2]), atol=1e-6)
    else:  # within 1e-2, not within 1e-6
        assert all(torch.allclose(on_batch[b], broken(batch[b]), atol=1e-2) for b in range(3))
        assert not all(torch.allclose(on_batch[b], broken(batch[b]), atol=1e-6)
                       for b in range(3))


def test_the_hidden_tests_accept_the_good_test_and_reject_every_weak_one():
    """The grader's hidden tests of exercise 3.4 reject the weak tests the checker rejects."""
    assert passes_hidden_tests("03_trainable_qkv.ipynb", "ch03-ex4-check",
                               is_batch_consistent=_is_batch_consistent)
    for weak in (_square_batch, _lets_errors_escape, _shapes_only, _one_leading_dim_only,
                 _first_sequence_only, _loose_tolerance, _copies_of_one_sequence,
                 lambda attention_fn: True):
        assert not passes_hidden_tests("03_trainable_qkv.ipynb", "ch03-ex4-check",
                                       is_batch_consistent=weak), weak
