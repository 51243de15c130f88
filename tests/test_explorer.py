"""attention_book.explorer.explore, driven from Python as a reader drives it in JupyterLab.

Each test sets the widgets' values (the text box, the layer slider, the head and token menus,
the picture switch), which runs the same callbacks as a click in the browser, and compares
what the explorer then shows with the attention that a separately loaded
``load_pretrained(dtype=torch.float64)`` gives for that sentence, layer and head. The static
picture (what a batch run stores and the website shows) and the choice between it and the
live widget are tested too.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import types

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from attention_book import explorer as explorer_module  # noqa: E402
from attention_book.explorer import DEFAULT_SENTENCE, explore  # noqa: E402
from attention_book.pretrained import load_pretrained  # noqa: E402


@pytest.fixture(scope="module")
def packaged():
    """The explorer's own cached (tokenizer, model): what ``explore()`` uses by default."""
    return explorer_module._packaged_model()


@pytest.fixture(scope="module")
def reference():
    """An independent copy of the model: the attention the explorer must show."""
    tokenizer, model = load_pretrained(dtype=torch.float64)

    def attention(sentence):
        encoded = tokenizer(sentence, return_tensors="pt")
        with torch.no_grad():
            layers = model(**encoded, output_attentions=True).attentions
        tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
        return tokens, torch.stack(layers)[:, 0]  # (num_layers, num_heads, T, T)

    return attention


@pytest.fixture
def forward_calls(packaged):
    """Counts the model's forward passes while a test runs."""
    calls = []
    handle = packaged[1].register_forward_hook(lambda *args: calls.append(1))
    yield calls
    handle.remove()


@pytest.fixture
def live_explorer(packaged):
    explorer = explore(*packaged, live=True)
    explorer.widget  # noqa: B018 - build the controls, as displaying it in Jupyter does
    return explorer


def _drawn_close(explorer, expected):
    """The heatmap in the widget holds exactly these weights (as float32, as drawn)."""
    assert explorer.drawn is not None, "no heatmap was drawn"
    torch.testing.assert_close(explorer.drawn, expected.float(), rtol=0, atol=1e-7)


def _png_of(explorer) -> bytes:
    (output,) = explorer.picture.outputs
    return base64.b64decode(output["data"]["image/png"])


def _link_line(tokens, weights_row, layer, head, query):
    key = int(weights_row.argmax())
    return (f"Layer {layer}, head {head}: {tokens[query]!r} (piece {query}) attends most to "
            f"{tokens[key]!r} (piece {key}), weight {float(weights_row[key]):.3f}.")


# --- what the explorer shows first ------------------------------------------------------------


def test_default_is_the_chapters_minute_sentences_at_layer_1_head_6(packaged, reference):
    explorer = explore(*packaged, live=False)
    tokens, attentions = reference(DEFAULT_SENTENCE)
    assert DEFAULT_SENTENCE == "It took one minute. The size was minute."
    assert explorer.tokens == tokens
    assert explorer.pieces() == "Word pieces (12): " + " | ".join(tokens)
    torch.testing.assert_close(explorer.weights, attentions[1, 6], rtol=0, atol=1e-12)
    assert explorer.token_index == tokens.index("minute") == 4
    line = explorer.strongest_link()
    assert line == _link_line(tokens, attentions[1, 6, 4], 1, 6, 4)
    assert "'took' (piece 2)" in line


def test_widgets_start_in_the_explorers_state(live_explorer, reference):
    controls = live_explorer.controls
    assert controls["text"].value == DEFAULT_SENTENCE
    assert (controls["layer"].value, controls["head"].value) == (1, 6)
    assert controls["layer"].max == 5 and len(controls["head"].options) == 13  # "all" + 12 heads
    assert controls["view"].value == "heatmap"
    tokens, attentions = reference(DEFAULT_SENTENCE)
    assert [label for label, _ in controls["token"].options] == [
        f"{i}: {piece}" for i, piece in enumerate(tokens)]
    assert "<code>took</code>" in live_explorer.pieces_area.value
    _drawn_close(live_explorer, attentions[1, 6])
    assert _png_of(live_explorer).startswith(b"\x89PNG")


# --- driving the widgets ------------------------------------------------------------------------


def test_typing_a_sentence_recomputes_the_attention(live_explorer, reference, forward_calls):
    sentence = "The meeting lasted a minute."
    live_explorer.controls["text"].value = sentence
    tokens, attentions = reference(sentence)
    assert len(forward_calls) == 1
    assert live_explorer.tokens == tokens
    assert [value for _, value in live_explorer.controls["token"].options] == list(range(len(tokens)))
    assert live_explorer.controls["token"].value == tokens.index("minute")
    _drawn_close(live_explorer, attentions[1, 6])
    assert live_explorer.link_area.value == (
        "<p>" + _link_line(tokens, attentions[1, 6, 5], 1, 6, 5) + "</p>")
    assert "'lasted'" in live_explorer.link_area.value


