"""The temperature demo of chapter 4: ``softmax(scores / τ)`` as bars, under a slider for ``τ``."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from IPython.display import HTML

from ..attention import softmax
from ..checks import check_element_id
from .page import (
    RUN_HINT,
    WEIGHT_HEADERS,
    as_float_tensor,
    bars_rows,
    check_tokens,
    entropy,
    script,
    style,
)

__all__ = ["temperature_demo"]


def temperature_demo(
    scores,
    tokens: Sequence[str],
    *,
    element_id: str,
    title: str = "Softmax weights as the temperature changes",
    min_temperature: float = 0.1,
    max_temperature: float = 5.0,
    temperature: float = 1.0,
) -> HTML:
    """A slider for the temperature ``τ`` that redraws ``softmax(scores / τ)`` as bars.

    Dividing the scores by ``√d_k`` is the same as a temperature of ``√d_k``;
    a small temperature sharpens the weights onto one token, a large one
    flattens them towards the average.

    Args:
        scores: one query's attention scores.
        tokens: a label for each key.
        element_id: a fixed id, unique on the page.
        title: the caption above the demo.
        min_temperature: the slider's lowest value (> 0).
        max_temperature: the slider's highest value.
        temperature: the starting value.

    Shapes:
        scores ``(T,)``; ``len(tokens) == T``.

    Returns:
        An ``IPython.display.HTML`` with the demo.

    Taught in chapter 4.
    """
    check_element_id(element_id)
    scores = as_float_tensor("scores", scores, 1)
    tokens = check_tokens(tokens, scores.numel(), "scores")
    if not 0 < min_temperature <= temperature <= max_temperature:
        raise ValueError(
            "need 0 < min_temperature <= temperature <= max_temperature, got "
            f"{min_temperature}, {temperature}, {max_temperature}"
        )
    weights = softmax(scores / temperature)  # (T,)
    slider = f"{element_id}-slider"
    markup = (
        f'{style()}<div class="ab-demo" id="{element_id}" data-demo="temperature">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>{RUN_HINT}'
        f'<label for="{slider}">Temperature τ</label>'
        f'<input type="range" id="{slider}" min="{min_temperature}" max="{max_temperature}" '
        f'step="0.05" value="{temperature}"> '
        f'<output id="{element_id}-value" for="{slider}">{temperature:.2f}</output>'
        f'<div class="ab-demo-output" aria-live="polite"><table>'
        f'<caption>softmax(scores / τ) for each key</caption>'
        f'<thead><tr><th scope="col">key</th>{WEIGHT_HEADERS}</tr></thead><tbody>'
        f"{bars_rows(element_id, tokens, weights.tolist())}</tbody></table>"
        f'<p class="ab-note">Entropy of the weights: <span id="{element_id}-entropy">'
        f"{entropy(weights):.3f}</span> nats (the uniform maximum is "
        f"{math.log(len(tokens)):.3f}).</p></div></div>"
    )
    demo_script = script(element_id, {"scores": scores.tolist()}, "temperature.js", "temperatureDemo")
    return HTML(markup + demo_script)
