"""The figure check: overlapping text in a figure is found, and fails the cell that shows it.

``attention_book.figure_check.text_overlaps`` lists the overlaps of one figure; the backend
``attention_book._figure_check_inline``, which the top-level ``conftest.py`` gives every kernel
the tests start, raises in the cell that shows such a figure, so strict nbval fails on it.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_book.figure_check import (  # noqa: E402
    FigureTextOverlapError,
    check_figure,
    text_overlaps,
)
from attention_book.viz import plot_attention, plot_heads  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _sink_figure(legend_loc: str):
    """Chapter 13's sink figure as it was: a legend in the corner where the annotation sits."""
    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(64)
    ax.plot(x, np.exp(-x / 10), label="window of 16")
    ax.plot(x, np.exp(-x / 20), label="window of 16 + 4 sinks")
    ax.annotate("the first token leaves the window", xy=(50, 0.9), xytext=(35, 0.9))
    ax.legend(loc=legend_loc)
    ax.set(title="A window of 16 without and with sinks", xlabel="position", ylabel="loss")
    return fig


def test_a_legend_over_an_annotation_is_found():
    overlaps = text_overlaps(_sink_figure("upper right"))
    assert len(overlaps) == 1
    assert "legend" in overlaps[0].second and "the first token leaves the window" in overlaps[0].first
    assert text_overlaps(_sink_figure("lower left")) == []


def test_colliding_log_axis_tick_labels_are_found():
    """Chapter 13's KV ladder as it was: minor tick labels 3×10¹ and 4×10¹ run together."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(["MHA", "MQA", "GQA"], [300, 35, 140])
    ax.set_xscale("log")
    ax.set_xlim(14, 400)
    ax.set_title("KV memory per token")
    found = {(o.first.split('"')[-2], o.second.split('"')[-2]) for o in text_overlaps(fig)}
    assert ("3×10^1", "4×10^1") in found and ("3×10^2", "4×10^2") in found
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # the usual fix
    assert text_overlaps(fig) == []


def test_overlapping_titles_and_crowded_categories_are_found():
    fig, (left, right) = plt.subplots(1, 2, figsize=(4, 3))
    left.set_title("a long title that runs into the next")
    right.set_title("the next panel's title")
    assert any("title" in o.first and "title" in o.second for o in text_overlaps(fig))
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.bar([f"category number {i}" for i in range(5)], range(5))
    assert any("x tick label" in o.first and "x tick label" in o.second for o in text_overlaps(fig))


def test_the_books_heatmaps_pass():
    """Slanted tick labels count by their rotated box: close, but not overlapping."""
    torch.manual_seed(0)
    tokens = [f"token{i}" for i in range(12)]
    ax = plot_attention(torch.softmax(torch.randn(12, 12), -1), tokens, annotate=True)
    assert text_overlaps(ax.figure) == []
    axes = plot_heads(torch.softmax(torch.randn(4, 10, 10), -1), tokens[:10])
    assert text_overlaps(axes.flat[0].figure) == []


def test_what_is_not_drawn_does_not_count():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("hidden texts")
    ax.text(0.5, 0.5, "drawn")
    ax.text(0.5, 0.5, "invisible", visible=False)
    ax.text(0.5, 0.5, "transparent", alpha=0.0)
    ax.text(5.0, 5.0, "clipped away", clip_on=True)
    ax.text(0.5, 0.5, "   ")
    assert text_overlaps(fig) == []
    ax.text(0.52, 0.5, "drawn too")
    assert len(text_overlaps(fig)) == 1


def test_check_figure_raises_with_every_overlap_listed():
    with pytest.raises(FigureTextOverlapError, match="A window of 16 without and with sinks") as error:
        check_figure(_sink_figure("upper right"))
    assert "legend" in str(error.value) and "Move the legend" in str(error.value)
    check_figure(_sink_figure("lower left"))  # no error
    with pytest.raises(TypeError, match="matplotlib Figure, got Axes"):
        text_overlaps(plt.subplots()[1])


def test_the_test_kernels_fail_a_cell_that_shows_overlapping_text():
    """In a kernel with the tests' environment, plt.show() and the end of a cell both raise on
    an overlapping figure, and a clean figure is shown as a PNG, as matplotlib-inline shows it."""
    import nbformat
    from nbclient import NotebookClient

    assert os.environ["MPLBACKEND"] == "module://attention_book._figure_check_inline"
    setup = ("import matplotlib.pyplot as plt\n"
             "def sinks(loc):\n"
             "    fig, ax = plt.subplots(figsize=(6, 4))\n"
             "    ax.plot([0, 63], [1, 0], label='window of 16')\n"
             "    ax.annotate('the first token leaves the window', xy=(50, 0.9), xytext=(35, 0.9))\n"
             "    ax.legend(loc=loc)\n"
             "    ax.set_title('sinks')\n")
    cells = [setup, "sinks('lower left')\nplt.show()", "sinks('upper right')\nplt.show()",
             "sinks('upper right')", "import matplotlib\nprint(matplotlib.get_backend())"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": os.getcwd()}})
    client.execute()  # the kernel inherits this process's environment, as nbval's kernels do
    outputs = [cell.outputs for cell in notebook.cells]
    assert [o["output_type"] for o in outputs[1]] == ["display_data"]
    assert "image/png" in outputs[1][0]["data"]
    for shown in (outputs[2], outputs[3]):  # plt.show(), and the figure left at the cell's end
        errors = [o for o in shown if o["output_type"] == "error"]
        assert len(errors) == 1 and errors[0]["ename"] == "FigureTextOverlapError", shown
        assert "the first token leaves the window" in errors[0]["evalue"]
        assert not any(o["output_type"] == "display_data" for o in shown)
    assert "attention_book._figure_check_inline" in outputs[4][0]["text"]
