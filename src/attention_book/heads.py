"""What the heads of a language model do: previous-token and induction scores, ablation, a report.

A **previous-token head** puts its weight on the token just before the query. An **induction
head** ([Olsson et al., 2022](https://arxiv.org/abs/2209.11895)) looks for an earlier copy of
the current token and attends to the token that *followed* it, so that the model can predict
that the sequence repeats: after ``… A B … A`` it looks at ``B``. The two work as a circuit:
the previous-token head of an early layer writes "the token before me was A" into the residual
stream at ``B``, and the induction head of a later layer matches its query (the current ``A``)
against that.

Every function here reads the weights that ``model(tokens, return_weights=True)`` returns
(one ``(B, num_heads, T, T)`` tensor per layer, as :class:`~attention_book.model.TinyGPT`
does); :func:`ablate_heads` needs the model's ``blocks[layer].attention`` layers.

This module imports :mod:`attention_book.model` and nothing above it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .model import TinyGPT

__all__ = [
    "head_name",
    "induction_targets",
    "previous_token_scores",
    "induction_scores",
    "ablate_heads",
    "HeadReport",
    "find_heads",
    "hand_built_induction_model",
]

_NAME = re.compile(r"^L(\d+)H(\d+)$")


def head_name(layer: int, head: int) -> str:
    """The name of head ``head`` of layer ``layer``: ``"L1H2"`` is layer 1, head 2 (from 0).

    Args:
        layer: the layer, counted from 0.
        head: the head within the layer, counted from 0.

    Returns:
        The name, a string.

    Taught in chapter 15.
    """
    return f"L{layer}H{head}"


def _layer_and_head(head: tuple[int, int] | str) -> tuple[int, int]:
    if isinstance(head, str):
        match = _NAME.match(head)
        if not match:
            raise ValueError(f"a head name looks like 'L1H2' (layer 1, head 2), got {head!r}")
        return int(match[1]), int(match[2])
    layer, index = head
    return int(layer), int(index)


def _check_tokens(tokens: object) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point:
        raise TypeError("tokens must be a tensor of integer token ids of shape (B, T)")
    if tokens.dim() != 2 or tokens.size(1) < 2:
        raise ValueError(f"tokens must have shape (B, T) with T >= 2, got {tuple(tokens.shape)}")
    return tokens


@torch.no_grad()
def _attention_weights(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Every layer's attention weights on ``tokens``, in eval mode: ``(L, B, H, T, T)``."""
    was_training = model.training
    model.eval()
    try:
        _, all_weights = model(tokens, return_weights=True)
    finally:
        model.train(was_training)
    return torch.stack(list(all_weights))  # (num_layers, B, num_heads, T, T)


def induction_targets(tokens: torch.Tensor) -> torch.Tensor:
    """Where an ideal induction head looks: the token after each earlier copy of the query's token.

    ``targets[b, t, s]`` is True when ``s <= t`` and ``tokens[b, s - 1] == tokens[b, t]``:
    key ``s`` follows an earlier occurrence of the token at ``t``. A query whose token did not
    occur before has no target (its row is all False).

    Args:
        tokens: integer token ids.

    Shapes:
        tokens ``(B, T)`` -> ``(B, T, T)`` (queries, keys), dtype ``torch.bool``.

    Returns:
        The boolean target mask.

    Taught in chapter 15.
    """
    tokens = _check_tokens(tokens)
    num_tokens = tokens.size(1)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): token t equals token j
    targets = torch.zeros_like(same)  # (B, T, T)
    targets[:, :, 1:] = same[:, :, :-1]  # key s = j + 1 follows the copy at j
    below = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=tokens.device).tril()
    return targets & below  # (B, T, T): only keys s <= t, so copies j < t


def previous_token_scores(
    model: nn.Module, tokens: torch.Tensor, *, at_targets: bool = False
) -> torch.Tensor:
    """Each head's mean attention weight on the previous token.

    By default the mean runs over every sequence and every query position ``t >= 1`` of the
    weight from ``t`` to ``t - 1``. A head that always looks one token back scores 1; a head
    that spreads its weight evenly over ``t + 1`` tokens scores about ``1 / (t + 1)``.

    With ``at_targets=True`` the mean runs only over the positions ``s`` that are an
    induction target of some later query (see :func:`induction_targets`): the keys whose
    "token before me" an induction head reads, the only places where an induction circuit
    needs its previous-token head. A head that does that job but idles elsewhere (at
    positions the training data rarely fills, say) scores high here and lower on average.

    Args:
        model: a language model whose ``model(tokens, return_weights=True)`` returns
            ``(logits, [weights of each layer])``, such as :class:`TinyGPT`.
        tokens: integer token ids to run it on; with ``at_targets=True`` at least one token
            must repeat.
        at_targets: average only over the keys that an induction head would read.

    Shapes:
        tokens ``(B, T)`` -> ``(num_layers, num_heads)``.

    Returns:
        A float tensor of scores in [0, 1], on the weights' device.

    Taught in chapter 15.
    """
    tokens = _check_tokens(tokens)
    if not isinstance(at_targets, bool):
        raise TypeError(f"at_targets must be a bool, got {type(at_targets).__name__}")
    keys = target_keys(induction_targets(tokens)) if at_targets else None
    return previous_token_scores_of_weights(_attention_weights(model, tokens), keys)


