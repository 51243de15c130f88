"""A zoo of broken attention implementations, one bug each.

Chapter 11 shows each of them with its :func:`attention_book.diagnose`
report and the fix; the tests feed every one to ``diagnose`` and assert that
exactly the check named in :data:`BUGS` fails. Each broken line carries a
``# BUG:`` comment. Nothing here is meant to be used for real work: the
correct versions are :func:`attention_book.scaled_dot_product_attention` and
the layers in :mod:`attention_book.modules`.

The functions follow the book's functional convention
``(query, key, value, mask=None) -> (output, weights)`` with a boolean mask,
True = may attend; the modules follow ``forward(x) -> output``. Every specimen
runs on the device and in the dtype of its inputs (or of its parameters): no
constant inside a forward pass is tied to the CPU or to float32.

Taught in chapter 11.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import causal_mask, softmax
from .modules import MultiHeadAttention

__all__ = [
    "BUGS",
    "Bug",
    "source",
    "EXAMPLE_MASK",
    "healthy_attention",
    "attention_scaled_by_numel",
    "attention_softmax_over_queries",
    "attention_inverted_mask",
    "attention_masked_with_zero",
    "attention_zeroed_after_softmax",
    "attention_outer_mask",
    "attention_nan_on_fully_masked_rows",
    "attention_returns_value",
    "HealthyCausalAttention",
    "CausalShortMaskBuffer",
    "CausalDropoutBeforeSoftmax",
    "CausalDropoutInEval",
    "HealthyMultiHeadAttention",
    "MultiHeadScaledByWidth",
    "MultiHeadViewSplit",
]


# ----------------------------------------------------------------------------
# Functions (query, key, value, mask=None) -> (output, weights)
# ----------------------------------------------------------------------------


def healthy_attention(query, key, value, mask=None):
    """The healthy attention function that every broken one below starts from.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        mask: optional boolean mask, True = may attend.

    Shapes:
        query ``(B, T_q, d_k)``, key ``(B, T_k, d_k)``, value ``(B, T_k, d_v)``,
        mask broadcastable to ``(B, T_q, T_k)``.

    Returns:
        ``(output, weights)``: output ``(B, T_q, d_v)``, weights ``(B, T_q, T_k)``.

    Taught in chapter 11 (the starting point).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_scaled_by_numel(query, key, value, mask=None):
    """Broken attention: scales the scores by the number of elements of the keys.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``, too flat: the scale is 1/sqrt(key.numel()).

    Taught in chapter 11 (Bug 1; exposed by the ``scale`` check).
    """
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(key.numel())  # BUG: not head_dim
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_softmax_over_queries(query, key, value, mask=None):
    """Broken attention: normalises each column (over the queries), not each row.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``; each *column* of the weights sums to 1.

    Taught in chapter 11 (Bug 2; exposed by the ``softmax_dim`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = softmax(attn_scores, dim=1)  # BUG: dim 1 of (B, T_q, T_k) is the queries
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_inverted_mask(query, key, value, mask=None):
    """Broken attention: hides the positions the mask allows, keeps the ones it blocks.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``, wrong wherever a mask is given.

    Taught in chapter 11 (Bug 3; exposed by the ``mask_polarity`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(mask, float("-inf"))  # BUG: should be ~mask
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_masked_with_zero(query, key, value, mask=None):
    """Broken attention: sets the masked scores to 0 instead of -inf.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``; masked keys still get weight.

    Taught in chapter 11 (Bug 4; exposed by the ``padding`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, 0.0)  # BUG: 0 is an ordinary score
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_zeroed_after_softmax(query, key, value, mask=None):
    """Broken attention: zeroes masked weights after the softmax, without renormalising.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``; masked rows sum to less than 1.

    Taught in chapter 11 (Bug 5; exposed by the ``weights_sum`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    if mask is not None:
        attn_weights = attn_weights.masked_fill(~mask, 0.0)  # BUG: rows no longer sum to 1
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


class _FollowsDevice(torch.Tensor):
    """A constant tensor that moves to the device of the tensors it is used with.

    A plain CPU constant inside a forward pass breaks the code on any other
    device; this one makes ``EXAMPLE_MASK`` behave as a mask left in the
    notebook's namespace does on the device the notebook runs on, so that
    ``attention_outer_mask`` shows its bug (the mask argument is ignored) on
    every device instead of a device error.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        others = [a for a in (*args, *kwargs.values())
                  if isinstance(a, torch.Tensor) and not isinstance(a, cls)]
        if not others:  # e.g. ~EXAMPLE_MASK: stays a device-following constant
            return super().__torch_function__(func, types, args, kwargs)
        device = others[0].device
        with torch._C.DisableTorchFunctionSubclass():

            def place(a):
                return a.as_subclass(torch.Tensor).to(device) if isinstance(a, cls) else a

            args = tuple(place(a) for a in args)
            kwargs = {name: place(a) for name, a in kwargs.items()}
            return func(*args, **kwargs)


