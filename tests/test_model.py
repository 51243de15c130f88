"""The Transformer block and TinyGPT of chapter 15: shapes, causality, the cache, the parameter count.

Every property is checked with learned positions and with rotary positions (``rope=True``).
"""

from __future__ import annotations

import pytest
import torch
from model_variants import VARIANTS, CausalMean, RunningSum, variant

import attention_book as ab
from attention_book.model import TinyGPT, TransformerBlock, gpt_parameter_count


def _model(attention_only: bool = False, rope: bool = False, **overrides) -> TinyGPT:
    sizes = {"vocab_size": 11, "d_model": 16, "num_heads": 4, "num_layers": 2,
             "context_length": 12}
    sizes.update(overrides)
    torch.manual_seed(0)
    return TinyGPT(**sizes, attention_only=attention_only, rope=rope, dtype=torch.float64).eval()


def _tokens(batch: int, length: int, vocab_size: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_public_names_are_exported():
    for name in ("TransformerBlock", "TinyGPT", "gpt_parameter_count", "induction_scores",
                 "previous_token_scores", "find_heads", "ablate_heads"):
        assert name in ab.__all__ and hasattr(ab, name), name


# --------------------------------------------------------------------------- the block


def test_block_is_pre_layernorm_with_two_residual_branches():
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, context_length=8).eval()
    x = torch.randn(2, 5, 16)  # (B, T, d_model)
    with torch.no_grad():
        out, weights = block(x, return_weights=True)
        after_attention = x + block.attention(block.attention_norm(x))  # (B, T, d_model)
        expected = after_attention + block.mlp(block.mlp_norm(after_attention))  # (B, T, d_model)
    torch.testing.assert_close(out, expected)
    assert weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))


def test_attention_only_block_has_no_mlp():
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, context_length=8, attention_only=True).eval()
    assert not hasattr(block, "mlp") and not hasattr(block, "mlp_norm")
    x = torch.randn(1, 4, 16)  # (B, T, d_model)
    with torch.no_grad():
        torch.testing.assert_close(block(x), x + block.attention(block.attention_norm(x)))


def test_block_decodes_with_a_kv_cache_like_the_full_pass():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, context_length=8, mlp_ratio=2, qkv_bias=True).eval()
    x = torch.randn(2, 7, 16)  # (B, T, d_model)
    cache = ab.KVCache(8)
    with torch.no_grad():
        full = block(x)  # (B, T, d_model)
        steps = [block(x[:, :3], kv_cache=cache)] + [
            block(x[:, t:t + 1], kv_cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"d_model": 10, "num_heads": 3}, ValueError, r"d_out \(10\) must be divisible by num_heads \(3\)"),
    ({"mlp_ratio": 0}, ValueError, "mlp_ratio must be >= 1"),
    ({"dropout": 1.0}, ValueError, r"dropout must lie in \[0, 1\)"),
    ({"d_model": 8.0}, TypeError, "d_model must be an int"),
])
def test_block_rejects_bad_sizes(kwargs, error, match):
    arguments = {"d_model": 8, "num_heads": 2, "context_length": 4, **kwargs}
    with pytest.raises(error, match=match):
        TransformerBlock(**arguments)


# --------------------------------------------------------------------------- the model


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attention_only", [False, True])
def test_logits_and_weights_have_the_promised_shapes(attention_only, rope):
    model = _model(attention_only, rope)
    tokens = _tokens(3, 9)
    logits, all_weights = model(tokens, return_weights=True)
    assert logits.shape == (3, 9, 11) and logits.dtype == torch.float64
    assert len(all_weights) == 2
    for weights in all_weights:
        assert weights.shape == (3, 4, 9, 9)
        assert torch.all(weights.triu(diagonal=1) == 0)  # causal
    torch.testing.assert_close(model(tokens), logits)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attention_only", [False, True])
@pytest.mark.parametrize("position", [0, 4, 10])
def test_changing_a_future_token_leaves_earlier_logits_unchanged(attention_only, rope, position):
    model = _model(attention_only, rope)
    tokens = _tokens(2, 12)
    changed = tokens.clone()
    changed[:, position] = (changed[:, position] + 1) % 11
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :position], before[:, :position], atol=0, rtol=0)
    assert not torch.allclose(after[:, position:], before[:, position:])


