#!/usr/bin/env python3
"""Execute notebooks in place with a fresh kernel and store them normalised (``make execute``).

For each notebook: a new kernel runs every cell in order (restart and run all, so the
execution counts go 1..n), in the notebook's folder, and stops at the first error, as
``jupyter execute --inplace`` does; then the outputs are stored in the canonical form of
``tools/normalize_notebooks.py``. Two things differ from ``jupyter execute``, so that
re-running an unchanged chapter leaves ``git diff`` empty and prints nothing alarming:

* no timing is recorded (``record_timing=False``: no ``metadata.execution`` timestamps);
* the kernel talks to this process over local Unix sockets (ZeroMQ's ``ipc`` transport), not
  TCP. Over TCP without CurveZMQ keys, ipykernel warns at start-up that "all communication
  ... is sent in plain text"; Unix sockets never leave the machine and are guarded by file
  permissions, so the warning's cause is gone rather than its message filtered.

Run it in the pinned numeric environment, as ``make execute`` does:
``tools/with_numerics pinned .venv/bin/python tools/execute_notebook.py chapters/05_masks.ipynb``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from normalize_notebooks import normalize  # noqa: E402 - this folder, added just above


def execute(path: Path, kernel_name: str = "python3") -> None:
    """Run ``path`` top to bottom with a fresh kernel and write it back, normalised."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="kernel-") as sockets:
        # The sockets' path prefix must be absolute: the kernel runs in the notebook's folder.
        config = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets, "ipc"))}})
        client = NotebookClient(notebook, timeout=None, kernel_name=kernel_name,
                                record_timing=False, config=config,
                                resources={"metadata": {"path": str(path.parent.resolve())}})
        client.execute()
    nbformat.write(normalize(notebook), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    options = parser.parse_args(argv)
    for path in options.notebooks:
        print(f"executing {path}", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
