"""Positions inside attention (chapter 12): rotary embeddings, ALiBi, RoPE in the layers,
cross-attention, and the ``cache_positions`` check of ``diagnose``.

RoPE is checked against rotations written out with 2 x 2 matrices and against Hugging Face's
``rotate_half`` formulation; the relative-position claims (shift invariance, the two pairings)
are property tests; the layers are checked against hand-written recomputations, their own
full forward pass (decoding with a cache) and ``torch.nn.MultiheadAttention`` (cross-attention).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attention_book
from attention_book import (
    GroupedQueryAttention,
    KVCache,
    MultiHeadAttention,
    alibi_bias,
    alibi_slopes,
    bug_zoo,
    causal_mask,
    padding_mask,
    rotary_embedding,
)
from attention_book.diagnose import CHECKS, diagnose

# ----------------------------------------------------------------------------- references


def _rotation_by_matrices(x: torch.Tensor, positions: torch.Tensor, base: float,
                          interleaved: bool) -> torch.Tensor:
    """RoPE written out: for each token and pair, multiply the pair by a 2 x 2 rotation matrix."""
    head_dim = x.size(-1)
    half = head_dim // 2
    out = torch.empty_like(x)
    for t in range(x.size(-2)):
        for i in range(half):
            angle = positions[t].item() * base ** (-2 * i / head_dim)
            rotation = torch.tensor([[math.cos(angle), -math.sin(angle)],
                                     [math.sin(angle), math.cos(angle)]], dtype=x.dtype)
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            pair = torch.stack((x[..., t, a], x[..., t, b]), dim=-1)  # (..., 2)
            turned = pair @ rotation.T  # (..., 2)
            out[..., t, a], out[..., t, b] = turned[..., 0], turned[..., 1]
    return out


def _rotate_half_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """The Hugging Face / Llama formulation: x * cos + rotate_half(x) * sin."""
    head_dim = x.size(-1)
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = positions.to(torch.float64)[:, None] * inv_freq  # (T, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, head_dim)
    first, second = x[..., : head_dim // 2], x[..., head_dim // 2:]
    rotated_half = torch.cat((-second, first), dim=-1)
    return x * emb.cos() + rotated_half * emb.sin()


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


# ----------------------------------------------------------------------------- rotary_embedding


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_equals_a_rotation_by_2x2_matrices(interleaved, base):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)  # (B, H, T, head_dim)
    positions = torch.tensor([0, 1, 2, 7, 100])
    expected = _rotation_by_matrices(x, positions, base, interleaved)
    actual = rotary_embedding(x, positions, base=base, interleaved=interleaved)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def test_split_half_rope_equals_huggingface_rotate_half():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 16, dtype=torch.float64)
    positions = torch.arange(3, 9)
    torch.testing.assert_close(rotary_embedding(x, positions),
                               _rotate_half_rope(x, positions, 10000.0), rtol=0, atol=1e-12)


def test_by_hand_two_dimensional_example():
    # head_dim 2: one pair, frequency 1, so position m turns by m radians.
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)  # (T=1, 2)
    turned = rotary_embedding(q, torch.tensor([1]))
    torch.testing.assert_close(turned, torch.tensor([[math.cos(1.0), math.sin(1.0)]],
                                                    dtype=torch.float64))
    # q at m and k at n: the score is cos(m - n) for q = k = e_0.
    for m, n in [(3, 1), (10, 8), (2, 0)]:
        score = (rotary_embedding(q, torch.tensor([m])) @ rotary_embedding(q, torch.tensor([n])).T)
        assert math.isclose(score.item(), math.cos(2.0), abs_tol=1e-12)


def test_default_positions_and_position_zero():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    assert torch.equal(rotary_embedding(x), rotary_embedding(x, torch.arange(5)))
    assert torch.equal(rotary_embedding(x, torch.zeros(5, dtype=torch.long)), x)
    # A list of ints is accepted too.
    assert torch.equal(rotary_embedding(x, [0, 1, 2, 3, 4]), rotary_embedding(x))


def test_positions_broadcast_per_sequence():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)  # (B, T, head_dim)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])  # (B, T)
    out = rotary_embedding(x, positions)
    assert torch.equal(out[0], rotary_embedding(x[0], positions[0]))
    assert torch.equal(out[1], rotary_embedding(x[1], positions[1]))
    # (B, 1, T) positions broadcast over the heads of (B, H, T, head_dim).
    heads = torch.randn(2, 3, 4, 8)
    out = rotary_embedding(heads, positions[:, None, :])
    assert torch.equal(out[1, 2], rotary_embedding(heads[1, 2], positions[1]))


@settings(max_examples=40, deadline=None)
@given(num_tokens=st.integers(1, 7), pairs=st.integers(1, 8), shift=st.integers(-50, 5000),
       interleaved=st.booleans(), seed=st.integers(0, 10_000))
def test_scores_depend_only_on_the_distance(num_tokens, pairs, shift, interleaved, seed):
    torch.manual_seed(seed)
    q, k = torch.randn(2, num_tokens, 2 * pairs, dtype=torch.float64).unbind(0)
    positions = torch.arange(num_tokens)
    before = _scores(rotary_embedding(q, positions, interleaved=interleaved),
                     rotary_embedding(k, positions, interleaved=interleaved))
    after = _scores(rotary_embedding(q, positions + shift, interleaved=interleaved),
                    rotary_embedding(k, positions + shift, interleaved=interleaved))
    torch.testing.assert_close(after, before, rtol=0, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(pairs=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_rope_preserves_lengths(pairs, seed):
    torch.manual_seed(seed)
    x = torch.randn(6, 2 * pairs, dtype=torch.float64)
    out = rotary_embedding(x, torch.arange(6) * 37)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=0, atol=1e-12)


def test_the_two_pairings_are_a_permutation_apart_but_not_interchangeable():
    torch.manual_seed(0)
    head_dim, half = 8, 4
    q, k = torch.randn(2, 5, head_dim, dtype=torch.float64).unbind(0)
    # Interleave the halves: split-half pair (i, i + half) becomes interleaved pair (2i, 2i + 1).
    perm = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()
    torch.testing.assert_close(rotary_embedding(q[..., perm], interleaved=True),
                               rotary_embedding(q)[..., perm])
    split = _scores(rotary_embedding(q), rotary_embedding(k))
    permuted = _scores(rotary_embedding(q[..., perm], interleaved=True),
                       rotary_embedding(k[..., perm], interleaved=True))
    torch.testing.assert_close(permuted, split)
    # The same q and k under the other pairing: different scores off the diagonal.
    swapped = _scores(rotary_embedding(q, interleaved=True), rotary_embedding(k, interleaved=True))
    off_diagonal = ~torch.eye(5, dtype=torch.bool)
    assert ((swapped - split).abs()[off_diagonal] > 1e-6).all()
    torch.testing.assert_close(swapped.diagonal(), split.diagonal())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_rope_keeps_the_dtype_and_precise_angles(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=dtype)
    positions = torch.tensor([0, 1000, 100_000])
    out = rotary_embedding(x, positions)
    assert out.dtype == dtype
    expected = _rotation_by_matrices(x.double(), positions, 10000.0, False)
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=tol[dtype])


def test_rope_runs_on_the_meta_device():
    out = rotary_embedding(torch.randn(2, 5, 8, device="meta", dtype=torch.bfloat16))
    assert out.device.type == "meta" and out.shape == (2, 5, 8) and out.dtype == torch.bfloat16


def test_rope_refuses_bad_input_clearly():
    with pytest.raises(ValueError, match=r"head_dim \(5\) must be even .*shape \(3, 5\)"):
        rotary_embedding(torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) do not broadcast to "
                                         r"\(\.\.\., T\) = \(3,\)"):
        rotary_embedding(torch.randn(3, 4), torch.arange(4))
    with pytest.raises(ValueError, match=r"positions of shape \(2, 3\) do not broadcast"):
        rotary_embedding(torch.randn(3, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must hold integers, got dtype torch.float32"):
        rotary_embedding(torch.randn(3, 4), torch.arange(3.0))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        rotary_embedding(torch.arange(12).view(3, 4))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, head_dim\)"):
        rotary_embedding(torch.randn(4))
    with pytest.raises(ValueError, match="base must be a positive number, got -1"):
        rotary_embedding(torch.randn(3, 4), base=-1)
    with pytest.raises(TypeError, match="base must be a float"):
        rotary_embedding(torch.randn(3, 4), base="10000")
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        rotary_embedding(torch.randn(3, 4), interleaved=1)


# ----------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    assert alibi_slopes(4).tolist() == [2.0 ** -k for k in (2, 4, 6, 8)]
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads (the paper's code).
    assert alibi_slopes(6).tolist() == [2.0 ** -k for k in (2, 4, 6, 8, 1, 3)]


def _paper_get_slopes(n):
    """Press et al.'s reference get_slopes (github.com/ofirpress/attention_with_linear_biases)."""
    def power_of_two(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + _paper_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("num_heads", range(1, 129))
def test_alibi_slopes_equal_the_papers_code_and_never_repeat(num_heads):
    slopes = alibi_slopes(num_heads)
    torch.testing.assert_close(slopes, torch.tensor(_paper_get_slopes(num_heads)))
    assert len(set(slopes.tolist())) == num_heads  # the docstring: no two heads share a slope
    if num_heads & (num_heads - 1) == 0:  # a power of two: largest first
        assert torch.equal(slopes, slopes.sort(descending=True).values)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = alibi_bias(4, 5)
    assert bias.shape == (4, 5, 5) and bias.dtype == torch.float32
    slopes = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j].item() == -slopes[h].item() * abs(i - j)
    assert not torch.signbit(bias.diagonal(dim1=-2, dim2=-1)).any()  # +0.0, not -0.0


