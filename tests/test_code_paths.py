"""The stored outputs do not depend on the CPU's code path.

The test command runs every kernel in the pinned numeric environment
(``tools/numerics/pinned.env``, applied by the top-level ``conftest.py``). That makes the
floats bit-identical on every x86-64 CPU with AVX2, but a claim the book prints should not
hang on the last bits of a float at all. So the whole book is executed a second time under
a deliberately different code path (``tools/numerics/alternate.env``: PyTorch's portable
kernels instead of AVX2, MKL's SSE2 branch, one thread instead of two) and compared with the
stored outputs exactly as the main run compares them: strict nbval, same sanitiser.
A chapter that prints float noise, or whose training amplifies rounding differences into a
printed number, fails here even if it passes on the machine that stored it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "book_numerics", ROOT / "tools" / "numerics" / "environment.py"
)
_numerics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_numerics)
numeric_environment = _numerics.numeric_environment

CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def _environment(name: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "BOOK_NUMERICS"}
    env["BOOK_NUMERICS"] = name
    env.update(numeric_environment(name))
    return env


@pytest.mark.parametrize(("name", "capability"), [("pinned", "AVX2"), ("alternate", "DEFAULT")])
def test_the_numeric_environment_reaches_torch(name: str, capability: str) -> None:
    """Each environment really selects the code path it names in a fresh process."""
    probe = (
        "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=_environment(name),
                            capture_output=True, text=True, timeout=120, check=True)
    threads = numeric_environment(name)["OMP_NUM_THREADS"]
    assert result.stdout.split() == [capability, threads]


def test_the_two_environments_differ_where_it_matters() -> None:
    """The alternate path changes every setting the pinned one fixes, or it would prove nothing."""
    pinned, alternate = numeric_environment("pinned"), numeric_environment("alternate")
    assert pinned.keys() == alternate.keys()
    assert all(pinned[key] != alternate[key] for key in pinned)


def test_every_chapter_passes_strict_nbval_under_the_alternate_code_path() -> None:
    """Re-execute every chapter under the alternate code path and compare with the stored outputs.

    The alternate path runs each kernel on one thread, so the chapters are split into two
    halves that run side by side, one per core: the same checks in about half the wall time.
    """
    assert CHAPTERS, "no chapters found"
    shards = [CHAPTERS[0::2], CHAPTERS[1::2]]
    assert sorted(path for shard in shards for path in shard) == CHAPTERS
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
             f"--nbval-sanitize-with={ROOT / 'tests' / 'nbval_sanitize.cfg'}",
             "-p", "no:cacheprovider", "-q", "--no-header", "-rf",
             *[str(path.relative_to(ROOT)) for path in shard]],
            cwd=ROOT, env=_environment("alternate"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        for shard in shards
    ]
    outputs = [run.communicate(timeout=1200)[0] for run in runs]
    for run, output in zip(runs, outputs, strict=True):
        summary = "\n".join(line for line in output.splitlines()
                            if line.startswith(("FAILED", "ERROR")) or " passed" in line
                            or " failed" in line)
        assert run.returncode == 0, (
            "the stored outputs differ under the alternate CPU code path "
            f"(tools/numerics/alternate.env):\n{summary}\n\n{output[-6000:]}"
        )
