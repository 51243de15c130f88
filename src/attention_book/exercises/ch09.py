"""Checkers for chapter 9's exercises (the tiny classifier and its attention)."""

from __future__ import annotations

import numbers
from functools import partial

import torch
from torch import nn

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

__all__ = [
    "check_predicted_accuracy_without_positions",
    "check_is_order_blind",
    "check_attention_by_offset",
    "check_predicted_attended_word",
]

#: The band a prediction of the no-position model's test accuracy must fall in: around the
#: bag-of-words level that chapter 9 computes (77 %), which the model cannot beat on average.
PREDICTION_BAND = (0.70, 0.85)


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_accuracy_without_positions(fn) -> None:
    """Check the prediction ``fn()`` of the test accuracy of chapter 9's model without positions.

    Without a positional encoding the ambiguous word's attention sees a bag of words: it
    cannot tell the nearer cue from the farther one, so the accuracy falls to about the
    bag-of-words level (77 % on the test split). A prediction within
    :data:`PREDICTION_BAND` passes.

    Taught in chapter 9 (exercise 9.1).
    """
    low, high = PREDICTION_BAND
    value = call(fn)
    expect_true("the prediction is a number", isinstance(value, numbers.Real)
                and not isinstance(value, bool), expected="a float such as 0.5",
                actual=type(value).__name__, hint="Return the accuracy you expect as a float.")
    value = float(value)
    if 1 < value <= 100:
        fail("the prediction is a fraction between 0 and 1", expected="for example 0.6 for 60 %",
             actual=value, hint="Write the accuracy as a fraction: divide a percentage by 100.")
    expect_true("the prediction is a fraction between 0 and 1", 0 <= value <= 1,
                expected="a number from 0 to 1", actual=value,
                hint="An accuracy is the fraction of test sentences classified right.")
    if value > high:
        fail("your prediction survives the experiment", expected="a prediction that does",
             actual=f"{value:.0%}",
             hint="Without positions, what could tell the model which of the two cue words "
                  "stands nearer to the ambiguous word? Compare with chapter 1's average, which "
                  "also sees only which words occur.")
    if value < low:
        fail("your prediction survives the experiment", expected="a prediction that does",
             actual=f"{value:.0%}",
             hint="The model still sees which words the sentence contains. In the sentences "
                  "whose two cues agree (section 9.1 counts them) that alone gives the answer; "
                  "what can it do in the others?")
    passed(f"a prediction of {value:.0%}: without positions the model sees a bag of words, so "
           "it should land near the bag-of-words level of section 9.1 (77%).")


# --------------------------------------------------------------------------- exercise 9.2


class _WatchesPosition(nn.Module):
    """An order-blind average plus ``strength`` times what stands at one position.

    ``position`` is ``"last"`` (the last word), ``"before"`` (the word just before the
    ambiguous one) or ``"first"`` (the first word); order matters only through that word.
    """

    def __init__(self, vocab_size: int, num_classes: int, position: str, strength: float = 3.0):
        super().__init__()
        # private: a property test may read a model's sizes, not which model it is
        self._position, self._strength = position, strength
        self.embedding = nn.Embedding(vocab_size, 8, padding_idx=0, dtype=torch.float64)
        self.head = nn.Linear(8, num_classes, dtype=torch.float64)

    def forward(self, token_ids, lengths, word_index):
        x = self.embedding(token_ids)  # (B, T, 8)
        real = (torch.arange(token_ids.shape[1]) < lengths[:, None]).to(x.dtype)  # (B, T)
        average = (x * real[..., None]).sum(1) / lengths[:, None]  # (B, 8)
        rows = torch.arange(token_ids.shape[0])
        where = {"last": lengths - 1, "before": (word_index - 1).clamp(min=0),
                 "first": torch.zeros_like(lengths)}[self._position]
        return self.head(average + self._strength * x[rows, where])  # (B, num_classes)


