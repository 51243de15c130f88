"""Checkers for chapter 18 (attention as a recurrence: the delta rule, hybrids, chunks)."""

from __future__ import annotations

import torch

from .feedback import call, checker, expect_close, expect_shape, fail, number_from_config, passed

__all__ = [
    "check_gated_delta_step",
    "check_hybrid_memory_bytes",
    "check_chunked_decay_attention",
]


# --------------------------------------------------------------------------- exercise 18.1


def _step_inputs(seed: int, batch: int = 2, heads: int = 3, d_k: int = 4, d_v: int = 5):
    generator = torch.Generator().manual_seed(seed)
    state = torch.randn(batch, heads, d_k, d_v, generator=generator)  # (B, H, d_k, d_v)
    key = torch.nn.functional.normalize(torch.randn(batch, heads, d_k, generator=generator), dim=-1)
    value = torch.randn(batch, heads, d_v, generator=generator)  # (B, H, d_v)
    beta = torch.rand(batch, heads, generator=generator) * 0.8 + 0.1  # (B, H)
    decay = -torch.rand(batch, heads, generator=generator) - 0.1  # (B, H): log space, < 0
    return state, key, value, beta, decay


def _gated_delta_step(state, key, value, beta, decay, *, decay_first=True, write_error=True,
                      use_beta=True, exponentiate=True):
    """The right step, and (through the keywords) the typical wrong ones."""
    factor = (decay.exp() if exponentiate else decay)[..., None, None]  # (B, H, 1, 1)
    if decay_first:
        state = state * factor
    recalled = (key.unsqueeze(-2) @ state).squeeze(-2)  # (B, H, d_v): S^T k
    written = value - recalled if write_error else value
    if use_beta:
        written = beta[..., None] * written
    state = state + key[..., :, None] * written[..., None, :]  # (B, H, d_k, d_v)
    if not decay_first:
        state = state * factor
    return state


@checker
def check_gated_delta_step(fn) -> None:
    """Check ``fn(state, key, value, beta, decay)``: one step of the gated delta rule.

    Taught in chapter 18 (Exercise 18.1).
    """
    state, key, value, beta, decay = _step_inputs(0)
    result = call(fn, state.clone(), key, value, beta, decay)
    expect_shape("the new state", result, state.shape,
                 hint="return the whole new state, (B, H, d_k, d_v), like the one passed in")
    expected = _gated_delta_step(state, key, value, beta, decay)
    if torch.allclose(result, expected, atol=1e-5, rtol=1e-4):
        second = _step_inputs(1, batch=1, heads=2, d_k=6, d_v=3)
        result = call(fn, second[0].clone(), *second[1:])
        expect_close("the new state for d_k = 6, d_v = 3", result, _gated_delta_step(*second),
                     hint="the recall is S^T k, a vector of d_v numbers: sum over the key "
                          "dimension (the rows of S)")
        passed("fade the state by exp(g), recall S^T k, write beta k (v - S^T k)^T: one step "
               "of the gated delta rule.")
        return
    wrong = {
        "decay_first": "fade the state by exp(g) before the recall and the write, as Gated "
                       "DeltaNet does: the new pair must not be faded in the step that writes it",
        "write_error": "that is linear attention's write (k v^T): the delta rule writes the "
                       "error v - S^T k, the part of v the state does not recall yet",
        "use_beta": "scale the written error by the write strength beta",
        "exponentiate": "decay is a log (g <= 0): multiply the state by exp(g), not by g",
    }
    for keyword, hint in wrong.items():
        if torch.allclose(result, _gated_delta_step(state, key, value, beta, decay,
                                                    **{keyword: False}), atol=1e-5, rtol=1e-4):
            fail("the new state matches one step of the gated delta rule",
                 expected="exp(g) S + beta k (v - (exp(g) S)^T k)^T", actual="a different state",
                 hint=hint)
    expect_close("the new state", result, expected,
                 hint="three moves, in order: S = exp(g) S; error = v - S^T k; "
                      "S = S + beta k error^T (an outer product per head)")


# --------------------------------------------------------------------------- exercise 18.2
# Qwen3-Next-80B-A3B's configuration (Qwen Team, 2025) in the keys of its Hugging Face
# config.json: 48 layers, every fourth one full attention. The expected bytes are written out.

