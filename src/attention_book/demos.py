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

import base64
import dataclasses
import html
import json
import math
import re
import struct
from collections.abc import Sequence

import torch
from IPython.display import HTML

from ._ids import _check_element_id
from .attention import softmax

__all__ = [
    "temperature_demo",
    "mask_editor_demo",
    "query_picker_demo",
    "SentenceReading",
    "read_sentence",
    "export_classifier",
    "classifier_from_export",
    "ambiguity_demo",
]

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


# --------------------------------------------------------------------------------------
# Chapter 9: the trained classifier, running in the page.

#: How the weights travel into the page: each one rounded to this many decimals and stored
#: as a little-endian int32 (value * 10**decimals), base64-encoded. Seven decimals keep the
#: page's probabilities within 1e-6 of PyTorch's (chapter 9 measures it), and a last-bit
#: difference between two CPUs (about 1e-14 after chapter 9's float64 training) is far too
#: small to move a weight across a rounding boundary, so the stored page is the same everywhere.
EXPORT_DECIMALS = 7
_EXPORT_LAYOUT = (  # (name in the payload, parameter of AttentionClassifier)
    ("embedding", "embedding.weight"),
    ("W_query", "attention.W_query.weight"),
    ("W_key", "attention.W_key.weight"),
    ("W_value", "attention.W_value.weight"),
    ("out_proj_weight", "attention.out_proj.weight"),
    ("out_proj_bias", "attention.out_proj.bias"),
    ("head_weight", "head.weight"),
    ("head_bias", "head.bias"),
)
_WORD_EDGE = re.compile(r"^[^a-z0-9]+|[^a-z0-9]+$")
_MARKER_COLOUR = "#E69F00"  # Okabe-Ito orange: the row the ambiguous word attends to most
_UNKNOWN_COLOUR = "#D55E00"  # Okabe-Ito vermillion: the underline of an unknown word


def _split_words(sentence: str) -> list[str]:
    """The demo's tokeniser: lower case, split on white space, punctuation trimmed from the ends."""
    words = []
    for raw in sentence.lower().split():
        word = _WORD_EDGE.sub("", raw)
        if word:
            words.append(word)
    return words


def _ambiguous_words(labels: Sequence[str]) -> list[str]:
    """The words the classifier disambiguates, from its ``"word/sense"`` labels, in label order."""
    words: list[str] = []
    for label in labels:
        word, slash, sense = str(label).partition("/")
        if not (word and slash and sense):
            raise ValueError(f"labels must look like 'word/sense', got {label!r}")
        if word not in words:
            words.append(word)
    return words


def _check_classifier(model, vocab, labels) -> None:
    from .train import AttentionClassifier

    if not isinstance(model, AttentionClassifier):
        raise TypeError(
            f"model must be an attention_book.train.AttentionClassifier, got {type(model).__name__}"
        )
    if not hasattr(vocab, "itos") or not hasattr(vocab, "stoi"):
        raise TypeError(f"vocab must be an attention_book.data.Vocabulary, got {type(vocab).__name__}")
    if len(vocab) != model.embedding.num_embeddings:
        raise ValueError(
            f"the vocabulary has {len(vocab)} words but the model embeds "
            f"{model.embedding.num_embeddings}"
        )
    if len(labels) != model.head.out_features:
        raise ValueError(f"got {len(labels)} labels but the model scores {model.head.out_features}")
    _ambiguous_words(labels)


@dataclasses.dataclass(frozen=True)
class SentenceReading:
    """What chapter 9's classifier makes of one typed sentence, as the ambiguity demo shows it.

    Attributes:
        words: the typed words after the demo's tokenisation (lower case, punctuation
            trimmed from the ends of each word).
        unknown: the words that are not in the vocabulary, each once, in order; the model
            has no vector for them, so it reads the sentence without them.
        tokens: the words the model reads: the known ones, in order.
        status: ``"ok"``; ``"empty"`` (no word typed); ``"too-long"`` (more known words than
            the model's ``context_length``); or ``"no-ambiguous-word"``.
        word_index: position in ``tokens`` of the ambiguous word (the first one, if there are
            several); -1 unless ``status == "ok"``.
        probabilities: the softmax of the logits, one per label, shape ``(num_classes,)``;
            ``None`` unless ``status == "ok"``.
        attention: the weights from the ambiguous word to every token, one row per head,
            shape ``(num_heads, len(tokens))``; ``None`` unless ``status == "ok"``.
        attended_index: position in ``tokens`` of the word, other than the ambiguous word
            itself, with the largest weight averaged over the heads; -1 if there is none.

    Taught in chapter 9.
    """

    words: tuple[str, ...]
    unknown: tuple[str, ...]
    tokens: tuple[str, ...]
    status: str
    word_index: int = -1
    probabilities: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    attended_index: int = -1

    @property
    def word(self) -> str | None:
        """The ambiguous word the model classifies, or ``None``."""
        return self.tokens[self.word_index] if self.word_index >= 0 else None

    @property
    def attended_word(self) -> str | None:
        """The word the ambiguous word attends to most (itself left out), or ``None``."""
        return self.tokens[self.attended_index] if self.attended_index >= 0 else None


