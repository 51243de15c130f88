"""Checkers for chapter 4's exercises (why scale by sqrt(d_k))."""

from __future__ import annotations

import math

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_scaled_scores", "check_softmax_entropy", "check_softmax_jacobian"]


def _matches(actual: torch.Tensor, candidate: torch.Tensor) -> bool:
    return (
        isinstance(actual, torch.Tensor)
        and actual.shape == candidate.shape
        and torch.allclose(actual.detach().to(candidate.dtype), candidate, atol=1e-5, rtol=1e-4)
    )


@checker
def check_scaled_scores(fn) -> None:
    """Check ``fn(queries, keys)`` returns ``queries @ keys^T / sqrt(d_k)`` for batched heads.

    The test input has the multi-head layout ``(B, num_heads, T, head_dim)``, so
    dividing by the model width, by the number of elements or by ``T`` gives
    different numbers from dividing by the per-head key size, and the feedback
    names the mistake.

    Taught in chapter 4.
    """
    batch, num_heads, num_tokens, head_dim = 2, 4, 5, 8
    torch.manual_seed(0)
    queries = torch.randn(batch, num_heads, num_tokens, head_dim)  # (B, num_heads, T, head_dim)
    keys = torch.randn(batch, num_heads, num_tokens, head_dim)  # (B, num_heads, T, head_dim)
    raw = queries @ keys.transpose(-2, -1)  # (B, num_heads, T, T)
    expected = raw / math.sqrt(head_dim)
    shape_hint = (
        "multiply the queries by the keys transposed on their last two dims: "
        "keys.transpose(-2, -1), so the result is (..., T_q, T_k)"
    )
    actual = call(fn, queries, keys,
                  prop="your function runs on queries and keys of shape (2, 4, 5, 8)")
    expect_shape("the scores of a (2, 4, 5, 8) query/key batch", actual, expected.shape,
                 hint=shape_hint)
    wrong_divisors = {
        "no scaling at all": (raw, "divide the dot products by math.sqrt(d_k)"),
        "dividing by d_k instead of sqrt(d_k)": (
            raw / head_dim, "take the square root: the *standard deviation* grows like sqrt(d_k)"),
        "dividing by sqrt(number of elements)": (
            raw / math.sqrt(queries.numel()),
            "queries.numel() counts every element of the batch; d_k is queries.size(-1)"),
        "dividing by sqrt(d_model = num_heads * head_dim)": (
            raw / math.sqrt(num_heads * head_dim),
            "d_k is the per-head key size, queries.size(-1), not the model width"),
        "dividing by sqrt(T)": (
            raw / math.sqrt(num_tokens),
            "queries.size(-2) is the number of tokens; d_k is the last dim, queries.size(-1)"),
    }
    for mistake, (candidate, hint) in wrong_divisors.items():
        if _matches(actual, candidate):
            fail("the scores are divided by sqrt(d_k)", expected="queries @ keys^T / sqrt(8)",
                 actual=mistake, hint=hint)
    expect_close("the scaled scores", actual, expected, hint=shape_hint)
    torch.manual_seed(1)
    queries_2d = torch.randn(3, 16)  # (T_q, d_k)
    keys_2d = torch.randn(6, 16)  # (T_k, d_k)
    expect_close("the scaled scores of a (3, 16) query and (6, 16) key matrix",
                 call(fn, queries_2d, keys_2d), queries_2d @ keys_2d.T / 4.0,
                 hint="use transpose(-2, -1) rather than .T so the code also works on 2-D input")
    passed("the dot products are divided by sqrt(d_k), the per-head key size.")


@checker
def check_softmax_entropy(fn) -> None:
    """Check ``fn(weights)`` returns the entropy (in nats) of each row, with 0 * log 0 = 0.

    Taught in chapter 4.
    """
    hint = "entropy = -(weights * log(weights)).sum(dim=-1); torch.special.xlogy(w, w) is 0 at w=0"
    uniform = torch.full((2, 8), 1 / 8)  # (2, 8)
    actual = call(fn, uniform)
    expect_shape("the entropy of a (2, 8) batch of rows", actual, (2,),
                 hint="sum over the last dim only, so one number per row remains")
    expect_close("the entropy of a uniform row over 8 tokens", actual,
                 torch.full((2,), math.log(8)),
                 hint="use the natural logarithm (torch.log), and negate the sum")
    one_hot = torch.eye(4)  # (4, 4)
    actual = call(fn, one_hot)
    expect_true("a one-hot row has entropy 0, not NaN",
                isinstance(actual, torch.Tensor) and not torch.isnan(actual).any(),
                expected="tensor([0., 0., 0., 0.])", actual=actual,
                hint="0 * log(0) is 0 * -inf = NaN in floating point; " + hint)
    expect_close("the entropy of one-hot rows", actual, torch.zeros(4), hint=hint)
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(3, 5, 7), dim=-1)  # (3, 5, 7)
    expected = -(weights * torch.log(weights)).sum(dim=-1)  # (3, 5)
    expect_close("the entropy of random softmax rows", call(fn, weights), expected, hint=hint)
    passed("entropy is log(T) for a uniform row and 0 for a one-hot row.")


@checker
def check_softmax_jacobian(fn) -> None:
    """Check ``fn(weights)`` returns the softmax Jacobian ``diag(w) - w w^T`` of a 1-D ``w``.

    Taught in chapter 4.
    """
    torch.manual_seed(0)
    scores = torch.randn(5)  # (T,)
    weights = torch.softmax(scores, dim=-1)  # (T,)
    expected = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, dim=-1), scores)
    actual = call(fn, weights)
    expect_shape("the Jacobian of a softmax over 5 scores", actual, (5, 5),
                 hint="d weights_i / d scores_j is a (T, T) matrix: torch.outer(w, w) is (T, T)")
    if _matches(actual, torch.diag(weights)):
        fail("the Jacobian has off-diagonal terms", expected="diag(w) - outer(w, w)",
             actual="diag(w) only",
             hint="raising one score lowers every other weight: subtract torch.outer(w, w)")
    if _matches(actual, -expected):
        fail("the Jacobian has the right sign", expected="diag(w) - outer(w, w)",
             actual="outer(w, w) - diag(w)",
             hint="raising score i raises weight i, so the diagonal must be positive")
    expect_close("the Jacobian (compared with torch.autograd.functional.jacobian)", actual,
                 expected, hint="torch.diag(w) - torch.outer(w, w)")
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    expect_close("the Jacobian of a one-hot weight vector", call(fn, one_hot), torch.zeros(3, 3),
                 hint="at a one-hot vector every entry of diag(w) - outer(w, w) is 0")
    passed("diag(w) - w w^T: it is all zeros when the weights are one-hot, "
           "so no gradient flows back to the scores.")
