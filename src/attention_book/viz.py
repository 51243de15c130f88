"""Pictures of attention weights: matplotlib heatmaps and bertviz views.

``plot_attention`` draws one ``(T_q, T_k)`` weight matrix; ``plot_heads`` draws
every head of a layer side by side. ``head_view`` and ``model_view`` wrap bertviz
(Vig, 2019) so that they take the book's modules' weights and give
HTML with a fixed element id, so a stored notebook output is the same on every run.
The widget explorer of chapter 8 builds on these pictures: :mod:`attention_book.explorer`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import torch

from .checks import check_element_id

__all__ = [
    "PIPELINE_STAGES", "plot_attention", "plot_attention_pipeline", "plot_heads", "head_view",
    "model_view",
]

_BERTVIZ_ID = re.compile(r"bertviz-[0-9a-f]{32}")
# One line for a notebook whose scripts do not run (Jupyter does not run the stored scripts of a
# notebook it does not trust, e.g. one just opened): the view's own script removes it.
_RUN_HINT = (
    '<p id="{root}-hint" style="margin:0 0 0.5rem;padding:0.25rem 0.5rem;color:#000;'
    'background:#fff8e1;border-left:4px solid #E69F00">Run this cell to draw the attention '
    "view: until its script runs, the view stays empty.</p>"
)
_REMOVE_HINT = ('<script>(function () {{ const hint = document.getElementById("{root}-hint"); '
                "if (hint) {{ hint.remove(); }} }})();</script>")


def _as_matrix(weights: object, name: str = "weights") -> torch.Tensor:
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(weights).__name__}")
    if weights.dim() != 2:
        raise ValueError(
            f"{name} must be a (T_q, T_k) matrix, got shape {tuple(weights.shape)}; "
            "pick one example and one head first, e.g. weights[0, head]"
        )
    return weights.detach().float().cpu()


def _check_tokens(tokens: Sequence[str], count: int, what: str) -> list[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"{what} tokens must be a list of strings, got {type(tokens).__name__}")
    if len(tokens) != count:
        kind = f"{what} " if what else ""
        raise ValueError(
            f"got {len(tokens)} {kind}tokens but the weights have {count} {kind}positions"
            f" (T={count})"
        )
    return [str(token) for token in tokens]


def plot_attention(
    weights: torch.Tensor,
    tokens: Sequence[str],
    *,
    query_tokens: Sequence[str] | None = None,
    ax=None,
    title: str | None = None,
    cmap: str = "viridis",
    annotate: bool = False,
    colorbar: bool = True,
    vmax: float | None = None,
):
    """Draw an attention weight matrix as a heatmap with token labels.

    Row ``i`` is query token ``i``; column ``j`` is how much it attends to key token ``j``.

    Args:
        weights: the attention weights of one example and one head.
        tokens: the key tokens (and the query tokens, unless ``query_tokens`` is given).
        query_tokens: the query tokens when they differ from the keys.
        ax: a matplotlib Axes to draw on; a new figure is made when None.
        title: the title; a descriptive default names the sizes.
        cmap: a colour-blind-safe colormap (``"viridis"`` or ``"cividis"``).
        annotate: write each weight in its cell (readable up to about 10 tokens).
        colorbar: add a colour bar labelled "attention weight".
        vmax: top of the colour scale; default the largest weight (at least 1e-6).

    Shapes:
        weights ``(T_q, T_k)``; ``len(tokens) == T_k``; ``len(query_tokens) == T_q``.

    Returns:
        The matplotlib Axes.

    Taught in chapter 8.
    """
    import matplotlib.pyplot as plt

    matrix = _as_matrix(weights)  # (T_q, T_k)
    num_queries, num_keys = matrix.shape
    key_labels = _check_tokens(tokens, num_keys, "key")
    query_labels = _check_tokens(
        tokens if query_tokens is None else query_tokens, num_queries, "query"
    )
    if ax is None:
        size = 0.45 * max(num_queries, num_keys) + 2.0
        _, ax = plt.subplots(figsize=(size + 1.0, size))
    top = float(matrix.max()) if vmax is None else vmax
    image = ax.imshow(matrix.numpy(), cmap=cmap, vmin=0.0, vmax=max(top, 1e-6))
    ax.set_xticks(range(num_keys), key_labels, rotation=60, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(num_queries), query_labels)
    ax.set_xlabel("key (the token attended to)")
    ax.set_ylabel("query (the token attending)")
    ax.set_title(title or f"Attention weights ({num_queries} queries x {num_keys} keys)")
    if annotate:
        middle = max(top, 1e-6) / 2
        for row in range(num_queries):
            for col in range(num_keys):
                value = float(matrix[row, col])
                ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if value > middle else "white")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return ax


def plot_heads(
    weights: torch.Tensor,
    tokens: Sequence[str],
    *,
    title: str | None = None,
    ncols: int = 4,
    cmap: str = "viridis",
    head_names: Sequence[str] | None = None,
):
    """Draw every head of one layer as a grid of small heatmaps on one colour scale.

    Args:
        weights: one layer's weights, with or without a batch dimension of 1.
        tokens: the tokens (queries and keys).
        title: the figure title.
        ncols: heatmaps per row.
        cmap: a colour-blind-safe colormap.
        head_names: a title for each panel (default ``"head 0"``, ``"head 1"``, ...).

    Shapes:
        weights ``(num_heads, T, T)`` or ``(1, num_heads, T, T)``; ``len(tokens) == T``.

    Returns:
        The array of Axes (one per head; unused panels are hidden).

    Taught in chapter 8.
    """
    import matplotlib.pyplot as plt

    layer = _as_layers(weights)[0][0]  # (num_heads, T, T)
    num_heads, num_tokens, _ = layer.shape
    labels = _check_tokens(tokens, num_tokens, "")
    names = [f"head {h}" for h in range(num_heads)] if head_names is None else list(head_names)
    if len(names) != num_heads:
        raise ValueError(f"got {len(names)} head_names for {num_heads} heads")
    ncols = min(ncols, num_heads)
    nrows = -(-num_heads // ncols)
    panel = 0.3 * num_tokens + 1.2
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel * ncols + 1.0, panel * nrows + 0.6),
                             squeeze=False, constrained_layout=True)
    top = max(float(layer.max()), 1e-6)
    for head, ax in enumerate(axes.flat):
        if head >= num_heads:
            ax.set_visible(False)
            continue
        plot_attention(layer[head], labels, ax=ax, title=names[head], cmap=cmap,
                       colorbar=False, vmax=top)
        ax.tick_params(labelsize=7)
        ax.xaxis.label.set_visible(head // ncols == nrows - 1)
        ax.yaxis.label.set_visible(head % ncols == 0)
    mappable = axes.flat[0].images[0]
    fig.colorbar(mappable, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title or f"Attention weights of {num_heads} heads")
    return axes


def _as_layers(attentions: object) -> list[torch.Tensor]:
    """Normalise one tensor or a list of per-layer tensors to ``(1, heads, T, T)`` tensors."""
    if isinstance(attentions, torch.Tensor):
        layers = [attentions]
    elif isinstance(attentions, (list, tuple)) and attentions:
        layers = list(attentions)
    else:
        raise TypeError(
            "attentions must be a tensor or a non-empty list of per-layer tensors, "
            f"got {type(attentions).__name__}"
        )
    result = []
    for index, layer in enumerate(layers):
        if not isinstance(layer, torch.Tensor):
            raise TypeError(f"layer {index} must be a torch.Tensor, got {type(layer).__name__}")
        if layer.dim() == 3:
            layer = layer.unsqueeze(0)  # (1, heads, T, T)
        if layer.dim() != 4:
            raise ValueError(
                f"layer {index} has shape {tuple(layer.shape)}; expected (1, num_heads, T, T) "
                "or (num_heads, T, T)"
            )
        if layer.size(0) != 1:
            raise ValueError(
                f"layer {index} has a batch of {layer.size(0)} (shape {tuple(layer.shape)}); "
                "bertviz shows one example: pass weights[:1]"
            )
        if layer.size(-1) != layer.size(-2):
            raise ValueError(
                f"layer {index} is not self-attention: shape {tuple(layer.shape)} has "
                f"{layer.size(-2)} queries but {layer.size(-1)} keys"
            )
        if result and layer.shape != result[0].shape:
            raise ValueError(
                f"layer {index} has shape {tuple(layer.shape)} but layer 0 has "
                f"{tuple(result[0].shape)}; every layer needs the same heads and tokens"
            )
        # float64 rounded to 4 decimals: short, stable numbers in the stored HTML.
        result.append(layer.detach().cpu().double().round(decimals=4))
    return result


def _fixed_ids(html: str, element_id: str | None, kind: str, layers, tokens) -> str:
    if element_id is None:
        digest = hashlib.sha256()
        digest.update(kind.encode())
        digest.update(" ".join(tokens).encode())
        for layer in layers:
            digest.update(layer.numpy().tobytes())
        element_id = f"{kind}-{digest.hexdigest()[:12]}"
    else:
        check_element_id(element_id)
    if len(set(_BERTVIZ_ID.findall(html))) != 1:
        raise RuntimeError("unexpected bertviz output: could not find its one element id")
    # Keep bertviz's own prefix, so a page can still find every bertviz view by its id.
    root = f"bertviz-{element_id}"
    return _RUN_HINT.format(root=root) + _BERTVIZ_ID.sub(root, html) + _REMOVE_HINT.format(root=root)


def _prepare(attentions, tokens) -> tuple[list[torch.Tensor], list[str]]:
    layers = _as_layers(attentions)
    num_tokens = layers[0].size(-1)
    labels = _check_tokens(tokens, num_tokens, "")
    return layers, labels


def head_view(
    attentions,
    tokens: Sequence[str],
    *,
    element_id: str | None = None,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
):
    """bertviz's head view of the book's attention weights, with a fixed element id.

    Pick a layer and heads; hover over a token to see where it attends.

    Args:
        attentions: one layer's weights, or a list with one tensor per layer.
        tokens: the tokens, one per position.
        element_id: names the view, unique on the page (its HTML id becomes
            ``bertviz-<element_id>``); by default derived from the weights and
            tokens, so the same input gives the same id.
        layer: the layer shown first (default 0).
        heads: the heads shown first (default all).

    Shapes:
        each layer ``(1, num_heads, T, T)`` or ``(num_heads, T, T)``; ``len(tokens) == T``.

    Returns:
        An ``IPython.display.HTML`` object (display it, or make it a cell's last line).

    Taught in chapter 8.
    """
    from bertviz import head_view as bertviz_head_view

    layers, labels = _prepare(attentions, tokens)
    if layer is not None and not 0 <= layer < len(layers):
        raise ValueError(f"layer must lie in [0, {len(layers)}), got {layer}")
    html = bertviz_head_view(layers, labels, layer=layer, heads=None if heads is None
                             else list(heads), html_action="return")
    html.data = _fixed_ids(html.data, element_id, "head-view", layers, labels)
    return html


def model_view(
    attentions,
    tokens: Sequence[str],
    *,
    element_id: str | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    display_mode: str = "light",
):
    """bertviz's model view (every layer x every head) with a fixed element id.

    Args:
        attentions: one layer's weights, or a list with one tensor per layer.
        tokens: the tokens, one per position.
        element_id: the HTML id of the view, unique on the page; by default
            derived from the weights and tokens.
        include_layers: the layers to show (default all).
        include_heads: the heads to show (default all).
        display_mode: ``"light"`` or ``"dark"``.

    Shapes:
        each layer ``(1, num_heads, T, T)`` or ``(num_heads, T, T)``; ``len(tokens) == T``.

    Returns:
        An ``IPython.display.HTML`` object.

    Taught in chapter 8.
    """
    from bertviz import model_view as bertviz_model_view

    layers, labels = _prepare(attentions, tokens)
    if display_mode not in ("light", "dark"):
        raise ValueError(f"display_mode must be 'light' or 'dark', got {display_mode!r}")
    html = bertviz_model_view(
        layers, labels, display_mode=display_mode,
        include_layers=None if include_layers is None else list(include_layers),
        include_heads=None if include_heads is None else list(include_heads),
        html_action="return",
    )
    html.data = _fixed_ids(html.data, element_id, "model-view", layers, labels)
    return html


#: The stages of the attention computation that :func:`plot_attention_pipeline` draws, in order.
PIPELINE_STAGES = (
    "input", "projections", "split_heads", "scores", "scale", "mask", "softmax", "dropout",
    "weighted_sum", "merge_heads", "out_proj",
)
_STAGE_LABELS = {
    "input": ("x", "(B, T, d_in)"),
    "split_heads": ("split into heads", "(B, num_heads, T, head_dim)"),
    "scores": ("scores  Q Kᵀ", "(B, num_heads, T, T)"),
    "scale": ("scale  ÷ √d_k", "(B, num_heads, T, T)"),
    "mask": ("mask  (−∞ where blocked)", "(B, num_heads, T, T)"),
    "softmax": ("softmax over keys", "weights (B, num_heads, T, T)"),
    "dropout": ("dropout (training only)", "(B, num_heads, T, T)"),
    "weighted_sum": ("weights · V", "(B, num_heads, T, head_dim)"),
    "merge_heads": ("merge the heads", "(B, T, d_out)"),
    "out_proj": ("out_proj", "output (B, T, d_out)"),
}


def plot_attention_pipeline(highlight: Sequence[str] = (), *, title: str | None = None, ax=None):
    """Draw the computation of (multi-head) attention as a flow chart, with shapes.

    ``x`` goes through three projections to the queries, keys and values; the scores
    ``Q Kᵀ`` are scaled, masked, turned into weights by the softmax and dropped out; the
    weights average the values, the heads are merged and ``out_proj`` mixes them. The stages
    in ``highlight`` are filled in orange, the others in grey, so a chapter can show what
    it adds.

    Args:
        highlight: names from :data:`PIPELINE_STAGES` to emphasise.
        title: the figure title; a default names the highlighted stages.
        ax: a matplotlib Axes to draw on; a new figure is made when None.

    Shapes:
        (a picture; the boxes are labelled with the shapes of multi-head attention)

    Returns:
        The matplotlib Axes.

    Taught in chapters 2, 3 and 7.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if isinstance(highlight, str):
        highlight = (highlight,)
    unknown = [name for name in highlight if name not in PIPELINE_STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; choose from {list(PIPELINE_STAGES)}")
    marked = set(highlight)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 9.0))
    colours = {True: ("#E69F00", "#000000"), False: ("#EEEEEE", "#555555")}  # Okabe-Ito orange

    def box(x, y, width, lines, stage):
        fill, edge = colours[stage in marked]
        patch = FancyBboxPatch((x - width / 2, y - 0.32), width, 0.64,
                               boxstyle="round,pad=0.02,rounding_size=0.08",
                               facecolor=fill, edgecolor=edge, linewidth=1.2)
        patch.set_gid(f"stage-{stage}")
        ax.add_patch(patch)
        ax.text(x, y + 0.1, lines[0], ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x, y - 0.15, lines[1], ha="center", va="center", fontsize=8.5,
                family="monospace")

    def arrow(start, end):
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color="#333333", linewidth=1.0))

    centre, top = 3.0, 11.0
    box(centre, top, 2.6, _STAGE_LABELS["input"], "input")
    for column, name in zip((1.0, 3.0, 5.0), ("query", "key", "value"), strict=True):
        letter = name[0].upper()
        box(column, top - 1.2, 1.8, (f"W_{name}", f"{letter} (B, T, d_out)"), "projections")
        arrow((centre, top - 0.34), (column, top - 0.86))
    box(centre, top - 2.4, 5.8, _STAGE_LABELS["split_heads"], "split_heads")
    for column in (1.0, 3.0, 5.0):
        arrow((column, top - 1.54), (column, top - 2.06))
    chain = ["scores", "scale", "mask", "softmax", "dropout", "weighted_sum"]
    x, width, y = 2.2, 4.0, top - 3.6
    arrow((x, top - 2.74), (x, y + 0.34))
    for index, stage in enumerate(chain):
        box(x, y, width, _STAGE_LABELS[stage], stage)
        if index < len(chain) - 1:
            arrow((x, y - 0.34), (x, y - 0.86))
            y -= 1.2
    # The values skip the score chain and join at the weighted sum.
    arrow((5.0, top - 2.74), (x + width / 2 + 0.02, y))
    ax.text(5.1, (top - 2.74 + y) / 2, "V", fontsize=10, weight="bold")
    for stage in ("merge_heads", "out_proj"):
        arrow((x, y - 0.34), (x, y - 0.86))
        y -= 1.2
        box(x, y, width, _STAGE_LABELS[stage], stage)
    ax.set_xlim(-0.3, 6.3)
    ax.set_ylim(y - 0.6, top + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    shown = ", ".join(name.replace("_", " ") for name in PIPELINE_STAGES if name in marked)
    ax.set_title(title or (f"Attention, step by step (highlighted: {shown})" if shown
                           else "Attention, step by step"))
    return ax
