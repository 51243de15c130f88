"""What a person may see of a student's notebook: inert outputs and inert written text.

The formgrader shows each autograded notebook as HTML on the instructor's own Jupyter
origin, where the instructor's cookies open the gradebook's API, and the feedback page is
made from the same notebook. Everything in that notebook is the student's: the cells they
wrote, the outputs their code produced in nbgrader's feedback run, the notebook's and the
cells' metadata. nbconvert's HTML exporter passes most of it through as live content:
``text/html``, ``application/javascript``, ``text/markdown`` and widget views of outputs,
the widget state in the notebook's metadata (with the widget manager it loads from a CDN),
an image's ``width`` from output metadata (an unquoted attribute), and markdown cells with
their raw HTML. Its ``sanitize_html`` option covers outputs, but nbgrader's ``formgrade``
and ``feedback`` templates render markdown cells and comments without it.

:func:`inert_notebook` reduces a notebook to what cannot act:

- **outputs**: a stream or an error stays text; a display or a result keeps ``text/plain``
  and PNG or JPEG images (base64 of a real PNG or JPEG, :data:`IMAGE_BYTES` at most, an
  integer width and height); every other type (HTML, JavaScript, SVG, Markdown, LaTeX,
  widget views, anything unknown) is dropped, replaced by the output's ``text/plain`` or a
  line naming what was left out;
- **markdown cells** (and the comments a feedback page shows under an answer) are untrusted:
  :func:`inert_markdown` renders them with nbconvert's own Markdown renderer with raw HTML
  escaped (the student's ``<script>`` is shown as text), unsafe links dropped and images only
  from the cell's own PNG or JPEG attachments, cleans the result to an allowlist of tags and
  attributes (no ``id``, no event handler, no ``style``, no class a page's script could
  select), and stores it as one HTML block that nbconvert passes through unchanged;
- **raw cells** are shown as text;
- **metadata**: the notebook keeps its kernel and language only (no widget state, no
  title); a cell keeps its nbgrader metadata, tags and the book's alt text (no attachments:
  the images are inside the cell's HTML).

The formgrader and the feedback page use it through :func:`.grading.bound_outputs` (the
autograded notebooks) and :class:`.feedback.StudentFeedback` (the page). The book's course
configuration also turns on nbconvert's own ``HTMLExporter.sanitize_html``, a second layer
for outputs of a notebook that did not pass through here.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import html
import re

import bleach
import nbformat
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

__all__ = ["IMAGE_BYTES", "NOTEBOOK_IMAGE_BYTES", "inert_markdown", "inert_notebook",
           "inert_outputs", "raster_image"]

MARKDOWN_CHARACTERS = 100_000  # one markdown cell; the rest is left out
IMAGE_BYTES = 1_000_000  # one image of an output or an attachment, decoded
NOTEBOOK_IMAGE_BYTES = 8_000_000  # every image of one notebook together
RASTER_TYPES = ("image/png", "image/jpeg")
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
_WRAPPER = '<div class="inert-markdown">'
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_PYGMENTS_CLASS = re.compile(r"^[a-z]{1,3}[0-9]?$")  # a code block's token classes: "n", "s2"
_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "div", "dl", "dt", "em",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "kbd", "li", "ol", "p", "pre", "q",
    "s", "span", "strong", "sub", "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr",
    "ul"})
_LANGUAGE_KEYS = ("name", "version", "pygments_lexer", "file_extension", "mimetype",
                  "nbconvert_exporter")


# --------------------------------------------------------------------------- images


def raster_image(mime: str, value) -> str | None:
    """The base64 text of a PNG or JPEG image, or None when it is not one.

    Args:
        mime: ``"image/png"`` or ``"image/jpeg"``.
        value: the base64 text (a str, or a list of str as notebooks store it).

    Returns:
        The image as base64 without line breaks, when it decodes strictly and starts with
        the format's signature and is at most :data:`IMAGE_BYTES` long; otherwise None.
    """
    if mime not in _MAGIC:
        return None
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        value = "".join(value)
    if not isinstance(value, str) or len(value) > 2 * IMAGE_BYTES:
        return None
    try:
        raw = base64.b64decode("".join(value.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) > IMAGE_BYTES or not raw.startswith(_MAGIC[mime]):
        return None
    return base64.b64encode(raw).decode("ascii")


def _data_uri(value: str) -> bool:
    for mime in RASTER_TYPES:
        prefix = f"data:{mime};base64,"
        if value.startswith(prefix):
            return raster_image(mime, value[len(prefix):]) is not None
    return False


# --------------------------------------------------------------------------- markdown


def _allowed_attribute(tag: str, name: str, value: str) -> bool:
    if tag == "a":
        return (name == "href" and value.startswith(("https://", "http://", "mailto:", "#"))
                ) or name == "title"
    if tag == "img":
        if name == "src":
            return _data_uri(value)
        return name in ("alt", "title") or (name in ("width", "height") and value.isdigit())
    if name == "class":
        return (tag == "div" and value in ("highlight", "inert-markdown")) or (
            tag == "span" and bool(_PYGMENTS_CLASS.match(value)))
    return False


def _clean(markup: str) -> str:
    """``markup`` reduced to the allowlist (anything else removed, its text kept)."""
    return bleach.clean(markup, tags=_TAGS, attributes=_allowed_attribute,
                        protocols=["http", "https", "mailto", "data"], strip=True,
                        strip_comments=True)


def _fold(markup: str) -> str:
    """One HTML block without a blank line: a Markdown renderer passes it through unchanged.

    A newline that a blank line follows is written as ``&#10;`` (the same text), so no line
    of the block is blank and the block does not end early.
    """
    markup = re.sub(r"\n(?=[ \t]*(?:\n|$))", "&#10;", markup.replace("\r", "").strip("\n"))
    return f"{_WRAPPER}{markup}</div>"


def _passes_through(block: str) -> bool:
    rendered = MarkdownWithMath(renderer=IPythonRenderer(escape=False)).render(block)
    return rendered.strip() == block


def _is_inert(source: str) -> bool:
    """Whether ``source`` is already a block :func:`inert_markdown` made (a fixed point)."""
    if not (source.startswith(_WRAPPER) and source.endswith("</div>")):
        return False
    return _fold(_clean(source[len(_WRAPPER):-len("</div>")])) == source and _passes_through(
        source)


class _Renderer(IPythonRenderer):
    """nbconvert's renderer; an image that is not a kept attachment shows its alt text only."""

    def _embed_image_or_attachment(self, src: str) -> str:
        if src.startswith("attachment:") and src[len("attachment:"):] in self.attachments:
            return super()._embed_image_or_attachment(src)
        return ""  # no remote, local or unknown image: no request leaves the page