#: The causal mask of a 5-token example, left in the notebook's namespace. It follows
#: the device of the scores it masks, so the bug below is the same on every device.
EXAMPLE_MASK = causal_mask(5).as_subclass(_FollowsDevice)


def attention_outer_mask(query, key, value, attn_mask=None):
    """Broken attention: uses the mask of an outer variable instead of its argument.

    Args:
        query, key, value, attn_mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``, masked with ``EXAMPLE_MASK`` whatever ``attn_mask`` says.

    Taught in chapter 11 (Bug 8; exposed by the ``mask_argument`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if attn_mask is not None:
        # BUG: EXAMPLE_MASK is the example's mask, not the argument attn_mask.
        attn_scores = attn_scores.masked_fill(~EXAMPLE_MASK, float("-inf"))
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_nan_on_fully_masked_rows(query, key, value, mask=None):
    """Broken attention: torch.softmax turns a row of only -inf into NaN.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``, NaN in every fully masked row.

    Taught in chapter 11 (Bug 11; exposed by the ``fully_masked_rows`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = torch.softmax(attn_scores, dim=-1)  # BUG: NaN where a row is all -inf
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


def attention_returns_value(query, key, value, mask=None):
    """Broken attention: computes the weights, then returns the values.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(value, weights)`` instead of ``(output, weights)``.

    Taught in chapter 11 (Bug 10; exposed by the ``returns_output`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    return value, attn_weights  # BUG: should return attn_weights @ value


# ----------------------------------------------------------------------------
# Modules x -> output
# ----------------------------------------------------------------------------


class HealthyCausalAttention(nn.Module):
    """The healthy single-head causal layer that the broken ones below start from.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and output.
        context_length: the longest sequence the layer accepts.
        dropout: probability of zeroing an attention weight in training.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (the starting point).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float = 0.0):
        super().__init__()
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length), persistent=False)

    def check_length(self, num_tokens: int) -> None:
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")

    def forward(self, x):
        num_tokens = x.shape[1]
        self.check_length(num_tokens)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, T, d_out)
        attn_scores = queries @ keys.transpose(1, 2) / math.sqrt(self.d_out)  # (B, T, T)
        causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
        attn_scores = attn_scores.masked_fill(~causal, float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, T, T)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (B, T, d_out)


class CausalShortMaskBuffer(HealthyCausalAttention):
    """Broken causal layer: its mask buffer is built for 6 tokens, not context_length.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and output.
        context_length: the longest sequence the layer accepts.
        dropout: probability of zeroing an attention weight in training.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (Bug 9; exposed by the ``lengths`` check).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float = 0.0):
        super().__init__(d_in, d_out, context_length, dropout)
        # BUG: 6 is the length of the example, not context_length.
        self.register_buffer("mask", causal_mask(6), persistent=False)


class CausalDropoutBeforeSoftmax(HealthyCausalAttention):
    """Broken causal layer: applies dropout to the scores, before the softmax.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and output.
        context_length: the longest sequence the layer accepts.
        dropout: probability of zeroing an attention weight in training.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (Bug 6; exposed by the ``dropout_train`` check).
    """

    def forward(self, x):
        num_tokens = x.shape[1]
        self.check_length(num_tokens)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, T, d_out)
        attn_scores = queries @ keys.transpose(1, 2) / math.sqrt(self.d_out)  # (B, T, T)
        attn_scores = self.dropout(attn_scores)  # BUG: dropout belongs after the softmax
        causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
        attn_scores = attn_scores.masked_fill(~causal, float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, T, T)
        return attn_weights @ values  # (B, T, d_out)


