"""Chapter 16's paged KV cache, paged attention and continuous batching.

Unit tests of the block bookkeeping, property tests (random block tables against contiguous
attention; random fork/append/free sequences against a plain model of the sequences and
against the block counts), exhaustion, the errors, and batched generation against
``TinyGPT.generate`` one request at a time.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_variants import VARIANTS, variant

import attention_book as ab
from attention_book import causal_mask, scaled_dot_product_attention
from attention_book.model import TinyGPT
from attention_book.serving import (
    ContinuousBatcher,
    OutOfBlocksError,
    PagedKVCache,
    generate_batch,
    new_sequence_states,
    paged_attention,
    paged_forward,
)


def _kv(num_kv_heads: int, num_tokens: int, head_dim: int, seed: int,
        dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (num_kv_heads, num_tokens, head_dim)
    return (torch.randn(shape, generator=generator, dtype=dtype),
            torch.randn(shape, generator=generator, dtype=dtype))


def _model(**overrides) -> TinyGPT:
    sizes = {"vocab_size": 13, "d_model": 16, "num_heads": 4, "num_layers": 2,
             "context_length": 40}
    sizes.update(overrides)
    torch.manual_seed(0)
    return TinyGPT(**sizes, dtype=torch.float64).eval()


def _prompts(lengths, vocab_size: int = 13, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=generator) for length in lengths]


def test_public_names_are_exported():
    for name in ("PagedKVCache", "OutOfBlocksError", "paged_attention", "paged_forward",
                 "ContinuousBatcher", "StepRecord", "generate_batch"):
        assert name in ab.__all__ and hasattr(ab, name), name
    assert issubclass(OutOfBlocksError, RuntimeError)


# --------------------------------------------------------------------------- the block pool


def test_blocks_are_taken_when_the_last_one_is_full_and_given_back_by_free():
    cache = PagedKVCache(8, 4, 2, 3)
    assert cache.key_blocks.shape == (1, 8, 4, 2, 3) and cache.blocks_in_use == 0
    cache.add_sequence("a")
    cache.add_sequence("b")
    assert cache.blocks_in_use == 0  # an empty sequence holds no block
    cache.append("a", *_kv(2, 6, 3, 0))
    cache.append("b", *_kv(2, 3, 3, 1))
    cache.append("a", *_kv(2, 3, 3, 2))
    assert cache.block_table("a") == [0, 1, 3] and cache.block_table("b") == [2]
    assert (cache.length("a"), cache.length("b"), cache.blocks_in_use) == (9, 3, 4)
    cache.free("b")
    assert cache.blocks_in_use == 3 and cache.ref_count(2) == 0
    cache.add_sequence("c")
    cache.append("c", *_kv(2, 1, 3, 3))
    assert cache.block_table("c") == [2]  # the lowest free block
    assert cache.block_nbytes == 2 * 4 * 2 * 3 * 4
    assert "blocks_in_use=4/8" in repr(cache) and "a" in cache and "b" not in cache


def test_gather_returns_what_was_appended_in_order():
    cache = PagedKVCache(10, 4, 2, 3, num_layers=2)
    cache.add_sequence(0)
    cache.add_sequence(1)
    chunks = {0: [], 1: []}
    for step, (seq_id, size) in enumerate([(0, 5), (1, 2), (0, 1), (1, 7), (0, 4)]):
        keys, values = _kv(2, size, 3, step)
        for layer in range(2):
            cache.append(seq_id, keys + layer, values - layer, layer=layer)
        chunks[seq_id].append((keys, values))
    for seq_id, parts in chunks.items():
        for layer in range(2):
            keys, values = cache.gather(seq_id, layer=layer)
            assert torch.equal(keys, torch.cat([k for k, _ in parts], dim=1) + layer)
            assert torch.equal(values, torch.cat([v for _, v in parts], dim=1) - layer)


def test_fork_shares_blocks_and_copy_on_write_copies_only_the_written_one():
    cache = PagedKVCache(8, 4, 1, 2)
    cache.add_sequence("prompt")
    prompt_keys, prompt_values = _kv(1, 6, 2, 0)
    cache.append("prompt", prompt_keys, prompt_values)
    cache.fork("prompt", "child")
    assert cache.block_table("child") == cache.block_table("prompt") == [0, 1]
    assert [cache.ref_count(b) for b in (0, 1)] == [2, 2] and cache.blocks_in_use == 2
    new_keys, new_values = _kv(1, 1, 2, 1)
    cache.append("child", new_keys, new_values)
    # The full block 0 stays shared; the partial block 1 was copied before the write.
    assert cache.block_table("child") == [0, 2] and cache.block_table("prompt") == [0, 1]
    assert [cache.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1] and cache.blocks_in_use == 3
    assert torch.equal(cache.gather("prompt")[0], prompt_keys)
    assert torch.equal(cache.gather("child")[0], torch.cat([prompt_keys, new_keys], dim=1))
    # The parent is now the only owner of block 1: it writes in place, no copy.
    cache.append("prompt", *_kv(1, 2, 2, 2))
    assert cache.block_table("prompt") == [0, 1] and cache.blocks_in_use == 3
    assert torch.equal(cache.gather("child")[0], torch.cat([prompt_keys, new_keys], dim=1))
    cache.free("prompt")
    assert cache.blocks_in_use == 2 and cache.ref_count(0) == 1
    cache.free("child")
    assert cache.blocks_in_use == 0


def test_a_fork_of_a_full_block_needs_no_copy():
    cache = PagedKVCache(4, 4, 1, 2)
    cache.add_sequence("p")
    cache.append("p", *_kv(1, 8, 2, 0))
    cache.fork("p", "c")
    cache.append("c", *_kv(1, 1, 2, 1))
    assert cache.block_table("c") == [0, 1, 2] and cache.blocks_in_use == 3


# --------------------------------------------------------------------------- property tests

_OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["add", "append", "fork", "free"]), st.integers(0, 5),
              st.integers(0, 5), st.integers(0, 7)),
    min_size=1, max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(operations=_OPERATIONS, block_size=st.integers(1, 4))
def test_random_fork_append_free_keep_every_sequence_and_the_block_counts(operations, block_size):
    cache = PagedKVCache(12, block_size, 1, 2, dtype=torch.float64)
    expected: dict[int, torch.Tensor] = {}  # the keys each sequence should hold
    next_value = 0.0
    for kind, first, second, size in operations:
        if kind == "add" and first not in expected:
            cache.add_sequence(first)
            expected[first] = torch.zeros(1, 0, 2, dtype=torch.float64)
        elif kind == "fork" and first in expected and second not in expected:
            cache.fork(first, second)
            expected[second] = expected[first].clone()
        elif kind == "free" and first in expected:
            cache.free(first)
            del expected[first]
        elif kind == "append" and first in expected:
            keys = next_value + torch.arange(2.0 * size, dtype=torch.float64).view(1, size, 2)
            next_value += 2 * size
            before = {seq_id: cache.block_table(seq_id) for seq_id in expected}
            used_before = cache.blocks_in_use
            try:
                cache.append(first, keys, -keys)
            except OutOfBlocksError:
                assert cache.blocks_in_use == used_before
                assert {seq_id: cache.block_table(seq_id) for seq_id in expected} == before
            else:
                expected[first] = torch.cat([expected[first], keys], dim=1)
        # Every sequence reads back exactly its own tokens.
        for seq_id, keys in expected.items():
            gathered_keys, gathered_values = cache.gather(seq_id)
            assert torch.equal(gathered_keys, keys) and torch.equal(gathered_values, -keys)
            assert cache.length(seq_id) == keys.size(1)
            assert len(cache.block_table(seq_id)) == -(-keys.size(1) // block_size)
        # The counts: a block's reference count is the number of tables that hold it, and
        # the blocks in use are exactly the distinct blocks of all tables.
        held = [block for seq_id in expected for block in cache.block_table(seq_id)]
        assert cache.blocks_in_use == len(set(held)) == cache.num_blocks - cache.num_free_blocks
        for block in range(cache.num_blocks):
            assert cache.ref_count(block) == held.count(block)
    for seq_id in list(expected):
        cache.free(seq_id)
    assert cache.blocks_in_use == 0


def _contiguous_attention(queries, keys, values):
    """Causal attention over contiguous keys and values, each query head on its kv head."""
    group_size = queries.size(0) // keys.size(0)
    keys = keys.repeat_interleave(group_size, dim=0)  # (num_heads, L, head_dim)
    values = values.repeat_interleave(group_size, dim=0)  # (num_heads, L, head_dim)
    mask = causal_mask(queries.size(1), keys.size(1))  # (T_new, L), bottom-right
    return scaled_dot_product_attention(queries, keys, values, mask)[0]


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=4), block_size=st.integers(1, 5),
       group_size=st.sampled_from([1, 2, 3]), num_new=st.integers(1, 3),
       order_seed=st.integers(0, 2**16))
def test_paged_attention_equals_contiguous_attention_for_random_block_tables(
        lengths, block_size, group_size, num_new, order_seed):
    num_kv_heads, head_dim = 2, 4
    num_blocks = sum(-(-length // block_size) for length in lengths) + 3  # a few left over
    cache = PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.float64)
    generator = torch.Generator().manual_seed(order_seed)
    contents = {}
    for seq_id, length in enumerate(lengths):
        cache.add_sequence(seq_id)
        contents[seq_id] = _kv(num_kv_heads, length, head_dim, seq_id, torch.float64)
    # Append in random chunks, interleaving the sequences: the tables scatter over the pool.
    written = dict.fromkeys(contents, 0)
    while any(written[s] < lengths[s] for s in contents):
        open_ids = [s for s in contents if written[s] < lengths[s]]
        seq_id = open_ids[int(torch.randint(len(open_ids), (1,), generator=generator))]
        size = min(int(torch.randint(1, 4, (1,), generator=generator)), lengths[seq_id] - written[seq_id])
        keys, values = contents[seq_id]
        cache.append(seq_id, keys[:, written[seq_id]:written[seq_id] + size],
                     values[:, written[seq_id]:written[seq_id] + size])
        written[seq_id] += size
    num_new = min(num_new, min(lengths))
    queries = torch.randn(len(lengths), num_kv_heads * group_size, num_new, head_dim,
                          generator=generator, dtype=torch.float64)
    output = paged_attention(queries, cache, list(contents))
    assert output.shape == queries.shape
    for row, seq_id in enumerate(contents):
        torch.testing.assert_close(output[row], _contiguous_attention(queries[row], *contents[seq_id]))


def test_paged_attention_ignores_stale_slots_even_when_they_hold_nan():
    cache = PagedKVCache(4, 4, 1, 2)
    cache.add_sequence("old")
    cache.append("old", torch.full((1, 4, 2), float("nan")), torch.full((1, 4, 2), float("nan")))
    cache.free("old")
    cache.add_sequence("new")
    keys, values = _kv(1, 2, 2, 0)
    cache.append("new", keys, values)  # reuses block 0, whose slots 2 and 3 still hold NaN
    queries = torch.randn(1, 1, 2, 2)
    output = paged_attention(queries, cache, ["new"])
    torch.testing.assert_close(output[0], _contiguous_attention(queries[0], keys, values))


def test_a_short_table_is_padded_without_reading_another_sequence():
    cache = PagedKVCache(6, 2, 1, 2)
    cache.add_sequence("broken")  # block 0, full of NaN
    cache.append("broken", torch.full((1, 2, 2), float("nan")), torch.full((1, 2, 2), float("nan")))
    contents = {"short": _kv(1, 1, 2, 0), "long": _kv(1, 6, 2, 1)}
    for seq_id, (keys, values) in contents.items():
        cache.add_sequence(seq_id)
        cache.append(seq_id, keys, values)
    queries = torch.randn(2, 1, 1, 2)
    output = paged_attention(queries, cache, list(contents))  # "short" is padded to 3 blocks
    for row, (keys, values) in enumerate(contents.values()):
        torch.testing.assert_close(output[row], _contiguous_attention(queries[row], keys, values))


# --------------------------------------------------------------------------- exhaustion


def test_out_of_blocks_leaves_every_sequence_intact():
    cache = PagedKVCache(5, 4, 1, 2)
    for seq_id, size in (("a", 6), ("b", 5)):
        cache.add_sequence(seq_id)
        cache.append(seq_id, *_kv(1, size, 2, len(seq_id)))
    cache.fork("a", "a2")
    snapshot = {s: (cache.block_table(s), cache.length(s), cache.gather(s)) for s in cache.seq_ids}
    used = cache.blocks_in_use
    assert used == 4
    # a2 would need a copy of its shared partial block and a new block: 2 > 1 free.
    with pytest.raises(OutOfBlocksError, match=r"needs 2 more block\(s\).*only 1 of the 5"):
        cache.append("a2", *_kv(1, 3, 2, 9))
    assert cache.blocks_in_use == used
    for seq_id, (table, length, (keys, values)) in snapshot.items():
        assert cache.block_table(seq_id) == table and cache.length(seq_id) == length
        assert torch.equal(cache.gather(seq_id)[0], keys)
        assert torch.equal(cache.gather(seq_id)[1], values)
    cache.append("a2", *_kv(1, 1, 2, 9))  # one copy fits
    assert cache.num_free_blocks == 0


def test_paged_forward_out_of_blocks_changes_nothing_in_any_layer():
    model = _model()
    cache = PagedKVCache(3, 4, 4, 4, num_layers=2, dtype=torch.float64)
    for seq_id in (0, 1):
        cache.add_sequence(seq_id)
    paged_forward(model, cache, [0, 1], torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]))
    before = [cache.gather(0, layer) for layer in range(2)], cache.blocks_in_use
    with pytest.raises(OutOfBlocksError):
        paged_forward(model, cache, [0, 1], torch.tensor([[1], [2]]))
    assert [cache.length(0, layer) for layer in range(2)] == [4, 4]
    assert cache.blocks_in_use == before[1]
    for layer in range(2):
        assert torch.equal(cache.gather(0, layer)[0], before[0][layer][0])


# --------------------------------------------------------------------------- errors


def test_bad_input_gets_clear_errors():
    cache = PagedKVCache(4, 4, 2, 3, num_layers=2)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match="unknown seq_id 7: the cache holds 1 sequences"):
        cache.append(7, *_kv(2, 1, 3, 0))
    with pytest.raises(ValueError, match="already in the cache"):
        cache.add_sequence(0)
    with pytest.raises(TypeError, match="hashable"):
        cache.add_sequence([1])
    with pytest.raises(ValueError, match=r"num_kv_heads=2 and head_dim=3, got \(2, 1, 4\)"):
        cache.append(0, torch.zeros(2, 1, 4), torch.zeros(2, 1, 4))
    with pytest.raises(ValueError, match="same shape"):
        cache.append(0, torch.zeros(2, 1, 3), torch.zeros(2, 2, 3))
    with pytest.raises(TypeError, match="stores torch.float32"):
        cache.append(0, torch.zeros(2, 1, 3, dtype=torch.float64),
                     torch.zeros(2, 1, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        cache.append(0, torch.zeros(2, 1, 3, dtype=torch.long), torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"layer must lie in \[0, num_layers=2\)"):
        cache.gather(0, layer=2)
    cache.fork(0, 1)
    with pytest.raises(ValueError, match="child_id 1 is already"):
        cache.fork(0, 1)
    cache.free(1)
    with pytest.raises(ValueError, match="seq_id 1 was freed"):
        cache.gather(1)
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        PagedKVCache(0, 4, 1, 1)
    with pytest.raises(TypeError, match="dtype"):
        PagedKVCache(1, 4, 1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match=r"block must lie in \[0, num_blocks=4\)"):
        cache.ref_count(4)


def test_paged_attention_checks_its_inputs():
    cache = PagedKVCache(4, 4, 2, 3)
    cache.add_sequence("a")
    cache.append("a", *_kv(2, 2, 3, 0))
    with pytest.raises(ValueError, match=r"queries has 2 rows .* seq_ids names 1"):
        paged_attention(torch.zeros(2, 2, 1, 3), cache, ["a"])
    with pytest.raises(ValueError, match=r"num_heads \(3\) must be a multiple .* \(2\)"):
        paged_attention(torch.zeros(1, 3, 1, 3), cache, ["a"])
    with pytest.raises(ValueError, match="head_dim=4"):
        paged_attention(torch.zeros(1, 2, 1, 4), cache, ["a"])
    with pytest.raises(ValueError, match="holds 2 tokens in layer 0, fewer than the T_new=3"):
        paged_attention(torch.zeros(1, 2, 3, 3), cache, ["a"])
    with pytest.raises(ValueError, match="unknown seq_id 'b'"):
        paged_attention(torch.zeros(1, 2, 1, 3), cache, ["b"])
    with pytest.raises(TypeError, match="PagedKVCache"):
        paged_attention(torch.zeros(1, 2, 1, 3), ab.KVCache(4), ["a"])
    with pytest.raises(ValueError, match="shape"):
        paged_attention(torch.zeros(2, 1, 3), cache, ["a"])


def test_the_model_must_fit_and_be_in_eval_mode():
    model = _model()
    with pytest.raises(ValueError, match=r"training mode.*model.eval\(\)"):
        generate_batch(model.train(), [torch.tensor([1, 2])], 2)
    model.eval()
    with pytest.raises(TypeError, match="TinyGPT"):
        generate_batch(torch.nn.Linear(2, 2), [torch.tensor([1])], 1)
    cache = PagedKVCache(4, 4, 2, 4, num_layers=2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"does not fit the model, which needs \(2, 4, 4"):
        paged_forward(model, cache, [], torch.zeros(0, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"vocab_size=13"):
        generate_batch(model, [torch.tensor([1, 13])], 1)
    with pytest.raises(ValueError, match="exceeds context_length=40"):
        generate_batch(model, [torch.tensor([1] * 30)], 11)
    with pytest.raises(ValueError, match=r"prompts\[0\] must have shape \(T,\)"):
        generate_batch(model, [torch.tensor(3)], 1)
    batcher = ContinuousBatcher(model, block_size=4, num_blocks=2)
    with pytest.raises(OutOfBlocksError, match="needs 3 blocks of 4 tokens.*only 2"):
        batcher.submit(torch.tensor([1, 2, 3, 4, 5]), 5)


# --------------------------------------------------------------------------- the model


def test_paged_forward_with_a_shared_prompt_equals_the_full_forward():
    model = _model()
    system, replies = _prompts([7])[0], _prompts([3, 1, 6], seed=2)
    cache = PagedKVCache(16, 4, 4, 4, num_layers=2, dtype=torch.float64)
    cache.add_sequence("system")
    paged_forward(model, cache, ["system"], system[None])
    for index, reply in enumerate(replies):
        cache.fork("system", index)
        logits = paged_forward(model, cache, [index], reply[None])  # (1, T_reply, vocab)
        with torch.no_grad():
            full = model(torch.cat([system, reply])[None])  # (1, T, vocab)
        torch.testing.assert_close(logits, full[:, -len(reply):])
    # The system prompt's full block 0 is shared by all; each reply copies the partial
    # block 1 and adds what it needs: 2 + (3 - 1) + (2 - 1) + (4 - 1) blocks.
    assert cache.blocks_in_use == 2 + sum(-(-(7 + len(r)) // 4) - 1 for r in replies) == 8


@pytest.mark.parametrize("rope", [False, True])
def test_generate_batch_equals_generating_each_request_alone(rope):
    model = _model()
    for block in model.blocks:
        block.attention.rope = rope  # RoPE with each sequence's own positions
    prompts = _prompts([5, 1, 12, 3, 8])
    counts = [6, 9, 0, 4, 11]
    outputs = generate_batch(model, prompts, counts, block_size=4)
    for prompt, count, output in zip(prompts, counts, outputs, strict=True):
        assert torch.equal(output, model.generate(prompt[None], count)[0])


def test_a_small_pool_preempts_and_still_gives_the_same_tokens():
    model = _model()
    prompts = _prompts([6, 9, 4, 7, 3], seed=3)
    counts = [12, 8, 14, 6, 10]
    batcher = ContinuousBatcher(model, block_size=4, num_blocks=9)
    request_ids = [batcher.submit(prompt, count) for prompt, count in zip(prompts, counts, strict=True)]
    batcher.run()
    assert sum(len(record.preempted) for record in batcher.history) > 0
    assert max(record.blocks_in_use for record in batcher.history) <= 9
    assert batcher.cache.blocks_in_use == 0 and batcher.done
    for request_id, prompt, count in zip(request_ids, prompts, counts, strict=True):
        assert torch.equal(batcher.output(request_id), model.generate(prompt[None], count)[0])


def test_a_hybrid_model_preempted_recomputes_its_states_and_gives_the_same_tokens():
    """A preempted request's recurrent states go with its blocks and are rebuilt with them."""
    model = variant("gated deltanet hybrid")
    prompts = _prompts([3, 5, 2, 4], vocab_size=11, seed=8)
    counts = [8, 6, 9, 7]
    batcher = ContinuousBatcher(model, block_size=2, num_blocks=12)
    request_ids = [batcher.submit(prompt, count) for prompt, count in zip(prompts, counts, strict=True)]
    batcher.run()
    assert sum(len(record.preempted) for record in batcher.history) > 0
    assert batcher.done and batcher.cache.blocks_in_use == 0 and not batcher.states
    for request_id, prompt, count in zip(request_ids, prompts, counts, strict=True):
        assert torch.equal(batcher.output(request_id), model.generate(prompt[None], count)[0])


