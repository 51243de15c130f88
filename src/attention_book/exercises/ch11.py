"""Checkers for chapter 11's exercises: two bug hunts in code the book did not write (a float
padding mask, a layer from a blog post) and a property test of the learner's own (does a
layer leak the future?).

None of them can be passed with the book's healthy code: the padding function takes a
tokenizer's ``attention_mask``, the property test is graded on layers it has never seen,
and the blog layer keeps its own constructor and weights.

Taught in chapter 11.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .. import bug_zoo
from ..attention import causal_mask
from ..diagnose import diagnose
from ..modules import MultiHeadAttention
from .feedback import (
    ExerciseFailure,
    call,
    call_in_private_order,
    checker,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = ["check_padded_attention", "check_leaks_future", "check_fixed_blog_attention"]


# --------------------------------------------------------------------------- 11.1 padding


def _padded_reference(query, key, value, attention_mask, *, additive_float=False,
                      inverted=False):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, T_q, T_k)
    keep = attention_mask.bool()[:, None, :]  # (B, 1, T_k)
    if additive_float:
        weights = torch.softmax(scores + attention_mask[:, None, :].float(), dim=-1)
    else:
        weights = torch.softmax(scores.masked_fill(keep if inverted else ~keep, float("-inf")),
                                dim=-1)
    return weights @ value  # (B, T_q, d_v)


@checker
def check_padded_attention(fn) -> None:
    """Check ``fn(query, key, value, attention_mask)`` hides the padding keys completely.

    ``attention_mask`` is a tokenizer's ``(B, T_k)`` integer tensor, 1 for a real token
    and 0 for padding; every sequence has at least one real token.

    Args:
        fn: the learner's ``padded_attention``.

    Returns:
        True when the output equals attention over the real tokens only.

    Taught in chapter 11.
    """
    torch.manual_seed(0)
    query = torch.randn(2, 4, 8)  # (B, T_q, d)
    key, value = torch.randn(2, 5, 8), torch.randn(2, 5, 6)  # (B, T_k, d), (B, T_k, d_v)
    cases = {
        "sequence 1 padded after 3 tokens": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        "both sequences padded": torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]]),
        "no padding": torch.ones(2, 5, dtype=torch.long),
    }
    for label, attention_mask in cases.items():
        try:
            output = call(fn, query, key, value, attention_mask.clone(),
                          prop=f"padded_attention runs with 4 queries, 5 keys and an "
                               f"attention_mask of shape (2, 5) ({label})")
        except ExerciseFailure as failure:
            if "must match the size" not in str(failure):
                raise
            fail(f"padded_attention runs on 2 sequences of 4 queries and 5 keys ({label})",
                 expected="no error", actual=str(failure).split("actual:")[-1].split("\n")[0].strip(),
                 hint="The mask (B, T_k) does not broadcast against the scores (B, T_q, T_k): "
                      "give it a dim for the queries, so that it broadcasts to (B, T_q, T_k).")
        expect_shape(f"the output ({label})", output, (2, 4, 6),
                     hint="Return the attention output only, shape (B, T_q, d_v); the mask "
                          "(B, T_k) must be turned into one that broadcasts to (B, T_q, T_k).")
        expected = _padded_reference(query, key, value, attention_mask)
        if torch.allclose(output, expected, atol=1e-5, rtol=1e-4):
            continue
        prop = f"padding keys get exactly zero weight ({label})"
        if torch.allclose(output, _padded_reference(query, key, value, attention_mask,
                                                    additive_float=True), atol=1e-5, rtol=1e-4):
            fail(prop, expected="the padding tokens move no output",
                 actual="they still get weight",
                 hint="A float attn_mask is added to the scores: 1.0 for a real token and 0.0 "
                      "for padding shifts the scores and hides nothing. Pass a boolean mask "
                      "(True = may attend), or add -inf where attention_mask is 0.")
        if torch.allclose(output[1], _padded_reference(query, key, value, attention_mask,
                                                       inverted=True)[1], atol=1e-5, rtol=1e-4):
            fail(prop, expected="each query attends to the real tokens",
                 actual="it attends to the padding",
                 hint="The polarity is inverted. In attention_mask 1 marks a real token, and a "
                      "boolean attn_mask means True = may attend.")
        if torch.isnan(output).all():
            fail(prop, expected="finite values", actual="NaN everywhere",
                 hint="0 times -inf is NaN, so (1 - attention_mask) * float('-inf') puts NaN on "
                      "every real token. Build the additive mask with torch.where, or use a "
                      "boolean mask.")
        fail(prop, expected="attention over the real tokens only", actual="different values",
             hint="Hide exactly the keys where attention_mask is 0, for every query of the "
                  "sequence, before the softmax.")
    passed("the padding keys get exactly zero weight, and without padding nothing changes.")


# --------------------------------------------------------------------------- 11.2 property test


class _MaskedLayer(nn.Module):
    """A single-head layer in which query i may see key j where ``allowed[i, j]``."""

    def __init__(self, allowed: torch.Tensor, *, dropout: float = 0.0,
                 zero_after_softmax: bool = False, fill: float = float("-inf"), d_in: int = 6,
                 d_out: int = 8):
        super().__init__()
        self._fill = fill  # private: a property test may read d_in, not what is broken
        self.d_in, self.context_length = d_in, allowed.size(0)
        self._zero_after_softmax = zero_after_softmax
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("allowed", allowed.clone(), persistent=False)

    def forward(self, x):
        num_tokens = x.size(1)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, T, d_out)
        attn_scores = queries @ keys.transpose(1, 2) / math.sqrt(keys.size(-1))  # (B, T, T)
        allowed = self.allowed[:num_tokens, :num_tokens]  # (T, T)
        if self._zero_after_softmax:
            attn_weights = torch.softmax(attn_scores, dim=-1).masked_fill(~allowed, 0.0)
        else:
            attn_weights = torch.softmax(attn_scores.masked_fill(~allowed, self._fill), dim=-1)
        return self.dropout(attn_weights) @ values  # (B, T, d_out)


def _with_extra(allowed: torch.Tensor, *pairs: tuple[int, int]) -> torch.Tensor:
    allowed = allowed.clone()
    for i, j in pairs:
        allowed[i, j] = True
    return allowed


def _built_for_four(num_tokens: int) -> torch.Tensor:
    """A causal mask made for 4 tokens and padded with True: from token 4 on, everything leaks."""
    allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
    allowed[:4, :4] = causal_mask(4)
    return allowed


def _seeded(build):
    torch.manual_seed(0)
    return build()


def _property_cases(num_tokens: int):
    """(description, layer, its first leak or None) for each layer the test is graded on."""
    causal = causal_mask(num_tokens)
    window = causal & ~causal_mask(num_tokens).tril(-2)  # each token sees itself and one before
    return [
        ("a healthy causal layer", _seeded(lambda: _MaskedLayer(causal)), None),
        ("a healthy causal layer with dropout, handed over in training mode",
         _seeded(lambda: _MaskedLayer(causal, dropout=0.5).train()), None),
        ("the book's MultiHeadAttention (sdpa backend)",
         _seeded(lambda: MultiHeadAttention(6, 8, num_heads=2, context_length=num_tokens,
                                            backend="sdpa")), None),
        ("a layer whose heads are split with a bare view (broken, but it does not see the "
         "future)", _seeded(lambda: bug_zoo.MultiHeadViewSplit(6, 8, num_tokens, 2)), None),
        ("a causal layer that sees only one token back", _seeded(lambda: _MaskedLayer(window)),
         None),
        ("a layer whose mask lets every token see the future",
         _seeded(lambda: _MaskedLayer(~causal.tril(-1))), (0, 1)),
        ("a layer that zeroes the future after the softmax",
         _seeded(lambda: _MaskedLayer(causal, zero_after_softmax=True)), (0, 1)),
        ("a layer with two holes in its mask",
         _seeded(lambda: _MaskedLayer(_with_extra(causal, (2, 4), (0, 5)))), (2, 4)),
        ("a layer with one hole, late in the sequence",
         _seeded(lambda: _MaskedLayer(_with_extra(causal, (3, 5)))), (3, 5)),
        ("a layer that fills the future with -10 instead of -inf (a leak of about 1e-4)",
         _seeded(lambda: _MaskedLayer(causal, fill=-10.0)), (0, 1)),
        ("a layer whose mask was built for 4 tokens (longer inputs see everything)",
         _seeded(lambda: _MaskedLayer(_built_for_four(num_tokens))), (0, 4)),
    ]


def _as_pair(result: object):
    """``result`` as a pair of ints, or None; fail with a hint for anything else."""
    if result is None:
        return None
    if isinstance(result, (list, tuple)) and result and all(
            isinstance(item, (list, tuple)) for item in result):
        fail("leaks_future returns one pair (i, j) or None", expected="(i, j)",
             actual=f"{len(result)} pairs",
             hint="Return only the first leak, as one pair (i, j), not a list of all of them.")
    try:
        pair = tuple(int(value) for value in result)
    except (TypeError, ValueError, RuntimeError):
        fail("leaks_future returns (i, j) or None", expected="a pair of ints (i, j), or None",
             actual=repr(result)[:60],
             hint="Return a tuple of two ints (output i, token j) for the first leak, and None "
                  "when you find none.")
    if len(pair) != 2:
        fail("leaks_future returns one pair (i, j) or None", expected="(i, j)",
             actual=f"{len(pair)} numbers",
             hint="Return only the first leak, as one pair (i, j), not a list of all of them.")
    return pair


def _every_leak(layer: nn.Module, num_tokens: int) -> list[tuple[int, int]]:
    """Every (i, j), i < j, such that changing token j moves output i (in eval mode)."""
    layer.eval()
    torch.manual_seed(1)
    x = torch.randn(1, num_tokens, layer.d_in)
    leaks = []
    with torch.no_grad():
        base = layer(x)
        for j in range(num_tokens):
            changed = x.clone()
            changed[:, j] += 1.0
            moved = (layer(changed) - base).abs().amax(dim=-1)[0]  # (T,)
            leaks += [(i, j) for i in range(j) if moved[i] > 1e-6]
    return leaks


def _find_leak(fn, layer: nn.Module, num_tokens: int, description: str):
    """What ``fn(layer, num_tokens)`` returns; ``layer`` is then put back in the mode it was in."""
    training = layer.training
    try:
        return call(fn, layer, num_tokens,
                    prop=f"leaks_future(layer, {num_tokens}) runs on {description}")
    finally:
        layer.train(training)


@checker
def check_leaks_future(fn) -> None:
    """Check the learner's property test ``fn(layer, num_tokens)`` on healthy and leaky layers.

    It must return ``None`` for every layer that never lets token j reach an output
    before j (broken or not), and the first leak ``(i, j)`` (smallest ``j``, then smallest
    ``i``) for every layer that does, whatever the size of the leak.

    Args:
        fn: the learner's ``leaks_future``.

    Returns:
        True when the test is right on every layer.

    Taught in chapter 11.
    """
    num_tokens = 6
    cases = _property_cases(num_tokens)
    outcomes = call_in_private_order([partial(_find_leak, fn, layer, num_tokens, description)
                                      for description, layer, _ in cases])
    for (description, layer, first_leak), outcome in zip(cases, outcomes, strict=True):
        result = _as_pair(outcome.get())
        prop = f"leaks_future is right on {description}"
        if first_leak is None and result is not None:
            i, j = result
            if i >= j:
                fail(prop, expected="None", actual=result,
                     hint="Output i may depend on every token up to and including i. A leak is "
                          "an output *before* the token you changed: only i < j counts.")
            if "dropout" in description:
                fail(prop, expected="None", actual=result,
                     hint="This layer is causal, but its dropout draws new random weights at "
                          "every call. A property test must not be fooled by randomness: put "
                          "the layer in eval mode (layer.eval()) before you compare outputs.")
            fail(prop, expected="None", actual=result,
                 hint="Output i moved when you changed token j, yet this layer cannot see the "
                      "future. Compare the outputs of the same input before and after the "
                      "change, with a small tolerance such as 1e-6.")
        if first_leak is not None and result != first_leak:
            if result is None:
                fail(prop, expected="a leak (i, j)", actual=None,
                     hint="Your test missed a leak. Change every token j in turn and look at "
                          "every earlier output i < j; a leak through the softmax's normaliser "
                          "or a finite mask can be as small as 1e-4, so compare with a small "
                          "tolerance such as 1e-6.")
            if result[::-1] == first_leak:
                fail(prop, expected="(i, j) with i < j", actual=result,
                     hint="Return (i, j) in this order: i is the output that moved, j the token "
                          "you changed, so i < j.")
            if result in _every_leak(layer, num_tokens):
                fail(prop, expected="the first leak", actual=f"{result}, a leak but not the first",
                     hint="Scan the tokens j in increasing order and, for each j, the outputs "
                          "i = 0, 1, ..., j - 1 in increasing order; return the first pair that "
                          "moves by more than about 1e-6 (a looser tolerance misses small "
                          "leaks).")
            fail(prop, expected="the first leak (i, j)", actual=result,
                 hint="That pair is not a leak of this layer. Change token j of one input, run "
                      "the layer on both inputs and compare output i (i < j).")
    passed("your test tells the causal layers (healthy or broken in other ways) from the ones "
           "that leak the future, and finds the first leak.")


# --------------------------------------------------------------------------- 11.3 two bugs

_LAYER_HINTS = {
    "dropout_eval": "In eval mode two calls still differ. An nn.Dropout built inside forward is a "
                    "new module in training mode at every call, and layer.eval() cannot reach "
                    "it: apply dropout so that it follows the layer's own mode.",
    "dropout_train": "Keep dropout in training, on the weights after the softmax: on the "
                     "scores it also hits the masked -inf entries, and 0 times -inf is NaN. "
                     "The fix must switch dropout off in eval mode, not remove it.",
    "scale": "The scores are divided by the wrong number. diagnose's scale row says which "
             "number the code divides by: compare it with head_dim.",
    "matches_reference": "Fix only the two bugs: keep the head split, the causal mask, the "
                         "softmax over the keys and out_proj as the blog wrote them.",
}


@checker
def check_fixed_blog_attention(layer_class) -> None:
    """Check ``layer_class(d_in, d_out, context_length, num_heads, dropout)`` fixes both bugs.

    The class is the learner's fix of the chapter's ``BlogCausalAttention``: it keeps the
    blog's constructor and parameters (``W_query``, ``W_key``, ``W_value``, ``out_proj``) and
    must pass every ``diagnose`` check and equal causal multi-head attention computed from
    its own weights.

    Args:
        layer_class: the learner's class (not an instance).

    Returns:
        True when the layer is right.

    Taught in chapter 11.
    """
    if not (isinstance(layer_class, type) and issubclass(layer_class, nn.Module)):
        fail("you pass a layer class", expected="a subclass of nn.Module",
             actual=type(layer_class).__name__,
             hint="Pass the class itself, without building it: check_fixed_blog_attention("
                  "FixedBlogAttention).")
    torch.manual_seed(0)
    layer = call(layer_class, 6, 8, 8, 2, 0.5,
                 prop="layer_class(d_in=6, d_out=8, context_length=8, num_heads=2, "
                      "dropout=0.5) builds a layer")
    names = ("W_query", "W_key", "W_value", "out_proj")
    expect_true("the layer keeps the blog's projections W_query, W_key, W_value and out_proj",
                all(isinstance(getattr(layer, name, None), nn.Linear) for name in names),
                expected="the four nn.Linear of BlogCausalAttention",
                actual=[name for name in names if not isinstance(getattr(layer, name, None),
                                                                 nn.Linear)],
                hint="Subclass BlogCausalAttention and override forward only, so that its "
                     "constructor and weights stay as they are.")
    layer.eval()
    torch.manual_seed(1)
    x = torch.randn(2, 5, 6)  # (B, T, d_in)
    with torch.no_grad():
        output = call(layer.forward, x, prop="the layer runs on x of shape (2, 5, 6)")
    expect_shape("the output for x of shape (2, 5, 6)", output, (2, 5, 8),
                 hint="Return the output of out_proj, shape (B, T, d_out).")
    report = diagnose(layer)
    for result in report.results:
        if result.status == "FAIL":
            fail(f"diagnose check '{result.name}' ({result.property})", expected="pass",
                 actual=result.evidence, hint=_LAYER_HINTS.get(result.name, result.hint))
    layer.train()
    changed = x.clone()
    changed[:, -1] += 1.0  # only the last token changes
    with torch.no_grad():
        torch.manual_seed(2)
        trained = layer(x)
        torch.manual_seed(2)  # the same dropout draws for both inputs
        trained_changed = layer(changed)
    layer.eval()
    expect_true("in training mode the output is finite and causal (the same dropout draws, the "
                "last token changed: the earlier outputs stay put)",
                bool(torch.isfinite(trained).all())
                and torch.equal(trained[:, :-1], trained_changed[:, :-1]),
                expected="finite outputs; outputs 0..3 unchanged",
                actual="NaN, or earlier outputs that moved",
                hint="Apply dropout to the weights after the softmax. On the scores it also hits "
                     "the masked -inf entries, and 0 times -inf is NaN.")
    with torch.no_grad():
        split = [getattr(layer, name)(x).view(2, 5, 2, 4).transpose(1, 2)  # (B, H, T, head_dim)
                 for name in ("W_query", "W_key", "W_value")]
        context = F.scaled_dot_product_attention(*split, is_causal=True)  # (B, H, T, head_dim)
        expected = layer.out_proj(context.transpose(1, 2).reshape(2, 5, 8))  # (B, T, d_out)
    expect_true("in eval mode the output equals causal multi-head attention computed from the "
                "layer's weights", torch.allclose(output, expected, atol=1e-5, rtol=1e-4),
                expected="the healthy output", actual="different values",
                hint="Fix only the two bugs: keep the head split, the causal mask, the softmax "
                     "over the keys and out_proj as the blog wrote them.")
    passed("dropout now follows train() and eval(), the scores are scaled by 1/sqrt(head_dim), "
           "and every diagnose check passes.")
