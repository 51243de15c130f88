"""Checks of the heads of a multi-head module: how they are split and merged."""

from __future__ import annotations

from .context import DiagnosisContext
from .registry import Failed, NotApplicable, register_check


@register_check(
    "head_mixing",
    property="heads split with view + transpose, not a bare view",
    hint=(
        "split heads with x.view(B, T, num_heads, head_dim).transpose(1, 2); a bare "
        "view(B, num_heads, T, head_dim) mixes tokens and features"
    ),
    order=400,
    needs=("returns_output", "dropout_eval"),
)
def check_head_mixing(ctx: DiagnosisContext) -> str:
    if not ctx.is_module:
        raise NotApplicable("a function receives heads already split")
    ref = ctx.reference()
    if ref.parts is not None:
        raise NotApplicable("the heads are separate modules: nothing is split")
    if ref.num_heads < 2:
        raise NotApplicable("a single head: nothing to split")
    fits = ctx.fits()
    if not fits:
        raise NotApplicable("the output matches no recomputation, with either split")
    if any(h.split == "transpose" for h, _ in fits):
        return f"output matches heads split by view + transpose ({ref.num_heads} heads)"
    raise Failed(
        f"output matches heads split by a bare view(B, {ref.num_heads}, T, "
        f"{ref.head_dim}): each head sees a mix of several tokens' features"
    )
