"""Chapters 8 and 9's checkers accept right answers and explain typical wrong ones."""

from __future__ import annotations

import pytest
import torch
from hidden_tests import passes_hidden_tests

from attention_book.exercises import (
    check_attention_by_offset,
    check_is_order_blind,
    check_norm_based_weights,
    check_predicted_accuracy_without_positions,
    check_predicted_attended_word,
    check_predicted_bias_effects,
    check_top_head,
)


def _passes(checker, answer, capsys):
    assert checker(answer) is True
    out = capsys.readouterr().out
    assert out.startswith("Correct:"), out
    return out


def _fails(checker, answer, *fragments, capsys, hint=True):
    assert checker(answer) is False
    out = capsys.readouterr().out
    assert out.startswith("Not yet."), out
    for fragment in fragments:
        assert fragment in out, out
    assert out.count("hint:") == (1 if hint else 0)
    return out


def _blank(*args):
    raise NotImplementedError()


@pytest.mark.parametrize("checker", [
    check_top_head, check_predicted_bias_effects, check_norm_based_weights,
    check_predicted_accuracy_without_positions, check_is_order_blind, check_attention_by_offset,
    check_predicted_attended_word,
])
def test_a_blank_answer_says_so(checker, capsys):
    _fails(checker, _blank, "You have not written `_blank` yet", capsys=capsys, hint=False)


# --- 8.1 the strongest link (bug-hunt) ------------------------------------------------------------


def _top_head(swap_direction=False, divide_by_layers=False, swap_pair=False):
    def top_head(attentions, query_index, key_index):
        weights = torch.stack(list(attentions))[:, 0]  # (num_layers, num_heads, T, T)
        if swap_direction:
            link = weights[:, :, key_index, query_index]
        else:
            link = weights[:, :, query_index, key_index]  # (num_layers, num_heads)
        size = len(attentions) if divide_by_layers else link.shape[1]
        layer, head = divmod(link.argmax().item(), size)
        return (head, layer) if swap_pair else (layer, head)

    return top_head


def test_top_head_accepts_the_fix(capsys):
    _passes(check_top_head, _top_head(), capsys)


def test_top_head_accepts_a_tensor_pair(capsys):
    def as_tensor(attentions, query_index, key_index):
        return torch.tensor(_top_head()(attentions, query_index, key_index))

    _passes(check_top_head, as_tensor, capsys)


@pytest.mark.parametrize(("answer", "fragments"), [
    (_top_head(swap_direction=True, divide_by_layers=True), ["split into (layer, head)",
                                                            "the head index runs fastest"]),
    (_top_head(divide_by_layers=True), ["split into (layer, head)"]),
    (_top_head(swap_direction=True), ["from the query token to the key token",
                                      "Row i of a weight matrix is query token i"]),
    (_top_head(swap_pair=True), ["(layer, head), in that order"]),
    (lambda attentions, q, k: 3, ["a pair (layer, head) of ints"]),
    (lambda attentions, q, k: (0, 0), ["the (layer, head) with the largest weight"]),
])
def test_top_head_explains_each_bug(answer, fragments, capsys):
    _fails(check_top_head, answer, *fragments, capsys=capsys)


# --- 8.2 the bias prediction --------------------------------------------------------------------


def test_bias_prediction(capsys):
    out = _passes(check_predicted_bias_effects, lambda: {"key bias": False, "query bias": True},
                  capsys)
    assert "softmax ignores" in out
    _fails(check_predicted_bias_effects, lambda: {"key bias": True, "query bias": True},
           "prediction for the key bias", "the same for every key j", capsys=capsys)
    _fails(check_predicted_bias_effects, lambda: {"key bias": False, "query bias": False},
           "prediction for the query bias", "involves the key", capsys=capsys)
    _fails(check_predicted_bias_effects, lambda: (False, True), "a dict", capsys=capsys)
    _fails(check_predicted_bias_effects, lambda: {"key bias": 0, "query bias": 1}, "a dict",
           capsys=capsys)


