"""Chapter 18: linear attention, the (gated) delta rule in its two forms, the recurrent layers.

The slow, obviously right forms (the token loops) are the references: the parallel and the
chunkwise forms must equal them, and the gated delta rule must equal Hugging Face's two torch
implementations in the Qwen3-Next model code, which nobody here wrote.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attention_book as ab
from attention_book.linear_attention import (
    GatedDeltaNet,
    LinearAttentionLayer,
    RecurrentState,
    delta_rule,
    linear_attention,
    linear_attention_recurrent,
    recurrent_state_bytes,
)


def _inputs(batch=2, heads=3, num_tokens=11, d_k=4, d_v=5, *, seed=0, dtype=torch.float64,
            gated=True):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, num_tokens, d_k, generator=generator, dtype=dtype)
    key = F.normalize(torch.randn(batch, heads, num_tokens, d_k, generator=generator,
                                  dtype=dtype), dim=-1)
    value = torch.randn(batch, heads, num_tokens, d_v, generator=generator, dtype=dtype)
    beta = torch.rand(batch, heads, num_tokens, generator=generator, dtype=dtype)
    decay = -torch.rand(batch, heads, num_tokens, generator=generator, dtype=dtype) if gated else None
    return query, key, value, beta, decay


# --------------------------------------------------------------------------- linear attention


@settings(max_examples=20, deadline=None)
@given(num_tokens=st.integers(1, 9), d_k=st.integers(1, 4), d_v=st.integers(1, 4),
       seed=st.integers(0, 100))
def test_linear_attention_parallel_equals_recurrent(num_tokens, d_k, d_v, seed):
    query, key, value, _, _ = _inputs(2, 2, num_tokens, d_k, d_v, seed=seed)
    parallel = linear_attention(query, key, value)
    recurrent, (memory, normalizer) = linear_attention_recurrent(query, key, value)
    torch.testing.assert_close(recurrent, parallel, rtol=0, atol=1e-12)
    phi_k = F.elu(key) + 1
    torch.testing.assert_close(memory, phi_k.transpose(-2, -1) @ value)
    torch.testing.assert_close(normalizer, phi_k.sum(dim=-2))


def test_linear_attention_by_its_definition_and_without_the_mask():
    query, key, value, _, _ = _inputs(1, 2, 6, 3, 2)
    phi_q, phi_k = F.elu(query) + 1, F.elu(key) + 1
    for causal in (True, False):
        expected = torch.zeros_like(value)
        for i in range(6):
            keys = range(i + 1) if causal else range(6)
            numerator = sum((phi_q[..., i, :] * phi_k[..., j, :]).sum(-1, keepdim=True)
                            * value[..., j, :] for j in keys)
            denominator = sum((phi_q[..., i, :] * phi_k[..., j, :]).sum(-1, keepdim=True)
                              for j in keys)
            expected[..., i, :] = numerator / (denominator + 1e-6)
        torch.testing.assert_close(linear_attention(query, key, value, causal=causal), expected)


def test_linear_attention_takes_any_feature_map_and_continues_a_state():
    query, key, value, _, _ = _inputs(2, 1, 9, 3, 4)
    torch.testing.assert_close(
        linear_attention(query, key, value, feature_map=torch.exp),
        linear_attention_recurrent(query, key, value, feature_map=torch.exp)[0])
    whole, state = linear_attention_recurrent(query, key, value)
    first, middle = linear_attention_recurrent(query[..., :4, :], key[..., :4, :], value[..., :4, :])
    second, end = linear_attention_recurrent(query[..., 4:, :], key[..., 4:, :], value[..., 4:, :],
                                             initial_state=middle)
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(end[0], state[0])
    torch.testing.assert_close(end[1], state[1])


def test_linear_attention_gradients():
    query, key, value, _, _ = _inputs(1, 1, 5, 2, 2)
    for tensor in (query, key, value):
        tensor.requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k, v: linear_attention(q, k, v), (query, key, value))


# --------------------------------------------------------------------------- the delta rule


def _by_hand(query, key, value, beta, decay, state, scale):
    """The recurrence written the plainest way: one head, one token, one line each."""
    state = state.clone()
    out = torch.zeros_like(value)
    for b in range(key.size(0)):
        for h in range(key.size(1)):
            s = state[b, h]
            for t in range(key.size(2)):
                if decay is not None:
                    s = torch.exp(decay[b, h, t]) * s
                k, v = key[b, h, t], value[b, h, t]
                s = s + beta[b, h, t] * torch.outer(k, v - s.T @ k)
                out[b, h, t] = scale * s.T @ query[b, h, t]
            state[b, h] = s
    return out, state


@pytest.mark.parametrize("gated", [False, True])
def test_token_loop_is_the_recurrence_written_by_hand(gated):
    query, key, value, beta, decay = _inputs(gated=gated)
    state = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    out, end = delta_rule(query, key, value, beta, decay=decay, scale=0.7, initial_state=state)
    expected_out, expected_end = _by_hand(query, key, value, beta, decay, state, 0.7)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(end, expected_end)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 7, 16, 23])
@pytest.mark.parametrize("chunk_size", [1, 3, 8, 16, 64])
def test_chunkwise_equals_the_token_loop(gated, num_tokens, chunk_size):
    query, key, value, beta, decay = _inputs(num_tokens=num_tokens, gated=gated, seed=num_tokens)
    state = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    loop_out, loop_state = delta_rule(query, key, value, beta, decay=decay, initial_state=state)
    chunk_out, chunk_state = delta_rule(query, key, value, beta, decay=decay, initial_state=state,
                                        chunk_size=chunk_size)
    torch.testing.assert_close(chunk_out, loop_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(chunk_state, loop_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_a_sequence_in_two_parts_equals_one_run(chunk_size):
    query, key, value, beta, decay = _inputs(num_tokens=13)
    whole, end = delta_rule(query, key, value, beta, decay=decay, chunk_size=chunk_size)
    first, middle = delta_rule(query[..., :6, :], key[..., :6, :], value[..., :6, :],
                               beta[..., :6], decay=decay[..., :6], chunk_size=chunk_size)
    second, last = delta_rule(query[..., 6:, :], key[..., 6:, :], value[..., 6:, :],
                              beta[..., 6:], decay=decay[..., 6:], chunk_size=chunk_size,
                              initial_state=middle)
    torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
    torch.testing.assert_close(last, end)


def test_empty_sequence_returns_the_initial_state():
    query, key, value, beta, decay = _inputs(num_tokens=0)
    state = torch.ones(2, 3, 4, 5, dtype=torch.float64)
    for chunk_size in (None, 4):
        out, end = delta_rule(query, key, value, beta, decay=decay, chunk_size=chunk_size,
                              initial_state=state)
        assert out.shape == (2, 3, 0, 5) and torch.equal(end, state)


def test_the_write_is_a_gradient_step_on_the_recall_error():
    _, key, value, _, _ = _inputs(1, 1, 1, 4, 3)
    state = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    k, v = key[0, 0, 0], value[0, 0, 0]
    loss = 0.5 * ((state.T @ k - v) ** 2).sum()
    (gradient,) = torch.autograd.grad(loss, state)
    _, written = delta_rule(key, key, value, torch.full((1, 1, 1), 0.3, dtype=torch.float64),
                            initial_state=state.detach()[None, None])
    torch.testing.assert_close(written[0, 0], state.detach() - 0.3 * gradient)


@pytest.mark.parametrize("chunk_size", [None, 3])  # 3: two chunks, the second one padded
def test_delta_rule_gradients(chunk_size):
    inputs = [t.requires_grad_() for t in _inputs(1, 1, 4, 2, 2)]
    state = torch.randn(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, g, s: delta_rule(q, k, v, b, decay=g, chunk_size=chunk_size,
                                            initial_state=s),
        (*inputs, state))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sixteen_bit_inputs_are_computed_in_float32(dtype):
    """torch has no 16-bit triangular solve: the chunk's solve and the state run in float32.

    The results come back in the inputs' dtype and equal the float64 computation on the same
    (rounded) inputs to within the rounding of the outputs; loop and chunks agree, also when
    a sequence continues from a 16-bit state, and a 16-bit GatedDeltaNet runs and decodes.
    """
    inputs = [t.to(dtype) for t in _inputs(2, 2, 37, 8, 6, dtype=torch.float32)]
    start = torch.randn(2, 2, 8, 6).to(dtype)
    exact_out, exact_state = delta_rule(*(t.double() for t in inputs[:4]),
                                        decay=inputs[4].double(), initial_state=start.double())
    for chunk_size in (None, 8):
        out, state = delta_rule(*inputs[:4], decay=inputs[4], chunk_size=chunk_size,
                                initial_state=start)
        assert out.dtype == state.dtype == dtype
        torch.testing.assert_close(out.double(), exact_out, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(state.double(), exact_state, rtol=1e-2, atol=1e-2)
    torch.manual_seed(0)
    layer = GatedDeltaNet(16, 2, chunk_size=8, dtype=dtype).eval()
    x = torch.randn(2, 21, 16).to(dtype)
    with torch.no_grad():
        whole = layer(x)
        state = layer.new_cache()
        steps = [layer(x[:, :13], kv_cache=state)] + [layer(x[:, t:t + 1], kv_cache=state)
                                                      for t in range(13, 21)]
        reference = layer.double()(x.double())
    assert whole.dtype == dtype and state.memory.dtype == dtype
    torch.testing.assert_close(whole.double(), reference, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(torch.cat(steps, dim=1).double(), reference, rtol=3e-2, atol=3e-2)


def test_the_benchmark_times_the_linear_table_in_bfloat16(monkeypatch):
    """On a GPU the benchmark times bfloat16 by default; its table 6 stopped there with
    "triangular_solve_cuda not implemented for 'BFloat16'" (the H100 review). The same code
    path runs here on the CPU, at a small size."""
    pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from attention_book import benchmark

    monkeypatch.setattr(benchmark, "LINEAR_SHAPE", {"batch_size": 1, "num_heads": 2,
                                                    "num_tokens": 70, "head_dim": 8,
                                                    "chunk_size": 16})
    monkeypatch.setattr(benchmark, "LINEAR_DECODE_SHAPE", {"d_model": 16, "num_heads": 2,
                                                           "lengths": (8,)})
    table = benchmark.bench_linear(1, benchmark._Device("cpu", torch.bfloat16))
    assert "cpu, bfloat16" in table
    worst = float(table.split("max |difference| to the token loop = ")[1].split(" ")[0])
    assert worst < 2e-2  # three float32 computations, each rounded to bfloat16 at the end


# --------------------------------------------------------------------------- Hugging Face


def _hugging_face():
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    # inspect.unwrap reaches the torch functions under transformers' kernel-hub wrappers.
    return (inspect.unwrap(qwen3_next.torch_recurrent_gated_delta_rule),
            inspect.unwrap(qwen3_next.torch_chunk_gated_delta_rule))


@pytest.mark.parametrize("num_tokens", [5, 70])
def test_equals_hugging_faces_two_torch_implementations(num_tokens):
    recurrent, chunked = _hugging_face()
    query, key, value, beta, decay = _inputs(2, 2, num_tokens, 8, 6, dtype=torch.float32)
    state = torch.randn(2, 2, 8, 6)
    ours, ours_state = delta_rule(query, key, value, beta, decay=decay, initial_state=state,
                                  chunk_size=16)

    def to_hf(tensor):  # Hugging Face's layout is (B, T, H, d); ours (B, H, T, d)
        return tensor.transpose(1, 2).contiguous()

    for function, kwargs in ((recurrent, {}), (chunked, {"chunk_size": 64})):
        out, end = function(to_hf(query), to_hf(key), to_hf(value), to_hf(decay), to_hf(beta),
                            initial_state=state, output_final_state=True, **kwargs)
        torch.testing.assert_close(out.transpose(1, 2), ours, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(end, ours_state, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- bad input


def test_bad_inputs_name_the_sizes():
    query, key, value, beta, decay = _inputs()
    with pytest.raises(ValueError, match=r"beta must have shape \(2, 3, 11\)"):
        delta_rule(query, key, value, beta[..., :-1])
    with pytest.raises(ValueError, match=r"decay must have shape \(2, 3, 11\).*got \(2, 11\)"):
        delta_rule(query, key, value, beta, decay=decay[:, 0])
    with pytest.raises(ValueError, match=r"decay must be <= 0 \(log space"):
        delta_rule(query, key, value, beta, decay=decay + 2)
    with pytest.raises(ValueError, match=r"beta must be <= 1"):
        delta_rule(query, key, value, beta + 1)
    with pytest.raises(ValueError, match=r"beta must be >= 0"):
        delta_rule(query, key, value, beta - 1)
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        delta_rule(query, key, value, beta, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        delta_rule(query, key, value, beta, chunk_size=2.0)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 3, 4, 5\).*"
                                         r"got \(2, 3, 5, 4\)"):
        delta_rule(query, key, value, beta, initial_state=torch.zeros(2, 3, 5, 4,
                                                                       dtype=torch.float64))
    with pytest.raises(TypeError, match="initial_state must have the keys' dtype"):
        delta_rule(query, key, value, beta, initial_state=torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"query and key must have the same shape"):
        delta_rule(query[..., :3], key, value, beta)
    with pytest.raises(ValueError, match=r"value must match key .* key \(2, 3, 11, 4\), value"):
        delta_rule(query, key, value[..., :5, :], beta)
    with pytest.raises(TypeError, match="floating-point"):
        delta_rule(query, key, value.long(), beta)
    with pytest.raises(TypeError, match="share one dtype"):
        delta_rule(query.float(), key.float(), value, beta)
    with pytest.raises(TypeError, match="beta must have the keys' dtype"):
        delta_rule(query, key, value, beta.float())
    with pytest.raises(ValueError, match="beta holds NaN"):
        delta_rule(query, key, value, beta.clone().fill_(float("nan")))
    with pytest.raises(ValueError, match="feature_map must keep the shape"):
        linear_attention(query, key, value, feature_map=lambda x: x[..., :2])
    with pytest.raises(TypeError, match="feature_map must be callable"):
        linear_attention(query, key, value, feature_map=3)
    with pytest.raises(ValueError, match=r"initial_state's z must have shape \(2, 3, 4\)"):
        linear_attention_recurrent(query, key, value, initial_state=(
            torch.zeros(2, 3, 4, 5, dtype=torch.float64), torch.zeros(2, 3, 5, dtype=torch.float64)))


# --------------------------------------------------------------------------- layers and state


@pytest.mark.parametrize("make", [
    lambda: LinearAttentionLayer(12, 3),
    lambda: GatedDeltaNet(12, 2, gate=False, chunk_size=4),
    lambda: GatedDeltaNet(12, 2, head_dim=5, chunk_size=4),
])
def test_layers_decode_token_by_token_as_they_run_the_whole_sequence(make):
    torch.manual_seed(0)
    layer = make().double().eval()
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    with torch.no_grad():
        whole = layer(x)
        state = layer.new_cache()
        steps = [layer(x[:, :4], kv_cache=state)] + [layer(x[:, t:t + 1], kv_cache=state)
                                                     for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole)
    assert len(state) == 9 and torch.equal(state.positions(2), torch.tensor([9, 10]))
    size = state.nbytes
    with torch.no_grad():
        layer(x[:, :1], kv_cache=state)
    assert state.nbytes == size  # the state does not grow
    out, weights = layer(x, return_weights=True)
    assert out.shape == x.shape and weights is None


def test_layer_and_state_refuse_what_they_cannot_use():
    layer = GatedDeltaNet(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="takes no mask"):
        layer(x, ab.causal_mask(3))
    with pytest.raises(TypeError, match="RecurrentState"):
        layer(x, kv_cache=ab.KVCache(8))
    with pytest.raises(ValueError, match="built with d_in=8"):
        layer(torch.randn(1, 3, 7))
    with pytest.raises(ValueError, match=r"d_model \(8\) must be divisible by num_heads \(3\)"):
        GatedDeltaNet(8, 3)
    state = RecurrentState(4)
    with torch.no_grad():
        layer(x, kv_cache=state)
        with pytest.raises(ValueError, match="cannot take 2 more: 5 would exceed max_length=4"):
            layer(x[:, :2], kv_cache=state)
        with pytest.raises(ValueError, match=r"holds a memory of shape \(1, 2, 4, 4\)"):
            state.advance(1, torch.zeros(1, 2, 4, 5))
        with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 2, 4, 4\).*"
                                             r"got \(1, 2, 4, 4\)"):
            layer(torch.randn(2, 1, 8), kv_cache=state)


def test_gate_starts_near_one_and_decays_are_never_positive():
    torch.manual_seed(0)
    layer = GatedDeltaNet(16, 4)
    beta, decay = layer.gates(torch.randn(3, 5, 16) * 10)
    assert beta.shape == decay.shape == (3, 4, 5)
    assert bool((decay <= 0).all()) and bool(((beta >= 0) & (beta <= 1)).all())
    _, start = layer.gates(torch.zeros(1, 1, 16))
    torch.testing.assert_close(start.exp()[0, :, 0], torch.exp(-torch.logspace(-1, -3, 4)),
                               rtol=1e-2, atol=0)
    assert GatedDeltaNet(16, 4, gate=False).gates(torch.zeros(1, 1, 16))[1] is None


def test_recurrent_state_bytes():
    assert recurrent_state_bytes(num_layers=36, batch_size=1, num_heads=32, key_dim=128,
                                 value_dim=128) == 36 * 32 * 128 * 128 * 2
    with pytest.raises(ValueError, match="key_dim must be >= 1"):
        recurrent_state_bytes(num_layers=1, batch_size=1, num_heads=1, key_dim=0, value_dim=1)
