"""Tests for attention_book.flash: the online softmax and tiled (FlashAttention-style) attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attention_book import causal_mask, scaled_dot_product_attention, softmax
from attention_book.flash import (
    DIAGONAL,
    FULL,
    SKIPPED,
    online_softmax,
    online_softmax_update,
    tile_plan,
    tiled_attention,
)


def _reference(query, key, value, is_causal, scale=None):
    """PyTorch's fused attention with the book's bottom-right causal mask."""
    mask = causal_mask(query.size(-2), key.size(-2)) if is_causal else None
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def _qkv(lead, num_queries, num_keys, d_k, d_v, seed=0):
    torch.manual_seed(seed)
    return (torch.randn(*lead, num_queries, d_k), torch.randn(*lead, num_keys, d_k),
            torch.randn(*lead, num_keys, d_v))


# ---------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_online_softmax_equals_softmax(block_size, dim):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5) * 5  # (4, 6, 5)
    torch.testing.assert_close(online_softmax(x, dim, block_size=block_size), softmax(x, dim))
    torch.testing.assert_close(online_softmax(x, dim, block_size=block_size),
                               torch.softmax(x, dim))


def test_online_softmax_large_scores_and_masked_rows():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [float("-inf")] * 3,
                      [float("-inf"), 0.0, float("-inf")]])
    weights = online_softmax(x, block_size=1)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights[0], torch.softmax(x[0], dim=0))
    assert torch.equal(weights[1], torch.zeros(3))
    assert torch.equal(weights[2], torch.tensor([0.0, 1.0, 0.0]))


def test_online_softmax_update_keeps_its_invariant():
    torch.manual_seed(0)
    scores = torch.randn(3, 10) * 4  # (3, 10)
    running_max = torch.full((3,), float("-inf"))
    running_sum = torch.zeros(3)
    for start in range(0, 10, 4):
        running_max, running_sum = online_softmax_update(
            running_max, running_sum, scores[:, start:start + 4])
        seen = scores[:, :start + 4]
        torch.testing.assert_close(running_max, seen.amax(dim=-1))
        torch.testing.assert_close(
            running_sum, torch.exp(seen - running_max.unsqueeze(-1)).sum(dim=-1))


def test_online_softmax_update_checks_shapes():
    with pytest.raises(ValueError, match="without its last dim"):
        online_softmax_update(torch.zeros(3), torch.zeros(3), torch.zeros(4, 2))
    with pytest.raises(TypeError, match="floating-point"):
        online_softmax_update(torch.zeros(3), torch.zeros(3), torch.zeros(3, 2, dtype=torch.long))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 12), block_size=st.integers(1, 13),
       seed=st.integers(0, 10_000), spread=st.sampled_from([0.1, 1.0, 30.0]))
def test_online_softmax_property(rows, cols, block_size, seed, spread):
    torch.manual_seed(seed)
    x = torch.randn(rows, cols) * spread  # (rows, cols)
    torch.testing.assert_close(online_softmax(x, block_size=block_size), torch.softmax(x, -1))


# ---------------------------------------------------------------- tiled attention


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    ("lead", "num_queries", "num_keys", "block_size"),
    [
        ((), 8, 8, 4),  # no leading dims, T a multiple of block_size
        ((2,), 10, 10, 4),  # T not a multiple
        ((2, 3), 13, 13, 5),  # (B, H, T, d)
        ((2, 3), 5, 17, 4),  # fewer queries than keys: decoding after a prompt
        ((2, 3), 17, 5, 4),  # more queries than keys: some queries see no key
        ((1, 2, 3), 9, 9, 128),  # one block covers everything
        ((2,), 6, 6, 1),  # one key at a time
    ],
)
def test_tiled_attention_equals_pytorch(lead, num_queries, num_keys, block_size, is_causal):
    query, key, value = _qkv(lead, num_queries, num_keys, d_k=8, d_v=6)
    out = tiled_attention(query, key, value, block_size=block_size, is_causal=is_causal)
    assert out.shape == (*lead, num_queries, 6)
    torch.testing.assert_close(out, _reference(query, key, value, is_causal), atol=1e-5, rtol=0)


def test_tiled_attention_is_pytorch_is_causal_when_lengths_match():
    query, key, value = _qkv((2, 3), 33, 33, d_k=8, d_v=8)
    torch.testing.assert_close(
        tiled_attention(query, key, value, block_size=8, is_causal=True),
        F.scaled_dot_product_attention(query, key, value, is_causal=True), atol=1e-5, rtol=0)


def test_tiled_attention_custom_scale_and_broadcast_leading_dims():
    torch.manual_seed(0)
    query = torch.randn(2, 3, 7, 4)  # (B, H, T_q, d)
    key = torch.randn(1, 3, 9, 4)  # broadcasts over B
    value = torch.randn(2, 1, 9, 5)  # broadcasts over H
    out = tiled_attention(query, key, value, block_size=4, is_causal=True, scale=0.3)
    expected, _ = scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.3)
    assert out.shape == (2, 3, 7, 5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_tiled_attention_rows_without_keys_are_zero():
    query, key, value = _qkv((2,), 6, 2, d_k=4, d_v=3)
    out = tiled_attention(query, key, value, block_size=2, is_causal=True)
    # Bottom-right alignment: the first T_q - T_k = 4 queries may see no key at all.
    assert torch.equal(out[:, :4], torch.zeros(2, 4, 3))
    assert torch.isfinite(out).all()


def test_tiled_attention_large_scores_do_not_overflow():
    query, key, value = _qkv((2,), 10, 10, d_k=4, d_v=4)
    out = tiled_attention(query * 300, key, value, block_size=3, is_causal=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, _reference(query * 300, key, value, True), atol=1e-5, rtol=0)


def test_tiled_attention_gradients_match():
    query, key, value = _qkv((2, 2), 7, 7, d_k=4, d_v=4)
    leaves = [t.clone().requires_grad_() for t in (query, key, value)]
    tiled_attention(*leaves, block_size=3, is_causal=True).square().sum().backward()
    refs = [t.clone().requires_grad_() for t in (query, key, value)]
    _reference(*refs, True).square().sum().backward()
    for mine, theirs in zip(leaves, refs, strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-4)


class _LargestResult(TorchDispatchMode):
    """Record the largest number of elements any operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor):
                self.largest = max(self.largest, item.numel())
        return result


