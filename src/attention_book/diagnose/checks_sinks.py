"""Checks of attention sinks: the sink is one more term in the softmax's denominator.

A sink (chapter 13) is a score with no key and no value: ``exp(sink_logit)`` joins
the sum of exponentials, so each query's weights sum to
``1 - exp(sink) / (exp(sink) + sum_j exp(s_j))``, that is
``sigmoid(logsumexp(scores) - sink)``. That share depends on the query's scores: a
query whose keys all score low leaves more of its weight to the sink. Two known
mistakes break it while every other property still holds: a sink applied as a
sigmoid gate (every weight multiplied by the same ``sigmoid(-sink)``, whatever the
scores) and a sink that the weights are renormalised away from (rows sum to 1
again). The probe reads each row's total weight, from the returned weights or, for
a function that returns none, by shifting every value by ``c`` (the output moves by
the row's total times ``c``), and compares it with ``sigmoid(logsumexp - sink)``.

A function takes part when it has a ``sink_logit`` parameter (the probe passes one);
a module when it has a learned ``sink_logit`` (one per head).
"""

from __future__ import annotations

import inspect
import math

import torch

from ..attention import softmax_with_sink
from .context import DiagnosisContext
from .numerics import fmt, fmt_tol, max_diff, precise
from .registry import Failed, NotApplicable, register_check
from .subjects import UserError, describe_error, module_sink_logit, unpack

#: The sink logit the probe passes to a function.
PROBE_SINK = 0.8


def _takes_sink(fn) -> bool:
    try:
        return "sink_logit" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call_with_sink(fn, q, k, v, sink):
    try:
        return unpack(fn(q, k, v, sink_logit=sink))
    except Failed:
        raise
    except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
        raise UserError(f"{describe_error(error)} (called with sink_logit)") from None


def _judge(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> str:
    """Compare each query's total weight with ``sigmoid(logsumexp - sink)``; the evidence."""
    low, high = expected.min().item(), expected.max().item()
    wanted = f"{fmt(low)} to {fmt(high)}, sigmoid(logsumexp(scores) - sink)"
    diff = (actual - expected).abs()
    if not torch.isnan(diff).any() and diff.max().item() <= tol:
        return (f"{what}: each query's weights sum to {wanted}, as one more term in the "
                f"denominator gives (within {fmt_tol(tol)})")
    got_low, got_high = actual.min().item(), actual.max().item()
    if (actual - 1.0).abs().max().item() <= tol:
        raise Failed(
            f"{what}: the weights still sum to 1, so the sink takes no share (it is ignored, "
            f"or the weights are renormalised after it); expected {wanted}"
        )
    # Within one head (or one sequence of a function), across its queries.
    spread = (actual.amax(dim=-1) - actual.amin(dim=-1)).max().item()
    expected_spread = (expected.amax(dim=-1) - expected.amin(dim=-1)).max().item()
    if spread <= tol and expected_spread > 10 * tol:
        same = (f"every query's weights sum to {fmt(got_low)}" if got_high - got_low <= tol else
                f"the queries of each head all give their weights one total ({fmt(got_low)} "
                f"to {fmt(got_high)} across the heads)")
        raise Failed(
            f"{what}: {same}, whatever its scores; expected {wanted}: the sink scales every "
            "weight by one fixed factor (a sigmoid gate) instead of competing with the scores "
            "in the denominator"
        )
    raise Failed(f"{what}: the queries' weights sum to {fmt(got_low)} to {fmt(got_high)}; "
                 f"expected {wanted}")


@register_check(
    "sink_denominator",
    property="an attention sink is one more term in the softmax's denominator",
    hint=(
        "add exp(sink_logit) to each row's sum of exponentials, as a score with no value: "
        "weights = exp(s - m) / (exp(sink - m) + sum exp(s - m)) with m the larger of the "
        "row's max and the sink (attention_book.softmax_with_sink); not a sigmoid gate on "
        "the weights, and no renormalisation after it"
    ),
    order=1600,
    needs=("returns_output", "dropout_eval", "softmax_dim", "head_mixing", "scale"),
)
def check_sink_denominator(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if ctx.is_module:
        return _check_module(ctx)
    if not _takes_sink(s.fn):
        raise NotApplicable("takes no sink_logit argument: no attention sink")
    q, k, v = s.inputs(seed=5)  # (B, T, head_dim) each
    sink = torch.tensor(PROBE_SINK, dtype=ctx.dtype, device=ctx.device)
    out, weights = _call_with_sink(s.fn, q, k, v, sink)
    scores = precise(q) @ precise(k).transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, T, T)
    expected = torch.sigmoid(torch.logsumexp(scores, dim=-1) - PROBE_SINK)  # (B, T)
    what = f"sink_logit={PROBE_SINK}"
    if weights is not None:
        evidence = _judge(precise(weights).sum(dim=-1), expected, ctx.tol.weights_sum, what)
    else:
        # Shifting every value by c shifts output row i by (total weight of row i) * c.
        shift = torch.linspace(-1.0, 1.0, v.shape[-1], device=v.device, dtype=v.dtype)  # (d_v,)
        shifted, _ = _call_with_sink(s.fn, q, k, v + shift, sink)
        moved = (precise(shifted) - precise(out)) / precise(shift)  # (B, T, d_v)
        evidence = _judge(moved.mean(dim=-1), expected, ctx.tol.value_shift, what)
    reference = softmax_with_sink(scores, PROBE_SINK) @ precise(v)  # (B, T, d_v)
    diff = max_diff(out, reference)
    if diff > ctx.tol.reference:
        raise Failed(f"{what}: the rows' totals are right, but the output differs from "
                     f"softmax_with_sink(scores) @ value by {fmt(diff)}")
    return evidence


def _check_module(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if module_sink_logit(s.module) is None:
        raise NotApplicable("no attention sink (the layer has no sink_logit)")
    reference = ctx.reference()
    scale, _ = ctx.expected_scale()
    x = s.inputs()  # (B, T, d_in)
    expected_weights = reference.weights(x, scale)  # (B, num_heads, T, T)
    weights = None
    if s.takes_return_weights:
        try:
            _, weights = s.call(x, return_weights=True)
        except UserError:
            weights = None  # e.g. a fused backend that returns no weights
    what = "with the layer's sink_logit"
    if weights is not None:
        return _judge(precise(weights).sum(dim=-1), expected_weights.sum(dim=-1),
                      ctx.tol.weights_sum, what)
    out, _ = s.call(x)
    expected = reference.outputs(x, ctx.scales(scale))[0]  # (B, T, d_out)
    diff = max_diff(out, expected)
    if diff > ctx.tol.reference:
        raise Failed(f"{what} (no weights returned): the output differs from attention with "
                     f"the sink in the denominator by {fmt(diff)}")
    return (f"{what} (no weights returned): the output equals attention with the sink in "
            f"the denominator (within {fmt_tol(ctx.tol.reference)})")