def test_layer_and_head_only_redraw(live_explorer, reference, forward_calls):
    tokens, attentions = reference(DEFAULT_SENTENCE)
    before = _png_of(live_explorer)
    live_explorer.controls["layer"].value = 3
    _drawn_close(live_explorer, attentions[3, 6])
    after_layer = _png_of(live_explorer)
    live_explorer.controls["head"].value = 2
    _drawn_close(live_explorer, attentions[3, 2])
    assert live_explorer.link_area.value.startswith(
        "<p>" + _link_line(tokens, attentions[3, 2, 4], 3, 2, 4))
    assert len({before, after_layer, _png_of(live_explorer)}) == 3, "the picture did not change"
    assert forward_calls == [], "changing the layer or head ran the model"


def test_all_heads_grid_and_its_strongest_link(live_explorer, reference, forward_calls):
    tokens, attentions = reference(DEFAULT_SENTENCE)
    live_explorer.controls["layer"].value = 2
    live_explorer.controls["head"].value = "all"
    _drawn_close(live_explorer, attentions[2])  # every head, in order
    rows = attentions[2, :, 4]  # (num_heads, T): where the first 'minute' looks in each head
    head, key = divmod(int(rows.argmax()), rows.shape[-1])
    assert live_explorer.link_area.value.startswith(
        f"<p>Layer 2: the strongest link of 'minute' (piece 4) is in head {head}, to "
        f"{tokens[key]!r} (piece {key}), weight {float(rows[head, key]):.3f}.")
    assert forward_calls == []


def test_choosing_a_token_names_its_strongest_link(live_explorer, reference, forward_calls):
    tokens, attentions = reference(DEFAULT_SENTENCE)
    second_minute = 9
    live_explorer.controls["token"].value = second_minute
    expected = _link_line(tokens, attentions[1, 6, second_minute], 1, 6, second_minute)
    assert live_explorer.link_area.value == f"<p>{expected}</p>"
    assert "'size' (piece 7)" in expected
    assert forward_calls == []


def test_head_view_shows_the_same_weights_under_a_fixed_id(live_explorer, reference, forward_calls):
    tokens, attentions = reference(DEFAULT_SENTENCE)
    live_explorer.controls["layer"].value = 4
    live_explorer.controls["view"].value = "head view"
    (output,) = live_explorer.picture.outputs
    markup = output["data"]["text/html"]
    assert 'id="bertviz-attention-explorer"' in markup
    params = json.loads(re.search(r"const params = (\{.*\});", markup).group(1))
    assert params["layer"] == 4 and params["heads"] == [6]
    view = params["attention"][0]
    assert view["left_text"] == tokens
    torch.testing.assert_close(torch.tensor(view["attn"], dtype=torch.float64),
                               attentions.round(decimals=4), rtol=0, atol=1e-12)
    live_explorer.controls["view"].value = "heatmap"
    _drawn_close(live_explorer, attentions[4, 6])
    assert forward_calls == []


def test_select_from_python_moves_the_controls(live_explorer, reference):
    tokens, attentions = reference(DEFAULT_SENTENCE)
    live_explorer.select(layer=0, head=3, token=7)
    controls = live_explorer.controls
    assert (controls["layer"].value, controls["head"].value, controls["token"].value) == (0, 3, 7)
    _drawn_close(live_explorer, attentions[0, 3])
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 6\)"):
        live_explorer.select(layer=6)
    with pytest.raises(ValueError, match="head must be"):
        live_explorer.select(head=12)
    with pytest.raises(ValueError, match=r"token must be a position in \[0, 12\)"):
        live_explorer.select(token=12)
    assert (live_explorer.layer, live_explorer.head) == (0, 3)


def test_a_sentence_seen_before_costs_no_model_call(live_explorer, forward_calls):
    for sentence in ("It took one hour.", "It took one step.", "It took one hour."):
        live_explorer.controls["text"].value = sentence
    assert len(forward_calls) == 2 and live_explorer.model_calls == 3  # with the first sentence
    live_explorer.controls["text"].value = DEFAULT_SENTENCE
    assert len(forward_calls) == 2


# --- bad input: a message in the widget, never a traceback --------------------------------------


@pytest.mark.parametrize("text", ["", "   \n "])
def test_an_empty_sentence_gets_a_message(live_explorer, forward_calls, text):
    live_explorer.controls["text"].value = text
    assert live_explorer.message == (
        "Type a sentence in the box: an empty text has no word pieces to attend to.")
    assert live_explorer.message in live_explorer.message_area.value
    assert 'role="alert"' in live_explorer.message_area.value
    assert live_explorer.picture.outputs == () and live_explorer.link_area.value == ""
    assert live_explorer.controls["token"].options == () and live_explorer.weights is None
    assert forward_calls == []


