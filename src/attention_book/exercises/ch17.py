"""Checkers for chapter 17's exercises: the bytes each method sends with grouped-query
attention, the causal work of the busiest rank (a prediction), a striped layout, the ring's step
that folds one block into the running result, and a property test for sharded attention.

None of them starts a process: the ranks are simulated in a loop where one is needed.

Taught in chapter 17.
"""

from __future__ import annotations

import math
import re
from functools import partial

import torch
import torch.nn.functional as F

from ..distributed import shard_positions, simulate_ring_attention, unshard
from .feedback import (
    call,
    call_in_private_order,
    checker,
    expect_int,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = [
    "check_bytes_sent_per_rank",
    "check_predicted_busiest_pairs",
    "check_striped_positions",
    "check_fold_block",
    "check_matches_whole_sequence",
]



# --------------------------------------------------------------------------- 17.1 bytes


def _forward_bytes(method, batch_size, num_heads, num_kv_heads, seq_len, head_dim, world_size,
                   bytes_per_element) -> dict[str, int]:
    """The right count and the usual wrong ones, by name."""
    p = world_size
    per_head = batch_size * (seq_len // p) * head_dim * bytes_per_element  # one head's shard
    query, kv = num_heads * per_head, num_kv_heads * per_head
    if method in ("allgather", "ring"):
        return {
            "right": 2 * (p - 1) * kv,
            "query heads for K and V": 2 * (p - 1) * query,
            "P hops": 2 * p * kv,
            "keys only": (p - 1) * kv,
            "whole sequence": 2 * (p - 1) * kv * p,
        }
    return {
        "right": (p - 1) * (2 * query + 2 * kv) // p,
        "query heads for K and V": (p - 1) * 4 * query // p,
        "no output": (p - 1) * (query + 2 * kv) // p,
        "everything sent": 2 * query + 2 * kv,
        "whole sequence": (p - 1) * (2 * query + 2 * kv),
    }


_BYTES_HINTS = {
    "query heads for K and V": "You gave the keys and values num_heads heads. With grouped-query "
                               "attention they have only num_kv_heads heads each: that is what "
                               "makes them cheap to send.",
    "P hops": "A rank sends its block on P - 1 times, not P: after P - 1 hops every rank has "
              "seen every block, and nobody needs the last one.",
    "keys only": "You counted one tensor. Both the keys and the values travel.",
    "whole sequence": "Count one rank's shard: T / P positions, not the T of the whole sequence.",
    "no output": "Ulysses makes four all-to-alls, not three: the queries, keys and values go out "
                 "by heads, and the output comes back by positions.",
    "everything sent": "In an all-to-all a rank keeps the part meant for itself: it sends "
                       "(P - 1) / P of each tensor.",
}


@checker
def check_bytes_sent_per_rank(fn) -> None:
    """Check ``fn(method, B, H, H_kv, T, head_dim, P, bytes_per_element)`` counts a rank's bytes.

    The forward pass of one attention layer: ``"allgather"`` and ``"ring"`` send the key and
    value shards (``H_kv`` heads) to ``P - 1`` ranks; ``"ulysses"`` sends ``(P - 1) / P`` of
    the query, key, value and output shards.

    Args:
        fn: the learner's ``bytes_sent_per_rank``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 17.
    """
    cases = [  # (B, H, H_kv, T, head_dim, P, bytes), valid for Ulysses too
        (1, 8, 8, 64, 16, 4, 4),
        (2, 32, 8, 4096, 128, 8, 2),
        (1, 128, 8, 131072, 128, 8, 2),
        (3, 12, 4, 96, 64, 4, 8),
        (1, 4, 4, 8, 8, 1, 4),
    ]
    for method in ("allgather", "ring", "ulysses"):
        for case in cases:
            counts = _forward_bytes(method, *case)
            args = (method, *case)
            actual = call(fn, *args)
            expect_int(f"bytes_sent_per_rank{args}", actual,
                        "Return a whole number of bytes as an int (use // to divide).")
            if actual == counts["right"]:
                continue
            prop = f"bytes_sent_per_rank{args} has the right value"
            for name, wrong in counts.items():
                if name != "right" and actual == wrong and wrong != counts["right"]:
                    fail(prop, expected="the bytes of the formula", actual=actual,
                         hint=_BYTES_HINTS[name])
            fail(prop, expected="the bytes of the formula", actual=actual,
                 hint="Count one rank's shards, B * heads * (T / P) * head_dim numbers each: "
                      "the all-gather and the ring send keys and values to P - 1 ranks; Ulysses "
                      "sends (P - 1) / P of the queries, keys, values and outputs.")
    llama = _forward_bytes("ring", 1, 128, 8, 131072, 128, 16, 2)["right"]
    ulysses = _forward_bytes("ulysses", 1, 128, 8, 131072, 128, 16, 2)["right"]
    replicated = _ulysses_with_copied_kv_heads(1, 128, 8, 131072, 128, 16, 2)
    passed(f"with 8 key/value heads for 128 query heads (T = 131072, P = 16, 16-bit), the "
           f"all-gather and the ring send {llama / 2**20:.0f} MiB per rank and layer. Your "
           f"formula gives Ulysses {ulysses / 2**20:.0f} MiB, as if 8 key/value heads could be "
           "split over 16 ranks; they cannot, so Ulysses copies them until every rank holds the "
           "one key/value head its 8 query heads share, and then sends "
           f"{replicated / 2**20:.0f} MiB: more than the all-gather, part of why Llama 3 "
           "all-gathers.")


def _ulysses_with_copied_kv_heads(batch_size, num_heads, num_kv_heads, seq_len, head_dim,
                                  world_size, bytes_per_element) -> int:
    """Ulysses' forward bytes per rank when ``P > H_kv``: each rank receives, from each of the
    ``P - 1`` others, its positions of the one key/value head that rank's query heads use."""
    per_head = batch_size * (seq_len // world_size) * head_dim * bytes_per_element
    kv_heads_per_rank = max(1, num_kv_heads // world_size)
    queries_and_output = 2 * (world_size - 1) * num_heads * per_head // world_size
    return queries_and_output + 2 * (world_size - 1) * kv_heads_per_rank * per_head


# --------------------------------------------------------------------------- 17.2 prediction


_PREDICTION_LAYOUTS = ("contiguous", "zigzag", "striped")


def _layout_positions(seq_len: int, world_size: int, rank: int, layout: str) -> list[int]:
    """A rank's positions, in increasing order; "striped" gives rank r the positions t with
    t mod P = r (Exercise 17.3), the other layouts are the package's."""
    if layout == "striped":
        return list(range(rank, seq_len, world_size))
    return shard_positions(seq_len, world_size, rank, layout).tolist()


def _work_per_rank(seq_len: int, world_size: int, layout: str, tile: int,
                   useful: bool = False) -> list[int]:
    """Scores each rank of a causal ring computes, tile by tile: ``tile`` consecutive query
    positions of the rank against ``tile`` consecutive key positions of a block, skipped when
    wholly in the future and computed whole otherwise (or, with ``useful``, only the unmasked
    pairs). Counted with loops, independently of the package."""
    work = []
    for rank in range(world_size):
        mine = _layout_positions(seq_len, world_size, rank, layout)
        pairs = 0
        for source in range(world_size):
            theirs = _layout_positions(seq_len, world_size, source, layout)
            for q0 in range(0, len(mine), tile):
                for k0 in range(0, len(theirs), tile):
                    queries, keys = mine[q0:q0 + tile], theirs[k0:k0 + tile]
                    seen = sum(1 for q in queries for k in keys if k <= q)
                    pairs += seen if useful else (len(queries) * len(keys) if seen else 0)
        work.append(pairs)
    return work


def _busiest(seq_len: int, world_size: int, tile: int, useful: bool = False,
             reduce=max) -> tuple[int, ...]:
    return tuple(reduce(_work_per_rank(seq_len, world_size, layout, tile, useful))
                 for layout in _PREDICTION_LAYOUTS)


def _mean(work: list[int]) -> int:
    return sum(work) // len(work)


_PREDICTION_HINTS = {
    0: ("contiguous", "With tiles of 4, the last rank's own block of 8 positions is 2 x 2 tiles: "
                      "the tile of its first 4 queries against its last 4 keys is wholly in the "
                      "future and skipped, so it computes 3 of them, not 4. Every earlier block "
                      "is computed whole."),
    1: ("zigzag", "Zig-zag shards are two chunks of 4: the tiles are the chapter's (section "
                  "17.8), 2P + 1 of them on every rank."),
    2: ("striped", "A striped rank holds r, r + 8, ..., r + 56: cut them in order into two tiles "
                   "of 4 (r ... r + 24 and r + 32 ... r + 56), and a block likewise. The tile "
                   "of a rank's early queries against a block's late keys is wholly in the "
                   "future; the other three tiles of every block each see at least one key."),
}


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_busiest_pairs(fn) -> None:
    """Check ``fn()`` predicts the busiest rank's causal work for three layouts.

    Causal ring attention over ``T = 64`` positions, ``P = 8`` ranks, ``B = H = 1``, computed in
    tiles of 4 query positions against 4 key positions (each rank's positions in increasing
    order), a tile skipped when wholly in the future: the scores the busiest rank computes with
    contiguous, zig-zag and striped shards.

    Args:
        fn: the learner's ``predicted_busiest_pairs``.

    Returns:
        True when the prediction is right (the decorator prints the feedback).

    Taught in chapter 17.
    """
    prediction = call(fn)
    hint = "Return a tuple of three ints: (contiguous, zigzag, striped)."
    if not isinstance(prediction, (tuple, list)) or len(prediction) != 3:
        fail("your prediction is a triple (contiguous, zigzag, striped)",
             expected="a tuple of 3 ints", actual=repr(prediction), hint=hint)
    for value in prediction:
        expect_int("each number of your prediction", value, hint)
    expected = _busiest(64, 8, tile=4)
    prediction = tuple(int(value) for value in prediction)
    if prediction == expected:
        useful = _busiest(64, 8, tile=4, useful=True)
        passed(f"the busiest rank computes {expected[0]} scores with contiguous shards, "
               f"{expected[1]} with zig-zag ones and {expected[2]} with striped ones. Striped "
               f"shards nearly balance the pairs a query may see (at most {useful[2]}, against "
               f"{useful[1]} for zig-zag), but three of every four striped tiles are crossed by "
               "the diagonal, and a kernel that skips only whole tiles computes their masked "
               "part too: how well a layout balances depends on the tile the kernel skips.")
        return
    prop = "your prediction equals the scores the busiest rank computes"
    expected_text = "the number that counting the computed tiles gives (check it afterwards)"
    if sorted(prediction) == sorted(expected):
        fail(prop, expected=expected_text, actual=prediction,
             hint="Your numbers are in the wrong order: contiguous, then zig-zag, then striped.")
    if prediction == _busiest(64, 8, tile=4, useful=True):
        fail(prop, expected=expected_text, actual=prediction,
             hint="You counted only the unmasked pairs. A tile crossed by the diagonal is "
                  "computed whole (then masked): count its full area.")
    if prediction == _busiest(64, 8, tile=4, reduce=_mean):
        fail(prop, expected=expected_text, actual=prediction,
             hint="That is the average rank. Find the busiest: with contiguous shards it is "
                  "the last one.")
    if prediction[0] == 512:
        fail(prop, expected=expected_text, actual=prediction,
             hint="512 is the chapter's count for contiguous shards, with one tile per block of "
                  "T / P = 8 positions. " + _PREDICTION_HINTS[0][1])
    if prediction[2] == 512:
        fail(prop, expected=expected_text, actual=prediction,
             hint="512 means every tile of every block. " + _PREDICTION_HINTS[2][1])
    for index, (layout, layout_hint) in _PREDICTION_HINTS.items():
        if prediction[index] != expected[index]:
            fail(prop, expected=expected_text, actual=prediction,
                 hint=f"The {layout} number is off. " + layout_hint)


# --------------------------------------------------------------------------- 17.3 striped


@checker
def check_striped_positions(fn) -> None:
    """Check ``fn(seq_len, world_size, rank)`` gives a striped layout's positions.

    Rank ``r`` holds ``r, r + P, r + 2P, …`` (Striped Attention); a length not divisible by
    ``P`` raises ``ValueError``.

    Args:
        fn: the learner's ``striped_positions``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 17.
    """
    for seq_len, world_size in ((8, 4), (12, 3), (16, 4), (6, 1), (10, 2)):
        for rank in range(world_size):
            label = f"striped_positions({seq_len}, {world_size}, {rank})"
            positions = call(fn, seq_len, world_size, rank)
            expect_shape(label, positions, (seq_len // world_size,),
                         hint="Return a 1-d tensor of the T / P positions this rank holds.")
            expect_true(f"{label} is an integer tensor", positions.dtype == torch.int64,
                        expected="torch.int64", actual=positions.dtype,
                        hint="Positions index a tensor: build them with torch.arange, which "
                             "gives int64.")
            expected = torch.arange(rank, seq_len, world_size)
            if torch.equal(positions, expected):
                continue
            prop = f"{label} holds the right positions"
            contiguous = shard_positions(seq_len, world_size, rank, "contiguous")
            if torch.equal(positions, contiguous):
                fail(prop, expected=expected.tolist(), actual=positions.tolist(),
                     hint="That is the contiguous layout. In a striped layout the ranks take "
                          "turns: position t goes to rank t mod P.")
            if torch.equal(positions, expected + 1):
                fail(prop, expected=expected.tolist(), actual=positions.tolist(),
                     hint="Your positions are one too large: positions start at 0.")
            fail(prop, expected=expected.tolist(), actual=positions.tolist(),
                 hint="Position t belongs to rank t mod P: rank r holds r, r + P, r + 2P, ...")
    try:
        fn(10, 4, 0)
    except ValueError as error:
        named = {number for number in ("10", "4") if re.search(rf"(?<!\d){number}(?!\d)",
                                                               str(error))}
        expect_true("the ValueError names both numbers, T and world_size", len(named) == 2,
                    expected="a message with 10 and 4 in it", actual=repr(str(error)),
                    hint="say what went wrong with the learner's own numbers, e.g. "
                         "f\"seq_len = {seq_len} is not divisible by world_size = "
                         "{world_size}\"")
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001 - any other error becomes feedback
        fail("a length not divisible by world_size raises ValueError", expected="ValueError",
             actual=type(error).__name__, hint="raise ValueError(...) with a message that "
                                               "names T and world_size")
    else:
        fail("a length not divisible by world_size raises ValueError", expected="ValueError",
             actual="no error for striped_positions(10, 4, 0)",
             hint="With T = 10 and P = 4 the ranks would hold 3, 3, 2 and 2 positions: raise "
                  "ValueError naming T and world_size instead.")
    passed("position t goes to rank t mod P. With a causal mask every rank now holds early and "
           "late positions alike, so the work is nearly balanced: rank r computes only "
           "r * T / P pairs more than rank 0.")


# --------------------------------------------------------------------------- 17.4 the ring's step


def _empty_state(batch_heads_queries: tuple[int, int, int], d_v: int):
    """A rank's running result before any key: output 0, log-sum-exp -inf."""
    return (torch.zeros(*batch_heads_queries, d_v, dtype=torch.float64),
            torch.full(batch_heads_queries, float("-inf"), dtype=torch.float64))


def _ring_with_step(fn, query, key, value, world_size, layout):
    """Run a causal ring in one process with the learner's step; the whole output and lse."""
    seq_len = query.size(-2)
    outputs, sums = [], []
    for rank in range(world_size):
        mine = shard_positions(seq_len, world_size, rank, layout)
        out, lse = _empty_state((*query.shape[:2], mine.numel()), value.size(-1))
        for step in range(world_size):
            theirs = shard_positions(seq_len, world_size, (rank - step) % world_size, layout)
            result = call(fn, out, lse, query[..., mine, :], mine, key[..., theirs, :],
                          value[..., theirs, :], theirs)
            out, lse = _unpack_step(result, out.shape, lse.shape,
                                    f"rank {rank}, step {step} of a {layout} ring")
        outputs.append(out)
        sums.append(lse.unsqueeze(-1))
    return unshard(outputs, layout), unshard(sums, layout).squeeze(-1)


def _unpack_step(result, out_shape, lse_shape, label):
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"fold_block returns (out, lse) at {label}", expected="a tuple (out, lse)",
             actual=type(result).__name__, hint="return out, lse")
    for name, tensor, shape in zip(("out", "lse"), result, (out_shape, lse_shape), strict=True):
        expect_shape(f"{name} after {label}", tensor, shape,
                     hint="out keeps the shape (B, H, T_q, d_v) of the running output and lse "
                          "the shape (B, H, T_q); fold the block in without changing them.")
    return result


def _causal_reference(query, key, value):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, T)
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    return (F.scaled_dot_product_attention(query, key, value, is_causal=True),
            torch.logsumexp(scores.masked_fill(future, float("-inf")), dim=-1))


@checker
def check_fold_block(fn) -> None:
    """Check ``fn(out, lse, query, query_positions, key, value, key_positions)``, one ring step.

    It folds one block of keys and values into a rank's running result ``(out, lse)`` under
    a causal mask by true positions; it must start from an empty result (``out = 0``,
    ``lse = -inf``), leave rows that see no key of the block unchanged (no NaN), and make a
    zig-zag ring equal to attention over the whole sequence, also for scores near 1000.

    Args:
        fn: the learner's ``fold_block``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 17.
    """
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 16, 4, dtype=torch.float64) for _ in range(3))
    normalised = ("Keep the running result normalised: with lse_new = logaddexp(lse, logsumexp "
                  "of the block's masked scores), the old output weighs exp(lse - lse_new) and "
                  "each new key exp(score - lse_new).")
    positions = torch.arange(16)
    out, lse = _unpack_step(call(fn, *_empty_state((2, 3, 16), 4), query, positions, key,
                                 value, positions), (2, 3, 16, 4), (2, 3, 16),
                            "one block of the whole sequence")
    expected_out, expected_lse = _causal_reference(query, key, value)
    if torch.allclose(out, F.scaled_dot_product_attention(query, key, value), atol=1e-8):
        fail("the block is masked causally by position", expected="causal attention",
             actual="attention without a mask",
             hint="A query at position p may see a key at position t only when t <= p: mask "
                  "the scores where key_positions[None, :] > query_positions[:, None].")
    expect_true("one block of the whole sequence gives causal attention and its log-sum-exp",
                torch.allclose(out, expected_out, atol=1e-8)
                and torch.allclose(lse, expected_lse, atol=1e-8),
                expected="F.scaled_dot_product_attention(..., is_causal=True) and the "
                         "log-sum-exp of the masked scores", actual="other values",
                hint="Scale the scores by 1 / sqrt(d) and mask the future. " + normalised)
    early, middle, late = torch.arange(0, 4), torch.arange(4, 8), torch.arange(12, 16)
    out, _ = _unpack_step(call(fn, *_empty_state((2, 3, 4), 4), query[..., middle, :], middle,
                               key[..., early, :], value[..., early, :], early),
                          (2, 3, 4, 4), (2, 3, 4), "a block of earlier positions")
    expect_true("queries at positions 4-7 see every key of a block at positions 0-3",
                torch.allclose(out, F.scaled_dot_product_attention(
                    query[..., middle, :], key[..., early, :], value[..., early, :]), atol=1e-8),
                expected="attention over all 4 keys, without a mask", actual="other values",
                hint="Build the mask from query_positions and key_positions, never from the "
                     "indices of the rows and columns: a block from another rank does not start "
                     "at your queries' positions, and zig-zag shards are not even in order.")
    out, lse = _unpack_step(call(fn, *_empty_state((2, 3, 4), 4), query[..., early, :], early,
                                 key[..., late, :], value[..., late, :], late),
                            (2, 3, 4, 4), (2, 3, 4), "a block wholly in the future")
    expect_true("folding a block wholly in the future into the empty result keeps it empty, "
                "without NaN", bool((out == 0).all() and torch.isneginf(lse).all()),
                expected="out = 0 and lse = -inf", actual="NaN or other values",
                hint="Before the first visible key every lse is -inf, and exp(-inf - (-inf)) is "
                     "NaN. Measure every exponent from a shift that is 0 where the new lse is "
                     "-inf: torch.where(torch.isfinite(lse), lse, 0.0).")
    for scale, label in ((1.0, ""), (300.0, " with scores near 1000")):
        for layout in ("contiguous", "zigzag"):
            out, lse = _ring_with_step(fn, query * scale, key, value, 4, layout)
            expected_out, expected_lse = _causal_reference(query * scale, key, value)
            expect_true(f"a causal {layout} ring of 4 ranks equals attention on one "
                        f"device{label}",
                        bool(torch.isfinite(out).all()) and torch.allclose(out, expected_out,
                                                                           atol=1e-8)
                        and torch.allclose(lse, expected_lse, atol=1e-8),
                        expected="causal attention of the whole sequence, and its log-sum-exp",
                        actual="NaN or other values",
                        hint="Both factors, exp(lse - lse_new) and exp(score - lse_new), are at "
                             "most 1, so nothing overflows even near 1000. " + normalised)
    start = (torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randn(2, 3, 4,
                                                                      dtype=torch.float64))
    out, lse = _unpack_step(call(fn, *start, query[..., early, :], early, key[..., late, :],
                                 value[..., late, :], late), (2, 3, 4, 4), (2, 3, 4),
                            "a block wholly in the future")
    expect_true("a block wholly in the future leaves a running result unchanged",
                torch.allclose(out, start[0]) and torch.allclose(lse, start[1]),
                expected="the same out and lse", actual="a changed result",
                hint="Every score of such a block is masked to -inf, so it adds exp(-inf) = 0 "
                     "to every row: the result must not move.")
    passed("your step folds any block into the running result, from an empty start, with rows "
           "that see nothing and with scores near 1000: a zig-zag ring built on it equals "
           "attention on one device.")


# --------------------------------------------------------------------------- 17.5 property test


def _safe(lse):
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _ring_with(bug: str | None):
    """Ring attention simulated in one process, with an optional bug (None: healthy)."""

    def attend(query, key, value, world_size, is_causal=False, layout="contiguous"):
        if bug == "batch and heads":  # folds (B, H) into one axis, unfolds it as (H, B)
            batch, heads = query.shape[:2]
            folded = [t.reshape(batch * heads, 1, *t.shape[2:]) for t in (query, key, value)]
            out = _ring_with(None)(*folded, world_size, is_causal=is_causal, layout=layout)
            return out.reshape(heads, batch, *out.shape[2:]).transpose(0, 1)  # (B, H, T, d_v)
        seq_len, scale = query.size(-2), 1.0 / math.sqrt(query.size(-1))
        positions = [shard_positions(seq_len, world_size, r, layout) for r in range(world_size)]
        believed = positions
        if bug == "contiguous rules":  # masks as if the shards were contiguous
            believed = [shard_positions(seq_len, world_size, r, "contiguous")
                        for r in range(world_size)]
        masked = (is_causal or bug == "always causal") and bug != "future leak"
        outputs = []
        for rank in range(world_size):
            q = query[..., positions[rank], :]
            out = lse = None
            for step in range(world_size):
                source = (rank - step) % world_size  # where the block really comes from
                if bug == "same neighbour" and world_size == 2 and step > 0:
                    source = rank  # its next and previous rank are one: keeps what it sent
                label = (rank + step) % world_size if bug == "wrong neighbour" else source
                k, v = key[..., positions[source], :], value[..., positions[source], :]
                if bug == "16-bit transfer" and source != rank:  # what travels, in bfloat16
                    k, v = (t.to(torch.bfloat16).to(t.dtype) for t in (k, v))
                if bug == "stale values" and layout == "contiguous" and not is_causal:
                    v = value[..., positions[(source - 1) % world_size], :]  # the block before
                scores = q @ k.transpose(-2, -1) * scale  # (..., T/P, T/P)
                if masked:
                    future = believed[label][None, :] > believed[rank][:, None]
                    scores = scores.masked_fill(future, float("-inf"))
                part_lse = torch.logsumexp(scores, dim=-1)
                part_out = torch.exp(scores - _safe(part_lse).unsqueeze(-1)) @ v
                if out is None:
                    out, lse = part_out, part_lse
                elif bug == "equal average":
                    out, lse = (out + part_out) / 2, torch.logaddexp(lse, part_lse)
                else:
                    new = torch.logaddexp(lse, part_lse)
                    out = (out * torch.exp(lse - _safe(new)).unsqueeze(-1)
                           + part_out * torch.exp(part_lse - _safe(new)).unsqueeze(-1))
                    lse = new
            outputs.append(out)
        return unshard(outputs, layout)

    return attend


def _from(function):
    """The subject ``attend`` that calls ``function``: every subject has the same name."""

    def attend(query, key, value, world_size, is_causal=False, layout="contiguous"):
        return function(query, key, value, world_size, is_causal=is_causal, layout=layout)

    return attend


def _whole_sequence(query, key, value, world_size, is_causal=False, layout="contiguous"):
    """A healthy subject that ignores the ranks: attention over the whole sequence."""
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal)


