"""Chapter 20's checkers accept right answers and explain each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import triton.language as tl
from checker_asserts import assert_fails, assert_passes, unwritten

from attention_book.exercises import (
    check_attention_any_length,
    check_causal_key_range,
    check_key_row_offset,
    check_predicted_tflops,
)
from attention_book.triton_attention import flash_attention, jit

# --- 20.1 the loop bounds ---------------------------------------------------------------------


def _range(start_m, block_m, block_n, num_tokens):
    return start_m * block_m // block_n * block_n, min((start_m + 1) * block_m, num_tokens)


def test_key_range_right(capsys):
    assert_passes(check_causal_key_range, _range, capsys)
    # The end rounded up to a whole tile visits the same tiles.
    assert_passes(check_causal_key_range, lambda m, bm, bn, t: (
        m * bm // bn * bn, -(-min((m + 1) * bm, t) // bn) * bn), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    # the chapter's bound, right only when block_m is a multiple of block_n
    (lambda m, bm, bn, t: (m * bm, min((m + 1) * bm, t)), "full_end is a multiple of block_n"),
    (lambda m, bm, bn, t: (0, min((m + 1) * bm, t)), "the first masked tile needs the mask"),
    (lambda m, bm, bn, t: (_range(m, bm, bn, t)[0], (m + 1) * bm),
     "no visited tile lies wholly after"),
    (lambda m, bm, bn, t: (_range(m, bm, bn, t)[0], m * bm + 1), "visits every key"),
    (lambda m, bm, bn, t: (-(-m * bm // bn) * bn, min((m + 1) * bm, t)),
     "sees the whole of each unmasked tile"),
    (lambda m, bm, bn, t: (m * bm / bn * bn, min((m + 1) * bm, t)), "is an int"),
    (lambda m, bm, bn, t: min((m + 1) * bm, t), "returns two numbers"),
])
def test_key_range_wrong(answer, phrase, capsys):
    assert_fails(check_causal_key_range, answer, capsys, phrase)
    assert_fails(check_causal_key_range, unwritten, capsys, "You have not written", sections=())


# --- 20.2 grouped heads in the (B, T, H_kv, d) layout -------------------------------------------


def _offset(b, h, t, num_heads, num_kv_heads, num_tokens, d):
    return ((b * num_tokens + t) * num_kv_heads + h // (num_heads // num_kv_heads)) * d


def test_key_row_offset_right(capsys):
    assert_passes(check_key_row_offset, _offset, capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda b, h, t, nh, nk, nt, d: ((b * nt + t) * nk + h % nk) * d, "round-robin"),
    (lambda b, h, t, nh, nk, nt, d: ((b * nk + h // (nh // nk)) * nt + t) * d,
     "the (B, H_kv, T, head_dim) layout"),
    (lambda b, h, t, nh, nk, nt, d: ((b * nt + t) * nh + h // (nh // nk)) * d,
     "counts H heads"),
    (lambda b, h, t, nh, nk, nt, d: ((b * nt + t) * nh + h) * d, "as if every query head"),
    (lambda b, h, t, nh, nk, nt, d: float(_offset(b, h, t, nh, nk, nt, d)), "is an int"),
])
def test_key_row_offset_wrong(answer, phrase, capsys):
    assert_fails(check_key_row_offset, answer, capsys, phrase)


# --- 20.3 the leaking tile ----------------------------------------------------------------------


def _leaky(block):
    def attention(query, key, value):
        num_tokens = key.size(-2)
        padded = -(-num_tokens // block) * block
        key = F.pad(key, (0, 0, 0, padded - num_tokens))
        value = F.pad(value, (0, 0, 0, padded - num_tokens))
        return F.scaled_dot_product_attention(query, key, value)
    return attention


def test_attention_any_length_right(capsys):
    assert_passes(check_attention_any_length, F.scaled_dot_product_attention, capsys)
    assert_passes(check_attention_any_length, flash_attention, capsys)  # the book's kernels


@pytest.mark.parametrize("block", [16, 32, 64])
def test_attention_any_length_that_still_leaks(block, capsys):
    assert_fails(check_attention_any_length, _leaky(block), capsys, "past the end joined in",
                 "Give those scores -inf")


def test_attention_any_length_other_mistakes(capsys):
    assert_fails(check_attention_any_length, lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, scale=1.0), capsys, "line by line")
    assert_fails(check_attention_any_length, lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=q.size(-2) % 64 != 0), capsys, "right when T is a multiple of 64")
    assert_fails(check_attention_any_length, lambda q, k, v: q, capsys, "line by line")
    assert_fails(check_attention_any_length, lambda q, k, v: q[0], capsys, "the shape of")
    assert_fails(check_attention_any_length, unwritten, capsys, "You have not written", sections=())


# A kernel with the bug of the chapter's colleague: the ragged last tile runs without the mask.
@jit
def fold(acc, total, top, scores, v):
    new_top = tl.maximum(top, tl.max(scores, 1))
    p = tl.exp(scores - new_top[:, None])
    rescale = tl.exp(top - new_top)
    acc = acc * rescale[:, None] + tl.dot(p, v, input_precision="ieee")
    return acc, total * rescale + tl.sum(p, 1), new_top


@jit
def leaky_kernel(q_ptr, k_ptr, v_ptr, out_ptr, num_tokens, scale,
                 HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    base = tl.program_id(1) * num_tokens * HEAD_DIM
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :],
                mask=rows[:, None] < num_tokens, other=0.0)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.full([BLOCK], 0.0, tl.float32)
    acc = tl.full([BLOCK, HEAD_DIM], 0.0, tl.float32)
    whole = tl.cdiv(num_tokens, BLOCK) * BLOCK  # the bug: rounds up, not down
    for start in range(0, num_tokens, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        k = tl.load(k_ptr + base + cols[:, None] * HEAD_DIM + dims[None, :],
                    mask=cols[:, None] < num_tokens, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * HEAD_DIM + dims[None, :],
                    mask=cols[:, None] < num_tokens, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        if start >= whole:
            s = tl.where(cols[None, :] < num_tokens, s, float("-inf"))
        acc, total, top = fold(acc, total, top, s, v)
    tl.store(out_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :],
             acc / total[:, None], mask=rows[:, None] < num_tokens)


def test_the_real_bug_is_caught(capsys):
    """A kernel with the bug of the chapter's colleague (the ragged last tile runs in the loop
    without a mask), through the interpreter: right at T = 64, and the checker names the leak."""
    def attention(query, key, value):
        batch, heads, num_tokens, head_dim = query.shape
        output = torch.empty_like(query)
        leaky_kernel[(-(-num_tokens // 16), batch * heads)](
            query, key, value, output, num_tokens, 1 / math.sqrt(head_dim),
            HEAD_DIM=head_dim, BLOCK=16)
        return output

    assert_fails(check_attention_any_length, attention, capsys, "past the end joined in")


# --- 20.4 the roofline prediction ---------------------------------------------------------------


def test_tflops_prediction(capsys):
    assert check_predicted_tflops.reveal is False
    assert_passes(check_predicted_tflops, lambda: 214.4, capsys)
    assert_passes(check_predicted_tflops, lambda: 64 * 3.35, capsys)
    for wrong, phrase in ((989, "the GPU's peak"), (428.8, "twice the bound"),
                          (107.2, "half the bound"), (1715.2, "Bytes, not bits"),
                          (857.6, "four times"), (300.0, "Count one step of the loop"),
                          ("214", "is a number")):
        out = assert_fails(check_predicted_tflops, lambda wrong=wrong: wrong, capsys, phrase)
        assert "214.4" not in out and "kept back" in out or phrase == "is a number"
