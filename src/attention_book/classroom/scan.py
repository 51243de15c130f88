"""What the grader reads in an answer's source before the answer runs: the rules a graded answer keeps.

The grading process (:mod:`.clean`) has every answer as source. It reads it here, in its own
process, where nothing the student wrote runs, for two kinds of finding; each is a flag of the
exercise (0 points, the reason in the comment):

- :func:`forbidden_findings`: a function the exercise forbids (the prompt's
  ``metadata.exercise.forbidden``) named in the source, directly, through an alias of its
  module, imported under another name, or as a tensor method; and imports of the
  grader's own modules (the checkers, the classroom).
- :func:`reflection_findings`: the ways Python code reaches objects without naming them,
  which an answer to an exercise never needs: ``eval``, ``exec``, ``compile``,
  ``__import__``, ``globals()``, ``vars()``, ``getattr``/``setattr``/``delattr`` with a computed
  or private name (a name drawn from a literal list of names, ``for name in ("W_key",
  "W_value")``, is not computed), dunder attributes (``__closure__``, ``__globals__``, ``__dict__``,
  ``__subclasses__``, ...) but a few harmless ones, private attributes of anything but
  ``self``/``cls``, frames and code objects (``f_back``, ``gi_frame``, ``cell_contents``,
  ...), and modules made for introspection or native code (``sys``, ``gc``, ``inspect``,
  ``ctypes``, ``importlib``, ``builtins``, ``torch.ops``, ...). Without them an answer can
  only reach what it names, so the first rule holds however the answer is written, and
  the graded process's own machinery (the tripwires that explain a forbidden call, the audit
  hook that explains and reports a refused file) is out of its reach.

Both run on the source alone (after IPython's magics are turned into Python), before the
answer's process is asked to define anything.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) lists the rules.
"""

from __future__ import annotations

import ast
import sys

__all__ = ["ALLOWED_DUNDERS", "REFLECTIVE_MODULES", "forbidden_findings", "namespace_of",
           "reflection_findings", "resolve_loaded"]

#: Dunder attributes an answer may use: what classes and operators of ordinary code need.
ALLOWED_DUNDERS = frozenset({
    "__init__", "__call__", "__name__", "__class__", "__doc__", "__len__", "__iter__",
    "__next__", "__getitem__", "__setitem__", "__contains__", "__enter__", "__exit__",
    "__repr__", "__str__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "__hash__", "__add__", "__sub__", "__mul__", "__matmul__", "__truediv__", "__neg__",
    "__post_init__", "__version__"})
#: Modules (by any dotted part) that reach objects without naming them, or native code.
REFLECTIVE_MODULES = frozenset({
    "sys", "gc", "inspect", "ctypes", "ctypeslib", "types", "builtins", "importlib", "imp",
    "marshal", "pickle", "dill", "cloudpickle", "copyreg", "code", "codeop", "runpy", "pkgutil",
    "zipimport", "dis", "traceback", "linecache", "threading", "multiprocessing", "subprocess",
    "signal", "mmap", "socket", "pdb", "bdb", "faulthandler", "tracemalloc", "site",
    "atexit", "dbm", "sqlite3", "shelve", "cpp_extension", "ops", "library", "overrides",
    "_python_dispatch"})
#: Names that evaluate code or hand out namespaces.
_REFLECTIVE_CALLS = frozenset({"eval", "exec", "compile", "__import__", "globals", "locals",
                               "vars", "breakpoint", "attrgetter", "methodcaller"})
#: Attributes of frames, code objects, generators, tracebacks and closure cells.
_FRAME_ATTRIBUTES = frozenset({
    "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "f_trace", "gi_frame",
    "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
    "tb_frame", "tb_next", "cell_contents", "co_consts", "co_code", "co_names"})
_NAME_CALLS = frozenset({"getattr", "setattr", "delattr"})
_OWN = ("self", "cls")