def test_requests_arrive_and_finish_at_different_times():
    model = _model()
    prompts = _prompts([4, 2, 6, 3], seed=4)
    counts = [5, 2, 3, 6]
    arrivals = [0, 0, 2, 3]
    batcher = ContinuousBatcher(model, block_size=4, num_blocks=20, max_batch_size=3)
    step = 0
    while step <= max(arrivals) or not batcher.done:
        for index, arrival in enumerate(arrivals):
            if arrival == step:
                assert batcher.submit(prompts[index], counts[index]) == index
        batcher.step()
        step += 1
    # Each request got its prefill token once and then one token per decoding step.
    for index, count in enumerate(counts):
        admitted = sum(record.admitted.count(index) for record in batcher.history)
        decoded = sum(record.decoded.count(index) for record in batcher.history)
        assert (admitted, admitted + decoded) == (1, count)
        assert torch.equal(batcher.output(index), model.generate(prompts[index][None], count)[0])
    assert max(len(record.decoded) for record in batcher.history) <= 3
    finish = {i: r.step for r in batcher.history for i in r.finished}
    assert finish[1] < finish[0] < finish[3]


# --------------------------------------------------------------------------- the cache protocol


def _paged_cache_for(model: TinyGPT, num_blocks: int = 24, block_size: int = 3) -> PagedKVCache:
    """A pool for the model's attention layers (a hybrid's recurrent layers page nothing)."""
    layers = [block.attention for block in model.blocks
              if isinstance(block.attention, (ab.MultiHeadAttention, ab.GroupedQueryAttention,
                                              ab.MultiHeadLatentAttention))]
    attention = layers[0]
    if isinstance(attention, ab.MultiHeadLatentAttention):  # one latent per token, no value
        return PagedKVCache(num_blocks, block_size, 1, attention.latent_dim,
                            num_layers=len(layers), dtype=torch.float64, store_values=False)
    return PagedKVCache(num_blocks, block_size, attention.num_kv_heads, attention.head_dim,
                        num_layers=len(layers), dtype=torch.float64)


