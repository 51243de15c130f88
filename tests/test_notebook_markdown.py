"""Notebook markdown reads well in Jupyter and Colab: no raw MyST, citations as plain links.

The website turns the plain conventions into styled boxes and citations while it reads each
notebook (``_ext/notebook_markdown.py``); these tests check the notebooks hold no MyST syntax
that Jupyter or Colab would show raw, that every link to a bibliography entry is in a pattern
the extension converts, and the conversion itself.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("notebook_markdown",
                                               ROOT / "_ext" / "notebook_markdown.py")
notebook_markdown = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebook_markdown)
URLS = notebook_markdown.bibliography_urls((ROOT / "references.bib").read_text())

RAW_MYST = [
    (re.compile(r"^\s*:{3,}\s*\{"), "a ':::{directive}' fence"),
    (re.compile(r"^\s*`{3,}\s*\{"), "a '```{directive}' fence"),
    (re.compile(r"\{[a-z][\w:-]*\}`"), "a {role}`…` role"),
    (re.compile(r"^\s*\([\w-]+\)=\s*$"), "a (label)= target"),
    (re.compile(r"^\s*:class:"), "a ':class:' option"),
]


def _markdown_cells(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            yield index, "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_raw_myst_syntax_in_notebook_markdown(path):
    found = [f"cell {index}: {what}: {line.strip()[:70]!r}"
             for index, text in _markdown_cells(path)
             for line in text.splitlines()
             for pattern, what in RAW_MYST if pattern.search(line)]
    assert found == [], "Jupyter and Colab would show this raw (see CONTRIBUTING.md):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_bibliography_link_becomes_a_citation(path):
    left = [f"cell {index}: {url}" for index, text in _markdown_cells(path)
            for url in notebook_markdown.unconverted_citations(text, URLS)]
    assert left == []


def test_every_bibliography_entry_has_its_own_url():
    bib = (ROOT / "references.bib").read_text()
    keys = re.findall(r"@\w+\s*\{\s*([^,\s]+)\s*,", bib)
    assert sorted(URLS.values()) == sorted(keys), "an entry has no url, or two share one"


def test_conversion_of_each_convention():
    url = "https://arxiv.org/abs/1706.03762"
    urls = {url: "vaswani2017attention", "https://x.org/b": "b2020"}
    text = (
        "> **Exercise 2.1 — Stable softmax (2 points)**\n>\n> Write `f`.\n> More.\n\n"
        "> **Note.** Careful here.\n> Second line.\n\n"
        "<details><summary>Model answer</summary>\n\nBecause.\n\n</details>\n\n"
        f"As shown ([Vaswani et al., 2017]({url}); [B, 2020](https://x.org/b)) and by "
        f"[Vaswani et al. (2017)]({url}); see [the paper]({url}).\n"
        "> an ordinary quote\n"
    )
    converted = notebook_markdown.to_myst(text, urls)
    assert ":::{admonition} Exercise 2.1 — Stable softmax (2 points)\n:class: exercise\n" \
           "Write `f`.\nMore.\n:::" in converted
    assert ":::{note}\nCareful here.\nSecond line.\n:::" in converted
    assert ":::{dropdown} Model answer\nBecause.\n:::" in converted
    assert "As shown {cite:p}`vaswani2017attention,b2020` and by {cite:t}`vaswani2017attention`" \
        in converted
    assert notebook_markdown.unconverted_citations(text, urls) == [url]
    assert "> an ordinary quote" in converted
