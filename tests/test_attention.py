"""Unit and property tests of the functional core: softmax, attention, masks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_book as ab

SETTINGS = settings(max_examples=40, deadline=None)


def _randn(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


# --- softmax ---------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    scale=st.floats(0.1, 50.0),
    seed=st.integers(0, 10_000),
)
def test_softmax_equals_torch(shape, scale, seed):
    x = _randn(*shape, seed=seed) * scale
    for dim in range(-len(shape), 0):
        torch.testing.assert_close(ab.softmax(x, dim=dim), torch.softmax(x, dim=dim))


def test_softmax_is_stable_for_huge_scores():
    x = torch.tensor([1000.0, 1001.0, 1002.0])
    naive = torch.exp(x) / torch.exp(x).sum()
    assert torch.isnan(naive).all()  # the naive formula overflows to inf / inf
    torch.testing.assert_close(ab.softmax(x), torch.softmax(x, dim=-1))


def test_softmax_all_masked_row_gives_zeros_not_nan():
    x = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 0.0]])
    out = ab.softmax(x)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.5]]))


def test_softmax_rejects_integers():
    with pytest.raises(TypeError, match="floating-point"):
        ab.softmax(torch.tensor([1, 2, 3]))


# --- masks -----------------------------------------------------------------------------------


def test_causal_mask_square_and_bottom_right():
    assert torch.equal(ab.causal_mask(3), torch.ones(3, 3, dtype=torch.bool).tril())
    expected = torch.tensor(
        [[True, True, True, False], [True, True, True, True]]
    )  # the 2 queries are the last 2 of 4 positions
    assert torch.equal(ab.causal_mask(2, 4), expected)
    assert ab.causal_mask(2, 4).dtype == torch.bool


@SETTINGS
@given(num_queries=st.integers(1, 8), extra=st.integers(0, 8))
def test_causal_mask_query_i_sees_keys_up_to_its_position(num_queries, extra):
    num_keys = num_queries + extra
    mask = ab.causal_mask(num_queries, num_keys)
    for i in range(num_queries):
        last = i + num_keys - num_queries
        assert mask[i, : last + 1].all() and not mask[i, last + 1 :].any()


def test_causal_mask_matches_torch_is_causal_when_square():
    q, k, v = _randn(2, 5, 4, seed=1), _randn(2, 5, 4, seed=2), _randn(2, 5, 3, seed=3)
    out, _ = ab.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_mask_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_queries must be >= 0, got -1"):
        ab.causal_mask(-1)
    with pytest.raises(TypeError, match="num_keys must be an int"):
        ab.causal_mask(2, 2.5)


def test_padding_mask():
    mask = ab.padding_mask([2, 4, 0], 4)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [
        [True, True, False, False],
        [True, True, True, True],
        [False, False, False, False],
    ]


def test_padding_mask_rejects_bad_lengths():
    with pytest.raises(ValueError, match=r"max_len=3.*\[2, 5\]"):
        ab.padding_mask([2, 5], 3)
    with pytest.raises(ValueError, match=r"1-D"):
        ab.padding_mask([[1, 2]], 3)
    with pytest.raises(TypeError, match="integers"):
        ab.padding_mask([1.5], 3)


# --- scaled dot-product attention ------------------------------------------------------------


@SETTINGS
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    t_q=st.integers(1, 7),
    t_k=st.integers(1, 7),
    d_k=st.integers(1, 8),
    d_v=st.integers(1, 8),
    seed=st.integers(0, 10_000),
)
def test_sdpa_equals_pytorch(lead, t_q, t_k, d_k, d_v, seed):
    q = _randn(*lead, t_q, d_k, seed=seed)
    k = _randn(*lead, t_k, d_k, seed=seed + 1)
    v = _randn(*lead, t_k, d_v, seed=seed + 2)
    out, weights = ab.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert weights.shape == (*lead, t_q, t_k)
    torch.testing.assert_close(weights.sum(-1), torch.ones(*lead, t_q))


@SETTINGS
@given(t=st.integers(1, 6), seed=st.integers(0, 10_000), scale=st.floats(0.05, 3.0))
def test_sdpa_with_mask_and_scale_equals_pytorch(t, seed, scale):
    q = _randn(2, 3, t, 4, seed=seed)
    k = _randn(2, 3, t, 4, seed=seed + 1)
    v = _randn(2, 3, t, 5, seed=seed + 2)
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(2, 1, t, t, generator=generator) > 0.3
    mask |= torch.eye(t, dtype=torch.bool)  # keep every row with at least one key
    out, _ = ab.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out, expected)


def test_default_scale_is_one_over_sqrt_dk():
    q, k, v = _randn(3, 16, seed=1), _randn(3, 16, seed=2), _randn(3, 2, seed=3)
    _, weights = ab.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights, torch.softmax(q @ k.T / math.sqrt(16), dim=-1))


def test_fully_masked_row_gives_zero_weights_and_output():
    q, k, v = _randn(3, 4, seed=1), _randn(3, 4, seed=2), _randn(3, 2, seed=3)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    out, weights = ab.scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    assert torch.equal(weights[1], torch.zeros(3)) and torch.equal(out[1], torch.zeros(2))


def test_mask_and_is_causal_combine():
    q, k, v = _randn(4, 3, seed=1), _randn(4, 3, seed=2), _randn(4, 3, seed=3)
    padding = torch.tensor([True, True, True, False])
    _, weights = ab.scaled_dot_product_attention(q, k, v, padding, is_causal=True)
    allowed = ab.causal_mask(4) & padding
    assert torch.all(weights[~allowed] == 0)


@SETTINGS
@given(t=st.integers(2, 7), j=st.integers(0, 6), seed=st.integers(0, 10_000))
def test_causal_outputs_ignore_future_tokens(t, j, seed):
    j = j % t
    x = _randn(t, 4, seed=seed)
    changed = x.clone()
    changed[j] += 10.0
    before, _ = ab.scaled_dot_product_attention(x, x, x, is_causal=True)
    after, _ = ab.scaled_dot_product_attention(changed, changed, changed, is_causal=True)
    torch.testing.assert_close(before[:j], after[:j])


@SETTINGS
@given(t=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_permutation_equivariance_without_mask(t, seed):
    x = _randn(t, 5, seed=seed)
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(seed))
    out, _ = ab.scaled_dot_product_attention(x, x, x)
    out_perm, _ = ab.scaled_dot_product_attention(x[perm], x[perm], x[perm])
    torch.testing.assert_close(out_perm, out[perm])


def test_dropout_preserves_expectation():
    q, k, v = _randn(4, 8, seed=1), _randn(4, 8, seed=2), _randn(4, 8, seed=3)
    _, clean = ab.scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    draws = torch.stack([ab.scaled_dot_product_attention(q, k, v, dropout_p=0.3)[1] for _ in range(4000)])
    kept = draws[draws > 0] / clean.expand_as(draws)[draws > 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.7))  # survivors scaled by 1/(1-p)
    # standard error of a mean of 4000 draws of w * Bernoulli(0.7) / 0.7 is below 0.01 * w
    torch.testing.assert_close(draws.mean(0), clean, atol=0.03, rtol=0.05)
    assert (draws == 0).float().mean().item() == pytest.approx(0.3, abs=0.01)


# --- bad input -------------------------------------------------------------------------------


def test_bad_input_errors_name_the_sizes():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 4)
    with pytest.raises(ValueError, match=r"d_k.*query has 8.*key has 7"):
        ab.scaled_dot_product_attention(q, torch.randn(2, 6, 7), v)
    with pytest.raises(ValueError, match=r"T_k.*key has 6.*value has 5"):
        ab.scaled_dot_product_attention(q, k, torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 6\).*\(2, 5, 6\)"):
        ab.scaled_dot_product_attention(q, k, v, torch.ones(3, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean"):
        ab.scaled_dot_product_attention(q, k, v, torch.ones(5, 6))
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match=rf"dropout_p must lie in \[0, 1\), got {p}"):
            ab.scaled_dot_product_attention(q, k, v, dropout_p=p)
    with pytest.raises(TypeError, match="floating-point.*int64"):
        ab.scaled_dot_product_attention(q.long(), k, v)
    with pytest.raises(ValueError, match=r"leading.*\(3, 5, 8\).*\(2, 6, 8\)"):
        ab.scaled_dot_product_attention(torch.randn(3, 5, 8), k, v)
    with pytest.raises(ValueError, match=r"at least 2 dims.*\(8,\)"):
        ab.scaled_dot_product_attention(torch.randn(8), k, v)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4), min_size=1, max_size=3))
def test_broadcast_shape_follows_torchs_rule(shapes):
    """The plain-Python check gives torch.broadcast_shapes' answer, or None where it raises."""
    from attention_book.checks import broadcast_shape

    try:
        expected = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        expected = None
    assert broadcast_shape(*shapes) == expected
