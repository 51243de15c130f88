"""What the grader trusts: a fingerprint of the book's package, checked before student code runs.

Grading imports the checkers and the grader from the installed ``attention_book`` package.
If a student's code could change those files, every later grade would be the student's to
decide, so ``autograde`` takes a fingerprint of the package (the SHA-256 of every Python
file) before any student code of the run executes, the grading process checks it once it
has loaded the checkers and again before each student's grader starts, and ``autograde``
checks it after nbgrader's feedback run. A difference stops the run and names the files.
The kernel layers of the sandbox are what keeps the files unchanged; this check is what
tells the instructor if anything ever did.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["PackageChanged", "changed_files", "fingerprint"]


class PackageChanged(RuntimeError):
    """The book's package is not the one the run started with."""


def _package_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("attention_book")
    if spec is None or spec.origin is None:
        raise PackageChanged("the attention_book package is not installed here")
    return Path(spec.origin).resolve().parent


def fingerprint(folder: str | Path | None = None) -> dict[str, str]:
    """The SHA-256 of every Python file of the package, by path relative to it.

    Args:
        folder: the package folder (default: the installed ``attention_book``).

    Returns:
        ``{relative path: hex digest}``, sorted by path.
    """
    root = Path(folder) if folder is not None else _package_folder()
    digests = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digests[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The files added, removed or changed between two fingerprints.

    Args:
        before: a :func:`fingerprint`.
        after: a later one.

    Returns:
        Relative paths, sorted.
    """
    return sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))
