"""Tests for attention_book.kv_cache and the decoding path of the headed attention layers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_book import GroupedQueryAttention, MultiHeadAttention, causal_mask, padding_mask
from attention_book.kv_cache import (
    EMPTY_POSITION,
    AttentionCache,
    KVCache,
    LayerCache,
    kv_cache_bytes,
    position_mask,
)


def _layer(kind: str, backend: str, context_length: int | None = 12, causal: bool = True):
    torch.manual_seed(0)
    if kind == "mha":
        layer = MultiHeadAttention(8, 8, num_heads=4, context_length=context_length,
                                   backend=backend, causal=causal)
    else:
        layer = GroupedQueryAttention(8, 8, num_heads=4, num_kv_heads=2,
                                      context_length=context_length, backend=backend,
                                      causal=causal)
    return layer.eval()


def _decode(layer, x, chunks, **kwargs):
    """Feed ``x`` through ``layer`` in consecutive chunks of the given sizes, with one cache."""
    cache = KVCache(x.size(-2))
    outputs, start = [], 0
    with torch.no_grad():
        for size in chunks:
            outputs.append(layer(x[..., start:start + size, :], kv_cache=cache, **kwargs))
            start += size
    return torch.cat(outputs, dim=-2), cache


# ---------------------------------------------------------------- KVCache on its own


def test_cache_appends_and_returns_everything_so_far():
    torch.manual_seed(0)
    keys, values = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)  # (B, H, T, d)
    cache = KVCache(max_length=8)
    assert len(cache) == 0 and cache.nbytes == 0
    k_all, v_all = cache.update(keys[..., :2, :], values[..., :2, :])
    assert k_all.shape == (2, 3, 2, 4) and v_all.shape == (2, 3, 2, 6)
    k_all, v_all = cache.update(keys[..., 2:, :], values[..., 2:, :])
    assert len(cache) == 5
    assert torch.equal(k_all, keys) and torch.equal(v_all, values)
    # Buffers of max_length are allocated once: 2*3*8*(4+6) float32 numbers.
    assert cache.nbytes == 2 * 3 * 8 * (4 + 6) * 4
    assert "length=5" in repr(cache)


def test_cache_reset_starts_over():
    cache = KVCache(4)
    cache.update(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.reset()
    assert len(cache) == 0
    k_all, _ = cache.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    assert torch.equal(k_all, torch.zeros(1, 1, 4, 2))


def test_cache_refuses_to_overflow():
    cache = KVCache(4)
    cache.update(torch.zeros(1, 2, 3, 2), torch.zeros(1, 2, 3, 2))
    with pytest.raises(ValueError, match="holds 3 tokens and cannot take 2 more"):
        cache.update(torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2, 2))
    assert len(cache) == 3  # the failed update changed nothing


def test_cache_rejects_mismatched_inputs():
    cache = KVCache(6)
    cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="new keys must be"):
        cache.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError, match="agree in every dim but the last"):
        cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(TypeError, match="the cache stores torch.float32"):
        cache.update(torch.zeros(1, 2, 1, 4, dtype=torch.float64),
                     torch.zeros(1, 2, 1, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        KVCache(0)
    with pytest.raises(TypeError, match="max_length must be an int"):
        KVCache(4.0)


def test_kv_cache_bytes_formula_and_grouped_query_saving():
    size = {"num_layers": 12, "batch_size": 1, "head_dim": 64, "context_length": 1024,
            "bytes_per_element": 2}
    full = kv_cache_bytes(num_kv_heads=12, **size)
    assert full == 2 * 12 * 1 * 12 * 1024 * 64 * 2  # GPT-2 small: 36 MiB in float16
    assert kv_cache_bytes(num_kv_heads=4, **size) * 3 == full
    with pytest.raises(ValueError, match="num_kv_heads must be >= 1"):
        kv_cache_bytes(num_kv_heads=0, **size)


# ---------------------------------------------------------------- decoding equals the full pass


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_one_token_at_a_time_equals_full_causal_pass(kind, backend):
    layer = _layer(kind, backend)
    torch.manual_seed(1)
    x = torch.randn(2, 9, 8)  # (B, T, d_in)
    with torch.no_grad():
        full = layer(x)  # (B, T, d_out)
    decoded, cache = _decode(layer, x, [1] * 9)
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=1e-5)
    # Grouped-query attention caches only its key/value heads.
    assert cache.keys.size(-3) == (4 if kind == "mha" else 2)


@pytest.mark.parametrize("kind", ["mha", "gqa"])
def test_prompt_then_tokens_gives_the_full_weights(kind):
    layer = _layer(kind, "naive")
    torch.manual_seed(2)
    x = torch.randn(1, 7, 8)  # (B, T, d_in)
    with torch.no_grad():
        _, full_weights = layer(x, return_weights=True)  # (B, H, T, T)
        cache = KVCache(7)
        _, prompt_weights = layer(x[:, :4], return_weights=True, kv_cache=cache)  # (B, H, 4, 4)
        _, chunk_weights = layer(x[:, 4:], return_weights=True, kv_cache=cache)  # (B, H, 3, 7)
    torch.testing.assert_close(prompt_weights, full_weights[..., :4, :4])
    torch.testing.assert_close(chunk_weights, full_weights[..., 4:, :])
    # Bottom-right alignment: the 3 new queries are positions 4, 5, 6 of the 7 keys.
    assert torch.equal(chunk_weights[0, 0] > 0, causal_mask(3, 7))


def test_top_left_alignment_would_be_wrong():
    """PyTorch's is_causal with 3 queries and 7 keys lets query 0 see only key 0."""
    top_left = torch.ones(3, 7, dtype=torch.bool).tril()
    assert not torch.equal(top_left, causal_mask(3, 7))
    assert causal_mask(3, 7)[0].sum() == 5 and top_left[0].sum() == 1