def test_alibi_bias_aligns_the_queries_bottom_right():
    full = alibi_bias(2, 6)
    assert torch.equal(alibi_bias(2, 2, 6), full[:, -2:, :])
    assert torch.equal(alibi_bias(2, 1, 6)[:, 0, -1], torch.zeros(2))


def test_alibi_errors_name_the_sizes():
    with pytest.raises(ValueError, match="num_heads must be >= 1, got 0"):
        alibi_bias(0, 3)
    with pytest.raises(ValueError, match="num_keys must be >= 1, got 0"):
        alibi_bias(2, 3, 0)
    with pytest.raises(TypeError, match="num_queries must be an int"):
        alibi_bias(2, 3.0)


# ----------------------------------------------------------------------------- RoPE in the layers


def _rope_reference(layer, x: torch.Tensor) -> torch.Tensor:
    """The layer written out: project, split, rotate queries and keys, attend, merge, project."""
    batch, num_tokens, _ = x.shape
    head_dim = layer.head_dim

    def heads(y, count):
        return y.view(batch, num_tokens, count, head_dim).transpose(1, 2)  # (B, count, T, hd)

    q = _rotate_half_rope(heads(layer.W_query(x), layer.num_heads).double(),
                          torch.arange(num_tokens), layer.rope_base)
    k = _rotate_half_rope(heads(layer.W_key(x), layer.num_kv_heads).double(),
                          torch.arange(num_tokens), layer.rope_base)
    v = heads(layer.W_value(x), layer.num_kv_heads).double()
    group = layer.num_heads // layer.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, T, T)
    if layer.causal:
        scores = scores.masked_fill(~causal_mask(num_tokens), float("-inf"))
    context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, num_tokens, -1)
    return nn.functional.linear(context, layer.out_proj.weight.double(),
                                layer.out_proj.bias.double())


