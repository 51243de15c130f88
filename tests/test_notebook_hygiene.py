"""Hygiene of every chapter notebook: proof of restart-and-run-all and the book's conventions.

nbval re-executes the notebooks and compares outputs; these checks cover what nbval cannot
see: that the stored outputs came from one clean run, that nothing was left on stderr, and
that the conventions of CONTRIBUTING.md hold (Colab install cell, setup cell, alt text).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from attention_book.classroom.practice import install_cell_source

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"(/root/|/home/[^/\s]+/|/Users/[^/\s]+/|/tmp/|[A-Z]:\\\\Users|site-packages)")
ADDRESS = re.compile(r"at 0x[0-9a-fA-F]{6,}")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _code_cells(nb: dict) -> list[dict]:
    return [cell for cell in nb["cells"] if cell["cell_type"] == "code"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _output_text(output: dict) -> str:
    parts = [json.dumps(output.get("text", ""))]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith("json"):
            parts.append(json.dumps(value))
    return "".join(parts)


def _toc_files() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = set()

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.add(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc)
    return files


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks found in chapters/"


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request):
    return request.param, _load(request.param)


def test_name_and_kernelspec(notebook):
    path, nb = notebook
    assert re.fullmatch(r"\d\d_[a-z0-9_]+", path.stem), f"{path.name}: name it NN_short_name.ipynb"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: kernelspec must be python3"
    )


def test_listed_in_toc(notebook):
    path, _ = notebook
    assert f"chapters/{path.stem}" in _toc_files(), f"{path.name} is not listed in _toc.yml"


def test_saved_after_one_clean_run(notebook):
    path, nb = notebook
    cells = _code_cells(nb)
    counts = [cell.get("execution_count") for cell in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(cells)}; "
        "re-run it with `make execute NB=...` (restart and run all) and save"
    )


def test_no_errors_stderr_or_machine_details(notebook):
    path, nb = notebook
    problems = []
    for index, cell in enumerate(_code_cells(nb), 1):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                problems.append(f"code cell {index}: error output {output.get('ename')}")
            if output.get("name") == "stderr":
                problems.append(f"code cell {index}: stderr {''.join(output['text'])[:120]!r}")
            text = _output_text(output)
            if MACHINE_PATH.search(text):
                problems.append(f"code cell {index}: a machine-specific path in the output")
            if ADDRESS.search(text):
                problems.append(f"code cell {index}: a memory address in the output")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_starts_with_title_goals_and_colab_install_cell(notebook):
    path, nb = notebook
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown" and _source(first).startswith("# "), (
        f"{path.name}: the first cell must be a markdown cell with the chapter title"
    )
    install = _code_cells(nb)[0]
    source = _source(install)
    assert '"google.colab" in sys.modules' in source, (
        f"{path.name}: the first code cell must be the Colab install cell"
    )
    assert source == install_cell_source(ROOT), (
        f"{path.name}: the install cell differs from the one written from _config.yml's "
        "repository setting: run `make practice`"
    )
    assert "remove-cell" in install["metadata"].get("tags", []), (
        f"{path.name}: tag the install cell remove-cell"
    )
    assert install.get("outputs", []) == [], f"{path.name}: the install cell must be silent off Colab"


def test_visible_setup_cell_sets_print_options(notebook):
    path, nb = notebook
    setup = _code_cells(nb)[1]
    assert "torch.set_printoptions(precision=4, sci_mode=False)" in _source(setup), (
        f"{path.name}: the second code cell must be the visible setup cell with "
        "torch.set_printoptions(precision=4, sci_mode=False)"
    )
    assert "remove-cell" not in setup["metadata"].get("tags", [])


def test_every_figure_has_alt_text(notebook):
    path, nb = notebook
    missing = []
    for index, cell in enumerate(_code_cells(nb), 1):
        has_image = any(
            "image/png" in output.get("data", {}) or "image/svg+xml" in output.get("data", {})
            for output in cell.get("outputs", [])
        )
        alt = cell["metadata"].get("mystnb", {}).get("image", {}).get("alt", "")
        if has_image and len(alt.strip()) < 15:
            missing.append(f"code cell {index}")
    assert not missing, (
        f"{path.name}: figures without meaningful alt text (cell metadata mystnb.image.alt): {missing}"
    )


def test_ignored_outputs_are_explained(notebook):
    path, nb = notebook
    unexplained = []
    for index, cell in enumerate(_code_cells(nb), 1):
        if "nbval-ignore-output" in cell["metadata"].get("tags", []):
            comments = [line for line in _source(cell).splitlines() if line.strip().startswith("#")]
            if not any(re.search(r"tim|vari", line, re.IGNORECASE) for line in comments):
                unexplained.append(f"code cell {index}")
    assert not unexplained, (
        f"{path.name}: cells tagged nbval-ignore-output need a comment saying why their output "
        f"varies (only timings may): {unexplained}"
    )


def test_chapters_do_not_import_each_other(notebook):
    path, nb = notebook
    for cell in _code_cells(nb):
        source = _source(cell)
        assert not re.search(r"(import|from)\s+chapters|%run|\d\d_[a-z_]+\.ipynb", source), (
            f"{path.name}: a chapter must not import or run another chapter"
        )
