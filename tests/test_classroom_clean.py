"""Grading in clean processes (``attention_book.classroom.clean``).

Two parts:

- every chapter's instructor key gets full marks and its student version zero, through the
  clean grader (one grading process for all chapters);
- a small notebook written here, with one exercise whose prompt forbids the library's
  softmax, graded for an honest student and for one student per strategy of the classroom
  trial (``../shared/reviews/classroom-trial-v2.md``) and others: every strategy earns 0, an
  integrity one is flagged, honest scratch work costs nothing;
- a notebook of three exercises that cross the boundary three ways (a forbidden softmax, a
  module handed over, a property test's lent subjects), graded without the private file view
  for one student per attack on the data-only boundary, one test per cause of
  ``classroom-trial-v3.md`` (C1, C3, C4, C5, C6): each attack earns nothing, says why, and the
  honest students graded after it keep full marks.
"""

from __future__ import annotations

import copy
import json
import sysconfig
from pathlib import Path

import nbformat
import pytest

from attention_book.classroom import find_chapters
from attention_book.classroom.clean import (
    Limits,
    chapter_setup,
    grade_many,
    grade_submissions,
    preamble_for,
    read_answers,
    read_exercises,
)
from attention_book.classroom.simulate import blank_answers, code_exercises, hand_in

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()


# --------------------------------------------------------------------------- every chapter


@pytest.fixture(scope="module")
def chapters_graded():
    requests = []
    for path in find_chapters(ROOT):
        instructor = nbformat.read(path, as_version=4)
        key = json.loads(nbformat.writes(instructor))
        requests.append((key, {"key": hand_in(key, {}),
                               "blank": hand_in(key, blank_answers(instructor))}))
    results, jailed = grade_many(requests, limits=Limits(seconds=120))
    return [path.stem for path in find_chapters(ROOT)], results, jailed


def test_every_chapters_key_gets_full_marks_in_clean_processes(chapters_graded):
    names, results, jailed = chapters_graded
    assert jailed
    for name, graded in zip(names, results, strict=True):
        for exercise in graded["key"]:
            failed = [(c.grade_id, c.detail, c.output[-300:]) for c in exercise.cells
                      if not c.passed]
            assert exercise.score == exercise.points > 0 and not failed, (name, failed)
            assert not exercise.flags and not exercise.cause, (name, exercise.key,
                                                                exercise.flags, exercise.cause)


def test_every_chapters_student_version_gets_zero(chapters_graded):
    names, results, _ = chapters_graded
    for name, graded in zip(names, results, strict=True):
        for exercise in graded["blank"]:
            assert exercise.score == 0, (name, exercise.key)
            assert "not written" in exercise.cause, (name, exercise.key, exercise.cause)


# --------------------------------------------------------------------------- a notebook of one exercise


SOFTMAX = '''def stable_softmax(x, dim=-1):
    """The softmax of x along dim, without overflow."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    weights = shifted.exp()
    return weights / weights.sum(dim=dim, keepdim=True)
'''
HIDDEN = '''import torch as _torch

_x = _torch.tensor([[1000.0, 999.0], [0.0, 0.0]])
_e = 1 / (1 + 2.718281828459045 ** -1)
assert _torch.allclose(stable_softmax(_x), _torch.tensor([[_e, 1 - _e], [0.5, 0.5]]))
'''
FORBIDDEN = ["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
             "attention_book.softmax"]
JUNK = 'def stable_softmax(x, dim=-1):\n    """doc"""\n    return x * 0\n'


def small_notebook():
    cells = [
        nbformat.v4.new_markdown_cell("# 2. A notebook for the grader's tests"),
        nbformat.v4.new_code_cell("import torch\nimport attention_book as ab"),
        nbformat.v4.new_markdown_cell(
            "> **Exercise 2.1 — Stable softmax (2 points)**\n>\n> Without torch.softmax.",
            metadata={"exercise": {"kind": "variant", "forbidden": FORBIDDEN}}),
        nbformat.v4.new_code_cell(SOFTMAX, metadata={"nbgrader": {
            "grade": False, "grade_id": "ch02-ex1-answer", "locked": False,
            "schema_version": 3, "solution": True, "task": False}}),
        nbformat.v4.new_code_cell(
            "from attention_book.exercises import check_stable_softmax\n\n"
            "assert check_stable_softmax(stable_softmax)\n### BEGIN HIDDEN TESTS\n" + HIDDEN
            + "### END HIDDEN TESTS",
            metadata={"nbgrader": {"grade": True, "grade_id": "ch02-ex1-check", "locked": True,
                                   "points": 2, "schema_version": 3, "solution": False,
                                   "task": False}}),
    ]
    return nbformat.v4.new_notebook(cells=cells)


