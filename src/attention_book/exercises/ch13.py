"""Checkers for chapter 13 (sliding windows, attention sinks, masks as rules, latent attention)."""

from __future__ import annotations

import math

import torch

from ..attention import causal_mask, sliding_window_mask, softmax_with_sink
from ..mods import materialize
from ._feedback import call, checker, expect_close, expect_shape, expect_true, fail, passed

__all__ = [
    "check_streaming_sink_mask",
    "check_chunked_attention_rule",
    "check_sink_weights_prediction",
    "check_fixed_absorbed_attention",
]


# --------------------------------------------------------------------------- exercise 13.1


def _streaming_reference(num_tokens: int, window: int, num_sinks: int) -> torch.Tensor:
    sinks = causal_mask(num_tokens) & (torch.arange(num_tokens) < num_sinks)  # (T, T)
    return sliding_window_mask(num_tokens, window) | sinks  # (T, T)


@checker
def check_streaming_sink_mask(fn) -> None:
    """Check ``fn(num_tokens, window, num_sinks)``, StreamingLLM's boolean mask.

    Taught in chapter 13 (Exercise 13.1).
    """
    for num_tokens, window, num_sinks in ((8, 3, 2), (6, 2, 1), (5, 5, 0), (7, 1, 3)):
        expected = _streaming_reference(num_tokens, window, num_sinks)
        mask = call(fn, num_tokens, window, num_sinks)
        expect_shape(f"streaming_mask({num_tokens}, {window}, {num_sinks})", mask,
                     (num_tokens, num_tokens), hint="one row per query, one column per key")
        expect_true("the mask is boolean", mask.dtype == torch.bool,
                    expected="dtype torch.bool", actual=f"dtype {mask.dtype}",
                    hint="combine boolean masks with & and |; True means 'may attend'")
        if bool((mask & ~causal_mask(num_tokens)).any()):
            fail(f"no query sees a future key (T={num_tokens}, window={window}, "
                 f"sinks={num_sinks})", expected="False above the diagonal",
                 actual="True somewhere above the diagonal",
                 hint="a sink token is kept only for the queries that come after it: "
                      "combine the first-tokens condition with the causal mask")
        missing_sinks = expected & ~mask
        extra = mask & ~expected
        if bool(missing_sinks.any()):
            q, k = (int(i) for i in torch.nonzero(missing_sinks)[0])
            in_window = 0 <= q - k < window
            fail(f"query {q} may attend to key {k} (T={num_tokens}, window={window}, "
                 f"sinks={num_sinks})", expected="True", actual="False",
                 hint=("the window counts the query's own position: keys q - window + 1 "
                       "to q" if in_window else
                       "the first num_sinks keys stay visible to every later query, "
                       "however far back they are"))
        if bool(extra.any()):
            q, k = (int(i) for i in torch.nonzero(extra)[0])
            fail(f"query {q} may not attend to key {k} (T={num_tokens}, window={window}, "
                 f"sinks={num_sinks})", expected="False", actual="True",
                 hint="a key is allowed only when it is one of the first num_sinks tokens or "
                      "among the window's keys q - window + 1 to q; check for an off-by-one "
                      "in the window or in the number of sinks")
    passed("causal, the first num_sinks keys, and a window of recent keys that counts the "
           "query itself.")


# --------------------------------------------------------------------------- exercise 13.2


@checker
def check_chunked_attention_rule(fn) -> None:
    """Check ``fn(chunk_size)``, which returns the chunked-attention rule ``allowed(b, h, q, k)``.

    Taught in chapter 13 (Exercise 13.2).
    """
    for chunk_size, num_tokens in ((3, 8), (2, 5), (4, 4), (1, 3)):
        rule = call(fn, chunk_size)
        expect_true("chunked_rule returns a rule", callable(rule),
                    expected="a function allowed(b, h, q_idx, kv_idx)",
                    actual=type(rule).__name__,
                    hint="define `def allowed(b, h, q_idx, kv_idx): ...` inside chunked_rule "
                         "and return it, without calling it")
        positions = torch.arange(num_tokens)
        same_chunk = positions[:, None] // chunk_size == positions[None, :] // chunk_size
        expected = same_chunk & causal_mask(num_tokens)  # (T, T)
        try:
            mask = materialize(rule, 1, 1, num_tokens)[0, 0]  # (T, T)
        except Exception as error:  # noqa: BLE001 - the learner's rule becomes feedback
            fail("the rule works on whole grids of indices", expected="no error",
                 actual=f"{type(error).__name__}: {error}",
                 hint="use tensor operations only (&, |, ==, <=, //), not `and`, `or`, `if` "
                      "or int(): the rule receives tensors of indices")
        if bool((mask & ~causal_mask(num_tokens)).any()):
            fail(f"no query sees a future key (chunk_size={chunk_size})",
                 expected="False above the diagonal", actual="True somewhere above it",
                 hint="within a chunk attention is still causal: also require kv_idx <= q_idx")
        if not torch.equal(mask, expected):
            q, k = (int(i) for i in torch.nonzero(mask != expected)[0])
            fail(f"query {q} and key {k} with chunk_size={chunk_size}",
                 expected=bool(expected[q, k]), actual=bool(mask[q, k]),
                 hint="two positions share a chunk when q_idx // chunk_size equals "
                      "kv_idx // chunk_size; a sliding window (q_idx - kv_idx < chunk_size) "
                      "is a different mask")
    passed("causal attention inside each chunk, written as a rule that works on index grids.")