def _layer(kind: str, backend: str = "naive", causal: bool = True, **kwargs):
    torch.manual_seed(0)
    if kind == "mha":
        layer = MultiHeadAttention(8, 16, 4, context_length=12, causal=causal, backend=backend,
                                   **kwargs)
    else:
        layer = GroupedQueryAttention(8, 16, 4, 2, context_length=12, causal=causal,
                                      backend=backend, **kwargs)
    return layer.eval()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", ["naive", "sdpa"])
@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_rope_layer_equals_a_hand_written_rotation(kind, backend, causal):
    layer = _layer(kind, backend, causal, rope=True, rope_base=500.0)
    torch.manual_seed(1)
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).double(), _rope_reference(layer, x),
                                   rtol=1e-4, atol=1e-5)


def test_rope_changes_the_output_and_keeps_the_parameters():
    plain, rotary = _layer("mha"), _layer("mha", rope=True)
    assert plain.state_dict().keys() == rotary.state_dict().keys()
    rotary.load_state_dict(plain.state_dict())
    torch.manual_seed(1)
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        assert (plain(x) - rotary(x)).abs().max() > 1e-3
        # Token 0 sits at position 0, where RoPE turns nothing: a causal layer's first row agrees.
        torch.testing.assert_close(plain(x)[:, 0], rotary(x)[:, 0])
    assert rotary.rope is True and rotary.rope_base == 10000.0 and plain.rope is False


