"""Checks of dropout: off in evaluation, on in training, and the expectation kept."""

from __future__ import annotations

import math

import torch

from .context import DiagnosisContext
from .numerics import max_diff, precise
from .registry import Failed, NotApplicable, register_check


@register_check(
    "dropout_eval",
    property="no randomness in eval mode (dropout off)",
    hint=(
        "apply dropout only in training: nn.Dropout follows module.eval(), but "
        "F.dropout(x, p) defaults to training=True; pass training=self.training"
    ),
    order=200,
    needs=("returns_output",),
)
def check_dropout_eval(ctx: DiagnosisContext) -> str:
    if not ctx.is_module:
        raise NotApplicable("a function has no train/eval mode")
    x = ctx.subject.inputs()
    first, _ = ctx.subject.call(x)
    second, _ = ctx.subject.call(x)
    if max_diff(first, second) > ctx.tol.atol:
        raise Failed(
            "in eval mode two calls on the same input give different outputs: "
            "something random (dropout) is still on"
        )
    return "two eval-mode calls on the same input agree exactly"


@register_check(
    "dropout_train",
    property="dropout active in training, expectation preserved",
    hint=(
        "apply dropout to the weights *after* the softmax (nn.Dropout rescales the "
        "survivors by 1/(1-p), which keeps the expectation)"
    ),
    order=1200,
    needs=("returns_output", "dropout_eval"),
)
def check_dropout_train(ctx: DiagnosisContext) -> str:
    if not ctx.is_module:
        raise NotApplicable("a function has no train/eval mode")
    s = ctx.subject
    if s.dropout_p == 0.0:
        raise NotApplicable("built without dropout (p = 0)")
    num_samples = 4000
    x = s.inputs(batch_size=1)  # (1, T, d_in)
    expected, _ = s.call(x)
    many = x.expand(num_samples, -1, -1).contiguous()  # (N, T, d_in)
    s.module.train()
    try:
        torch.manual_seed(0)  # seeds the subject's device too: its dropout draws from it
        samples, _ = s.call(many)  # (N, T, d_out)
    finally:
        s.module.eval()
    if not torch.isfinite(samples).all():
        raise Failed(f"p={s.dropout_p}: training calls return NaN or infinite outputs "
                     "(dropout before the softmax turns -inf scores into NaN)")
    spread = (samples - samples[:1]).abs().max().item()
    if spread <= ctx.tol.atol:
        raise Failed(f"p={s.dropout_p}, yet {num_samples} training calls all agree: "
                     "dropout is never applied")
    samples = precise(samples)
    mean = samples.mean(dim=0)  # (T, d_out)
    std_err = samples.std(dim=0) / math.sqrt(num_samples)
    z = ((mean - precise(expected[0])).abs() / (std_err + 1e-12)).max().item()
    if z > 6.0:
        raise Failed(
            f"p={s.dropout_p}: the mean of {num_samples} training outputs is more than "
            "6 standard errors away from the eval output: dropout changes the "
            "expected output"
        )
    return (f"p={s.dropout_p}: training outputs vary; their mean over {num_samples} "
            "calls matches the eval output")
