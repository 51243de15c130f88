"""The practice notebooks: fresh, and holding no answer.

``practice/NN_name.ipynb`` is generated from each chapter by nbgrader (``make practice``).
A practice notebook must (1) equal what the generator writes today, so it never drifts from
its chapter; (2) run from the top without an error up to its first exercise and through every
blank answer cell; and (3) answer each check cell of a blank exercise with the checker's
feedback ("You have not written … yet") and a failed assert, never a ``NameError`` and never
"Correct". This file checks (1) and that no answer is left in it; (2) and (3) are checked in
the chapter's second run (``tests/test_code_paths.py``), which runs the practice version of
every exercise cell in the same kernel as the chapter, instead of running each practice
notebook a third time. The website's buttons that open them are tested in
``test_practice_links.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attention_book.classroom.format import find_chapters
from attention_book.classroom.practice import HEADER_ID, practice_notebooks

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = find_chapters(ROOT)
PRACTICE = ROOT / "practice"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return practice_notebooks(ROOT)


def test_every_chapter_has_a_practice_notebook_and_no_other():
    assert sorted(p.name for p in PRACTICE.glob("*.ipynb")) == sorted(c.name for c in CHAPTERS)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_practice_notebook_is_up_to_date(chapter, generated):
    committed = (PRACTICE / chapter.name).read_text(encoding="utf-8")
    assert committed == generated[chapter.name], (
        f"practice/{chapter.name} is out of date with chapters/{chapter.name}: run `make practice`")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_practice_notebook_says_what_it_is_and_holds_no_answer(chapter):
    notebook = json.loads((PRACTICE / chapter.name).read_text())
    header = notebook["cells"][0]
    assert header["id"] == HEADER_ID and "make practice" in "".join(header["source"])
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("solution"):
            assert "raise NotImplementedError()" in "".join(cell["source"])
        if meta.get("solution") or meta.get("grade"):
            assert not cell.get("outputs"), "an answer or check cell kept a stored output"
