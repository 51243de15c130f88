"""Every dependency of the package and of its extras has the lowest version it needs.

A hosted runtime (Colab, Kaggle) keeps a library it already has when the install cell asks for
``attention-book[book]``, unless pyproject.toml names a lowest version; an old one then fails
far into a chapter, at an import. So each dependency has a floor, and
``tests/dependency_floors.py`` says where each floor comes from. These tests are the cheap half
of the check (a second, in the test command): pyproject.toml's floors are the table's; every
third-party module that the package and the chapters import belongs to a declared dependency;
every import of a fast-moving API (a ``transformers.models`` family, ``torch.nn.attention``)
is in the table with the release that brought it, at or under the floor; the pinned versions
reach the floors. The expensive half, ``tools/check_floors.py``, installs every floor into a
fresh environment and runs the package's tests and every chapter there (about 15 minutes: run
it after changing a floor or a fast-moving import, as its docstring says).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import tomllib
from dependency_floors import FEATURES, FLOORS, NOT_DEPENDENCIES

ROOT = Path(__file__).resolve().parents[1]
FAST_MOVING = ("transformers.models.", "torch.nn.attention")


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _version(text: str) -> tuple[int, ...]:
    parts = tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0]))
    return parts + (0,) * (3 - len(parts))


@cache
def declared() -> dict[tuple[str, str], str]:
    """{(distribution, "core" or extra): floor} as pyproject.toml writes them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"core": project["dependencies"], **project.get("optional-dependencies", {})}
    found = {}
    for group, requirements in groups.items():
        for requirement in requirements:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)", requirement.strip())
            assert match, (f"pyproject.toml's {group} dependency {requirement!r} has no floor: "
                           "write name>=version (tests/dependency_floors.py says why each)")
            found[(_name(match.group(1)), group)] = match.group(2)
    return found


def floor_of(distribution: str) -> str:
    """The highest floor any group gives a distribution: what a full install gets at least."""
    floors = [floor for (name, _), floor in declared().items() if name == _name(distribution)]
    return max(floors, key=_version)


# An import statement on a line of its own, at any indentation, with a parenthesised list of
# names over several lines.
_IMPORT = re.compile(r"^[ \t]*((?:from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*))"
                     r"|(?:import[ \t]+[^\n]*))", re.MULTILINE)


def _code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return ["\n".join(line for line in "".join(cell["source"]).splitlines()
                      if not line.lstrip().startswith(("%", "!")))
            for cell in cells if cell["cell_type"] == "code"]


@cache
def imports() -> dict[str, set[str]]:
    """Every import of the package (not its classroom tools) and the chapters:
    {"module" or "module:name": {where}}."""
    package = ROOT / "src" / "attention_book"
    sources = [(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
               for path in sorted(package.rglob("*.py"))
               if not path.is_relative_to(package / "classroom")]  # requirements.txt's tools
    for notebook in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        sources += [(notebook.name, code) for code in _code_cells(notebook)]
    found: dict[str, set[str]] = {}
    for where, code in sources:
        # Only the import statements are parsed (parsing whole files took seconds).
        statements = "\n".join(match.group(1) for match in _IMPORT.finditer(code))
        for node in ast.walk(ast.parse(statements)):
            if isinstance(node, ast.Import):
                keys = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                keys = [node.module] + [f"{node.module}:{alias.name}" for alias in node.names]
            else:
                continue
            for key in keys:
                found.setdefault(key, set()).add(where)
    return found


def test_pyproject_floors_are_the_tables():
    table = {(_name(name), group): floor for name, group, floor, _ in FLOORS}
    assert declared() == table, (
        "pyproject.toml's floors and tests/dependency_floors.py's FLOORS differ: "
        f"only in pyproject.toml {sorted(set(declared().items()) - set(table.items()))}, "
        f"only in the table {sorted(set(table.items()) - set(declared().items()))}")


def test_every_imported_library_is_a_dependency_with_a_floor():
    """A third-party module the package or a chapter imports comes from a declared dependency
    (or is one of NOT_DEPENDENCIES: the notebook kernel's own libraries)."""
    provided = set()  # the top-level modules of the declared distributions, as installed
    for name, _ in declared():
        distribution = importlib.metadata.distribution(name)
        top_level = distribution.read_text("top_level.txt")
        if top_level:
            provided |= set(top_level.split())
        else:
            provided |= {Path(str(file)).parts[0].removesuffix(".py")
                         for file in distribution.files or [] if str(file).endswith(".py")}
    undeclared = {}
    for key, where in imports().items():
        top = key.split(":")[0].split(".")[0]
        if top in sys.stdlib_module_names or top in ("attention_book", "__future__"):
            continue
        if top not in provided and top not in NOT_DEPENDENCIES:
            undeclared[top] = sorted(where)[:3]
    assert undeclared == {}, (
        f"imported but not a dependency of the package or an extra: {undeclared}; add it to "
        "pyproject.toml with a floor and a row in tests/dependency_floors.py (or, for the "
        "kernel's and the classroom's own libraries, to NOT_DEPENDENCIES there)")


def test_fast_moving_imports_are_recorded_with_their_release():
    """Each import of a transformers model family or of torch.nn.attention names the release
    that brought it (FEATURES), and that release is at or under the declared floor."""
    recorded = {row[0]: row for row in FEATURES}
    def covered(key: str) -> bool:  # the name's row, its module's, or (a module) a name's
        return (key in recorded or key.split(":")[0] in recorded
                or any(row.startswith(key + ":") for row in recorded))

    missing = sorted(key for key in imports()
                     if key.split(":")[0].startswith(FAST_MOVING) and not covered(key))
    assert missing == [], (
        f"these imports need a row in FEATURES of tests/dependency_floors.py (the first release "
        f"that has them, checked in its wheel): {missing}")
    unused = sorted(key for key in recorded if key not in imports())
    assert unused == [], f"FEATURES rows that nothing imports any more: {unused}"
    too_new = [f"{key} needs {dist} {release}, the floor is {floor_of(dist)}"
               for key, dist, release, _ in FEATURES if _version(release) > _version(floor_of(dist))]
    assert too_new == [], too_new


def test_pinned_versions_reach_the_floors():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if match:
            pins[_name(match.group(1))] = match.group(2)
    low = [f"{name} {pins[name]} < {floor}" for (name, _), floor in declared().items()
           if name in pins and _version(pins[name]) < _version(floor)]
    assert low == [], f"requirements.txt pins a version under pyproject.toml's floor: {low}"
    unpinned = sorted({name for name, _ in declared()} - set(pins))
    assert unpinned == [], f"dependencies requirements.txt does not pin: {unpinned}"


@pytest.mark.parametrize("release, older", [("5.11.0", "5.10.1"), ("2.9", "2.8.0")])
def test_version_order(release, older):
    assert _version(older) < _version(release) and _version("2.9") == _version("2.9.0")
