"""A submission is untrusted HTML: what the formgrader and the feedback page show is inert.

Trial v4, D2 (``../shared/reviews/classroom-trial-v4.md``): a scratch cell's HTML output ran
in the instructor's formgrader and rewrote every classmate's grade. These tests build an
autograded notebook carrying active content in every form nbconvert renders live (HTML,
JavaScript, SVG and Markdown outputs, widget views and widget state, an image whose metadata
writes an attribute, a markdown cell and a comment with raw HTML, a raw HTML cell), render it
with nbgrader's own ``formgrade`` and ``feedback`` templates as the formgrader and
``generate_feedback`` do, and check that the page has no script, event handler or request of
the submission's, while it still shows the student's text and figures.
``tests/test_jupyterhub.py`` opens such a submission in a real formgrader in Chromium.
"""

from __future__ import annotations

import base64
import html.parser
import struct
import zlib
from pathlib import Path

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from traitlets.config import Config

from attention_book.classroom import write_course_config
from attention_book.classroom.feedback import StudentFeedback
from attention_book.classroom.grading import NOTEBOOK_OUTPUT_CHARACTERS, bound_outputs
from attention_book.classroom.sanitise import (
    IMAGE_BYTES,
    inert_markdown,
    inert_notebook,
    inert_outputs,
    raster_image,
)

JS = "window.__pwned = 'ABK-PAYLOAD'"
VISIBLE = "VISIBLE-TEXT-OF-THE-STUDENT"


def _png(width: int = 1) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(width))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, width, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = base64.b64encode(_png()).decode()
SVG = f'<svg xmlns="http://www.w3.org/2000/svg" onload="{JS}"><script>{JS}</script></svg>'


def _display(data: dict, metadata: dict | None = None) -> dict:
    return {"output_type": "display_data", "data": data, "metadata": metadata or {}}


def _attack_notebook(invalid: bool = False) -> nbformat.NotebookNode:
    """An autograded notebook as the feedback run could leave it, with every payload.

    With ``invalid``, also execution counts that are markup (a kernel the student rewrote
    could send them; nbconvert refuses such a notebook, the book makes them None).
    """
    code = nbformat.v4.new_code_cell(f"print('{VISIBLE}')")
    code.execution_count = 3
    code.metadata.update({"tags": ["ok-tag", 'x" onmouseover="' + JS],
                          "jupyter": {"source_hidden": True},
                          "transient": {"remove_source": True}})
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"{VISIBLE} <script>{JS}</script>\n"),
        _display({"text/html": f'<img src=x onerror="{JS}">'}),
        _display({"application/javascript": JS, "text/plain": "<IPython Javascript>"}),
        _display({"image/svg+xml": SVG}),
        _display({"text/markdown": f"<img src=x onerror=\"{JS}\">"}),
        _display({"text/latex": r"\href{javascript:alert(1)}{x}"}),
        _display({"application/vnd.jupyter.widget-view+json":
                  {"model_id": "m1", "version_major": 2, "version_minor": 0},
                  "text/plain": "HTML(value='…')"}),
        _display({"image/png": PNG, "text/plain": "<Figure>"},
                 {"image/png": {"width": "1 onload=eval(this.alt)", "alt": JS}}),
        _display({"image/jpeg": base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(16)).decode()},
                 {"filenames": {"image/jpeg": "http://127.0.0.1:9/x.jpg"}}),
        _display({"image/png": base64.b64encode(SVG.encode()).decode()}),  # not a PNG
        _display({"application/x-unknown": "<b>?</b>"}),
        {"output_type": "execute_result", "execution_count": 3,
         "data": {"text/html": "<script>" + JS + "</script>", "text/plain": "result"},
         "metadata": {}},
    ]
    markdown = nbformat.v4.new_markdown_cell(
        f"Notes: {VISIBLE}\n\n<script>{JS}</script>\n\n<img src=x onerror=\"{JS}\">\n\n"
        "[link](javascript:alert(1)) ![remote](http://127.0.0.1:9/pixel.png) "
        "![svg](attachment:a.svg) ![png](attachment:b.png)\n\n"
        f"```mermaid\ngraph TD; A--><img src=x onerror=\"{JS}\">\n```\n")
    markdown.attachments = {"a.svg": {"image/svg+xml": base64.b64encode(SVG.encode()).decode()},
                            "b.png": {"image/png": PNG}}
    answer = nbformat.v4.new_code_cell("x = 1")
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                   "grade_id": "ch02-ex1-answer", "schema_version": 3,
                                   # what GetGrades puts here for the feedback page
                                   "comment": f"Not counted. <img src=x onerror=\"{JS}\"> "
                                              f"{VISIBLE}"}
    raw = nbformat.v4.new_raw_cell(f"<script>{JS}</script>")
    raw.metadata["raw_mimetype"] = "text/html"
    check = nbformat.v4.new_code_cell("check(x)")
    check.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "ch02-ex1-check",
                                  "points": 2, "locked": True, "schema_version": 3}
    notebook = nbformat.v4.new_notebook(cells=[code, markdown, answer, raw, check])
    notebook.metadata["title"] = f"<script>{JS}</script>"
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "version_major": 2, "version_minor": 0, "state": {"m1": {
            "model_name": "HTMLModel", "model_module": "@jupyter-widgets/controls",
            "model_module_version": "2.0.0",
            "state": {"value": f"<img src=x onerror=\"{JS}\">"}}}}}
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    if invalid:
        code.execution_count = "<img src=x onerror=\"" + JS + "\">"
        code.outputs[-1]["execution_count"] = "<b>1</b>"
    return notebook


