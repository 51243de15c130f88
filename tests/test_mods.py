"""Chapter 13: masks as rules ``allowed(b, h, q_idx, kv_idx)``, score rules, and FlexAttention.

Every mask of the gallery, and ALiBi and soft-capping as score rules, give the same output
through PyTorch's FlexAttention (eager, on this CPU build) as through the book's attention
with the materialised mask, within 1e-5; the materialised masks equal PyTorch's own
``create_mask``; FlexAttention's backward pass raises ``NotImplementedError`` on the CPU,
as the chapter says. Building a block mask first materialises the whole (B, H, T, T) grid, and
its partial and full tiles are ``tile_plan``'s; a ``score_mod`` receives the scaled score and
runs on the pairs the mask blocks as well.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import (
    and_masks,
    create_block_mask,
    create_mask,
    flex_attention,
)
from torch.utils._python_dispatch import TorchDispatchMode

import attention_book as ab
from attention_book import mods

BATCH, HEADS, TOKENS, HEAD_DIM = 2, 4, 12, 8
LENGTHS = torch.tensor([12, 7])
DOCUMENTS = torch.tensor([0] * 5 + [1] * 4 + [2] * 3)

GALLERY = {
    "causal": mods.causal,
    "padding": mods.padding(LENGTHS),
    "sliding window": mods.sliding_window(3),
    "prefix-LM": mods.prefix_lm(4),
    "document": mods.document(DOCUMENTS),
    "document and causal": and_masks(mods.document(DOCUMENTS), mods.causal),
}


def _flex(*args, **kwargs):
    # Eager FlexAttention warns that it is not compiled; the comparison is the point here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


@pytest.fixture(scope="module")
def qkv():
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(BATCH, HEADS, TOKENS, HEAD_DIM, generator=generator)
                 for _ in range(3))


@pytest.mark.parametrize("name", list(GALLERY))
def test_every_gallery_mask_gives_flex_attentions_output(name, qkv):
    rule = GALLERY[name]
    mask = mods.materialize(rule, BATCH, HEADS, TOKENS)
    assert torch.equal(mask, create_mask(rule, BATCH, HEADS, TOKENS, TOKENS, device="cpu"))
    expected, weights = ab.scaled_dot_product_attention(*qkv, mask)
    assert (weights[~mask] == 0).all()
    block_mask = create_block_mask(rule, BATCH, HEADS, TOKENS, TOKENS, device="cpu")
    torch.testing.assert_close(_flex(*qkv, block_mask=block_mask), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["ALiBi", "soft-capping"])
def test_score_rules_give_flex_attentions_output(name, qkv):
    score_mod = mods.alibi(HEADS) if name == "ALiBi" else mods.soft_cap(1.5)
    query, key, value = qkv
    scores = query @ key.transpose(-2, -1) / math.sqrt(HEAD_DIM)  # (B, H, T, T)
    scores = mods.apply_score_mod(scores, score_mod).masked_fill(~ab.causal_mask(TOKENS),
                                                                 float("-inf"))
    expected = ab.softmax(scores) @ value  # (B, H, T, d)
    block_mask = create_block_mask(mods.causal, None, None, TOKENS, TOKENS, device="cpu")
    output = _flex(query, key, value, score_mod=score_mod, block_mask=block_mask)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)


def test_rules_equal_the_packages_masks():
    window = mods.materialize(mods.sliding_window(3), 1, 1, 9)[0, 0]
    assert torch.equal(window, ab.sliding_window_mask(9, 3))
    assert torch.equal(mods.materialize(mods.causal, 1, 1, 6)[0, 0], ab.causal_mask(6))
    padding = mods.materialize(mods.padding(LENGTHS), BATCH, 1, 1, TOKENS)  # (B, 1, 1, T)
    assert torch.equal(padding, ab.padding_mask(LENGTHS, TOKENS))
    prefix = mods.materialize(mods.prefix_lm(2), 1, 1, 4)[0, 0]
    assert prefix.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    blocks = mods.materialize(mods.document(torch.tensor([0, 0, 1])), 1, 1, 3)[0, 0]
    assert blocks.int().tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1]]


def test_score_rules_equal_the_formulas():
    scores = torch.randn(1, 4, 5, 5, generator=torch.Generator().manual_seed(1))
    alibi = mods.apply_score_mod(scores, mods.alibi(4))
    torch.testing.assert_close(alibi, scores + ab.alibi_bias(4, 5))
    capped = mods.apply_score_mod(scores * 10, mods.soft_cap(3.0))
    assert capped.abs().max() <= 3.0 < (scores * 10).abs().max()
    torch.testing.assert_close(capped, 3.0 * torch.tanh(scores * 10 / 3.0))


def test_bad_rules_and_arguments_are_refused():
    with pytest.raises(TypeError, match="must return booleans"):
        mods.materialize(lambda b, h, q, k: q - k, 1, 1, 3)
    with pytest.raises(ValueError, match="window must be >= 1"):
        mods.sliding_window(0)
    with pytest.raises(ValueError, match="prefix_length must be >= 0"):
        mods.prefix_lm(-1)
    with pytest.raises(TypeError, match="lengths must be a 1-D integer tensor"):
        mods.padding([3, 2])
    with pytest.raises(TypeError, match="document_ids must be a 1-D integer tensor"):
        mods.document(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="cap must be a positive number"):
        mods.soft_cap(0)
    with pytest.raises(ValueError, match=r"scores must have shape \(B, H, T_q, T_k\)"):
        mods.apply_score_mod(torch.randn(3, 3), mods.soft_cap(1.0))


def test_flex_attentions_backward_is_not_implemented_on_the_cpu(qkv):
    """The chapter says so; if a later PyTorch adds it, the chapter's sentence must change."""
    query = qkv[0].clone().requires_grad_()
    block_mask = create_block_mask(mods.causal, None, None, TOKENS, TOKENS, device="cpu")
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        _flex(query, qkv[1], qkv[2], block_mask=block_mask).sum().backward()


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.entries = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, torch.Tensor):
                self.entries = max(self.entries, tensor.numel())
        return result