class CausalDropoutInEval(HealthyCausalAttention):
    """Broken causal layer: F.dropout without training=self.training stays on in eval.

    Args:
        d_in: size of each input token vector.
        d_out: size of the queries, keys, values and output.
        context_length: the longest sequence the layer accepts.
        dropout: probability of zeroing an attention weight in training.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (Bug 6; exposed by the ``dropout_eval`` check).
    """

    def forward(self, x):
        num_tokens = x.shape[1]
        self.check_length(num_tokens)
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (B, T, d_out)
        attn_scores = queries @ keys.transpose(1, 2) / math.sqrt(self.d_out)  # (B, T, T)
        causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
        attn_scores = attn_scores.masked_fill(~causal, float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, T, T)
        attn_weights = F.dropout(attn_weights, self.dropout.p)  # BUG: training defaults to True
        return attn_weights @ values  # (B, T, d_out)


class HealthyMultiHeadAttention(nn.Module):
    """The healthy causal multi-head layer that the broken ones below start from.

    Args:
        d_in: size of each input token vector.
        d_out: model width; ``head_dim = d_out // num_heads``.
        context_length: the longest sequence the layer accepts.
        num_heads: number of heads.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (the starting point).
    """

    def __init__(self, d_in: int, d_out: int, context_length: int, num_heads: int):
        super().__init__()
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", causal_mask(context_length), persistent=False)

    def split_heads(self, x):
        batch, num_tokens, _ = x.shape
        x = x.view(batch, num_tokens, self.num_heads, self.head_dim)  # (B, T, num_heads, head_dim)
        return x.transpose(1, 2)  # (B, num_heads, T, head_dim)

    def forward(self, x):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
        queries = self.split_heads(self.W_query(x))  # (B, num_heads, T, head_dim)
        keys = self.split_heads(self.W_key(x))  # (B, num_heads, T, head_dim)
        values = self.split_heads(self.W_value(x))  # (B, num_heads, T, head_dim)
        attn_scores = queries @ keys.transpose(2, 3) / math.sqrt(self.head_dim)  # (B, H, T, T)
        attn_scores = attn_scores.masked_fill(~self.mask[:num_tokens, :num_tokens], float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, num_heads, T, T)
        context = (attn_weights @ values).transpose(1, 2)  # (B, T, num_heads, head_dim)
        return self.out_proj(context.reshape(batch, num_tokens, self.d_out))  # (B, T, d_out)


class MultiHeadScaledByWidth(HealthyMultiHeadAttention):
    """Broken multi-head layer: scales the scores by the model width d_out.

    Args:
        d_in: size of each input token vector.
        d_out: model width; ``head_dim = d_out // num_heads``.
        context_length: the longest sequence the layer accepts.
        num_heads: number of heads.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (Bug 1; exposed by the ``scale`` check).
    """

    def forward(self, x):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
        queries = self.split_heads(self.W_query(x))  # (B, num_heads, T, head_dim)
        keys = self.split_heads(self.W_key(x))  # (B, num_heads, T, head_dim)
        values = self.split_heads(self.W_value(x))  # (B, num_heads, T, head_dim)
        attn_scores = queries @ keys.transpose(2, 3) / math.sqrt(self.d_out)  # BUG: not head_dim
        attn_scores = attn_scores.masked_fill(~self.mask[:num_tokens, :num_tokens], float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, num_heads, T, T)
        context = (attn_weights @ values).transpose(1, 2)  # (B, T, num_heads, head_dim)
        return self.out_proj(context.reshape(batch, num_tokens, self.d_out))  # (B, T, d_out)


