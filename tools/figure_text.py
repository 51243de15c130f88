#!/usr/bin/env python3
"""Measure the smallest text of every figure the chapters show, for the website's phone sizes.

The website shows each figure at a width where its smallest text is at least 9 CSS px
(``_ext/figure_links.py``), and ``tests/test_browser.py`` checks that on a 390 px phone. Both
need to know, for each stored figure (a PNG in a chapter's outputs), the font size of its
smallest text and its dpi. A PNG does not say what size its text is, so this tool runs the
chapters and asks matplotlib: every text the Agg renderer draws while a figure is saved as the
PNG that Jupyter shows (``FigureCanvasBase.print_figure``) is recorded with its size in points,
and the smallest one, the renderer's dpi and the PNG's width are stored in
``_ext/figure_text.json`` under the PNG's SHA-256 (the name the website gives the image file).

Each chapter runs in memory with a fresh kernel, in the pinned numeric environment (so its PNGs
are the bytes ``make execute`` stores), and is never written back. A figure of the stored
chapter that the run did not draw byte for byte means the chapter is stale: re-execute it
first (``make execute NB=...``). Run it after re-executing a chapter whose figures changed:

    .venv/bin/python tools/figure_text.py chapters/18_attention_as_a_recurrence.ipynb

(no argument: every chapter; about as long as running them). ``--check`` only compares: it lists
the stored figures the table does not know, and exits 1 if there are any.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "_ext" / "figure_text.json"

# Run first in the chapter's kernel: record the size of every text drawn while a figure is
# saved, per saved PNG (by its SHA-256).
_RECORDER = r'''
def _ab_figure_text_recorder():
    import hashlib, io
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.backends.backend_agg import RendererAgg

    drawn, records = [], []
    draw_text = RendererAgg.draw_text

    def recording_draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if str(s).strip():
            drawn.append((float(prop.get_size_in_points()), str(s)[:40], float(self.dpi)))
        return draw_text(self, gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    print_figure = FigureCanvasBase.print_figure

    def recording_print_figure(self, filename, *args, **kwargs):
        start = len(drawn)
        result = print_figure(self, filename, *args, **kwargs)
        texts = drawn[start:]
        del drawn[start:]
        if isinstance(filename, io.BytesIO) and texts:
            data = filename.getvalue()
            if data.startswith(b"\x89PNG"):
                size, text, dpi = min(texts)
                records.append({
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "smallest_pt": round(size, 2), "dpi": round(dpi, 2),
                    "width_px": int.from_bytes(data[16:20], "big"), "smallest_text": text})
        return result

    RendererAgg.draw_text = recording_draw_text
    FigureCanvasBase.print_figure = recording_print_figure
    return records

_ab_figure_text = _ab_figure_text_recorder()
'''
_REPORT = "import json as _ab_json; print('AB-FIGURE-TEXT ' + _ab_json.dumps(_ab_figure_text))"


def stored_figures(path: Path) -> list[str]:
    """The SHA-256 of every PNG in a stored notebook's outputs, in order."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {}).get("image/png")
            if data:
                text = "".join(data) if isinstance(data, list) else data
                found.append(hashlib.sha256(base64.b64decode(text)).hexdigest())
    return found


def stored_width(path: Path, index: int) -> int:
    """The width in pixels of the stored notebook's ``index``-th PNG."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    pngs = [output["data"]["image/png"] for cell in notebook["cells"]
            for output in cell.get("outputs", []) if output.get("data", {}).get("image/png")]
    data = base64.b64decode("".join(pngs[index]) if isinstance(pngs[index], list) else pngs[index])
    return int.from_bytes(data[16:20], "big")


def measure(path: Path) -> list[dict]:
    """Run ``path`` in memory with the recorder; what it recorded for each PNG, in order."""
    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    notebook = nbformat.read(path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(_RECORDER))
    notebook.cells.append(nbformat.v4.new_code_cell(_REPORT))
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets, "ipc"))}})
        NotebookClient(notebook, timeout=None, kernel_name="python3", record_timing=False,
                       config=config,
                       resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    for output in notebook.cells[-1].outputs:
        for line in output.get("text", "").splitlines():
            if line.startswith("AB-FIGURE-TEXT "):
                return json.loads(line.removeprefix("AB-FIGURE-TEXT "))
    raise RuntimeError(f"{path}: the recorder printed nothing")


def read_table() -> dict:
    if TABLE.is_file():
        return json.loads(TABLE.read_text(encoding="utf-8"))
    return {"figures": {}}


def write_table(table: dict) -> None:
    figures = dict(sorted(table["figures"].items(), key=lambda kv: (kv[1]["chapter"], kv[1]["index"])))
    table = {
        "about": ("The smallest text of every figure of the chapters, by the SHA-256 of its PNG "
                  "(the website's image file name): its size in points, the dpi it was drawn at "
                  "and the PNG's width. Written by tools/figure_text.py, which runs the chapters; "
                  "read by _ext/figure_links.py and tests/test_browser.py."),
        "figures": figures,
    }
    # One line per figure, so that a re-measured chapter changes only its own lines.
    lines = [f"  {json.dumps(sha)}: {json.dumps(row, ensure_ascii=False)}"
             for sha, row in table["figures"].items()]
    TABLE.write_text('{\n "about": ' + json.dumps(table["about"], ensure_ascii=False)
                     + ',\n "figures": {\n' + ",\n".join(lines) + "\n }\n}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="only list the stored figures the table lacks (exit 1 if any)")
    options = parser.parse_args(argv)
    paths = options.notebooks or sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    table = read_table()
    if options.check:
        missing = [f"{path.name}: figure {i}" for path in paths
                   for i, sha in enumerate(stored_figures(path)) if sha not in table["figures"]]
        print("\n".join(missing) or "every stored figure is in the table")
        return 1 if missing else 0

    sys.path.insert(0, str(ROOT / "tools" / "numerics"))
    from environment import numeric_environment

    os.environ.update(numeric_environment("pinned"))
    os.environ.pop("MPLBACKEND", None)  # the kernel's default, as under make execute
    stale = []
    for path in paths:
        path = path.resolve()
        chapter = path.stem
        print(f"measuring {path.relative_to(ROOT)}", flush=True)
        stored = stored_figures(path)
        measured = measure(path)
        by_sha = {row["sha256"]: row for row in measured}
        table["figures"] = {sha: row for sha, row in table["figures"].items()
                            if row["chapter"] != chapter}
        for index, sha in enumerate(stored):
            row = dict(by_sha.get(sha, {}))
            if not row and len(measured) == len(stored) and (
                    measured[index]["width_px"] == stored_width(path, index)):
                # A figure of measured data (timings) differs in its pixels from run to run,
                # not in its fonts: the fresh run's figure at the same place measures it.
                row = dict(measured[index], drawn_again=True)
            if not row:
                stale.append(f"{path.name}: stored figure {index} was not drawn by a fresh run")
                continue
            row.pop("sha256", None)
            table["figures"][sha] = {"chapter": chapter, "index": index, **row}
            print(f"  figure {index}: {row['smallest_pt']} pt at {row['dpi']} dpi, "
                  f"{row['width_px']} px wide ({row['smallest_text']!r})"
                  + (" (measured on the fresh run's figure)" if row.get("drawn_again") else ""))
    write_table(table)
    if stale:
        print("Re-execute these chapters (make execute NB=...), then run this again:\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