@pytest.mark.parametrize("name", VARIANTS)
def test_paged_views_of_a_ragged_batch_give_the_full_forward_logits(name):
    """Sequences of 2, 7 and 4 tokens decode together; each row equals its own full pass.

    A hybrid's recurrent layers keep one state per sequence beside the pool, stacked for the
    batch at each step (the sequences have read different numbers of tokens).
    """
    model = variant(name)
    lengths = [2, 7, 4]
    tokens = _prompts([length + 3 for length in lengths], vocab_size=11, seed=5)
    cache = _paged_cache_for(model)
    states = {}
    for seq_id, (sequence, length) in enumerate(zip(tokens, lengths, strict=True)):
        cache.add_sequence(seq_id)
        states[seq_id] = new_sequence_states(model)
        paged_forward(model, cache, [seq_id], sequence[None, :length],  # each prompt alone
                      states=states)
    steps = []
    for step in range(3):  # then one token of every sequence per batched forward pass
        idx = torch.stack([sequence[length + step] for sequence, length in
                           zip(tokens, lengths, strict=True)])[:, None]  # (B, 1)
        steps.append(paged_forward(model, cache, [0, 1, 2], idx, states=states))  # (B, 1, V)
    decoded = torch.cat(steps, dim=1)  # (B, 3, vocab_size)
    with torch.no_grad():
        for row, (sequence, length) in enumerate(zip(tokens, lengths, strict=True)):
            full = model(sequence[None])  # (1, length + 3, vocab_size)
            torch.testing.assert_close(decoded[row], full[0, length:])
    assert [cache.length(seq_id, layer) for seq_id in range(3)
            for layer in range(cache.num_layers)] == [5] * cache.num_layers + [
        10] * cache.num_layers + [7] * cache.num_layers
    assert [len(state) for seq_id in range(3) for state in states[seq_id]] == [
        5] * len(states[0]) + [10] * len(states[0]) + [7] * len(states[0])


