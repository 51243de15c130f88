"""Checkers for chapter 1's exercises (context vectors and positions)."""

from __future__ import annotations

import torch

from ._feedback import call, checker, expect_close, expect_shape, passed

__all__ = ["check_average_so_far", "check_window_average", "check_offset_matrix"]


def _reference_average(x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Average of the last ``window`` tokens up to each position (all of them if None)."""
    num_tokens = x.shape[-2]
    window = num_tokens if window is None else window
    query_pos = torch.arange(num_tokens).unsqueeze(1)  # (T, 1)
    key_pos = torch.arange(num_tokens).unsqueeze(0)  # (1, T)
    visible = ((key_pos <= query_pos) & (key_pos > query_pos - window)).to(x.dtype)  # (T, T)
    weights = visible / visible.sum(dim=-1, keepdim=True)  # (T, T)
    return weights @ x  # (..., T, d)


def _reference_encoding(context_length: int, d_model: int) -> torch.Tensor:
    """The sinusoidal positional encoding of Vaswani et al. (2017), in float64."""
    positions = torch.arange(context_length, dtype=torch.float64).unsqueeze(1)  # (T, 1)
    pair_index = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model / 2,)
    angles = positions * 10000.0 ** (-pair_index / d_model)  # (T, d_model / 2)
    encoding = torch.zeros(context_length, d_model, dtype=torch.float64)  # (T, d_model)
    encoding[:, 0::2] = torch.sin(angles)
    encoding[:, 1::2] = torch.cos(angles)
    return encoding


@checker
def check_average_so_far(fn) -> None:
    """Check ``fn(x)`` returns the running average over tokens, for ``(..., T, d)`` input.

    Taught in chapter 1.
    """
    small = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 0.0]])  # (3, 2)
    expect_close(
        "the running average of the hand example", call(fn, small),
        torch.tensor([[1.0, 2.0], [2.0, 3.0], [3.0, 2.0]]),
        hint="token t averages tokens 0 ... t: divide the running sum at t by t + 1, not by T",
    )
    torch.manual_seed(0)
    x = torch.randn(7, 5)  # (T, d)
    expect_close(
        "the running average of a (7, 5) input", call(fn, x), _reference_average(x),
        hint="cumsum along the token dim (dim=-2), then divide row t by t + 1",
    )
    batch = torch.randn(2, 3, 6, 4)  # (B, H, T, d)
    expect_close(
        "the running average of a (2, 3, 6, 4) input", call(fn, batch), _reference_average(batch),
        hint="use dim=-2 for the tokens, so any leading batch dims are left alone",
    )
    passed("token t is the average of tokens 0 ... t, for any number of leading dims.")


@checker
def check_window_average(fn) -> None:
    """Check ``fn(x, window)`` averages the last ``window`` tokens up to each position.

    Taught in chapter 1.
    """
    torch.manual_seed(0)
    x = torch.randn(6, 3)  # (T, d)
    expect_close(
        "window=1 keeps every token's own vector", call(fn, x, 1), x,
        hint="with window=1, token t may look only at itself",
    )
    expect_close(
        "window=3 averages tokens t-2, t-1 and t", call(fn, x, 3), _reference_average(x, 3),
        hint="token t may look at key s when t - window < s <= t; never at a later token",
    )
    expect_close(
        "a window as long as the sequence gives the average so far", call(fn, x, 6),
        _reference_average(x),
        hint="at the start of the sequence the window holds fewer tokens: average only those",
    )
    expect_close(
        "a window longer than the sequence gives the average so far", call(fn, x, 10),
        _reference_average(x),
        hint="a window larger than T must not break anything",
    )
    passed("each token averages itself and the window - 1 tokens before it.")


@checker
def check_offset_matrix(fn) -> None:
    """Check ``fn(offset, d_model)`` maps the encoding of position p to that of p + offset.

    Taught in chapter 1.
    """
    d_model, offset = 8, 3
    matrix = call(fn, offset, d_model)
    expect_shape("the offset matrix", matrix, (d_model, d_model),
                 hint="return a square (d_model, d_model) matrix")
    encoding = _reference_encoding(40, d_model)  # (40, d_model)
    moved = encoding[:-offset] @ matrix.detach().to(torch.float64).T  # (40 - offset, d_model)
    expect_close(
        "M @ PE(p) equals PE(p + 3) for every position p", moved, encoding[offset:],
        hint="each 2x2 block rotates (sin a, cos a) into (sin(a + b), cos(a + b)); "
        "check the sign of the sin b entries",
        atol=1e-4, rtol=1e-4,
    )
    for offset, d_model in ((1, 4), (7, 16)):
        matrix = call(fn, offset, d_model)
        encoding = _reference_encoding(30, d_model)  # (30, d_model)
        moved = encoding[:-offset] @ matrix.detach().to(torch.float64).T
        expect_close(
            f"the matrix for offset={offset}, d_model={d_model}", moved, encoding[offset:],
            hint="the angle of pair i is offset * 10000 ** (-2i / d_model)",
            atol=1e-4, rtol=1e-4,
        )
    expect_close(
        "offset 0 gives the identity", call(fn, 0, 6).detach().to(torch.float64),
        torch.eye(6, dtype=torch.float64),
        hint="with offset 0 every rotation angle is 0", atol=1e-6,
    )
    passed("one fixed matrix moves every position forward by the offset: a rotation per pair.")