def target_keys(targets: torch.Tensor) -> torch.Tensor:
    """The positions that some query targets, from targets ``(B, T, T)`` -> ``(B, T)``."""
    keys = targets.any(dim=1)  # (B, T)
    if not bool(keys.any()):
        raise ValueError(
            f"no token of the {tuple(targets.shape[:2])} tokens occurs twice, so no key is an "
            "induction target; score sequences that repeat"
        )
    return keys


def previous_token_scores_of_weights(weights: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
    """``previous_token_scores`` from weights ``(L, B, H, T, T)`` -> ``(L, H)``.

    ``keys`` ``(B, T)``, if given, picks the query positions to average over.
    """
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (L, B, H, T - 1): query t >= 1
    if keys is None:
        return previous.mean(dim=(1, 3))  # (L, H)
    counted = keys[:, 1:].to(weights.dtype)[None, :, None]  # (1, B, 1, T - 1); key 0 is never one
    return (previous * counted).sum(dim=(1, 3)) / counted.sum()  # (L, H)


def induction_scores(
    model: nn.Module, tokens: torch.Tensor, *, queries: torch.Tensor | None = None
) -> torch.Tensor:
    """Each head's mean attention weight on the token after an earlier copy of the query's token.

    For every query whose token occurred before (see :func:`induction_targets`), the weight on
    all its targets is summed; the score is the mean of those sums over the queries and the
    sequences. An induction head scores near 1. Use sequences that repeat (as in chapter 15,
    a random segment that occurs twice), or nothing is there to find.

    With ``queries``, only the marked query positions count (those of them that have a
    target): for example the positions of a segment's second copy (chapter 15's
    ``loss_mask``), where the target is the first copy, and not the tokens that repeat by
    chance elsewhere.

    Args:
        model: a language model whose ``model(tokens, return_weights=True)`` returns
            ``(logits, [weights of each layer])``, such as :class:`TinyGPT`.
        tokens: integer token ids to run it on; at least one token must repeat.
        queries: optional boolean mask of the query positions to average over.

    Shapes:
        tokens ``(B, T)``, queries ``(B, T)`` -> ``(num_layers, num_heads)``.

    Returns:
        A float tensor of scores in [0, 1], on the weights' device.

    Taught in chapter 15.
    """
    targets = induction_targets(tokens)  # (B, T, T)
    if queries is not None:
        if not isinstance(queries, torch.Tensor) or queries.dtype != torch.bool:
            raise TypeError("queries must be a bool tensor of shape (B, T) marking the query "
                            "positions to score")
        if queries.shape != tokens.shape:
            raise ValueError(f"queries must have the shape of tokens, {tuple(tokens.shape)}, "
                             f"got {tuple(queries.shape)}")
        targets = targets & queries.to(targets.device)[:, :, None]  # (B, T, T): other rows empty
    return induction_scores_of_weights(_attention_weights(model, tokens), targets)


def induction_scores_of_weights(weights: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``induction_scores`` from weights ``(L, B, H, T, T)`` and targets ``(B, T, T)``."""
    has_target = targets.any(dim=-1)  # (B, T)
    if not bool(has_target.any()):
        raise ValueError(
            f"no token of the {tuple(targets.shape[:2])} tokens occurs twice, so no query "
            "has an induction target; score sequences that repeat"
        )
    on_targets = (weights * targets[None, :, None].to(weights.dtype)).sum(dim=-1)  # (L, B, H, T)
    counted = has_target[None, :, None].to(weights.dtype)  # (1, B, 1, T)
    return (on_targets * counted).sum(dim=(1, 3)) / counted.sum()  # (L, H)


@contextlib.contextmanager
def ablate_heads(model: nn.Module, heads: Iterable[tuple[int, int] | str]) -> Iterator[nn.Module]:
    """Zero the output of some heads while the ``with`` block runs.

    A hook on each named layer's output projection zeroes the head's slice of the
    concatenated context vectors, so that the head adds nothing to the residual stream. Its
    attention weights are still computed (and returned); only its contribution is gone.
    The hooks are removed when the block ends, even after an error.

    Args:
        model: a model with ``model.blocks[layer].attention``, a multi-head attention layer
            with ``num_heads``, ``head_dim`` and ``out_proj`` (such as :class:`TinyGPT`).
        heads: ``(layer, head)`` pairs or names such as ``"L0H3"``.

    Shapes:
        (the model's own)

    Returns:
        A context manager that yields the model.

    Taught in chapter 15.
    """
    by_layer: dict[int, list[int]] = {}
    for head in heads:
        layer, index = _layer_and_head(head)
        if not 0 <= layer < len(model.blocks):
            raise ValueError(f"layer {layer} does not exist: the model has {len(model.blocks)}")
        attention = model.blocks[layer].attention
        if not 0 <= index < attention.num_heads:
            raise ValueError(
                f"head {index} does not exist: layer {layer} has {attention.num_heads} heads"
            )
        by_layer.setdefault(layer, []).append(index)

    def zero_heads(indices: list[int], head_dim: int):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]):
            context = inputs[0].clone()  # (..., T, num_heads * head_dim)
            for index in indices:
                context[..., index * head_dim:(index + 1) * head_dim] = 0
            return (context,)

        return hook

    handles = []
    try:
        for layer, indices in by_layer.items():
            attention = model.blocks[layer].attention
            handles.append(attention.out_proj.register_forward_pre_hook(
                zero_heads(indices, attention.head_dim)))
        yield model
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class HeadReport:
    """The previous-token and induction scores of every head, and the heads above a threshold.

    Prints as a table, one row per head, with the role of each head whose score reaches
    ``threshold``.

    Attributes:
        previous_token: :func:`previous_token_scores` at the induction targets
            (``at_targets=True``), ``(num_layers, num_heads)``.
        induction: :func:`induction_scores`, ``(num_layers, num_heads)``.
        threshold: the score from which a head is given a role.

    Taught in chapter 15.
    """

    previous_token: torch.Tensor
    induction: torch.Tensor
    threshold: float = 0.5

    def _names(self, scores: torch.Tensor) -> list[str]:
        return [head_name(layer, head) for layer, head in
                (scores >= self.threshold).nonzero().tolist()]

    @property
    def previous_token_heads(self) -> list[str]:
        """Names of the heads whose previous-token score reaches the threshold."""
        return self._names(self.previous_token)

    @property
    def induction_heads(self) -> list[str]:
        """Names of the heads whose induction score reaches the threshold."""
        return self._names(self.induction)

    @property
    def has_induction_circuit(self) -> bool:
        """True when a previous-token head comes before (in an earlier layer) an induction head."""
        previous = [_layer_and_head(name)[0] for name in self.previous_token_heads]
        induction = [_layer_and_head(name)[0] for name in self.induction_heads]
        return any(p < i for p in previous for i in induction)

    def __str__(self) -> str:
        num_layers, num_heads = self.previous_token.shape
        lines = [f"head   previous-token  induction  role (score >= {self.threshold:g})"]
        for layer in range(num_layers):
            for head in range(num_heads):
                previous = float(self.previous_token[layer, head])
                induction = float(self.induction[layer, head])
                roles = [role for role, score in (("previous-token head", previous),
                                                  ("induction head", induction))
                         if score >= self.threshold]
                lines.append(f"{head_name(layer, head):<6} {previous:>14.2f}  {induction:>9.2f}"
                             f"  {', '.join(roles) or '-'}")
        lines.append(f"previous-token heads: {', '.join(self.previous_token_heads) or 'none'}; "
                     f"induction heads: {', '.join(self.induction_heads) or 'none'}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def find_heads(model: nn.Module, tokens: torch.Tensor, threshold: float = 0.5) -> HeadReport:
    """Score every head of ``model`` on ``tokens`` and name its previous-token and induction heads.

    The check beside :func:`~attention_book.diagnose` for whole models: ``diagnose`` tests
    one attention layer against properties that must hold; ``find_heads`` reports what the
    heads of a trained model *do*. Each score is measured where an induction circuit needs
    the head: the induction score at the queries that have a target, the previous-token
    score at the keys an induction head reads (``previous_token_scores(...,
    at_targets=True)``). A score averaged over every position would also count places where
    a head has no work to do, and fall below the threshold for reasons that say nothing
    about the circuit (chapter 15 measures it). Two heads of one layer that share a job
    may each stay below the threshold: read the table, not only the names.

    Args:
        model: a language model whose ``model(tokens, return_weights=True)`` returns
            ``(logits, [weights of each layer])``, such as :class:`TinyGPT`.
        tokens: integer token ids with repeats (a segment that occurs twice).
        threshold: the score from which a head counts as a previous-token or induction head.

    Shapes:
        tokens ``(B, T)``; the report holds two ``(num_layers, num_heads)`` tensors.

    Returns:
        A :class:`HeadReport`; ``str(report)`` is the table.

    Taught in chapter 15.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
        0 < threshold <= 1
    ):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    targets = induction_targets(tokens)  # (B, T, T)
    weights = _attention_weights(model, tokens)  # (L, B, H, T, T)
    return HeadReport(previous_token_scores_of_weights(weights, target_keys(targets)).cpu(),
                      induction_scores_of_weights(weights, targets).cpu(), float(threshold))


def _identity_norm(norm: nn.LayerNorm, num_ones: int) -> None:
    """Make ``norm`` return its input unchanged for vectors holding ``num_ones`` ones and 0s."""
    d_model = norm.normalized_shape[0]
    mean = num_ones / d_model
    variance = mean - mean**2
    norm.weight.fill_((variance + norm.eps) ** 0.5)
    norm.bias.fill_(mean)


@torch.no_grad()
def hand_built_induction_model(
    vocab_size: int = 8,
    context_length: int = 16,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> TinyGPT:
    """An attention-only two-layer :class:`TinyGPT` whose weights are set by hand to copy.

    The residual stream has four blocks of features: the token (one-hot), the position
    (one-hot), the previous token and the copied token. Layer 0, head 0 is a previous-token
    head: its query is the position ``t``, its key the position plus one, and it writes the
    token it finds into the "previous token" block. Layer 1, head 0 is an induction head: its
    query is the current token, its key the "previous token" block, so it attends to every key
    that follows an earlier copy of the current token, and writes that key's token into the
    "copied token" block, which the output layer reads. Two decoys have the same attention
    patterns but write nothing: L0H1 looks at the previous token, L1H1 at the current one.
    The LayerNorms are set to pass these 0/1 vectors through unchanged.

    Args:
        vocab_size: number of token ids ``V``.
        context_length: the longest sequence ``T``; at most ``3 * vocab_size``.
        device: where to create the parameters.
        dtype: the parameters' floating dtype.

    Shapes:
        ``d_model = 3 V + T`` (plus one if that is odd), two heads of ``d_model / 2`` per layer.

    Returns:
        The model, in eval mode.

    Taught in chapter 15.
    """
    for name, value in (("vocab_size", vocab_size), ("context_length", context_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 2:
            raise ValueError(f"{name} must be an int >= 2, got {value!r}")
    if context_length > 3 * vocab_size:
        raise ValueError(f"context_length ({context_length}) must be at most 3 * vocab_size "
                         f"({3 * vocab_size}), so that a head holds one feature per position")
    num_features = 3 * vocab_size + context_length
    d_model = num_features + num_features % 2
    model = TinyGPT(vocab_size, d_model, 2, 2, context_length, attention_only=True,
                    device=device, dtype=dtype)
    for parameter in model.parameters():
        parameter.zero_()
    head_dim = d_model // 2
    where = model.output.weight.device
    token = torch.arange(vocab_size, device=where)  # feature of each token in the "token" block
    position = vocab_size + torch.arange(context_length, device=where)  # the "position" block
    previous = vocab_size + context_length + token  # the "previous token" block
    copied = 2 * vocab_size + context_length + token  # the "copied token" block
    # A gain so large that each softmax puts all but about e^-20 of its weight on the max.
    gain = 20.0 * head_dim**0.5

    model.token_embedding.weight[token, token] = 1.0
    model.position_embedding.weight[position - vocab_size, position] = 1.0

    first, second = model.blocks
    _identity_norm(first.attention_norm, 2)  # token + position
    _identity_norm(second.attention_norm, 3)  # + previous token
    _identity_norm(model.final_norm, 4)  # + copied token
    rows = position - vocab_size  # 0 … context_length - 1
    for head in (0, 1):  # both heads of layer 0 look one position back
        start = head * head_dim
        first.attention.W_query.weight[start + rows, position] = gain
        first.attention.W_key.weight[start + rows[1:], position[:-1]] = 1.0
    first.attention.W_value.weight[token, token] = 1.0  # head 0 reads the token ...
    first.attention.out_proj.weight[previous, token] = 1.0  # ... and writes it as "previous"

    rows = token
    second.attention.W_query.weight[rows, token] = gain  # head 0: "which token am I?"
    second.attention.W_key.weight[rows, previous] = 1.0  # "which token came before you?"
    second.attention.W_value.weight[rows, token] = 1.0  # copy the key's own token ...
    second.attention.out_proj.weight[copied, rows] = 1.0  # ... into the "copied" block
    second.attention.W_query.weight[head_dim + rows, token] = gain  # L1H1 looks at the
    second.attention.W_key.weight[head_dim + rows, token] = 1.0  # current token (a decoy)

    model.output.weight[token, copied] = 10.0  # the logits read the copied token
    return model.eval()
