"""Shared fixtures: the repository paths and one build of the book per test session."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class BookBuild:
    returncode: int
    log: str
    html_dir: Path


@pytest.fixture(scope="session")
def built_book() -> BookBuild:
    """Build the website once (`jupyter-book build . -W -n --keep-going`) into `_build/`."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return BookBuild(result.returncode, result.stdout + result.stderr, ROOT / "_build" / "html")
