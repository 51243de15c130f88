"""Attention as a recurrence: linear attention, the delta rule, gating and the chunkwise form.

Without the softmax, ``(phi(q) . phi(k)) v`` regroups as ``phi(q) . (sum phi(k) v^T)``: the
causal sum is a running ``d_k x d_v`` *state*, and attention becomes a recurrent network whose
memory does not grow with the sequence (Katharopoulos et al., 2020). :func:`linear_attention`
is that layer's functional core. :func:`delta_rule` writes into the state the *error* of what
it already recalls for a key, ``S <- S + beta k (v - S^T k)^T`` (Schlag et al., 2021), with an
optional per-step decay ``exp(g)`` (Gated DeltaNet, Yang et al., 2025), token by token or in
chunks whose inside is computed with matrices (the WY/UT form of Yang et al., 2024).

The layers built on these functions, :class:`LinearAttentionLayer` and
:class:`GatedDeltaNet` (DeltaNet with ``gate=False``), are token mixers: a
:class:`~attention_book.TransformerBlock` holds one in place of attention. While a model
generates, each keeps a :class:`RecurrentState` (one fixed-size state per layer) where an
attention layer keeps a :class:`~attention_book.KVCache`.

This module imports only the argument checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_layer_input, check_positive_int, require_float

__all__ = [
    "elu_feature_map",
    "linear_attention",
    "linear_attention_recurrent",
    "delta_rule",
    "RecurrentState",
    "LinearAttentionLayer",
    "GatedDeltaNet",
    "recurrent_state_bytes",
]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``: a positive feature map, the default of :func:`linear_attention`.

    Args:
        x: queries or keys.

    Shapes:
        any shape; the result has the same shape.

    Returns:
        ``elu(x) + 1``, every entry > 0 (so every score ``phi(q) . phi(k)`` is positive,
        as ``exp`` would make it).

    Taught in chapter 18.
    """
    return F.elu(x) + 1.0


def _check_same_lead(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """query and key (..., T, d_k), value (..., T, d_v): the same leading dims and T."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        require_float(name, tensor)
        if tensor.dim() < 2:
            raise ValueError(
                f"{name} must have shape (..., T, d), got shape {tuple(tensor.shape)}"
            )
    if query.shape != key.shape:
        raise ValueError(
            f"query and key must have the same shape (..., T, d_k): query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}"
        )
    if value.shape[:-1] != key.shape[:-1]:
        raise ValueError(
            f"value must match key in every dim but the last (..., T, d_v): key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype} and "
            f"{value.dtype}"
        )


def linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
    causal: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Linear attention: softmax's ``exp(q . k)`` replaced by ``phi(q) . phi(k)``.

    Output ``i`` is ``phi(q_i) . sum_j phi(k_j) v_j^T`` divided by
    ``phi(q_i) . sum_j phi(k_j)``, over ``j <= i`` (every ``j`` when ``causal=False``).
    Computed in the parallel form: the ``T x T`` matrix of scores ``phi(q_i) . phi(k_j)``,
    masked, times the values, each row divided by its sum. Without the mask the product
    regroups as ``phi(Q) (phi(K)^T V)``, which costs ``T d_k d_v`` instead of ``T^2``; that
    regrouping is what this function computes for ``causal=False``. The causal sum as a
    running state is the recurrent form that chapter 18 writes beside it.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        feature_map: ``phi``, applied to queries and keys; any callable that keeps the
            shape. ``None`` is :func:`elu_feature_map`, ``elu(x) + 1``.
        causal: query ``i`` reads keys ``j <= i`` only.
        eps: added to each denominator, so that a row whose scores sum to 0 gives 0.

    Shapes:
        query and key ``(..., T, d_k)``, value ``(..., T, d_v)`` (in the book ``(B, H, T, d)``)
        -> ``(..., T, d_v)``.

    Returns:
        The outputs, one per query.

    Taught in chapter 18.
    """
    _check_same_lead(query, key, value)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    phi = elu_feature_map if feature_map is None else feature_map
    if not callable(phi):
        raise TypeError(f"feature_map must be callable, got {type(phi).__name__}")
    phi_q, phi_k = phi(query), phi(key)  # (..., T, d_k) each
    for name, mapped, original in (("phi(query)", phi_q, query), ("phi(key)", phi_k, key)):
        if not isinstance(mapped, torch.Tensor) or mapped.shape != original.shape:
            got = tuple(mapped.shape) if isinstance(mapped, torch.Tensor) else type(mapped).__name__
            raise ValueError(
                f"feature_map must keep the shape: {name} has {got}, the input "
                f"{tuple(original.shape)}"
            )
    if not causal:
        memory = phi_k.transpose(-2, -1) @ value  # (..., d_k, d_v): sum_j phi(k_j) v_j^T
        normalizer = phi_k.sum(dim=-2)  # (..., d_k): sum_j phi(k_j)
        numerator = phi_q @ memory  # (..., T, d_v)
        denominator = (phi_q * normalizer.unsqueeze(-2)).sum(dim=-1, keepdim=True)  # (..., T, 1)
        return numerator / (denominator + eps)
    num_tokens = query.size(-2)
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., T, T)
    keep = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=query.device).tril()
    scores = scores.masked_fill(~keep, 0.0)  # (..., T, T): key j > i adds nothing
    return (scores @ value) / (scores.sum(dim=-1, keepdim=True) + eps)  # (..., T, d_v)


