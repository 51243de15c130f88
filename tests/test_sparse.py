"""Chapter 19: top-k attention, the lightning indexer, its distillation loss and the
block-sparse FlexAttention version."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attention_book as ab
from attention_book.sparse import (
    LightningIndexer,
    block_topk_attention,
    block_topk_mask,
    indexer_distillation_loss,
    lightning_indexer_scores,
    topk_attention,
    topk_mask,
)


def _masked_dense(query, key, value, allowed):
    """Dense attention with -inf outside ``allowed`` (B, T_q, T_k); an empty row gives 0."""
    group = query.size(1) // key.size(1)
    key = key.repeat_interleave(group, dim=1)  # (B, H, T_k, d)
    value = value.repeat_interleave(group, dim=1)  # (B, H, T_k, d_v)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T_q, T_k)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty row: 0, not NaN
    return weights @ value  # (B, H, T_q, d_v)


def _reference_choice(scores, top_k, is_causal):
    """The chosen keys by a loop: sort by (-score, position), keep the first top_k candidates."""
    batch_size, num_queries, num_keys = scores.shape
    chosen = torch.zeros(scores.shape, dtype=torch.bool)
    for b in range(batch_size):
        for i in range(num_queries):
            last = i + num_keys - num_queries if is_causal else num_keys - 1
            candidates = [j for j in range(num_keys)
                          if j <= last and scores[b, i, j] != float("-inf")]
            candidates.sort(key=lambda j, b=b, i=i: (-float(scores[b, i, j]), j))
            for j in candidates[:top_k]:
                chosen[b, i, j] = True
    return chosen


def _qkv(batch_size, num_heads, num_kv_heads, num_queries, num_keys, head_dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch_size, num_heads, num_queries, head_dim, generator=generator)
    key = torch.randn(batch_size, num_kv_heads, num_keys, head_dim, generator=generator)
    value = torch.randn(batch_size, num_kv_heads, num_keys, head_dim + 1, generator=generator)
    return query, key, value


# --------------------------------------------------------------------------- top-k attention


@settings(max_examples=40, deadline=None)
@given(num_queries=st.integers(1, 7), extra_keys=st.integers(0, 5), top_k=st.integers(1, 14),
       group=st.sampled_from([1, 2, 3]), ties=st.booleans(), is_causal=st.booleans(),
       seed=st.integers(0, 10_000))
def test_topk_attention_is_dense_attention_outside_the_chosen_keys(
        num_queries, extra_keys, top_k, group, ties, is_causal, seed):
    num_keys = num_queries + extra_keys
    query, key, value = _qkv(2, 2 * group, 2, num_queries, num_keys, 4, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    scores = torch.randn(2, num_queries, num_keys, generator=generator)
    if ties:  # few distinct values: the boundary is often a tie
        scores = scores.round()
    output, indices = topk_attention(query, key, value, scores, top_k, is_causal=is_causal,
                                     return_indices=True)
    chosen = _reference_choice(scores, top_k, is_causal)
    assert torch.equal(topk_mask(scores, top_k, is_causal=is_causal), chosen)
    torch.testing.assert_close(output, _masked_dense(query, key, value, chosen))
    k = min(top_k, num_keys)
    assert indices.shape == (2, num_queries, k) and indices.dtype == torch.long
    for b in range(2):
        for i in range(num_queries):
            expected = chosen[b, i].nonzero().flatten().tolist()
            assert indices[b, i].tolist() == expected + [-1] * (k - len(expected))


def test_ties_go_to_the_earlier_position():
    scores = torch.zeros(1, 4, 4)  # every score equal
    assert topk_mask(scores, 2)[0].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, False, False],
        [True, True, False, False],
    ]


@pytest.mark.parametrize("num_queries,num_keys", [(6, 6), (2, 9)])
def test_topk_with_k_at_least_the_visible_keys_is_dense_causal_attention(num_queries, num_keys):
    query, key, value = _qkv(2, 4, 2, num_queries, num_keys, 8)
    scores = torch.randn(2, num_queries, num_keys)
    dense = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1),
        attn_mask=ab.causal_mask(num_queries, num_keys))  # bottom-right
    for top_k in (num_keys, num_keys + 5):
        torch.testing.assert_close(topk_attention(query, key, value, scores, top_k), dense)


def test_minus_infinity_is_never_chosen_and_an_empty_query_gets_zeros():
    query, key, value = _qkv(1, 2, 2, 3, 3, 4)
    scores = torch.full((1, 3, 3), float("-inf"))
    scores[0, 2, 1] = 0.0
    output, indices = topk_attention(query, key, value, scores, 2, return_indices=True)
    assert indices[0].tolist() == [[-1, -1], [-1, -1], [1, -1]]
    assert torch.equal(output[:, :, :2], torch.zeros_like(output[:, :, :2]))
    torch.testing.assert_close(output[:, :, 2], value[:, :, 1])  # one key: its value


def test_the_selection_passes_no_gradient_but_the_chosen_keys_do():
    query, key, value = _qkv(1, 2, 1, 5, 5, 4)
    for tensor in (query, key, value):
        tensor.requires_grad_(True)
    scores = torch.randn(1, 5, 5, requires_grad=True)
    output = topk_attention(query, key, value, scores, 2)
    assert output.grad_fn is not None
    grads = torch.autograd.grad(output.square().sum(), (query, key, value, scores),
                                allow_unused=True)
    assert grads[3] is None  # nothing reaches the index scores
    chosen = topk_mask(scores.detach(), 2)
    expected = torch.autograd.grad(
        _masked_dense(query, key, value, chosen).square().sum(), (query, key, value))
    for got, want in zip(grads[:3], expected, strict=True):
        torch.testing.assert_close(got, want)


def test_topk_attention_in_blocks_of_queries_matches_one_block(monkeypatch):
    from attention_book import sparse
    query, key, value = _qkv(1, 2, 2, 40, 40, 4)
    scores = torch.randn(1, 40, 40)
    whole = topk_attention(query, key, value, scores, 5)
    monkeypatch.setattr(sparse, "_GATHER_BUDGET", 1)  # one query row per step
    monkeypatch.setattr(sparse, "_SCORE_BUDGET", 1)
    torch.testing.assert_close(topk_attention(query, key, value, scores, 5), whole)
    assert torch.equal(topk_mask(scores, 5), sparse.topk_mask(scores, 5))


# --------------------------------------------------------------------------- the indexer


def test_indexer_scores_are_the_formula_by_a_loop():
    generator = torch.Generator().manual_seed(0)
    index_queries = torch.randn(2, 3, 4, 5, generator=generator)  # (B, T_q, H_I, d_I)
    index_keys = torch.randn(2, 6, 5, generator=generator)  # (B, T_k, d_I)
    head_weights = torch.randn(2, 3, 4, generator=generator)  # (B, T_q, H_I)
    scores = lightning_indexer_scores(index_queries, index_keys, head_weights)
    assert scores.shape == (2, 3, 6)
    for b in range(2):
        for t in range(3):
            for s in range(6):
                expected = sum(float(head_weights[b, t, j])
                               * max(0.0, float(index_queries[b, t, j] @ index_keys[b, s]))
                               for j in range(4))
                assert abs(float(scores[b, t, s]) - expected) < 1e-5


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class _RecordMatmuls(TorchFunctionMode):
    """Keeps the result of every torch.matmul called inside it."""

    def __init__(self):
        super().__init__()
        self.results = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func is torch.matmul:
            self.results.append(result)
        return result


@pytest.fixture(scope="module")
def hf_indexer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer
    config = transformers.DeepseekV32Config(
        hidden_size=32, q_lora_rank=32, index_n_heads=4, index_head_dim=16,
        qk_rope_head_dim=8, index_topk=5)
    torch.manual_seed(0)
    indexer = DeepseekV32Indexer(config, layer_idx=0).eval()
    with torch.no_grad():  # a non-trivial LayerNorm
        indexer.k_norm.weight.uniform_(0.5, 1.5)
        indexer.k_norm.bias.uniform_(-0.2, 0.2)
    return indexer


def _hf_scores(indexer, hidden, cos, sin):
    """HF's index scores: the last matmul of its forward (weights @ ReLU scores, before HF
    applies the mask), and the top-k positions the forward returns."""
    mask = ab.causal_mask(hidden.size(1))[None]  # (1, T, T), True = visible
    recorder = _RecordMatmuls()
    with recorder:
        top = indexer(hidden, hidden, (cos, sin), mask, None)
    return recorder.results[-1].squeeze(-2), top  # (B, T, T), (B, T, topk)


def test_indexer_equals_hugging_face_deepseek_v32_on_copied_weights(hf_indexer):
    """Our formula on HF's rotated queries and keys equals HF's scores (RoPE included), and
    LightningIndexer with HF's weights equals HF with the rotation switched off (cos 1, sin 0)."""
    torch.manual_seed(1)
    batch_size, num_tokens, rope_dim = 2, 7, hf_indexer.qk_rope_head_dim
    hidden = torch.randn(batch_size, num_tokens, 32)
    # Half-split RoPE at positions 0..T-1 (base 10000) on the first rope_dim features.
    inverse = 1.0 / 10000 ** (torch.arange(0, rope_dim, 2).float() / rope_dim)
    angles = torch.arange(num_tokens).float()[:, None] * inverse  # (T, rope_dim / 2)
    angles = torch.cat((angles, angles), dim=-1).expand(batch_size, -1, -1)  # (B, T, rope_dim)
    cos, sin = angles.cos(), angles.sin()
    hf_scores, hf_top = _hf_scores(hf_indexer, hidden, cos, sin)

    num_heads, head_dim = hf_indexer.n_heads, hf_indexer.head_dim
    with torch.no_grad():
        queries = hf_indexer.wq_b(hidden).view(batch_size, num_tokens, num_heads, head_dim)
        keys = hf_indexer.k_norm(hf_indexer.wk(hidden))  # (B, T, d_I)
        c, s = cos[:, :, None], sin[:, :, None]
        queries = torch.cat((queries[..., :rope_dim] * c + _rotate_half(queries[..., :rope_dim]) * s,
                             queries[..., rope_dim:]), dim=-1)
        keys = torch.cat((keys[..., :rope_dim] * cos + _rotate_half(keys[..., :rope_dim]) * sin,
                          keys[..., rope_dim:]), dim=-1)
        weights = hf_indexer.weights_proj(hidden)  # (B, T, H_I)
        ours = lightning_indexer_scores(queries, keys, weights) * (head_dim * num_heads) ** -0.5
    torch.testing.assert_close(ours, hf_scores)
    chosen = topk_mask(ours, 5)
    for b in range(batch_size):
        for t in range(num_tokens):
            hf_set = {int(i) for i in hf_top[b, t] if int(i) <= t}  # HF pads with masked keys
            assert hf_set == set(chosen[b, t].nonzero().flatten().tolist())

    module = LightningIndexer(32, num_heads, head_dim)
    with torch.no_grad():
        module.W_query.weight.copy_(hf_indexer.wq_b.weight)
        module.W_key.weight.copy_(hf_indexer.wk.weight)
        module.key_norm.load_state_dict(hf_indexer.k_norm.state_dict())
        module.key_norm.eps = hf_indexer.k_norm.eps
        module.W_weights.weight.copy_(hf_indexer.weights_proj.weight)
        plain_scores, _ = _hf_scores(hf_indexer, hidden, torch.ones_like(cos), torch.zeros_like(sin))
        torch.testing.assert_close(module(hidden), plain_scores)


