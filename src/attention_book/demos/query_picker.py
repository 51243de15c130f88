"""The query picker of chapter 2: choose a query token, see its scores, weights and context vector."""

from __future__ import annotations

import html
from collections.abc import Sequence

from IPython.display import HTML

from ..attention import softmax
from ..checks import check_element_id
from .page import RUN_HINT, WEIGHT_HEADERS, as_float_tensor, check_tokens, script, style

__all__ = ["query_picker_demo"]


def query_picker_demo(
    inputs,
    tokens: Sequence[str],
    *,
    element_id: str,
    title: str = "Pick a query token",
    query_index: int = 0,
) -> HTML:
    """Pick a query token and see its dot-product scores, weights and context vector.

    Computes, for the chosen query ``x_q``, the scores ``x_q · x_k`` for every
    key, the weights ``softmax(scores)`` and the context vector ``Σ_k w_k x_k``
    (plain dot-product attention, with no trainable weights and no scaling).

    Args:
        inputs: one embedding per token.
        tokens: one label per token.
        element_id: a fixed id, unique on the page.
        title: the caption above the demo.
        query_index: the query shown first.

    Shapes:
        inputs ``(T, d)``; ``len(tokens) == T``.

    Returns:
        An ``IPython.display.HTML`` with the demo.

    Taught in chapter 2.
    """
    check_element_id(element_id)
    inputs = as_float_tensor("inputs", inputs, 2)
    num_tokens = inputs.size(0)
    tokens = check_tokens(tokens, num_tokens, "inputs")
    if not 0 <= query_index < num_tokens:
        raise ValueError(f"query_index must lie in [0, {num_tokens}), got {query_index}")
    scores = inputs @ inputs[query_index]  # (T,)
    weights = softmax(scores)  # (T,)
    context_vec = weights @ inputs  # (d,)

    score_rows = "".join(
        f'<tr><th scope="row">{html.escape(token)}</th>'
        f'<td id="{element_id}-s-{k}">{float(scores[k]):.4f}</td>'
        f'<td><div class="ab-bar-track"><div class="ab-bar" id="{element_id}-bar-{k}" '
        f'style="width:{100 * float(weights[k]):.1f}%"></div></div></td>'
        f'<td id="{element_id}-w-{k}">{float(weights[k]):.4f}</td></tr>'
        for k, token in enumerate(tokens)
    )
    slider = f"{element_id}-slider"
    context_text = "[" + ", ".join(f"{v:.4f}" for v in context_vec.tolist()) + "]"
    markup = (
        f'{style()}<div class="ab-demo" id="{element_id}" data-demo="query-picker">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>{RUN_HINT}'
        f'<label for="{slider}">Query token</label>'
        f'<input type="range" id="{slider}" min="0" max="{num_tokens - 1}" step="1" '
        f'value="{query_index}"> '
        f'<output id="{element_id}-query" for="{slider}">{html.escape(tokens[query_index])}</output>'
        f'<div class="ab-demo-output" aria-live="polite"><table>'
        f"<caption>Scores (query · key) and softmax weights</caption>"
        f'<thead><tr><th scope="col">key</th><th scope="col">score</th>'
        f'{WEIGHT_HEADERS}</tr></thead>'
        f"<tbody>{score_rows}</tbody></table>"
        f'<p class="ab-note">Context vector: <code id="{element_id}-context">{context_text}'
        f"</code></p></div></div>"
    )
    data = {"inputs": inputs.tolist(), "tokens": tokens}
    return HTML(markup + script(element_id, data, "query_picker.js", "queryPickerDemo"))
