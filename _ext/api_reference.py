"""The API reference (``api.md``): Sphinx autodoc over ``src/attention_book``, without torch.

``make book`` installs only ``requirements-book.txt`` (no torch, no numpy, no matplotlib): the
modules are imported with those libraries mocked (``autodoc_mock_imports`` in ``_config.yml``),
which is all autodoc needs to read signatures and docstrings. This extension puts ``src/`` on
the import path and checks that the reference is complete: every public module of the package
(not the classroom tools, which are for instructors, the exercise checkers or the shared
argument checks) is documented
by an ``automodule`` in ``api.md`` (in an ``eval-rst`` block: autodoc writes
reStructuredText), or covered by its package's; a module missing is a build
warning (an error under ``-W``), so a new module cannot be forgotten.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import re
import sys
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
API_DOC = "api"
# Not in the reference: the instructor's tools (documented in the instructor guide), the
# checkers of the exercises, the argument checks every function shares (checks.py: their
# messages are what a reader meets), and the modules private to the package (_name.py).
LEFT_OUT = ("attention_book.classroom", "attention_book.exercises", "attention_book.checks")

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


def _same_object_each_time(getattr_):
    """Autodoc's mocks make a new object on every attribute access, so ``torch.float32`` is
    never equal to itself, and a module that looks a dtype up in a dict at import time
    (``TOLERANCES[torch.float32]``, diagnose/) fails to import. Keep the first one."""

    def __getattr__(self, name):
        value = getattr_(self, name)
        if not name.startswith("__"):  # Python's own lookups stay as autodoc answers them
            object.__setattr__(self, name, value)
        return value

    return __getattr__


# (the module itself: ``sphinx.ext.autodoc.mock`` is also the name of a function there)
_mock = importlib.import_module("sphinx.ext.autodoc.mock")
_mock._MockObject.__getattr__ = _same_object_each_time(_mock._MockObject.__getattr__)
_mock._MockModule.__getattr__ = _same_object_each_time(_mock._MockModule.__getattr__)


def public_modules() -> list[str]:
    """Every public module of the package, as a dotted name: ``attention_book.attention``, ..."""
    found = []
    package = SRC / "attention_book"
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts) or parts == ("attention_book",):
            continue
        name = ".".join(parts)
        if not name.startswith(LEFT_OUT) and name != "attention_book.__main__":
            found.append(name)
    return found


def documented_modules(text: str) -> set[str]:
    return set(re.findall(r"^\.\. automodule::\s+(\S+)", text, flags=re.MULTILINE))


def _check_complete(app: Sphinx, env) -> None:
    path = Path(app.srcdir) / f"{API_DOC}.md"
    documented = documented_modules(path.read_text(encoding="utf-8"))
    for module in public_modules():
        # A subpackage's reference (its __all__) covers its modules.
        if not any(module == doc or module.startswith(doc + ".") for doc in documented):
            logger.warning(f"{API_DOC}.md documents no module {module}: add an automodule for it",
                           location=API_DOC)


@functools.cache
def _attribute_names(cls: type) -> frozenset[str]:
    """The fields of a (data)class and the attributes its methods name (``self.memory = ...``)."""
    names = set(getattr(cls, "__annotations__", {}))
    for value in vars(cls).values():
        code = getattr(getattr(value, "fget", value), "__code__", None)
        if code is not None:
            names |= set(code.co_names)
    return frozenset(names)


def _instance_attribute(cls: type, name: str) -> bool:
    return name in _attribute_names(cls)


def _exists(dotted: str) -> bool:
    """Whether ``attention_book.x.y`` names a real module, class, function, constant or field."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        value = module
        for part in parts[cut:]:
            if isinstance(value, type) and _instance_attribute(value, part):
                return True
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True
    return False


@functools.cache
def _submodule_names() -> frozenset[str]:
    """The last part of every module's name (``registry``, ``context``): how docstrings inside a
    package name their neighbours."""
    return frozenset(name.rsplit(".", 1)[-1] for name in public_modules())


_DOCUMENTED: dict[str, object] = {}


def _documented(env) -> dict[str, tuple[str, str]]:
    """{dotted name: (page, anchor)} of every documented Python object and module; read once
    the pages are read (references are resolved only after that)."""
    domain = env.get_domain("py")
    key = (id(env), len(domain.objects), len(domain.modules))
    if _DOCUMENTED.get("key") != key:
        documented = {name: (entry.docname, entry.node_id) for name, entry in domain.objects.items()}
        documented.update({name: (entry.docname, entry.node_id)
                           for name, entry in domain.modules.items()})
        _DOCUMENTED.clear()
        _DOCUMENTED.update(key=key, value=documented)
    return _DOCUMENTED["value"]