def test_lightning_indexer_reads_keys_from_a_context():
    torch.manual_seed(0)
    module = LightningIndexer(8, 2, 4)
    x, context = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    assert module(x).shape == (2, 3, 3)
    scores = module(x, context)
    assert scores.shape == (2, 3, 5)
    torch.testing.assert_close(module(x, x), module(x))
    # A query's score of a key does not depend on the other keys.
    torch.testing.assert_close(module(x, context[:, 1:4]), scores[:, :, 1:4])


# --------------------------------------------------------------------------- distillation


def test_distillation_loss_is_zero_at_the_target_and_trains_only_the_indexer():
    torch.manual_seed(0)
    attn = torch.softmax(torch.randn(2, 3, 4, 4).masked_fill(~ab.causal_mask(4), float("-inf")), -1)
    target = attn.sum(dim=1) / 3  # (B, T, T): summed over heads, normalised
    at_target = target.clamp_min(1e-30).log()
    loss = indexer_distillation_loss(at_target, attn)
    assert abs(float(loss)) < 1e-6
    attn = attn.requires_grad_(True)
    scores = torch.randn(2, 4, 4, requires_grad=True)
    loss = indexer_distillation_loss(scores, attn)
    assert float(loss.detach()) > 0
    grads = torch.autograd.grad(loss, (scores, attn), allow_unused=True)
    assert grads[0] is not None and grads[1] is None  # the main attention is the teacher
    # Future keys take no gradient: they are outside both distributions.
    assert torch.equal(grads[0].masked_select(~ab.causal_mask(4)[None].expand(2, 4, 4)),
                       torch.zeros(2 * 6))


