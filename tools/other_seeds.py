#!/usr/bin/env python3
"""Run a chapter with other training seeds and report whether every check still holds.

A chapter whose claims rest on training (chapter 15; chapter 18 for the run it trains again
beside its stored results) sets ``SEED = 0`` in one line of a code cell and uses it for every
random draw of its training runs. This tool runs the chapter once
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

**The table of the seeds.** A chapter that tabulates its runs (chapter 15's "The same chapter
with seeds 0 to 4") computes its own row in a variable ``seed_row``, a Markdown table row
that starts ``| <SEED> |``, and its table is a Markdown cell whose header row starts
``| `SEED` |``. For such a chapter the tool also reads ``seed_row`` in every run and compares
it with the table's row for that seed: a row that differs, or is missing, fails the seed,
with both rows shown. ``--write-table`` writes the measured rows into the table instead (run
it after a change that moves the numbers, then re-run without it). The table is never typed
by hand, and ``tests/test_seed_table.py`` checks the row of ``SEED = 0`` against the stored
output of the cell that computes it.
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
TABLE_HEADER = "| `SEED` |"  # the first cells of the header row of a chapter's seeds table
ROW = "seed_row"  # the variable in which the chapter computes its own row of that table
_TABLE_ROW = re.compile(r"^\| (\d+) \|.*\|$")


def table_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode | None:
    """The Markdown cell that holds the seeds table, or None when the chapter has none."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "markdown"
             and any(line.startswith(TABLE_HEADER) for line in cell.source.splitlines())]
    if len(cells) > 1:
        raise ValueError(f"the notebook has {len(cells)} seeds tables; one at most")
    return cells[0] if cells else None


def table_rows(notebook: nbformat.NotebookNode) -> dict[int, str]:
    """The seeds table's rows, by seed (empty without a table)."""
    cell = table_cell(notebook)
    if cell is None:
        return {}
    return {int(match[1]): match[0] for line in cell.source.splitlines()
            if (match := _TABLE_ROW.match(line))}


def write_rows(notebook: nbformat.NotebookNode, rows: dict[int, str]) -> None:
    """Put ``rows`` (by seed) into the seeds table: a seed's row replaces its old one, a new
    seed's row goes after the others, in seed order."""
    for seed, row in rows.items():
        match = _TABLE_ROW.match(row)
        if not match or int(match[1]) != seed:
            raise ValueError(f"the row for seed {seed} must read '| {seed} | ... |', got {row!r}")
    cell = table_cell(notebook)
    if cell is None:
        raise ValueError(f"the notebook has no Markdown table whose header starts {TABLE_HEADER}")
    lines = cell.source.splitlines()
    positions = [index for index, line in enumerate(lines) if _TABLE_ROW.match(line)]
    if not positions:  # a table of a header and its separator only
        header = next(index for index, line in enumerate(lines) if line.startswith(TABLE_HEADER))
        positions = [header + 2]
        lines.insert(header + 2, "")
    old = {int(_TABLE_ROW.match(lines[index])[1]): lines[index]
           for index in positions if _TABLE_ROW.match(lines[index])}
    merged = {**old, **rows}
    new_lines = [merged[seed] for seed in sorted(merged)]
    lines[positions[0]:positions[-1] + 1] = new_lines
    cell.source = "\n".join(lines)


def row_problems(results: list[dict], table: dict[int, str]) -> dict[int, str]:
    """For each seed whose measured row is not the table's, what differs."""
    problems = {}
    for result in results:
        if result["ok"] and "row" in result:
            stated = table.get(result["seed"])
            if stated != result["row"]:
                problems[result["seed"]] = (f"the table's row for this seed is\n    {stated}\n"
                                            f"  but this run computes\n    {result['row']}")
    return problems


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
    row = table_cell(notebook) is not None
    if collect or row:
        notebook.cells.append(new_code_cell(
            "import json as _json\n"
            f"print(_json.dumps({{'collected': {collect or 'None'}, "
            f"'row': {ROW if row else 'None'}}}))"))
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
    if (collect or row) and result["ok"]:
        text = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
        values = json.loads(text)
        if collect:
            result["collected"] = values["collected"]
        if row:
            result["row"] = values["row"]
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
    parser.add_argument("--write-table", action="store_true",
                        help="write each seed's measured row into the chapter's seeds table")
    options = parser.parse_args(argv)
    count = len(options.seeds)
    with ProcessPoolExecutor(max_workers=options.jobs) as pool:
        results = list(pool.map(run, [options.notebook] * count, options.seeds,
                                [options.collect] * count, [options.keep] * count))
    notebook = nbformat.read(options.notebook, as_version=4)
    if options.write_table:
        rows = {result["seed"]: result["row"] for result in results if "row" in result}
        write_rows(notebook, rows)
        nbformat.write(notebook, options.notebook)
        print(f"wrote the rows of seeds {sorted(rows)} into the table of {options.notebook}")
        problems = {}
    else:
        problems = row_problems(results, table_rows(notebook))
    for result in results:
        status = "every check holds" if result["ok"] else (
            f"FAILS in cell {result['cell']}: {result['error']}")
        if result["seed"] in problems:
            status = f"every check holds, but {problems[result['seed']]}"
        print(f"SEED = {result['seed']}: {status} ({result['seconds']} s)", flush=True)
        if "collected" in result:
            print(f"  {json.dumps(result['collected'])}")
    return 0 if all(result["ok"] for result in results) and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
