"""Checkers for chapter 10's exercises: FLOPs when few queries meet many keys, the size of a
KV cache (a prediction), merging two partial softmax states (split-K decoding) and a decoding
step with a cache (a bug hunt).

Taught in chapter 10.
"""

from __future__ import annotations

import math

import torch

from ..attention import causal_mask
from ..kv_cache import KVCache
from ..modules import GroupedQueryAttention
from .feedback import call, checker, expect_int, expect_shape, expect_true, fail, hand_over, passed

__all__ = [
    "check_attention_flops",
    "check_predicted_cache_bytes",
    "check_combine",
    "check_cached_attention",
]



# --------------------------------------------------------------------------- 10.1 FLOPs


def _causal_pairs(num_queries: int, num_keys: int, *, top_left: bool = False) -> int:
    """Allowed (query, key) pairs of a causal mask of T_q queries over T_k keys."""
    offset = 0 if top_left else num_keys - num_queries
    return sum(min(i + offset + 1, num_keys) for i in range(num_queries))


@checker
def check_attention_flops(fn) -> None:
    """Check ``fn(batch_size, num_heads, num_queries, num_keys, head_dim, causal=False)``.

    Only the two matrix products count: the scores ``Q K^T`` and the weighted sum
    ``weights V``, each ``B * H * T_q * T_k * head_dim`` multiply-adds of 2 FLOPs. With
    ``causal=True`` only the (query, key) pairs that a bottom-right causal mask allows count
    (the new queries are the last ``T_q`` positions), as in a kernel that skips every blocked
    score: ``T_q * (T_k - T_q) + T_q * (T_q + 1) / 2`` pairs.

    Args:
        fn: the learner's ``attention_flops``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 10.
    """
    hint = ("Count the two products of one head: (T_q, head_dim) @ (head_dim, T_k) gives the "
            "scores and (T_q, T_k) @ (T_k, head_dim) the weighted sum; each is T_q * T_k * "
            "head_dim multiply-adds, and a multiply-add is 2 FLOPs.")
    cases = ((3, 5, 7, 11, 13), (2, 12, 1, 1024, 64), (1, 8, 16, 4096, 128), (1, 1, 4, 4, 2))
    for batch_size, num_heads, num_queries, num_keys, head_dim in cases:
        args = f"({batch_size}, {num_heads}, {num_queries}, {num_keys}, {head_dim})"
        per_pair = batch_size * num_heads * head_dim
        expected = 4 * per_pair * num_queries * num_keys
        actual = call(fn, batch_size, num_heads, num_queries, num_keys, head_dim)
        expect_int(f"attention_flops{args}", actual, "Return an int (use * and //, not /).")
        prop = f"attention_flops{args} has the right value"
        if num_queries != num_keys and actual == 4 * per_pair * num_keys**2:
            fail(prop, expected="the FLOPs of a T_q x T_k score matrix", actual=actual,
                 hint=f"You counted a square {num_keys} x {num_keys} score matrix. Each of the "
                      f"{num_queries} new queries meets each of the {num_keys} keys, so the "
                      "scores are T_q x T_k.")
        if num_queries != num_keys and actual == 4 * per_pair * num_queries**2:
            fail(prop, expected="the FLOPs of a T_q x T_k score matrix", actual=actual,
                 hint="You counted the queries twice. Each query meets every key, not every "
                      "other query, so the scores are T_q x T_k.")
        if actual * 2 == expected:
            fail(prop, expected="twice your number", actual=actual,
                 hint="Your count is half the answer. Count both products (the scores and the "
                      "weighted sum) and 2 FLOPs per multiply-add.")
        expect_true(prop, actual == expected, expected=expected, actual=actual, hint=hint)
    causal_cases = ((1, 1, 4, 4, 2), (2, 3, 5, 12, 8), (1, 12, 1, 4096, 64), (1, 8, 256, 1024, 64),
                    (2, 4, 9, 9, 16))
    for batch_size, num_heads, num_queries, num_keys, head_dim in causal_cases:
        args = f"({batch_size}, {num_heads}, {num_queries}, {num_keys}, {head_dim}, causal=True)"
        per_pair = batch_size * num_heads * head_dim
        expected = 4 * per_pair * _causal_pairs(num_queries, num_keys)
        actual = call(fn, batch_size, num_heads, num_queries, num_keys, head_dim, causal=True)
        expect_int(f"attention_flops{args}", actual, "Return an int (use * and //, not /).")
        prop = f"attention_flops{args} counts only the pairs the causal mask allows"
        full = 4 * per_pair * num_queries * num_keys
        if actual == expected:
            continue
        if actual == full:
            fail(prop, expected="fewer FLOPs than without the mask", actual=actual,
                 hint="With causal=True, count only the (query, key) pairs the mask allows: a "
                      "kernel that skips the blocked scores does no work for them.")
        if num_queries != num_keys and actual == 4 * per_pair * _causal_pairs(
                num_queries, num_keys, top_left=True):
            fail(prop, expected="the pairs of a causal mask aligned bottom-right", actual=actual,
                 hint="Your triangle is aligned top-left: query 0 sees only key 0. While "
                      "decoding, the new queries are the last T_q positions, so query i sees "
                      "the keys up to T_k - T_q + i.")
        if actual == 4 * per_pair * (_causal_pairs(num_queries, num_keys) - num_queries):
            fail(prop, expected="one more key for every query", actual=actual,
                 hint="A query may attend to its own position: count the diagonal too.")
        if actual * 2 == full:
            fail(prop, expected="more than half of the pairs", actual=actual,
                 hint="Half of the T_q x T_k pairs is not the count: even a square mask allows "
                      "its diagonal too. Count the keys each query sees, query by query, and add "
                      "them up.")
        expect_true(prop, actual == expected, expected=expected, actual=actual,
                    hint="Query i (of T_q) stands at position T_k - T_q + i and sees the keys 0 "
                         "... T_k - T_q + i. Add up those counts for every query, then apply the "
                         "4 FLOPs per (query, key) pair and per feature.")
    passed("T_q queries against T_k keys cost 4 * B * H * T_q * T_k * head_dim FLOPs; a causal "
           "kernel that skips the blocked scores needs T_q * (T_k - T_q) + T_q * (T_q + 1) / 2 "
           "pairs instead of T_q * T_k. One decoding step (T_q = 1) is linear in the cache's "
           "length, not quadratic, and the mask saves it nothing.")