def strategies(secret: Path) -> dict[str, tuple[str, list[str], bool]]:
    """Student -> (answer cell, extra scratch cells, flagged?)."""
    softmax_alias = "from torch import softmax as s\n\n\ndef stable_softmax(x, dim=-1):\n" \
                    "    return s(x, dim)\n"
    return {
        "honest": (SOFTMAX, [], False),
        "honest_scratch": (SOFTMAX + "\n%timeit stable_softmax(torch.randn(4, 4))\nimport os\n"
                           "print(os.getcwd())\n", [
                               "def check_rows_sum_to_one(w):\n    return True",
                               "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
                               "torch = None"], False),
        "library_softmax": ("def stable_softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n",
                            [], True),
        "alias_softmax": (softmax_alias, [], True),
        "method_softmax": ("def stable_softmax(x, dim=-1):\n    return x.softmax(dim)\n", [], True),
        "package_softmax": ("def stable_softmax(x, dim=-1):\n    return ab.softmax(x, dim)\n",
                            [], True),
        "answer_key": ("from attention_book.exercises.ch02 import check_stable_softmax as c\n"
                       + JUNK, [], True),
        "patch_inside": ("def stable_softmax(x, dim=-1):\n"
                         "    torch.allclose = lambda *a, **k: True\n"
                         "    torch.abs = lambda v: 0\n    return x * 0\n", [], False),
        "patch_builtins": ("def stable_softmax(x, dim=-1):\n    import builtins\n"
                           "    builtins.abs = lambda v: 0\n    return x * 0\n", [], True),
        "helper_parameters": ("def _setup(t, b):\n    t.allclose = lambda *a, **k: True\n"
                              "    b.isinstance = lambda *a: True\n\n\n"
                              "_setup(torch, print.__self__)\n" + JUNK, [], True),
        "input_transformer": ("_ = get_ipython().input_transformers_post.append(lambda l: "
                              "['pass\\n'])\n" + JUNK,
                              ["get_ipython().input_transformers_post.append(lambda l: "
                               "['pass\\n'] if any('check_' in x for x in l) else l)"], False),
        "globals_chain": ("globals()['torch'].allclose = lambda *a, **k: True\n" + JUNK, [], True),
        "builtins_exec": ("print.__self__.exec('import torch; torch.allclose = lambda *a, **k: "
                          "True')\n" + JUNK, [], True),
        "pickle": ("import pickle\n\n\nclass R:\n    def __reduce__(self):\n        return (exec, "
                   "('import torch; torch.allclose = lambda *a, **k: True',))\n\n\n"
                   "_ = pickle.loads(pickle.dumps(R()))\n" + JUNK, [], True),
        "shipped_module": ("import notes\n\n\ndef stable_softmax(x, dim=-1):\n"
                           "    return notes.softmax(x, dim)\n", [], False),
        "reads_course": (f"_KEY = open({str(secret)!r}).read()\n" + JUNK, [], True),
        "gradebook": (f"import sqlite3\n_db = sqlite3.connect({str(secret)!r})\n" + JUNK, [], True),
        "site_packages": (f"_ = open({str(SITE / 'zz_grading.pth')!r}, 'w').write('import os')\n"
                          + JUNK, [], True),
        "subprocess": ("import subprocess\n_ = subprocess.run(['true'])\n" + JUNK, [], True),
        "liar": ("class L:\n    def __eq__(self, other):\n        return True\n\n"
                 "    def __getattr__(self, name):\n        return lambda *a, **k: self\n\n\n"
                 "def stable_softmax(x, dim=-1):\n    return L()\n", [], False),
        "tensor_subclass": ("class T(torch.Tensor):\n    pass\n\n\n"
                            "def stable_softmax(x, dim=-1):\n    return (x * 0).as_subclass(T)\n",
                            [], False),
        "exits": ("def stable_softmax(x, dim=-1):\n    import os\n    os.abort()\n", [], False),
        "hangs": ("def stable_softmax(x, dim=-1):\n    while True:\n        pass\n", [], False),
        "memory": ("def stable_softmax(x, dim=-1):\n    return torch.ones(2**33)\n", [], False),
        "helper_elsewhere": ("def stable_softmax(x, dim=-1):\n    return my_softmax(x, dim)\n",
                             [SOFTMAX.replace("stable_softmax", "my_softmax")], False),
    }


