"""Practice notebooks for self-learners: each chapter with its answers taken out.

``practice/NN_name.ipynb`` is what the website's Colab, Binder and download buttons open. It
is generated from the chapter by ``nbgrader generate_assignment``, the same code path as the
classroom assignments, in a throw-away course folder, so every answer cell is cut back to
its signature and docstring plus ``raise NotImplementedError()`` and the hidden tests are
gone. Unlike a classroom release, a practice notebook keeps the chapter's outputs (figures,
demos, printed checks), so it reads like the website; only the outputs of the answer and
check cells are removed, so no "Correct" is stored under an empty answer, and the sentence of
the exercise section that sends a reader to the practice version says they are in it.

Regenerate them with ``make practice`` (``python -m attention_book.classroom.practice``);
``tests/test_practice.py`` fails when one is out of date with its chapter.

The same command first applies the book's one repository setting, ``repository.url`` and
``repository.branch`` in ``_config.yml``, to every place that names the repository
(:func:`sync_repository_setting`): the Colab install cell of every chapter (and so of every
practice notebook generated from it), ``CITATION.cff``, the branch that the website's
deploy workflow publishes, and the clone command and help link of ``plan_your_path.md``. The
website's launch buttons read the setting themselves.

Not taught in a chapter: chapter 0 tells learners where the practice notebooks are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .format import chapter_number, find_chapters

__all__ = ["HEADER_ID", "PLAN_PAGE", "repository_setting", "install_cell_source", "sync_repository_setting",
           "practice_notebooks", "write_practice_notebooks", "main"]

#: The id of the generated first cell, which says where the notebook comes from.
HEADER_ID = "practice-header"

#: The page with the routes through the book, the clone command and the help link.
PLAN_PAGE = "plan_your_path.md"
# The help link's text on that page; its address is the repository's issues page.
_HELP_LINK = "[the book's issue tracker]"

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
`raise NotImplementedError()`, run the cell, then run the check cell below it. A check that
fails prints what is still wrong, with a hint, and then stops with an `AssertionError`: the
error only marks the check as failed, and the message above it says why. The chapter with its
solutions is on the book's website.

Work in your own copy of this notebook: `make lab` puts one in `my-work/` (git ignores that
folder and `make practice` never writes there); on Colab, use *File → Save a copy in Drive*.

*For the book's authors: this notebook is generated from `chapters/{name}` by `make practice`;
change the chapter, not this file.*"""

# A chapter's exercise section sends its reader to the practice version; in the practice
# version itself that sentence becomes this one.
_GO_TO_PRACTICE = re.compile(
    r"Do (?:the exercises|them) in (?:the|this) (?:chapter's )?practice\s+version\b[^.]*\.")
_HERE = "You are in the practice version: do the exercises below, then run each check."


# The first code cell of every chapter. `make practice` writes it from _config.yml; the hygiene
# test compares each chapter's cell with it. Where the package imports (a local clone, a
# hub with it installed, Colab after the first run) it does nothing and prints nothing.
_INSTALL_CELL = """\
# Install the book's package where it is missing: on Colab; anywhere else, say how.
import sys

try:
    import attention_book  # noqa: F401
except ImportError:
    _package = {package}
    if "google.colab" in sys.modules:
        import subprocess

        print("Installing the book's package (about a minute)...", flush=True)
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", _package],
                              capture_output=True, text=True)
        if _pip.returncode != 0:
            raise RuntimeError(
                "Could not install the book's package, which every cell below needs.\\n"
                f"pip tried: pip install '{{_package}}'\\n"
                "Is this runtime online? Installing needs the internet: check the connection,\\n"
                "then run this cell again. Does the address after 'git+' open in a browser? If\\n"
                "the book has moved, put its new address in this cell, and tell its authors.\\n"
                "What pip said:\\n" + _pip.stderr[-2000:]
            ) from None
    else:
        raise ModuleNotFoundError(
            "This notebook needs the book's package, attention_book, and this kernel's Python\\n"
            "does not have it. Install it from a cell of its own, then restart the kernel:\\n"
            f"    %pip install '{{_package}}'\\n"
            "(It needs PyTorch. On Linux, pip's default torch is the large CUDA build: install\\n"
            "torch from https://download.pytorch.org/whl/cpu first if you have no GPU.)"
        ) from None"""

_PACKAGE = "attention-book[book] @ git+{url}@{branch}"


def repository_setting(root: str | Path = ".") -> tuple[str, str]:
    """The book's repository: ``repository.url`` and ``repository.branch`` in ``_config.yml``.

    Args:
        root: the repository root (holds ``_config.yml``).

    Returns:
        ``(url, branch)``, e.g. ``("https://github.com/owner/name", "main")``.

    Raises:
        ValueError: the setting is missing, or the URL is not an ``https://`` address.
    """
    import yaml

    config = yaml.safe_load(Path(root, "_config.yml").read_text(encoding="utf-8"))
    repository = (config or {}).get("repository") or {}
    url, branch = repository.get("url"), repository.get("branch")
    if not isinstance(url, str) or not re.fullmatch(r"https://[^\s'\"@]+", url.rstrip("/")):
        raise ValueError(f"_config.yml: repository.url must be an https:// address, not {url!r}")
    if not isinstance(branch, str) or not re.fullmatch(r"[\w./-]+", branch):
        raise ValueError(f"_config.yml: repository.branch must be a branch name, not {branch!r}")
    return url.rstrip("/"), branch


