"""Links from the glossary to the section that teaches each term: the role ``{taught}``.

``{taught}`10.4``` links to the section of chapter 10 whose title starts with "10.4 " and
writes its title ("section 10.4, *The key/value cache*"). Chapters whose sections have no
numbers are named by chapter and title: ``{taught}`5: Padding masks``` links to the section
of chapter 5 whose title starts with "Padding masks". ``{taught}`5``` links to the chapter.

The titles and their anchors come from Sphinx's own table of contents of each page, so a link
always shows the section's current title; a section that no longer exists (renamed, renumbered)
is a build warning, an error under ``-W``, so the glossary cannot point at nothing.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)
_CHAPTER_DOC = re.compile(r"^chapters/(\d\d)_")


class taught_ref(nodes.Inline, nodes.Element):  # noqa: N801 - docutils names nodes so
    """Where a term is taught: resolved to a link once every page's sections are known."""


def taught_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    return [taught_ref(rawtext, target=text.strip())], []


def _sections(env, docname: str) -> list[tuple[str, str]]:
    """(title, anchor) of every section of a page, the page's own title first (anchor "")."""
    toc = env.tocs.get(docname)
    if toc is None:
        return []
    return [(ref.astext(), ref.get("anchorname", "")) for ref in toc.findall(nodes.reference)]


def _resolve(app: Sphinx, doctree: nodes.document, fromdocname: str) -> None:
    env = app.env
    chapters = {int(m.group(1)): doc for doc in env.found_docs if (m := _CHAPTER_DOC.match(doc))}
    for node in list(doctree.findall(taught_ref)):
        target = node["target"]
        match = re.fullmatch(r"(\d+)(?:\.(\d+)|\s*:\s*(.+))?", target)
        found = None
        if match and int(match.group(1)) in chapters:
            number = int(match.group(1))
            doc = chapters[number]
            sections = _sections(env, doc)
            if match.group(2):
                prefix = f"{number}.{match.group(2)} "
                hits = [(t, a) for t, a in sections if t.startswith(prefix)]
                if hits:
                    title, anchor = hits[0]
                    found = (doc, anchor, f"section {prefix.strip()}", title[len(prefix):])
            elif match.group(3):
                hits = [(t, a) for t, a in sections[1:] if t.startswith(match.group(3))]
                if hits:
                    title, anchor = hits[0]
                    found = (doc, anchor, f"chapter {number}", title)
            elif sections:
                title = re.sub(r"^\d+\.\s*", "", sections[0][0])
                found = (doc, "", f"chapter {number}", title)
        if found is None:
            logger.warning(f"{{taught}}`{target}`: no such section in the book", location=node)
            node.replace_self(nodes.Text(target))
            continue
        doc, anchor, where, title = found
        uri = app.builder.get_relative_uri(fromdocname, doc) + anchor
        reference = nodes.reference("", "", internal=True, refuri=uri)
        reference += nodes.Text(f"{where}, ")
        reference += nodes.emphasis(title, title)
        node.replace_self(reference)


def setup(app: Sphinx) -> dict:
    app.add_node(taught_ref)
    app.add_role("taught", taught_role)
    app.connect("doctree-resolved", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
