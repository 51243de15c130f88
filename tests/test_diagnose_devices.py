"""``diagnose`` and the bug zoo follow the device and dtype of what they test.

A healthy ``MultiHeadAttention`` moved to CUDA used to be reported broken
(``failed == ['returns_output']``): diagnose built its probes on the CPU. These tests
need no GPU. They check that

* healthy layers pass and every zoo bug fails exactly its own check in float64,
  float16 and bfloat16 (float32 is ``test_diagnose.py``);
* every tensor a subject receives has the subject's device and dtype, whatever
  torch's default device and dtype are (a probe built in torch's default place is
  exactly the CUDA bug: there the default, the CPU, was not the module's device);
* the meta device, and a device or dtype the module does not have, are refused with
  clear errors;
* every zoo specimen runs on a device other than the CPU (meta) without a device error;
* a new family of checks is one registered function.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attention_book
from attention_book import bug_zoo
from attention_book.diagnose import (
    CHECKS,
    additive_mask_adapter,
    diagnose,
    torch_multihead_adapter,
)
from attention_book.diagnose import registry as diagnose_registry
from attention_book.diagnose.registry import Failed, register_check

LOW_AND_HIGH = [torch.float64, torch.float16, torch.bfloat16]


def _build(factory, dtype=None):
    torch.manual_seed(0)
    subject = factory()
    if dtype is not None and isinstance(subject, nn.Module):
        subject = subject.to(dtype)
    return subject


def _diagnose(subject, dtype):
    """A module brings its own dtype; a function is told it."""
    if isinstance(subject, nn.Module):
        return diagnose(subject)
    return diagnose(subject, dtype=dtype)


HEALTHY = {
    "book function": lambda: attention_book.scaled_dot_product_attention,
    "torch sdpa": lambda: F.scaled_dot_product_attention,
    "zoo function": lambda: bug_zoo.healthy_attention,
    "MHA naive dropout": lambda: attention_book.MultiHeadAttention(
        6, 8, 2, context_length=8, dropout=0.2),
    "MHA sdpa": lambda: attention_book.MultiHeadAttention(6, 8, 2, context_length=8,
                                                          backend="sdpa"),
    "MHA non-causal": lambda: attention_book.MultiHeadAttention(6, 8, 2, causal=False),
    "GQA naive": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 2, context_length=8),
    "GQA sdpa": lambda: attention_book.GroupedQueryAttention(6, 8, 4, 2, context_length=8,
                                                             backend="sdpa"),
    "zoo causal dropout": lambda: bug_zoo.HealthyCausalAttention(6, 8, 8, 0.5),
    "zoo multi-head": lambda: bug_zoo.HealthyMultiHeadAttention(6, 8, 8, 2),
    "MHA sink": lambda: attention_book.MultiHeadAttention(6, 8, 2, context_length=8, sink=True),
    "GQA sdpa sink": lambda: attention_book.GroupedQueryAttention(
        6, 8, 4, 2, context_length=8, backend="sdpa", sink=True),
    "MLA sink": lambda: attention_book.MultiHeadLatentAttention(6, 8, 2, 4, context_length=8,
                                                                sink=True),
    "MLA sdpa": lambda: attention_book.MultiHeadLatentAttention(6, 8, 2, 4, context_length=8,
                                                                backend="sdpa"),
}


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", LOW_AND_HIGH, ids=str)
@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_implementations_pass_in_every_dtype(name, dtype):
    report = _diagnose(_build(HEALTHY[name], dtype), dtype)
    assert report.ok, str(report)
    for check in ("returns_output", "softmax_dim", "scale", "batch", "lengths",
                  "matches_reference"):
        assert report[check].status == "pass", str(report)
    assert f"in {str(dtype).removeprefix('torch.')} on cpu" in report.subject


# Every check discriminates in bfloat16 too: each tolerance sits about 3x above the
# rounding of the healthy layers and 3x below the smallest effect of a zoo bug.
@pytest.mark.parametrize("dtype", LOW_AND_HIGH, ids=str)
@pytest.mark.parametrize("name", list(bug_zoo.BUGS))
def test_each_bug_fails_exactly_its_check_in_every_dtype(name, dtype):
    bug = bug_zoo.BUGS[name]
    report = _diagnose(_build(bug.build, dtype), dtype)
    assert report.failed == [bug.check], str(report)


def test_the_float64_tolerances_are_tighter_than_float32():
    """A scale error of 1e-5 is rounding in float32 and bfloat16 and a real error in float64."""
    def almost(query, key, value, mask=None):
        return F.scaled_dot_product_attention(query, key, value, mask,
                                              scale=(1 + 1e-5) / query.size(-1) ** 0.5)

    assert diagnose(almost).ok
    assert diagnose(almost, dtype=torch.bfloat16).ok
    assert diagnose(almost, dtype=torch.float64).failed == ["matches_reference"]


# ----------------------------------------------------------------------------- placement


def _recording(subject, seen):
    """``subject`` wrapped so that every tensor it receives is noted in ``seen``."""
    def note(values):
        seen.extend((v.device, v.dtype) for v in values if isinstance(v, torch.Tensor))

    if isinstance(subject, nn.Module):
        subject.register_forward_pre_hook(
            lambda module, args, kwargs: note([*args, *kwargs.values()]), with_kwargs=True)
        return subject

    @functools.wraps(subject)
    def recorded(*args, **kwargs):
        note([*args, *kwargs.values()])
        return subject(*args, **kwargs)

    return recorded


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["book function", "MHA naive dropout", "GQA sdpa"])
def test_every_probe_has_the_subjects_device_and_dtype(name, dtype):
    seen = []
    report = _diagnose(_recording(_build(HEALTHY[name], dtype), seen), dtype)
    assert report.ok, str(report)
    assert len(seen) > 50
    assert {device.type for device, _ in seen} == {"cpu"}
    assert {d for _, d in seen} <= {dtype, torch.bool}
    assert dtype in {d for _, d in seen}


@pytest.mark.parametrize("name", ["book function", "torch sdpa", "MHA naive dropout",
                                  "GQA sdpa", "zoo causal dropout"])
def test_probes_ignore_torchs_default_device(name):
    """The H100 bug, turned around so that it shows without a GPU.

    On the H100 the probes were built on torch's default device (the CPU) for a module
    on CUDA, and the module raised: ``failed == ['returns_output']``. Here the module
    stays on the CPU and torch's default device becomes ``meta``: a probe built without
    naming the subject's device lands on meta, the module raises (or the output has no
    values), and the report changes. It must be identical instead.
    """
    expected = str(_diagnose(_build(HEALTHY[name]), torch.float32))
    subject = _build(HEALTHY[name])
    with torch.device("meta"):
        report = _diagnose(subject, torch.float32)
    assert str(report) == expected


@pytest.mark.parametrize("name", ["book function", "MHA naive dropout", "zoo multi-head"])
def test_probes_ignore_torchs_default_dtype(name):
    """A probe built in torch's default dtype (here float64) would break a float32 module."""
    expected = str(_diagnose(_build(HEALTHY[name]), torch.float32))
    subject = _build(HEALTHY[name])
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        report = _diagnose(subject, torch.float32)
    finally:
        torch.set_default_dtype(default)
    assert str(report) == expected


