"""The checkers of chapters 4-6 accept a right answer and reject typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import unwritten
from hidden_tests import passes_hidden_tests

from attention_book.exercises import ch04, ch05, ch06

# ---------------------------------------------------------------- chapter 4


def _divisor(d_k, var_q, var_k):
    return math.sqrt(d_k * var_q * var_k)


@pytest.mark.parametrize("right", [_divisor, lambda d, a, b: torch.tensor(d * a * b).sqrt()])
def test_unit_variance_divisor_accepts_right_answers(right, capsys):
    assert ch04.check_unit_variance_divisor(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda d, a, b: math.sqrt(d), "does not change with the variances"),
        (lambda d, a, b: math.sqrt(d) * a * b, "variances themselves"),
        (lambda d, a, b: d * a * b, "That is the variance of q . k"),
        (lambda d, a, b: math.sqrt(d / (a * b)), "grows when the entries get smaller"),
        (lambda d, a, b: math.sqrt(d) / (a * b), "grows when the entries get smaller"),
        (lambda d, a, b: math.sqrt(d * (a + b)), "added the two variances"),
        (lambda d, a, b: math.sqrt(d) * (a * b) ** 0.25, "Var(q_i k_i) = E[q_i^2] E[k_i^2]"),
        (lambda d, a, b: "8", "is a number"),
    ],
)
def test_unit_variance_divisor_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch04.check_unit_variance_divisor(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _entropy(scores, tau):
    weights = torch.softmax(scores.double() / tau, dim=-1)
    return -torch.special.xlogy(weights, weights).sum().item()


def _bisect(entropy_fn, target, towards_larger=True):
    low, high = math.log(1e-3), math.log(1e3)
    for _ in range(60):
        middle = (low + high) / 2
        if (entropy_fn(math.exp(middle)) < target) == towards_larger:
            low = middle
        else:
            high = middle
    return math.exp((low + high) / 2)


def _temperature(scores, target):
    return _bisect(lambda tau: _entropy(scores, tau), target)


def _temperature_by_grid(scores, target):
    taus = torch.logspace(-3, 3, 200_001, dtype=torch.float64)
    entropies = torch.tensor([_entropy(scores, t) for t in taus[::1000]])  # coarse, then fine
    best = taus[::1000][(entropies - target).abs().argmin()]
    fine = torch.linspace(best.item() * 0.9, best.item() * 1.1, 20_001, dtype=torch.float64)
    weights = torch.softmax(scores.double()[None, :] / fine[:, None], dim=-1)
    values = -torch.special.xlogy(weights, weights).sum(dim=-1)
    return fine[(values - target).abs().argmin()]  # a 0-d tensor


@pytest.mark.parametrize("right", [_temperature, _temperature_by_grid])
def test_temperature_for_entropy_accepts_right_answers(right, capsys):
    assert ch04.check_temperature_for_entropy(right)
    out = capsys.readouterr().out
    assert out.startswith("Correct:") and "1.830" in out


def _bits(scores, target):
    return _bisect(lambda tau: _entropy(scores, tau) / math.log(2), target)


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda s, t: 1 / _temperature(s, t), "multiplied by it"),
        (_bits, "measured in bits"),
        (lambda s, t: _bisect(lambda tau: _entropy(s, tau), t, towards_larger=False),
         "ended at one end of its interval"),
        (lambda s, t: 4.0, "Bisect: start from a low and a high tau"),
        (lambda s, t: -_temperature(s, t), "must be positive"),
        (lambda s, t: None, "is a number"),
    ],
)
def test_temperature_for_entropy_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch04.check_temperature_for_entropy(wrong)
    assert named_in_feedback in capsys.readouterr().out


_RIGHT_ROWS = [[0.8756, 0.1185, 0.0059], [0.6897, 0.2537, 0.0566], [0.4321, 0.3366, 0.2313]]
_BY_D_K = [0.5283, 0.3204, 0.1513]  # the scores divided by d_k = 4 instead of sqrt(d_k)


def test_predicted_rows_accepts_the_hand_computed_answer(capsys):
    assert ch04.check_predicted_rows(lambda: _RIGHT_ROWS)
    assert capsys.readouterr().out.startswith("Correct:")
    assert ch04.check_predicted_rows(lambda: torch.tensor(_RIGHT_ROWS))  # a tensor is fine


def test_ex43_is_not_ex22_again():
    """Exercise 4.3 asks for other numbers than exercise 2.2 (the recheck's N2)."""
    from attention_book.exercises import ch02

    assert ch02.check_predicted_cross_attention.__doc__ != ch04.check_predicted_rows.__doc__
    ex22_weights = [[0.4011, 0.1978, 0.4011], [0.1978, 0.4011, 0.4011]]
    assert not ch04.check_predicted_rows(lambda: ex22_weights + [[0.4011, 0.1978, 0.4011]])


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        ([_RIGHT_ROWS[0], _BY_D_K, _RIGHT_ROWS[2]], "You divided by d_k = 4"),
        ([_RIGHT_ROWS[0], _RIGHT_ROWS[2], _RIGHT_ROWS[2]], "not the layer's width"),
        ([_RIGHT_ROWS[0], _RIGHT_ROWS[1], _RIGHT_ROWS[1]], "the chapter's scale, sqrt(d_k) = 2"),
        ([_RIGHT_ROWS[1], _RIGHT_ROWS[1], _RIGHT_ROWS[2]], "the chapter's scale, sqrt(d_k) = 2"),
        ([_RIGHT_ROWS[0], _RIGHT_ROWS[1], _RIGHT_ROWS[0]], "raw scores"),
        ([[0.8438, 0.1142, 0.0420], _RIGHT_ROWS[1], _RIGHT_ROWS[2]], "first entry is -1"),
        ([[0.5, 0.2, 0.1], _RIGHT_ROWS[1], _RIGHT_ROWS[2]], "sums to 1"),
        ([[0.80, 0.15, 0.05], _RIGHT_ROWS[1], _RIGHT_ROWS[2]], "Write out the three scores"),
        (_RIGHT_ROWS[:2], "three rows of three numbers"),
        ("0.87, 0.12", "three rows of three numbers"),
    ],
)
def test_predicted_rows_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch04.check_predicted_rows(lambda: wrong)
    out = capsys.readouterr().out
    assert named_in_feedback in out, out
    expected = [line for line in out.splitlines() if line.strip().startswith("expected:")]
    assert not any(number in line for line in expected  # the answer is never given away
                   for number in ("0.8756", "0.6897", "0.4321", "0.2537"))