# --------------------------------------------------------------------------- 10.2 prediction


def _measured_cache() -> KVCache:
    """Run the code of Exercise 10.2's prompt and return its cache."""
    torch.manual_seed(0)
    layer = GroupedQueryAttention(d_in=64, d_out=64, num_heads=8, num_kv_heads=2,
                                  context_length=40).eval()
    cache = KVCache(max_length=40)
    with torch.no_grad():
        layer(torch.randn(1, 10, 64), kv_cache=cache)  # a prompt of 10 tokens
        for _ in range(6):
            layer(torch.randn(1, 1, 64), kv_cache=cache)  # 6 more, one at a time
    return cache


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_cache_bytes(fn) -> None:
    """Check ``fn()`` predicts ``cache.nbytes`` after the code of Exercise 10.2.

    The prediction is compared with a run of that code; a wrong prediction gets a hint
    for each usual slip, never the number itself.

    Args:
        fn: the learner's ``predicted_cache_bytes``.

    Returns:
        True when the prediction is right (the decorator prints the feedback).

    Taught in chapter 10.
    """
    prediction = call(fn)
    expect_int("your prediction", prediction,
                "Return a whole number of bytes, an int such as 1000 (not a string or a float).")
    cache = _measured_cache()
    measured = cache.nbytes
    if prediction == measured:
        passed(f"the cache holds {len(cache)} tokens, but its buffers were allocated for "
               f"max_length = {cache.max_length} at the first update: {measured} bytes. The "
               "size depends on max_length, num_kv_heads and head_dim, never on num_heads.")
        return
    prop = "your prediction equals cache.nbytes"
    expected = "the number the code prints (run it once your prediction is written down)"
    tokens_held = measured * len(cache) // cache.max_length
    hints = {
        tokens_held: "You counted the 16 tokens the cache holds. Read again how KVCache "
                     "allocates its buffers: the size is fixed at the first update.",
        measured // 2: "Your prediction is half the size. Check that you counted both the keys "
                       "and the values, and the bytes of one float32 number.",
        measured * 2: "Your prediction is twice the size. A float32 number takes 4 bytes, and "
                      "each token stores one key and one value per key/value head.",
        measured * 4: "Your prediction is four times the size. A grouped-query layer stores only "
                      "its key/value heads, and each head holds d_out / num_heads features.",
        measured * 8: "Your prediction is eight times the size. Did you count bits instead of "
                      "bytes?",
        measured // 4: "Your prediction is a quarter of the size. cache.nbytes counts bytes, and "
                       "a float32 number takes 4 of them.",
    }
    hint = hints.get(prediction, "Work through the cache's buffers: their shape (batch, "
                                 "key/value heads, length, head_dim), two of them, and the "
                                 "bytes per float32 number.")
    fail(prop, expected=expected, actual=prediction, hint=hint)


