"""Checkers for chapter 4's exercises (why scale by sqrt(d_k))."""

from __future__ import annotations

import math

import torch

from ._feedback import call, checker, expect_true, fail, passed

__all__ = ["check_unit_variance_divisor", "check_temperature_for_entropy",
           "check_predicted_attention"]


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

_QUERIES = [[1.0, 0.0], [0.0, 1.0]]
_KEYS = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
_VALUES = [1.0, 2.0, 3.0]


def _hand_example_weights(divisor: float, dim: int = -1) -> torch.Tensor:
    scores = torch.tensor(_QUERIES, dtype=torch.float64) @ torch.tensor(
        _KEYS, dtype=torch.float64).T  # (2, 3)
    return torch.softmax(scores / divisor, dim=dim)  # (2, 3)


def _as_tensor(value: object, shape: tuple[int, ...], what: str) -> torch.Tensor:
    hint = (f"Return the {what} as a nested list or tensor of {shape[0]} "
            + ("rows of 3 numbers." if len(shape) == 2 else "numbers."))
    try:
        tensor = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        fail(f"{what} are numbers", expected=f"shape {shape}", actual=type(value).__name__,
             hint=hint)
    if len(shape) == 1 and tensor.numel() == shape[0]:
        tensor = tensor.flatten()
    if tuple(tensor.shape) != shape:
        fail(f"the {what} have shape {shape}", expected=shape, actual=tuple(tensor.shape),
             hint=hint)
    return tensor


@checker
def check_predicted_attention(fn) -> None:
    """Check the hand-computed weights and outputs of a 2-query, 3-key attention.

    ``Q = [[1, 0], [0, 1]]``, ``K = [[1, 0], [0, 1], [1, 1]]``, values ``(1, 2, 3)``,
    ``d_k = 2``. The checker compares the prediction with the real computation to the
    rounding of four decimals and names the usual slips (no scale, the scale ``1 / d_k``,
    a softmax over the queries, outputs that do not follow from the weights) without
    printing the right numbers.

    Taught in chapter 4.
    """
    answer = call(fn, prop="predicted_attention() runs")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        fail("predicted_attention() returns a pair (weights, outputs)",
             expected="a pair (weights, outputs)", actual=type(answer).__name__,
             hint="End the function with: return weights, outputs")
    weights = _as_tensor(answer[0], (2, 3), "weights")
    outputs = _as_tensor(answer[1], (2,), "outputs")
    true_weights = _hand_example_weights(math.sqrt(2))
    values = torch.tensor(_VALUES, dtype=torch.float64)

    def near(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
        return bool((a - b).abs().max() <= atol)

    if not near(weights, true_weights, 3e-4):
        mistakes = [
            (_hand_example_weights(1.0), "These are the weights of the raw scores. Divide each "
                                         "score by sqrt(d_k) = sqrt(2), about 1.4142, before "
                                         "the softmax."),
            (_hand_example_weights(2.0), "You divided the scores by d_k = 2. The scale is "
                                         "sqrt(d_k), about 1.4142."),
            (_hand_example_weights(math.sqrt(2), dim=0), "Your columns sum to 1. Each row "
                                                         "belongs to one query, so normalise "
                                                         "over the three keys of a row."),
            (true_weights.flip(0), "Your two rows are swapped. Row i holds the weights of "
                                   "query i, so row 0 belongs to the query (1, 0)."),
        ]
        for candidate, hint in mistakes:
            if near(weights, candidate, 1e-3):
                fail("the weights are softmax(Q K^T / sqrt(d_k)) over the keys, to 4 decimals",
                     expected="two rows of weights, each summing to 1",
                     actual=f"your weights {weights.tolist()}", hint=hint)
        row_sums = weights.sum(dim=-1)
        expect_true("each row of weights sums to 1", near(row_sums, torch.ones(2), 2e-3),
                    expected="row sums 1 and 1", actual=f"row sums {row_sums.tolist()}",
                    hint="Divide each exponential by the sum of the exponentials of its row.")
        fail("the weights are softmax(Q K^T / sqrt(d_k)) over the keys, to 4 decimals",
             expected="two rows of weights, each summing to 1",
             actual=f"your weights {weights.tolist()}",
             hint="Write out the two rows of scores q . k first: each holds only two different "
                  "numbers. Divide them by sqrt(2), then exponentiate and normalise each row.")
    if not near(outputs, true_weights @ values, 2e-3):
        fail("the outputs are the weighted sums sum_j w_ij v_j of the values (1, 2, 3)",
             expected="two numbers that follow from your (right) weights",
             actual=f"your outputs {outputs.tolist()}",
             hint="Your weights are right. Multiply each weight of a row by the value of its "
                  "key and add the three products.")
    passed("the weights are (0.4011, 0.1978, 0.4011) and (0.1978, 0.4011, 0.4011); the outputs "
           "are 2.0000 and 2.2033. The key (1, 1) gets the same weight as the matching key: "
           "its score is as large.")
