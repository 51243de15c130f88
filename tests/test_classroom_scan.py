"""What the grader reads in an answer's source before it runs (``attention_book.classroom.scan``).

Trial v4 (D3) took apart what runs inside the answer's process (a tripwire's closure, the
dispatcher's mode stack, the audit hook's closure cell) to reach a forbidden function or to
try files without a flag. Each of those needs reflection; the grader flags reflection in the
source, so such an answer never runs. Every chapter's own solutions, and honest scratch work,
use none.
"""

from __future__ import annotations

import json

import pytest
import torch

from attention_book.classroom import find_chapters, scan
from attention_book.classroom.clean import read_answers, read_exercises
from attention_book.classroom.simulate import hand_in

#: Ways to reach an object without naming it, each of which must be flagged.
REFLECTIVE = {
    "closure cell": "f = torch.softmax.__closure__[0].cell_contents",
    "computed getattr": "f = getattr(torch, 'soft' + 'max')",
    "getattr passed on": "import functools\nf = functools.reduce(getattr, ['softmax'], torch)",
    "private getattr": "f = getattr(torch, '_C')",
    "eval": "f = eval('torch.softmax')",
    "exec": "exec('import os')",
    "compile": "c = compile('1', 'x', 'eval')",
    "__import__": "t = __import__('torch')",
    "globals": "g = globals()['torch']",
    "vars": "v = vars(torch)",
    "dunder": "d = torch.nn.functional.__dict__",
    "subclasses": "s = object.__subclasses__()",
    "private attribute": "c = torch._C",
    "frames": "import inspect\nf = inspect.currentframe().f_back.f_globals",
    "frame attribute": "def g():\n    yield\nf = g().gi_frame",
    "sys": "import sys\nm = sys.modules['torch']",
    "from sys": "from sys import modules",
    "gc": "import gc\no = gc.get_objects()",
    "ctypes": "import ctypes",
    "numpy's ctypes": "import numpy\nc = numpy.ctypeslib",
    "torch.ops": "f = torch.ops.aten._softmax",
    "dispatch modes": "from torch.utils._python_dispatch import _pop_mode",
    "builtins": "import builtins\nbuiltins.isinstance = lambda *a: True",
    "print's module": "b = print.__self__",
    "attrgetter": "import operator\nf = operator.attrgetter('softmax')",
    "pickle": "import pickle",
    "threads": "import threading",
}
#: What honest answers write, none of which is reflection.
HONEST = {
    "loop over literal names": ("for name in ('W_query', 'W_key'):\n"
                                "    getattr(layer, name).weight.copy_(w)"),
    "zip over literal names": ("for name, w in zip(('W_key', 'W_value'), ws):\n"
                               "    setattr(layer, name, w)"),
    "constant getattr": "w = getattr(layer, 'weight')",
    "own private state": "class C:\n    def __init__(self):\n        self._cache = {}\n"
                         "    def __len__(self):\n        return len(self._cache)",
    "super": "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()",
    "eval mode": "layer.eval()",
    "type name": "name = type(x).__name__",
    "module attributes": "import math\ny = math.sqrt(2) * torch.nn.functional.relu(x)",
    "timeit magic": "get_ipython().run_line_magic('timeit', 'f(x)')",
}


@pytest.mark.parametrize("source", REFLECTIVE.values(), ids=REFLECTIVE.keys())
def test_reflection_is_found_in_the_source(source):
    assert scan.reflection_findings(source), source


@pytest.mark.parametrize("source", HONEST.values(), ids=HONEST.keys())
def test_honest_code_is_no_reflection(source):
    assert scan.reflection_findings(source) == []


def test_no_solution_of_the_book_is_reflection():
    """Every chapter's own answers pass the rule, so honest students meet it nowhere."""
    from pathlib import Path

    found = {}
    for path in find_chapters(Path(__file__).resolve().parents[1]):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        exercises = read_exercises(notebook)
        for key, answer in read_answers(hand_in(notebook, {}), exercises).items():
            if answer.source and scan.reflection_findings(answer.source):
                found[key] = scan.reflection_findings(answer.source)
    assert found == {}


def test_a_forbidden_function_is_found_however_it_is_named():
    import torch.nn.functional as functional  # noqa: F401 - loaded, as in the grader

    namespace = scan.namespace_of("import torch\nimport torch.nn.functional as F")
    forbidden = {id(torch.softmax): "torch.softmax",
                 id(torch.nn.functional.softmax): "torch.nn.functional.softmax",
                 id(torch.Tensor.softmax): "torch.Tensor.softmax"}
    blocked = ("attention_book.exercises",)
    for source in ("y = torch.softmax(x, -1)", "y = F.softmax(x, -1)",
                   "from torch import softmax as s\ny = s(x, -1)", "y = x.softmax(-1)",
                   "import torch.nn.functional as G\ny = G.softmax(x, -1)",
                   "from attention_book.exercises.ch02 import check_stable_softmax"):
        assert scan.forbidden_findings(source, namespace, forbidden, blocked), source
    assert scan.forbidden_findings("y = torch.exp(x)", namespace, forbidden, blocked) == []