def resolve_loaded(dotted: str, *, importing: bool = False):
    """The object a dotted name names, looked up in modules already imported.

    Args:
        dotted: e.g. ``torch.nn.functional.softmax``.
        importing: import a module that is not loaded yet (in an answer's own process; the
            grader imports nothing a student's source names).

    Returns:
        The object, or ``None``.
    """
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        value = sys.modules.get(".".join(parts[:cut]))
        if value is None and importing:
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except Exception:  # noqa: BLE001 - not a module: try a shorter prefix
                value = None
        if value is None:
            continue
        for part in parts[cut:]:
            value = getattr(value, part, None)
            if value is None:
                return None
        return value
    return None


def namespace_of(preamble: str) -> dict:
    """The names an answer starts with: the chapter's imports and definitions, run here.

    Only modules already imported are bound (the grader imported the chapter's imports
    before any student code of the run); a definition that fails to run is left out.

    Args:
        preamble: the chapter code the answer gets (:func:`.clean.preamble_for`): the
            instructor's, never the student's.

    Returns:
        ``{name: object}``.
    """
    namespace: dict = {"__name__": "__scan__"}
    try:
        tree = ast.parse(preamble)
    except SyntaxError:
        return namespace
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if isinstance(node, ast.Import):
                    bound = alias.asname or alias.name.split(".")[0]
                    value = resolve_loaded(alias.name if alias.asname else bound)
                else:
                    bound = alias.asname or alias.name
                    value = resolve_loaded(f"{node.module}.{alias.name}")
                if value is not None:
                    namespace[bound] = value
            continue
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), "<chapter>", "exec"),  # noqa: S102
                 namespace)
        except Exception:  # noqa: BLE001 - the chapter's definition; not the answer's
            pass
    return namespace


def _chain(node: ast.AST) -> list[str] | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        return names[::-1]
    return None


