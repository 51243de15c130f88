"""The wire between the grader and an answer (``attention_book.classroom.remote``, ``handover``).

The three ends run in this process, each served by a thread, over real socket pairs: the
grading end (trusted) lends nothing, serves nothing, adopts nothing and decodes under
limits; what it hands to an answer is a description that the other end builds for itself;
a subject end lends its objects through their face only. The process-level attacks (an
answer that takes over what it was handed, poisons the grader's state, floods it) are in
``test_classroom_clean.py``, where the ends are real processes.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import threading

import pytest
import torch
from torch import nn

from attention_book.classroom.handover import Describer, build, is_public
from attention_book.classroom.remote import (
    MAX_REPLY,
    Channel,
    ChannelClosed,
    Exports,
    ProtocolError,
    RemoteError,
    RemoteTensor,
    serve_all,
)
from attention_book.exercises.ch16 import _BROKEN, _HEALTHY
from attention_book.serving import OutOfBlocksError, PagedKVCache


class Liar:
    def __eq__(self, other):
        return True

    def __bool__(self):
        return True

    def __sub__(self, other):
        return torch.zeros(3)

    __rsub__ = __sub__


def _builder(exports: Exports):
    def made(tag, data, sub, ctx):
        obj = build(tag, data, sub, ctx)
        exports.grader_built.add(id(obj))
        return obj

    return made


def answer_side(names: dict):
    """A trusted grader end and an answer end that serves ``names`` and builds descriptions."""
    trusted_sock, answer_sock = socket.socketpair()
    exports = Exports()
    answer = Channel(answer_sock, trusted=False, exports=exports, builder=_builder(exports))

    def made(message):
        return answer.decode(message["description"])

    def peer(message):
        other = Channel(socket.socket(fileno=answer.received_fds.pop(0)), trusted=False,
                        exports=exports)
        answer.peer, other.peer = other, answer

    answer.handlers.update({"get": lambda m: names[m["name"]], "build": made, "peer": peer})
    threading.Thread(target=answer.serve, daemon=True).start()
    grader = Channel(trusted_sock, trusted=True, timeout=20)
    return grader, lambda name: grader.request("get", name=name)


def subject_side(grader_to_answer: Channel):
    """A subject end linked to the grader and to the answer end, as the grader links them."""
    grader_sock, subject_sock = socket.socketpair()
    exports = Exports()
    subject = Channel(subject_sock, trusted=False, strict=True, exports=exports,
                      builder=_builder(exports))
    channels = [subject]

    def made(message):
        return subject.decode(message["description"])

    def peer(message):
        other = Channel(socket.socket(fileno=subject.received_fds.pop(0)), trusted=False,
                        strict=True, exports=exports)
        subject.peer, other.peer = other, subject
        channels.append(other)

    subject.handlers.update({"build": made, "peer": peer})
    threading.Thread(target=serve_all, args=(channels,), daemon=True).start()
    grader = Channel(grader_sock, trusted=True, timeout=20)
    mine, theirs = socket.socketpair()
    grader.request("peer", fds=[theirs.fileno()])
    grader_to_answer.request("peer", fds=[mine.fileno()])
    mine.close()
    theirs.close()
    grader.peer, grader_to_answer.peer = grader_to_answer, grader
    return grader


def lend(grader: Channel, subject: Channel, value):
    """Hand ``value`` to the answer as a subject: built in the subject process."""
    return subject.request("build", description=Describer(grader).describe(value))


# --------------------------------------------------------------------------- values


def test_values_travel_by_value_and_keep_their_types():
    values = [None, True, 3, 2.5, float("inf"), "text", b"\x00\x01", 1 + 2j, [1, (2, 3)],
              {"a": {1, 2}}, slice(1, None, 2), torch.Size([2, 3]), torch.float64,
              torch.device("cpu"), torch.arange(6.0).view(2, 3), torch.tensor([True, False]),
              torch.ones(2, dtype=torch.bfloat16), torch.empty(0, 4)]
    _, get = answer_side({"echo": lambda v: v})
    echo = get("echo")
    for value in values:
        back = echo(value)
        if isinstance(value, torch.Tensor):
            assert type(back) is torch.Tensor and back.dtype == value.dtype
            assert back.shape == value.shape and torch.equal(back, value)
        else:
            assert back == value and type(back) is type(value), value


def test_the_answers_objects_travel_by_reference_and_give_back_data():
    class Doubler(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x) * 2

    _, get = answer_side({"Doubler": Doubler})
    layer_class = get("Doubler")
    assert isinstance(layer_class, type) and issubclass(layer_class, nn.Module)
    layer = layer_class()
    assert isinstance(layer, nn.Module) and not isinstance(layer, nn.Linear)
    with torch.no_grad():  # an attribute tensor is a reference: copy_ changes the answer's
        layer.linear.weight.copy_(torch.ones(2, 3))
        layer.linear.bias.zero_()
    assert isinstance(layer.linear.weight, RemoteTensor)
    x = torch.randn(4, 3)
    assert torch.allclose(layer(x), x.sum(-1, keepdim=True).expand(4, 2) * 2)
    assert layer.eval() is layer and layer.training is False


# --------------------------------------------------------------------------- the grader lends nothing


def test_the_grader_lends_nothing_and_answers_no_question():
    grader, get = answer_side({"apply": lambda fn, x: fn(x)})
    with pytest.raises(TypeError, match="hands no function"):
        get("apply")(lambda x: x * 10, 2)  # no hook: a grader object never leaves by reference
    assert not grader.exports.objects
    # an answer that asks the grader a question (a crafted request) breaks the conversation
    trusted_sock, answer_sock = socket.socketpair()
    grader = Channel(trusted_sock, trusted=True, timeout=5)
    data = json.dumps({"req": 1, "op": "getattr", "target": 1, "name": "f_globals"}).encode()
    answer_sock.sendall(struct.pack(">I", len(data)) + data)
    with pytest.raises(ProtocolError, match="answers no question"):
        grader.request("get", name="x")
    assert grader.broken is not None


def test_forged_references_to_the_graders_objects_are_refused():
    trusted_sock, _ = socket.socketpair()
    grader = Channel(trusted_sock, trusted=True)
    for forged in ({"$": "back", "id": 1}, {"$": "ref", "at": "peer", "id": 1},
                   {"$": "global", "v": "builtins:exec"},
                   {"$": "new", "m": 1, "cls": {"$": "global", "v": "os:system"}, "state": {}},
                   {"$": "function", "m": 1, "code": "", "globals": {}}):
        with pytest.raises(ProtocolError):
            grader.decode(forged)


def test_a_proxy_never_passes_for_a_class_that_c_code_trusts():
    """A crafted reference claiming torch.Tensor must not reach torch's C code as one."""
    trusted_sock, _ = socket.socketpair()
    grader = Channel(trusted_sock, trusted=True)
    forged = grader.decode({"$": "ref", "id": 7, "kind": "object", "cls": "torch:Tensor"})
    assert not isinstance(forged, torch.Tensor)
    with pytest.raises((TypeError, RuntimeError)):
        torch.allclose(forged, torch.zeros(3))
    module = grader.decode({"$": "ref", "id": 8, "kind": "object",
                            "cls": "torch.nn.modules.module:Module"})
    assert isinstance(module, nn.Module)  # a class written in Python is safe to claim