def _decode(layer, x, chunks):
    cache = KVCache(x.size(-2))
    outputs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            outputs.append(layer(x[:, start:start + size], kv_cache=cache))
            start += size
    return torch.cat(outputs, dim=-2), cache


@settings(max_examples=15, deadline=None)
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6),
       kind=st.sampled_from(["mha", "gqa"]), backend=st.sampled_from(["naive", "sdpa"]))
def test_rope_decoding_with_a_cache_equals_the_full_forward_pass(chunks, kind, backend):
    layer = _layer(kind, backend, rope=True)
    sizes = []  # the chunks, cut to the layer's context_length of 12
    for size in chunks:
        size = min(size, 12 - sum(sizes))
        if size > 0:
            sizes.append(size)
    num_tokens = sum(sizes)
    torch.manual_seed(2)
    x = torch.randn(2, num_tokens, 8)
    decoded, cache = _decode(layer, x, sizes)
    with torch.no_grad():
        torch.testing.assert_close(decoded, layer(x), rtol=1e-4, atol=1e-5)
    assert len(cache) == num_tokens


def test_the_cache_stores_rotated_keys():
    layer = _layer("gqa", rope=True)
    torch.manual_seed(2)
    x = torch.randn(1, 5, 8)
    _, cache = _decode(layer, x, [2, 1, 1, 1])
    with torch.no_grad():
        keys = layer.W_key(x).view(1, 5, 2, 4).transpose(1, 2)  # (B, num_kv_heads, T, head_dim)
        torch.testing.assert_close(cache.keys[..., :5, :], rotary_embedding(keys))


def test_positions_that_restart_break_decoding_only():
    bug = bug_zoo.RotaryCacheRestartsPositions(8, 16, 4, context_length=12, rope=True).eval()
    bug.load_state_dict(_layer("mha", rope=True).state_dict())
    torch.manual_seed(2)
    x = torch.randn(2, 6, 8)
    with torch.no_grad():
        torch.testing.assert_close(bug(x), _layer("mha", rope=True)(x))  # the full pass is right
        decoded, _ = _decode(bug, x, [2, 1, 1, 1, 1])
        torch.testing.assert_close(decoded[:, :2], bug(x)[:, :2])  # so is the first call
        assert (decoded[:, 2:] - bug(x)[:, 2:]).abs().max() > 1e-2  # later calls are not


def test_rope_arguments_are_checked():
    with pytest.raises(ValueError, match=r"head_dim = d_out // num_heads = 6 // 2 = 3 must be even"):
        MultiHeadAttention(6, 6, 2, rope=True)
    with pytest.raises(TypeError, match="rope must be a bool"):
        GroupedQueryAttention(8, 8, 2, 1, rope=1)
    with pytest.raises(ValueError, match="base must be a positive number, got 0"):
        MultiHeadAttention(8, 8, 2, rope=True, rope_base=0)
    MultiHeadAttention(6, 6, 2)  # an odd head_dim is fine without RoPE


