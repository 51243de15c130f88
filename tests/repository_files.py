"""A copy of the repository's own files (what a clean clone has), for tests that change or build it.

Not a test module: ``test_code_paths.py`` builds the wheel from such a copy, and
``test_publishing.py`` changes the repository setting in one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def repository_files() -> list[str]:
    """The files git tracks, plus new ones it does not ignore, as paths relative to the root."""
    result = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, (
        f"these tests copy the files git lists; `git ls-files` failed in {ROOT.name}: "
        f"{result.stderr.strip()}")
    return sorted({name for name in result.stdout.split("\0")
                   if name and (ROOT / name).is_file()})


def copy_repository(destination: Path) -> Path:
    """Copy the repository's files (not .venv, _build, node_modules, ...) into ``destination``."""
    for name in repository_files():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return destination
