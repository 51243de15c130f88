"""Chapter 17's checkers accept right answers and explain each typical wrong one."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from checker_asserts import assert_fails, assert_passes, unwritten
from hidden_tests import passes_hidden_tests

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
    # 510 MiB is the formula's count; with each rank holding a copy of one key/value head, the
    # all-to-alls carry 480 MiB of queries and outputs and 2 * 15 * 2 MiB of keys and values.
    assert "480 MiB" in out and "510 MiB" in out and "540 MiB" in out


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
    assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex1-check",
                                   bytes_sent_per_rank=_bytes_wrong(kind))


def test_bytes_unwritten(capsys):
    def bytes_sent_per_rank(*args):
        raise NotImplementedError()

    assert_fails(check_bytes_sent_per_rank, bytes_sent_per_rank, capsys,
                 "You have not written `bytes_sent_per_rank` yet", sections=())


# --- 17.2 the busiest rank's work (prediction) --------------------------------------------------


def _tile_count(layout, tile=4, seq_len=64, world_size=8):
    """The busiest rank's computed scores, counted with sets of positions (an independent count)."""
    def positions(rank):
        if layout == "striped":
            return list(range(rank, seq_len, world_size))
        if layout == "contiguous":
            size = seq_len // world_size
            return list(range(rank * size, (rank + 1) * size))
        chunk = seq_len // (2 * world_size)
        late = 2 * world_size - 1 - rank
        return [*range(rank * chunk, (rank + 1) * chunk), *range(late * chunk, (late + 1) * chunk)]

    def tiles(rank):
        mine = positions(rank)
        return [mine[i:i + tile] for i in range(0, len(mine), tile)]

    return max(sum(len(q) * len(k) for source in range(world_size) for q in tiles(rank)
                   for k in tiles(source) if min(k) <= max(q)) for rank in range(world_size))


def test_prediction_right(capsys):
    expected = tuple(_tile_count(layout) for layout in ("contiguous", "zigzag", "striped"))
    assert expected == (496, 272, 384)
    out = assert_passes(check_predicted_busiest_pairs, lambda: expected, capsys)
    assert "depends on the tile the kernel skips" in out


@pytest.mark.parametrize(("value", "phrase"), [
    ((272, 496, 384), "wrong order"),
    ((484, 260, 288), "only the unmasked pairs"),
    ((272, 272, 384), "the average rank"),
    ((512, 272, 384), "one tile per block of T / P = 8 positions"),
    ((496, 272, 512), "every tile of every block"),
    ((496, 272, 400), "The striped number is off"),
    ((496, 256, 384), "The zigzag number is off"),
    ((480, 272, 384), "The contiguous number is off"),
    ((512, 272), "a triple (contiguous, zigzag, striped)"),
    ((496.0, 272.0, 384.0), "is an int"),
])
def test_prediction_wrong(value, phrase, capsys):
    assert_fails(check_predicted_busiest_pairs, lambda: value, capsys, phrase)
    if all(isinstance(number, int) for number in value):  # not a mere format slip
        assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex2-check",
                                       predicted_busiest_pairs=lambda: value)


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


def _striped_raising(message):
    def striped_positions(seq_len, world_size, rank):
        if seq_len % world_size:
            raise ValueError(message.format(seq_len=seq_len, world_size=world_size))
        return torch.arange(rank, seq_len, world_size)

    return striped_positions


@pytest.mark.parametrize("message", [
    "the length is not divisible by the number of ranks",
    "seq_len = {seq_len} is not divisible",
    "world_size = {world_size} does not divide the length",
    "seq_len = 104 is not divisible by world_size = 14",
])
def test_striped_error_must_name_both_numbers(message, capsys):
    """N2: the prompt asks for a ValueError naming both numbers; the checker reads the message."""
    answer = _striped_raising(message)
    assert_fails(check_striped_positions, answer, capsys, "names both numbers")
    assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex3-check",
                                   striped_positions=answer)


def test_striped_hidden_tests_pass_the_solution():
    assert passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex3-check",
                               striped_positions=striped_right)


def test_striped_unwritten(capsys):
    def striped_positions(seq_len, world_size, rank):
        raise NotImplementedError()

    assert_fails(check_striped_positions, striped_positions, capsys,
                 "You have not written `striped_positions` yet", sections=())


# --- 17.4 the ring's step: fold one block into the running result -----------------------------


