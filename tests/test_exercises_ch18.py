"""Chapter 18's checkers: each accepts the right answer and explains each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests

import attention_book as ab
from attention_book.exercises import (
    check_chunked_decay_attention,
    check_decayed_weights,
    check_gated_delta_step,
    check_hybrid_memory_bytes,
    check_recall_prediction,
)

NOTEBOOK = "18_attention_as_a_recurrence.ipynb"


@pytest.mark.parametrize("checker", [check_gated_delta_step, check_hybrid_memory_bytes,
                                     check_chunked_decay_attention, check_decayed_weights,
                                     check_recall_prediction])
def test_a_blank_answer_says_it_is_not_written_yet(checker, capsys):
    assert checker(unwritten) is False
    assert "You have not written `unwritten` yet" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 18.1


def gated_delta_step(state, key, value, beta, decay, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on."""
    factor = {"log": decay, "exp(-g)": (-decay).exp()}.get(mistake, decay.exp())[..., None, None]
    original = state
    if mistake != "late decay":
        state = state * factor
    read = original if mistake == "unfaded recall" else state
    if mistake == "S k":
        recalled = (read @ key.unsqueeze(-1)).squeeze(-1)  # wrong: S k, not S^T k
    else:
        recalled = (key.unsqueeze(-2) @ read).squeeze(-2)  # (B, H, d_v)
    written = value if mistake == "linear" else value - recalled
    if mistake != "no beta":
        written = beta[..., None] * written
    kept = original if mistake == "unfaded write" else state
    state = kept + key[..., :, None] * written[..., None, :]  # (B, H, d_k, d_v)
    return state * factor if mistake == "late decay" else state