# ----------------------------------------------------------------------------- cross-attention


def _torch_copy(layer: MultiHeadAttention) -> nn.MultiheadAttention:
    reference = nn.MultiheadAttention(layer.d_out, layer.num_heads, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat(
            [layer.W_query.weight, layer.W_key.weight, layer.W_value.weight]))
        reference.in_proj_bias.copy_(torch.cat(
            [layer.W_query.bias, layer.W_key.bias, layer.W_value.bias]))
        reference.out_proj.weight.copy_(layer.out_proj.weight)
        reference.out_proj.bias.copy_(layer.out_proj.bias)
    return reference.eval()


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_cross_attention_equals_torch_multihead_attention(backend):
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 8, 2, causal=False, qkv_bias=True, backend=backend).eval()
    reference = _torch_copy(layer)
    torch.manual_seed(1)
    x, context = torch.randn(3, 4, 8), torch.randn(3, 7, 8)  # T = 4 queries, T_ctx = 7
    mask = padding_mask([7, 5, 2], 7)  # (B, 1, 1, T_ctx)
    with torch.no_grad():
        expected, expected_weights = reference(x, context, context,
                                               key_padding_mask=~mask[:, 0, 0, :],
                                               average_attn_weights=False)
        torch.testing.assert_close(layer(x, mask, context=context), expected)
        if backend == "naive":
            _, weights = layer(x, mask, return_weights=True, context=context)
            assert weights.shape == (3, 2, 4, 7)
            torch.testing.assert_close(weights, expected_weights)
            assert (weights[2, :, :, 2:] == 0).all()  # padding gets no weight


def test_grouped_query_cross_attention_equals_a_hand_computation():
    torch.manual_seed(0)
    layer = GroupedQueryAttention(6, 8, 4, 2, causal=False).eval()
    torch.manual_seed(1)
    x, context = torch.randn(2, 3, 6), torch.randn(2, 5, 6)
    with torch.no_grad():
        q = layer.W_query(x).view(2, 3, 4, 2).transpose(1, 2)  # (B, 4, T, 2)
        k = layer.W_key(context).view(2, 5, 2, 2).transpose(1, 2)  # (B, 2, T_ctx, 2)
        v = layer.W_value(context).view(2, 5, 2, 2).transpose(1, 2)  # (B, 2, T_ctx, 2)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        weights = (q @ k.transpose(-2, -1) / math.sqrt(2)).softmax(dim=-1)  # (B, 4, T, T_ctx)
        merged = (weights @ v).transpose(1, 2).reshape(2, 3, 8)
        expected = layer.out_proj(merged)
        output, returned = layer(x, return_weights=True, context=context)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(returned, weights)


def test_cross_attention_masks_broadcast_and_context_may_exceed_context_length():
    torch.manual_seed(0)
    layer = MultiHeadAttention(4, 4, 2, context_length=3, causal=False).eval()
    x, context = torch.randn(2, 3, 4), torch.randn(2, 9, 4)  # T_ctx = 9 > context_length
    full_mask = torch.ones(2, 2, 3, 9, dtype=torch.bool)
    full_mask[..., 6:] = False
    with torch.no_grad():
        a = layer(x, full_mask, context=context)
        b = layer(x, full_mask[:1, :1, :1, :], context=context)
        c = layer(x, context=context[:, :6])  # dropping the masked tokens changes nothing
        d = layer(x, context=context[:1].expand(2, 9, 4))
        e = layer(x, context=context[:1])  # the context's batch dim broadcasts
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    torch.testing.assert_close(d, e)


