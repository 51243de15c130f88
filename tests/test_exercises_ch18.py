"""Chapter 18's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten

from attention_book.exercises import (
    check_chunked_decay_attention,
    check_gated_delta_step,
    check_hybrid_memory_bytes,
)


@pytest.mark.parametrize("checker", [check_gated_delta_step, check_hybrid_memory_bytes,
                                     check_chunked_decay_attention])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 18.1


def gated_delta_step(state, key, value, beta, decay, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on."""
    factor = (decay if mistake == "log" else decay.exp())[..., None, None]  # (B, H, 1, 1)
    if mistake != "late decay":
        state = state * factor
    if mistake == "S k":
        recalled = (state @ key.unsqueeze(-1)).squeeze(-1)  # wrong: S k, not S^T k
    else:
        recalled = (key.unsqueeze(-2) @ state).squeeze(-2)  # (B, H, d_v)
    written = value if mistake == "linear" else value - recalled
    if mistake != "no beta":
        written = beta[..., None] * written
    state = state + key[..., :, None] * written[..., None, :]  # (B, H, d_k, d_v)
    return state * factor if mistake == "late decay" else state


def test_gated_delta_step_right_answer(capsys):
    assert_passes(check_gated_delta_step, gated_delta_step, capsys)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("log", "multiply the state by exp(g)"),
    ("late decay", "before the recall and the write"),
    ("linear", "linear attention's write"),
    ("no beta", "write strength beta"),
    ("S k", "Run your function"),  # d_k != d_v: the shapes do not fit
])
def test_gated_delta_step_typical_mistakes(mistake, phrase, capsys):
    assert_fails(check_gated_delta_step,
                 lambda *args: gated_delta_step(*args, mistake=mistake), capsys, phrase)


# ----------------------------------------------------------------------------- 18.2


def hybrid_memory_bytes(config, context_length, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on."""
    nbytes = {"float32": 4, "float16": 2, "bfloat16": 2}[config["torch_dtype"]]
    if mistake == "dtype":
        nbytes = 2
    num_layers = config["num_hidden_layers"]
    layer_types = config.get("layer_types")
    if layer_types is None:
        interval = config["full_attention_interval"]
        first = 0 if mistake == "interval" else 1
        layer_types = ["full_attention" if (i + first) % interval == 0 else "linear_attention"
                       for i in range(num_layers)]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config["num_attention_heads" if mistake == "query heads" else "num_key_value_heads"]
    kv_per_token = (1 if mistake == "keys only" else 2) * kv_heads * head_dim
    heads = config["linear_num_key_heads" if mistake == "key heads" else "linear_num_value_heads"]
    state = heads * config["linear_key_head_dim"] * config["linear_value_head_dim"]
    if mistake == "state per token":
        state *= context_length
    full = layer_types.count("full_attention")
    if mistake == "no states":
        state = 0
    return (full * kv_per_token * context_length + (num_layers - full) * state) * nbytes


def test_hybrid_memory_right_answer(capsys):
    assert_passes(check_hybrid_memory_bytes, hybrid_memory_bytes, capsys)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("key heads", "per *value* head"),
    ("state per token", "do not grow with the context"),
    ("no states", "add the recurrent layers' states"),
    ("keys only", "a key *and* a value"),
    ("query heads", "num_key_value_heads (2) heads"),
    ("interval", "indices 3, 7"),
    ("dtype", "float32 numbers take 4 bytes"),
])
def test_hybrid_memory_typical_mistakes(mistake, phrase, capsys):
    assert_fails(check_hybrid_memory_bytes,
                 lambda config, context_length: hybrid_memory_bytes(config, context_length,
                                                                    mistake=mistake),
                 capsys, phrase)


def test_hybrid_memory_missing_layer_types(capsys):
    def reads_layer_types(config, context_length):
        config["layer_types"]  # noqa: B018 - a KeyError for the configs without it
        return hybrid_memory_bytes(config, context_length)

    assert_fails(check_hybrid_memory_bytes, reads_layer_types, capsys,
                 "full_attention_interval instead")


# ----------------------------------------------------------------------------- 18.3


def chunked_decay_attention(query, key, value, decay, chunk_size, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on (``"boundary"`` is the
    chapter's buggy version)."""
    *lead, num_tokens, d_k = key.shape
    state = key.new_zeros(*lead, d_k, value.size(-1))  # (B, H, d_k, d_v)
    outputs = []
    for start in range(0, num_tokens, chunk_size):
        if mistake == "drop the last chunk" and start + chunk_size > num_tokens:
            break
        q, k, v = (x[..., start:start + chunk_size, :] for x in (query, key, value))
        log_gamma = decay[..., start:start + chunk_size].cumsum(dim=-1)  # (B, H, C)
        size = k.size(-2)
        lower = torch.ones(size, size, dtype=torch.bool).tril()
        ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(
            ~lower, float("-inf")).exp()  # (B, H, C, C)
        within = ((q @ k.transpose(-2, -1)) * ratio) @ v  # (B, H, C, d_v)
        from_state = log_gamma.exp()[..., None] * (q @ state)  # (B, H, C, d_v)
        outputs.append(within + from_state)
        to_end = (log_gamma[..., -1:] - log_gamma).exp()[..., None]  # (B, H, C, 1)
        carried = state if mistake == "boundary" else log_gamma[..., -1].exp()[..., None, None] * state
        state = carried + (to_end * k).transpose(-2, -1) @ v
    return torch.cat(outputs, dim=-2), state


def test_chunked_decay_right_answer(capsys):
    assert_passes(check_chunked_decay_attention, chunked_decay_attention, capsys)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("boundary", "fade by the chunk's whole decay"),
    ("drop the last chunk", "also when the last chunk is shorter"),
])
def test_chunked_decay_typical_mistakes(mistake, phrase, capsys):
    assert_fails(check_chunked_decay_attention,
                 lambda *args: chunked_decay_attention(*args, mistake=mistake), capsys, phrase)


def test_chunked_decay_without_the_state_between_chunks(capsys):
    def restart(query, key, value, decay, chunk_size):
        pieces = [chunked_decay_attention(*(x[..., s:s + chunk_size, :] for x in (query, key, value)),
                                          decay[..., s:s + chunk_size], chunk_size)
                  for s in range(0, key.size(-2), chunk_size)]
        return torch.cat([out for out, _ in pieces], dim=-2), pieces[-1][1]

    assert_fails(check_chunked_decay_attention, restart, capsys, "the first chunk right")