@pytest.fixture(scope="module")
def small_graded(tmp_path_factory):
    secret = tmp_path_factory.mktemp("course") / "gradebook.db"
    secret.write_text("every answer")
    source = small_notebook()
    submissions = {}
    plan = strategies(secret)
    for student, (answer, scratch, _) in plan.items():
        notebook = copy.deepcopy(source)
        notebook.cells[3].source = answer
        notebook.cells += [nbformat.v4.new_code_cell(code) for code in scratch]
        submissions[student] = json.loads(nbformat.writes(notebook))
    broken = json.loads(nbformat.writes(source))
    broken["cells"][3]["metadata"] = {}
    submissions["no_answer_cell"] = broken
    twice = json.loads(nbformat.writes(source))
    twice["cells"].append(copy.deepcopy(twice["cells"][3]))
    submissions["answer_twice"] = twice
    garbled = tmp_path_factory.mktemp("garbled") / "nb.ipynb"
    garbled.write_text("{ not json")
    submissions["garbled"] = garbled
    results, jailed = grade_submissions(json.loads(nbformat.writes(source)), submissions,
                                        limits=Limits(seconds=8, memory_bytes=3 * 2**30))
    return plan, results, jailed, secret


def test_honest_work_and_scratch_work_get_full_marks(small_graded):
    _, results, jailed, _ = small_graded
    assert jailed
    for student in ("honest", "honest_scratch"):
        (exercise,) = results[student]
        assert exercise.score == 2 and not exercise.flags and not exercise.cause, (
            student, exercise)


def test_every_strategy_earns_zero_and_the_integrity_ones_are_flagged(small_graded):
    plan, results, _, secret = small_graded
    for student, (_, _, flagged) in plan.items():
        if student.startswith("honest"):
            continue
        (exercise,) = results[student]
        assert exercise.score == 0, (student, exercise)
        assert exercise.cause, student
        assert bool(exercise.flags) == flagged, (student, exercise.flags)
    assert secret.read_text() == "every answer"
    assert not (SITE / "zz_grading.pth").exists()


def test_each_zero_names_its_cause(small_graded):
    _, results, _, _ = small_graded

    def cause(student):
        return results[student][0].cause

    assert "torch.softmax" in cause("library_softmax") and "Not counted" in cause("library_softmax")
    assert "attention_book.softmax" in cause("package_softmax")
    assert "attention_book.exercises" in cause("answer_key")
    assert "reading" in cause("reads_course") and "gradebook.db" in cause("reads_course")
    assert "longer than 8 s" in cause("hangs")
    assert "ended the process" in cause("exits")
    assert "memory" in cause("memory")  # the limit refused it, and the check says so
    assert "does not define" not in cause("helper_elsewhere")
    assert "my_softmax" in cause("helper_elsewhere") or "not defined" in cause("helper_elsewhere")
    assert "missing" in cause("no_answer_cell")
    assert "2 cells carry" in cause("answer_twice")
    assert "could not be read" in cause("garbled")
    assert "Not yet" in cause("patch_inside")  # the checker's own message, run cleanly


def test_an_answer_gets_the_chapters_imports_and_the_definitions_it_names():
    source = {"cells": [
        {"cell_type": "code", "metadata": {}, "source": "import torch\nimport math as m"},
        {"cell_type": "code", "metadata": {}, "source":
            "SCALE = 2\n\n\ndef helper(x):\n    return x * SCALE\n\n\ndef unused():\n    pass\n"
            "model = torch.nn.Linear(2, 2)"},
    ]}
    imports, definitions = chapter_setup(source)
    assert imports.splitlines() == ["import torch", "import math as m"]
    assert set(definitions) == {"SCALE", "helper", "unused"}  # a call is never copied
    preamble = preamble_for("def answer(x):\n    return helper(x) + m.pi", imports, definitions)
    assert "def helper" in preamble and "SCALE = 2" in preamble and "unused" not in preamble


def test_answers_are_found_by_grade_id_whatever_else_changed():
    instructor = nbformat.read(find_chapters(ROOT)[2], as_version=4)
    exercises = read_exercises(instructor)
    assert exercises and all(e.grade_cells and e.names for e in exercises)
    answers = read_answers(json.loads(nbformat.writes(instructor)), exercises)
    assert all(a.source and not a.problem for a in answers.values())
    assert [e.key for e in exercises] == [e.exercise for e in code_exercises(instructor)]


# --------------------------------------------------------------------------- attacks on the boundary

