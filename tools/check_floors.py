#!/usr/bin/env python3
"""Install every dependency at its floor into a fresh environment and run the tests there.

pyproject.toml gives each dependency of the package and of its extras (``[book]``,
``[kernels]``) a lowest version (``name>=floor``; where they come from:
``tests/dependency_floors.py``). This tool
checks that the floors work: it creates a virtual environment, installs each dependency at
exactly its floor (torch excepted: see below) and the test tools at requirements.txt's pins,
prints what it got, and runs ``FLOOR_TESTS`` (the package's own tests and every chapter under
strict nbval) with that environment's Python and this clone's ``src/`` on the path. Exit
status: pytest's.

torch: PyTorch's CPU index, the only source of older CPU builds, is not reachable from the
book's machines, and PyPI's Linux build of torch is the CUDA one; so torch stays at
requirements.txt's pin unless ``--torch`` names another version that pip can find.

    .venv/bin/python tools/check_floors.py                 # about 15 minutes on 2 cores
    .venv/bin/python tools/check_floors.py --keep /tmp/floors -- chapters/19_*.ipynb

Arguments after ``--`` replace FLOOR_TESTS. ``--keep DIR`` builds the environment in DIR and
keeps it (a second run with the same DIR reuses it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# The test tools FLOOR_TESTS need, at requirements.txt's pins.
TEST_TOOLS = ("pytest", "nbval", "hypothesis", "ipykernel", "nbformat", "nbclient")


def _floors_table():
    spec = importlib.util.spec_from_file_location("dependency_floors",
                                                  ROOT / "tests" / "dependency_floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared_floors(extras: tuple[str, ...] | None = None) -> dict[str, str]:
    """{distribution: floor} from pyproject.toml's dependencies and its extras (all of them by
    default); where a distribution appears twice (torch in the core and in [book]) the higher
    floor wins."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in optional if extras is None else extras:
        requirements += optional[extra]
    floors: dict[str, str] = {}
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", requirement.strip())
        if not match:
            raise SystemExit(f"pyproject.toml: {requirement!r} has no floor (name>=version)")
        name, floor = match.group(1).lower().replace("_", "-"), match.group(2)
        if name not in floors or _key(floor) > _key(floors[name]):
            floors[name] = floor
    return floors


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def pins(path: Path = ROOT / "requirements.txt") -> dict[str, str]:
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            found[match.group(1).lower().replace("_", "-")] = match.group(2)
    return found


def run(command: list[str], **kwargs) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="build the environment here and keep it")
    parser.add_argument("--torch", help="the torch version to install (default: requirements.txt's)")
    parser.add_argument("--python", default=sys.executable, help="the Python to build it with")
    parser.add_argument("tests", nargs="*", help="what to run instead of FLOOR_TESTS")
    options = parser.parse_args(argv)

    floors = declared_floors()
    pinned = pins()
    torch = options.torch or pinned["torch"]
    wanted = {name: floor for name, floor in floors.items() if name != "torch"}
    folder = options.keep or Path(tempfile.mkdtemp(prefix="abk-floors-"))
    python = folder / "bin" / "python"
    try:
        if not python.exists():
            run([options.python, "-m", "venv", str(folder)])
        # In a kept environment too: pip leaves what is already at its version alone.
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        run(pip + [f"torch=={torch}"])
        run(pip + [f"{name}=={floor}" for name, floor in sorted(wanted.items())]
            + [f"{tool}=={pinned[tool]}" for tool in TEST_TOOLS])
        freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True,
                                capture_output=True, text=True).stdout
        got = {}
        for line in freeze.splitlines():
            name, _, version = line.partition("==")
            got[name.lower().replace("_", "-")] = version
        print("\nInstalled (dependency: floor -> installed):")
        wrong = []
        for name, floor in sorted(floors.items()):
            want = torch if name == "torch" else floor
            have = got.get(name, "missing")
            print(f"  {name}: {floor} -> {have}")
            if have == "missing" or _key(have.split("+")[0]) + (0,) * (3 - len(_key(have))) != (
                    _key(want) + (0,) * (3 - len(_key(want)))):
                wrong.append(f"{name} {have} (wanted {want})")
        if wrong:
            print("not at the floor: " + ", ".join(wrong), file=sys.stderr)
            return 2
        check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
        print("pip check:", check.stdout.strip() or check.stderr.strip())
        tests = options.tests or _floors_table().FLOOR_TESTS
        expanded = []
        for pattern in tests:
            matches = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
            expanded += matches or [pattern]
        print(f"\nRunning {len(expanded)} test files and notebooks with every dependency at its floor",
              flush=True)
        # The package from this clone's src/ (on the path of pytest and of every kernel it
        # starts), so that a kept environment always tests the current code.
        environment = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        return subprocess.run([str(python), "-m", "pytest", "-p", "no:xdist", "-q",
                               "--durations=10", *expanded], cwd=ROOT, env=environment).returncode
    finally:
        if options.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