def _render(source: str, attachments: dict[str, dict[str, str]]) -> str:
    renderer = _Renderer(escape=True, allow_harmful_protocols=False, exclude_anchor_links=True,
                         attachments=attachments)
    try:
        markup = MarkdownWithMath(renderer=renderer).render(source)
    except Exception:  # noqa: BLE001 - a source the renderer refuses is shown as text
        markup = f"<pre>{html.escape(source)}</pre>"
    block = _fold(_clean(markup))
    if _passes_through(block):
        return block
    block = _fold(f"<pre>{html.escape(source)}</pre>")
    return block if _passes_through(block) else _fold("<p>(this text could not be shown)</p>")


_render_text = functools.lru_cache(maxsize=2048)(lambda source: _render(source, {}))


def inert_markdown(source, attachments=None) -> str:
    """A markdown cell's source as one inert HTML block (see the module docstring).

    Args:
        source: the cell's Markdown (a str, or a list of str).
        attachments: the cell's attachments (``{name: {mime: base64}}``); only PNG and JPEG
            images are kept, inside the HTML.

    Returns:
        HTML without a blank line, in ``<div class="inert-markdown">``; a source that already
        is such a block is returned unchanged.
    """
    if isinstance(source, list):
        source = "".join(str(part) for part in source)
    if not isinstance(source, str):
        source = "" if source is None else str(source)
    if _is_inert(source):
        return source
    if len(source) > MARKDOWN_CHARACTERS:
        source = (source[:MARKDOWN_CHARACTERS]
                  + f"\n\n… ({len(source) - MARKDOWN_CHARACTERS:,} more characters left out)")
    kept: dict[str, dict[str, str]] = {}
    for name, bundle in (attachments.items() if isinstance(attachments, dict) else ()):
        for mime in RASTER_TYPES if isinstance(name, str) and isinstance(bundle, dict) else ():
            image = raster_image(mime, bundle.get(mime))
            if image is not None:
                kept[name] = {mime: image}
                break
    # the instructor's cells are the same in every notebook of a class: rendered once
    return _render(source, kept) if kept else _render_text(source)