def test_the_meta_device_is_refused_clearly():
    layer = _build(HEALTHY["MHA sdpa"]).to("meta")
    with pytest.raises(ValueError, match="MultiHeadAttention on the meta device"):
        diagnose(layer)
    with pytest.raises(ValueError, match="a function on the meta device"):
        diagnose(attention_book.scaled_dot_product_attention, device="meta")


def test_a_device_or_dtype_the_module_lacks_is_refused():
    layer = _build(HEALTHY["MHA sdpa"])
    with pytest.raises(ValueError, match=r"device=meta but the parameters of .* are on cpu"):
        diagnose(layer, device="meta")
    with pytest.raises(ValueError, match=r"dtype=torch.float64 but .* are torch.float32"):
        diagnose(layer, dtype=torch.float64)
    assert diagnose(layer, device="cpu", dtype=torch.float32).ok


def test_bad_device_and_dtype_arguments_raise_clear_errors():
    fn = attention_book.scaled_dot_product_attention
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        diagnose(fn, dtype="float32")
    with pytest.raises(ValueError, match="floating dtypes .* got torch.int64"):
        diagnose(fn, dtype=torch.int64)
    with pytest.raises(TypeError, match="device must be a torch.device"):
        diagnose(fn, device=1.5)
    with pytest.raises(ValueError, match="not a device torch knows"):
        diagnose(fn, device="no-such-device")
    float8 = _build(HEALTHY["MHA sdpa"]).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="the parameters of MultiHeadAttention are torch.float8"):
        diagnose(float8)


def test_a_functions_report_names_its_dtype_only_off_the_default():
    assert diagnose(bug_zoo.healthy_attention).subject.endswith("-> output")
    report = diagnose(bug_zoo.healthy_attention, device=torch.device("cpu"), dtype=torch.float64)
    assert report.subject.endswith("-> output in float64 on cpu")


# ----------------------------------------------------------------------------- the zoo off the CPU


ZOO_FUNCTIONS = [getattr(bug_zoo, name) for name in bug_zoo.__all__
                 if name.startswith(("attention_", "healthy_"))]
