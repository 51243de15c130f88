"""What every kernel-free demo shares: input checks, the colours, and the page parts.

A demo is HTML: a ``<style>`` with the demo's CSS, the markup of its first rendering (computed
in Python), and a ``<script>`` that recomputes it in the browser. The CSS and JavaScript live
in real files next to this module (``assets/``, shipped as package data): ``demo.css`` and
``common.js`` for every demo, plus the demo's own ``.css``/``.js``. :func:`script` wraps them
in one function scope with the demo's element and its numbers (see ``assets/common.js``).
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Sequence
from importlib import resources

import torch

# Black text stays readable (contrast > 4.5) on every shade between white and
# this sky blue, one of the Okabe-Ito colour-blind-safe colours.
_CELL_RGB = (86, 180, 233)
# The headers of a weight drawn as a bar and written as a number. Never "value": in this
# book that word means V.
WEIGHT_HEADERS = '<th scope="col">weight as a bar</th><th scope="col">weight</th>'
# One line for a notebook whose scripts do not run (Jupyter does not run the stored scripts of a
# notebook it does not trust, e.g. one just opened): the script removes it as it starts.
RUN_HINT = ('<p class="ab-run-hint">Run this cell to bring the demo to life: until its script '
             "runs, the controls do nothing.</p>")


@functools.cache
def asset(name: str) -> str:
    """The text of ``assets/<name>``, a file shipped with the package."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def style(*names: str) -> str:
    """A ``<style>`` element holding the CSS files ``names`` (``demo.css`` first)."""
    return "<style>\n" + "".join(asset(name) for name in ("demo.css", *names)) + "</style>"


def script(element_id: str, data: dict, file: str, function: str) -> str:
    """The demo's ``<script>``: ``common.js`` and ``file`` in one scope, then ``function(root, data)``."""
    payload = json.dumps(data, sort_keys=True)
    return (
        '<script>\n(function () {\n  "use strict";\n'
        f"  const root = document.getElementById({json.dumps(element_id)});\n"
        "  if (!root) { return; }\n"
        f"  const data = {payload};\n"
        f"  const CELL_RGB = {json.dumps(list(_CELL_RGB))};\n"
        f"{asset('common.js')}{asset(file)}"
        f"  {function}(root, data);\n"
        "})();\n</script>"
    )


def as_float_tensor(name: str, values, dims: int) -> torch.Tensor:
    tensor = torch.as_tensor(values)
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must hold floating-point numbers, got dtype {tensor.dtype}")
    if tensor.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(tensor.shape)}")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite; mask positions with the demo's controls instead")
    # Round once, here, so the first rendering (Python) and every later one
    # (JavaScript) start from the very same numbers.
    return torch.round(tensor.detach().to(torch.float64).cpu(), decimals=6)


def check_tokens(tokens: Sequence[str], count: int, what: str) -> list[str]:
    tokens = [str(token) for token in tokens]
    if len(tokens) != count:
        raise ValueError(f"got {len(tokens)} tokens but {what} has {count} positions")
    return tokens


def cell_background(weight: float) -> str:
    red, green, blue = (round(255 + (c - 255) * weight) for c in _CELL_RGB)
    return f"rgb({red},{green},{blue})"


def bars_rows(element_id: str, tokens: list[str], weights: list[float]) -> str:
    rows = []
    for index, (token, weight) in enumerate(zip(tokens, weights, strict=True)):
        rows.append(
            f'<tr><th scope="row">{html.escape(token)}</th>'
            f'<td><div class="ab-bar-track"><div class="ab-bar" id="{element_id}-bar-{index}" '
            f'style="width:{100 * weight:.1f}%"></div></div></td>'
            f'<td id="{element_id}-w-{index}">{weight:.4f}</td></tr>'
        )
    return "".join(rows)


def entropy(weights: torch.Tensor) -> float:
    positive = weights[weights > 0]
    return float(-(positive * positive.log()).sum())
