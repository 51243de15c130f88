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

A practice notebook speaks to the learner (the generated header tells authors, not learners,
not to edit it, and the exercise section no longer sends its reader to the practice version
it is in), and ``make lab`` installs only what a learner needs and gives them their own copy of
the practice notebooks in ``my-work/``, which it never overwrites.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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


def _markdown(path: Path) -> list[str]:
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
            if cell["cell_type"] == "markdown"]


def test_practice_notebooks_speak_to_the_learner():
    """"Do not edit" is for authors; the learner is told to work in a copy, and what a failed
    check's AssertionError means; no exercise section sends them to the notebook they are in."""
    sent_away = re.compile(r"Do (?:the exercises|them) in [^.]*practice\s+version")
    rewritten = 0
    for chapter in CHAPTERS:
        header, *rest = _markdown(PRACTICE / chapter.name)
        assert "do not edit it by hand" not in header
        assert "For the book's authors" in header and "make practice" in header
        assert "`my-work/`" in header and "Save a copy in Drive" in header
        assert "`AssertionError`" in header
        assert not any(sent_away.search(text) for text in rest), chapter.name
        in_chapter = any(sent_away.search(text) for text in _markdown(chapter))
        rewritten += in_chapter
        assert in_chapter == any("You are in the practice version" in text for text in rest)
    assert rewritten >= 5  # chapters 0, 1, 2, 3, 5 and 6 send their readers away


def test_make_lab_installs_the_learners_set_not_the_toolchain():
    makefile = (ROOT / "Makefile").read_text()
    lab = re.search(r"^lab: (.+)$", makefile, re.M).group(1)
    assert lab.strip() == "$(LAB_STAMP)", lab
    recipe = re.search(r"^\$\(LAB_STAMP\):.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "requirements-lab.txt" in recipe and "requirements.txt" not in recipe.replace(
        "requirements-lab.txt", "")
    lab_pins = _pins(ROOT / "requirements-lab.txt")
    test_pins = _pins(ROOT / "requirements.txt")
    assert {name: test_pins.get(name) for name in lab_pins} == lab_pins, "requirements-lab.txt " \
        "must pin the versions of requirements.txt"
    assert {"torch", "jupyterlab", "ipykernel", "ipywidgets"} <= set(lab_pins)
    assert not {"nbgrader", "jupyterhub", "playwright", "axe-playwright-python", "pytest",
                "pytest-xdist", "hypothesis", "ruff", "build", "jupyter-book"} & set(lab_pins)
    assert re.search(r"^-e \.\[book\]$", (ROOT / "requirements-lab.txt").read_text(), re.M)


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.split("#", 1)[0].strip())
        if match:
            pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def test_make_lab_copies_the_practice_notebooks_into_my_work_and_keeps_what_is_there(tmp_path):
    """`make lab` with a stand-in for JupyterLab: every practice notebook lands in my-work/
    once; a notebook the learner changed is never overwritten; JupyterLab opens in my-work/."""
    venv, work = tmp_path / "venv", tmp_path / "my-work"
    (venv / "bin").mkdir(parents=True)
    jupyter = venv / "bin" / "jupyter"
    jupyter.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'jupyter-args'}\n")
    jupyter.chmod(0o755)
    stamp = venv / ".installed-lab"
    stamp.touch()
    newest = max(os.stat(ROOT / name).st_mtime for name in ("requirements-lab.txt", "pyproject.toml"))
    os.utime(stamp, (newest + 60, newest + 60))  # installed: make must not install anything
    work.mkdir()
    mine = work / CHAPTERS[2].name
    mine.write_text("my answers")

    def lab() -> str:
        result = subprocess.run(["make", "--no-print-directory", "lab", f"VENV={venv}",
                                 f"MY_WORK={work}"], cwd=ROOT, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    first = lab()
    assert "pip install" not in first
    assert sorted(p.name for p in work.glob("*.ipynb")) == sorted(c.name for c in CHAPTERS)
    assert mine.read_text() == "my answers" and f"practice/{mine.name}" not in first
    assert (work / CHAPTERS[0].name).read_bytes() == (PRACTICE / CHAPTERS[0].name).read_bytes()
    assert first.count("copied practice/") == len(CHAPTERS) - 1
    assert f"--ContentsManager.preferred_dir={work}" in (tmp_path / "jupyter-args").read_text()
    assert "copied" not in lab()  # a second run copies nothing
    assert "my-work/" in (ROOT / ".gitignore").read_text().splitlines()  # git leaves it alone
