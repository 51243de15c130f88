"""Checkers for chapter 10's exercises (the cost of attention, the online softmax, the KV cache)."""

from __future__ import annotations

import math
import numbers

import torch

from ..attention import causal_mask
from ..kv_cache import kv_cache_bytes
from ._feedback import call, checker, expect_true, fail, passed

__all__ = [
    "check_attention_flops",
    "check_online_max_and_sum",
    "check_kv_cache_size",
    "check_decoding_mask",
]


def _expect_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(f"{name} is an int", expected="an int", actual=type(value).__name__, hint=hint)


@checker
def check_attention_flops(fn) -> None:
    """Check ``fn(batch_size, num_heads, num_tokens, head_dim)`` counts attention's FLOPs.

    Only the two matrix products are counted: the scores ``Q K^T`` and the
    weighted sum ``weights V``, each ``B * H * T * T * head_dim`` multiply-adds of
    2 FLOPs, so ``4 * B * H * T**2 * head_dim`` in all.

    Taught in chapter 10.
    """
    hint = ("count the two matrix products: (T, head_dim) @ (head_dim, T) and (T, T) @ "
            "(T, head_dim), each T * T * head_dim multiply-adds per head and sequence; "
            "a multiply-add is 2 FLOPs")
    for batch_size, num_heads, num_tokens, head_dim in ((1, 1, 4, 2), (2, 12, 1024, 64),
                                                        (3, 5, 7, 11)):
        expected = 4 * batch_size * num_heads * num_tokens**2 * head_dim
        actual = call(fn, batch_size, num_heads, num_tokens, head_dim)
        args = f"({batch_size}, {num_heads}, {num_tokens}, {head_dim})"
        _expect_int(f"attention_flops{args}", actual, hint)
        if actual == expected // 2:
            fail(f"attention_flops{args} has the right value", expected=expected, actual=actual,
                 hint="half the answer: count both products, and 2 FLOPs per multiply-add")
        if actual == 4 * batch_size * num_heads * num_tokens * head_dim:
            fail(f"attention_flops{args} grows with T squared", expected=expected,
                 actual=actual, hint="every one of the T queries meets every one of the T keys")
        expect_true(f"attention_flops{args} has the right value", actual == expected,
                    expected=expected, actual=actual, hint=hint)
    passed("attention's two products cost 4 * B * H * T^2 * head_dim FLOPs: double T, "
           "four times the work.")


@checker
def check_online_max_and_sum(fn) -> None:
    """Check ``fn(scores)`` returns ``(max, sum(exp(scores - max)))`` of a 1-D tensor.

    The learner's answer makes one pass over the scores, keeping a running
    maximum and a running sum that is rescaled whenever the maximum grows.

    Taught in chapter 10.
    """
    hint = ("keep m (the largest score so far) and s (the sum of exp(score - m) so far); for "
            "each new score x: m_new = max(m, x), s = s * exp(m - m_new) + exp(x - m_new), m = "
            "m_new; start from m = -inf, s = 0")
    cases = {
        "increasing scores [0, 1, 2, 3]": torch.tensor([0.0, 1.0, 2.0, 3.0]),
        "decreasing scores [3, 2, 1, 0]": torch.tensor([3.0, 2.0, 1.0, 0.0]),
        "large scores [1000, 1002, 1001]": torch.tensor([1000.0, 1002.0, 1001.0]),
        "one score [5]": torch.tensor([5.0]),
    }
    torch.manual_seed(0)
    cases["random scores"] = torch.randn(20) * 3
    for label, scores in cases.items():
        result = call(fn, scores.clone())
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            fail(f"the result for {label} is a pair (max, sum)", expected="(max, sum)",
                 actual=type(result).__name__, hint="return running_max, running_sum")
        try:
            got_max, got_sum = (float(value) for value in result)
        except (TypeError, ValueError, RuntimeError):
            fail(f"the result for {label} holds two numbers", expected="(max, sum) as numbers",
                 actual=repr(result)[:80], hint="return two floats or 0-d tensors")
        want_max = float(scores.max())
        want_sum = float(torch.exp(scores - scores.max()).sum())
        expect_true(f"the maximum for {label}", math.isclose(got_max, want_max, abs_tol=1e-5),
                    expected=round(want_max, 5), actual=got_max, hint=hint)
        if not math.isfinite(got_sum):
            fail(f"the sum for {label} is finite", expected=round(want_sum, 5), actual=got_sum,
                 hint="subtract the running maximum before exp, never exp the raw score")
        unscaled = float(sum(torch.exp(x - torch.cummax(scores, 0).values[i])
                             for i, x in enumerate(scores)))
        if scores.numel() > 1 and not math.isclose(unscaled, want_sum, rel_tol=1e-4) and (
            math.isclose(got_sum, unscaled, rel_tol=1e-4)
        ):
            fail(f"the sum for {label} is rescaled when the maximum grows",
                 expected=round(want_sum, 5), actual=round(got_sum, 5),
                 hint="when m grows to m_new, the old terms exp(x - m) must become exp(x - "
                      "m_new): multiply s by exp(m - m_new) before adding the new term")
        expect_true(f"the sum for {label}", math.isclose(got_sum, want_sum, rel_tol=1e-4),
                    expected=round(want_sum, 5), actual=got_sum, hint=hint)
    passed("one pass gives the maximum and the rescaled sum, even for scores near 1000.")


