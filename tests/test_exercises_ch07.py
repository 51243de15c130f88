"""Chapter 7's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attention_book import GroupedQueryAttention, MultiHeadAttention
from attention_book.exercises import check_load_c_attn, check_mha_to_gqa, check_multi_head_cross_attention


def _fails(checker, answer, *fragments, capsys):
    assert checker(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("Not yet."), out
    for fragment in fragments:
        assert fragment in out, out
    return out


# --- 7.1 cross-attention -------------------------------------------------------------------


def _cross_attention_class(mistake=None):
    """A MultiHeadCrossAttention, right (mistake=None) or with one typical mistake."""

    class CrossAttention(nn.Module):
        def __init__(self, d_out, d_kv, num_heads, qkv_bias=False):
            super().__init__()
            self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
            self.W_query = nn.Linear(d_out, d_out, bias=qkv_bias)
            self.W_key = nn.Linear(d_kv, d_out, bias=qkv_bias)
            self.W_value = nn.Linear(d_kv, d_out, bias=qkv_bias)
            self.out_proj = nn.Linear(d_out, d_out)

        def split(self, x, num_tokens):
            batch = x.shape[0]
            if mistake == "bare view split":
                return x.view(batch, self.num_heads, num_tokens, self.head_dim)
            return x.view(batch, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

        def forward(self, x_q, x_kv, mask=None):
            batch, num_queries, _ = x_q.shape
            source = x_q if mistake == "self attention" else x_kv
            num_keys = num_queries if mistake == "query length" else source.shape[1]
            queries = self.split(self.W_query(x_q), num_queries)
            keys = self.split(self.W_key(source), num_keys)
            values = self.split(self.W_value(source), num_keys)
            scale = math.sqrt(self.d_out if mistake == "scale d_out" else self.head_dim)
            scores = queries @ keys.transpose(-2, -1) / scale
            if mistake == "causal":
                future = torch.ones(num_queries, keys.shape[2], dtype=torch.bool).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            if mask is not None and mistake != "mask ignored":
                blocked = mask if mistake == "mask inverted" else ~mask
                scores = scores.masked_fill(blocked, float("-inf"))
            weights = torch.softmax(scores, dim=-2 if mistake == "softmax dim" else -1)
            context = weights @ values  # (B, num_heads, T_q, head_dim)
            if mistake == "view merge":
                merged = context.reshape(batch, num_queries, self.d_out)
            else:
                merged = context.transpose(1, 2).reshape(batch, num_queries, self.d_out)
            output = merged if mistake == "no out_proj" else self.out_proj(merged)
            if mistake == "only output":
                return output
            return output, weights

    return CrossAttention


def test_cross_attention_accepts_the_right_answer(capsys):
    assert check_multi_head_cross_attention(_cross_attention_class()) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct:") and "nn.MultiheadAttention" in out


@pytest.mark.parametrize(("mistake", "fragments"), [
    ("self attention", ["the keys and values come from x_kv", "Only the queries come from x_q"]),
    ("query length", ["differ in length or width", "belong to x_kv"]),
    ("scale d_out", ["scaled by 1 / sqrt(head_dim)", "not of d_out"]),
    ("causal", ["no causal mask", "every token of x_q may look at every token of x_kv"]),
    ("mask inverted", ["keeps the keys where it is True", "True means 'may attend'"]),
    ("mask ignored", ["the mask is applied", "Use the mask argument"]),
    ("softmax dim", ["each query's weights sum to 1", "runs over the keys"]),
    ("bare view split", ["the values of attn_weights", "head split"]),
    ("no out_proj", ["goes through out_proj", "The weights are right"]),
    ("view merge", ["one token's heads side by side", "merged without moving"]),
    ("only output", ["returns the pair (output, attn_weights)", "Return the output and the weights"]),
])
def test_cross_attention_explains_typical_mistakes(mistake, fragments, capsys):
    out = _fails(check_multi_head_cross_attention, _cross_attention_class(mistake), *fragments, capsys=capsys)
    assert out.count("hint:") == 1


def test_cross_attention_wants_the_class(capsys):
    _fails(check_multi_head_cross_attention, _cross_attention_class()(8, 8, 2), "Pass the class itself",
           capsys=capsys)


def test_cross_attention_not_written_yet(capsys):
    class Blank(_cross_attention_class()):
        def forward(self, x_q, x_kv, mask=None):
            raise NotImplementedError()

    _fails(check_multi_head_cross_attention, Blank, "You have not written `forward` yet", capsys=capsys)


def test_cross_attention_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check_multi_head_cross_attention(_cross_attention_class())
    assert torch.equal(torch.rand(3), expected)


# --- 7.2 fused c_attn ------------------------------------------------------------------------


def _loader(mistake=None):
    def load_c_attn(mha, c_attn_weight, c_attn_bias):
        d_out = mha.d_out
        dim = 0 if mistake == "split rows" else 1
        weights = list(c_attn_weight.split(d_out, dim=dim))
        biases = list(c_attn_bias.split(d_out))
        if mistake == "order":
            weights[0], weights[1] = weights[1], weights[0]
        if mistake == "value bias":
            biases[2] = biases[1]
        if mistake == "no transpose":
            weights = [w.T for w in weights]
        if mistake == "no_grad":
            mha.W_query.weight.copy_(weights[0].T)
        with torch.no_grad():
            for name, weight, bias in zip(("W_query", "W_key", "W_value"), weights, biases,
                                          strict=True):
                getattr(mha, name).weight.copy_(weight.T)
                getattr(mha, name).bias.copy_(bias)

    return load_c_attn


def load_c_attn_by_assignment(mha, c_attn_weight, c_attn_bias):
    for name, weight, bias in zip(("W_query", "W_key", "W_value"),
                                  c_attn_weight.split(mha.d_out, dim=1),
                                  c_attn_bias.split(mha.d_out), strict=True):
        getattr(mha, name).weight = nn.Parameter(weight.T.contiguous())
        getattr(mha, name).bias = nn.Parameter(bias.clone())


@pytest.mark.parametrize("answer", [_loader(), load_c_attn_by_assignment])
def test_load_c_attn_accepts_right_answers(answer, capsys):
    assert check_load_c_attn(answer) is True
    assert capsys.readouterr().out.startswith("Correct:")


@pytest.mark.parametrize(("mistake", "fragments"), [
    ("no transpose", ["in nn.Linear's layout", "(out_features, in_features)"]),
    ("order", ["the queries' third", "in that order"]),
    ("value bias", ["mha.W_value.bias is its third", "the keys' third", "its own third"]),
    ("no_grad", ["torch.no_grad()"]),
    ("split rows", ["A slice does not fit the parameter"]),
])
def test_load_c_attn_explains_typical_mistakes(mistake, fragments, capsys):
    _fails(check_load_c_attn, _loader(mistake), *fragments, capsys=capsys)


def test_load_c_attn_that_does_nothing(capsys):
    _fails(check_load_c_attn, lambda mha, weight, bias: None, "is its third of c_attn",
           capsys=capsys)


# --- 7.3 multi-head to grouped-query -----------------------------------------------------------


def _converter(mistake=None):
    def mha_to_gqa(mha, num_kv_heads):
        bias = mha.W_query.bias is not None
        gqa = GroupedQueryAttention(mha.d_in, mha.d_out, mha.num_heads, num_kv_heads,
                                    qkv_bias=bias,
                                    causal=not mha.causal if mistake == "causal" else mha.causal)
        group_size = mha.num_heads // num_kv_heads

        def pool(tensor):
            rest = tensor.shape[1:]
            if mistake == "tiled":
                grouped = tensor.reshape(group_size, num_kv_heads, mha.head_dim, *rest)
                return grouped.mean(0).reshape(num_kv_heads * mha.head_dim, *rest)
            grouped = tensor.reshape(num_kv_heads, group_size, mha.head_dim, *rest)
            pooled = {"first": grouped[:, 0], "sum": grouped.sum(1)}.get(mistake, grouped.mean(1))
            return pooled.reshape(num_kv_heads * mha.head_dim, *rest)

        with torch.no_grad():
            if mistake != "queries":
                gqa.W_query.load_state_dict(mha.W_query.state_dict())
            gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
            for name in ("W_key", "W_value"):
                getattr(gqa, name).weight.copy_(pool(getattr(mha, name).weight))
                if bias and mistake != "bias":
                    getattr(gqa, name).bias.copy_(pool(getattr(mha, name).bias))
            if mistake == "in place":
                mha.W_key.weight.zero_()
        return gqa

    return mha_to_gqa


def test_mha_to_gqa_accepts_the_right_answer(capsys):
    assert check_mha_to_gqa(_converter()) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct:") and "Ainslie" in out


@pytest.mark.parametrize(("mistake", "fragments"), [
    ("tiled", ["the heads of a group are consecutive", "neighbours"]),
    ("first", ["each new head is the mean of its group", "not one of them"]),
    ("sum", ["the mean of its group, not the sum", "Divide by the number of heads"]),
    ("bias", ["W_key.bias", "the values of"]),
    ("queries", ["W_query.weight is copied unchanged", "Only the keys and values are pooled"]),
    ("causal", ["keeps the causal setting", "Read causal"]),
    ("in place", ["mha is left unchanged", "Build a new layer"]),
])
def test_mha_to_gqa_explains_typical_mistakes(mistake, fragments, capsys):
    _fails(check_mha_to_gqa, _converter(mistake), *fragments, capsys=capsys)


def test_mha_to_gqa_wants_a_grouped_query_layer(capsys):
    _fails(check_mha_to_gqa, lambda mha, num_kv_heads: mha, "the result is a GroupedQueryAttention",
           capsys=capsys)


def test_pooled_layer_equals_the_original_when_nothing_is_shared():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 4, qkv_bias=True)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(_converter()(mha, 4)(x), mha(x))
