"""A tiny attention classifier and its training loop (chapter 9).

The classifier reads a sentence, lets its ambiguous word attend to the other
words with one :class:`~attention_book.modules.MultiHeadAttention` layer, and
classifies the ambiguous word's context vector. Its baseline, chapter 1's
averaging, gives every word the same weight instead.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from .attention import padding_mask
from .modules import MultiHeadAttention

__all__ = [
    "sinusoidal_positional_encoding",
    "AttentionClassifier",
    "AveragingClassifier",
    "evaluate_accuracy",
    "mean_attention_to",
    "train_classifier",
]


def sinusoidal_positional_encoding(context_length: int, d_model: int, *,
                                   dtype: torch.dtype | None = None,
                                   device: torch.device | str | None = None) -> torch.Tensor:
    """The fixed sine/cosine positional encoding of Vaswani et al. (2017).

    Position ``pos`` gets ``sin(pos / 10000^(2i/d_model))`` in feature ``2i`` and
    the cosine in feature ``2i + 1``, so nearby positions get similar vectors.

    Args:
        context_length: number of positions.
        d_model: size of each position vector; must be even.
        dtype: the floating dtype the encoding is computed in (default: torch's default).
        device: where to create it.

    Shapes:
        returns ``(context_length, d_model)``.

    Returns:
        A float tensor, one row per position.

    Taught in chapter 1; used in chapter 9.
    """
    for name, value in (("context_length", context_length), ("d_model", d_model)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if d_model % 2:
        raise ValueError(f"d_model ({d_model}) must be even: features come in sin/cos pairs")
    factory = {"dtype": dtype or torch.get_default_dtype(), "device": device}
    positions = torch.arange(context_length, **factory).unsqueeze(1)  # (T, 1)
    frequencies = torch.exp(
        torch.arange(0, d_model, 2, **factory) * (-math.log(10000.0) / d_model)
    )  # (d_model / 2,)
    encoding = torch.zeros(context_length, d_model, **factory)  # (T, d_model)
    encoding[:, 0::2] = torch.sin(positions * frequencies)
    encoding[:, 1::2] = torch.cos(positions * frequencies)
    return encoding


def _check_batch(token_ids: torch.Tensor, lengths: torch.Tensor, word_index: torch.Tensor,
                 context_length: int) -> None:
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must have shape (B, T), got {tuple(token_ids.shape)}")
    batch, num_tokens = token_ids.shape
    if num_tokens > context_length:
        raise ValueError(f"sequence length T={num_tokens} exceeds context_length={context_length}")
    for name, tensor in (("lengths", lengths), ("word_index", word_index)):
        if tuple(tensor.shape) != (batch,):
            raise ValueError(f"{name} must have shape (B,)=({batch},), got {tuple(tensor.shape)}")
    if bool((word_index >= lengths).any()) or bool((word_index < 0).any()):
        raise ValueError("every word_index must point at a real token (0 <= word_index < length)")


class AttentionClassifier(nn.Module):
    """Embeddings + positional encoding + one multi-head attention layer + a linear head.

    The head reads only the ambiguous word's context vector: everything the model
    knows about the sense must come through that word's attention.

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_classes: number of labels.
        d_model: embedding size and attention width.
        num_heads: attention heads; must divide ``d_model``.
        context_length: the longest sentence accepted.
        positional_encoding: add the sinusoidal positional encoding to the embeddings;
            ``False`` builds the ablation of chapter 9's exercise, a model that cannot
            tell where a word stands.
        dtype: the floating dtype of the parameters (chapter 9 trains in ``torch.float64``,
            so that its numbers are the same on every CPU).
        device: where to create the parameters.

    Shapes:
        token_ids ``(B, T)``, lengths ``(B,)``, word_index ``(B,)`` -> logits
        ``(B, num_classes)``, weights ``(B, num_heads, T, T)``.

    Returns:
        ``forward`` returns the logits, or ``(logits, weights)`` with ``return_weights=True``.

    Taught in chapter 9.
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 32,
                 num_heads: int = 4, context_length: int = 16, *,
                 positional_encoding: bool = True,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        if not isinstance(positional_encoding, bool):
            raise TypeError(f"positional_encoding must be True or False, got {positional_encoding!r}")
        factory = {"device": device, "dtype": dtype}
        self.context_length = context_length
        self.positional_encoding = positional_encoding
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0, **factory)
        encoding = sinusoidal_positional_encoding(
            context_length, d_model, dtype=dtype, device=device
        )  # (context_length, d_model)
        self.register_buffer("positions", encoding, persistent=False)
        self.attention = MultiHeadAttention(
            d_model, d_model, num_heads, context_length=context_length, causal=False, **factory
        )
        self.head = nn.Linear(d_model, num_classes, **factory)

    def forward(self, token_ids: torch.Tensor, lengths: torch.Tensor, word_index: torch.Tensor,
                return_weights: bool = False):
        _check_batch(token_ids, lengths, word_index, self.context_length)
        num_tokens = token_ids.size(1)
        x = self.embedding(token_ids)  # (B, T, d_model)
        if self.positional_encoding:
            x = x + self.positions[:num_tokens]  # (B, T, d_model)
        mask = padding_mask(lengths, num_tokens)  # (B, 1, 1, T)
        context, attn_weights = self.attention(x, mask, return_weights=True)
        # context (B, T, d_model), attn_weights (B, num_heads, T, T)
        rows = torch.arange(token_ids.size(0), device=token_ids.device)
        context_vec = context[rows, word_index]  # (B, d_model)
        logits = self.head(context_vec)  # (B, num_classes)
        return (logits, attn_weights) if return_weights else logits


