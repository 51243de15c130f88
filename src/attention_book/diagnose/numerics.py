"""Tolerances per dtype, and the comparisons every check shares.

The probes are small (a few tokens, a few features) and their outputs are of
order 1, so one table of absolute tolerances per floating dtype separates
rounding from real differences. A measured difference is always computed in
the *precise* dtype (float64; float32 on devices without float64), so the
measurement itself adds no rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerances:
    """How large a difference must be, in one dtype, before a check calls it real.

    Attributes:
        atol: changes at or below this are rounding ("unchanged", "no effect", "agree").
        reference: largest difference from the reference recomputation (``matches_reference``).
        fit: largest residual, relative to ``1 + max|output|``, for an output to be
            "reproduced" by a hypothesis (softmax dim, head split) at its fitted scale.
        weights_sum: largest distance of a row of the weights from 1.
        value_shift: largest distance from 1 of "output shift / value shift"
            (``weights_sum`` for a function that returns no weights).
        scale: largest relative distance of the fitted scale from 1/sqrt(head_dim).
    """

    atol: float
    reference: float
    fit: float
    weights_sum: float
    value_shift: float
    scale: float


# float32 holds the values the checks were designed with (chapter 11 prints them); float64
# is tighter. float16 and bfloat16 round every intermediate result to 11 and 8 significant
# bits (eps 1e-3 and 8e-3); their values sit, on a log scale, between the rounding that
# healthy layers show and the smallest effect of a zoo bug (measured for the book's
# layers and the zoo, scaling each tolerance from 1/100 to 30 times). In bfloat16, for
# example, a healthy layer's fitted scale is off by up to 1.5% and the mildest scale
# bug (sqrt(d_out) for sqrt(head_dim), 2 heads) by 29%; "unchanged" outputs are bitwise
# unchanged while a real effect moves an output by 0.5 or more.
TOLERANCES: dict[torch.dtype, Tolerances] = {
    torch.float64: Tolerances(atol=1e-10, reference=1e-9, fit=1e-6, weights_sum=1e-9,
                              value_shift=1e-8, scale=1e-3),
    torch.float32: Tolerances(atol=1e-5, reference=1e-4, fit=1e-4, weights_sum=1e-4,
                              value_shift=1e-3, scale=1e-3),
    torch.float16: Tolerances(atol=5e-3, reference=1e-2, fit=2e-2, weights_sum=1e-2,
                              value_shift=5e-2, scale=2e-2),
    torch.bfloat16: Tolerances(atol=2e-2, reference=5e-2, fit=3e-2, weights_sum=5e-2,
                               value_shift=2e-1, scale=1e-1),
}


def tolerances_for(dtype: torch.dtype) -> Tolerances:
    """The tolerances of ``dtype``; ValueError for a dtype diagnose has none for."""
    if dtype not in TOLERANCES:
        names = ", ".join(str(d) for d in TOLERANCES)
        raise ValueError(f"diagnose checks the floating dtypes {names}; got {dtype}")
    return TOLERANCES[dtype]


def precise_dtype(device: torch.device) -> torch.dtype:
    """float64, the dtype of references and measurements, or float32 where there is none (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def precise(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, in the precise dtype of its device."""
    return tensor.detach().to(precise_dtype(tensor.device))


def fmt(x: float) -> str:
    """A number with 3 significant digits."""
    return f"{x:.3g}"


def fmt_tol(x: float) -> str:
    """A tolerance as ``1e-4``, ``5e-2``."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference; NaN anywhere counts as infinitely different."""
    diff = (precise(a) - precise(b)).abs()
    if torch.isnan(diff).any():
        return math.inf
    return diff.max().item() if diff.numel() else 0.0


def close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    """Same shape and no difference above ``atol``."""
    return a.shape == b.shape and max_diff(a, b) <= atol


def row_change(out: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Per-row largest change ``(T,)``; a NaN counts as a large change."""
    diff = (precise(out) - precise(base)).abs()  # (1, T, d)
    diff = torch.nan_to_num(diff, nan=1e9)
    both_nan = torch.isnan(out) & torch.isnan(base)
    diff = diff.masked_fill(both_nan, 0.0)
    return diff[0].amax(dim=-1)  # (T,)