def test_the_answer_cannot_decide_a_comparison_or_compute_on_the_trusted_side():
    _, get = answer_side({"liar": lambda *args: Liar()})
    liar = get("liar")()
    with pytest.raises(TypeError, match="cannot decide a grade"):
        assert liar == [1, 2]
    with pytest.raises(TypeError, match="cannot decide a grade"):
        bool(liar)
    with pytest.raises(TypeError, match="cannot decide a grade"):
        assert 3 in liar
    expected = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="no arithmetic"):  # it would see `expected`
        _ = liar - expected
    with pytest.raises(TypeError, match="no arithmetic"):
        _ = expected - liar
    with pytest.raises(TypeError):  # torch.as_tensor asks for items, and gets none
        torch.as_tensor(liar)


def test_a_tensor_subclass_is_not_a_tensor_on_the_trusted_side():
    class Always(torch.Tensor):
        pass

    _, get = answer_side({"make": lambda: torch.zeros(3).as_subclass(Always)})
    made = get("make")()
    assert type(made) is not torch.Tensor and not isinstance(made, torch.Tensor)
    with pytest.raises((TypeError, RuntimeError)):
        torch.allclose(made, torch.zeros(3))


def test_the_grader_decodes_under_limits_of_bytes_items_and_depth(monkeypatch):
    from attention_book.classroom import remote

    monkeypatch.setattr(remote, "MAX_REPLY_ITEMS", 20_000)  # the count, not the speed, is tested
    _, get = answer_side({"many": lambda n: [0] * n, "tensor": lambda n: torch.zeros(n)})
    assert len(get("many")(10_000)) == 10_000
    with pytest.raises(ProtocolError, match="more than 20000 values"):
        get("many")(25_000)
    _, get = answer_side({"tensor": lambda n: torch.zeros(n)})
    with pytest.raises(ProtocolError, match="more than 20000 values"):  # a tensor's elements
        get("tensor")(25_000)
    _, get = answer_side({"deep": lambda n: functools.reduce(lambda inner, _: [inner],
                                                              range(n), 0)})
    assert get("deep")(10)
    with pytest.raises(ProtocolError, match="nested too deeply"):
        get("deep")(30)
    trusted_sock, answer_sock = socket.socketpair()
    grader = Channel(trusted_sock, trusted=True, timeout=5)
    answer_sock.sendall(struct.pack(">I", MAX_REPLY + 1))  # announced, never read
    with pytest.raises(ProtocolError, match="announced a message"):
        grader.request("get", name="x")


