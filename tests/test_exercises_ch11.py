"""Chapter 11's checkers accept right answers, explain each typical wrong one, and cannot be
passed with the book's healthy code (classroom trial D11)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from checker_asserts import assert_fails, assert_passes
from hidden_tests import passes_hidden_tests
from torch import nn

import attention_book
from attention_book import bug_zoo
from attention_book.exercises import (
    check_fixed_blog_attention,
    check_leaks_future,
    check_padded_attention,
)

# --- 11.1 padded attention (bug hunt) --------------------------------------------------------


def padded_buggy(query, key, value, attention_mask):
    """The chapter's buggy function: a 0/1 float mask is added to the scores."""
    mask = attention_mask[:, None, :].float()  # (B, 1, T_k)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)


def padded_bool(query, key, value, attention_mask):
    return F.scaled_dot_product_attention(query, key, value,
                                          attn_mask=attention_mask[:, None, :].bool())


def padded_additive(query, key, value, attention_mask):
    bias = torch.where(attention_mask[:, None, :].bool(), 0.0, float("-inf"))
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias)


def padded_book(query, key, value, attention_mask):
    output, _ = attention_book.scaled_dot_product_attention(
        query, key, value, mask=attention_mask[:, None, :].bool())
    return output


def padded_inverted(query, key, value, attention_mask):
    return padded_bool(query, key, value, 1 - attention_mask)


def padded_times_inf(query, key, value, attention_mask):
    bias = (1.0 - attention_mask[:, None, :].float()) * float("-inf")
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias)


def padded_not_broadcast(query, key, value, attention_mask):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask.bool())


def padded_only_first_query(query, key, value, attention_mask):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    scores[:, 0] = scores[:, 0].masked_fill(attention_mask == 0, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


@pytest.mark.parametrize("answer", [padded_bool, padded_additive, padded_book])
def test_padded_right(answer, capsys):
    assert_passes(check_padded_attention, answer, capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (padded_buggy, "A float attn_mask is added to the scores"),
    (padded_inverted, "The polarity is inverted"),
    (padded_times_inf, "0 times -inf is NaN"),
    (padded_not_broadcast, "broadcasts to (B, T_q, T_k)"),
    (padded_only_first_query, "for every query of the sequence"),
])
def test_padded_wrong(answer, phrase, capsys):
    assert_fails(check_padded_attention, answer, capsys, phrase)


@pytest.mark.parametrize("copied", [bug_zoo.healthy_attention,
                                    attention_book.scaled_dot_product_attention])
def test_padded_cannot_be_passed_with_the_books_code(copied, capsys):
    assert check_padded_attention(copied) is False


# --- 11.2 leaks_future (property test) -------------------------------------------------------


def _moved(layer, num_tokens, j):
    torch.manual_seed(0)
    x = torch.randn(1, num_tokens, layer.d_in)
    changed = x.clone()
    changed[:, j] += 1.0
    return (layer(changed) - layer(x)).abs().amax(dim=-1)[0]  # (T,)


