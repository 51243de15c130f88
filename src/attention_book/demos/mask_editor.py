"""The mask editor of chapter 5: click a boolean mask, watch the weights it produces."""

from __future__ import annotations

import html
from collections.abc import Sequence

import torch
from IPython.display import HTML

from ..attention import softmax
from ..checks import check_element_id
from .page import RUN_HINT, as_float_tensor, cell_background, check_tokens, script, style

__all__ = ["mask_editor_demo"]


def mask_editor_demo(
    scores,
    tokens: Sequence[str],
    *,
    element_id: str,
    title: str = "Click the mask to allow or block a query-key pair",
    mask=None,
) -> HTML:
    """A clickable boolean mask beside the attention weights it produces.

    Each cell of the mask is a toggle button (True = may attend). The weights
    are ``softmax`` of the scores with blocked positions set to ``-inf``; a
    row whose every key is blocked gets zero weights, as in the package.

    Args:
        scores: the attention scores of a short sequence.
        tokens: one label per position.
        element_id: a fixed id, unique on the page.
        title: the caption above the demo.
        mask: the starting mask (default: the causal mask).

    Shapes:
        scores ``(T, T)``; mask ``(T, T)`` boolean; ``len(tokens) == T``.

    Returns:
        An ``IPython.display.HTML`` with the demo.

    Taught in chapter 5.
    """
    check_element_id(element_id)
    scores = as_float_tensor("scores", scores, 2)
    num_tokens = scores.size(0)
    if scores.size(1) != num_tokens:
        raise ValueError(f"scores must be square (T, T), got shape {tuple(scores.shape)}")
    tokens = check_tokens(tokens, num_tokens, "scores")
    if mask is None:
        mask = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    mask = torch.as_tensor(mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    if mask.shape != scores.shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} must match scores of shape {tuple(scores.shape)}"
        )
    weights = softmax(scores.masked_fill(~mask, float("-inf")))  # (T, T)

    header = "".join(f'<th scope="col">{html.escape(t)}</th>' for t in tokens)
    mask_rows, weight_rows = [], []
    for i, query in enumerate(tokens):
        cells = []
        for j, key in enumerate(tokens):
            on = bool(mask[i, j])
            cells.append(
                f'<td><button type="button" class="ab-mask-cell" data-row="{i}" data-col="{j}" '
                f'aria-pressed="{str(on).lower()}" '
                f'aria-label="{html.escape(query)} may attend to {html.escape(key)}">'
                f'{"1" if on else "0"}</button></td>'
            )
        mask_rows.append(f'<tr><th scope="row">{html.escape(query)}</th>{"".join(cells)}</tr>')
        weight_cells = "".join(
            f'<td id="{element_id}-w-{i}-{j}" style="background:{cell_background(w)}">{w:.3f}</td>'
            for j, w in enumerate(weights[i].tolist())
        )
        weight_rows.append(f'<tr><th scope="row">{html.escape(query)}</th>{weight_cells}</tr>')

    markup = (
        f'{style()}<div class="ab-demo" id="{element_id}" data-demo="mask-editor">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>{RUN_HINT}<div class="ab-side-by-side">'
        f'<table><caption>Mask (1 = may attend)</caption>'
        f'<thead><tr><th scope="col">query</th>{header}</tr></thead>'
        f'<tbody>{"".join(mask_rows)}</tbody></table>'
        f'<div class="ab-demo-output" aria-live="polite"><table>'
        f"<caption>Attention weights</caption>"
        f'<thead><tr><th scope="col">query</th>{header}</tr></thead>'
        f'<tbody>{"".join(weight_rows)}</tbody></table></div></div>'
        f'<p class="ab-note">Rows are queries and columns are keys. Each row of weights sums '
        "to 1, or to 0 when every key of that row is blocked.</p></div>"
    )
    data = {"scores": scores.tolist(), "mask": mask.tolist()}
    return HTML(markup + script(element_id, data, "mask_editor.js", "maskEditorDemo"))
