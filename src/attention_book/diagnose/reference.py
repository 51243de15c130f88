"""References: the book's attention recomputed under hypotheses (scale, softmax dim, head split).

A :class:`Hypothesis` is one way to compute attention, as a function of the
scale; :func:`fit` finds, for each hypothesis, the scale that brings it closest
to an output and keeps the hypotheses that reproduce it. For a module,
:class:`ModuleReference` recomputes the output from the module's own
``W_query``/``W_key``/``W_value`` weights (and, for a layer built with
``rope=True``, rotates the queries and keys as it does; a layer with a learned
``sink_logit`` gets the sink in every softmax; a layer with a ``W_down_kv``
projects its keys and values up from that latent, chapter 14). Every reference is computed on the
subject's device in the precise dtype (float64), so that a comparison measures
the subject's error, not the reference's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..attention import causal_mask, softmax, softmax_with_sink
from ..positions import rotary_embedding
from .numerics import max_diff, precise, precise_dtype
from .outcomes import NotApplicable


def attention_weights(q, k, allowed, scales, dim: int, sink_logit=None):
    """Weights for several scales at once: ``(S, ..., T_q, T_k)``, with a sink when given."""
    scores = q @ k.transpose(-2, -1)  # (..., T_q, T_k)
    scores = scores.unsqueeze(0) * scales.view(-1, *([1] * scores.dim()))  # (S, ..., T_q, T_k)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    dim = dim if dim >= 0 else scores.dim() + dim
    if dim == 0:  # the batch dim of the inputs sits after the scales dim
        dim = 1
    if sink_logit is None:
        return softmax(scores, dim=dim)  # (S, ..., T_q, T_k)
    return softmax_with_sink(scores, sink_logit, dim=dim)  # (S, ..., T_q, T_k)


def attend(q, k, v, allowed, scales, dim: int, sink_logit=None):
    """Attention for several scales at once: returns ``(S, ..., T_q, d_v)``."""
    return attention_weights(q, k, allowed, scales, dim, sink_logit) @ v  # (S, ..., T_q, d_v)


class Hypothesis:
    """A way to compute attention: ``outputs(scales) -> (S, *output shape)``."""

    def __init__(self, label: str, outputs: Callable, split: str, dim: int):
        self.label = label
        self.outputs = outputs
        self.split = split
        self.dim = dim


def fit_scale(hypothesis: Hypothesis, target: torch.Tensor) -> tuple[float, float]:
    """The scale that makes ``hypothesis`` closest to ``target`` and the residual there."""
    target = precise(target)
    dtype, device = target.dtype, target.device
    low, high = math.log(1e-4), math.log(1e2)
    best = 0.0
    for _ in range(4):
        log_scales = torch.linspace(low, high, 161, dtype=dtype, device=device)
        outs = hypothesis.outputs(log_scales.exp())
        resid = (outs - target).abs().flatten(1).amax(dim=1)
        resid = torch.nan_to_num(resid, nan=math.inf)
        i = int(resid.argmin())
        best = log_scales[i].item()
        step = (high - low) / 160
        low, high = best - step, best + step
    final = hypothesis.outputs(torch.tensor([math.exp(best)], dtype=dtype, device=device))
    return math.exp(best), max_diff(final[0], target)


def fit(hypotheses: list[Hypothesis], target: torch.Tensor,
        rel_tol: float) -> list[tuple[Hypothesis, float]]:
    """The hypotheses that reproduce ``target`` at some scale, with that scale.

    A hypothesis reproduces ``target`` when its residual at the fitted scale is at
    most ``rel_tol * (1 + max|target|)``.
    """
    fitting = []
    tol = rel_tol * (1.0 + target.detach().abs().max().item())
    for hypothesis in hypotheses:
        scale, resid = fit_scale(hypothesis, target)
        if resid <= tol:
            fitting.append((hypothesis, scale))
    return fitting


def function_hypotheses(q, k, v) -> list[Hypothesis]:
    """Softmax over the keys, the queries or the batch, for a function's inputs."""
    qd, kd, vd = precise(q), precise(k), precise(v)
    dims = {-1: "the keys (dim -1)", -2: "the queries (dim -2)", 0: "the batch (dim 0)"}
    return [
        Hypothesis(f"softmax over {label}", lambda s, d=d: attend(qd, kd, vd, None, s, d),
                   "transpose", d)
        for d, label in dims.items()
    ]


