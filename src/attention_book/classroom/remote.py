"""Call objects that live in another process: the wire between the grader and a student's answer.

A graded answer runs in a sandboxed process of its own (:mod:`.sandbox`); the hidden tests
run in a trusted process (:mod:`.clean`). Each call from a hidden test to an answer function
travels over a socket as a message, and so does every call the answer makes back into an
object the hidden test handed it (a module to test, a cache to fill). Nothing else crosses:
no code, no pickles, only the data types below, so the answer can never touch the memory
of the process that decides its grade.

What crosses, and how:

- ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``complex``, lists, tuples,
  dicts, sets, ``slice``, ``torch.Size``, ``torch.dtype``, ``torch.device``, numeric NumPy
  arrays and tensors travel **by value** (a tensor as its dtype, shape and raw bytes);
- every other object travels **by reference**: the receiver gets a :class:`Remote` proxy
  whose calls, attribute reads and writes, items, ``len``, iteration, comparisons and
  arithmetic are messages back to the owner. A proxy reports the first class of the book,
  of PyTorch or of the standard library in its object's MRO as its ``__class__``, so
  ``isinstance(proxy, nn.Module)`` is true for a module;
- a tensor read as an *attribute* (``layer.weight``) travels by reference as a
  :class:`RemoteTensor`, so ``layer.weight.copy_(w)`` changes the owner's tensor; torch
  functions and Python operators fetch its value first.

Each message also carries the sender's global RNG state, grad mode and default dtype, and
the receiver adopts them while it handles the message: ``torch.manual_seed(1)`` before a
call means the same in both processes.

The trusted side never lets the other side read or write an attribute whose name starts and
ends with two underscores (``__globals__``, ``__dict__``, ``__code__``, …), so an answer
cannot walk from an object it was handed to the hidden test's namespace.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import base64
import builtins
import importlib
import itertools
import json
import math
import operator
import socket
import struct
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable

import torch

__all__ = ["Channel", "ChannelClosed", "ProtocolError", "Remote", "RemoteError", "RemoteTensor"]

MAX_MESSAGE = 256 * 2**20  # bytes; a bigger message ends the conversation
MAX_DEPTH = 40  # nesting of containers
MAX_ITEMS = 2_000_000  # values in one message
#: Modules whose classes a proxy may report as its ``__class__`` (the first such class in the
#: object's MRO); the checkers and the grader are never among them.
TRUSTED_MODULES = ("torch", "attention_book", "builtins", "collections", "numpy", "math",
                   "functools", "itertools", "typing", "types", "abc")
UNTRUSTED_MODULES = ("attention_book.exercises", "attention_book.classroom")
_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "matmul": operator.matmul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift, "eq": operator.eq,
    "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge,
}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs,
          "invert": operator.invert}
_SAFE_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__module__"})
_NUMPY_KINDS = "biufc"  # bool, int, uint, float, complex: the only arrays that travel by value
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.bool)}


class ChannelClosed(ConnectionError):
    """The other process went away (it ended, crashed or was stopped)."""


class ProtocolError(RuntimeError):
    """The other process sent something that is not a well-formed message."""


class RemoteError(Exception):
    """An exception raised in the other process whose type is not a built-in one."""

    def __init__(self, type_name: str, message: str):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message


def _is_trusted_module(name: str) -> bool:
    return (any(name == root or name.startswith(root + ".") for root in TRUSTED_MODULES)
            and not any(name == bad or name.startswith(bad + ".") for bad in UNTRUSTED_MODULES))


def _class_path(obj) -> str | None:
    for klass in type(obj).__mro__:
        if klass is object:
            continue
        if _is_trusted_module(getattr(klass, "__module__", "") or "") and _reportable(klass):
            return f"{klass.__module__}:{klass.__qualname__}"
    return None


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python


def _reportable(klass: type) -> bool:
    """A proxy may pass for an instance of ``klass`` only if no C code trusts its layout.

    C extensions (torch's among them) test ``isinstance`` and then read the object's memory
    as their own struct: a proxy that claimed to be a ``torch.Tensor`` would crash the
    process. Classes written in Python only, and ``type`` for a remote class, are safe.
    """
    if klass is type:
        return True
    return all(k.__flags__ & _HEAPTYPE for k in klass.__mro__ if k is not object)


def _resolve_class(path: str | None):
    if not path or ":" not in path:
        return None
    module, qualname = path.split(":", 1)
    if not _is_trusted_module(module):
        return None
    try:
        value = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except Exception:  # noqa: BLE001 - an unknown class is just not reported
        return None
    return value if isinstance(value, type) and _reportable(value) else None


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().tobytes()


class Remote:
    """A proxy for an object in the other process (see the module docstring)."""

    __slots__ = ("_chan", "_rid", "_meta", "__weakref__")

    def __init__(self, chan: Channel, rid: int, meta: dict):
        object.__setattr__(self, "_chan", chan)
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_meta", meta)

    # -- attributes
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in _SAFE_DUNDERS:
            raise AttributeError(name)
        method = self._chan._methods.get((self._rid, name))
        if method is not None:  # a method of the object's class: no round trip to find it
            return method
        return self._chan.request("getattr", target=self._rid, name=name)

    def __setattr__(self, name, value):
        self._chan.request("setattr", target=self._rid, name=name,
                           value=self._chan.encode(value))

    def __delattr__(self, name):
        self._chan.request("delattr", target=self._rid, name=name)

    @property
    def __class__(self):  # noqa: D105 - isinstance() reads it
        return _resolve_class(self._meta.get("cls")) or type(self)

    @property
    def __signature__(self):  # noqa: D105 - inspect.signature() reads it
        return _signature(self._chan, self._rid, None)

    @property
    def __bases__(self):  # noqa: D105 - issubclass() reads it for a remote class
        if self._meta.get("kind") != "class":
            raise AttributeError("__bases__")
        return tuple(k for k in map(_resolve_class, self._meta.get("bases", [])) if k) or (object,)

    def __dir__(self):
        return self._chan.request("dir", target=self._rid)

    # -- protocols
    def __call__(self, *args, **kwargs):
        return self._chan.request("call", target=self._rid, args=self._chan.encode(list(args)),
                                  kwargs=self._chan.encode(kwargs))

    def __getitem__(self, key):
        return self._chan.request("getitem", target=self._rid, key=self._chan.encode(key))

    def __setitem__(self, key, value):
        self._chan.request("setitem", target=self._rid, key=self._chan.encode(key),
                           value=self._chan.encode(value))

    def __delitem__(self, key):
        self._chan.request("delitem", target=self._rid, key=self._chan.encode(key))

    def __len__(self):
        return self._chan.request("len", target=self._rid)

    def __iter__(self):
        return self._chan.request("iter", target=self._rid)

    def __next__(self):
        return self._chan.request("next", target=self._rid)

    def __contains__(self, item):
        self._verdict("'in'")
        return self._chan.request("contains", target=self._rid, item=self._chan.encode(item))

    def __bool__(self):
        self._verdict("the truth value")
        return self._chan.request("bool", target=self._rid)

    def __int__(self):
        return self._chan.request("int", target=self._rid)

    def __index__(self):
        return self._chan.request("int", target=self._rid)

    def __float__(self):
        return self._chan.request("float", target=self._rid)

    def __repr__(self):
        try:
            return self._chan.request("repr", target=self._rid)
        except Exception:  # noqa: BLE001 - a repr must not fail
            return f"<remote {self._meta.get('type', 'object')}>"

    def __str__(self):
        try:
            return self._chan.request("str", target=self._rid)
        except Exception:  # noqa: BLE001
            return repr(self)

    def __format__(self, spec):
        return self._chan.request("format", target=self._rid, spec=spec)

    def __hash__(self):
        return hash((id(self._chan), self._rid))

    def __enter__(self):
        return self._chan.request("callmethod", target=self._rid, name="__enter__",
                                  args=self._chan.encode([]), kwargs=self._chan.encode({}))

    def __exit__(self, *exc):
        return self._chan.request("callmethod", target=self._rid, name="__exit__",
                                  args=self._chan.encode([None, None, None]),
                                  kwargs=self._chan.encode({}))

    def __reduce__(self):
        raise TypeError("a remote object cannot be pickled")

    def _verdict(self, what: str) -> None:
        if self._chan.trusted:
            raise TypeError(f"{what} of an object of the answer's own type cannot decide a "
                            "grade: return a tensor, a number, a string, a list or a dict")

    def _binary(self, name, other, reflected=False, verdict=False):
        if verdict:
            self._verdict("a comparison")
        return self._chan.request("binop", target=self._rid, name=name,
                                  other=self._chan.encode(other), reflected=reflected)

    def _unary(self, name):
        return self._chan.request("unop", target=self._rid, name=name)


def _make_operators(klass: type) -> None:
    for name in _BINARY:
        if name in ("eq", "ne", "lt", "le", "gt", "ge"):
            setattr(klass, f"__{name}__",
                    lambda self, other, _n=name: self._binary(_n, other, verdict=True))
            continue
        setattr(klass, f"__{name}__", lambda self, other, _n=name: self._binary(_n, other))
        setattr(klass, f"__r{name}__",
                lambda self, other, _n=name: self._binary(_n, other, reflected=True))
    for name in _UNARY:
        setattr(klass, f"__{name}__", lambda self, _n=name: self._unary(_n))


_make_operators(Remote)


class RemoteTensor(Remote):
    """A tensor in the other process, read as an attribute (``layer.weight``).

    Methods run on the owner's tensor (``copy_`` changes it); torch functions and Python
    operators fetch its value and compute here.
    """

    __slots__ = ()

    def value(self) -> torch.Tensor:
        """The tensor's current value, copied here."""
        return self._chan.request("value", target=self._rid)

    @property
    def __class__(self):  # noqa: D105 - safe: torch dispatches to __torch_function__ first
        return torch.Tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Replace every remote tensor by its value, then call ``func`` here."""
        return func(*_materialise(args), **_materialise(kwargs or {}))

    def __array__(self, dtype=None, copy=None):
        array = self.value().numpy()
        return array if dtype is None else array.astype(dtype)

    def __format__(self, spec):
        return format(self.value(), spec)

    def __bool__(self):
        return bool(self.value())

    def __float__(self):
        return float(self.value())

    def __int__(self):
        return int(self.value())

    def __index__(self):
        return operator.index(self.value())

    def __getitem__(self, key):
        return self.value()[key]

    def __iter__(self):
        return iter(self.value())

    def __len__(self):
        return len(self.value())

    def _binary(self, name, other, reflected=False, verdict=False):
        mine, theirs = self.value(), _materialise(other)
        function = _BINARY[name]
        return function(theirs, mine) if reflected else function(mine, theirs)

    def _unary(self, name):
        return _UNARY[name](self.value())

    def _inplace(self, method, other):
        self._chan.request("callmethod", target=self._rid, name=method,
                           args=self._chan.encode([_materialise(other)]),
                           kwargs=self._chan.encode({}))
        return self

    def __iadd__(self, other):
        return self._inplace("add_", other)

    def __isub__(self, other):
        return self._inplace("sub_", other)

    def __imul__(self, other):
        return self._inplace("mul_", other)

    def __itruediv__(self, other):
        return self._inplace("div_", other)


_make_operators(RemoteTensor)


class _MethodOf:
    """What the owner sends for ``obj.name`` when it is a method of ``obj``'s class."""

    __slots__ = ("rid", "name")

    def __init__(self, rid: int, name: str):
        self.rid, self.name = rid, name


class RemoteMethod:
    """A method of an object in the other process: one message per call."""

    __slots__ = ("_chan", "_rid", "_name", "__weakref__")

    def __init__(self, chan: Channel, rid: int, name: str):
        self._chan, self._rid, self._name = chan, rid, name

    def __call__(self, *args, **kwargs):
        return self._chan.request("callmethod", target=self._rid, name=self._name,
                                  args=self._chan.encode(list(args)),
                                  kwargs=self._chan.encode(kwargs))

    @property
    def __signature__(self):  # noqa: D105 - inspect.signature() reads it
        return _signature(self._chan, self._rid, self._name)

    def __repr__(self):
        return f"<remote method {self._name}>"


def _signature(chan: Channel, rid: int, name: str | None):
    """The remote callable's signature (its parameters' names, kinds and defaults' presence)."""
    import inspect

    described = chan.request("signature", target=rid, name=name)
    if described is None:
        raise ValueError("no signature found for the remote callable")
    parameters = []
    for item in described:
        pname, kind, has_default = item
        parameters.append(inspect.Parameter(
            str(pname), inspect._ParameterKind(int(kind)),
            default=None if has_default else inspect.Parameter.empty))
    return inspect.Signature(parameters)


def _materialise(value):
    if isinstance(value, RemoteTensor):
        return value.value()
    if type(value) in (list, tuple):
        return type(value)(_materialise(item) for item in value)
    if type(value) is dict:
        return {key: _materialise(item) for key, item in value.items()}
    return value


def _exception(type_name: str, message: str) -> BaseException:
    klass = getattr(builtins, type_name, None)
    if isinstance(klass, type) and issubclass(klass, BaseException) and not issubclass(
            klass, (SystemExit, KeyboardInterrupt, GeneratorExit)):
        try:
            return klass(message) if message else klass()
        except Exception:  # noqa: BLE001 - an odd constructor
            pass
    return RemoteError(type_name, message)


class Channel:
    """One end of a conversation with another process (see the module docstring).

    Args:
        sock: a connected stream socket.
        trusted: this end is the grader's: the other end may not read or write dunder
            attributes of its objects, and the tracebacks of its errors are not sent.
        handlers: extra operations this end answers, ``{name: function(message) -> value}``.
        timeout: seconds to wait for any one message (``None``: forever).
        deadline: a ``time.monotonic()`` after which waiting raises ``TimeoutError``.
    """

    def __init__(self, sock: socket.socket, *, trusted: bool,
                 handlers: dict[str, Callable] | None = None, timeout: float | None = None,
                 deadline: float | None = None):
        self.sock = sock
        self.trusted = trusted
        self.handlers = dict(handlers or {})
        self.timeout = timeout
        self.deadline = deadline
        self.broken: BaseException | None = None
        self.notices: list[dict] = []
        self.pending_notices: list[dict] = []
        self._exports: dict[int, object] = {}
        self._export_ids: dict[int, int] = {}
        self._proxies: dict[int, Remote] = {}
        self._methods: dict[tuple[int, str], RemoteMethod] = {}
        self._rng: bytes | None = None  # the RNG state both ends last agreed on
        self._counter = itertools.count(1)
        self._ids = itertools.count(1)
        self._buffer = bytearray()

    # ------------------------------------------------------------------ framing
    def _send(self, message: dict) -> None:
        if self.pending_notices:
            message["notices"] = self.pending_notices
            self.pending_notices = []
        data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        if len(data) > MAX_MESSAGE:
            raise ProtocolError(f"a message of {len(data)} bytes is over the limit of "
                                f"{MAX_MESSAGE}")
        if self.broken is not None:
            raise self.broken
        try:
            self.sock.sendall(struct.pack(">I", len(data)) + data)
        except OSError as error:
            self.broken = ChannelClosed(f"the other process is gone ({error})")
            raise self.broken from None

    def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            try:
                chunk = self.sock.recv(max(65536, count - len(self._buffer)))
            except TimeoutError:
                raise
            except OSError as error:
                raise ChannelClosed(f"the other process is gone ({error})") from None
            if not chunk:
                raise ChannelClosed("the other process closed the connection")
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def _receive(self) -> dict:
        if self.broken is not None:
            raise self.broken
        try:
            return self._receive_one()
        except (ChannelClosed, TimeoutError, ProtocolError) as error:
            self.broken = error
            raise

    def _receive_one(self) -> dict:
        timeout = self.timeout
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the time for this exercise is up")
            timeout = left if timeout is None else min(timeout, left)
        self.sock.settimeout(timeout)
        (size,) = struct.unpack(">I", self._read(4))
        if size > MAX_MESSAGE:
            raise ProtocolError(f"the other process announced a message of {size} bytes")
        try:
            message = json.loads(self._read(size))
        except (ValueError, UnicodeDecodeError) as error:
            raise ProtocolError(f"not a message: {error}") from None
        if not isinstance(message, dict):
            raise ProtocolError("not a message")
        notices = message.pop("notices", None)
        if isinstance(notices, list):
            self.notices += [notice for notice in notices if isinstance(notice, dict)][:100]
        return message

    # ------------------------------------------------------------------ state
    def _state(self) -> dict:
        state = {"grad": torch.is_grad_enabled(),
                 "dtype": str(torch.get_default_dtype()).removeprefix("torch.")}
        rng = torch.random.get_rng_state().numpy().tobytes()
        if rng != self._rng:  # the RNG travels only when it moved since the last message
            state["rng"] = base64.b64encode(rng).decode()
            self._rng = rng
        return state

    def _adopt(self, state) -> None:
        if not isinstance(state, dict):
            return
        if isinstance(state.get("grad"), bool):
            torch.set_grad_enabled(state["grad"])
        dtype = _DTYPES.get(state.get("dtype"))
        if dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            torch.set_default_dtype(dtype)
        rng = state.get("rng")
        if isinstance(rng, str):
            try:
                raw = base64.b64decode(rng, validate=True)
                torch.random.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
                self._rng = raw
            except Exception:  # noqa: BLE001 - a malformed state is ignored
                pass

    # ------------------------------------------------------------------ values
    def export(self, obj) -> int:
        """The id under which the other end can refer to ``obj``."""
        key = id(obj)
        if key in self._export_ids and self._exports.get(self._export_ids[key]) is obj:
            return self._export_ids[key]
        rid = next(self._ids)
        self._exports[rid] = obj
        self._export_ids[key] = rid
        return rid

    def encode(self, value, *, tensors_by_ref: bool = False, _depth: int = 0, _count=None):
        """``value`` as JSON-ready data (see the module docstring)."""
        count = _count if _count is not None else [0]
        count[0] += 1
        if count[0] > MAX_ITEMS or _depth > MAX_DEPTH:
            raise ValueError("the value is too large or too deeply nested to send")
        if value is None or isinstance(value, bool) or type(value) is str:
            return value
        if isinstance(value, int) and type(value) in (int,):
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
        if isinstance(value, Remote) and value._chan is self:
            return {"$": "back", "id": value._rid}
        if isinstance(value, _MethodOf):
            return {"$": "method", "id": value.rid, "name": value.name}
        sub = lambda item: self.encode(item, _depth=_depth + 1, _count=count)  # noqa: E731
        if isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter):
            if tensors_by_ref:
                return self._ref(value, kind="tensor")
            if value.dtype not in _DTYPES.values() or value.layout != torch.strided:
                return self._ref(value)
            count[0] += value.numel()
            if count[0] > MAX_ITEMS:
                raise ValueError("the value is too large to send")
            return {"$": "tensor", "dtype": str(value.dtype).removeprefix("torch."),
                    "shape": list(value.shape),
                    "data": base64.b64encode(_tensor_bytes(value)).decode(),
                    "grad": bool(value.requires_grad),
                    "param": isinstance(value, torch.nn.Parameter)}
        if type(value) is torch.Size:
            return {"$": "size", "v": [int(v) for v in value]}
        if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
            return {"$": "list" if isinstance(value, list) else "tuple",
                    "v": [sub(item) for item in list.__iter__(value)] if isinstance(value, list)
                    else [sub(item) for item in tuple.__iter__(value)]}
        if isinstance(value, dict):
            return {"$": "odict" if isinstance(value, OrderedDict) else "dict",
                    "v": [[sub(key), sub(item)] for key, item in dict.items(value)]}
        if type(value) in (set, frozenset):
            return {"$": type(value).__name__, "v": [sub(item) for item in value]}
        if type(value) in (bytes, bytearray):
            return {"$": "bytes", "v": base64.b64encode(bytes(value)).decode()}
        if type(value) is complex:
            return {"$": "complex", "v": [sub(value.real), sub(value.imag)]}
        if type(value) is slice:
            return {"$": "slice", "v": [sub(value.start), sub(value.stop), sub(value.step)]}
        if value is Ellipsis:
            return {"$": "ellipsis"}
        if isinstance(value, torch.dtype):
            return {"$": "dtype", "v": str(value).removeprefix("torch.")}
        if isinstance(value, torch.device):
            return {"$": "device", "v": str(value)}
        if isinstance(value, type):
            path = f"{value.__module__}:{value.__qualname__}"
            if _is_trusted_module(value.__module__) and _resolve_class(path) is value:
                return {"$": "class", "v": path}
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy comes with torch
            numpy = None
        if numpy is not None:
            if type(value) is numpy.ndarray and value.dtype.kind in _NUMPY_KINDS:
                count[0] += value.size
                if count[0] > MAX_ITEMS:
                    raise ValueError("the value is too large to send")
                return {"$": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                        "data": base64.b64encode(numpy.ascontiguousarray(value).tobytes()).decode()}
            if isinstance(value, numpy.generic) and value.dtype.kind in _NUMPY_KINDS:
                return sub(value.item())
        if isinstance(value, int):  # an int subclass (an enum): its value
            return int(value)
        if isinstance(value, float):
            return sub(float(value))
        if isinstance(value, str):
            return str(value)
        return self._ref(value)

    def _ref(self, value, kind: str | None = None) -> dict:
        if kind is None:
            kind = "class" if isinstance(value, type) else "callable" if callable(value) \
                else "object"
        message = {"$": "ref", "id": self.export(value), "kind": kind,
                   "cls": _class_path(value)}
        if not self.trusted:  # the grader's own objects keep their names to themselves
            message["type"] = type(value).__name__[:80]
        if isinstance(value, type):
            bases = [f"{k.__module__}:{k.__qualname__}" for k in value.__mro__[1:]
                     if _is_trusted_module(getattr(k, "__module__", "") or "")]
            message["bases"] = bases[:1]
        return message

    def decode(self, data, _depth: int = 0):
        """The value that :meth:`encode` turned into ``data`` (on the other end)."""
        if _depth > MAX_DEPTH:
            raise ProtocolError("a value nested too deeply")
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if not isinstance(data, dict) or not isinstance(data.get("$"), str):
            raise ProtocolError(f"not an encoded value: {type(data).__name__}")
        tag, items = data["$"], data.get("v")
        sub = lambda item: self.decode(item, _depth + 1)  # noqa: E731
        if tag in ("list", "tuple", "set", "frozenset"):
            if not isinstance(items, list):
                raise ProtocolError(f"a {tag} without items")
            values = [sub(item) for item in items]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](values)
        if tag in ("dict", "odict"):
            if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2
                                                      for p in items):
                raise ProtocolError("a dict without pairs")
            pairs = [(sub(key), sub(value)) for key, value in items]
            return OrderedDict(pairs) if tag == "odict" else dict(pairs)
        if tag == "float":
            if items not in ("nan", "inf", "-inf"):
                raise ProtocolError("a bad float")
            return float(items)
        if tag == "size":
            return torch.Size([int(v) for v in items])
        if tag == "tensor":
            dtype = _DTYPES.get(data.get("dtype"))
            shape = data.get("shape")
            if dtype is None or not isinstance(shape, list) or not all(
                    isinstance(n, int) and n >= 0 for n in shape):
                raise ProtocolError("a bad tensor")
            raw = base64.b64decode(data.get("data", ""))
            numel = math.prod(shape)
            if numel == 0:
                tensor = torch.empty(shape, dtype=dtype)
            else:
                itemsize = torch.empty((), dtype=dtype).element_size()
                if len(raw) != numel * itemsize:
                    raise ProtocolError("a tensor whose bytes do not match its shape")
                view = torch.int16 if dtype == torch.bfloat16 else dtype
                tensor = torch.frombuffer(bytearray(raw), dtype=view).reshape(shape)
                if dtype == torch.bfloat16:
                    tensor = tensor.view(torch.bfloat16)
            if data.get("param"):
                return torch.nn.Parameter(tensor, requires_grad=bool(data.get("grad")))
            if data.get("grad") and tensor.is_floating_point():
                tensor.requires_grad_(True)
            return tensor
        if tag == "ndarray":
            import numpy

            dtype = numpy.dtype(str(data.get("dtype")))
            shape = data.get("shape")
            if dtype.kind not in _NUMPY_KINDS or not isinstance(shape, list):
                raise ProtocolError("a bad array")
            raw = base64.b64decode(data.get("data", ""))
            if len(raw) != math.prod(shape) * dtype.itemsize:
                raise ProtocolError("an array whose bytes do not match its shape")
            return numpy.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if tag == "bytes":
            return base64.b64decode(items)
        if tag == "complex":
            return complex(float(sub(items[0])), float(sub(items[1])))
        if tag == "slice":
            return slice(*(sub(item) for item in items))
        if tag == "ellipsis":
            return Ellipsis
        if tag == "dtype":
            if items not in _DTYPES:
                raise ProtocolError("a bad dtype")
            return _DTYPES[items]
        if tag == "device":
            return torch.device(str(items))
        if tag == "class":
            klass = _resolve_class(items if isinstance(items, str) else None)
            if klass is None:
                raise ProtocolError("an unknown class")
            return klass
        if tag == "method":
            rid, name = data.get("id"), data.get("name")
            if not isinstance(rid, int) or not isinstance(name, str):
                raise ProtocolError("a bad method")
            key = (rid, name)
            if key not in self._methods:
                self._methods[key] = RemoteMethod(self, rid, name)
            return self._methods[key]
        if tag == "back":
            if data.get("id") not in self._exports:
                raise ProtocolError("a reference to an unknown object")
            return self._exports[data["id"]]
        if tag == "ref":
            rid = data.get("id")
            if not isinstance(rid, int):
                raise ProtocolError("a bad reference")
            if rid not in self._proxies:
                bases = data.get("bases") if isinstance(data.get("bases"), list) else []
                meta = {"cls": data.get("cls") if isinstance(data.get("cls"), str) else None,
                        "type": str(data.get("type", "object"))[:80],
                        "kind": str(data.get("kind")),
                        "bases": [b for b in bases if isinstance(b, str)][:1]}
                klass = RemoteTensor if meta["kind"] == "tensor" else Remote
                self._proxies[rid] = klass(self, rid, meta)
            return self._proxies[rid]
        raise ProtocolError(f"an unknown kind of value {tag!r}")

    # ------------------------------------------------------------------ requests
    def request(self, op: str, **fields):
        """Ask the other end to do ``op``; serve its own requests while waiting."""
        number = next(self._counter)
        self._send({"req": number, "op": op, "state": self._state(), **fields})
        while True:
            message = self._receive()
            if "req" in message:
                self._serve_one(message)
                continue
            if message.get("re") != number:
                raise ProtocolError("an answer to a question that was not asked")
            self._adopt(message.get("state"))
            if "error" in message:
                error = message["error"] if isinstance(message["error"], dict) else {}
                raise _exception(str(error.get("type", "Exception"))[:100],
                                 str(error.get("msg", ""))[:2000])
            return self.decode(message.get("value"))

    def notify(self, notice: dict) -> None:
        """Queue ``notice`` for the other end; it travels with the next message."""
        if len(self.pending_notices) < 100:
            self.pending_notices.append(notice)

    def serve(self) -> None:
        """Answer the other end's requests until it closes the connection."""
        while True:
            try:
                message = self._receive()
            except ChannelClosed:
                return
            if "req" not in message:
                raise ProtocolError("a message that is not a question")
            if message.get("op") == "bye":
                self._send({"re": message["req"], "value": None, "state": self._state()})
                return
            self._serve_one(message)

    def _target(self, message: dict):
        rid = message.get("target")
        if rid not in self._exports:
            raise LookupError("no such object")
        return self._exports[rid]

    def _check_name(self, name) -> str:
        if not isinstance(name, str):
            raise TypeError("an attribute name is a str")
        if self.trusted and name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"{name} is not available here")
        return name

    def _serve_one(self, message: dict) -> None:
        number = message.get("req")
        op = message.get("op")
        try:
            self._adopt(message.get("state"))
            value, by_ref = self._perform(op, message)
            reply = {"re": number, "value": self.encode(value, tensors_by_ref=by_ref)}
        except BaseException as error:  # noqa: BLE001 - every error (sys.exit too) is an answer
            text = str(error)[:2000]
            reply = {"re": number, "error": {"type": type(error).__name__, "msg": text}}
            if not self.trusted:
                reply["error"]["tb"] = "".join(traceback.format_exception(error))[-6000:]
        reply["state"] = self._state()
        self._send(reply)

    def _perform(self, op, message):
        if op in self.handlers:
            return self.handlers[op](message), False
        decode = self.decode
        if op == "call":
            args, kwargs = decode(message.get("args")), decode(message.get("kwargs"))
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ProtocolError("bad call arguments")
            return self._target(message)(*args, **{str(k): v for k, v in kwargs.items()}), False
        if op == "callmethod":
            name = message.get("name")
            if name not in ("__enter__", "__exit__", "add_", "sub_", "mul_", "div_"):
                name = self._check_name(name)
            args, kwargs = decode(message.get("args")), decode(message.get("kwargs"))
            method = getattr(self._target(message), name)
            return method(*args, **{str(k): v for k, v in kwargs.items()}), False
        if op == "getattr":
            target, name = self._target(message), self._check_name(message.get("name"))
            value = getattr(target, name)
            if (getattr(value, "__self__", None) is target and callable(value)
                    and getattr(type(target), name, None) is not None
                    and name not in getattr(target, "__dict__", {})):
                return _MethodOf(message["target"], name), False  # a method of its class
            return value, True
        if op == "setattr":
            setattr(self._target(message), self._check_name(message.get("name")),
                    decode(message.get("value")))
            return None, False
        if op == "delattr":
            delattr(self._target(message), self._check_name(message.get("name")))
            return None, False
        if op == "getitem":
            return self._target(message)[decode(message.get("key"))], False
        if op == "setitem":
            self._target(message)[decode(message.get("key"))] = decode(message.get("value"))
            return None, False
        if op == "delitem":
            del self._target(message)[decode(message.get("key"))]
            return None, False
        if op == "len":
            return len(self._target(message)), False
        if op == "iter":
            return iter(self._target(message)), False
        if op == "next":
            return next(self._target(message)), False
        if op == "contains":
            return decode(message.get("item")) in self._target(message), False
        if op == "bool":
            return bool(self._target(message)), False
        if op == "int":
            return operator.index(self._target(message)), False
        if op == "float":
            return float(self._target(message)), False
        if op == "repr":
            return repr(self._target(message))[:5000], False
        if op == "str":
            return str(self._target(message))[:5000], False
        if op == "format":
            return format(self._target(message), str(message.get("spec", "")))[:5000], False
        if op == "signature":
            import inspect

            target = self._target(message)
            name = message.get("name")
            if name is not None:
                target = getattr(target, self._check_name(name))
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):
                return None, False
            return [[p.name, int(p.kind), p.default is not p.empty]
                    for p in signature.parameters.values()], False
        if op == "dir":
            names = dir(self._target(message))
            return [n for n in names if not (self.trusted and n.startswith("__"))], False
        if op == "value":
            target = self._target(message)
            if not isinstance(target, torch.Tensor):
                raise TypeError("not a tensor")
            return target.detach().clone(), False
        if op == "binop":
            name = message.get("name")
            if name not in _BINARY:
                raise ProtocolError("an unknown operator")
            mine, other = self._target(message), decode(message.get("other"))
            return (_BINARY[name](other, mine) if message.get("reflected")
                    else _BINARY[name](mine, other)), False
        if op == "unop":
            name = message.get("name")
            if name not in _UNARY:
                raise ProtocolError("an unknown operator")
            return _UNARY[name](self._target(message)), False
        raise ProtocolError(f"an unknown operation {op!r}")

    def close(self) -> None:
        """Close the socket."""
        try:
            self.sock.close()
        except OSError:
            pass