def test_the_bias_facts_hold_in_a_bert_layer():
    """What the prediction's checker calls right is true of BERT's attention (a tiny random one)."""
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    query = torch.nn.Linear(8, 8, dtype=torch.float64)
    key = torch.nn.Linear(8, 8, dtype=torch.float64)

    def weights():
        return torch.softmax(query(x) @ key(x).transpose(-2, -1) / 8**0.5, dim=-1)

    with torch.no_grad():
        before = weights()
        key.bias.zero_()
        assert torch.allclose(weights(), before, atol=1e-12)
        query.bias.zero_()
        assert (weights() - before).abs().max() > 1e-3


# --- 8.3 norm-based weights ----------------------------------------------------------------------


def _norm_based(weights, transformed):
    contributions = weights * transformed.norm(dim=-1)[:, None, :]  # (heads, T_q, T_k)
    return contributions / contributions.sum(dim=-1, keepdim=True)


def _norm_based_loop(weights, transformed):
    num_heads, num_tokens, _ = weights.shape
    result = torch.zeros_like(weights)
    for h in range(num_heads):
        for i in range(num_tokens):
            lengths = torch.stack([(weights[h, i, j] * transformed[h, j]).norm()
                                   for j in range(num_tokens)])
            result[h, i] = lengths / lengths.sum()
    return result


@pytest.mark.parametrize("answer", [_norm_based, _norm_based_loop])
def test_norm_based_accepts_right_answers(answer, capsys):
    _passes(check_norm_based_weights, answer, capsys)


@pytest.mark.parametrize(("answer", "fragments"), [
    (lambda w, f: w.clone(), ["differ from the attention weights", "a large weight on a short"]),
    (lambda w, f: w * f.norm(dim=-1)[:, None, :], ["every row sums to 1", "Divide each row"]),
    (lambda w, f: (c := w * f.norm(dim=-1)[:, None, :]) / c.sum(-2, keepdim=True),
     ["every row (one query) sums to 1", "row i is query i"]),
    (lambda w, f: (c := w * f.norm(dim=-1)[:, None, :] ** 2) / c.sum(-1, keepdim=True),
     ["lengths of the vectors", "not its square"]),
    (lambda w, f: (c := w * f.norm(dim=-1)[:, :, None]) / c.sum(-1, keepdim=True),
     ["differ from the attention weights"]),  # the query's length cancels in each row
    (lambda w, f: f.norm(dim=1), ["the shape of"]),
])
def test_norm_based_explains_typical_mistakes(answer, fragments, capsys):
    _fails(check_norm_based_weights, answer, *fragments, capsys=capsys)


# --- 9.1 the prediction -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.7, 0.75, 0.77, 0.85])
def test_accuracy_prediction_near_the_bag_of_words(value, capsys):
    _passes(check_predicted_accuracy_without_positions, lambda: value, capsys)


@pytest.mark.parametrize(("value", "fragments"), [
    (0.98, ["which of the two cue words", "chapter 1's average"]),
    (0.9, ["which of the two cue words"]),
    (0.5, ["two cues agree"]),
    (0.125, ["two cues agree"]),
    (77, ["a fraction between 0 and 1", "divide a percentage by 100"]),
    (-0.2, ["a fraction between 0 and 1"]),
    ("77%", ["a number"]),
])
def test_accuracy_prediction_explains(value, fragments, capsys):
    _fails(check_predicted_accuracy_without_positions, lambda: value, *fragments, capsys=capsys)


def test_the_band_contains_the_bag_of_words_level():
    from attention_book.exercises.ch09 import PREDICTION_BAND

    low, high = PREDICTION_BAND
    assert low < 0.772 < high  # chapter 9's expected accuracy of a bag of words


# --- 9.2 the property test ------------------------------------------------------------------------