@pytest.mark.parametrize(("batch", "heads", "tokens"), [(None, None, 1024), (None, None, 300),
                                                      (2, 3, 200)])
def test_building_a_block_mask_materialises_the_whole_grid(batch, heads, tokens):
    """Chapter 13 says create_block_mask evaluates the rule on every (b, h, q, k) first."""
    with _LargestTensor() as largest:
        create_block_mask(mods.sliding_window(64), batch, heads, tokens, tokens, device="cpu")
    padded = math.ceil(tokens / 128) * 128  # the grid is padded to whole 128-token tiles
    assert largest.entries == (batch or 1) * (heads or 1) * padded * padded


@pytest.mark.parametrize(("tokens", "window"), [(2048, 512), (1024, 300), (1000, 129), (640, 1)])
def test_block_mask_tiles_are_the_tile_plan(tokens, window):
    """A block mask's partial and full tiles are tile_plan's masked and full tiles."""
    block_mask = create_block_mask(mods.sliding_window(window), None, None, tokens, tokens,
                                   device="cpu")
    plan = ab.tile_plan(tokens, tokens, 128, window=window)
    assert int(block_mask.kv_num_blocks.sum()) == int((plan == 2).sum())
    assert int(block_mask.full_kv_num_blocks.sum()) == int((plan == 1).sum())


def test_a_score_mod_sees_the_scaled_score_and_runs_on_blocked_pairs(qkv):
    query, key, value = qkv
    block_mask = create_block_mask(mods.causal, None, None, TOKENS, TOKENS, device="cpu")
    scaled = query @ key.transpose(-2, -1) / math.sqrt(HEAD_DIM)  # (B, H, T, T)
    seen = _flex(query, key, value, score_mod=lambda score, b, h, q, k: score * 0 + 1.0,
                 block_mask=block_mask)
    uniform = ab.softmax(torch.ones_like(scaled).masked_fill(~ab.causal_mask(TOKENS),
                                                             float("-inf"))) @ value
    torch.testing.assert_close(seen, uniform)
    doubled = _flex(query, key, value, score_mod=lambda score, b, h, q, k: 2 * score,
                    block_mask=block_mask)
    expected = ab.softmax((2 * scaled).masked_fill(~ab.causal_mask(TOKENS), float("-inf"))) @ value
    torch.testing.assert_close(doubled, expected, rtol=0, atol=1e-5)
    table = torch.zeros(3)  # one number per distance 0, 1, 2: out of range for future keys
    with pytest.raises(IndexError):
        _flex(query, key, value, score_mod=lambda score, b, h, q, k: score + table[q - k],
              block_mask=block_mask)