def test_state_travels_one_way_from_the_grader():
    def draw_and_poison():
        drawn = torch.rand(2), torch.is_grad_enabled(), torch.get_default_dtype()
        torch.set_default_dtype(torch.float16)
        torch.set_grad_enabled(False)
        torch.manual_seed(123)
        return drawn

    grader, get = answer_side({"draw": draw_and_poison})
    # in this test both ends share one interpreter, so keep the grader's state to compare
    torch.manual_seed(3)
    here = torch.rand(2)
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    message = grader._state()
    assert message["grad"] is True and message["dtype"] == "float32" and "rng" in message
    assert "rng" not in grader._state()  # sent when it moved: calls in a row draw on
    grader._adopt({"grad": False, "dtype": "float16", "rng": message["rng"]})
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert torch.equal(torch.random.get_rng_state(), before)
    there, grad, dtype = get("draw")()
    try:
        assert torch.equal(here, there) and grad is True and dtype == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)


def test_errors_come_back_as_builtin_exceptions_or_remote_errors():
    class Custom(Exception):
        pass

    def fail(kind):
        raise {"value": ValueError("bad size (3)"), "custom": Custom("no"),
               "stop": StopIteration(), "exit": SystemExit(2),
               "pool": OutOfBlocksError("no free block")}[kind]

    _, get = answer_side({"fail": fail})
    with pytest.raises(ValueError, match=r"bad size \(3\)"):
        get("fail")("value")
    with pytest.raises(RemoteError, match="Custom: no"):
        get("fail")("custom")
    with pytest.raises(StopIteration):
        get("fail")("stop")
    with pytest.raises(RemoteError, match="SystemExit"):  # sys.exit() ends nothing
        get("fail")("exit")
    with pytest.raises(OutOfBlocksError):  # a public exception of the book keeps its class
        get("fail")("pool")


def test_a_closed_or_babbling_peer_breaks_the_channel_for_good():
    trusted_sock, answer_sock = socket.socketpair()
    grader = Channel(trusted_sock, trusted=True, timeout=5)
    answer_sock.sendall(b"\x00\x00\x00\x05hello")
    with pytest.raises(Exception, match="not a message"):
        grader.request("get", name="x")
    assert grader.broken is not None
    with pytest.raises(type(grader.broken)):
        grader.request("get", name="x")
    other, peer = socket.socketpair()
    peer.close()
    with pytest.raises(ChannelClosed):
        Channel(other, trusted=True, timeout=5).request("get", name="x")


def test_a_silent_peer_times_out():
    trusted_sock, _answer_sock = socket.socketpair()
    with pytest.raises(TimeoutError):
        Channel(trusted_sock, trusted=True, timeout=0.2).request("get", name="x")


