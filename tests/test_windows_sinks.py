"""Chapter 13: the sliding-window mask, the sink softmax (also as a gate on the log-sum-exp),
and both in the tiled kernel and the layers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import attention_book as ab
from attention_book.attention import sliding_window_mask, softmax_with_sink
from attention_book.flash import DIAGONAL, FULL, SKIPPED, tile_plan, tiled_attention
from attention_book.kv_cache import KVCache

# --------------------------------------------------------------------------- sliding_window_mask


@settings(max_examples=60, deadline=None)
@given(num_queries=st.integers(0, 12), extra_keys=st.integers(0, 6), window=st.integers(1, 20))
def test_sliding_window_mask_is_the_formula(num_queries, extra_keys, window):
    num_keys = num_queries + extra_keys
    mask = sliding_window_mask(num_queries, window, num_keys)
    assert mask.shape == (num_queries, num_keys) and mask.dtype == torch.bool
    for i in range(num_queries):
        for j in range(num_keys):
            distance = i + num_keys - num_queries - j
            assert bool(mask[i, j]) == (0 <= distance < window)


@settings(max_examples=40, deadline=None)
@given(num_queries=st.integers(1, 10), extra_keys=st.integers(0, 6), window=st.integers(1, 20))
def test_sliding_window_mask_lies_inside_the_causal_mask(num_queries, extra_keys, window):
    num_keys = num_queries + extra_keys
    mask = sliding_window_mask(num_queries, window, num_keys)
    causal = ab.causal_mask(num_queries, num_keys)
    assert not (mask & ~causal).any()  # never the future
    assert (mask.sum(dim=-1) <= window).all()  # at most `window` keys per query
    if window >= num_keys:
        assert torch.equal(mask, causal)
    # Bottom-right alignment: the last queries of a long mask are the rows of a short one.
    full = sliding_window_mask(num_keys, window)
    assert torch.equal(mask, full[num_keys - num_queries:])


def test_window_one_sees_only_itself():
    assert torch.equal(sliding_window_mask(4, 1), torch.eye(4, dtype=torch.bool))
    assert sliding_window_mask(3, 2).int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]


@pytest.mark.parametrize(("args", "error", "match"), [
    ((4, 0), ValueError, "window must be >= 1, got 0"),
    ((4, 2.5), TypeError, "window must be an int"),
    ((4, True), TypeError, "window must be an int"),
    ((-1, 2), ValueError, "num_queries must be >= 0"),
    ((4, 2, -3), ValueError, "num_keys must be >= 0"),
])
def test_sliding_window_mask_rejects_bad_sizes(args, error, match):
    with pytest.raises(error, match=match):
        sliding_window_mask(*args)


# --------------------------------------------------------------------------- softmax_with_sink


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 4), keys=st.integers(1, 7), seed=st.integers(0, 1000),
       sink=st.floats(-6.0, 6.0))
def test_softmax_with_sink_is_a_softmax_with_one_more_column(rows, keys, seed, sink):
    scores = torch.randn(2, rows, keys, generator=torch.Generator().manual_seed(seed),
                         dtype=torch.float64) * 3
    weights = softmax_with_sink(scores, sink)
    with_column = torch.cat([scores, torch.full((2, rows, 1), sink, dtype=torch.float64)], -1)
    torch.testing.assert_close(weights, torch.softmax(with_column, dim=-1)[..., :-1])
    # The keys' share is sigmoid(logsumexp(scores) - sink); the sink takes the rest.
    torch.testing.assert_close(weights.sum(-1), torch.sigmoid(torch.logsumexp(scores, -1) - sink))
    assert (weights.sum(-1) < 1).all()


def test_the_sink_per_head_is_shared_by_every_query():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 5)  # (B, H, T_q, T_k)
    sink = torch.tensor([-1.0, 0.0, 2.0])  # (H,)
    weights = softmax_with_sink(scores, sink)
    for head in range(3):
        torch.testing.assert_close(weights[:, head], softmax_with_sink(scores[:, head], sink[head]))
    with pytest.raises(ValueError, match=r"sink_logit of shape \(4,\) must broadcast"):
        softmax_with_sink(scores, torch.zeros(4))
    with pytest.raises(ValueError, match="must broadcast"):
        softmax_with_sink(torch.randn(5), torch.zeros(3))


def test_softmax_with_sink_edge_cases():
    scores = torch.tensor([[1000.0, 999.0], [float("-inf"), float("-inf")], [0.0, 0.0]])
    weights = softmax_with_sink(scores, 0.0)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights[0], torch.softmax(scores[0], -1))  # the sink is negligible
    assert weights[1].tolist() == [0.0, 0.0]  # a fully masked row gives all to the sink
    torch.testing.assert_close(weights[2], torch.full((2,), 1 / 3))
    torch.testing.assert_close(softmax_with_sink(scores[:1], float("-inf")), ab.softmax(scores[:1]))
    assert softmax_with_sink(scores[1:2], float("-inf")).tolist() == [[0.0, 0.0]]
    by_hand = softmax_with_sink(torch.tensor([0.0, 0.0, math.log(2)]), math.log(4))
    torch.testing.assert_close(by_hand, torch.tensor([0.125, 0.125, 0.25]))
    # dim: normalise the columns instead of the rows.
    grid = torch.randn(3, 4)
    torch.testing.assert_close(softmax_with_sink(grid, 0.5, dim=0),
                               softmax_with_sink(grid.T, 0.5).T)


@pytest.mark.parametrize(("args", "error"), [
    ((torch.tensor([1, 2]), 0.0), TypeError),
    ((torch.randn(3), "0.5"), TypeError),
    ((torch.randn(3), True), TypeError),
    ((torch.randn(3), torch.tensor(1)), TypeError),
    ((torch.tensor(1.0), 0.0), ValueError),
])
def test_softmax_with_sink_rejects_bad_inputs(args, error):
    with pytest.raises(error):
        softmax_with_sink(*args)


def test_scaled_dot_product_attention_takes_a_learnable_sink():
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 4, 6, 8).unbind(0)  # each (B, H, T, d)
    sink = torch.tensor([0.5, -1.0, 1.0, 0.0], requires_grad=True)  # (H,)
    output, weights = ab.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                      sink_logit=sink)
    scores = query @ key.transpose(-2, -1) / math.sqrt(8)
    scores = scores.masked_fill(~ab.causal_mask(6), float("-inf"))
    torch.testing.assert_close(weights, softmax_with_sink(scores, sink))
    torch.testing.assert_close(output, weights @ value)
    output.sum().backward()
    assert sink.grad is not None and (sink.grad != 0).all()
    plain, _ = ab.scaled_dot_product_attention(query, key, value, is_causal=True)
    none, _ = ab.scaled_dot_product_attention(query, key, value, is_causal=True,
                                              sink_logit=float("-inf"))
    torch.testing.assert_close(none, plain)


# --------------------------------------------------------------------------- tiled_attention


@settings(max_examples=30, deadline=None)
@given(num_queries=st.integers(1, 40), extra_keys=st.integers(0, 20), window=st.integers(1, 64),
       block_size=st.integers(1, 17), with_sink=st.booleans(), seed=st.integers(0, 100))
def test_tiled_attention_with_a_window_and_a_sink_equals_the_masked_reference(
        num_queries, extra_keys, window, block_size, with_sink, seed):
    num_keys = num_queries + extra_keys
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 3, num_queries, 4, generator=generator, dtype=torch.float64)
    key = torch.randn(2, 3, num_keys, 4, generator=generator, dtype=torch.float64)
    value = torch.randn(2, 3, num_keys, 5, generator=generator, dtype=torch.float64)
    sink = torch.randn(3, generator=generator, dtype=torch.float64) if with_sink else None
    tiled = tiled_attention(query, key, value, block_size=block_size, window=window,
                            sink_logit=sink)
    expected, _ = ab.scaled_dot_product_attention(
        query, key, value, sliding_window_mask(num_queries, window, num_keys), sink_logit=sink)
    torch.testing.assert_close(tiled, expected, rtol=0, atol=1e-12)


def test_tiled_attention_with_a_sink_and_no_mask_or_a_causal_mask():
    torch.manual_seed(1)
    query, key, value = torch.randn(3, 2, 30, 8, dtype=torch.float64).unbind(0)
    for is_causal in (False, True):
        for sink in (0.7, torch.tensor(-2.0, dtype=torch.float64), float("-inf")):
            tiled = tiled_attention(query, key, value, block_size=8, is_causal=is_causal,
                                    sink_logit=sink)
            expected, _ = ab.scaled_dot_product_attention(query, key, value, is_causal=is_causal,
                                                          sink_logit=sink)
            torch.testing.assert_close(tiled, expected, rtol=0, atol=1e-12)


def test_gradients_reach_the_sink_through_the_tiled_kernel():
    torch.manual_seed(2)
    query, key, value = torch.randn(3, 1, 2, 12, 4, dtype=torch.float64).unbind(0)
    sink = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    tiled_attention(query, key, value, block_size=4, window=5, sink_logit=sink).sum().backward()
    tiled_grad = sink.grad.clone()
    sink.grad = None
    expected, _ = ab.scaled_dot_product_attention(query, key, value, sliding_window_mask(12, 5),
                                                  sink_logit=sink)
    expected.sum().backward()
    torch.testing.assert_close(tiled_grad, sink.grad)


def test_the_window_skips_the_tiles_before_it():
    plan = tile_plan(1024, 1024, 128, window=256)
    # Each query tile needs its own diagonal tile and the two before it, no others.
    for row in range(8):
        computed = [col for col in range(8) if plan[row, col] != SKIPPED]
        assert computed == list(range(max(0, row - 2), row + 1))
    # Tile (r, r - 1) lies wholly inside every window (distances 1..255); tiles (r, r) and
    # (r, r - 2) are crossed by the diagonal and by the window's far edge.
    assert int((plan == FULL).sum()) == 7 and int((plan == DIAGONAL).sum()) == 14
    causal = tile_plan(1024, 1024, 128, is_causal=True)
    assert int((causal != SKIPPED).sum()) == 36 and int((plan != SKIPPED).sum()) == 21
    # A window as long as the sequence is the causal mask.
    assert torch.equal(tile_plan(1000, 1000, 128, window=1000),
                       tile_plan(1000, 1000, 128, is_causal=True))


def test_the_tiled_kernel_computes_only_the_planned_tiles():
    """Count the tiles of scores actually multiplied: exactly the plan's non-skipped ones."""
    products = []

    class CountProducts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default) and (
                    result.shape[-2:] == (16, 16)):
                products.append(func)  # a (16, 16) tile of scores
            return result

    query = torch.randn(1, 1, 128, 4)
    with torch.no_grad(), CountProducts():
        tiled_attention(query, query, query, block_size=16, window=20)
    # Query tile r needs key tiles r - 2, r - 1 and r: 1 + 2 + 6 * 3 = 21 of 64.
    assert len(products) == int((tile_plan(128, 128, 16, window=20) != SKIPPED).sum()) == 21


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"window": 0}, ValueError, "window must be >= 1"),
    ({"window": 2.0}, TypeError, "window must be an int"),
    ({"sink_logit": "big"}, TypeError, "sink_logit must be a number"),
    ({"sink_logit": torch.zeros(5)}, ValueError, "must broadcast"),
])
def test_tiled_attention_rejects_bad_windows_and_sinks(kwargs, error, match):
    query = torch.randn(2, 3, 6, 4)
    with pytest.raises(error, match=match):
        tiled_attention(query, query, query, block_size=4, **kwargs)
    if "window" in kwargs:
        with pytest.raises(error, match=match):
            tile_plan(6, 6, 4, window=kwargs["window"])


