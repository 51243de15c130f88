"""Grade each exercise in a clean process: the answer cell alone, the hidden tests elsewhere.

nbgrader grades by running the whole notebook in the student's own kernel, where anything
the student wrote can reach the checks. The book grades each exercise instead with two
fresh processes that share nothing but a socket (:mod:`.remote`):

- the **answer process** receives only that exercise's answer cell(s), taken from the
  notebook as source, plus the chapter's own imports and the chapter definitions the
  answer names. It runs them inside the sandbox (:mod:`.sandbox`: a private read-only view
  of the Python environment and the package without its checkers, no writes, no new
  processes, memory and time limits) and then only answers calls;
- the **grading process** (trusted) runs the check cell's ``assert check_…(answer)`` line and
  its hidden tests, in which every answer name is a proxy: each call travels to the answer
  process and comes back as a value. Nothing the student wrote runs in it, so a patch, an
  input transformer or a rebound checker in any cell cannot touch a grade, and scratch work
  costs nothing.

An answer that calls a function the exercise forbids (the prompt cell's
``metadata.exercise.forbidden``, dotted names), that imports the checkers, or that tries what
the sandbox refuses (reading the course, writing files, starting processes) scores 0 on that
exercise with the reason, and the grader records a flag.

:func:`grade_submissions` grades the notebooks of a class with one grading process: a
zygote forked from it before it reads the hidden tests forks one answer process per
exercise. ``python -m attention_book.classroom.clean`` is that grading process (it reads a
job as JSON on stdin and writes the results as JSON on stdout).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import integrity, sandbox, scan
from .format import BEGIN_HIDDEN, END_HIDDEN, prompt_match
from .handover import Describer, build, is_public
from .remote import Channel, ChannelClosed, Exports, ProtocolError, Remote, count_seeds, serve_all

__all__ = ["Answer", "CellResult", "Exercise", "ExerciseResult", "GradeCell", "Limits",
           "chapter_setup", "grade_many", "grade_submissions", "read_answers",
           "read_exercises"]

_GRADE_ID = re.compile(r"^(?P<key>ch\d+-ex\d+)-")
_OUTPUT_LIMIT = 20_000  # characters of a checker's printed feedback that are kept
_SCRATCH = "/answer-scratch"  # an answer process's private temporary folder, inside its jail
#: The most bytes an answer's scratch folder may hold (a tmpfs of this size in the jail;
#: watched by the zygote without it).
SCRATCH_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Limits:
    """The limits of one answer process.

    Args:
        seconds: wall-clock time for one exercise (definition, checks and hidden tests).
        cpu_seconds: CPU time of the answer process.
        memory_bytes: address space of the answer process.
    """

    seconds: float = 60.0
    cpu_seconds: int = 120
    memory_bytes: int = 4 * 2**30


@dataclass(frozen=True)
class GradeCell:
    """One graded check cell: its visible checker lines and its hidden tests."""

    grade_id: str
    points: float
    checks: str
    hidden: str


@dataclass(frozen=True)
class Exercise:
    """One autograded exercise of a chapter, read from the instructor notebook.

    Args:
        key: ``chNN-exK``.
        title: the prompt's first line, e.g. ``Exercise 2.1 — Stable softmax (2 points)``.
        answer_ids: grade ids of its answer cells.
        names: the names its answer cells define (the instructor's version).
        grade_cells: its graded check cells.
        forbidden: dotted names the answer may not call (the prompt's metadata).
        kind: the prompt's ``metadata.exercise.kind``; in a ``property-test`` every object
            a check hands to the answer is a subject, lent by a subject process.
    """

    key: str
    title: str
    answer_ids: tuple[str, ...]
    names: tuple[str, ...]
    grade_cells: tuple[GradeCell, ...]
    forbidden: tuple[str, ...] = ()
    kind: str = ""


@dataclass
class Answer:
    """A student's answer to one exercise: the answer cells' source, or why there is none."""

    key: str
    source: str | None = None
    problem: str | None = None


@dataclass
class CellResult:
    """The clean grade of one check cell.

    Args:
        grade_id: the check cell.
        points: its points.
        passed: the checker and the hidden tests passed.
        output: what the checker printed (feedback for the student), shortened.
        detail: what failed, for the instructor (may name a hidden test line).
    """

    grade_id: str
    points: float
    passed: bool = False
    output: str = ""
    detail: str = ""


@dataclass
class ExerciseResult:
    """The clean grade of one exercise.

    Args:
        key: ``chNN-exK``.
        title: the prompt's title.
        cells: one result per check cell.
        cause: why it scored 0, in a sentence for the student (empty when it passed).
        flags: integrity findings (forbidden calls, the checkers imported, sandbox refusals).
        notes: what else the student should know (a statement of the answer cell skipped).
    """

    key: str
    title: str
    cells: list[CellResult] = field(default_factory=list)
    cause: str = ""
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Points earned."""
        return sum(cell.points for cell in self.cells if cell.passed)

    @property
    def points(self) -> float:
        """Points possible."""
        return sum(cell.points for cell in self.cells)


# --------------------------------------------------------------------------- reading


def _source(cell) -> str:
    source = cell.get("source", "") if isinstance(cell, dict) else getattr(cell, "source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _meta(cell) -> dict:
    metadata = cell.get("metadata") if isinstance(cell, dict) else getattr(cell, "metadata", {})
    nbgrader = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return nbgrader if isinstance(nbgrader, dict) else {}


def _split_check(source: str) -> tuple[str, str]:
    lines = source.splitlines()
    begin = next((i for i, line in enumerate(lines) if BEGIN_HIDDEN in line), None)
    end = next((i for i, line in enumerate(lines) if END_HIDDEN in line), None)
    if begin is None or end is None or end < begin:
        return source, ""
    visible = "\n".join(lines[:begin] + lines[end + 1:])
    hidden = textwrap.dedent("\n".join(lines[begin + 1:end]))
    try:
        tree = ast.parse(visible)
    except SyntaxError:
        return "", hidden
    keep = [node for node in tree.body
            if (isinstance(node, ast.ImportFrom) and node.module == "attention_book.exercises")
            or (isinstance(node, ast.Assert) and isinstance(node.test, ast.Call)
                and isinstance(node.test.func, ast.Name)
                and node.test.func.id.startswith("check_"))]
    return "\n".join(ast.unparse(node) for node in keep), hidden


def _defined(source: str) -> tuple[str, ...]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return tuple(dict.fromkeys(names))


def read_exercises(source_notebook) -> list[Exercise]:
    """Every autograded exercise of an instructor notebook, in notebook order.

    Args:
        source_notebook: the chapter (a notebook dict or ``nbformat`` node).

    Returns:
        One :class:`Exercise` per exercise with at least one graded code cell.
    """
    import nbformat

    if isinstance(source_notebook, dict) and not hasattr(source_notebook, "cells"):
        source_notebook = nbformat.reads(json.dumps(source_notebook), as_version=4)
    cells = source_notebook.cells
    answers: dict[str, list[tuple[str, str]]] = {}
    grades: dict[str, list[GradeCell]] = {}
    prompts: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for cell in cells:
        cell_type = cell.get("cell_type") if isinstance(cell, dict) else cell.cell_type
        prompt = prompt_match(cell) if cell_type == "markdown" else None
        if prompt:
            key = f"ch{int(prompt['chapter']):02d}-ex{int(prompt['number'])}"
            metadata = cell.get("metadata", {}) if isinstance(cell, dict) else cell.metadata
            about = metadata.get("exercise", {}) or {}
            forbidden = tuple(str(name) for name in about.get("forbidden", []) or [])
            title = _source(cell).splitlines()[0].lstrip("> ").replace("**", "").strip()
            prompts[key] = (title, forbidden, str(about.get("kind", "") or ""))
        meta = _meta(cell)
        grade_id = str(meta.get("grade_id", ""))
        match = _GRADE_ID.match(grade_id)
        if cell_type != "code" or not match:
            continue
        key = match["key"]
        if meta.get("solution"):
            answers.setdefault(key, []).append((grade_id, _source(cell)))
        elif meta.get("grade"):
            checks, hidden = _split_check(_source(cell))
            grades.setdefault(key, []).append(
                GradeCell(grade_id, float(meta.get("points", 0) or 0), checks, hidden))
    exercises = []
    for key, cells_ in grades.items():
        title, forbidden, kind = prompts.get(key, (key, (), ""))
        names = tuple(dict.fromkeys(
            name for _, source in answers.get(key, []) for name in _defined(source)))
        exercises.append(Exercise(key, title, tuple(g for g, _ in answers.get(key, [])), names,
                                  tuple(cells_), forbidden, kind))
    return exercises


def chapter_setup(source_notebook) -> tuple[str, dict[str, str]]:
    """The chapter's imports, and its top-level definitions by name.

    Only cells without nbgrader metadata count. A definition is a ``def``, a ``class``, or
    an assignment whose value calls nothing (a constant): what an answer may build on.

    Args:
        source_notebook: the instructor notebook.

    Returns:
        ``(imports, definitions)``: the import statements as source, one per line, and
        ``{name: source}`` for every definition.
    """
    cells = source_notebook["cells"] if isinstance(source_notebook, dict) \
        else source_notebook.cells
    imports: list[str] = []
    definitions: dict[str, str] = {}
    for cell in cells:
        cell_type = cell.get("cell_type") if isinstance(cell, dict) else cell.cell_type
        if cell_type != "code" or _meta(cell):
            continue
        try:
            tree = ast.parse(_transform(_source(cell)))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if not _imports_grader_code(node):
                    imports.append(ast.unparse(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                definitions[node.name] = ast.unparse(node)
            elif isinstance(node, ast.Assign) and not any(
                    isinstance(n, ast.Call) for n in ast.walk(node.value)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        definitions[target.id] = ast.unparse(node)
    return "\n".join(dict.fromkeys(imports)), definitions


def _imports_grader_code(node: ast.Import | ast.ImportFrom) -> bool:
    """Whether an import of the chapter's own cells names grader-side code (a checker the
    chapter demonstrates, say): answers never get those imports, which they may not make."""
    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
        [alias.name for alias in node.names]
    return any(name == module or name.startswith(module + ".")
               for name in names for module in sandbox.GRADER_MODULES)


def _free_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else loaded).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    return loaded - bound - set(dir(builtins))


def preamble_for(answer: str, imports: str, definitions: dict[str, str]) -> str:
    """The chapter code an answer gets: the imports, and the definitions it names.

    Args:
        answer: the answer's source.
        imports: the chapter's imports (:func:`chapter_setup`).
        definitions: the chapter's definitions (:func:`chapter_setup`).

    Returns:
        Python source: the imports, then every definition the answer uses, directly or
        through another definition, in chapter order.
    """
    wanted: list[str] = []
    todo = list(_free_names(answer))
    while todo:
        name = todo.pop()
        if name in definitions and name not in wanted:
            wanted.append(name)
            todo += list(_free_names(definitions[name]))
    order = [name for name in definitions if name in wanted]
    return "\n".join([imports, *(definitions[name] for name in order)])


def _transform(source: str) -> str:
    """IPython's syntax (magics, ``!`` lines, ``?``) turned into plain Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython comes with Jupyter
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - leave it for the parser to report
        return source


def read_answers(submission, exercises: list[Exercise]) -> dict[str, Answer]:
    """Each exercise's answer in a submitted notebook, found by its grade id.

    A notebook that cannot be read, an answer cell that is missing, not code, or that
    appears twice (a duplicated grade id) gives an :class:`Answer` with a ``problem``.

    Args:
        submission: a path to the notebook, or the notebook as a dict.
        exercises: from :func:`read_exercises` (the instructor's version).

    Returns:
        ``{exercise key: Answer}``.
    """
    if not isinstance(submission, dict):
        try:
            submission = json.loads(Path(submission).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as error:
            reason = f"the notebook could not be read ({type(error).__name__})"
            return {e.key: Answer(e.key, problem=reason) for e in exercises}
    cells = submission.get("cells") if isinstance(submission, dict) else None
    if not isinstance(cells, list):
        return {e.key: Answer(e.key, problem="the notebook has no cells") for e in exercises}
    found: dict[str, list[dict]] = {}
    for cell in cells:
        if isinstance(cell, dict):
            found.setdefault(str(_meta(cell).get("grade_id", "")), []).append(cell)
    answers = {}
    for exercise in exercises:
        parts, problem = [], None
        for grade_id in exercise.answer_ids:
            matches = found.get(grade_id, [])
            if not matches:
                problem = (f"its answer cell ({grade_id}) is missing: the cell or its "
                           "nbgrader metadata was deleted")
            elif len(matches) > 1:
                problem = (f"{len(matches)} cells carry the answer cell's id {grade_id}; "
                           "keep one answer cell per exercise")
            elif matches[0].get("cell_type") != "code":
                problem = f"the answer cell {grade_id} is not a code cell"
            else:
                parts.append(_transform(_source(matches[0])))
        if not exercise.answer_ids:
            problem = "the exercise has no answer cell in the instructor's version"
        answers[exercise.key] = Answer(exercise.key, None if problem else "\n\n".join(parts),
                                       problem)
    return answers


# --------------------------------------------------------------------------- the answer process


class _Forbidden(Exception):
    """A forbidden function was called from the answer."""


class _Watch:
    """Whose behalf the answer process works on, and the tripwires that ask it.

    A forbidden function is refused whenever the answer is anywhere on the call stack: while
    the process serves a request on one of the answer's own objects (the grader calling the
    answer, a subject calling back into it, the answer cell running), however the function
    was reached (a ``functools.partial``, ``map``, a lambda compiled under another file name,
    ``getattr`` with a computed name, ``eval``); and while it serves the grader on an
    object the grader built (a module handed to the answer), when a frame of the answer's
    code is on the stack. Forbidden PyTorch functions are also refused at the dispatcher, so
    ``torch.ops.aten`` and other aliases of the same operator are refused too.
    """

    def __init__(self, exports, filename: str):
        self.exports = exports
        self.depth = 0  # requests being served on the answer's behalf
        self.files = {filename}  # file names of the answer's code (its compile() calls too)
        self.mode = None  # refuses the forbidden operators at the dispatcher
        self._entered = False

    def enter(self) -> None:
        """Switch the dispatcher's refusals on (while the answer's code runs)."""
        if self.mode is not None and not self._entered:
            self.mode.__enter__()
            self._entered = True

    def leave(self) -> None:
        """Switch them off."""
        if self._entered:
            self._entered = False
            self.mode.__exit__(None, None, None)

    def serving(self, message: dict, entering: bool) -> None:
        """Count the requests served on the answer's behalf (``Channel.on_serve``)."""
        op, target = message.get("op"), message.get("target")
        if op in ("get", "build", "peer", "bye"):
            return
        if op != "define":
            obj = self.exports.objects.get(target) if type(target) is int else None
            if obj is not None and id(obj) in self.exports.grader_built:
                return
        if entering:
            self.depth += 1
            self.enter()
        else:
            self.depth -= 1
            if self.depth == 0:
                self.leave()

    def answer_on_stack(self) -> bool:
        """True while the answer's code runs, or its frame is anywhere on the stack."""
        if self.depth > 0:
            return True
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename in self.files:
                return True
            frame = frame.f_back
        return False

    def compiled(self, event: str, args: tuple) -> None:
        """Remember the file names under which the answer compiles code (an audit hook)."""
        if event == "compile" and self.depth > 0 and len(args) > 1 and isinstance(args[1], str):
            self.files.add(args[1])


def _forbidden_operators(forbidden: dict[int, tuple[str, object]]) -> set[str]:
    """The names of the dispatcher's operators behind the forbidden PyTorch functions."""
    names = set()
    for name, original in forbidden.values():
        module = getattr(original, "__module__", "") or ""
        if name.startswith("torch.") or module.startswith("torch"):
            base = name.rsplit(".", 1)[-1]
            names |= {base, f"_{base}"}
    return names


def _install_tripwires(forbidden: dict[int, tuple[str, object]], namespace: dict,
                       watch: _Watch) -> None:
    """Replace every reference to a forbidden object by one that refuses the answer.

    An explanation, not the boundary: the grader has already read the source for forbidden
    names and for the reflection that could reach one unnamed (:mod:`.scan`); a call that
    gets here fails with a sentence that says why, and the check fails with it.
    """
    def wrap(dotted: str, original):
        def tripwire(*args, **kwargs):
            if watch.answer_on_stack():
                raise _Forbidden(f"{dotted} is not allowed in this exercise")
            return original(*args, **kwargs)

        tripwire.__name__ = getattr(original, "__name__", "forbidden")
        return tripwire

    wrappers = {key: wrap(name, original) for key, (name, original) in forbidden.items()}
    owners = [module.__dict__ for module in list(sys.modules.values())
              if getattr(module, "__dict__", None) is not None]
    import torch

    owners.append(namespace)
    for owner in owners:
        for attribute, value in list(owner.items()):
            if id(value) in wrappers:
                try:
                    owner[attribute] = wrappers[id(value)]
                except TypeError:
                    pass
    for key, (name, _) in forbidden.items():
        if name.split(".")[-2:-1] == ["Tensor"]:
            try:
                setattr(torch.Tensor, name.rsplit(".", 1)[-1], wrappers[key])
            except (AttributeError, TypeError):
                pass
    operators = _forbidden_operators(forbidden)
    if operators:
        from torch.utils._python_dispatch import TorchDispatchMode

        dotted = ", ".join(sorted(name for name, _ in forbidden.values()))

        class _RefuseOperators(TorchDispatchMode):
            # a higher-order operator (FlexAttention) passes through: its own operators
            # run below this mode, and an answer reaches it through the public function
            supports_higher_order_operators = True

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not hasattr(func, "overloadpacket"):
                    return func(*args, **(kwargs or {}))
                if func.overloadpacket.__name__ in operators:
                    raise _Forbidden(f"the operator {func.overloadpacket.__name__} (one of "
                                     f"{dotted}) is not allowed in this exercise")
                return func(*args, **(kwargs or {}))

        watch.mode = _RefuseOperators()


def _run_statements(source: str, filename: str, namespace: dict, notes: list[str],
                    skip_expressions: bool) -> None:
    import linecache

    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as error:
        notes.append(f"is not valid Python (line {error.lineno}: {error.msg})")
        return
    for node in tree.body:
        if skip_expressions and isinstance(node, ast.Expr) and not isinstance(
                node.value, ast.Constant):
            continue
        module = ast.Module(body=[node], type_ignores=[])
        try:
            exec(compile(module, filename, "exec"), namespace)  # noqa: S102 - sandboxed
        except BaseException as error:  # noqa: BLE001 - report it and go on
            if skip_expressions:
                notes.append(f"line {node.lineno} raised {type(error).__name__}: "
                             f"{str(error)[:200]} (skipped)")


def _enter_answer_sandbox(jail_root: str, limits: Limits, required: sandbox.Layers,
                          blocked: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Every layer of the sandbox, entered by an answer process before the answer runs.

    Args:
        jail_root: the empty folder the zygote made for this process.
        limits: its memory and CPU limits.
        required: the layers the run promised (it ends the process if it cannot enter them).
        blocked: the grader's modules it may not import.

    Returns:
        ``(readable roots, writable scratch folders)`` for the audit hook. Ends the process
        (exit status 3) if it cannot enter the layers the run promised.
    """
    roots = [*sandbox.python_roots(), sandbox.package_root()]
    hidden = [os.path.join(sandbox.package_root(), "attention_book", name)
              for name in ("exercises", "classroom")]
    sandbox.block_imports(blocked)
    jailed = False
    if required.namespaces:
        try:
            # a private scratch folder (FlexAttention and torch's compilers want a temporary
            # folder); it vanishes with the process. It is not /tmp, so that a path under the
            # real /tmp (a course folder, say) is refused and reported, not just missing.
            sandbox.enter_jail(jail_root, [*roots, *sandbox.SYSTEM_LIBRARIES], hidden=hidden,
                               scratch=_SCRATCH, scratch_megabytes=SCRATCH_BYTES // 2**20,
                               network=True)
            jailed = True
        except (sandbox.SandboxError, OSError):
            os._exit(3)
    # without the view: the empty folder the zygote made for this answer is its scratch
    scratch = _SCRATCH if jailed else jail_root
    os.chdir(scratch)  # an empty folder: nothing shipped beside the notebook is importable
    keep = {key: os.environ[key] for key in ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS",
                                             "MKL_NUM_THREADS") if key in os.environ}
    os.environ.clear()  # nothing of the grader's environment is the answer's business
    os.environ.update(keep)
    for key in ("TMPDIR", "HOME", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        os.environ[key] = scratch
    # An answer's process starts no thread and no process: TorchInductor (FlexAttention,
    # torch.compile) must compile in the calling thread, never in its pool of workers
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    tempfile.tempdir = scratch
    contained = jailed or required.landlock > 0
    sandbox.limit_resources(memory_bytes=limits.memory_bytes, cpu_seconds=limits.cpu_seconds,
                            file_bytes=64 * 2**20 if contained else 0, open_files=256)
    # one thread: the dispatcher's refusal of forbidden operators holds in this thread only
    entered = sandbox.confine(roots, [scratch], hidden=hidden, network_namespace=jailed,
                              kill=True, threads=False, sockets=False)
    if entered.landlock < required.landlock or (required.seccomp and not entered.seccomp):
        os._exit(3)
    sandbox.keep_readable_path([*roots, *sandbox.SYSTEM_LIBRARIES])
    return roots, [scratch]


def _answer_process(sock: socket.socket, limits: Limits, jail_root: str,
                    required: sandbox.Layers, role: str = "answer", report_fd: int = -1) -> None:
    """The body of an answer process, or of a subject process (never returns).

    An answer process runs one exercise's answer cell and serves the grader's calls on the
    answer's objects. A subject process (``role="subject"``) runs no student code: it builds
    what a check hands over that the answer may use but not see inside (the subjects of a
    property test, a checker's test double) and lends it to the answer through its face
    (:mod:`.remote`); it may use the checkers, loaded before it enters the sandbox.

    What its sandbox refuses is written to ``report_fd``, a pipe that only its grader reads,
    with ``os.write`` taken before any student code runs: a report can only be about the
    process that wrote it, and rebinding a module's functions cannot silence it.
    """
    sandbox.die_with_parent()  # the zygote's end (and so the grader's) ends it
    try:
        os.setsid()
    except OSError:
        pass
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sorted({sock.fileno(), report_fd} - {-1})
    os.closerange(3, keep[0])
    for low, high in zip(keep, [*keep[1:], 65536], strict=True):
        os.closerange(low + 1, high)
    import torch

    torch.set_num_threads(1)
    subject = role == "subject"
    if subject:  # the checkers' test doubles; their files are hidden once in the sandbox
        import attention_book.exercises  # noqa: F401
    blocked = tuple(name for name in sandbox.GRADER_MODULES
                    if not (subject and name == "attention_book.exercises"))
    roots, scratch = _enter_answer_sandbox(jail_root, limits, required, blocked)
    jailed = required.namespaces
    exports = Exports()

    def builder(tag, data, sub, ctx):
        made = build(tag, data, sub, ctx)
        exports.grader_built.add(id(made))
        return made

    channel = Channel(sock, trusted=False, strict=subject, exports=exports, builder=builder)
    channels = [channel]
    watch = _Watch(exports, "<answer>")
    write, budget = os.write, [64 * 1024]

    def report(event: str, detail: str) -> None:
        line = f"{event}\t{detail}"[:400].replace("\n", " ").encode(errors="replace") + b"\n"
        if report_fd >= 0 and budget[0] >= len(line):
            budget[0] -= len(line)
            write(report_fd, line)

    def peer(message: dict):
        """Take the socket to the third process (the subject process, or the answer's)."""
        if channel.peer is not None or not channel.received_fds:
            raise ProtocolError("no socket came with the message")
        other = Channel(socket.socket(fileno=channel.received_fds.pop(0)), trusted=False,
                        strict=subject, exports=exports)
        other.on_serve = channel.on_serve
        channel.peer, other.peer = other, channel
        channels.append(other)
        return None

    def made(message: dict):
        obj = channel.decode(message.get("description"))
        exports.grader_built.add(id(obj))
        return obj

    def define(message: dict) -> dict:
        namespace: dict = {"__name__": "__answer__", "__builtins__": builtins}
        notes: list[str] = []
        _run_statements(str(message.get("preamble", "")), "<chapter setup>", namespace, [],
                        skip_expressions=False)
        forbidden = {}
        for name in message.get("forbidden", []):
            value = scan.resolve_loaded(str(name), importing=True)
            if value is not None:
                forbidden[id(value)] = (str(name), value)
        answer = str(message.get("answer", ""))
        filename = str(message.get("filename", "<answer>"))
        watch.files.add(filename)
        _install_tripwires(forbidden, namespace, watch)
        if "flex_attention" in answer:  # torch.compile traces nothing under a dispatch mode:
            watch.mode = None  # for FlexAttention the Python-level tripwires alone refuse
        watch.enter()  # the answer cell runs on the answer's behalf
        _run_statements(answer, filename, namespace, notes, skip_expressions=True)
        state["namespace"] = namespace
        return {"defined": [name for name in message.get("names", []) if name in namespace],
                "notes": notes, "jailed": jailed}

    state: dict = {"namespace": None}

    def get(message: dict):
        namespace = state["namespace"] or {}
        name = str(message.get("name"))
        if name not in namespace:
            raise NameError(f"name {name!r} is not defined")
        return namespace[name]

    channel.handlers.update({"build": made, "peer": peer})
    if not subject:
        channel.handlers.update({"define": define, "get": get})
        channel.on_serve = watch.serving
        sys.addaudithook(watch.compiled)
    sandbox.install_audit_hook(readable=[*roots, *sandbox.SYSTEM_LIBRARIES], writable=scratch,
                               allow_processes=False, blocked_modules=blocked, report=report)
    try:
        serve_all(channels)
    finally:
        os._exit(0)


# --------------------------------------------------------------------------- the grading process


class _Capped(io.StringIO):
    def write(self, text):  # keep the beginning of a long output
        room = _OUTPUT_LIMIT - self.tell()
        if room > 0:
            super().write(text[:room])
        return len(text)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rstrip() + " …"


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text[:500]


def _hidden_line(error: BaseException, filename: str) -> str:
    import traceback

    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if frame.filename == filename:
            return f"line {frame.lineno}: {(frame.line or '').strip()}"
    return ""


class _Expired(BaseException):
    """The time for an exercise ran out while the grading process computed (SIGALRM).

    A ``BaseException``, so that no checker's ``except Exception`` can swallow it.
    """


def _reset_torch_state() -> None:
    """The grader's own default dtype, grad mode and RNG, set before each check."""
    import torch

    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.manual_seed(0)


@contextlib.contextmanager
def _time_limit(deadline: float | None):
    """Stop what the grading process computes for an answer once ``deadline`` has passed."""
    import threading

    if deadline is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _Expired("the time for this exercise is up")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001) + 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run(code: str, filename: str, proxies: dict,
         deadline: float | None = None) -> tuple[bool, str, BaseException | None]:
    import linecache

    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    namespace = {"__name__": "__grading__", "__builtins__": builtins, **proxies}
    output = _Capped()
    _reset_torch_state()
    try:
        with _time_limit(deadline), contextlib.redirect_stdout(output), \
                contextlib.redirect_stderr(io.StringIO()):
            exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the instructor's
    except BaseException as error:  # noqa: BLE001 - every failure is a result
        if isinstance(error, KeyboardInterrupt):
            raise
        return False, output.getvalue(), error
    finally:
        _reset_torch_state()
    return True, output.getvalue(), None


class _Handover:
    """What the grading process hands to one answer, and where each object is built.

    Nothing of the grading process is lent (:mod:`.remote`). An object a check passes to the
    answer is described (:mod:`.handover`); a description that names only public code is
    built in the answer's process, which then holds a real object of the book; any other (a
    checker's private test double, code of a hidden test), and every object of a
    ``property-test`` exercise, is built in a subject process that lends it to the answer
    through its face. :meth:`explicit` (``attention_book.exercises.hand_over``) builds one
    copy and returns a proxy, so a check can read what the answer did to it.
    """

    def __init__(self, channel: Channel, spawn, subjects: bool):
        self.channel = channel
        self.spawn = spawn
        self.subjects = subjects
        self.worker: _Worker | None = None
        self.subject_channel: Channel | None = None

    def _subject(self) -> Channel:
        if self.subject_channel is None:
            if self.spawn is None:
                raise TypeError("this check hands over an object that only a subject process "
                                "can build, and there is none here")
            self.worker = self.spawn()
            chan = Channel(self.worker.sock, trusted=True, deadline=self.channel.deadline)
            mine, theirs = socket.socketpair()
            try:
                chan.request("peer", fds=[theirs.fileno()])
                self.channel.request("peer", fds=[mine.fileno()])
            finally:
                mine.close()
                theirs.close()
            chan.peer, self.channel.peer = self.channel, chan
            self.subject_channel = chan
        return self.subject_channel

    def _place(self, value) -> tuple[dict, bool]:
        description = Describer(self.channel).describe(value)
        return description, not self.subjects and is_public(description)

    def wire(self, value) -> dict:
        """``value`` as it travels to the answer: a description, or a subject's reference."""
        description, here = self._place(value)
        if here:
            return description
        built = self._subject().request("build", description=description)
        return self.channel.encode(built)

    def explicit(self, value):
        """A proxy of the answer-side copy of ``value``, built once."""
        if isinstance(value, Remote):
            return value
        description, here = self._place(value)
        if here:
            return self.channel.request("build", description=description)
        return self._subject().request("build", description=description)

    def refused(self) -> list[tuple[str, str]]:
        """What the subject process's sandbox refused (known once :meth:`close` ran)."""
        return self.worker.refused if self.worker is not None else []

    def close(self) -> None:
        """Stop the subject process."""
        self.channel.peer = None
        if self.worker is not None:
            self.worker.stop()


class _Worker:
    """One answer process, as its grader sees it: a socket to it, the zygote's word on it, and
    the pipe on which its sandbox reports what it refused."""

    def __init__(self, pid: int, sock: socket.socket, status: socket.socket, reports: int):
        self.pid, self.sock, self.status, self.reports = pid, sock, status, reports
        self.refused: list[tuple[str, str]] = []  # (event, detail), read once it has ended
        self.disk = False  # the zygote ended it for its scratch files

    def stop(self) -> int | None:
        """End the answer process (the zygote kills it) and return its wait status."""
        for action in (self.sock.close, lambda: self.status.sendall(b"stop\n")):
            try:
                action()
            except OSError:
                pass
        line = _read_line(self.status, 30.0)
        self.status.close()
        data = b""
        os.set_blocking(self.reports, False)
        with contextlib.suppress(OSError):
            while len(data) < 64 * 1024:
                chunk = os.read(self.reports, 65536)
                if not chunk:
                    break
                data += chunk
        os.close(self.reports)
        for raw in data.splitlines()[:100]:
            event, _, detail = raw.decode(errors="replace").partition("\t")
            self.refused.append((event[:80], detail[:300]))
        self.disk = line.endswith(" disk")
        return int(line.split()[1]) if line.startswith("exit ") else None


def _read_line(sock: socket.socket, seconds: float) -> str:
    sock.settimeout(seconds)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 256:
            chunk = sock.recv(64)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode(errors="replace").strip()


def _spawn(control: socket.socket, limits: Limits, role: str = "answer") -> _Worker:
    """Ask the zygote for a fresh answer process (or subject process: ``role="subject"``)."""
    parent, child = socket.socketpair()
    status, status_child = socket.socketpair()
    reports, report_end = os.pipe()
    try:
        socket.send_fds(control, [f"spawn {limits.seconds + 30:g} {role}".encode()],
                        [child.fileno(), status_child.fileno(), report_end])
    finally:
        child.close()
        status_child.close()
        os.close(report_end)
    line = _read_line(status, 60.0)
    if not line.startswith("pid "):
        os.close(reports)
        raise ChannelClosed("the zygote did not start an answer process")
    status.settimeout(None)
    return _Worker(int(line.split()[1]), parent, status, reports)


def _zygote(control: socket.socket, limits: Limits,
            required: sandbox.Layers) -> None:  # pragma: no cover - its own process
    """Fork each answer process on request, kill it on request or past its time, report its end.

    It is forked from the grading template before the checkers and the hidden tests are
    loaded, so no answer process can find them in its memory; it never runs student code.
    Without the private view an answer's scratch folder is a plain folder: the zygote
    watches its size and ends the answer past :data:`SCRATCH_BYTES` (``exit … disk``).
    """
    import select
    import shutil

    watch_disk = not required.namespaces
    over: set[int] = set()  # answers ended for their scratch files
    children: dict[int, tuple[socket.socket, str, float]] = {}
    streams: dict[int, int] = {}  # status socket fd -> answer pid
    ended, wakeup = os.pipe()  # a child's end wakes the loop at once
    os.set_blocking(wakeup, False)
    signal.set_wakeup_fd(wakeup)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        while True:
            soonest = min((deadline for _, _, deadline in children.values()), default=None)
            wait = 5.0 if soonest is None else max(0.0, min(5.0, soonest - time.monotonic()))
            if watch_disk and children:
                wait = min(wait, 0.2)
            ready, _, _ = select.select([control, ended, *(children[p][0] for p in children)],
                                        [], [], wait)
            for sock in ready:
                if sock == ended:
                    with contextlib.suppress(OSError):
                        os.read(ended, 4096)
                elif sock is control:
                    message, fds, _, _ = socket.recv_fds(control, 256, 3)
                    if not message:
                        raise SystemExit
                    if len(fds) != 3 or not message.startswith(b"spawn "):
                        for fd in fds:
                            os.close(fd)
                        continue
                    root = tempfile.mkdtemp(prefix="abk-answer-")
                    pid = os.fork()
                    if pid == 0:
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        control.close()
                        for other, _, _ in children.values():
                            other.close()
                        os.close(fds[1])
                        role = "subject" if message.split()[2:] == [b"subject"] else "answer"
                        _answer_process(socket.socket(fileno=fds[0]), limits, root, required,
                                        role, fds[2])
                    os.close(fds[0])
                    os.close(fds[2])
                    status = socket.socket(fileno=fds[1])
                    seconds = float(message.split()[1])
                    children[pid] = (status, root, time.monotonic() + seconds)
                    streams[status.fileno()] = pid
                    try:
                        status.sendall(f"pid {pid}\n".encode())
                    except OSError:
                        pass
                else:
                    pid = streams.get(sock.fileno())
                    try:
                        sock.recv(64)  # "stop", or the grader is gone: either way, it ends
                    except OSError:
                        pass
                    if pid is not None:
                        _kill(pid)
            now = time.monotonic()
            for pid, (_, root, deadline) in list(children.items()):
                if now > deadline:
                    _kill(pid)
                elif watch_disk and sandbox.folder_bytes(root) > SCRATCH_BYTES:
                    over.add(pid)
                    _kill(pid)
            while children:
                try:
                    pid, wait_status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                if pid in children:
                    status, root, _ = children.pop(pid)
                    streams.pop(status.fileno(), None)
                    try:
                        end = " disk" if pid in over else ""
                        status.sendall(f"exit {wait_status}{end}\n".encode())
                    except OSError:
                        pass
                    over.discard(pid)
                    status.close()
                    shutil.rmtree(root, ignore_errors=True)
    finally:
        for pid, (_, root, _) in children.items():
            _kill(pid)
            shutil.rmtree(root, ignore_errors=True)
        os._exit(0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _after_exit(result: ExerciseResult, worker: _Worker, wait_status: int | None) -> None:
    """What the end of an answer process adds: its sandbox's reports, a system call the kernel
    refused, scratch files past their bound."""
    for event, detail in worker.refused:
        result.flags.append(f"your answer tried {event} {detail}".strip()
                            + ", which graded code may not do")
    if wait_status is not None and os.WIFSIGNALED(wait_status) \
            and os.WTERMSIG(wait_status) == signal.SIGSYS:
        result.flags.append("your answer made a system call that graded code may not make (a "
                            "socket, a new process, a writable shared file mapping, another "
                            "process's memory, …), and the kernel stopped it")
    elif wait_status is not None and os.WIFEXITED(wait_status) \
            and os.WEXITSTATUS(wait_status) == 3:
        result.cause = ("This exercise could not be graded: its process could not enter the "
                        "sandbox this run promised; tell your instructor.")
        return
    elif worker.disk:
        for cell in result.cells:
            cell.passed = False
        result.cause = (f"Your answer wrote more than {SCRATCH_BYTES // 2**20} MB of scratch "
                        "files, and its process was ended.")
    if not result.flags:
        return
    for cell in result.cells:
        cell.passed = False
    result.flags = list(dict.fromkeys(result.flags))
    result.cause = "Not counted: " + "; ".join(result.flags[:3]) + "."


def _grade_exercise(exercise: Exercise, answer: Answer, preamble: str,
                    worker: _Worker | None, limits: Limits,
                    spawn=None) -> ExerciseResult:
    """Grade one exercise: define the answer in ``worker``, then run its checks here.

    ``spawn()`` starts a subject process when a check hands over something the answer's
    process may not build (see :class:`_Handover`).
    """
    from ..exercises import feedback

    result = ExerciseResult(exercise.key, exercise.title,
                            [CellResult(cell.grade_id, cell.points) for cell in exercise.grade_cells])
    if answer.problem or answer.source is None:
        result.cause = f"This exercise was not graded: {answer.problem}."
        return result
    deadline = time.monotonic() + limits.seconds
    count_seeds()  # a check that seeds twice alike sends the seed twice
    channel = Channel(worker.sock, trusted=True, deadline=deadline)
    handover = _Handover(channel, spawn, subjects=exercise.kind == "property-test")
    channel.hand_over = handover.wire
    feedback.HAND_OVER.append(handover.explicit)
    filename = f"<answer {exercise.key}>"
    expired = False
    try:
        report = channel.request("define", preamble=preamble, answer=answer.source,
                                 filename=filename, names=list(exercise.names),
                                 forbidden=list(exercise.forbidden))
        result.notes += [f"your answer cell {note}" for note in report.get("notes", [])][:10]
        missing = [name for name in exercise.names if name not in report.get("defined", [])]
        if missing:
            result.cause = (f"Your answer cell does not define {', '.join(missing)} when it runs "
                            "on its own (with only the chapter's imports and definitions): "
                            "put every helper it needs in the answer cell itself.")
        proxies = {name: channel.request("get", name=name)
                   for name in exercise.names if name not in missing}
        for cell, cell_result in zip(exercise.grade_cells, result.cells, strict=True):
            if missing:
                break
            ok, output, error = _run(cell.checks, f"<check {cell.grade_id}>", proxies, deadline)
            cell_result.output = output
            expired = isinstance(error, _Expired)
            if channel.broken is not None or expired:
                break
            if not ok:
                cell_result.detail = f"the visible check failed ({_short(error)})"
                continue
            ok, _, error = _run(cell.hidden, f"<hidden tests {cell.grade_id}>", proxies, deadline)
            expired = isinstance(error, _Expired)
            if channel.broken is not None or expired:
                break
            if not ok:
                where = _hidden_line(error, f"<hidden tests {cell.grade_id}>")
                cell_result.detail = f"a hidden test failed ({_short(error)}; {where})"
                continue
            cell_result.passed = True
    except (ChannelClosed, TimeoutError, ProtocolError):
        pass
    except Exception as error:  # noqa: BLE001 - an answer that will not load
        result.cause = f"Your answer could not be loaded: {_short(error)}."
    finally:
        feedback.HAND_OVER.remove(handover.explicit)
        handover.close()
    ended = channel.broken
    if expired and ended is None:
        ended = TimeoutError("the time for this exercise is up")
    for event, detail in handover.refused():
        result.flags.append(f"a check's object, used by your answer, was refused {event} "
                            f"{detail}".strip())
    result.flags = list(dict.fromkeys(result.flags))
    if ended is not None:
        for cell_result in result.cells:
            cell_result.passed = False
        if isinstance(ended, TimeoutError):
            result.cause = (f"Grading this exercise took longer than {limits.seconds:g} s: "
                            "look for an endless loop or a very slow step.")
        elif isinstance(ended, ProtocolError):
            result.cause = ("Your answer sent the grader something it does not accept "
                            f"({_clip(str(ended), 200)}): return tensors, numbers, strings, "
                            "lists or dicts of a reasonable size.")
        else:
            result.cause = ("Your answer ended the process that graded it (for example "
                            "os._exit, a crash, or more memory than the limit).")
    if result.flags:
        for cell_result in result.cells:
            cell_result.passed = False
        result.cause = "Not counted: " + "; ".join(result.flags[:3]) + "."
    if not result.cause and not all(cell.passed for cell in result.cells):
        failed = [cell for cell in result.cells if not cell.passed]
        message = next((cell.output.strip() for cell in failed
                        if cell.detail.startswith("the visible") and cell.output.strip()), "")
        if message:
            result.cause = ("When your answer cell runs on its own, its check says: "
                            + _clip(message, 800))
        elif any(cell.detail.startswith("a hidden test") for cell in failed):
            result.cause = ("Your answer passes the visible check but not the hidden tests, "
                            "which try it on other inputs.")
        else:
            result.cause = "The check of this exercise did not pass."
    return result


def _preload(imports: str) -> None:
    """Import what answers use before the zygote is forked (each answer then starts warm)."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import torch.nn.attention.bias  # noqa: F401 - see below

    import attention_book  # noqa: F401
    for module in ("cli", "course", "feedback", "grading"):  # loaded, not used: no import cycle
        importlib.import_module(f"attention_book.classroom.{module}")

    # Every answer's process is forked from this one, with what it imported: the same modules
    # as when `import attention_book` brought TorchDynamo (FlexAttention, torch.compile and
    # PyTorch's CausalBias need it; imported inside an answer's process it was stopped there)
    # and `attention_book.classroom` imported all of its modules.

    for line in imports.splitlines():
        try:
            exec(line, {})  # noqa: S102 - the chapter's own import lines
        except Exception:  # noqa: BLE001 - an import this machine cannot do
            pass


def _option(argv: list[str], name: str, default: str | None = None) -> str:
    if name in argv:
        return argv[argv.index(name) + 1]
    if default is None:
        raise SystemExit(f"missing {name}")
    return default


def _runner(argv: list[str]) -> int:
    """The grading template: ``--imports-file F --limits JSON --layers JSON --jobs N``, the job
    on stdin, the results on stdout.

    It loads what every grader needs, forks the zygote (before the checkers), loads the
    checkers, checks the package's fingerprint against the one ``autograde`` took before any
    student code ran, and then forks one grader per student, ``--jobs`` at a time.
    """
    imports = Path(_option(argv, "--imports-file")).read_text(encoding="utf-8")
    limits = Limits(**json.loads(_option(argv, "--limits")))
    required = sandbox.Layers(**json.loads(_option(argv, "--layers", "{}")))
    jobs = max(1, int(_option(argv, "--jobs", "1")))
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sandbox.die_with_parent()  # a killed autograde leaves no grading behind
    try:  # nobody may read this process's memory (it will hold the hidden tests)
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass
    _preload(imports)
    control, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the zygote
        sandbox.die_with_parent()
        control.close()
        _zygote(zygote_end, limits, required)
    zygote_end.close()
    job = json.loads(sys.stdin.read())
    _load_checkers()
    expected = job.get("fingerprint") or {}
    try:
        graded = _run_graders(job["students"], control, limits, required, jobs, expected)
    except integrity.PackageChanged as error:
        out.write(json.dumps({"error": str(error)}))
        out.flush()
        return 4
    finally:
        control.close()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    out.write(json.dumps({"layers": asdict(required), "students": graded}))
    out.flush()
    return 0


def _load_checkers() -> None:
    """Import every checker module now, before any student code of the run executes."""
    import importlib
    import pkgutil

    from .. import exercises

    for module in pkgutil.iter_modules(exercises.__path__):
        importlib.import_module(f"{exercises.__name__}.{module.name}")


def _check_fingerprint(expected: dict[str, str]) -> None:
    if not expected:
        return
    changed = integrity.changed_files(expected, integrity.fingerprint())
    if changed:
        raise integrity.PackageChanged(
            "the book's package changed while grading ran (" + ", ".join(changed[:5])
            + "): the run stopped; reinstall the package and grade again")


def _grader_budget(student: dict, limits: Limits) -> float:
    return 30 + len(student["exercises"]) * (limits.seconds + 10)


def _run_graders(students: list[dict], control: socket.socket, limits: Limits,
                 required: sandbox.Layers, jobs: int,
                 expected: dict[str, str]) -> dict[str, dict]:
    """One fresh grader process per student, ``jobs`` at a time; their results by student."""
    import select

    graded: dict[str, dict] = {}
    pending = list(students)
    running: dict[int, list] = {}  # pipe fd -> [pid, student key, chunks, size, deadline]
    _check_fingerprint(expected)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                student = pending.pop(0)
                _check_fingerprint(expected)
                read, write = os.pipe()
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the grader
                    sandbox.die_with_parent()
                    os.close(read)
                    _grader_process(student, control, limits, required, write)
                os.close(write)
                running[read] = [pid, student["student"], [], 0,
                                 time.monotonic() + _grader_budget(student, limits),
                                 _grader_budget(student, limits)]
            ready, _, _ = select.select(list(running), [], [], 0.5)
            for fd in ready:
                entry = running[fd]
                chunk = os.read(fd, 1 << 16)
                if chunk and entry[3] + len(chunk) <= _MAX_RESULTS:
                    entry[2].append(chunk)
                    entry[3] += len(chunk)
                    continue
                if chunk:  # a grader that writes more than any result can be: stopped
                    _kill(entry[0])
                    entry[2] = [json.dumps({"error": "its grader wrote more than "
                                                     f"{_MAX_RESULTS:,} bytes"}).encode()]
                _finish(running.pop(fd), fd, graded)
            now = time.monotonic()
            for fd, entry in list(running.items()):
                if now > entry[4]:
                    _kill(entry[0])
                    entry[2] = [json.dumps({"error": "its grader took longer than "
                                                     f"{entry[5]:.0f} s"}).encode()]
                    _finish(running.pop(fd), fd, graded)
    finally:
        for fd, entry in running.items():
            _kill(entry[0])
            os.close(fd)
    _check_fingerprint(expected)
    return graded


_MAX_RESULTS = 16 * 2**20  # bytes of results one student's grader may send


def _finish(entry: list, fd: int, graded: dict[str, dict]) -> None:
    os.close(fd)
    pid, key = entry[0], entry[1]
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        status = 0
    try:
        data = json.loads(b"".join(entry[2]) or b"{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict) or not ("results" in data or "error" in data):
        signal_name = (signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status)
                       else f"exit {os.waitstatus_to_exitcode(status)}")
        data = {"error": f"its grader ended without results ({signal_name})"}
    graded[key] = data


def _grader_process(student: dict, control: socket.socket, limits: Limits,
                    required: sandbox.Layers, write: int) -> None:  # pragma: no cover
    """Grade one student, in a process of their own, and write the results to ``write``."""
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # the template's output is not this process's to write
        os.dup2(devnull, fd)
    keep = sorted({write, control.fileno()})
    os.closerange(3, keep[0])  # nor other graders' pipes
    for low, high in zip(keep, [*keep[1:], 65536], strict=True):
        os.closerange(low + 1, high)
    try:
        import torch

        torch.set_num_threads(1)
        count = max(1, len(student["exercises"]))
        sandbox.limit_resources(memory_bytes=max(limits.memory_bytes, 4 * 2**30),
                                cpu_seconds=int(count * limits.cpu_seconds + 60), open_files=256)
        if required.protected:  # read Python and the package; write nothing; no network
            sandbox.confine([*sandbox.python_roots(), sandbox.package_root()], [], kill=True)
        data: dict = {"results": _grade_student(student, control, limits)}
    except BaseException as error:  # noqa: BLE001 - every failure is a result
        data = {"error": f"its grader failed: {_short(error)}"}
    payload = json.dumps(data).encode()
    view = memoryview(payload)
    while view:
        try:
            written = os.write(write, view)
        except OSError:
            break
        view = view[written:]
    os._exit(0)


def _grade_student(student: dict, control: socket.socket, limits: Limits) -> list[dict]:
    results = []
    for item in student["exercises"]:
        exercise = Exercise(item["key"], item["title"], tuple(item["answer_ids"]),
                            tuple(item["names"]),
                            tuple(GradeCell(**cell) for cell in item["grade_cells"]),
                            tuple(item["forbidden"]), item.get("kind", ""))
        answer = Answer(**item["answer"])
        if answer.problem or answer.source is None:
            results.append(_grade_exercise(exercise, answer, "", None, limits))
            continue
        findings = _read_source(exercise, answer.source, item["preamble"])
        if findings:  # nothing of it runs: the source alone is the evidence
            result = ExerciseResult(exercise.key, exercise.title,
                                    [CellResult(c.grade_id, c.points) for c in exercise.grade_cells],
                                    flags=[f"your answer {text}" for text in findings])
            result.cause = "Not counted: " + "; ".join(result.flags[:3]) + "."
            results.append(result)
            continue
        worker = _spawn(control, limits)
        try:
            result = _grade_exercise(exercise, answer, item["preamble"], worker, limits,
                                     spawn=lambda: _spawn(control, limits, "subject"))
        finally:
            wait_status = worker.stop()
        _after_exit(result, worker, wait_status)
        results.append(result)
    return [asdict(result) for result in results]


def _read_source(exercise: Exercise, source: str, preamble: str) -> list[str]:
    """What the grader finds in an answer's source before it runs (:mod:`.scan`)."""
    namespace = scan.namespace_of(preamble)
    forbidden = {}
    for name in exercise.forbidden:
        value = scan.resolve_loaded(name)
        if value is not None:
            forbidden[id(value)] = name
    findings = scan.forbidden_findings(source, namespace, forbidden, (
        "attention_book.exercises", "attention_book.classroom"))
    findings += [f"{text} (reflection, which a graded answer may not use: name what you use)"
                 for text in scan.reflection_findings(source)]
    return list(dict.fromkeys(findings))


def _results(items: list[dict]) -> list[ExerciseResult]:
    results = []
    for item in items:
        item = dict(item)
        cells = [CellResult(**cell) for cell in item.pop("cells")]
        results.append(ExerciseResult(**item, cells=cells))
    return results


def grade_submissions(source_notebook, submissions: dict[str, object], *,
                      limits: Limits | None = None, use_jail: bool = True,
                      timeout: float | None = None, jobs: int | None = None,
                      layers: sandbox.Layers | None = None,
                      fingerprint: dict[str, str] | None = None,
                      ) -> tuple[dict[str, list[ExerciseResult]], sandbox.Layers]:
    """Grade submitted notebooks, exercise by exercise, in clean processes.

    Each student gets a grader process of their own, forked from a clean template; every
    exercise gets a fresh answer process, forked from a zygote made before the checkers
    and the hidden tests were loaded.

    Args:
        source_notebook: the instructor notebook (dict or ``nbformat`` node, or a path).
        submissions: each student id mapped to their notebook (a path, or a dict).
        limits: the limits of each answer process.
        use_jail: use the private file view where the machine allows it.
        timeout: seconds for everything (default: enough for every exercise).
        jobs: students graded at once (default: the machine's cores).
        layers: the sandbox layers to enter (default: every layer this machine gives).
        fingerprint: the package's :func:`~.integrity.fingerprint`, taken before any student
            code ran (default: taken now).

    Returns:
        ``(results, layers)``: each student's list of :class:`ExerciseResult`, and the
        :class:`~.sandbox.Layers` every answer entered (true when files were fenced).

    Raises:
        RuntimeError: the grading process itself failed (never because of an answer).
        integrity.PackageChanged: the package changed while the run went on.
    """
    (results,), layers = grade_many([(source_notebook, submissions)], limits=limits,
                                    use_jail=use_jail, timeout=timeout, jobs=jobs,
                                    layers=layers, fingerprint=fingerprint)
    return results, layers


def default_jobs() -> int:
    """Students graded at once by default: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def grade_many(requests: list[tuple[object, dict[str, object]]], *,
               limits: Limits | None = None, use_jail: bool = True,
               timeout: float | None = None, jobs: int | None = None,
               layers: sandbox.Layers | None = None,
               fingerprint: dict[str, str] | None = None,
               ) -> tuple[list[dict[str, list[ExerciseResult]]], sandbox.Layers]:
    """Grade the submissions of several chapters with one grading template.

    Args:
        requests: ``(instructor notebook, {student: submission})`` pairs.
        limits: the limits of each answer process.
        use_jail: use the private file view where the machine allows it.
        timeout: seconds for everything.
        jobs: students graded at once (default: :func:`default_jobs`).
        layers: the sandbox layers to enter (default: every layer this machine gives).
        fingerprint: the package's fingerprint, taken before any student code ran.

    Returns:
        ``(results, layers)``: one ``{student: [ExerciseResult]}`` per request, in order.

    Raises:
        RuntimeError: the grading process itself failed (never because of an answer).
        integrity.PackageChanged: the package changed while the run went on.
    """
    limits = limits or Limits()
    jobs = jobs or default_jobs()
    layers = layers if layers is not None else sandbox.available_layers(use_jail=use_jail)
    fingerprint = fingerprint if fingerprint is not None else integrity.fingerprint()
    job: dict = {"students": [], "fingerprint": fingerprint}
    all_imports: list[str] = []
    for index, (source_notebook, submissions) in enumerate(requests):
        if not isinstance(source_notebook, dict) and not hasattr(source_notebook, "cells"):
            source_notebook = json.loads(Path(source_notebook).read_text(encoding="utf-8"))
        exercises = read_exercises(source_notebook)
        imports, definitions = chapter_setup(source_notebook)
        all_imports += imports.splitlines()
        for student, submission in submissions.items():
            answers = read_answers(submission, exercises)
            items = []
            for exercise in exercises:
                answer = answers[exercise.key]
                items.append({**asdict(exercise), "answer": asdict(answer),
                              "preamble": preamble_for(answer.source or "", imports,
                                                       definitions)})
            job["students"].append({"student": f"{index}\t{student}", "exercises": items})
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, encoding="utf-8") as handle:
        handle.write("\n".join(dict.fromkeys(all_imports)))
        imports_file = handle.name
    # -P: the working folder is not on the path (PYTHONPATH still is, as the grader has it);
    # no bytecode cache of the package runs in the grader (integrity.SOURCE_ONLY)
    start = integrity.SOURCE_ONLY + (
        "import sys\nfrom attention_book.classroom.clean import _runner\n"
        "sys.exit(_runner(sys.argv[1:]))\n")
    command = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-c", start,
               "--imports-file", imports_file, "--limits", json.dumps(asdict(limits)),
               "--layers", layers.to_json(), "--jobs", str(jobs)]
    env = dict(os.environ)  # the grader's own environment (each answer process clears it)
    # TORCHINDUCTOR_COMPILE_THREADS: TorchInductor's settings are read when the grader imports
    # it; with more than one, a pool of compile workers (warmed in the grader, copied into each
    # fork) could be handed an answer's compilation, and the answer's process may start no
    # thread: its filter ends it
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "TORCHINDUCTOR_COMPILE_THREADS": "1"})
    budgets = sorted((_grader_budget(s, limits) for s in job["students"]), reverse=True)
    budget = timeout if timeout is not None else 90 + sum(budgets[::jobs]) + sum(budgets) / jobs
    try:
        process = subprocess.run(command, input=json.dumps(job), capture_output=True, text=True,
                                 timeout=budget, env=env, check=False)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"the grading process took longer than {budget:g} s") from error
    finally:
        os.unlink(imports_file)
    try:
        data = json.loads(process.stdout) if process.stdout.strip() else {}
    except ValueError:
        data = {}
    if process.returncode == 4 and data.get("error"):
        raise integrity.PackageChanged(data["error"])
    if process.returncode != 0 or "students" not in data:
        tail = (process.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"the grading process failed (exit {process.returncode}): "
                           + " | ".join(tail))
    by_key = {s["student"]: s["exercises"] for s in job["students"]}
    results: list[dict[str, list[ExerciseResult]]] = [{} for _ in requests]
    for key, items in by_key.items():
        index, student = key.split("\t", 1)
        outcome = data["students"].get(key)
        outcome = outcome if isinstance(outcome, dict) else {"error": "its grader sent nothing"}
        outcome.setdefault("error", "its grader sent results for other exercises")
        graded = _checked_results(items, outcome.get("results"))
        if graded is not None:
            results[int(index)][student] = graded
        else:
            results[int(index)][student] = _not_graded(items, str(outcome.get("error"))[:300])
    return results, layers


def _checked_results(items: list[dict], sent) -> list[ExerciseResult] | None:
    """A grader's results, if they are results for exactly the exercises it was given."""
    try:
        graded = _results(sent)
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    expected = [(item["key"], [(c["grade_id"], float(c["points"])) for c in item["grade_cells"]])
                for item in items]
    found = [(r.key, [(c.grade_id, float(c.points)) for c in r.cells]) for r in graded]
    if expected != found or not all(isinstance(c.passed, bool) for r in graded for c in r.cells):
        return None
    return graded


def _not_graded(items: list[dict], error: str) -> list[ExerciseResult]:
    return [ExerciseResult(item["key"], item["title"],
                           [CellResult(cell["grade_id"], cell["points"])
                            for cell in item["grade_cells"]],
                           cause=f"This exercise could not be graded ({error}); tell your "
                                 "instructor.") for item in items]


if __name__ == "__main__":
    sys.exit(_runner(sys.argv[1:]))
