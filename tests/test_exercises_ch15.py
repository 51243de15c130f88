"""Chapter 15's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import torch
from checker_asserts import assert_fails, unwritten

from attention_book.exercises import (
    check_block_forward,
    check_block_parameter_count,
    check_breaking_heads,
    check_is_causal,
)

# --- block_parameter_count --------------------------------------------------------------------


def count_right(d, r, qkv_bias):
    return (4 + 2 * r) * d * d + (6 + r) * d + 3 * d * qkv_bias


def test_count_right(capsys):
    assert check_block_parameter_count(count_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_count_without_qkv_bias(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, False), capsys,
                 "counts the query, key and value biases")


def test_count_without_layernorms(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, r, b) - 4 * d,
                 capsys, "counts the LayerNorms")


def test_count_with_a_fixed_ratio(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: count_right(d, 4, b), capsys,
                 "follows mlp_ratio")


def test_count_without_biases_at_all(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: (4 + 2 * r) * d * d, capsys,
                 "has the right value", "two LayerNorms")


def test_count_as_float_and_not_written(capsys):
    assert_fails(check_block_parameter_count, lambda d, r, b: float(count_right(d, r, b)), capsys,
                 "is an int")
    assert_fails(check_block_parameter_count, unwritten, capsys, "You have not written",
                 sections=())


# --- breaking heads -----------------------------------------------------------------------------


def test_heads_right(capsys):
    assert check_breaking_heads(lambda: {"L0H0", "L1H0"})
    assert capsys.readouterr().out.startswith("Correct:")
    assert check_breaking_heads(lambda: ["L1H0", "L0H0"])


def test_heads_decoy_included(capsys):
    assert_fails(check_breaking_heads, lambda: {"L0H0", "L0H1", "L1H0"}, capsys,
                 "look right but write nothing", "value projection is zero")


def test_heads_previous_token_head_left_out(capsys):
    assert_fails(check_breaking_heads, lambda: {"L1H0"}, capsys, "writes the previous token")


def test_heads_induction_head_left_out(capsys):
    assert_fails(check_breaking_heads, lambda: {"L0H0"}, capsys,
                 "exactly the heads whose ablation breaks copying", "['L0H0', 'L1H0']")


def test_heads_bad_names_and_types(capsys):
    assert_fails(check_breaking_heads, lambda: {"layer 0"}, capsys, "is a head of the model")
    assert_fails(check_breaking_heads, lambda: "L0H0", capsys, "a set of head names")


# --- block forward ------------------------------------------------------------------------------


def forward_right(block, x):
    x = x + block.attention(block.attention_norm(x))
    return x + block.mlp(block.mlp_norm(x))


def forward_stream_normed(block, x):
    x = block.attention_norm(x)
    x = x + block.attention(x)
    return x + block.mlp(block.mlp_norm(x))


def forward_raw_mlp(block, x):
    x = x + block.attention(block.attention_norm(x))
    return x + block.mlp(x)


def forward_post_norm(block, x):
    x = block.attention_norm(x + block.attention(x))
    return block.mlp_norm(x + block.mlp(x))


def forward_no_residual(block, x):
    x = block.attention(block.attention_norm(x))
    return block.mlp(block.mlp_norm(x))


def test_forward_right(capsys):
    assert check_block_forward(forward_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_forward_typical_bugs(capsys):
    assert_fails(check_block_forward, forward_stream_normed, capsys,
                 "carries x, not attention_norm(x)")
    assert_fails(check_block_forward, forward_raw_mlp, capsys, "MLP reads a LayerNorm-ed copy")
    assert_fails(check_block_forward, forward_post_norm, capsys, "is pre-LayerNorm")
    assert_fails(check_block_forward, forward_no_residual, capsys, "the values of the block")


def test_forward_must_use_the_parts(capsys):
    assert_fails(check_block_forward, lambda block, x: block(x), capsys,
                 "call the block's parts")


# --- is_causal ----------------------------------------------------------------------------------


def is_causal_right(model):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (2, model.context_length), generator=generator)
    with torch.no_grad():
        reference = model(tokens)
        for position in range(model.context_length):
            changed = tokens.clone()
            changed[:, position] = (changed[:, position] + 1) % model.vocab_size
            if not torch.allclose(model(changed)[:, :position], reference[:, :position]):
                return False
    return True


def is_causal_last_token_only(model):
    tokens = torch.zeros(1, model.context_length, dtype=torch.long)
    changed = tokens.clone()
    changed[:, -1] = 1
    with torch.no_grad():
        return bool(torch.allclose(model(changed)[:, :-1], model(tokens)[:, :-1]))


def is_causal_compares_everything(model):
    tokens = torch.zeros(1, model.context_length, dtype=torch.long)
    changed = tokens.clone()
    changed[:, 4] = 1
    with torch.no_grad():
        return bool(torch.allclose(model(changed), model(tokens)))


def test_is_causal_right(capsys):
    assert check_is_causal(is_causal_right)
    assert capsys.readouterr().out.startswith("Correct:")


def test_is_causal_that_changes_only_the_last_token_misses_a_leak(capsys):
    assert_fails(check_is_causal, is_causal_last_token_only, capsys,
                 "rejects a model with position 0 reads token 3")


def test_is_causal_that_compares_every_position_rejects_healthy_models(capsys):
    assert_fails(check_is_causal, is_causal_compares_everything, capsys,
                 "accepts a healthy TinyGPT")


def test_is_causal_that_always_says_yes_or_returns_a_tensor(capsys):
    assert_fails(check_is_causal, lambda model: True, capsys,
                 "rejects a model with attention without the causal mask")
    assert_fails(check_is_causal, lambda model: torch.tensor(True), capsys, "returns a bool")


def test_checkers_leave_the_global_random_state_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_block_forward(forward_right)
    check_is_causal(is_causal_right)
    assert torch.equal(torch.rand(3), expected)
