"""Checkers for chapter 7's exercises (multi-head and grouped-query attention)."""

from __future__ import annotations

import numbers

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_mha_param_count",
    "check_expand_kv",
]


def _numbered(*shape: int) -> torch.Tensor:
    """A float tensor whose entries are 0, 1, 2, ... so every position is recognisable."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)


@checker
def check_split_heads(fn) -> None:
    """Check ``fn(x, num_heads)`` turns ``(B, T, d_out)`` into ``(B, num_heads, T, head_dim)``.

    Head ``h`` of token ``t`` must hold the features ``h * head_dim ... (h + 1) * head_dim - 1``
    of token ``t``.

    Taught in chapter 7.
    """
    hint = ("view the last dim as (num_heads, head_dim), giving (B, T, num_heads, head_dim), "
            "then swap T and num_heads with transpose(1, 2)")
    for batch, num_tokens, num_heads, head_dim in ((2, 5, 3, 2), (1, 4, 2, 3)):
        x = _numbered(batch, num_tokens, num_heads * head_dim)  # (B, T, d_out)
        expected = x.view(batch, num_tokens, num_heads, head_dim).transpose(1, 2)
        actual = call(fn, x.clone(), num_heads)
        expect_shape(f"split_heads(x, {num_heads}) for x of shape {tuple(x.shape)}", actual,
                     expected.shape, hint=hint)
        if torch.equal(actual.detach().to(x.dtype),
                       x.reshape(batch, num_heads, num_tokens, head_dim)):
            fail("each head holds the features of the right token",
                 expected="head h, token t = x[b, t, h*head_dim:(h+1)*head_dim]",
                 actual="the flat memory of x cut straight into (B, num_heads, T, head_dim): "
                        "'head 0' holds the first tokens' features, not one slice of every token",
                 hint=hint)
        expect_close(f"split_heads(x, {num_heads})", actual, expected, hint=hint)
    passed("every head now holds its own head_dim-sized slice of every token.")


@checker
def check_merge_heads(fn) -> None:
    """Check ``fn(context)`` turns ``(B, num_heads, T, head_dim)`` into ``(B, T, d_out)``.

    Token ``t`` of the result must be the concatenation of every head's output for token ``t``.

    Taught in chapter 7.
    """
    hint = ("first transpose(1, 2) to (B, T, num_heads, head_dim), then reshape (or "
            ".contiguous().view) to (B, T, num_heads * head_dim)")
    for batch, num_heads, num_tokens, head_dim in ((2, 3, 5, 2), (1, 2, 4, 3)):
        context = _numbered(batch, num_heads, num_tokens, head_dim)
        expected = context.transpose(1, 2).reshape(batch, num_tokens, num_heads * head_dim)
        actual = call(fn, context.clone())
        expect_shape(f"merge_heads(context) for context of shape {tuple(context.shape)}",
                     actual, expected.shape, hint=hint)
        if torch.equal(actual.detach().to(context.dtype),
                       context.reshape(batch, num_tokens, num_heads * head_dim)):
            fail("each output row is one token's heads side by side",
                 expected="row t = [head 0 of token t, head 1 of token t, ...]",
                 actual="the (B, num_heads, T, head_dim) memory cut into rows without the "
                        "transpose: row 0 holds tokens 0 and 1 of head 0, and so on",
                 hint=hint)
        expect_close("merge_heads(context)", actual, expected, hint=hint)
    passed("each token's row is the concatenation of its heads, in head order.")


def _reference_param_count(d_in: int, d_out: int, qkv_bias: bool) -> int:
    qkv = 3 * (d_in * d_out + (d_out if qkv_bias else 0))
    out_proj = d_out * d_out + d_out
    return qkv + out_proj


@checker
def check_mha_param_count(fn) -> None:
    """Check ``fn(d_in, d_out, num_heads, qkv_bias)`` counts a ``MultiHeadAttention``'s parameters.

    Taught in chapter 7.
    """
    cases = (
        (768, 768, 12, True),
        (768, 768, 12, False),
        (8, 6, 2, True),
        (5, 12, 3, False),
        (1024, 1024, 16, True),
    )
    for d_in, d_out, num_heads, qkv_bias in cases:
        expected = _reference_param_count(d_in, d_out, qkv_bias)
        actual = call(fn, d_in, d_out, num_heads, qkv_bias)
        args = f"d_in={d_in}, d_out={d_out}, num_heads={num_heads}, qkv_bias={qkv_bias}"
        expect_true(f"the count is a whole number ({args})",
                    isinstance(actual, numbers.Integral) and not isinstance(actual, bool),
                    expected="an int", actual=type(actual).__name__,
                    hint="return an int; call int(...) on a tensor or float result")
        if actual == expected:
            continue
        if actual == expected - (d_out * d_out + d_out):
            hint = "you left out out_proj: a (d_out, d_out) weight plus a d_out bias"
        elif actual == expected - d_out:
            hint = "out_proj always has a bias (d_out numbers), even when qkv_bias is False"
        elif num_heads > 1 and actual in (expected * num_heads,
                                          3 * num_heads * (d_in * d_out) + d_out * d_out + d_out):
            hint = ("the count does not grow with num_heads: the heads split d_out, each "
                    "projection stays (d_out, d_in)")
        elif qkv_bias and actual == expected - 3 * d_out:
            hint = "with qkv_bias=True each of W_query, W_key, W_value adds d_out bias numbers"
        else:
            hint = ("three projections of d_in * d_out weights (+ d_out biases each if qkv_bias), "
                    "plus out_proj with d_out * d_out weights and d_out biases")
        fail(f"the parameter count for {args}", expected=f"{expected:,}",
             actual=f"{actual:,}", hint=hint)
    passed("3 * (d_in * d_out [+ d_out]) + d_out * d_out + d_out, whatever num_heads is; "
           "a GPT-2 layer (d=768, 12 heads, qkv bias) has 2,362,368.")


@checker
def check_expand_kv(fn) -> None:
    """Check ``fn(kv, num_heads)`` repeats key/value heads for grouped-query attention.

    ``kv`` has shape ``(B, num_kv_heads, T, head_dim)``; the result has shape
    ``(B, num_heads, T, head_dim)`` and query head ``h`` gets key/value head
    ``h // (num_heads // num_kv_heads)``, so consecutive query heads share one.

    Taught in chapter 7.
    """
    hint = ("each key/value head must serve group_size = num_heads // num_kv_heads consecutive "
            "query heads: kv.repeat_interleave(group_size, dim=1)")
    for batch, num_kv_heads, num_heads, num_tokens, head_dim in (
        (2, 2, 6, 3, 2),
        (1, 3, 6, 2, 4),
        (2, 1, 4, 3, 2),
        (1, 4, 4, 2, 2),
    ):
        kv = _numbered(batch, num_kv_heads, num_tokens, head_dim)
        group_size = num_heads // num_kv_heads
        expected = kv.repeat_interleave(group_size, dim=1)
        actual = call(fn, kv.clone(), num_heads)
        what = f"expand_kv(kv, {num_heads}) for kv of shape {tuple(kv.shape)}"
        expect_shape(what, actual, expected.shape, hint=hint)
        if group_size > 1 and num_kv_heads > 1 and torch.equal(
            actual.detach().to(kv.dtype), kv.repeat(1, group_size, 1, 1)
        ):
            order = [h % num_kv_heads for h in range(num_heads)]
            fail("consecutive query heads share a key/value head",
                 expected=f"query head -> kv head {[h // group_size for h in range(num_heads)]}",
                 actual=f"query head -> kv head {order} (the heads were tiled with repeat)",
                 hint=hint)
        expect_close(what, actual, expected, hint=hint)
    passed("query head h reads key/value head h // group_size.")