class ModuleReference:
    """Recomputes a book-style module from its ``W_query``/``W_key``/``W_value``.

    Supports single-head modules, multi-head modules with ``num_heads`` (and
    ``num_kv_heads``, ``out_proj``, ``rope``, ``rope_base``, a learned ``sink_logit``
    per head and a latent down-projection ``W_down_kv``), and wrappers holding a
    ``heads`` list.
    """

    def __init__(self, module: nn.Module, causal: bool):
        self.causal = causal
        heads = getattr(module, "heads", None)
        if isinstance(heads, nn.ModuleList) and len(heads) > 0:
            self.parts = [ModuleReference(head, causal) for head in heads]
            self.num_heads = len(self.parts)
            self.head_dim = self.parts[0].head_dim
            return
        self.parts = None
        for name in ("W_query", "W_key", "W_value"):
            if not isinstance(getattr(module, name, None), nn.Linear):
                raise NotApplicable(
                    f"cannot recompute a reference: {type(module).__name__} has no nn.Linear "
                    "W_query, W_key and W_value (the book's names)"
                )
        self.module = module
        self.num_heads = int(getattr(module, "num_heads", 1))
        self.num_kv_heads = int(getattr(module, "num_kv_heads", self.num_heads))
        self.d_out = module.W_query.out_features
        self.head_dim = int(getattr(module, "head_dim", self.d_out // self.num_heads))
        out_proj = getattr(module, "out_proj", None)
        self.out_proj = out_proj if isinstance(out_proj, nn.Linear) else None
        # A layer that declares rope=True rotates its queries and keys by position (chapter 12).
        self.rope = getattr(module, "rope", False) is True
        self.rope_base = float(getattr(module, "rope_base", 10000.0))
        # A learned sink per head joins every softmax's denominator (chapter 13).
        sink = getattr(module, "sink_logit", None)
        self.sink_logit = sink if isinstance(sink, torch.Tensor) else None
        # Multi-head latent attention: keys and values are projected up from a latent.
        down = getattr(module, "W_down_kv", None)
        self.down_kv = down if isinstance(down, nn.Linear) else None

    @torch.no_grad()
    def project(self, x, split="transpose", mask=None):
        """The heads' queries, keys and values, the allowed mask and the sink, in float64.

        Returns ``(q, k, v, allowed, sink)``: ``q``, ``k``, ``v`` ``(B, num_heads, T, head_dim)``
        (key/value heads repeated for their groups), ``allowed`` ``(T, T)`` or None and
        ``sink`` ``(num_heads,)`` or None.
        """
        m = self.module
        dtype = precise_dtype(x.device)
        xd = x.to(dtype)
        batch, num_tokens = x.shape[0], x.shape[1]

        def linear_of(linear, inputs):
            weight = linear.weight.to(dtype)
            bias = None if linear.bias is None else linear.bias.to(dtype)
            return nn.functional.linear(inputs, weight, bias)

        # Keys and values come from the input, or from its latent (multi-head latent attention).
        source = xd if self.down_kv is None else linear_of(self.down_kv, xd)  # (B, T, d_in or latent)

        def heads_of(linear, heads, inputs):
            y = linear_of(linear, inputs)  # (B, T, heads * head_dim)
            if split == "view":
                return y.reshape(batch, heads, num_tokens, self.head_dim)  # (B, heads, T, head_dim)
            y = y.view(batch, num_tokens, heads, self.head_dim)  # (B, T, heads, head_dim)
            return y.transpose(1, 2)  # (B, heads, T, head_dim)

        q = heads_of(m.W_query, self.num_heads, xd)  # (B, num_heads, T, head_dim)
        k = heads_of(m.W_key, self.num_kv_heads, source)  # (B, num_kv_heads, T, head_dim)
        v = heads_of(m.W_value, self.num_kv_heads, source)  # (B, num_kv_heads, T, head_dim)
        if self.rope:
            q = rotary_embedding(q, base=self.rope_base)  # (B, num_heads, T, head_dim)
            k = rotary_embedding(k, base=self.rope_base)  # (B, num_kv_heads, T, head_dim)
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, num_heads, T, head_dim)
            v = v.repeat_interleave(group, dim=1)  # (B, num_heads, T, head_dim)
        allowed = causal_mask(num_tokens, device=x.device) if self.causal else None  # (T, T)
        if mask is not None:
            allowed = mask if allowed is None else allowed & mask
        sink = None if self.sink_logit is None else self.sink_logit.detach().to(dtype)  # (num_heads,)
        return q, k, v, allowed, sink

    @torch.no_grad()
    def weights(self, x, scale: float) -> torch.Tensor:
        """The weights ``(B, num_heads, T, T)`` of a multi-head module at ``scale``, sink included."""
        q, k, _, allowed, sink = self.project(x)
        scales = torch.tensor([scale], dtype=q.dtype, device=q.device)
        return attention_weights(q, k, allowed, scales, -1, sink)[0]  # (B, num_heads, T, T)

    @torch.no_grad()
    def outputs(self, x, scales, dim=-1, split="transpose", mask=None):
        """Output ``(S, B, T, d_out)`` for each scale in ``scales``."""
        if self.parts is not None:
            outs = [part.outputs(x, scales, dim, split, mask) for part in self.parts]
            return torch.cat(outs, dim=-1)  # (S, B, T, num_heads * d_out)
        batch, num_tokens = x.shape[0], x.shape[1]
        q, k, v, allowed, sink = self.project(x, split, mask)
        context = attend(q, k, v, allowed, scales, dim, sink)  # (S, B, num_heads, T, head_dim)
        if split == "view":
            context = context.reshape(len(scales), batch, num_tokens, -1)  # (S, B, T, d_out)
        else:
            context = context.transpose(2, 3)  # (S, B, T, num_heads, head_dim)
            context = context.reshape(len(scales), batch, num_tokens, -1)  # (S, B, T, d_out)
        if self.out_proj is not None:
            weight = self.out_proj.weight.to(context.dtype)
            bias = None if self.out_proj.bias is None else self.out_proj.bias.to(context.dtype)
            context = nn.functional.linear(context, weight, bias)  # (S, B, T, d_out)
        return context

    def hypotheses(self, x) -> list[Hypothesis]:
        """Softmax over the keys or the queries, heads split by transpose or (multi-head) view."""
        splits = ["transpose", "view"] if self.num_heads > 1 else ["transpose"]
        dims = {-1: "the keys (dim -1)", -2: "the queries (dim -2)"}
        return [
            Hypothesis(
                f"softmax over {label}, heads split by {split}",
                lambda s, d=d, sp=split: self.outputs(x, s, d, sp),
                split,
                d,
            )
            for split in splits
            for d, label in dims.items()
        ]
