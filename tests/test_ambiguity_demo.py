"""Chapter 9's ambiguity demo on the Python side: the export, the PyTorch reference reading,
the first rendering, and clear errors. The browser tests (tests/test_browser_minute_demo.py)
check that the page's JavaScript computes the same numbers.
"""

from __future__ import annotations

import json

import pytest
import torch

from attention_book.data import Vocabulary, encode_splits, load_ambiguity_dataset
from attention_book.demos import (
    EXPORT_DECIMALS,
    ambiguity_demo,
    classifier_from_export,
    export_classifier,
    read_sentence,
)
from attention_book.train import AttentionClassifier


@pytest.fixture(scope="module")
def untrained():
    """A classifier of chapter 9's shape with its real vocabulary and labels (not trained:
    the functions under test must work for any weights)."""
    vocab, labels, _ = encode_splits(load_ambiguity_dataset())
    torch.manual_seed(3)
    model = AttentionClassifier(len(vocab), len(labels), dtype=torch.float64).eval()
    return model, vocab, labels


def test_export_round_trips_to_the_rounded_weights(untrained):
    model, vocab, labels = untrained
    payload = export_classifier(model, vocab, labels)
    assert json.loads(json.dumps(payload)) == payload  # plain JSON, nothing else
    assert payload == export_classifier(model, vocab, labels)  # deterministic
    assert payload["vocab"] == vocab.itos and payload["labels"] == list(labels)
    rebuilt, rebuilt_vocab, rebuilt_labels = classifier_from_export(payload)
    assert rebuilt_vocab.itos == vocab.itos and rebuilt_labels == list(labels)
    original, copy = model.state_dict(), rebuilt.state_dict()
    assert original.keys() == copy.keys()
    for key in original:
        gap = (original[key].double() - copy[key]).abs().max().item()
        assert gap <= 0.5 * 10.0**-EXPORT_DECIMALS + 1e-15, key
    # 4 bytes per weight, base64: 4/3 characters per byte
    count = sum(p.numel() for p in model.parameters())
    assert len(payload["weights"]) == 4 * ((4 * count + 2) // 3)


def test_reading_a_sentence_is_the_models_forward_pass(untrained):
    model, vocab, labels = untrained
    reading = read_sentence(model, vocab, labels, "The Minute, by the clock; while we saw zzz dust!")
    assert reading.status == "ok"
    assert reading.words == ("the", "minute", "by", "the", "clock", "while", "we", "saw", "zzz",
                             "dust")
    assert reading.unknown == ("zzz",)
    assert reading.tokens == ("the", "minute", "by", "the", "clock", "while", "we", "saw", "dust")
    assert reading.word_index == 1 and reading.word == "minute"
    ids = torch.tensor([vocab.encode(list(reading.tokens))])  # (1, T)
    with torch.no_grad():
        logits, weights = model(ids, torch.tensor([9]), torch.tensor([1]), return_weights=True)
    torch.testing.assert_close(reading.probabilities, logits[0].softmax(-1), rtol=0, atol=0)
    torch.testing.assert_close(reading.attention, weights[0, :, 1], rtol=0, atol=0)
    assert reading.attention.shape == (model.attention.num_heads, 9)
    torch.testing.assert_close(reading.attention.sum(-1), torch.ones(4, dtype=torch.float64))
    mean = reading.attention.mean(0)
    others = [i for i in range(9) if i != 1]
    assert reading.attended_index == max(others, key=lambda i: mean[i].item())
    assert reading.attended_word == reading.tokens[reading.attended_index]


@pytest.mark.parametrize(("sentence", "status", "unknown"), [
    ("", "empty", ()),
    ("  ...  ", "empty", ()),
    ("we saw the clock near the river", "no-ambiguous-word", ()),
    ("it took one moment", "no-ambiguous-word", ("it", "took", "moment")),
    ("minute " * 17, "too-long", ()),
    ("the minute " + "zzz " * 30, "ok", ("zzz",)),  # unknown words do not count
])
def test_the_states_without_a_prediction(untrained, sentence, status, unknown):
    model, vocab, labels = untrained
    reading = read_sentence(model, vocab, labels, sentence)
    assert reading.status == status and reading.unknown == unknown
    if status != "ok":
        assert reading.probabilities is None and reading.attention is None
        assert reading.word is None and reading.attended_word is None


def test_a_sentence_of_the_ambiguous_word_alone_attends_to_nothing_else(untrained):
    model, vocab, labels = untrained
    reading = read_sentence(model, vocab, labels, "bank")
    assert reading.status == "ok" and reading.attended_index == -1
    assert reading.attention.shape == (4, 1)


def test_bad_input_names_what_is_wrong(untrained):
    model, vocab, labels = untrained
    with pytest.raises(TypeError, match="AttentionClassifier, got Linear"):
        read_sentence(torch.nn.Linear(2, 2), vocab, labels, "minute")
    with pytest.raises(ValueError, match=r"vocabulary has 3 words but the model embeds 79"):
        read_sentence(model, Vocabulary(["a", "b"]), labels, "minute")
    with pytest.raises(ValueError, match=r"got 2 labels but the model scores 8"):
        read_sentence(model, vocab, labels[:2], "minute")
    with pytest.raises(ValueError, match="'word/sense', got 'minute'"):
        read_sentence(model, vocab, ["minute", *labels[1:]], "minute")
    with pytest.raises(TypeError, match="sentence must be a str, got list"):
        read_sentence(model, vocab, labels, ["minute"])
    with pytest.raises(ValueError, match="decimals must be an int from 1 to 8, got 9"):
        export_classifier(model, vocab, labels, decimals=9)
    payload = export_classifier(model, vocab, labels)
    payload["layout"] = [["embedding", 78, 32], *payload["layout"][1:]]
    with pytest.raises(ValueError, match="the payload holds 6920 weights, the layout 6888"):
        classifier_from_export(payload)
    with pytest.raises(ValueError):
        ambiguity_demo(model, vocab, labels, element_id="not an id!", sentence="minute")


def test_demo_html_is_deterministic_and_accessible(untrained):
    model, vocab, labels = untrained
    first = ambiguity_demo(model, vocab, labels, element_id="amb", sentence="the minute by the dust")
    again = ambiguity_demo(model, vocab, labels, element_id="amb", sentence="the minute by the dust")
    page = first.data
    assert page == again.data
    assert 'id="amb"' in page and 'data-demo="ambiguity"' in page
    assert '<label for="amb-input">' in page and 'id="amb-input"' in page
    assert 'aria-live="polite"' in page
    assert 'id="amb-prediction"' in page and "The model reads <strong>minute</strong> as" in page
    assert "fetch(" not in page and "http" not in page  # nothing from another host
    markup = page.split("<script>")[0]
    assert markup.count("<button") == len(vocab) - 1  # a chip per known word, no suggestion yet


@pytest.mark.parametrize(("sentence", "message"), [
    ("", 'data-message="empty"'),
    ("we saw the clock", 'data-message="no-ambiguous-word"'),
    ("minute " * 17, 'data-message="too-long"'),
    ("the minute by the klock", 'data-message="unknown"'),
])
def test_first_rendering_shows_each_message(untrained, sentence, message):
    model, vocab, labels = untrained
    page = ambiguity_demo(model, vocab, labels, element_id="amb", sentence=sentence).data
    assert message in page


def test_the_notes_say_what_the_answer_rests_on(untrained):
    """Several ambiguous words, no cue word of the word read, no clear focus: each one noted,
    and shown as a message (or, for the focus, by the missing star)."""
    from attention_book.demos import CLEAR_FOCUS

    model, vocab, labels = untrained
    two = read_sentence(model, vocab, labels, "The bat near the bank, by the money!")
    assert two.word == "bat" and two.ambiguous_indices == (1, 4)
    assert two.cue_indices == () and two.notes[:2] == ("several-ambiguous", "no-cue")
    page = ambiguity_demo(model, vocab, labels, element_id="amb",
                          sentence="The bat near the bank, by the money!").data
    assert 'data-message="several-ambiguous"' in page and 'data-message="no-cue"' in page
    assert "2 ambiguous words (<strong>bat</strong>, then <strong>bank</strong>)" in page
    cued = read_sentence(model, vocab, labels, "the bat near the cave")
    assert cued.cue_indices == (4,) and "no-cue" not in cued.notes
    # A custom list of cue words: "near" decides the sense of bat; no list for a word, no note.
    custom = read_sentence(model, vocab, labels, "the bat near", cues={"bat": ["near"]})
    assert custom.cue_indices == (2,) and "no-cue" not in custom.notes
    nobody = read_sentence(model, vocab, labels, "the minute", cues={"bat": ["near"]})
    assert "no-cue" not in nobody.notes
    with pytest.raises(TypeError, match="cue words of 'bat' must be a list of strings"):
        read_sentence(model, vocab, labels, "bat", cues={"bat": "near"})
    long = read_sentence(model, vocab, labels, "the minute " + "and the dust " * 4)
    mean = long.attention.mean(0)  # 18 words: no one of them gets a tenth of the attention
    assert float(mean[long.attended_index]) < CLEAR_FOCUS and "no-clear-focus" in long.notes
    for sentence in ("the minute " + "and the dust " * 4, "bat near the cave", "minute minute"):
        reading = read_sentence(model, vocab, labels, sentence)
        page = ambiguity_demo(model, vocab, labels, element_id="amb", sentence=sentence).data
        markup = page.split("<script>")[0]
        starred = 'class="ab-attended"' in markup
        assert starred == ("no-clear-focus" not in reading.notes and reading.attended_index >= 0)
        assert ("so no word has a ★" in markup) == ("no-clear-focus" in reading.notes)


def test_unknown_words_share_one_message_and_no_ambiguous_word_is_suggested(untrained):
    model, vocab, labels = untrained
    sentence = "the bat flew out of the cave at night"
    reading = read_sentence(model, vocab, labels, sentence)
    assert reading.unknown == ("flew", "out", "at")
    markup = ambiguity_demo(model, vocab, labels, element_id="amb", sentence=sentence).data
    markup = markup.split("<script>")[0]
    assert markup.count('data-message="unknown"') == 1
    assert "never seen <strong>flew</strong>, <strong>out</strong> and <strong>at</strong>" in markup
    suggested = [chip for chip in markup.split('data-replace="')[1:]]
    assert len(suggested) == 9  # three replacements for each unknown word
    offered = {chip.split('data-word="')[1].split('"')[0] for chip in suggested}
    assert not offered & {"minute", "bank", "bat", "crane"}, offered
    assert {"fish", "fur", "but"} <= offered  # spelling neighbours of flew and out