def test_a_remote_callable_has_its_own_signature():
    import inspect

    def attend(x, mask=None, *, scale=1.0):
        return x

    _, get = answer_side({"Linear": nn.Linear, "attend": attend})
    assert list(inspect.signature(get("attend")).parameters) == ["x", "mask", "scale"]
    layer = get("Linear")(2, 2)
    assert list(inspect.signature(layer.forward).parameters) == ["input"]  # a method: no self
    assert inspect.signature(get("attend")).parameters["mask"].default is not \
        inspect.Parameter.empty


# --------------------------------------------------------------------------- descriptions


def test_a_public_object_is_described_and_built_as_a_real_object_on_the_other_side():
    from attention_book.modules import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(4, 4, 2, qkv_bias=True)
    grader, get = answer_side({"kind": lambda m: (type(m).__module__, type(m).__name__),
                               "load": lambda m: m.W_query.weight.data.fill_(1.0)})
    description = Describer(grader).describe(mha)
    assert is_public(description) and "exercises" not in json.dumps(description)
    grader.hand_over = lambda value: Describer(grader).describe(value)  # as clean.py does
    assert get("kind")(mha) == ("attention_book.modules", "MultiHeadAttention")
    copy = grader.request("build", description=description)  # hand_over: a handle to a copy
    get("load")(copy)
    assert torch.equal(copy.W_query.weight.detach(), torch.ones(4, 4))
    assert not torch.equal(mha.W_query.weight, torch.ones(4, 4))  # the grader's own is intact
    x = torch.randn(1, 3, 4)
    assert copy(x).shape == (1, 3, 4)


def test_a_test_double_of_a_hidden_test_is_described_with_its_code():
    source = (
        "from attention_book.serving import PagedKVCache as _Base\n"
        "class _ForkWithoutCounts(_Base):\n"
        "    def fork(self, parent_id, child_id):\n"
        "        super().fork(parent_id, child_id)\n"
        "        return 'forked'\n"
        "_scale = 3\n"
        "def _make(*sizes, factor=2):\n"
        "    return _ForkWithoutCounts(*sizes), _scale * factor\n")
    namespace = {"__name__": "__grading__"}
    exec(compile(source, "<hidden tests>", "exec"), namespace)  # noqa: S102 - a test's own code
    grader, _ = answer_side({})
    description = Describer(grader).describe(namespace["_make"])
    assert not is_public(description)  # code ships: it is built in a subject process
    trusted_sock, built_sock = socket.socketpair()
    make = Channel(built_sock, trusted=False, builder=build).decode(description)
    cache, scaled = make(8, 2, 1, 2)
    assert scaled == 6 and type(cache).__name__ == "_ForkWithoutCounts"
    cache.add_sequence("a")
    assert cache.fork("a", "b") == "forked" and cache.length("b") == 0


# --------------------------------------------------------------------------- subjects


@pytest.fixture(scope="module")
def subjects():
    grader, get = answer_side({
        "probe": lambda thing: [repr(thing), str(thing), f"{thing}", dir(thing)],
        "make": lambda make_cache: make_cache(8, 2, 1, 2),
        "use": lambda cache: cache.gather("a"),
        "peek": lambda thing, name: getattr(thing, name),
        "poke": lambda thing, name, value: setattr(thing, name, value),
        "call": lambda thing, *args: thing(*args)})
    subject = subject_side(grader)
    return grader, get, subject


def test_a_subject_shows_its_face_only(subjects):
    grader, get, subject = subjects
    names = {cls.__name__ for cls in [*_HEALTHY.values(), *_BROKEN.values()]} - {"PagedKVCache"}
    texts = []
    for cls in [*_HEALTHY.values(), *_BROKEN.values()]:
        make_cache = lend(grader, subject, cls)
        texts.append(json.dumps(get("probe")(make_cache)))
        cache = get("make")(make_cache)
        texts.append(json.dumps(get("probe")(cache)))
        assert isinstance(cache, PagedKVCache)  # the face of every cache is the book's class
    assert len(set(texts[::2])) == 1 and len(set(texts[1::2])) == 1  # all look the same
    leaks = [name for name in names if any(name in text for text in texts)]
    assert not leaks and "exercises" not in "".join(texts)


