"""What a check hands to an answer, as a description that the other process builds for itself.

The grading process never lends one of its own objects to an answer (:mod:`.remote`): a
reference would let the answer walk from it to the grader's frames and builtins. When a
check passes an object that is not data (a module to load weights into, a cache, a class or
a function to test), :class:`Describer` writes it down as JSON-ready data, and the receiving
process rebuilds it with :func:`build`:

- a class, function or constant of an importable module: its name (``module:qualname``);
- an instance: its class and its state (``__dict__``: tensors by value, numbers, strings,
  containers, and further instances), rebuilt with ``cls.__new__`` and the state, the way
  :mod:`pickle` rebuilds an object, never by calling code of the grader;
- a function that no module holds (a closure, a lambda, a test double defined by a hidden
  test): its compiled code, its closure and the globals it reads; a class defined by a
  hidden test: its bases and its namespace.

A description whose every name is public (PyTorch, the book's package without its checkers)
is built in the answer's own process (:func:`is_public`): the answer gets a real object of
the book. Any other (a checker's private test double, code of a hidden test) is built in a
sandboxed subject process, which lends it to the answer through its face only. The grading
process reads descriptions from no one.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import base64
import functools
import importlib
import marshal
import sys
import types

from .remote import Channel, ProtocolError, Remote, is_public_module

__all__ = ["Describer", "build", "is_public"]

_TAGS = frozenset({"global", "module", "new", "function", "type", "cell", "memo", "partial",
                   "bound", "wrapper"})
_SKIPPED_CLASS_KEYS = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__"})


def _lookup(module: str, qualname: str):
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _path(obj) -> str | None:
    """``module:qualname`` under which ``obj`` can be imported again, or None."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    if module not in sys.modules or module in ("__main__", "__grading__"):
        return None
    try:
        found = _lookup(module, qualname)
    except Exception:  # noqa: BLE001 - not importable under that name
        return None
    return f"{module}:{qualname}" if found is obj else None