def test_the_causality_test_above_can_fail():
    """A model whose attention sees the future breaks the property that test checks."""
    model = _model()
    for block in model.blocks:
        block.attention.causal = False
    tokens = _tokens(1, 12)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 11
    with torch.no_grad():
        assert not torch.allclose(model(changed)[:, 0], model(tokens)[:, 0])


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attention_only", [False, True])
def test_cached_and_uncached_generation_give_the_same_tokens(attention_only, rope):
    model = _model(attention_only, rope)
    prompt = _tokens(3, 4)
    cached = model.generate(prompt, 8, use_cache=True)
    recomputed = model.generate(prompt, 8, use_cache=False)
    assert cached.shape == (3, 12)
    assert torch.equal(cached[:, :4], prompt)
    assert torch.equal(cached, recomputed)
    # Greedy: each new token is the argmax of the full forward pass over what came before.
    with torch.no_grad():
        logits = model(cached[:, :-1])  # (B, 11, vocab_size)
    assert torch.equal(logits[:, 3:].argmax(-1), cached[:, 4:])


def test_generation_with_the_cache_uses_the_right_positions():
    """A cache that forgot the position offset would give other tokens: this model would see it."""
    model = _model()
    with torch.no_grad():
        model.position_embedding.weight.mul_(5)
    prompt = _tokens(4, 3, seed=7)
    assert torch.equal(model.generate(prompt, 9), model.generate(prompt, 9, use_cache=False))


def test_a_rope_model_has_no_position_table_and_rotates_in_every_layer():
    model = _model(rope=True, rope_base=500.0)
    assert model.rope and model.position_embedding is None
    assert "position_embedding" not in dict(model.named_parameters())
    for block in model.blocks:
        assert block.attention.rope and block.attention.rope_base == 500.0
    # The block's forward is the chapter's: x + attn(ln(x)), then x + mlp(ln(x)), with RoPE.
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    block = model.blocks[0]
    with torch.no_grad():
        after_attention = x + block.attention(block.attention_norm(x))
        expected = after_attention + block.mlp(block.mlp_norm(after_attention))
        torch.testing.assert_close(block(x), expected)


def test_generation_of_a_rope_model_continues_the_positions_from_the_cache():
    """A cache that restarted the rotary positions would give other tokens: this model sees it."""
    model = _model(rope=True)
    prompt = _tokens(4, 3, seed=7)
    cached = model.generate(prompt, 9)
    assert torch.equal(cached, model.generate(prompt, 9, use_cache=False))
    for block in model.blocks:  # the bug of chapter 12: positions that restart at 0
        block.attention._rope_positions = (
            lambda num_tokens, kv_cache, device: torch.arange(num_tokens, device=device))
    assert not torch.equal(model.generate(prompt, 9), cached)
    assert torch.equal(model.generate(prompt, 9, use_cache=False), cached)


