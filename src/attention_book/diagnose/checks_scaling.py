"""Checks of how scores become weights: the softmax dim, the scale, rows that sum to 1.

``softmax_dim`` and ``scale`` read the fitted hypotheses of
:meth:`DiagnosisContext.fits`: the output is recomputed under each softmax dim
(and head split) at the scale that fits best, so a wrong scale cannot hide a
wrong dim and the other way round.
"""

from __future__ import annotations

import torch

from .context import DiagnosisContext
from .numerics import fmt, precise
from .registry import Failed, NotApplicable, register_check
from .subjects import UserError, module_sink_logit


@register_check(
    "softmax_dim",
    property="softmax taken over the keys (the last dim)",
    hint=(
        "normalise over the keys: softmax(scores, dim=-1), so that each query's "
        "weights sum to 1"
    ),
    order=300,
    needs=("returns_output", "dropout_eval"),
)
def check_softmax_dim(ctx: DiagnosisContext) -> str:
    fits = ctx.fits()
    if not fits:
        raise NotApplicable("the output matches no softmax of the scores at any scale")
    if any(h.dim == -1 for h, _ in fits):
        return "output matches a softmax over the keys (dim -1)"
    label = fits[0][0].label
    raise Failed(f"output matches {label}: weights are normalised over the wrong dim")


@register_check(
    "scale",
    property="scores scaled by 1/sqrt(head_dim)",
    hint=(
        "divide the scores by sqrt(head_dim), the size of one query vector "
        "(query.size(-1) after the head split)"
    ),
    order=500,
    needs=("returns_output", "dropout_eval", "softmax_dim", "head_mixing"),
)
def check_scale(ctx: DiagnosisContext) -> str:
    fits = [(h, s) for h, s in ctx.fits() if h.dim == -1 and h.split == "transpose"]
    if not fits:
        raise NotApplicable("the output matches no softmax over the keys at any scale")
    fitted = fits[0][1]
    expected, head_dim = ctx.expected_scale()
    implied = 1.0 / fitted**2
    shown = f"{implied:.0f}" if abs(implied - round(implied)) < 1e-2 * implied else fmt(implied)
    if abs(fitted / expected - 1.0) < ctx.tol.scale:
        return f"fitted scale {fmt(fitted)} = 1/sqrt({shown}); head_dim = {head_dim}"
    meaning = _name_size(ctx, implied, head_dim)
    raise Failed(
        f"fitted scale {fmt(fitted)} = 1/sqrt({shown}){meaning}; expected "
        f"1/sqrt(head_dim) = 1/sqrt({head_dim}) = {fmt(expected)}"
    )


def _name_size(ctx: DiagnosisContext, implied: float, head_dim: int) -> str:
    """What the size ``implied`` by a wrong scale probably is, in words."""
    names = {head_dim**2: "head_dim squared: divided by head_dim, not its sqrt"}
    if ctx.is_module:
        ref = ctx.reference()
        if ref.parts is None:
            names.setdefault(ref.d_out, "the model width d_out")
    else:
        q, k, _ = ctx.standard()[0]
        names.setdefault(k.numel(), f"the number of elements of key {tuple(k.shape)}")
        names.setdefault(k.shape[-2], "the number of keys")
    size = round(implied)
    if size in names:
        return f" ({size} = {names[size]})"
    # In low precision the fitted scale, and so the implied size, is only near the true one.
    near = [n for n in names if abs(n - implied) <= 2 * ctx.tol.scale * implied]
    if not near:
        return ""
    nearest = min(near, key=lambda n: abs(n - implied))
    return f" ({size} ~ {nearest} = {names[nearest]})"


def _rows_sum_to_one(weights: torch.Tensor, where: str, tol: float) -> str:
    sums = precise(weights).sum(dim=-1)  # (..., T_q)
    diff = (sums - 1.0).abs()
    if torch.isnan(diff).any() or diff.max().item() > tol:
        flat = torch.nan_to_num(diff, nan=float("inf")).flatten()
        worst = int(flat.argmax())
        value = sums.flatten()[worst].item()
        row = worst % sums.shape[-1]
        raise Failed(f"with {where}, weights row {row} sums to {fmt(value)}, not 1")
    return f"with {where}, every row of the weights {tuple(weights.shape)} sums to 1"


@register_check(
    "weights_sum",
    property="each row of the attention weights sums to 1",
    hint=(
        "mask by setting scores to -inf *before* the softmax; zeroing weights after "
        "it leaves rows that no longer sum to 1"
    ),
    order=1100,
    needs=(
        "returns_output", "dropout_eval", "softmax_dim", "mask_argument", "mask_polarity",
        "head_mixing",
    ),
)
def check_weights_sum(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    tol = ctx.tol
    if ctx.is_module:
        if module_sink_logit(s.module) is not None:
            raise NotApplicable("an attention sink takes part of each row's weight: "
                                "sink_denominator judges the rows")
        if not s.takes_return_weights:
            raise NotApplicable("the module returns no weights")
        try:
            _, weights = s.call(s.inputs(), return_weights=True)
        except UserError as error:
            raise NotApplicable(f"no weights: return_weights=True raised {error}") from None
        if weights is None:
            raise NotApplicable("the module returns no weights")
        return _rows_sum_to_one(weights, "no mask", tol.weights_sum)
    q, k, v = s.inputs()
    mask = None
    if s.takes_mask:
        mask = ctx.random_mask((q.shape[1], k.shape[1]), seed=3, keep=0.5)  # (T, T)
        mask[:, 0], mask[:, 1] = True, False  # no row fully masked or fully open
    out, weights = s.call(q, k, v, mask)
    where = "a random mask" if mask is not None else "no mask"
    if weights is not None:
        return _rows_sum_to_one(weights, where, tol.weights_sum)
    # Without weights: rows sum to 1 exactly when shifting every value by c
    # shifts every output by c.
    shift = torch.linspace(-1.0, 1.0, v.shape[-1], device=v.device, dtype=v.dtype)  # (d_v,)
    out2, _ = s.call(q, k, v + shift, mask)
    moved = (precise(out2) - precise(out)) / precise(shift)  # (B, T, d_v): each row's weight sum
    diff = (moved - 1.0).abs().max().item()
    if diff > tol.value_shift:
        raise Failed(
            f"with {where}, shifting every value by c shifts the output by "
            f"{fmt(moved.min().item())}*c to {fmt(moved.max().item())}*c, not c: "
            "the hidden weights do not sum to 1"
        )
    return f"with {where}: shifting every value by c shifts every output by c"