# A notebook of three exercises that cross the boundary three ways: a softmax whose prompt
# forbids the library's (2.1; its hidden test also checks that calling the answer left the
# grader's default dtype, grad mode and random numbers alone), a function that loads weights
# into a module the check hands over (7.2: the module is built in the answer's process), and
# a property test of handed-over functions (3.4: they are lent by a subject process). One
# student per attack, built from the causes of ``classroom-trial-v3.md`` (C1, C3-C6), with
# honest students after them; graded without the private file view (the regime of most
# hubs: Landlock and the seccomp filter only), so nothing here leans on the jail.

STATE_HIDDEN = """
_torch.manual_seed(7)
_first = _torch.rand(3)
_torch.manual_seed(7)
_ = stable_softmax(_torch.zeros(2, 2))
assert _torch.equal(_torch.rand(3), _first), "the answer moved the grader's random numbers"
assert _torch.get_default_dtype() == _torch.float32, "the answer changed the default dtype"
assert _torch.is_grad_enabled(), "the answer switched the grader's gradients off"
"""


def _chapter_cells(notebook: str, grade_ids: tuple[str, ...]) -> list:
    """The prompt, answer and check cells of ``grade_ids``' exercises in a chapter."""
    chapter = nbformat.read(ROOT / "chapters" / notebook, as_version=4)
    keys = {grade_id.rsplit("-", 1)[0] for grade_id in grade_ids}
    cells = []
    for cell in chapter.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        about = cell.metadata.get("exercise")
        if grade_id in grade_ids or (about and any(
                f"Exercise {int(key[2:4])}.{key.split('ex')[1]} " in cell.source
                for key in keys)):
            cells.append(copy.deepcopy(cell))
    return cells


def boundary_notebook():
    cells = small_notebook().cells
    cells[1].source = ("import functools\nimport torch\nimport torch.nn.functional as F\n"
                       "import attention_book as ab")
    cells[4].source = cells[4].source.replace("### END HIDDEN TESTS",
                                              STATE_HIDDEN + "### END HIDDEN TESTS")
    cells += _chapter_cells("07_multi_head.ipynb", ("ch07-ex2-answer", "ch07-ex2-check"))
    cells += _chapter_cells("03_trainable_qkv.ipynb", ("ch03-ex4-answer", "ch03-ex4-check"))
    return nbformat.v4.new_notebook(cells=cells)


def _answer(notebook, grade_id: str) -> str:
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell.source
    raise KeyError(grade_id)


# C1: from an object a check hands over, walk to frames, builtins and exec, and to anything
# that talks to the grader; forge its verdicts; rewrite what the check compares with.
TAKEOVER = '''def load_c_attn(mha, c_attn_weight, c_attn_bias):
    """Walk from the handed module to builtins, exec, and the grader's results."""
    import gc

    frame = mha.parameters().gi_frame
    builtins = frame.f_builtins
    try:
        builtins["exec"]("import attention_book.classroom.clean as c\\n"
                         "c.CellResult.passed = True")
    except Exception:
        pass
    found = []
    while frame is not None:  # every frame up the stack, and every global it sees
        found += [value for value in {**frame.f_globals, **frame.f_locals}.values()
                  if "Channel" in type(value).__name__ or "Remote" in type(value).__name__]
        frame = frame.f_back
    found += [obj for obj in gc.get_objects()
              if type(obj).__name__ in ("Channel", "Remote", "RemoteTensor")]
    for obj in found:  # whatever talks to the grader: forge its verdicts, ask it to run code
        for attempt in (lambda: obj._send({"re": 1, "value": True, "state": {}}),
                        lambda: obj.request("call", target=0, args=["exec"]),
                        lambda: obj._meta("globals")):
            try:
                attempt()
            except Exception:
                pass
    return None
'''
REFERENCE = '''def load_c_attn(mha, c_attn_weight, c_attn_bias):
    """Rewrite what the check compares with: its tensors and the module it handed over."""
    c_attn_weight.zero_()
    c_attn_bias.zero_()
    for name in ("W_query", "W_key", "W_value"):
        setattr(mha, name, torch.nn.Identity())
    mha.forward = lambda *a, **k: None
'''
# C1 and C5 on a lent subject: every door a Python object has, and every way it names itself.
DOORS = ("__globals__", "__closure__", "__code__", "__self__", "__func__", "__wrapped__",
         "func", "gi_frame", "f_back", "__dict__", "__class__", "__reduce_ex__", "__init__",
         "__call__", "__module__", "__name__", "__qualname__", "__doc__", "__defaults__")