def read_sentence(model, vocab, labels: Sequence[str], sentence: str) -> SentenceReading:
    """Run chapter 9's classifier on a typed sentence, exactly as the ambiguity demo does.

    The sentence is split into lower-case words with punctuation trimmed; words that are
    not in ``vocab`` are left out (the model has no vector for them); the first word that
    one of the labels names (``"minute"`` for ``"minute/time"``) is the ambiguous word, whose
    context vector the classifier reads. This is the PyTorch reference that the page's
    JavaScript forward pass is tested against.

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        sentence: the text a reader typed.

    Shapes:
        ``probabilities`` ``(num_classes,)``, ``attention`` ``(num_heads, T)`` with ``T`` the
        number of known words.

    Returns:
        A :class:`SentenceReading`.

    Taught in chapter 9.
    """
    _check_classifier(model, vocab, labels)
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    words = _split_words(sentence)
    known = [w for w in words if vocab.stoi.get(w, 0) > 0]  # id 0 is padding, never a word
    unknown = tuple(dict.fromkeys(w for w in words if vocab.stoi.get(w, 0) == 0))
    base = {"words": tuple(words), "unknown": unknown, "tokens": tuple(known)}
    ambiguous = set(_ambiguous_words(labels))
    if not words:
        return SentenceReading(status="empty", **base)
    if len(known) > model.context_length:
        return SentenceReading(status="too-long", **base)
    word_index = next((i for i, w in enumerate(known) if w in ambiguous), -1)
    if word_index < 0:
        return SentenceReading(status="no-ambiguous-word", **base)
    device = model.embedding.weight.device
    ids = torch.tensor([vocab.encode(known)], device=device)  # (1, T)
    with torch.no_grad():
        logits, weights = model(ids, torch.tensor([len(known)], device=device),
                                torch.tensor([word_index], device=device), return_weights=True)
    probabilities = torch.softmax(logits[0], dim=-1).cpu()  # (num_classes,)
    attention = weights[0, :, word_index].cpu()  # (num_heads, T)
    mean = attention.mean(dim=0)  # (T,)
    others = [i for i in range(len(known)) if i != word_index]
    attended = max(others, key=lambda i: (float(mean[i]), -i)) if others else -1
    return SentenceReading(status="ok", word_index=word_index, probabilities=probabilities,
                           attention=attention, attended_index=attended, **base)


def export_classifier(model, vocab, labels: Sequence[str], *,
                      decimals: int = EXPORT_DECIMALS) -> dict:
    """Everything the page needs to run chapter 9's classifier: sizes, words, labels, weights.

    The weights are rounded to ``decimals`` decimals and stored as base64 of little-endian
    int32 (``round(w * 10**decimals)``), in the order embedding, ``W_query``, ``W_key``,
    ``W_value``, ``out_proj`` weight and bias, head weight and bias (row-major, as PyTorch
    stores them). The result is deterministic and survives ``json.dumps``.

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        decimals: decimals kept per weight (1 to 8).

    Returns:
        A dict: ``d_model``, ``num_heads``, ``context_length``, ``positional_encoding``,
        ``vocab`` (id order, ``"<pad>"`` first), ``labels``, ``decimals``, ``layout``
        (``[name, rows, cols]`` per tensor, ``cols == 0`` for a vector) and ``weights``.

    Taught in chapter 9.
    """
    _check_classifier(model, vocab, labels)
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 1 <= decimals <= 8:
        raise ValueError(f"decimals must be an int from 1 to 8, got {decimals!r}")
    state = model.state_dict()
    scale = 10.0**decimals
    layout, chunks = [], []
    for name, key in _EXPORT_LAYOUT:
        tensor = state[key].detach().to("cpu", torch.float64)
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{key} holds a NaN or an infinity; train the model again")
        fixed = torch.round(tensor * scale)
        if fixed.abs().max() > 2**31 - 1:
            raise ValueError(f"{key} has a weight too large to store with {decimals} decimals")
        rows, cols = (tensor.shape[0], tensor.shape[1]) if tensor.dim() == 2 else (tensor.shape[0], 0)
        layout.append([name, rows, cols])
        values = [int(v) for v in fixed.flatten().tolist()]
        chunks.append(struct.pack(f"<{len(values)}i", *values))
    return {
        "d_model": model.embedding.embedding_dim,
        "num_heads": model.attention.num_heads,
        "context_length": model.context_length,
        "positional_encoding": bool(model.positional_encoding),
        "vocab": list(vocab.itos),
        "labels": [str(label) for label in labels],
        "decimals": decimals,
        "layout": layout,
        "weights": base64.b64encode(b"".join(chunks)).decode("ascii"),
    }