def test_a_subject_refuses_what_leads_inside_it(subjects):
    grader, get, subject = subjects
    make_cache = lend(grader, subject, _BROKEN[next(iter(_BROKEN))])
    cache = get("make")(make_cache)
    for thing, name in ((make_cache, "mro"), (make_cache, "fork"), (make_cache, "__dict__"),
                        (cache, "_tables"), (cache, "_copy_block"), (cache, "__dict__")):
        with pytest.raises(AttributeError):
            get("peek")(thing, name)
    assert get("peek")(cache, "__class__") is PagedKVCache  # its face, nothing more
    with pytest.raises(AttributeError):
        get("poke")(make_cache, "append", None)  # a class is not changed
    # a method is a handle to call, nothing more: no code, no frame, no globals
    method = get("peek")(cache, "gather")
    for name in ("__func__", "__self__", "__globals__", "__code__"):
        with pytest.raises(AttributeError):
            get("peek")(method, name)
    # a subject's error names no private code
    with pytest.raises(Exception) as caught:
        cache.fork("nobody", "b")
    assert "fork" not in str(caught.value) or "_" not in str(caught.value)
    assert not any(name in str(caught.value) for name in ("Blank", "exercises", "ch16"))


def test_a_subject_keeps_the_books_exceptions_and_its_results_are_data(subjects):
    grader, get, subject = subjects
    make_cache = lend(grader, subject, PagedKVCache)
    cache = get("make")(make_cache)
    cache.add_sequence("a")
    keys = torch.arange(8.0).view(1, 4, 2)
    cache.append("a", keys, -keys)
    got_keys, got_values = get("use")(cache)
    assert type(got_keys) is torch.Tensor and torch.equal(got_keys, keys)
    with pytest.raises(OutOfBlocksError):
        cache.append("a", torch.zeros(1, 20, 2), torch.zeros(1, 20, 2))
    assert cache.blocks_in_use == 2


def test_a_closure_subject_is_built_from_its_code_and_lent_as_a_function(subjects):
    from attention_book.exercises.ch05 import _LAYERS

    grader, get, subject = subjects
    layer = lend(grader, subject, _LAYERS[2][1])  # a closure over a checker's tensors
    x = torch.randn(1, 4, 4)
    assert torch.allclose(get("call")(layer, x), _LAYERS[2][1](x))
    assert get("probe")(layer)[:3] == ["<function>"] * 3
    with pytest.raises(AttributeError):
        get("peek")(layer, "__closure__")


def test_a_subject_class_and_a_subject_function_are_one_kind():
    """Trial v4 D9: a broken cache handed over as a class and a healthy one made by a function
    look alike to the answer: neither is a class, both are called the same way."""
    def view(thing):  # what the answer's process sees of a lent subject
        return [isinstance(thing, type), callable(thing), type(thing).__name__,
                str(thing.__class__), repr(thing), isinstance(thing(8, 2, 1, 2), PagedKVCache)]

    grader, get = answer_side({"view": view})
    subject = subject_side(grader)
    from_class = lend(grader, subject, _BROKEN[next(iter(_BROKEN))])
    from_function = lend(grader, subject, functools.partial(PagedKVCache))
    assert get("view")(from_class) == get("view")(from_function)
    assert get("view")(from_class)[:2] == [False, True]
    assert get("view")(from_class)[-1] is True


def test_the_grader_takes_no_descriptors():
    """Trial v4 D10: descriptors sent with a reply are dropped by the kernel on the grader's
    side (it reads with plain recv); only an answer's or subject's end takes one (its peer)."""
    import os

    ours, theirs = socket.socketpair()
    grader = Channel(ours, trusted=True, timeout=20)
    before = len(os.listdir("/proc/self/fd"))
    pipes = [os.pipe() for _ in range(4)]
    payload = json.dumps({"re": 0, "value": None}).encode()
    frame = struct.pack(">I", len(payload)) + payload
    socket.send_fds(theirs, [frame[:1]], [fd for pair in pipes for fd in pair])
    theirs.sendall(frame[1:])
    for pair in pipes:
        for fd in pair:
            os.close(fd)
    message = grader._receive()
    assert message == {"re": 0, "value": None}
    assert grader.received_fds == []
    assert len(os.listdir("/proc/self/fd")) == before  # none of the eight arrived here
    ours.close()
    theirs.close()
