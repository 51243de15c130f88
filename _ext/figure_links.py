"""Figures a phone can read: each keeps the width at which its smallest text is 9 CSS px.

The chapters' figures are PNGs drawn for a desktop column (about 690 px) or wider, at 100 dpi.
Shrunk to a 390 px phone's column (358 px), most show their labels at 3 to 6 CSS px, which no
one reads without pinching. So on screens narrower than 992 px (phones and tablets, where the
sidebar folds away) every figure keeps a *readable width*: the width at which its smallest text
is 9 CSS px, never more than its own width. A figure wider than the column then scrolls
sideways in its output box, which fades at its right edge until scrolled to the end
(``_static/wide_outputs.js``), and one tap switches it between that size and the whole figure
fitted to the column (``_static/figure_fit.js``); on a desktop nothing changes.

The readable width comes from the figure's smallest text: its size in points and its dpi, which
``tools/figure_text.py`` measured by running the chapters and stored in ``figure_text.json``
(next to this file) under the PNG's SHA-256. At ``pt`` points and ``dpi`` dots per inch that text
is ``pt * dpi / 72`` pixels high in the PNG, so it reaches 9 CSS px at a width of
``natural_width * 9 / (pt * dpi / 72)``. A figure the table does not know keeps its natural
width on small screens (readable, if wide), and ``tests/test_browser.py`` reports it.

Every figure is also a link to its image file (``<a class="ab-full-size" href="../_images/….png">``,
with the file name Sphinx gives the image once it has copied it); an image that is already a link
is left alone. A figure that stands on its own (a notebook output, not an image inside a
sentence) sits in a box of its own, ``<div class="ab-figure">``, that scrolls sideways; the box
(or, for an image inside a sentence, the link) carries the readable width as the CSS variable
``--ab-readable-width``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import posixpath
from html import escape
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx

TABLE = Path(__file__).with_name("figure_text.json")
SMALLEST_CSS_PX = 9.0  # the smallest text a reader should meet, in CSS pixels


class full_size_link(nodes.General, nodes.Element):  # noqa: N801 - docutils names nodes so
    """A link around an image to the image file itself."""


def load_table() -> dict[str, dict]:
    if not TABLE.is_file():
        return {}
    return json.loads(TABLE.read_text(encoding="utf-8"))["figures"]


def png_width(data: bytes) -> int | None:
    """The width of a PNG, from its header; None for anything else."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big")
    return None


def readable_width(natural: int, smallest_pt: float, dpi: float) -> int:
    """The width (CSS px) at which text of ``smallest_pt`` points, drawn at ``dpi``, is 9 px;
    at most the figure's own width."""
    text_px = smallest_pt * dpi / 72
    return min(natural, math.ceil(natural * SMALLEST_CSS_PX / text_px))


def _image_file(app: Sphinx, docname: str, uri: str) -> Path | None:
    for candidate in (Path(uri), Path(app.srcdir) / uri, Path(app.env.relfn2path(uri, docname)[1])):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _table(modified_ns: int) -> dict[str, dict]:
    return load_table()


def _wrap_images(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    table = _table(TABLE.stat().st_mtime_ns if TABLE.is_file() else 0)
    for image in list(doctree.findall(nodes.image)):
        if isinstance(image.parent, (nodes.reference, full_size_link)):
            continue
        link = full_size_link()
        path = _image_file(app, docname, image["uri"])
        if path is not None:
            data = path.read_bytes()
            natural = png_width(data)
            row = table.get(hashlib.sha256(data).hexdigest())
            if natural:
                link["readable_width"] = (readable_width(natural, row["smallest_pt"], row["dpi"])
                                          if row else natural)
        image.replace_self(link)
        link.append(image)
        # A figure of its own (not an image inside a sentence) gets a box that scrolls sideways.
        link["block"] = not isinstance(link.parent, nodes.TextElement)


def _visit_html(self, node: full_size_link) -> None:
    image = node.next_node(nodes.image)
    uri = image["uri"]
    images = getattr(self.builder, "images", {})
    target = posixpath.join(self.builder.imgpath, images[uri]) if uri in images else uri
    style = (f' style="--ab-readable-width: {node["readable_width"]}px"'
             if node.get("readable_width") else "")
    box = f'<div class="ab-figure"{style}>' if node.get("block") else ""
    self.body.append(f'{box}<a class="ab-full-size reference internal image-reference" '
                     f'href="{escape(target)}"{"" if box else style}>')


def _depart_html(self, node: full_size_link) -> None:
    self.body.append("</a></div>" if node.get("block") else "</a>")


def _pass(self, node: full_size_link) -> None:
    pass


def _outdated(app: Sphinx, env, added, changed, removed) -> list[str]:
    """A new measurement of the figures rewrites every page with a figure."""
    digest = hashlib.sha256(TABLE.read_bytes()).hexdigest() if TABLE.is_file() else ""
    if getattr(env, "ab_figure_text_digest", None) == digest:
        return []
    env.ab_figure_text_digest = digest
    return [doc for doc in env.found_docs if doc.startswith("chapters/")]


def setup(app: Sphinx) -> dict:
    app.connect("env-get-outdated", _outdated)
    app.add_node(full_size_link, html=(_visit_html, _depart_html),
                 latex=(_pass, _pass), text=(_pass, _pass), man=(_pass, _pass),
                 texinfo=(_pass, _pass))
    app.connect("doctree-resolved", _wrap_images)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