_QWEN3_NEXT = {
    "num_hidden_layers": 48, "full_attention_interval": 4, "hidden_size": 2048,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "torch_dtype": "bfloat16",
}
_QWEN3_NEXT_TYPED = {**_QWEN3_NEXT, "layer_types": (["linear_attention"] * 3
                                                    + ["full_attention"]) * 12}
_QWEN_KV = 12 * 2 * 2 * 256 * 2  # bytes per token: 12 layers, a key and a value, 2 heads of 256
_QWEN_STATES = 36 * 32 * 128 * 128 * 2  # 36 layers, 32 value heads, 128 x 128 states
_SMALL = {  # no head_dim, float32, six layers with the interval 4: only layer 3 is full attention
    "num_hidden_layers": 6, "full_attention_interval": 4, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 1, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6,
    "torch_dtype": "float32",
}
_SMALL_KV = 1 * 2 * 1 * 16 * 4
_SMALL_STATES = 5 * 4 * 8 * 6 * 4

# (name, config, context_length, expected bytes, {wrong answer: hint})
_HYBRID_CASES = [
    ("Qwen3-Next-80B-A3B at 32,768 tokens", _QWEN3_NEXT_TYPED, 32768,
     _QWEN_KV * 32768 + _QWEN_STATES, {
         _QWEN_KV * 32768 + _QWEN_STATES // 2: "a recurrent layer keeps one state per *value* "
                                               "head (linear_num_value_heads = 32), not per key "
                                               "head",
         _QWEN_KV * 32768 + _QWEN_STATES * 32768: "the states do not grow with the context: "
                                                  "count them once",
         _QWEN_KV * 32768: "add the recurrent layers' states (one d_k x d_v matrix per value "
                           "head and layer)",
         _QWEN_KV * 32768 // 2 + _QWEN_STATES: "a full-attention layer caches a key *and* a "
                                               "value per key/value head and token",
         _QWEN_KV * 8 * 32768 + _QWEN_STATES: "the cache holds num_key_value_heads (2) heads, "
                                              "not one per query head",
         _QWEN_KV * 4 * 32768 + _QWEN_STATES * 4 // 3: "only the full_attention layers keep a "
                                                       "KV cache; the others keep a state",
     }),
    ("Qwen3-Next-80B-A3B at 262,144 tokens", _QWEN3_NEXT_TYPED, 262144,
     _QWEN_KV * 262144 + _QWEN_STATES, {}),
    ("Qwen3-Next-80B-A3B without layer_types (full_attention_interval = 4)", _QWEN3_NEXT, 4096,
     _QWEN_KV * 4096 + _QWEN_STATES, {}),
    ("a small float32 config without head_dim (6 layers, interval 4)", _SMALL, 100,
     _SMALL_KV * 100 + _SMALL_STATES, {
         2 * _SMALL_KV * 100 + 4 * 4 * 8 * 6 * 4: "with full_attention_interval = 4 the full "
                                                  "layers are the 4th, 8th, ... (indices 3, 7, "
                                                  "...): here only layer 3",
         (_SMALL_KV * 100 + _SMALL_STATES) // 2: "float32 numbers take 4 bytes",
     }),
    ("a config with only recurrent layers", {**_SMALL, "layer_types": ["linear_attention"] * 6},
     1000, 6 * 4 * 8 * 6 * 4, {}),
]

_HYBRID_KEY_HINTS = {
    "layer_types": "configs without layer_types give full_attention_interval instead: layer i "
                   "(from 0) is full attention when (i + 1) % interval == 0",
    "head_dim": "when the config has no head_dim, it is hidden_size // num_attention_heads",
    "full_attention_interval": "when the config has layer_types, read the kind of each layer "
                               "from it",
}


