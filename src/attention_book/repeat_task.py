"""Chapter 15's task: random tokens in which a random segment occurs twice; copy the repeat.

Each sequence is ``seq_len`` random tokens. A segment of ``segment_len`` of them is written a
second time further on, ``offset`` tokens after its first start. A model can predict the
tokens of the second copy, from its second token on, only by finding the first copy and
reading what came next there: the job of an induction head. The loss is taken on those
predictions alone (``loss_mask``); everything else is noise that no model can predict.

With a random ``offset`` and a random start the copy can be anywhere, so position alone does
not help. With a fixed ``offset`` a single head that always looks ``offset - 1`` tokens back
solves the task without an induction head (chapter 15's control run).

This module imports the model and the head scores; nothing imports it but the chapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .heads import (
    induction_scores_of_weights,
    induction_targets,
    previous_token_scores_of_weights,
    target_keys,
)
from .train import cpu_threads, progress_bar

__all__ = [
    "RepeatedSegments",
    "repeated_segments",
    "repeat_loss",
    "induction_accuracy",
    "train_on_repeats",
]


@dataclass
class RepeatedSegments:
    """A batch of the repeated-segment task.

    Attributes:
        tokens: ``(B, T)`` token ids.
        loss_mask: ``(B, T)`` bool, True at the positions ``t`` whose *next* token,
            ``tokens[:, t + 1]``, is the second or later token of the repeated copy.
        first_start: ``(B,)`` where the segment first starts.
        second_start: ``(B,)`` where its copy starts, ``first_start + offset``.

    Taught in chapter 15.
    """

    tokens: torch.Tensor
    loss_mask: torch.Tensor
    first_start: torch.Tensor
    second_start: torch.Tensor

    def to(self, device: torch.device | str) -> RepeatedSegments:
        """The same batch on ``device``."""
        return RepeatedSegments(self.tokens.to(device), self.loss_mask.to(device),
                                self.first_start.to(device), self.second_start.to(device))


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def repeated_segments(
    batch_size: int,
    seq_len: int,
    segment_len: int,
    vocab_size: int,
    *,
    offset: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> RepeatedSegments:
    """Draw ``batch_size`` random sequences, each with a segment that occurs twice.

    The offset (from the first start to the second) is drawn uniformly from
    ``segment_len … seq_len - segment_len`` unless ``offset`` fixes it; then the first start
    is drawn uniformly from the places where both copies fit. The copies never overlap.
    Everything is drawn on the CPU with ``generator``, so a seed gives the same batch on
    every device.

    Args:
        batch_size: number of sequences ``B``.
        seq_len: tokens per sequence ``T``.
        segment_len: tokens in the repeated segment, at least 2.
        vocab_size: token ids are drawn uniformly from ``0 … vocab_size - 1``.
        offset: a fixed distance from the first copy to the second (the control run), or
            None for a random one.
        generator: the random generator (default: torch's global one).
        device: where to put the batch.

    Shapes:
        tokens and loss_mask ``(B, T)``; first_start and second_start ``(B,)``.

    Returns:
        A :class:`RepeatedSegments`.

    Taught in chapter 15.
    """
    for name, value, low in (("batch_size", batch_size, 1), ("segment_len", segment_len, 2),
                             ("vocab_size", vocab_size, 2), ("seq_len", seq_len, 1)):
        _check_int(name, value, low)
    if 2 * segment_len > seq_len:
        raise ValueError(f"two copies of segment_len={segment_len} tokens do not fit in "
                         f"seq_len={seq_len}")
    if offset is not None:
        _check_int("offset", offset, segment_len)
        if offset + segment_len > seq_len:
            raise ValueError(f"offset ({offset}) + segment_len ({segment_len}) exceeds "
                             f"seq_len ({seq_len})")
    cpu = {"generator": generator, "device": "cpu"}
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len), **cpu)  # (B, T)
    if offset is None:
        offsets = torch.randint(segment_len, seq_len - segment_len + 1, (batch_size,), **cpu)
    else:
        offsets = torch.full((batch_size,), offset, dtype=torch.long, device="cpu")  # (B,)
    # A uniform start among the seq_len - segment_len - offset + 1 places where both fit.
    room = (seq_len - segment_len - offsets + 1).double()  # (B,)
    first_start = (torch.rand(batch_size, dtype=torch.float64, **cpu) * room).long()  # (B,)
    second_start = first_start + offsets  # (B,)
    steps = torch.arange(segment_len, device="cpu")  # (segment_len,)
    rows = torch.arange(batch_size, device="cpu")[:, None]  # (B, 1)
    tokens[rows, second_start[:, None] + steps] = tokens[rows, first_start[:, None] + steps]
    loss_mask = torch.zeros(batch_size, seq_len, dtype=torch.bool, device="cpu")  # (B, T)
    loss_mask[rows, second_start[:, None] + steps[:-1]] = True  # predicts copy tokens 2 … L
    batch = RepeatedSegments(tokens, loss_mask, first_start, second_start)
    return batch if device is None else batch.to(device)


def repeat_loss(logits: torch.Tensor, batch: RepeatedSegments) -> torch.Tensor:
    """Cross-entropy of the predictions of the repeated tokens (where ``loss_mask`` is True).

    Args:
        logits: the model's logits on ``batch.tokens``.
        batch: the batch.

    Shapes:
        logits ``(B, T, vocab_size)`` -> a scalar.

    Returns:
        The mean cross-entropy over the masked positions.

    Taught in chapter 15.
    """
    predictions = logits[:, :-1][batch.loss_mask[:, :-1]]  # (N, vocab_size)
    targets = batch.tokens[:, 1:][batch.loss_mask[:, :-1]]  # (N,)
    return nn.functional.cross_entropy(predictions, targets)


@torch.no_grad()
def induction_accuracy(model: nn.Module, batch: RepeatedSegments) -> float:
    """Fraction of the repeated tokens (``loss_mask``) whose most likely prediction is right.

    Args:
        model: a language model ``model(tokens) -> logits``.
        batch: the batch.

    Shapes:
        batch.tokens ``(B, T)``.

    Returns:
        The accuracy, a float in [0, 1]; chance is ``1 / vocab_size``.

    Taught in chapter 15.
    """
    was_training = model.training
    model.eval()
    try:
        logits = model(batch.tokens)  # (B, T, vocab_size)
    finally:
        model.train(was_training)
    predicted = logits[:, :-1].argmax(dim=-1)  # (B, T - 1)
    right = predicted == batch.tokens[:, 1:]  # (B, T - 1)
    return right[batch.loss_mask[:, :-1]].double().mean().item()


def train_on_repeats(
    model: nn.Module,
    *,
    steps: int,
    batch_size: int,
    segment_len: int,
    offset: int | None = None,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    probe: RepeatedSegments | None = None,
    record_every: int = 10,
    progress: bool = False,
    num_threads: int | None = 1,
) -> dict[str, list]:
    """Train a language model on fresh repeated-segment batches with AdamW; deterministic under ``seed``.

    Every step draws a new batch (``repeated_segments`` with the model's context length and
    vocabulary). The learning rate starts at ``lr`` and falls linearly to 0 at the last step,
    which lets the weights settle, so that the last-bit rounding differences between two
    CPUs do not grow into different results (chapter 9 measured this).

    Every ``record_every`` steps, and before the first, it records on ``probe`` (a fixed
    batch with random offsets): the loss, the induction accuracy, and every head's
    previous-token and induction scores, measured as :func:`~attention_book.heads.find_heads`
    measures them (the previous-token score at the keys an induction head reads).

    Args:
        model: a language model with ``vocab_size`` and ``context_length`` attributes, such
            as :class:`~attention_book.model.TinyGPT`.
        steps: optimiser steps.
        batch_size: sequences per step.
        segment_len: tokens in the repeated segment.
        offset: a fixed offset for every training sequence (the control), or None.
        lr: AdamW's starting learning rate.
        weight_decay: AdamW's weight decay.
        seed: seeds the batches.
        probe: the batch the records are measured on (default: 256 sequences with random
            offsets, drawn with ``seed + 1``).
        record_every: steps between records.
        progress: show a tqdm progress bar; the book's tests pass ``False`` so that nothing
            timing-dependent is printed.
        num_threads: CPU threads while training (restored afterwards); a model this small
            trains fastest on one, and ``None`` keeps torch's setting.

    Returns:
        A history dict of lists, one entry per record: ``"step"``, ``"loss"``,
        ``"accuracy"``, ``"previous_token"`` and ``"induction"`` (``(num_layers, num_heads)``
        tensors).

    Taught in chapter 15.
    """
    _check_int("steps", steps, 1)
    _check_int("record_every", record_every, 1)

    device = next(model.parameters()).device
    sizes = {"seq_len": model.context_length, "segment_len": segment_len,
             "vocab_size": model.vocab_size}
    if probe is None:
        probe = repeated_segments(256, **sizes, generator=torch.Generator().manual_seed(seed + 1),
                                  device=device)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    history: dict[str, list] = {"step": [], "loss": [], "accuracy": [], "previous_token": [],
                                "induction": []}

    probe_targets = induction_targets(probe.tokens)  # (B, T, T)
    probe_keys = target_keys(probe_targets)  # (B, T)
    probe_mask = probe.loss_mask[:, :-1]  # (B, T - 1)

    @torch.no_grad()
    def record(step: int) -> None:
        # One forward pass on the probe gives every number of the record.
        model.eval()
        logits, all_weights = model(probe.tokens, return_weights=True)  # (B, T, V), L x weights
        model.train()
        weights = torch.stack(list(all_weights))  # (L, B, H, T, T)
        right = logits[:, :-1].argmax(dim=-1) == probe.tokens[:, 1:]  # (B, T - 1)
        history["step"].append(step)
        history["loss"].append(repeat_loss(logits, probe).item())
        history["accuracy"].append(right[probe_mask].double().mean().item())
        history["previous_token"].append(previous_token_scores_of_weights(weights, probe_keys).cpu())
        history["induction"].append(induction_scores_of_weights(weights, probe_targets).cpu())

    with cpu_threads(num_threads):
        bar = progress_bar(steps, "steps", progress)
        record(0)
        for step in bar:
            batch = repeated_segments(batch_size, **sizes, offset=offset, generator=generator,
                                      device=device)
            loss = repeat_loss(model(batch.tokens), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            if (step + 1) % record_every == 0 or step + 1 == steps:
                record(step + 1)
                bar.set_postfix_str(f"accuracy {history['accuracy'][-1]:.0%}")
    model.eval()
    return history
