"""Checks of masking and causality: the mask argument, its polarity, padding, empty rows, the future.

Every mask probe is built on the subject's device. The probes are chosen so
that a wrong scale cannot hide them: they measure whether a token moves an
output at all (:meth:`DiagnosisContext.influence`), not by how much.
"""

from __future__ import annotations

import torch

from .context import DiagnosisContext
from .numerics import fmt, max_diff
from .registry import Failed, NotApplicable, register_check


def _probe_masks(ctx: DiagnosisContext, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two opposite ``(T, T)`` masks: only key 0 allowed, and every key but 0."""
    only_first = ctx.full_mask((num_tokens, num_tokens), False)  # (T, T)
    only_first[:, 0] = True
    return only_first, ~only_first


@register_check(
    "mask_argument",
    property="the output follows the mask that is passed",
    hint=(
        "use the mask passed as an argument; a mask taken from an outer variable "
        "only works for the example it was built for"
    ),
    order=600,
    needs=("returns_output", "dropout_eval"),
)
def check_mask_argument(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if not s.takes_mask:
        raise NotApplicable("takes no mask argument")
    only_first, all_but_first = _probe_masks(ctx, s.num_tokens)
    if ctx.is_module:
        x = s.inputs(batch_size=1)
        out_a, _ = s.call(x, only_first)
        out_b, _ = s.call(x, all_but_first)
    else:
        q, k, v = s.inputs(batch_size=1)
        out_a, _ = s.call(q, k, v, only_first)
        out_b, _ = s.call(q, k, v, all_but_first)
    rows = slice(1, None)  # row 0 is fully masked by a causal layer under the second mask
    if max_diff(out_a[:, rows], out_b[:, rows]) <= ctx.tol.atol:
        raise Failed(
            "two opposite masks (only key 0 allowed / all but key 0 allowed) give the "
            "same output: the mask argument is not used"
        )
    return "opposite masks give different outputs"


@register_check(
    "mask_polarity",
    property="mask True means 'may attend'",
    hint=(
        "True must mean 'may attend': scores.masked_fill(~mask, float('-inf')); for "
        "a causal mask use torch.tril (allowed) and fill where it is False"
    ),
    order=700,
    needs=("returns_output", "dropout_eval", "mask_argument", "head_mixing"),
)
def check_mask_polarity(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    atol = ctx.tol.atol
    messages = []
    if s.takes_mask:
        only_first, all_but_first = _probe_masks(ctx, s.num_tokens)
        rows = slice(1, None)  # for a module, token 0 also moves its own row
        effect_a = ctx.influence(only_first)[rows, 0].max().item()
        effect_b = ctx.influence(all_but_first)[rows, 0].max().item()
        if effect_a <= atol and effect_b > atol:
            raise Failed(
                "key 0 has no effect when the mask allows only key 0 and moves the "
                f"output by {fmt(effect_b)} when the mask blocks it: True is treated "
                "as 'blocked'"
            )
        messages.append("key 0 counts only when the mask allows it")
    if ctx.is_module and s.causal:
        effect = ctx.influence()  # (T, T)
        first_on_later = effect[1:, 0].max().item()
        last_on_earlier = effect[:-1, -1].max().item()
        if first_on_later <= atol and last_on_earlier > atol:
            raise Failed(
                "token 0 affects no later output while the last token moves earlier "
                f"outputs by {fmt(last_on_earlier)}: the causal mask is inverted "
                "(each token sees only the future)"
            )
        messages.append("the causal mask hides the future, not the past")
    if not messages:
        raise NotApplicable("takes no mask argument and is not causal")
    return "; ".join(messages)


@register_check(
    "padding",
    property="masked (padding) tokens get exactly zero weight",
    hint=(
        "fill masked scores with float('-inf') *before* the softmax; 0 is an "
        "ordinary score and still gets weight"
    ),
    order=800,
    needs=("returns_output", "dropout_eval", "mask_argument", "mask_polarity", "head_mixing"),
)
def check_padding(ctx: DiagnosisContext) -> str:
    if not ctx.subject.takes_mask:
        raise NotApplicable("takes no mask argument")
    num_tokens = ctx.subject.num_tokens
    keep = ctx.full_mask((1, num_tokens), True)  # (1, T): padding-style key mask
    keep[:, -2:] = False
    # A function's padding is judged by the values alone: a key that is zeroed
    # after the softmax still shifts the other weights, but gets no weight itself.
    effect = ctx.influence(keep, values_only=not ctx.is_module)  # (T, T)
    if ctx.is_module:
        effect = effect.masked_fill(ctx.eye(num_tokens), 0.0)
    leak = effect[:, -2:]
    if leak.max().item() > ctx.tol.atol:
        row = int(leak.max(dim=1).values.argmax())
        raise Failed(
            f"padding tokens {num_tokens - 2} and {num_tokens - 1} are masked but move "
            f"output row {row} by {fmt(leak.max().item())}: they still get weight"
        )
    return f"the 2 masked padding tokens of {num_tokens} move no other output"


@register_check(
    "fully_masked_rows",
    property="a fully masked row gives no NaN",
    hint=(
        "a row of only -inf makes torch.softmax return NaN: use a softmax that returns "
        "zeros there (attention_book.softmax) or replace NaN rows with 0"
    ),
    order=900,
    needs=("returns_output", "dropout_eval", "mask_argument", "mask_polarity"),
)
def check_fully_masked_rows(ctx: DiagnosisContext) -> str:
    s = ctx.subject
    if not s.takes_mask:
        raise NotApplicable("takes no mask argument")
    num_tokens = s.num_tokens
    mask = ctx.full_mask((num_tokens, num_tokens), True)  # (T, T)
    mask[2] = False
    if ctx.is_module:
        out, _ = s.call(s.inputs(), mask)
    else:
        out, _ = s.call(*s.inputs(), mask)
    bad = ~torch.isfinite(out)
    if bad.any():
        rows = sorted({int(i) for i in bad.nonzero()[:, -2]})
        raise Failed(f"query row 2 fully masked: NaN/inf in output rows {rows}")
    return "query row 2 fully masked: the output stays finite"


@register_check(
    "causality",
    property="changing token j leaves the outputs before j unchanged",
    hint=(
        "mask every key j > i for query i before the softmax, with -inf, using a mask "
        "sliced to the current length"
    ),
    order=1000,
    needs=("returns_output", "dropout_eval", "mask_polarity", "head_mixing"),
)
def check_causality(ctx: DiagnosisContext) -> str:
    if not (ctx.is_module and ctx.subject.causal):
        what = "a function is causal only through the mask it is given" if not ctx.is_module \
            else "a non-causal module"
        raise NotApplicable(what)
    effect = ctx.influence()  # (T, T)
    future = torch.triu(torch.ones_like(effect, dtype=torch.bool), diagonal=1)
    leak = effect.masked_fill(~future, 0.0)
    if leak.max().item() > ctx.tol.atol:
        i, j = divmod(int(leak.argmax()), leak.shape[1])
        raise Failed(
            f"changing token {j} moves the output at position {i} by "
            f"{fmt(leak.max().item())}: the future leaks into the past"
        )
    return f"changing token j leaves outputs 0..j-1 unchanged (T={effect.shape[0]})"