class _SidesOfWord(nn.Module):
    """A bag of words on each side of the ambiguous word: blind to every swap within a side.

    Swapping two neighbours never moves a word across the ambiguous one, so a test that tries
    only neighbouring pairs calls this model order-blind; a swap across the word changes it.
    """

    def __init__(self, vocab_size: int, num_classes: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, 8, padding_idx=0, dtype=torch.float64)
        self.head = nn.Linear(16, num_classes, dtype=torch.float64)

    def forward(self, token_ids, lengths, word_index):
        x = self.embedding(token_ids)  # (B, T, 8)
        positions = torch.arange(token_ids.shape[1])  # (T,)
        real = positions < lengths[:, None]  # (B, T)
        before = (positions < word_index[:, None]) & real  # (B, T)
        after = (positions > word_index[:, None]) & real  # (B, T)

        def mean_over(where: torch.Tensor) -> torch.Tensor:
            weights = where.to(x.dtype)[..., None]  # (B, T, 1)
            return (x * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, 8)

        return self.head(torch.cat([mean_over(before), mean_over(after)], dim=-1))


def _order_blind(model: nn.Module, token_ids: torch.Tensor, word_index: int) -> bool:
    """The truth, by brute force: no swap of two words other than the ambiguous one matters."""
    num_tokens = token_ids.numel()
    lengths, where = torch.tensor([num_tokens]), torch.tensor([word_index])
    with torch.no_grad():
        reference = model(token_ids[None], lengths, where)  # (1, num_classes)
        for i in range(num_tokens):
            for j in range(i + 1, num_tokens):
                if word_index in (i, j):
                    continue
                swapped = token_ids.clone()
                swapped[[i, j]] = token_ids[[j, i]]
                if not torch.allclose(model(swapped[None], lengths, where), reference, atol=1e-6):
                    return False
    return True


def _models(vocab_size: int, num_classes: int):
    """(name, model) for the checker: order-blind models and order-sensitive ones."""
    from ..train import AttentionClassifier, AveragingClassifier

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(90)
        built = [
            ("an averaging classifier", AveragingClassifier(vocab_size, num_classes, d_model=8,
                                                             dtype=torch.float64)),
            ("an attention classifier without positions",
             AttentionClassifier(vocab_size, num_classes, d_model=8, num_heads=2,
                                 positional_encoding=False, dtype=torch.float64)),
            ("an attention classifier with positions",
             AttentionClassifier(vocab_size, num_classes, d_model=8, num_heads=2,
                                 dtype=torch.float64)),
            ("a model that reads the last word", _WatchesPosition(vocab_size, num_classes, "last")),
            ("a model that reads the word just before the ambiguous one",
             _WatchesPosition(vocab_size, num_classes, "before")),
            ("a model that reads the first word", _WatchesPosition(vocab_size, num_classes,
                                                                    "first")),
            ("a bag of words on each side of the ambiguous word",
             _SidesOfWord(vocab_size, num_classes)),
            ("a model that reads the last word only very faintly",
             _WatchesPosition(vocab_size, num_classes, "last", strength=1e-4)),
        ]
    for _, model in built:
        model.eval()
    return built


