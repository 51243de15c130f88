"""Chapter 15's training, live in the page: watch induction heads form, with no kernel.

The reader presses Train and chapter 15's attention-only :class:`~attention_book.TinyGPT`
(2 layers of 2 heads, ``d_model`` 32, a vocabulary and a context of 32) learns the
repeated-segment task in the browser, step by step, exactly as
:func:`~attention_book.repeat_task.train_on_repeats` trains it: the same initial weights, the
same batches, AdamW with the learning rate falling linearly to 0, and every 10 steps the
same record on the same probe (the loss on the copied tokens, the induction accuracy, and the
previous-token and induction scores of :mod:`attention_book.heads`). The page draws the loss
with the phase change, the scores of every head, and both layers' attention maps for a
sequence the reader picks or types.

Two files of JavaScript do it (``assets/``): ``induction_train.js`` is the model, its
backward pass, AdamW, torch's random generator and the head scores, written by hand and
runnable on its own (the tests run it in Node.js as well as in the page);
``induction_demo.js`` is the page: the controls, a Web Worker that trains while the page
stays responsive, the plots and the maps. This module is the Python side:

* :func:`demo_model`, :func:`demo_probe`, :data:`DEMO_SETTINGS`: the model, the probe and the
  settings of the demo, as chapter 15 builds them;
* :func:`export_parameters` and :func:`parameters_from_export`: weights into the page and back
  (the agreement test starts the page and PyTorch from the same exported weights);
* :func:`induction_training_demo`: the demo itself, whose first rendering (step 0, computed
  here in PyTorch) teaches with no script, and whose plot carries the chapter's own PyTorch
  run as a reference line.

Why by hand and not a library such as TensorFlow.js (core and CPU backend, from npm)? Measured
in headless Chromium on this book's 2-core machine, both trainers in one page at one moment:

* speed: in three runs TensorFlow.js took 5 to 18 s per step of 64 sequences, the hand-written
  code 0.06 to 0.33 s, 55 to 95 times less (on a shared, busy machine, whose load made both
  figures vary; their ratio is what counts). The whole run of 300 steps takes the page 20 s on
  this machine at a load of 3;
* page weight: the demo adds 85 KB to its page (25 KB gzipped), the engine 38 KB of it;
  TensorFlow.js's core and CPU backend are 426 KB minified (121 KB gzipped) before the
  gradients, which ship in its full bundle (1.47 MB, 368 KB gzipped);
* agreement: from the same float32 weights, over 50 steps, both agree with PyTorch's float32
  to a relative 2e-7; only the hand-written code also computes in float64, which repeats the
  chapter's float64 run to the printed digits. It also needs torch's random generator and
  AdamW as PyTorch writes it, which a library would not give either.
"""

from __future__ import annotations

import base64
import html
import json
import math
import struct
from collections.abc import Mapping, Sequence

import torch
from IPython.display import HTML

from ..checks import check_element_id
from ..heads import (
    HeadReport,
    induction_scores_of_weights,
    induction_targets,
    previous_token_scores_of_weights,
    target_keys,
)
from ..model import TinyGPT
from ..repeat_task import RepeatedSegments, repeat_loss, repeated_segments
from ..train import cpu_threads
from .page import RUN_HINT, asset, style

__all__ = [
    "DEMO_SETTINGS",
    "demo_model",
    "demo_probe",
    "export_parameters",
    "parameters_from_export",
    "induction_training_demo",
]

