"""Checkers for chapter 3's exercises (trainable queries, keys and values)."""

from __future__ import annotations

import math
import warnings
from functools import partial

import torch
from torch import nn

from .feedback import (
    call,
    call_in_private_order,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    on_cpu,
    passed,
)

__all__ = [
    "check_linear_from_parameter", "check_cross_attention", "check_split_merged",
    "check_batch_consistency_test",
]

_TRANSPOSE_HINT = (
    "Your function works on 2-D inputs but not on a batch. `.T` and `transpose(0, 1)` are only "
    "right for 2-D tensors (on a 3-D tensor `.T` reverses every dim), so swap the last two dims "
    "of the keys with keys.transpose(-2, -1)."
)


def _call_with_hint(fn, *args, prop: str, hint: str):
    """Like ``call``, but an error in the answer gets ``hint`` instead of the generic one."""
    try:
        with warnings.catch_warnings():
            # `.T` on a 3-D tensor warns before it fails; the hint says what to do instead.
            warnings.simplefilter("ignore", UserWarning)
            return on_cpu(fn(*args))
    except NotImplementedError:
        return call(fn, *args)  # reports "You have not written ... yet"
    except Exception as error:  # noqa: BLE001 - any error in learner code becomes feedback
        fail(prop, expected="no error", actual=f"{type(error).__name__}: {error}", hint=hint)


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
        hint="Create nn.Linear(d_in, d_out, bias=False) and copy W into its weight.",
    )
    expect_true(
        "the layer has no bias", layer.bias is None,
        expected="bias=None", actual="a bias of shape " + str(
            tuple(layer.bias.shape) if layer.bias is not None else ()),
        hint="Pass bias=False: x @ W has no bias term.",
    )
    expect_shape(
        "layer.weight", layer.weight, (3, 4),
        hint="nn.Linear stores its weight as (d_out, d_in), so copy W.T, not W.",
    )
    x = torch.randn(2, 5, 4)  # (B, T, d_in)
    with torch.no_grad():
        output = call(layer, x, prop="the layer runs on a (2, 5, 4) input")
    expect_close(
        "the layer's output on a (2, 5, 4) input", output, x @ W,
        hint="nn.Linear computes x @ weight.T, so the weight must be W.T.",
    )
    square = torch.randn(3, 3)  # (d_in, d_out) with d_in == d_out
    square_layer = call(fn, square)
    with torch.no_grad():
        output = call(square_layer, x[..., :3], prop="the layer runs on a (2, 5, 3) input")
    expect_close(
        "the layer's output for a square W", output, x[..., :3] @ square,
        hint="A square W hides a missing transpose from the shape check: copy W.T.",
    )
    passed("your nn.Linear computes x @ W: its (d_out, d_in) weight is W transposed.")


def _cross_reference(x_q, x_kv, W_query, W_key, W_value, scale=None):
    queries = x_q @ W_query  # (..., T_q, d_k)
    keys = x_kv @ W_key  # (..., T_kv, d_k)
    values = x_kv @ W_value  # (..., T_kv, d_v)
    scale = 1 / math.sqrt(keys.shape[-1]) if scale is None else scale
    weights = torch.softmax(queries @ keys.transpose(-2, -1) * scale, dim=-1)  # (..., T_q, T_kv)
    return weights @ values, weights  # (..., T_q, d_v), (..., T_q, T_kv)


def _pair(result, shape_note: str):
    expect_true(
        f"cross_attention returns a pair for {shape_note}",
        isinstance(result, tuple) and len(result) == 2,
        expected="(context_vecs, attn_weights)", actual=type(result).__name__,
        hint="End with `return context_vecs, attn_weights`.",
    )
    return result


