"""Chapter 17's checkers accept right answers and explain each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from checker_asserts import assert_fails, assert_passes, unwritten

from attention_book.distributed import LAYOUTS, simulate_ring_attention
from attention_book.exercises import (
    check_bytes_sent_per_rank,
    check_fold_block,
    check_matches_whole_sequence,
    check_predicted_busiest_pairs,
    check_striped_positions,
)

# --- 17.1 bytes per rank with grouped-query attention ---------------------------------------


def bytes_right(method, batch_size, num_heads, num_kv_heads, seq_len, head_dim, world_size,
                bytes_per_element):
    per_head = batch_size * (seq_len // world_size) * head_dim * bytes_per_element
    if method in ("allgather", "ring"):
        return 2 * (world_size - 1) * num_kv_heads * per_head
    return (world_size - 1) * (2 * num_heads + 2 * num_kv_heads) * per_head // world_size


def test_bytes_right(capsys):
    out = assert_passes(check_bytes_sent_per_rank, bytes_right, capsys)
    assert "Llama 3" in out


def _bytes_wrong(kind):
    def answer(method, b, h, h_kv, t, d, p, s):
        per_head = b * (t // p) * d * s
        if method in ("allgather", "ring"):
            if kind == "query heads":
                return 2 * (p - 1) * h * per_head
            if kind == "P hops":
                return 2 * p * h_kv * per_head
            if kind == "keys only":
                return (p - 1) * h_kv * per_head
            if kind == "whole sequence":
                return 2 * (p - 1) * h_kv * per_head * p
            if kind == "float":
                return float(2 * (p - 1) * h_kv * per_head)
            return 2 * (p - 1) * h_kv * per_head
        if kind == "no output":
            return (p - 1) * (h + 2 * h_kv) * per_head // p
        if kind == "everything sent":
            return (2 * h + 2 * h_kv) * per_head
        return (p - 1) * (2 * h + 2 * h_kv) * per_head // p

    return answer


@pytest.mark.parametrize(("kind", "phrase"), [
    ("query heads", "only num_kv_heads heads"),
    ("P hops", "P - 1 times, not P"),
    ("keys only", "Both the keys and the values"),
    ("whole sequence", "T / P positions"),
    ("no output", "four all-to-alls"),
    ("everything sent", "(P - 1) / P of each tensor"),
    ("float", "is an int"),
])
def test_bytes_wrong(kind, phrase, capsys):
    assert_fails(check_bytes_sent_per_rank, _bytes_wrong(kind), capsys, phrase)


def test_bytes_unwritten(capsys):
    def bytes_sent_per_rank(*args):
        raise NotImplementedError()

    assert_fails(check_bytes_sent_per_rank, bytes_sent_per_rank, capsys,
                 "You have not written `bytes_sent_per_rank` yet", sections=())


# --- 17.2 the busiest rank's work (prediction) --------------------------------------------------


def test_prediction_right(capsys):
    out = assert_passes(check_predicted_busiest_pairs, lambda: (512, 272), capsys)
    assert "by 1.88" in out


@pytest.mark.parametrize(("value", "phrase"), [
    ((272, 512), "swapped"),
    ((484, 260), "only the unmasked pairs"),
    ((512, 512), "without a mask"),
    ((260, 260), "the average rank"),
    ((500, 300), "Count tiles"),
    ((512,), "a pair (contiguous, zigzag)"),
    ((512.0, 272.0), "is an int"),
])
def test_prediction_wrong(value, phrase, capsys):
    assert_fails(check_predicted_busiest_pairs, lambda: value, capsys, phrase)


# --- 17.3 striped positions --------------------------------------------------------------------


def striped_right(seq_len, world_size, rank):
    if seq_len % world_size:
        raise ValueError(f"T = {seq_len} is not divisible by world_size = {world_size}")
    return torch.arange(rank, seq_len, world_size)


def test_striped_right(capsys):
    assert_passes(check_striped_positions, striped_right, capsys)
    pairs = [int((striped_right(16, 4, rank) + 1).sum()) for rank in range(4)]
    assert pairs == [28 + 4 * rank for rank in range(4)]  # what the message says: r * T / P more


@pytest.mark.parametrize(("answer", "phrase"), [
    (lambda t, p, r: torch.arange(r * (t // p), (r + 1) * (t // p)), "contiguous layout"),
    (lambda t, p, r: torch.arange(r, t, p) + 1, "one too large"),
    (lambda t, p, r: torch.arange(r, t, p).float(), "integer tensor"),
    (lambda t, p, r: torch.arange(r, t, p).flip(0), "rank r holds r, r + P"),
    (lambda t, p, r: torch.arange(r, t, p)[:1], "the shape of"),
    (lambda t, p, r: torch.arange(r, t, p) if t % p == 0 else torch.arange(r, t, p),
     "raises ValueError"),
])
def test_striped_wrong(answer, phrase, capsys):
    assert_fails(check_striped_positions, answer, capsys, phrase)


def test_striped_unwritten(capsys):
    def striped_positions(seq_len, world_size, rank):
        raise NotImplementedError()

    assert_fails(check_striped_positions, striped_positions, capsys,
                 "You have not written `striped_positions` yet", sections=())


# --- 17.4 the ring's step: fold one block into the running result -----------------------------


def _fold(mask="positions", safe=True, merge="right"):
    def fold_block(out, lse, query, query_positions, key, value, key_positions):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask == "positions":
            future = key_positions[None, :] > query_positions[:, None]
        elif mask == "indices":
            future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        else:
            future = torch.zeros(scores.shape[-2:], dtype=torch.bool)
        scores = scores.masked_fill(future, float("-inf"))
        block_lse = torch.logsumexp(scores, dim=-1)
        new_lse = torch.logaddexp(lse, block_lse)
        shift = torch.where(torch.isfinite(new_lse), new_lse, 0.0) if safe else new_lse
        if merge == "average":
            block_shift = torch.where(torch.isfinite(block_lse), block_lse, 0.0)
            block_out = torch.exp(scores - block_shift.unsqueeze(-1)) @ value
            return (out + block_out) / 2, new_lse
        weights = torch.exp(scores - shift.unsqueeze(-1))
        return out * torch.exp(lse - shift).unsqueeze(-1) + weights @ value, new_lse

    return fold_block


def test_fold_right(capsys):
    assert_passes(check_fold_block, _fold(), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (_fold(safe=False), "exp(-inf - (-inf)) is NaN"),
    (_fold(mask="none"), "mask the scores where key_positions"),
    (_fold(mask="indices"), "never from the indices"),
    (_fold(merge="average"), "Keep the running result normalised"),
    (lambda *args: _fold()(*args)[0], "returns (out, lse)"),
])
def test_fold_wrong(answer, phrase, capsys):
    assert_fails(check_fold_block, answer, capsys, phrase)


def test_fold_unwritten(capsys):
    def fold_block(out, lse, query, query_positions, key, value, key_positions):
        raise NotImplementedError()

    assert_fails(check_fold_block, fold_block, capsys, "You have not written `fold_block` yet",
                 sections=())


# --- 17.5 a property test for sharded attention ------------------------------------------------


def _test_with(world_sizes, is_causal_values, layouts, exact=False):
    def matches_whole_sequence(attend):
        torch.manual_seed(0)
        query, key, value = (torch.randn(1, 2, 24, 4, dtype=torch.float64) for _ in range(3))
        for world_size in world_sizes:
            for is_causal in is_causal_values:
                for layout in layouts:
                    expected = F.scaled_dot_product_attention(query, key, value,
                                                              is_causal=is_causal)
                    got = attend(query, key, value, world_size, is_causal=is_causal,
                                 layout=layout)
                    same = torch.equal(got, expected) if exact else torch.allclose(
                        got, expected, atol=1e-8)
                    if not same:
                        return False
        return True

    return matches_whole_sequence


def test_property_test_right(capsys):
    assert_passes(check_matches_whole_sequence,
                  _test_with((1, 2, 3, 4), (False, True), LAYOUTS), capsys)


@pytest.mark.parametrize(("answer", "phrase"), [
    (_test_with((1,), (False, True), LAYOUTS), "averages the blocks' outputs"),
    (_test_with((1, 2, 3, 4), (False,), LAYOUTS), "forgets the causal mask"),
    (_test_with((1, 2, 3, 4), (False, True), ("contiguous",)), "as if the shards were contiguous"),
    (_test_with((1, 2), (False, True), LAYOUTS), "the other neighbour"),
    (_test_with((1, 2, 3, 4), (False, True), LAYOUTS, exact=True), "within a tolerance"),
    (lambda attend: "yes", "returns True or False"),
])
def test_property_test_wrong(answer, phrase, capsys):
    assert_fails(check_matches_whole_sequence, answer, capsys, phrase)


def test_property_test_unwritten(capsys):
    assert_fails(check_matches_whole_sequence, unwritten, capsys, "You have not written",
                 sections=())


def test_the_broken_subjects_fail_only_where_the_prompt_says():
    """Each broken subject of 17.5 is right everywhere except its documented configurations."""
    from attention_book.exercises.ch17 import _SUBJECTS

    torch.manual_seed(1)
    query, key, value = (torch.randn(1, 2, 24, 4, dtype=torch.float64) for _ in range(3))
    wrong_where = {}
    for name, subject, healthy in _SUBJECTS:
        wrong = set()
        for world_size in (1, 2, 3, 4):
            for is_causal in (False, True):
                for layout in LAYOUTS:
                    got = subject(query, key, value, world_size, is_causal=is_causal,
                                  layout=layout)
                    expected = F.scaled_dot_product_attention(query, key, value,
                                                              is_causal=is_causal)
                    if not torch.allclose(got, expected, atol=1e-8):
                        wrong.add((world_size, is_causal, layout))
        wrong_where[name] = wrong
        assert (not wrong) == healthy, name
    by_bug = {name.split("(")[0].strip(): wrong for name, wrong in wrong_where.items()}
    assert by_bug["a ring that averages the blocks' outputs"] == {
        (p, c, layout) for p in (2, 3, 4) for c in (False, True) for layout in LAYOUTS}
    assert by_bug["a ring that forgets the causal mask inside a block"] == {
        (p, True, layout) for p in (1, 2, 3, 4) for layout in LAYOUTS}
    assert by_bug["a ring that masks as if the shards were contiguous"] == {
        (p, True, "zigzag") for p in (2, 3, 4)}  # one rank: zig-zag is the whole sequence
    assert by_bug["a ring that thinks its blocks come from the other neighbour"] == {
        (p, True, layout) for p in (3, 4) for layout in LAYOUTS}
    assert math.isclose(float(simulate_ring_attention(query, key, value, 2)[0, 0, 0, 0]),
                        float(F.scaled_dot_product_attention(query, key, value)[0, 0, 0, 0]))
