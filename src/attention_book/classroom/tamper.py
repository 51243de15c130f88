"""The tamper scan: code in a submission that could switch a graded check off.

nbgrader restores every locked cell (the check cells, hidden tests included) before it runs
a submission, but it runs every *student-editable* cell as the student wrote it: the answer
cells and any cell without locked nbgrader metadata (a scratch cell). Code there can rebind a
checker, patch ``attention_book.exercises._feedback``, ``torch.testing`` or ``builtins``, and
a check that trusts those names passes. The book's hidden tests do not trust them (they bind
only ``_``-prefixed names and use plain ``assert``), and this scan is the second line: it
reads, without running anything, every student-editable cell of a submission and reports
each line that

- (re)binds a checker name (anything ``attention_book.exercises`` exports, or ``check_*``);
- assigns or deletes an attribute or item on an imported module or object, or on ``torch``,
  ``attention_book``, ``builtins`` or ``sys`` (``torch.testing.assert_close = ...``);
- uses ``setattr``, ``delattr``, ``exec``, ``eval``, ``compile``, ``__import__``,
  ``breakpoint``, ``__builtins__``, ``sys.modules``, ``importlib`` (or imports ``builtins``,
  ``ctypes``, ``gc``, ``subprocess``, ``os``, ``shutil``, ``unittest.mock``), writes through
  ``globals()`` or ``vars()``, reaches for a function's or module's internals
  (``__dict__``, ``__code__``, ``__globals__``, …), opens a file for writing, or holds an
  IPython magic or shell command (``%…``, ``!…``);
- takes the answer from the package instead of writing it: an answer name bound to an
  imported object (``stable_softmax = torch.softmax``), a reference to one of
  ``attention_book.bug_zoo``'s healthy specimens (``healthy_attention``,
  ``HealthyCausalAttention``, …) in an answer, a class built on a healthy specimen that
  does not write its own ``forward``, or a class whose ``forward`` is borrowed from an
  imported one.

A line of a scratch cell that the student version itself holds (the chapter's own set-up
code, e.g. the Colab install cell that reads ``sys.modules``) is not reported.

:func:`scan_notebook` returns the findings and the exercises they *taint*: an exercise is
tainted by a flagged answer cell of its own, and by every flagged student-editable cell
above its check cell (a scratch cell, or the answer cell of an earlier exercise: a patch
there runs before the check too). ``python -m attention_book.classroom autograde`` sets the
autograded score of a tainted exercise to 0 after nbgrader has run, with a comment naming
the line, and the instructor can override that score in the formgrader.

The scan is a tripwire, not a sandbox: code can always hide from a static reading. The
hidden tests are what make a grade trustworthy; the scan makes the obvious attempts cost
the points and shows them to the instructor.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = ["Finding", "ScanReport", "exercise_of", "scan_notebook", "scan_source"]

# Modules whose attributes a submission never assigns, whether or not the cell imports them.
PROTECTED_ROOTS = frozenset({"torch", "attention_book", "builtins", "sys", "__builtins__"})
# Calls that can run or rebind code by name.
FORBIDDEN_CALLS = {
    "setattr": "setattr() can replace a checker or a library function",
    "delattr": "delattr() can remove a checker or a library function",
    "exec": "exec() runs code the scan cannot read",
    "eval": "eval() runs code the scan cannot read",
    "compile": "compile() builds code the scan cannot read",
    "__import__": "__import__() imports modules behind the scan's back",
    "breakpoint": "breakpoint() stops the autograder",
    "get_ipython": "runs an IPython magic or shell command (%…, !…), code the scan cannot read",
}
FORBIDDEN_NAMES = {
    "__builtins__": "__builtins__ gives access to every built-in function",
}
# Imports a submission has no use for: each can change the interpreter or the files.
FORBIDDEN_IMPORTS = {
    "builtins": "imports builtins, which can replace print, isinstance, …",
    "importlib": "imports importlib, which can reload or replace modules",
    "ctypes": "imports ctypes, which can change memory directly",
    "gc": "imports gc, which can reach every object",
    "subprocess": "imports subprocess, which runs shell commands",
    "os": "imports os, which can run commands and change files",
    "shutil": "imports shutil, which can change files",
    "unittest.mock": "imports unittest.mock, which patches functions",
    "mock": "imports mock, which patches functions",
}
# Attributes that reach into functions, classes and modules.
DUNDER_ATTRIBUTES = frozenset({
    "__dict__", "__setattr__", "__delattr__", "__code__", "__globals__", "__builtins__",
    "__closure__", "__defaults__", "__kwdefaults__", "__subclasses__", "__import__",
    "__loader__", "__spec__", "__getattribute__", "__bases__", "__mro__", "__base__",
})
_WRITE_METHODS = frozenset({
    "update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__",
})
_READ_METHODS = frozenset({"get", "keys", "items", "values", "copy", "__contains__"})
_GRADE_ID = re.compile(r"^(?P<exercise>ch\d{2}-ex\d+)-")


@dataclass(frozen=True)
class Finding:
    """One suspicious line of a student-editable cell.

    Args:
        cell: index of the cell in the submitted notebook.
        exercise: grade id of the answer cell, or ``None`` for a scratch cell.
        line: 1-based line number inside the cell.
        code: the line, stripped.
        reason: what the line does, in words.
    """

    cell: int
    exercise: str | None
    line: int
    code: str
    reason: str

    def describe(self) -> str:
        """One line for a log or a gradebook comment.

        Returns:
            E.g. ``"answer cell ch02-ex2-answer, line 3: `check_attend = ...` rebinds ..."``.
        """
        where = (f"answer cell {self.exercise}" if self.exercise
                 else f"scratch cell {self.cell}")
        return f"{where}, line {self.line}: `{self.code}` {self.reason}"


@dataclass
class ScanReport:
    """Everything the scan found in one submitted notebook.

    Args:
        findings: every flagged line, in notebook order.
        tainted: each tainted exercise (``chNN-exK``) mapped to the findings that taint it.
        edited_locked: grade ids of locked cells whose text differs from the student version
            (nbgrader restores them before grading; listed so an instructor sees real edits).
        missing_locked: grade ids of locked cells the student deleted (nbgrader adds them back
            when ``OverwriteCells.add_missing_cells`` is on, which the book's config does).
    """

    findings: list[Finding] = field(default_factory=list)
    tainted: dict[str, list[Finding]] = field(default_factory=dict)
    edited_locked: list[str] = field(default_factory=list)
    missing_locked: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when no line was flagged."""
        return not self.findings


def exercise_of(grade_id: str) -> str:
    """Return the exercise a grade id belongs to: ``"ch02-ex3-check"`` -> ``"ch02-ex3"``.

    Args:
        grade_id: an nbgrader grade id; ids outside the book's ``chNN-exK-…`` scheme are
            their own exercise.

    Returns:
        The exercise key.
    """
    if not isinstance(grade_id, str):
        raise TypeError(f"grade_id must be a str, got {type(grade_id).__name__}")
    match = _GRADE_ID.match(grade_id)
    return match["exercise"] if match else grade_id


# --------------------------------------------------------------------------- names


@lru_cache(maxsize=1)
def checker_names() -> frozenset[str]:
    """Every name a check cell imports from ``attention_book.exercises``."""
    from .. import exercises

    exported = getattr(exercises, "__all__", None)
    if exported is None:
        exported = [name for name in dir(exercises) if not name.startswith("_")]
    return frozenset(exported)


@lru_cache(maxsize=1)
def healthy_specimens() -> frozenset[str]:
    """The names of ``attention_book.bug_zoo``'s healthy implementations."""
    from .. import bug_zoo

    return frozenset(name for name in bug_zoo.__all__ if name.lower().startswith("healthy"))


def _is_checker(name: str, checkers: frozenset[str]) -> bool:
    return name in checkers or name.startswith("check_")


def _root(node: ast.AST) -> str | None:
    """The name an attribute/subscript/call chain starts from (``torch`` in ``torch.a.b``)."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _chain(node: ast.AST) -> str:
    """``a.b.c`` for an attribute chain (best effort, for messages)."""
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - a message only
        return "?"


def _import_bindings(tree: ast.AST) -> Iterator[tuple[str, str, ast.AST]]:
    """Yield (bound name, full module or object path, node) for each import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                yield bound, alias.name if alias.asname else alias.name.split(".")[0], node
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                yield alias.asname or alias.name, f"{module}.{alias.name}", node


# --------------------------------------------------------------------------- one cell


class _CellScanner(ast.NodeVisitor):
    """Collect (line, reason) for one parsed cell."""

    def __init__(self, *, checkers, imported, healthy, answer_names, is_answer):
        self.checkers = checkers
        self.imported = imported  # names bound by imports or aliases anywhere in the notebook
        self.healthy = healthy
        self.answer_names = answer_names
        self.is_answer = is_answer
        self.hits: list[tuple[int, str]] = []
        self._parents: dict[ast.AST, ast.AST] = {}

    def scan(self, tree: ast.AST) -> list[tuple[int, str]]:
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self._parents[child] = parent
        self.visit(tree)
        return self.hits

    def flag(self, node: ast.AST, reason: str) -> None:
        self.hits.append((getattr(node, "lineno", 1), reason))

    # ----- bindings

    def _check_target(self, target: ast.AST, node: ast.AST, verb: str) -> None:
        if isinstance(target, ast.Name):
            if _is_checker(target.id, self.checkers):
                self.flag(node, f"{verb} the checker name {target.id}")
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._check_target(element, node, verb)
        elif isinstance(target, ast.Starred):
            self._check_target(target.value, node, verb)
        elif isinstance(target, ast.Attribute | ast.Subscript):
            root = _root(target)
            if root in self.imported or root in PROTECTED_ROOTS:
                kind = "an attribute" if isinstance(target, ast.Attribute) else "an item"
                self.flag(node, f"{verb} {kind} of {root} ({_chain(target)}), which the "
                                "checks rely on")
            elif _root(target) is None and self._is_namespace_call(target):
                self.flag(node, f"{verb} a name through globals() or vars()")

    @staticmethod
    def _is_namespace_call(target: ast.AST) -> bool:
        value = getattr(target, "value", None)
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in {"globals", "vars", "locals"})

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node, "rebinds")
            self._check_answer_binding(target, node.value, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node, "rebinds")
        if node.value is not None:
            self._check_answer_binding(node.target, node.value, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node, "changes")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target, node, "deletes")
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._check_target(node.target, node, "rebinds")
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._check_target(node.target, node, "rebinds")
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._check_target(node.target, node.target, "rebinds")
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._check_target(node.optional_vars, node.context_expr, "rebinds")
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name and _is_checker(node.name, self.checkers):
            self.flag(node, f"rebinds the checker name {node.name}")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            if _is_checker(name, self.checkers):
                self.flag(node, f"declares the checker name {name} global to rebind it")

    visit_Nonlocal = visit_Global

    def _visit_definition(self, node) -> None:
        if _is_checker(node.name, self.checkers):
            self.flag(node, f"defines its own {node.name}, hiding the checker")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_definition(node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_definition(node)
        healthy_bases = [base for base in node.bases if self._healthy_name(base)]
        if healthy_bases:
            writes_forward = any(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                                 and item.name == "forward" for item in node.body)
            if not writes_forward:
                self.flag(node, f"builds {node.name} on the healthy "
                                f"{self._healthy_name(healthy_bases[0])} without writing its "
                                "own forward: the answer is the package's code")
        for item in node.body:
            if (isinstance(item, ast.Assign) and isinstance(item.value, ast.Name | ast.Attribute)
                    and any(isinstance(t, ast.Name) and t.id in {"forward", "__call__"}
                            for t in item.targets)
                    and (_root(item.value) in self.imported or self._healthy_name(item.value))):
                self.flag(item, f"borrows {_chain(item.value)} as {node.name}'s forward: the "
                                "answer is existing code")
        # Bases are checked here; the other parts of the class as usual.
        for item in node.body + node.decorator_list + node.keywords:
            self.visit(item)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_import(alias.name, node)
            bound = alias.asname or alias.name.split(".")[0]
            if _is_checker(bound, self.checkers):
                self.flag(node, f"rebinds the checker name {bound} with an import")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_import(module, node)
        for alias in node.names:
            self._check_import(f"{module}.{alias.name}", node)
            bound = alias.asname or alias.name
            if alias.name == "*":
                if "bug_zoo" in module:
                    self.flag(node, "imports everything from bug_zoo, healthy specimens included")
                continue
            legit = (module.startswith("attention_book.exercises") and bound == alias.name)
            if _is_checker(bound, self.checkers) and not legit:
                self.flag(node, f"rebinds the checker name {bound} with an import")
            if self.is_answer and alias.name in self.healthy:
                self.flag(node, f"imports the healthy specimen {alias.name}: the answer is "
                                "the package's code")

    def _check_import(self, name: str, node: ast.AST) -> None:
        for forbidden, reason in FORBIDDEN_IMPORTS.items():
            if name == forbidden or name.startswith(forbidden + "."):
                self.flag(node, reason)
                return

    # ----- uses

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.flag(node, FORBIDDEN_NAMES[node.id])
        elif node.id in {"globals", "vars", "locals"}:
            self._check_namespace_use(node)
        elif node.id in FORBIDDEN_CALLS and isinstance(node.ctx, ast.Load):
            parent = self._parents.get(node)
            called = isinstance(parent, ast.Call) and parent.func is node
            self.flag(node, FORBIDDEN_CALLS[node.id] if called
                      else f"passes {node.id} around: " + FORBIDDEN_CALLS[node.id])
        elif (self.is_answer and node.id in self.healthy and isinstance(node.ctx, ast.Load)
              and not self._is_class_base(node)):
            self.flag(node, f"uses the healthy specimen {node.id}: the answer is the "
                            "package's code")

    def _check_namespace_use(self, node: ast.Name) -> None:
        """``globals()``/``vars()``: reading one name is fine, writing or passing it is not."""
        call = self._parents.get(node)
        if not (isinstance(call, ast.Call) and call.func is node):
            self.flag(node, f"passes {node.id} around, which can rebind any name")
            return
        use = self._parents.get(call)
        if isinstance(use, ast.Subscript) and use.value is call:
            if isinstance(use.ctx, ast.Load):
                return
            self.flag(node, f"writes a name through {node.id}()")
        elif isinstance(use, ast.Attribute) and use.value is call:
            if use.attr in _READ_METHODS:
                return
            reason = ("writes names through" if use.attr in _WRITE_METHODS
                      else "reaches into")
            self.flag(node, f"{reason} {node.id}()")
        elif isinstance(use, ast.Compare):
            return
        elif isinstance(use, ast.comprehension | ast.For) and use.iter is call:
            return  # iterating over the names reads them
        else:
            self.flag(node, f"hands {node.id}() to other code, which can rebind any name")

    def _is_class_base(self, node: ast.AST) -> bool:
        parent, child = self._parents.get(node), node
        while isinstance(parent, ast.Attribute):
            parent, child = self._parents.get(parent), parent
        return isinstance(parent, ast.ClassDef) and child in parent.bases

    def _healthy_name(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.healthy:
            return node.id
        if isinstance(node, ast.Attribute) and node.attr in self.healthy:
            return node.attr
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in DUNDER_ATTRIBUTES:
            self.flag(node, f"reaches into {node.attr}, which can replace code behind a name")
        elif node.attr == "__class__" and isinstance(node.ctx, ast.Store):
            self.flag(node, "changes an object's __class__")
        elif node.attr == "modules" and _root(node) == "sys":
            self.flag(node, "uses sys.modules, which can swap a module for another")
        elif (self.is_answer and node.attr in self.healthy
              and not self._is_class_base(node)):
            self.flag(node, f"uses the healthy specimen {node.attr}: the answer is the "
                            "package's code")
        if self.is_answer and node.attr == "forward" and self._super_or_healthy(node.value):
            self.flag(node, "calls the healthy specimen's forward: the answer is the "
                            "package's code")
        self.generic_visit(node)

    def _super_or_healthy(self, node: ast.AST) -> bool:
        if self._healthy_name(node):
            return True
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "super"):
            return False
        parent = self._parents.get(node)
        while parent is not None and not isinstance(parent, ast.ClassDef):
            parent = self._parents.get(parent)
        return parent is not None and any(self._healthy_name(base) for base in parent.bases)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            if self.is_answer and name in self.healthy:
                self.flag(node, f"fetches the healthy specimen {name}: the answer is the "
                                "package's code")
            elif name in DUNDER_ATTRIBUTES:
                self.flag(node, f"reaches into {name}, which can replace code behind a name")
        if isinstance(func, ast.Name) and func.id == "open" and self._writes_file(node):
            self.flag(node, "opens a file for writing (the package's checkers are files too)")
        if (isinstance(func, ast.Attribute) and func.attr in {"write_text", "write_bytes",
                                                              "unlink", "rename", "replace"}
                and _root(func) is not None and _root(func) not in {"self"}):
            if _root(func) in self.imported:
                self.flag(node, f"changes files with {func.attr}()")
        self.generic_visit(node)

    @staticmethod
    def _writes_file(node: ast.Call) -> bool:
        mode = node.args[1] if len(node.args) >= 2 else next(
            (kw.value for kw in node.keywords if kw.arg == "mode"), None)
        if mode is None:
            return False
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            return any(flag in mode.value for flag in "wax+")
        return True  # a computed mode: assume the worst

    def _check_answer_binding(self, target: ast.AST, value: ast.AST, node: ast.AST) -> None:
        """``stable_softmax = torch.softmax``: the asked-for name bound to existing code."""
        if not (isinstance(target, ast.Name) and target.id in self.answer_names):
            return
        if isinstance(value, ast.Name | ast.Attribute):
            root = _root(value)
            if root in self.imported or root in PROTECTED_ROOTS or self._healthy_name(value):
                self.flag(node, f"binds the answer {target.id} to {_chain(value)}, existing "
                                "code, instead of writing it")


# --------------------------------------------------------------------------- notebook


def _python_source(source: str) -> tuple[str, list[int]]:
    """Turn a cell's IPython syntax into Python.

    IPython turns ``%magic`` and ``!command`` lines into ``get_ipython()`` calls, which the
    scan then flags. Without IPython, such lines are commented out and returned as flagged.
    """
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython: comment the magic lines out, keep the numbering
        lines = source.splitlines()
        magic_lines = [number for number, line in enumerate(lines, start=1)
                       if line.lstrip().startswith(("%", "!"))]
        for number in magic_lines:
            lines[number - 1] = "#" + lines[number - 1]
        return "\n".join(lines), magic_lines
    try:
        return _transformer(TransformerManager).transform_cell(source), []
    except Exception:  # noqa: BLE001 - let ast.parse report the syntax error
        return source, []


@lru_cache(maxsize=1)
def _transformer(factory):
    return factory()


def _parse(source: str) -> tuple[ast.AST | None, list[int]]:
    python, magic_lines = _python_source(source)
    try:
        return ast.parse(python), magic_lines
    except SyntaxError:
        try:
            return ast.parse(source), magic_lines
        except SyntaxError:
            return None, magic_lines  # a cell that cannot run cannot tamper either


def scan_source(source: str, *, is_answer: bool = False, imported: Iterable[str] = (),
                answer_names: Iterable[str] = ()) -> list[tuple[int, str]]:
    """Scan one cell's source; return ``(line, reason)`` for every flagged line.

    Args:
        source: the cell's text (IPython syntax allowed).
        is_answer: whether it is an answer cell (the healthy-specimen rules apply there).
        imported: names that imports bind elsewhere in the notebook (``torch``, ``F``, …).
        answer_names: the names the exercises ask for (``stable_softmax``, …).

    Returns:
        The flagged lines, sorted by line number; a cell with a syntax error gives none
        (it cannot run, so it cannot tamper).
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    tree, magic_lines = _parse(source)
    hits = [(number, "holds an IPython magic or shell command, which runs code the scan "
                     "cannot read") for number in magic_lines]
    if tree is not None:
        names = _aliases([tree], set(imported) | set(PROTECTED_ROOTS)
                         | {bound for bound, _, _ in _import_bindings(tree)})
        scanner = _CellScanner(checkers=checker_names(), imported=names,
                               healthy=healthy_specimens(), answer_names=set(answer_names),
                               is_answer=is_answer)
        hits += scanner.scan(tree)
    return sorted(set(hits))


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def _aliases(trees: Iterable[ast.AST], roots: set[str]) -> set[str]:
    """Names assigned from a chain rooted at ``roots`` (``t = torch.testing``), to a fixpoint."""
    trees = [tree for tree in trees if tree is not None]
    names = set(roots)
    while True:
        added = set()
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                    value = node.value
                    targets = (node.targets if isinstance(node, ast.Assign)
                               else [node.target])
                    if value is None:
                        continue
                    root = _root(value)
                    if isinstance(value, ast.Call) and not (
                            isinstance(value.func, ast.Name) and value.func.id == "getattr"):
                        continue  # the result of a call is a new object, not an alias
                    if root in names:
                        added |= {target.id for target in targets
                                  if isinstance(target, ast.Name)} - names
        if not added:
            return names
        names |= added


def _answer_names(notebook) -> set[str]:
    """Top-level names the answer cells of ``notebook`` define (def, class or assignment)."""
    names = set()
    for cell in notebook.cells:
        meta = _nbgrader(cell)
        if cell.cell_type != "code" or not meta.get("solution"):
            continue
        tree, _ = _parse(cell.source)
        for node in getattr(tree, "body", []):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _baseline_lines(release) -> set[tuple[str, str]]:
    """(line text, reason) pairs the student version's own unlocked cells already produce."""
    imported = _all_imports(release)
    baseline = set()
    for cell in release.cells:
        if cell.cell_type != "code" or _nbgrader(cell).get("solution"):
            continue
        lines = cell.source.splitlines()
        for number, reason in scan_source(cell.source, imported=imported):
            text = lines[number - 1].strip() if number <= len(lines) else ""
            baseline.add((text, reason))
    return baseline


def _all_imports(notebook) -> set[str]:
    trees = [_parse(cell.source)[0] for cell in notebook.cells if cell.cell_type == "code"]
    roots = {bound for tree in trees if tree is not None
             for bound, _, _ in _import_bindings(tree)}
    return _aliases(trees, roots | set(PROTECTED_ROOTS))


def scan_notebook(submitted, release, source=None) -> ScanReport:
    """Scan every student-editable cell of a submitted notebook.

    Args:
        submitted: the student's notebook (``nbformat``), as handed in.
        release: the student version it was made from (``release/<a>/<a>.ipynb``): it says
            which cells are locked, and its own set-up lines are not reported.
        source: the instructor version, if at hand (names the answer functions of an old
            chapter whose student version lacks the ``def`` line).

    Returns:
        A :class:`ScanReport`.
    """
    for name, notebook in (("submitted", submitted), ("release", release)):
        if not hasattr(notebook, "cells"):
            raise TypeError(f"{name} must be an nbformat notebook, got "
                            f"{type(notebook).__name__}")
    locked = {_nbgrader(cell).get("grade_id"): cell for cell in release.cells
              if _nbgrader(cell).get("locked") and _nbgrader(cell).get("grade_id")}
    answers = {_nbgrader(cell).get("grade_id") for cell in release.cells
               if _nbgrader(cell).get("solution") and cell.cell_type == "code"}
    answer_names = _answer_names(release) | (_answer_names(source) if source else set())
    imported = _all_imports(submitted) | _all_imports(release)
    baseline = _baseline_lines(release)

    report = ScanReport()
    seen_locked = set()
    for index, cell in enumerate(submitted.cells):
        if cell.cell_type != "code":
            continue
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        if grade_id in locked and grade_id not in seen_locked:
            # nbgrader puts the locked text back before it runs anything: not scanned.
            seen_locked.add(grade_id)
            if cell.source.strip() != locked[grade_id].source.strip():
                report.edited_locked.append(grade_id)
            continue
        is_answer = grade_id in answers and bool(meta.get("solution"))
        lines = cell.source.splitlines()
        for number, reason in scan_source(cell.source, is_answer=is_answer,
                                          imported=imported, answer_names=answer_names):
            text = lines[number - 1].strip() if number <= len(lines) else ""
            if not is_answer and (text, reason) in baseline:
                continue
            report.findings.append(Finding(index, grade_id if is_answer else None, number,
                                           text, reason))
    report.missing_locked = [grade_id for grade_id in locked if grade_id not in seen_locked]
    report.tainted = _taint(submitted, release, report.findings)
    return report


def _taint(submitted, release, findings: list[Finding]) -> dict[str, list[Finding]]:
    """Which exercise each finding taints (see the module docstring)."""
    checks: dict[str, float] = {}  # exercise -> position of its first check cell
    answer_at: dict[str, int] = {}
    for index, cell in enumerate(submitted.cells):
        meta = _nbgrader(cell)
        grade_id = meta.get("grade_id")
        if not grade_id:
            continue
        if meta.get("solution"):
            answer_at.setdefault(exercise_of(grade_id), index)
        elif meta.get("grade") and cell.cell_type == "code":
            checks.setdefault(exercise_of(grade_id), index)
    for cell in release.cells:  # a deleted check cell comes back right after its answer
        meta = _nbgrader(cell)
        if meta.get("grade") and not meta.get("solution") and cell.cell_type == "code":
            exercise = exercise_of(meta["grade_id"])
            if exercise not in checks:
                checks[exercise] = answer_at.get(exercise, len(submitted.cells)) + 0.5
    tainted: dict[str, list[Finding]] = {}
    for finding in findings:
        own = exercise_of(finding.exercise) if finding.exercise else None
        for exercise, position in checks.items():
            if exercise == own or finding.cell < position:
                tainted.setdefault(exercise, []).append(finding)
    return {exercise: tainted[exercise] for exercise in sorted(tainted)}