def leaks_right(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        for j in range(1, num_tokens):
            moved = _moved(layer, num_tokens, j)
            for i in range(j):
                if moved[i] > 1e-6:
                    return i, j
    return None


def leaks_in_training_mode(layer, num_tokens):
    with torch.no_grad():
        for j in range(1, num_tokens):
            moved = _moved(layer, num_tokens, j)
            for i in range(j):
                if moved[i] > 1e-6:
                    return i, j
    return None


def leaks_including_j(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        for j in range(num_tokens):
            moved = _moved(layer, num_tokens, j)
            for i in range(j + 1):
                if moved[i] > 1e-6:
                    return i, j
    return None


def leaks_loose(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        for j in range(1, num_tokens):
            moved = _moved(layer, num_tokens, j)
            for i in range(j):
                if moved[i] > 0.5:
                    return i, j
    return None


def leaks_swapped(layer, num_tokens):
    found = leaks_right(layer, num_tokens)
    return None if found is None else found[::-1]


def leaks_by_output_first(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        moves = {j: _moved(layer, num_tokens, j) for j in range(num_tokens)}
    for i in range(num_tokens):
        for j in range(i + 1, num_tokens):
            if moves[j][i] > 1e-6:
                return i, j
    return None


def leaks_last_token_only(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        moved = _moved(layer, num_tokens, num_tokens - 1)
    for i in range(num_tokens - 1):
        if moved[i] > 1e-6:
            return i, num_tokens - 1
    return None


def leaks_all(layer, num_tokens):
    layer.eval()
    with torch.no_grad():
        found = [(i, j) for j in range(num_tokens) for i in range(j)
                 if _moved(layer, num_tokens, j)[i] > 1e-6]
    return found or None


def leaks_from_the_end(layer, num_tokens):  # the recheck's weak test: j scanned from the end
    layer.eval()
    with torch.no_grad():
        for j in reversed(range(1, num_tokens)):
            moved = _moved(layer, num_tokens, j)
            for i in range(j):
                if moved[i] > 1e-6:
                    return i, j
    return None


def leaks_tiny_change(layer, num_tokens):  # the recheck's weak test: token j moved by 1e-4
    layer.eval()
    torch.manual_seed(0)
    x = torch.randn(1, num_tokens, layer.d_in)
    with torch.no_grad():
        base = layer(x)
        for j in range(1, num_tokens):
            changed = x.clone()
            changed[:, j] += 1e-4
            moved = (layer(changed) - base).abs().amax(dim=-1)[0]
            for i in range(j):
                if moved[i] > 1e-6:
                    return i, j
    return None


def leaks_tolerance_1e3(layer, num_tokens):  # a tolerance that hides a small leak
    layer.eval()
    with torch.no_grad():
        for j in range(1, num_tokens):
            moved = _moved(layer, num_tokens, j)
            for i in range(j):
                if moved[i] > 1e-3:
                    return i, j
    return None


def leaks_four_tokens(layer, num_tokens):  # its own input of 4 tokens, whatever num_tokens is
    return leaks_right(layer, min(num_tokens, 4))


def leaks_first_output_only(layer, num_tokens):  # looks only at output 0
    layer.eval()
    with torch.no_grad():
        for j in range(1, num_tokens):
            if _moved(layer, num_tokens, j)[0] > 1e-6:
                return 0, j
    return None


def leaks_returns_text(layer, num_tokens):
    return "leak" if leaks_right(layer, num_tokens) else None


def test_leaks_right(capsys):
    assert_passes(check_leaks_future, leaks_right, capsys)


def test_leaks_right_with_tensors_in_the_pair(capsys):
    def answer(layer, num_tokens):
        found = leaks_right(layer, num_tokens)
        return None if found is None else (torch.tensor(found[0]), torch.tensor(found[1]))

    assert_passes(check_leaks_future, answer, capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (leaks_in_training_mode, "put the layer in eval mode"),
    (leaks_including_j, "only i < j counts"),
    (leaks_loose, "a looser tolerance"),
    (leaks_swapped, "Return (i, j) in this order"),
    (leaks_by_output_first, "Scan the tokens j in increasing order"),
    (leaks_last_token_only, "a leak but not the first"),
    (leaks_all, "Return only the first leak"),
    (leaks_returns_text, "Return a tuple of two ints"),
    (lambda layer, num_tokens: (0, 1), "this layer cannot see the future"),
    (leaks_from_the_end, "a leak but not the first"),
    (leaks_tiny_change, "a leak but not the first"),
    (leaks_tolerance_1e3, "as small as 1e-4"),
    (leaks_four_tokens, "Your test missed a leak"),
    (leaks_first_output_only, "a leak but not the first"),
])
def test_leaks_wrong(answer, phrase, capsys):
    assert_fails(check_leaks_future, answer, capsys, phrase)


def test_the_hidden_tests_of_ex112_reject_every_weak_test():
    notebook, grade_id = "11_debugging.ipynb", "ch11-ex2-check"
    assert passes_hidden_tests(notebook, grade_id, leaks_future=leaks_right)
    for weak in (leaks_in_training_mode, leaks_including_j, leaks_loose, leaks_swapped,
                 leaks_by_output_first, leaks_last_token_only, leaks_from_the_end,
                 leaks_tiny_change, leaks_tolerance_1e3, leaks_four_tokens,
                 leaks_first_output_only):
        assert not passes_hidden_tests(notebook, grade_id, leaks_future=weak), weak


# --- 11.3 the blog layer with two bugs (bug hunt) ---------------------------------------------


class BlogCausalAttention(nn.Module):
    """The chapter's buggy layer, as the learner receives it (two bugs)."""

    def __init__(self, d_in, d_out, context_length, num_heads, dropout=0.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.context_length, self.dropout_p = context_length, dropout
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", torch.ones(context_length, context_length).tril().bool())

    def split(self, x):
        batch, num_tokens, _ = x.shape
        return x.view(batch, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
        queries, keys, values = (self.split(w(x)) for w in (self.W_query, self.W_key,
                                                            self.W_value))
        attn_scores = queries @ keys.transpose(-2, -1) / self.head_dim
        attn_scores = attn_scores.masked_fill(~self.mask[:num_tokens, :num_tokens], -math.inf)
        attn_weights = torch.softmax(attn_scores, dim=-1)
        attn_weights = nn.Dropout(self.dropout_p)(attn_weights)
        context = (attn_weights @ values).transpose(1, 2).reshape(batch, num_tokens, -1)
        return self.out_proj(context)


def _blog_forward(scale_by_sqrt: bool, dropout: str):
    """A forward pass of the blog layer with the two bugs fixed or not."""

    def forward(self, x):
        batch, num_tokens, _ = x.shape
        if num_tokens > self.context_length:
            raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
        queries, keys, values = (self.split(w(x)) for w in (self.W_query, self.W_key,
                                                            self.W_value))
        divisor = math.sqrt(self.head_dim) if scale_by_sqrt else self.head_dim
        attn_scores = queries @ keys.transpose(-2, -1) / divisor
        if dropout == "before mask":
            attn_scores = F.dropout(attn_scores, self.dropout_p, training=self.training)
        attn_scores = attn_scores.masked_fill(~self.mask[:num_tokens, :num_tokens], -math.inf)
        if dropout == "on masked scores":
            attn_scores = F.dropout(attn_scores, self.dropout_p, training=self.training)
        attn_weights = torch.softmax(attn_scores, dim=-1)
        if dropout == "fixed":
            attn_weights = F.dropout(attn_weights, self.dropout_p, training=self.training)
        elif dropout == "fresh module":
            attn_weights = nn.Dropout(self.dropout_p)(attn_weights)
        context = (attn_weights @ values).transpose(1, 2).reshape(batch, num_tokens, -1)
        return self.out_proj(context)

    return type("FixedBlogAttention", (BlogCausalAttention,), {"forward": forward})


def test_blog_right(capsys):
    assert_passes(check_fixed_blog_attention, _blog_forward(True, "fixed"), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (BlogCausalAttention, "An nn.Dropout built inside forward"),
    (_blog_forward(True, "fresh module"), "An nn.Dropout built inside forward"),
    (_blog_forward(False, "fixed"), "compare it with head_dim"),
    (_blog_forward(True, "removed"), "not remove it"),
    (_blog_forward(True, "before mask"), "dropout_train"),
    (_blog_forward(True, "on masked scores"), "0 times -inf is NaN"),
    (BlogCausalAttention(6, 8, 8, 2, 0.5), "Pass the class itself"),
])
def test_blog_wrong(answer, phrase, capsys):
    assert_fails(check_fixed_blog_attention, answer, capsys, phrase)


def test_blog_wrong_without_out_proj(capsys):
    class NoOutProj(BlogCausalAttention):
        def forward(self, x):
            batch, num_tokens, _ = x.shape
            if num_tokens > self.context_length:
                raise ValueError(f"T={num_tokens} exceeds context_length={self.context_length}")
            queries, keys, values = (self.split(w(x)) for w in (self.W_query, self.W_key,
                                                                self.W_value))
            context = F.scaled_dot_product_attention(queries, keys, values, is_causal=True,
                                                     dropout_p=self.dropout_p * self.training)
            return context.transpose(1, 2).reshape(batch, num_tokens, -1)

    assert_fails(check_fixed_blog_attention, NoOutProj, capsys, "out_proj")


def test_blog_unwritten(capsys):
    class FixedBlogAttention(BlogCausalAttention):
        def forward(self, x):
            raise NotImplementedError()

    assert_fails(check_fixed_blog_attention, FixedBlogAttention, capsys,
                 "You have not written `forward` yet", sections=())


@pytest.mark.parametrize("copied", [bug_zoo.HealthyMultiHeadAttention,
                                    bug_zoo.HealthyCausalAttention])
def test_blog_cannot_be_passed_with_the_zoos_healthy_layers(copied, capsys):
    assert check_fixed_blog_attention(copied) is False
    class_copy = type("FixedBlogAttention", (BlogCausalAttention,),
                      {"forward": copied.forward})
    assert check_fixed_blog_attention(class_copy) is False
    capsys.readouterr()