def _fold(mask="positions", safe=True, merge="right", scale=True):
    def fold_block(out, lse, query, query_positions, key, value, key_positions):
        scores = query @ key.transpose(-2, -1) / (math.sqrt(query.size(-1)) if scale else 1.0)
        if mask == "positions":
            future = key_positions[None, :] > query_positions[:, None]
        elif mask == "strict":
            future = key_positions[None, :] >= query_positions[:, None]
        elif mask == "indices":
            future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        else:
            future = torch.zeros(scores.shape[-2:], dtype=torch.bool)
        scores = scores.masked_fill(future, float("-inf"))
        block_lse = torch.logsumexp(scores, dim=-1)
        new_lse = torch.logaddexp(lse, block_lse)
        shift = torch.where(torch.isfinite(new_lse), new_lse, 0.0) if safe else new_lse
        if merge == "raw sums":  # sums of exp(score) with no shift: overflows on large scores
            total = torch.exp(lse) + torch.exp(scores).sum(-1)
            merged = out * torch.exp(lse).unsqueeze(-1) + torch.exp(scores) @ value
            return torch.where(total.unsqueeze(-1) > 0, merged / total.unsqueeze(-1), out), \
                torch.log(total)
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
    (_fold(merge="raw sums"), "scores near 1000"),
    (_fold(scale=False), "causal attention and its log-sum-exp"),
    (_fold(mask="strict"), "causal attention and its log-sum-exp"),
    (lambda *args: _fold()(*args)[0], "returns (out, lse)"),
])
def test_fold_wrong(answer, phrase, capsys):
    assert_fails(check_fold_block, answer, capsys, phrase)
    assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex4-check",
                                   fold_block=answer)


def test_fold_hidden_tests_pass_the_solution():
    assert passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex4-check",
                               fold_block=_fold())


def test_fold_unwritten(capsys):
    def fold_block(out, lse, query, query_positions, key, value, key_positions):
        raise NotImplementedError()

    assert_fails(check_fold_block, fold_block, capsys, "You have not written `fold_block` yet",
                 sections=())


# --- 17.5 a property test for sharded attention ------------------------------------------------


def _test_with(world_sizes, is_causal_values, layouts, exact=False, batch_heads=(2, 3),
               configurations=None, atol=1e-8):
    """A property test of 17.5 that tries the given configurations, or every combination."""
    if configurations is None:
        configurations = [(p, c, layout) for p in world_sizes for c in is_causal_values
                          for layout in layouts]

    def matches_whole_sequence(attend):
        torch.manual_seed(0)
        query, key, value = (torch.randn(*batch_heads, 24, 4, dtype=torch.float64)
                             for _ in range(3))
        for world_size, is_causal, layout in configurations:
            expected = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)
            got = attend(query, key, value, world_size, is_causal=is_causal, layout=layout)
            same = torch.equal(got, expected) if exact else torch.allclose(got, expected,
                                                                           atol=atol)
            if not same:
                return False
        return True

    return matches_whole_sequence


# Two world sizes are enough for a right answer (P = 2 and P = 3 show every bug), and keep
# these tests cheap; the chapter's own solution tries P = 1 to 4.
FULL_TEST = _test_with((2, 3), (False, True), LAYOUTS)


def test_property_test_right(capsys):
    assert_passes(check_matches_whole_sequence, FULL_TEST, capsys)
    assert passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex5-check",
                               matches_whole_sequence=FULL_TEST)


# The weak tests the review of chapters 16-17 quotes: the two that passed before (one
# configuration; P = 3, causal, both layouts) and those it saw rejected. Every other test that
# leaves out one value of a dimension is covered by the two tests of the subjects below.
WEAK_TESTS = {
    "one configuration (P = 4, causal, zig-zag)": (
        _test_with((4,), (True,), ("zigzag",)), "wrong only for P = 2"),
    "P = 3, causal, both layouts": (_test_with((3,), (True,), LAYOUTS), "wrong only for P = 2"),
    "P <= 2": (_test_with((1, 2), (False, True), LAYOUTS), "the other neighbour"),
    "contiguous only": (_test_with((2, 3), (False, True), ("contiguous",)),
                        "as if the shards were contiguous"),
    "without the mask only": (_test_with((2, 3), (False,), LAYOUTS),
                              "as if the shards were contiguous"),
    "one configuration with B = 1": (
        _test_with((3,), (True,), ("zigzag",), batch_heads=(1, 2)),
        "wrong only when B > 1 and H > 1"),
    # the recheck's D10: every configuration (P = 2 and 3 show every bug, as for FULL_TEST),
    # but a tolerance that lets an error of 0.005 through
    "every configuration, atol = 0.05": (
        _test_with((2, 3), (False, True), LAYOUTS, atol=0.05), "in bfloat16"),
}


@pytest.mark.parametrize("name", list(WEAK_TESTS))
def test_property_test_weak_tests_fail_checker_and_hidden_tests(name, capsys):
    answer, phrase = WEAK_TESTS[name]
    assert_fails(check_matches_whole_sequence, answer, capsys, phrase)
    assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex5-check",
                                   matches_whole_sequence=answer), name


def _length_16(attend):
    """The review's wrong answer: T = 16, which three ranks cannot split."""
    query = key = value = torch.randn(2, 3, 16, 4, dtype=torch.float64)
    return all(torch.allclose(attend(query, key, value, p, is_causal=True, layout="contiguous"),
                              F.scaled_dot_product_attention(query, key, value, is_causal=True))
               for p in (1, 2, 3, 4))