def _order_test(*, all_pairs=True, exact=False, move_word=False, atol=1e-6, pairs_from=None,
                by_class=False):
    """A property test in the learner's style; each keyword is one typical weakness.

    ``pairs_from(num_tokens, word_index)`` chooses the pairs to swap (all pairs by default);
    ``by_class`` compares the predicted classes instead of the logits.
    """
    def is_order_blind(model, token_ids, word_index):
        num_tokens = token_ids.numel()
        lengths, where = torch.tensor([num_tokens]), torch.tensor([word_index])
        with torch.no_grad():
            reference = model(token_ids[None], lengths, where)
            pairs = [(i, j) for i in range(num_tokens) for j in range(i + 1, num_tokens)]
            if not all_pairs:
                pairs = pairs[:1]
            if pairs_from is not None:
                pairs = pairs_from(num_tokens, word_index)
            for i, j in pairs:
                if not move_word and word_index in (i, j):
                    continue
                swapped = token_ids.clone()
                swapped[[i, j]] = token_ids[[j, i]]
                logits = model(swapped[None], lengths, where)
                if by_class:
                    same = torch.equal(logits.argmax(-1), reference.argmax(-1))
                elif exact:
                    same = torch.equal(logits, reference)
                else:
                    same = torch.allclose(logits, reference, atol=atol)
                if not same:
                    return False
        return True

    return is_order_blind


def _neighbours(num_tokens, word_index):  # the recheck's weak test: adjacent swaps only
    return [(i, i + 1) for i in range(num_tokens - 1)]


def _one_side(num_tokens, word_index):  # swaps only among the words after the ambiguous one
    return [(i, j) for i in range(word_index + 1, num_tokens) for j in range(i + 1, num_tokens)]


def _with_the_last(num_tokens, word_index):  # swaps every word with the last one only
    return [(i, num_tokens - 1) for i in range(num_tokens - 1)]


def _first_with_last(num_tokens, word_index):  # one far swap: the first and the last word
    return [(0, num_tokens - 1)]


def _near(num_tokens, word_index):  # the recheck's N-f: neighbours and next-but-one words only
    return [(i, j) for i in range(num_tokens) for j in range(i + 1, min(i + 3, num_tokens))]


def _within_three(num_tokens, word_index):  # every pair at most three apart
    return [(i, j) for i in range(num_tokens) for j in range(i + 1, min(i + 4, num_tokens))]


def test_order_blind_accepts_a_right_test(capsys):
    _passes(check_is_order_blind, _order_test(), capsys)


def test_order_blind_accepts_a_tensor_verdict(capsys):
    right = _order_test()
    _passes(check_is_order_blind, lambda m, t, w: torch.tensor(right(m, t, w)), capsys)


@pytest.mark.parametrize(("answer", "fragments"), [
    (_order_test(all_pairs=False), ["notices that order matters", "try every pair"]),
    (_order_test(move_word=True), ["order-blind", "the ambiguous word moved"]),
    (_order_test(atol=0.5), ["notices that order matters"]),
    (_order_test(pairs_from=_neighbours), ["notices that order matters", "across the ambiguous"]),
    (_order_test(pairs_from=_one_side), ["notices that order matters", "try every pair"]),
    (_order_test(pairs_from=_with_the_last), ["notices that order matters", "try every pair"]),
    (_order_test(pairs_from=_first_with_last), ["notices that order matters", "try every pair"]),
    (_order_test(pairs_from=_near), ["notices that order matters", "far apart"]),
    (_order_test(pairs_from=_within_three), ["notices that order matters", "far apart"]),
    (_order_test(by_class=True), ["notices that order matters"]),
    (_order_test(atol=1e-3), ["reads the last word only very faintly", "within 1e-6"]),
    (lambda m, t, w: "yes", ["returns True or False"]),
])
def test_order_blind_explains_typical_mistakes(answer, fragments, capsys):
    _fails(check_is_order_blind, answer, *fragments, capsys=capsys)