def test_a_sentence_over_the_models_length_gets_a_message(live_explorer, forward_calls, capfd):
    live_explorer.tokenizer.deprecation_warnings.clear()  # transformers warns once per tokenizer
    live_explorer.controls["text"].value = "minute " * 600  # 600 pieces + [CLS] and [SEP]
    assert live_explorer.message == (
        "This text has 602 word pieces (with [CLS] and [SEP]), but the model reads at most 512. "
        "Shorten it by 90 or more.")
    assert live_explorer.message in live_explorer.message_area.value
    assert live_explorer.picture.outputs == () and forward_calls == []
    live_explorer.controls["layer"].value = 2  # moving a control meanwhile is harmless
    assert live_explorer.picture.outputs == ()
    assert capfd.readouterr().err == "", "the tokenizer's length warning reached stderr"


def test_the_longest_sentence_the_model_reads_is_accepted(packaged):
    explorer = explore(*packaged, sentence="minute " * 510, live=False)  # 512 pieces
    assert explorer.message == "" and len(explorer.tokens) == 512


def test_a_good_sentence_after_a_message_clears_it(live_explorer, reference):
    live_explorer.controls["text"].value = ""
    live_explorer.controls["text"].value = "The size was minute."
    tokens, attentions = reference("The size was minute.")
    assert live_explorer.message == "" and live_explorer.message_area.value == ""
    _drawn_close(live_explorer, attentions[1, 6])


def test_set_sentence_reports_success(packaged):
    explorer = explore(*packaged, live=False)
    assert explorer.set_sentence("") is False and explorer.strongest_link() == explorer.message
    assert explorer.set_sentence("It took one minute.") is True


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"layer": 6}, "layer must be"),
    ({"head": -1}, "head must be"),
    ({"view": "model view"}, "view must be one of"),
    ({"element_id": "1-bad"}, "element_id must start with a letter"),
])
def test_bad_arguments_are_refused(packaged, kwargs, match):
    with pytest.raises(ValueError, match=match):
        explore(*packaged, **kwargs)


def test_tokenizer_and_model_go_together(packaged):
    with pytest.raises(ValueError, match="pass both tokenizer and model"):
        explore(packaged[0])


def test_without_a_model_it_uses_the_cached_packaged_one(packaged):
    first, second = explore(live=False), explore(live=False)
    assert first.model is second.model is packaged[1]
    assert next(first.model.parameters()).dtype == torch.float64


# --- static picture or live widget --------------------------------------------------------------


@pytest.fixture
def shown(monkeypatch):
    """What IPython's display() received."""
    objects = []
    monkeypatch.setattr("IPython.display.display", lambda *args, **kwargs: objects.extend(args))
    return objects


def test_static_picture_prints_the_lines_and_draws_the_heatmap(packaged, shown, capsys):
    explorer = explore(*packaged, live=False)
    explorer._ipython_display_()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == explorer.pieces()
    assert printed[1] == explorer.strongest_link()
    assert "launch button" in " ".join(printed[2:]) and "Colab" in " ".join(printed[2:])
    (image,) = shown
    assert image.data.startswith(b"\x89PNG")
    assert explorer._widget is None and explorer.controls == {}, "a static run built widgets"


def test_static_picture_of_a_bad_sentence_is_its_message(packaged, shown, capsys):
    explorer = explore(*packaged, sentence="", live=False)
    explorer._ipython_display_()
    assert capsys.readouterr().out == explorer.message + "\n" and shown == []


def test_live_display_shows_the_widget(packaged, shown):
    import ipywidgets

    explorer = explore(*packaged, live=True)
    explorer._ipython_display_()
    assert shown == [explorer.widget] and isinstance(shown[0], ipywidgets.VBox)


class _FakeKernel:
    def __init__(self, allow_stdin):
        self._allow_stdin = allow_stdin


@pytest.mark.parametrize(("shell", "expected"), [
    (None, False),  # plain Python
    (types.SimpleNamespace(), False),  # terminal IPython: no kernel
    (types.SimpleNamespace(kernel=_FakeKernel(False)), False),  # jupyter execute, nbval
    (types.SimpleNamespace(kernel=_FakeKernel(True)), True),  # JupyterLab, Notebook, VS Code
])
def test_a_reader_is_present_when_the_front_end_takes_input(monkeypatch, shell, expected):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    assert explorer_module._reader_is_present() is expected