class _Page(html.parser.HTMLParser):
    """Every script, event handler and URL a page has."""

    def __init__(self):
        super().__init__()
        self.scripts: list[str] = []
        self.handlers: list[str] = []
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"{tag} {name}={value}")
            if name in ("src", "href", "data", "action", "formaction", "xlink:href"):
                self.urls.append(f"{tag} {name}={value or ''}")
        if tag == "script":
            self._in_script = True
            self.scripts.append(dict(attrs).get("src") or dict(attrs).get("type") or "")

    def handle_endtag(self, tag):
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data.strip()[:80]


def _active(page_html: str) -> dict[str, list[str]]:
    page = _Page()
    page.feed(page_html)
    return {"scripts": page.scripts, "handlers": page.handlers,
            "urls": page.urls}


def _exporter(template: str) -> HTMLExporter:
    """nbconvert's exporter as nbgrader 0.9.6 sets it up: the formgrader's (``formgrade``,
    nbconvert's defaults otherwise) or ``generate_feedback``'s (``feedback``)."""
    from nbgrader.server_extensions.formgrader import handlers

    config = Config()
    config.HTMLExporter.template_name = template
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    config.HTMLExporter.extra_template_paths = [
        str(Path(handlers.static_path) / "node_modules" / "bootstrap" / "dist" / "css")]
    return HTMLExporter(config=config)


_FORMGRADE_RESOURCES = {"assignment_id": "a", "notebook_id": "a", "submission_id": "s1",
                        "index": 0, "total": 1, "base_url": "/user/ida", "student": "bob",
                        "last_name": None, "first_name": None,
                        "notebook_path": "course/autograded/bob/a/a.ipynb"}


def _formgrade(notebook) -> str:
    """The formgrader's page of ``notebook``, as nbgrader's SubmissionHandler renders it."""
    return _exporter("formgrade").from_notebook_node(notebook, resources=_FORMGRADE_RESOURCES)[0]


def _feedback(notebook, book: bool = True) -> str:
    """The feedback page of ``notebook`` as ``generate_feedback`` writes it, after nbgrader's
    GetGrades (which puts the comment under an answer) and, with ``book``, the book's
    preprocessor."""
    notebook.cells[-1].metadata.nbgrader.update({"score": 0, "points": 2})
    if book:
        notebook, _ = StudentFeedback().preprocess(notebook, {})
    return _exporter("feedback").from_notebook_node(
        notebook, resources={"nbgrader": {"notebook": "a", "score": 0, "max_score": 2,
                                          "late_penalty": 0}})[0]


def _payload(page_html: str, render) -> list[str]:
    """The scripts, event handlers and URLs of a page that the template alone does not have
    (``render`` of a notebook with one plain cell)."""
    plain = _attack_notebook()
    plain.cells[0].outputs = []
    plain.cells[1].source = "text"
    plain.cells[1].attachments = {}
    plain.cells[2].metadata.nbgrader["comment"] = "A comment."
    plain.cells[3].source = "raw"
    plain.metadata = {"kernelspec": plain.metadata.kernelspec}
    template = _active(render(plain))
    found = _active(page_html)
    return [f"{kind}: {item[:120]}" for kind, items in found.items() for item in items
            if item not in template[kind] and not _figure(item)]


def _figure(url: str) -> bool:
    """An ``img`` whose source is a real PNG or JPEG in the page, or a link to a place in the
    page: no request, no script."""
    if url.startswith("a href=#"):
        return True
    for mime in ("image/png", "image/jpeg"):
        prefix = f"img src=data:{mime};base64,"
        if url.startswith(prefix):
            return raster_image(mime, url[len(prefix):]) is not None
    return False