#: The demo's model, task and training, as chapter 15 sets them (sections 15.4 and 15.5):
#: sizes, the repeated segment, 64 sequences a step, AdamW's weight decay, the probe (256
#: held-out sequences drawn with seed 1), a record every 10 steps, and the default run (seed
#: 0, learning rate 0.01, 300 steps, a random offset, learned positions) that the demo starts
#: with.
DEMO_SETTINGS: Mapping[str, object] = {
    "vocab_size": 32, "d_model": 32, "num_heads": 2, "num_layers": 2, "context_length": 32,
    "segment_len": 8, "batch_size": 64, "weight_decay": 0.01, "probe_size": 256,
    "probe_seed": 1, "record_every": 10, "rope_base": 10000.0,
    "seed": 0, "lr": 0.01, "steps": 300, "offset": None, "rope": False,
}
_LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1)
_STEPS = (100, 200, 300, 500)
_OFFSETS = (None, 8, 12, 16, 24)  # None: random, 8 ... 24
_CONTROL_OFFSET = 12  # chapter 15's control (section 15.9)
_MAX_SEED = 2**32 - 1  # torch's CPU generator keeps 32 bits of the seed
_DIGITS = 7  # the reference run travels into the page with 7 decimals
_RECORD_KEYS = ("step", "loss", "accuracy", "previous_token", "induction")


def demo_model(seed: int = 0, *, rope: bool = False, dtype: torch.dtype = torch.float64) -> TinyGPT:
    """Chapter 15's attention-only model, initialised as the chapter does with ``torch.manual_seed(seed)``.

    The global random state is left as it was (the draw happens under
    ``torch.random.fork_rng``); the weights are those of ``torch.manual_seed(seed)`` followed
    by ``TinyGPT(32, 32, 2, 2, 32, attention_only=True, rope=rope)``, which the page repeats
    in JavaScript from the same seed.

    Args:
        seed: the seed of the initial weights, 0 to 2**32 - 1.
        rope: rotary positions (section 15.7) instead of a learned position table.
        dtype: the parameters' dtype; chapter 15 trains in float64.

    Shapes:
        (no tensors in; the model maps ``(B, T)`` token ids to ``(B, T, 32)`` logits)

    Returns:
        A :class:`~attention_book.TinyGPT`.

    Taught in chapter 15.
    """
    _check_seed(seed)
    if not isinstance(rope, bool):
        raise TypeError(f"rope must be a bool, got {type(rope).__name__}")
    s = DEMO_SETTINGS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(s["vocab_size"], s["d_model"], s["num_heads"], s["num_layers"],
                       s["context_length"], attention_only=True, rope=rope,
                       rope_base=s["rope_base"], dtype=dtype)


def demo_probe() -> RepeatedSegments:
    """The demo's probe: chapter 15's 256 held-out sequences with random offsets (seed 1).

    Args:
        (none)

    Shapes:
        tokens and loss_mask ``(256, 32)``.

    Returns:
        A :class:`~attention_book.repeat_task.RepeatedSegments`, the ``probe`` that chapter 15
        passes to ``train_on_repeats`` and that the page draws with the same generator.

    Taught in chapter 15.
    """
    s = DEMO_SETTINGS
    return repeated_segments(s["probe_size"], s["context_length"], s["segment_len"],
                             s["vocab_size"], generator=torch.Generator().manual_seed(s["probe_seed"]))


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int from 0 to {_MAX_SEED}, got {seed!r}")


