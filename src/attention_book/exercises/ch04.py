"""Checkers for chapter 4's exercises (why scale by sqrt(d_k))."""

from __future__ import annotations

import math

import torch

from .feedback import call, checker, expect_true, fail, passed

__all__ = ["check_unit_variance_divisor", "check_temperature_for_entropy",
           "check_predicted_rows"]


def _as_float(value: object, what: str, hint: str) -> float:
    """``value`` as a Python float, or feedback saying a number was expected."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"{what} is a number", expected="a float (or a tensor holding one number)",
             actual=type(value).__name__, hint=hint)
    return float(value)


# ---------------------------------------------------------------- exercise 4.1


@checker
def check_unit_variance_divisor(fn) -> None:
    """Check ``fn(d_k, var_q, var_k)`` returns ``sqrt(d_k * var_q * var_k)``.

    With independent entries of mean 0, ``Var(q . k) = d_k * var_q * var_k``, so dividing by
    its square root gives scores of variance 1. The checker names the usual slips (the
    variances ignored, used without a square root, or inverted) and measures the learner's
    divisor on random vectors.

    Taught in chapter 4.
    """
    cases = [(64, 1.0, 1.0), (64, 1 / 3, 1 / 3), (16, 4.0, 0.25), (100, 2.0, 3.0), (8, 0.5, 0.5)]
    number_hint = "Return the divisor c as a number, for example with math.sqrt(...)."
    for d_k, var_q, var_k in cases:
        actual = _as_float(call(fn, d_k, var_q, var_k,
                                prop=f"your function runs for d_k={d_k}, var_q={var_q:.4g}, "
                                     f"var_k={var_k:.4g}"),
                           f"the divisor for d_k={d_k}", number_hint)
        expected = math.sqrt(d_k * var_q * var_k)
        if math.isclose(actual, expected, rel_tol=1e-6):
            continue
        case = f"d_k={d_k}, var_q={var_q:.4g}, var_k={var_k:.4g}"
        mistakes = {
            math.sqrt(d_k): "Your divisor does not change with the variances. Redo the middle "
                            "line of the derivation: each product q_i k_i now has variance "
                            "var_q * var_k, not 1.",
            math.sqrt(d_k) * var_q * var_k: "You multiplied sqrt(d_k) by the variances "
                                            "themselves. The divisor is a standard deviation, "
                                            "so take the square root of the whole variance "
                                            "of q . k.",
            d_k * var_q * var_k: "That is the variance of q . k. Divide by its square root, "
                                 "the standard deviation, so that the variance becomes 1.",
            math.sqrt(d_k / (var_q * var_k)): "Your divisor grows when the entries get "
                                              "smaller. Smaller entries give smaller scores, "
                                              "which need a smaller divisor.",
            math.sqrt(d_k) / (var_q * var_k): "Your divisor grows when the entries get "
                                              "smaller. Smaller entries give smaller scores, "
                                              "which need a smaller divisor.",
            math.sqrt(d_k * (var_q + var_k)): "You added the two variances. The variance of a "
                                              "product of two independent numbers of mean 0 "
                                              "is the product of their variances.",
        }
        for candidate, hint in mistakes.items():
            if math.isclose(actual, candidate, rel_tol=1e-6):
                fail(f"q . k / c has variance 1 for {case}",
                     expected="a divisor that makes the variance of the scores 1",
                     actual=f"c = {actual:.4g}, which leaves the scores with variance "
                            f"{expected ** 2 / actual ** 2:.4g}", hint=hint)
        fail(f"q . k / c has variance 1 for {case}",
             expected="a divisor that makes the variance of the scores 1",
             actual=f"c = {actual:.4g}, which leaves the scores with variance "
                    f"{expected ** 2 / actual ** 2:.4g}" if actual else "c = 0",
             hint="Write Var(q . k) as a sum over the d_k products, use "
                  "Var(q_i k_i) = E[q_i^2] E[k_i^2], and divide by the square root of the "
                  "result.")
    # The same divisor, measured: scores of random vectors with these variances.
    torch.manual_seed(0)
    d_k, var_q, var_k = 64, 1 / 3, 1 / 3
    queries = torch.randn(20_000, d_k) * math.sqrt(var_q)  # (N, d_k)
    keys = torch.randn(20_000, d_k) * math.sqrt(var_k)  # (N, d_k)
    divisor = _as_float(call(fn, d_k, var_q, var_k), "the divisor", number_hint)
    measured = ((queries * keys).sum(dim=-1) / divisor).var().item()
    expect_true("random vectors with these variances give scores of variance 1",
                abs(measured - 1) < 0.1, expected="a variance within 0.1 of 1",
                actual=f"{measured:.3f}",
                hint="Check your divisor on random vectors in a cell of your own.")
    passed("c = sqrt(d_k * var_q * var_k), the standard deviation of q . k. For the outputs "
           "of a fresh nn.Linear (variance about 1/3) that is sqrt(d_k) / 3, not sqrt(d_k).")


# ---------------------------------------------------------------- exercise 4.2


def _entropy_at(scores: torch.Tensor, tau: float) -> float:
    weights = torch.softmax(scores.double() / tau, dim=-1)  # (T,)
    return -torch.special.xlogy(weights, weights).sum().item()


@checker
def check_temperature_for_entropy(fn) -> None:
    """Check ``fn(scores, target)`` returns tau with entropy of softmax(scores / tau) = target.

    The entropy (in nats) grows with the temperature, so bisection finds tau. The checker
    recognises an answer that multiplies by tau, one that measures entropy in bits, and a
    bisection that moves the wrong bound and ends at one end of its interval.

    Taught in chapter 4.
    """
    demo_scores = torch.tensor([-1.26, 1.98, 6.67, -1.21, -6.23, 3.12])  # (T,)
    torch.manual_seed(0)
    cases = [
        ("the demo's scores, half their entropy at tau = 4", demo_scores,
         _entropy_at(demo_scores, 4.0) / 2),
        ("the scores (2, 1, 0), entropy 0.5 nats", torch.tensor([2.0, 1.0, 0.0]), 0.5),
        ("16 random scores, entropy 2.0 nats", torch.randn(16) * 3, 2.0),
    ]
    number_hint = "Return tau as a float (or as a tensor that holds one number)."
    results = []
    for name, scores, target in cases:
        tau = _as_float(call(fn, scores.clone(), target, prop=f"your function runs on {name}"),
                        f"tau for {name}", number_hint)
        expect_true(f"tau is positive for {name}", tau > 0, expected="tau > 0",
                    actual=f"tau = {tau:.4g}",
                    hint="A temperature divides the scores, so it must be positive.")
        reached = _entropy_at(scores, tau)
        if abs(reached - target) <= 1e-4:
            results.append(tau)
            continue
        what = f"the entropy of softmax(scores / tau) equals the target for {name}"
        actual = f"tau = {tau:.4g} gives {reached:.4f} nats instead of {target:.4f}"
        expected = f"{target:.4f} nats (within 1e-4)"
        if abs(_entropy_at(scores, 1 / tau) - target) <= 1e-3:
            fail(what, expected=expected, actual=actual,
                 hint="Your tau would be right if the scores were multiplied by it. Divide "
                      "the scores by tau: a large temperature flattens the weights.")
        if abs(reached / math.log(2) - target) <= 1e-3:
            fail(what, expected=expected, actual=actual,
                 hint="Your entropy is measured in bits. Use the natural logarithm "
                      "(torch.log or torch.special.xlogy), so that it is in nats.")
        if reached < 0.01 or reached > math.log(scores.numel()) - 0.01:
            fail(what, expected=expected, actual=actual,
                 hint="Your search ended at one end of its interval. The entropy grows with "
                      "tau: when the entropy at the middle is below the target, the answer "
                      "lies above the middle, so raise the lower end.")
        fail(what, expected=expected, actual=actual,
             hint="Bisect: start from a low and a high tau, compute the entropy at their "
                  "middle, replace the low end when that entropy is below the target and the "
                  "high end otherwise, and repeat until the interval is tiny.")
    passed(f"tau = {results[0]:.3f} halves the entropy of the demo's scores at tau = 4; "
           "the entropy grows with tau, so bisection always finds it.")


# ---------------------------------------------------------------- exercise 4.3

#: One head of a layer with d_model = 64 split into 16 heads, so head_dim = d_k = 4.
_QUERY = [1.0, 1.0, 1.0, 1.0]
_KEYS = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]
_D_K, _D_MODEL = 4, 64


def _row(divisor: float, keys: list[list[float]] | None = None) -> torch.Tensor:
    """The weights of the exercise's one query over its three keys, scores divided by divisor."""
    scores = torch.tensor(keys or _KEYS, dtype=torch.float64) @ torch.tensor(
        _QUERY, dtype=torch.float64)  # (3,)
    return torch.softmax(scores / divisor, dim=-1)  # (3,)


