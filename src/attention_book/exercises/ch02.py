"""Checkers for chapter 2's exercises (softmax and dot-product attention)."""

from __future__ import annotations

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, passed

__all__ = ["check_stable_softmax", "check_attend", "check_cosine_attention_weights"]


@checker
def check_stable_softmax(fn) -> None:
    """Check ``fn(x, dim=-1)`` is a softmax along ``dim`` that does not overflow.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    x = torch.randn(4, 5)  # (4, 5)
    expect_close(
        "softmax of small scores", call(fn, x), torch.softmax(x, dim=-1),
        hint="exp of each score divided by the sum of the exps of its row (dim=-1, keepdim=True)",
    )
    large = torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1002.0]])  # (2, 3)
    weights = call(fn, large)
    expect_shape("the softmax of large scores", weights, (2, 3),
                 hint="keep the input's shape")
    expect_true(
        "large scores give finite weights", bool(torch.isfinite(weights).all()),
        expected="finite numbers", actual=weights.tolist(),
        hint="subtract the row maximum (x.amax(dim=dim, keepdim=True)) before torch.exp",
    )
    expect_close(
        "softmax of large scores", weights, torch.softmax(large, dim=-1),
        hint="subtract the maximum of each row, not of the whole tensor",
    )
    batch = torch.randn(2, 3, 4) * 50  # (2, 3, 4)
    expect_close(
        "softmax along dim=1 of a (2, 3, 4) tensor", call(fn, batch, dim=1),
        torch.softmax(batch, dim=1),
        hint="use the dim argument both for the maximum and for the sum",
    )
    passed("your softmax matches torch.softmax, along any dim, even for scores of 1000.")


@checker
def check_attend(fn) -> None:
    """Check ``fn(queries, memory)`` returns dot-product context vectors and weights.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    queries = torch.randn(3, 4)  # (T_q, d)
    memory = torch.randn(5, 4)  # (T_k, d)
    result = call(fn, queries, memory)
    expect_true(
        "attend returns a pair", isinstance(result, tuple) and len(result) == 2,
        expected="(context_vecs, attn_weights)", actual=type(result).__name__,
        hint="end with `return context_vecs, attn_weights`",
    )
    context_vecs, attn_weights = result
    expected_weights = torch.softmax(queries @ memory.T, dim=-1)  # (T_q, T_k)
    expect_shape("attn_weights", attn_weights, (3, 5),
                 hint="one row per query and one column per memory token: queries @ memory.T")
    expect_close(
        "each row of attn_weights sums to 1", attn_weights.sum(dim=-1), torch.ones(3),
        hint="apply the softmax over the memory tokens, the last dim (dim=-1)",
    )
    expect_close("attn_weights", attn_weights, expected_weights,
                 hint="scores are queries @ memory.T, with no scaling")
    expect_close(
        "context_vecs", context_vecs, expected_weights @ memory,
        hint="weight the memory vectors: attn_weights @ memory, shape (T_q, d)",
    )
    passed("every query gets a weighted sum of the memory, with weights from dot products.")


@checker
def check_cosine_attention_weights(fn) -> None:
    """Check ``fn(x)`` is the softmax of cosine similarities, so length cannot matter.

    Taught in chapter 2.
    """
    torch.manual_seed(0)
    x = torch.randn(5, 3)  # (T, d)
    unit = x / x.norm(dim=-1, keepdim=True)  # (T, d)
    expected = torch.softmax(unit @ unit.T, dim=-1)  # (T, T)
    expect_close(
        "the cosine attention weights", call(fn, x), expected,
        hint="normalise every row to length 1 before the dot products, then softmax over dim=-1",
    )
    longer = x.clone()
    longer[2] = 10.0 * x[2]  # same direction, ten times as long
    expect_close(
        "the weights do not change when one vector gets longer", call(fn, longer), expected,
        hint="normalise each row by its own norm: x.norm(dim=-1, keepdim=True)",
    )
    passed("only the directions of the vectors decide the weights, not their lengths.")
