"""Interactive demos that need no kernel: HTML with a little inline JavaScript.

Each function returns an ``IPython.display.HTML`` object. Its first rendering
is computed here in Python, so the page teaches even with scripts off; the
inline script then recomputes the same formula in the browser whenever the
reader moves the control. That keeps the demos alive on the static website,
where no Python runs behind an ipywidget.

Every demo's root element carries the CSS class ``ab-demo`` and a
``data-demo`` attribute naming it; the part that changes has the class
``ab-demo-output``. Element ids derive from ``element_id`` only, so the stored
notebook output is the same on every run.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence

import torch
from IPython.display import HTML

from ._ids import _check_element_id
from .attention import softmax

__all__ = ["temperature_demo", "mask_editor_demo", "query_picker_demo"]

# Black text stays readable (contrast > 4.5) on every shade between white and
# this sky blue, one of the Okabe-Ito colour-blind-safe colours.
_CELL_RGB = (86, 180, 233)
_BAR_COLOUR = "#0072B2"
# The headers of a weight drawn as a bar and written as a number. Never "value": in this
# book that word means V.
_WEIGHT_HEADERS = '<th scope="col">weight as a bar</th><th scope="col">weight</th>'

_STYLE = """<style>
.ab-demo { font-family: system-ui, sans-serif; font-size: 0.9rem; margin: 0.5rem 0 1rem;
  padding: 0.75rem; border: 1px solid #d0d7de; border-radius: 6px; max-width: 44rem; }
.ab-demo .ab-demo-title { font-weight: 600; margin: 0 0 0.5rem; }
.ab-demo label { display: inline-block; margin-right: 0.5rem; }
.ab-demo table { border-collapse: collapse; margin: 0.25rem 0; }
.ab-demo caption { caption-side: top; text-align: left; white-space: nowrap; padding-bottom: 0.25rem; }
.ab-demo .ab-side-by-side { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: flex-start; }
.ab-demo th, .ab-demo td { padding: 0.15rem 0.4rem; text-align: right; color: #000; }
.ab-demo th { font-weight: 600; }
.ab-demo .ab-bar-track { width: 14rem; background: #f3f4f6; height: 0.9rem; }
.ab-demo .ab-bar { height: 0.9rem; background: """ + _BAR_COLOUR + """; }
.ab-demo button.ab-mask-cell { width: 2.2rem; height: 1.8rem; border: 1px solid #57606a;
  cursor: pointer; color: #000; font: inherit; }
.ab-demo button.ab-mask-cell[aria-pressed="true"] { background: #E69F00; }
.ab-demo button.ab-mask-cell[aria-pressed="false"] { background: #ffffff; }
.ab-demo .ab-note { margin: 0.4rem 0 0; color: #24292f; }
</style>"""


def _as_float_tensor(name: str, values, dims: int) -> torch.Tensor:
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


def _check_tokens(tokens: Sequence[str], count: int, what: str) -> list[str]:
    tokens = [str(token) for token in tokens]
    if len(tokens) != count:
        raise ValueError(f"got {len(tokens)} tokens but {what} has {count} positions")
    return tokens


def _cell_background(weight: float) -> str:
    red, green, blue = (round(255 + (c - 255) * weight) for c in _CELL_RGB)
    return f"rgb({red},{green},{blue})"


def _script(element_id: str, data: dict, body: str) -> str:
    payload = json.dumps(data, sort_keys=True)
    return (
        "<script>\n(function () {\n"
        f"  const root = document.getElementById({json.dumps(element_id)});\n"
        "  if (!root) { return; }\n"
        f"  const data = {payload};\n"
        "  function softmax(row) {\n"
        "    const finite = row.filter(Number.isFinite);\n"
        "    if (finite.length === 0) { return row.map(() => 0); }\n"
        "    const top = Math.max(...finite);\n"
        "    const exps = row.map(v => Number.isFinite(v) ? Math.exp(v - top) : 0);\n"
        "    const total = exps.reduce((a, b) => a + b, 0);\n"
        "    return exps.map(v => v / total);\n"
        "  }\n"
        "  function cellColour(w) {\n"
        f"    const rgb = {json.dumps(list(_CELL_RGB))};\n"
        "    const c = rgb.map(x => Math.round(255 + (x - 255) * w));\n"
        "    return `rgb(${c[0]},${c[1]},${c[2]})`;\n"
        "  }\n"
        f"{body}"
        "})();\n</script>"
    )


def _bars_rows(element_id: str, tokens: list[str], weights: list[float]) -> str:
    rows = []
    for index, (token, weight) in enumerate(zip(tokens, weights, strict=True)):
        rows.append(
            f'<tr><th scope="row">{html.escape(token)}</th>'
            f'<td><div class="ab-bar-track"><div class="ab-bar" id="{element_id}-bar-{index}" '
            f'style="width:{100 * weight:.1f}%"></div></div></td>'
            f'<td id="{element_id}-w-{index}">{weight:.4f}</td></tr>'
        )
    return "".join(rows)


def _entropy(weights: torch.Tensor) -> float:
    positive = weights[weights > 0]
    return float(-(positive * positive.log()).sum())


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
    _check_element_id(element_id)
    scores = _as_float_tensor("scores", scores, 1)
    tokens = _check_tokens(tokens, scores.numel(), "scores")
    if not 0 < min_temperature <= temperature <= max_temperature:
        raise ValueError(
            "need 0 < min_temperature <= temperature <= max_temperature, got "
            f"{min_temperature}, {temperature}, {max_temperature}"
        )
    weights = softmax(scores / temperature)  # (T,)
    slider = f"{element_id}-slider"
    body = f"""
  const slider = root.querySelector("#{slider}");
  function update() {{
    const t = Number(slider.value);
    const w = softmax(data.scores.map(s => s / t));
    root.querySelector("#{element_id}-value").textContent = t.toFixed(2);
    w.forEach((v, i) => {{
      root.querySelector("#{element_id}-bar-" + i).style.width = (100 * v).toFixed(1) + "%";
      root.querySelector("#{element_id}-w-" + i).textContent = v.toFixed(4);
    }});
    const h = -w.filter(v => v > 0).reduce((a, v) => a + v * Math.log(v), 0);
    root.querySelector("#{element_id}-entropy").textContent = h.toFixed(3);
  }}
  slider.addEventListener("input", update);
"""
    markup = (
        f'{_STYLE}<div class="ab-demo" id="{element_id}" data-demo="temperature">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>'
        f'<label for="{slider}">Temperature τ</label>'
        f'<input type="range" id="{slider}" min="{min_temperature}" max="{max_temperature}" '
        f'step="0.05" value="{temperature}"> '
        f'<output id="{element_id}-value" for="{slider}">{temperature:.2f}</output>'
        f'<div class="ab-demo-output" aria-live="polite"><table>'
        f'<caption>softmax(scores / τ) for each key</caption>'
        f'<thead><tr><th scope="col">key</th>{_WEIGHT_HEADERS}</tr></thead><tbody>'
        f"{_bars_rows(element_id, tokens, weights.tolist())}</tbody></table>"
        f'<p class="ab-note">Entropy of the weights: <span id="{element_id}-entropy">'
        f"{_entropy(weights):.3f}</span> nats (the uniform maximum is "
        f"{math.log(len(tokens)):.3f}).</p></div></div>"
    )
    return HTML(markup + _script(element_id, {"scores": scores.tolist()}, body))


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
    _check_element_id(element_id)
    scores = _as_float_tensor("scores", scores, 2)
    num_tokens = scores.size(0)
    if scores.size(1) != num_tokens:
        raise ValueError(f"scores must be square (T, T), got shape {tuple(scores.shape)}")
    tokens = _check_tokens(tokens, num_tokens, "scores")
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
            f'<td id="{element_id}-w-{i}-{j}" style="background:{_cell_background(w)}">{w:.3f}</td>'
            for j, w in enumerate(weights[i].tolist())
        )
        weight_rows.append(f'<tr><th scope="row">{html.escape(query)}</th>{weight_cells}</tr>')

    body = f"""
  const T = data.scores.length;
  const mask = data.mask.map(row => row.slice());
  function update() {{
    for (let i = 0; i < T; i++) {{
      const row = data.scores[i].map((s, j) => mask[i][j] ? s : -Infinity);
      softmax(row).forEach((w, j) => {{
        const cell = root.querySelector("#{element_id}-w-" + i + "-" + j);
        cell.textContent = w.toFixed(3);
        cell.style.background = cellColour(w);
      }});
    }}
  }}
  root.querySelectorAll("button.ab-mask-cell").forEach(button => {{
    button.addEventListener("click", () => {{
      const i = Number(button.dataset.row), j = Number(button.dataset.col);
      mask[i][j] = !mask[i][j];
      button.setAttribute("aria-pressed", String(mask[i][j]));
      button.textContent = mask[i][j] ? "1" : "0";
      update();
    }});
  }});
"""
    markup = (
        f'{_STYLE}<div class="ab-demo" id="{element_id}" data-demo="mask-editor">'
        f'<p class="ab-demo-title">{html.escape(title)}</p><div class="ab-side-by-side">'
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
    return HTML(markup + _script(element_id, data, body))


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
    _check_element_id(element_id)
    inputs = _as_float_tensor("inputs", inputs, 2)
    num_tokens = inputs.size(0)
    tokens = _check_tokens(tokens, num_tokens, "inputs")
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
    body = f"""
  const slider = root.querySelector("#{slider}");
  function fmt(v) {{ return "[" + v.map(x => x.toFixed(4)).join(", ") + "]"; }}
  function update() {{
    const q = Number(slider.value);
    const x = data.inputs;
    const scores = x.map(row => row.reduce((a, v, i) => a + v * x[q][i], 0));
    const w = softmax(scores);
    const ctx = x[0].map((_, i) => x.reduce((a, row, k) => a + w[k] * row[i], 0));
    root.querySelector("#{element_id}-query").textContent = data.tokens[q];
    scores.forEach((s, k) => {{
      root.querySelector("#{element_id}-s-" + k).textContent = s.toFixed(4);
      root.querySelector("#{element_id}-w-" + k).textContent = w[k].toFixed(4);
      root.querySelector("#{element_id}-bar-" + k).style.width = (100 * w[k]).toFixed(1) + "%";
    }});
    root.querySelector("#{element_id}-context").textContent = fmt(ctx);
  }}
  slider.addEventListener("input", update);
"""
    context_text = "[" + ", ".join(f"{v:.4f}" for v in context_vec.tolist()) + "]"
    markup = (
        f'{_STYLE}<div class="ab-demo" id="{element_id}" data-demo="query-picker">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>'
        f'<label for="{slider}">Query token</label>'
        f'<input type="range" id="{slider}" min="0" max="{num_tokens - 1}" step="1" '
        f'value="{query_index}"> '
        f'<output id="{element_id}-query" for="{slider}">{html.escape(tokens[query_index])}</output>'
        f'<div class="ab-demo-output" aria-live="polite"><table>'
        f"<caption>Scores (query · key) and softmax weights</caption>"
        f'<thead><tr><th scope="col">key</th><th scope="col">score</th>'
        f'{_WEIGHT_HEADERS}</tr></thead>'
        f"<tbody>{score_rows}</tbody></table>"
        f'<p class="ab-note">Context vector: <code id="{element_id}-context">{context_text}'
        f"</code></p></div></div>"
    )
    data = {"inputs": inputs.tolist(), "tokens": tokens}
    return HTML(markup + _script(element_id, data, body))