def classifier_from_export(payload: dict):
    """Rebuild an :class:`~attention_book.train.AttentionClassifier` from :func:`export_classifier`.

    The model holds the page's rounded weights, in float64: what the demo computes with.

    Args:
        payload: the dict returned by :func:`export_classifier`.

    Returns:
        ``(model, vocab, labels)``: the classifier (in eval mode), a
        :class:`~attention_book.data.Vocabulary` and the list of labels.

    Taught in chapter 9.
    """
    from .data import Vocabulary
    from .train import AttentionClassifier

    vocab = Vocabulary(payload["vocab"][1:])
    labels = list(payload["labels"])
    model = AttentionClassifier(len(vocab), len(labels), payload["d_model"], payload["num_heads"],
                                payload["context_length"],
                                positional_encoding=payload["positional_encoding"],
                                dtype=torch.float64)
    raw = base64.b64decode(payload["weights"])
    values = torch.tensor(struct.unpack(f"<{len(raw) // 4}i", raw), dtype=torch.float64)
    values = values / 10.0 ** payload["decimals"]
    state, start = {}, 0
    for (name, rows, cols), (expected, key) in zip(payload["layout"], _EXPORT_LAYOUT, strict=True):
        if name != expected:
            raise ValueError(f"unexpected tensor {name!r} in the payload (expected {expected!r})")
        count = rows * max(cols, 1)
        chunk = values[start : start + count]
        state[key] = chunk.view(rows, cols) if cols else chunk
        start += count
    if start != values.numel():
        raise ValueError(f"the payload holds {values.numel()} weights, the layout {start}")
    model.load_state_dict(state)
    return model.eval(), vocab, labels


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def _suggestions(word: str, known: Sequence[str], count: int = 3) -> list[str]:
    """The ``count`` known words closest to ``word`` in edit distance (ties: vocabulary order)."""
    ranked = sorted(range(len(known)), key=lambda i: (_edit_distance(word, known[i]), i))
    return [known[i] for i in ranked[:count]]


_SENTENCE_STYLE = """<style>
.ab-sentence-demo input[type="text"] { width: 100%; box-sizing: border-box; font: inherit;
  padding: 0.35rem 0.5rem; border: 1px solid #57606a; border-radius: 4px; margin: 0.25rem 0; }
.ab-sentence-demo input[type="text"]:focus, .ab-sentence-demo button.ab-chip:focus,
.ab-sentence-demo summary:focus { outline: 3px solid #0072B2; outline-offset: 1px; }
.ab-sentence-demo .ab-words span { margin-right: 0.35rem; }
.ab-sentence-demo .ab-word-unknown { text-decoration: underline dashed """ + _UNKNOWN_COLOUR + """;
  text-decoration-thickness: 2px; }
.ab-sentence-demo .ab-tag { font-size: 0.75rem; border: 1px solid #57606a; border-radius: 3px;
  padding: 0 0.2rem; margin-left: 0.15rem; color: #000; background: #fff; }
.ab-sentence-demo .ab-message { margin: 0.4rem 0; padding: 0.35rem 0.5rem; color: #000;
  background: #f6f8fa; border-left: 4px solid """ + _UNKNOWN_COLOUR + """; }
.ab-sentence-demo button.ab-chip { font: inherit; font-size: 0.85rem; color: #000;
  background: #fff; border: 1px solid #57606a; border-radius: 1rem; padding: 0.05rem 0.55rem;
  margin: 0.1rem 0.15rem; cursor: pointer; }
.ab-sentence-demo button.ab-chip:hover { background: #e8f1f8; }
.ab-sentence-demo tr.ab-attended th, .ab-sentence-demo tr.ab-attended td {
  border-top: 3px solid """ + _MARKER_COLOUR + """; border-bottom: 3px solid """ + _MARKER_COLOUR + """; }
.ab-sentence-demo th[scope="row"] { text-align: left; }
.ab-sentence-demo .ab-sr-only { position: absolute; width: 1px; height: 1px; padding: 0;
  margin: -1px; overflow: hidden; clip: rect(0, 0, 0, 0); white-space: nowrap; border: 0; }
.ab-sentence-demo details { margin-top: 0.5rem; }
</style>"""