ZOO_MODULES = {
    "HealthyCausalAttention": lambda: bug_zoo.HealthyCausalAttention(6, 8, 8, 0.5),
    "CausalShortMaskBuffer": lambda: bug_zoo.CausalShortMaskBuffer(6, 8, 8),
    "CausalDropoutBeforeSoftmax": lambda: bug_zoo.CausalDropoutBeforeSoftmax(6, 8, 8, 0.5),
    "CausalDropoutInEval": lambda: bug_zoo.CausalDropoutInEval(6, 8, 8, 0.5),
    "HealthyMultiHeadAttention": lambda: bug_zoo.HealthyMultiHeadAttention(6, 8, 8, 2),
    "MultiHeadScaledByWidth": lambda: bug_zoo.MultiHeadScaledByWidth(6, 8, 8, 2),
    "MultiHeadViewSplit": lambda: bug_zoo.MultiHeadViewSplit(6, 8, 8, 2),
    "torch_multihead_adapter": lambda: torch_multihead_adapter(
        nn.MultiheadAttention(8, 2, batch_first=True), causal=True),
}


@pytest.mark.parametrize("fn", ZOO_FUNCTIONS + [additive_mask_adapter(F.scaled_dot_product_attention)],
                         ids=lambda fn: fn.__name__)
def test_zoo_functions_run_off_the_cpu(fn):
    """On ``meta`` a CPU constant inside the code (a mask) raises a device error."""
    query, key, value = torch.randn(3, 2, 5, 8, device="meta", dtype=torch.bfloat16).unbind(0)
    mask = torch.ones(5, 5, dtype=torch.bool, device="meta")
    result = fn(query, key, value, mask)
    output = result[0] if isinstance(result, tuple) else result
    assert output.device.type == "meta" and output.shape == (2, 5, 8)
    assert output.dtype == torch.bfloat16 and type(output) is torch.Tensor


@pytest.mark.parametrize("name", list(ZOO_MODULES))
def test_zoo_modules_run_off_the_cpu(name):
    layer = _build(ZOO_MODULES[name]).to(device="meta", dtype=torch.bfloat16).eval()
    x = torch.randn(2, 5, layer.d_in, device="meta", dtype=torch.bfloat16)
    output = layer(x)
    assert output.device.type == "meta" and output.shape == (2, 5, 8)
    assert output.dtype == torch.bfloat16


def test_the_outer_mask_stays_the_examples_mask():
    """EXAMPLE_MASK follows the device of the scores, and is still the 5-token causal mask."""
    assert torch.equal(bug_zoo.EXAMPLE_MASK, attention_book.causal_mask(5))
    scores = torch.zeros(5, 5, device="meta")
    assert scores.masked_fill(~bug_zoo.EXAMPLE_MASK, 1.0).device.type == "meta"


# ----------------------------------------------------------------------------- a new family


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry, restored after the test (a test may register checks)."""
    monkeypatch.setattr(diagnose_registry, "_REGISTRY", dict(diagnose_registry._REGISTRY))
    saved = dict(CHECKS)
    yield
    CHECKS.clear()
    CHECKS.update(saved)


def test_a_new_family_is_one_registered_function(scratch_registry):
    seen = {}

    @register_check("toy_positions", property="a toy property", hint="a toy hint",
                    order=1700, needs=("returns_output",))
    def check_toy(ctx):
        inputs, out, _ = ctx.standard()
        seen["device"], seen["dtype"] = out.device, out.dtype
        raise Failed(f"toy evidence on {ctx.device} in {ctx.dtype}")

    assert list(CHECKS)[-2:] == ["toy_positions", "matches_reference"]
    report = diagnose(bug_zoo.healthy_attention, dtype=torch.float64)
    assert report.failed == ["toy_positions"]
    assert report["toy_positions"].evidence == "toy evidence on cpu in torch.float64"
    assert report["toy_positions"].hint == "a toy hint"
    assert seen == {"device": torch.device("cpu"), "dtype": torch.float64}
    # The catch-all now waits for the new check as well.
    assert report["matches_reference"].evidence == "not judged: fix toy_positions first"
    # A check whose needs fail is not judged.
    assert diagnose(bug_zoo.attention_returns_value)["toy_positions"].status == "n/a"


def test_the_registry_refuses_an_unsound_order(scratch_registry):
    with pytest.raises(ValueError, match="already registered"):
        register_check("scale", property="p", hint="h", order=1501)(lambda ctx: "")
    with pytest.raises(ValueError, match="order 500 is taken by 'scale'"):
        register_check("toy", property="p", hint="h", order=500)(lambda ctx: "")
    register_check("toy_early", property="p", hint="h", order=50, needs=("scale",))(
        lambda ctx: "")
    with pytest.raises(RuntimeError, match="'toy_early' needs 'scale'"):
        diagnose(bug_zoo.healthy_attention)
