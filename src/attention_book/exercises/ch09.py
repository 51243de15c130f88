"""Checkers for chapter 9's exercises (the tiny classifier and its attention)."""

from __future__ import annotations

import torch

from ._feedback import call, checker, expect_close, expect_shape, fail, passed

__all__ = ["check_mean_pool", "check_gather_word", "check_attention_to_cue"]


@checker
def check_mean_pool(fn) -> None:
    """Check ``fn(x, lengths)`` averages the real (unpadded) token vectors of each sentence.

    Taught in chapter 9.
    """
    hint = ("build a (B, T, 1) mask of real tokens, e.g. torch.arange(T) < lengths[:, None], "
            "sum x * mask over the token dim and divide by lengths[:, None]")
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 6, 4, generator=generator)  # (B, T, d)
    lengths = torch.tensor([6, 2, 4])
    expected = torch.stack([x[row, :length].mean(dim=0) for row, length in enumerate(lengths)])
    actual = call(fn, x.clone(), lengths.clone())
    expect_shape("the pooled vectors", actual, expected.shape, hint="one vector per sentence")
    if torch.allclose(actual.detach().to(x.dtype), x.mean(dim=1)):
        fail("padding is left out of the average", expected="the mean over the first "
             "lengths[b] tokens", actual="the mean over all T positions, padding included",
             hint=hint)
    expect_close("the pooled vectors", actual, expected, hint=hint)
    passed("every sentence is averaged over its own words only.")


@checker
def check_gather_word(fn) -> None:
    """Check ``fn(context, word_index)`` picks, for each sentence, the context vector at
    position ``word_index[b]``.

    Taught in chapter 9.
    """
    hint = "index two dims at once: context[torch.arange(B), word_index] has shape (B, d)"
    context = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)  # (B, T, d)
    word_index = torch.tensor([3, 1])
    expected = torch.stack([context[0, 3], context[1, 1]])
    actual = call(fn, context.clone(), word_index.clone())
    if isinstance(actual, torch.Tensor) and actual.shape == (2, 2, 3):
        fail("one vector per sentence", expected=(2, 3), actual=tuple(actual.shape),
             hint="context[:, word_index] takes every index for every sentence; pair the rows "
                  "with torch.arange(B)")
    expect_shape("the gathered vectors", actual, expected.shape, hint=hint)
    expect_close("the gathered vectors", actual, expected, hint=hint)
    passed("the head will read exactly the ambiguous word's context vector.")


@checker
def check_attention_to_cue(fn) -> None:
    """Check ``fn(weights, word_index, cue_index)`` returns ``weights[b, h, word_index[b],
    cue_index[b]]`` for every sentence ``b`` and head ``h``.

    Taught in chapter 9.
    """
    hint = ("rows = torch.arange(B); weights[rows, :, word_index] has shape (B, heads, T); "
            "index it again with [rows, :, cue_index]")
    generator = torch.Generator().manual_seed(6)
    weights = torch.softmax(torch.randn(3, 2, 5, 5, generator=generator), dim=-1)
    word_index = torch.tensor([0, 4, 2])
    cue_index = torch.tensor([2, 1, 3])
    expected = torch.stack([weights[b, :, word_index[b], cue_index[b]] for b in range(3)])
    actual = call(fn, weights.clone(), word_index.clone(), cue_index.clone())
    expect_shape("the weights to the cue", actual, expected.shape,
                 hint="one weight per sentence and head: (B, num_heads)")
    swapped = torch.stack([weights[b, :, cue_index[b], word_index[b]] for b in range(3)])
    if torch.allclose(actual.detach().to(swapped.dtype), swapped):
        fail("the weight goes *from* the word *to* the cue", expected="weights[b, h, word, cue]",
             actual="weights[b, h, cue, word] (from the cue to the word)",
             hint="rows are queries (the word attending), columns are keys (the cue)")
    expect_close("the weights to the cue", actual, expected, hint=hint)
    passed("you can read how much each head of the ambiguous word looks at its cue.")
