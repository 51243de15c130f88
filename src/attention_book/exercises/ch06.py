"""Checkers for chapter 6's exercises (dropout on the attention weights)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .feedback import (
    call,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    on_cpu,
    passed,
)

__all__ = ["check_drop_keys", "check_draws_needed", "check_fixed_dropout_layer",
           "check_weights_with_dropout"]


def _test_weights(seed: int, num_queries: int = 100, num_keys: int = 100) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.softmax(torch.randn(num_queries, num_keys), dim=-1)  # every entry > 0


def _check_rate_and_scale(name: str, dropped: torch.Tensor, survivors: torch.Tensor, p: float,
                          unit: str) -> None:
    """Fail unless about a fraction p of the units is dropped and the survivors are scaled right.

    ``dropped`` is a boolean per unit (a weight, or a key's column); ``survivors`` holds the
    ratios output / input of the kept entries.
    """
    fraction = dropped.double().mean().item()
    # The number of dropped units is Binomial(n, p): allow five standard errors.
    tolerance = 5 * math.sqrt(p * (1 - p) / dropped.numel())
    # At p = 0.5 keeping and dropping have the same rate and 1 / p = 1 / (1 - p), so
    # those two mistakes can only be told apart for other values of p.
    symmetric = math.isclose(p, 0.5)
    if not symmetric and abs(fraction - (1 - p)) < tolerance:
        fail(f"{name}: each {unit} is dropped with probability p={p}",
             expected=f"about {p:.0%} dropped", actual=f"{fraction:.1%} dropped",
             hint="You dropped with probability 1 - p. Keep a unit when torch.rand(...) >= p, "
                  "so that it is dropped with probability p.")
    expect_true(f"{name}: each {unit} is dropped with probability p={p}",
                abs(fraction - p) < tolerance,
                expected=f"{p:.0%} dropped (within {tolerance:.1%} for {dropped.numel()} "
                         f"{unit}s)",
                actual=f"{fraction:.1%} dropped",
                hint="Draw one uniform number per unit with torch.rand and drop the unit when "
                     "the number is below p.")
    factor = 1 / (1 - p)
    if not symmetric and survivors.numel() \
            and torch.allclose(survivors, torch.full_like(survivors, 1 / p), rtol=1e-4):
        fail(f"{name}: the survivors are scaled by 1 / (1 - p)",
             expected=f"factor {factor:.4f}", actual=f"factor 1 / p = {1 / p:.4f}",
             hint="A weight survives with probability 1 - p, so divide it by (1 - p) to keep "
                  "its expected value: (1 - p) * w / (1 - p) = w.")
    if survivors.numel() and torch.allclose(survivors, torch.ones_like(survivors), rtol=1e-4):
        fail(f"{name}: the survivors are scaled by 1 / (1 - p)",
             expected=f"factor {factor:.4f}", actual="factor 1 (not scaled)",
             hint="Without scaling, the expected weight shrinks to (1 - p) * w. Divide the kept "
                  "weights by (1 - p).")
    expect_true(f"{name}: the survivors are scaled by 1 / (1 - p)",
                bool(survivors.numel())
                and torch.allclose(survivors, torch.full_like(survivors, factor), rtol=1e-4),
                expected=f"every kept weight multiplied by {factor:.4f}",
                actual=(f"factors between {survivors.min().item():.4f} and "
                        f"{survivors.max().item():.4f}") if survivors.numel() else "nothing kept",
                hint="Multiply the kept weights by 1 / (1 - p) and leave nothing else changed.")


def _check_elementwise_dropout(name: str, actual: torch.Tensor, weights: torch.Tensor,
                               p: float) -> None:
    kept = actual != 0
    survivors = (actual.detach().double() / weights.double())[kept]
    _check_rate_and_scale(name, ~kept, survivors, p, "weight")


# ---------------------------------------------------------------- exercise 6.1


@checker
def check_drop_keys(fn) -> None:
    """Check ``fn(weights, p)`` drops whole keys (columns) with probability p, scaled by 1/(1-p).

    A dropped key is zeroed for every query, so the zeros of the result fill whole columns
    of the ``(T_q, T_k)`` weights. The checker seeds PyTorch's global generator before each
    call and names the usual slips: single weights dropped, whole queries (rows) dropped,
    the wrong rate, and the wrong scale.

    Taught in chapter 6.
    """
    for p in (0.1, 0.5):
        weights = _test_weights(0, num_queries=20, num_keys=2_000)  # (T_q, T_k)
        torch.manual_seed(1)
        actual = call(fn, weights.clone(), p, prop=f"your function runs with p={p}")
        expect_shape(f"the weight matrix after dropping keys with p={p}", actual, weights.shape,
                     hint="Dropping keys keeps the shape of the weights (T_q, T_k).")
        zero = actual.detach() == 0  # (T_q, T_k)
        column_dropped, column_kept = zero.all(dim=0), (~zero).all(dim=0)  # (T_k,)
        if not bool((column_dropped | column_kept).all()):
            rows_whole = bool((zero.all(dim=1) | (~zero).all(dim=1)).all())
            if rows_whole and zero.any():
                fail(f"p={p}: a dropped key is zeroed for every query (whole columns)",
                     expected="columns that are all zero or all kept",
                     actual="whole rows are zero: you dropped queries",
                     hint="The rows are the queries and the columns, the last dim, are the keys. "
                          "Draw one decision per key, a mask of shape (1, T_k).")
            fail(f"p={p}: a dropped key is zeroed for every query (whole columns)",
                 expected="columns that are all zero or all kept",
                 actual=f"{int((~(column_dropped | column_kept)).sum())} of "
                        f"{weights.size(-1)} columns are partly zero",
                 hint="You dropped single weights, as nn.Dropout does. Draw one keep-or-drop "
                      "decision per key, a mask of shape (1, T_k), and let it broadcast over the "
                      "queries.")
        survivors = (actual.detach().double() / weights.double())[:, column_kept]
        _check_rate_and_scale(f"p={p}", column_dropped, survivors.flatten(), p, "key")
    weights = _test_weights(2, num_queries=5, num_keys=7)
    torch.manual_seed(3)
    expect_close("the weight matrix with p=0 (nothing dropped)", call(fn, weights.clone(), 0.0),
                 weights,
                 hint="With p=0 every key survives and the factor is 1 / (1 - 0) = 1.")
    passed("a dropped key disappears for every query, and the kept keys are scaled by "
           "1 / (1 - p), so every weight keeps its expected value.")


# ---------------------------------------------------------------- exercise 6.2


@checker
def check_draws_needed(fn) -> None:
    """Check ``fn(p, relative_tolerance, z)`` returns the fewest draws for the tolerance.

    ``z`` standard errors of the mean of ``n`` dropped-out copies of a weight ``w`` are
    ``z * w * sqrt(p / ((1 - p) * n))``; the answer is the smallest whole ``n`` for which
    this is at most ``relative_tolerance * w``, that is
    ``ceil(z**2 * p / ((1 - p) * relative_tolerance**2))``.

    Taught in chapter 6.
    """
    cases = [(0.1, 0.01, 5.0), (0.3, 0.02, 4.0), (0.5, 0.035, 5.0), (0.2, 0.07, 3.0)]
    for p, tolerance, z in cases:
        exact = z**2 * p / ((1 - p) * tolerance**2)
        expected = math.ceil(exact)
        actual = call(fn, p, tolerance, z, prop=f"your function runs for p={p}, "
                                                f"relative_tolerance={tolerance}, z={z}")
        if isinstance(actual, torch.Tensor) and actual.numel() == 1:
            actual = actual.item()
        if isinstance(actual, bool) or not isinstance(actual, (int, float)):
            fail("the number of draws is a number", expected="an int",
                 actual=type(actual).__name__,
                 hint="Return the number of draws as a whole number, an int.")
        what = f"the fewest draws for p={p}, relative tolerance {tolerance}, z={z}"
        if actual == expected:
            continue
        if math.isclose(actual, exact, rel_tol=1e-9):
            fail(what, expected="a whole number of draws", actual=f"{actual:.6g}",
                 hint="A number of draws is a whole number. Round up with math.ceil: rounding "
                      "down would leave the tolerance slightly too large.")
        if actual == math.floor(exact):
            fail(what, expected="the smallest n whose tolerance is small enough",
                 actual=f"{actual}, whose tolerance is still slightly too large",
                 hint="You rounded down. Round up with math.ceil, so that the tolerance is at "
                      "most the one asked for.")
        mistakes = [
            (z * p / ((1 - p) * tolerance),
             "You did not square z and the tolerance. The standard error shrinks like "
             "1 / sqrt(n), so solving z * sqrt(p / ((1 - p) * n)) <= r for n squares both."),
            (z**2 * p * (1 - p) / tolerance**2,
             "Your variance leaves out the 1 / (1 - p) scaling. A kept weight is w / (1 - p), "
             "so one draw has variance w**2 * p / (1 - p)."),
            (z**2 * (1 - p) / (p * tolerance**2),
             "You swapped p and 1 - p. Here p is the probability of dropping a weight."),
            (z * math.sqrt(p / (1 - p)) / tolerance,
             "You solved for sqrt(n). Square the result: n = (z / r)**2 * p / (1 - p)."),
        ]
        for candidate, hint in mistakes:
            if abs(actual - candidate) <= 1:
                fail(what, expected="the smallest n whose tolerance is small enough",
                     actual=f"{actual}", hint=hint)
        achieved = z * math.sqrt(p / ((1 - p) * actual)) if actual > 0 else math.inf
        fail(what, expected="the smallest n whose tolerance is small enough",
             actual=f"{actual}, whose relative tolerance is {achieved:.4g} instead of "
                    f"{tolerance}",
             hint="Set z * sqrt(p / ((1 - p) * n)) equal to the relative tolerance, solve for n "
                  "and round up.")
    passed("n = ceil(z**2 * p / ((1 - p) * r**2)): 27 778 draws for a tolerance of 1 % at "
           "p = 0.1 with z = 5. Halving the tolerance takes four times the draws.")


# ---------------------------------------------------------------- exercise 6.3


def _plain_causal_attention(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's output without any dropout, from its own projections."""
    queries, keys, values = layer.W_query(x), layer.W_key(x), layer.W_value(x)  # (B, T, d)
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(keys.size(-1))  # (B, T, T)
    causal = torch.ones(x.size(-2), x.size(-2), dtype=torch.bool).tril()  # (T, T)
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ values


@checker
def check_fixed_dropout_layer(fn) -> None:
    """Check ``fn(d_in, d_out, context_length, dropout)`` builds a layer whose dropout obeys eval().

    The layer must be plain causal attention in ``eval()`` mode (deterministic, no dropout)
    and random again after ``train()``, every time the mode is switched.

    Taught in chapter 6.
    """
    torch.manual_seed(0)
    layer = call(fn, 4, 4, 6, 0.5, prop="your function runs for d_in=4, d_out=4, "
                                        "context_length=6, dropout=0.5")
    expect_true("your function returns the layer, an nn.Module", isinstance(layer, nn.Module),
                expected="an nn.Module", actual=type(layer).__name__,
                hint="Return the fixed layer itself, not its output.")
    missing = [name for name in ("W_query", "W_key", "W_value") if not hasattr(layer, name)]
    expect_true("the layer keeps its projections W_query, W_key and W_value", not missing,
                expected="the attributes W_query, W_key and W_value", actual=f"{missing} missing",
                hint="Fix the bug and keep the rest of the layer as it is.")
    torch.manual_seed(1)
    x = torch.randn(2, 6, 4)  # (B, T, d_in)
    for round_trip in (1, 2):
        layer.eval()
        with torch.no_grad():
            torch.manual_seed(2)
            first = call(layer, x, prop="the layer runs on a (2, 6, 4) batch")
            second = on_cpu(layer(x))  # where call() puts the first
        expect_true("in eval() mode two calls on the same input agree",
                    isinstance(first, torch.Tensor) and torch.equal(first, second),
                    expected="the same output twice", actual="two different outputs",
                    hint="In eval() mode dropout is still on. Find out which modules eval() "
                         "reaches: list(layer.modules()) shows them. Compare that list with the "
                         "dropout modules the forward pass uses.")
        with torch.no_grad():
            reference = _plain_causal_attention(layer, x)
        expect_close("the eval() output (plain causal attention, no dropout)", first, reference,
                     hint="In eval() mode the layer computes plain causal attention: the softmax "
                          "of the masked, scaled scores, times the values. Change only what "
                          "keeps dropout on.")
        layer.train()
        with torch.no_grad():
            torch.manual_seed(3)
            first, second = layer(x), layer(x)
        expect_true(f"after train() (switch {round_trip}) two calls differ: dropout acts again",
                    not torch.equal(first, second), expected="two different outputs",
                    actual="the same output twice",
                    hint="Dropout must still act in training. Keep both dropouts, and let "
                         "train() and eval() reach them rather than switching them by hand once.")
    passed("the dropouts are registered with the layer, so eval() switches them off and train() "
           "back on.")


# ---------------------------------------------------------------- exercise 6.4


@checker
def check_weights_with_dropout(fn) -> None:
    """Check ``fn(scores, p, training)``: softmax, then dropout only when ``training`` is True.

    Taught in chapter 6.
    """
    torch.manual_seed(0)
    scores = torch.randn(100, 100)  # (T_q, T_k)
    weights = torch.softmax(scores, dim=-1)  # (T_q, T_k)
    torch.manual_seed(1)
    evaluated = call(fn, scores.clone(), 0.5, False, prop="your function runs with training=False")
    expect_shape("the weight matrix", evaluated, weights.shape,
                 hint="Return weights of the shape of the scores.")
    expect_close("the weight matrix in evaluation (training=False)",
                 evaluated, weights,
                 hint="Apply no dropout in evaluation: pass training=training to F.dropout, "
                      "whose training argument defaults to True, and build no nn.Dropout inside "
                      "the function (a new one is in training mode). The result is the plain "
                      "softmax.")
    torch.manual_seed(1)
    trained = call(fn, scores.clone(), 0.5, True, prop="your function runs with training=True")
    expect_shape("the weight matrix in training", trained, weights.shape,
                 hint="Return weights of the shape of the scores.")
    if not (trained == 0).any():
        fail("dropout comes after the softmax, so some weights are exactly 0",
             expected="about half of the weights equal to 0", actual="no zero weights",
             hint="Apply the softmax first, then dropout. A dropped score still gets exp(0) in "
                  "the softmax, so dropping before it zeroes nothing.")
    _check_elementwise_dropout("training=True, p=0.5", trained, weights, 0.5)
    passed("softmax first, then dropout in training only; evaluation is deterministic.")
