#!/usr/bin/env python3
"""Which tests and chapters use a module of the package: what to run after changing it.

usage: .venv/bin/python tools/which_tests.py src/attention_book/positions.py [MODULE ...]
       .venv/bin/python tools/which_tests.py --all     (every module of the package)

For a module it prints

* the test files that import it or one of its names (its focused tests), and
* the chapters that use it, directly (``ab.alibi_bias``, ``from attention_book.positions
  import ...``) or through another module of the package that imports it (chapter 13's
  ``mods.alibi`` calls ``positions.alibi_bias``), since a change can break those too.

It reads the sources (no kernel; about 20 seconds, most of it importing torch), so it cannot
see which branch of a function a chapter takes: "reach it through other modules" means the
chapter calls package code that refers to the module. Then run, e.g.:

    .venv/bin/python -m pytest -p no:xdist -q tests/test_positions.py
    .venv/bin/python -m pytest -p no:xdist -q chapters/12_positions_in_attention.ipynb
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "attention_book"


def module_name(path: Path) -> str:
    """``src/attention_book/diagnose/core.py`` -> ``attention_book.diagnose.core``."""
    relative = path.resolve().relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> list[str]:
    """Every module of the package, by dotted name."""
    return sorted(module_name(path) for path in PACKAGE.rglob("*.py")
                  if path.name != "__main__.py" and "__pycache__" not in path.parts)


def _owner(module: str, name: str) -> tuple[str, str | None]:
    """Where ``module.name`` is defined: ``(package module, name there)``; the name is None
    for a whole module (``from attention_book import mods``)."""
    candidate = f"{module}.{name}"
    if candidate in _MODULES:
        return candidate, None
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return module, name
    if isinstance(value, type(sys)):
        return (value.__name__, None) if value.__name__ in _MODULES else (module, name)
    owner = getattr(value, "__module__", None)
    if owner in _MODULES:
        return owner, getattr(value, "__name__", name)
    return module, name


def _base(node: ast.ImportFrom, package_module: str | None) -> str:
    base = node.module or ""
    if node.level and package_module:  # a relative import inside the package
        parts = package_module.split(".")
        keep = len(parts) - node.level + (1 if _is_package(package_module) else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    return base


def _bindings(tree: ast.AST, package_module: str | None) -> dict[str, tuple[str, str | None]]:
    """Local name -> what it refers to in the package: (module, name) or (module, None)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attention_book" and alias.name in _MODULES:
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else "attention_book", None)
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package_module)
            if base.split(".")[0] == "attention_book":
                for alias in node.names:
                    bound[alias.asname or alias.name] = _owner(base, alias.name)
    return bound


def _references(tree: ast.AST, bound: dict) -> set[tuple[str, str | None]]:
    """The package names (and whole modules) a piece of code refers to."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                node.value.id in bound and bound[node.value.id][1] is None):
            found.add(_owner(bound[node.value.id][0], node.attr))
        elif isinstance(node, ast.Name) and node.id in bound and bound[node.id][1] is not None:
            found.add(bound[node.id])  # a module bound to a name counts through its attributes
    return found


def _parse(source: str) -> ast.AST | None:
    source = "\n".join(line for line in source.splitlines()
                       if not line.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def used_names(*sources: str) -> set[tuple[str, str | None]]:
    """The package names (module, name) that code refers to: a test file, or a notebook's
    cells in order (a name imported in one cell is used in the next)."""
    bound, found = {}, set()
    for source in sources:
        tree = _parse(source)
        if tree is not None:
            bound.update(_bindings(tree, None))
            found |= _references(tree, bound)
    return found


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").is_file()


def _module_path(module: str) -> Path:
    base = PACKAGE.parent / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def name_graph() -> dict[tuple[str, str | None], set[tuple[str, str | None]]]:
    """(module, name) -> the package names its definition refers to; (module, None) -> all of
    the module's top-level definitions (using a module may mean any of them)."""
    graph: dict[tuple[str, str | None], set[tuple[str, str | None]]] = {}
    for module in _MODULES:
        tree = ast.parse(_module_path(module).read_text(encoding="utf-8"))
        bound = _bindings(tree, module)
        local = {node.name for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        bound.update({name: (module, name) for name in local})
        graph[(module, None)] = {(module, name) for name in local}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                graph[(module, node.name)] = _references(node, bound) - {(module, node.name)}
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):  # module constants: their values
                for target in ast.walk(node):
                    if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                        graph[(module, target.id)] = _references(node, bound)
    return graph


def _whole_module_imports(module: str) -> set[str]:
    """The modules that ``module`` imports whole at its top level (``from . import checks_masks``):
    importing it runs them (e.g. they register the checks of ``diagnose``)."""
    tree = ast.parse(_module_path(module).read_text(encoding="utf-8"))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = _base(node, module)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in _MODULES}
    return found


def reached_modules(names: set, graph: dict) -> set[str]:
    """The modules whose code the given names can run: the names, and what they refer to."""
    seen, todo = set(names), list(names)
    while todo:
        for reference in graph.get(todo.pop(), ()):
            if reference not in seen:
                seen.add(reference)
                todo.append(reference)
    modules, todo = {module for module, _ in seen}, [module for module, _ in seen]
    while todo:
        for imported in _whole_module_imports(todo.pop()) - modules:
            if imported != "attention_book":
                modules.add(imported)
                todo.append(imported)
    return modules


def users(modules: list[str]) -> dict[str, tuple[list[str], list[str], list[str]]]:
    """Module -> (test files that import it, chapters that call it, chapters that reach it
    only through other modules of the package)."""
    tests = {f"tests/{path.name}": {m for m, _ in used_names(path.read_text(encoding="utf-8"))}
             for path in sorted((ROOT / "tests").glob("test_*.py"))}
    graph = name_graph()
    chapters = {}
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        names = used_names(*("".join(cell["source"]) for cell in cells
                             if cell["cell_type"] == "code"))
        chapters[f"chapters/{path.name}"] = ({m for m, _ in names}, reached_modules(names, graph))
    return {module: ([name for name, used in tests.items()
                      if module in used or any(m.startswith(module + ".") for m in used)],
                     [name for name, (direct, _) in chapters.items() if module in direct],
                     [name for name, (direct, reached) in chapters.items()
                      if module in reached - direct])
            for module in modules}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module files or dotted names")
    parser.add_argument("--all", action="store_true", help="every module of the package")
    options = parser.parse_args(argv)
    if not options.modules and not options.all:
        parser.error("name a module file, or --all")
    modules = [m for m in _MODULES if m != "attention_book"] if options.all else [
        module_name(Path(m)) if m.endswith(".py") else m for m in options.modules]
    unknown = [m for m in modules if m not in _MODULES]
    if unknown:
        parser.error(f"not a module of the package: {unknown}")
    def numbers(chapters: list[str]) -> str:
        return " ".join(re.match(r"chapters/(\d+)", name).group(1) for name in chapters) or "-"

    for module, (tests, direct, indirect) in users(modules).items():
        print(f"{module}\n  tests:                      {' '.join(tests) or '-'}\n"
              f"  chapters that call it:      {numbers(direct)}\n"
              f"  chapters that reach it through other modules: {numbers(indirect)}")
    return 0


sys.path.insert(0, str(PACKAGE.parent))
_MODULES = all_modules()

if __name__ == "__main__":
    raise SystemExit(main())