def test_predicted_rows_reports_an_unwritten_answer(capsys):
    assert not ch04.check_predicted_rows(unwritten)
    assert "You have not written" in capsys.readouterr().out

# ---------------------------------------------------------------- chapter 5


def _ones(num_tokens):
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool)


def _prefix_lm(prefix_len, num_tokens):
    return _ones(num_tokens).tril() | (torch.arange(num_tokens) < prefix_len)[None, :]


def _prefix_lm_by_loops(prefix_len, num_tokens):
    mask = torch.zeros(num_tokens, num_tokens, dtype=torch.bool)
    for i in range(num_tokens):
        for j in range(num_tokens):
            mask[i, j] = j <= i or j < prefix_len
    return mask


@pytest.mark.parametrize("right", [_prefix_lm, _prefix_lm_by_loops])
def test_prefix_lm_mask_accepts_right_answers(right, capsys):
    assert ch05.check_prefix_lm_mask(right)
    assert capsys.readouterr().out.startswith("Correct:")


def _prefix_block_only(p, t):
    query, key = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return ((query < p) & (key < p)) | (_ones(t).tril() & (key >= p))


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda p, t: ~_prefix_lm(p, t), "True where attending is forbidden"),
        (lambda p, t: _ones(t).tril(), "plain causal mask"),
        (lambda p, t: _ones(t).tril() | (torch.arange(t) < p)[:, None], "see the whole sequence"),
        (_prefix_block_only, "do not see the prefix"),
        (lambda p, t: _prefix_lm(p + 1, t), "one token too long"),
        (lambda p, t: _prefix_lm(p - 1, t), "one token too short"),
        (lambda p, t: _prefix_lm(p, t).int(), "boolean"),
        (lambda p, t: _prefix_lm(p, t)[0], "shape"),
        (lambda p, t: _prefix_lm(3, 6), "Use both arguments"),
        (lambda p, t: _prefix_lm(p, t).T.contiguous(), "Combine two conditions with |"),
    ],
)
def test_prefix_lm_mask_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_prefix_lm_mask(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _masked_softmax(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0)


def _renormalised(scores, mask):
    weights = torch.softmax(scores, dim=-1) * mask
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))