# --------------------------------------------------------------------------- exercise 13.3


@checker
def check_sink_weights_prediction(fn) -> None:
    """Check ``fn()``, the predicted ``([w_0, …, w_3], sink_share)`` of exercise 13.3.

    Taught in chapter 13 (Exercise 13.3).
    """
    scores = torch.tensor([math.log(3.0), 0.0, 0.0, math.log(2.0)], dtype=torch.float64)
    sink = math.log(2.0)
    expected = softmax_with_sink(scores, sink)  # (4,)
    expected_share = 1.0 - expected.sum().item()
    result = call(fn)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        fail("predicted_sink_weights returns a pair", expected="([w_0, w_1, w_2, w_3], share)",
             actual=type(result).__name__, hint="return a list of four weights and one number")
    weights, share = result
    try:
        weights = torch.as_tensor([float(w) for w in weights], dtype=torch.float64)
        share = float(share)
    except (TypeError, ValueError):
        fail("the prediction holds numbers", expected="four numbers and one number",
             actual=repr(result)[:80], hint="write the weights as fractions, e.g. 1 / 9")
    expect_shape("the predicted weights", weights, (4,), hint="one weight per key, four keys")
    if torch.allclose(weights, torch.softmax(scores, -1), atol=1e-4):
        fail("the sink takes part of the weight", expected="weights that sum to less than 1",
             actual="the plain softmax, which sums to 1",
             hint="the sink's exponential joins the denominator: add exp(sink) to the sum "
                  "of the four keys' exponentials")
    expect_close("the predicted weights", weights, expected, atol=1e-4, hint=(
        "each weight is exp(score) divided by exp(sink) + the sum of the keys' exponentials; "
        "exp(ln 3) = 3 and exp(0) = 1"))
    expect_true("the sink's share is 1 minus the sum of the weights",
                abs(share - expected_share) <= 1e-4,
                expected="exp(sink) over the same denominator", actual=f"{share:.4g}",
                hint="the sink is one more term of the denominator; its share is its own "
                     "exponential over that denominator")
    passed("with the sink's exp(ln 2) = 2 the denominator is 9, and the sink keeps 2/9.")


# --------------------------------------------------------------------------- exercise 13.4


def _absorbed_inputs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(2, 3, 5, 4, generator=generator)  # (B, heads, T, head_dim)
    latents = torch.randn(2, 5, 16, generator=generator)  # (B, T, latent_dim)
    key_up = torch.randn(3, 4, 16, generator=generator) / 4  # (heads, head_dim, latent_dim)
    value_up = torch.randn(3, 4, 16, generator=generator) / 4  # (heads, head_dim, latent_dim)
    return queries, latents, key_up, value_up


def _plain_mla(queries, latents, key_up, value_up) -> torch.Tensor:
    keys = latents.unsqueeze(1) @ key_up.transpose(-2, -1)  # (B, heads, T, head_dim)
    values = latents.unsqueeze(1) @ value_up.transpose(-2, -1)  # (B, heads, T, head_dim)
    scores = queries @ keys.transpose(-2, -1) / math.sqrt(queries.size(-1))  # (B, heads, T, T)
    scores = scores.masked_fill(~causal_mask(scores.size(-1)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ values  # (B, heads, T, head_dim)


@checker
def check_fixed_absorbed_attention(fn) -> None:
    """Check ``fn(queries, latents, key_up, value_up)``, absorbed MLA equal to the plain form.

    Taught in chapter 13 (Exercise 13.4).
    """
    queries, latents, key_up, value_up = _absorbed_inputs(0)
    expected = _plain_mla(queries, latents, key_up, value_up)
    output = call(fn, queries, latents, key_up, value_up)
    expect_shape("the output", output, expected.shape, hint=(
        "the output has the plain form's shape (B, heads, T, head_dim): project the latent "
        "context up with value_up at the end"))
    changed = call(fn, queries, latents.clone().index_fill_(1, torch.tensor([4]), 5.0),
                   key_up, value_up)
    expect_true("changing the last token leaves the earlier outputs unchanged",
                torch.allclose(changed[..., :4, :], output[..., :4, :], atol=1e-5),
                expected="the causal mask kept", actual="earlier outputs moved",
                hint="keep the blog's causal mask; the bug is elsewhere")
    wrong_scale = torch.allclose(output, _plain_mla(queries * math.sqrt(4 / 16), latents, key_up,
                                                    value_up), atol=1e-5)
    if wrong_scale:
        fail("the absorbed scores equal the plain scores q . k / sqrt(head_dim)",
             expected="the plain form's output", actual="the output of scores scaled by "
             "1/sqrt(latent_dim)",
             hint="the absorbed query has latent_dim features, but the score is the same "
                  "number as in the plain form; which size did the plain form divide by?")
    expect_close("the output", output, expected, hint=(
        "compare the blog's code line by line with the plain form of section 13.5: the "
        "shapes are right, and one number that the scores are divided by is not"))
    passed("the absorbed form divides by sqrt(head_dim), like the plain form, and equals it.")