# --------------------------------------------------------------------------- outputs


def _text(value) -> str:
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return "" if value is None else str(value)


def _size(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 0 < value <= 10_000:
        return value
    if isinstance(value, float) and value.is_integer() and 0 < value <= 10_000:
        return int(value)
    return None


def _inert_output(output, budget: list[int]) -> dict | None:
    if not isinstance(output, dict):
        return None
    kind = output.get("output_type")
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return {"output_type": "stream", "name": name, "text": _text(output.get("text"))}
    if kind == "error":
        traceback = output.get("traceback")
        return {"output_type": "error", "ename": _text(output.get("ename")),
                "evalue": _text(output.get("evalue")),
                "traceback": [_text(line) for line in traceback]
                if isinstance(traceback, list) else []}
    if kind not in ("display_data", "execute_result"):
        return None
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    given = output.get("metadata") if isinstance(output.get("metadata"), dict) else {}
    kept, metadata, left_out = {}, {}, []
    for mime in RASTER_TYPES:
        if mime not in data:
            continue
        image = raster_image(mime, data[mime])
        if image is None or len(image) * 3 // 4 > budget[0]:
            left_out.append(mime)
            continue
        budget[0] -= len(image) * 3 // 4
        kept[mime] = image
        sizes = given.get(mime) if isinstance(given.get(mime), dict) else {}
        sizes = {key: _size(sizes.get(key)) for key in ("width", "height")}
        if any(sizes.values()):
            metadata[mime] = {key: value for key, value in sizes.items() if value}
    left_out += sorted(str(mime) for mime in data if mime not in kept and mime != "text/plain"
                       and mime not in RASTER_TYPES)
    if "text/plain" in data:
        kept["text/plain"] = _text(data["text/plain"])
    elif left_out and not kept:
        kept["text/plain"] = (f"(an output of type {', '.join(left_out)} is left out: only "
                              "text and images are shown)")
    inert = {"output_type": kind, "data": kept, "metadata": metadata}
    if kind == "execute_result":
        count = output.get("execution_count")
        inert["execution_count"] = count if isinstance(count, int) and not isinstance(
            count, bool) else None
    return inert


def inert_outputs(outputs, budget: list[int] | None = None) -> list[dict]:
    """The outputs of one cell, each reduced to inert types (see the module docstring).

    Args:
        outputs: a code cell's outputs.
        budget: ``[bytes]`` of images still allowed (shared across calls; default
            :data:`NOTEBOOK_IMAGE_BYTES`).

    Returns:
        New outputs; an output of an unknown kind is dropped.
    """
    budget = [NOTEBOOK_IMAGE_BYTES] if budget is None else budget
    if not isinstance(outputs, list):
        return []
    return [inert for output in outputs if (inert := _inert_output(output, budget)) is not None]


# --------------------------------------------------------------------------- notebooks


def _cell_metadata(metadata) -> dict:
    metadata = metadata if isinstance(metadata, dict) else {}
    kept: dict = {}
    nbgrader = metadata.get("nbgrader")
    if isinstance(nbgrader, dict) and (nbgrader.get("grade_id") is None or (
            isinstance(nbgrader.get("grade_id"), str)
            and _SAFE_NAME.match(nbgrader["grade_id"]))):
        nbgrader = dict(nbgrader)
        if "comment" in nbgrader and nbgrader["comment"] is not None:
            nbgrader["comment"] = inert_markdown(nbgrader["comment"])
        kept["nbgrader"] = nbgrader
    tags = metadata.get("tags")
    if isinstance(tags, list):
        kept["tags"] = [tag for tag in tags if isinstance(tag, str) and _SAFE_NAME.match(tag)]
    alt = ((metadata.get("mystnb") or {}).get("image") or {}).get("alt") \
        if isinstance(metadata.get("mystnb"), dict) and isinstance(
            metadata["mystnb"].get("image"), dict) else None
    if isinstance(alt, str):
        kept["mystnb"] = {"image": {"alt": alt}}
    if isinstance(metadata.get("alt"), str):
        kept["alt"] = metadata["alt"]
    for key in ("editable", "deletable"):
        if isinstance(metadata.get(key), bool):
            kept[key] = metadata[key]
    return kept


def _notebook_metadata(metadata) -> dict:
    metadata = metadata if isinstance(metadata, dict) else {}
    kept: dict = {}
    spec = metadata.get("kernelspec")
    if isinstance(spec, dict):
        kept["kernelspec"] = {key: spec[key] for key in ("name", "display_name", "language")
                              if isinstance(spec.get(key), str)}
    language = metadata.get("language_info")
    if isinstance(language, dict):
        kept["language_info"] = {key: language[key] for key in _LANGUAGE_KEYS
                                 if isinstance(language.get(key), str)}
    if isinstance(metadata.get("nbgrader"), dict):  # nbgrader's own bookkeeping
        kept["nbgrader"] = metadata["nbgrader"]
    return kept


def inert_notebook(notebook):
    """Reduce a notebook to what cannot act when shown as HTML (see the module docstring).

    Args:
        notebook: a notebook as a dict or an ``nbformat.NotebookNode``; changed in place.

    Returns:
        The same notebook. A cell of an unknown type is removed; nothing else is.

    Raises:
        TypeError: ``notebook`` is not a dict.
    """
    if not isinstance(notebook, dict):
        raise TypeError(f"notebook must be a dict, got {type(notebook).__name__}")
    node = isinstance(notebook, nbformat.NotebookNode)
    wrap = nbformat.from_dict if node else (lambda value: value)
    budget = [NOTEBOOK_IMAGE_BYTES]
    cells = []
    for index, cell in enumerate(notebook.get("cells") or []):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            continue
        kind = cell["cell_type"]
        new = {"cell_type": kind, "metadata": _cell_metadata(cell.get("metadata"))}
        if "id" in cell:
            new["id"] = cell["id"] if isinstance(cell["id"], str) and _SAFE_ID.match(
                cell["id"]) else f"cell-{index}"
        if kind == "code":
            new["source"] = _text(cell.get("source"))
            count = cell.get("execution_count")
            new["execution_count"] = count if isinstance(count, int) and not isinstance(
                count, bool) else None
            new["outputs"] = inert_outputs(cell.get("outputs"), budget)
        elif kind == "markdown":
            new["source"] = inert_markdown(cell.get("source"), cell.get("attachments"))
        else:
            source = _text(cell.get("source"))
            new["source"] = source if _is_escaped(source) else html.escape(source, quote=False)
        cell.clear()
        cell.update(wrap(new))
        cells.append(cell)
    notebook["cells"] = cells
    notebook["metadata"] = wrap(_notebook_metadata(notebook.get("metadata")))
    return notebook


def _is_escaped(text: str) -> bool:
    """Whether a raw cell's text has no markup left (escaping it again would show entities)."""
    return "<" not in text and ">" not in text and not re.search(r"&(?!(?:lt|gt|amp);)", text)
