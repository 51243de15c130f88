"""The matplotlib backend of the test kernels: matplotlib-inline, plus the figure check.

The top-level ``conftest.py`` sets ``MPLBACKEND=module://attention_book._figure_check_inline``
for everything the tests start, so the kernels that nbval runs the chapters in use this
backend; a reader's Jupyter, ``make execute`` and the website never see it. It is
matplotlib-inline's backend (``matplotlib_inline.backend_inline``: same canvas, same PNGs, same
settings), except that before a figure is shown (``plt.show()``, or at the end of the cell) it
runs :func:`attention_book.figure_check.check_figure`: a figure with overlapping text raises
:class:`~attention_book.figure_check.FigureTextOverlapError` in its cell, listing the overlaps,
so strict nbval fails on it. The figure is then closed, not shown.
"""

from __future__ import annotations

import matplotlib
from IPython.core.getipython import get_ipython
from matplotlib._pylab_helpers import Gcf
from matplotlib_inline import backend_inline as _inline
from matplotlib_inline.backend_inline import (  # noqa: F401 - the backend API matplotlib looks up
    FigureCanvas,
    new_figure_manager,
    new_figure_manager_given_figure,
)

from .figure_check import check_figure

BACKEND = "module://attention_book._figure_check_inline"


def _check_open_figures() -> None:
    """Check every open figure; on an overlap, close them all (nothing left to show) and raise."""
    try:
        for manager in Gcf.get_all_fig_managers():
            check_figure(manager.canvas.figure)
    except Exception:
        _inline.show._to_draw = []
        _inline.show._draw_called = False
        matplotlib.pyplot.close("all")
        raise


def show(close=None, block=None):
    """``plt.show()``: check the open figures, then show them as matplotlib-inline does."""
    _check_open_figures()
    return _inline.show(close=close, block=block)


def flush_figures():
    """At the end of a cell: check the figures drawn, then send them as matplotlib-inline does.

    An overlap raises here, in IPython's ``post_execute`` event, which shows the error in the
    cell's output (nbval fails on it).
    """
    if _inline.show._draw_called:
        _check_open_figures()
    return _inline.flush_figures()


def _enable_in_ipython() -> None:
    """Configure the kernel as matplotlib-inline does, with this module's ``flush_figures``."""
    shell = get_ipython()
    if shell is None:
        return
    from IPython.core.pylabtools import activate_matplotlib

    def configure(*_):
        activate_matplotlib(BACKEND)
        # The inline backend's own set-up (its rc, figure formats, and its post_execute hook),
        # then our hook in place of its hook.
        _inline.configure_inline_support(shell, "inline")
        try:
            shell.events.unregister("post_execute", _inline.flush_figures)
        except ValueError:
            pass
        if flush_figures not in shell.events.callbacks["post_execute"]:
            shell.events.register("post_execute", flush_figures)

    try:
        configure()
    except (ImportError, AttributeError):  # pyplot still importing us: finish after the cell
        def configure_once(*args):
            configure()
            shell.events.unregister("post_run_cell", configure_once)

        shell.events.register("post_run_cell", configure_once)


_enable_in_ipython()