@checker
def check_cross_attention(fn) -> None:
    """Check ``fn(x_q, x_kv, W_query, W_key, W_value)`` is cross-attention for any leading dims.

    Queries come from ``x_q`` (``T_q`` tokens), keys and values from ``x_kv`` (``T_kv``
    tokens); scores are scaled by ``1/√d_k`` with ``d_k = W_key.shape[1]``, as in the chapter.

    Taught in chapter 3.
    """
    torch.manual_seed(0)
    d_in, d_k, d_v, T_q, T_kv = 5, 3, 2, 4, 6
    W_query, W_key, W_value = torch.randn(d_in, d_k), torch.randn(d_in, d_k), torch.randn(d_in, d_v)
    x_q, x_kv = torch.randn(T_q, d_in), torch.randn(T_kv, d_in)  # (T_q, d_in), (T_kv, d_in)
    weights_args = (W_query, W_key, W_value)
    context_vecs, attn_weights = _pair(call(fn, x_q, x_kv, *weights_args), "2-D inputs")
    expected_context, expected_weights = _cross_reference(x_q, x_kv, *weights_args)
    wrong_shapes = {
        (T_q, T_q): "Your scores compare the queries with themselves: the keys come from x_kv, "
                    "the sequence being looked at.",
        (T_kv, T_kv): "Your scores compare x_kv with itself: the queries come from x_q.",
        (T_kv, T_q): "Your rows belong to x_kv: each row of the weights is one query, taken "
                     "from x_q, and each column one key, taken from x_kv.",
    }
    hint = wrong_shapes.get(tuple(getattr(attn_weights, "shape", ())),
                            "One row per query token (T_q = 4) and one column per key token "
                            "(T_kv = 6).")
    expect_shape("attn_weights for a 4-token x_q and a 6-token x_kv", attn_weights, (T_q, T_kv),
                 hint=hint)
    expect_close(
        "the row sums of attn_weights", attn_weights.sum(dim=-1), torch.ones(T_q),
        hint="Apply the softmax over the keys, the last dim (dim=-1), so each query's row "
             "sums to 1.",
    )
    for scale, what in ((1.0, "not scaled"), (1 / math.sqrt(d_in), "divided by sqrt(d_in)"),
                        (1 / d_k, "divided by d_k")):
        if torch.allclose(attn_weights, _cross_reference(x_q, x_kv, *weights_args, scale)[1],
                          atol=1e-5):
            fail("the scores are divided by sqrt(d_k), the size of a key",
                 expected="scores / sqrt(3)", actual=f"scores {what}",
                 hint="Scale as the chapter does: divide by the square root of the keys' last "
                      "dim (keys.shape[-1]).")
    expect_close("attn_weights", attn_weights, expected_weights,
                 hint="queries = x_q @ W_query, keys = x_kv @ W_key; the weights are the "
                      "softmax of the scaled queries @ keys^T.")
    expect_shape("context_vecs", context_vecs, (T_q, d_v),
                 hint="Weight the values x_kv @ W_value: one (d_v = 2)-sized vector per query.")
    expect_close("context_vecs", context_vecs, expected_context,
                 hint="The values come from x_kv @ W_value, and context_vecs = attn_weights @ "
                      "values.")
    for batch in ((2,), (2, 3)):
        torch.manual_seed(1)
        x_q, x_kv = torch.randn(*batch, T_q, d_in), torch.randn(*batch, T_kv, d_in)
        shape_note = f"inputs of shapes {tuple(x_q.shape)} and {tuple(x_kv.shape)}"
        result = _call_with_hint(fn, x_q, x_kv, *weights_args,
                                 prop=f"your function runs on {shape_note}", hint=_TRANSPOSE_HINT)
        context_vecs, attn_weights = _pair(result, shape_note)
        expected_context, expected_weights = _cross_reference(x_q, x_kv, *weights_args)
        expect_shape(f"attn_weights for {shape_note}", attn_weights, (*batch, T_q, T_kv),
                     hint=_TRANSPOSE_HINT)
        expect_close(f"attn_weights for {shape_note}", attn_weights, expected_weights,
                     hint=_TRANSPOSE_HINT)
        expect_close(f"context_vecs for {shape_note}", context_vecs, expected_context,
                     hint="Multiply the weights with the values of the same batch: "
                          "attn_weights @ values.")
    passed("queries from one sequence attend to keys and values of another, for any number of "
           "leading dims.")