# --------------------------------------------------------------------------- layers with a sink


def _sink_layer(cls, *args, backend="naive", **kwargs):
    torch.manual_seed(0)
    layer = cls(*args, sink=True, backend=backend, **kwargs).double().eval()
    with torch.no_grad():
        layer.sink_logit.copy_(torch.linspace(-1.0, 1.5, layer.num_heads))
    return layer


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_layers_with_a_sink_agree_across_backends(num_kv_heads, causal):
    naive = _sink_layer(ab.GroupedQueryAttention, 8, 16, 4, num_kv_heads, context_length=9,
                        causal=causal)
    fused = _sink_layer(ab.GroupedQueryAttention, 8, 16, 4, num_kv_heads, context_length=9,
                        causal=causal, backend="sdpa")
    fused.load_state_dict(naive.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    mask = ab.padding_mask([7, 4], 7)  # (B, 1, 1, T)
    with torch.no_grad():
        output, weights = naive(x, mask, return_weights=True)
        torch.testing.assert_close(fused(x, mask), output)
    assert (weights.sum(-1) < 1).all()
    assert (weights[1, ..., 4:] == 0).all()


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_decoding_a_layer_with_a_sink_equals_the_full_pass(backend):
    layer = _sink_layer(ab.MultiHeadAttention, 8, 16, 4, context_length=9, backend=backend)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    cache = KVCache(9)
    with torch.no_grad():
        full = layer(x)
        steps = [layer(x[:, :3], kv_cache=cache)] + [layer(x[:, t:t + 1], kv_cache=cache)
                                                     for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_a_sink_of_minus_infinity_is_the_layer_without_a_sink():
    torch.manual_seed(0)
    plain = ab.MultiHeadAttention(8, 16, 4, context_length=8).eval()
    with_sink = ab.MultiHeadAttention(8, 16, 4, context_length=8, sink=True).eval()
    assert set(with_sink.state_dict()) == set(plain.state_dict()) | {"sink_logit"}
    assert with_sink.sink_logit.shape == (4,) and (with_sink.sink_logit == 0).all()
    with_sink.load_state_dict({**plain.state_dict(), "sink_logit": torch.full((4,), -math.inf)})
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(with_sink(x), plain(x))


def test_the_sink_is_learned():
    torch.manual_seed(0)
    layer = ab.GroupedQueryAttention(8, 16, 4, 2, context_length=8, sink=True)
    layer(torch.randn(2, 5, 8)).pow(2).sum().backward()
    assert layer.sink_logit.grad is not None and (layer.sink_logit.grad != 0).all()
    with pytest.raises(TypeError, match="sink must be a bool"):
        ab.MultiHeadAttention(8, 16, 4, sink=1)


# --------------------------------------------------------------------------- a cache of keys only


def test_a_cache_of_keys_only_holds_one_tensor():
    cache = KVCache(6)
    latents, none = cache.update(torch.ones(2, 1, 4, 3))
    assert none is None and latents.shape == (2, 1, 4, 3) and cache.values is None
    latents, _ = cache.update(2 * torch.ones(2, 1, 2, 3))
    assert latents[:, :, 4:].eq(2).all() and len(cache) == 6
    assert cache.nbytes == 2 * 6 * 3 * 4  # B * max_length * d floats of 4 bytes
    mixed = KVCache(6)
    mixed.update(torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match="this cache stores keys only"):
        mixed.update(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3))
    both = KVCache(6)
    both.update(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match="this cache stores keys and values"):
        both.update(torch.ones(1, 1, 1, 3))
    with pytest.raises(ValueError, match="new keys must be"):
        mixed.update(torch.ones(1, 1, 1, 4))
    with pytest.raises(TypeError, match="the cache stores torch.float32"):
        mixed.update(torch.ones(1, 1, 1, 3, dtype=torch.float64))


# --------------------------------------------------------------------------- the sink as a gate


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 4), keys=st.integers(1, 9), seed=st.integers(0, 10_000),
       sink=st.floats(-6.0, 6.0), shift=st.floats(-10.0, 10.0))