def _large_negative_then_zero_empty_rows(scores, mask):
    weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    return torch.where(mask.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))


@pytest.mark.parametrize("right", [_masked_softmax, _renormalised,
                                   _large_negative_then_zero_empty_rows])
def test_masked_softmax_accepts_right_answers(right, capsys):
    assert ch05.check_masked_softmax(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), dim=-1), "not NaN"),
        (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), dim=-1), "filled with -1e+09"),
        (lambda s, m: torch.softmax(s.masked_fill(~m, torch.finfo(s.dtype).min), dim=-1),
         "A large negative number is not -inf"),
        (lambda s, m: torch.softmax(s * m, dim=-1), "set to 0, not -inf"),
        (lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), dim=-1), "polarity"),
        (lambda s, m: torch.softmax(s, dim=-1) * m, "not renormalised"),
        (lambda s, m: _masked_softmax(s, m).sum(dim=-1), "shape"),
        (lambda s, m: _masked_softmax(s.transpose(-2, -1), m), "values"),
    ],
)
def test_masked_softmax_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_masked_softmax(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _real_keys(lengths, max_len, left=True):
    positions = torch.arange(max_len)[None, :]
    lengths = torch.as_tensor(lengths)[:, None]
    return positions >= max_len - lengths if left else positions < lengths  # (B, T)


def _left_padded(lengths, max_len):
    return _ones(max_len).tril() & _real_keys(lengths, max_len)[:, None, None, :]


def test_left_padded_mask_accepts_right_answer(capsys):
    assert ch05.check_left_padded_mask(_left_padded)
    assert capsys.readouterr().out.startswith("Correct:")


def _diagonal_for_padding_queries(lengths, max_len):
    padding_query = ~_real_keys(lengths, max_len)[:, None, :, None]  # (B, 1, T, 1)
    return _left_padded(lengths, max_len) | (padding_query & torch.eye(max_len, dtype=torch.bool))


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda lengths, t: _ones(t).tril() & _real_keys(lengths, t, left=False)[:, None, None, :],
         "as for right padding"),
        (lambda lengths, t: _ones(t).tril().expand(len(lengths), 1, t, t), "only causal"),
        (lambda lengths, t: _real_keys(lengths, t)[:, None, None, :].expand(-1, 1, t, t),
         "only hides the padding"),
        (lambda lengths, t: ~_left_padded(lengths, t), "True where attending is forbidden"),
        (_diagonal_for_padding_queries, "Mask the keys only"),
        (lambda lengths, t: _left_padded(lengths, t)[:, 0], "(B, 1, T, T)"),
        (lambda lengths, t: _left_padded(lengths, t).float(), "boolean"),
        (lambda lengths, t: _left_padded([4, 2, 3], 4), "Use both arguments"),
    ],
)
def test_left_padded_mask_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_left_padded_mask(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _causality_test(perturb=1.0, positions=None, same=torch.equal, upto=0, sequences=slice(None)):
    """A property test in the learner's style; each keyword is one typical mistake."""
    def is_causal_layer(layer, x):
        reference = layer(x)
        for t in positions or range(1, x.size(-2)):
            changed = x.clone()
            changed[:, t] += perturb
            if not same(layer(changed)[sequences, :t + upto], reference[sequences, :t + upto]):
                return False
        return True
    return is_causal_layer


def _own_short_input(layer, x):
    """Draws its own input of four tokens instead of testing the one it is given."""
    torch.manual_seed(0)
    return _causality_test()(layer, torch.randn(x.size(0), 4, x.size(-1)))


def test_the_recheck_weak_causality_tests_are_each_rejected(capsys):
    """The three weak tests the recheck review quoted for exercise 5.4 fail the checker."""
    last_token_only = _causality_test(positions=[5])
    tiny_change = _causality_test(perturb=1e-6, same=lambda a, b: torch.allclose(a, b))
    sequence_0_only = _causality_test(sequences=0)
    for weak in (last_token_only, tiny_change, sequence_0_only):
        assert ch05.check_is_causal_layer(weak) is False
        assert capsys.readouterr().out.startswith("Not yet.")


@pytest.mark.parametrize(
    "right",
    [
        _causality_test(),
        _causality_test(same=lambda a, b: bool(torch.isclose(a, b).all())),  # first_leak's test
        lambda layer, x: torch.tensor(_causality_test()(layer, x)),  # a 0-d bool tensor
    ],
)
def test_is_causal_layer_accepts_right_answers(right, capsys):
    assert ch05.check_is_causal_layer(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda layer, x: True, "passes a layer that has no mask at all"),
        (lambda layer, x: False, "rejects a correct causal layer"),
        (_causality_test(upto=1), "a token may depend on itself"),
        (_causality_test(positions=[1]), "a leak from the last token into position 0"),
        (_causality_test(positions=[5]), "a leak inside a bidirectional prefix"),
        (_causality_test(sequences=0), "the second sequence of the batch"),
        (_causality_test(same=lambda a, b: torch.allclose(a, b, atol=1e-3)), "a weak mask"),
        (_causality_test(perturb=1e-6, same=lambda a, b: torch.allclose(a, b)),
         "by a visible amount"),
        (_causality_test(same=lambda a, b: torch.equal(a[:, :1], b[:, :1])),  # output 0 only
         "a leak in the middle of the sequence"),
        (_own_short_input, "only from the fifth token on"),
        (lambda layer, x: None, "returns True or False"),
    ],
)
def test_is_causal_layer_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch05.check_is_causal_layer(wrong)
    assert named_in_feedback in capsys.readouterr().out

