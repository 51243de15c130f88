"""Tests of the attention layers: equivalences with PyTorch, properties, and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attention_book as ab


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _copy_into_torch_mha(ours: ab.MultiHeadAttention, bias: bool) -> nn.MultiheadAttention:
    assert ours.d_in == ours.d_out, "in_proj_weight needs d_in == d_out"
    ref = nn.MultiheadAttention(ours.d_out, ours.num_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_query.weight, ours.W_key.weight, ours.W_value.weight]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.W_query.bias, ours.W_key.bias, ours.W_value.bias]))
            ref.out_proj.bias.copy_(ours.out_proj.bias)
        else:
            ours.out_proj.bias.zero_()  # torch's bias=False also drops the output bias
    return ref


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_mha_equals_torch_multihead_attention(causal, bias):
    torch.manual_seed(0)
    ours = ab.MultiHeadAttention(12, 12, num_heads=3, context_length=8, qkv_bias=bias, causal=causal)
    ref = _copy_into_torch_mha(ours, bias)
    x = _x(2, 7, 12)
    blocked = ~ab.causal_mask(7) if causal else None  # torch's boolean masks: True = blocked
    expected, expected_weights = ref(x, x, x, attn_mask=blocked, need_weights=True,
                                     average_attn_weights=False)
    out, weights = ours(x, return_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)


def test_mha_padding_mask_equals_torch_key_padding_mask():
    torch.manual_seed(1)
    ours = ab.MultiHeadAttention(8, 8, num_heads=2, causal=False)
    ref = _copy_into_torch_mha(ours, bias=False)
    x = _x(2, 5, 8)
    lengths = torch.tensor([5, 3])
    expected, _ = ref(x, x, x, key_padding_mask=~ab.padding_mask(lengths, 5)[:, 0, 0])
    torch.testing.assert_close(ours(x, mask=ab.padding_mask(lengths, 5)), expected)


def test_wrapper_equals_efficient_module_once_weights_are_copied():
    torch.manual_seed(2)
    num_heads, d_in, head_out = 3, 6, 4
    wrapper = ab.MultiHeadAttentionWrapper(d_in, head_out, context_length=9, dropout=0.0,
                                           num_heads=num_heads, qkv_bias=True)
    mha = ab.MultiHeadAttention(d_in, num_heads * head_out, num_heads, context_length=9, qkv_bias=True)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            getattr(mha, name).weight.copy_(torch.cat([getattr(h, name).weight for h in wrapper.heads]))
            getattr(mha, name).bias.copy_(torch.cat([getattr(h, name).bias for h in wrapper.heads]))
        mha.out_proj.weight.copy_(torch.eye(num_heads * head_out))
        mha.out_proj.bias.zero_()
    x = _x(2, 9, d_in)
    out_w, weights_w = wrapper(x, return_weights=True)
    out_m, weights_m = mha(x, return_weights=True)
    torch.testing.assert_close(out_w, out_m)
    torch.testing.assert_close(weights_w, weights_m)
    assert out_w.shape == (2, 9, num_heads * head_out)


@pytest.mark.parametrize("causal", [True, False])
def test_naive_backend_equals_sdpa_backend(causal):
    torch.manual_seed(3)
    naive = ab.MultiHeadAttention(16, 16, num_heads=4, context_length=10, causal=causal, qkv_bias=True)
    fused = ab.MultiHeadAttention(16, 16, num_heads=4, context_length=10, causal=causal,
                                  qkv_bias=True, backend="sdpa")
    fused.load_state_dict(naive.state_dict())
    x = _x(3, 10, 16)
    mask = ab.padding_mask([10, 6, 1], 10)
    torch.testing.assert_close(naive(x), fused(x))
    torch.testing.assert_close(naive(x, mask=mask), fused(x, mask=mask))


def test_single_head_modules_match_manual_computation():
    torch.manual_seed(4)
    layer = ab.SelfAttention(3, 2)
    x = _x(6, 3)
    q, k, v = x @ layer.W_query.weight.T, x @ layer.W_key.weight.T, x @ layer.W_value.weight.T
    weights = torch.softmax(q @ k.T / 2**0.5, dim=-1)
    torch.testing.assert_close(layer(x), weights @ v)
    causal = ab.CausalSelfAttention(3, 2, context_length=6)
    causal.load_state_dict(layer.state_dict())
    masked = torch.softmax((q @ k.T / 2**0.5).masked_fill(~ab.causal_mask(6), float("-inf")), dim=-1)
    torch.testing.assert_close(causal(x), masked @ v)


LAYERS = {
    "causal": lambda: ab.CausalSelfAttention(4, 4, context_length=8),
    "wrapper": lambda: ab.MultiHeadAttentionWrapper(4, 2, 8, 0.0, num_heads=2),
    "mha": lambda: ab.MultiHeadAttention(4, 4, num_heads=2, context_length=8),
    "mha-no-length": lambda: ab.MultiHeadAttention(4, 4, num_heads=2),
    "gqa": lambda: ab.GroupedQueryAttention(4, 4, num_heads=2, num_kv_heads=1, context_length=8),
}


@pytest.mark.parametrize("name", LAYERS)
def test_causal_layers_ignore_future_tokens(name):
    torch.manual_seed(5)
    layer = LAYERS[name]()
    x = _x(2, 8, 4)
    for j in range(8):
        changed = x.clone()
        changed[:, j] += 5.0
        torch.testing.assert_close(layer(x)[:, :j], layer(changed)[:, :j])
        assert not torch.allclose(layer(x)[:, j:], layer(changed)[:, j:])


@pytest.mark.parametrize("name", LAYERS)
def test_weight_rows_sum_to_one(name):
    torch.manual_seed(6)
    _, weights = LAYERS[name]()(_x(3, 5, 4), return_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


def test_permutation_equivariance_without_causal_mask():
    torch.manual_seed(7)
    layer = ab.MultiHeadAttention(6, 6, num_heads=2, causal=False)
    x = _x(7, 6)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(layer(x[perm]), layer(x)[perm])
    single = ab.SelfAttention(6, 3)
    torch.testing.assert_close(single(x[perm]), single(x)[perm])


@pytest.mark.parametrize("make", [
    lambda p: ab.CausalSelfAttention(4, 4, context_length=6, dropout=p),
    lambda p: ab.MultiHeadAttention(4, 4, num_heads=2, context_length=6, dropout=p),
])
def test_dropout_keeps_expectation_and_is_off_in_eval(make):
    torch.manual_seed(8)
    layer = make(0.4)
    x = _x(6, 4)
    layer.eval()
    _, clean = layer(x, return_weights=True)
    torch.testing.assert_close(layer(x), layer(x))  # deterministic in eval
    layer.train()
    torch.manual_seed(9)
    draws = torch.stack([layer(x, return_weights=True)[1] for _ in range(3000)])
    assert (draws[:, ..., clean > 0] == 0).float().mean().item() == pytest.approx(0.4, abs=0.02)
    torch.testing.assert_close(draws.mean(0), clean, atol=0.03, rtol=0.06)


def test_mask_is_a_buffer_not_a_weight():
    layer = ab.CausalSelfAttention(4, 4, context_length=5)
    assert "mask" in dict(layer.named_buffers())
    assert "mask" not in layer.state_dict()
    assert all(p.dtype.is_floating_point for p in layer.parameters())
    assert layer.to(torch.float64).mask.dtype == torch.bool


def test_any_number_of_leading_dims():
    torch.manual_seed(10)
    layer = ab.MultiHeadAttention(4, 4, num_heads=2, context_length=5)
    x = _x(2, 3, 5, 4)
    expected = torch.stack([layer(x[i]) for i in range(2)])
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(layer(x[0, 0]), layer(x[0, 0].unsqueeze(0))[0])


def test_bad_input_errors_name_the_sizes():
    with pytest.raises(ValueError, match=r"d_out \(10\) must be divisible by num_heads \(3\)"):
        ab.MultiHeadAttention(4, 10, num_heads=3)
    with pytest.raises(ValueError, match=r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        ab.GroupedQueryAttention(12, 12, num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"dropout must lie in \[0, 1\), got 1.0"):
        ab.CausalSelfAttention(4, 4, context_length=3, dropout=1.0)
    with pytest.raises(ValueError, match="backend"):
        ab.MultiHeadAttention(4, 4, 2, backend="flash")
    layer = ab.MultiHeadAttention(4, 4, num_heads=2, context_length=5)
    with pytest.raises(ValueError, match=r"T=6 exceeds context_length=5"):
        layer(torch.randn(1, 6, 4))
    with pytest.raises(ValueError, match=r"3 features.*d_in=4"):
        layer(torch.randn(1, 5, 3))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.ones(1, 5, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\).*\(1, 2, 5, 5\)"):
        layer(torch.randn(1, 5, 4), mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"T=4 exceeds context_length=3"):
        ab.CausalSelfAttention(4, 4, context_length=3)(torch.randn(4, 4))
    with pytest.raises(ValueError, match="does not return attention weights"):
        ab.MultiHeadAttention(4, 4, 2, backend="sdpa")(torch.randn(2, 4), return_weights=True)


def test_fused_attention_adds_the_sink_and_the_groups_the_kernel_has_no_argument_for():
    from torch.nn.attention.bias import causal_lower_right

    from attention_book.fused import fused_attention

    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(2, 4, 3, 8, generator=generator, dtype=torch.float64)  # 4 query heads
    keys = torch.randn(2, 2, 5, 8, generator=generator, dtype=torch.float64)  # 2 key/value heads
    values = torch.randn(2, 2, 5, 8, generator=generator, dtype=torch.float64)
    sink = torch.tensor([0.5, -1.0, 0.0, 2.0], dtype=torch.float64)[:, None]  # (H, 1): per head
    wide_keys, wide_values = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)
    mask = ab.causal_mask(3, 5)  # (T, T_k), bottom-right
    expected, _ = ab.scaled_dot_product_attention(queries, wide_keys, wide_values, mask,
                                               sink_logit=sink[:, 0])
    torch.testing.assert_close(fused_attention(queries, keys, values, mask, sink_logit=sink[:, 0]),
                               expected)
    plain, _ = ab.scaled_dot_product_attention(queries, wide_keys, wide_values, mask)
    torch.testing.assert_close(fused_attention(queries, keys, values, causal_lower_right(3, 5)),
                               plain)
    square = queries[..., :3, :], keys[..., :3, :], values[..., :3, :]
    causal, _ = ab.scaled_dot_product_attention(square[0], square[1].repeat_interleave(2, dim=1),
                                             square[2].repeat_interleave(2, dim=1),
                                             ab.causal_mask(3), sink_logit=sink[:, 0])
    torch.testing.assert_close(fused_attention(*square, is_causal=True, sink_logit=sink[:, 0]),
                               causal)
    with pytest.raises(TypeError, match="a sink needs a boolean attn_mask"):
        fused_attention(queries, keys, values, causal_lower_right(3, 5), sink_logit=0.5)
