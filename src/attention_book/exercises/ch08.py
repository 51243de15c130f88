"""Checkers for chapter 8's exercises (reading attention weights of a real model)."""

from __future__ import annotations

import math

import torch

from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = ["check_top_head", "check_previous_token_score", "check_weights_from_projections"]


def _random_attentions(num_layers: int, num_heads: int, num_tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.softmax(torch.randn(1, num_heads, num_tokens, num_tokens, generator=generator), -1)
        for _ in range(num_layers)
    ]


@checker
def check_top_head(fn) -> None:
    """Check ``fn(attentions, query_index, key_index)`` returns the ``(layer, head)`` whose
    weight from the query token to the key token is the largest.

    ``attentions`` is a list of per-layer ``(1, num_heads, T, T)`` tensors, as a
    ``transformers`` model returns them with ``output_attentions=True``.

    Taught in chapter 8.
    """
    hint = ("stack the layers into (num_layers, num_heads, T, T), take [:, :, query_index, "
            "key_index] and find the argmax of that (num_layers, num_heads) matrix; "
            "divmod(flat_index, num_heads) gives (layer, head)")
    for num_layers, num_heads, seed in ((3, 4, 0), (2, 5, 1), (4, 3, 2)):
        attentions = _random_attentions(num_layers, num_heads, 6, seed)
        query_index, key_index = 4, 1
        # Plant one clear winner so that the answer is unique.
        layer, head = num_layers - 2, num_heads - 1
        attentions[layer][0, head, query_index] = 0.0
        attentions[layer][0, head, query_index, key_index] = 1.0
        answer = call(fn, [a.clone() for a in attentions], query_index, key_index)
        if isinstance(answer, torch.Tensor):
            answer = tuple(answer.tolist())
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            fail("the answer is a pair (layer, head)", expected=(layer, head), actual=answer,
                 hint=hint)
        answer = tuple(int(value) for value in answer)
        if answer == (head, layer) and head != layer:
            fail("the pair is (layer, head), in that order", expected=(layer, head),
                 actual=answer, hint="divmod(flat_index, num_heads) gives (layer, head)")
        expect_true("the (layer, head) with the largest weight", answer == (layer, head),
                    expected=(layer, head), actual=answer, hint=hint)
    passed("you find the head that attends most from one token to another, by computation.")


@checker
def check_previous_token_score(fn) -> None:
    """Check ``fn(weights)`` returns, for each head, the mean weight a token gives the token
    just before it: ``weights[h, t, t - 1]`` averaged over ``t = 1 … T - 1``.

    Taught in chapter 8.
    """
    hint = ("torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1) gives the (num_heads, T - 1) "
            "entries weights[h, t, t - 1]; average them over the last dim")
    generator = torch.Generator().manual_seed(3)
    weights = torch.softmax(torch.randn(4, 6, 6, generator=generator), dim=-1)  # (heads, T, T)
    expected = torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1).mean(dim=-1)  # (heads,)
    actual = call(fn, weights.clone())
    expect_shape("the scores", actual, expected.shape, hint="one score per head: shape (num_heads,)")
    above = torch.diagonal(weights, offset=1, dim1=-2, dim2=-1).mean(dim=-1)
    if torch.allclose(actual.detach().to(above.dtype), above):
        fail("the score uses the *previous* token (below the diagonal)",
             expected="weights[h, t, t - 1]", actual="weights[h, t, t + 1] (the next token)",
             hint="use offset=-1, not offset=1")
    expect_close("the previous-token scores", actual, expected, hint=hint)
    shifted = torch.zeros(2, 5, 5)
    shifted[0, 1:, :-1] = torch.eye(4)
    shifted[0, 0, 0] = 1.0
    shifted[1] = 1.0 / 5
    expect_close("the scores of a perfect previous-token head and a uniform head",
                 call(fn, shifted), torch.tensor([1.0, 0.2]), hint=hint)
    passed("a score of 1 means the head always looks one token back.")


@checker
def check_weights_from_projections(fn) -> None:
    """Check ``fn(queries, keys, num_heads)`` splits ``(B, T, d_out)`` queries and keys into
    heads and returns the attention weights ``softmax(q k^T / sqrt(head_dim))``.

    Taught in chapter 8.
    """
    hint = ("split both with .view(B, T, num_heads, head_dim).transpose(1, 2), then "
            "softmax(q @ k.transpose(-2, -1) / sqrt(head_dim), dim=-1)")
    generator = torch.Generator().manual_seed(4)
    batch, num_tokens, num_heads, head_dim = 2, 5, 3, 4
    queries = torch.randn(batch, num_tokens, num_heads * head_dim, generator=generator)
    keys = torch.randn(batch, num_tokens, num_heads * head_dim, generator=generator)
    split_q = queries.view(batch, num_tokens, num_heads, head_dim).transpose(1, 2)
    split_k = keys.view(batch, num_tokens, num_heads, head_dim).transpose(1, 2)
    scores = split_q @ split_k.transpose(-2, -1)  # (B, num_heads, T, T)
    expected = torch.softmax(scores / math.sqrt(head_dim), dim=-1)
    actual = call(fn, queries.clone(), keys.clone(), num_heads)
    expect_shape("the weights", actual, expected.shape, hint=hint)
    if torch.allclose(actual.detach().to(scores.dtype), torch.softmax(scores / math.sqrt(num_heads
                                                                                  * head_dim), -1)):
        fail("the scores are scaled by 1/sqrt(head_dim)", expected="1/sqrt(head_dim) = 1/2",
             actual="1/sqrt(d_out)", hint="each head's dot products have head_dim terms")
    if torch.allclose(actual.detach().to(scores.dtype), torch.softmax(scores, -1)):
        fail("the scores are scaled", expected="scores / sqrt(head_dim)", actual="no scaling",
             hint=hint)
    expect_close("the weights", actual, expected, hint=hint)
    passed("these are the weights a BERT layer computes from its own projections.")