def export_parameters(model: TinyGPT) -> dict:
    """The weights of a demo model as plain JSON: names, shapes, and the numbers in base64.

    Each parameter travels at the model's precision: a float32 model as little-endian
    float32, a float64 one as float64, so that the page starts from exactly these numbers.

    Args:
        model: a model of the demo's shape (:func:`demo_model`).

    Shapes:
        (the model's parameters; the payload lists each one's shape)

    Returns:
        ``{"dtype": "float32" | "float64", "layout": [[name, shape], ...], "weights": base64}``,
        in the order of ``model.state_dict()``.

    Taught in chapter 15.
    """
    if not isinstance(model, TinyGPT):
        raise TypeError(f"model must be an attention_book.TinyGPT, got {type(model).__name__}")
    state = model.state_dict()
    dtypes = {tensor.dtype for tensor in state.values()}
    if dtypes not in ({torch.float32}, {torch.float64}):
        raise ValueError(f"export a float32 or a float64 model, got dtypes {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    code = "f" if dtype == torch.float32 else "d"
    numbers = [value for tensor in state.values() for value in tensor.detach().cpu().flatten().tolist()]
    data = struct.pack(f"<{len(numbers)}{code}", *numbers)
    return {"dtype": str(dtype).removeprefix("torch."),
            "layout": [[name, list(tensor.shape)] for name, tensor in state.items()],
            "weights": base64.b64encode(data).decode("ascii")}


def parameters_from_export(payload: Mapping) -> dict[str, torch.Tensor]:
    """The tensors of an :func:`export_parameters` payload: a state dict.

    Args:
        payload: what :func:`export_parameters` returned.

    Shapes:
        each tensor has the shape the payload's layout gives it.

    Returns:
        ``{name: tensor}``, ready for ``model.load_state_dict``.

    Taught in chapter 15.
    """
    if not isinstance(payload, Mapping) or not {"dtype", "layout", "weights"} <= payload.keys():
        raise TypeError("payload must be what export_parameters returned: a dict with dtype, "
                        "layout and weights")
    dtype, code, size = {"float32": (torch.float32, "f", 4), "float64": (torch.float64, "d", 8)}[
        payload["dtype"]]
    data = base64.b64decode(payload["weights"])
    count = sum(math.prod(shape) for _, shape in payload["layout"])
    if len(data) != size * count:
        raise ValueError(f"the payload holds {len(data) // size} weights, the layout {count}")
    numbers = struct.unpack(f"<{count}{code}", data)
    state, start = {}, 0
    for name, shape in payload["layout"]:
        n = math.prod(shape)
        state[name] = torch.tensor(numbers[start:start + n], dtype=dtype).reshape(shape)
        start += n
    return state


def _check_reference(reference: Mapping) -> dict:
    """The reference history as lists for the page, its numbers rounded to 7 decimals."""
    if not isinstance(reference, Mapping) or not set(_RECORD_KEYS) <= reference.keys():
        raise TypeError(f"reference must be a history of train_on_repeats, a dict with the keys "
                        f"{list(_RECORD_KEYS)}")
    count = len(reference["step"])
    for key in _RECORD_KEYS:
        if len(reference[key]) != count:
            raise ValueError(f"reference[{key!r}] has {len(reference[key])} records, "
                             f"reference['step'] {count}")
    s = DEMO_SETTINGS
    if count == 0 or reference["step"][0] != 0 or reference["step"][-1] != s["steps"]:
        raise ValueError(f"reference must record steps 0 to {s['steps']} (the demo's default run), "
                         f"got {list(reference['step'][:1])} to {list(reference['step'][-1:])}")
    shape = (s["num_layers"], s["num_heads"])

    def table(scores):
        tensor = torch.as_tensor(scores, dtype=torch.float64)
        if tensor.shape != shape:
            raise ValueError(f"each record's scores must have shape {shape}, got "
                             f"{tuple(tensor.shape)}")
        return [[round(float(v), _DIGITS) for v in row] for row in tensor.tolist()]

    return {"step": [int(step) for step in reference["step"]],
            "loss": [round(float(v), _DIGITS) for v in reference["loss"]],
            "accuracy": [round(float(v), _DIGITS) for v in reference["accuracy"]],
            "previousToken": [table(v) for v in reference["previous_token"]],
            "induction": [table(v) for v in reference["induction"]]}


def _first_record(probe: RepeatedSegments, seed: int) -> dict:
    """What the page shows at step 0 of a run with the default settings and ``seed``: the
    record ``train_on_repeats`` keeps, from one forward pass on the probe (on one thread, the
    fastest for a model this small)."""
    model = demo_model(seed, rope=DEMO_SETTINGS["rope"]).eval()
    with torch.no_grad(), cpu_threads(1):
        logits, all_weights = model(probe.tokens, return_weights=True)  # (B, T, V), L x weights
    weights = torch.stack(list(all_weights))  # (L, B, H, T, T)
    targets = induction_targets(probe.tokens)  # (B, T, T)
    right = logits[:, :-1].argmax(dim=-1) == probe.tokens[:, 1:]  # (B, T - 1)
    return {"loss": repeat_loss(logits, probe).item(),
            "accuracy": right[probe.loss_mask[:, :-1]].double().mean().item(),
            "previous_token": previous_token_scores_of_weights(weights, target_keys(targets)).tolist(),
            "induction": induction_scores_of_weights(weights, targets).tolist(),
            "threshold": HeadReport.threshold}


def _sequences(probe: RepeatedSegments) -> list[tuple[str, list[int]]]:
    """The probe sequences the reader can pick: (label, token ids)."""
    s = DEMO_SETTINGS
    # Section 15.6's sequence: the probe's with the fewest queries that have a target.
    with_target = induction_targets(probe.tokens).any(dim=-1).sum(dim=-1)  # (B,)
    chapter = probe.tokens[int(with_target.argmin())].tolist()
    control = repeated_segments(1, s["context_length"], s["segment_len"], s["vocab_size"],
                                offset=_CONTROL_OFFSET,
                                generator=torch.Generator().manual_seed(2)).tokens[0].tolist()
    half = s["context_length"] // 2
    return [("section 15.6's held-out sequence", chapter),
            (f"a copy {_CONTROL_OFFSET} tokens after the first (the control's offset)", control),
            (f"0 to {half - 1}, then 0 to {half - 1} again", list(range(half)) * 2),
            (f"no repeat: 0 to {s['context_length'] - 1}", list(range(s["context_length"])))]


# The plots: two SVGs drawn here for the first rendering and redrawn by the script.
_PLOT = {"width": 320, "height": 190, "left": 40, "right": 10, "top": 22, "bottom": 34}
_LOSS_MAX = 4.0  # the loss axis starts at 0 ... 4 and grows (to 8 at most) when a run goes higher
_COLOURS = {"probe": "#0072B2", "batch": "#56B4E9", "reference": "#000000",
            "previous": "#E69F00", "induction": "#009E73", "grid": "#8c959f"}


def _x(step: float, steps: int) -> float:
    p = _PLOT
    return p["left"] + (p["width"] - p["left"] - p["right"]) * step / steps


def _y(value: float, top: float) -> float:
    p = _PLOT
    value = min(max(value, 0.0), top)
    return p["height"] - p["bottom"] - (p["height"] - p["top"] - p["bottom"]) * value / top


def _path(steps: Sequence[int], values: Sequence[float], total: int, top: float) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{_x(s, total):.1f},{_y(v, top):.1f}"
                    for i, (s, v) in enumerate(zip(steps, values, strict=True)))


