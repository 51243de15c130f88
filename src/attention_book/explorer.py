"""Explore a pretrained model's attention on your own sentence: an ipywidgets explorer.

``explore(tokenizer, model)`` (``from attention_book.explorer import explore``) returns an
:class:`AttentionExplorer`. In JupyterLab, Jupyter Notebook, VS Code or Colab it shows a text
box for the sentence, a layer slider, a head menu (one head, or all of them as a grid), a
token menu, and a switch between the heatmap and bertviz's head view; below them, the word
pieces the tokenizer made and one line naming the chosen head's strongest link for the chosen
token. Editing the text runs the model once (and remembers the result, so going back to an
earlier sentence is free); moving the layer, head, token or view only redraws.

**Static picture or live widget.** A widget needs a running kernel behind it. The book's
website has none, and a stored widget would show controls that do nothing, so the explorer
stores no widget state at all: displayed in a batch run (``jupyter execute``, nbval,
nbgrader), it prints its word pieces and strongest link and draws its heatmap, a picture
that teaches without a kernel and that nbval can compare. Displayed where a person runs the
cell, it shows the live widget instead. "A person runs the cell" is read from the kernel:
every notebook front end lets a cell ask for keyboard input (``input()``), while batch
runners send their cells with ``allow_stdin=False`` because no one could answer. On Colab the
widget is always shown. ``live=True`` or ``live=False`` overrides the test.
"""

from __future__ import annotations

import functools
import html
import io
import sys
import threading
import warnings
from collections import OrderedDict

import torch

from .checks import check_element_id
from .viz import head_view, plot_attention

__all__ = ["DEFAULT_SENTENCE", "VIEWS", "ALL_HEADS", "AttentionExplorer", "explore"]

#: The explorer's first sentence: chapter 8's two senses of *minute*, side by side.
DEFAULT_SENTENCE = "It took one minute. The size was minute."
#: The two pictures the explorer can draw.
VIEWS = ("heatmap", "head view")
#: The head menu's value for "every head of the layer, as a grid".
ALL_HEADS = "all"

_SPECIAL_TOKENS = ("[CLS]", "[SEP]")
_OUTLINE = "#D55E00"  # Okabe-Ito vermillion: visible on every shade of viridis
_CACHE_SIZE = 16  # sentences whose attention is kept (a few MB at most)
_EMPTY = "Type a sentence in the box: an empty text has no word pieces to attend to."
# One line (it wraps to any screen): what the picture is, and how to make it live.
_LAUNCH = (
    "This is the explorer's static picture: run the cell in Jupyter or Colab to explore live "
    "(on the website, the launch button at the top of the page opens this chapter's practice "
    "notebook in Colab or Binder)."
)


@functools.lru_cache(maxsize=1)
def _packaged_model():
    """The packaged MiniLM in float64, loaded once per process."""
    from .pretrained import load_pretrained

    return load_pretrained(dtype=torch.float64)


def _reader_is_present() -> bool:
    """True when a person runs this cell in a notebook front end, False in a batch run."""
    if "google.colab" in sys.modules:
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    # ipykernel records, for the cell being run, whether its front end may answer input().
    return bool(getattr(kernel, "_allow_stdin", False))


def _png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # A typed character that the font lacks is drawn as a box, not reported on stderr.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _thin_labels(ax, tokens: list[str], most: int, keep: int) -> None:
    """Keep every n-th token label (and token ``keep``'s) when there are more than ``most``."""
    step = -(-len(tokens) // most)
    if step == 1:
        return
    ticks = sorted(set(range(0, len(tokens), step)) | {keep})
    labels = [tokens[t] for t in ticks]
    if len(ax.get_xticks()):
        ax.set_xticks(ticks, labels, rotation=60, ha="right", rotation_mode="anchor")
    if len(ax.get_yticks()):
        ax.set_yticks(ticks, labels)


def _outline_row(ax, row: int, num_tokens: int) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((-0.5, row - 0.5), num_tokens, 1.0, fill=False,
                           edgecolor=_OUTLINE, linewidth=2.0))


