"""Checkers for chapter 19's exercises (top-k attention, the lightning indexer, the output
gate): which keys top-k chooses (a prediction), a top-k attention whose future keys took the
places (a bug hunt), the k a budget of FLOPs buys (a variant), an output gate (a variant), the
k that keeps a share of the needles (a variant) and how much work each number a kernel loads
pays for (a prediction).

Taught in chapter 19.
"""

from __future__ import annotations

import torch
from torch import nn

from ..sparse import topk_attention
from .feedback import call, checker, expect_close, expect_int, expect_shape, fail, passed

__all__ = [
    "check_predicted_choice",
    "check_causal_topk_attention",
    "check_largest_k",
    "check_gated_heads",
    "check_keys_needed",
    "check_predicted_reuse",
]

# Exercise 19.1's index scores: row = query, column = key.
PREDICTION_SCORES = ((5.0, 9.0, 9.0, 9.0), (1.0, 1.0, 8.0, 0.0), (4.0, 7.0, 5.0, 9.0),
                     (3.0, 3.0, 3.0, 3.0))


# --------------------------------------------------------------------------- 19.1 prediction


@checker(reveal=False)  # a prediction: the expected keys are kept back
def check_predicted_choice(fn) -> None:
    """Check ``fn()`` lists the keys causal top-2 attention chooses for exercise 19.1's scores.

    Args:
        fn: the learner's ``predicted_choice``, returning four pairs of positions.

    Returns:
        True when every pair is right (the decorator prints the feedback).

    Taught in chapter 19.
    """
    scores = torch.tensor(PREDICTION_SCORES).unsqueeze(0)  # (1, 4, 4)
    probe = torch.zeros(1, 1, 4, 1)  # (B, H, T, d): only the choice matters
    _, indices = topk_attention(probe, probe, probe, scores, 2, return_indices=True)
    expected = [tuple(row) for row in indices[0].tolist()]
    predicted = call(fn)
    if not isinstance(predicted, (list, tuple)) or len(predicted) != 4:
        fail("the prediction lists the chosen keys of the four queries",
             expected="a list of four pairs, such as [(0, -1), (0, 1), (0, 2), (1, 2)]",
             actual=repr(predicted)[:80], hint="one pair per query, in the queries' order",
             reveal=True)
    for query, (pair, want) in enumerate(zip(predicted, expected, strict=True)):
        try:
            pair = tuple(int(position) for position in pair)
        except (TypeError, ValueError):
            fail(f"query {query}'s entry is a pair of positions", expected="two ints",
                 actual=repr(pair)[:40], hint="write the pair as (first_key, second_key)",
                 reveal=True)
        if pair == want:
            continue
        hint = "a query sees only the keys at or before its position; break ties toward the " \
               "earlier key"
        if -1 in want and -1 not in pair:
            hint = "this query sees fewer than 2 keys: the empty place is -1"
        elif any(position > query for position in pair):
            hint = "a key after the query's position is in its future: causal top-k never " \
                   "chooses it, and it takes no place from the keys the query sees"
        elif list(pair) != sorted(pair, key=lambda p: (p == -1, p)):
            hint = "list the positions in increasing order, -1 last"
        fail(f"query {query} reads the right keys", expected=want, actual=pair, hint=hint)
    passed("you predicted every query's keys: the future is removed before the choice, and "
           "ties go to the earlier key")


# --------------------------------------------------------------------------- 19.2 bug hunt