class MultiHeadViewSplit(HealthyMultiHeadAttention):
    """Broken multi-head layer: splits and merges the heads with a bare view.

    Args:
        d_in: size of each input token vector.
        d_out: model width; ``head_dim = d_out // num_heads``.
        context_length: the longest sequence the layer accepts.
        num_heads: number of heads.

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output.

    Taught in chapter 11 (Bug 7; exposed by the ``head_mixing`` check).
    """

    def split_heads(self, x):
        batch, num_tokens, _ = x.shape
        # BUG: a bare view cuts the (T, d_out) block into heads across token boundaries.
        return x.view(batch, self.num_heads, num_tokens, self.head_dim)  # (B, H, T, head_dim)

    def forward(self, x):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
        queries = self.split_heads(self.W_query(x))  # (B, num_heads, T, head_dim)
        keys = self.split_heads(self.W_key(x))  # (B, num_heads, T, head_dim)
        values = self.split_heads(self.W_value(x))  # (B, num_heads, T, head_dim)
        attn_scores = queries @ keys.transpose(2, 3) / math.sqrt(self.head_dim)  # (B, H, T, T)
        attn_scores = attn_scores.masked_fill(~self.mask[:num_tokens, :num_tokens], float("-inf"))
        attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, num_heads, T, T)
        context = attn_weights @ values  # (B, num_heads, T, head_dim)
        # BUG: the merge is a bare view too (it undoes the split, not the transpose).
        return self.out_proj(context.reshape(batch, num_tokens, self.d_out))  # (B, T, d_out)


def source(obj) -> str:
    """The source code of a zoo exhibit, with each docstring cut to its summary line.

    Args:
        obj: a function, class or method of this module.

    Returns:
        The dedented source, ready to print in the chapter.

    Taught in chapter 11.
    """
    lines = textwrap.dedent(inspect.getsource(obj)).splitlines()
    cuts = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            first = node.body[0]
            summary = ast.get_docstring(node).splitlines()[0]
            indent = lines[first.lineno - 1][: first.col_offset]
            cuts.append((first.lineno - 1, first.end_lineno, f'{indent}"""{summary}"""'))
    for start, end, replacement in sorted(cuts, reverse=True):
        lines[start:end] = [replacement]
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# The registry used by the chapter and the tests.
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bug:
    """One exhibit of the zoo.

    Args:
        name: the implementation's name in this module.
        check: the :func:`attention_book.diagnose` check that exposes it.
        summary: the bug in a few words.
        build: returns the implementation (a function, or a freshly seeded module).

    Taught in chapter 11.
    """

    name: str
    check: str
    summary: str
    build: Callable[[], object]


def _seeded(cls, *args, **kwargs) -> Callable[[], nn.Module]:
    def build():
        torch.manual_seed(0)
        return cls(*args, **kwargs)

    return build


def _function(fn) -> Callable[[], Callable]:
    return lambda: fn


#: Every bug of the zoo, with the check that exposes it.
BUGS: dict[str, Bug] = {
    bug.name: bug
    for bug in [
        Bug("attention_scaled_by_numel", "scale",
            "scales by the number of elements, not sqrt(head_dim)",
            _function(attention_scaled_by_numel)),
        Bug("MultiHeadScaledByWidth", "scale", "scales by sqrt(d_out), not sqrt(head_dim)",
            _seeded(MultiHeadScaledByWidth, 6, 8, 8, 2)),
        Bug("attention_softmax_over_queries", "softmax_dim", "softmax over the queries",
            _function(attention_softmax_over_queries)),
        Bug("attention_inverted_mask", "mask_polarity", "mask polarity inverted",
            _function(attention_inverted_mask)),
        Bug("attention_masked_with_zero", "padding", "masked with 0 instead of -inf",
            _function(attention_masked_with_zero)),
        Bug("attention_zeroed_after_softmax", "weights_sum",
            "zeroed after the softmax, not renormalised",
            _function(attention_zeroed_after_softmax)),
        Bug("CausalDropoutBeforeSoftmax", "dropout_train", "dropout before the softmax",
            _seeded(CausalDropoutBeforeSoftmax, 6, 8, 8, 0.5)),
        Bug("CausalDropoutInEval", "dropout_eval", "dropout left on in evaluation",
            _seeded(CausalDropoutInEval, 6, 8, 8, 0.5)),
        Bug("MultiHeadViewSplit", "head_mixing", "heads split with a bare view",
            _seeded(MultiHeadViewSplit, 6, 8, 8, 2)),
        Bug("attention_outer_mask", "mask_argument", "mask taken from an outer variable",
            _function(attention_outer_mask)),
        Bug("CausalShortMaskBuffer", "lengths", "mask buffer shorter than context_length",
            _seeded(CausalShortMaskBuffer, 6, 8, 8)),
        Bug("attention_returns_value", "returns_output", "returns the values",
            _function(attention_returns_value)),
        Bug("attention_nan_on_fully_masked_rows", "fully_masked_rows",
            "NaN for a fully masked row", _function(attention_nan_on_fully_masked_rows)),
    ]
}


