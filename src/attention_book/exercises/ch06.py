"""Checkers for chapter 6's exercises (dropout on the attention weights)."""

from __future__ import annotations

import math

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_inverted_dropout", "check_mean_tolerance", "check_weights_with_dropout"]


def _test_weights(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.softmax(torch.randn(100, 100), dim=-1)  # (100, 100), every entry > 0


def _survivor_factors(actual: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The distinct values of actual / weights among the entries that were kept."""
    ratios = (actual.detach().double() / weights.double())[actual != 0]
    return ratios


def _check_dropout_pattern(name: str, actual: torch.Tensor, weights: torch.Tensor, p: float,
                           hint: str) -> None:
    """Fail unless about a fraction p is zero and every survivor is weight / (1 - p)."""
    num_entries = weights.numel()
    zero_fraction = (actual == 0).double().mean().item()
    # The count of zeros is Binomial(n, p): allow five standard errors.
    tolerance = 5 * math.sqrt(p * (1 - p) / num_entries)
    # At p = 0.5 keeping and dropping have the same rate and 1 / p = 1 / (1 - p), so
    # those two mistakes can only be told apart for other values of p.
    symmetric = math.isclose(p, 0.5)
    if not symmetric and abs(zero_fraction - (1 - p)) < tolerance:
        fail(f"{name}: each weight is zeroed with probability p={p}",
             expected=f"about {p:.0%} zeros", actual=f"{zero_fraction:.1%} zeros",
             hint="you dropped with probability 1 - p: keep an entry when torch.rand(...) >= p")
    expect_true(f"{name}: each weight is zeroed with probability p={p}",
                abs(zero_fraction - p) < tolerance,
                expected=f"{p:.0%} zeros (within {tolerance:.1%} for {num_entries} entries)",
                actual=f"{zero_fraction:.1%} zeros", hint=hint)
    factors = _survivor_factors(actual, weights)
    if not symmetric and factors.numel() \
            and torch.allclose(factors, torch.full_like(factors, 1 / p), rtol=1e-4):
        fail(f"{name}: the survivors are scaled by 1 / (1 - p)",
             expected=f"factor {1 / (1 - p):.4f}", actual=f"factor 1 / p = {1 / p:.4f}",
             hint="a weight survives with probability 1 - p, so divide by (1 - p) to keep "
                  "its expected value: (1 - p) * w / (1 - p) = w")
    if factors.numel() and torch.allclose(factors, torch.ones_like(factors), rtol=1e-4):
        fail(f"{name}: the survivors are scaled by 1 / (1 - p)",
             expected=f"factor {1 / (1 - p):.4f}", actual="factor 1 (not scaled)",
             hint="without scaling the expected weight shrinks to (1 - p) * w; divide by (1 - p)")
    expect_true(f"{name}: the survivors are scaled by 1 / (1 - p)",
                bool(factors.numel())
                and torch.allclose(factors, torch.full_like(factors, 1 / (1 - p)), rtol=1e-4),
                expected=f"every kept entry equal to weight * {1 / (1 - p):.4f}",
                actual=f"factors between {factors.min().item():.4f} and "
                       f"{factors.max().item():.4f}" if factors.numel() else "no kept entries",
                hint="multiply the kept entries by 1 / (1 - p) and leave nothing else changed")


@checker
def check_inverted_dropout(fn) -> None:
    """Check ``fn(weights, p)`` zeroes each entry with probability p and scales the rest by 1/(1-p).

    The checker seeds PyTorch's global generator before each call, so use
    ``torch.rand`` (or ``torch.bernoulli``) without a generator of your own.

    Taught in chapter 6.
    """
    hint = "keep = torch.rand(weights.shape) >= p; return weights * keep / (1 - p)"
    for p in (0.1, 0.5):
        weights = _test_weights(0)
        torch.manual_seed(1)
        actual = call(fn, weights, p, prop=f"your function runs with p={p}")
        expect_shape(f"dropout with p={p} of (100, 100) weights", actual, weights.shape,
                     hint="dropout keeps the shape of its input")
        _check_dropout_pattern(f"p={p}", actual, weights, p, hint)
    weights = _test_weights(2)
    torch.manual_seed(3)
    expect_close("dropout with p=0 (nothing dropped)", call(fn, weights, 0.0), weights,
                 hint="with p=0 every entry survives and the factor is 1 / (1 - 0) = 1")
    passed("about p of the weights are zeroed and the survivors scaled by 1 / (1 - p), "
           "so every weight keeps its expected value.")


@checker
def check_mean_tolerance(fn) -> None:
    """Check ``fn(weight, p, num_draws, z)`` returns ``z`` standard errors of the dropout mean.

    A weight ``w`` after dropout is ``w / (1 - p)`` with probability ``1 - p`` and 0
    otherwise: its variance is ``w**2 * p / (1 - p)``, so the mean of ``num_draws``
    independent draws has standard error ``w * sqrt(p / ((1 - p) * num_draws))``.

    Taught in chapter 6.
    """
    cases = [(0.5, 0.1, 10_000, 5.0), (0.2, 0.5, 400, 3.0), (1.0, 0.25, 1_000_000, 4.0)]
    for weight, p, num_draws, z in cases:
        expected = z * weight * math.sqrt(p / ((1 - p) * num_draws))
        actual = call(fn, weight, p, num_draws, z)
        try:
            actual = float(actual)
        except (TypeError, ValueError):
            fail("the tolerance is a number", expected="a float", actual=type(actual).__name__,
                 hint="return a Python float (or a 0-d tensor)")
        if math.isclose(actual, z * weight * math.sqrt(p * (1 - p) / num_draws), rel_tol=1e-6):
            fail("the variance includes the 1 / (1 - p) scaling",
                 expected=f"{expected:.6g}", actual=f"{actual:.6g}",
                 hint="the kept value is w / (1 - p), not w: Var = w**2 * p / (1 - p)")
        if math.isclose(actual, z * weight * p / ((1 - p) * num_draws), rel_tol=1e-6) or \
                math.isclose(actual, z * weight * math.sqrt(p / (1 - p)) / num_draws, rel_tol=1e-6):
            fail("the tolerance shrinks like 1 / sqrt(num_draws)",
                 expected=f"{expected:.6g}", actual=f"{actual:.6g}",
                 hint="the standard error of a mean is the standard deviation / sqrt(num_draws)")
        expect_true(f"the tolerance for w={weight}, p={p}, {num_draws} draws, z={z}",
                    math.isclose(actual, expected, rel_tol=1e-6),
                    expected=f"{expected:.6g}", actual=f"{actual:.6g}",
                    hint="z * w * sqrt(p / ((1 - p) * num_draws))")
    passed("the tolerance is z standard errors, w * sqrt(p / ((1 - p) n)): "
           "four times the draws halve it.")


@checker
def check_weights_with_dropout(fn) -> None:
    """Check ``fn(scores, p, training)``: softmax, then dropout only when ``training`` is True.

    Taught in chapter 6.
    """
    torch.manual_seed(0)
    scores = torch.randn(100, 100)  # (T_q, T_k)
    weights = torch.softmax(scores, dim=-1)  # (T_q, T_k)
    torch.manual_seed(1)
    evaluated = call(fn, scores, 0.5, False, prop="your function runs with training=False")
    expect_shape("the weights", evaluated, weights.shape,
                 hint="the weights have the shape of the scores")
    expect_close("in evaluation (training=False) the weights are the plain softmax", evaluated,
                 weights,
                 hint="no dropout in evaluation: F.dropout(w, p, training=training); note that "
                      "F.dropout's training argument defaults to True")
    torch.manual_seed(1)
    trained = call(fn, scores, 0.5, True, prop="your function runs with training=True")
    expect_shape("the weights in training", trained, weights.shape,
                 hint="the weights have the shape of the scores")
    if not (trained == 0).any():
        fail("dropout comes after the softmax, so some weights are exactly 0",
             expected="about half of the weights equal to 0", actual="no zero weights",
             hint="apply the softmax first, then dropout: a dropped score still gets exp(0) "
                  "in the softmax, so dropping before it zeroes nothing")
    _check_dropout_pattern("training=True, p=0.5", trained, weights, 0.5,
                           hint="attn_weights = torch.softmax(scores, dim=-1), then "
                                "torch.nn.functional.dropout(attn_weights, p, training=training)")
    passed("softmax first, then dropout in training only; evaluation is deterministic.")