def _axes(title: str, label: str, top: float, ticks: Sequence[float], steps: int) -> str:
    p = _PLOT
    parts = [f'<text x="{p["left"]}" y="13" font-weight="600">{html.escape(title)}</text>',
             '<g class="ab-yticks">']
    for tick in ticks:
        y = _y(tick, top)
        parts.append(f'<line x1="{p["left"]}" x2="{p["width"] - p["right"]}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" stroke="#d0d7de"/><text x="{p["left"] - 4}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{tick:g}</text>')
    parts.append('</g><g class="ab-xticks">')
    for step in range(0, steps + 1, 100):
        x = _x(step, steps)
        parts.append(f'<text x="{x:.1f}" y="{p["height"] - p["bottom"] + 14}" '
                     f'text-anchor="middle">{step}</text>')
    parts.append("</g>")
    parts.append(f'<text x="{(p["left"] + p["width"] - p["right"]) / 2:.1f}" '
                 f'y="{p["height"] - 4}" text-anchor="middle">training step</text>')
    parts.append(f'<text transform="translate(11 {(p["top"] + p["height"] - p["bottom"]) / 2:.1f}) '
                 f'rotate(-90)" text-anchor="middle">{html.escape(label)}</text>')
    return "".join(parts)


def _loss_svg(element_id: str, reference: dict | None, first: dict) -> str:
    steps = DEMO_SETTINGS["steps"]
    chance = math.log(DEMO_SETTINGS["vocab_size"])
    parts = [_axes("Loss on the copied tokens", "cross-entropy (nats)", _LOSS_MAX,
                   (0, 1, 2, 3, 4), steps)]
    y = _y(chance, _LOSS_MAX)
    parts.append(f'<line class="ab-chance" x1="{_PLOT["left"]}" '
                 f'x2="{_PLOT["width"] - _PLOT["right"]}" y1="{y:.1f}" y2="{y:.1f}" '
                 f'stroke="{_COLOURS["grid"]}" stroke-dasharray="1 3"/>')
    start = _path([0], [first["loss"]], steps, _LOSS_MAX)
    parts.append(f'<path class="ab-batch" d="" fill="none" stroke="{_COLOURS["batch"]}" '
                 f'stroke-width="1"/><path class="ab-probe" d="{start}" '
                 f'fill="none" stroke="{_COLOURS["probe"]}" stroke-width="2"/>'
                 f'<circle class="ab-probe-now" cx="{_x(0, steps):.1f}" '
                 f'cy="{_y(first["loss"], _LOSS_MAX):.1f}" r="3" fill="{_COLOURS["probe"]}"/>')
    if reference is not None:  # on top: where the runs agree, its dashes lie on the blue line
        line = _path(reference["step"], reference["loss"], steps, _LOSS_MAX)
        parts.append(f'<path class="ab-ref" d="{line}" fill="none" '
                     f'stroke="{_COLOURS["reference"]}" stroke-width="1.2" stroke-dasharray="5 3"/>')
    label = ("Line chart of the loss on the copied tokens against the training step"
             + (", with chapter 15's own run as a dashed line" if reference else ""))
    return (f'<svg id="{element_id}-loss" viewBox="0 0 {_PLOT["width"]} {_PLOT["height"]}" '
            f'role="img" aria-labelledby="{element_id}-loss-title"><title id="{element_id}-loss-title">'
            f'{html.escape(label)}</title>{"".join(parts)}</svg>')


