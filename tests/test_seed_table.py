"""Chapter 15's table of seeds is computed, not typed: ``tools/other_seeds.py`` checks each
seed's row against the cell that computes it, and here the row of ``SEED = 0`` against that
cell's stored output (which strict nbval compares with a fresh run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "15_attention_in_a_model.ipynb"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("other_seeds", ROOT / "tools" / "other_seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_row_of_seed_0_is_the_row_the_chapter_computes(tool):
    notebook = nbformat.read(CHAPTER, as_version=4)
    computing = [cell for cell in notebook.cells
                 if cell.cell_type == "code" and f"\n{tool.ROW} = " in f"\n{cell.source}"]
    assert len(computing) == 1
    printed = "".join(output.get("text", "") for output in computing[0].outputs)
    computed = [line for line in printed.splitlines() if line.startswith("| 0 |")]
    assert len(computed) == 1, printed
    rows = tool.table_rows(notebook)
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[0] == computed[0]
    columns = rows[0].count(" | ")
    assert all(row.count(" | ") == columns for row in rows.values())


def _table_notebook(*rows: str):
    table = "\n".join(["Intro.", "", "| `SEED` | a | b |", "|---|---|---|", *rows, "", "After."])
    return new_notebook(cells=[new_code_cell("SEED = 0"), new_markdown_cell(table)])


def test_the_tool_writes_rows_into_the_table_and_keeps_the_rest(tool):
    notebook = _table_notebook("| 0 | 1 | 2 |", "| 2 | 5 | 6 |")
    tool.write_rows(notebook, {1: "| 1 | 3 | 4 |", 2: "| 2 | 7 | 8 |"})
    assert notebook.cells[1].source.splitlines() == [
        "Intro.", "", "| `SEED` | a | b |", "|---|---|---|", "| 0 | 1 | 2 |", "| 1 | 3 | 4 |",
        "| 2 | 7 | 8 |", "", "After."]
    empty = _table_notebook()
    tool.write_rows(empty, {0: "| 0 | 1 | 2 |"})
    assert tool.table_rows(empty) == {0: "| 0 | 1 | 2 |"}
    with pytest.raises(ValueError, match="seed 3"):
        tool.write_rows(notebook, {3: "| 4 | 1 | 2 |"})


def test_the_tool_fails_a_seed_whose_row_differs_from_the_table(tool):
    table = tool.table_rows(_table_notebook("| 0 | 1 | 2 |", "| 1 | 3 | 4 |"))
    results = [{"seed": 0, "ok": True, "row": "| 0 | 1 | 2 |"},
               {"seed": 1, "ok": True, "row": "| 1 | 3 | 5 |"},
               {"seed": 2, "ok": True, "row": "| 2 | 0 | 0 |"},
               {"seed": 3, "ok": False}]
    problems = tool.row_problems(results, table)
    assert sorted(problems) == [1, 2]
    assert "| 1 | 3 | 4 |" in problems[1] and "| 1 | 3 | 5 |" in problems[1]
    assert "None" in problems[2]  # no row for seed 2 in the table
