"""Every figure links to its full-size image: one tap opens it at its own resolution.

The chapters' figures are drawn for a desktop column (about 690 px) or wider, and the page
shrinks them to the column (``_static/custom.css``): on a 390 px phone most show at under half
their size, with labels a few pixels high. Sphinx links an image to its full-size file only
when the image was scaled by an option (``html_scaled_image_link``), which notebook outputs
never are. This extension wraps every image of the page's content in such a link
(``doctree-resolved``: a :class:`full_size_link` node around the image; written as
``<a class="ab-full-size" href="../_images/….png">``, with the file name Sphinx gives the
image once it has copied it). An image that is already a link is left alone.

``tests/test_browser.py`` checks on a phone-sized screen that every figure shown at under
half its natural width, or narrower than half the column, opens at full size with one tap.
"""

from __future__ import annotations

import posixpath
from html import escape

from docutils import nodes
from sphinx.application import Sphinx


class full_size_link(nodes.General, nodes.Element):  # noqa: N801 - docutils names nodes so
    """A link around an image to the image file itself."""


def _wrap_images(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for image in list(doctree.findall(nodes.image)):
        if isinstance(image.parent, (nodes.reference, full_size_link)):
            continue
        link = full_size_link()
        image.replace_self(link)
        link.append(image)


def _visit_html(self, node: full_size_link) -> None:
    image = node.next_node(nodes.image)
    uri = image["uri"]
    images = getattr(self.builder, "images", {})
    target = posixpath.join(self.builder.imgpath, images[uri]) if uri in images else uri
    self.body.append(f'<a class="ab-full-size reference internal image-reference" '
                     f'href="{escape(target)}">')


def _depart_html(self, node: full_size_link) -> None:
    self.body.append("</a>")


def _pass(self, node: full_size_link) -> None:
    pass


def setup(app: Sphinx) -> dict:
    app.add_node(full_size_link, html=(_visit_html, _depart_html),
                 latex=(_pass, _pass), text=(_pass, _pass), man=(_pass, _pass),
                 texinfo=(_pass, _pass))
    app.connect("doctree-resolved", _wrap_images)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
