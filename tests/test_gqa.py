"""GroupedQueryAttention: equivalences with multi-head attention, a hand-made reference, and errors.

Taught in chapter 7.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention_book import (
    GroupedQueryAttention,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
)

D_IN, D_OUT, NUM_HEADS, T = 10, 12, 4, 6


def _inputs(batch: int = 2, num_tokens: int = T, d_in: int = D_IN) -> torch.Tensor:
    torch.manual_seed(123)
    return torch.randn(batch, num_tokens, d_in)


def _reference_gqa(layer: GroupedQueryAttention, x: torch.Tensor, causal: bool):
    """Grouped-query attention written out head by head, with explicit loops.

    Query head ``h`` uses key/value head ``h // group_size``: the key/value heads are expanded
    by indexing, not by ``repeat_interleave``, so this is an independent reading of the rule.
    """
    head_dim = layer.head_dim
    group_size = layer.num_heads // layer.num_kv_heads
    queries = layer.W_query(x)  # (B, T, d_out)
    keys = layer.W_key(x)  # (B, T, num_kv_heads * head_dim)
    values = layer.W_value(x)  # (B, T, num_kv_heads * head_dim)
    num_tokens = x.size(-2)
    outputs, weights = [], []
    for head in range(layer.num_heads):
        kv_head = head // group_size
        q = queries[..., head * head_dim:(head + 1) * head_dim]  # (B, T, head_dim)
        k = keys[..., kv_head * head_dim:(kv_head + 1) * head_dim]  # (B, T, head_dim)
        v = values[..., kv_head * head_dim:(kv_head + 1) * head_dim]  # (B, T, head_dim)
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (B, T, T)
        if causal:
            future = torch.ones(num_tokens, num_tokens, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, dim=-1)  # (B, T, T)
        outputs.append(attn @ v)  # (B, T, head_dim)
        weights.append(attn)
    context = torch.cat(outputs, dim=-1)  # (B, T, d_out)
    return layer.out_proj(context), torch.stack(weights, dim=-3)  # (B, T, d_out), (B, H, T, T)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mha_state_dict_loads_into_gqa_with_as_many_kv_heads(causal, qkv_bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, context_length=T, qkv_bias=qkv_bias,
                             causal=causal)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads=NUM_HEADS,
                                context_length=T, qkv_bias=qkv_bias, causal=causal)
    result = gqa.load_state_dict(mha.state_dict())  # strict: every name and shape must match
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert mha.state_dict().keys() == gqa.state_dict().keys()
    x = _inputs()
    out_mha, w_mha = mha(x, return_weights=True)
    out_gqa, w_gqa = gqa(x, return_weights=True)
    torch.testing.assert_close(out_gqa, out_mha)
    torch.testing.assert_close(w_gqa, w_mha)


@pytest.mark.parametrize("causal", [True, False])
def test_mha_equals_gqa_with_a_padding_mask(causal):
    torch.manual_seed(1)
    mha = MultiHeadAttention(D_IN, D_OUT, NUM_HEADS, causal=causal)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, NUM_HEADS, causal=causal)
    gqa.load_state_dict(mha.state_dict())
    x = _inputs()
    mask = padding_mask([T, 3], T)  # (B, 1, 1, T)
    torch.testing.assert_close(gqa(x, mask), mha(x, mask))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_gqa_equals_a_head_by_head_reference(num_kv_heads, causal, qkv_bias):
    torch.manual_seed(2)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads, qkv_bias=qkv_bias,
                                causal=causal)
    x = _inputs()
    expected_out, expected_weights = _reference_gqa(gqa, x, causal)
    out, weights = gqa(x, return_weights=True)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(weights, expected_weights)


def test_multi_query_heads_share_one_key_projection():
    torch.manual_seed(3)
    mqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads=1)
    head_dim = D_OUT // NUM_HEADS
    assert mqa.W_key.weight.shape == (head_dim, D_IN)
    assert mqa.W_value.weight.shape == (head_dim, D_IN)
    # Making all query heads equal must make all heads' weights equal: they share K.
    with torch.no_grad():
        first = mqa.W_query.weight[:head_dim].clone()
        mqa.W_query.weight.copy_(first.repeat(NUM_HEADS, 1))
    _, weights = mqa(_inputs(), return_weights=True)  # (B, num_heads, T, T)
    for head in range(1, NUM_HEADS):
        torch.testing.assert_close(weights[:, head], weights[:, 0])


def test_gqa_groups_are_consecutive_query_heads():
    """With 4 query heads and 2 kv heads, heads 0,1 read kv head 0 and heads 2,3 kv head 1."""
    torch.manual_seed(4)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads=2, causal=False)
    head_dim = D_OUT // NUM_HEADS
    with torch.no_grad():
        first = gqa.W_query.weight[:head_dim].clone()
        gqa.W_query.weight.copy_(first.repeat(NUM_HEADS, 1))
    _, weights = gqa(_inputs(), return_weights=True)
    torch.testing.assert_close(weights[:, 1], weights[:, 0])
    torch.testing.assert_close(weights[:, 3], weights[:, 2])
    assert not torch.allclose(weights[:, 2], weights[:, 0])


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_naive_equals_sdpa(num_kv_heads, causal):
    torch.manual_seed(5)
    naive = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads, qkv_bias=True,
                                  causal=causal, backend="naive")
    sdpa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, num_kv_heads, qkv_bias=True,
                                 causal=causal, backend="sdpa")
    sdpa.load_state_dict(naive.state_dict())
    x = _inputs()
    torch.testing.assert_close(sdpa(x), naive(x))
    mask = padding_mask([T, 4], T)  # (B, 1, 1, T)
    torch.testing.assert_close(sdpa(x, mask), naive(x, mask))


def test_sdpa_backend_refuses_to_return_weights():
    layer = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, 2, backend="sdpa")
    with pytest.raises(ValueError, match="backend='naive'"):
        layer(_inputs(), return_weights=True)


def test_causal_gqa_ignores_the_future():
    torch.manual_seed(6)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, 2, context_length=T)
    x = _inputs()
    changed = x.clone()
    changed[:, -1] += 10.0  # only the last token changes
    torch.testing.assert_close(gqa(changed)[:, :-1], gqa(x)[:, :-1])
    _, weights = gqa(x, return_weights=True)
    assert torch.all(weights.masked_select(~causal_mask(T)) == 0)


def test_shapes_unbatched_and_batched():
    torch.manual_seed(7)
    gqa = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, 2)
    x = _inputs(batch=3)
    out, weights = gqa(x, return_weights=True)
    assert out.shape == (3, T, D_OUT)
    assert weights.shape == (3, NUM_HEADS, T, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, NUM_HEADS, T))
    torch.testing.assert_close(gqa(x[1]), out[1])


def _gqa_param_count(d_in, d_out, num_heads, num_kv_heads, qkv_bias):
    kv_dim = num_kv_heads * (d_out // num_heads)
    query = d_in * d_out + (d_out if qkv_bias else 0)
    key_value = 2 * (d_in * kv_dim + (kv_dim if qkv_bias else 0))
    out_proj = d_out * d_out + d_out
    return query + key_value + out_proj


@pytest.mark.parametrize(
    ("d_in", "d_out", "num_heads", "num_kv_heads", "qkv_bias"),
    [(10, 12, 4, 4, False), (10, 12, 4, 2, True), (10, 12, 4, 1, True), (768, 768, 12, 4, True)],
)
def test_parameter_count_formula(d_in, d_out, num_heads, num_kv_heads, qkv_bias):
    layer = GroupedQueryAttention(d_in, d_out, num_heads, num_kv_heads, qkv_bias=qkv_bias)
    actual = sum(p.numel() for p in layer.parameters())
    assert actual == _gqa_param_count(d_in, d_out, num_heads, num_kv_heads, qkv_bias)


def test_parameter_count_equals_mha_with_as_many_kv_heads():
    gqa = GroupedQueryAttention(768, 768, 12, 12, qkv_bias=True)
    mha = MultiHeadAttention(768, 768, 12, qkv_bias=True)
    assert sum(p.numel() for p in gqa.parameters()) == sum(p.numel() for p in mha.parameters())
    assert sum(p.numel() for p in gqa.parameters()) == 2_362_368


def test_fewer_kv_heads_means_fewer_parameters():
    counts = [
        sum(p.numel() for p in GroupedQueryAttention(64, 64, 8, kv).parameters())
        for kv in (8, 4, 2, 1)
    ]
    assert counts == sorted(counts, reverse=True)
    assert len(set(counts)) == 4


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "message"),
    [
        (6, 4, r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"),
        (4, 8, r"num_heads \(4\) must be a multiple of num_kv_heads \(8\)"),
        (4, 3, r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"),
    ],
)
def test_num_heads_must_be_a_multiple_of_num_kv_heads(num_heads, num_kv_heads, message):
    with pytest.raises(ValueError, match=message):
        GroupedQueryAttention(12, 12, num_heads, num_kv_heads)


def test_d_out_must_be_divisible_by_num_heads():
    with pytest.raises(ValueError, match=r"d_out \(10\) must be divisible by num_heads \(3\)"):
        GroupedQueryAttention(8, 10, 3, 1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_kv_heads": 0}, ValueError, r"num_kv_heads must be >= 1, got 0"),
        ({"num_kv_heads": 2.0}, TypeError, r"num_kv_heads must be an int, got float"),
        ({"backend": "flash"}, ValueError, r"backend must be 'naive' or 'sdpa', got 'flash'"),
        ({"dropout": 1.0}, ValueError, r"dropout must lie in \[0, 1\), got 1.0"),
    ],
)
def test_other_bad_arguments(kwargs, error, message):
    arguments = {"d_in": 8, "d_out": 8, "num_heads": 4, "num_kv_heads": 2} | kwargs
    with pytest.raises(error, match=message):
        GroupedQueryAttention(**arguments)


def test_bad_input_names_the_sizes():
    layer = GroupedQueryAttention(D_IN, D_OUT, NUM_HEADS, 2, context_length=T)
    with pytest.raises(ValueError, match=r"but the layer was built with d_in=10"):
        layer(torch.randn(2, T, D_IN + 1))
    with pytest.raises(ValueError, match=r"T=7 exceeds context_length=6"):
        layer(torch.randn(2, T + 1, D_IN))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        layer(_inputs(), torch.ones(T + 1, T + 1, dtype=torch.bool))


@pytest.mark.parametrize("num_kv_heads", [1, 2, 6])
def test_sdpa_backend_matches_naive_for_groups_masks_and_cached_decoding(num_kv_heads):
    """The fused path (enable_gqa, causal_lower_right while decoding) computes what naive does."""
    from attention_book import KVCache, padding_mask

    torch.manual_seed(0)
    naive = GroupedQueryAttention(12, 12, 6, num_kv_heads, context_length=8)
    fused = GroupedQueryAttention(12, 12, 6, num_kv_heads, context_length=8, backend="sdpa")
    fused.load_state_dict(naive.state_dict())
    x = torch.randn(2, 7, 12)  # (B, T, d_in)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), naive(x))
        mask = padding_mask([7, 4], 7)  # (B, 1, 1, T)
        torch.testing.assert_close(fused(x, mask), naive(x, mask))
        cache = KVCache(8)
        fused(x[:, :3], kv_cache=cache)
        steps = [fused(x[:, t:t + 2], kv_cache=cache) for t in (3, 5)]
        torch.testing.assert_close(torch.cat(steps, dim=1), naive(x)[:, 3:7])