def linear_attention_recurrent(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
    eps: float = 1e-6,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal linear attention as a recurrence: a running ``d_k x d_v`` state, token by token.

    At each step ``t``: ``S <- S + phi(k_t) v_t^T`` and ``z <- z + phi(k_t)``, then
    ``o_t = phi(q_t)^T S / (phi(q_t) . z + eps)``. The memory ``(S, z)`` has the same size
    after 10 tokens as after 10,000; it equals causal :func:`linear_attention`.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        feature_map: ``phi``; ``None`` is :func:`elu_feature_map`.
        eps: added to each denominator.
        initial_state: ``(S, z)`` before the first token; ``None`` is zeros.

    Shapes:
        query and key ``(..., T, d_k)``, value ``(..., T, d_v)``; the state ``S`` is
        ``(..., d_k, d_v)`` and ``z`` ``(..., d_k)`` -> out ``(..., T, d_v)``.

    Returns:
        ``(out, (S, z))``: the outputs and the memory after the last token, which continues
        the sequence when passed back as ``initial_state``.

    Taught in chapter 18.
    """
    _check_same_lead(query, key, value)
    phi = elu_feature_map if feature_map is None else feature_map
    if not callable(phi):
        raise TypeError(f"feature_map must be callable, got {type(phi).__name__}")
    d_k, d_v = key.size(-1), value.size(-1)
    lead = key.shape[:-2]
    if initial_state is None:
        memory = key.new_zeros(*lead, d_k, d_v)  # (..., d_k, d_v)
        normalizer = key.new_zeros(*lead, d_k)  # (..., d_k)
    else:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise TypeError("initial_state must be a pair (S, z) of tensors, got "
                            f"{type(initial_state).__name__}")
        memory, normalizer = initial_state
        for name, tensor, shape in (("S", memory, (*lead, d_k, d_v)),
                                    ("z", normalizer, (*lead, d_k))):
            require_float(f"initial_state's {name}", tensor)
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"initial_state's {name} must have shape {shape} for keys "
                    f"{tuple(key.shape)} and values {tuple(value.shape)}; got {tuple(tensor.shape)}"
                )
    phi_q, phi_k = phi(query), phi(key)  # (..., T, d_k) each
    outputs = []
    for t in range(key.size(-2)):
        memory = memory + phi_k[..., t, :, None] * value[..., t, None, :]  # (..., d_k, d_v)
        normalizer = normalizer + phi_k[..., t, :]  # (..., d_k)
        numerator = (phi_q[..., t, None, :] @ memory).squeeze(-2)  # (..., d_v)
        denominator = (phi_q[..., t, :] * normalizer).sum(dim=-1, keepdim=True)  # (..., 1)
        outputs.append(numerator / (denominator + eps))
    out = torch.stack(outputs, dim=-2) if outputs else value.new_zeros(value.shape)
    return out, (memory, normalizer)  # (..., T, d_v), ((..., d_k, d_v), (..., d_k))


#: Dtypes that :func:`delta_rule` computes in float32 (returning its results in them).
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _check_gates(
    name: str, gate: torch.Tensor, key: torch.Tensor, low: float | None, high: float | None
) -> None:
    require_float(name, gate)
    if gate.shape != key.shape[:-1]:
        raise ValueError(
            f"{name} must have shape {tuple(key.shape[:-1])} (..., T): one number per head and "
            f"token, for keys of shape {tuple(key.shape)}; got {tuple(gate.shape)}"
        )
    if gate.dtype != key.dtype:
        raise TypeError(f"{name} must have the keys' dtype {key.dtype}, got {gate.dtype}")
    if gate.numel() == 0:
        return
    if torch.isnan(gate).any():
        raise ValueError(f"{name} holds NaN")
    if low is not None and float(gate.detach().min()) < low:
        raise ValueError(f"{name} must be >= {low:g}, got a minimum of {float(gate.detach().min()):.4g}")
    if high is not None and float(gate.detach().max()) > high:
        what = "log space: a decay exp(g) <= 1 needs g <= 0" if name == "decay" else "[0, 1]"
        raise ValueError(
            f"{name} must be <= {high:g} ({what}), got a maximum of {float(gate.detach().max()):.4g}"
        )


def _delta_rule_loop(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    decay: torch.Tensor | None,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence: decay, write the error, read. ``query`` is scaled."""
    outputs = []
    for t in range(key.size(-2)):
        k_t, v_t = key[..., t, :], value[..., t, :]  # (..., d_k), (..., d_v)
        if decay is not None:
            state = state * decay[..., t, None, None].exp()  # (..., d_k, d_v)
        recalled = (k_t.unsqueeze(-2) @ state).squeeze(-2)  # (..., d_v): S^T k
        error = beta[..., t, None] * (v_t - recalled)  # (..., d_v)
        state = state + k_t.unsqueeze(-1) * error.unsqueeze(-2)  # (..., d_k, d_v)
        outputs.append((query[..., t, :].unsqueeze(-2) @ state).squeeze(-2))  # (..., d_v)
    if not outputs:
        return value.new_zeros(value.shape), state
    return torch.stack(outputs, dim=-2), state  # (..., T, d_v), (..., d_k, d_v)


def _delta_rule_chunks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    decay: torch.Tensor | None,
    state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunkwise form: matrices inside each chunk, the state passed between chunks.

    Inside a chunk that starts from state ``S0``, with ``G_i`` the decay accumulated from the
    chunk's start to step ``i``, the vector that step ``i`` writes is
    ``w_i = beta_i (v_i - G_i S0^T k_i - sum_{j<i} (G_i / G_j)(k_i . k_j) w_j)``: a unit
    lower-triangular system ``A W = beta (V - G K S0)``, solved for the whole chunk at once
    (the UT transform). Then ``o_i = G_i q_i S0 + sum_{j<=i} (G_i / G_j)(q_i . k_j) w_j`` and
    the state at the chunk's end is ``G_C S0 + sum_j (G_C / G_j) k_j w_j^T``.
    """
    *lead, num_tokens, d_k = key.shape
    d_v = value.size(-1)
    pad = -num_tokens % chunk_size
    # Padding is exact: a padded step has beta = 0 (writes nothing) and g = 0 (keeps the state).
    if pad:
        query, key, value = (F.pad(x, (0, 0, 0, pad)) for x in (query, key, value))
        beta = F.pad(beta, (0, pad))
        if decay is not None:
            decay = F.pad(decay, (0, pad))
    num_chunks = (num_tokens + pad) // chunk_size
    shape = (*lead, num_chunks, chunk_size)
    q = query.reshape(*shape, d_k)  # (..., n, C, d_k)
    k = key.reshape(*shape, d_k)  # (..., n, C, d_k)
    v = value.reshape(*shape, d_v)  # (..., n, C, d_v)
    b = beta.reshape(shape).unsqueeze(-1)  # (..., n, C, 1)
    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=key.device).tril()
    if decay is None:
        ratio = lower.to(key.dtype)  # (C, C): G_i / G_j = 1 for j <= i, 0 above
        start_decay = torch.ones_like(b)  # (..., n, C, 1): G_i
        end_decay = torch.ones_like(b)  # (..., n, C, 1): G_C / G_j
        chunk_decay = torch.ones(*lead, num_chunks, 1, 1, dtype=key.dtype, device=key.device)
    else:
        log_g = decay.reshape(shape).cumsum(dim=-1)  # (..., n, C): log G_i
        gap = log_g.unsqueeze(-1) - log_g.unsqueeze(-2)  # (..., n, C, C): log G_i - log G_j
        ratio = gap.masked_fill(~lower, float("-inf")).exp()  # (..., n, C, C); 0 above
        start_decay = log_g.exp().unsqueeze(-1)  # (..., n, C, 1)
        end_decay = (log_g[..., -1:] - log_g).exp().unsqueeze(-1)  # (..., n, C, 1)
        chunk_decay = log_g[..., -1].exp()[..., None, None]  # (..., n, 1, 1): G_C
    strictly_lower = (k @ k.transpose(-2, -1)) * ratio * b  # (..., n, C, C): beta_i G_i/G_j k_i.k_j
    system = strictly_lower.tril(-1) + torch.eye(chunk_size, dtype=key.dtype, device=key.device)
    # A W = beta V - beta G K S0: solve once for beta V and once for beta G K, then subtract.
    written_free = torch.linalg.solve_triangular(system, b * v, upper=False,
                                                 unitriangular=True)  # (..., n, C, d_v)
    state_reader = torch.linalg.solve_triangular(system, b * start_decay * k, upper=False,
                                                 unitriangular=True)  # (..., n, C, d_k)
    within = (q @ k.transpose(-2, -1)) * ratio  # (..., n, C, C): (G_i/G_j) q_i.k_j, j <= i
    q_decayed = q * start_decay  # (..., n, C, d_k)
    k_to_end = k * end_decay  # (..., n, C, d_k)
    outputs = []
    for chunk in range(num_chunks):
        written = written_free[..., chunk, :, :] - state_reader[..., chunk, :, :] @ state  # (..., C, d_v)
        outputs.append(q_decayed[..., chunk, :, :] @ state
                       + within[..., chunk, :, :] @ written)  # (..., C, d_v)
        state = (chunk_decay[..., chunk, :, :] * state
                 + k_to_end[..., chunk, :, :].transpose(-2, -1) @ written)  # (..., d_k, d_v)
    out = torch.cat(outputs, dim=-2)  # (..., n C, d_v)
    return out[..., :num_tokens, :], state  # (..., T, d_v), (..., d_k, d_v)


def delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    *,
    decay: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (gated) delta rule: a ``d_k x d_v`` state that writes what it failed to recall.

    At each step ``t``: ``S <- exp(g_t) S`` (only with ``decay``), then
    ``S <- S + beta_t k_t (v_t - S^T k_t)^T``, then ``o_t = scale * S^T q_t``. The write is
    one step of gradient descent, with learning rate ``beta_t``, on ``||S^T k_t - v_t||^2 / 2``.
    With ``decay=None`` this is DeltaNet; with a decay, Gated DeltaNet. ``chunk_size=None``
    runs the token-by-token loop; an int runs the chunkwise form, which computes the same
    with a few matrix products per chunk and a loop over chunks only.

    Args:
        query: the queries (multiplied by ``scale``).
        key: the keys, used as given (the models, and chapter 18, L2-normalise them first).
        value: the values.
        beta: the write strength of each step, in ``[0, 1]``.
        decay: ``g``, the log of the decay of each step (``<= 0``); ``None`` for no decay.
        scale: multiplies the queries; ``None`` is ``1 / sqrt(d_k)``.
        chunk_size: ``None`` for the token loop; an int ``>= 1`` for the chunkwise form.
        initial_state: the state before the first token; ``None`` is zeros.

    Shapes:
        query and key ``(..., T, d_k)``, value ``(..., T, d_v)``, beta and decay ``(..., T)``,
        initial_state ``(..., d_k, d_v)`` (in the book ``(B, H, T, d)``, ``(B, H, T)`` and
        ``(B, H, d_k, d_v)``) -> out ``(..., T, d_v)``, state ``(..., d_k, d_v)``.

    Returns:
        ``(out, state)``: the outputs and the state after the last token. Running a sequence
        in two parts, passing the first part's state as ``initial_state``, equals one run.
        Inputs in float16 or bfloat16 are computed in float32 (the state, the chunk's
        triangular solve, every sum), as flash-linear-attention's kernels do; both results
        come back in the inputs' dtype.

    Taught in chapter 18.
    """
    _check_same_lead(query, key, value)
    _check_gates("beta", beta, key, 0.0, 1.0)
    if decay is not None:
        _check_gates("decay", decay, key, None, 0.0)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    d_k, d_v = key.size(-1), value.size(-1)
    if scale is None:
        scale = 1.0 / math.sqrt(d_k)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite number or None, got {scale!r}")
    state_shape = (*key.shape[:-2], d_k, d_v)
    if initial_state is None:
        state = key.new_zeros(state_shape)
    else:
        require_float("initial_state", initial_state)
        if tuple(initial_state.shape) != state_shape:
            raise ValueError(
                f"initial_state must have shape {state_shape} (..., d_k, d_v) for keys "
                f"{tuple(key.shape)} and values {tuple(value.shape)}; got "
                f"{tuple(initial_state.shape)}"
            )
        if initial_state.dtype != key.dtype:
            raise TypeError(
                f"initial_state must have the keys' dtype {key.dtype}, got {initial_state.dtype}"
            )
        state = initial_state
    dtype = key.dtype
    if dtype in _SIXTEEN_BIT:
        # As the fla kernels do: the state, the chunk's triangular solve and every sum in
        # float32 (torch has no 16-bit triangular solve, and a 16-bit state loses the small
        # writes), the results back in the inputs' dtype.
        query, key, value, beta, state = (x.float() for x in (query, key, value, beta, state))
        decay = None if decay is None else decay.float()
    query = query * scale  # (..., T, d_k)
    if chunk_size is None or key.size(-2) == 0:
        out, state = _delta_rule_loop(query, key, value, beta, decay, state)
    else:
        out, state = _delta_rule_chunks(query, key, value, beta, decay, state, chunk_size)
    return out.to(dtype), state.to(dtype)  # (..., T, d_v), (..., d_k, d_v)


class RecurrentState:
    """The memory of a recurrent token mixer while a model generates: one state of fixed size.

    Where an attention layer's :class:`~attention_book.KVCache` grows by one key and one value
    per token, a recurrent layer keeps one ``(B, H, d_k, d_v)`` state (and, for linear
    attention, a ``(B, H, d_k)`` normaliser), overwritten at each step. It answers the two
    questions every layer cache answers (``len(state)`` and :meth:`positions`), so a model
    hands it to its layer like any other cache; the layer reads :attr:`memory` and
    :attr:`normalizer` and stores the new ones with :meth:`advance`.

    Args:
        max_length: the most tokens it may take (the model's ``context_length``), or None for
            no limit: the state itself does not grow.

    Shapes:
        memory ``(B, H, d_k, d_v)``; normalizer ``(B, H, d_k)`` or None.

    Returns:
        (a class) ``len(state)`` is the number of tokens it has read; ``state.nbytes`` the
        bytes it holds, the same after one token as after a million.

    Taught in chapter 18.
    """

    def __init__(self, max_length: int | None = None):
        if max_length is not None:
            check_positive_int("max_length", max_length)
        self.max_length = max_length
        self.memory: torch.Tensor | None = None  # (B, H, d_k, d_v)
        self.normalizer: torch.Tensor | None = None  # (B, H, d_k)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        shape = None if self.memory is None else tuple(self.memory.shape)
        return f"RecurrentState(length={self._length}, memory={shape})"

    @property
    def nbytes(self) -> int:
        """Bytes held by the state (0 before the first token)."""
        if self.memory is None:
            return 0
        return self.memory.nbytes + (0 if self.normalizer is None else self.normalizer.nbytes)

    def reset(self) -> None:
        """Forget everything: the next token starts from a zero state."""
        self.memory, self.normalizer, self._length = None, None, 0

    def positions(self, num_new: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The positions of the next ``num_new`` tokens: they follow the ``len(state)`` read.

        Args:
            num_new: how many tokens are about to be read.
            device: where to create the positions.

        Shapes:
            returns ``(num_new,)``.

        Returns:
            ``len(state), …, len(state) + num_new - 1``.
        """
        if isinstance(num_new, bool) or not isinstance(num_new, int) or num_new < 0:
            raise ValueError(f"num_new must be an int >= 0, got {num_new!r}")
        return torch.arange(self._length, self._length + num_new, device=device)  # (T_new,)

    def check_room(self, num_new: int) -> None:
        """Raise ``ValueError`` if ``num_new`` more tokens would pass ``max_length``."""
        if self.max_length is not None and self._length + num_new > self.max_length:
            raise ValueError(
                f"the state has read {self._length} tokens and cannot take {num_new} more: "
                f"{self._length + num_new} would exceed max_length={self.max_length}; call "
                "reset() to start over"
            )

    def advance(self, num_new: int, memory: torch.Tensor,
                normalizer: torch.Tensor | None = None) -> None:
        """Store the state after ``num_new`` more tokens.

        Args:
            num_new: the tokens the layer has just read.
            memory: the new state.
            normalizer: the new normaliser (linear attention), or None.

        Shapes:
            memory ``(B, H, d_k, d_v)``, normalizer ``(B, H, d_k)``: the shapes of the first
            call, at every later one.

        Returns:
            None.
        """
        self.check_room(num_new)
        require_float("memory", memory)
        if self.memory is not None:
            if memory.shape != self.memory.shape:
                raise ValueError(
                    f"this state holds a memory of shape {tuple(self.memory.shape)} "
                    f"(B, H, d_k, d_v); got {tuple(memory.shape)}"
                )
            if (normalizer is None) != (self.normalizer is None):
                raise ValueError("pass a normalizer at every step or at none, as at the first")
        if normalizer is not None and normalizer.shape != memory.shape[:-1]:
            raise ValueError(
                f"normalizer must have shape {tuple(memory.shape[:-1])} (B, H, d_k) for a memory "
                f"of shape {tuple(memory.shape)}; got {tuple(normalizer.shape)}"
            )
        self.memory, self.normalizer = memory, normalizer
        self._length += num_new

    @staticmethod
    def stack(states: Sequence[RecurrentState]) -> RecurrentState:
        """One state for a batch of sequences, each with a state of its own (a server's batch).

        A server that decodes many sequences in one forward pass (chapter 16) keeps one
        state per sequence and layer, of batch size 1, beside its paged pool of keys and
        values. For a step it stacks the states of the batch's sequences into one, which
        the layer reads and advances as any state; what the layer stores goes back, row by
        row, into each sequence's own state. The sequences may have read different numbers
        of tokens: :meth:`positions` then gives each row its own positions, as a paged view
        does. A state that has read nothing yet starts from zeros, which is what an empty
        state means.

        Args:
            states: one state per sequence, each empty or holding batch size 1.

        Shapes:
            each memory ``(1, H, d_k, d_v)`` -> the stack's ``(len(states), H, d_k, d_v)``.

        Returns:
            A :class:`RecurrentState` whose :meth:`advance` writes through to ``states``.
        """
        return _StackedStates(states)


class _StackedStates(RecurrentState):
    """A batch made of per-sequence states; :meth:`advance` writes each row back."""

    def __init__(self, states: Sequence[RecurrentState]):
        if isinstance(states, RecurrentState) or not isinstance(states, Sequence) or not states:
            raise TypeError("states must be a non-empty list of RecurrentState, one per sequence")
        for index, state in enumerate(states):
            if not isinstance(state, RecurrentState):
                raise TypeError(f"states[{index}] is a {type(state).__name__}, not a "
                                "RecurrentState")
            if state.memory is not None and state.memory.size(0) != 1:
                raise ValueError(f"states[{index}] holds a batch of {state.memory.size(0)}; "
                                 "each sequence's state must hold batch size 1")
        limits = [state.max_length for state in states if state.max_length is not None]
        super().__init__(min(limits) if limits else None)
        self.states = list(states)
        self.lengths = [len(state) for state in states]
        self._length = max(self.lengths)
        held = [state for state in states if state.memory is not None]
        if held:
            shapes = {tuple(state.memory.shape) for state in held}
            if len(shapes) != 1 or len({state.normalizer is None for state in held}) != 1:
                raise ValueError(f"the states hold memories of different shapes {sorted(shapes)} "
                                 "(or some have a normaliser and some not): they belong to "
                                 "different layers")
            template = held[0]

            def rows(name: str) -> torch.Tensor | None:
                if getattr(template, name) is None:
                    return None
                zero = torch.zeros_like(getattr(template, name))
                return torch.cat([zero if getattr(state, name) is None else getattr(state, name)
                                  for state in states])  # (B, ...)

            self.memory, self.normalizer = rows("memory"), rows("normalizer")

    def positions(self, num_new: int, device: torch.device | str | None = None) -> torch.Tensor:
        if len(set(self.lengths)) == 1:
            return super().positions(num_new, device)  # (T_new,)
        super().positions(num_new, device)  # checks num_new
        starts = torch.tensor(self.lengths, device=device)  # (B,)
        return starts[:, None] + torch.arange(num_new, device=device)  # (B, T_new)

    def check_room(self, num_new: int) -> None:
        for state in self.states:
            state.check_room(num_new)

    def advance(self, num_new: int, memory: torch.Tensor,
                normalizer: torch.Tensor | None = None) -> None:
        if memory.size(0) != len(self.states):
            raise ValueError(f"memory holds a batch of {memory.size(0)} for "
                             f"{len(self.states)} stacked states")
        for row, state in enumerate(self.states):
            state.advance(num_new, memory[row:row + 1],
                          None if normalizer is None else normalizer[row:row + 1])
        self.memory, self.normalizer = memory, normalizer
        self.lengths = [length + num_new for length in self.lengths]
        self._length += num_new


def _check_state(kv_cache: object) -> RecurrentState:
    if not isinstance(kv_cache, RecurrentState):
        raise TypeError(
            "a recurrent layer keeps its memory in a RecurrentState (layer.new_cache()), not "
            f"in a {type(kv_cache).__name__}: a KV cache stores keys, this layer a fixed state"
        )
    return kv_cache


class _RecurrentMixer(nn.Module):
    """What the two recurrent layers share: projections into heads, the mixer's interface."""

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None,
                 factory: dict) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(
                    f"d_model ({d_model}) must be divisible by num_heads ({num_heads}), or "
                    "give head_dim"
                )
            head_dim = d_model // num_heads
        check_positive_int("head_dim", head_dim)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        inner = num_heads * head_dim
        self.W_query = nn.Linear(d_model, inner, bias=False, **factory)
        self.W_key = nn.Linear(d_model, inner, bias=False, **factory)
        self.W_value = nn.Linear(d_model, inner, bias=False, **factory)
        self.out_proj = nn.Linear(inner, d_model, bias=False, **factory)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, num_tokens, _ = x.shape
        return x.view(batch, num_tokens, self.num_heads, -1).transpose(1, 2)  # (B, H, T, d)

    def new_cache(self, max_length: int | None = None) -> RecurrentState:
        """An empty :class:`RecurrentState`: what this layer keeps while a model generates.

        Args:
            max_length: the most tokens it may read (None: no limit).

        Shapes:
            (no tensors)

        Returns:
            A new, empty state.
        """
        return RecurrentState(max_length)

    def _mix(self, x: torch.Tensor, state: RecurrentState | None) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_weights: bool = False, *, kv_cache: RecurrentState | None = None):
        check_layer_input(x, self.d_model, None)
        if x.dim() != 3:
            raise ValueError(f"x must have shape (B, T, d_model), got {tuple(x.shape)}")
        if mask is not None:
            raise ValueError(
                "a recurrent layer is causal by construction and takes no mask: it reads the "
                "tokens in order, each once"
            )
        state = None if kv_cache is None else _check_state(kv_cache)
        if state is not None:
            state.check_room(x.size(1))
        mixed = self._mix(x, state)  # (B, H, T, head_dim)
        batch, _, num_tokens, _ = mixed.shape
        out = self.out_proj(mixed.transpose(1, 2).reshape(batch, num_tokens, -1))  # (B, T, d_model)
        return (out, None) if return_weights else out


class LinearAttentionLayer(_RecurrentMixer):
    """Multi-head causal linear attention (Katharopoulos et al., 2020) as a token mixer.

    Queries, keys and values are projected and split into heads as in
    :class:`~attention_book.MultiHeadAttention`; each head computes :func:`linear_attention`
    (``elu(x) + 1`` features) and an output projection joins them. With a
    :class:`RecurrentState` it continues from the state instead of attending to cached keys.

    Args:
        d_model: size of the input and output vectors.
        num_heads: the heads.
        head_dim: the size ``d_k = d_v`` of each head; None is ``d_model // num_heads``.
        feature_map: ``phi``; None is ``elu(x) + 1``.
        device: where to create the parameters.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(B, T, d_model)`` -> ``(B, T, d_model)``; the state ``(B, H, head_dim, head_dim)``
        and its normaliser ``(B, H, head_dim)``.

    Returns:
        ``forward(x, mask=None, return_weights=False, *, kv_cache=None)`` returns the output,
        or ``(output, None)`` with ``return_weights=True`` (there are no attention weights).

    Taught in chapter 18.
    """

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 feature_map: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__(d_model, num_heads, head_dim, {"device": device, "dtype": dtype})
        self.feature_map = feature_map

    def _mix(self, x: torch.Tensor, state: RecurrentState | None) -> torch.Tensor:
        queries = self._heads(self.W_query(x))  # (B, H, T, head_dim)
        keys = self._heads(self.W_key(x))  # (B, H, T, head_dim)
        values = self._heads(self.W_value(x))  # (B, H, T, head_dim)
        if state is None:
            return linear_attention(queries, keys, values, feature_map=self.feature_map)
        previous = None if state.memory is None else (state.memory, state.normalizer)
        out, (memory, normalizer) = linear_attention_recurrent(
            queries, keys, values, feature_map=self.feature_map, initial_state=previous)
        state.advance(x.size(1), memory, normalizer)
        return out  # (B, H, T, head_dim)


class GatedDeltaNet(_RecurrentMixer):
    """Gated DeltaNet (Yang et al., 2025) as a token mixer; DeltaNet with ``gate=False``.

    Per head: queries and keys are projected and L2-normalised, values projected; the write
    strength ``beta = sigmoid(W_beta x)`` and, with the gate, the log-decay
    ``g = -exp(A_log) * softplus(W_gate x + dt_bias)`` (Mamba-2's parametrisation, so
    ``g <= 0``) are computed for each token; :func:`delta_rule` mixes, in its chunkwise form
    over a whole sequence and token by token when it continues a :class:`RecurrentState`.
    (Published layers add a short convolution before the heads and a gated norm after them;
    this one leaves both out.)

    Args:
        d_model: size of the input and output vectors.
        num_heads: the heads.
        head_dim: the size ``d_k = d_v`` of each head; None is ``d_model // num_heads``.
        gate: learn a decay (Gated DeltaNet); ``False`` gives DeltaNet.
        chunk_size: the chunk length of the chunkwise form.
        device: where to create the parameters.
        dtype: the parameters' floating dtype.

    Shapes:
        x ``(B, T, d_model)`` -> ``(B, T, d_model)``; the state ``(B, H, head_dim, head_dim)``.

    Returns:
        ``forward(x, mask=None, return_weights=False, *, kv_cache=None)`` returns the output,
        or ``(output, None)`` with ``return_weights=True`` (there are no attention weights).

    Taught in chapter 18.
    """

    def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
                 gate: bool = True, chunk_size: int = 64,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        factory = {"device": device, "dtype": dtype}
        super().__init__(d_model, num_heads, head_dim, factory)
        if not isinstance(gate, bool):
            raise TypeError(f"gate must be a bool, got {type(gate).__name__}")
        check_positive_int("chunk_size", chunk_size)
        self.gate, self.chunk_size = gate, chunk_size
        self.W_beta = nn.Linear(d_model, num_heads, **factory)
        if gate:
            self.W_gate = nn.Linear(d_model, num_heads, bias=False, **factory)  # dt_bias is its bias
            # A simplification of Mamba-2's start (which draws A from U[1, 16] and dt
            # log-uniformly from [0.001, 0.1], memories of about 0.6 to 1,000 tokens): decay
            # rates A = 1 and steps dt log-spaced from 0.1 down to 0.001 over the heads, so
            # that g = -A softplus(dt_bias) starts near -dt (memories of 10 to 1,000 tokens);
            # dt_bias = softplus^-1(dt).
            steps = torch.logspace(-1, -3, num_heads, **factory)
            self.A_log = nn.Parameter(torch.zeros(num_heads, **factory))
            self.dt_bias = nn.Parameter(steps + torch.log(-torch.expm1(-steps)))

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The write strength ``beta`` and the log-decay ``g`` of every head and token.

        Args:
            x: the layer's input.

        Shapes:
            x ``(B, T, d_model)`` -> beta and g ``(B, H, T)`` each.

        Returns:
            ``(beta, g)``, ``g`` None without the gate.
        """
        beta = torch.sigmoid(self.W_beta(x)).transpose(1, 2)  # (B, H, T)
        if not self.gate:
            return beta, None
        rate = F.softplus(self.W_gate(x) + self.dt_bias)  # (B, T, H)
        return beta, (-self.A_log.exp() * rate).transpose(1, 2)  # (B, H, T)

    def _mix(self, x: torch.Tensor, state: RecurrentState | None) -> torch.Tensor:
        queries = F.normalize(self._heads(self.W_query(x)), dim=-1)  # (B, H, T, head_dim)
        keys = F.normalize(self._heads(self.W_key(x)), dim=-1)  # (B, H, T, head_dim)
        values = self._heads(self.W_value(x))  # (B, H, T, head_dim)
        beta, decay = self.gates(x)  # (B, H, T) each
        if state is None:
            out, _ = delta_rule(queries, keys, values, beta, decay=decay,
                                chunk_size=self.chunk_size)
            return out  # (B, H, T, head_dim)
        chunk_size = self.chunk_size if x.size(1) > 1 else None
        out, memory = delta_rule(queries, keys, values, beta, decay=decay, chunk_size=chunk_size,
                                 initial_state=state.memory)
        state.advance(x.size(1), memory)
        return out  # (B, H, T, head_dim)


def recurrent_state_bytes(
    *,
    num_layers: int,
    batch_size: int,
    num_heads: int,
    key_dim: int,
    value_dim: int,
    bytes_per_element: int = 2,
) -> int:
    """Bytes the recurrent states of a model's linear-attention layers hold, at any length.

    Each layer keeps one ``key_dim x value_dim`` state per head and sequence:
    ``L * B * H * d_k * d_v`` numbers, whatever the number of tokens (compare
    :func:`~attention_book.kv_cache_bytes`, which grows with the context).

    Args:
        num_layers: recurrent layers ``L``.
        batch_size: sequences ``B``.
        num_heads: heads with a state of their own ``H`` (the value heads).
        key_dim: ``d_k``, the rows of each state.
        value_dim: ``d_v``, its columns.
        bytes_per_element: 2 for 16-bit numbers, 4 for float32.

    Shapes:
        (numbers only)

    Returns:
        The number of bytes, an int.

    Taught in chapter 18.
    """
    sizes = {"num_layers": num_layers, "batch_size": batch_size, "num_heads": num_heads,
             "key_dim": key_dim, "value_dim": value_dim, "bytes_per_element": bytes_per_element}
    for name, value in sizes.items():
        check_positive_int(name, value)
    return num_layers * batch_size * num_heads * key_dim * value_dim * bytes_per_element