def test_the_checker_models_are_what_their_names_say():
    """The premise of the property test: without positions the classifier is order-blind."""
    from attention_book.exercises.ch09 import _models, _order_blind

    sentence = torch.tensor([3, 3, 5, 7, 2, 9, 4])
    verdicts = {name: _order_blind(model, sentence, 3) for name, model in _models(12, 4)}
    assert verdicts == {
        "an averaging classifier": True,
        "an attention classifier without positions": True,
        "an attention classifier with positions": False,
        "a model that reads the last word": False,
        "a model that reads the word just before the ambiguous one": False,
        "a model that reads the first word": False,
        "a bag of words on each side of the ambiguous word": False,
        "a model that reads the last word only very faintly": False,
    }


def test_the_new_models_hide_from_neighbour_swaps():
    """Two checker models change only under a swap of words that are not neighbours (N4)."""
    from attention_book.exercises.ch09 import _models

    models = dict(_models(12, 4))
    sentence, word_index = torch.tensor([3, 3, 5, 7, 2, 9, 4]), 3
    lengths, where = torch.tensor([7]), torch.tensor([word_index])
    for name in ("a model that reads the first word",
                 "a bag of words on each side of the ambiguous word"):
        model = models[name]
        reference = model(sentence[None], lengths, where)
        changes = {}
        for i in range(7):
            for j in range(i + 1, 7):
                if word_index in (i, j):
                    continue
                swapped = sentence.clone()
                swapped[[i, j]] = sentence[[j, i]]
                changes[i, j] = not torch.allclose(model(swapped[None], lengths, where),
                                                   reference, atol=1e-6)
        assert not any(changed for (i, j), changed in changes.items() if j == i + 1), name
        assert any(changes.values()), name


def test_the_first_word_model_shows_only_in_far_swaps_of_a_word_said_three_times():
    """The checker's sentence for N-f: the first word's reader changes only 4 or more apart."""
    from attention_book.exercises.ch09 import _models

    model = dict(_models(12, 4))["a model that reads the first word"]
    sentence, word_index = torch.tensor([8, 8, 8, 2, 5, 11, 7]), 3
    lengths, where = torch.tensor([7]), torch.tensor([word_index])
    reference = model(sentence[None], lengths, where)
    changed = set()
    for i in range(7):
        for j in range(i + 1, 7):
            if word_index not in (i, j):
                swapped = sentence.clone()
                swapped[[i, j]] = sentence[[j, i]]
                if not torch.allclose(model(swapped[None], lengths, where), reference, atol=1e-6):
                    changed.add((i, j))
    assert changed == {(0, 4), (0, 5), (0, 6)}


def _reversed_others(model, token_ids, word_index):
    """The recheck's D4: one permutation, the other words in reverse order. On a sentence whose
    other words read the same at both ends it moves neither the first word nor the last."""
    num_tokens = token_ids.numel()
    lengths, where = torch.tensor([num_tokens]), torch.tensor([word_index])
    others = [i for i in range(num_tokens) if i != word_index]
    permuted = token_ids.clone()
    permuted[others] = token_ids[others[::-1]]
    with torch.no_grad():
        return torch.allclose(model(permuted[None], lengths, where),
                              model(token_ids[None], lengths, where), atol=1e-6)


def test_one_permutation_fails_the_checker_and_the_hidden_tests(capsys):
    """Reversing the other words once passed the checker but not the hidden tests (D4)."""
    out = _fails(check_is_order_blind, _reversed_others, "notices that order matters",
                 "[6, 3, 8, 1, 5, 6]", capsys=capsys)
    assert "try every pair" in out
    assert not passes_hidden_tests("09_training_attention.ipynb", "ch09-ex2-check",
                                   is_order_blind=_reversed_others)


def test_the_hidden_tests_of_ex92_reject_every_weak_test():
    notebook, grade_id = "09_training_attention.ipynb", "ch09-ex2-check"
    assert passes_hidden_tests(notebook, grade_id, is_order_blind=_order_test())
    for weak in (_order_test(all_pairs=False), _order_test(move_word=True),
                 _order_test(pairs_from=_neighbours), _order_test(pairs_from=_one_side),
                 _order_test(pairs_from=_with_the_last), _order_test(by_class=True),
                 _order_test(atol=1e-3), _order_test(pairs_from=_first_with_last),
                 _order_test(pairs_from=_near), _order_test(pairs_from=_within_three)):
        assert not passes_hidden_tests(notebook, grade_id, is_order_blind=weak)


