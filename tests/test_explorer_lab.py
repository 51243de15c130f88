"""The attention explorer in a real JupyterLab, driven by a person's keystrokes in Chromium.

``tests/test_explorer.py`` drives the widgets from Python and over the kernel's messaging
protocol; this test checks the last link, the browser side: JupyterLab (with the book's
environment's ``@jupyter-widgets/jupyterlab-manager``) renders the live widget, and typing a
sentence, choosing a head and clearing the box change what it shows, with no traceback in
the page and nothing on the browser console. A missing Chromium fails (``browser`` fixture).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

CELL = "from attention_book.explorer import explore\nexplorer = explore()\nexplorer"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 whose root holds a notebook with the explorer cell."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, tmp_path / "explorer.ipynb")
    port = _free_port()
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", "--allow-root",
         f"--port={port}", "--ServerApp.ip=127.0.0.1", "--ServerApp.token=",
         "--ServerApp.password=", f"--ServerApp.root_dir={tmp_path}",
         f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--LabApp.news_url="],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "lab.log").read_text()
                assert time.monotonic() < deadline, "JupyterLab did not start in 120 s"
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/explorer.ipynb"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _shows(page, selector: str, text: str, timeout: int = 120_000) -> None:
    """Wait until an element matching ``selector`` in the output area contains ``text``."""
    page.wait_for_function(
        "([selector, text]) => [...document.querySelectorAll('.jp-OutputArea ' + selector)]"
        ".some(element => element.innerText.includes(text))",
        arg=[selector, text], timeout=timeout)


def test_the_explorer_is_live_in_jupyterlab(browser, lab):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    errors, outside = [], []
    context.on("console", lambda message: errors.append(message.text)
               if message.type == "error" else None)

    def only_local(route):
        if route.request.url.startswith("http://127.0.0.1:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_local)
    page = context.new_page()
    try:
        page.goto(lab, timeout=120_000)
        page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=120_000)
        # A cell run before the kernel is connected is not run: wait for the status bar.
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
            ".some(item => /\\(ipykernel\\) \\| Idle/.test(item.innerText))", timeout=120_000)
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
        page.keyboard.press("Shift+Enter")

        # The live widget, not the static picture: a text box, and a heatmap in its Output.
        text_box = page.locator(".jp-OutputArea .widget-text input")
        text_box.wait_for(timeout=240_000)
        page.wait_for_selector(".jp-OutputArea .widget-output img", timeout=120_000)
        _shows(page, ".widget-html", "Word pieces (12):")
        _shows(page, ".widget-html", "Layer 1, head 6: 'minute' (piece 4) attends most to "
                                     "'took' (piece 2)")
        assert "static picture" not in page.locator(".jp-OutputArea").first.inner_text()

        text_box.fill("We waited a minute.")
        text_box.press("Enter")
        _shows(page, ".widget-html", "Word pieces (7):")
        _shows(page, ".widget-html", "'minute' (piece 4) attends most to 'waited' (piece 2)")

        page.locator(".jp-OutputArea .widget-dropdown select").first.select_option(label="head 2")
        _shows(page, ".widget-html", "Layer 1, head 2: 'minute' (piece 4)")

        text_box.fill("")
        text_box.press("Enter")
        _shows(page, "[role=alert]", "Type a sentence in the box")
        # The message and the cleared picture are separate widget updates: wait for the second.
        page.wait_for_function("() => document.querySelectorAll("
                               "'.jp-OutputArea .widget-output img').length === 0",
                               timeout=60_000)
        assert page.locator(".jp-OutputArea .widget-output img").count() == 0

        stderr = page.locator(".jp-OutputArea-output[data-mime-type="
                              "'application/vnd.jupyter.stderr']")
        assert stderr.count() == 0, stderr.all_inner_texts()
        assert errors == [], f"JupyterLab logged console errors: {errors}"
        assert outside == [], f"JupyterLab asked another host for: {outside}"
    finally:
        context.close()
