"""Checkers for chapter 11's exercises (find and fix the bug).

Each checker runs :func:`attention_book.diagnose` on the learner's fix and
reports the first failed check with its evidence and hint.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import bug_zoo
from ..diagnose import DiagnosisReport, diagnose
from ._feedback import call, checker, expect_close, expect_true, fail, passed

__all__ = ["check_fixed_masking", "check_split_merge_heads", "check_fixed_dropout"]


def _expect_checks(report: DiagnosisReport, must_pass: tuple[str, ...], what: str) -> None:
    """Fail on the first failed check of ``report``, or on a required check that did not pass."""
    for result in report.results:
        if result.status == "FAIL":
            fail(f"{what}: diagnose check '{result.name}' ({result.property})",
                 expected="pass", actual=result.evidence, hint=result.hint)
    for name in must_pass:
        result = report[name]
        expect_true(
            f"{what}: diagnose check '{name}' ({result.property})",
            result.status == "pass",
            expected="pass",
            actual=f"{result.status}: {result.evidence}",
            hint="make sure your code runs and keeps the same calling convention",
        )


@checker
def check_fixed_masking(fn) -> None:
    """Check ``fn(query, key, value, mask=None)`` masks with -inf before the softmax.

    The fix of ``bug_zoo.attention_masked_with_zero``.

    Taught in chapter 11.
    """
    report = diagnose(fn)
    _expect_checks(report, ("padding", "mask_polarity", "scale", "softmax_dim"),
                   "your attention function")
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 4, 8).unbind(0)  # each (2, 4, 8)
    keep = torch.tensor([True, True, True, False])  # (T_k,): the last key is padding
    result = call(fn, query, key, value, keep)
    output = result[0] if isinstance(result, (tuple, list)) else result
    weights = torch.softmax(query @ key.transpose(-2, -1) / 8**0.5
                            + torch.where(keep, 0.0, float("-inf")), dim=-1)  # (2, 4, 4)
    expect_close("the output with the last key masked", output, weights @ value,
                 hint="masked_fill(~mask, float('-inf')) before the softmax, not 0")
    passed("masked scores are -inf before the softmax, so padding gets exactly zero weight.")


@checker
def check_split_merge_heads(split_heads, merge_heads) -> None:
    """Check ``split_heads(x, num_heads)`` and ``merge_heads(x)`` keep tokens apart.

    ``split_heads``: ``(B, T, d_out) -> (B, num_heads, T, head_dim)``;
    ``merge_heads``: its inverse. The fix of ``bug_zoo.MultiHeadViewSplit``.

    Taught in chapter 11.
    """
    x = torch.arange(2 * 5 * 8, dtype=torch.float32).view(2, 5, 8)  # (B, T, d_out)
    heads = call(split_heads, x, 2, prop="split_heads(x, num_heads) runs")
    expected = x.view(2, 5, 2, 4).transpose(1, 2)  # (B, num_heads, T, head_dim)
    if isinstance(heads, torch.Tensor) and heads.shape == expected.shape and not torch.equal(
        heads, expected
    ) and torch.equal(heads, x.view(2, 2, 5, 4)):
        fail("head h holds features h*head_dim ... (h+1)*head_dim - 1 of *every* token",
             expected="x.view(B, T, num_heads, head_dim).transpose(1, 2)",
             actual="a bare x.view(B, num_heads, T, head_dim): head 0 holds tokens 0-2",
             hint="view as (B, T, num_heads, head_dim) first, then swap dims 1 and 2")
    expect_close("split_heads(x, 2) for x of shape (2, 5, 8)", heads, expected,
                 hint="x.view(B, T, num_heads, head_dim).transpose(1, 2)")
    merged = call(merge_heads, expected.clone(), prop="merge_heads(x) runs")
    expect_close("merge_heads(split_heads(x)) gives x back", merged, x,
                 hint="transpose(1, 2) back, then .reshape(B, T, num_heads * head_dim)")

    class FixedMultiHead(bug_zoo.HealthyMultiHeadAttention):
        def forward(self, x):
            batch, num_tokens, _ = x.shape
            if num_tokens > self.context_length:
                raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
            queries = split_heads(self.W_query(x), self.num_heads)  # (B, H, T, head_dim)
            keys = split_heads(self.W_key(x), self.num_heads)  # (B, H, T, head_dim)
            values = split_heads(self.W_value(x), self.num_heads)  # (B, H, T, head_dim)
            attn_scores = queries @ keys.transpose(2, 3) / self.head_dim**0.5  # (B, H, T, T)
            causal = self.mask[:num_tokens, :num_tokens]  # (T, T)
            attn_scores = attn_scores.masked_fill(~causal, float("-inf"))
            attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, H, T, T)
            return self.out_proj(merge_heads(attn_weights @ values))  # (B, T, d_out)

    torch.manual_seed(0)
    report = diagnose(FixedMultiHead(6, 8, 8, 2))
    _expect_checks(report, ("head_mixing", "causality"), "a layer built on your functions")
    passed("each head sees every token, and merging undoes the split exactly.")


@checker
def check_fixed_dropout(layer_class) -> None:
    """Check ``layer_class(d_in, d_out, context_length, dropout)`` drops out only in training.

    The fix of ``bug_zoo.CausalDropoutInEval``.

    Taught in chapter 11.
    """
    if not (isinstance(layer_class, type) and issubclass(layer_class, nn.Module)):
        fail("you pass a layer class", expected="a subclass of nn.Module",
             actual=type(layer_class).__name__,
             hint="pass the class itself, e.g. check_fixed_dropout(FixedDropoutAttention)")
    torch.manual_seed(0)
    layer = call(layer_class, 6, 8, 8, 0.5, prop="layer_class(6, 8, 8, 0.5) builds a layer")
    report = diagnose(layer)
    _expect_checks(report, ("dropout_eval", "dropout_train", "causality"), "your layer")
    passed("dropout is on in training (keeping the expectation) and off in eval.")