@checker
def check_is_order_blind(fn) -> None:
    """Check the property test ``fn(model, token_ids, word_index)``.

    ``token_ids`` is one sentence, a ``(T,)`` tensor of ids without padding, and
    ``word_index`` the position of the ambiguous word. ``fn`` returns True when swapping any
    two of the *other* words leaves the model's logits unchanged (within 1e-6), False
    otherwise. The checker runs it on order-blind models (the averaging baseline, the
    attention classifier without positions) and on order-sensitive ones whose sensitivity
    shows at different depths: only for swaps with one position (the first word, whose
    neighbours are the same word, so that only a swap of words four apart shows it in one
    sentence), only for swaps across the ambiguous word (a bag of words on
    each side, blind to every swap of neighbours), or only in the fourth decimal of the
    logits (a faint reading of the last word).

    Taught in chapter 9 (exercise 9.2).
    """
    vocab_size, num_classes = 12, 4
    sentences = (  # (token ids, word_index): repeated words, the word in the middle or at an end
        (torch.tensor([3, 3, 5, 7, 2, 9, 4]), 3),
        (torch.tensor([6, 6, 8, 1, 10, 11]), 0),
        (torch.tensor([2, 2, 4, 9, 5, 7]), 5),
        # a word three times over: reading the first word shows only in a swap of words at
        # least four apart, which a test of near swaps alone never makes
        (torch.tensor([8, 8, 8, 2, 5, 11, 7]), 3),
        # the other words read the same at both ends (6 ... 6): reversing them, or any
        # permutation that keeps the ends, moves neither the first nor the last word
        (torch.tensor([6, 3, 8, 1, 5, 6]), 4),
        (torch.tensor([4, 4, 7, 2, 9, 5]), 2),
        (torch.tensor([5, 2, 2, 8, 3]), 0),
        (torch.tensor([7, 7, 7, 3, 9, 1, 5]), 3),
    )
    cases = [(name, model, token_ids, word_index, _order_blind(model, token_ids, word_index))
             for name, model in _models(vocab_size, num_classes)
             for token_ids, word_index in sentences]
    outcomes = call_in_private_order([
        partial(call, fn, model, token_ids.clone(), word_index, prop=f"your test runs on {name}")
        for name, model, token_ids, word_index, _ in cases])
    for (name, _, token_ids, word_index, blind), outcome in zip(cases, outcomes, strict=True):
        verdict = outcome.get()
        if isinstance(verdict, torch.Tensor) and verdict.numel() == 1:
            verdict = bool(verdict.item())
        expect_true(f"your test returns True or False ({name})", isinstance(verdict, bool),
                    expected="a bool", actual=type(verdict).__name__,
                    hint="Return True when no swap changes the logits, False otherwise.")
        sentence = f"{name}, sentence {token_ids.tolist()} with the word at {word_index}"
        if blind and not verdict:
            fail(f"your test calls {sentence} order-blind", expected=True, actual=False,
                 hint="No swap of two other words changes this model's logits here, yet your "
                      "test says that order matters. Two usual causes: the ambiguous word "
                      "moved (swap only the other words, so that word_index still points at "
                      "it), or the logits were compared exactly (adding numbers in another "
                      "order changes the last bits, so compare within 1e-6).")
        if not blind and verdict:
            hint = ("Some swaps change this model's logits, but your test did not try "
                    "them. A swap of two equal words changes nothing, and some models "
                    "notice only particular positions, only swaps across the ambiguous "
                    "word (which no swap of neighbours makes) or only swaps of words far "
                    "apart: try every pair of the other words (a sentence has only a few).")
            if "faintly" in name:
                hint = ("This model's logits move by about 1e-4 when the last word moves: "
                        "order matters to it, a little. Compare the logits themselves "
                        "within 1e-6, not the predicted class or a loose tolerance.")
            fail(f"your test notices that order matters to {sentence}", expected=False,
                 actual=True, hint=hint)
    passed("your test tells order-blind models from order-sensitive ones, including models that "
           "notice only a few of the swaps, only swaps across the ambiguous word, or only a "
           "little.")


# --------------------------------------------------------------------------- exercise 9.3


def _by_offset(weights, word_index, lengths, offsets, *, sign=1, keep_out_of_range=False):
    rows = torch.arange(weights.shape[0])
    from_word = weights[rows, :, word_index]  # (B, num_heads, T)
    result = []
    for offset in offsets:
        position = word_index + sign * offset  # (B,)
        real = (position >= 0) & (position < lengths)
        if keep_out_of_range:
            real = torch.ones_like(real)
        picked = from_word[rows, :, position % weights.shape[-1]]  # (B, num_heads), -1 wraps
        result.append(picked[real].mean() if real.any() else torch.tensor(float("nan")))
    return torch.stack(result)


@checker
def check_attention_by_offset(fn) -> None:
    """Check ``fn(weights, word_index, lengths, offsets)``: mean attention at each offset.

    ``weights`` is ``(B, num_heads, T, T)``, ``word_index`` and ``lengths`` are ``(B,)``, and
    ``offsets`` a list of ints. For each offset ``d`` the result holds the weight from the
    ambiguous word (query ``word_index[b]``) to the token at ``word_index[b] + d``, averaged
    over the heads and over the sentences in which that position is a real token
    (``0 <= word_index[b] + d < lengths[b]``). Shape ``(len(offsets),)``.

    Taught in chapter 9 (exercise 9.3).
    """
    generator = torch.Generator().manual_seed(9)
    weights = torch.softmax(torch.randn(4, 2, 6, 6, generator=generator), dim=-1)
    word_index = torch.tensor([0, 3, 5, 2])
    lengths = torch.tensor([4, 6, 6, 3])
    offsets = [-2, -1, 1, 2]
    expected = _by_offset(weights, word_index, lengths, offsets)
    actual = call(fn, weights.clone(), word_index.clone(), lengths.clone(), list(offsets))
    expect_shape("the result", actual, expected.shape,
                 hint="One mean weight per offset: a tensor of shape (len(offsets),).")
    actual = actual.detach().to(expected.dtype)
    if torch.allclose(actual, _by_offset(weights, word_index, lengths, offsets, sign=-1),
                      atol=1e-6):
        fail("offset d means the token d positions after the ambiguous word",
             expected="position word_index + d", actual="position word_index - d",
             hint="A negative offset is a word before the ambiguous word, a positive one a word "
                  "after it.")
    if torch.isnan(actual).any() or torch.allclose(
            actual, _by_offset(weights, word_index, lengths, offsets, keep_out_of_range=True),
            atol=1e-6):
        fail("only sentences in which the position is a real token count",
             expected="the mean over sentences with 0 <= word_index + d < length",
             actual="a mean that includes positions outside the sentence" if not
             torch.isnan(actual).any() else "NaN",
             hint="Leave out the sentences where word_index + d falls before the first word or "
                  "on padding; a negative index in Python counts from the end, which is not the "
                  "word you want.")
    expect_close("the mean weights by offset", actual, expected,
                 hint="For each offset, check which row and which column of the weights you read "
                      "(the ambiguous word is the query) and which sentences you average over.")
    passed("you can see how far from the ambiguous word its attention goes.")


