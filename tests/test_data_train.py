"""attention_book.data and attention_book.train: the ambiguity data set and the tiny classifier."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from attention_book import data
from attention_book.data import (
    AMBIGUOUS_WORDS,
    DATA_SEED,
    Vocabulary,
    default_data_path,
    encode_examples,
    encode_splits,
    generate_ambiguity_dataset,
    load_ambiguity_dataset,
    write_ambiguity_csv,
)
from attention_book.train import (
    AttentionClassifier,
    AveragingClassifier,
    evaluate_accuracy,
    mean_attention_to,
    sinusoidal_positional_encoding,
    train_classifier,
)


@pytest.fixture(scope="module")
def examples():
    return generate_ambiguity_dataset()


@pytest.fixture(scope="module")
def encoded(examples):
    return encode_splits(examples)


# --- the generator and the committed CSV ------------------------------------------------------


def test_generator_is_deterministic_under_its_seed(examples):
    assert generate_ambiguity_dataset(per_sense=20, seed=1) == generate_ambiguity_dataset(
        per_sense=20, seed=1)
    assert generate_ambiguity_dataset(per_sense=20, seed=1) != generate_ambiguity_dataset(
        per_sense=20, seed=2)
    assert generate_ambiguity_dataset(seed=DATA_SEED) == examples


def test_committed_csv_is_the_generators_output(examples, tmp_path):
    assert default_data_path().name == "ambiguity.csv"
    assert load_ambiguity_dataset() == examples
    written = write_ambiguity_csv(examples, tmp_path / "copy.csv")
    assert written.read_bytes() == default_data_path().read_bytes()


def test_without_the_repository_the_data_are_regenerated(examples, monkeypatch, tmp_path):
    monkeypatch.setattr(data, "default_data_path", lambda: tmp_path / "absent.csv")
    assert load_ambiguity_dataset() == examples


def test_counts_and_balanced_splits(examples):
    assert len(examples) == 2400
    counts = collections.Counter((e.split, e.label) for e in examples)
    labels = {f"{w}/{s}" for w, senses in AMBIGUOUS_WORDS.items() for s in senses}
    for label in labels:
        assert (counts["train", label], counts["validation", label], counts["test", label]) == (
            210, 45, 45)
    assert len({e.sentence for e in examples}) == len(examples)  # no sentence twice


def test_every_sentence_follows_the_rule(examples):
    for e in examples:
        tokens = e.tokens
        assert tokens[e.word_index] == e.word
        assert tokens[e.cue_index] == e.cue and e.cue in AMBIGUOUS_WORDS[e.word][e.sense]
        assert tokens[e.distractor_index] == e.distractor
        assert any(e.distractor in cues for cues in AMBIGUOUS_WORDS[e.word].values())
        near, far = abs(e.cue_index - e.word_index), abs(e.distractor_index - e.word_index)
        assert 1 <= near <= 4 and far >= near + 2
        assert e.label == f"{e.word}/{e.sense}"
    offsets = {e.cue_index - e.word_index for e in examples}
    assert offsets == {-4, -3, -2, -1, 1, 2, 3}


def test_distractor_sense_is_a_coin_flip(examples):
    agree = sum(e.distractor in AMBIGUOUS_WORDS[e.word][e.sense] for e in examples)
    assert 0.45 < agree / len(examples) < 0.55


def test_frame_words_do_not_reveal_the_label(examples):
    cue_words = {c for senses in AMBIGUOUS_WORDS.values() for cues in senses.values() for c in cues}
    frame_words = collections.defaultdict(set)
    for e in examples:
        frame_words[e.label] |= set(e.tokens) - cue_words - set(AMBIGUOUS_WORDS)
    assert len({frozenset(words) for words in frame_words.values()}) == 1


def test_generator_rejects_bad_sizes(monkeypatch):
    with pytest.raises(TypeError, match="per_sense must be an int"):
        generate_ambiguity_dataset(per_sense=2.5)
    with pytest.raises(ValueError, match="per_sense must be >= 3"):
        generate_ambiguity_dataset(per_sense=2)
    # One frame of each kind leaves 6 cues x 11 distractors x 2 orders = 132 sentences a label.
    monkeypatch.setattr(data, "_TARGET_FRAMES", ("the {c} {w}",))
    monkeypatch.setattr(data, "_DISTRACTOR_FRAMES", ("we saw the {c}",))
    monkeypatch.setattr(data, "_CONNECTORS", ("while",))
    assert len(generate_ambiguity_dataset(per_sense=100)) == 800
    with pytest.raises(ValueError, match=r"could not draw 200 distinct .*\(found 1\d\d\)"):
        generate_ambiguity_dataset(per_sense=200)


def test_loader_reports_missing_file_and_wrong_columns(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data set"):
        load_ambiguity_dataset(tmp_path / "absent.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,label\nthe minute,minute/time\n")
    with pytest.raises(ValueError, match="has columns"):
        load_ambiguity_dataset(bad)


# --- vocabulary and tensors -------------------------------------------------------------------


def test_vocabulary_pads_with_zero_and_names_unknown_tokens():
    vocab = Vocabulary(["b", "a", "b"])
    assert vocab.itos == ["<pad>", "b", "a"] and len(vocab) == 3
    assert vocab.encode(["a", "b"]) == [2, 1]
    with pytest.raises(KeyError, match="'zebra'"):
        vocab.encode(["a", "zebra"])


def test_encode_examples_pads_and_indexes(examples):
    sample = examples[:5]
    vocab = Vocabulary.from_examples(sample)
    labels = sorted({e.label for e in examples})
    tensors = encode_examples(sample, vocab, labels)
    max_len = max(len(e.tokens) for e in sample)
    assert tensors["token_ids"].shape == (5, max_len)
    for row, e in enumerate(sample):
        assert tensors["lengths"][row] == len(e.tokens)
        assert (tensors["token_ids"][row, len(e.tokens):] == 0).all()
        assert vocab.itos[tensors["token_ids"][row, e.word_index]] == e.word
        assert labels[tensors["targets"][row]] == e.label
    with pytest.raises(ValueError, match="are not in labels"):
        encode_examples(sample, vocab, ["bank/money"])
    with pytest.raises(ValueError, match="examples is empty"):
        encode_examples([], vocab, labels)


def test_encode_splits(encoded):
    vocab, labels, tensors = encoded
    assert len(labels) == 8 and labels == sorted(labels)
    assert {name: t["targets"].numel() for name, t in tensors.items()} == {
        "train": 1680, "validation": 360, "test": 360}


def test_encode_splits_needs_every_split(examples):
    only_train = [e for e in examples if e.split == "train"]
    with pytest.raises(ValueError, match="'validation' split is empty"):
        encode_splits(only_train)


# --- the models -------------------------------------------------------------------------------


def test_sinusoidal_positional_encoding():
    pe = sinusoidal_positional_encoding(10, 8)
    assert pe.shape == (10, 8)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * 4))
    torch.testing.assert_close(pe[3, 0], torch.sin(torch.tensor(3.0)))
    torch.testing.assert_close(pe[3, 7], torch.cos(torch.tensor(3.0 / 10000 ** (6 / 8))))
    with pytest.raises(ValueError, match="must be even"):
        sinusoidal_positional_encoding(10, 7)
    with pytest.raises(ValueError, match="context_length must be a positive int"):
        sinusoidal_positional_encoding(0, 8)


def _batch(encoded, split="validation", rows=slice(0, 6)):
    tensors = encoded[2][split]
    return tensors["token_ids"][rows], tensors["lengths"][rows], tensors["word_index"][rows]


def test_attention_classifier_shapes_and_padding(encoded):
    vocab, labels, _ = encoded
    torch.manual_seed(0)
    model = AttentionClassifier(len(vocab), len(labels), d_model=16, num_heads=2).eval()
    token_ids, lengths, word_index = _batch(encoded)
    logits, weights = model(token_ids, lengths, word_index, return_weights=True)
    assert logits.shape == (6, 8) and weights.shape == (6, 2, token_ids.shape[1],
                                                        token_ids.shape[1])
    real = torch.arange(token_ids.shape[1]) < lengths[:, None]  # (B, T)
    assert (weights.masked_select(~real[:, None, None, :]) == 0).all()
    padded = torch.cat([token_ids, torch.zeros(6, 2, dtype=torch.long)], dim=1)  # (B, T + 2)
    torch.testing.assert_close(model(padded, lengths, word_index), logits)


def test_averaging_classifier_ignores_word_order(encoded):
    vocab, labels, _ = encoded
    torch.manual_seed(0)
    model = AveragingClassifier(len(vocab), len(labels), d_model=16).eval()
    token_ids, lengths, word_index = _batch(encoded, rows=slice(0, 1))
    length = lengths.item()
    torch.manual_seed(1)
    shuffled = token_ids.clone()
    shuffled[0, :length] = token_ids[0, torch.randperm(length)]
    torch.testing.assert_close(model(shuffled, lengths, word_index),
                               model(token_ids, lengths, word_index))
    _, weights = model(token_ids, lengths, word_index, return_weights=True)
    torch.testing.assert_close(weights[0, 0, 0, :length], torch.full((length,), 1 / length))


def test_attention_classifier_without_positions_is_order_blind(encoded):
    """positional_encoding=False: swapping two other words leaves the word's logits unchanged."""
    vocab, labels, _ = encoded
    token_ids, lengths, word_index = _batch(encoded, rows=slice(0, 1))
    others = [i for i in range(lengths.item()) if i != word_index.item()]
    swapped = token_ids.clone()
    swapped[0, [others[0], others[-1]]] = token_ids[0, [others[-1], others[0]]]
    assert not torch.equal(swapped, token_ids)
    logits = {}
    for positional_encoding in (False, True):
        torch.manual_seed(0)
        model = AttentionClassifier(len(vocab), len(labels), d_model=16, num_heads=2,
                                    positional_encoding=positional_encoding,
                                    dtype=torch.float64).eval()
        assert model.positional_encoding is positional_encoding
        logits[positional_encoding] = (model(token_ids, lengths, word_index),
                                       model(swapped, lengths, word_index))
    torch.testing.assert_close(*logits[False])
    assert not torch.allclose(*logits[True])
    # The same parameters with and without the encoding: only the positions differ.
    assert not torch.allclose(logits[False][0], logits[True][0])
    with pytest.raises(TypeError, match="positional_encoding must be True or False"):
        AttentionClassifier(10, 3, positional_encoding="no")