def _score_svg(element_id: str, first: dict) -> str:
    steps = DEMO_SETTINGS["steps"]
    parts = [_axes("Head scores on the probe", "score", 1.0, (0, 0.25, 0.5, 0.75, 1), steps)]
    y = _y(first["threshold"], 1.0)
    parts.append(f'<line x1="{_PLOT["left"]}" x2="{_PLOT["width"] - _PLOT["right"]}" '
                 f'y1="{y:.1f}" y2="{y:.1f}" stroke="#000" stroke-dasharray="2 2"/>')
    for kind, layer, key in (("previous", 0, "previous_token"), ("induction", 1, "induction")):
        for head in range(DEMO_SETTINGS["num_heads"]):
            value = first[key][layer][head]
            dash = ' stroke-dasharray="2 2"' if head else ""
            parts.append(f'<path class="ab-score" data-kind="{kind}" data-head="{head}" '
                         f'd="{_path([0], [value], steps, 1.0)}" fill="none" '
                         f'stroke="{_COLOURS[kind]}" stroke-width="2"{dash}/>')
    label = ("Line chart of the previous-token scores of layer 0's heads and the induction "
             "scores of layer 1's heads against the training step, with the threshold of 0.5")
    return (f'<svg id="{element_id}-scores" viewBox="0 0 {_PLOT["width"]} {_PLOT["height"]}" '
            f'role="img" aria-labelledby="{element_id}-scores-title"><title id="{element_id}-scores-title">'
            f'{html.escape(label)}</title>{"".join(parts)}</svg>')


def _swatch(colour: str, dash: str = "", width: int = 2) -> str:
    dash = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<svg width="22" height="8" aria-hidden="true"><line x1="1" y1="4" x2="21" y2="4" '
            f'stroke="{colour}" stroke-width="{width}"{dash}/></svg>')