class AveragingClassifier(nn.Module):
    """Chapter 1's baseline: the context vector is the plain average of the word vectors.

    The same embeddings and linear head as :class:`AttentionClassifier`, but every
    real token gets weight ``1 / length``, whatever it is and wherever it stands.

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_classes: number of labels.
        d_model: embedding size.
        context_length: the longest sentence accepted.
        dtype: the floating dtype of the parameters.
        device: where to create the parameters.

    Shapes:
        token_ids ``(B, T)``, lengths ``(B,)``, word_index ``(B,)`` -> logits
        ``(B, num_classes)``, weights ``(B, 1, T, T)``.

    Returns:
        ``forward`` returns the logits, or ``(logits, weights)`` with ``return_weights=True``.

    Taught in chapter 9.
    """

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 32,
                 context_length: int = 16, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.context_length = context_length
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0, **factory)
        self.head = nn.Linear(d_model, num_classes, **factory)

    def forward(self, token_ids: torch.Tensor, lengths: torch.Tensor, word_index: torch.Tensor,
                return_weights: bool = False):
        _check_batch(token_ids, lengths, word_index, self.context_length)
        batch, num_tokens = token_ids.shape
        x = self.embedding(token_ids)  # (B, T, d_model)
        real = padding_mask(lengths, num_tokens).to(x.dtype)  # (B, 1, 1, T)
        uniform = real / lengths.view(batch, 1, 1, 1)  # (B, 1, 1, T)
        attn_weights = uniform.expand(batch, 1, num_tokens, num_tokens)  # (B, 1, T, T)
        context_vec = (attn_weights[:, 0, 0, :, None] * x).sum(dim=1)  # (B, d_model)
        logits = self.head(context_vec)  # (B, num_classes)
        return (logits, attn_weights) if return_weights else logits


def _batch_inputs(data: dict[str, torch.Tensor], rows: torch.Tensor | slice = slice(None)):
    return data["token_ids"][rows], data["lengths"][rows], data["word_index"][rows]


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, data: dict[str, torch.Tensor]) -> float:
    """Fraction of examples whose highest logit is the target class.

    Args:
        model: a classifier taking ``(token_ids, lengths, word_index)``.
        data: tensors from :func:`attention_book.data.encode_examples`.

    Returns:
        The accuracy, a float in [0, 1].

    Taught in chapter 9.
    """
    was_training = model.training
    model.eval()
    logits = model(*_batch_inputs(data))  # (N, num_classes)
    model.train(was_training)
    return (logits.argmax(dim=-1) == data["targets"]).float().mean().item()


@torch.no_grad()
def mean_attention_to(model: nn.Module, data: dict[str, torch.Tensor], position: str) -> float:
    """Average weight from the ambiguous word to another word, over heads and examples.

    Args:
        model: a classifier whose ``forward`` accepts ``return_weights=True``.
        data: tensors from :func:`attention_book.data.encode_examples`.
        position: which word: ``"cue_index"`` (the deciding word) or ``"distractor_index"``.

    Returns:
        The mean attention weight, a float in [0, 1].

    Taught in chapter 9.
    """
    if position not in ("cue_index", "distractor_index", "word_index"):
        raise ValueError(
            f"position must be 'cue_index', 'distractor_index' or 'word_index', got {position!r}"
        )
    was_training = model.training
    model.eval()
    _, attn_weights = model(*_batch_inputs(data), return_weights=True)  # (N, heads, T, T)
    model.train(was_training)
    rows = torch.arange(attn_weights.size(0), device=attn_weights.device)
    from_word = attn_weights[rows, :, data["word_index"]]  # (N, heads, T)
    to_target = from_word[rows, :, data[position]]  # (N, heads)
    return to_target.mean().item()