@checker
def check_kv_cache_size(fn) -> None:
    """Check ``fn(num_layers, batch_size, num_kv_heads, head_dim, context_length,
    bytes_per_element)`` returns the bytes of a full KV cache.

    Taught in chapter 10.
    """
    hint = ("each layer stores, for every sequence, key/value head and token, one key and one "
            "value of head_dim numbers: 2 * layers * batch * kv_heads * tokens * head_dim "
            "* bytes_per_element")
    for sizes in ((2, 3, 1, 5, 7, 4), (12, 1, 12, 64, 1024, 2), (32, 4, 8, 128, 4096, 2)):
        num_layers, batch_size, num_kv_heads, head_dim, context_length, bytes_per_element = sizes
        expected = kv_cache_bytes(num_layers=num_layers, batch_size=batch_size,
                                  num_kv_heads=num_kv_heads, head_dim=head_dim,
                                  context_length=context_length,
                                  bytes_per_element=bytes_per_element)
        actual = call(fn, *sizes)
        _expect_int(f"kv_cache_size{sizes}", actual, hint)
        if actual * bytes_per_element == expected:
            fail(f"kv_cache_size{sizes} is in bytes", expected=expected, actual=actual,
                 hint="you counted numbers: multiply by bytes_per_element")
        if actual * 2 == expected:
            fail(f"kv_cache_size{sizes} counts keys and values", expected=expected,
                 actual=actual, hint="the cache holds keys AND values: twice the numbers")
        expect_true(f"kv_cache_size{sizes} has the right value", actual == expected,
                    expected=expected, actual=actual, hint=hint)
    passed("a full cache holds 2 * L * B * H_kv * T * head_dim numbers; fewer key/value "
           "heads, a smaller cache.")


@checker
def check_decoding_mask(fn) -> None:
    """Check ``fn(num_new, num_keys)`` returns the bottom-right aligned causal mask.

    The ``num_new`` queries are the last ``num_new`` of ``num_keys`` positions,
    so query ``i`` may see keys ``0 … i + num_keys - num_new``.

    Taught in chapter 10.
    """
    hint = ("the new queries are the LAST positions: shift the diagonal right by num_keys - "
            "num_new, e.g. torch.ones(num_new, num_keys, dtype=torch.bool).tril(diagonal=...)")
    for num_new, num_keys in ((1, 5), (3, 7), (4, 4), (2, 9)):
        expected = causal_mask(num_new, num_keys)  # (T_new, T_k)
        actual = call(fn, num_new, num_keys)
        label = f"decoding_mask({num_new}, {num_keys})"
        if not isinstance(actual, torch.Tensor):
            fail(f"{label} is a tensor", expected="a boolean torch.Tensor",
                 actual=type(actual).__name__, hint=hint)
        expect_true(f"{label} has shape (num_new, num_keys)",
                    tuple(actual.shape) == (num_new, num_keys), expected=(num_new, num_keys),
                    actual=tuple(actual.shape), hint=hint)
        expect_true(f"{label} is boolean (True = may attend)", actual.dtype == torch.bool,
                    expected=torch.bool, actual=actual.dtype, hint="build it with dtype=torch.bool")
        top_left = torch.ones(num_new, num_keys, dtype=torch.bool).tril()
        if num_new != num_keys and torch.equal(actual, top_left):
            fail(f"{label} is aligned bottom-right", expected=expected.int().tolist(),
                 actual=actual.int().tolist(),
                 hint="this is the top-left alignment of PyTorch's is_causal: the first new "
                      "query would see only key 0, although every cached key is in its past")
        expect_true(f"{label} has the right entries", torch.equal(actual, expected),
                    expected=expected.int().tolist(), actual=actual.int().tolist(), hint=hint)
    passed("each new query sees every cached key and itself, and nothing after it.")
