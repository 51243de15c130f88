"""What the grader trusts: a fingerprint of the book's package, checked before student code runs.

Grading imports the checkers and the grader from the installed ``attention_book`` package.
If a student's code could change those files, every later grade would be the student's to
decide, so ``autograde`` takes a fingerprint of the package (the SHA-256 of every Python
file) before any student code of the run executes, the grading process checks it once it
has loaded the checkers and again before each student's grader starts, and ``autograde``
checks it after nbgrader's feedback run. A difference stops the run and names the files.
The kernel layers of the sandbox are what keeps the files unchanged; this check is what
tells the instructor if anything ever did.

Python runs a module's cached bytecode (``__pycache__/*.pyc``) whenever its header matches
the source's time and size, and the fingerprint covers sources only. So the grading process
never runs a cache of the package: it starts through :data:`SOURCE_ONLY`, which compiles
every module of ``attention_book`` from its source. After a run without kernel isolation,
where a student's code could have written anywhere, ``autograde`` removes the package's
caches (:func:`remove_bytecode_caches`) and refuses the package until the instructor has
reinstalled it.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["SOURCE_ONLY", "PackageChanged", "changed_files", "fingerprint",
           "remove_bytecode_caches"]

#: Python source that makes every later import of ``attention_book`` compile its module from
#: the source file, never from a bytecode cache (run it with ``-c`` before the package is
#: imported; :mod:`.clean` starts the grading process so).
SOURCE_ONLY = """\
import importlib.machinery as _machinery
import sys as _sys


class _FromSource(_machinery.SourceFileLoader):
    def get_code(self, fullname):
        return compile(self.get_data(self.path), self.path, "exec", dont_inherit=True)


class _SourceOnly:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "attention_book" and not name.startswith("attention_book."):
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is not None and type(spec.loader) is _machinery.SourceFileLoader:
            spec.loader = _FromSource(spec.loader.name, spec.loader.path)
            spec.cached = None
        return spec


_sys.meta_path.insert(0, _SourceOnly)
_sys.dont_write_bytecode = True
"""


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


def remove_bytecode_caches(folder: str | Path | None = None) -> list[str]:
    """Remove every ``__pycache__`` folder of the package.

    Args:
        folder: the package folder (default: the installed ``attention_book``).

    Returns:
        The caches that could not be removed (a read-only installation), relative to it.
    """
    import shutil

    root = Path(folder) if folder is not None else _package_folder()
    left = []
    for cache in sorted(root.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
        if cache.exists():
            left.append(cache.relative_to(root).as_posix())
    return left
