"""Checkers for chapter 5's exercises (causal, prefix and padding masks)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .feedback import (
    call,
    call_in_private_order,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = ["check_prefix_lm_mask", "check_masked_softmax", "check_left_padded_mask",
           "check_is_causal_layer"]


def _causal(num_tokens: int) -> torch.Tensor:
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()  # (T, T)


def _reference_masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    masked = scores.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k)
    weights = torch.softmax(masked, dim=-1)  # (..., T_q, T_k)
    return torch.nan_to_num(weights, nan=0.0)  # fully masked rows: zeros


def _same(actual: object, candidate: torch.Tensor) -> bool:
    if not isinstance(actual, torch.Tensor) or actual.shape != candidate.shape:
        return False
    if candidate.dtype == torch.bool:
        return actual.dtype == torch.bool and bool(torch.equal(actual, candidate))
    # NaN counts as 0, so a mistake is named even when the answer also has NaN rows.
    actual = torch.nan_to_num(actual.detach().to(candidate.dtype), nan=0.0)
    return torch.allclose(actual, candidate, atol=1e-5)


def _expect_bool_mask(name: str, actual: object, shape: tuple[int, ...], shape_hint: str) -> None:
    expect_shape(name, actual, shape, hint=shape_hint)
    expect_true(f"{name} is boolean", actual.dtype == torch.bool,
                expected="dtype torch.bool", actual=f"dtype {actual.dtype}",
                hint="Build the mask from boolean tensors (comparisons, torch.ones(..., "
                     "dtype=torch.bool)) and combine them with & and |, not with * or +.")


# ---------------------------------------------------------------- exercise 5.1


def _prefix_lm(prefix_len: int, num_tokens: int) -> torch.Tensor:
    key = torch.arange(num_tokens)  # (T,)
    return _causal(num_tokens) | (key < prefix_len)[None, :]  # (T, T)


@checker
def check_prefix_lm_mask(fn) -> None:
    """Check ``fn(prefix_len, num_tokens)`` returns the prefix-LM mask, True = may attend.

    Every query may attend to the whole prefix (keys ``0 … prefix_len - 1``) and, causally,
    to the keys up to itself; a prefix query sees no key after the prefix.

    Taught in chapter 5.
    """
    prefix_len, num_tokens = 3, 6
    expected = _prefix_lm(prefix_len, num_tokens)
    actual = call(fn, prefix_len, num_tokens, prop="your function runs for prefix_len=3, "
                                                   "num_tokens=6")
    _expect_bool_mask("the mask for prefix_len=3, num_tokens=6", actual, (6, 6),
                      "Return one row per query and one column per key: shape "
                      "(num_tokens, num_tokens).")
    query = torch.arange(num_tokens)[:, None]  # (T, 1)
    key = torch.arange(num_tokens)[None, :]  # (1, T)
    in_prefix = (query < prefix_len) & (key < prefix_len)  # (T, T)
    known_mistakes = [
        (~expected, "Your mask is True where attending is forbidden. In this book True means "
                    "may attend."),
        (_causal(num_tokens), "Your mask is the plain causal mask. Inside the prefix every token "
                              "may see every other prefix token, also the later ones: query 0 "
                              "may attend to keys 0, 1 and 2."),
        (_causal(num_tokens) | (query < prefix_len),
         "Your prefix queries see the whole sequence. They may see the whole prefix, but not "
         "the tokens after it, which the model has to predict."),
        (in_prefix | (_causal(num_tokens) & (key >= prefix_len)),
         "The tokens after the prefix do not see the prefix. They may attend to the prefix and "
         "to the earlier tokens after it, as in a causal mask."),
        (_prefix_lm(prefix_len + 1, num_tokens), "Your prefix is one token too long. The prefix "
                                                 "is keys 0 to prefix_len - 1."),
        (_prefix_lm(prefix_len - 1, num_tokens), "Your prefix is one token too short. The "
                                                 "prefix is keys 0 to prefix_len - 1."),
    ]
    for candidate, hint in known_mistakes:
        if _same(actual, candidate):
            fail("query i may attend to every prefix key and to the keys 0..i",
                 expected="the prefix-LM mask", actual=f"{actual.int().tolist()}", hint=hint)
    expect_true("query i may attend to every prefix key and to the keys 0..i",
                bool(torch.equal(actual, expected)), expected="the prefix-LM mask",
                actual=f"{actual.int().tolist()}",
                hint="Combine two conditions with |: key j <= query i (causal), or key j is in "
                     "the prefix (j < prefix_len).")
    for size_prefix, size in ((0, 4), (5, 5), (2, 7)):
        result = call(fn, size_prefix, size)
        expect_true(f"the mask for prefix_len={size_prefix}, num_tokens={size} is right",
                    _same(result, _prefix_lm(size_prefix, size)),
                    expected=("the plain causal mask" if size_prefix == 0 else
                              "all True" if size_prefix == size else "the prefix-LM mask"),
                    actual=result.int().tolist() if isinstance(result, torch.Tensor) else result,
                    hint="Use both arguments instead of fixed sizes; with prefix_len=0 the mask "
                         "is causal, with prefix_len=num_tokens every token sees every token.")
    passed("the prefix is read both ways and the rest causally; prefix_len=0 gives the causal "
           "mask and prefix_len=T the full one.")


# ---------------------------------------------------------------- exercise 5.2


@checker
def check_masked_softmax(fn) -> None:
    """Check ``fn(scores, mask)``: ``-inf`` where ``mask`` is False, softmax, zeros for empty rows.

    Names the usual slips, among them a large finite fill value such as ``-1e9``, which
    turns a fully masked row into a uniform one instead of zeros.

    Taught in chapter 5.
    """
    torch.manual_seed(0)
    scores = torch.randn(2, 4, 4)  # (B, T, T)
    mask = _causal(4).expand(2, 4, 4).clone()  # (B, T, T)
    mask[1, 2] = False  # one query that may attend to nothing
    expected = _reference_masked_softmax(scores, mask)
    actual = call(fn, scores.clone(), mask.clone())
    expect_shape("the weight matrix for scores of shape (2, 4, 4)", actual, (2, 4, 4),
                 hint="Return weights of the shape of the scores, normalised over dim=-1.")
    wrong_ways = {
        "the masked scores were set to 0, not -inf, so masked keys still get weight exp(0)":
            torch.softmax(scores * mask, dim=-1),
        "the polarity is inverted: you blocked where the mask is True":
            _reference_masked_softmax(scores, ~mask),
        "masked positions were zeroed after the softmax, but the rows were not renormalised":
            torch.softmax(scores, dim=-1) * mask,
    }
    for mistake, candidate in wrong_ways.items():
        if _same(actual, candidate):
            fail("masked keys get weight 0 and each row sums to 1",
                 expected="softmax(scores.masked_fill(~mask, -inf)) over the last dim",
                 actual=mistake,
                 hint="Fill the blocked scores with float('-inf') using masked_fill(~mask, ...), "
                      "then take the softmax over dim=-1.")
    for fill in (-1e9, -1e4, torch.finfo(torch.float32).min):
        if _same(actual, torch.softmax(scores.masked_fill(~mask, fill), dim=-1)):
            fail("a fully masked row gives zeros", expected="a row of zeros",
                 actual=f"a uniform row (0.25 on every key): blocked scores were filled with "
                        f"{fill:g}, not -inf",
                 hint="A large negative number is not -inf: when every key of a row is blocked, "
                      "they all get the same score and the softmax spreads the weight evenly "
                      "over keys the query must not see. Fill with float('-inf') and turn the "
                      "NaN of an empty row into zeros.")
    if isinstance(actual, torch.Tensor) and actual.is_floating_point() and torch.isnan(actual).any():
        fail("a fully masked row gives zeros, not NaN", expected="a row of zeros",
             actual="NaN (the softmax of a row of -inf is 0/0)",
             hint="After the softmax, replace NaN by 0 (torch.nan_to_num), or zero the rows "
                  "whose mask has no True with torch.where.")
    expect_close("the matrix of masked weights", actual, expected,
                 hint="Fill the blocked scores with float('-inf') using masked_fill(~mask, ...), "
                      "then take the softmax over dim=-1.")
    passed("blocked keys get exactly 0, allowed weights sum to 1, an empty row gives zeros.")


# ---------------------------------------------------------------- exercise 5.3


def _left_padded(lengths: list[int], max_len: int) -> torch.Tensor:
    start = max_len - torch.tensor(lengths)  # (B,): the first real position
    key_is_real = torch.arange(max_len)[None, :] >= start[:, None]  # (B, T)
    return (_causal(max_len) & key_is_real[:, None, :]).unsqueeze(1)  # (B, 1, T, T)


@checker
def check_left_padded_mask(fn) -> None:
    """Check ``fn(lengths, max_len)``: causal and key-padding mask for a left-padded batch.

    With left padding the real tokens of sequence ``b`` are its last ``lengths[b]``
    positions. Only the keys are masked, so the rows of the padding queries have no
    allowed key at all and stay all False.

    Taught in chapter 5.
    """
    lengths, max_len = [4, 2, 3], 4
    expected = _left_padded(lengths, max_len)  # (B, 1, T, T)
    actual = call(fn, list(lengths), max_len, prop="your function runs for lengths [4, 2, 3], "
                                                   "max_len=4")
    if isinstance(actual, torch.Tensor) and actual.numel() == expected.numel() \
            and actual.shape != expected.shape:
        fail("the mask has shape (B, 1, T, T)", expected=tuple(expected.shape),
             actual=tuple(actual.shape),
             hint="Keep a size-1 axis for the heads: mask.unsqueeze(1) or mask[:, None].")
    _expect_bool_mask("the mask of a batch with lengths [4, 2, 3] padded to 4", actual,
                      tuple(expected.shape),
                      "A (B, T) padding row [:, None, None, :] & the causal (T, T) mask "
                      "broadcasts to (B, 1, T, T).")
    causal = _causal(max_len)
    right_real = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]  # (B, T)
    left_real = torch.arange(max_len)[None, :] >= (max_len - torch.tensor(lengths))[:, None]
    wrong_masks = [
        ((causal & right_real[:, None, :]).unsqueeze(1),
         "Your mask hides the last positions, as for right padding. With left padding the "
         "padding comes first and the real tokens are the last lengths[b] positions."),
        (causal.expand(3, 1, max_len, max_len),
         "Your mask is only causal: the padding keys are still visible."),
        (left_real[:, None, None, :].expand(3, 1, max_len, max_len),
         "Your mask only hides the padding: every real token sees the future."),
        (~expected, "Your mask is True where attending is forbidden. In this book True means "
                    "may attend."),
    ]
    for candidate, hint in wrong_masks:
        if _same(actual, candidate):
            fail("query i may attend to the real keys 0..i", expected="causal & left padding",
                 actual=f"{actual.int().tolist()}", hint=hint)
    real_query = left_real[:, None, :, None]  # (B, 1, T, 1)
    if isinstance(actual, torch.Tensor) and actual.shape == expected.shape \
            and torch.equal(actual & real_query, expected) and not torch.equal(actual, expected):
        fail("the rows of the padding queries are all False",
             expected="no allowed key for a padding query",
             actual="your mask lets padding queries attend to something",
             hint="Mask the keys only, as in this chapter. A padding query comes before every "
                  "real token, so the causal mask leaves it no real key: its row stays all "
                  "False, and attention_book.softmax turns it into zeros.")
    expect_true("query i may attend to the real keys 0..i", bool(torch.equal(actual, expected)),
                expected="causal & left padding", actual=f"{actual.int().tolist()}",
                hint="The real keys of sequence b are the positions j >= max_len - lengths[b]; "
                     "combine that (B, T) row with the causal (T, T) mask using &.")
    other = call(fn, [1, 5], 5)
    expect_true("the mask for lengths [1, 5] padded to 5 is right",
                _same(other, _left_padded([1, 5], 5)),
                expected="causal & left padding for the new sizes",
                actual=tuple(other.shape) if isinstance(other, torch.Tensor) else other,
                hint="Use both arguments instead of fixed sizes.")
    passed("each real token sees itself and the earlier real tokens; padding keys are hidden. "
           "The padding queries come first and have no key left: their rows are empty, which "
           "attention_book.softmax turns into zeros.")


# ---------------------------------------------------------------- exercise 5.4


def _layer(allowed: Callable[[int], torch.Tensor], fill: float = float("-inf"),
           seed: int = 0) -> Callable:
    """A single-head attention function x (B, T, d) -> (B, T, d): blocked scores get ``fill``."""
    generator = torch.Generator().manual_seed(seed)
    projections = torch.randn(3, 4, 4, generator=generator) / 2  # W_query, W_key, W_value

    def attend(x: torch.Tensor) -> torch.Tensor:
        queries, keys, values = x @ projections[0], x @ projections[1], x @ projections[2]
        scores = queries @ keys.transpose(-2, -1) / 2.0  # (B, T, T), of size about 1
        mask = allowed(x.size(-2))  # (T, T) or (B, T, T)
        attn_weights = torch.softmax(scores.masked_fill(~mask, fill), dim=-1)  # (B, T, T)
        return torch.nan_to_num(attn_weights, nan=0.0) @ values  # (B, T, d)

    return attend


def _wrap_around(num_tokens: int) -> torch.Tensor:
    mask = _causal(num_tokens).clone()
    mask[0, -1] = True  # position 0 also sees the last token
    return mask


def _second_sequence_unmasked(num_tokens: int) -> torch.Tensor:
    causal = _causal(num_tokens)
    return torch.stack([causal, torch.ones_like(causal)])  # (B=2, T, T)


def _prefix_of_three(num_tokens: int) -> torch.Tensor:
    return _causal(num_tokens) | (torch.arange(num_tokens) < 3)[None, :]  # a prefix-LM mask


def _middle_hole(num_tokens: int) -> torch.Tensor:
    mask = _causal(num_tokens).clone()
    mask[2, 3] = True  # token 2 also sees token 3; the first and the last token are fine
    return mask


def _built_for_four(num_tokens: int) -> torch.Tensor:
    """A causal mask made for 4 tokens and padded with True: longer inputs leak."""
    mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool)
    size = min(num_tokens, 4)
    mask[:size, :size] = _causal(size)
    return mask


_LAYERS = [
    # (name, layer, is it causal?, hint when the learner's test gets it wrong)
    ("a correct causal layer (attention_book.CausalSelfAttention)", None, True,
     "Your test rejects a correct causal layer. Compare only the outputs at positions before "
     "the one you changed: a token may depend on itself."),
    ("a causal layer that also hides each token from itself", _layer(lambda t: _causal(t).tril(-1)),
     True, "Your test rejects a layer that hides the diagonal. That layer leaks nothing: its "
           "first query has no key at all and gets a zero output. Compare only the outputs at "
           "positions before the one you changed."),
    ("a layer without a mask", _layer(lambda t: torch.ones(t, t, dtype=torch.bool)), False,
     "Your test passes a layer that has no mask at all. Change the input at a later position "
     "by a visible amount (say + 1) and compare the outputs at the earlier positions."),
    ("a layer whose mask lets each token see the next one",
     _layer(lambda t: torch.ones(t, t, dtype=torch.bool).tril(1)), False,
     "Your test misses an off-by-one mask that lets every token see the next one. Change each "
     "later position in turn, by a visible amount such as + 1, and compare the outputs before "
     "it."),
    ("a layer whose first position also sees the last token", _layer(_wrap_around), False,
     "Your test misses a leak from the last token into position 0. Change every later "
     "position, one at a time and by a visible amount such as + 1, not only the next one or "
     "the first one."),
    ("a layer whose mask is missing for the second sequence of the batch",
     _layer(_second_sequence_unmasked), False,
     "Your test misses a leak in the second sequence of the batch. Compare the outputs of "
     "every sequence, not only the first one."),
    ("a layer that uses a prefix-LM mask with a 3-token prefix", _layer(_prefix_of_three), False,
     "Your test misses a leak inside a bidirectional prefix: token 2 changes the outputs at "
     "positions 0 and 1, while the last token changes nothing earlier. Change every later "
     "position, one at a time."),
    ("a layer in which token 2 also sees token 3 (and nothing else leaks)",
     _layer(_middle_hole), False,
     "Your test misses a leak in the middle of the sequence: token 3 changes the output at "
     "position 2 only. Change every later position in turn, and compare every earlier "
     "output, not only the first or the last."),
    ("a layer whose causal mask was built for 4 tokens and is True beyond",
     _layer(_built_for_four), False,
     "Your test misses a leak that appears only from the fifth token on. Run the test on the "
     "input you are given, with all of its positions, not on a shorter input of your own."),
    ("a layer that fills blocked scores with -10 instead of -inf", _layer(_causal, fill=-10.0),
     False,
     "Your test misses a weak mask that fills blocked scores with -10 instead of -inf, so the "
     "future keeps a weight of e^-10 (about 5e-5) or less. A causal layer's earlier outputs do "
     "not move at all: change the input by a visible amount (say + 1) and compare with "
     "torch.equal or a tolerance of 1e-5 or tighter."),
]


@checker
def check_is_causal_layer(fn) -> None:
    """Grade the learner's property test ``fn(layer, x)`` on healthy and broken layers.

    ``fn`` must return True exactly for the layers in which no output at position ``i``
    depends on an input at a later position. The layers map ``(B, T, d_in)`` to
    ``(B, T, d_out)``; ``x`` is the input the test may perturb (a fresh copy per call).

    Taught in chapter 5.
    """
    from ..modules import CausalSelfAttention

    torch.manual_seed(0)
    package_layer = CausalSelfAttention(4, 4, context_length=6).eval()
    torch.manual_seed(1)
    x = torch.randn(2, 6, 4)  # (B, T, d_in)
    with torch.no_grad():
        outcomes = call_in_private_order([
            partial(call, fn, package_layer if layer is None else layer, x.clone(),
                    prop=f"your test runs on {name}") for name, layer, _, _ in _LAYERS])
    for (name, _, causal, hint), outcome in zip(_LAYERS, outcomes, strict=True):
        verdict = outcome.get()
        if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
            verdict = verdict.item()
        if not isinstance(verdict, bool):
            fail("your test returns True or False", expected="a bool",
                 actual=f"{type(verdict).__name__}: {verdict!r}",
                 hint="Return True when no earlier output moves, and False as soon as one does.")
        expect_true(f"your test says {'True' if causal else 'False'} for {name}",
                    verdict == causal, expected=causal, actual=verdict, hint=hint)
    passed(f"your test tells all {len(_LAYERS)} layers apart: it accepts the two causal ones and "
           "catches a missing mask, an off-by-one, a wrap-around, a batch-dependent, a prefix, a "
           "middle, a too-short and a weak mask.")