def test_padding_mask_combines_with_the_cache():
    layer = _layer("mha", "naive")
    torch.manual_seed(3)
    x = torch.randn(2, 6, 8)  # (B, T, d_in)
    keep = padding_mask([6, 4], 6)  # (B, 1, 1, T)
    with torch.no_grad():
        full = layer(x, keep)
        cache = KVCache(6)
        first = layer(x[:, :5], keep[..., :5], kv_cache=cache)  # (B, 5, d_out)
        last = layer(x[:, 5:], keep, kv_cache=cache)  # (B, 1, d_out)
    torch.testing.assert_close(torch.cat([first, last], dim=1), full, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(x[:, :1], keep[..., :5], kv_cache=KVCache(6))


def test_non_causal_layer_attends_to_the_whole_cache():
    layer = _layer("mha", "naive", causal=False)
    torch.manual_seed(4)
    x = torch.randn(1, 5, 8)  # (B, T, d_in)
    with torch.no_grad():
        cache = KVCache(5)
        layer(x[:, :4], kv_cache=cache)
        last = layer(x[:, 4:], kv_cache=cache)  # (B, 1, d_out)
        full = layer(x)
    torch.testing.assert_close(last, full[:, 4:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_cache_beyond_context_length_is_a_clear_error(backend):
    layer = _layer("gqa", backend, context_length=4)
    cache = KVCache(10)
    with torch.no_grad():
        layer(torch.randn(1, 3, 8), kv_cache=cache)
        layer(torch.randn(1, 1, 8), kv_cache=cache)
        with pytest.raises(ValueError, match="makes 5, which exceeds context_length=4"):
            layer(torch.randn(1, 1, 8), kv_cache=cache)
    assert len(cache) == 4


def test_cache_of_the_wrong_type_is_a_clear_error():
    layer = _layer("mha", "naive")
    with pytest.raises(TypeError, match="kv_cache must follow the attention cache protocol.*got dict"):
        layer(torch.randn(1, 2, 8), kv_cache={})


def test_without_a_cache_nothing_changed():
    """The sdpa backend (is_causal fast path) still equals the naive one, with and without masks."""
    naive, sdpa = _layer("gqa", "naive"), _layer("gqa", "sdpa")
    torch.manual_seed(5)
    x = torch.randn(2, 10, 8)  # (B, T, d_in)
    keep = padding_mask([10, 7], 10)  # (B, 1, 1, T)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(x), naive(x), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sdpa(x, keep), naive(x, keep), atol=1e-6, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=6),
    batch=st.integers(1, 3),
    kind=st.sampled_from(["mha", "gqa"]),
    backend=st.sampled_from(["naive", "sdpa"]),
    seed=st.integers(0, 10_000),
)
def test_any_chunking_equals_the_full_pass(chunks, batch, kind, backend, seed):
    layer = _layer(kind, backend, context_length=24)
    torch.manual_seed(seed)
    x = torch.randn(batch, sum(chunks), 8)  # (B, T, d_in)
    with torch.no_grad():
        full = layer(x)
    decoded, cache = _decode(layer, x, chunks)
    assert len(cache) == sum(chunks)
    torch.testing.assert_close(decoded, full, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the cache protocol


def test_kv_cache_follows_the_protocol_and_its_positions_continue():
    cache = KVCache(8)
    assert isinstance(cache, AttentionCache) and isinstance(cache, LayerCache)
    assert not isinstance({}, LayerCache)
    assert torch.equal(cache.positions(3, "cpu"), torch.tensor([0, 1, 2]))
    cache.update(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4))  # (B, H, T, d)
    assert torch.equal(cache.positions(2, "cpu"), torch.tensor([3, 4]))  # read before the update
    assert torch.equal(cache.key_positions("cpu"), torch.arange(3))
    with pytest.raises(ValueError, match="num_new must be an int >= 0, got -1"):
        cache.positions(-1, "cpu")


def test_the_fast_protocol_check_agrees_with_isinstance():
    from types import SimpleNamespace

    from attention_book.kv_cache import follows_protocol
    from attention_book.linear_attention import RecurrentState

    class OnlyPositions:
        def positions(self, num_new, device):
            return torch.arange(num_new)

    candidates = [KVCache(4), RecurrentState(), {}, [], OnlyPositions(), None, 3,
                  SimpleNamespace(positions=len, update=len, key_positions=len),
                  SimpleNamespace(__len__=len, positions=len, update=len, key_positions=len)]
    for protocol in (LayerCache, AttentionCache):
        for candidate in candidates:
            assert follows_protocol(candidate, protocol) == isinstance(candidate, protocol), (
                protocol.__name__, candidate)
    assert follows_protocol(KVCache(4), AttentionCache)
    assert not follows_protocol(RecurrentState(), AttentionCache)
    assert follows_protocol(RecurrentState(), LayerCache)


def test_position_mask_is_the_bottom_right_causal_mask_and_hides_empty_slots():
    # A contiguous cache: 3 new queries at positions 5, 6, 7 against keys 0 ... 7.
    mask = position_mask(torch.arange(5, 8), torch.arange(8))  # (T_new, T_k)
    assert torch.equal(mask, causal_mask(3, 8))
    # Two rows of different lengths: 2 tokens and 4, one new query each, padded to 4 keys.
    queries = torch.tensor([[1], [3]])  # (B, T_new)
    keys = torch.tensor([[0, 1, EMPTY_POSITION, EMPTY_POSITION], [0, 1, 2, 3]])  # (B, T_k)
    assert position_mask(queries, keys).tolist() == [[[True, True, False, False]],
                                                      [[True, True, True, True]]]
    # Without causality only the empty slots are hidden.
    assert position_mask(torch.tensor([[0], [0]]), keys, causal=False).tolist() == [
        [[True, True, False, False]], [[True, True, True, True]]]
    with pytest.raises(TypeError, match="integer positions"):
        position_mask(torch.zeros(2), torch.arange(2))


class _LeftPaddedCache:
    """Rows of different lengths in one buffer, each right-aligned: the padding comes first.

    An implementation of the protocol that is neither a KVCache nor a paged view (a batch
    padded on the left, as Hugging Face pads batched prompts), to show that a layer needs
    nothing but the protocol. The padding lies *before* every query's position, so only its
    ``EMPTY_POSITION`` hides it; it holds large finite numbers (the protocol asks for finite
    ones), so a layer that attended to it would be far off.
    """

    def __init__(self, lengths: list[int], keys: torch.Tensor, values: torch.Tensor):
        self.lengths = list(lengths)
        self.keys, self.values = keys, values  # (B, H, max(lengths), d), rows right-aligned

    def __len__(self) -> int:
        return max(self.lengths)

    def positions(self, num_new, device):
        return torch.tensor(self.lengths, device=device)[:, None] + torch.arange(num_new, device=device)

    def update(self, keys, values=None):
        self.keys = torch.cat([self.keys, keys], dim=-2)  # (B, H, T_k, d)
        self.values = torch.cat([self.values, values], dim=-2)  # (B, H, T_k, d)
        self.lengths = [length + keys.size(-2) for length in self.lengths]
        return self.keys, self.values

    def key_positions(self, device):
        width = self.keys.size(-2)
        slot = torch.arange(width, device=device)  # (T_k,)
        padding = torch.tensor([width - length for length in self.lengths], device=device)[:, None]
        return torch.where(slot >= padding, slot - padding, EMPTY_POSITION)  # (B, T_k)


@pytest.mark.parametrize("rope", [False, True])
def test_a_layer_decodes_rows_of_different_lengths_through_the_protocol_alone(rope):
    """Any protocol cache: per-row positions for RoPE and the mask; the padding is hidden."""
    torch.manual_seed(0)
    layer = GroupedQueryAttention(8, 8, 4, 2, context_length=10, rope=rope).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    lengths = [3, 5]
    with torch.no_grad():
        full = [layer(x[row:row + 1, :lengths[row] + 2]) for row in range(2)]  # each (1, L + 2, d)
        # Fill the cache with each row's first L tokens, by decoding them alone.
        keys, values = [], []
        for row, length in enumerate(lengths):
            own = KVCache(10)
            layer(x[row:row + 1, :length], kv_cache=own)
            pad = max(lengths) - length
            keys.append(torch.nn.functional.pad(own.keys[0, :, :length], (0, 0, pad, 0), value=1e3))
            values.append(torch.nn.functional.pad(own.values[0, :, :length], (0, 0, pad, 0),
                                                  value=1e3))
        cache = _LeftPaddedCache(lengths, torch.stack(keys), torch.stack(values))
        new = torch.stack([x[row, length:length + 2] for row, length in enumerate(lengths)])
        out = layer(new, kv_cache=cache)  # (B, 2, d): each row's next 2 tokens
    for row, length in enumerate(lengths):
        torch.testing.assert_close(out[row], full[row][0, length:length + 2])