def _message(kind: str, text: str) -> str:
    return f'<p class="ab-message" data-message="{kind}">{text}</p>'


def _render_reading(element_id: str, reading: SentenceReading, labels: Sequence[str],
                    known: Sequence[str], ambiguous: Sequence[str], context_length: int) -> str:
    """The demo's output area for one reading; the script's ``render`` draws the same markup."""
    parts = []
    if reading.words:
        spans = []
        for word in reading.words:
            if word in reading.unknown:
                spans.append(f'<span class="ab-word-unknown">{html.escape(word)} '
                             '<span class="ab-tag">unknown</span></span>')
            elif reading.status == "ok" and word == reading.word:
                spans.append(f"<span><strong>{html.escape(word)}</strong></span>")
            else:
                spans.append(f"<span>{html.escape(word)}</span>")
        parts.append(f'<p class="ab-words">Words: {" ".join(spans)}</p>')
    listed = ", ".join(ambiguous[:-1]) + " or " + ambiguous[-1] if len(ambiguous) > 1 else ambiguous[0]
    if reading.status == "empty":
        parts.append(_message("empty", f"Type a sentence with {html.escape(listed)}."))
    for word in reading.unknown:
        chips = "".join(
            f'<button type="button" class="ab-chip" data-replace="{html.escape(word)}" '
            f'data-word="{html.escape(s)}">{html.escape(s)}</button>'
            for s in _suggestions(word, known)
        )
        parts.append(_message(
            "unknown",
            f"The model has never seen <strong>{html.escape(word)}</strong>, so it reads the "
            f"sentence without it. Replace it with a word it knows: {chips} (or pick one from "
            "the list of all its words below)."))
    if reading.status == "too-long":
        parts.append(_message(
            "too-long",
            f"This sentence has {len(reading.tokens)} words the model knows; it reads at most "
            f"{context_length} (its context length). Remove "
            f"{len(reading.tokens) - context_length} of them."))
    if reading.status == "no-ambiguous-word":
        parts.append(_message(
            "no-ambiguous-word",
            f"No ambiguous word: the model tells the senses of {html.escape(listed)} apart. "
            "Add one of them."))
    if reading.status == "ok":
        parts.append(_render_prediction(element_id, reading, labels))
    return "".join(parts)


def _render_prediction(element_id: str, reading: SentenceReading, labels: Sequence[str]) -> str:
    probabilities = reading.probabilities.tolist()
    best = max(range(len(labels)), key=lambda c: (probabilities[c], -c))
    word = html.escape(reading.word)
    predicted_word, _, predicted_sense = labels[best].partition("/")
    summary = (f"The model reads <strong>{word}</strong> as <strong>{html.escape(labels[best])}"
               f"</strong> (probability {probabilities[best]:.3f})")
    if reading.attended_index >= 0:
        summary += (f"; it attends most to <strong>{html.escape(reading.attended_word)}</strong>"
                    " (★ below).")
    else:
        summary += "; there is no other word to attend to."
    rows = []
    own = [c for c, label in enumerate(labels) if label.partition("/")[0] == reading.word]
    for c in own:
        rows.append(
            f'<tr><th scope="row">{html.escape(labels[c])}</th><td><div class="ab-bar-track">'
            f'<div class="ab-bar" style="width:{100 * probabilities[c]:.1f}%"></div></div></td>'
            f"<td>{probabilities[c]:.3f}</td></tr>")
    if len(own) < len(labels):
        rest = 0.0
        for c, p in enumerate(probabilities):
            if c not in own:
                rest += p
        rows.append(
            f'<tr><th scope="row">the other {len(labels) - len(own)} labels</th><td>'
            f'<div class="ab-bar-track"><div class="ab-bar" style="width:{100 * rest:.1f}%"></div>'
            f"</div></td><td>{rest:.3f}</td></tr>")
    num_heads = reading.attention.shape[0]
    head_cols = "".join(f'<th scope="col">head {h}</th>' for h in range(num_heads))
    mean = reading.attention.mean(dim=0).tolist()
    weight_rows = []
    for t, token in enumerate(reading.tokens):
        label = html.escape(token)
        if t == reading.word_index:
            label = f"<strong>{label}</strong> (itself)"
        attended = t == reading.attended_index
        if attended:
            label = (f'<span aria-hidden="true">★ </span>{label}'
                     '<span class="ab-sr-only"> (most attention)</span>')
        cells = "".join(
            f'<td style="background:{_cell_background(w)}">{w:.2f}</td>'
            for w in [*reading.attention[:, t].tolist(), mean[t]])
        row_class = ' class="ab-attended"' if attended else ""
        weight_rows.append(f'<tr{row_class}><th scope="row">{label}</th>{cells}</tr>')
    return (
        f'<p class="ab-prediction" id="{element_id}-prediction">{summary}</p>'
        f'<div class="ab-side-by-side"><table><caption>Probability of each sense</caption>'
        f'<thead><tr><th scope="col">label</th><th scope="col">probability as a bar</th>'
        f'<th scope="col">probability</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
        f"<table><caption>Attention from <strong>{word}</strong> to each word</caption>"
        f'<thead><tr><th scope="col">word</th>{head_cols}<th scope="col">mean</th></tr></thead>'
        f'<tbody>{"".join(weight_rows)}</tbody></table></div>'
        f'<p class="ab-note">★ marks the word that <strong>{word}</strong> attends to most: the '
        "largest mean weight over the heads, the word itself left out. Each column of weights "
        "sums to 1.</p>"
    )