@checker
def check_hybrid_memory_bytes(fn) -> None:
    """Check ``fn(config, context_length)``: a hybrid model's KV cache and states, in bytes.

    Taught in chapter 18 (Exercise 18.2).
    """
    call(fn, dict(_QWEN3_NEXT_TYPED), 32768)  # a blank answer says so before anything else
    for name, config, context_length, expected, wrong in _HYBRID_CASES:
        value = number_from_config(fn, config, context_length, name="hybrid_memory_bytes",
                                   config_name=f"the config of {name}",
                                   key_hints=_HYBRID_KEY_HINTS,
                                   returns="return the bytes as a number")
        if abs(value - expected) <= 1e-9 * expected:
            continue
        for wrong_value, hint in wrong.items():
            if abs(value - wrong_value) <= 1e-9 * wrong_value:
                fail(f"the memory of {name}", expected="a different number",
                     actual=f"{value:,.0f} bytes", hint=hint)
        fail(f"the memory of {name}", expected="a different number", actual=f"{value:,.0f} bytes",
             hint="full-attention layers: 2 x num_key_value_heads x head_dim numbers per token "
                  "and layer, times the tokens; recurrent layers: linear_num_value_heads x "
                  "linear_key_head_dim x linear_value_head_dim numbers per layer, once; all "
                  "times the bytes of one number")
    passed("KV caches that grow with the context and states that do not, for Qwen3-Next and "
           "for configs with and without layer_types and head_dim.")


# --------------------------------------------------------------------------- exercise 18.3


def _decay_attention_loop(query, key, value, decay):
    """The reference: S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t."""
    state = key.new_zeros(*key.shape[:-2], key.size(-1), value.size(-1))  # (..., d_k, d_v)
    outputs = []
    for t in range(key.size(-2)):
        state = state * decay[..., t, None, None].exp() + key[..., t, :, None] * value[..., t, None, :]
        outputs.append((query[..., t, None, :] @ state).squeeze(-2))  # (..., d_v)
    return torch.stack(outputs, dim=-2), state  # (..., T, d_v), (..., d_k, d_v)


def _decay_inputs(seed: int, num_tokens: int):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 2, num_tokens, 4, generator=generator, dtype=torch.float64)
    key = torch.randn(2, 2, num_tokens, 4, generator=generator, dtype=torch.float64) / 2
    value = torch.randn(2, 2, num_tokens, 3, generator=generator, dtype=torch.float64)
    decay = -torch.rand(2, 2, num_tokens, generator=generator, dtype=torch.float64) / 2
    return query, key, value, decay


@checker
def check_chunked_decay_attention(fn) -> None:
    """Check ``fn(query, key, value, decay, chunk_size)``: decayed linear attention in chunks.

    Taught in chapter 18 (Exercise 18.3).
    """
    cases = [(7, 7, "one chunk"), (12, 4, "three whole chunks"), (11, 4, "a last chunk of 3"),
             (9, 1, "chunks of one token")]
    for seed, (num_tokens, chunk_size, what) in enumerate(cases):
        inputs = _decay_inputs(seed, num_tokens)
        result = call(fn, *inputs, chunk_size)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            fail("chunked_decay_attention returns (out, state)", expected="a pair of tensors",
                 actual=type(result).__name__, hint="return the outputs and the final state")
        out, state = result
        loop_out, loop_state = _decay_attention_loop(*inputs)
        expect_shape(f"out ({what})", out, loop_out.shape,
                     hint="one output per token: (B, H, T, d_v), also when the last chunk is "
                          "shorter than chunk_size")
        if num_tokens > chunk_size and not torch.allclose(out, loop_out, atol=1e-8) \
                and torch.allclose(out[..., :chunk_size, :], loop_out[..., :chunk_size, :]):
            fail(f"the outputs after the first chunk match the token loop ({what}, T = "
                 f"{num_tokens}, chunk_size = {chunk_size})",
                 expected="the loop's outputs", actual="the first chunk right, later ones wrong",
                 hint="what crosses a chunk boundary is the state, and it must fade by the "
                      "chunk's whole decay, Gamma_C = exp(sum of g over the chunk), before the "
                      "chunk's own writes are added")
        expect_close(f"out ({what}, T = {num_tokens}, chunk_size = {chunk_size})", out, loop_out,
                     atol=1e-8, rtol=1e-6,
                     hint="inside a chunk: o_i = Gamma_i S0^T q_i + sum_{j<=i} (Gamma_i / "
                          "Gamma_j)(q_i . k_j) v_j, with Gamma counted from the chunk's start")
        expect_close(f"the final state ({what}, T = {num_tokens}, chunk_size = {chunk_size})",
                     state, loop_state, atol=1e-8, rtol=1e-6,
                     hint="the state after a chunk is Gamma_C S0 + sum_j (Gamma_C / Gamma_j) "
                          "k_j v_j^T: fade the old state by the whole chunk's decay")
    passed("the state that crosses each chunk boundary fades by the chunk's decay, and every "
           "chunk, the short last one included, gives the token loop's numbers.")
