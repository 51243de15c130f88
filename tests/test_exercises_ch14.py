"""Chapter 14's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests

from attention_book import causal_mask, softmax
from attention_book.exercises import (
    check_absorption_cost_prediction,
    check_decoupled_rope_weights,
    check_kv_bytes_per_token,
)


@pytest.mark.parametrize("checker", [check_kv_bytes_per_token, check_absorption_cost_prediction,
                                     check_decoupled_rope_weights])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 14.1

_NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_bytes_per_token(config, context_length, *, kv_heads_key="num_key_value_heads",
                       dtype=True, window=True, layer_types=True, latent=True, both=2,
                       use_head_dim=True, rope=True, minimum=True, latent_twice=False,
                       dtype_key=None, switch=True):
    """The right answer; each keyword switches one typical mistake on."""
    name = config[dtype_key] if dtype_key else config.get("dtype") or config["torch_dtype"]
    nbytes = _NBYTES[name] if dtype else 2
    num_layers = config["num_hidden_layers"]
    if latent and config.get("kv_lora_rank") is not None:
        numbers = config["kv_lora_rank"] + (config["qk_rope_head_dim"] if rope else 0)
        return num_layers * numbers * nbytes * (2 if latent_twice else 1)
    num_kv_heads = config.get(kv_heads_key) or config["num_attention_heads"]
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    if use_head_dim and config.get("head_dim"):
        head_dim = config["head_dim"]
    per_layer = both * num_kv_heads * head_dim * nbytes
    sliding = config.get("sliding_window") if window else None
    if switch and config.get("use_sliding_window") is False:
        sliding = None
    kinds = (config.get("layer_types") if layer_types else None) or ["sliding_attention"] * num_layers
    total = 0
    for kind in kinds:
        held = context_length
        if sliding is not None and kind == "sliding_attention":
            held = min(context_length, sliding) if minimum else sliding
        total += per_layer * held
    return total / context_length


def test_kv_bytes_right_answer(capsys):
    out = assert_passes(check_kv_bytes_per_token, kv_bytes_per_token, capsys)
    assert "six published configurations" in out
    assert passes_hidden_tests("14_kv_memory.ipynb", "ch14-ex1-check",
                               kv_bytes_per_token=kv_bytes_per_token)


@pytest.mark.parametrize("mistake", [{"switch": False}, {"dtype_key": "torch_dtype"},
                                     {"dtype_key": "dtype"}])
def test_kv_bytes_config_key_mistakes_fail_the_hidden_tests(mistake):
    def answer(config, context_length):
        return kv_bytes_per_token(config, context_length, **mistake)

    assert not passes_hidden_tests("14_kv_memory.ipynb", "ch14-ex1-check", kv_bytes_per_token=answer)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ({"kv_heads_key": "num_attention_heads"}, "not one per query head"),
    ({"both": 1}, "a key and a value"),
    ({"dtype": False}, "float32 takes 4"),
    ({"window": False}, "keeps only the last W tokens"),
    ({"minimum": False}, "use min(T, W)"),
    ({"latent": False}, "kv_lora_rank is multi-head latent attention"),
    ({"rope": False}, "cached beside the latent"),
    ({"latent_twice": True}, "keys and values together"),
    ({"layer_types": False}, "layer_types entry"),
    ({"use_head_dim": False}, "when the config gives head_dim"),
    ({"switch": False}, "use_sliding_window: false"),
    ({"dtype_key": "torch_dtype"}, "call it dtype"),
    ({"dtype_key": "dtype"}, "older configs call it torch_dtype"),
])
def test_kv_bytes_typical_mistakes(mistake, phrase, capsys):
    assert_fails(check_kv_bytes_per_token,
                 lambda config, context_length: kv_bytes_per_token(config, context_length,
                                                                   **mistake),
                 capsys, phrase)


def test_kv_bytes_missing_key(capsys):
    def strict(config, context_length):
        heads = config["num_key_value_heads"]  # LLaMA 1's config has no such key
        return kv_bytes_per_token({**config, "num_key_value_heads": heads}, context_length)

    assert_fails(check_kv_bytes_per_token, strict, capsys, "older configs (LLaMA 1)")


def test_kv_bytes_whole_cache_not_per_token(capsys):
    assert_fails(check_kv_bytes_per_token,
                 lambda config, context_length: kv_bytes_per_token(config, context_length)
                 * context_length, capsys, "divide the whole cache by context_length")


def test_kv_bytes_not_a_number(capsys):
    assert_fails(check_kv_bytes_per_token, lambda config, context_length: "128 KiB", capsys,
                 "returns a number")


# ----------------------------------------------------------------------------- 14.2

_T, _H, _DH, _DC = 4096, 128, 128, 512
_PLAIN = 2 * _T * _H * _DH * _DC + 2 * _T * _H * _DH
_ABSORBED = 2 * _H * _DH * _DC + 2 * _T * _H * _DC


def test_cost_right_answer(capsys):
    assert_passes(check_absorption_cost_prediction, lambda: (_PLAIN, _ABSORBED), capsys)
    assert_passes(check_absorption_cost_prediction, lambda: [float(_PLAIN), float(_ABSORBED)],
                  capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    ((_T * _H * _DH * _DC + 2 * _T * _H * _DH, _ABSORBED), "into a key and into a value"),
    ((2 * _T * _H * _DH * _DC, _ABSORBED), "still scores the query"),
    ((2 * _T * _H * _DH * _DC + _T * _H * _DH, _ABSORBED), "count both attention products"),
    ((2 * _H * _DH * _DC + 2 * _T * _H * _DH, _ABSORBED), "all T cached latents"),
    ((_PLAIN, 2 * _T * _H * _DC), "count those two products"),
    ((_PLAIN, 2 * _T * _H * _DH + 2 * _H * _DH * _DC), "have d_c features"),
    ((_PLAIN, _H * _DH * _DC + 2 * _T * _H * _DC), "count both small products"),
    ((_PLAIN, 2 * _T * _H * _DH * _DC + 2 * _T * _H * _DC), "once per step"),
    ((_PLAIN + 1, _ABSORBED), "three sizes"),
    ((_PLAIN,), "returns a pair"),
    (("many", "few"), "two numbers"),
])
def test_cost_wrong_answers(answer, phrase, capsys):
    assert_fails(check_absorption_cost_prediction, lambda: answer, capsys, phrase)


# ----------------------------------------------------------------------------- 14.3


def decoupled_rope_weights(absorbed_queries, rope_queries, latents, rope_keys, head_dim, *,
                           scale_dim=None, rope=True, causal=True, normalise=True):
    """The right answer; each keyword switches one typical mistake on."""
    scores = absorbed_queries @ latents.unsqueeze(1).transpose(-2, -1)
    if rope:
        scores = scores + rope_queries @ rope_keys.unsqueeze(1).transpose(-2, -1)
    size = head_dim + rope_queries.size(-1) if scale_dim is None else scale_dim(
        head_dim, rope_queries.size(-1), latents.size(-1))
    scores = scores / math.sqrt(size)
    if causal:
        scores = scores.masked_fill(~causal_mask(scores.size(-1)), float("-inf"))
    return softmax(scores) if normalise else scores


def test_rope_weights_right_answer(capsys):
    assert_passes(check_decoupled_rope_weights, decoupled_rope_weights, capsys)


def test_rope_weights_with_fused_sdpa_pass(capsys):
    """Concatenating [absorbed query; rotated query] and [latent; rotated key] is also right."""
    def concatenated(absorbed_queries, rope_queries, latents, rope_keys, head_dim):
        queries = torch.cat([absorbed_queries, rope_queries], dim=-1)
        keys = torch.cat([latents, rope_keys], dim=-1).unsqueeze(1)
        scores = queries @ keys.transpose(-2, -1) / math.sqrt(head_dim + rope_queries.size(-1))
        scores = scores.masked_fill(~causal_mask(scores.size(-1)), float("-inf"))
        return torch.softmax(scores, dim=-1)

    assert_passes(check_decoupled_rope_weights, concatenated, capsys)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ({"scale_dim": lambda d_h, d_r, d_c: d_h}, "counts all of them"),
    ({"scale_dim": lambda d_h, d_r, d_c: d_c + d_r}, "absorbing changes the vectors"),
    ({"scale_dim": lambda d_h, d_r, d_c: d_c}, "absorbed query's size"),
    ({"rope": False}, "rope_queries . rope_keys"),
    ({"causal": False}, "mask the scores before the softmax"),
    ({"normalise": False}, "after the softmax"),
    ({"scale_dim": lambda d_h, d_r, d_c: 2 * d_h}, "scaled once"),
])
def test_rope_weights_typical_mistakes(mistake, phrase, capsys):
    assert_fails(check_decoupled_rope_weights,
                 lambda *args: decoupled_rope_weights(*args, **mistake), capsys, phrase)


def test_rope_weights_rope_keys_not_broadcast(capsys):
    def per_head_keys(absorbed_queries, rope_queries, latents, rope_keys, head_dim):
        return decoupled_rope_weights(absorbed_queries, rope_queries, latents,
                                      rope_keys.transpose(-2, -1), head_dim)

    assert_fails(check_decoupled_rope_weights, per_head_keys, capsys, "runs without an error")