# The subjects that only a few configurations catch come first, so that a weak test meets the
# bug it misses early; the order changes nothing else.
_SUBJECTS = [
    ("a ring that folds the batch and head axes into one in one order and unfolds them in the "
     "other (wrong only when B > 1 and H > 1)", _ring_with("batch and heads"), False),
    ("a ring that, with two ranks, whose next and previous rank are the same, keeps the block "
     "it sent instead of the one it received (wrong only for P = 2)",
     _ring_with("same neighbour"), False),
    ("a ring that applies the causal mask even when is_causal=False (wrong only without the "
     "mask)", _ring_with("always causal"), False),
    ("a ring whose path for contiguous shards without a mask folds each block's keys with the "
     "values of the block before it (wrong only for contiguous shards without the mask)",
     _ring_with("stale values"), False),
    ("a ring that masks as if the shards were contiguous (wrong only for causal zig-zag)",
     _ring_with("contiguous rules"), False),
    ("a ring that thinks its blocks come from the other neighbour (wrong only when causal "
     "with P >= 3)", _ring_with("wrong neighbour"), False),
    ("a ring that forgets the causal mask inside a block (wrong whenever causal)",
     _ring_with("future leak"), False),
    ("a ring that averages the blocks' outputs (wrong for any P >= 2)",
     _ring_with("equal average"), False),
    ("a ring that sends its key and value blocks in bfloat16 (off by a few thousandths, for "
     "any P >= 2)", _ring_with("16-bit transfer"), False),
    ("the package's simulate_ring_attention", _from(simulate_ring_attention), True),
    ("attention over the whole sequence, ignoring the ranks", _from(_whole_sequence), True),
    ("a healthy ring written another way", _ring_with(None), True),
]
_NUM_HEALTHY = sum(healthy for _, _, healthy in _SUBJECTS)