# --- 9.3 attention by offset ----------------------------------------------------------------------


def _by_offset_right(weights, word_index, lengths, offsets):
    rows = torch.arange(weights.shape[0])
    from_word = weights[rows, :, word_index]  # (B, num_heads, T)
    means = []
    for offset in offsets:
        position = word_index + offset
        real = (position >= 0) & (position < lengths)
        means.append(from_word[rows[real], :, position[real]].mean())
    return torch.stack(means)


def _by_offset_wrapping(weights, word_index, lengths, offsets):
    rows = torch.arange(weights.shape[0])
    from_word = weights[rows, :, word_index]
    return torch.stack([from_word[rows, :, (word_index + d) % weights.shape[-1]].mean()
                        for d in offsets])


def test_attention_by_offset(capsys):
    _passes(check_attention_by_offset, _by_offset_right, capsys)
    _fails(check_attention_by_offset,
           lambda w, i, n, o: _by_offset_right(w, i, n, [-d for d in o]),
           "d positions after", "A negative offset", capsys=capsys)
    _fails(check_attention_by_offset, _by_offset_wrapping, "a real token count",
           "counts from the end", capsys=capsys)
    _fails(check_attention_by_offset,
           lambda w, i, n, o: _by_offset_right(w.transpose(-2, -1), i, n, o),
           "the values of the mean weights by offset", capsys=capsys)
    _fails(check_attention_by_offset,
           lambda w, i, n, o: _by_offset_right(w, i, n, o)[None], "the shape of", capsys=capsys)


# --- 9.4 where the model looks in a sentence built to mislead it -----------------------------------


@pytest.mark.parametrize("answer", ["hour", " Hour", "'hour'", "HOUR\n"])
def test_attended_word_accepts_the_word_however_written(answer, capsys):
    out = _passes(check_predicted_attended_word, lambda: answer, capsys)
    assert "a nearer cue follows it" in out


@pytest.mark.parametrize(("answer", "fragments"), [
    ("speck", ["'speck'", "the nearer cue", "never read that rule", "cue_index - word_index"]),
    ("clock", ["'clock'", "six words before minute", "do not add up"]),
    ("minute", ["another word than minute", "*other* word"]),
    ("while", ["'while'", "small words of the frames"]),
    ("the", ["'the'", "small words of the frames"]),
    ("grain", ["a word of the sentence", "'grain'"]),
    (10, ["a word", "not its position"]),
    (None, ["a word", "NoneType"]),
])
def test_attended_word_explains_typical_mistakes(answer, fragments, capsys):
    out = _fails(check_predicted_attended_word, lambda: answer, *fragments, capsys=capsys)
    assert "hour" not in out.split("hint:")[1].lower()  # no hint gives the answer away


def test_the_misleading_sentence_is_what_the_exercise_says():
    """minute stands at 10, speck (the data set's deciding word) right after it; no training
    sentence with its ambiguous word at 10 had its deciding word after it."""
    from attention_book.data import load_ambiguity_dataset
    from attention_book.exercises.ch09 import _ATTENDED_WORD, MISLEADING_SENTENCE

    words = MISLEADING_SENTENCE.split()
    position = words.index("minute")
    assert position == 10 and words[position + 1] == "speck" and _ATTENDED_WORD in words
    train = [e for e in load_ambiguity_dataset() if e.split == "train" and e.word_index == position]
    offsets = {e.cue_index - e.word_index for e in train}
    assert len(train) > 50 and offsets == {-4, -3, -2}
    assert words.index(_ATTENDED_WORD) - position in offsets
    assert MISLEADING_SENTENCE not in {e.sentence for e in load_ambiguity_dataset()}