def _bug_hunt_cases() -> list[tuple[str, tuple[torch.Tensor, ...], int]]:
    generator = torch.Generator().manual_seed(19)
    cases = []

    def draw(*shape):
        return torch.randn(*shape, generator=generator)

    # The colleague's failure: the future holds the best scores.
    future = torch.arange(6.0).expand(1, 6, 6).clone()  # key j scores j: later is better
    cases.append(("index scores that rise toward the future (the best keys are future keys)",
                  (draw(1, 2, 6, 4), draw(1, 2, 6, 4), draw(1, 2, 6, 4), future), 2))
    cases.append(("random scores, k = 3",
                  (draw(2, 2, 7, 4), draw(2, 2, 7, 4), draw(2, 2, 7, 4), draw(2, 7, 7)), 3))
    tied = draw(1, 8, 8).round().clamp(-1, 1)  # three values: the boundary is often a tie
    cases.append(("scores with ties (ties go to the earlier key)",
                  (draw(1, 2, 8, 4), draw(1, 2, 8, 4), draw(1, 2, 8, 4), tied), 3))
    cases.append(("grouped heads: 4 query heads share 2 key/value heads",
                  (draw(1, 4, 5, 4), draw(1, 2, 5, 4), draw(1, 2, 5, 4), draw(1, 5, 5)), 2))
    cases.append(("top_k = 9, more than the 5 tokens",
                  (draw(1, 2, 5, 4), draw(1, 2, 5, 4), draw(1, 2, 5, 4), draw(1, 5, 5)), 9))
    return cases


def _reads_future(fn, query, key, value, scores, top_k) -> bool:
    """Does changing a future value change any earlier output?"""
    before = call(fn, query, key, value, scores, top_k)
    changed = value.clone()
    changed[..., -1, :] += 100.0  # only the last token's value
    after = call(fn, query, key, changed, scores, top_k)
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    return not torch.allclose(before[..., :-1, :], after[..., :-1, :], atol=1e-4, equal_nan=True)


@checker
def check_causal_topk_attention(fn) -> None:
    """Check ``fn(query, key, value, index_scores, top_k)`` is causal top-k attention.

    It must equal :func:`~attention_book.topk_attention` (bottom-right causal, ties to the
    earlier key, ``top_k`` larger than ``T`` allowed, grouped heads) on cases where the
    best index scores lie in the future, with ties and with grouped heads, and no output may
    change when a future value changes.

    Args:
        fn: the learner's ``causal_topk_attention``.

    Returns:
        True when every case matches (the decorator prints the feedback).

    Taught in chapter 19.
    """
    for description, (query, key, value, scores), top_k in _bug_hunt_cases():
        if _reads_future(fn, query, key, value, scores, top_k):
            fail(f"no output reads a future token ({description})",
                 expected="the outputs of tokens 0 … T-2 unchanged when token T-1's value changes",
                 actual="they changed", hint="mask the future keys before you choose, and keep "
                 "the causal mask in the attention itself")
        output = call(fn, query, key, value, scores, top_k)
        expected = topk_attention(query, key, value, scores, top_k)
        expect_shape(f"the output ({description})", output, expected.shape,
                     hint="return (B, H, T, head_dim): one row per query and query head")
        if torch.isnan(output).any():
            fail(f"no NaN in the output ({description})", expected="finite values",
                 actual="NaN", hint="every query sees at least its own key: if a row has no "
                 "allowed key, the future took its places")
        if not torch.allclose(output, expected, atol=1e-5, rtol=1e-4):
            hint = "choose among the keys the query sees: a future key must not take one of the " \
                   "k places, because the causal mask then removes it and the query reads " \
                   "fewer than k keys"
            if "ties" in description:
                hint = "among equal scores at the boundary, the earlier key wins (a stable sort " \
                       "by descending score keeps the positions' order)"
            elif "grouped" in description:
                hint = "each key/value head serves num_heads // num_kv_heads consecutive query heads"
            elif "more than" in description:
                hint = "when top_k exceeds the keys, every visible key is read"
            expect_close(f"the output ({description})", output, expected, hint=hint)
    passed("your top-k attention chooses among the visible keys only, so no future key takes a "
           "place; ties, grouped heads and a k larger than T work")


# --------------------------------------------------------------------------- 19.3 variant