# ----------------------------------------------------------------------------
# Chapter 12: positions inside attention (appended; registered in BUGS below).
# ----------------------------------------------------------------------------


class RotaryCacheRestartsPositions(MultiHeadAttention):
    """Broken RoPE layer: while decoding, the new tokens' positions restart at 0.

    The book's :class:`~attention_book.MultiHeadAttention` built with
    ``rope=True``, with one method changed: the positions of the tokens of each
    call are ``0 … T_new-1`` instead of continuing after the ``len(kv_cache)``
    tokens already cached. The full forward pass (and the first call into an
    empty cache) is right; every later decoding step rotates its query and key
    as if the token were the first of the sequence.

    Args:
        as for :class:`~attention_book.MultiHeadAttention` (build it with ``rope=True``).

    Shapes:
        x ``(B, T, d_in)`` -> output ``(B, T, d_out)``.

    Returns:
        ``forward`` returns the output (or ``(output, weights)``), as the healthy layer.

    Taught in chapter 12 (exposed by the ``cache_positions`` check).
    """

    def _rope_positions(self, num_tokens, kv_cache, device):
        return torch.arange(num_tokens, device=device)  # BUG: ignores the len(kv_cache) cached tokens


__all__.append("RotaryCacheRestartsPositions")
BUGS["RotaryCacheRestartsPositions"] = Bug(
    "RotaryCacheRestartsPositions", "cache_positions",
    "RoPE positions restart at 0 at every decoding step",
    _seeded(RotaryCacheRestartsPositions, 6, 8, 2, context_length=8, rope=True),
)


# ----------------------------------------------------------------------------
# Chapter 13: attention sinks (appended; registered in BUGS below).
# ----------------------------------------------------------------------------


def attention_sink_as_sigmoid(query, key, value, mask=None, sink_logit=None):
    """Broken attention sink: a sigmoid gate on the weights instead of a term in the denominator.

    Without a sink it is the healthy function. With one, every weight of the
    softmax is multiplied by the same ``sigmoid(-sink_logit)``: the rows sum to
    less than 1, as with a real sink, but by a fixed factor that ignores the
    scores, so a query whose keys all score low cannot give more of its weight
    to the sink. The right weights are ``exp(s) / (exp(sink) + sum exp(s))``
    (:func:`attention_book.softmax_with_sink`), whose total is
    ``sigmoid(logsumexp(s) - sink)``.

    Args:
        query, key, value, mask: as in :func:`healthy_attention`.
        sink_logit: the sink, a number or a tensor that broadcasts to the leading dims.

    Shapes:
        as in :func:`healthy_attention`.

    Returns:
        ``(output, weights)``; with a sink, every row sums to ``sigmoid(-sink_logit)``.

    Taught in chapter 13 (exposed by the ``sink_denominator`` check).
    """
    head_dim = query.size(-1)
    attn_scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T_q, T_k)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    attn_weights = softmax(attn_scores, dim=-1)  # (B, T_q, T_k)
    if sink_logit is not None:
        sink = torch.as_tensor(sink_logit, dtype=attn_weights.dtype, device=attn_weights.device)
        # BUG: a fixed gate, blind to the scores; the sink belongs in the softmax's denominator.
        attn_weights = attn_weights * torch.sigmoid(-sink)[..., None, None]  # (B, T_q, T_k)
    return attn_weights @ value, attn_weights  # (B, T_q, d_v), (B, T_q, T_k)


__all__.append("attention_sink_as_sigmoid")
BUGS["attention_sink_as_sigmoid"] = Bug(
    "attention_sink_as_sigmoid", "sink_denominator",
    "sink applied as a sigmoid gate, not in the denominator",
    _function(attention_sink_as_sigmoid),
)
