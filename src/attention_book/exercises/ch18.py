"""Checkers for chapter 18 (attention as a recurrence: the delta rule, hybrids, chunks)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from .feedback import (
    call,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    number_from_config,
    passed,
)

__all__ = [
    "check_gated_delta_step",
    "check_hybrid_memory_bytes",
    "check_chunked_decay_attention",
    "check_decayed_weights",
    "check_recall_prediction",
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
                                               "value per key/value head and token, each of "
                                               "head_dim numbers (the config's head_dim, 256 "
                                               "here, when it gives one)",
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
     1000, 6 * 4 * 8 * 6 * 4, {
         _SMALL_KV * 1000 + _SMALL_STATES: "when the config has layer_types, read the kind of "
                                           "each layer from it: here every layer is "
                                           "linear_attention, whatever full_attention_interval "
                                           "says",
     }),
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


def _decay_attention_loop(query, key, value, decay, chunk_size):
    """The reference: S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, token by token.

    Returns the outputs and the states at the chunk boundaries: the zeros before the first
    chunk, the state after each chunk (the last one, maybe shorter, after the last token).
    """
    state = key.new_zeros(*key.shape[:-2], key.size(-1), value.size(-1))  # (..., d_k, d_v)
    outputs, states = [], [state]
    num_tokens = key.size(-2)
    for t in range(num_tokens):
        state = state * decay[..., t, None, None].exp() + key[..., t, :, None] * value[..., t, None, :]
        outputs.append((query[..., t, None, :] @ state).squeeze(-2))  # (..., d_v)
        if (t + 1) % chunk_size == 0 or t + 1 == num_tokens:
            states.append(state)
    return torch.stack(outputs, dim=-2), torch.stack(states, dim=-3)  # (..., T, d_v), (..., n+1, d_k, d_v)


def _decay_inputs(seed: int, num_tokens: int, d_k: int = 4, d_v: int = 3,
                  dtype: torch.dtype = torch.float64):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 2, num_tokens, d_k, generator=generator, dtype=dtype)
    key = torch.randn(2, 2, num_tokens, d_k, generator=generator, dtype=dtype) / 2
    value = torch.randn(2, 2, num_tokens, d_v, generator=generator, dtype=dtype)
    decay = -torch.rand(2, 2, num_tokens, generator=generator, dtype=dtype) / 2
    return query, key, value, decay


class _Watch(TorchFunctionMode):
    """Count the torch calls an answer makes and note the first tensor with two dims of size T."""

    def __init__(self, num_tokens: int):
        super().__init__()
        self.num_tokens, self.calls, self.square = num_tokens, 0, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.calls += 1
        for out in result if isinstance(result, (tuple, list)) else (result,):
            if (self.square is None and isinstance(out, torch.Tensor)
                    and list(out.shape).count(self.num_tokens) >= 2):
                self.square = tuple(out.shape)
        return result


def _watched(fn, num_tokens: int, chunk_size: int) -> _Watch:
    """Run ``fn`` on a sequence of ``num_tokens`` in chunks of ``chunk_size``, watching it.

    In a notebook the watch sees every torch call of the answer. (While the book grades in a
    clean process the answer runs elsewhere and the watch sees nothing: there the states at
    the chunk boundaries, which only a chunked answer returns, carry the check.)
    """
    inputs = _decay_inputs(7, num_tokens, d_k=3, d_v=5)
    watch = _Watch(num_tokens)
    with watch:
        call(fn, *inputs, chunk_size)
    return watch


@checker
def check_chunked_decay_attention(fn) -> None:
    """Check ``fn(query, key, value, decay, chunk_size)``: decayed linear attention in chunks.

    The answer returns ``(out, states)``, the outputs and the state at every chunk boundary,
    and must keep the chunkwise form: in a notebook the checker counts its torch calls (a
    loop over the tokens makes more of them for more tokens in as many chunks) and watches
    for a ``T x T`` tensor.

    Taught in chapter 18 (Exercise 18.3).
    """
    cases = [(7, 7, "one chunk"), (12, 4, "three whole chunks"), (11, 4, "a last chunk of 3"),
             (9, 1, "chunks of one token")]
    for seed, (num_tokens, chunk_size, what) in enumerate(cases):
        inputs = _decay_inputs(seed, num_tokens)
        result = call(fn, *inputs, chunk_size)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            fail("chunked_decay_attention returns (out, states)", expected="a pair of tensors",
                 actual=type(result).__name__,
                 hint="return the outputs and the states at the chunk boundaries", reveal=True)
        out, states = result
        loop_out, loop_states = _decay_attention_loop(*inputs, chunk_size)
        num_chunks = loop_states.size(-3) - 1
        expect_shape(f"out ({what})", out, loop_out.shape,
                     hint="one output per token: (B, H, T, d_v), also when the last chunk is "
                          "shorter than chunk_size")
        chunks = f"{num_chunks} chunk{'' if num_chunks == 1 else 's'}"
        expect_shape(f"states ({what}, T = {num_tokens}, chunk_size = {chunk_size}: {chunks})",
                     states, loop_states.shape,
                     hint="(B, H, n + 1, d_k, d_v) for n chunks: the state before each chunk "
                          "(zeros before the first), then the state after the last token. It "
                          "is all that passes from one chunk to the next: keep each one the "
                          "chunk loop starts from, and stack them on dim -3")
        if num_tokens > chunk_size and not torch.allclose(out, loop_out, atol=1e-8) \
                and torch.allclose(out[..., :chunk_size, :], loop_out[..., :chunk_size, :]):
            if torch.allclose(states.to(loop_states.dtype), loop_states, atol=1e-8, rtol=1e-6):
                hint = ("the states at the boundaries are right, so the error is in how a chunk "
                        "reads the state before it: that state has faded by Gamma_i = exp(g "
                        "summed from the chunk's start to token i) when token i reads it, "
                        "Gamma_i S0^T q_i")
            else:
                hint = ("what crosses a chunk boundary is the state, and it must fade by the "
                        "chunk's whole decay, Gamma_C = exp(sum of g over the chunk), before "
                        "the chunk's own writes are added")
            fail(f"the outputs after the first chunk match the token loop ({what}, T = "
                 f"{num_tokens}, chunk_size = {chunk_size})",
                 expected="the loop's outputs", actual="the first chunk right, later ones wrong",
                 hint=hint)
        expect_close(f"out ({what}, T = {num_tokens}, chunk_size = {chunk_size})", out, loop_out,
                     atol=1e-8, rtol=1e-6,
                     hint="inside a chunk: o_i = Gamma_i S0^T q_i + sum_{j<=i} (Gamma_i / "
                          "Gamma_j)(q_i . k_j) v_j, with Gamma counted from the chunk's start "
                          "and S0 the state before the chunk")
        expect_close(f"states[..., 0, :, :], the state before the first chunk ({what})",
                     states[..., 0, :, :], loop_states[..., 0, :, :], atol=1e-8, rtol=1e-6,
                     hint="before the first chunk nothing has been written: zeros")
        expect_close(f"the states at the chunk boundaries ({what}, T = {num_tokens}, "
                     f"chunk_size = {chunk_size})", states, loop_states, atol=1e-8, rtol=1e-6,
                     hint="the state after a chunk is Gamma_C S0 + sum_j (Gamma_C / Gamma_j) "
                          "k_j v_j^T: fade the old state by the whole chunk's decay")
    square = _watched(fn, 40, 8).square
    expect_true("your function builds no T x T tensor (T = 40 tokens in chunks of 8)",
                square is None, expected="tensors of at most C x C = 8 x 8 per chunk",
                actual=f"a tensor of shape {square}",
                hint="one masked T x T product is the parallel form of section 18.1, not the "
                     "chunkwise one: inside a chunk, build the C x C matrix of that chunk's "
                     "own tokens, and reach everything before it through the state")
    short, long = _watched(fn, 16, 8).calls, _watched(fn, 64, 32).calls
    expect_true("your function loops over the chunks, not over the tokens",
                long <= short + 20,
                expected="about as many torch calls for 64 tokens in 2 chunks as for 16 "
                         "tokens in 2 chunks",
                actual=f"{short} calls for 16 tokens and {long} for 64",
                hint="a Python loop over the tokens does T sequential steps, which is what "
                     "the chunkwise form avoids: inside a chunk, compute every output and the "
                     "chunk's write to the state with C x C and C x d matrix products")
    passed("the state that crosses each chunk boundary fades by the chunk's decay, every "
           "chunk, the short last one included, gives the token loop's numbers, and the work "
           "inside a chunk is matrix products.")


# --------------------------------------------------------------------------- exercise 18.4


def _decayed_weights(query, key, decay):
    """W_ij = exp(G_i - G_j) q_i . k_j for j <= i, 0 above; G = cumsum(g): o = W V."""
    log_gamma = decay.cumsum(dim=-1)  # (..., T)
    num_tokens = key.size(-2)
    lower = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()  # (T, T)
    gap = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~lower, float("-inf"))
    return (query @ key.transpose(-2, -1)) * gap.exp()  # (..., T, T)


@checker
def check_decayed_weights(fn) -> None:
    """Check ``fn(query, key, decay)``: the ``T x T`` matrix ``W`` with ``o = W V``.

    Taught in chapter 18 (Exercise 18.4).
    """
    query, key, value, decay = _decay_inputs(0, 7)
    weights = call(fn, query, key, decay)
    expected = _decayed_weights(query, key, decay)
    expect_shape("W for T = 7", weights, expected.shape,
                 hint="one weight per query and key: (B, H, T, T), like chapter 5's attention "
                      "weights")
    weights = weights.to(torch.float64)
    above = torch.ones(7, 7, dtype=torch.bool).triu(1)
    if torch.isnan(weights).any():
        fail("W has no NaN (T = 7)", expected="finite numbers",
             actual="NaN", hint="exp(G_i - G_j) grows without bound for a future key j > i; "
                                "set the future entries to -inf before the exp (or zero them "
                                "with torch.where), not by multiplying an inf by 0")
    expect_true("W is 0 above the diagonal: a query never reads a later key",
                bool((weights[..., above] == 0).all()), expected="0 for every key j > i",
                actual="a non-zero weight on a future key",
                hint="unroll the recurrence: S_i holds only the pairs written at j <= i")
    right = torch.allclose(weights, expected, atol=1e-8, rtol=1e-6)
    if not right:
        log_gamma = decay.cumsum(dim=-1)
        scores = query @ key.transpose(-2, -1)  # (B, H, T, T)
        lower = ~above
        hints = [
            (scores * lower, "you left the decay out: a pair written at token j has faded by "
                             "every g after it, exp(g_{j+1} + ... + g_i), when token i reads"),
            ((scores * (log_gamma[..., None, :] - log_gamma[..., :, None]).exp()) * lower,
             "the ratio is the wrong way round: Gamma_i / Gamma_j = exp(G_i - G_j) is <= 1 "
             "for j <= i, since the older the pair the more it has faded"),
            ((scores * (log_gamma[..., :, None] - log_gamma[..., None, :] + decay[..., None, :])
              .exp()) * lower,
             "the decay of token j itself does not touch its own write: S_j = exp(g_j) S_{j-1} "
             "+ k_j v_j^T fades before writing, so W_ii = q_i . k_i"),
            ((scores * (log_gamma[..., :, None] - log_gamma[..., None, :] - decay[..., :, None])
              .exp()) * lower,
             "token i's own decay g_i fades every earlier pair before it reads: the factor is "
             "exp(g_{j+1} + ... + g_i), including g_i"),
        ]
        for wrong, hint in hints:
            if torch.allclose(weights, wrong, atol=1e-8, rtol=1e-6):
                fail("W matches the unrolled recurrence (T = 7)", expected="another matrix",
                     actual="a known mix-up", hint=hint)
        if torch.allclose(weights / weights.sum(-1, keepdim=True), expected
                          / expected.sum(-1, keepdim=True), atol=1e-8, rtol=1e-6):
            hint = ("this recurrence has no normaliser: o_t = S_t^T q_t, so W is not divided "
                    "by its row sums")
        else:
            hint = ("unroll S_i = exp(g_i) S_{i-1} + k_i v_i^T: S_i = sum_{j<=i} exp(g_{j+1} + "
                    "... + g_i) k_j v_j^T, so W_ij = exp(G_i - G_j) q_i . k_j with G the "
                    "cumulative sum of g")
        expect_close("W (T = 7)", weights, expected, atol=1e-8, rtol=1e-6, hint=hint)
    state, outputs = torch.zeros(2, 2, 4, 3, dtype=torch.float64), []
    for t in range(7):
        state = state * decay[..., t, None, None].exp() + key[..., t, :, None] * value[..., t, None, :]
        outputs.append((query[..., t, None, :] @ state).squeeze(-2))
    expect_close("W @ V, against the recurrence run token by token", weights @ value,
                 torch.stack(outputs, dim=-2), atol=1e-8, rtol=1e-6,
                 hint="W @ V must give the loop's outputs o_t = S_t^T q_t")
    query, key, _, _ = _decay_inputs(1, 160, dtype=torch.float32)
    decay = -1.0 - torch.rand(2, 2, 160, generator=torch.Generator().manual_seed(2))  # (B, H, T)
    long = call(fn, query, key, decay)
    expect_shape("W for T = 160", long, (2, 2, 160, 160),
                 hint="(B, H, T, T) for any T")
    expect_true("W has no NaN or inf for 160 tokens whose g are between -2 and -1 (float32)",
                bool(torch.isfinite(long).all()), expected="finite numbers",
                actual=f"{int((~torch.isfinite(long)).sum())} NaN or inf entries",
                hint="Gamma_j = exp(G_j) underflows to 0 in float32 once G_j < -104, and a "
                     "ratio Gamma_i / Gamma_j becomes 0 / 0: take the ratio in log space, "
                     "exp(G_i - G_j)")
    expect_close("W for T = 160 (float32)", long.to(torch.float64),
                 _decayed_weights(query.double(), key.double(), decay.double()), atol=1e-4,
                 rtol=1e-3, hint="compute exp(G_i - G_j) from the differences of the "
                                 "cumulative sums, never from exp(G_i) / exp(G_j)")
    passed("W_ij = exp(G_i - G_j) q_i . k_j below the diagonal, 0 above: W V equals the "
           "recurrence, and in log space it stays finite however long the sequence.")


# --------------------------------------------------------------------------- exercise 18.5

#: The pairs (numbered 1 to 6) whose own value each state still recalls exactly.
_RECALL_ANSWER = {"delta rule": {4, 5, 6}, "linear attention": {4}}


def _pair_numbers(value: object, name: str) -> set[int]:
    try:
        numbers = [int(item) for item in value]
    except (TypeError, ValueError):
        fail(f"predicted_recall()[{name!r}] is a list of pair numbers", expected="e.g. [1, 3]",
             actual=repr(value)[:80], hint="list the numbers (1 to 6) of the pairs whose own "
                                           "value the final state recalls exactly", reveal=True)
    if any(number != item for number, item in zip(numbers, value, strict=True)) or not all(
            1 <= number <= 6 for number in numbers):
        fail(f"predicted_recall()[{name!r}] holds pair numbers from 1 to 6",
             expected="whole numbers from 1 to 6", actual=repr(value)[:80],
             hint="the pairs are numbered 1 to 6 in the order they are written", reveal=True)
    return set(numbers)


@checker(reveal=False)  # a prediction: the expected pairs are kept back
def check_recall_prediction(fn) -> None:
    """Check ``fn()``: which of six pairs a delta-rule and a linear-attention state recall.

    Taught in chapter 18 (Exercise 18.5).
    """
    result = call(fn)
    if not (isinstance(result, dict) and set(result) == set(_RECALL_ANSWER)):
        fail("predicted_recall returns a dict with the keys 'delta rule' and 'linear attention'",
             expected="{'delta rule': [...], 'linear attention': [...]}",
             actual=repr(result)[:80], hint="one list of pair numbers for each state",
             reveal=True)
    delta = _pair_numbers(result["delta rule"], "delta rule")
    if delta != _RECALL_ANSWER["delta rule"]:
        if 3 in delta:
            hint = ("pair 6 writes pair 3's key e3 again, with another value: with beta = 1 "
                    "the delta rule replaces what e3 recalls, so pair 3's value is gone")
        elif delta & {1, 2}:
            hint = ("k5 = (e1 + e2) / sqrt(2) overlaps e1 and e2: the error written along k5 "
                    "changes what e1 and e2 recall (crosstalk)")
        elif 5 not in delta:
            hint = ("after its own write (beta = 1, a unit key) k5 recalls v5 exactly; pair "
                    "6's key e3 is orthogonal to k5, so its write leaves S^T k5 as it was")
        else:
            hint = ("a key orthogonal to every later key keeps its value, and the newest "
                    "write with beta = 1 and a unit key is always recalled exactly")
        fail("the pairs the delta-rule state recalls exactly", expected="other pairs",
             actual=sorted(delta), hint=hint)
    linear = _pair_numbers(result["linear attention"], "linear attention")
    if linear != _RECALL_ANSWER["linear attention"]:
        if linear & {3, 6}:
            hint = "linear attention only adds: S^T e3 = v3 + v6, neither value alone"
        elif 5 in linear:
            hint = "S^T k5 = v5 + (v1 + v2) / sqrt(2): pairs 1 and 2 answer as well"
        elif linear & {1, 2}:
            hint = "writing pair 5 adds v5 / sqrt(2) to what e1 and e2 recall"
        else:
            hint = ("a key orthogonal to every other key written recalls its own value: "
                    "nothing else is added to it")
        fail("the pairs the linear-attention state recalls exactly", expected="other pairs",
             actual=sorted(linear), hint=hint)
    passed("the delta rule still recalls pairs 4, 5 and 6 (the untouched e4, the newest k5 "
           "and e3's new value), linear attention only pair 4: six pairs in d_k = 4 "
           "directions cannot all stay, and writing errors keeps the newest exact.")