def _as_rows(value: object) -> torch.Tensor:
    hint = "Return a list of three rows, each a list of three weights: [[...], [...], [...]]."
    try:
        tensor = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        fail("the prediction is three rows of three numbers", expected="shape (3, 3)",
             actual=type(value).__name__, hint=hint)
    if tuple(tensor.shape) != (3, 3):
        fail("the prediction is three rows of three numbers", expected=(3, 3),
             actual=tuple(tensor.shape), hint=hint)
    return tensor


_ROW_NAMES = ("row 0 (raw scores, no division)", "row 1 (the chapter's scale)",
              "row 2 (divided by sqrt(d_model))")


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_rows(fn) -> None:
    """Check the hand-computed weights of one query over three keys at three temperatures.

    The query ``(1, 1, 1, 1)`` of one head (``d_k = 4`` in a layer with ``d_model = 64``)
    meets the keys ``(1, 1, 1, 1)``, ``(1, 1, 0, 0)`` and ``(-1, 0, 0, 0)``. Row 0 divides
    the scores by 1, row 1 by the scale of chapter 4, row 2 by ``sqrt(d_model)``. The
    checker compares each row with the real softmax to the rounding of four decimals and
    names the usual slips (``d_k`` for its square root, ``d_model`` for ``d_k``, rows in
    another order, a wrong score) without printing the right numbers.

    Taught in chapter 4.
    """
    rows = _as_rows(call(fn, prop="predicted_rows() runs"))
    divisors = (1.0, math.sqrt(_D_K), math.sqrt(_D_MODEL))
    truth = torch.stack([_row(divisor) for divisor in divisors])  # (3, 3)

    def near(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-3) -> bool:
        return bool((a - b).abs().max() <= atol)

    row_sums = rows.sum(dim=-1)
    expect_true("each row of weights sums to 1", near(row_sums, torch.ones(3), 2e-3),
                expected="row sums 1, 1 and 1", actual=f"row sums {row_sums.tolist()}",
                hint="Divide each exponential by the sum of the three exponentials of its row.")
    for index, (name, divisor) in enumerate(zip(_ROW_NAMES, divisors, strict=True)):
        if near(rows[index], truth[index], 3e-4):
            continue
        mistakes = [
            (_row(float(_D_K)), f"You divided by d_k = {_D_K}. The chapter's scale is its "
                                "square root."),
            (_row(math.sqrt(_D_MODEL)), "These are the weights of the scores divided by "
                                        "sqrt(d_model) = 8. d_k is the size of one head's "
                                        "key, the number of entries in q, not the layer's "
                                        "width."),
            (_row(math.sqrt(_D_K)), "These are the weights with the chapter's scale, "
                                    "sqrt(d_k) = 2. Check which divisor this row asks for."),
            (_row(1.0), "These are the weights of the raw scores. Check which divisor this row "
                        "asks for."),
            (_row(divisor, [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]),
             "The third key's score is q . k = -1: its first entry is -1."),
        ]
        for candidate, hint in mistakes:
            if near(rows[index], candidate):
                fail(f"{name} holds softmax(scores / {divisor:g}), to 4 decimals",
                     expected="three weights that sum to 1",
                     actual=f"your row {rows[index].tolist()}", hint=hint)
        fail(f"{name} holds softmax(scores / {divisor:g}), to 4 decimals",
             expected="three weights that sum to 1", actual=f"your row {rows[index].tolist()}",
             hint="Write out the three scores q . k first (whole numbers), divide each by the "
                  "row's divisor, then exponentiate and normalise.")
    passed("raw scores (4, 2, -1) put 0.876 on the first key; the chapter's scale "
           "sqrt(d_k) = 2 leaves it 0.690, and sqrt(d_model) = 8 flattens the row to 0.432, "
           "0.337 and 0.231. Each weight ratio is e^(score gap / tau): the larger tau, the "
           "flatter the row.")
