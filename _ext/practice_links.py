"""The website's Colab, Binder and download buttons open a chapter's practice version.

A reader who launches a chapter wants to *do* its exercises, so the buttons should not open
the instructor notebook, with every solution filled in and "Correct" stored under it. For
each chapter ``chapters/NN_name.ipynb`` that has a ``practice/NN_name.ipynb`` (written by
``make practice``), this extension

* rewrites the launch buttons (Colab, Binder) of the page to the practice notebook's path
  (``html-page-context``, after the theme has built them);
* replaces the copy of the notebook that the page's download button serves
  (``_sources/chapters/NN_name.ipynb``) with the practice notebook (``build-finished``).

The page itself still shows the chapter, with the solutions folded behind their toggles.
``tests/test_browser.py`` checks the buttons' addresses and the downloaded file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.application import Sphinx

PRACTICE_DIR = "practice"


def _practice_for(app: Sphinx, pagename: str) -> Path | None:
    if not pagename.startswith("chapters/"):
        return None
    practice = Path(app.srcdir, PRACTICE_DIR, Path(pagename).name + ".ipynb")
    return practice if practice.is_file() else None


def _rewrite_launch_buttons(app: Sphinx, pagename: str, templatename: str, context: dict,
                            doctree) -> None:
    if _practice_for(app, pagename) is None:
        return
    chapter, practice = f"{pagename}.ipynb", f"{PRACTICE_DIR}/{Path(pagename).name}.ipynb"
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        for button in group.get("buttons", []):
            if "url" in button:
                button["url"] = button["url"].replace(chapter, practice)


def _serve_practice_downloads(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for docname in app.env.found_docs:
        practice = _practice_for(app, docname)
        target = Path(app.outdir, "_sources", f"{docname}.ipynb")
        if practice is not None and target.exists():
            shutil.copyfile(practice, target)


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _rewrite_launch_buttons, priority=600)
    app.connect("build-finished", _serve_practice_downloads)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
