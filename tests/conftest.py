"""Shared fixtures: the repository paths, one build of the book per test session, the device.

``--device cuda`` (what ``make test-gpu`` passes) runs the device-parametrised tests
(``tests/test_devices.py``) with CUDA tensors; the default is the CPU.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"],
                     help="the device for tests/test_devices.py (make test-gpu passes cuda)")


def pytest_configure(config):
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            "--device cuda: no CUDA device is available to PyTorch on this machine "
            f"(torch {torch.__version__}); run make test-gpu on a machine with a GPU")


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """The device the device-parametrised tests run on (``--device``, default cpu)."""
    return torch.device(pytestconfig.getoption("--device"))


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
