"""Chapter 15's repeated-segment task: the batches, the loss, the accuracy and the training loop."""

from __future__ import annotations

import pytest
import torch

from attention_book.model import TinyGPT
from attention_book.repeat_task import (
    RepeatedSegments,
    induction_accuracy,
    repeat_loss,
    repeated_segments,
    train_on_repeats,
)


def _batch(offset=None, seed=0, batch_size=200) -> RepeatedSegments:
    return repeated_segments(batch_size, 32, 8, 32, offset=offset,
                             generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("offset", [None, 12])
def test_each_sequence_holds_its_segment_twice(offset):
    batch = _batch(offset)
    assert batch.tokens.shape == batch.loss_mask.shape == (200, 32)
    assert batch.tokens.dtype == torch.long and batch.loss_mask.dtype == torch.bool
    offsets = batch.second_start - batch.first_start
    if offset is None:
        assert offsets.min() >= 8 and offsets.max() <= 24 and len(offsets.unique()) > 10
        assert len(batch.first_start.unique()) > 10
    else:
        assert torch.all(offsets == offset)
    assert torch.all(batch.second_start + 8 <= 32) and torch.all(batch.first_start >= 0)
    for row in range(200):
        first, second = int(batch.first_start[row]), int(batch.second_start[row])
        assert torch.equal(batch.tokens[row, second:second + 8], batch.tokens[row, first:first + 8])
        # The loss is taken where the next token is the copy's 2nd ... 8th token.
        assert batch.loss_mask[row].nonzero().flatten().tolist() == list(range(second, second + 7))


def test_batches_are_reproducible_and_follow_the_seed():
    assert torch.equal(_batch(seed=3).tokens, _batch(seed=3).tokens)
    assert not torch.equal(_batch(seed=3).tokens, _batch(seed=4).tokens)
    moved = _batch().to("cpu")
    assert isinstance(moved, RepeatedSegments) and torch.equal(moved.tokens, _batch().tokens)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"segment_len": 20}, "two copies of segment_len=20"),
    ({"offset": 4}, "offset must be an int >= 8"),
    ({"offset": 30}, r"offset \(30\) \+ segment_len \(8\) exceeds seq_len \(32\)"),
    ({"segment_len": 1}, "segment_len must be an int >= 2"),
])
def test_bad_sizes_are_named(kwargs, match):
    sizes = {"batch_size": 2, "seq_len": 32, "segment_len": 8, "vocab_size": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        repeated_segments(**sizes)


class _Oracle(torch.nn.Module):
    """Predicts the true next token with certainty, or always token 0."""

    def __init__(self, tokens: torch.Tensor, right: bool):
        super().__init__()
        self.tokens, self.right = tokens, right

    def forward(self, tokens):
        following = torch.roll(self.tokens, -1, dims=1) if self.right else torch.zeros_like(tokens)
        return torch.nn.functional.one_hot(following, 32).double() * 50  # (B, T, V)


def test_loss_and_accuracy_are_taken_on_the_repeat_only():
    batch = _batch()
    oracle = _Oracle(batch.tokens, right=True)
    assert induction_accuracy(oracle, batch) == 1.0
    assert repeat_loss(oracle(batch.tokens), batch).item() < 1e-10
    logits = torch.randn(200, 32, 32, generator=torch.Generator().manual_seed(0))
    rows, cols = batch.loss_mask[:, :-1].nonzero(as_tuple=True)
    expected = torch.nn.functional.cross_entropy(logits[rows, cols], batch.tokens[rows, cols + 1])
    torch.testing.assert_close(repeat_loss(logits, batch), expected)
    constant = induction_accuracy(_Oracle(batch.tokens, right=False), batch)
    assert constant == (batch.tokens[:, 1:][batch.loss_mask[:, :-1]] == 0).double().mean().item()


def _train(seed: int = 0, offset=None):
    torch.manual_seed(0)
    model = TinyGPT(16, 16, 2, 2, 16, dtype=torch.float64)
    history = train_on_repeats(model, steps=12, batch_size=8, segment_len=4, offset=offset,
                               seed=seed, record_every=5)
    return model, history


def test_training_records_the_probe_and_is_deterministic():
    threads = torch.get_num_threads()
    model, history = _train()
    assert torch.get_num_threads() == threads
    assert not model.training
    assert history["step"] == [0, 5, 10, 12]
    assert all(len(history[key]) == 4 for key in history)
    assert history["previous_token"][0].shape == history["induction"][0].shape == (2, 2)
    assert history["loss"][-1] < history["loss"][0]
    again_model, again = _train()
    assert again["loss"] == history["loss"] and again["accuracy"] == history["accuracy"]
    for a, b in zip(model.parameters(), again_model.parameters(), strict=True):
        assert torch.equal(a, b)
    _, other = _train(seed=1)
    assert other["loss"] != history["loss"]


def test_training_rejects_bad_step_counts():
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        train_on_repeats(TinyGPT(8, 8, 2, 1, 8), steps=0, batch_size=2, segment_len=2)
