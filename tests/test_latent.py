"""Chapter 14: multi-head latent attention (MLA), its latent cache and the weight-absorption trick."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_book as ab
from attention_book.diagnose import diagnose
from attention_book.kv_cache import KVCache
from attention_book.latent import MultiHeadLatentAttention


def _layer(*args, seed=0, sink_values=None, **kwargs):
    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(*args, **kwargs).double().eval()
    if sink_values is not None:
        with torch.no_grad():
            layer.sink_logit.copy_(torch.tensor(sink_values, dtype=torch.float64))
    return layer


def _by_hand(layer, x, mask=None):
    """The unabsorbed form written out from the layer's weights, with plain matrix products."""
    batch, num_tokens, _ = x.shape
    heads, head_dim = layer.num_heads, layer.head_dim
    latent = x @ layer.W_down_kv.weight.T  # (B, T, latent_dim)
    queries = (x @ layer.W_query.weight.T).view(batch, num_tokens, heads, head_dim).transpose(1, 2)
    keys = (latent @ layer.W_key.weight.T).view(batch, num_tokens, heads, head_dim).transpose(1, 2)
    values = (latent @ layer.W_value.weight.T).view(batch, num_tokens, heads, head_dim).transpose(1, 2)
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, T, T)
    allowed = ab.causal_mask(num_tokens) if layer.causal else torch.ones(num_tokens, num_tokens,
                                                                          dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    if layer.sink_logit is None:
        weights = ab.softmax(scores)
    else:
        weights = ab.softmax_with_sink(scores, layer.sink_logit)
    context = (weights @ values).transpose(1, 2).reshape(batch, num_tokens, -1)  # (B, T, d_out)
    return layer.out_proj(context), weights


@settings(max_examples=25, deadline=None)
@given(num_heads=st.integers(1, 4), head_dim=st.integers(1, 5), latent_dim=st.integers(1, 9),
       num_tokens=st.integers(1, 7), causal=st.booleans(), sink=st.booleans(),
       seed=st.integers(0, 50))
def test_absorbed_and_unabsorbed_forms_agree_with_the_form_written_by_hand(
        num_heads, head_dim, latent_dim, num_tokens, causal, sink, seed):
    layer = _layer(5, num_heads * head_dim, num_heads, latent_dim, causal=causal, sink=sink,
                   seed=seed)
    if sink:
        with torch.no_grad():
            layer.sink_logit.copy_(torch.linspace(-1, 1, num_heads, dtype=torch.float64))
    x = torch.randn(2, num_tokens, 5, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        plain, plain_weights = layer(x, return_weights=True)
        absorbed, absorbed_weights = layer(x, return_weights=True, absorb=True)
        expected, expected_weights = _by_hand(layer, x)
    torch.testing.assert_close(plain, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(absorbed, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(plain_weights, expected_weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(absorbed_weights, expected_weights, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("sink", [False, True])
def test_decoding_with_the_latent_cache_equals_the_full_pass(backend, absorb, sink):
    layer = _layer(8, 16, 4, 6, context_length=10, backend=backend, sink=sink,
                   sink_values=[0.5, -1.0, 0.0, 2.0] if sink else None)
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    cache = KVCache(10)
    with torch.no_grad():
        full = layer(x)
        steps = [layer(x[:, :4], kv_cache=cache, absorb=absorb)]
        steps += [layer(x[:, t:t + 1], kv_cache=cache, absorb=absorb) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)
    # The cache holds the latent alone: latent_dim numbers per token, not 2 * d_out.
    assert cache.values is None and cache.keys.shape == (2, 1, 10, 6)
    assert cache.nbytes == 2 * 10 * 6 * 8  # B * max_length * latent_dim float64 numbers


def test_the_latent_cache_is_smaller_than_the_multi_head_cache():
    torch.manual_seed(0)
    latent_layer = MultiHeadLatentAttention(32, 32, 4, latent_dim=8, context_length=16).eval()
    multi_head = ab.MultiHeadAttention(32, 32, 4, context_length=16).eval()
    x = torch.randn(1, 16, 32)
    caches = KVCache(16), KVCache(16)
    with torch.no_grad():
        latent_layer(x, kv_cache=caches[0])
        multi_head(x, kv_cache=caches[1])
    assert caches[0].nbytes == 16 * 8 * 4 and caches[1].nbytes == 16 * 2 * 32 * 4
    assert caches[1].nbytes == 8 * caches[0].nbytes  # 2 * d_out / latent_dim


@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_the_fused_backend_equals_the_naive_one(sink, causal):
    naive = _layer(8, 16, 4, 6, context_length=10, causal=causal, sink=sink)
    fused = _layer(8, 16, 4, 6, context_length=10, causal=causal, sink=sink, backend="sdpa")
    fused.load_state_dict(naive.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    mask = ab.padding_mask([7, 5], 7)
    with torch.no_grad():
        for absorb in (False, True):
            torch.testing.assert_close(fused(x, mask, absorb=absorb), naive(x, mask),
                                       rtol=0, atol=1e-12)
        expected, _ = _by_hand(naive, x, mask)
        torch.testing.assert_close(naive(x, mask), expected, rtol=0, atol=1e-12)


def test_weights_are_a_distribution_and_dropout_trains():
    layer = _layer(8, 16, 4, 6, context_length=10, dropout=0.5)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        _, weights = layer(x, return_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 7, dtype=torch.float64))
    assert (weights.triu(diagonal=1) == 0).all()
    layer.train()
    torch.manual_seed(1)
    first = layer(x)
    second = layer(x)
    assert not torch.allclose(first, second)
    first.sum().backward()
    for name in ("W_query", "W_down_kv", "W_key", "W_value", "out_proj"):
        assert getattr(layer, name).weight.grad is not None, name


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"d_out": 10, "num_heads": 3}, ValueError, r"d_out \(10\) must be divisible by num_heads \(3\)"),
    ({"latent_dim": 0}, ValueError, "latent_dim must be >= 1"),
    ({"backend": "flash"}, ValueError, "backend must be 'naive' or 'sdpa'"),
    ({"sink": "yes"}, TypeError, "sink must be a bool"),
    ({"dropout": 1.0}, ValueError, "dropout must lie in"),
])
def test_bad_sizes_are_refused(kwargs, error, match):
    arguments = {"d_in": 8, "d_out": 16, "num_heads": 4, "latent_dim": 6, **kwargs}
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(**arguments)


def test_bad_calls_are_refused():
    layer = MultiHeadLatentAttention(8, 16, 4, 6, context_length=4)
    fused = MultiHeadLatentAttention(8, 16, 4, 6, backend="sdpa")
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="exceeds context_length=4"):
        layer(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="backend='sdpa' does not return attention weights"):
        fused(x, return_weights=True)
    with pytest.raises(TypeError, match="absorb must be a bool"):
        layer(x, absorb=1)
    with pytest.raises(TypeError, match="kv_cache must follow the attention cache protocol"):
        layer(x, kv_cache={})
    cache = KVCache(8)
    layer(x, kv_cache=cache)
    with pytest.raises(ValueError, match="which exceeds context_length=4"):
        layer(x[:, :2], kv_cache=cache)
    with pytest.raises(ValueError, match="features in its last dim"):
        layer(torch.randn(1, 3, 7))


class _Absorbed(MultiHeadLatentAttention):
    """The layer that always computes in the absorbed form, for diagnose (which calls layer(x))."""

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        return super().forward(x, mask, return_weights, kv_cache=kv_cache, absorb=True)


@pytest.mark.parametrize("cls", [MultiHeadLatentAttention, _Absorbed])
@pytest.mark.parametrize("backend", ["naive", "sdpa"])
@pytest.mark.parametrize("sink", [False, True])
def test_diagnose_passes_every_latent_layer(cls, backend, sink):
    torch.manual_seed(0)
    layer = cls(6, 8, 2, 4, context_length=8, backend=backend, sink=sink, dropout=0.1)
    if sink:
        with torch.no_grad():
            layer.sink_logit.copy_(torch.tensor([0.5, -1.0]))
    report = diagnose(layer)
    assert report.ok, str(report)
    for check in ("softmax_dim", "head_mixing", "scale", "causality", "cache_positions",
                  "matches_reference", "dropout_train"):
        assert report[check].status == "pass", str(report)
    assert report["sink_denominator"].status == ("pass" if sink else "n/a"), str(report)