def test_on_colab_the_widget_is_always_live(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    assert explorer_module._reader_is_present() is True


@pytest.mark.parametrize("present", [True, False])
def test_live_none_decides_when_displayed(packaged, shown, monkeypatch, capsys, present):
    monkeypatch.setattr(explorer_module, "_reader_is_present", lambda: present)
    explorer = explore(*packaged)
    assert explorer.live is None
    explorer._ipython_display_()
    assert (explorer._widget is not None) is present
    assert ("launch button" in capsys.readouterr().out) is not present


# --- the live widget in a real kernel, over the Jupyter messaging protocol ----------------------


def _run_cell(client, code, *, allow_stdin):
    """Execute ``code`` as a front end does; return the cell's iopub messages."""
    msg_id = client.execute(code, allow_stdin=allow_stdin)
    messages = []
    while True:
        message = client.get_iopub_msg(timeout=240)
        if message["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(message)
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return messages


def _comm_updates(client, until):
    """The kernel's widget updates, read until ``until(updates)`` holds (or a minute passes)."""
    import queue
    import time

    updates, deadline = [], time.monotonic() + 60
    while not until(updates) and time.monotonic() < deadline:
        try:
            message = client.get_iopub_msg(timeout=5)
        except queue.Empty:
            continue
        if message["msg_type"] == "comm_msg" and message["content"]["data"].get("method") == "update":
            updates.append(message["content"]["data"]["state"])
    return updates


def test_in_a_kernel_the_widget_is_live_and_answers_the_front_end(reference):
    """What JupyterLab does: run the cell with input allowed, then send the text box's new value.

    The kernel must open the widget models and display the widget (no static picture, no
    stderr), and after the front end's update of the text box it must send the new word
    pieces, the new strongest link and a new heatmap. A batch-style run of the same line
    (input not allowed) must store the static picture and open no widget.
    """
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        messages = _run_cell(client, "from attention_book.explorer import explore\nexplorer = explore()\n"
                                     "explorer", allow_stdin=True)
        kinds = [m["msg_type"] for m in messages]
        assert "error" not in kinds and "stream" not in kinds, messages
        models = {m["content"]["comm_id"]: m["content"]["data"]["state"]["_model_name"]
                  for m in messages if m["msg_type"] == "comm_open"}
        assert {"TextModel", "IntSliderModel", "DropdownModel", "ToggleButtonsModel",
                "OutputModel", "VBoxModel"} <= set(models.values())
        (shown,) = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
        assert "application/vnd.jupyter.widget-view+json" in shown

        sentence = "We waited a minute."
        text_box = next(comm for comm, name in models.items() if name == "TextModel")
        client.session.send(client.shell_channel.socket, client.session.msg("comm_msg", {
            "comm_id": text_box,
            "data": {"method": "update", "state": {"value": sentence}, "buffer_paths": []}}))
        updates = _comm_updates(client, lambda got: any("outputs" in state for state in got))
        tokens, attentions = reference(sentence)
        values = [state["value"] for state in updates if isinstance(state.get("value"), str)]
        assert any(value.startswith(f"<p><b>Word pieces ({len(tokens)}):</b> <code>[CLS]</code> "
                                    "<code>we</code> <code>waited</code>") for value in values), values
        assert "<p>" + _link_line(tokens, attentions[1, 6, 4], 1, 6, 4) + "</p>" in values
        (outputs,) = [state["outputs"] for state in updates if "outputs" in state]
        assert "image/png" in outputs[0]["data"]

        batch = _run_cell(client, "explorer", allow_stdin=False)
        assert [m["msg_type"] for m in batch if m["msg_type"] in ("comm_open", "display_data")] == [
            "display_data"]
        (picture,) = [m["content"]["data"] for m in batch if m["msg_type"] == "display_data"]
        assert "image/png" in picture and "application/vnd.jupyter.widget-view+json" not in picture
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_slow_picture_of_an_older_state_never_covers_a_newer_one(live_explorer):
    """The kernel may handle two widget events at once: the last state must be what is shown.

    JupyterLab showed the old heatmap under the "Type a sentence" message: the heatmap of a
    head chosen just before was still being drawn when the empty sentence's message was shown,
    and it was put in the picture afterwards.
    """
    import threading

    draw, started, release = live_explorer._draw, threading.Event(), threading.Event()

    def slow_draw():
        picture = draw()  # drawn from the state of its own event, then slow to arrive
        started.set()
        assert release.wait(60)
        return picture

    live_explorer._draw = slow_draw
    older = threading.Thread(target=live_explorer.select, kwargs={"head": 2})
    older.start()
    assert started.wait(60)
    live_explorer._draw = draw
    live_explorer.set_sentence("")  # the newer state: a message, no picture
    release.set()
    older.join(60)
    assert not older.is_alive()
    assert live_explorer.picture.outputs == () and live_explorer.drawn is None
    assert "Type a sentence" in live_explorer.message_area.value
    live_explorer.set_sentence("We waited a minute.")  # and the explorer works on
    assert len(live_explorer.picture.outputs) == 1 and live_explorer.drawn is not None
