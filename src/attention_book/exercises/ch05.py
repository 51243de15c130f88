"""Checkers for chapter 5's exercises (causal and padding masks)."""

from __future__ import annotations

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_causal_mask", "check_masked_softmax", "check_batch_mask"]

_POLARITY_HINT = (
    "in this book True means *may attend*: token i may attend to keys 0..i, "
    "so the True entries are on and below the diagonal (torch.tril)"
)


def _reference_causal(num_tokens: int) -> torch.Tensor:
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()  # (T, T)


def _reference_masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    masked = scores.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k)
    weights = torch.softmax(masked, dim=-1)  # (..., T_q, T_k)
    return torch.nan_to_num(weights, nan=0.0)  # fully masked rows: zeros


def _same(actual: object, candidate: torch.Tensor) -> bool:
    if not isinstance(actual, torch.Tensor) or actual.shape != candidate.shape:
        return False
    if candidate.dtype == torch.bool:
        return actual.dtype == torch.bool and bool(torch.equal(actual, candidate))
    # NaN counts as 0, so a mistake is named even when the answer also has NaN rows.
    actual = torch.nan_to_num(actual.detach().to(candidate.dtype), nan=0.0)
    return torch.allclose(actual, candidate, atol=1e-5)


@checker
def check_causal_mask(fn) -> None:
    """Check ``fn(num_tokens)`` returns the boolean causal mask, True = may attend.

    Taught in chapter 5.
    """
    num_tokens = 5
    expected = _reference_causal(num_tokens)
    actual = call(fn, num_tokens)
    expect_shape("the causal mask for 5 tokens", actual, (5, 5),
                 hint="build a (T, T) matrix: torch.ones(T, T, dtype=torch.bool)")
    expect_true("the mask is boolean", actual.dtype == torch.bool,
                expected="dtype torch.bool", actual=f"dtype {actual.dtype}",
                hint="pass dtype=torch.bool to torch.ones, or compare: mask == 1")
    known_mistakes = {
        "True above the diagonal (the blocked positions): the polarity is inverted":
            ~expected,
        "the diagonal is False: a token may not attend to itself":
            expected.tril(diagonal=-1),
        "True on and above the diagonal (torch.triu): every token sees the future":
            expected.T.contiguous(),
    }
    for mistake, candidate in known_mistakes.items():
        if _same(actual, candidate):
            fail("query i may attend to keys 0..i", expected=expected.int().tolist(),
                 actual=mistake, hint=_POLARITY_HINT)
    expect_true("query i may attend to keys 0..i", bool(torch.equal(actual, expected)),
                expected=expected.int().tolist(), actual=actual.int().tolist(), hint=_POLARITY_HINT)
    for size in (1, 8):
        expect_true(f"the mask for {size} token(s) is right",
                    bool(torch.equal(call(fn, size), _reference_causal(size))),
                    expected=f"torch.tril of a ({size}, {size}) boolean matrix of ones",
                    actual=call(fn, size), hint="use the argument, not a fixed size")
    passed("True on and below the diagonal: every token sees itself and the past, never the future.")


@checker
def check_masked_softmax(fn) -> None:
    """Check ``fn(scores, mask)``: ``-inf`` where ``mask`` is False, softmax, zeros for empty rows.

    Taught in chapter 5.
    """
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 4)  # (B, T, T)
    mask = _reference_causal(4).expand(2, 4, 4).clone()  # (B, T, T)
    mask[1, 2] = False  # one query that may attend to nothing
    expected = _reference_masked_softmax(scores, mask)
    actual = call(fn, scores, mask)
    expect_shape("the weights for scores of shape (2, 4, 4)", actual, (2, 4, 4),
                 hint="the weights have the shape of the scores; normalise over dim=-1")
    wrong_ways = {
        "the masked scores were set to 0, not -inf: masked keys still get weight exp(0)":
            torch.softmax(scores * mask, dim=-1),
        "the polarity is inverted: you blocked where the mask is True":
            _reference_masked_softmax(scores, ~mask),
        "masked positions were zeroed after the softmax but the rows were not renormalised":
            torch.softmax(scores, dim=-1) * mask,
    }
    for mistake, candidate in wrong_ways.items():
        if _same(actual, candidate):
            fail("masked keys get weight 0 and each row sums to 1",
                 expected="softmax(scores.masked_fill(~mask, -inf))", actual=mistake,
                 hint="scores.masked_fill(~mask, float('-inf')), then softmax over dim=-1")
    if isinstance(actual, torch.Tensor) and actual.is_floating_point() and torch.isnan(actual).any():
        fail("a fully masked row gives zeros, not NaN", expected="row of zeros",
             actual="NaN (softmax of a row of -inf is 0/0)",
             hint="after the softmax, replace NaN by 0 (torch.nan_to_num), or use "
                  "attention_book.softmax, which already does")
    expect_close("the masked weights", actual, expected,
                 hint="scores.masked_fill(~mask, float('-inf')), then softmax over dim=-1")
    passed("blocked keys get exactly 0, allowed weights sum to 1, an empty row gives zeros.")


@checker
def check_batch_mask(fn) -> None:
    """Check ``fn(lengths, max_len)`` returns the combined causal and key-padding mask ``(B, 1, T, T)``.

    Taught in chapter 5.
    """
    lengths, max_len = [4, 2, 3], 4
    causal = _reference_causal(max_len)  # (T, T)
    key_is_real = torch.arange(max_len) < torch.tensor(lengths).unsqueeze(1)  # (B, T)
    expected = (causal & key_is_real[:, None, :]).unsqueeze(1)  # (B, 1, T, T)
    actual = call(fn, lengths, max_len)
    if isinstance(actual, torch.Tensor) and actual.numel() == expected.numel() \
            and actual.shape != expected.shape:
        fail("the mask has shape (B, 1, T, T)", expected=tuple(expected.shape),
             actual=tuple(actual.shape),
             hint="keep a size-1 axis for the heads: mask.unsqueeze(1) or mask[:, None]")
    expect_shape("the mask of a batch with lengths [4, 2, 3] padded to 4", actual,
                 expected.shape,
                 hint="padding (B, 1, 1, T) & causal (T, T) broadcasts to (B, 1, T, T)")
    expect_true("the mask is boolean", actual.dtype == torch.bool,
                expected="dtype torch.bool", actual=f"dtype {actual.dtype}",
                hint="combine boolean masks with &, not with * or +")
    key_and_query = expected & key_is_real[:, None, :, None]  # (B, 1, T, T)
    wrong_masks = {
        "only the causal mask: padding keys are still visible":
            causal.expand(3, 1, max_len, max_len),
        "only the padding mask: every token sees the future":
            key_is_real[:, None, None, :].expand(3, 1, max_len, max_len),
        "the polarity is inverted (True where attending is forbidden)": ~expected,
        "padding *queries* are masked too, which leaves fully masked rows":
            key_and_query,
    }
    for mistake, candidate in wrong_masks.items():
        if _same(actual, candidate):
            fail("query i may attend to real keys 0..i", expected="causal & key padding",
                 actual=mistake,
                 hint="mask the keys only: causal (T, T) & (positions < length)[:, None, None, :]")
    expect_true("query i may attend to real keys 0..i", bool(torch.equal(actual, expected)),
                expected=expected.int().tolist(), actual=actual.int().tolist(),
                hint="causal (T, T) & (positions < length)[:, None, None, :]")
    passed("each query sees itself and the earlier *real* tokens; padding keys are hidden.")