# ---------------------------------------------------------------- chapter 6


def _drop_keys(weights, p):
    keep = torch.rand(1, weights.size(-1)) >= p
    return weights * keep / (1 - p)


@pytest.mark.parametrize(
    "right",
    [
        _drop_keys,
        lambda w, p: w * (torch.rand(w.size(-1)) >= p) / (1 - p),  # a (T_k,) mask broadcasts too
        lambda w, p: w * torch.bernoulli(torch.full((1, w.size(-1)), 1 - p)) / (1 - p),
    ],
)
def test_drop_keys_accepts_right_answers(right, capsys):
    assert ch06.check_drop_keys(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda w, p: torch.nn.functional.dropout(w, p, training=True), "You dropped single weights"),
        (lambda w, p: w * (torch.rand(w.size(0), 1) >= p) / (1 - p), "you dropped queries"),
        (lambda w, p: w * (torch.rand(1, w.size(-1)) >= p) / p if p else w, "1 / p"),
        (lambda w, p: w * (torch.rand(1, w.size(-1)) >= p), "not scaled"),
        (lambda w, p: w * (torch.rand(1, w.size(-1)) < p) / (1 - p), "probability 1 - p"),
        (lambda w, p: w * (torch.rand(1, w.size(-1)) >= p / 2) / (1 - p), "dropped with probability"),
        (lambda w, p: _drop_keys(w, p).sum(dim=-1), "shape"),
        (lambda w, p: _drop_keys(w, max(p, 0.1)), "with p=0"),
    ],
)
def test_drop_keys_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_drop_keys(wrong)
    assert named_in_feedback in capsys.readouterr().out