def _referenced(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced(const)
    return names


def is_public(description) -> bool:
    """True when a description names only public modules and ships no code.

    Args:
        description: what :class:`Describer` wrote.

    Returns:
        True when the answer's own process can build it (it imports no checker and runs
        no code of the grader).
    """
    if isinstance(description, list):
        return all(is_public(item) for item in description)
    if not isinstance(description, dict):
        return True
    tag = description.get("$")
    if tag in ("function", "type"):
        return False
    if tag == "global" and not is_public_module(str(description.get("v", "")).split(":")[0]):
        return False
    if tag == "module" and not is_public_module(str(description.get("v", ""))):
        return False
    return all(is_public(value) for key, value in description.items() if key != "$")


class Describer:
    """Writes down objects for another process to build (see the module docstring).

    Args:
        channel: the channel whose encoding turns data (tensors, numbers, containers) into
            wire form; objects go through this describer.
    """

    def __init__(self, channel: Channel):
        self.channel = channel
        self._memo: dict[int, int] = {}
        self._alive: list[object] = []  # keeps described objects alive, so ids stay unique

    def describe(self, value):
        """``value`` as a description (data stays data)."""
        return self.channel.encode(value, objects=self._object)

    def _sub(self, value):
        return self.channel.encode(value, objects=self._object)

    def _remember(self, value) -> tuple[int, dict | None]:
        key = id(value)
        if key in self._memo:
            return self._memo[key], {"$": "memo", "v": self._memo[key]}
        number = len(self._memo) + 1
        self._memo[key] = number
        self._alive.append(value)
        return number, None

    def _object(self, value):
        if isinstance(value, Remote):
            raise TypeError("an object of the answer cannot be part of what the grader hands "
                            "over")
        if isinstance(value, types.ModuleType):
            return {"$": "module", "v": value.__name__}
        path = _path(value) if isinstance(value, (type, types.FunctionType,
                                                  types.BuiltinFunctionType)) else None
        if path is not None:
            return {"$": "global", "v": path}
        number, seen = self._remember(value)
        if seen is not None:
            return seen
        if isinstance(value, types.FunctionType):
            return self._function(value, number)
        if isinstance(value, type):
            return self._type(value, number)
        if isinstance(value, functools.partial):
            return {"$": "partial", "m": number, "func": self._sub(value.func),
                    "args": self._sub(list(value.args)),
                    "kwargs": self._sub(dict(value.keywords))}
        if isinstance(value, types.MethodType):
            return {"$": "bound", "m": number, "self": self._sub(value.__self__),
                    "name": value.__func__.__name__}
        if isinstance(value, (staticmethod, classmethod)):
            return {"$": "wrapper", "m": number, "kind": type(value).__name__,
                    "v": [self._sub(value.__func__)]}
        if isinstance(value, property):
            return {"$": "wrapper", "m": number, "kind": "property",
                    "v": [self._sub(value.fget), self._sub(value.fset), self._sub(value.fdel),
                          value.__doc__ if isinstance(value.__doc__, str) else None]}
        if isinstance(value, types.CellType):
            try:
                contents = value.cell_contents
            except ValueError:  # an empty cell
                return {"$": "cell", "m": number}
            return {"$": "cell", "m": number, "v": self._sub(contents)}
        return self._instance(value, number)

    def _instance(self, value, number: int) -> dict:
        klass = type(value)
        if isinstance(value, (types.BuiltinFunctionType, types.GeneratorType,
                              types.FrameType, types.CodeType)) or klass.__module__ == "builtins":
            raise TypeError(f"the grader cannot hand a {klass.__name__} to an answer")
        getstate = getattr(value, "__getstate__", None)
        state = getstate() if callable(getstate) else None
        if state is None:
            state = getattr(value, "__dict__", None)
        if state is None:
            raise TypeError(f"the grader cannot hand a {klass.__name__} to an answer: it has "
                            "no state to describe")
        return {"$": "new", "m": number, "cls": self._sub(klass), "state": self._sub(state)}

    def _function(self, function: types.FunctionType, number: int) -> dict:
        module = function.__module__ if isinstance(function.__module__, str) else None
        shared = (module in sys.modules and module not in ("__main__", "__grading__")
                  and getattr(sys.modules[module], "__dict__", None) is function.__globals__)
        names = {}
        if not shared:  # globals of a hidden test: only the names the code reads
            for name in sorted(_referenced(function.__code__)):
                if name in function.__globals__ and name != "__builtins__":
                    names[name] = function.__globals__[name]
        closure = [self._sub(cell) for cell in function.__closure__ or ()]
        return {"$": "function", "m": number,
                "code": base64.b64encode(marshal.dumps(function.__code__)).decode(),
                "module": module if shared else None, "globals": self._sub(names),
                "name": function.__name__, "qualname": function.__qualname__,
                "defaults": self._sub(function.__defaults__),
                "kwdefaults": self._sub(function.__kwdefaults__), "closure": closure,
                "dict": self._sub(dict(function.__dict__))}

    def _type(self, klass: type, number: int) -> dict:
        if "__slots__" in klass.__dict__:
            raise TypeError(f"the grader cannot hand over the class {klass.__name__} "
                            "(it has __slots__)")
        items = {key: self._sub(value) for key, value in klass.__dict__.items()
                 if key not in _SKIPPED_CLASS_KEYS}
        return {"$": "type", "m": number, "name": klass.__name__,
                "qualname": klass.__qualname__, "module": klass.__module__,
                "meta": self._sub(type(klass)), "bases": self._sub(list(klass.__bases__)),
                "dict": items}


def build(tag: str, data: dict, sub, ctx):
    """Build the object a description describes (the builder of a :class:`~.remote.Channel`).

    Args:
        tag: the description's kind (``data["$"]``).
        data: the description.
        sub: decodes a nested value.
        ctx: the decoding's memo (``ctx.memo``) and the fix-ups run once all is built
            (``ctx.fixups``: the cells of a class's methods point to the class itself).

    Returns:
        The object.

    Raises:
        ProtocolError: the description is malformed.
    """
    if tag not in _TAGS:
        raise ProtocolError(f"an unknown kind of value {tag!r}")
    number = data.get("m")
    if tag == "memo":
        if data.get("v") not in ctx.memo:
            raise ProtocolError("a reference to an object not yet described")
        return ctx.memo[data["v"]]
    if tag == "global":
        module, _, qualname = str(data.get("v", "")).partition(":")
        try:
            return _lookup(module, qualname)
        except Exception as error:  # noqa: BLE001 - a name this process cannot import
            raise ProtocolError(f"cannot find {module}:{qualname} ({type(error).__name__})") \
                from None
    if tag == "module":
        return importlib.import_module(str(data.get("v")))
    if tag == "cell":
        cell = types.CellType()
        ctx.memo[number] = cell
        if "v" in data:
            contents = data["v"]

            def fill(cell=cell, contents=contents):
                cell.cell_contents = sub(contents)

            ctx.fixups.append(fill)
        return cell
    if tag == "new":
        klass = sub(data.get("cls"))
        if not isinstance(klass, type):
            raise ProtocolError("an instance of something that is not a class")
        obj = klass.__new__(klass)
        ctx.memo[number] = obj
        state = sub(data.get("state"))
        setstate = getattr(obj, "__setstate__", None)
        if callable(setstate):
            setstate(state)
        elif isinstance(state, dict):
            obj.__dict__.update(state)
        return obj
    if tag == "function":
        code = marshal.loads(base64.b64decode(str(data.get("code", ""))))
        module = data.get("module")
        if isinstance(module, str):
            namespace = importlib.import_module(module).__dict__
        else:
            namespace = {"__builtins__": __builtins__, "__name__": "__grading__"}
        cells = [sub(cell) for cell in data.get("closure") or []]
        function = types.FunctionType(code, namespace, str(data.get("name", "f")), None,
                                      tuple(cells) or None)
        ctx.memo[number] = function
        if not isinstance(module, str):
            namespace.update(sub(data.get("globals")) or {})
        function.__qualname__ = str(data.get("qualname", function.__name__))
        function.__defaults__ = sub(data.get("defaults"))
        function.__kwdefaults__ = sub(data.get("kwdefaults"))
        function.__dict__.update(sub(data.get("dict")) or {})
        return function
    if tag == "type":
        meta = sub(data.get("meta"))
        bases = tuple(sub(data.get("bases")) or ())
        items = {key: sub(value) for key, value in (data.get("dict") or {}).items()}
        items["__module__"] = str(data.get("module", "__grading__"))
        klass = types.new_class(str(data.get("name", "C")), bases, {"metaclass": meta},
                                lambda namespace: namespace.update(items))
        klass.__qualname__ = str(data.get("qualname", klass.__name__))
        ctx.memo[number] = klass
        return klass
    if tag == "partial":
        function = functools.partial(sub(data.get("func")), *(sub(data.get("args")) or []),
                                     **(sub(data.get("kwargs")) or {}))
        ctx.memo[number] = function
        return function
    if tag == "bound":
        method = getattr(sub(data.get("self")), str(data.get("name")))
        ctx.memo[number] = method
        return method
    kind, values = data.get("kind"), [sub(value) for value in data.get("v") or []]
    wrapper = {"staticmethod": lambda: staticmethod(values[0]),
               "classmethod": lambda: classmethod(values[0]),
               "property": lambda: property(*values)}.get(kind)
    if wrapper is None:
        raise ProtocolError(f"an unknown wrapper {kind!r}")
    ctx.memo[number] = made = wrapper()
    return made
