"""Pin the numeric environment for everything pytest runs, before torch is imported.

The chapters' stored outputs are compared bit for bit by nbval, and the last bits of a
float depend on the CPU code path (PyTorch's AVX2 or AVX-512 kernels, MKL's branch, the
thread count). This file applies ``tools/numerics/pinned.env`` to this process and, through
the environment, to every kernel that nbval and nbgrader start. ``BOOK_NUMERICS=alternate``
selects ``tools/numerics/alternate.env`` instead: ``tests/test_code_paths.py`` uses it to
re-run the book under a deliberately different code path.

It lives at the top of the repository so that it also applies to ``pytest chapters/...``.
It also decides how ``make test`` (``pytest -n 2``) shares the tests between its two workers:
see ``test_group`` below.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "book_numerics", Path(__file__).resolve().parent / "tools" / "numerics" / "environment.py"
)
book_numerics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(book_numerics)

os.environ.update(book_numerics.numeric_environment(os.environ.get("BOOK_NUMERICS", "pinned")))
# PyTorch's two OpenMP threads wait for work by spinning. The test command runs two workers,
# each with kernels and servers of its own, on two cores: a spinning thread then holds a core
# that another process needs, and a loop of small operations (chapter 18's token loop)
# took 17 s instead of half a second. Waiting threads sleep instead; the results are the same
# (how a reduction is split depends on the thread count, not on how threads wait).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Every figure that a kernel started by the tests shows is checked for overlapping text (a legend
# over an annotation, colliding tick labels): the backend raises in the cell, so strict nbval
# fails. See src/attention_book/_figure_check_inline.py; Jupyter and `make execute` never use it.
os.environ["MPLBACKEND"] = "module://attention_book._figure_check_inline"


# --------------------------------------------------------------------------------------
# Running the test command on both cores (`make test` passes `-n 2`, pytest-xdist).
#
# Each group of tests goes to one worker, which runs it from start to end. A group is one
# file: a notebook's nbval cells share its kernel, and a test file's module fixtures (a course,
# a hub, a trained model) are built once. The files that build or read the website in
# `_build/` are one group, "book", so one worker builds the site there, one build at a time.
# Each chapter's second run (tests/test_code_paths.py: another CPU code path, the practice
# version, the wheel) is a group of its own, so those runs spread over both workers. The
# slowest groups start first, then the chapters' second runs, so that no worker is left alone
# with a long one at the end.

_BOOK_FILES = ("tests/test_book_build.py", "tests/test_browser.py",
               "tests/test_browser_minute_demo.py", "tests/test_browser_training_demo.py",
               "tests/test_practice_links.py", "tests/test_pages_workflow.py")
_ONE_GROUP_EACH = (
    "tests/test_code_paths.py::test_chapter_under_another_code_path_from_the_wheel_with_its_",
)
_SLOWEST_FIRST = (  # measured with --durations: each takes 1 to 5 minutes
    "book",
    "tests/test_classroom_scenario.py",
    "tests/test_classroom_clean.py",
    "tests/test_jupyterhub.py",
)


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def test_group(nodeid: str) -> str:
    """The group of a test: what one xdist worker runs from start to end."""
    file = _file(nodeid)
    if file in _BOOK_FILES:
        return "book"
    if nodeid.startswith(_ONE_GROUP_EACH):
        return nodeid
    return file


test_group.__test__ = False  # a helper, not a test


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    strays = sorted({_file(item.nodeid) for item in items
                     if "built_book" in getattr(item, "fixturenames", ())} - set(_BOOK_FILES))
    if strays:
        raise pytest.UsageError(f"{strays} read the built book: add them to _BOOK_FILES in "
                                "conftest.py, so that one xdist worker builds it")

    def rank(item) -> int:
        group = test_group(item.nodeid)
        if group in _SLOWEST_FIRST:
            return _SLOWEST_FIRST.index(group)
        return len(_SLOWEST_FIRST) + (0 if group.startswith(_ONE_GROUP_EACH) else 1)

    items.sort(key=rank)  # stable: inside a group, and among the rest, the order is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whatever --dist says, xdist sends whole groups (:func:`test_group`), in our order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return test_group(nodeid)

    if config.getvalue("dist") == "each":
        return None
    config.option.loadscopereorder = False  # keep the slowest-first order of the collection
    return GroupScheduling(config, log)