# --------------------------------------------------------------------------- 10.3 combine


def _state(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """The partial softmax state (m, l, o) of ``query`` over one block of keys."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., T_q, T_k)
    m = scores.amax(dim=-1, keepdim=True)  # (..., T_q, 1)
    weights = torch.exp(scores - m)  # (..., T_q, T_k)
    return m, weights.sum(dim=-1, keepdim=True), weights @ value  # (.., 1), (.., 1), (.., d_v)


def _empty_state(like_m: torch.Tensor, like_o: torch.Tensor):
    return (torch.full_like(like_m, float("-inf")), torch.zeros_like(like_m),
            torch.zeros_like(like_o))


def _unpack_state(result: object, shapes, label: str):
    hint = "Return the three tensors m, l and o as a tuple: return m, l, o."
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        fail(f"combine returns a state (m, l, o) for {label}", expected="a tuple (m, l, o)",
             actual=type(result).__name__, hint=hint)
    for name, tensor, shape in zip("mlo", result, shapes, strict=True):
        expect_shape(f"{name} of the combined state for {label}", tensor, shape, hint=(
            "m and l keep the shape (..., 1) of the states you were given, o the shape "
            "(..., d_v); combine them elementwise, without summing over any dim."))
    return result


def _wrong_outputs(a, b):
    """What the usual wrong merges give as o / l, by name."""
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    up_a, up_b = torch.exp(m - m_a), torch.exp(m - m_b)  # the inverted factors
    down_a, down_b = torch.exp(m_a - m), torch.exp(m_b - m)
    return {
        "no rescaling": (o_a + o_b) / (l_a + l_b),
        "inverted factor": (o_a * up_a + o_b * up_b) / (l_a * up_a + l_b * up_b),
        "l not rescaled": (o_a * down_a + o_b * down_b) / (l_a + l_b),
        "o not rescaled": (o_a + o_b) / (l_a * down_a + l_b * down_b),
        "equal average": (o_a / l_a + o_b / l_b) / 2,
    }


_WRONG_HINTS = {
    "no rescaling": "You added the two states as they are. Each state is measured from its own "
                    "maximum: bring both to the larger maximum m = max(m_a, m_b) by multiplying "
                    "l and o of each by exp(m_its_own - m) before adding.",
    "inverted factor": "Your rescaling factor is upside down. Moving a state from its own "
                       "maximum to a larger one multiplies it by exp(m_own - m_new), which is at "
                       "most 1.",
    "l not rescaled": "You rescaled o but not l. Both are sums measured from the same maximum, "
                      "so both need the same factor.",
    "o not rescaled": "You rescaled l but not o. Both are sums measured from the same maximum, "
                      "so both need the same factor.",
    "equal average": "You averaged the two blocks' outputs with equal weight. A block whose "
                     "scores are larger deserves more weight: merge the unnormalised sums and "
                     "divide only once, at the end.",
}


@checker
def check_combine(fn) -> None:
    """Check ``fn(state_a, state_b)`` merges two partial softmax states ``(m, l, o)``.

    ``m`` is the block's largest score, ``l = sum(exp(s - m))`` and ``o = sum(exp(s - m) v)``
    (unnormalised); the merge of the states of two blocks of keys must be the state of both,
    so that ``o / l`` is the attention output, also for scores near 1000 and for a block in
    which every key is masked (``m = -inf``, ``l = 0``, ``o = 0``).

    Args:
        fn: the learner's ``combine``.

    Returns:
        True when every case is right (the decorator prints the feedback).

    Taught in chapter 10.
    """
    torch.manual_seed(0)
    query = torch.randn(2, 3, 4, 8)  # (B, H, T_q, d)
    key, value = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 5)  # (B, H, T_k, d), d_v = 5
    shapes = ((2, 3, 4, 1), (2, 3, 4, 1), (2, 3, 4, 5))
    a, b = _state(query, key[..., :4, :], value[..., :4, :]), _state(
        query, key[..., 4:, :], value[..., 4:, :])
    m, total, o = _unpack_state(call(fn, a, b), shapes, "two blocks of 4 and 6 keys")
    expected = torch.softmax(query @ key.transpose(-2, -1) / math.sqrt(8), dim=-1) @ value
    output = o / total  # (B, H, T_q, d_v)
    if not torch.allclose(output, expected, atol=1e-5, rtol=1e-4):
        for name, wrong in _wrong_outputs(a, b).items():
            if torch.allclose(output, wrong, atol=1e-5, rtol=1e-4):
                fail("o / l of the merged state is the attention output over all 10 keys",
                     expected="softmax over all 10 scores, times the values",
                     actual=f"a merge with {name}", hint=_WRONG_HINTS[name])
        fail("o / l of the merged state is the attention output over all 10 keys",
             expected="softmax over all 10 scores, times the values",
             actual="a different output", hint=_WRONG_HINTS["no rescaling"])
    want_m, want_l, _ = _state(query, key, value)
    expect_true("m of the merged state is the larger of the two maxima",
                torch.allclose(m, want_m), expected="max(m_a, m_b)",
                actual="another value",
                hint="The merged maximum is the larger of the two: torch.maximum(m_a, m_b).")
    expect_true("l of the merged state is the sum of exp(s - m) over all 10 keys",
                torch.allclose(total, want_l, atol=1e-5, rtol=1e-4),
                expected="the unnormalised sum, measured from the merged maximum",
                actual="another value",
                hint="Return the unnormalised state (do not divide o by l): a third block may "
                     "still have to be merged, and only the final o / l is the output.")

    big = _state(query * 300, key[..., :4, :], value[..., :4, :]), _state(
        query * 300, key[..., 4:, :], value[..., 4:, :])
    m, total, o = _unpack_state(call(fn, *big), shapes, "scores near 1000")
    expected = torch.softmax(query * 300 @ key.transpose(-2, -1) / math.sqrt(8), dim=-1) @ value
    expect_true("o / l stays finite and right for scores near 1000",
                bool(torch.isfinite(o / total).all()) and torch.allclose(o / total, expected, atol=1e-4,
                                                                     rtol=1e-4),
                expected="finite values equal to the attention output",
                actual="inf, NaN or wrong values",
                hint="Never exponentiate a raw maximum: each factor exp(m_own - m_new) is at "
                     "most 1, so nothing overflows.")

    empty = _empty_state(a[0], a[2])
    for order, states in (("(empty, full)", (empty, a)), ("(full, empty)", (a, empty))):
        m, total, o = _unpack_state(call(fn, *states), shapes, f"a fully masked block {order}")
        expect_true(f"merging with a fully masked block {order} changes nothing",
                    bool(torch.isfinite(total).all() and torch.isfinite(o).all())
                    and torch.allclose(o / total, a[2] / a[1], atol=1e-5, rtol=1e-4),
                    expected="the other block's state", actual="NaN or another state",
                    hint="A block whose keys are all masked has m = -inf, l = 0 and o = 0; its "
                         "factor exp(-inf - m_new) is 0, so it must add nothing.")
    m, total, o = _unpack_state(call(fn, empty, empty), shapes, "two fully masked blocks")
    expect_true("two fully masked blocks merge into an empty state without NaN",
                bool((total == 0).all() and (o == 0).all() and torch.isneginf(m).all()),
                expected="m = -inf, l = 0, o = 0", actual="NaN or other values",
                hint="When both maxima are -inf, exp(-inf - (-inf)) is NaN. Measure from a shift "
                     "that is 0 where the merged maximum is -inf, as my_tiled_attention does "
                     "with torch.where(new_max.isfinite(), new_max, 0.0).")
    passed("two partial states merge into the state of all their keys, exactly, in any order: "
           "this is how split-K decoding (FlashDecoding) spreads one long cache over many cores.")


# --------------------------------------------------------------------------- 10.4 bug hunt


def _reference_steps(query, key, value, steps):
    """The outputs of each step of a cached decode: rows of one full causal pass."""
    num_tokens = query.size(-2)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (B, H, T, T)
    scores = scores.masked_fill(~causal_mask(num_tokens), float("-inf"))
    full = torch.softmax(scores, dim=-1) @ value  # (B, H, T, d)
    rows, start = [], 0
    for size in steps:
        rows.append(full[..., start:start + size, :])
        start += size
    return rows


def _attend(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value


@checker
def check_cached_attention(fn) -> None:
    """Check ``fn(query_new, key_new, value_new, cache)`` is one correct cached decoding step.

    The function appends the new keys and values to the :class:`KVCache` and returns the
    outputs of the new positions: a prompt, single tokens and a chunk of several tokens
    must give the rows of one full causal pass.

    Args:
        fn: the learner's ``cached_attention``.

    Returns:
        True when every step is right (the decorator prints the feedback).

    Taught in chapter 10.
    """
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 2, 12, 4).unbind(0)  # each (B, H, T, head_dim)
    steps = (5, 1, 1, 3, 1, 1)
    expected = _reference_steps(query, key, value, steps)
    cache = hand_over(KVCache(max_length=64))  # the answer appends to it: read it back
    start = 0
    for step, size in enumerate(steps):
        end = start + size
        q_new, k_new, v_new = (t[..., start:end, :] for t in (query, key, value))
        label = (f"step {step + 1}: {size} new token{'s' if size > 1 else ''} after "
                 f"{start} cached")
        output = call(fn, q_new.clone(), k_new.clone(), v_new.clone(), cache,
                      prop=f"cached_attention runs ({label})")
        expect_true(f"after {label}, the cache holds {end} tokens", len(cache) == end,
                    expected=end, actual=len(cache),
                    hint="Append the new keys and values with cache.update(key_new, value_new) "
                         "exactly once per call, and attend over everything it returns.")
        expect_shape(f"the output of {label}", output, (2, 2, size, 4),
                     hint="Return the outputs of the new positions only: (B, H, T_new, "
                          "head_dim), one row per new query.")
        if torch.allclose(output, expected[step], atol=1e-5, rtol=1e-4):
            start = end
            continue
        keys, values = key[..., :end, :], value[..., :end, :]
        top_left = _attend(q_new, keys, values, torch.ones(size, end, dtype=torch.bool).tril())
        prop = f"the output of {label} equals the rows of one full causal pass"
        if start > 0 and torch.allclose(output, top_left, atol=1e-5, rtol=1e-4):
            fail(prop, expected="each new query sees every cached key and the new keys up to "
                                "itself", actual="the first new query sees only the first keys",
                 hint="is_causal=True aligns the causal triangle top-left, which is right only "
                      "while the queries and the keys have the same length (the prompt, on an "
                      "empty cache). The new queries are the last positions: align the mask "
                      "bottom-right.")
        if size > 1 and torch.allclose(output, _attend(q_new, keys, values), atol=1e-5,
                                       rtol=1e-4):
            fail(prop, expected="no new query sees the new tokens after it",
                 actual="every new query sees all the new tokens",
                 hint="With several new tokens at once (a prompt or a chunk), each one must not "
                      "see the new tokens after it: you still need a causal mask, aligned "
                      "bottom-right.")
        if torch.allclose(output, _attend(q_new, k_new, v_new, causal_mask(size)),
                          atol=1e-5, rtol=1e-4) and start > 0:
            fail(prop, expected="the new queries attend over every cached key",
                 actual="they attend over the new keys only",
                 hint="Attend over the keys and values that cache.update returns (all the "
                      "tokens so far), not over the new ones alone.")
        fail(prop, expected="the rows of one full causal pass", actual="different values",
             hint="Attend over all cached keys with a causal mask aligned bottom-right: new "
                  "query i may see keys 0 ... i + (T_cached - T_new).")
    passed("a prompt, single tokens and a chunk of three, each through the cache, give the "
           "rows of one full causal pass.")
