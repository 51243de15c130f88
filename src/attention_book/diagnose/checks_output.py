"""Checks of the output itself: what is returned, batches, lengths, and the reference.

``returns_output`` comes first (every other check reads the output);
``matches_reference`` is the catch-all, judged last and only when every other
check passed or did not apply.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import scaled_dot_product_attention
from .context import DiagnosisContext
from .numerics import close, fmt, fmt_tol, max_diff
from .registry import Failed, register_check
from .subjects import UserError, cpu_generator


def expect_shape(out, expected, what, prefix=False):
    """Raise :class:`Failed` unless ``out`` has shape ``expected`` (or starts with it)."""
    got = tuple(out.shape[: len(expected)]) if prefix else tuple(out.shape)
    if got != tuple(expected):
        shown = tuple(expected) + (("d_out",) if prefix else ())
        raise Failed(f"{what}: output shape {tuple(out.shape)}, expected {shown}")


@register_check(
    "returns_output",
    property="returns the attention output (not the values or the weights)",
    hint=(
        "return softmax(scores) @ value (and optionally the weights); not value, "
        "not the weights, not the projected values"
    ),
    order=100,
)
def check_returns_output(ctx: DiagnosisContext) -> str:
    inputs, out, weights = ctx.standard()
    s = ctx.subject
    if ctx.is_module:
        batch, num_tokens = inputs.shape[0], inputs.shape[1]
        if out.dim() != 3 or tuple(out.shape[:2]) != (batch, num_tokens):
            raise Failed(
                f"x of shape {tuple(inputs.shape)} gave an output of shape "
                f"{tuple(out.shape)}; expected ({batch}, {num_tokens}, d_out)"
            )
        d_out = getattr(s.module, "d_out", None)
        heads = getattr(s.module, "heads", None)
        if isinstance(heads, nn.ModuleList):
            d_out = None
        if isinstance(d_out, int) and out.shape[-1] != d_out:
            raise Failed(
                f"output shape {tuple(out.shape)}; expected ({batch}, {num_tokens}, {d_out})"
            )
        mixing = ctx.influence(num_tokens=num_tokens)
        off_diagonal = mixing.masked_fill(ctx.eye(num_tokens), 0.0)
        if off_diagonal.max().item() <= ctx.tol.atol:
            raise Failed(
                "each output row depends only on its own token (no token mixes with "
                "another): this is a per-token projection such as the values, "
                "not attention"
            )
        return f"output {tuple(out.shape)}; rows mix information from other tokens"
    q, k, v = inputs
    expected = (q.shape[0], q.shape[1], v.shape[-1])
    if tuple(out.shape) != expected:
        weights_shape = (q.shape[0], q.shape[1], k.shape[1])
        what = " (the shape of the weights)" if tuple(out.shape) == weights_shape else ""
        raise Failed(
            f"returned shape {tuple(out.shape)}{what}; expected {expected} = "
            "(B, T_q, d_v)"
        )
    q2 = q + 2.0 * ctx.randn(q.shape, cpu_generator(7))
    out2, _ = s.call(q2, k, v)
    if max_diff(out, out2) <= ctx.tol.atol:
        same_as_value = " and equals the value tensor" if close(out, v, ctx.tol.atol) else ""
        raise Failed(
            f"the output {tuple(out.shape)} does not change when the queries "
            f"change{same_as_value}: it is not attention"
        )
    return f"output {tuple(out.shape)} depends on the queries"


@register_check(
    "batch",
    property="batch size 1 and >1 agree; batch items stay independent",
    hint="keep the batch dim separate: never mix or squeeze it",
    order=1300,
    needs=("returns_output", "dropout_eval", "softmax_dim", "head_mixing", "scale"),
)
def check_batch(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    atol = ctx.tol.atol
    if ctx.is_module:
        x = s.inputs(batch_size=3)
        out, _ = s.call(x)
        singles = [s.call(x[b : b + 1])[0] for b in range(3)]
        x2 = x.clone()
        x2[0] += 1.0
        out2, _ = s.call(x2)
    else:
        q, k, v = s.inputs(batch_size=3)
        out, _ = s.call(q, k, v)
        singles = [s.call(q[b : b + 1], k[b : b + 1], v[b : b + 1])[0] for b in range(3)]
        v2 = v.clone()
        v2[0] += 1.0
        out2, _ = s.call(q, k, v2)
    for b, single in enumerate(singles):
        if single.shape[0] != 1 or single.shape[1:] != out.shape[1:]:
            raise Failed(
                f"batch size 1 gave shape {tuple(single.shape)}; batch size 3 gave "
                f"{tuple(out.shape)}"
            )
        diff = max_diff(single[0], out[b])
        if diff > atol:
            raise Failed(
                f"item {b} alone (B=1) and in a batch (B=3) differ by {fmt(diff)}"
            )
    leak = max_diff(out2[1:], out[1:])
    if leak > atol:
        raise Failed(f"changing batch item 0 moves items 1-2 by {fmt(leak)}")
    return "B=1 and B=3 agree; changing item 0 leaves items 1-2 unchanged"


@register_check(
    "lengths",
    property="short inputs work; a clear error past context_length",
    hint=(
        "slice the mask buffer to the input length (mask[:T, :T]), build it with "
        "context_length, and raise ValueError naming T and context_length past it"
    ),
    order=1400,
    needs=("returns_output", "dropout_eval"),
)
def check_lengths(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if not ctx.is_module:
        q, k, v = s.inputs(num_queries=1)
        out, _ = s.call(q, k, v)
        expect_shape(out, (q.shape[0], 1, v.shape[-1]), "T=1")
        q, k, v = s.inputs(num_queries=3, num_keys=7)
        out, _ = s.call(q, k, v)
        expect_shape(out, (q.shape[0], 3, v.shape[-1]), "T_q=3, T_k=7")
        return "works for T=1 and for 3 queries over 7 keys"
    context_length = s.context_length
    lengths = [1, context_length] if context_length else [1, 2 * s.num_tokens]
    for num_tokens in lengths:
        x = s.inputs(num_tokens=num_tokens)
        try:
            out, _ = s.call(x)
        except UserError as error:
            raise Failed(f"T={num_tokens} (context_length={context_length}) raised "
                         f"{error}") from None
        expect_shape(out, (x.shape[0], num_tokens), f"T={num_tokens}", prefix=True)
        if not torch.isfinite(out).all():
            raise Failed(f"T={num_tokens}: NaN/inf in the output")
    if not context_length:
        return f"works for T={lengths[0]} and T={lengths[1]} (no context_length)"
    too_long = context_length + 1
    try:
        s.call(s.inputs(num_tokens=too_long))
    except UserError as error:
        message = str(error)
        if str(context_length) not in message.split(":", 1)[-1]:
            raise Failed(
                f"T={too_long} > context_length={context_length} raised an error that "
                f"does not name context_length: {message}"
            ) from None
        return (f"works for T=1 and T={context_length}; T={too_long} raises "
                f"{message.split(':', 1)[0]} naming context_length={context_length}")
    raise Failed(f"T={too_long} > context_length={context_length} ran without an error")


@register_check(
    "matches_reference",
    property="output equals a reference recomputation",
    hint="compare your code line by line with attention_book.scaled_dot_product_attention",
    order=9000,
    catch_all=True,
)
def check_matches_reference(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if ctx.is_module:
        ref = ctx.reference()
        x = s.inputs()
        out, _ = s.call(x)
        expected = ref.outputs(x, ctx.scales(ctx.expected_scale()[0]))[0]
        where = "the causal mask" if s.causal else "no mask"
    else:
        q, k, v = s.inputs()
        mask = None
        if s.takes_mask:
            mask = ctx.random_mask((q.shape[0], q.shape[1], k.shape[1]), seed=4, keep=0.6)
            mask[..., 0] = True  # (B, T, T), no row fully masked
        out, _ = s.call(q, k, v, mask)
        expected, _ = scaled_dot_product_attention(
            q.to(ctx.precise), k.to(ctx.precise), v.to(ctx.precise), mask
        )
        where = "a random mask" if mask is not None else "no mask"
    if out.shape != expected.shape:
        raise Failed(f"shape {tuple(out.shape)}; the reference has {tuple(expected.shape)}")
    diff = max_diff(out, expected)
    tol = ctx.tol.reference
    if diff > tol:
        raise Failed(f"with {where}, differs from the reference by up to {fmt(diff)}")
    return f"with {where}, agrees with the reference (max error < {fmt_tol(tol)})"