@checker
def check_split_merged(fn) -> None:
    """Check ``fn(merged, d_out)`` factors a rank-``d_out`` matrix as ``W_query @ W_key.T``.

    Any factorisation passes: ``(W_query A, W_key A^{-T})`` is as good as ``(W_query, W_key)``.

    Taught in chapter 3.
    """
    torch.manual_seed(0)
    for d_in, d_out in ((3, 2), (5, 2), (4, 4)):
        merged = torch.randn(d_in, d_out) @ torch.randn(d_in, d_out).T  # (d_in, d_in)
        result = call(fn, merged, d_out)
        expect_true(
            "split_merged returns a pair", isinstance(result, tuple) and len(result) == 2,
            expected="(W_query, W_key)", actual=type(result).__name__,
            hint="End with `return W_query, W_key`.",
        )
        W_query, W_key = result
        hint = ("Keep d_out columns: the first d_out columns of U and the first d_out rows of "
                "Vh carry everything, because the other singular values are 0.")
        expect_shape(f"W_query for d_in={d_in}, d_out={d_out}", W_query, (d_in, d_out),
                     hint=hint)
        if tuple(getattr(W_key, "shape", ())) == (d_out, d_in):
            hint = ("Vh holds the right singular vectors as rows, and W_key needs them as "
                    "columns, so transpose the rows you keep.")
        expect_shape(f"W_key for d_in={d_in}, d_out={d_out}", W_key, (d_in, d_out), hint=hint)
        product = (W_query @ W_key.T).detach()
        U, S, Vh = torch.linalg.svd(merged)
        if torch.allclose(product, U[:, :d_out] @ Vh[:d_out], atol=1e-4):
            fail(f"W_query @ W_key.T equals the merged matrix (d_in={d_in}, d_out={d_out})",
                 expected="U diag(S) Vh", actual="U Vh, without the singular values",
                 hint="The singular values S must go into one of the two factors: multiply "
                      "the columns of U (or the rows of Vh) by them.")
        if d_in == d_out and torch.allclose(
                product, (U[:, :d_out] * S[:d_out]) @ Vh[:d_out].T, atol=1e-4):
            fail(f"W_query @ W_key.T equals the merged matrix (d_in={d_in}, d_out={d_out})",
                 expected="U diag(S) Vh", actual="U diag(S) Vh^T",
                 hint="Vh holds the right singular vectors as rows, and W_key needs them as "
                      "columns, so transpose the rows you keep.")
        expect_close(
            f"W_query @ W_key.T for d_in={d_in}, d_out={d_out}", product, merged,
            hint="M = U diag(S) Vh: give S to the columns of U (or to the rows of Vh), and "
                 "take W_key from Vh.",
            atol=1e-4, rtol=1e-4,
        )
    passed("any merged matrix of rank <= d_out splits back into a query and a key projection.")


# The attention functions the learner's property test is graded against: each takes
# x (..., T, 3) and returns (..., T, 2).
def _projections():
    generator = torch.Generator().manual_seed(7)
    return tuple(torch.randn(3, 2, generator=generator) for _ in range(3))


def _healthy(x):
    W_query, W_key, W_value = _projections()
    keys = x @ W_key  # (..., T, 2)
    scores = (x @ W_query) @ keys.transpose(-2, -1)  # (..., T, T)
    return torch.softmax(scores / math.sqrt(2), dim=-1) @ (x @ W_value)  # (..., T, 2)


def _healthy_einsum(x):
    W_query, W_key, W_value = _projections()
    scores = torch.einsum("...qd,...kd->...qk", x @ W_query, x @ W_key)  # (..., T, T)
    weights = torch.softmax(scores / math.sqrt(2), dim=-1)  # (..., T, T)
    return torch.einsum("...qk,...kd->...qd", weights, x @ W_value)  # (..., T, 2)


def _flattens_batch(x):
    return _healthy(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], 2)


def _scales_by_first_dim(x):
    W_query, W_key, W_value = _projections()
    keys = x @ W_key  # (..., T, 2)
    scores = (x @ W_query) @ keys.transpose(-2, -1)  # (..., T, T)
    return torch.softmax(scores / math.sqrt(keys.shape[0]), dim=-1) @ (x @ W_value)


def _transposes_first_dims(x):
    W_query, W_key, W_value = _projections()
    scores = (x @ W_query) @ (x @ W_key).transpose(0, 1)  # right only for 2-D x
    return torch.softmax(scores / math.sqrt(2), dim=-1) @ (x @ W_value)


def _softmax_over_first_dim(x):
    W_query, W_key, W_value = _projections()
    scores = (x @ W_query) @ (x @ W_key).transpose(-2, -1)  # (..., T, T)
    return torch.softmax(scores / math.sqrt(2), dim=0) @ (x @ W_value)


def _first_sequence_keys(x):
    """Every sequence of a batch is scored against the keys and values of the first one."""
    W_query, W_key, W_value = _projections()
    looked_at = x if x.dim() == 2 else x[:1].expand_as(x)  # (..., T, 3): sequence 0 everywhere
    scores = (x @ W_query) @ (looked_at @ W_key).transpose(-2, -1)  # (..., T, T)
    return torch.softmax(scores / math.sqrt(2), dim=-1) @ (looked_at @ W_value)


def _softmax_over_dim_two(x):
    """Written for (B, T, d_in): a single sequence gets a batch dim, the softmax runs on dim 2."""
    if x.dim() == 2:
        return _softmax_over_dim_two(x[None])[0]
    W_query, W_key, W_value = _projections()
    scores = (x @ W_query) @ (x @ W_key).transpose(-2, -1)  # (..., T, T)
    return torch.softmax(scores / math.sqrt(2), dim=2) @ (x @ W_value)  # dim 2 is -1 for 3-D


