"""Checkers for chapter 3's exercises (trainable queries, keys and values)."""

from __future__ import annotations

import torch
from torch import nn

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_linear_from_parameter", "check_attention_scores", "check_split_merged"]


@checker
def check_linear_from_parameter(fn) -> None:
    """Check ``fn(W)`` returns a bias-free ``nn.Linear`` that computes ``x @ W``.

    Taught in chapter 3.
    """
    torch.manual_seed(0)
    W = torch.randn(4, 3)  # (d_in, d_out)
    layer = call(fn, W)
    expect_true(
        "the result is an nn.Linear", isinstance(layer, nn.Linear),
        expected="an nn.Linear", actual=type(layer).__name__,
        hint="create nn.Linear(d_in, d_out, bias=False) and copy W into its weight",
    )
    expect_true(
        "the layer has no bias", layer.bias is None,
        expected="bias=None", actual="a bias of shape " + str(
            tuple(layer.bias.shape) if layer.bias is not None else ()),
        hint="pass bias=False: x @ W has no bias term",
    )
    expect_shape(
        "layer.weight", layer.weight, (3, 4),
        hint="nn.Linear stores its weight as (d_out, d_in): copy W.T, not W",
    )
    x = torch.randn(2, 5, 4)  # (B, T, d_in)
    with torch.no_grad():
        output = call(layer, x, prop="the layer runs on a (2, 5, 4) input")
    expect_close(
        "layer(x) equals x @ W", output, x @ W,
        hint="nn.Linear computes x @ weight.T, so the weight must be W.T",
    )
    square = torch.randn(3, 3)  # (d_in, d_out) with d_in == d_out
    square_layer = call(fn, square)
    with torch.no_grad():
        output = call(square_layer, x[..., :3], prop="the layer runs on a (2, 5, 3) input")
    expect_close(
        "for a square W, layer(x) equals x @ W (not x @ W.T)", output, x[..., :3] @ square,
        hint="a square W hides a missing transpose from the shape check: copy W.T",
    )
    passed("your nn.Linear computes x @ W: its (d_out, d_in) weight is W transposed.")


def _reference_scores(x, W_query, W_key):
    return (x @ W_query) @ (x @ W_key).transpose(-2, -1)  # (..., T, T)


@checker
def check_attention_scores(fn) -> None:
    """Check ``fn(x, W_query, W_key)`` returns unscaled scores for any leading dims.

    Taught in chapter 3.
    """
    torch.manual_seed(0)
    W_query = torch.randn(4, 3)  # (d_in, d_out)
    W_key = torch.randn(4, 3)  # (d_in, d_out)
    for shape in ((6, 4), (2, 6, 4), (2, 3, 6, 4)):
        x = torch.randn(*shape)
        name = f"the scores of an input of shape {shape}"
        hint = ("swap only the last two dims of the keys: keys.transpose(-2, -1); "
                ".T or transpose(0, 1) is only right for 2-D tensors")
        scores = call(fn, x, W_query, W_key, prop=f"your function runs on shape {shape}")
        expect_shape(name, scores, (*shape[:-1], shape[-2]), hint=hint)
        expected = _reference_scores(x, W_query, W_key)
        if torch.allclose(scores, expected / 3**0.5, atol=1e-5):
            fail(f"{name} are unscaled", expected="queries @ keys^T",
                 actual="the scores divided by sqrt(d_out)",
                 hint="this exercise asks for the raw scores; leave out the scaling")
        expect_close(name, scores, expected,
                     hint="queries = x @ W_query, keys = x @ W_key; scores = queries @ keys^T")
    passed("one implementation gives the scores for (T, d), (B, T, d) and (B, H, T, d).")


@checker
def check_split_merged(fn) -> None:
    """Check ``fn(merged, d_out)`` factors a rank-``d_out`` matrix as ``W_query @ W_key.T``.

    Taught in chapter 3.
    """
    torch.manual_seed(0)
    for d_in, d_out in ((3, 2), (5, 2), (4, 4)):
        merged = torch.randn(d_in, d_out) @ torch.randn(d_in, d_out).T  # (d_in, d_in)
        result = call(fn, merged, d_out)
        expect_true(
            "split_merged returns a pair", isinstance(result, tuple) and len(result) == 2,
            expected="(W_query, W_key)", actual=type(result).__name__,
            hint="end with `return W_query, W_key`",
        )
        W_query, W_key = result
        hint = "keep the first d_out columns of U and the first d_out rows of Vh"
        expect_shape(f"W_query for d_in={d_in}, d_out={d_out}", W_query, (d_in, d_out),
                     hint=hint)
        expect_shape(f"W_key for d_in={d_in}, d_out={d_out}", W_key, (d_in, d_out), hint=hint)
        expect_close(
            f"W_query @ W_key.T equals the merged matrix (d_in={d_in}, d_out={d_out})",
            W_query @ W_key.T, merged,
            hint="M = U diag(S) Vh: multiply the columns of U by S (or the rows of Vh), "
            "and use Vh[:d_out].T as W_key",
            atol=1e-4, rtol=1e-4,
        )
    passed("any merged matrix of rank <= d_out splits back into a query and a key projection.")
