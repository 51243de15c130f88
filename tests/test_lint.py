"""ruff, with the bugbear rules, over the package and the tests."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "src", "tests"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, f"ruff found problems:\n{result.stdout}{result.stderr}"


def test_ruff_selects_bugbear():
    """A comparison that is not asserted is a defect: B015 must stay switched on."""
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--stdin-filename", "tests/test_probe.py", "-"],
        cwd=ROOT, capture_output=True, text=True, input="def test_probe():\n    1 == 2\n",
    )
    assert "B015" in result.stdout, result.stdout
