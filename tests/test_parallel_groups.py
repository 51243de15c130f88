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


def _second_runs() -> list[str]:
    """The node ids of the chapters' second runs (tests/test_code_paths.py), as pytest names them."""
    import test_code_paths

    test = test_code_paths.test_chapter_under_another_code_path_from_the_wheel_with_its_practice_version
    return [f"tests/test_code_paths.py::{test.__name__}[{chapter.stem}]"
            for chapter in test_code_paths.CHAPTERS]


def test_other_files_are_a_group_each_and_the_chapters_second_runs_spread():
    assert test_group("tests/test_attention.py::test_a[1]") == "tests/test_attention.py"
    assert test_group("tests/test_attention.py::test_b") == "tests/test_attention.py"
    runs = _second_runs()
    assert len(runs) == len(list((ROOT / "chapters").glob("*.ipynb")))
    assert len({test_group(run) for run in runs}) == len(runs)
    assert test_group("tests/test_code_paths.py::test_the_wheel_holds_every_file_of_the_package") == (
        "tests/test_code_paths.py")
    assert test_group("tests/test_practice.py::test_practice_notebook_is_up_to_date[x]") == (
        "tests/test_practice.py")


def test_the_slowest_groups_start_first_then_the_chapters_second_runs():
    book = SimpleNamespace(nodeid="tests/test_book_build.py::test_book_builds_without_warnings",
                           fixturenames=["built_book"])
    second_run = SimpleNamespace(nodeid=_second_runs()[0], fixturenames=[])
    other = SimpleNamespace(nodeid="tests/test_attention.py::test_a", fixturenames=[])
    items = [other, second_run, book]
    _conftest.pytest_collection_modifyitems(None, items)
    assert items == [book, second_run, other]
