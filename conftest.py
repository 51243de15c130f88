"""Pin the numeric environment for everything pytest runs, before torch is imported.

The chapters' stored outputs are compared bit for bit by nbval, and the last bits of a
float depend on the CPU code path (PyTorch's AVX2 or AVX-512 kernels, MKL's branch, the
thread count). This file applies ``tools/numerics/pinned.env`` to this process and, through
the environment, to every kernel that nbval and nbgrader start. ``BOOK_NUMERICS=alternate``
selects ``tools/numerics/alternate.env`` instead: ``tests/test_code_paths.py`` uses it to
re-run the book under a deliberately different code path.

It lives at the top of the repository so that it also applies to ``pytest chapters/...``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "book_numerics", Path(__file__).resolve().parent / "tools" / "numerics" / "environment.py"
)
book_numerics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(book_numerics)

os.environ.update(book_numerics.numeric_environment(os.environ.get("BOOK_NUMERICS", "pinned")))