# The script of ambiguity_demo: it decodes the weights, repeats AttentionClassifier's forward
# pass, and redraws the markup of _render_reading on every keystroke. It reads nothing from
# Python but `data.model` (export_classifier's payload), so it holds no f-string braces.
_SENTENCE_JS = r"""
  const M = data.model;
  const d = M.d_model, H = M.num_heads, hd = d / H, L = M.context_length;
  const labels = M.labels, known = M.vocab.slice(1);
  const stoi = new Map(known.map((w, i) => [w, i + 1]));  // id 0 is padding, never a word
  const ambiguous = [];
  labels.forEach(l => { const w = l.split("/")[0]; if (!ambiguous.includes(w)) ambiguous.push(w); });
  const listed = ambiguous.length > 1
    ? ambiguous.slice(0, -1).join(", ") + " or " + ambiguous[ambiguous.length - 1] : ambiguous[0];
  // The weights: little-endian int32, value * 10^decimals, in the order of M.layout.
  const bytes = Uint8Array.from(atob(M.weights), c => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const unit = Math.pow(10, M.decimals);
  const P = {};
  let offset = 0;
  M.layout.forEach(([name, rows, cols]) => {
    const n = rows * Math.max(cols, 1);
    const values = new Float64Array(n);
    for (let i = 0; i < n; i++) { values[i] = view.getInt32(4 * (offset + i), true) / unit; }
    P[name] = values;
    offset += n;
  });
  // The sinusoidal positional encoding, as attention_book.train computes it.
  const pe = new Float64Array(L * d);
  for (let p = 0; p < L; p++) {
    for (let i = 0; i < d; i += 2) {
      const f = Math.exp(i * (-Math.log(10000) / d));
      pe[p * d + i] = Math.sin(p * f);
      pe[p * d + i + 1] = Math.cos(p * f);
    }
  }
  function linear(W, b, x, rows, cols) {  // W x + b, W stored row-major (rows, cols)
    const out = new Float64Array(rows);
    for (let o = 0; o < rows; o++) {
      let s = 0;
      for (let i = 0; i < cols; i++) { s += W[o * cols + i] * x[i]; }
      out[o] = b ? s + b[o] : s;
    }
    return out;
  }
  // AttentionClassifier.forward for one sentence, padded to the context length like a batch.
  function forward(ids, wordIndex) {
    const T = ids.length;
    const xs = [];
    for (let t = 0; t < L; t++) {
      const id = t < T ? ids[t] : 0;  // padding beyond the sentence
      const x = new Float64Array(d);
      for (let i = 0; i < d; i++) {
        x[i] = P.embedding[id * d + i] + (M.positional_encoding ? pe[t * d + i] : 0);
      }
      xs.push(x);
    }
    // The head reads only the ambiguous word's context vector: one query is enough.
    const q = linear(P.W_query, null, xs[wordIndex], d, d);
    const keys = xs.map(x => linear(P.W_key, null, x, d, d));
    const values = xs.map(x => linear(P.W_value, null, x, d, d));
    const scale = 1 / Math.sqrt(hd);
    const context = new Float64Array(d);
    const attention = [];
    for (let h = 0; h < H; h++) {
      const scores = keys.map((k, t) => {
        if (t >= T) { return -Infinity; }  // the padding mask: True only for real tokens
        let s = 0;
        for (let j = 0; j < hd; j++) { s += q[h * hd + j] * k[h * hd + j]; }
        return s * scale;
      });
      const w = softmax(scores);
      for (let j = 0; j < hd; j++) {
        let s = 0;
        for (let t = 0; t < L; t++) { s += w[t] * values[t][h * hd + j]; }
        context[h * hd + j] = s;
      }
      attention.push(w.slice(0, T));
    }
    const mixed = linear(P.out_proj_weight, P.out_proj_bias, context, d, d);
    const logits = linear(P.head_weight, P.head_bias, mixed, labels.length, d);
    return {probabilities: softmax(Array.from(logits)), attention};
  }
  function split(text) {
    return text.toLowerCase().split(/\s+/)
      .map(w => w.replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, "")).filter(w => w.length > 0);
  }
  function read(text) {
    const words = split(text);
    const tokens = words.filter(w => stoi.has(w));
    const unknown = [...new Set(words.filter(w => !stoi.has(w)))];
    const r = {words, unknown, tokens, status: "ok", wordIndex: -1, attendedIndex: -1,
               probabilities: null, attention: null};
    if (words.length === 0) { r.status = "empty"; return r; }
    if (tokens.length > L) { r.status = "too-long"; return r; }
    r.wordIndex = tokens.findIndex(w => ambiguous.includes(w));
    if (r.wordIndex < 0) { r.status = "no-ambiguous-word"; return r; }
    const out = forward(tokens.map(w => stoi.get(w)), r.wordIndex);
    r.probabilities = out.probabilities;
    r.attention = out.attention;
    r.mean = tokens.map((_, t) => out.attention.reduce((a, row) => a + row[t], 0) / H);
    let best = -Infinity;
    r.mean.forEach((m, t) => {
      if (t !== r.wordIndex && m > best) { best = m; r.attendedIndex = t; }
    });
    return r;
  }
  function esc(s) {
    const table = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;"};
    return String(s).replace(/[&<>"']/g, c => table[c]);
  }
  function editDistance(a, b) {
    let previous = Array.from({length: b.length + 1}, (_, j) => j);
    for (let i = 1; i <= a.length; i++) {
      const current = [i];
      for (let j = 1; j <= b.length; j++) {
        current.push(Math.min(previous[j] + 1, current[j - 1] + 1,
                              previous[j - 1] + (a[i - 1] !== b[j - 1] ? 1 : 0)));
      }
      previous = current;
    }
    return previous[b.length];
  }
  function suggestions(word) {
    return known.map((w, i) => [editDistance(word, w), i]).sort((x, y) => x[0] - y[0] || x[1] - y[1])
      .slice(0, 3).map(pair => known[pair[1]]);
  }
  function message(kind, text) { return `<p class="ab-message" data-message="${kind}">${text}</p>`; }
  function bar(p) {
    return `<td><div class="ab-bar-track"><div class="ab-bar" style="width:${(100 * p).toFixed(1)}%">` +
      `</div></div></td><td>${p.toFixed(3)}</td>`;
  }
  function renderPrediction(r) {
    const p = r.probabilities;
    let best = 0;
    p.forEach((v, c) => { if (v > p[best]) { best = c; } });
    const word = esc(r.tokens[r.wordIndex]);
    let summary = `The model reads <strong>${word}</strong> as <strong>${esc(labels[best])}` +
      `</strong> (probability ${p[best].toFixed(3)})`;
    summary += r.attendedIndex >= 0
      ? `; it attends most to <strong>${esc(r.tokens[r.attendedIndex])}</strong> (★ below).`
      : "; there is no other word to attend to.";
    const own = [];
    labels.forEach((l, c) => { if (l.split("/")[0] === r.tokens[r.wordIndex]) { own.push(c); } });
    const rows = own.map(c => `<tr><th scope="row">${esc(labels[c])}</th>${bar(p[c])}</tr>`);
    if (own.length < labels.length) {
      let rest = 0;
      p.forEach((v, c) => { if (!own.includes(c)) { rest += v; } });
      rows.push(`<tr><th scope="row">the other ${labels.length - own.length} labels</th>${bar(rest)}</tr>`);
    }
    let headCols = "";
    for (let h = 0; h < H; h++) { headCols += `<th scope="col">head ${h}</th>`; }
    const weightRows = r.tokens.map((token, t) => {
      let label = esc(token);
      if (t === r.wordIndex) { label = `<strong>${label}</strong> (itself)`; }
      const attended = t === r.attendedIndex;
      if (attended) {
        label = `<span aria-hidden="true">★ </span>${label}<span class="ab-sr-only"> (most attention)</span>`;
      }
      const cells = [...r.attention.map(row => row[t]), r.mean[t]]
        .map(w => `<td style="background:${cellColour(w)}">${w.toFixed(2)}</td>`).join("");
      return `<tr${attended ? ' class="ab-attended"' : ""}><th scope="row">${label}</th>${cells}</tr>`;
    });
    return `<p class="ab-prediction">${summary}</p>` +
      `<div class="ab-side-by-side"><table><caption>Probability of each sense</caption>` +
      `<thead><tr><th scope="col">label</th><th scope="col">probability as a bar</th>` +
      `<th scope="col">probability</th></tr></thead><tbody>${rows.join("")}</tbody></table>` +
      `<table><caption>Attention from <strong>${word}</strong> to each word</caption>` +
      `<thead><tr><th scope="col">word</th>${headCols}<th scope="col">mean</th></tr></thead>` +
      `<tbody>${weightRows.join("")}</tbody></table></div>` +
      `<p class="ab-note">★ marks the word that <strong>${word}</strong> attends to most: the ` +
      "largest mean weight over the heads, the word itself left out. Each column of weights " +
      "sums to 1.</p>";
  }
  function render(r) {
    const parts = [];
    if (r.words.length) {
      const spans = r.words.map(w => r.unknown.includes(w)
        ? `<span class="ab-word-unknown">${esc(w)} <span class="ab-tag">unknown</span></span>`
        : (r.status === "ok" && w === r.tokens[r.wordIndex])
          ? `<span><strong>${esc(w)}</strong></span>` : `<span>${esc(w)}</span>`);
      parts.push(`<p class="ab-words">Words: ${spans.join(" ")}</p>`);
    }
    if (r.status === "empty") { parts.push(message("empty", `Type a sentence with ${esc(listed)}.`)); }
    r.unknown.forEach(w => {
      const chips = suggestions(w).map(s => `<button type="button" class="ab-chip" ` +
        `data-replace="${esc(w)}" data-word="${esc(s)}">${esc(s)}</button>`).join("");
      parts.push(message("unknown",
        `The model has never seen <strong>${esc(w)}</strong>, so it reads the sentence without it. ` +
        `Replace it with a word it knows: ${chips} (or pick one from the list of all its words below).`));
    });
    if (r.status === "too-long") {
      parts.push(message("too-long",
        `This sentence has ${r.tokens.length} words the model knows; it reads at most ${L} ` +
        `(its context length). Remove ${r.tokens.length - L} of them.`));
    }
    if (r.status === "no-ambiguous-word") {
      parts.push(message("no-ambiguous-word",
        `No ambiguous word: the model tells the senses of ${esc(listed)} apart. Add one of them.`));
    }
    if (r.status === "ok") { parts.push(renderPrediction(r)); }
    return parts.join("");
  }
  const input = root.querySelector("input.ab-sentence-input");
  const output = root.querySelector(".ab-demo-output");
  const live = root.querySelector(".ab-live");
  const wordList = root.querySelector("details.ab-word-list");
  function update() {
    const start = performance.now();
    const r = read(input.value);
    const computed = performance.now();
    output.innerHTML = render(r);
    const drawn = performance.now();
    // What the page computed, for the browser tests (and the curious: inspect the element).
    root.dataset.state = r.status;
    root.dataset.tokens = JSON.stringify(r.tokens);
    root.dataset.wordIndex = String(r.wordIndex);
    root.dataset.attendedIndex = String(r.attendedIndex);
    root.dataset.probabilities = r.probabilities ? JSON.stringify(r.probabilities) : "";
    root.dataset.attention = r.attention ? JSON.stringify(r.attention) : "";
    root.dataset.forwardMs = (computed - start).toFixed(3);
    root.dataset.updateMs = (drawn - start).toFixed(3);
    if (r.unknown.length && wordList) { wordList.open = true; }
  }
  let announceTimer = null;
  function announce() {  // once the reader pauses, so a screen reader is not flooded
    clearTimeout(announceTimer);
    announceTimer = setTimeout(() => {
      const said = [...output.querySelectorAll(".ab-message, .ab-prediction")].map(p => p.textContent);
      live.textContent = said.join(" ");
    }, 400);
  }
  function caretTo(position) { input.focus(); input.setSelectionRange(position, position); }
  function insertWord(word) {
    const at = input.selectionStart === null ? input.value.length : input.selectionStart;
    const before = input.value.slice(0, at), after = input.value.slice(input.selectionEnd || at);
    const left = before && !/\s$/.test(before) ? " " : "";
    const right = after && !/^\s/.test(after) ? " " : "";
    input.value = before + left + word + right + after;
    caretTo((before + left + word).length);
  }
  function replaceWord(unknownWord, word) {
    const pieces = input.value.split(/(\s+)/);
    const at = pieces.findIndex(piece => split(piece)[0] === unknownWord);
    if (at < 0) { insertWord(word); return; }
    pieces[at] = word;
    input.value = pieces.join("");
    caretTo(pieces.slice(0, at + 1).join("").length);
  }
  input.addEventListener("input", () => { update(); announce(); });
  root.addEventListener("click", event => {
    const chip = event.target.closest("button.ab-chip");
    if (!chip || !root.contains(chip)) { return; }
    if (chip.dataset.replace !== undefined) { replaceWord(chip.dataset.replace, chip.dataset.word); }
    else { insertWord(chip.dataset.word); }
    update();
    announce();
  });
  root.abRead = read;  // the browser test times the forward pass with it
  update();
"""