def _status(step: int, steps: int, record: dict) -> str:
    return (f"Step {step} of {steps}. On the probe: loss on the copied tokens "
            f"{record['loss']:.2f} nats (a uniform guess: "
            f"{math.log(DEMO_SETTINGS['vocab_size']):.2f}), induction accuracy "
            f"{100 * record['accuracy']:.1f} % (chance: {100 / DEMO_SETTINGS['vocab_size']:.1f} %).")


def _head_rows(record: dict, threshold: float) -> str:
    rows = []
    for layer in range(DEMO_SETTINGS["num_layers"]):
        for head in range(DEMO_SETTINGS["num_heads"]):
            previous = record["previous_token"][layer][head]
            induction = record["induction"][layer][head]
            roles = [role for role, score in (("previous-token head", previous),
                                              ("induction head", induction)) if score >= threshold]
            rows.append(f'<tr><th scope="row">L{layer}H{head}</th><td>{previous:.2f}</td>'
                        f'<td>{induction:.2f}</td><td>{", ".join(roles) or "-"}</td></tr>')
    return "".join(rows)


def _select(element_id: str, name: str, label: str, options: Sequence[tuple[str, str]],
            selected: str) -> str:
    choices = "".join(f'<option value="{html.escape(value)}"'
                      f'{" selected" if value == selected else ""}>{html.escape(text)}</option>'
                      for value, text in options)
    return (f'<span class="ab-setting"><label for="{element_id}-{name}">{html.escape(label)}</label>'
            f'<select id="{element_id}-{name}" data-setting="{name}">{choices}</select></span>')