def test_the_sink_is_a_gate_sigmoid_lse_minus_sink_on_the_softmax(rows, keys, seed, sink, shift):
    """Chapter 13: softmax_with_sink(x, s) = softmax(x) * sigmoid(logsumexp(x) - s), row by row."""
    generator = torch.Generator().manual_seed(seed)
    scores = (3 * torch.randn(rows, keys, generator=generator) + shift).double()
    gate = torch.sigmoid(torch.logsumexp(scores, dim=-1, keepdim=True) - sink)
    torch.testing.assert_close(softmax_with_sink(scores, sink), ab.softmax(scores) * gate)


@pytest.mark.parametrize(("tokens", "window"), [(9, 4), (12, 1), (7, 7)])
def test_flex_attentions_lse_gives_it_a_sink(tokens, window):
    """FlexAttention's log-sum-exp (natural log, over the scaled scores) gates its output into
    the windowed attention with a sink per head; the sigmoid of the sink alone does not."""
    import warnings

    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    from attention_book import mods

    generator = torch.Generator().manual_seed(tokens)
    query, key, value = (2 * torch.randn(2, 3, tokens, 8, generator=generator) for _ in range(3))
    sinks = torch.tensor([-1.0, 0.5, 2.0])
    block_mask = create_block_mask(mods.sliding_window(window), None, None, tokens, tokens,
                                   device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        output, aux = flex_attention(query, key, value, block_mask=block_mask,
                                     return_aux=AuxRequest(lse=True))
    mask = sliding_window_mask(tokens, window)
    scores = (query @ key.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(aux.lse, torch.logsumexp(scores, dim=-1))
    expected, _ = ab.scaled_dot_product_attention(query, key, value, mask, sink_logit=sinks)
    gated = output * torch.sigmoid(aux.lse - sinks.view(1, 3, 1)).unsqueeze(-1)
    torch.testing.assert_close(gated, expected, rtol=0, atol=1e-5)
    fixed = output * torch.sigmoid(-sinks).view(1, 3, 1, 1)
    assert not torch.allclose(fixed, expected, atol=1e-3)
