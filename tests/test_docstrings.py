"""Every public name of the package documents itself the way the book promises.

A docstring has a one-line summary, Args (when there are arguments), Shapes (for the tensor
code), Returns, and names the chapter that teaches it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import attention_book

TENSOR_MODULES = {"attention", "modules", "flash", "kv_cache", "positions", "latent", "mods", "model"}


def _public_objects():
    for info in pkgutil.iter_modules(attention_book.__path__):
        # benchmark, classroom and figure_check are tools for maintainers and instructors, not
        # taught code.
        # A package (diagnose, exercises) is checked through the names its __init__ exports.
        if info.name.startswith("_") or info.name in ("benchmark", "classroom", "figure_check"):
            continue
        module = importlib.import_module(f"attention_book.{info.name}")
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield pytest.param(info.name, obj, id=f"{info.name}.{name}")


@pytest.mark.parametrize(("module", "obj"), list(_public_objects()))
def test_public_docstring(module, obj):
    doc = inspect.getdoc(obj) or ""
    lines = doc.splitlines()
    assert lines and lines[0].strip(), f"{obj.__qualname__}: no one-line summary"
    if inspect.isclass(obj) and issubclass(obj, Exception):
        return  # an exception needs only its summary line
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
    except (TypeError, ValueError):
        params = []
    if params and target is not object.__init__:
        assert "Args:" in doc or inspect.isclass(obj) and "Attributes:" in doc, (
            f"{obj.__qualname__}: document the arguments under 'Args:'"
        )
    if not inspect.isclass(obj):
        assert "Returns" in doc, f"{obj.__qualname__}: say what it returns under 'Returns:'"
    if module in TENSOR_MODULES:
        assert "Shapes:" in doc, f"{obj.__qualname__}: give the tensor shapes under 'Shapes:'"
    assert "Taught in chapter" in doc, f"{obj.__qualname__}: name the chapter ('Taught in chapter N')"


def test_top_level_names_exist():
    for name in attention_book.__all__:
        assert hasattr(attention_book, name), name