def ambiguity_demo(
    model,
    vocab,
    labels: Sequence[str],
    *,
    element_id: str,
    sentence: str,
    title: str = "Type a sentence: the trained classifier reads it in this page",
) -> HTML:
    """A text box whose sentence chapter 9's trained classifier reads as the reader types.

    The weights travel into the page (:func:`export_classifier`, about 37 KB of base64), and
    the inline script repeats :class:`~attention_book.train.AttentionClassifier`'s forward
    pass in JavaScript: embeddings, positional encoding, one multi-head attention layer with
    its padding mask, ``out_proj``, the linear head. It shows the predicted sense with its
    probabilities and, per head, the attention from the ambiguous word to every word, with a
    star on the word it attends to most; unknown words are skipped and marked, with known
    words offered as buttons; a sentence without an ambiguous word, or longer than the
    context, gets a message instead. The first rendering, for ``sentence``, is computed here
    by :func:`read_sentence` in PyTorch.

    Args:
        model: a trained :class:`~attention_book.train.AttentionClassifier`.
        vocab: its :class:`~attention_book.data.Vocabulary`.
        labels: its class names, ``"word/sense"``.
        element_id: a fixed id, unique on the page.
        sentence: the sentence in the box at first.
        title: the caption above the demo.

    Returns:
        An ``IPython.display.HTML`` with the demo.

    Taught in chapter 9.
    """
    _check_element_id(element_id)
    reading = read_sentence(model, vocab, labels, sentence)
    payload = export_classifier(model, vocab, labels)
    known = list(vocab.itos[1:])
    ambiguous = _ambiguous_words(labels)
    input_id = f"{element_id}-input"
    output = _render_reading(element_id, reading, labels, known, ambiguous, model.context_length)

    def chips(words):
        return "".join(f'<button type="button" class="ab-chip" data-word="{html.escape(w)}">'
                       f"{html.escape(w)}</button>" for w in words)

    others = [w for w in known if w not in ambiguous]
    markup = (
        f'{_STYLE}{_SENTENCE_STYLE}<div class="ab-demo ab-sentence-demo" id="{element_id}" '
        f'data-demo="ambiguity"><p class="ab-demo-title">{html.escape(title)}</p>'
        f'<label for="{input_id}">Your sentence (with {html.escape(", ".join(ambiguous))})</label>'
        f'<input type="text" class="ab-sentence-input" id="{input_id}" '
        f'value="{html.escape(sentence)}" autocomplete="off" spellcheck="false" '
        f'aria-describedby="{element_id}-help">'
        f'<p class="ab-note" id="{element_id}-help">The model reads lower-case words, ignores '
        f"punctuation, knows {len(known)} words (listed below) and reads at most "
        f"{model.context_length} of them.</p>"
        f'<div class="ab-demo-output">{output}</div>'
        f'<p class="ab-live ab-sr-only" aria-live="polite"></p>'
        f'<details class="ab-word-list"><summary>The {len(known)} words the model knows (a '
        "button adds its word at the cursor)</summary>"
        f'<p class="ab-note">Ambiguous words: {chips(ambiguous)}</p>'
        f'<p class="ab-note">Other words: {chips(others)}</p></details></div>'
    )
    return HTML(markup + _script(element_id, {"model": payload}, _SENTENCE_JS))