def test_distillation_loss_by_hand_and_restricted_to_the_chosen_keys():
    attn = torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]])  # (1, 1, 2, 2)
    scores = torch.tensor([[[0.0, 5.0], [0.0, 0.0]]])
    # Row 0 sees one key: KL 0. Row 1: KL((1/4, 3/4) || (1/2, 1/2)).
    row1 = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert abs(float(indexer_distillation_loss(scores, attn)) - row1 / 2) < 1e-6
    selected = torch.tensor([[[True, False], [False, True]]])
    assert abs(float(indexer_distillation_loss(scores, attn, selected=selected))) < 1e-6


# --------------------------------------------------------------------------- block-sparse


@pytest.mark.parametrize("top_k_blocks", [1, 2, 4])
def test_block_topk_attention_is_dense_attention_with_its_mask(top_k_blocks):
    from torch.nn.attention.flex_attention import create_mask
    query, key, value = _qkv(1, 4, 2, 40, 40, 8)
    value = value[..., :8].contiguous()
    scores = torch.randn(1, 40, 40)
    block_mask = block_topk_mask(scores, top_k_blocks, block_size=8)
    dense_mask = create_mask(block_mask.mask_mod, 1, 1, 40, 40)[:, 0]  # (1, T, T)
    output = block_topk_attention(query, key, value, scores, top_k_blocks, block_size=8)
    torch.testing.assert_close(output, _masked_dense(query, key, value, dense_mask))
    # Each query block keeps its diagonal block causally and top_k_blocks - 1 earlier blocks.
    tiles = dense_mask[0].view(5, 8, 5, 8).any(dim=(1, 3))  # (query block, key block)
    assert torch.equal(tiles.sum(dim=1), torch.arange(5).clamp_max(top_k_blocks - 1) + 1)
    assert not (dense_mask & ~ab.causal_mask(40)).any()
    if top_k_blocks >= 5:
        assert torch.equal(dense_mask[0], ab.causal_mask(40))