def test_gated_delta_step_right_answer(capsys):
    assert_passes(check_gated_delta_step, gated_delta_step, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch18-ex1-check", gated_delta_step=gated_delta_step)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("log", "multiply the state by exp(g)"),
    ("exp(-g)", "three moves, in order"),
    ("late decay", "before the recall and the write"),
    ("unfaded recall", "three moves, in order"),  # the error from the state before the fade
    ("unfaded write", "three moves, in order"),  # recall faded, but the write onto S unfaded
    ("linear", "linear attention's write"),
    ("no beta", "write strength beta"),
    ("S k", "Run your function"),  # d_k != d_v: the shapes do not fit
])
def test_gated_delta_step_typical_mistakes(mistake, phrase, capsys):
    """The review's wrong answers fail the checker and the hidden tests alike."""
    def answer(*args):
        return gated_delta_step(*args, mistake=mistake)

    assert_fails(check_gated_delta_step, answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex1-check", gated_delta_step=answer)


# ----------------------------------------------------------------------------- 18.2


def hybrid_memory_bytes(config, context_length, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on."""
    nbytes = {"float32": 4, "float16": 2, "bfloat16": 2}[config["torch_dtype"]]
    if mistake == "dtype":
        nbytes = 2
    num_layers = config["num_hidden_layers"]
    layer_types = None if mistake == "ignore layer_types" else config.get("layer_types")
    if layer_types is None:
        interval = config["full_attention_interval"]
        first = 0 if mistake == "interval" else 1
        layer_types = ["full_attention" if (i + first) % interval == 0 else "linear_attention"
                       for i in range(num_layers)]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if mistake == "derived head_dim":
        head_dim = config["hidden_size"] // config["num_attention_heads"]
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
    assert passes_hidden_tests(NOTEBOOK, "ch18-ex2-check", hybrid_memory_bytes=hybrid_memory_bytes)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("key heads", "per *value* head"),
    ("state per token", "do not grow with the context"),
    ("no states", "add the recurrent layers' states"),
    ("keys only", "a key *and* a value"),
    ("query heads", "num_key_value_heads (2) heads"),
    ("interval", "indices 3, 7"),
    ("dtype", "float32 numbers take 4 bytes"),
    ("ignore layer_types", "whatever full_attention_interval says"),
    ("derived head_dim", "the config's head_dim, 256 here"),
])
def test_hybrid_memory_typical_mistakes(mistake, phrase, capsys):
    """The review's wrong answers fail the checker and the hidden tests alike."""
    def answer(config, context_length):
        return hybrid_memory_bytes(config, context_length, mistake=mistake)

    assert_fails(check_hybrid_memory_bytes, answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex2-check", hybrid_memory_bytes=answer)


def test_hybrid_memory_missing_layer_types(capsys):
    def reads_layer_types(config, context_length):
        config["layer_types"]  # noqa: B018 - a KeyError for the configs without it
        return hybrid_memory_bytes(config, context_length)

    assert_fails(check_hybrid_memory_bytes, reads_layer_types, capsys,
                 "full_attention_interval instead")


# ----------------------------------------------------------------------------- 18.3


def chunked_decay_attention(query, key, value, decay, chunk_size, *, mistake=None):
    """The right answer; ``mistake`` switches one of the review's wrong answers on
    (``"boundary"`` is the chapter's buggy version)."""
    *lead, num_tokens, d_k = key.shape
    state = key.new_zeros(*lead, d_k, value.size(-1))  # (B, H, d_k, d_v)
    outputs, states = [], [state]
    for start in range(0, num_tokens, chunk_size):
        q, k, v = (x[..., start:start + chunk_size, :] for x in (query, key, value))
        g = decay[..., start:start + chunk_size]  # (B, H, C)
        log_gamma = g.cumsum(dim=-1)  # (B, H, C)
        if mistake == "exclusive cumsum":
            log_gamma = log_gamma - g
        size = k.size(-2)
        lower = torch.ones(size, size, dtype=torch.bool).tril()
        ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(
            ~lower, float("-inf")).exp()  # (B, H, C, C)
        if mistake == "no decay inside":
            ratio = lower.to(q.dtype)
        within = ((q @ k.transpose(-2, -1)) * ratio) @ v  # (B, H, C, d_v)
        to_end = (log_gamma[..., -1:] - log_gamma).exp()[..., None]  # (B, H, C, 1)
        fade = {"boundary": torch.zeros_like(g[..., 0]), "first-step fade": g[..., 0],
                "fade missing the first step": g[..., 1:].sum(-1)}.get(mistake, log_gamma[..., -1])
        new_state = fade.exp()[..., None, None] * state + (to_end * k).transpose(-2, -1) @ v
        read = new_state if mistake == "reading the new state" else state
        from_state = q @ read if mistake == "no Gamma_i on the state read" else \
            log_gamma.exp()[..., None] * (q @ read)  # (B, H, C, d_v)
        outputs.append(within + from_state)
        state = new_state
        states.append(state)
    out = torch.cat(outputs, dim=-2)
    if mistake == "padded output":
        out = torch.nn.functional.pad(out, (0, 0, 0, -num_tokens % chunk_size))
    return out, torch.stack(states, dim=-3)


def token_loop(query, key, value, decay, chunk_size):
    """A review's wrong answer: the token loop, which ignores chunk_size."""
    state = key.new_zeros(*key.shape[:-2], key.size(-1), value.size(-1))
    outputs = []
    for t in range(key.size(-2)):
        state = decay[..., t, None, None].exp() * state + key[..., t, :, None] * value[..., t, None, :]
        outputs.append((query[..., t, None, :] @ state).squeeze(-2))
    return torch.stack(outputs, dim=-2), state


def one_square_product(query, key, value, decay, chunk_size):
    """A review's wrong answer: one T x T masked product with decay ratios."""
    log_gamma = decay.cumsum(dim=-1)  # (B, H, T)
    num_tokens = key.size(-2)
    lower = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    ratio = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~lower, float("-inf"))
    out = ((query @ key.transpose(-2, -1)) * ratio.exp()) @ value
    to_end = (log_gamma[..., -1:] - log_gamma).exp()[..., None]
    return out, (to_end * key).transpose(-2, -1) @ value


def snapshot_loop(query, key, value, decay, chunk_size):
    """A token loop that keeps the state at every chunk boundary: right numbers, no chunks."""
    state = key.new_zeros(*key.shape[:-2], key.size(-1), value.size(-1))
    outputs, states = [], [state]
    for t in range(key.size(-2)):
        state = decay[..., t, None, None].exp() * state + key[..., t, :, None] * value[..., t, None, :]
        outputs.append((query[..., t, None, :] @ state).squeeze(-2))
        if (t + 1) % chunk_size == 0 or t + 1 == key.size(-2):
            states.append(state)
    return torch.stack(outputs, dim=-2), torch.stack(states, dim=-3)


def square_with_states(query, key, value, decay, chunk_size):
    """One T x T product for the outputs, the boundary states from the token sums."""
    out, _ = one_square_product(query, key, value, decay, chunk_size)
    _, states = snapshot_loop(query, key, value, decay, chunk_size)
    return out, states


def test_chunked_decay_right_answer(capsys):
    assert_passes(check_chunked_decay_attention, chunked_decay_attention, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch18-ex3-check",
                               chunked_decay_attention=chunked_decay_attention)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("boundary", "fade by the chunk's whole decay"),
    ("first-step fade", "fade by the chunk's whole decay"),
    ("fade missing the first step", "fade by the chunk's whole decay"),
    ("no Gamma_i on the state read", "how a chunk reads the state before it"),
    ("exclusive cumsum", "Gamma counted from the chunk's start"),
    ("no decay inside", "Gamma counted from the chunk's start"),
    ("reading the new state", "S0 the state before the chunk"),
    ("padded output", "also when the last chunk is shorter"),
])
def test_chunked_decay_typical_mistakes(mistake, phrase, capsys):
    """The review's wrong answers fail the checker and the hidden tests alike."""
    def answer(*args):
        return chunked_decay_attention(*args, mistake=mistake)

    assert_fails(check_chunked_decay_attention, answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex3-check", chunked_decay_attention=answer)


@pytest.mark.parametrize("answer", [token_loop, one_square_product])
def test_chunked_decay_refuses_answers_without_chunks(answer, capsys):
    """Review, Major 1: a plain token loop and one T x T product scored 4 of 4. They return
    no states at the chunk boundaries, so the checker and the hidden tests both refuse them."""
    assert_fails(check_chunked_decay_attention, answer, capsys, "n + 1, d_k, d_v")
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex3-check", chunked_decay_attention=answer)


@pytest.mark.parametrize(("answer", "phrase"), [
    (snapshot_loop, "loops over the chunks, not over the tokens"),
    (square_with_states, "builds no T x T tensor"),
])
def test_chunked_decay_watches_the_structure(answer, capsys, phrase):
    """Right numbers without the chunkwise form: the checker counts the torch calls."""
    assert_fails(check_chunked_decay_attention, answer, capsys, phrase)


def test_chunked_decay_without_the_state_between_chunks(capsys):
    def restart(query, key, value, decay, chunk_size):
        pieces = [chunked_decay_attention(*(x[..., s:s + chunk_size, :] for x in (query, key, value)),
                                          decay[..., s:s + chunk_size], chunk_size)
                  for s in range(0, key.size(-2), chunk_size)]
        states = [pieces[0][1][..., 0, :, :]] + [states[..., -1, :, :] for _, states in pieces]
        return torch.cat([out for out, _ in pieces], dim=-2), torch.stack(states, dim=-3)

    assert_fails(check_chunked_decay_attention, restart, capsys, "the first chunk right")
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex3-check", chunked_decay_attention=restart)


# ----------------------------------------------------------------------------- 18.4


def decayed_weights(query, key, decay, *, mistake=None):
    """The right answer; ``mistake`` switches one typical error on."""
    log_gamma = decay.cumsum(dim=-1)  # (B, H, T)
    num_tokens = key.size(-2)
    lower = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    gap = log_gamma[..., :, None] - log_gamma[..., None, :]  # (B, H, T, T)
    if mistake == "reversed":
        gap = -gap
    elif mistake == "own decay":
        gap = gap + decay[..., None, :]
    elif mistake == "no decay":
        gap = torch.zeros_like(gap)
    scores = query @ key.transpose(-2, -1)
    if mistake == "ratio of products":
        gamma = log_gamma.exp()
        weights = scores * (gamma[..., :, None] / gamma[..., None, :]) * lower
    elif mistake == "no mask":
        weights = scores * gap.exp()
    elif mistake == "inf times 0":
        weights = scores * gap.exp() * lower
    else:
        weights = scores * gap.masked_fill(~lower, float("-inf")).exp()
    if mistake == "normalised":
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def test_decayed_weights_right_answer(capsys):
    assert_passes(check_decayed_weights, decayed_weights, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch18-ex4-check", decayed_weights=decayed_weights)


@pytest.mark.parametrize(("mistake", "phrase"), [
    ("reversed", "the wrong way round"),
    ("own decay", "does not touch its own write"),
    ("no decay", "you left the decay out"),
    ("no mask", "a query never reads a later key"),
    ("normalised", "no normaliser"),
    ("ratio of products", "log space"),  # finite for 7 tokens, 0 / 0 for 160
])
def test_decayed_weights_typical_mistakes(mistake, phrase, capsys):
    def answer(query, key, decay):
        return decayed_weights(query, key, decay, mistake=mistake)

    assert_fails(check_decayed_weights, answer, capsys, phrase)
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex4-check", decayed_weights=answer)


def test_decayed_weights_inf_times_zero(capsys):
    """Masking by multiplying exp(G_i - G_j), which overflows above the diagonal, by 0."""
    def answer(query, key, decay):
        return decayed_weights(query, key, decay, mistake="inf times 0")

    assert_fails(check_decayed_weights, answer, capsys, "no NaN or inf")
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex4-check", decayed_weights=answer)


# ----------------------------------------------------------------------------- 18.5


def test_recall_prediction_is_what_the_package_computes():
    """The kept-back answer is what ab.delta_rule and plain outer products give."""
    e = torch.eye(4, dtype=torch.float64)
    keys = torch.stack([e[0], e[1], e[2], e[3], (e[0] + e[1]) / math.sqrt(2), e[2]])  # (6, 4)
    values = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    _, delta = ab.delta_rule(keys[None, None], keys[None, None], values[None, None],
                             torch.ones(1, 1, 6, dtype=torch.float64))
    linear = keys.T @ values  # (d_k, d_v): the sum of every k v^T
    for state, name in ((delta[0, 0], "delta rule"), (linear, "linear attention")):
        exact = {i + 1 for i in range(6) if torch.allclose(state.T @ keys[i], values[i])}
        assert exact == set(_RIGHT_RECALL[name])


_RIGHT_RECALL = {"delta rule": [4, 5, 6], "linear attention": [4]}


def test_recall_prediction_right_answer(capsys):
    assert_passes(check_recall_prediction, lambda: _RIGHT_RECALL, capsys)
    assert passes_hidden_tests(NOTEBOOK, "ch18-ex5-check", predicted_recall=lambda: _RIGHT_RECALL)


@pytest.mark.parametrize(("wrong", "phrase"), [
    ({"delta rule": [3, 4, 5, 6], "linear attention": [4]}, "replaces what e3 recalls"),
    ({"delta rule": [1, 2, 4, 5, 6], "linear attention": [4]}, "crosstalk"),
    ({"delta rule": [4, 6], "linear attention": [4]}, "leaves S^T k5 as it was"),
    ({"delta rule": [5, 6], "linear attention": [4]}, "orthogonal to every later key"),
    ({"delta rule": [4, 5, 6], "linear attention": [4, 6]}, "only adds"),
    ({"delta rule": [4, 5, 6], "linear attention": [4, 5]}, "pairs 1 and 2 answer as well"),
    ({"delta rule": [4, 5, 6], "linear attention": [1, 2, 4]}, "adds v5 / sqrt(2)"),
    ({"delta rule": [4, 5, 6], "linear attention": []}, "nothing else is added"),
])
def test_recall_prediction_typical_mistakes(wrong, phrase, capsys):
    out = assert_fails(check_recall_prediction, lambda: wrong, capsys, phrase)
    assert "kept back" in out  # a prediction keeps its answer back
    assert not passes_hidden_tests(NOTEBOOK, "ch18-ex5-check", predicted_recall=lambda: wrong)


@pytest.mark.parametrize(("wrong", "phrase"), [
    ([4, 5, 6], "keys 'delta rule' and 'linear attention'"),
    ({"delta rule": "456", "linear attention": [4]}, "pair numbers from 1 to 6"),
    ({"delta rule": [4, 5, 7], "linear attention": [4]}, "pair numbers from 1 to 6"),
    ({"delta rule": None, "linear attention": [4]}, "is a list of pair numbers"),
])
def test_recall_prediction_refuses_other_shapes(wrong, phrase, capsys):
    assert_fails(check_recall_prediction, lambda: wrong, capsys, phrase)