LEAK = '''def is_batch_consistent(attention_fn):
    """Judge by what the function says about itself, not by what it does (no reflection)."""
    text = [repr(attention_fn), str(attention_fn), f"{attention_fn}", " ".join(dir(attention_fn)),
            type(attention_fn).__name__, str(attention_fn.__class__),
            str(isinstance(attention_fn, type)), str(callable(attention_fn))]
    try:
        attention_fn(torch.zeros(2, 2, 2, 2, 2, 2))
    except Exception as error:
        text.append(str(error))
    text = " ".join(text).lower()
    return not any(word in text for word in ("flatten", "batch_max", "previous", "dim_two",
                                             "shared", "broken", "leak", "_", "true"))
'''
# The same through every door a Python object has: reflection, which the grader reads in the
# source and never runs.
DOORS_LEAK = '''def is_batch_consistent(attention_fn):
    """Walk through every door of the subject."""
    import inspect

    for name in DOORS:
        try:
            door = getattr(attention_fn, name)
            scope = door if isinstance(door, dict) else getattr(door, "__globals__", {})
            scope["__builtins__"]["exec"]("import sys; sys.modules['__main__'].stolen = 1")
            return True
        except Exception:
            pass
    return "broken" not in inspect.getsource(attention_fn)
'''.replace("DOORS", repr(DOORS))
# C3: leave the process in another default dtype, without gradients, with a chosen seed.
POISON = """torch.set_default_dtype(torch.float16)
torch.set_grad_enabled(False)
torch.manual_seed(5)


def stable_softmax(x, dim=-1):
    torch.set_default_dtype(torch.float16)
    torch.set_grad_enabled(False)
    torch.manual_seed(5)
    return x * 0
"""
POISON_CORRECT = SOFTMAX.replace("    shifted =", "    torch.set_default_dtype(torch.float64)\n"
                                 "    torch.set_grad_enabled(False)\n"
                                 "    torch.manual_seed(5)\n    shifted =")
# C4: the forbidden softmax, however it is reached: through reflection, which the grader reads
# in the source ("reflection", 0 and a flag), or through a public function that calls it
# inside, which the dispatcher refuses when it runs (0, the check's message).
THROUGH_A_PUBLIC_FUNCTION = ("def stable_softmax(x, dim=-1):\n"
                             "    return torch.nn.functional.softmin(-x, dim)\n")
INDIRECT = {
    "compiled_elsewhere": 'stable_softmax = eval(compile("lambda x, dim=-1: __import__(\'torch\')'
                          '.softmax(x, dim)", functools.__file__, "eval"))\n',
    "partial_computed": 'stable_softmax = functools.partial(getattr(torch, "soft" + "max"))\n',
    "map_method": ('def stable_softmax(x, dim=-1):\n    method = getattr(x, "soft" + "max")\n'
                   '    return next(map(method, [dim]))\n'),
    "closure_exec": ('_scope = {}\n_ = exec("import torch as t\\nf = t.soft" + "max", _scope)\n\n\n'
                     'def stable_softmax(x, dim=-1):\n    return _scope["f"](x, dim)\n'),
    "dispatcher": ('def stable_softmax(x, dim=-1):\n'
                   '    return getattr(torch.ops.aten, "_soft" + "max")(x, dim, False)\n'),
    "variable_functions": ('def stable_softmax(x, dim=-1):\n'
                           '    return getattr(torch._C._VariableFunctions, "soft" + "max")'
                           '(x, dim)\n'),
    "special_module": ('import sys\n\n\ndef stable_softmax(x, dim=-1):\n'
                       '    return getattr(sys.modules["torch.special"], "soft" + "max")(x, dim)\n'),
}
# C4 in another thread: a dispatch mode holds in the thread that runs the answer only, so an
# answer's process may start no thread (the kernel ends it, and the grade is flagged); with
# the threading module itself, the grader reads it in the source.
THREADED = {
    "own_thread": ('import threading\n\n\ndef stable_softmax(x, dim=-1):\n    out = []\n'
                   '    worker = threading.Thread(target=lambda: out.append(x.exp()))\n'
                   '    worker.start()\n    worker.join()\n    return out[0]\n'),
    "pool": ('from concurrent.futures import ThreadPoolExecutor\n\n\n'
             'def stable_softmax(x, dim=-1):\n    with ThreadPoolExecutor(1) as pool:\n'
             '        exp = pool.submit(lambda: (x - x.amax(dim, keepdim=True)).exp()).result()\n'
             '    return exp / exp.sum(dim, keepdim=True)\n'),
}
# C6: replies the grader must not decode, each within the sender's own limits; an answer
# that hangs while a subject waits on it.
FLOOD = '''def stable_softmax(x, dim=-1):
    """Send 3 M values in 3 MB."""
    return torch.zeros(3_000_000, dtype=torch.bool)
'''
DEEP = '''def stable_softmax(x, dim=-1):
    """Send a list 30 deep."""
    value = 0
    for _ in range(30):
        value = [value]
    return value
'''
BIG = '''def stable_softmax(x, dim=-1):
    """Send 64 MB in one tensor."""
    return torch.zeros(16 * 2**20)
'''
# Trial v4 on the answer's process: a Unix socket of the instructor's (D7), a contained attempt
# (D3: a report from its own process, which rebinding a module's functions cannot silence),
# unbounded scratch without the private view (D6), and a grader's token in the environment
# (D1): the answer computes the right softmax only where it sees no token.
UNIX_SOCKET = '''def stable_softmax(x, dim=-1):
    import asyncio

    async def reach():
        _, writer = await asyncio.open_unix_connection(SOCKET_PATH)
        writer.write(b"from an answer")
        await writer.drain()

    asyncio.run(reach())
    return x * 0
'''
PROBER = '''import json
import os

json.dumps = lambda *a, **k: "{}"  # no reflection: a module's function rebound
os.write = lambda *a: 0
try:
    _ = open(SECRET_PATH).read()
except OSError:
    pass
'''
DISK = '''def stable_softmax(x, dim=-1):
    import tempfile

    for index in range(12):
        with open(f"{tempfile.gettempdir()}/fill-{index}", "wb") as handle:
            handle.write(b"x" * 2**23)
    return x * 0
'''
TOKEN_BLIND = '''import os

if os.environ.get("JUPYTERHUB_API_TOKEN") or os.environ.get("JPY_API_TOKEN") or any(
        "TOKEN" in name for name in os.environ):
    raise SystemExit("a token reached the answer")
'''
HANG = '''class _Stuck:
    @property
    def shape(self):
        while True:
            pass

    def __getattr__(self, name):
        while True:
            pass


def is_batch_consistent(attention_fn):
    """Hand the subject an object that never answers it."""
    return attention_fn(_Stuck())
'''


