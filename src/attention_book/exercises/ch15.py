"""Checkers for chapter 15's exercises (attention inside a model)."""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from functools import partial

import torch
from torch import nn

from ..heads import ablate_heads, hand_built_induction_model
from ..model import TinyGPT, TransformerBlock
from .feedback import (
    Outcome,
    call,
    call_in_private_order,
    checker,
    expect_close,
    expect_shape,
    expect_true,
    fail,
    passed,
)

__all__ = [
    "check_block_parameter_count",
    "check_induction_score",
    "check_mean_ablated_logits",
    "check_is_induction_head",
    "check_generates_like_full_pass",
]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run the models of a check on one CPU thread, then restore the setting: these models are
    so small that a second thread only waits (ten times slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


@checker
def check_block_parameter_count(fn) -> None:
    """Check ``fn(d_model, mlp_ratio, qkv_bias)`` counts the parameters of a TransformerBlock.

    The answer is ``(4 + 2 r) d^2 + (6 + r) d``, plus ``3 d`` with a bias on the query, key and
    value projections; the checker counts real blocks.

    Taught in chapter 15 (Exercise 15.1).
    """
    hint = ("add up, for d = d_model and r = mlp_ratio: two LayerNorms (a weight and a bias of "
            "d each), the query, key and value projections (d x d each, plus a bias of d each "
            "when qkv_bias), the output projection (d x d and a bias), and the MLP (d x rd and "
            "a bias of rd, then rd x d and a bias of d)")
    for d_model, mlp_ratio, qkv_bias in ((16, 4, False), (16, 4, True), (24, 2, False),
                                         (8, 3, True), (64, 1, False)):
        block = TransformerBlock(d_model, 4, 8, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                                 device="meta")
        expected = _count(block)
        actual = call(fn, d_model, mlp_ratio, qkv_bias)
        label = f"block_parameter_count({d_model}, {mlp_ratio}, {qkv_bias})"
        if isinstance(actual, bool) or not isinstance(actual, numbers.Integral):
            fail(f"{label} is an int", expected="an int", actual=type(actual).__name__,
                 hint=hint)
        if actual == expected:
            continue
        d = d_model
        if actual == expected - 3 * d * qkv_bias or actual == expected + 3 * d * (not qkv_bias):
            fail(f"{label} counts the query, key and value biases when qkv_bias is set",
                 expected=expected, actual=actual,
                 hint="qkv_bias adds a bias of d_model numbers to each of the three "
                      "projections, and only then; the output projection always has one")
        if actual == expected - 4 * d:
            fail(f"{label} counts the LayerNorms", expected=expected, actual=actual,
                 hint="each of the two LayerNorms learns a weight and a bias of d_model each")
        if actual == expected - 2 * d:
            fail(f"{label} counts both parts of each LayerNorm", expected=expected,
                 actual=actual, hint="a LayerNorm learns a scale *and* a shift: a weight of "
                 "d_model and a bias of d_model, 2 d for each of the two")
        if actual == expected - d:
            fail(f"{label} counts the output projection's bias", expected=expected,
                 actual=actual, hint="the output projection has a bias of d_model even when "
                 "qkv_bias is False (qkv_bias is about the query, key and value projections)")
        plain = (4 + 2 * 4) * d * d + (6 + 4) * d + 3 * d * qkv_bias
        if mlp_ratio != 4 and actual == plain:
            fail(f"{label} follows mlp_ratio", expected=expected, actual=actual,
                 hint="the MLP's hidden layer has mlp_ratio * d_model units, not always 4")
        fail(f"{label} has the right value", expected=expected, actual=actual, hint=hint)
    passed("a block holds (4 + 2r) d^2 + (6 + r) d parameters (+ 3d with qkv_bias): at r = 4, "
           "two thirds of them are in the MLP.")


# --------------------------------------------------------------------------- exercise 15.2


def _score_with(weights: torch.Tensor, targets: torch.Tensor, counted: torch.Tensor) -> float:
    """Mean, over the ``counted`` queries, of the weight on ``targets``."""
    on_targets = (weights * targets).sum(dim=-1)  # (B, T)
    return (on_targets[counted].sum() / counted.sum()).item()


def _score_variants(weights: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    """The right score and the usual wrong ones, for weights (B, T, T) and tokens (B, T)."""
    num_tokens = tokens.size(1)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): token t equals token j
    after_copy = torch.zeros_like(same)
    after_copy[:, :, 1:] = same[:, :, :-1]  # key s follows a copy at s - 1
    at_or_before = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()  # s <= t
    targets = after_copy & at_or_before  # (B, T, T)
    counted = targets.any(dim=-1)  # (B, T)
    earlier_copies = same & torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril(-1)
    strict = after_copy & torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril(-1)
    right = _score_with(weights, targets, counted)
    per_sequence = [_score_with(weights[b:b + 1], targets[b:b + 1], counted[b:b + 1])
                    for b in range(tokens.size(0)) if counted[b].any()]
    return {
        "right": right,
        "copy": _score_with(weights, earlier_copies, earlier_copies.any(dim=-1)),
        "strict": _score_with(weights, strict, strict.any(dim=-1)),
        "all queries": _score_with(weights, targets, torch.ones_like(counted)),
        "future": _score_with(weights, after_copy, after_copy.any(dim=-1)),
        "per sequence": sum(per_sequence) / len(per_sequence),
        "max": (weights * targets).amax(dim=-1)[counted].mean().item(),
    }


_SCORE_HINTS = {
    "copy": ("you measured the weight on the earlier copies of the query's token (a "
             "duplicate-token score); an induction head looks one place further, at the token "
             "that followed each copy: key s is a target when tokens[s - 1] == tokens[t]"),
    "strict": ("the key s = t counts too: when tokens[t - 1] == tokens[t] (a token repeated "
               "twice in a row), the query's own position follows a copy of its token"),
    "all queries": ("average only over the queries that have at least one target; a query whose "
                    "token never occurred before has nothing to find and is not counted"),
    "future": ("a target must lie at or before the query (s <= t): the causal head cannot look "
               "further, and a query whose token only occurs later has no target"),
    "per sequence": ("take one mean over every counted query of every sequence, not a mean per "
                     "sequence averaged over the sequences (they have different numbers of "
                     "counted queries, and one has none)"),
    "max": ("sum the weight over all of a query's targets (a token can occur several times "
            "before), do not keep only the largest"),
}


def _score_example() -> tuple[torch.Tensor, torch.Tensor]:
    """Three sequences with every trap: a doubled token, several targets, no target at all, and
    4 and 5 queries with a target (so a mean per sequence differs from the mean over queries)."""
    tokens = torch.tensor([[3, 1, 4, 1, 5, 3, 1, 4, 2],
                           [2, 2, 7, 2, 6, 2, 7, 9, 6],
                           [0, 1, 2, 3, 4, 5, 6, 7, 8]])  # (B, T); the last has no repeat
    generator = torch.Generator().manual_seed(0)
    scores = 2 * torch.randn(3, 9, 9, generator=generator, dtype=torch.float64)  # (B, T, T)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (B, T, T)
    return weights, tokens


def _as_number(value: object, label: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(f"{label} is a number", expected="a float (or a tensor holding one number)",
             actual=type(value).__name__, hint="return the mean as a float, e.g. with .item()")
    return float(value)


@checker
def check_induction_score(fn) -> None:
    """Check ``fn(weights, tokens) -> float``: one head's induction score.

    Taught in chapter 15 (Exercise 15.2).
    """
    weights, tokens = _score_example()
    variants = _score_variants(weights, tokens)
    actual = _as_number(call(fn, weights.clone(), tokens.clone()), "induction_score(weights, tokens)")
    if abs(actual - variants["right"]) > 1e-6:
        for name, hint in _SCORE_HINTS.items():
            if abs(actual - variants[name]) <= 1e-6:
                fail("the induction score follows its definition", expected=round(
                    variants["right"], 4), actual=round(actual, 4), hint=hint)
        fail("the induction score follows its definition", expected=round(variants["right"], 4),
             actual=round(actual, 4), hint=(
                 "for each query t, sum its weight on the keys s <= t with tokens[s - 1] == "
                 "tokens[t]; average those sums over the queries that have such a key"))
    with torch.random.fork_rng():  # building a model draws (then overwrites) random weights
        copier = hand_built_induction_model(8, 16, dtype=torch.float64)
    generator = torch.Generator().manual_seed(1)
    segments = torch.stack([torch.randperm(7, generator=generator) + 1 for _ in range(4)])
    repeats = torch.cat([torch.zeros(4, 1, dtype=torch.long), segments, segments], dim=1)
    with torch.no_grad():
        _, (first, second) = copier(repeats, return_weights=True)
    for layer, head, expected, what in ((1, 0, 1.0, "the hand-built induction head L1H0"),
                                        (0, 0, 0.0, "the hand-built previous-token head L0H0")):
        weights = (second if layer else first)[:, head]  # (B, T, T)
        score = _as_number(call(fn, weights, repeats.clone()), f"the score of {what}")
        expect_true(f"{what} scores about {expected:g}", abs(score - expected) < 0.01,
                    expected=expected, actual=round(score, 4), hint=(
                        "run your function on the weights of one head, weights[:, head] of "
                        "its layer, shaped (B, T, T)"))
    passed("the weight on the tokens that followed each earlier copy, averaged over the "
           "queries that have one: 1 for the hand-built induction head, 0 for its "
           "previous-token head.")


# --------------------------------------------------------------------------- exercise 15.3


def _head_means(model: TinyGPT, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """The input of layer ``layer``'s output projection, averaged over batch and positions."""
    seen = []
    handle = model.blocks[layer].attention.out_proj.register_forward_pre_hook(
        lambda module, inputs: seen.append(inputs[0]))
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    return seen[0].mean(dim=(0, 1))  # (d_model,)


def _replaced(model: TinyGPT, tokens: torch.Tensor, layer: int, features: slice,
              value: torch.Tensor | None) -> torch.Tensor:
    """Logits with ``features`` of the out_proj input replaced by ``value`` (per position if None)."""
    def hook(module, inputs):
        context = inputs[0].clone()
        context[..., features] = (context[..., features].mean(dim=0, keepdim=True)
                                  if value is None else value)
        return (context,)

    handle = model.blocks[layer].attention.out_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


@checker
def check_mean_ablated_logits(fn) -> None:
    """Check ``fn(model, tokens, layer, head)``: logits with one head mean-ablated.

    Taught in chapter 15 (Exercise 15.3).
    """
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = TinyGPT(13, 16, 4, 2, 10, dtype=torch.float64).eval()
    tokens = torch.randint(0, 13, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(tokens)  # (B, T, V)
    for layer, head in ((1, 2), (0, 1)):
        head_dim = model.blocks[layer].attention.head_dim
        features = slice(head * head_dim, (head + 1) * head_dim)
        means = _head_means(model, tokens, layer)  # (d_model,)
        expected = _replaced(model, tokens, layer, features, means[features])
        label = f"mean_ablated_logits(model, tokens, {layer}, {head})"
        actual = call(fn, model, tokens.clone(), layer, head)
        with torch.no_grad():
            after = model(tokens)
        hooks = sum(len(block.attention.out_proj._forward_pre_hooks) for block in model.blocks)
        expect_true("the model is left as it was", hooks == 0 and torch.equal(after, before),
                    expected="the same logits as before the call, and no hook left behind",
                    actual=("a hook is still registered" if hooks else "other logits"), hint=(
                        "remove every hook you register (handle.remove(), in a finally: block) "
                        "and put back any weight you change"))
        expect_shape(label, actual, expected.shape, hint="return the logits, (B, T, vocab_size)")
        actual = actual.detach().to(expected.dtype)
        if torch.allclose(actual, expected, atol=1e-6):
            continue
        with ablate_heads(model, [(layer, head)]), torch.no_grad():
            zeroed = model(tokens)
        other = (head + 1) % model.num_heads
        wrong = {
            "zero": (zeroed, "you zeroed the head, as ablate_heads does; mean ablation puts "
                             "its average output in its place, so the layer after it still "
                             "gets the usual offset"),
            "per position": (_replaced(model, tokens, layer, features, None),
                             "one mean vector for the head: average over every sequence *and* "
                             "every position, not one mean per position"),
            "one number": (_replaced(model, tokens, layer, features, means[features].mean()),
                           "average each of the head's head_dim features on its own: the "
                           "mean is a vector of head_dim numbers, not one number"),
            "whole layer": (_replaced(model, tokens, layer, slice(None), means),
                            "replace only this head's slice, features head * head_dim to "
                            "(head + 1) * head_dim - 1 of the output projection's input"),
            "other head": (_replaced(model, tokens, layer, slice(other * head_dim,
                                                                  (other + 1) * head_dim),
                                     means[other * head_dim:(other + 1) * head_dim]),
                           "the slice belongs to another head: head h owns features "
                           "h * head_dim to (h + 1) * head_dim - 1"),
            "nothing": (before, "the head is not replaced at all: register the hook on "
                                "model.blocks[layer].attention.out_proj and return the logits "
                                "computed while it is in place"),
        }
        for result, hint in wrong.values():
            if torch.allclose(actual, result, atol=1e-6):
                fail(f"{label} mean-ablates that head", expected="the reference logits",
                     actual="the logits of another ablation", hint=hint)
        expect_close(label, actual, expected, atol=1e-6, hint=(
            "first run the model once and average the head's slice of the input of "
            "out_proj over every sequence and position; then run it again with that slice "
            "replaced by the average"))
    passed("each head's slice of the context vectors is replaced by its average, so the "
           "model loses what the head says about *this* input and keeps the rest.")


# --------------------------------------------------------------------------- exercise 15.4


def _look_back(model: TinyGPT, lookbacks: tuple[int, int], share: float) -> None:
    """Give the hand-built model's induction head L1H0 a positional part: from every query at
    position t it also attends positions ``t - lookback`` for both lookbacks (token 0 when
    t < lookback), whatever the tokens. On a query whose induction target is none of those
    keys, ``share`` of its weight goes to the target and the rest to the two keys."""
    vocab_size, context_length = model.vocab_size, model.context_length
    head_dim = model.d_model // 2
    attention = model.blocks[1].attention
    position = vocab_size + torch.arange(context_length)  # the stream's position features
    rows = vocab_size + torch.arange(context_length)  # head 0's features after the tokens'
    gain = 20.0 * head_dim**0.5  # the hand-built gain: a logit of 20
    # the target's logit 20 + a, each positional key's 20: share = e^a / (e^a + 2)
    lift = math.log(2 * share / (1 - share))
    with torch.no_grad():
        tokens = torch.arange(vocab_size)
        attention.W_query.weight[tokens, tokens] = gain * (20.0 + lift) / 20.0
        attention.W_query.weight[rows] = 0
        attention.W_key.weight[rows] = 0
        attention.W_query.weight[rows, position] = gain
        for lookback in lookbacks:
            attention.W_key.weight[rows[lookback:], position[:context_length - lookback]] = 1.0
            attention.W_key.weight[rows[:lookback], position[0]] = 1.0


def _repeat_distances(tokens: torch.Tensor, vocab_size: int) -> list[int]:
    """The distances d >= 2 at which ``tokens`` (B, T) repeat beyond chance (token t equal to
    token t - d), the commonest first, down to half as common as the commonest."""
    if tokens.dim() != 2:
        return []
    batch_size, num_tokens = tokens.shape
    excess = {}
    for distance in range(2, num_tokens):
        matches = (tokens[:, distance:] == tokens[:, :-distance]).sum().item()
        excess[distance] = matches - batch_size * (num_tokens - distance) / vocab_size
    top = max(excess.values(), default=0.0)
    return sorted((d for d, e in excess.items() if e > 0 and e >= top / 2),
                  key=lambda d: -excess[d])


class _FollowsTheOffsets(nn.Module):
    """The token table of 15.4's positional subject, whose L1H0 attends two fixed distances
    back (11 and 12 tokens until it settles) and gives the rest of its weight to the
    induction targets. It settles on the distances at which the batches it reads repeat:
    the commonest ones of the first batch that repeats, then of the next, until it has two.
    A test that scores heads on copies at one or two fixed offsets, whichever, then sees a
    head that lands on its targets; at random distances the head scores below 0.5."""

    def __init__(self, model: TinyGPT, share: float):
        super().__init__()
        self.table = model.token_embedding
        self.share = share
        self.settled: list[int] = []
        object.__setattr__(self, "_model", model)  # a plain reference, not a submodule
        _look_back(model, (11, 12), share)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.table, name)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if len(self.settled) < 2:
            for distance in _repeat_distances(tokens, self._model.vocab_size):
                if len(self.settled) < 2 and distance - 1 not in self.settled:
                    self.settled.append(distance - 1)
            if self.settled:
                lookbacks = self.settled + [12 if self.settled[0] != 12 else 11]
                _look_back(self._model, tuple(lookbacks[:2]), self.share)
        return self.table(tokens)


def _positional(share: float = 0.2) -> TinyGPT:
    """The hand-built model (vocabulary 32, 32 tokens) with L1H0 turned into a mostly
    positional head that looks back as far as the test's own copies lie (see
    :class:`_FollowsTheOffsets`). With ``share`` 0.2 it scores 0.32 to 0.45 on repeats at
    random distances (32 to 256 sequences, segments of 4 and 8, 10 seeds), and 0.66 or more
    on copies at one or two fixed offsets, whichever."""
    model = hand_built_induction_model(32, 32, dtype=torch.float64)
    model.token_embedding = _FollowsTheOffsets(model, share)
    return model


def _soft(vocab_size: int, context_length: int) -> TinyGPT:
    """The hand-built model with a blurrier induction head (about 0.77 of its weight on targets)."""
    model = hand_built_induction_model(vocab_size, context_length, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[1].attention.W_query.weight[:model.d_model // 2] *= 0.2
    return model


def _blurred(vocab_size: int, context_length: int, gain: float) -> TinyGPT:
    """The hand-built model with its induction head L1H0 blurred: its query gain scaled by
    ``gain``, so that part of its weight spreads over every earlier key."""
    model = hand_built_induction_model(vocab_size, context_length, dtype=torch.float64)
    with torch.no_grad():
        model.blocks[1].attention.W_query.weight[:model.d_model // 2] *= gain
    return model


def _head_subjects() -> list[tuple[str, TinyGPT, int, int, bool]]:
    big = hand_built_induction_model(32, 32, dtype=torch.float64)
    small = hand_built_induction_model(24, 24, dtype=torch.float64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        untrained = TinyGPT(32, 32, 2, 2, 32, attention_only=True, dtype=torch.float64).eval()
    subjects = [
        ("the hand-built induction head L1H0 (vocabulary 32, 32 tokens)", big, 1, 0, True),
        ("a blurrier induction head (about 0.77 of its weight on the targets)",
         _soft(32, 32), 1, 0, True),
        ("the hand-built induction head L1H0 (vocabulary 24, 24 tokens)", small, 1, 0, True),
        ("the previous-token head L0H0", big, 0, 0, False),
        ("the head L1H1, which looks at earlier copies of the current token", big, 1, 1, False),
        ("a head of an untrained model", untrained, 1, 0, False),
    ]
    # Either side of the definition's 0.5: their scores on repeats at random offsets are 0.53
    # to 0.55 and 0.46 to 0.47, whatever the segment length (4 to 10), the batch (32 to 256)
    # or the seed (0 to 2).
    subjects.append(("a mostly positional head, which looks two fixed distances back (as far "
                     "back as the copies of the first sequences your test reads lie) and puts "
                     "a fifth of its weight on the induction targets: about 0.35 at random "
                     "distances",
                     _positional(), 1, 0, False))
    subjects.append(("a head with about 0.54 of its weight on the induction targets",
                     _blurred(32, 32, 0.142), 1, 0, True))
    subjects.append(("a head with about 0.46 of its weight on the induction targets",
                     _blurred(32, 32, 0.125), 1, 0, False))
    return subjects


@checker
def check_is_induction_head(fn) -> None:
    """Check the test ``fn(model, layer, head) -> bool`` on induction heads and look-alikes.

    The look-alikes include positional heads that attend a fixed distance back: on sequences
    whose copy always lies at that distance their induction score passes 0.5.

    Taught in chapter 15 (Exercise 15.4).
    """
    with torch.random.fork_rng():  # building a model draws (then overwrites) random weights
        subjects = _head_subjects()
    with _one_thread():
        _judge_heads(fn, subjects)
    passed("your test tells induction heads from positional heads, previous-token heads and "
           "duplicate-token heads: it scores them on repeats at distances that vary, the "
           "control that a fixed offset lacks, and it draws the line at the definition's 0.5.")


def _accepts_the_head_at_046(subjects: list[tuple[str, TinyGPT, int, int, bool]],
                             outcomes: list[Outcome]) -> bool:
    """Whether the test calls the head at 0.46 an induction head: then it accepted the
    positional head for its threshold, not for its distances."""
    for (name, *_), outcome in zip(subjects, outcomes, strict=True):
        if "0.46" in name:
            verdict = outcome.get()
            return bool(verdict) if isinstance(verdict, (bool, torch.Tensor)) else False
    return False


def _judge_heads(fn, subjects: list[tuple[str, TinyGPT, int, int, bool]]) -> None:
    outcomes = call_in_private_order([partial(call, fn, model, layer, head)
                                      for _, model, layer, head, _ in subjects])
    for (name, _, _, _, expected), outcome in zip(subjects, outcomes, strict=True):
        verdict = outcome.get()
        if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
            verdict = bool(verdict)
        if not isinstance(verdict, bool):
            fail("is_induction_head returns True or False", expected="a bool",
                 actual=type(verdict).__name__, hint="return bool(score >= 0.5)")
        if expected and not verdict:
            fail(f"your test accepts {name}", expected=True, actual=False, hint=(
                "score the head on sequences in which a segment repeats, with "
                "model.vocab_size and model.context_length, and call it an induction head "
                "when its induction score reaches 0.5, the threshold of the definition: a "
                "real head is not perfect, and a stricter threshold rejects heads that are "
                "induction heads"))
        if not expected and verdict:
            if "positional" in name and _accepts_the_head_at_046(subjects, outcomes):
                hint = ("the definition asks for at least 0.5 of the weight on the targets: "
                        "compare the score with 0.5, not with a lower threshold (your test "
                        "also calls a head at 0.46 an induction head)")
            elif "positional" in name:
                hint = ("score the head on repeats at many different distances (a random "
                        "offset for each sequence, as repeated_segments draws by default): "
                        "whatever fixed offset a test uses, some head that looks that far back "
                        "passes it; with distances that vary, a head that looks a fixed "
                        "distance back finds the target only when the copy happens to lie "
                        "there")
            elif "0.46" in name:
                hint = ("the definition asks for at least 0.5 of the weight on the targets: "
                        "compare the score with 0.5, not with a lower threshold")
            else:
                hint = ("a head is an induction head when its weight goes to the token after "
                        "an earlier copy of the query's token; score exactly that, on repeated "
                        "sequences")
            fail(f"your test rejects {name}", expected=False, actual=True, hint=hint)


# --------------------------------------------------------------------------- exercise 15.5


class _Table(nn.Module):
    """A subject's position table: ``change(positions)`` rewrites the positions it is asked for."""

    def __init__(self, table: nn.Module, change):
        super().__init__()
        self.table = table
        self.change = change

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table(self.change(positions))


class _Layer(nn.Module):
    """A subject's attention layer: right without a cache; while decoding, the keys for which
    ``hidden(query positions, key positions, prompt length)`` is True are masked out."""

    def __init__(self, layer: nn.Module, hidden):
        super().__init__()
        self.layer = layer
        self.hidden = hidden
        self.prompt_length = 0

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.layer, name)

    def forward(self, x, mask=None, return_weights=False, *, kv_cache=None):
        if kv_cache is None:
            return self.layer(x, mask, return_weights)
        start, num_tokens = len(kv_cache), x.size(-2)
        if start == 0:
            self.prompt_length = num_tokens  # the first call into an empty cache: the prompt
        queries = torch.arange(start, start + num_tokens)[:, None]  # (T, 1)
        keys = torch.arange(start + num_tokens)[None, :]  # (1, T_k)
        allowed = ~self.hidden(queries, keys, self.prompt_length)  # (T, T_k)
        if mask is not None:
            allowed = allowed & mask
        return self.layer(x, allowed, return_weights, kv_cache=kv_cache)


_GEN_SIZES = {"vocab_size": 11, "d_model": 16, "num_heads": 2, "num_layers": 2,
              "context_length": 12}


def _generator_model(seed: int, **options) -> TinyGPT:
    """A random TinyGPT whose outputs follow its context closely: sharper queries, a louder
    attention output and quieter token embeddings make every cache bug change some token."""
    torch.manual_seed(seed)
    model = TinyGPT(**_GEN_SIZES, dtype=torch.float64, **options).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attention.W_query.weight.mul_(3.0)
            block.attention.out_proj.weight.mul_(4.0)
        model.token_embedding.weight.mul_(0.5)
    return model


def _restart(positions: torch.Tensor) -> torch.Tensor:
    return positions - positions[0]  # every call's first token at position 0


def _one_late(positions: torch.Tensor) -> torch.Tensor:
    late = positions.numel() == 1 and int(positions[0]) >= 10
    return positions - 1 if late else positions  # a token decoded at 10 or later: one back


def _generation_subjects() -> tuple[dict[str, TinyGPT], list[tuple[str, TinyGPT, str]]]:
    healthy = {"a TinyGPT with learned positions": _generator_model(0),
               "a TinyGPT with RoPE": _generator_model(1, rope=True),
               "an attention-only TinyGPT": _generator_model(2, attention_only=True)}
    restarts = _generator_model(3)
    restarts.position_embedding = _Table(restarts.position_embedding, _restart)
    prefill = _generator_model(6)
    for block in prefill.blocks:
        block.attention = _Layer(block.attention, lambda q, k, prompt: (q >= prompt)
                                 & (k < prompt - 1))
    late = _generator_model(4)
    late.position_embedding = _Table(late.position_embedding, _one_late)
    sees_ahead = _generator_model(5)
    for block in sees_ahead.blocks:
        block.attention.causal = False
    deep = ("a cache bug can show only deep in the cache: generate until the context is full "
            "(prompt length + max_new_tokens = model.context_length)")
    broken = [
        ("a model whose learned positions restart at 0 at every decoding step (chapter 12's "
         "RoPE bug, with learned positions)", restarts,
         "generate at least two new tokens: the first comes from the prompt alone, and only "
         "the later ones are decoded through the cache"),
        ("a model whose prefill caches only the prompt's last token (right for prompts of "
         "one token)", prefill,
         "use prompts of several tokens, of more than one length: a prompt goes into the "
         "cache in one call, a path that a one-token prompt never takes"),
        ("a model whose tokens decoded at position 10 or later (of 12) get the position "
         "before their own (right unless the cache is nearly full)", late, deep),
        ("a model whose attention is not causal (its cached keys were computed before the "
         "later tokens existed)", sees_ahead,
         "compare every generated token of several prompts, with and without the cache: a "
         "model that reads later tokens recomputes the earlier ones differently without a "
         "cache; " + deep),
    ]
    return healthy, broken


def _verdict(value: object, name: str) -> bool:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = bool(value)
    if not isinstance(value, bool):
        fail(f"generates_like_full_pass returns a bool for {name}", expected="True or False",
             actual=type(value).__name__,
             hint="return the result of your comparison, e.g. torch.equal(...), as a bool")
    return value


@checker
def check_generates_like_full_pass(fn) -> None:
    """Check the property test ``fn(model) -> bool``: cached generation equals recomputation.

    It is run on three healthy models and on four whose cache path is broken: positions that
    restart at 0, a prefill that caches only the last token, positions that go wrong only
    deep in the cache, and attention that is not causal. Each has ``vocab_size`` and
    ``context_length`` attributes and ``generate(idx, max_new_tokens, use_cache=...)``.

    Taught in chapter 15 (Exercise 15.5).
    """
    with torch.random.fork_rng():  # building the models draws random weights
        healthy, broken = _generation_subjects()
    with _one_thread():
        _judge_generation(fn, healthy, broken)
    passed("your test passes the three healthy models and catches all four broken caches: "
           "a position that restarts, a prefill that loses the prompt, a bug deep in the "
           "cache, and a model that is not causal, which no cache can serve.")


def _judge_generation(fn, healthy: dict[str, TinyGPT],
                      broken: list[tuple[str, TinyGPT, str]]) -> None:
    models = [*healthy.values(), *(model for _, model, _ in broken)]
    outcomes = call_in_private_order([partial(call, fn, model) for model in models])
    for name, outcome in zip(healthy, outcomes[:len(healthy)], strict=True):
        verdict = _verdict(outcome.get(), name)
        expect_true(f"your test accepts {name}", verdict, expected=True, actual=verdict,
                    hint="with a correct cache the tokens are exactly the same: compare with "
                         "torch.equal the outputs of model.generate(prompts, n) and "
                         "model.generate(prompts, n, use_cache=False)")
    for (name, _, hint), outcome in zip(broken, outcomes[len(healthy):], strict=True):
        verdict = _verdict(outcome.get(), name)
        expect_true(f"your test catches {name}", not verdict, expected=False, actual=verdict,
                    hint=hint)
