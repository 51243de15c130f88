"""Chapter 18's tasks: associative recall, with a fixed set of pairs or pairs that change.

**Multi-query associative recall** (Arora et al., 2023, "Zoology"): a sequence shows
``num_pairs`` key-value pairs, then asks for the value of every key once more, in a random
order. A layer whose memory grows with the sequence (softmax attention and its KV cache) can
answer however many pairs there are; a layer with a fixed state (linear attention, DeltaNet)
must fit every pair into ``d_k x d_v`` numbers, and fails once the pairs outnumber what the
state holds. **Changed associations**: an old episode of pairs, a boundary marker, a new
episode in which half the keys come back with new values, then questions about the new
keys and about old keys that did not come back, whose answer is "absent": a memory must
replace some associations and drop others.

Each position holds one key and one value side by side (a query holds its key and the
"no value" id), so that one layer can answer: the experiments measure what a layer's memory
holds, not whether a model can find the token before the current one.

This module imports the model's block and the training helpers; nothing imports it but the
chapter and its tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.resources import files

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_positive_int
from .linear_attention import GatedDeltaNet, LinearAttentionLayer
from .model import TransformerBlock
from .modules import MultiHeadAttention
from .train import cpu_threads, progress_bar

__all__ = [
    "RecallBatch",
    "associative_recall",
    "changed_associations",
    "RecallModel",
    "train_recall",
    "recall_accuracy",
    "RECALL_SETUP",
    "RECALL_RUNS",
    "recall_mixer",
    "recall_pairs",
    "recall_run",
    "load_recall_sweep",
]


@dataclass
class RecallBatch:
    """A batch of a recall task.

    Attributes:
        keys: ``(B, T)`` the key id at each position (``num_keys`` marks a boundary).
        values: ``(B, T)`` the value id at each position (``num_values`` means "no value":
            a query or a boundary).
        targets: ``(B, Q)`` the answer to each of the ``Q`` queries, which are the last ``Q``
            positions (``num_values`` means "absent").

    Taught in chapter 18.
    """

    keys: torch.Tensor
    values: torch.Tensor
    targets: torch.Tensor


def _distinct_keys(batch_size: int, count: int, num_keys: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    scores = torch.rand(batch_size, num_keys, generator=generator)  # (B, num_keys)
    return scores.argsort(dim=1)[:, :count]  # (B, count): a random subset, in random order


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        check_positive_int(name, value)


def associative_recall(
    batch_size: int,
    num_pairs: int,
    *,
    num_keys: int,
    num_values: int,
    generator: torch.Generator | None = None,
) -> RecallBatch:
    """Draw multi-query associative recall: ``num_pairs`` pairs, then every key asked once.

    The keys of a sequence are distinct, drawn from ``num_keys``; the values are drawn from
    ``num_values`` (they may repeat). The queries ask for every key of the sequence, in a
    random order, so a sequence has ``T = 2 num_pairs`` positions.

    Args:
        batch_size: sequences.
        num_pairs: pairs per sequence, at most ``num_keys``.
        num_keys: the key vocabulary.
        num_values: the value vocabulary.
        generator: the random generator (seed it for a reproducible batch).

    Shapes:
        keys and values ``(B, 2 num_pairs)``; targets ``(B, num_pairs)``.

    Returns:
        A :class:`RecallBatch`.

    Taught in chapter 18.
    """
    _check_sizes(batch_size=batch_size, num_pairs=num_pairs, num_keys=num_keys,
                 num_values=num_values)
    if num_pairs > num_keys:
        raise ValueError(f"num_pairs ({num_pairs}) cannot exceed num_keys ({num_keys}): the keys "
                         "of a sequence are distinct")
    keys = _distinct_keys(batch_size, num_pairs, num_keys, generator)  # (B, N)
    values = torch.randint(0, num_values, (batch_size, num_pairs), generator=generator)  # (B, N)
    order = torch.rand(batch_size, num_pairs, generator=generator).argsort(dim=1)  # (B, N)
    asked = keys.gather(1, order)  # (B, N): every key once, shuffled
    no_value = torch.full_like(asked, num_values)  # (B, N)
    return RecallBatch(keys=torch.cat([keys, asked], dim=1),  # (B, 2N)
                       values=torch.cat([values, no_value], dim=1),  # (B, 2N)
                       targets=values.gather(1, order))  # (B, N)


def changed_associations(
    batch_size: int,
    *,
    old_pairs: int,
    new_pairs: int,
    stale_queries: int,
    num_keys: int,
    num_values: int,
    generator: torch.Generator | None = None,
) -> RecallBatch:
    """Draw an old episode, a boundary, a new episode, and questions about the new one.

    The new episode has ``new_pairs`` distinct keys; the old one ``old_pairs`` distinct keys,
    of which ``new_pairs // 2`` come back in the new episode with fresh values. After the new
    episode come the queries, shuffled: every new key (answer: its new value) and
    ``stale_queries`` old keys that did not come back (answer: ``num_values``, "absent").

    Args:
        batch_size: sequences.
        old_pairs: pairs before the boundary.
        new_pairs: pairs after it.
        stale_queries: questions about old keys that did not come back.
        num_keys: the key vocabulary (id ``num_keys`` is the boundary marker).
        num_values: the value vocabulary (id ``num_values`` is "no value" or "absent").
        generator: the random generator.

    Shapes:
        keys and values ``(B, old_pairs + 1 + 2 new_pairs + stale_queries)``; targets
        ``(B, new_pairs + stale_queries)``.

    Returns:
        A :class:`RecallBatch`.

    Taught in chapter 18.
    """
    _check_sizes(batch_size=batch_size, old_pairs=old_pairs, new_pairs=new_pairs,
                 num_keys=num_keys, num_values=num_values)
    if isinstance(stale_queries, bool) or not isinstance(stale_queries, int) or stale_queries < 0:
        raise ValueError(f"stale_queries must be an int >= 0, got {stale_queries!r}")
    returning = new_pairs // 2
    if old_pairs - returning < stale_queries:
        raise ValueError(
            f"old_pairs ({old_pairs}) minus the {returning} keys that come back must leave "
            f"stale_queries ({stale_queries}) old keys to ask about"
        )
    if old_pairs + new_pairs - returning > num_keys:
        raise ValueError(f"num_keys ({num_keys}) is too small for {old_pairs} old and "
                         f"{new_pairs} new pairs with {returning} keys in both")
    drawn = _distinct_keys(batch_size, old_pairs + new_pairs - returning, num_keys, generator)
    new_keys = drawn[:, :new_pairs]  # (B, new): the first `returning` of them are old too
    old_keys = torch.cat([drawn[:, new_pairs:], drawn[:, :returning]], dim=1)  # (B, old)
    shuffle = torch.rand(batch_size, old_pairs, generator=generator).argsort(dim=1)  # (B, old)
    old_keys = old_keys.gather(1, shuffle)  # (B, old): the returning keys anywhere
    stale = drawn[:, new_pairs:new_pairs + stale_queries]  # (B, stale): old, not new
    old_values = torch.randint(0, num_values, (batch_size, old_pairs), generator=generator)
    new_values = torch.randint(0, num_values, (batch_size, new_pairs), generator=generator)
    order = torch.rand(batch_size, new_pairs, generator=generator).argsort(dim=1)  # (B, new)
    new_keys, new_values = new_keys.gather(1, order), new_values.gather(1, order)
    asked = torch.cat([new_keys, stale], dim=1)  # (B, Q)
    answers = torch.cat([new_values, torch.full_like(stale, num_values)], dim=1)  # (B, Q)
    shuffle = torch.rand(batch_size, asked.size(1), generator=generator).argsort(dim=1)  # (B, Q)
    asked, answers = asked.gather(1, shuffle), answers.gather(1, shuffle)
    boundary = torch.full((batch_size, 1), num_keys)  # (B, 1)
    nothing = torch.full((batch_size, 1), num_values)  # (B, 1)
    return RecallBatch(
        keys=torch.cat([old_keys, boundary, new_keys, asked], dim=1),  # (B, T)
        values=torch.cat([old_values, nothing, new_values,
                          torch.full_like(asked, num_values)], dim=1),  # (B, T)
        targets=answers,
    )


class RecallModel(nn.Module):
    """A model for the recall tasks: key and value embeddings side by side, token mixers, a readout.

    Position ``t`` starts as ``[key_embedding(key_t), value_embedding(value_t)]``; each layer
    adds ``mixer(LayerNorm(x))`` to it (a :class:`~attention_book.TransformerBlock` with
    ``attention_only=True`` holding the mixer); a final
    LayerNorm and the value embeddings, read back (``logits = h_values @ E_value^T``), score
    every value at every position, and one more learned vector scores "absent".

    Args:
        mixers: the token mixers, one per layer, each mapping ``(B, T, d_model)`` to the same
            shape (``MultiHeadAttention``, ``LinearAttentionLayer``, ``GatedDeltaNet``, …).
        num_keys: the key vocabulary (one more id is the boundary marker).
        num_values: the value vocabulary (one more id is "no value" or "absent").
        d_model: the width; half of it holds the key, the other half the value.

    Shapes:
        keys and values ``(B, T)`` -> logits ``(B, T, num_values + 1)``.

    Returns:
        ``forward(keys, values)`` returns the logits.

    Taught in chapter 18.
    """

    def __init__(self, mixers: Sequence[nn.Module], *, num_keys: int, num_values: int,
                 d_model: int):
        super().__init__()
        _check_sizes(num_keys=num_keys, num_values=num_values, d_model=d_model)
        if not mixers or not all(isinstance(mixer, nn.Module) for mixer in mixers):
            raise TypeError("mixers must be a non-empty list of nn.Modules, one per layer")
        if d_model < 2:
            raise ValueError(f"d_model must be >= 2 (half key, half value), got {d_model}")
        self.num_keys, self.num_values, self.d_model = num_keys, num_values, d_model
        self.key_dim = d_model // 2
        self.key_embedding = nn.Embedding(num_keys + 1, self.key_dim)
        self.value_embedding = nn.Embedding(num_values + 1, d_model - self.key_dim)
        # The answer "absent" gets a readout vector of its own: reading it back from the "no
        # value" embedding that every query carries would make each query answer itself.
        self.absent = nn.Parameter(torch.randn(d_model - self.key_dim) / (d_model - self.key_dim) ** 0.5)
        # Attention-only blocks around the given mixers (their head count and context length
        # are the mixers' own business).
        self.blocks = nn.ModuleList(TransformerBlock(d_model, 1, 1, attention_only=True, mixer=mixer)
                                    for mixer in mixers)
        self.final_norm = nn.LayerNorm(d_model)

    def forward(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if keys.shape != values.shape or keys.dim() != 2:
            raise ValueError(f"keys and values must both be (B, T); got {tuple(keys.shape)} and "
                             f"{tuple(values.shape)}")
        x = torch.cat([self.key_embedding(keys), self.value_embedding(values)], dim=-1)  # (B, T, d)
        for block in self.blocks:
            x = block(x)  # (B, T, d_model): x + mixer(LayerNorm(x))
        value_part = self.final_norm(x)[..., self.key_dim:]  # (B, T, d_model - key_dim)
        answers = torch.cat([self.value_embedding.weight[:-1], self.absent[None]])  # (V + 1, d_v)
        return value_part @ answers.T  # (B, T, num_values + 1)


def _query_logits(model: RecallModel, batch: RecallBatch) -> torch.Tensor:
    num_queries = batch.targets.size(1)
    return model(batch.keys, batch.values)[:, -num_queries:]  # (B, Q, num_values + 1)


def train_recall(
    model: RecallModel,
    make_batch: Callable[[torch.Generator], RecallBatch],
    *,
    steps: int,
    lr: float = 1e-2,
    seed: int = 0,
    progress: bool = False,
    num_threads: int | None = 1,
) -> list[float]:
    """Train on fresh batches with AdamW, the learning rate falling linearly to 0; deterministic.

    Args:
        model: the model.
        make_batch: draws one training batch from the generator it is given.
        steps: optimiser steps.
        lr: AdamW's starting learning rate.
        seed: seeds the generator the batches are drawn from.
        progress: show a progress bar.
        num_threads: CPU threads while training (restored afterwards); None keeps torch's.

    Shapes:
        (batches of :class:`RecallBatch`)

    Returns:
        The training loss of every step; the model is left in eval mode.

    Taught in chapter 18.
    """
    check_positive_int("steps", steps)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    losses = []
    model.train()
    with cpu_threads(num_threads):
        for _ in progress_bar(steps, "steps", progress):
            batch = make_batch(generator)
            logits = _query_logits(model, batch)  # (B, Q, num_values + 1)
            loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def recall_accuracy(model: RecallModel, batch: RecallBatch) -> torch.Tensor:
    """Which queries the model answers right.

    Args:
        model: the model.
        batch: the questions.

    Shapes:
        returns ``(B, Q)``.

    Returns:
        A boolean tensor, True where the most likely answer is the target.

    Taught in chapter 18.
    """
    return _query_logits(model, batch).argmax(dim=-1) == batch.targets  # (B, Q)


# ---------------------------------------------------------------------------------------------
# Chapter 18's experiment (section 18.5): which memories recall how many pairs.

#: The experiment's fixed settings: the task's vocabularies, the model width, the training
#: (``steps`` of ``batch_size`` sequences, AdamW at ``lr`` falling to 0), the test
#: (``test_sequences`` fresh sequences per pair count, drawn from ``test_seed``) and the
#: episodes of the changed-associations task (``changed``: its pairs, and its test sequences).
RECALL_SETUP = {"num_keys": 32, "num_values": 16, "d_model": 32, "steps": 1000,
                "batch_size": 32, "lr": 1e-2, "test_sequences": 256, "test_seed": 1000,
                "changed": {"old_pairs": 8, "new_pairs": 6, "stale_queries": 3,
                            "test_sequences": 512}}

#: The runs of the experiment, each trained once per seed: ``(name, layers, d_k, task)``.
#: Associative recall (``"recall"``) for the five memories with one head of ``d_k = 8``
#: features, then for the three fixed states with ``d_k = 4`` and ``d_k = 16``; changed
#: associations (``"changed"``) for DeltaNet and Gated DeltaNet.
RECALL_RUNS = (
    ("softmax", ("softmax",), 8, "recall"),
    ("linear", ("linear",), 8, "recall"),
    ("DeltaNet", ("DeltaNet",), 8, "recall"),
    ("Gated DeltaNet", ("Gated DeltaNet",), 8, "recall"),
    ("hybrid", ("Gated DeltaNet", "softmax"), 8, "recall"),
    *((name, (name,), d_k, "recall") for d_k in (4, 16)
      for name in ("linear", "DeltaNet", "Gated DeltaNet")),
    ("DeltaNet", ("DeltaNet",), 8, "changed"),
    ("Gated DeltaNet", ("Gated DeltaNet",), 8, "changed"),
)

_RECALL_KINDS = ("softmax", "linear", "DeltaNet", "Gated DeltaNet")


class _OneSoftmaxHead(nn.Module):
    """Causal softmax attention with one head of ``head_dim`` features, back to ``d_model``."""

    def __init__(self, d_model: int, head_dim: int, context_length: int):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, head_dim, 1, context_length=context_length)
        self.out = nn.Linear(head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_weights: bool = False, *, kv_cache=None):
        if return_weights:
            mixed, weights = self.attention(x, mask, return_weights=True, kv_cache=kv_cache)
            return self.out(mixed), weights  # (B, T, d_model), (B, 1, T, T)
        return self.out(self.attention(x, mask, kv_cache=kv_cache))  # (B, T, d_model)


def recall_mixer(kind: str, *, d_model: int, head_dim: int) -> nn.Module:
    """One token mixer of the recall experiment: one head of ``head_dim`` features.

    Args:
        kind: ``"softmax"`` (attention with a KV cache), ``"linear"``
            (:class:`~attention_book.LinearAttentionLayer`), ``"DeltaNet"`` or
            ``"Gated DeltaNet"`` (:class:`~attention_book.GatedDeltaNet` without and with the
            gate).
        d_model: the width of the model around it.
        head_dim: ``d_k = d_v`` of the head: the state of a recurrent head is
            ``head_dim x head_dim``.

    Shapes:
        the mixer maps ``(B, T, d_model)`` to ``(B, T, d_model)``.

    Returns:
        The mixer, freshly initialised from torch's global generator.

    Taught in chapter 18.
    """
    _check_sizes(d_model=d_model, head_dim=head_dim)
    if kind == "softmax":
        return _OneSoftmaxHead(d_model, head_dim, context_length=128)
    if kind == "linear":
        return LinearAttentionLayer(d_model, 1, head_dim=head_dim)
    if kind in ("DeltaNet", "Gated DeltaNet"):
        return GatedDeltaNet(d_model, 1, head_dim=head_dim, gate=kind == "Gated DeltaNet")
    raise ValueError(f"kind must be one of {list(_RECALL_KINDS)}, got {kind!r}")


def recall_pairs(head_dim: int) -> tuple[int, ...]:
    """The pair counts a state of ``head_dim`` rows is tested on: 1/4 to 2 pairs per row.

    Args:
        head_dim: ``d_k``.

    Shapes:
        (numbers only)

    Returns:
        ``d_k / 4, d_k / 2, 3 d_k / 4, d_k, 3 d_k / 2, 2 d_k`` pairs (at least 1), as ints:
        ``(2, 4, 6, 8, 12, 16)`` for ``d_k = 8``.

    Taught in chapter 18.
    """
    _check_sizes(head_dim=head_dim)
    return tuple(max(1, round(head_dim * fraction)) for fraction in (0.25, 0.5, 0.75, 1, 1.5, 2))


def recall_run(layers: Sequence[str], *, head_dim: int, seed: int, task: str = "recall",
               steps: int | None = None) -> dict:
    """Train one model of chapter 18's experiment and measure what it recalls.

    The model (:class:`RecallModel` with one mixer per entry of ``layers``, from
    :func:`recall_mixer`) starts from ``torch.manual_seed(seed)`` and trains with
    :func:`train_recall` on fresh batches (``seed`` draws them too), with the settings of
    :data:`RECALL_SETUP`, on one thread, so that a run gives the same numbers every time in
    the same numeric environment. ``task="recall"``: :func:`associative_recall` with a pair
    count drawn uniformly from the smallest to the largest of :func:`recall_pairs`, tested at
    each of them. ``task="changed"``: :func:`changed_associations`, tested on the new
    episode's keys and on the stale ones (answer "absent").

    Args:
        layers: the mixers' kinds, first layer first (``("Gated DeltaNet", "softmax")`` is
            the hybrid).
        head_dim: ``d_k`` of every mixer's head.
        seed: the seed of the initial weights and of the training batches.
        task: ``"recall"`` or ``"changed"``.
        steps: optimiser steps; None is ``RECALL_SETUP["steps"]``.

    Shapes:
        (numbers only)

    Returns:
        A dict of numbers rounded to 4 digits. ``"recall"``: ``pairs`` (the pair counts) and
        ``accuracy`` (the share of questions answered right at each); ``"changed"``: ``new``
        and ``stale`` (the share answered right about the new keys and about the stale
        ones). Both: ``loss``, the mean training loss of the last 100 steps.

    Taught in chapter 18.
    """
    setup = RECALL_SETUP
    steps = setup["steps"] if steps is None else steps
    check_positive_int("steps", steps)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if isinstance(layers, str) or not layers:
        raise TypeError("layers must be a non-empty list of mixer kinds, e.g. ['DeltaNet']")
    if task not in ("recall", "changed"):
        raise ValueError(f"task must be 'recall' or 'changed', got {task!r}")
    pairs = recall_pairs(head_dim)
    sizes = {"num_keys": setup["num_keys"], "num_values": setup["num_values"]}
    episodes = {name: setup["changed"][name] for name in ("old_pairs", "new_pairs",
                                                            "stale_queries")}

    def batch(generator: torch.Generator) -> RecallBatch:
        if task == "changed":
            return changed_associations(setup["batch_size"], generator=generator, **episodes,
                                        **sizes)
        num_pairs = int(torch.randint(pairs[0], pairs[-1] + 1, (1,), generator=generator))
        return associative_recall(setup["batch_size"], num_pairs, generator=generator, **sizes)

    with cpu_threads(1):
        torch.manual_seed(seed)  # the initial weights
        model = RecallModel([recall_mixer(kind, d_model=setup["d_model"], head_dim=head_dim)
                             for kind in layers], d_model=setup["d_model"], **sizes)
        losses = train_recall(model, batch, steps=steps, lr=setup["lr"], seed=seed)
        test = torch.Generator().manual_seed(setup["test_seed"])
        if task == "changed":
            questions = changed_associations(setup["changed"]["test_sequences"],
                                             generator=test, **episodes, **sizes)
            right = recall_accuracy(model, questions)  # (B, Q)
            stale = questions.targets == setup["num_values"]  # (B, Q): the answer is "absent"
            result = {"new": round(right[~stale].float().mean().item(), 4),
                      "stale": round(right[stale].float().mean().item(), 4)}
        else:
            accuracy = [recall_accuracy(model, associative_recall(
                setup["test_sequences"], num_pairs, generator=test, **sizes)).float().mean().item()
                for num_pairs in pairs]
            result = {"pairs": list(pairs), "accuracy": [round(value, 4) for value in accuracy]}
    last = losses[-100:]
    return {**result, "loss": round(sum(last) / len(last), 4)}


def load_recall_sweep() -> dict:
    """The stored results of chapter 18's recall experiment, every run of every seed.

    ``tools/recall_sweep.py`` trained each of :data:`RECALL_RUNS` with each seed through
    :func:`recall_run` and wrote them into ``recall_sweep.json``, a file of this package
    (so that the chapter finds it wherever the package is installed); ``tools/recall_sweep.py
    --check`` trains them all again and compares.

    Shapes:
        (numbers only)

    Returns:
        A dict: ``setup`` (:data:`RECALL_SETUP`), ``seeds``, and ``runs``, a list of dicts
        with ``model``, ``layers``, ``d_k``, ``task``, ``seed`` and what :func:`recall_run`
        returns.

    Taught in chapter 18.
    """
    return json.loads(files("attention_book").joinpath("recall_sweep.json").read_text("utf-8"))