def _resolve_alias(app: Sphinx, env, node, contnode):
    """Resolve the package's own names as its docstrings write them.

    The docstrings name things as a reader imports them (``attention_book.softmax``,
    ``KVCache``, ``registry.Check``) or as they read inside their module (``CHECKS``); the
    reference documents each where it is defined (``attention_book.attention.softmax``), and
    constants, type aliases and fields inside their module's or class's text. So a Python
    reference that Sphinx cannot find goes, in this order, to

    1. the one documented object whose dotted name ends with the same names;
    2. for a name under ``attention_book``, its nearest documented parent (a module of a
       documented package: ``attention_book.distributed.traffic``);
    3. the documented class or module of the docstring that names it, when the name really
       is there (a constant, a type alias, a field, a submodule).

    Anything else (a misspelt name) stays unresolved, and nitpicky mode reports it.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    first = target.split(".")[0]
    if hasattr(builtins, target) or (
            "." in target and first != "attention_book" and first not in _submodule_names()):
        return None  # Python's or another library's name (int, torch.Tensor): not ours
    from sphinx.util.nodes import make_refnode

    documented = _documented(env)
    tail = target.removeprefix("attention_book.")
    found = [name for name in documented
             if name.startswith("attention_book.") and name.endswith("." + tail)]
    if len(found) != 1:
        found = []
        parts = target.split(".")
        if target.startswith("attention_book.") and _exists(target):
            while parts and ".".join(parts) not in documented:
                parts.pop()
            found = [".".join(parts)] if parts else []
        if not found:
            context = [node.get("py:module") or ""]
            if node.get("py:class"):
                context.insert(0, f"{context[0]}.{node['py:class']}")
            found = [place for place in context
                     if place in documented and _exists(f"{place}.{target}")][:1]
    if not found:
        return None
    docname, anchor = documented[found[0]]
    return make_refnode(app.builder, node["refdoc"], docname, anchor, contnode, found[0])


_INLINE_LITERAL_THEN_LETTER = re.compile(r"(``[^`]+``)(?=\w)")
_SECTION = re.compile(r"^\s*(Returns|Yields):\s*$")


def _prepare_docstring(app, what, name, obj, options, lines) -> None:
    """Two habits of the package's docstrings that reStructuredText and napoleon misread.

    * ``nn.Module``s: an inline literal followed by a letter is not a literal in
      reStructuredText; an escaped space (``\\ ``, which prints nothing) ends it.
    * "Returns:" sections (and the summaries of properties and constants) are prose, and
      their first line often has a colon ("``(output, weights)``: output ..."), which napoleon
      would take for "type: description" and turn into a type; the package gives its types in
      the signatures, so that line gets an empty type (a leading ": ").
    """
    for index, line in enumerate(lines):
        lines[index] = _INLINE_LITERAL_THEN_LETTER.sub(r"\1\\ ", line)
    starts = []
    if what in ("attribute", "property", "data") and lines:
        starts.append(0)
    starts += [index + 1 for index, line in enumerate(lines) if _SECTION.match(line)]
    for start in starts:
        index = start
        while index < len(lines) and not lines[index].strip():
            index += 1
        if index < len(lines) and ":" in lines[index]:
            indent = len(lines[index]) - len(lines[index].lstrip())
            lines[index] = lines[index][:indent] + ": " + lines[index][indent:]


_WORD_SPAN = re.compile(r'<span class="pre">([^<]*)</span>')


def _plain_literals(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """On the API page, inline code without a ``<span class="pre">`` around each word.

    Sphinx wraps every word of inline code in a span (to keep it on one line; custom.css lets
    it wrap anyway). The reference has 8,000 of them, a third of its elements, and everything
    that walks the page pays for them (an accessibility scan took a minute)."""
    if pagename == API_DOC and "body" in context:
        context["body"] = _WORD_SPAN.sub(r"\1", context["body"])


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", _plain_literals)
    app.connect("env-check-consistency", _check_complete)
    # Before napoleon's own handler (priority 500), which reads the sections.
    app.connect("autodoc-process-docstring", _prepare_docstring, priority=400)
    app.connect("missing-reference", _resolve_alias)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