def test_cross_attention_refuses_what_makes_no_sense():
    torch.manual_seed(0)
    x, context = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="a causal layer cannot attend to a context"):
        MultiHeadAttention(8, 8, 2)(x, context=context)
    with pytest.raises(ValueError, match="build the cross-attention layer with rope=False"):
        GroupedQueryAttention(8, 8, 2, 1, causal=False, rope=True)(x, context=context)
    layer = MultiHeadAttention(8, 8, 2, causal=False)
    with pytest.raises(ValueError, match="pass it again without a kv_cache"):
        layer(x, context=context, kv_cache=KVCache(5))
    with pytest.raises(ValueError, match=r"context must have shape \(\.\.\., T_ctx, d_in=8\), "
                                         r"got shape \(2, 5, 4\)"):
        layer(x, context=context[..., :4])
    with pytest.raises(ValueError, match=r"batch\) dims of context \(3, 5, 8\) do not broadcast"):
        layer(x, context=torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) does not broadcast to the "
                                         r"attention scores of shape \(2, 2, 3, 5\)"):
        layer(x, causal_mask(3), context=context)
    with pytest.raises(TypeError, match="context must be a floating-point tensor"):
        layer(x, context=torch.ones(2, 5, 8, dtype=torch.long))


# ----------------------------------------------------------------------------- diagnose