# --------------------------------------------------------------------------- the pages


def test_the_pages_run_the_payloads_when_nothing_is_made_inert():
    """The checks below can fail: without the book's step the payloads are live in both pages."""
    formgrade = _payload(_formgrade(_attack_notebook()), _formgrade)
    assert any("onerror" in item and "ABK-PAYLOAD" in item for item in formgrade), formgrade
    assert any(item.startswith("scripts") and "ABK-PAYLOAD" in item for item in formgrade)
    assert "handlers: img onload=eval(this.alt)" in formgrade  # the width= of an image
    assert any("widget-view" in item for item in formgrade), formgrade
    assert any("127.0.0.1:9" in item for item in formgrade), formgrade
    feedback = _payload(_feedback(_attack_notebook(), book=False), lambda nb: _feedback(
        nb, book=False))
    assert any("onerror" in item and "ABK-PAYLOAD" in item for item in feedback), feedback


def test_nbconverts_sanitiser_alone_leaves_markdown_and_image_metadata_live():
    """Which layer holds in the formgrader: nbconvert's ``sanitize_html`` cleans HTML outputs,
    but nbgrader's ``formgrade`` template renders markdown cells without it, and an image's
    metadata writes its attributes in any case. (In Chromium, trial v4's payloads in these
    three places ran with ``sanitize_html`` on.)"""

    def sanitised(notebook):
        exporter = _exporter("formgrade")
        exporter.sanitize_html = True
        return exporter.from_notebook_node(notebook, resources=_FORMGRADE_RESOURCES)[0]

    found = _payload(sanitised(_attack_notebook()), sanitised)
    scripts = [item for item in found if item.startswith("scripts")]
    assert not any("var element" in item for item in scripts), found  # JavaScript outputs: gone
    assert any("ABK-PAYLOAD" in item for item in scripts), found  # the markdown cell's <script>
    assert any(item.startswith("handlers: img onerror") for item in found), found  # its onerror
    assert "handlers: img onload=eval(this.alt)" in found  # the image's width


def test_the_formgrader_page_of_an_inert_notebook_has_no_payload():
    notebook = bound_outputs(_attack_notebook(), [])
    page = _formgrade(nbformat.from_dict(notebook))
    assert _payload(page, _formgrade) == []
    # the student's work is still there, as text
    assert page.count(VISIBLE) >= 2 and "&lt;script&gt;" in page
    assert f"data:image/png;base64,{PNG}" in page  # the figure
    assert 'id="ch02-ex1-check"' in page  # the formgrader's score box for the check cell
    assert 'id="ch02-ex1-answer-comment"' in page  # and its comment box for the answer


def test_the_feedback_page_has_no_payload_and_shows_the_work():
    page = _feedback(_attack_notebook())
    assert _payload(page, _feedback) == []
    assert VISIBLE in page and "Not counted." in page and "Points for this check" in page


def test_the_course_config_turns_on_nbconverts_sanitiser(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    write_course_config(tmp_path)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert config.HTMLExporter.sanitize_html is True


# --------------------------------------------------------------------------- the parts


def test_outputs_keep_text_and_real_images_only():
    outputs = inert_outputs(_attack_notebook(invalid=True).cells[0].outputs)
    kinds = [sorted(o.get("data", {"stream": 1}) if "data" in o else [o["output_type"]])
             for o in outputs]
    assert kinds == [["stream"], ["text/plain"], ["text/plain"], ["text/plain"], ["text/plain"],
                     ["text/plain"], ["text/plain"], ["image/png", "text/plain"], ["image/jpeg"],
                     ["text/plain"], ["text/plain"], ["text/plain"]]
    assert outputs[1]["data"]["text/plain"].startswith("(an output of type text/html is left out")
    assert outputs[2]["data"]["text/plain"] == "<IPython Javascript>"
    assert outputs[7]["metadata"] == {}  # the width that wrote an attribute, the alt
    assert outputs[8]["metadata"] == {}  # the file name that became a remote src
    assert outputs[9]["data"]["text/plain"].startswith("(an output of type image/png")
    assert outputs[-1]["execution_count"] is None and outputs[-1]["data"] == {
        "text/plain": "result"}
    sized = inert_outputs([_display({"image/png": PNG}, {"image/png": {"width": 300,
                                                                       "height": 200.0}})])
    assert sized[0]["metadata"] == {"image/png": {"width": 300, "height": 200}}


def test_an_image_is_base64_of_its_own_format():
    assert raster_image("image/png", PNG) == PNG
    assert raster_image("image/png", [PNG[:10], "\n", PNG[10:]]) == PNG
    assert raster_image("image/jpeg", PNG) is None  # a PNG is not a JPEG
    assert raster_image("image/png", PNG + '" onerror="x') is None
    assert raster_image("image/png", base64.b64encode(b"<svg/>").decode()) is None
    assert raster_image("image/svg+xml", PNG) is None
    big = base64.b64encode(_png(1) + b"\x00" * (IMAGE_BYTES + 1)).decode()
    assert raster_image("image/png", big) is None
    jpeg = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 16).decode()
    assert raster_image("image/jpeg", jpeg) == jpeg