@pytest.mark.parametrize("model_class", [AttentionClassifier, AveragingClassifier])
def test_classifiers_reject_bad_batches(model_class):
    model = model_class(10, 3, context_length=4)
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"token_ids must have shape \(B, T\)"):
        model(ids[0], torch.tensor([4, 4]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="exceeds context_length=4"):
        model(torch.ones(2, 5, dtype=torch.long), torch.tensor([5, 5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(B,\)=\(2,\)"):
        model(ids, torch.tensor([4]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="must point at a real token"):
        model(ids, torch.tensor([4, 2]), torch.tensor([0, 3]))


# --- training ---------------------------------------------------------------------------------


def _train_small(encoded, seed, **kwargs):
    vocab, labels, tensors = encoded
    subset = {name: value[:400] for name, value in tensors["train"].items()}
    torch.manual_seed(seed)
    model = AttentionClassifier(len(vocab), len(labels), d_model=16, num_heads=2)
    history = train_classifier(model, subset, tensors["validation"], seed=seed, **kwargs)
    return model, history


def test_training_is_deterministic_quiet_and_restores_threads(encoded, capfd):
    threads = torch.get_num_threads()
    _, first = _train_small(encoded, seed=0, epochs=2)
    _, second = _train_small(encoded, seed=0, epochs=2)
    assert first == second
    assert set(first) == {"train_loss", "val_accuracy", "cue_weight", "distractor_weight"}
    assert all(len(values) == 3 for values in first.values())
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""  # progress=False prints nothing
    assert torch.get_num_threads() == threads


def test_progress_bar_shows_no_timing(encoded, capsys):
    _train_small(encoded, seed=0, epochs=2, progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "validation accuracy" in err
    assert "it/s" not in err and "<" not in err  # no speed, no elapsed/remaining time


def test_training_learns_to_look_at_the_deciding_word(encoded):
    vocab, labels, tensors = encoded
    torch.manual_seed(0)
    model = AttentionClassifier(len(vocab), len(labels))
    history = train_classifier(model, tensors["train"], tensors["validation"], epochs=4)
    assert history["train_loss"][-1] < 0.5 * history["train_loss"][0]
    assert history["val_accuracy"][-1] > 0.75 > 0.2 > history["val_accuracy"][0]
    assert history["cue_weight"][-1] > 1.5 * history["cue_weight"][0]
    assert not model.training
    assert evaluate_accuracy(model, tensors["validation"]) == history["val_accuracy"][-1]


def test_mean_attention_to(encoded):
    vocab, labels, tensors = encoded
    model = AveragingClassifier(len(vocab), len(labels))
    uniform = (1 / tensors["test"]["lengths"].float()).mean().item()
    assert mean_attention_to(model, tensors["test"], "cue_index") == pytest.approx(uniform)
    with pytest.raises(ValueError, match="position must be"):
        mean_attention_to(model, tensors["test"], "targets")


def test_train_classifier_rejects_bad_settings(encoded):
    vocab, labels, tensors = encoded
    model = AveragingClassifier(len(vocab), len(labels))
    with pytest.raises(ValueError, match="epochs must be a positive int"):
        train_classifier(model, tensors["train"], tensors["validation"], epochs=0)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        train_classifier(model, tensors["train"], tensors["validation"], batch_size=0)


def test_examples_are_frozen(examples):
    with pytest.raises(dataclasses.FrozenInstanceError):
        examples[0].label = "bank/money"
