"""Practice notebooks for self-learners: each chapter with its answers taken out.

``practice/NN_name.ipynb`` is what the website's Colab, Binder and download buttons open. It
is generated from the chapter by ``nbgrader generate_assignment``, the same code path as the
classroom assignments, in a throw-away course folder, so every answer cell is cut back to
its signature and docstring plus ``raise NotImplementedError()`` and the hidden tests are
gone. Unlike a classroom release, a practice notebook keeps the chapter's outputs (figures,
demos, printed checks), so it reads like the website; only the outputs of the answer and
check cells are removed, so no "Correct" is stored under an empty answer.

Regenerate them with ``make practice`` (``python -m attention_book.classroom.practice``);
``tests/test_practice.py`` fails when one is out of date with its chapter.

Not taught in a chapter: chapter 0 tells learners where the practice notebooks are.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .format import chapter_number, find_chapters

__all__ = ["HEADER_ID", "practice_notebooks", "write_practice_notebooks", "main"]

#: The id of the generated first cell, which says where the notebook comes from.
HEADER_ID = "practice-header"

_CONFIG = """\
# A throw-away nbgrader course that turns chapters into practice notebooks.
c = get_config()  # noqa: F821 - provided by nbgrader
c.CourseDirectory.course_id = "attention-step-by-step-practice"
c.CourseDirectory.root = {root!r}
c.CourseDirectory.db_url = {db_url!r}
# Keep the chapter's outputs; the answer and check cells' outputs are removed afterwards.
c.ClearOutput.enabled = False
"""

_HEADER = """\
**Practice version of chapter {number}.** The exercises at the end are yours to do: each answer
cell holds only the function's signature and docstring. Write your code in place of
`raise NotImplementedError()`, run the cell, then run the check cell below it, which tells you
what is still wrong. The chapter with its solutions is on the book's website.

*This notebook is generated from `chapters/{name}` by `make practice`; do not edit it by hand.*"""


def _run_generate(course: Path, names: Sequence[str]) -> None:
    from .course import run_nbgrader

    run_nbgrader(course, "generate_assignment", "*", "--force")
    missing = [name for name in names if not (course / "release" / name / f"{name}.ipynb").exists()]
    if missing:
        raise RuntimeError(f"nbgrader wrote no practice version of {missing}")


def _clean(notebook: dict, chapter: Path) -> dict:
    """Remove the answer and check cells' outputs and add the header cell."""
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and (meta.get("solution") or meta.get("grade")):
            cell["outputs"] = []
            cell["execution_count"] = None
    header = {
        "cell_type": "markdown",
        "id": HEADER_ID,
        "metadata": {},
        "source": _HEADER.format(number=chapter_number(chapter), name=chapter.name).splitlines(
            keepends=True),
    }
    notebook["cells"].insert(0, header)
    return notebook


def practice_notebooks(root: str | Path = ".", chapters: Sequence[str | Path] | None = None,
                       ) -> dict[str, str]:
    """Generate the practice version of chapters, as notebook JSON text.

    Args:
        root: the repository root (holds ``chapters/``).
        chapters: chapter notebooks (default: every chapter).

    Returns:
        Each chapter's file name mapped to the text of its practice notebook, in the
        layout Jupyter writes (one-space indent, a final newline).

    Raises:
        RuntimeError: nbgrader failed.
    """
    paths = [Path(c) for c in chapters] if chapters is not None else find_chapters(root)
    with tempfile.TemporaryDirectory(prefix="practice-") as scratch:
        course = Path(scratch)
        (course / "nbgrader_config.py").write_text(
            _CONFIG.format(root=str(course), db_url=f"sqlite:///{course / 'gradebook.db'}"),
            encoding="utf-8")
        for path in paths:
            folder = course / "source" / path.stem
            folder.mkdir(parents=True)
            (folder / path.name).write_bytes(path.read_bytes())
        _run_generate(course, [path.stem for path in paths])
        result = {}
        for path in paths:
            released = course / "release" / path.stem / path.name
            notebook = _clean(json.loads(released.read_text(encoding="utf-8")), path)
            result[path.name] = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    return result


def write_practice_notebooks(root: str | Path = ".", out_dir: str | Path = "practice",
                             chapters: Sequence[str | Path] | None = None) -> list[Path]:
    """Write ``practice/NN_name.ipynb`` for chapters (default: all), replacing old versions.

    Args:
        root: the repository root.
        out_dir: where to write them, relative to ``root``.
        chapters: chapter notebooks (default: every chapter).

    Returns:
        The paths written.
    """
    target = Path(root, out_dir)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in practice_notebooks(root, chapters).items():
        (target / name).write_text(text, encoding="utf-8")
        written.append(target / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m attention_book.classroom.practice [CHAPTER ...]``."""
    parser = argparse.ArgumentParser(description="Write practice/NN_name.ipynb for chapters.")
    parser.add_argument("chapters", nargs="*", help="chapter notebooks (default: all)")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    options = parser.parse_args(argv)
    try:
        written = write_practice_notebooks(options.root, chapters=options.chapters or None)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