def _draws(p, r, z):
    return math.ceil(z**2 * p / ((1 - p) * r**2))


def _draws_by_search(p, r, z):
    n = 1
    while z * math.sqrt(p / ((1 - p) * n)) > r:
        n *= 2
    low, high = n // 2, n  # the tolerance is too large at low (or low is 0) and fine at high
    while high - low > 1:
        middle = (low + high) // 2
        if z * math.sqrt(p / ((1 - p) * middle)) > r:
            low = middle
        else:
            high = middle
    return high


@pytest.mark.parametrize("right", [_draws, _draws_by_search, lambda p, r, z: torch.tensor(_draws(p, r, z))])
def test_draws_needed_accepts_right_answers(right, capsys):
    assert ch06.check_draws_needed(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (lambda p, r, z: z**2 * p / ((1 - p) * r**2), "Round up with math.ceil"),
        (lambda p, r, z: math.floor(z**2 * p / ((1 - p) * r**2)), "You rounded down"),
        (lambda p, r, z: math.ceil(z * p / ((1 - p) * r)), "did not square z"),
        (lambda p, r, z: math.ceil(z**2 * p * (1 - p) / r**2), "leaves out the 1 / (1 - p)"),
        (lambda p, r, z: math.ceil(z**2 * (1 - p) / (p * r**2)), "swapped p and 1 - p"),
        (lambda p, r, z: math.ceil(z * math.sqrt(p / (1 - p)) / r), "solved for sqrt(n)"),
        (lambda p, r, z: 20_000, "Set z * sqrt(p / ((1 - p) * n)) equal"),
        (lambda p, r, z: None, "is a number"),
    ],
)
def test_draws_needed_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_draws_needed(wrong)
    assert named_in_feedback in capsys.readouterr().out


class _TwoDropouts(torch.nn.Module):
    """The exercise's layer; ``container`` says how it keeps its two dropout modules."""

    def __init__(self, d_in, d_out, context_length, dropout, container=list):
        super().__init__()
        self.W_query = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_key = torch.nn.Linear(d_in, d_out, bias=False)
        self.W_value = torch.nn.Linear(d_in, d_out, bias=False)
        self.dropouts = container([torch.nn.Dropout(dropout), torch.nn.Dropout(dropout)])
        self.register_buffer("mask", torch.ones(context_length, context_length,
                                                dtype=torch.bool).tril(), persistent=False)

    def forward(self, x):
        num_tokens = x.size(-2)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(keys.size(-1))
        scores = scores.masked_fill(~self.mask[:num_tokens, :num_tokens], float("-inf"))
        return self.dropouts[1](self.dropouts[0](torch.softmax(scores, dim=-1)) @ values)


class _FunctionalDropout(_TwoDropouts):
    """Another right fix: F.dropout that reads the layer's own flag."""

    def forward(self, x):
        num_tokens = x.size(-2)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(keys.size(-1))
        scores = scores.masked_fill(~self.mask[:num_tokens, :num_tokens], float("-inf"))
        drop = torch.nn.functional.dropout
        weights = drop(torch.softmax(scores, dim=-1), 0.5, training=self.training)
        return drop(weights @ values, 0.5, training=self.training)


def _switched_off_by_hand(*args):
    layer = _TwoDropouts(*args)
    for dropout in layer.dropouts:
        dropout.eval()
    return layer


def _dropout_removed(*args):
    layer = _TwoDropouts(*args)
    layer.dropouts = [torch.nn.Identity(), torch.nn.Identity()]
    return layer


