"""Tests for attention_book.flash: the online softmax, partial attention and its one merge, and
tiled (FlashAttention-style) attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attention_book import causal_mask, flash, scaled_dot_product_attention, softmax
from attention_book.attention import softmax_with_sink
from attention_book.flash import (
    DIAGONAL,
    FULL,
    SKIPPED,
    accumulation_dtype,
    add_sink,
    empty_partial,
    merge_partials,
    online_softmax,
    online_softmax_update,
    partial_attention,
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


# ---------------------------------------------------------------- the partial-attention primitive


def _positions_mask(query_positions, key_positions, window=None):
    """True where a query may see a key: key_pos <= query_pos (and within the window)."""
    distance = query_positions[:, None] - key_positions[None, :]
    allowed = distance >= 0
    return allowed if window is None else allowed & (distance < window)


@pytest.mark.parametrize("window", [None, 3])
def test_partial_attention_is_attention_over_its_block_masked_by_positions(window):
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, n, 4, dtype=torch.float64) for n in (5, 7, 7))
    value = value[..., :3]  # d_v = 3
    # Scattered positions, as a zig-zag shard holds them.
    query_positions, key_positions = torch.tensor([0, 1, 12, 13, 14]), torch.arange(4, 11)
    output, lse = partial_attention(query, key, value, query_positions=query_positions,
                                    key_positions=key_positions, is_causal=True, window=window)
    allowed = _positions_mask(query_positions, key_positions, window)
    scores = (query @ key.transpose(-2, -1) / 2).masked_fill(~allowed, float("-inf"))
    expected_lse = torch.logsumexp(scores, dim=-1)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse))
    seen = ~torch.isneginf(expected_lse)
    torch.testing.assert_close(lse[seen], expected_lse[seen], rtol=0, atol=1e-12)
    expected = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ value
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-12)
    # Queries 0 and 1 see no key of the block: output 0 and LSE -inf, never NaN.
    assert torch.equal(output[..., :2, :], torch.zeros(2, 3, 2, 3, dtype=torch.float64))
    assert bool(torch.isneginf(lse[..., :2]).all())


def test_partial_attention_without_positions_is_bottom_right_causal():
    query, key, value = _qkv((2, 3), 4, 9, d_k=8, d_v=5)
    output, lse = partial_attention(query, key, value, is_causal=True)
    torch.testing.assert_close(output, _reference(query, key, value, True), atol=1e-6, rtol=0)
    scores = (query @ key.transpose(-2, -1) / 8**0.5).masked_fill(~causal_mask(4, 9), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))
    empty_out, empty_lse = partial_attention(query, key[..., :0, :], value[..., :0, :])
    assert torch.equal(empty_out, torch.zeros(2, 3, 4, 5)) and bool(torch.isneginf(empty_lse).all())


def test_partial_attention_groups_key_value_heads():
    torch.manual_seed(1)
    query, key, value = torch.randn(2, 6, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 3)
    output, lse = partial_attention(query, key, value, is_causal=True)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=causal_mask(5, 7),
                                              enable_gqa=True)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)
    assert lse.shape == (2, 6, 5)
    with pytest.raises(ValueError, match="query has 6 heads .* and key and value 4"):
        partial_attention(query, torch.randn(2, 4, 7, 4), torch.randn(2, 4, 7, 3))


@settings(max_examples=30, deadline=None)
@given(num_keys=st.integers(0, 12), cut=st.integers(0, 12), is_causal=st.booleans(),
       seed=st.integers(0, 10_000))
def test_merging_two_parts_gives_attention_over_both(num_keys, cut, is_causal, seed):
    """Any split of the keys, parts empty or fully masked included, merges back exactly."""
    cut = min(cut, num_keys)
    generator = torch.Generator().manual_seed(seed)
    query = 3 * torch.randn(2, 5, 4, generator=generator, dtype=torch.float64)
    key = 3 * torch.randn(2, num_keys, 4, generator=generator, dtype=torch.float64)
    value = torch.randn(2, num_keys, 3, generator=generator, dtype=torch.float64)
    query_positions, key_positions = torch.arange(3, 8), torch.arange(num_keys)
    whole = partial_attention(query, key, value, query_positions=query_positions,
                              key_positions=key_positions, is_causal=is_causal)
    parts = [partial_attention(query, key[:, piece], value[:, piece],
                               query_positions=query_positions, key_positions=key_positions[piece],
                               is_causal=is_causal)
             for piece in (slice(0, cut), slice(cut, num_keys))]
    merged = merge_partials(*parts[0], *parts[1])
    torch.testing.assert_close(merged[0], whole[0], rtol=0, atol=1e-12)
    assert torch.equal(torch.isneginf(merged[1]), torch.isneginf(whole[1]))
    torch.testing.assert_close(merged[1].nan_to_num(neginf=0.0), whole[1].nan_to_num(neginf=0.0),
                               rtol=0, atol=1e-12)
    assert not merged[0].isnan().any()


def test_the_empty_partial_is_the_identity_of_the_merge():
    torch.manual_seed(2)
    output, lse = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5) * 10
    lse[0, 0, 0] = float("-inf")
    output[0, 0, 0] = 0.0
    empty = empty_partial(torch.zeros(2, 3, 5, 7), 4)
    for merged in (merge_partials(*empty, output, lse), merge_partials(output, lse, *empty)):
        assert torch.equal(merged[0], output) and torch.equal(merged[1], lse)


def test_merging_is_nan_free_in_the_backward_pass_too():
    output = torch.randn(3, 2)
    output[0] = 0.0  # a row that saw no key has output 0, as partial_attention gives it
    output.requires_grad_()
    lse = torch.tensor([float("-inf"), 0.5, float("-inf")], requires_grad=True)
    other_lse = torch.tensor([float("-inf"), float("-inf"), 1.0], requires_grad=True)
    merged, merged_lse = merge_partials(output, lse, torch.ones(3, 2), other_lse)
    assert torch.isneginf(merged_lse[0]) and torch.equal(merged[0], torch.zeros(2))
    (merged.sum() + merged_lse[1:].sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (output, lse, other_lse))


def test_merge_partials_checks_its_inputs():
    with pytest.raises(ValueError, match=r"output_a \(3, 2\), lse_a \(4,\)"):
        merge_partials(torch.zeros(3, 2), torch.zeros(4), torch.zeros(3, 2), torch.zeros(4))
    with pytest.raises(TypeError, match="lse_b must be a floating-point tensor"):
        merge_partials(torch.zeros(3, 2), torch.zeros(3), torch.zeros(3, 2),
                       torch.zeros(3, dtype=torch.long))


def test_a_sink_is_one_more_part_with_output_zero():
    torch.manual_seed(3)
    output, lse = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4)
    sinks = torch.tensor([0.5, -1.0, 2.0])
    gated, new_lse = add_sink(output, lse, sinks)
    torch.testing.assert_close(gated, output * torch.sigmoid(lse - sinks[:, None])[..., None])
    torch.testing.assert_close(new_lse, torch.logaddexp(lse, sinks[:, None].expand(2, 3, 4)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_inputs_accumulate_in_float32(dtype):
    """Partial results are float32; tiled attention returns the inputs' dtype, and its error
    against float64 stays within twice that of PyTorch's fused kernel in the same dtype."""
    torch.manual_seed(4)
    query, key, value = (torch.randn(1, 4, 256, 64).to(dtype) for _ in range(3))
    output, lse = partial_attention(query, key, value)
    assert output.dtype == lse.dtype == torch.float32 == accumulation_dtype(dtype)
    assert merge_partials(output, lse, output, lse)[0].dtype == torch.float32
    assert merge_partials(output.to(dtype), lse, output.to(dtype), lse)[0].dtype == dtype
    assert accumulation_dtype(torch.float64) == torch.float64
    reference = F.scaled_dot_product_attention(query.double(), key.double(), value.double(),
                                               is_causal=True)
    fused = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    tiled = tiled_attention(query, key, value, block_size=32, is_causal=True)
    assert tiled.dtype == dtype
    fused_error = (fused.double() - reference).abs().max()
    assert (tiled.double() - reference).abs().max() <= 2 * fused_error


