"""Checkers for chapter 19's exercises (top-k attention, the lightning indexer, the output
gate): which keys top-k chooses (a prediction), a top-k attention whose future keys took the
places (a bug hunt), the indexer's score without a loop (practice), the k a budget of FLOPs
buys (a variant) and an output gate (a variant).

Taught in chapter 19.
"""

from __future__ import annotations

import torch
from torch import nn

from ..sparse import lightning_indexer_scores, topk_attention
from .feedback import call, checker, expect_close, expect_int, expect_shape, fail, passed

__all__ = [
    "check_predicted_choice",
    "check_causal_topk_attention",
    "check_indexer_scores",
    "check_largest_k",
    "check_gated_heads",
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


# --------------------------------------------------------------------------- 19.3 practice


@checker
def check_indexer_scores(fn) -> None:
    """Check ``fn(index_queries, index_keys, head_weights)`` is the lightning indexer's score.

    Args:
        fn: the learner's ``indexer_scores``.

    Returns:
        True when it matches :func:`~attention_book.lightning_indexer_scores`.

    Taught in chapter 19.
    """
    index_queries = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # (1, 1, 2, 2)
    index_keys = torch.tensor([[[2.0, -1.0], [-1.0, 3.0], [1.0, 1.0]]])  # (1, 3, 2)
    head_weights = torch.tensor([[[0.5, -2.0]]])  # (1, 1, 2): a negative weight counts
    by_hand = call(fn, index_queries, index_keys, head_weights)
    expected = torch.tensor([[[1.0, -6.0, -1.5]]])
    expect_shape("the scores of one query and three keys", by_hand, (1, 1, 3),
                 hint="return (B, T_q, T_k): one score per query and key, summed over the heads")
    relu_of_sum = torch.relu(torch.einsum("bth,bthd,bsd->bts", head_weights, index_queries,
                                          index_keys))  # (1, 1, 3): [3, 0, 0]
    if torch.allclose(by_hand.detach().to(relu_of_sum.dtype), relu_of_sum, atol=1e-6):
        fail("the weights multiply each head's ReLU, not the sum", expected=expected.tolist(),
             actual=by_hand.tolist(), hint="ReLU each head's dot product first, then weight it "
             "by w[t, j] (which may be negative) and sum over the heads")
    expect_close("the scores of the example (weights 0.5 and -2)", by_hand, expected,
                 hint="I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s]): the ReLU comes before "
                      "the weight")
    generator = torch.Generator().manual_seed(3)
    index_queries = torch.randn(2, 5, 3, 4, generator=generator)
    index_keys = torch.randn(2, 6, 4, generator=generator)
    head_weights = torch.randn(2, 5, 3, generator=generator)
    expect_close("the scores of a batch of 2, 5 queries, 6 keys and 3 heads",
                 call(fn, index_queries, index_keys, head_weights),
                 lightning_indexer_scores(index_queries, index_keys, head_weights),
                 hint="keep the batch dimension apart: sequence b's queries read only sequence "
                      "b's keys")
    passed("your scores are sum_j w_j ReLU(q_j . k) for every query and key")


# --------------------------------------------------------------------------- 19.4 variant


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
         (10**10, 128 * 1024 - 1, 8256, 40960)),
        ("the last query of 1M tokens, 10 GFLOP: the indexer alone costs more",
         (10**10, 2**20 - 1, 8256, 40960)),
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
        hint = "cost = 2 * ((position + 1) * indexer_per_pair + k * attention_per_pair) must " \
               "not exceed the budget: solve for k and round down"
        if want == 0:
            hint = "when the indexer alone costs more than the budget, no k fits: return 0"
        elif want == args[1] + 1:
            hint = "k never exceeds the position + 1 keys the query sees"
        elif got == want + 1:
            hint = "round down: k = (budget - indexer cost) // (2 * attention_per_pair)"
        elif got in (_largest_k(args[0], args[1] - 1, args[2], args[3]),
                     _largest_k(2 * args[0], *args[1:]), _largest_k(args[0] // 2, *args[1:])):
            hint = "query t sees t + 1 keys, and a multiply-add is two FLOPs"
        fail(f"the largest k for {description}", expected=want, actual=got, hint=hint)
    passed("your k is the most keys the budget buys after the indexer has scored every visible "
           "key: at 128k tokens 10 GFLOP buys 95,651 keys, at 1M none")


# --------------------------------------------------------------------------- 19.5 variant


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