def test_markdown_is_shown_as_written_and_passes_nbconvert_unchanged():
    cell = _attack_notebook().cells[1]
    block = inert_markdown(cell.source, cell.attachments)
    assert "<script" not in block and "onerror=" not in block.replace("onerror=&quot;", "")
    assert "&lt;script&gt;" in block and "&lt;img src=x onerror=" in block  # shown as text
    assert "javascript:" not in block and "127.0.0.1:9" not in block
    assert f'src="data:image/png;base64,{PNG}"' in block and "image/svg" not in block
    assert inert_markdown(block) == block  # already inert: unchanged
    rendered = MarkdownWithMath(renderer=IPythonRenderer(escape=False)).render(block)
    assert rendered.strip() == block  # what the formgrade template's markdown2html does
    math = inert_markdown("Shapes: $a<b$ and\n\n$$\nQK^T / \\sqrt{d}\n$$\n\n```\nx = 1\n\n\ny\n```")
    assert "$a&lt;b$" in math and "\\sqrt{d}" in math and "x = 1&#10;&#10;\ny" in math
    heading = inert_markdown("## Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n**bold** `code`")
    assert "<h2>Title</h2>" in heading and "<td>1</td>" in heading and "id=" not in heading
    assert "<strong>bold</strong>" in heading and "<code>code</code>" in heading


def test_metadata_keeps_the_kernel_grades_tags_and_alt_text_only():
    notebook = inert_notebook(_attack_notebook(invalid=True))
    assert set(notebook.metadata) == {"kernelspec"}
    code, markdown, answer, raw, check = notebook.cells
    assert code.execution_count is None and code.metadata == {"tags": ["ok-tag"]}
    assert "attachments" not in markdown
    assert answer.metadata.nbgrader.grade_id == "ch02-ex1-answer"
    assert raw.metadata == {} and raw.source.startswith("&lt;script&gt;")
    assert check.metadata.nbgrader.points == 2
    again = inert_notebook(nbformat.from_dict(notebook))
    assert again == notebook  # inert twice is inert once (the feedback page re-checks)
    nbformat.validate(notebook)


def test_bound_outputs_still_caps_printing_and_hides_hidden_lines():
    hidden = "assert attention(q, k, v).shape == (2, 3)"
    cell = nbformat.v4.new_code_cell("print('x' * 10**6)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10**6),
                    nbformat.v4.new_output("error", ename="AssertionError", evalue="",
                                           traceback=[f"----> 3 {hidden}"]),
                    _display({"text/plain": "y" * 10**6, "text/html": "<b>y</b>"})]
    notebook = bound_outputs(nbformat.v4.new_notebook(cells=[cell]), [hidden])
    printed, removed, shown = notebook["cells"][0]["outputs"]
    assert len(printed["text"]) < 11_000 and "more characters left out" in printed["text"]
    assert removed["text"] == "(output removed: it repeated the hidden tests)\n"
    assert set(shown["data"]) == {"text/plain"} and len(shown["data"]["text/plain"]) < 11_000
    total = sum(len(str(o)) for o in notebook["cells"][0]["outputs"])
    assert total < NOTEBOOK_OUTPUT_CHARACTERS


@pytest.mark.parametrize("source", ["", "plain", "a\r\nb", "<", "&amp;", "~~~\n<b>\n~~~",
                                    "* list\n\n  <i>x</i>", "> quote <svg onload=x>"])
def test_any_markdown_becomes_one_block_that_passes_through(source):
    block = inert_markdown(source)
    assert block.startswith('<div class="inert-markdown">') and inert_markdown(block) == block
    assert MarkdownWithMath(renderer=IPythonRenderer(escape=False)).render(block).strip() == block
    assert "<svg" not in block and "<i>" not in block and "<b>" not in block


def test_a_notebook_is_a_dict():
    with pytest.raises(TypeError, match="notebook must be a dict"):
        inert_notebook([])