def induction_training_demo(
    *,
    element_id: str,
    seed: int = 0,
    reference: Mapping | None = None,
    title: str = "Train chapter 15's model in this page and watch its induction heads form",
) -> HTML:
    """A demo that trains chapter 15's attention-only model in the reader's browser.

    Train, Pause, Step and Reset drive :func:`~attention_book.repeat_task.train_on_repeats`
    repeated in JavaScript (``assets/induction_train.js``) in a Web Worker, so the page stays
    responsive. As it trains the page shows the loss on the copied tokens of the probe (and of
    each training batch), every head's previous-token and induction score on the probe (the
    scores that :func:`~attention_book.find_heads` reports), and both layers' attention maps
    for a sequence the reader picks or types, with its induction targets circled. The settings
    are those of chapter 15's experiments: the seed, the learning rate, a random or fixed offset
    (the control of section 15.9), learned positions or RoPE (section 15.7), and the number of
    steps. With the default settings the page repeats the chapter's run: the same weights, the
    same batches, the same numbers to about 1e-14 (float64, as the chapter trains).

    The first rendering (step 0 of the default run: the loss, the scores) is computed here in
    PyTorch, so the demo says something even where its script does not run.

    Args:
        element_id: a fixed id, unique on the page.
        seed: the seed the demo starts with (the reader can change it), 0 to 2**32 - 1.
        reference: a history of ``train_on_repeats`` of the run the demo starts with (``seed``,
            learning rate 0.01, 300 steps, random offsets, learned positions, the probe of
            :func:`demo_probe`), such as chapter 15's own; drawn as a dashed line over the
            loss, for comparison. None: no reference line.
        title: the caption above the demo.

    Shapes:
        (no tensors)

    Returns:
        An ``IPython.display.HTML`` with the demo (about 85 KB, 25 KB gzipped).

    Taught in chapter 15.
    """
    check_element_id(element_id)
    _check_seed(seed)
    ref = None if reference is None else _check_reference(reference)
    s = DEMO_SETTINGS
    probe = demo_probe()
    first = _first_record(probe, seed)
    sequences = _sequences(probe)
    steps = s["steps"]
    e = element_id
    lr_options = [(f"{lr:g}", f"{lr:g}" + (" (the chapter's)" if lr == s["lr"] else ""))
                  for lr in _LEARNING_RATES]
    step_options = [(str(n), str(n) + (" (the chapter's)" if n == steps else "")) for n in _STEPS]
    offset_options = [("random", "random, 8 to 24 (the chapter's)")] + [
        (str(o), f"fixed at {o}" + (" (the control, 15.9)" if o == _CONTROL_OFFSET else ""))
        for o in _OFFSETS if o is not None]
    settings = (
        f'<fieldset class="ab-train-settings"><legend>Settings (a change starts a new run)</legend>'
        f'<span class="ab-setting"><label for="{e}-seed">Seed</label><input type="number" '
        f'id="{e}-seed" data-setting="seed" min="0" max="{_MAX_SEED}" step="1" '
        f'value="{seed}"></span>'
        + _select(e, "lr", "Learning rate", lr_options, f"{s['lr']:g}")
        + _select(e, "offset", "Offset of the copy", offset_options, "random")
        + _select(e, "positions", "Positions", [("learned", "learned (the chapter's)"),
                                                ("rope", "RoPE (section 15.7)")], "learned")
        + _select(e, "steps", "Steps", step_options, str(steps))
        + "</fieldset>")
    buttons = (
        '<div class="ab-train-buttons" role="group" aria-label="Training">'
        '<button type="button" class="ab-primary" data-action="train" disabled>Train</button>'
        '<button type="button" data-action="pause" disabled>Pause</button>'
        '<button type="button" data-action="step" disabled>Step</button>'
        '<button type="button" data-action="reset" disabled>Reset</button></div>')
    legend = (
        '<ul class="ab-legend">'
        f'<li>{_swatch(_COLOURS["probe"])}probe (held out)</li>'
        f'<li>{_swatch(_COLOURS["batch"], width=1)}training batch</li>'
        + (f'<li>{_swatch(_COLOURS["reference"], "5 3", 1)}chapter 15\'s run (PyTorch)</li>'
           if ref else "")
        + f'<li>{_swatch(_COLOURS["grid"], "1 3", 1)}uniform guess, ln 32</li>'
        f'<li>{_swatch(_COLOURS["previous"])}L0H0 previous-token</li>'
        f'<li>{_swatch(_COLOURS["previous"], "2 2")}L0H1 previous-token</li>'
        f'<li>{_swatch(_COLOURS["induction"])}L1H0 induction</li>'
        f'<li>{_swatch(_COLOURS["induction"], "2 2")}L1H1 induction</li>'
        f'<li>{_swatch("#000", "2 2", 1)}threshold {first["threshold"]:g}</li></ul>')
    table = (
        f'<table class="ab-head-table"><caption>Every head\'s scores on the probe, at step '
        f'<span class="ab-record-step">0</span></caption><thead><tr><th scope="col">head</th>'
        f'<th scope="col">previous-token</th><th scope="col">induction</th>'
        f'<th scope="col">role (score &ge; {first["threshold"]:g})</th></tr></thead>'
        f'<tbody>{_head_rows(first, first["threshold"])}</tbody></table>')
    chosen = sequences[0][1]
    sequence_options = "".join(f'<option value="{index}">{html.escape(label)}</option>'
                               for index, (label, _) in enumerate(sequences))
    maps = "".join(
        f'<figure class="ab-map"><canvas id="{e}-map-{layer}-{head}" width="320" height="320" '
        f'role="img" aria-label="Attention weights of L{layer}H{head}">The script draws the '
        f'attention weights of L{layer}H{head} here.</canvas><figcaption>L{layer}H{head}: layer '
        f'{layer}, head {head}</figcaption></figure>'
        for layer in range(s["num_layers"]) for head in range(s["num_heads"]))
    probe_part = (
        f'<p class="ab-demo-title">Both layers\' attention on one sequence</p>'
        f'<span class="ab-setting"><label for="{e}-sequence">Sequence</label><select '
        f'id="{e}-sequence">{sequence_options}<option value="typed">the tokens typed below'
        f'</option></select></span><br><label for="{e}-tokens">Tokens (2 to '
        f'{s["context_length"]} ids from 0 to {s["vocab_size"] - 1}, separated by spaces)</label>'
        f'<input type="text" class="ab-token-input" id="{e}-tokens" autocomplete="off" '
        f'spellcheck="false" value="{" ".join(map(str, chosen))}" aria-describedby="{e}-maps-note">'
        f'<div class="ab-token-message"></div><div class="ab-maps">{maps}</div>'
        f'<p class="ab-note" id="{e}-maps-note">Each map: a row per query position (top: 0), a '
        f"column per key; darker blue is more weight. Orange circles mark the induction targets "
        f"(the token after each earlier copy of the query's token); a previous-token head lights "
        f"the diagonal just below the main one.</p>")
    look_for = (
        '<details class="ab-look-for" open><summary>What to look for, and what to try</summary><ul>'
        "<li>Press <strong>Train</strong>. For about 80 steps little happens: the loss stays near "
        "ln 32, a uniform guess. Then, within some 40 steps, it falls: the <em>phase change</em>. "
        "In the same steps one head of layer 0 turns into a previous-token head (a bright "
        "diagonal just below the main one) and the heads of layer 1 find the induction targets "
        "(the circles), as section 15.5 shows.</li>"
        "<li>With the chapter's settings your run lies on the dashed line: the page computes "
        "the chapter's own numbers.</li>"
        "<li>Set the offset to <strong>fixed at 12</strong>: the control of section 15.9. The "
        "training batches' loss falls fast, the probe's (random offsets) does not, and no "
        "induction head forms: position alone solves the task.</li>"
        "<li>Choose <strong>RoPE</strong> (section 15.7): the loss falls lower, and the "
        "previous-token head works at every position.</li>"
        "<li>Try other <strong>seeds</strong> (which head does which job changes) and "
        "<strong>learning rates</strong> (the phase change comes earlier, later, or not at "
        "all).</li></ul></details>")
    markup = (
        f'{style("induction.css")}<div class="ab-demo ab-train-demo" id="{e}" data-demo="induction">'
        f'<p class="ab-demo-title">{html.escape(title)}</p>{RUN_HINT}{buttons}{settings}'
        f'<div class="ab-demo-output">'
        f'<p class="ab-train-status" id="{e}-status">{html.escape(_status(0, steps, first))}</p>'
        f'<div class="ab-side-by-side"><div class="ab-plot">{_loss_svg(e, ref, first)}</div>'
        f'<div class="ab-plot">{_score_svg(e, first)}</div></div>{legend}{table}{probe_part}</div>'
        f'<p class="ab-live ab-sr-only" aria-live="polite"></p>{look_for}</div>'
    )
    data = {
        "config": {"vocabSize": s["vocab_size"], "dModel": s["d_model"], "numHeads": s["num_heads"],
                   "numLayers": s["num_layers"], "contextLength": s["context_length"],
                   "segmentLen": s["segment_len"], "batchSize": s["batch_size"],
                   "weightDecay": s["weight_decay"], "probeSize": s["probe_size"],
                   "probeSeed": s["probe_seed"], "recordEvery": s["record_every"],
                   "ropeBase": s["rope_base"]},
        "threshold": first["threshold"],
        "maxSeed": _MAX_SEED,
        "plot": {**_PLOT, "lossMax": _LOSS_MAX, "colours": _COLOURS},
        "reference": ref,
        "sequences": [tokens for _, tokens in sequences],
    }
    return HTML(markup + _script(element_id, data))


def _script(element_id: str, data: dict) -> str:
    """The demo's ``<script>``: the engine and the page in one scope (see ``page.script``)."""
    payload = json.dumps(data, sort_keys=True)
    return ('<script>\n(function () {\n  "use strict";\n'
            f"  const root = document.getElementById({json.dumps(element_id)});\n"
            "  if (!root) { return; }\n"
            f"  const data = {payload};\n"
            f"{asset('common.js')}{asset('induction_train.js')}{asset('induction_demo.js')}"
            "  inductionDemo(root, data);\n"
            "})();\n</script>")
