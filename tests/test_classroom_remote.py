"""The wire between the grader and an answer (``attention_book.classroom.remote``).

Both ends run in this process, one in a thread, over a real socket pair: values travel by
value, objects by reference; the trusted end never lets a proxy decide a comparison or
read its dunder attributes; the RNG state, grad mode and default dtype follow each call.
"""

from __future__ import annotations

import socket
import threading

import pytest
import torch
from torch import nn

from attention_book.classroom.remote import Channel, ChannelClosed, RemoteError, RemoteTensor


class Doubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x):
        return self.linear(x) * 2


class Liar:
    def __eq__(self, other):
        return True

    def __bool__(self):
        return True


def answer_side(names: dict):
    """A trusted grader end and an untrusted answer end that serves ``names``."""
    trusted_sock, answer_sock = socket.socketpair()
    answer = Channel(answer_sock, trusted=False, handlers={"get": lambda m: names[m["name"]]})
    thread = threading.Thread(target=answer.serve, daemon=True)
    thread.start()
    grader = Channel(trusted_sock, trusted=True, timeout=20)
    return grader, lambda name: grader.request("get", name=name)


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


def test_objects_travel_by_reference_and_calls_go_both_ways():
    _, get = answer_side({"apply": lambda fn, x: fn(x) + 1, "Doubler": Doubler})
    assert get("apply")(lambda x: x * 10, 2) == 21  # the answer calls back into the grader
    layer_class = get("Doubler")
    assert isinstance(layer_class, type) and issubclass(layer_class, nn.Module)
    layer = layer_class()
    assert isinstance(layer, nn.Module) and not isinstance(layer, nn.Linear)
    x = torch.randn(4, 3)
    with torch.no_grad():  # an attribute tensor is a reference: copy_ changes the answer's
        layer.linear.weight.copy_(torch.ones(2, 3))
        layer.linear.bias.zero_()
    assert isinstance(layer.linear.weight, RemoteTensor)
    assert torch.allclose(layer(x), x.sum(-1, keepdim=True).expand(4, 2) * 2)
    assert layer.linear.weight.shape == (2, 3) and layer.training is True
    assert layer.eval() is layer and layer.training is False


def test_the_answer_cannot_decide_a_comparison_on_the_trusted_side():
    _, get = answer_side({"liar": lambda *args: Liar()})
    liar = get("liar")()
    with pytest.raises(TypeError, match="cannot decide a grade"):
        assert liar == [1, 2]
    with pytest.raises(TypeError, match="cannot decide a grade"):
        bool(liar)
    with pytest.raises(TypeError, match="cannot decide a grade"):
        assert 3 in liar


def test_a_tensor_subclass_is_not_a_tensor_on_the_trusted_side():
    class Always(torch.Tensor):
        pass

    _, get = answer_side({"make": lambda: torch.zeros(3).as_subclass(Always)})
    made = get("make")()
    assert type(made) is not torch.Tensor
    with pytest.raises((TypeError, RuntimeError)):
        torch.allclose(made, torch.zeros(3))


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


def test_the_answer_cannot_read_the_graders_dunders():
    secret = {"expected": 42}

    def subject(x):
        """Output 1 also sees token 3."""
        return secret["expected"] + x

    grader, get = answer_side({
        "peek": lambda fn: [getattr(fn, name, "denied") for name in (
            "__globals__", "__code__", "__name__", "__closure__", "__dict__", "__defaults__")],
        "doc": lambda fn: fn.__doc__,
        "kind": lambda fn: type(fn).__name__})
    assert grader.trusted
    assert get("peek")(subject) == ["denied"] * 6
    assert "token 3" not in (get("doc")(subject) or "")
    assert get("kind")(subject) == "Remote"


def test_rng_grad_mode_and_default_dtype_follow_each_call():
    def draw():
        return torch.rand(2), torch.is_grad_enabled(), torch.get_default_dtype()

    _, get = answer_side({"draw": draw})
    remote_draw = get("draw")
    torch.manual_seed(3)
    here = torch.rand(2)
    torch.manual_seed(3)
    there, grad, dtype = remote_draw()
    assert torch.equal(here, there) and grad is True
    assert torch.equal(torch.rand(2), (torch.manual_seed(3), torch.rand(2), torch.rand(2))[2])
    with torch.no_grad():
        assert remote_draw()[1] is False
    torch.set_default_dtype(torch.float64)
    try:
        assert remote_draw()[2] == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


def test_errors_come_back_as_builtin_exceptions_or_remote_errors():
    class Custom(Exception):
        pass

    def fail(kind):
        raise {"value": ValueError("bad size (3)"), "custom": Custom("no"),
               "stop": StopIteration(), "exit": SystemExit(2)}[kind]

    _, get = answer_side({"fail": fail})
    with pytest.raises(ValueError, match=r"bad size \(3\)"):
        get("fail")("value")
    with pytest.raises(RemoteError, match="Custom: no"):
        get("fail")("custom")
    with pytest.raises(StopIteration):
        get("fail")("stop")
    with pytest.raises(RemoteError, match="SystemExit"):  # sys.exit() ends nothing
        get("fail")("exit")


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

    _, get = answer_side({"Doubler": Doubler, "attend": attend})
    assert list(inspect.signature(get("attend")).parameters) == ["x", "mask", "scale"]
    layer = get("Doubler")()
    assert list(inspect.signature(layer.forward).parameters) == ["x"]  # a method: no self
    assert inspect.signature(get("attend")).parameters["mask"].default is not \
        inspect.Parameter.empty