def _batch_statistics(x):
    """Adds 0.1 % of the batch's mean output: a tiny leak between sequences."""
    out = _healthy(x)  # (..., T, 2)
    batch_mean = out if x.dim() == 2 else out.flatten(0, -3).mean(dim=0)  # (T, 2)
    return out + 1e-3 * batch_mean


_BROKEN = (
    (_flattens_batch,
     "Your test accepts a function that flattens the batch into one long sequence, so that "
     "tokens of different sequences attend to each other. Use a batch of at least two "
     "different sequences, and compare each sequence's output with the output of the function "
     "run on that sequence alone."),
    (_scales_by_first_dim,
     "Your test accepts a function that divides the scores by sqrt(keys.shape[0]), which is "
     "the batch size on a batch but T on a single sequence. Use a batch whose size B differs "
     "from the number of tokens T."),
    (_transposes_first_dims,
     "Your test accepts a function that uses transpose(0, 1), which fails on every batch. A "
     "function that raises an error on a batch is not batch-consistent: return False then."),
    (_softmax_over_first_dim,
     "Your test accepts a function whose softmax runs along dim 0, which is the batch dim on a "
     "batch. Compare the batched output of every sequence with its output alone."),
    (_first_sequence_keys,
     "Your test accepts a function that scores every sequence of a batch against the keys of "
     "the first sequence, so only sequences 1, 2, ... come out wrong. Compare every sequence of "
     "the batch with its output alone, not only the first one, and make the sequences "
     "different from one another."),
    (_softmax_over_dim_two,
     "Your test accepts a function written for (B, T, d_in) batches: its softmax runs along "
     "dim 2, which is the last dim of (B, T, T) scores but the query dim of (B, G, T, T) ones. "
     "The property is about any number of leading dims: test a batch of shape (B, G, T, 3) "
     "too, and compare each of its B * G sequences with its output alone."),
    (_batch_statistics,
     "Your test accepts a function that adds 0.1 % of the batch's mean output to every "
     "sequence: a small leak between sequences, but a leak. Float rounding alone moves a "
     "result by about 1e-7, so compare with a tolerance such as atol=1e-6, not 1e-2."),
)

_ESCAPED_ERROR_HINT = (
    "Your test let the function's error escape. A function that raises on a batch is not "
    "batch-consistent: catch the error (try/except) and return False.")


@checker
def check_batch_consistency_test(fn) -> None:
    """Check a learner's property test ``fn(attention_fn) -> bool`` against healthy and broken code.

    ``fn`` must return True for two healthy self-attention functions and False for seven
    broken ones, each of which runs without an error on a single ``(T, 3)`` sequence and
    treats a batch differently, at different depths: on every batch (a flattened batch,
    ``transpose(0, 1)``, a softmax along dim 0), only when ``B != T`` (a scale read from
    ``shape[0]``), only for the sequences after the first, only with two leading dims
    (a softmax along dim 2), or only beyond a tolerance of 1e-3 (batch statistics).

    Taught in chapter 3.
    """
    healthy = (_healthy, _healthy_einsum)
    calls = [partial(call, fn, right, prop="your test runs on a correct attention function")
             for right in healthy]
    calls += [partial(_call_with_hint, fn, broken,
                      prop="your test runs on a function that is broken on batches",
                      hint=_ESCAPED_ERROR_HINT) for broken, _ in _BROKEN]
    outcomes = call_in_private_order(calls)
    for outcome in outcomes[:len(healthy)]:
        verdict = outcome.get()
        expect_true(
            "your test returns True or False", isinstance(verdict, (bool, torch.Tensor)),
            expected="True or False", actual=type(verdict).__name__,
            hint="End with `return` and a bool, e.g. `return all(...)` or `return "
                 "torch.allclose(...)`.",
        )
        expect_true(
            "your test accepts a correct attention function", bool(verdict),
            expected="True", actual="False",
            hint="Batched and single results can differ in the last bits of a float: compare "
                 "with torch.allclose (e.g. atol=1e-6) instead of torch.equal or ==.",
        )
    for (_, hint), outcome in zip(_BROKEN, outcomes[len(healthy):], strict=True):
        verdict = outcome.get()
        expect_true("your test rejects a function that treats a batch differently from a "
                    "single sequence",
                    not bool(verdict), expected="False", actual="True", hint=hint)
    passed(f"your test accepts both correct functions and rejects all {len(_BROKEN)} broken ones, "
           "each of which runs on a single sequence but treats a batch differently: on every "
           "batch, only when B differs from T, only after the first sequence, only with two "
           "leading dims, or only by 0.1 %.")