def install_cell_source(root: str | Path = ".") -> str:
    """The source of the Colab install cell, for the repository named in ``_config.yml``.

    Args:
        root: the repository root.

    Returns:
        The cell's Python source: on Colab it pip-installs ``attention-book[book]`` from the
        repository's branch and, if that fails, raises a ``RuntimeError`` that names the
        address it tried and how to fix it; anywhere else it does nothing.
    """
    url, branch = repository_setting(root)
    package = _PACKAGE.format(url=url, branch=branch)
    return _INSTALL_CELL.format(package=json.dumps(package))


def _sync_install_cell(path: Path, source: str) -> bool:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    if not code or '"google.colab" in sys.modules' not in "".join(code[0]["source"]):
        raise ValueError(f"{path.name}: the first code cell is not the Colab install cell")
    if "".join(code[0]["source"]) == source:
        return False
    code[0]["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    return True


def _sync_line(path: Path, pattern: str, replacement: str) -> bool:
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    new, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    if count != 1:
        raise ValueError(f"{path.name}: found no line matching {pattern!r} to update")
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


def sync_repository_setting(root: str | Path = ".",
                            chapters: Sequence[str | Path] | None = None) -> list[Path]:
    """Write the repository setting of ``_config.yml`` into every file that names it.

    Rewrites the Colab install cell of each chapter (:func:`install_cell_source`; the rest
    of the notebook is left as it is), ``repository-code`` in ``CITATION.cff``, the branch
    that ``.github/workflows/pages.yml`` publishes from, and in ``plan_your_path.md`` the
    clone command and the help link (the repository's issues page).

    Args:
        root: the repository root.
        chapters: chapter notebooks (default: every chapter).

    Returns:
        The files that changed.

    Raises:
        ValueError: a chapter does not start with the install cell, or a file lacks the line
            that names the repository.
    """
    url, branch = repository_setting(root)
    source = install_cell_source(root)
    paths = [Path(c) for c in chapters] if chapters is not None else find_chapters(root)
    changed = [path for path in paths if _sync_install_cell(path, source)]
    citation = Path(root, "CITATION.cff")
    if _sync_line(citation, r"^repository-code: .*$", f'repository-code: "{url}"'):
        changed.append(citation)
    plan = Path(root, PLAN_PAGE)
    clone = _sync_line(plan, r"^git clone \S+$", f"git clone {url}.git")
    if _sync_line(plan, rf"{re.escape(_HELP_LINK)}\(\S+?\)", f"{_HELP_LINK}({url}/issues)") or clone:
        changed.append(plan)
    workflow = Path(root, ".github", "workflows", "pages.yml")
    if _sync_line(workflow, r"^(\s+branches: )\[[^\]\n]*\]", rf"\g<1>[{branch}]"):
        changed.append(workflow)
    return changed


def _run_generate(course: Path, names: Sequence[str]) -> None:
    from .course import run_nbgrader

    run_nbgrader(course, "generate_assignment", "*", "--force")
    missing = [name for name in names if not (course / "release" / name / f"{name}.ipynb").exists()]
    if missing:
        raise RuntimeError(f"nbgrader wrote no practice version of {missing}")


def _clean(notebook: dict, chapter: Path) -> dict:
    """Remove the answer and check cells' outputs, point the exercises here, add the header."""
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        cell.get("metadata", {}).pop("execution", None)  # run timestamps: not part of a chapter
        if cell["cell_type"] == "code" and (meta.get("solution") or meta.get("grade")):
            cell["outputs"] = []
            cell["execution_count"] = None
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            here = _GO_TO_PRACTICE.sub(_HERE, source)
            if here != source:
                cell["source"] = here.splitlines(keepends=True)
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
    """Command line: ``python -m attention_book.classroom.practice [CHAPTER ...]``.

    First applies the repository setting of ``_config.yml`` (:func:`sync_repository_setting`,
    to every chapter), then writes the practice notebooks of the chapters given (default: all).
    """
    parser = argparse.ArgumentParser(
        description="Apply _config.yml's repository setting, then write practice/NN_name.ipynb.")
    parser.add_argument("chapters", nargs="*", help="chapter notebooks (default: all)")
    parser.add_argument("--root", default=".", help="repository root (default: .)")
    options = parser.parse_args(argv)
    try:
        for path in sync_repository_setting(options.root):
            print(f"updated {path} from _config.yml's repository setting")
        written = write_practice_notebooks(options.root, chapters=options.chapters or None)
    except (RuntimeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
