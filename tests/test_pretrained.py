"""attention_book.pretrained: the offline model, its checksum, and its attention weights."""

from __future__ import annotations

import hashlib

import pytest
import torch

from attention_book import scaled_dot_product_attention
from attention_book.pretrained import (
    PACKAGED_WEIGHTS_SHA256,
    WEIGHTS_FILE,
    ChecksumError,
    load_pretrained,
    packaged_model_path,
    sha256_of,
    verify_weights,
)

FAKE = b"not the weights of all-MiniLM-L6-v2"


@pytest.fixture
def fake_model_dir(tmp_path):
    (tmp_path / WEIGHTS_FILE).write_bytes(FAKE)
    return tmp_path


@pytest.fixture(scope="module")
def minilm():
    return load_pretrained()


def test_sha256_of_matches_hashlib(fake_model_dir):
    assert sha256_of(fake_model_dir / WEIGHTS_FILE, chunk_size=4) == hashlib.sha256(FAKE).hexdigest()


def test_packaged_weights_match_the_recorded_checksum():
    weights = verify_weights(packaged_model_path())
    assert weights.name == WEIGHTS_FILE
    assert sha256_of(weights) == PACKAGED_WEIGHTS_SHA256


def test_verify_refuses_a_different_file(fake_model_dir):
    with pytest.raises(ChecksumError) as refusal:
        verify_weights(fake_model_dir)
    message = str(refusal.value)
    assert hashlib.sha256(FAKE).hexdigest() in message
    assert PACKAGED_WEIGHTS_SHA256 in message
    assert "refusing to load" in message
    assert isinstance(refusal.value, ValueError)


def test_verify_needs_a_weights_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no {WEIGHTS_FILE}"):
        verify_weights(tmp_path)


def test_load_refuses_a_tampered_directory_before_loading(fake_model_dir, monkeypatch):
    import transformers

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the checksum was checked")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", must_not_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", must_not_load)
    with pytest.raises(ChecksumError):
        load_pretrained(fake_model_dir)
    with pytest.raises(ChecksumError):
        load_pretrained(str(fake_model_dir), expected_sha256="0" * 64)


def test_hub_names_are_checked_too(fake_model_dir, monkeypatch):
    import huggingface_hub

    requested = []

    def fake_download(repo_id, **kwargs):
        requested.append(repo_id)
        return str(fake_model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    with pytest.raises(ChecksumError):
        load_pretrained("someone/not-minilm")
    assert requested == ["someone/not-minilm"]


def test_load_rejects_a_bad_name_type():
    with pytest.raises(TypeError, match="name_or_path must be None, a path or a hub name"):
        load_pretrained(42)


def test_loading_prints_nothing_and_restores_logging(capfd):
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    tokenizer, model = load_pretrained()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    assert hf_logging.get_verbosity() == before
    assert not model.training


def test_model_returns_weights_per_layer(minilm):
    tokenizer, model = minilm
    encoded = tokenizer("It took one minute.", return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    assert tokens == ["[CLS]", "it", "took", "one", "minute", ".", "[SEP]"]
    with torch.no_grad():
        outputs = model(**encoded, output_attentions=True)
    assert model.config._attn_implementation == "eager"
    assert len(outputs.attentions) == 6
    for layer in outputs.attentions:
        assert layer.shape == (1, 12, 7, 7)
        torch.testing.assert_close(layer.sum(-1), torch.ones(1, 12, 7))


def test_weights_equal_the_books_attention(minilm):
    tokenizer, model = minilm
    encoded = tokenizer("The size was minute.", return_tensors="pt")
    with torch.no_grad():
        outputs = model(**encoded, output_attentions=True, output_hidden_states=True)
        layer = model.encoder.layer[3].attention.self
        hidden = outputs.hidden_states[3]  # (1, T, 384)

        def split(x):
            return x.view(1, x.shape[1], 12, 32).transpose(1, 2)  # (1, 12, T, 32)

        _, weights = scaled_dot_product_attention(
            split(layer.query(hidden)), split(layer.key(hidden)), split(layer.value(hidden))
        )
    torch.testing.assert_close(weights, outputs.attentions[3])