def test_block_topk_picks_the_blocks_with_the_best_pooled_score():
    scores = torch.zeros(1, 32, 32)
    scores[0, 30, 3] = 9.0  # query block 3 likes key block 0
    scores[0, 20, 9] = 9.0  # query block 2 likes key block 1
    tiles = block_topk_mask(scores, 2, block_size=8).to_dense()[0, 0]  # (4, 4) kept tiles
    assert tiles.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 1]]


def _tiles_the_long_way(scores, top_k_blocks, block_size):
    """The kept tiles built as the mask was before issue 43: mask the future of the whole
    (B, T, T) scores, pad them to whole tiles, pool each tile, rank the earlier tiles."""
    batch_size, num_tokens, _ = scores.shape
    num_blocks = -(-num_tokens // block_size)
    padded = num_blocks * block_size
    masked = scores.masked_fill(~ab.causal_mask(num_tokens), float("-inf"))  # (B, T, T)
    masked = torch.nn.functional.pad(masked, (0, padded - num_tokens, 0, padded - num_tokens),
                                     value=float("-inf"))  # (B, T', T')
    pooled = masked.view(batch_size, num_blocks, block_size, num_blocks, block_size).amax(
        dim=(2, 4))  # (B, n, n)
    kept = torch.eye(num_blocks, dtype=torch.bool).repeat(batch_size, 1, 1)  # (B, n, n)
    for b in range(batch_size):
        for i in range(num_blocks):
            earlier = [j for j in range(i) if pooled[b, i, j] > float("-inf")]
            earlier.sort(key=lambda j, b=b, i=i: (-float(pooled[b, i, j]), j))
            for j in earlier[:top_k_blocks - 1]:
                kept[b, i, j] = True
    return kept


@pytest.mark.parametrize("num_tokens,block_size", [(1, 4), (9, 4), (40, 8), (45, 8),
                                                   (130, 16), (7, 16)])
@pytest.mark.parametrize("top_k_blocks", [1, 2, 3, 9])
def test_block_topk_mask_equals_the_mask_built_from_the_whole_scores(num_tokens, block_size,
                                                                      top_k_blocks):
    from torch.nn.attention.flex_attention import create_mask
    generator = torch.Generator().manual_seed(num_tokens * 10 + top_k_blocks)
    scores = torch.randn(2, num_tokens, num_tokens, generator=generator).round()  # many ties
    scores[1, num_tokens // 2:, : num_tokens // 3] = float("-inf")  # tiles never chosen
    block_mask = block_topk_mask(scores, top_k_blocks, block_size=block_size, num_heads=3)
    kept = _tiles_the_long_way(scores, top_k_blocks, block_size)  # (B, n, n)
    assert torch.equal(block_mask.to_dense().bool(), kept[:, None].expand(-1, 3, -1, -1))
    # The diagonal tiles are the partial ones (the causal rule runs there); the rest are full.
    assert block_mask.kv_num_blocks.eq(1).all()
    assert torch.equal(block_mask.full_kv_num_blocks, (kept.sum(dim=-1) - 1)[:, None]
                       .expand(-1, 3, -1).to(torch.int32))
    expected = kept.repeat_interleave(block_size, 1).repeat_interleave(block_size, 2)[
        :, :num_tokens, :num_tokens] & ab.causal_mask(num_tokens)  # (B, T, T)
    assert torch.equal(create_mask(block_mask.mask_mod, 2, 3, num_tokens, num_tokens),
                       expected[:, None].expand(-1, 3, -1, -1))


class _NewStorages(TorchDispatchMode):
    """Records the largest storage that any operation creates (views and in-place results,
    which share an input's storage, do not count)."""

    def __init__(self):
        super().__init__()
        self.largest, self.made_by = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        inputs = {tensor.untyped_storage().data_ptr() for tensor in _tensors((args, kwargs))}
        for tensor in _tensors(output):
            size = tensor.untyped_storage().nbytes()
            if tensor.untyped_storage().data_ptr() not in inputs and size > self.largest:
                self.largest, self.made_by = size, f"{func} {tuple(tensor.shape)}"
        return output


def _tensors(tree):
    return [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]


@pytest.mark.parametrize("num_tokens,num_heads", [(2048, None), (2000, 4)])
def test_block_topk_mask_allocates_nothing_the_size_of_the_scores(num_tokens, num_heads):
    # Issue 43: the mask took 2.3 GiB at T = 16384 (a masked and a padded copy of the scores
    # and a T x T causal mask). Now the largest new tensor is a table of the n x n tiles.
    scores = torch.randn(2, num_tokens, num_tokens)  # (B, T, T): 32 MiB
    num_blocks = -(-num_tokens // 128)
    with _NewStorages() as recorder:
        block_mask = block_topk_mask(scores, 3, block_size=128, num_heads=num_heads)
    table_bytes = 8 * 2 * (num_heads or 1) * num_blocks * num_blocks  # int64 (B, heads, n, n)
    assert recorder.largest <= table_bytes, recorder.made_by
    assert int(block_mask.to_dense()[0, 0].sum()) == 1 + 2 + 3 * (num_blocks - 2)


def test_block_topk_mask_peak_memory_is_small_in_the_process():
    # The storages above are what the operations return; this measures the process itself
    # (buffers inside a kernel count too): the peak resident memory across one call.
    from attention_book.benchmark import _rss_growth_mib
    scores = torch.randn(1, 4096, 4096)  # 64 MiB
    block_topk_mask(scores, 2)  # the first call loads code and warms the allocator
    assert _rss_growth_mib(lambda: block_topk_mask(scores, 2)) < 8


# --------------------------------------------------------------------------- bad input


def test_bad_input_names_the_sizes():
    query, key, value = _qkv(1, 4, 2, 3, 5, 8)
    scores = torch.randn(1, 3, 5)
    with pytest.raises(ValueError, match=r"top_k must be >= 1.*got 0"):
        topk_attention(query, key, value, scores, 0)
    with pytest.raises(TypeError, match="top_k must be an int, got float"):
        topk_attention(query, key, value, scores, 2.0)
    with pytest.raises(TypeError, match="top_k must be an int, got bool"):
        topk_attention(query, key, value, scores, True)
    with pytest.raises(ValueError, match=r"\(B, T_q, T_k\) = \(1, 3, 5\).*got shape \(1, 5, 3\)"):
        topk_attention(query, key, value, scores.transpose(1, 2), 2)
    with pytest.raises(ValueError, match=r"got shape \(2, 3, 5\)"):
        topk_attention(query, key, value, torch.randn(2, 3, 5), 2)
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of the key/value "
                                         r"heads \(3\)"):
        topk_attention(query, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), scores, 2)
    with pytest.raises(ValueError, match="same head_dim: query has 8"):
        topk_attention(query, key[..., :4], value, scores, 2)
    with pytest.raises(ValueError, match="NaN"):
        topk_attention(query, key, value, torch.full((1, 3, 5), float("nan")), 2)
    with pytest.raises(TypeError):
        topk_attention(query, key, value, scores.long(), 2)
    with pytest.raises(ValueError, match="top_k_blocks must be >= 1"):
        block_topk_mask(torch.randn(1, 8, 8), 0)
    with pytest.raises(ValueError, match=r"T_q == T_k.*\(1, 3, 5\)"):
        block_topk_mask(scores, 2)
    future_nan = torch.zeros(1, 8, 8)
    future_nan[0, 1, 6] = float("nan")  # in a future tile, which the pooling never reads
    with pytest.raises(ValueError, match="NaN"):
        block_topk_mask(future_nan, 2, block_size=4)
    with pytest.raises(ValueError, match=r"index_keys must have shape \(B, T_k, d_I\) = "
                                         r"\(1, T_k, 4\).*got \(1, 6, 3\)"):
        lightning_indexer_scores(torch.randn(1, 2, 3, 4), torch.randn(1, 6, 3), torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match=r"head_weights must have shape \(B, T_q, H_I\) = "
                                         r"\(1, 2, 3\).*got \(1, 2, 4\)"):
        lightning_indexer_scores(torch.randn(1, 2, 3, 4), torch.randn(1, 6, 4), torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match=r"index_queries must have shape \(B, T_q, H_I, d_I\)"):
        lightning_indexer_scores(torch.randn(2, 3, 4), torch.randn(1, 6, 4), torch.randn(1, 2, 4))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, d_model=8\)"):
        LightningIndexer(8, 2, 4)(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match=r"selected must have shape \(B, T_q, T_k\) = \(1, 3, 5\)"):
        indexer_distillation_loss(scores, torch.rand(1, 2, 3, 5),
                                  selected=torch.ones(1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"index_scores must have shape \(B, T_q, T_k\) = "
                                         r"\(1, 3, 5\)"):
        indexer_distillation_loss(scores[:, :2], torch.rand(1, 2, 3, 5))


# --------------------------------------------------------------------------- the output gate


def test_output_gate_shapes_gradients_and_cache():
    torch.manual_seed(0)
    layer = ab.MultiHeadAttention(8, 8, 2, context_length=6, output_gate=True)
    assert tuple(layer.W_gate.weight.shape) == (8, 8) and layer.W_gate.bias is None
    x = torch.randn(2, 6, 8, requires_grad=True)
    output = layer(x)
    assert output.shape == (2, 6, 8)
    output.square().sum().backward()
    assert layer.W_gate.weight.grad is not None and bool(layer.W_gate.weight.grad.abs().sum() > 0)
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    with torch.no_grad():  # the gate by hand: merged heads times sigmoid(W_gate x)
        plain = ab.MultiHeadAttention(8, 8, 2, context_length=6)
        plain.load_state_dict({k: v for k, v in layer.state_dict().items() if "W_gate" not in k})
        captured = {}
        plain.out_proj.register_forward_pre_hook(lambda m, args: captured.update(c=args[0]))
        plain(x)
        expected = layer.out_proj(captured["c"] * torch.sigmoid(layer.W_gate(x)))
        torch.testing.assert_close(layer(x), expected)
        cache = ab.KVCache(6)
        steps = torch.cat([layer(x[:, t:t + 1], kv_cache=cache) for t in range(6)], dim=1)
        torch.testing.assert_close(steps, layer(x))
    model = ab.TinyGPT(11, 8, 2, 2, 6, output_gate=True)
    assert all(block.attention.W_gate is not None for block in model.blocks)
    tokens = torch.randint(11, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model.generate(tokens[:, :2], 4, use_cache=True),
                                   model.generate(tokens[:, :2], 4, use_cache=False))
    with pytest.raises(TypeError, match="output_gate must be a bool, got int"):
        ab.MultiHeadAttention(8, 8, 2, output_gate=1)
