#!/usr/bin/env python3
"""Run a chapter with other training seeds and report whether every check still holds.

A chapter whose claims rest on training (chapter 15) sets ``SEED = 0`` in one line of a code
cell and uses it for every random draw of its training runs. This tool runs the chapter once
per seed, each time in a fresh kernel with that line changed to ``SEED = s``, and reports for
each seed whether every cell ran (every ``assert`` held) or which cell failed and why. Nothing
is written back to the chapter; the stored outputs stay those of ``SEED = 0``.

Run it in the pinned numeric environment, as ``make execute`` does, from the repository root:

    tools/with_numerics pinned .venv/bin/python tools/other_seeds.py \\
        chapters/15_attention_in_a_model.ipynb --seeds 0 1 2 3 4

Options: ``--jobs 2`` runs two seeds at a time (chapter 15 trains on one thread, so two fit
on two cores); ``--collect EXPRESSION`` evaluates a Python expression in each kernel after
the last cell and prints its value as JSON (for example a dict of the numbers the chapter
quotes); ``--keep DIR`` stores each executed notebook in ``DIR``. It takes about as long as
the chapter runs, once per seed; the exit status is 1 when any seed fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell
from traitlets.config import Config

SEED_LINE = re.compile(r"^SEED = \d+$", re.MULTILINE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of a traceback


def with_seed(notebook: nbformat.NotebookNode, seed: int) -> nbformat.NotebookNode:
    """A copy of ``notebook`` whose one ``SEED = ...`` line reads ``SEED = seed``."""
    copy = nbformat.from_dict(json.loads(json.dumps(notebook)))
    cells = [cell for cell in copy.cells
             if cell.cell_type == "code" and SEED_LINE.search(cell.source)]
    if len(cells) != 1 or len(SEED_LINE.findall(cells[0].source)) != 1:
        raise ValueError(f"the notebook must set SEED in exactly one line 'SEED = <int>'; "
                         f"found it in {len(cells)} code cells")
    cells[0].source = SEED_LINE.sub(f"SEED = {seed}", cells[0].source)
    return copy


def run(path: Path, seed: int, collect: str | None, keep: Path | None) -> dict:
    """Execute ``path`` with ``SEED = seed``; return what happened."""
    notebook = with_seed(nbformat.read(path, as_version=4), seed)
    if collect:
        notebook.cells.append(new_code_cell(f"import json as _json\nprint(_json.dumps({collect}))"))
    start = time.perf_counter()
    result = {"seed": seed, "ok": True}
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets, "ipc"))}})
        client = NotebookClient(notebook, timeout=None, kernel_name="python3", record_timing=False,
                                config=config,
                                resources={"metadata": {"path": str(path.parent.resolve())}})
        try:
            client.execute()
        except CellExecutionError as error:
            failed = next((index for index, cell in enumerate(notebook.cells)
                           if any(output.get("output_type") == "error"
                                  for output in cell.get("outputs", []))), None)
            lines = [line for line in ANSI.sub("", str(error)).splitlines() if line.strip()]
            result.update(ok=False, cell=failed, error=lines[-1] if lines else "an error")
    result["seconds"] = round(time.perf_counter() - start, 1)
    if collect and result["ok"]:
        text = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
        result["collected"] = json.loads(text)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, keep / f"{path.stem}_seed{seed}.ipynb")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--collect", help="a Python expression to print as JSON at the end")
    parser.add_argument("--keep", type=Path, help="a folder for the executed notebooks")
    options = parser.parse_args(argv)
    count = len(options.seeds)
    with ProcessPoolExecutor(max_workers=options.jobs) as pool:
        results = list(pool.map(run, [options.notebook] * count, options.seeds,
                                [options.collect] * count, [options.keep] * count))
    for result in results:
        status = "every check holds" if result["ok"] else (
            f"FAILS in cell {result['cell']}: {result['error']}")
        print(f"SEED = {result['seed']}: {status} ({result['seconds']} s)", flush=True)
        if "collected" in result:
            print(f"  {json.dumps(result['collected'])}")
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
