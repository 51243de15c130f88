"""Shared fixtures: the repository paths, one build of the book per test session, the device,
and the browser tests' Chromium and local web server (``site``, ``browser``).

``--device cuda`` (what ``make test-gpu`` passes) runs the device-parametrised tests
(``tests/test_devices.py``) with CUDA tensors; the default is the CPU.
"""

from __future__ import annotations

import functools
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from checker_agreement import pytest_runtest_call  # noqa: F401 - a hook: "Correct" is full marks

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


CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]


# --------------------------------------------------------------------------------------
# The browser and the local server.


def chromium_executable() -> str:
    """Debian's chromium (or ``$CHROMIUM``); fails, with the fix, when there is none."""
    candidates = [os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    ci = os.environ.get("CI", "").lower() == "true"
    pytest.fail(
        "no Chromium for the browser tests"
        + (" (CI=true: a missing browser is a failure)" if ci else "")
        + ". Install Debian's package with `tools/ensure_chromium.sh` (as root; `make test` runs "
        "it), or point the CHROMIUM environment variable at a Chromium or Chrome binary.",
        pytrace=False,
    )


@functools.cache
def _gzipped(path: Path, mtime_ns: int) -> bytes:
    return gzip.compress(path.read_bytes(), compresslevel=6, mtime=0)


class _SiteHandler(SimpleHTTPRequestHandler):
    """Serves the built site as a web host does: text files gzip-compressed when asked."""

    COMPRESSIBLE = {".html", ".js", ".css", ".json", ".svg", ".txt", ".ttf", ".eot", ".inv"}

    def send_head(self):
        path = Path(self.translate_path(self.path))
        accepts_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
        if not (accepts_gzip and path.is_file() and path.suffix in self.COMPRESSIBLE):
            return super().send_head()
        body = _gzipped(path, path.stat().st_mtime_ns)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@dataclass
class Site:
    html_dir: Path
    base_url: str
    screenshots: Path


@pytest.fixture(scope="session")
def site(built_book):
    """The built website, served from 127.0.0.1 on a free port."""
    problems = [line for line in built_book.log.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert built_book.returncode == 0, "the book did not build, so no page can be tested:\n" + (
        "\n".join(problems[:20]) or built_book.log[-1500:]
    )
    handler = functools.partial(_SiteHandler, directory=str(built_book.html_dir))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    screenshots = built_book.html_dir.parent / "screenshots"
    shutil.rmtree(screenshots, ignore_errors=True)
    screenshots.mkdir(parents=True)
    yield Site(built_book.html_dir, f"http://127.0.0.1:{server.server_port}/", screenshots)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    executable = chromium_executable()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