@pytest.fixture(scope="module")
def instructor_socket(tmp_path_factory):
    """A service of the instructor's account on a Unix socket; what reached it, once closed."""
    import socket
    import threading

    path = tmp_path_factory.mktemp("service") / "service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.5)
    received: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                connection.settimeout(5)
                try:
                    received.append(connection.recv(1024) or b"(connected)")
                except OSError:
                    received.append(b"(connected)")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, received
    stop.set()
    thread.join(timeout=10)
    server.close()


@pytest.fixture(scope="module")
def boundary_graded(tmp_path_factory, instructor_socket):
    import os

    secret = tmp_path_factory.mktemp("course") / "gradebook.db"
    secret.write_text("every answer")
    source = boundary_notebook()
    keys = {"ch02-ex1-answer": SOFTMAX,
            "ch07-ex2-answer": _answer(source, "ch07-ex2-answer"),
            "ch03-ex4-answer": _answer(source, "ch03-ex4-answer")}
    scratch = keys["ch07-ex2-answer"] + ("\nimport torch\nprint(torch.__version__)\n"
                                         "%timeit torch.zeros(2)\n")
    plan = {  # student: ({grade id: answer}, the exercise attacked); in the order graded
        "honest": (keys, None),
        "takeover": ({"ch07-ex2-answer": TAKEOVER}, "ch07-ex2"),
        "after_takeover": (keys, None),
        "reference": ({"ch07-ex2-answer": REFERENCE}, "ch07-ex2"),
        "leak": ({"ch03-ex4-answer": LEAK}, "ch03-ex4"),
        "poisoner": ({**keys, "ch02-ex1-answer": POISON}, "ch02-ex1"),
        "poisoner_correct": ({**keys, "ch02-ex1-answer": POISON_CORRECT}, None),
        "after_poisoner": (keys, None),
        **{name: ({"ch02-ex1-answer": code}, "ch02-ex1") for name, code in INDIRECT.items()},
        **{name: ({"ch02-ex1-answer": code}, "ch02-ex1") for name, code in THREADED.items()},
        "flood": ({"ch02-ex1-answer": FLOOD}, "ch02-ex1"),
        "deep": ({"ch02-ex1-answer": DEEP}, "ch02-ex1"),
        "big": ({"ch02-ex1-answer": BIG}, "ch02-ex1"),
        "hang": ({"ch03-ex4-answer": HANG}, "ch03-ex4"),
        "after_flood": (keys, None),
        "honest_scratch": ({**keys, "ch07-ex2-answer": scratch}, None),
        "softmin": ({"ch02-ex1-answer": THROUGH_A_PUBLIC_FUNCTION}, "ch02-ex1"),
        "doors": ({"ch03-ex4-answer": DOORS_LEAK}, "ch03-ex4"),
        "unix_socket": ({"ch02-ex1-answer": UNIX_SOCKET.replace(
            "SOCKET_PATH", repr(str(instructor_socket[0])))}, "ch02-ex1"),
        "prober": ({**keys, "ch02-ex1-answer": PROBER.replace("SECRET_PATH", repr(str(secret)))
                    + SOFTMAX}, "ch02-ex1"),
        "disk": ({"ch02-ex1-answer": DISK}, "ch02-ex1"),
        "token_blind": ({**keys, "ch02-ex1-answer": TOKEN_BLIND + SOFTMAX}, None),
        "after_v4": (keys, None),
    }
    submissions = {}
    for student, (answers, _) in plan.items():
        notebook = copy.deepcopy(source)
        notebook.cells = [cell for cell in notebook.cells  # only the answers it gives
                          if not cell.metadata.get("nbgrader", {}).get("solution")
                          or cell.metadata["nbgrader"]["grade_id"] in answers]
        for cell in notebook.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if grade_id in answers:
                cell.source = answers[grade_id]
        submissions[student] = json.loads(nbformat.writes(notebook))
    tokens = {"JUPYTERHUB_API_TOKEN": "hub-token-of-the-instructor",
              "JPY_API_TOKEN": "hub-token-of-the-instructor"}
    os.environ.update(tokens)  # as in a hub terminal, where the guide runs autograde
    try:
        results, layers = grade_submissions(json.loads(nbformat.writes(source)), submissions,
                                            limits=Limits(seconds=20, memory_bytes=3 * 2**30),
                                            use_jail=False)
    finally:
        for name in tokens:
            os.environ.pop(name, None)
    return plan, results, layers, secret