def test_the_views_of_a_step_share_one_reservation_and_follow_the_protocol():
    from attention_book.kv_cache import EMPTY_POSITION, AttentionCache

    cache = PagedKVCache(6, 2, 1, 2, num_layers=2)
    for seq_id, size in (("a", 3), ("b", 1)):
        cache.add_sequence(seq_id)
        for layer in range(2):
            cache.append(seq_id, *_kv(1, size, 2, layer), layer=layer)
    views = cache.batch_views(["a", "b"], 2)
    assert len(views) == 2 and all(isinstance(view, AttentionCache) for view in views)
    # Every block of the step is taken before any layer writes: a: 3 + 2 tokens need 3 blocks.
    assert [len(cache.block_table(s)) for s in ("a", "b")] == [3, 2] and cache.blocks_in_use == 5
    assert len(views[0]) == 3 and views[0].positions(2, "cpu").tolist() == [[3, 4], [1, 2]]
    keys, values = _kv(1, 4, 2, 7)
    new_keys, new_values = keys.reshape(2, 1, 2, 2), values.reshape(2, 1, 2, 2)  # (B, H, T_new, d)
    all_keys, _ = views[0].update(new_keys, new_values)  # (B, H_kv, T_k, head_dim)
    assert all_keys.shape == (2, 1, 5, 2) and len(views[0]) == 5 and len(views[1]) == 3
    torch.testing.assert_close(all_keys[1, :, :3], cache.gather("b", 0)[0])
    assert views[0].key_positions("cpu").tolist() == [
        [0, 1, 2, 3, 4], [0, 1, 2, EMPTY_POSITION, EMPTY_POSITION]]
    with pytest.raises(ValueError, match="already updated in this step"):
        views[0].update(new_keys, new_values)
    with pytest.raises(ValueError, match="reserved for 2 new token"):
        views[1].positions(1, "cpu")
    with pytest.raises(ValueError, match=r"B=2 and T_new=2, got \(2, 1, 1, 2\)"):
        views[1].update(new_keys[:, :, :1], new_values[:, :, :1])
    with pytest.raises(ValueError, match="holds \\[5, 3\\] tokens in its layers"):
        cache.batch_views(["a"], 1)
    with pytest.raises(ValueError, match="each sequence once"):
        cache.batch_views(["b", "b"], 1)