def _no_mask(*args):
    layer = _TwoDropouts(*args, container=torch.nn.ModuleList)
    layer.mask = torch.ones_like(layer.mask)
    return layer


@pytest.mark.parametrize(
    "right",
    [
        lambda *args: _TwoDropouts(*args, container=torch.nn.ModuleList),
        _FunctionalDropout,
    ],
)
def test_fixed_dropout_layer_accepts_right_answers(right, capsys):
    assert ch06.check_fixed_dropout_layer(right)
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(
    ("wrong", "named_in_feedback"),
    [
        (_TwoDropouts, "list(layer.modules())"),  # the bug itself, left in place
        (_switched_off_by_hand, "Dropout must still act in training"),
        (_dropout_removed, "Dropout must still act in training"),
        (_no_mask, "plain causal attention"),
        (lambda *args: _TwoDropouts(*args, container=torch.nn.ModuleList)(torch.zeros(1, 6, 4)),
         "Return the fixed layer itself"),
        (lambda *args: torch.nn.Sequential(torch.nn.Dropout(0.5)), "W_query"),
    ],
)
def test_fixed_dropout_layer_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_fixed_dropout_layer(wrong)
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
         "defaults to True"),
        # a fresh nn.Dropout is in training mode: the same mistake
        (lambda s, p, training: torch.nn.Dropout(p)(torch.softmax(s, -1)), "defaults to True"),
        # dropout on the scores, before the softmax
        (lambda s, p, training: torch.softmax(
            torch.nn.functional.dropout(s, p, training=training), -1), "after the softmax"),
        # dropout but without the 1 / (1 - p) scaling
        (lambda s, p, training: torch.softmax(s, -1) * (torch.rand(s.shape) >= p)
         if training else torch.softmax(s, -1), "not scaled"),
        (lambda s, p, training: torch.softmax(s, 0), "evaluation"),
    ],
)
def test_weights_with_dropout_names_typical_mistakes(wrong, named_in_feedback, capsys):
    assert not ch06.check_weights_with_dropout(wrong)
    assert named_in_feedback in capsys.readouterr().out


def test_the_hidden_tests_of_ex43_accept_the_prediction_and_reject_ex22s():
    notebook, grade_id = "04_scaling.ipynb", "ch04-ex3-check"
    assert passes_hidden_tests(notebook, grade_id, predicted_rows=lambda: _RIGHT_ROWS)
    for wrong in ([_RIGHT_ROWS[0], _BY_D_K, _RIGHT_ROWS[2]],
                  [_RIGHT_ROWS[0], _RIGHT_ROWS[2], _RIGHT_ROWS[1]],
                  [[0.4011, 0.1978, 0.4011], [0.1978, 0.4011, 0.4011], [0.4011, 0.1978, 0.4011]]):
        assert not passes_hidden_tests(notebook, grade_id, predicted_rows=lambda w=wrong: w)


def _last_position_only(layer, x):
    """Changes only the last token (the recheck's weak test), on an input of any length."""
    last = x.size(-2) - 1
    return _causality_test(positions=[last])(layer, x)


def test_the_hidden_tests_of_ex54_reject_every_weak_test():
    notebook, grade_id = "05_masks.ipynb", "ch05-ex4-check"
    assert passes_hidden_tests(notebook, grade_id, is_causal_layer=_causality_test())
    weak_tests = (
        _last_position_only,
        _causality_test(perturb=1e-6, same=lambda a, b: torch.allclose(a, b)),
        _causality_test(sequences=0),
        _causality_test(same=lambda a, b: torch.equal(a[:, :1], b[:, :1])),
        _causality_test(same=lambda a, b: torch.allclose(a, b, atol=1e-3)),
        _own_short_input,
        lambda layer, x: True,
    )
    for weak in weak_tests:
        assert not passes_hidden_tests(notebook, grade_id, is_causal_layer=weak), weak
