"""How `make test` shares the tests between its two xdist workers (top-level conftest.py).

A notebook's cells share one kernel, so they must run in order on one worker; the tests of the
built website must too, or two workers would build `_build/` at once.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("book_root_conftest", ROOT / "conftest.py")
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
test_group = _conftest.test_group


def test_make_test_runs_on_two_workers():
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "-m pytest -n 2" in recipe.group(1)


def test_a_notebooks_cells_stay_together():
    for chapter in sorted((ROOT / "chapters").glob("*.ipynb")):
        name = f"chapters/{chapter.name}"
        assert {test_group(f"{name}::Cell {i}") for i in range(40)} == {name}


def test_the_book_files_are_one_group_and_a_new_reader_stops_collection():
    assert {test_group(f"{file}::test_x") for file in _conftest._BOOK_FILES} == {"book"}
    reader = SimpleNamespace(nodeid="tests/test_new_page.py::test_x", fixturenames=["built_book"])
    with pytest.raises(pytest.UsageError, match="test_new_page.py"):
        _conftest.pytest_collection_modifyitems(None, [reader])


def test_other_files_are_a_group_each_and_practice_runs_spread():
    assert test_group("tests/test_attention.py::test_a[1]") == "tests/test_attention.py"
    assert test_group("tests/test_attention.py::test_b") == "tests/test_attention.py"
    runs = [f"tests/test_practice.py::test_practice_notebook_runs_and_blank_exercises_get_"
            f"feedback[{chapter.stem}]" for chapter in sorted((ROOT / "chapters").glob("*.ipynb"))]
    assert len({test_group(run) for run in runs}) == len(runs)
    assert test_group("tests/test_practice.py::test_practice_notebook_is_up_to_date[x]") == (
        "tests/test_practice.py")