@checker
def check_matches_whole_sequence(fn) -> None:
    """Check the property test ``fn(attend) -> bool`` against healthy and broken subjects.

    ``attend(query, key, value, world_size, is_causal=..., layout=...)`` returns the output of
    the whole sequence from ``world_size`` simulated ranks; the test must pass every healthy
    subject and catch every broken one. Each broken one is wrong only in some configurations
    (with or without the causal mask, one layout, some world sizes, ``B > 1`` and ``H > 1``),
    and no single configuration shows them all.

    Args:
        fn: the learner's ``matches_whole_sequence``.

    Returns:
        True when every verdict is right (the decorator prints the feedback).

    Taught in chapter 17.
    """
    outcomes = call_in_private_order([partial(call, fn, subject) for _, subject, _ in _SUBJECTS])
    for (name, _, healthy), outcome in zip(_SUBJECTS, outcomes, strict=True):
        verdict = outcome.get()
        if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
            verdict = bool(verdict)
        if not isinstance(verdict, bool):
            fail("the test returns True or False", expected="a bool",
                 actual=type(verdict).__name__,
                 hint="return the result of the comparisons, e.g. all(...) of torch.allclose")
        if healthy and not verdict:
            fail(f"a healthy subject passes your test: {name}", expected="True", actual="False",
                 hint="compare with F.scaled_dot_product_attention within a tolerance "
                      "(torch.allclose(..., atol=1e-6)), not exactly: the ring adds its blocks "
                      "in another order; use a length every layout splits (e.g. T = 24) and "
                      "call attend(q, k, v, P, is_causal=..., layout=...) with keywords")
        if not healthy and verdict:
            hint = ("some bugs show only in some configurations: try every world size from "
                    "1 to 4, with and without is_causal, both layouts, and inputs with "
                    "B > 1 and H > 1 (one configuration, or one value of any of these, "
                    "misses some bug)")
            if "bfloat16" in name:
                hint = ("compare within a tolerance near the rounding of your inputs "
                        "(torch.allclose(..., atol=1e-6) in float64): this ring is off by a "
                        "few thousandths everywhere, which a loose tolerance such as 0.05 "
                        "lets through")
            fail(f"your test catches a broken subject: {name}", expected="False",
                 actual="True", hint=hint)
    passed(f"your test passes the {_NUM_HEALTHY} healthy subjects and catches all "
           f"{len(_SUBJECTS) - _NUM_HEALTHY} broken ones, including bugs that show only with "
           "the causal mask or only without it, in one layout, at one world size, or with "
           "several sequences and heads: no single configuration catches them all.")