@pytest.mark.parametrize("name", VARIANTS)
def test_paged_generation_equals_model_generate_for_every_variant(name):
    model = variant(name)
    prompts = _prompts([5, 1, 3], vocab_size=11, seed=6)
    counts = [4, 6, 0]
    outputs = generate_batch(model, prompts, counts, block_size=2)
    for prompt, count, output in zip(prompts, counts, outputs, strict=True):
        assert torch.equal(output, model.generate(prompt[None], count)[0])


def test_a_mixer_whose_state_cannot_be_batched_is_refused_with_a_clear_error():
    from model_variants import CausalMean, RunningSum

    class Unstackable(RunningSum):
        stack = None  # a state a server cannot batch

    class Mixer(CausalMean):
        def new_cache(self, max_length):
            return Unstackable()

    model = variant("hybrid")
    model.blocks[0].attention = model.blocks[0].mixer = Mixer(16)
    with pytest.raises(ValueError, match="block 0's mixer is a Mixer, whose cache .a Unstackable. "
                                         "has no stack"):
        generate_batch(model.eval(), [torch.tensor([1, 2])], 2)


def test_a_hybrid_step_checks_the_states_before_it_reserves_blocks():
    model = variant("gated deltanet hybrid")
    cache = _paged_cache_for(model)
    cache.add_sequence("a")
    with pytest.raises(TypeError, match="1 recurrent layer.*pass states="):
        paged_forward(model, cache, ["a"], torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="states holds nothing for sequence 'b'"):
        cache.add_sequence("b")
        paged_forward(model, cache, ["a", "b"], torch.tensor([[1], [2]]),
                      states={"a": new_sequence_states(model)})
    states = {"a": new_sequence_states(model)}
    paged_forward(model, cache, ["a"], torch.tensor([[1, 2, 3]]), states=states)
    stale = {"a": new_sequence_states(model)}  # has read nothing; the pool holds 3 tokens
    with pytest.raises(ValueError, match=r"have read \[0\] tokens but the pool holds 3"):
        paged_forward(model, cache, ["a"], torch.tensor([[4]]), states=stale)
    assert cache.length("a") == 3 and cache.blocks_in_use == 1  # nothing was reserved