def test_tiled_attention_never_builds_the_full_score_matrix():
    query, key, value = _qkv((2, 2), 256, 256, d_k=8, d_v=8)
    with _LargestResult() as naive_mode:
        scaled_dot_product_attention(query, key, value, is_causal=True)
    with _LargestResult() as tiled_mode:
        tiled_attention(query, key, value, block_size=32, is_causal=True)
    full_scores = 2 * 2 * 256 * 256
    assert naive_mode.largest >= full_scores  # the check can see a (T, T) matrix
    # The largest tensor is the (B, H, T, d_v) output; tiles are (B, H, 32, 32).
    assert tiled_mode.largest == 2 * 2 * 256 * 8
    assert tiled_mode.largest < full_scores / 8


@pytest.mark.parametrize("block_size", [0, -3])
def test_tiled_attention_rejects_small_block_size(block_size):
    query, key, value = _qkv((), 4, 4, d_k=2, d_v=2)
    with pytest.raises(ValueError, match=f"block_size must be >= 1, got {block_size}"):
        tiled_attention(query, key, value, block_size=block_size)


def test_tiled_attention_rejects_bad_inputs():
    query, key, value = _qkv((2,), 4, 5, d_k=3, d_v=2)
    with pytest.raises(TypeError, match="block_size must be an int"):
        tiled_attention(query, key, value, block_size=2.0)
    with pytest.raises(ValueError, match="same feature size"):
        tiled_attention(query, key[..., :2], value)
    with pytest.raises(ValueError, match="same length T_k"):
        tiled_attention(query, key, value[..., :4, :])
    with pytest.raises(ValueError, match="do not broadcast"):
        tiled_attention(query, torch.randn(3, 5, 3), torch.randn(3, 5, 2))
    with pytest.raises(TypeError, match="floating-point"):
        tiled_attention(query.long(), key, value)
    with pytest.raises(ValueError, match="at least 2 dims"):
        tiled_attention(torch.randn(3), key, value)


@settings(max_examples=40, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    num_queries=st.integers(1, 20),
    num_keys=st.integers(1, 20),
    d_k=st.integers(1, 6),
    d_v=st.integers(1, 6),
    block_size=st.integers(1, 24),
    is_causal=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_tiled_attention_property(lead, num_queries, num_keys, d_k, d_v, block_size, is_causal,
                                  seed):
    query, key, value = _qkv(tuple(lead), num_queries, num_keys, d_k, d_v, seed)
    out = tiled_attention(query, key, value, block_size=block_size, is_causal=is_causal)
    torch.testing.assert_close(out, _reference(query, key, value, is_causal), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- the tile plan


def test_tile_plan_small_example():
    expected = torch.tensor([[DIAGONAL, SKIPPED, SKIPPED],
                             [FULL, DIAGONAL, SKIPPED],
                             [FULL, FULL, DIAGONAL]])
    assert torch.equal(tile_plan(9, 9, 3, is_causal=True), expected)
    assert torch.equal(tile_plan(9, 9, 3), torch.full((3, 3), FULL))


@settings(max_examples=40, deadline=None)
@given(num_queries=st.integers(1, 30), num_keys=st.integers(1, 30), block_size=st.integers(1, 12))
def test_tile_plan_agrees_with_causal_mask(num_queries, num_keys, block_size):
    plan = tile_plan(num_queries, num_keys, block_size, is_causal=True)
    mask = causal_mask(num_queries, num_keys)  # (T_q, T_k)
    assert plan.shape == (-(-num_queries // block_size), -(-num_keys // block_size))
    for row in range(plan.size(0)):
        for col in range(plan.size(1)):
            tile = mask[row * block_size:(row + 1) * block_size,
                        col * block_size:(col + 1) * block_size]
            expected = SKIPPED if not tile.any() else FULL if tile.all() else DIAGONAL
            assert plan[row, col] == expected


def test_tile_plan_skips_about_half_of_a_long_causal_sequence():
    plan = tile_plan(4096, 4096, 128, is_causal=True)
    visited = int((plan != SKIPPED).sum())
    assert visited == 32 * 33 // 2  # the lower triangle of a 32 x 32 grid of tiles


def test_tile_plan_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        tile_plan(4, 4, 0)
    with pytest.raises(ValueError, match="num_keys must be >= 0"):
        tile_plan(4, -1, 2)