def forbidden_findings(answer: str, namespace: dict, forbidden: dict[int, str],
                       blocked: tuple[str, ...]) -> list[str]:
    """Forbidden functions the source names, and imports of the grader's modules.

    Args:
        answer: the answer cell(s), as Python source.
        namespace: the names the answer starts with (:func:`namespace_of`).
        forbidden: ``{id(object): dotted name}`` of what the exercise forbids.
        blocked: module prefixes an answer may not import.

    Returns:
        Findings, each a phrase ("uses torch.softmax"), each once.
    """
    try:
        tree = ast.parse(answer)
    except SyntaxError:
        return []
    findings: list[str] = []
    method_names = {name.rsplit(".", 1)[-1]: name for name in forbidden.values()
                    if name.split(".")[-2:-1] == ["Tensor"]}
    local_modules: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local_modules[alias.asname or alias.name.split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
                if alias.name.startswith(blocked):
                    findings.append(f"imports {alias.name}, which a graded answer may not use")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(blocked):
                findings.append(f"imports from {node.module}, which a graded answer may not use")
            for alias in node.names:
                value = resolve_loaded(f"{node.module}.{alias.name}")
                if value is not None and id(value) in forbidden:
                    findings.append(f"imports {forbidden[id(value)]}")
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain:
                root = local_modules.get(chain[0])
                value = None
                if root is not None:
                    value = resolve_loaded(".".join([root, *chain[1:]]))
                elif chain[0] in namespace:
                    value = namespace[chain[0]]
                    for part in chain[1:]:
                        value = getattr(value, part, None)
                if value is not None and id(value) in forbidden:
                    findings.append(f"uses {forbidden[id(value)]}")
                    continue
            if (node.attr in method_names and isinstance(node.ctx, ast.Load)
                    and not (chain and len(chain) == 2 and chain[0] in local_modules)):
                findings.append(f"uses .{node.attr}(), that is {method_names[node.attr]}")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            value = namespace.get(node.id)
            if value is not None and id(value) in forbidden:
                findings.append(f"uses {forbidden[id(value)]}")
    return list(dict.fromkeys(findings))


def _private(name: str) -> bool:
    return name.startswith("_") and name not in ALLOWED_DUNDERS


def _constant_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _string_literal(node: ast.AST) -> list[str] | None:
    """The strings of a literal tuple, list or set of strings (``None``: not one)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        values = [_constant_name(element) for element in node.elts]
        return values if all(value is not None for value in values) else None
    return None


def _constant_names(tree: ast.AST) -> dict[str, set[str]]:
    """Names whose every binding gives a known string: ``for name in ("a", "b")``,
    ``for name, w in zip(("a", "b"), ws)``, ``name = "a"``; with the strings they take."""
    known: dict[str, set[str]] = {}
    unknown: set[str] = set()

    def bind(target: ast.AST, values: list[str] | None) -> None:
        if isinstance(target, ast.Name):
            if values is None:
                unknown.add(target.id)
            else:
                known.setdefault(target.id, set()).update(values)
        else:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    unknown.add(name.id)

    def loop(target: ast.AST, iterable: ast.AST) -> None:
        strings = _string_literal(iterable)
        if strings is not None:
            bind(target, strings)
        elif (isinstance(target, ast.Tuple) and isinstance(iterable, ast.Call)
              and isinstance(iterable.func, ast.Name) and iterable.func.id == "zip"
              and len(iterable.args) == len(target.elts) and not iterable.keywords):
            for element, argument in zip(target.elts, iterable.args, strict=True):
                bind(element, _string_literal(argument))
        else:
            bind(target, None)

    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            loop(node.target, node.iter)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                name = _constant_name(node.value)
                bind(target, [name] if name is not None else None)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            bind(node.target, None)
        elif isinstance(node, ast.arg):
            unknown.add(node.arg)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, None)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            unknown.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                unknown.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            unknown.add(node.name)
    return {name: values for name, values in known.items() if name not in unknown}


def reflection_findings(answer: str) -> list[str]:
    """The ways the source reaches objects without naming them (see the module docstring).

    Args:
        answer: the answer cell(s), as Python source.

    Returns:
        Findings, each a phrase ("uses __closure__"), each once.
    """
    try:
        tree = ast.parse(answer)
    except SyntaxError:
        return []
    findings: list[str] = []
    constants = _constant_names(tree)
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}

    def module_finding(name: str) -> None:
        parts = name.split(".")
        hit = next((part for part in parts if part in REFLECTIVE_MODULES or
                    (part.startswith("_") and part not in ALLOWED_DUNDERS)), None)
        if hit is not None:
            findings.append(f"imports {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module_finding(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module_finding(node.module or "")
            for alias in node.names:
                if alias.name in REFLECTIVE_MODULES or alias.name in _REFLECTIVE_CALLS \
                        or _private(alias.name):
                    findings.append(f"imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Name):
            if node.id in _REFLECTIVE_CALLS or (node.id.startswith("__")
                                                 and node.id not in ALLOWED_DUNDERS):
                findings.append(f"uses {node.id}")
            elif node.id in _NAME_CALLS and id(node) not in called:  # map(getattr, …)
                findings.append(f"passes {node.id} on, to call with names it computes")
        elif isinstance(node, ast.Attribute):
            base = node.value
            own = isinstance(base, ast.Name) and base.id in _OWN or (
                isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
                and base.func.id == "super")
            if node.attr.startswith("__") and node.attr not in ALLOWED_DUNDERS:
                findings.append(f"uses {node.attr}")
            elif node.attr.startswith("_") and not own and node.attr not in ALLOWED_DUNDERS:
                findings.append(f"uses the private attribute {node.attr}")
            elif node.attr in _FRAME_ATTRIBUTES or node.attr in ("attrgetter", "methodcaller"):
                findings.append(f"uses {node.attr}")
            elif node.attr in REFLECTIVE_MODULES and not own:
                findings.append(f"uses {node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _NAME_CALLS:
            argument = node.args[1] if len(node.args) > 1 else None
            names = [_constant_name(argument)] if _constant_name(argument) is not None else (
                sorted(constants[argument.id]) if isinstance(argument, ast.Name)
                and argument.id in constants else None)
            if names is None:
                findings.append(f"calls {node.func.id} with a computed name")
            for name in names or ():
                if name.startswith("_") and name not in ALLOWED_DUNDERS:
                    findings.append(f"calls {node.func.id} with the private name {name}")
    return list(dict.fromkeys(findings))