def test_serving_has_no_layer_code_of_its_own():
    """paged_forward runs the model's own forward: serving.py touches no projection, norm or MLP."""
    import ast
    import inspect

    from attention_book import serving

    tree = ast.parse(inspect.getsource(serving))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    used |= {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    layer_code = {"W_query", "W_key", "W_value", "W_down_kv", "out_proj", "attention_norm",
                  "mlp", "mlp_norm", "final_norm", "token_embedding", "position_embedding",
                  "embedding_dropout", "attention_dropout", "rotary_embedding", "layer_norm",
                  "LayerNorm", "Linear", "gelu", "GELU", "linear", "_forward"}
    assert used & layer_code == set()
    # What serving reads of a model: its sizes, its mode and its blocks' attention settings.
    read_on_model = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name) and node.value.id == "model"}
    assert read_on_model <= {"training", "blocks", "vocab_size", "context_length", "parameters"}


def test_a_pool_of_keys_only_holds_latents_and_refuses_values():
    cache = PagedKVCache(4, 2, 1, 6, store_values=False)
    assert cache.value_blocks is None and not cache.store_values
    assert cache.block_nbytes == 2 * 6 * 4  # keys alone: half the bytes of a block
    cache.add_sequence("a")
    latents = torch.randn(1, 3, 6)  # (1, T, latent_dim)
    cache.append("a", latents, None)
    keys, values = cache.gather("a")
    assert torch.equal(keys, latents) and values is None
    with pytest.raises(ValueError, match=r"stores keys only \(store_values=False\): pass values=None"):
        cache.append("a", latents, latents)
    with pytest.raises(ValueError, match="stores keys only"):
        paged_attention(torch.zeros(1, 1, 1, 6), cache, ["a"])
    both = PagedKVCache(4, 2, 1, 6)
    both.add_sequence("a")
    with pytest.raises(ValueError, match="stores keys and values: pass both"):
        both.append("a", latents, None)
    with pytest.raises(TypeError, match="store_values must be a bool"):
        PagedKVCache(4, 2, 1, 6, store_values=0)
    model = variant("latent")
    with pytest.raises(ValueError, match="need a cache with store_values=False"):
        paged_forward(model, PagedKVCache(4, 2, 1, 6, num_layers=2, dtype=torch.float64),
                      [], torch.zeros(0, 1, dtype=torch.long))