# ---------------------------------------------------------------- one merge for every algorithm


def _count_merges(monkeypatch, module):
    """Wrap the ``merge_partials`` that ``module`` calls; return the list its calls append to."""
    calls = []
    merge = flash.merge_partials
    assert module.merge_partials is merge  # the one merge, imported

    def counting(*args):
        calls.append(args[0].shape)
        return merge(*args)

    monkeypatch.setattr(module, "merge_partials", counting)
    return calls


def test_tiled_attention_and_the_sinks_call_the_one_merge(monkeypatch):
    calls = _count_merges(monkeypatch, flash)
    query, key, value = _qkv((1, 2), 40, 40, d_k=4, d_v=4)
    expected = _reference(query, key, value, True)
    torch.testing.assert_close(tiled_attention(query, key, value, block_size=16, is_causal=True),
                               expected, atol=1e-5, rtol=0)
    assert len(calls) == int((tile_plan(40, 40, 16, is_causal=True) != SKIPPED).sum()) == 6
    calls.clear()
    tiled_attention(query, key, value, block_size=16, is_causal=True, sink_logit=0.5)
    assert len(calls) == 6 + 1  # the tiles, then the sink
    calls.clear()
    softmax_with_sink(torch.randn(3, 5), 0.2)
    assert len(calls) == 1


def test_the_ring_the_all_gather_and_ulysses_call_the_one_merge(monkeypatch):
    """Every context-parallel algorithm (forward: the simulator, and the per-rank functions on
    a group of one rank) merges its tiles with flash.merge_partials and has no merge of its own."""
    import torch.distributed as dist

    from attention_book.distributed import algorithms

    calls = _count_merges(monkeypatch, algorithms)
    torch.manual_seed(5)
    query, key, value = (torch.randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=True)
    output = algorithms.simulate_ring_attention(query, key, value, 2, is_causal=True,
                                                layout="zigzag")
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-12)
    # zig-zag: every rank computes 2P + 1 = 5 tiles of a chunk against a chunk (chapter 17)
    assert len(calls) == 2 * 5
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for method in (algorithms.ring_attention, algorithms.allgather_kv_attention,
                       algorithms.ulysses_attention):
            calls.clear()
            torch.testing.assert_close(method(query, key, value, is_causal=True), expected,
                                       rtol=0, atol=1e-12)
            assert len(calls) == 1, method.__name__  # one rank, one tile
    finally:
        dist.destroy_process_group()


def test_no_other_module_merges_partial_results():
    """logaddexp, the merge's heart, appears in flash.py only (the chapter-17 checkers build
    deliberately broken rings by hand, and are the one exception)."""
    import ast
    from pathlib import Path

    package = Path(flash.__file__).parent
    users = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "logaddexp":
                users.append(path.relative_to(package).as_posix())
    assert sorted(set(users)) == ["exercises/ch17.py"]
