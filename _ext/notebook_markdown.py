"""Plain notebook markdown in Jupyter and Colab, styled boxes and citations on the website.

A chapter is read in three places. JupyterLab and Colab render CommonMark and show MyST
syntax (``:::{admonition}``, ``{cite}`key```) as raw text, so the notebooks use plain
conventions only, and this extension turns them into MyST while Sphinx reads a notebook
(``source-read``), before myst-nb parses it:

* a blockquote whose first line is ``> **Exercise 2.1 — Title (2 points)**`` becomes an
  ``admonition`` with the class ``exercise`` (the blue-edged exercise box);
* a blockquote whose first line starts with ``> **Note.**`` or ``> **Warning.**`` becomes a
  ``note`` or ``warning`` admonition;
* ``<details><summary>Title</summary>`` … ``</details>`` becomes a ``dropdown``;
* a link to the ``url`` of an entry of ``references.bib`` becomes a citation:
  ``([A et al., 2017](url))`` (several separated by ``; ``) a parenthetical ``{cite:p}``,
  ``[A et al. (2017)](url)`` a textual ``{cite:t}``.

Links between pages are ordinary markdown links (``[chapter 5](05_masks.ipynb)``), which
MyST resolves itself. ``tests/test_notebook_markdown.py`` checks that no notebook holds raw
MyST syntax and that every link to a bibliography entry is converted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

_EXERCISE_TITLE = re.compile(r"^\*\*(Exercise \d+\.\d+ — .+\(\d+ points?\))\*\*\s*$")
_NOTE_TITLE = re.compile(r"^\*\*(Note|Warning)\.\*\*\s*(.*)$")
_DETAILS = re.compile(
    r"^<details>\s*<summary>(?P<title>.*?)</summary>\s*\n(?P<body>.*?)\n</details>[ \t]*$",
    re.S | re.M,
)
_LINK = r"\[(?P<text>[^\]\n]+)\]\((?P<url>https?://[^)\s]+)\)"
_PAREN_GROUP = re.compile(r"\((?P<links>\[[^\]\n]+\]\(https?://[^)\s]+\)"
                          r"(?:;\s*\[[^\]\n]+\]\(https?://[^)\s]+\))*)\)")
_TEXTUAL = re.compile(r"\[(?P<text>[^\]\n]+\(\d{4}[a-z]?\))\]\((?P<url>https?://[^)\s]+)\)")
_BIB_ENTRY = re.compile(r"@\w+\s*\{\s*(?P<key>[^,\s]+)\s*,(?P<body>.*?)\n\}", re.S)
_BIB_URL = re.compile(r"^\s*url\s*=\s*\{(?P<url>[^}]+)\}", re.M)


def bibliography_urls(bib_text: str) -> dict[str, str]:
    """Map each ``url`` field of a BibTeX file to its entry's key."""
    urls: dict[str, str] = {}
    for entry in _BIB_ENTRY.finditer(bib_text):
        found = _BIB_URL.search(entry["body"])
        if found:
            urls[found["url"].strip()] = entry["key"]
    return urls


def _blockquote(lines: list[str], start: int) -> int:
    """Index just after the blockquote that starts at ``lines[start]``."""
    end = start
    while end < len(lines) and lines[end].startswith(">"):
        end += 1
    return end


def _unquote(line: str) -> str:
    return line[2:] if line.startswith("> ") else line[1:]


def _admonitions(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith(">"):
            out.append(line)
            index += 1
            continue
        end = _blockquote(lines, index)
        body = [_unquote(item) for item in lines[index:end]]
        exercise = _EXERCISE_TITLE.match(body[0])
        note = _NOTE_TITLE.match(body[0])
        if exercise:
            rest = body[1:]
            while rest and not rest[0].strip():
                rest = rest[1:]
            out += [f":::{{admonition}} {exercise[1]}", ":class: exercise", *rest, ":::"]
        elif note:
            first = [note[2]] if note[2] else []
            out += [f":::{{{note[1].lower()}}}", *first, *body[1:], ":::"]
        else:
            out += lines[index:end]
        index = end
    return "\n".join(out)


def _dropdowns(text: str) -> str:
    return _DETAILS.sub(lambda m: f":::{{dropdown}} {m['title'].strip()}\n{m['body'].strip()}\n:::",
                        text)


def _citations(text: str, urls: dict[str, str]) -> str:
    def parenthetical(match: re.Match) -> str:
        links = re.findall(_LINK, match["links"])
        keys = [urls.get(url) for _, url in links]
        if None in keys:
            return match[0]
        return f"{{cite:p}}`{','.join(keys)}`"

    def textual(match: re.Match) -> str:
        key = urls.get(match["url"])
        return f"{{cite:t}}`{key}`" if key else match[0]

    return _TEXTUAL.sub(textual, _PAREN_GROUP.sub(parenthetical, text))


def to_myst(markdown: str, urls: dict[str, str]) -> str:
    """Turn a notebook markdown cell's plain conventions into MyST (see the module doc)."""
    return _citations(_dropdowns(_admonitions(markdown)), urls)


def unconverted_citations(markdown: str, urls: dict[str, str]) -> list[str]:
    """Links to a bibliography entry that :func:`to_myst` would leave as plain links."""
    converted = to_myst(markdown, urls)
    return [m["url"] for m in re.finditer(_LINK, converted) if m["url"] in urls]


def _convert_notebook(app: Sphinx, docname: str, source: list[str]) -> None:
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    urls = app.env.notebook_markdown_urls
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for url in unconverted_citations(text, urls):
            logger.warning(f"{docname}: a link to the bibliography entry {urls[url]!r} is not in "
                           "a citation pattern (see _ext/notebook_markdown.py)", location=docname)
        cell["source"] = to_myst(text, urls)
    source[0] = json.dumps(notebook)


def _load_bibliography(app: Sphinx) -> None:
    files = app.config.bibtex_bibfiles or []
    text = "\n".join(Path(app.srcdir, name).read_text(encoding="utf-8") for name in files)
    app.env.notebook_markdown_urls = bibliography_urls(text)


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _load_bibliography)
    app.connect("source-read", _convert_notebook)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