@pytest.mark.parametrize(("answer", "phrase"), [
    (_test_with((1, 2, 3, 4), (False, True), LAYOUTS, exact=True), "within a tolerance"),
    (_length_16, "not divisible"),
    (lambda attend: "yes", "returns True or False"),
])
def test_property_test_wrong(answer, phrase, capsys):
    assert_fails(check_matches_whole_sequence, answer, capsys, phrase)
    assert not passes_hidden_tests("17_attention_across_devices.ipynb", "ch17-ex5-check",
                                   matches_whole_sequence=answer)


def test_property_test_unwritten(capsys):
    assert_fails(check_matches_whole_sequence, unwritten, capsys, "You have not written",
                 sections=())


def _wrong_configurations(subject, batch_heads=(2, 3)):
    torch.manual_seed(1)
    query, key, value = (torch.randn(*batch_heads, 24, 4, dtype=torch.float64) for _ in range(3))
    wrong = set()
    for world_size in (1, 2, 3, 4):
        for is_causal in (False, True):
            for layout in LAYOUTS:
                got = subject(query, key, value, world_size, is_causal=is_causal, layout=layout)
                expected = F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)
                if not torch.allclose(got, expected, atol=1e-8):
                    wrong.add((world_size, is_causal, layout))
    return wrong


@pytest.fixture(scope="module")
def wrong_where():
    """Where each subject of 17.5 is wrong, by its name up to the parenthesis."""
    from attention_book.exercises.ch17 import _SUBJECTS

    return {name.split("(")[0].strip(): (healthy, _wrong_configurations(subject))
            for name, subject, healthy in _SUBJECTS}


def test_the_broken_subjects_fail_only_where_the_prompt_says(wrong_where):
    """Each broken subject of 17.5 is right everywhere except its documented configurations."""
    from attention_book.exercises.ch17 import _SUBJECTS

    everywhere = {(p, c, layout) for p in (1, 2, 3, 4) for c in (False, True) for layout in LAYOUTS}
    for name, (healthy, wrong) in wrong_where.items():
        assert (not wrong) == healthy, name
    wrong_where = {name: wrong for name, (_, wrong) in wrong_where.items()}
    assert wrong_where["a ring that averages the blocks' outputs"] == {
        (p, c, layout) for p, c, layout in everywhere if p >= 2}
    assert wrong_where["a ring that forgets the causal mask inside a block"] == {
        (p, c, layout) for p, c, layout in everywhere if c}
    assert wrong_where["a ring that applies the causal mask even when is_causal=False"] == {
        (p, c, layout) for p, c, layout in everywhere if not c}
    assert wrong_where["a ring that masks as if the shards were contiguous"] == {
        (p, True, "zigzag") for p in (2, 3, 4)}  # one rank: zig-zag is the whole sequence
    assert wrong_where["a ring whose path for contiguous shards without a mask folds each "
                       "block's keys with the values of the block before it"] == {
        (p, False, "contiguous") for p in (2, 3, 4)}
    assert wrong_where["a ring that thinks its blocks come from the other neighbour"] == {
        (p, True, layout) for p in (3, 4) for layout in LAYOUTS}
    assert wrong_where["a ring that, with two ranks, whose next and previous rank are the same, "
                       "keeps the block it sent instead of the one it received"] == {
        (2, c, layout) for c in (False, True) for layout in LAYOUTS}
    assert wrong_where["a ring that folds the batch and head axes into one in one order and "
                       "unfolds them in the other"] == everywhere
    assert wrong_where["a ring that sends its key and value blocks in bfloat16"] == {
        (p, c, layout) for p, c, layout in everywhere if p >= 2}
    batch_and_heads = _SUBJECTS[0][1]
    assert not _wrong_configurations(batch_and_heads, (1, 3))
    assert not _wrong_configurations(batch_and_heads, (2, 1))
    assert math.isclose(float(simulate_ring_attention(query_ := torch.randn(1, 1, 8, 2,
                                                                           dtype=torch.float64),
                                                      query_, query_, 2)[0, 0, 0, 0]),
                        float(F.scaled_dot_product_attention(query_, query_, query_)[0, 0, 0, 0]))


def test_no_single_value_of_any_dimension_catches_every_broken_subject(wrong_where):
    """M1: a test that tries one world size, mask setting or layout misses some bug."""
    broken = [wrong for healthy, wrong in wrong_where.values() if not healthy]
    for index, values in ((0, (2, 3, 4)), (1, (False, True)), (2, LAYOUTS)):
        for value in values:  # a test that tries only this value of this dimension
            assert any(not any(config[index] == value for config in wrong) for wrong in broken)
    for config in {c for wrong in broken for c in wrong}:  # and no single configuration
        assert any(config not in wrong for wrong in broken)


def test_property_test_subjects_have_neutral_names():
    """A learner's test must not tell the subjects apart by their names."""
    from attention_book.exercises.ch17 import _SUBJECTS

    assert {subject.__name__ for _, subject, _ in _SUBJECTS} == {"attend"}