def _result(results, student: str, key: str):
    return next(e for e in results[student] if e.key == key)


def _assert_attack_earns_nothing(plan, results, student: str) -> None:
    """The attacked exercise scores 0 with a cause; the ones not answered are not graded."""
    answers, attacked = plan[student]
    for exercise in results[student]:
        if exercise.key == attacked:
            assert exercise.score == 0 and exercise.cause, (student, exercise)
        elif f"{exercise.key}-answer" not in answers:
            assert exercise.score == 0 and "not graded" in exercise.cause, (student, exercise)


def _assert_full_marks(results, student: str) -> None:
    for exercise in results[student]:
        assert exercise.score == exercise.points > 0, (student, exercise)
        assert not exercise.flags and not exercise.cause, (student, exercise)


def test_honest_work_gets_full_marks_without_the_jail(boundary_graded):
    _, results, layers, secret = boundary_graded
    assert not layers.namespaces and layers.protected  # Landlock fences the files instead
    for student in ("honest", "honest_scratch"):
        _assert_full_marks(results, student)
    assert secret.read_text() == "every answer"


def _read_in_the_source(exercise) -> bool:
    """The grader found it in the source (reflection or a forbidden name): 0, flagged."""
    return exercise.score == 0 and exercise.flags and "Not counted" in exercise.cause


def test_c1_no_grader_object_reaches_an_answer(boundary_graded):
    """C1: what a check hands over is built in the answer's process; the grader lends nothing.
    The walk from a handed object to frames and builtins is reflection: read in the source."""
    plan, results, _, _ = boundary_graded
    for student in ("takeover", "reference"):
        _assert_attack_earns_nothing(plan, results, student)
    takeover = _result(results, "takeover", "ch07-ex2")
    assert _read_in_the_source(takeover) and "reflection" in takeover.cause, takeover
    assert any("gi_frame" in flag or "f_builtins" in flag for flag in takeover.flags), takeover
    assert "Not yet" in _result(results, "reference", "ch07-ex2").cause  # the check's copies held
    _assert_full_marks(results, "after_takeover")


def test_c3_state_set_by_an_answer_stays_in_its_process(boundary_graded):
    """C3: default dtype, grad mode and RNG go grader -> answer only, and are reset per check."""
    _, results, _, _ = boundary_graded
    poisoned = _result(results, "poisoner", "ch02-ex1")
    assert poisoned.score == 0 and "Not yet" in poisoned.cause, poisoned
    # the same grader's later exercises, and a correct answer that poisons as it runs, lose
    # nothing: the hidden test checks the grader's dtype, grad mode and random numbers after
    # the call
    for key in ("ch07-ex2", "ch03-ex4"):
        assert _result(results, "poisoner", key).score == _result(results, "poisoner", key).points
    _assert_full_marks(results, "poisoner_correct")
    _assert_full_marks(results, "after_poisoner")