# --------------------------------------------------------------------------- exercise 9.4

#: The sentence of exercise 9.4. By the rule of the data set its deciding word is *speck*,
#: right after *minute*; but *minute* stands at position 10, and every training sentence
#: whose ambiguous word stood there had its deciding word 2 to 4 words *before* it.
MISLEADING_SENTENCE = "they talked about the clock and the hour while the minute speck"
# What chapter 9's trained model attends to most from *minute* (the chapter's check cell
# compares it with the model every time the chapter runs; the browser test with the demo).
_ATTENDED_WORD = "hour"
_COUNT_HINT = ("Count, in the training split, where the deciding word stood (cue_index - "
               "word_index) in the sentences whose ambiguous word stood where minute stands "
               "here (its word_index, counting from 0).")


@checker(reveal=False)  # a prediction: the expected value is kept back
def check_predicted_attended_word(fn) -> None:
    """Check the prediction ``fn()`` of the word *minute* attends to most in exercise 9.4's sentence.

    ``fn()`` returns one word of :data:`MISLEADING_SENTENCE` (a string): the word, other
    than *minute* itself, to which chapter 9's trained classifier gives the largest attention
    weight from *minute*, averaged over its four heads (the word the demo of section 9.7
    marks with a star). The hints explain the usual wrong predictions without naming the
    right one.

    Taught in chapter 9 (exercise 9.4).
    """
    words = MISLEADING_SENTENCE.split()
    value = call(fn)
    expect_true("the prediction is a word", isinstance(value, str),
                expected="a string such as 'while'", actual=type(value).__name__,
                hint="Return the word itself, as a string, not its position.")
    word = value.strip().strip("'\"").lower()
    expect_true("the prediction is a word of the sentence", word in words,
                expected=f"one of {sorted(set(words))}", actual=repr(value),
                hint="Return one of the words of the sentence, spelled as it is there.")
    if word == "minute":
        fail("the prediction is another word than minute", expected="a word other than minute",
             actual="'minute'",
             hint="Most of minute's attention goes to minute itself (section 9.5); the question "
                  "is which *other* word gets the most. " + _COUNT_HINT)
    if word == "speck":
        fail("your prediction survives the experiment", expected="a prediction that does",
             actual="'speck'",
             hint="speck is the nearer cue, the rule by which the data were made. But the model "
                  "never read that rule: it learned from 1,680 sentences, with a positional "
                  "encoding that tells it where each word stands in the sentence. "
                  + _COUNT_HINT)
    if word == "clock":
        fail("your prediction survives the experiment", expected="a prediction that does",
             actual="'clock'",
             hint="clock stands six words before minute, further than any deciding word "
                  "stood in the data set, and two time cues do not add up to more attention "
                  "for the first one. " + _COUNT_HINT)
    if word != _ATTENDED_WORD:
        fail("your prediction survives the experiment", expected="a prediction that does",
             actual=repr(word),
             hint="In sentences like this one the trained heads look from the ambiguous word "
                  "at cue words rather than at the small words of the frames (section 9.6). "
                  + _COUNT_HINT)
    passed(f"the model looks at {_ATTENDED_WORD!r}: where minute stands, the training sentences "
           "always had their deciding word a few words before it, so that is where it looks, "
           "although a nearer cue follows it.")