def _largest_k(budget: int, position: int, indexer_per_pair: int, attention_per_pair: int) -> int:
    visible = position + 1
    left = budget - 2 * visible * indexer_per_pair
    return 0 if left < 0 else min(visible, left // (2 * attention_per_pair))


@checker
def check_largest_k(fn) -> None:
    """Check ``fn(budget, position, indexer_per_pair, attention_per_pair)`` is the largest k.

    Args:
        fn: the learner's ``largest_k``.

    Returns:
        True when it is right on DeepSeek-V3.2's sizes and on edge cases.

    Taught in chapter 19.
    """
    cases = [
        ("DeepSeek-V3.2's sizes, the last query of 128k tokens, 10 GFLOP",
         (10**10, 128 * 1024 - 1, 8256, 139264)),
        ("the last query of 1M tokens, 10 GFLOP: the indexer alone costs more",
         (10**10, 2**20 - 1, 8256, 139264)),
        ("query 99 with a huge budget: it sees only 100 keys", (10**12, 99, 10, 10)),
        ("a budget that leaves exactly 42 FLOPs after the indexer", (2 * 100 * 10 + 42, 99, 10, 3)),
        ("a budget that leaves 41 FLOPs after the indexer", (2 * 100 * 10 + 41, 99, 10, 3)),
        ("a budget just under the indexer's cost", (2 * 100 * 10 - 1, 99, 10, 3)),
    ]
    for description, args in cases:
        got = call(fn, *args)
        expect_int(f"the k for {description}", got, hint="k is a whole number of keys: round "
                   "down (//) and return an int")
        want = _largest_k(*args)
        if got == want:
            continue
        hint = "add up what the query pays: the indexer on every key it sees, attention on the " \
               "k keys it reads, two FLOPs per multiply-add; the largest k whose total fits " \
               "the budget is the answer"
        if want == 0:
            hint = "when the indexer alone costs more than the budget, no k fits: return 0"
        elif want == args[1] + 1:
            hint = "k never exceeds the position + 1 keys the query sees"
        elif got == want + 1:
            hint = "one more key would cost more than the budget: round down, never to the nearest"
        elif got in (_largest_k(args[0], args[1] - 1, args[2], args[3]),
                     _largest_k(2 * args[0], *args[1:]), _largest_k(args[0] // 2, *args[1:])):
            hint = "query t sees t + 1 keys, and a multiply-add is two FLOPs"
        fail(f"the largest k for {description}", expected=want, actual=got, hint=hint)
    passed("your k is the most keys the budget buys after the indexer has scored every visible "
           "key: at 128k tokens 10 GFLOP buys 28,132 keys (attention in MLA's MQA mode), at 1M "
           "none")


# --------------------------------------------------------------------------- 19.4 variant


@checker
def check_gated_heads(fn) -> None:
    """Check ``fn(context_vec, x, gate_projection)`` merges the heads and gates each feature.

    Args:
        fn: the learner's ``gated_heads``.

    Returns:
        True when it matches the reference on heads of different sizes.

    Taught in chapter 19.
    """
    for num_heads, head_dim in ((2, 3), (3, 2)):
        generator = torch.Generator().manual_seed(num_heads)
        context_vec = torch.randn(2, num_heads, 4, head_dim, generator=generator)
        x = torch.randn(2, 4, 5, generator=generator)
        projection = nn.Linear(5, num_heads * head_dim)
        with torch.no_grad():
            projection.weight.copy_(torch.randn(num_heads * head_dim, 5, generator=generator))
            projection.bias.copy_(torch.randn(num_heads * head_dim, generator=generator))
        merged = context_vec.transpose(1, 2).reshape(2, 4, num_heads * head_dim)  # (B, T, H hd)
        expected = merged * torch.sigmoid(projection(x))
        got = call(fn, context_vec, x, projection)
        expect_shape(f"the gated heads ({num_heads} heads of {head_dim})", got,
                     expected.shape, hint="return (B, T, H * head_dim): the heads merged")
        got = got.detach()
        if torch.allclose(got, merged, atol=1e-5):
            fail("the gate changes the output", expected="merged heads times sigmoid(gate)",
                 actual="the merged heads unchanged", hint="multiply by torch.sigmoid of the "
                 "gate projection of x")
        if torch.allclose(got, merged * projection(x), atol=1e-5):
            fail("the gate is a sigmoid", expected="values between 0 and 1 multiply the heads",
                 actual="the raw projection multiplies them", hint="apply torch.sigmoid to the "
                 "projection")
        expect_close(f"the gated heads ({num_heads} heads of {head_dim})", got, expected,
                     hint="merge as the book's layers do: transpose to (B, T, H, head_dim), then "
                          "reshape, so head h fills features h * head_dim … (h + 1) * head_dim - 1; "
                          "then multiply element by element by sigmoid(gate_projection(x))")
    passed("each head's features are scaled by their own sigmoid gate, computed from the token")



# --------------------------------------------------------------------------- 19.5 variant


def _needle_ranks(index_scores: torch.Tensor, needle: torch.Tensor) -> torch.Tensor:
    """The place of each needle when its row's keys are sorted by score, ties to the earlier key.

    Shapes: index_scores ``(B, T)``, needle ``(B,)`` -> ``(B,)``, 1 for the best key.
    """
    positions = torch.arange(index_scores.size(-1))  # (T,)
    own = index_scores.gather(-1, needle[:, None])  # (B, 1)
    ahead = (index_scores > own) | ((index_scores == own) & (positions < needle[:, None]))
    return ahead.sum(dim=-1) + 1  # (B,)


def _keys_needed(index_scores: torch.Tensor, needle: torch.Tensor, fraction: float) -> int:
    ranks = _needle_ranks(index_scores, needle)  # (B,)
    return next(k for k in range(1, index_scores.size(-1) + 1)
                if (ranks <= k).double().mean().item() >= fraction)


def _needle_cases() -> list[tuple[str, torch.Tensor, torch.Tensor, float]]:
    cases = [
        ("one question, the needle (key 2) ranked second",
         torch.tensor([[0.1, 0.9, 0.5, 0.3]]), torch.tensor([2]), 1.0),
        ("one question whose needle (key 2) ties with keys 0 and 1",
         torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([2]), 1.0),
        ("one question whose needle (key 0) ties with keys 1 and 2",
         torch.tensor([[1.0, 1.0, 1.0, 0.0]]), torch.tensor([0]), 1.0),
    ]
    # Ten questions whose needles rank 1, 2, ..., 10: k keeps the needles ranked k or better.
    scores = torch.zeros(10, 12)  # (B, T)
    needle = torch.arange(10)  # (B,): question r's needle is key r
    for row in range(10):
        scores[row, :row] = 2.0  # the row keys before the needle score higher
        scores[row, row] = 1.0
    generator = torch.Generator().manual_seed(19)
    shuffle = torch.randperm(12, generator=generator)  # the ranks do not follow the positions
    scores, needle = scores[:, shuffle], torch.argsort(shuffle)[needle]
    cases += [(f"ten questions whose needles rank 1 ... 10, fraction {fraction}",
               scores, needle, fraction) for fraction in (0.9, 0.85, 0.5, 0.05, 1.0)]
    rounded = torch.randn(16, 40, generator=generator).round()  # many ties
    cases.append(("16 questions with many tied scores, fraction 0.75", rounded,
                  torch.randint(40, (16,), generator=generator), 0.75))
    return cases


@checker
def check_keys_needed(fn) -> None:
    """Check ``fn(index_scores, needle, fraction)`` is the smallest k that keeps that share.

    Args:
        fn: the learner's ``keys_needed``.

    Returns:
        True when it gives the smallest k whose top-k (ties to the earlier key) holds the
        needle for at least ``fraction`` of the questions, on every case.

    Taught in chapter 19.
    """
    for description, index_scores, needle, fraction in _needle_cases():
        got = call(fn, index_scores.clone(), needle.clone(), fraction)
        expect_int(f"the k for {description}", got, hint="k is a whole number of keys: return an "
                   "int")
        want = _keys_needed(index_scores, needle, fraction)
        if got == want:
            continue
        later_ties = (index_scores > index_scores.gather(-1, needle[:, None])).sum(dim=-1) + 1
        hint = "for each question, count the keys that top-k would take before its needle; " \
               "then find the smallest k that keeps enough needles"
        if "ties" in description and got == _keys_needed_from(later_ties, fraction):
            hint = "ties go to the earlier key, as in ab.topk_mask: an equal score at an " \
                   "earlier position comes before the needle, one at a later position after it"
        elif "fraction" not in description and got == want - 1:
            hint = "top-k with k keys holds a needle only if at most k - 1 keys come before it: " \
                   "count the needle itself"
        elif "fraction" in description and got < want:
            hint = "at least the fraction of the questions must keep their needle: round the " \
                   "number of questions up, never down"
        elif got > want:
            hint = "'at least': a share equal to the fraction is enough, and take one " \
                   "question's rank, with no interpolation between two questions' ranks"
        fail(f"the smallest k for {description}", expected=want, actual=got, hint=hint)
    passed("your k is the smallest that keeps the needle for the share of questions asked: "
           "rank each needle as top-k would (ties to the earlier key), then take the rank "
           "that share of the questions reach")


def _keys_needed_from(ranks: torch.Tensor, fraction: float) -> int:
    return next(k for k in range(1, int(ranks.max()) + 1)
                if (ranks <= k).double().mean().item() >= fraction)


# --------------------------------------------------------------------------- 19.6 prediction

# Multiply-adds per number of keys and values loaded: a dense tile, top-k gather, a kept tile.
REUSE = (128, 1, 128)


@checker(reveal=False)  # a prediction: the three numbers are kept back
def check_predicted_reuse(fn) -> None:
    """Check ``fn()`` gives exercise 19.6's multiply-adds per key/value number a kernel loads.

    Args:
        fn: the learner's ``predicted_reuse``, returning three numbers: a full tile of dense
            attention, top-k gather, a kept tile of block-sparse FlexAttention.

    Returns:
        True when all three are right (the decorator prints the feedback).

    Taught in chapter 19.
    """
    predicted = call(fn)
    if not isinstance(predicted, (list, tuple)) or len(predicted) != 3:
        fail("the prediction has three numbers", expected="a tuple (dense tile, top-k gather, "
             "block-sparse tile)", actual=repr(predicted)[:80], hint="return the three numbers "
             "in this order", reveal=True)
    try:
        values = tuple(float(value) for value in predicted)
    except (TypeError, ValueError):
        fail("each entry is a number", expected="three numbers", actual=repr(predicted)[:80],
             hint="multiply-adds per number loaded, for example 10 or 2.5", reveal=True)
    names = ("a full tile of dense attention", "top-k gather", "a kept tile of block-sparse "
             "FlexAttention")
    hints = {
        0: "a tile loads 128 keys and 128 values of 64 numbers each, and every one of its 128 "
           "queries uses all of them: once for its scores, once for its weighted sum",
        1: "each copied key and value belongs to one query only: how many multiply-adds does "
           "that query do with one number of it?",
        2: "the kernel runs a kept tile exactly as dense attention runs any tile",
    }
    for index, (value, want, name) in enumerate(zip(values, REUSE, names, strict=True)):
        if abs(value - want) <= 1e-6 * want:
            continue
        hint = hints[index]
        if abs(value - want / 2) <= 1e-6 * want:
            hint = "count both products: the scores q . k and the weighted sum of the values " \
                   "each take 64 multiply-adds per query and key"
        elif index != 1 and abs(value - 2 * want) <= 1e-6 * want:
            hint = "the values are loaded too: count the numbers of the keys and of the values"
        elif index == 1 and value >= 2:
            hint = "gather copies each query's keys anew: a copied key serves one query, not " \
                   "a block of them"
        fail(f"your number for {name}", expected=want, actual=value, hint=hint)
    passed("a dense or block-sparse tile does 128 multiply-adds for every number it loads, "
           "top-k gather 1: gather is limited by copying memory, tiles by arithmetic")