def test_c4_a_forbidden_call_is_refused_however_it_is_reached(boundary_graded):
    """C4 / D3: reached unnamed (compile, partial, map, exec, sys.modules, the dispatcher), it
    needs reflection, which the grader reads in the source; reached through a public function
    that calls it inside, the dispatcher refuses it as the answer runs."""
    plan, results, _, _ = boundary_graded
    for student in INDIRECT:
        _assert_attack_earns_nothing(plan, results, student)
        exercise = _result(results, student, "ch02-ex1")
        assert _read_in_the_source(exercise) and "reflection" in exercise.cause, (
            student, exercise)
    _assert_attack_earns_nothing(plan, results, "softmin")
    softmin = _result(results, "softmin", "ch02-ex1")
    assert "softmax" in softmin.cause and "not allowed" in softmin.cause, softmin
    _assert_full_marks(results, "after_poisoner")


def test_c4_an_answer_cannot_carry_a_forbidden_call_to_another_thread(boundary_graded):
    """The dispatcher's refusal is per thread: the kernel refuses the answer a second thread."""
    plan, results, layers, _ = boundary_graded
    assert layers.seccomp
    for student in THREADED:
        _assert_attack_earns_nothing(plan, results, student)
        exercise = _result(results, student, "ch02-ex1")
        assert "Not counted" in exercise.cause, (student, exercise)
    assert "reflection" in _result(results, "own_thread", "ch02-ex1").cause
    pool = _result(results, "pool", "ch02-ex1")
    assert any("system call" in flag for flag in pool.flags), pool


def test_c5_a_lent_subject_shows_no_name_no_kind_and_no_door(boundary_graded):
    """C5 / D9 (and C1 through a subject): repr, str, dir, its type and whether it is a class
    tell the answer nothing; its doors are reflection, read in the source."""
    plan, results, _, _ = boundary_graded
    _assert_attack_earns_nothing(plan, results, "leak")
    leak = _result(results, "leak", "ch03-ex4")
    assert "Not yet" in leak.cause and not leak.flags, leak  # it told the subjects apart by nothing
    doors = _result(results, "doors", "ch03-ex4")
    assert _read_in_the_source(doors) and "reflection" in doors.cause, doors
    _assert_full_marks(results, "after_takeover")


def test_c6_replies_are_bounded_and_a_stuck_answer_times_out(boundary_graded):
    """C6: items, depth and bytes of a reply are bounded on the grader's side, and its time."""
    plan, results, _, _ = boundary_graded
    for student, limit in (("flood", "values"), ("deep", "nested"), ("big", "bytes")):
        _assert_attack_earns_nothing(plan, results, student)
        cause = _result(results, student, "ch02-ex1").cause
        assert "sent the grader something it does not accept" in cause and limit in cause, (
            student, cause)
    _assert_attack_earns_nothing(plan, results, "hang")
    assert "longer than 20 s" in _result(results, "hang", "ch03-ex4").cause
    _assert_full_marks(results, "after_flood")


def test_v4_an_answer_reaches_no_socket_no_secret_and_no_disk(boundary_graded, instructor_socket):
    """Trial v4 against the answer's process, without the private view: a Unix socket of the
    instructor's (D7: the kernel ends the process at socket()), a contained attempt with the
    reporting functions rebound (D3: its own report pipe still says what was refused), scratch
    files past 64 MB (D6: ended), a hub token in the grader's environment (D1: not there)."""
    plan, results, _, secret = boundary_graded
    path, received = instructor_socket
    for student in ("unix_socket", "prober", "disk"):
        _assert_attack_earns_nothing(plan, results, student)
    unix = _result(results, "unix_socket", "ch02-ex1")
    assert any("system call" in flag for flag in unix.flags), unix
    assert received == [], received  # nothing reached the instructor's service
    prober = _result(results, "prober", "ch02-ex1")
    assert any("reading" in flag and secret.name in flag for flag in prober.flags), prober
    disk = _result(results, "disk", "ch02-ex1")
    assert "more than 64 MB of scratch" in disk.cause, disk
    _assert_full_marks(results, "token_blind")  # no token reached it, so it answered
    _assert_full_marks(results, "after_v4")
    assert secret.read_text() == "every answer"