def train_classifier(
    model: nn.Module,
    train_data: dict[str, torch.Tensor],
    val_data: dict[str, torch.Tensor],
    *,
    epochs: int = 20,
    batch_size: int = 32,
    lr: float = 5e-3,
    seed: int = 0,
    progress: bool = False,
    num_threads: int | None = 1,
) -> dict[str, list[float]]:
    """Train a classifier with Adam and cross-entropy; deterministic under ``seed``.

    The learning rate starts at ``lr`` and falls linearly to 0 at the last step. The
    decay is what makes the result reproducible across machines: with a constant rate,
    Adam keeps moving the weights after the loss has settled, and the last-bit rounding
    differences between CPUs grow into visible differences (chapter 9 measures this).

    Before the first epoch and after each one, records the training loss, the
    validation accuracy and, for a model that returns weights, the mean
    attention from the ambiguous word to its deciding word and to the distractor.

    Args:
        model: :class:`AttentionClassifier` or :class:`AveragingClassifier`.
        train_data: tensors from :func:`attention_book.data.encode_examples`.
        val_data: the same, for validation.
        epochs: passes over the training data.
        batch_size: examples per step.
        lr: Adam's starting learning rate, decayed linearly to 0.
        seed: seeds the batch order.
        progress: show a tqdm progress bar (a widget in a notebook); the
            book's tests pass ``False`` so that nothing timing-dependent is printed.
        num_threads: CPU threads while training (restored afterwards); a model
            this small trains fastest on one thread, and ``None`` keeps torch's setting.

    Returns:
        A history dict of lists with ``epochs + 1`` entries each (entry 0 is
        before training): ``"train_loss"``, ``"val_accuracy"``, ``"cue_weight"``,
        ``"distractor_weight"``.

    Taught in chapter 9.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    with cpu_threads(num_threads):
        bar = progress_bar(epochs, "epochs", progress)
        return _train(model, train_data, val_data, epochs, batch_size, lr, seed, bar)


@contextmanager
def cpu_threads(num_threads: int | None):
    """Run the block with ``num_threads`` torch threads (None: unchanged), then restore them."""
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)


def progress_bar(total: int, desc: str, progress: bool):
    """A tqdm range over ``total`` items, without elapsed time or rate, so that the text a
    notebook stores stays the same from run to run."""
    from tqdm.auto import trange

    return trange(total, desc=desc, disable=not progress,
                  bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}")


def _train(model, train_data, val_data, epochs, batch_size, lr, seed, bar):
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    num_examples = train_data["targets"].numel()
    total_steps = epochs * math.ceil(num_examples / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total_steps)
    loss_fn = nn.CrossEntropyLoss()
    history: dict[str, list[float]] = {
        "train_loss": [], "val_accuracy": [], "cue_weight": [], "distractor_weight": []
    }

    def record(loss: float) -> None:
        history["train_loss"].append(loss)
        history["val_accuracy"].append(evaluate_accuracy(model, val_data))
        history["cue_weight"].append(mean_attention_to(model, val_data, "cue_index"))
        history["distractor_weight"].append(mean_attention_to(model, val_data, "distractor_index"))

    with torch.no_grad():
        model.eval()
        initial = loss_fn(model(*_batch_inputs(train_data)), train_data["targets"]).item()
    record(initial)
    model.train()
    for _ in bar:
        # Drawn on the CPU generator's device, so the order is the same wherever the model is.
        order = torch.randperm(num_examples, generator=generator, device=generator.device)  # (N,)
        total_loss = 0.0
        for start in range(0, num_examples, batch_size):
            rows = order[start : start + batch_size]  # (batch,)
            logits = model(*_batch_inputs(train_data, rows))  # (batch, num_classes)
            loss = loss_fn(logits, train_data["targets"][rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item() * rows.numel()
        record(total_loss / num_examples)
        bar.set_postfix_str(f"validation accuracy {history['val_accuracy'][-1]:.1%}")
    model.eval()
    return history