def test_a_rope_block_decodes_with_a_kv_cache_like_the_full_pass():
    torch.manual_seed(0)
    block = TransformerBlock(16, 2, context_length=8, rope=True).eval()
    x = torch.randn(2, 7, 16)  # (B, T, d_model)
    cache = ab.KVCache(8)
    with torch.no_grad():
        full = block(x)  # (B, T, d_model)
        steps = [block(x[:, :2], kv_cache=cache)] + [
            block(x[:, t:t + 1], kv_cache=cache) for t in range(2, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_rope_options_are_checked():
    with pytest.raises(TypeError, match="rope must be a bool, got int"):
        TinyGPT(11, 16, 4, 2, 12, rope=1)
    with pytest.raises(ValueError, match=r"head_dim = d_out // num_heads = 12 // 4 = 3 must be even"):
        TinyGPT(11, 12, 4, 2, 12, rope=True)
    with pytest.raises(ValueError, match="base must be a positive number"):
        TransformerBlock(16, 2, 8, rope=True, rope_base=-1.0)


def test_generate_restores_training_mode_and_rejects_bad_lengths():
    model = _model().train()
    model.generate(_tokens(1, 2), 1)
    assert model.training
    with pytest.raises(ValueError, match=r"prompt of 5 tokens plus max_new_tokens=8 makes 13, "
                                         r"which exceeds context_length=12"):
        model.generate(_tokens(1, 5), 8)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        model.generate(_tokens(1, 5), -1)
    assert torch.equal(model.generate(_tokens(1, 5), 0), _tokens(1, 5))


@pytest.mark.parametrize(("tokens", "error", "match"), [
    (torch.zeros(2, 13, dtype=torch.long), ValueError, "T=13 exceeds context_length=12"),
    (torch.zeros(2, 3), TypeError, "integer token ids"),
    (torch.zeros(3, dtype=torch.long), ValueError, r"shape \(B, T\)"),
    (torch.full((1, 3), 11), ValueError, r"in \[0, vocab_size=11\), got ids from 11 to 11"),
])
def test_model_rejects_bad_token_ids(tokens, error, match):
    with pytest.raises(error, match=match):
        _model()(tokens)


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("attention_only", [False, True])
@pytest.mark.parametrize(("vocab_size", "d_model", "num_layers", "context_length"),
                         [(11, 16, 2, 12), (32, 32, 2, 32), (5, 8, 3, 7), (100, 24, 1, 64)])
def test_parameter_count_formula_matches_the_module(attention_only, rope, vocab_size, d_model,
                                                    num_layers, context_length):
    model = TinyGPT(vocab_size, d_model, 4, num_layers, context_length,
                    attention_only=attention_only, rope=rope, device="meta")
    counted = sum(p.numel() for p in model.parameters())
    assert gpt_parameter_count(vocab_size, d_model, num_layers, context_length,
                               attention_only=attention_only, rope=rope) == counted
    d = d_model
    per_block = 4 * d * d + 3 * d if attention_only else 12 * d * d + 10 * d
    positions = 0 if rope else context_length * d
    assert counted == 2 * vocab_size * d + positions + num_layers * per_block + 2 * d


def test_parameter_count_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        gpt_parameter_count(10, 8, 0, 4)


def test_dropout_is_used_in_training_only():
    model = _model(dropout=0.5).train()
    tokens = _tokens(2, 6)
    torch.manual_seed(0)
    first = model(tokens)
    torch.manual_seed(1)
    assert not torch.allclose(model(tokens), first)
    model.eval()
    torch.testing.assert_close(model(tokens), model(tokens))


# --------------------------------------------------------------------------- mixers and caches


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_decodes_with_its_caches_like_the_full_forward(name):
    model = variant(name)
    tokens = _tokens(3, 9)
    with torch.no_grad():
        full = model(tokens)  # (B, T, vocab_size)
        caches = model.new_caches()
        steps = [model(tokens[:, :4], kv_caches=caches)]  # the prompt, then one token at a time
        steps += [model(tokens[:, t:t + 1], kv_caches=caches) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert [len(cache) for cache in caches] == [9, 9]
    prompt = tokens[:, :3]
    assert torch.equal(model.generate(prompt, 7), model.generate(prompt, 7, use_cache=False))


def test_a_model_of_fused_attention_layers_runs_and_asks_no_weights_it_cannot_have():
    """The model asks its layers for weights only when its caller does: sdpa layers run."""
    fused = variant("fused")
    naive = variant("fused")
    for block in naive.blocks:
        block.attention.backend = "naive"  # the same weights, the book's own attention
    tokens = _tokens(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens), naive(tokens))
        logits, weights = naive(tokens, return_weights=True)
        assert len(weights) == 2 and weights[0].shape == (2, 4, 7, 7)
        with pytest.raises(ValueError, match="backend='sdpa' does not return attention weights"):
            fused(tokens, return_weights=True)


def test_a_block_holds_any_mixer_under_the_chapters_names():
    torch.manual_seed(0)
    mixer = CausalMean(16)
    block = TransformerBlock(16, 4, context_length=8, mixer=mixer, dtype=torch.float64).eval()
    assert block.attention is mixer and block.mixer is mixer
    assert isinstance(block.new_cache(8), RunningSum)
    assert isinstance(TransformerBlock(16, 4, 8).new_cache(8), ab.KVCache)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        after_mixer = x + mixer(block.attention_norm(x))  # (B, T, d_model)
        expected = after_mixer + block.mlp(block.mlp_norm(after_mixer))
        out, weights = block(x, return_weights=True)
    torch.testing.assert_close(out, expected)
    assert weights is None
    model = variant("hybrid")
    assert isinstance(model.blocks[0].attention, CausalMean)
    assert isinstance(model.blocks[1].attention, ab.MultiHeadAttention)
    assert "blocks.0.attention.W_value.weight" in model.state_dict()
    assert "blocks.1.attention.W_query.weight" in model.state_dict()


def test_mixers_and_caches_are_checked():
    with pytest.raises(ValueError, match="mixers names 1 mixers for num_layers=2"):
        TinyGPT(11, 16, 4, 2, 12, mixers=[None])
    with pytest.raises(TypeError, match="mixers must be a list"):
        TinyGPT(11, 16, 4, 2, 12, mixers=CausalMean(16))
    with pytest.raises(TypeError, match="mixer must be an nn.Module.*got str"):
        TransformerBlock(16, 4, 8, mixer="linear")
    model = _model()
    with pytest.raises(ValueError, match="kv_caches holds 1 caches for 2 layers"):
        model(_tokens(1, 2), kv_caches=[ab.KVCache(12)])
    with pytest.raises(TypeError, match=r"kv_caches\[0\] must be a cache"):
        model(_tokens(1, 2), kv_caches=[object(), object()])
    caches = model.new_caches()
    with torch.no_grad():
        model(_tokens(1, 10), kv_caches=caches)
    with pytest.raises(ValueError, match="sequence length T=13 exceeds context_length=12"):
        model(_tokens(1, 3), kv_caches=caches)