class AttentionExplorer:
    """A pretrained model's attention on one sentence, with ipywidgets controls to explore it.

    Build it with :func:`explore`. The state (sentence, layer, head, token, view) can be set
    through the widgets or from Python; :attr:`widget` builds the controls on first use, so
    a batch run that only shows the static picture creates no widget at all.

    Args:
        tokenizer: the model's tokenizer (a ``transformers`` tokenizer).
        model: a ``transformers`` encoder loaded with the eager attention path (as
            :func:`attention_book.pretrained.load_pretrained` does), so it returns weights.
        sentence: the first sentence.
        layer: the first layer shown.
        head: the first head shown, or ``"all"`` for every head of the layer as a grid.
        token: the word piece whose strongest link is named (its first occurrence); when a
            sentence lacks it, the first word piece after ``[CLS]``.
        view: ``"heatmap"`` or ``"head view"``.
        element_id: the fixed HTML id of the head view (``bertviz-<element_id>``).
        live: show the live widget (True), the static picture (False), or decide when
            displayed (None: live where a person runs the cell, see the module's docstring).

    Attributes:
        tokens: the word pieces of the sentence (empty while a message is shown).
        attentions: the sentence's weights, ``(num_layers, num_heads, T, T)``, or None.
        message: what is wrong with the sentence ("" when nothing is).
        model_calls: how many times the model has run (a cached sentence costs none).
        drawn: the weight matrices of the last heatmap drawn in the widget, as the figure
            holds them: ``(T, T)`` for one head, ``(num_heads, T, T)`` for all.
        controls: the widgets by name (``text``, ``layer``, ``head``, ``token``, ``view``).

    Shapes:
        ``attentions`` ``(num_layers, num_heads, T, T)``; :attr:`weights` ``(T, T)`` for one
        head, ``(num_heads, T, T)`` for ``head="all"``; ``T`` counts ``[CLS]`` and ``[SEP]``.

    Taught in chapter 8.
    """

    def __init__(self, tokenizer, model, *, sentence: str = DEFAULT_SENTENCE, layer: int = 1,
                 head: int | str = 6, token: str = "minute", view: str = "heatmap",
                 element_id: str = "attention-explorer", live: bool | None = None):
        config = model.config
        self.tokenizer, self.model = tokenizer, model
        self.num_layers = int(config.num_hidden_layers)
        self.num_heads = int(config.num_attention_heads)
        self.max_tokens = int(getattr(config, "max_position_embeddings", 512))
        self._check_layer(layer)
        self._check_head(head)
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        check_element_id(element_id)
        if live not in (None, True, False):
            raise TypeError(f"live must be None, True or False, got {live!r}")
        self.layer, self.head, self.view = layer, head, view
        self.element_id, self.live = element_id, live
        self.preferred_token = str(token)
        self.sentence, self.message = "", ""
        self.tokens: list[str] = []
        self.attentions: torch.Tensor | None = None
        self.token_index: int | None = None
        self.model_calls = 0
        self.drawn: torch.Tensor | None = None
        self.controls: dict = {}
        self._cache: OrderedDict[str, tuple[list[str], torch.Tensor]] = OrderedDict()
        self._widget = None
        self._syncing = False
        # Every change of the state gets a number; a picture drawn for an older state is not
        # shown. The kernel may handle two widget events at once (a slow heatmap of the old
        # sentence, the message of the new one), and the last state must win.
        self._state_number = 0
        self._showing = threading.Lock()
        self.set_sentence(sentence)

    # --- state ---------------------------------------------------------------------------

    def _check_layer(self, layer) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")

    def _check_head(self, head) -> None:
        if head == ALL_HEADS:
            return
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < self.num_heads:
            raise ValueError(
                f"head must be an int in [0, {self.num_heads}) or {ALL_HEADS!r}, got {head!r}")

    def _encode(self, text: str) -> dict:
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # no "sequence too long" warning: we say it ourselves
        try:
            return self.tokenizer(text, return_tensors="pt")
        finally:
            hf_logging.set_verbosity(verbosity)

    def _attention(self, text: str) -> tuple[list[str], torch.Tensor] | str:
        """The word pieces and weights of ``text``, or a message saying why there are none."""
        if not text.strip():
            return _EMPTY
        if text in self._cache:
            self._cache.move_to_end(text)
            return self._cache[text]
        encoded = self._encode(text)
        num_tokens = encoded["input_ids"].shape[-1]
        if num_tokens > self.max_tokens:
            return (f"This text has {num_tokens} word pieces (with [CLS] and [SEP]), but the "
                    f"model reads at most {self.max_tokens}. Shorten it by "
                    f"{num_tokens - self.max_tokens} or more.")
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
        with torch.no_grad():
            layers = self.model(**encoded, output_attentions=True).attentions
        self.model_calls += 1
        attentions = torch.stack(layers)[:, 0].detach().cpu()  # (num_layers, num_heads, T, T)
        self._cache[text] = (tokens, attentions)
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return tokens, attentions

    def set_sentence(self, text: str) -> bool:
        """Run the model on a new sentence (what the text box does).

        Args:
            text: the sentence; an empty one, or one longer than the model can read, leaves
                a message in :attr:`message` instead of raising.

        Returns:
            True when the sentence was read, False when a message explains why not.
        """
        self.sentence = str(text)
        result = self._attention(self.sentence)
        if isinstance(result, str):
            self.message, self.tokens, self.attentions, self.token_index = result, [], None, None
        else:
            self.message = ""
            self.tokens, self.attentions = result
            self.token_index = self._default_token_index()
        self._update_widgets()
        return not self.message

    def select(self, *, layer: int | None = None, head: int | str | None = None,
               token: int | None = None, view: str | None = None) -> None:
        """Choose what is shown (what the slider and the menus do); the model does not run.

        Args:
            layer: the layer.
            head: a head, or ``"all"`` for every head of the layer as a grid.
            token: the position (in :attr:`tokens`) of the token whose strongest link is named.
            view: ``"heatmap"`` or ``"head view"``.

        Returns:
            None; the widget, when it is built, is redrawn.

        Raises:
            ValueError: a value out of range (a token while a message is shown has none).
        """
        if layer is not None:
            self._check_layer(layer)
        if head is not None:
            self._check_head(head)
        if view is not None and view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
        if token is not None and (isinstance(token, bool) or not isinstance(token, int)
                                  or not 0 <= token < len(self.tokens)):
            raise ValueError(f"token must be a position in [0, {len(self.tokens)}), got {token!r}")
        self.layer = self.layer if layer is None else layer
        self.head = self.head if head is None else head
        self.view = self.view if view is None else view
        if token is not None:
            self.token_index = token
            self.preferred_token = self.tokens[token]
        self._update_widgets()

    def _default_token_index(self) -> int:
        if self.preferred_token in self.tokens:
            return self.tokens.index(self.preferred_token)
        words = [i for i, piece in enumerate(self.tokens) if piece not in _SPECIAL_TOKENS]
        return words[0] if words else 0

    @property
    def weights(self) -> torch.Tensor | None:
        """The weights shown now: ``(T, T)`` for one head, ``(num_heads, T, T)`` for all."""
        if self.attentions is None:
            return None
        layer = self.attentions[self.layer]  # (num_heads, T, T)
        return layer if self.head == ALL_HEADS else layer[self.head]

    def strongest_link(self) -> str:
        """One line: where the chosen token attends most, in the chosen layer and head.

        Returns:
            The line (the message instead, when the sentence could not be read).
        """
        if self.message:
            return self.message
        query = self.token_index
        rows = self.attentions[self.layer, :, query]  # (num_heads, T)
        if self.head == ALL_HEADS:
            head, key = divmod(int(rows.argmax()), rows.shape[-1])
            start = (f"Layer {self.layer}: the strongest link of {self.tokens[query]!r} "
                     f"(piece {query}) is in head {head}, to")
        else:
            head, key = self.head, int(rows[self.head].argmax())
            start = f"Layer {self.layer}, head {head}: {self.tokens[query]!r} (piece {query}) attends most to"
        line = f"{start} {self.tokens[key]!r} (piece {key}), weight {float(rows[head, key]):.3f}."
        if self.tokens[key] in _SPECIAL_TOKENS:
            line += " (A special token: often where a head parks attention it has no use for.)"
        return line

    def pieces(self) -> str:
        """The word pieces as one line, numbered from 0 like the token menu.

        Returns:
            ``"Word pieces (T): [CLS] | it | ..."``, or the message.
        """
        if self.message:
            return self.message
        return f"Word pieces ({len(self.tokens)}): " + " | ".join(self.tokens)

    # --- pictures ------------------------------------------------------------------------

    def _draw(self) -> tuple[bytes, torch.Tensor]:
        """The heatmap of the current state as PNG bytes, and the matrices it shows.

        The figure is a plain ``matplotlib.figure.Figure``, not a pyplot one, so nothing is
        left for pyplot to show later, and drawing from a widget callback has no side effect.
        """
        from matplotlib.figure import Figure

        tokens, row = self.tokens, self.token_index
        num_tokens = len(tokens)
        name = tokens[row]
        if self.head == ALL_HEADS:
            fig, shown = self._heads_grid()
        else:
            size = min(0.4 * num_tokens + 2.5, 9.0)
            fig = Figure(figsize=(size + 1.2, size), layout="constrained")
            ax = fig.subplots()
            plot_attention(self.weights, tokens, ax=ax,
                           title=f"Layer {self.layer}, head {self.head}: "
                                 f"the row of {name!r} is outlined")
            if num_tokens <= 24:  # the numbers of the outlined row, as the line above names them
                top = max(float(self.weights.max()), 1e-6)
                for col, value in enumerate(self.weights[row].tolist()):
                    ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                            color="black" if value > top / 2 else "white")
            shown = [ax]
        for ax in shown:
            _outline_row(ax, row, num_tokens)
            _thin_labels(ax, tokens, most=16 if len(shown) > 1 else 40, keep=row)
        drawn = torch.stack([torch.as_tensor(ax.images[0].get_array().data) for ax in shown])
        return _png(fig), drawn if self.head == ALL_HEADS else drawn[0]

    def _heads_grid(self):
        """Every head of the layer on one colour scale; token labels on the outer panels only.

        Only the left column and the bottom row get tick labels: a panel's ticks are most of
        the drawing time, and the same labels repeated inside the grid add nothing.
        """
        from matplotlib.figure import Figure

        tokens, weights = self.tokens, self.weights  # weights: (num_heads, T, T)
        ncols = min(4, self.num_heads)
        nrows = -(-self.num_heads // ncols)
        panel, gap, left, right, bottom, top = 2.3, 0.3, 1.1, 1.2, 1.1, 0.8  # inches
        width = left + ncols * panel + (ncols - 1) * gap + right
        height = bottom + nrows * panel + (nrows - 1) * gap + top
        fig = Figure(figsize=(width, height))
        grid = fig.subplots(nrows, ncols, squeeze=False, gridspec_kw={
            "left": left / width, "right": 1 - right / width, "bottom": bottom / height,
            "top": 1 - top / height, "wspace": gap / panel, "hspace": gap / panel})
        vmax = max(float(weights.max()), 1e-6)  # one colour scale for every head
        shown = []
        for head, ax in enumerate(grid.flat):
            row, col = divmod(head, ncols)
            if head >= self.num_heads:
                ax.set_visible(False)
                continue
            if col == 0 or row == nrows - 1 or head + ncols >= self.num_heads:
                plot_attention(weights[head], tokens, ax=ax, title=f"head {head}",
                               colorbar=False, vmax=vmax)
                ax.set_xlabel("")
                ax.set_ylabel("")
                ax.tick_params(labelsize=7)
                if col != 0:
                    ax.set_yticks([])
                if head + ncols < self.num_heads:
                    ax.set_xticks([])
            else:
                ax.imshow(weights[head].float().numpy(), cmap="viridis", vmin=0.0, vmax=vmax)
                ax.set_title(f"head {head}")
                ax.set_xticks([])
                ax.set_yticks([])
            shown.append(ax)
        colour_axes = fig.add_axes((1 - (right - 0.25) / width, bottom / height, 0.18 / width,
                                    nrows * panel / height))
        fig.colorbar(shown[0].images[0], cax=colour_axes, label="attention weight")
        fig.supxlabel("key (the token attended to)", y=0.01)
        fig.supylabel("query (the token attending)", x=0.01)
        fig.suptitle(f"Layer {self.layer}, all {self.num_heads} heads: "
                     f"the row of {tokens[self.token_index]!r} is outlined")
        return fig, shown

    def _picture_output(self) -> tuple[dict, torch.Tensor | None]:
        """The picture of the current state as one notebook output, and the weights drawn."""
        import base64

        drawn = None
        if self.view == "head view":
            view = head_view([layer[None] for layer in self.attentions], self.tokens,
                             element_id=self.element_id, layer=self.layer,
                             heads=None if self.head == ALL_HEADS else [self.head])
            data = {"text/html": view.data,
                    "text/plain": f"bertviz head view of layer {self.layer}"}
        else:
            png, drawn = self._draw()
            which = "all heads" if self.head == ALL_HEADS else f"head {self.head}"
            data = {"image/png": base64.b64encode(png).decode("ascii"),
                    "text/plain": f"Heatmap of layer {self.layer}, {which}"}
        return {"output_type": "display_data", "data": data, "metadata": {}}, drawn

    def show_static(self) -> None:
        """Print the word pieces and the strongest link, and draw the heatmap: no widget.

        This is what a batch run stores (and the website shows): the explorer's current
        state, with a line saying where the live explorer is.

        Returns:
            None; the lines are printed and the picture displayed.
        """
        from IPython.display import Image, display

        print(self.pieces())
        if self.message:
            return
        print(self.strongest_link())
        print(_LAUNCH)
        png, _ = self._draw()
        display(Image(data=png))

    # --- widgets -------------------------------------------------------------------------

    @property
    def widget(self):
        """The explorer's ipywidgets interface (built on first use): display it in a notebook."""
        if self._widget is None:
            self._build_widgets()
        return self._widget

    def _build_widgets(self) -> None:
        import ipywidgets as widgets

        wide = widgets.Layout(width="40rem")
        self.controls = {
            "text": widgets.Text(value=self.sentence, description="Sentence",
                                 placeholder="Type a sentence, then press Enter",
                                 continuous_update=False, layout=wide),
            "layer": widgets.IntSlider(value=self.layer, min=0, max=self.num_layers - 1,
                                       description="Layer", continuous_update=False),
            "head": widgets.Dropdown(
                options=[("all (grid)", ALL_HEADS)] + [(f"head {h}", h) for h in range(self.num_heads)],
                value=self.head, description="Head"),
            "token": widgets.Dropdown(options=[], description="Token"),
            "view": widgets.ToggleButtons(options=list(VIEWS), value=self.view,
                                          description="Picture"),
        }
        self.message_area = widgets.HTML()
        self.pieces_area = widgets.HTML()
        self.link_area = widgets.HTML()
        self.picture = widgets.Output()
        self.controls["text"].observe(self._on_text, "value")
        for control in self.controls.values():
            if control is not self.controls["text"]:
                control.observe(self._on_control, "value")
        self._widget = widgets.VBox([
            self.controls["text"],
            widgets.HBox([self.controls["layer"], self.controls["head"], self.controls["token"]]),
            self.controls["view"],
            self.message_area, self.pieces_area, self.link_area, self.picture,
        ])
        self._update_widgets()

    def _on_text(self, change) -> None:
        if not self._syncing:
            self.set_sentence(change["new"])

    def _on_control(self, change) -> None:
        if self._syncing or change["new"] is None:
            return
        name = next(key for key, control in self.controls.items() if control is change["owner"])
        self.select(**{name: change["new"]})

    def _update_widgets(self) -> None:
        """Set the controls to the state (without their callbacks firing), then redraw."""
        if self._widget is None:
            return
        controls = self.controls
        self._syncing = True
        try:
            controls["text"].value = self.sentence
            controls["layer"].value = self.layer
            controls["head"].value = self.head
            controls["view"].value = self.view
            options = [(f"{i}: {piece}", i) for i, piece in enumerate(self.tokens)]
            if list(controls["token"].options) != options:
                controls["token"].options = options
            controls["token"].value = self.token_index
        finally:
            self._syncing = False
        self._render()

    def _render(self) -> None:
        """Redraw the lines and the picture from the state; the model does not run."""
        if self._widget is None:
            return
        with self._showing:
            self._state_number += 1
            number = self._state_number
        if self.message:
            areas = (f'<p role="alert"><b>{html.escape(self.message, quote=False)}</b></p>', "", "")
            outputs, drawn = (), None
        else:
            try:
                pieces = " ".join(f"<code>{html.escape(piece, quote=False)}</code>"
                                  for piece in self.tokens)
                areas = ("", f"<p><b>Word pieces ({len(self.tokens)}):</b> {pieces}</p>",
                         f"<p>{html.escape(self.strongest_link(), quote=False)}</p>")
                output, drawn = self._picture_output()
            except Exception:  # noqa: BLE001 - the state changed under the drawing?
                if number != self._state_number:
                    return  # yes: the newer state is shown by its own call
                raise
            outputs = (output,)
        with self._showing:
            if number != self._state_number:
                return  # a newer state was shown meanwhile: this picture is out of date
            self.message_area.value, self.pieces_area.value, self.link_area.value = areas
            self.picture.outputs = outputs
            self.drawn = drawn

    def _ipython_display_(self) -> None:
        from IPython.display import display

        live = _reader_is_present() if self.live is None else self.live
        if live:
            display(self.widget)
        else:
            self.show_static()


def explore(tokenizer=None, model=None, *, sentence: str = DEFAULT_SENTENCE, layer: int = 1,
            head: int | str = 6, token: str = "minute", view: str = "heatmap",
            element_id: str = "attention-explorer", live: bool | None = None) -> AttentionExplorer:
    """An ipywidgets explorer of a pretrained model's attention on a sentence you type.

    Shows a text box, a layer slider, a head menu (one head or ``"all"`` as a grid), a token
    menu, a switch between the heatmap (:func:`plot_attention`, :func:`plot_heads`) and
    bertviz's head view (:func:`head_view`, with a fixed ``element_id``), the word pieces,
    and one line naming the chosen head's strongest link for the chosen token. A new sentence
    runs the model once (sentences are cached); a new layer, head, token or view only redraws.
    An empty sentence, or one longer than the model reads, gets a message in the widget.

    What a displayed explorer stores: in a batch run (``jupyter execute``, nbval, the book's
    build) no widget, only a static picture (word pieces, strongest link, heatmap, and a line
    saying where the live explorer is), so the website's page teaches without a kernel and
    nbval compares deterministic text. Where a person runs the cell (the front end accepts
    ``input()``, or on Colab) the live widget. ``live`` overrides that choice.

    Args:
        tokenizer: the model's tokenizer; with ``model`` None, both default to the packaged
            MiniLM in float64, loaded once and cached.
        model: a ``transformers`` encoder that returns attention weights (eager attention).
        sentence: the first sentence (default: chapter 8's two senses of *minute*).
        layer: the first layer shown (default 1, the layer of chapter 8's head).
        head: the first head (default 6, the head that links *minute* to *took*), or
            ``"all"``.
        token: the word piece whose strongest link is named.
        view: ``"heatmap"`` or ``"head view"``.
        element_id: the fixed HTML id of the head view, unique on the page.
        live: True (widget), False (static picture) or None (decide when displayed).

    Shapes:
        the explorer's ``attentions`` are ``(num_layers, num_heads, T, T)``; ``weights`` is
        ``(T, T)`` for one head, ``(num_heads, T, T)`` for all.

    Returns:
        An :class:`AttentionExplorer`; make it a cell's last line (or ``display`` it).

    Raises:
        ValueError: a layer, head, view or element id out of range, or only one of
            ``tokenizer`` and ``model`` given.

    Taught in chapter 8.
    """
    if (tokenizer is None) != (model is None):
        raise ValueError("pass both tokenizer and model, or neither (the packaged MiniLM)")
    if model is None:
        tokenizer, model = _packaged_model()
    return AttentionExplorer(tokenizer, model, sentence=sentence, layer=layer, head=head,
                             token=token, view=view, element_id=element_id, live=live)