ROPE_LAYERS = {
    "MHA rope naive": lambda: MultiHeadAttention(6, 8, 2, context_length=8, rope=True),
    "MHA rope sdpa": lambda: MultiHeadAttention(6, 8, 2, context_length=8, rope=True,
                                                backend="sdpa"),
    "MHA rope non-causal": lambda: MultiHeadAttention(6, 8, 2, causal=False, rope=True),
    "GQA rope naive": lambda: GroupedQueryAttention(6, 8, 4, 2, context_length=8, rope=True),
    "GQA rope sdpa dropout": lambda: GroupedQueryAttention(
        6, 8, 4, 2, context_length=8, dropout=0.2, rope=True, backend="sdpa"),
    "MHA no rope": lambda: MultiHeadAttention(6, 8, 2, context_length=8),
    "GQA no rope non-causal": lambda: GroupedQueryAttention(6, 8, 4, 2, causal=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(ROPE_LAYERS))
def test_healthy_layers_pass_every_check_with_and_without_rope(name, dtype):
    torch.manual_seed(0)
    report = diagnose(ROPE_LAYERS[name]().to(dtype))
    assert report.ok, str(report)
    assert report["cache_positions"].status == "pass", str(report)
    for check in ("scale", "head_mixing", "batch", "matches_reference"):
        assert report[check].status == "pass", str(report)


def test_cache_positions_is_registered_before_the_catch_all():
    names = list(CHECKS)
    assert names.index("cache_positions") == names.index("lengths") + 1
    assert names[-1] == "matches_reference"


def test_cache_positions_names_the_restart_and_waits_for_basic_checks():
    report = diagnose(bug_zoo.BUGS["RotaryCacheRestartsPositions"].build())
    assert report.failed == ["cache_positions"]
    evidence = report["cache_positions"].evidence
    assert "the first call matches the full forward pass" in evidence
    assert "restart at 0" in evidence and "len(cache)" in evidence
    assert report["matches_reference"].evidence == "not judged: fix cache_positions first"


def test_cache_positions_in_a_non_causal_layer_compares_the_last_token():
    torch.manual_seed(0)
    bug = bug_zoo.RotaryCacheRestartsPositions(6, 8, 2, causal=False, rope=True)
    report = diagnose(bug)
    assert report.failed == ["cache_positions"], str(report)
    assert "the last token, which sees every key" in report["cache_positions"].evidence


def test_cache_positions_does_not_apply_without_a_cache():
    report = diagnose(attention_book.scaled_dot_product_attention)
    assert report["cache_positions"].status == "n/a"
    assert report["cache_positions"].evidence == "a function has no key/value cache"
    torch.manual_seed(0)
    report = diagnose(attention_book.CausalSelfAttention(6, 8, 8))
    assert report["cache_positions"].evidence == "forward takes no kv_cache argument"


def test_cache_positions_catches_a_layer_that_ignores_its_cache():
    class ForgetsTheCache(MultiHeadAttention):
        def forward(self, x, mask=None, return_weights=False, *, kv_cache=None, context=None):
            return super().forward(x, mask, return_weights)

    torch.manual_seed(0)
    report = diagnose(ForgetsTheCache(6, 8, 2, context_length=8))
    assert report.failed == ["cache_positions"], str(report)


def test_cache_positions_reports_an_error_while_decoding():
    class BreaksWhileDecoding(MultiHeadAttention):
        def forward(self, x, mask=None, return_weights=False, *, kv_cache=None, context=None):
            if kv_cache is not None and len(kv_cache) > 0:
                raise RuntimeError("no room in my cache")
            return super().forward(x, mask, return_weights, kv_cache=kv_cache)

    torch.manual_seed(0)
    report = diagnose(BreaksWhileDecoding(6, 8, 2, context_length=8))
    assert report.failed == ["cache_positions"]
    assert "RuntimeError: no room in my cache (decoding tokens 2..2 with a KVCache holding 2)" \
        in report["cache_positions"].evidence


# ----------------------------------------------------------------------------- device and dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_positions_follow_the_device_and_dtype(device, dtype):
    """On ``--device`` (the CPU by default, CUDA under make test-gpu), in three dtypes."""
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 5e-2}[dtype]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 8)
    positions = torch.tensor([0, 1, 2, 50, 51, 900])
    out = rotary_embedding(x.to(device, dtype), positions.to(device))
    assert out.device.type == device.type and out.dtype == dtype
    torch.testing.assert_close(out.double().cpu(), rotary_embedding(x.double(), positions),
                               rtol=tol, atol=tol)
    bias = alibi_bias(4, 2, 5, device=device)
    assert bias.device.type == device.type
    torch.testing.assert_close(bias.cpu(), alibi_bias(4, 2, 5))

    torch.manual_seed(0)
    layer = GroupedQueryAttention(8, 8, 4, 2, context_length=8, rope=True).eval()
    with torch.no_grad():
        reference = copy.deepcopy(layer).double()(x[0].double())  # (3, 6, 8), on the CPU
    layer = layer.to(device=device, dtype=dtype)
    x_here = x[0].to(device, dtype)  # (3, 6, 8)
    cache = KVCache(8)
    with torch.no_grad():
        steps = torch.cat([layer(x_here[:, t:t + 1], kv_cache=cache) for t in range(6)], dim=1)
        full = layer(x_here)
    assert steps.device.type == device.type and steps.dtype == dtype
    torch.testing.assert_close(full.double().cpu(), reference, rtol=tol, atol=tol)
    torch.testing.assert_close(steps.double().cpu(), reference, rtol=tol, atol=tol)

    cross = MultiHeadAttention(8, 8, 2, causal=False).to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        out = cross(x_here, padding_mask(torch.tensor([2, 1, 2], device=device), 2),
                    context=x_here[:, :2])
    assert out.device.type == device.type and out.dtype == dtype and out.shape == (3, 6, 8)


@pytest.fixture
def default_device_meta():
    """Make torch's default device ``meta`` for the duration of a test."""
    torch.set_default_device("meta")
    yield
    torch.set_default_device(None)


def test_no_factory_in_the_positions_forgets_the_device(default_device_meta):
    cpu = torch.device("cpu")
    x = torch.ones(2, 5, 8, device=cpu)
    assert rotary_embedding(x).device == cpu
    assert rotary_embedding(x, [4, 5, 6, 7, 8], interleaved=True).device == cpu
    assert alibi_bias(2, 3, device=cpu).device == cpu
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 8, 2, context_length=6, rope=True, device=cpu).eval()
    cross = GroupedQueryAttention(8, 8, 2, 1, causal=False, backend="sdpa", device=cpu).eval()
    with torch.no_grad():
        cache = KVCache(6)
        for t in range(5):
            assert layer(x[:, t:t + 1], kv_cache=cache).device == cpu
        assert cross(x, context=x[:, :3]).device == cpu
