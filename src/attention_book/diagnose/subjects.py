"""What is diagnosed: a function or a module, where it lives, and the probes it is fed.

A *subject* wraps the code under test behind one calling convention
(``call``) and builds its standard inputs (``inputs``). Every probe is drawn
on the CPU from a seeded generator and then moved to the subject's device and
dtype, so the same probe reaches the code on every device: a module on a GPU
gets GPU tensors, a bfloat16 module gets bfloat16 tensors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from .numerics import tolerances_for
from .outcomes import Failed


class UserError(Exception):
    """An exception raised inside the code under test."""


def describe_error(error: Exception) -> str:
    """``"TypeError: first line of the message"``, at most 200 characters."""
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    return f"{type(error).__name__}: {first}"[:200]


def unpack(result) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split a return value into (output, weights or None)."""
    weights = None
    if isinstance(result, (tuple, list)):
        if not result:
            raise Failed("returned an empty tuple")
        if len(result) > 1 and isinstance(result[1], torch.Tensor):
            weights = result[1]
        result = result[0]
    if not isinstance(result, torch.Tensor):
        raise Failed(f"returned {type(result).__name__}, not a tensor")
    return result, weights


# ----------------------------------------------------------------------------
# Probes: drawn on the CPU (the same numbers everywhere), then placed.
# ----------------------------------------------------------------------------


def cpu_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator(device="cpu").manual_seed(seed)


def draw(shape, generator: torch.Generator, device: torch.device, dtype: torch.dtype,
         uniform: bool = False) -> torch.Tensor:
    """Standard normal (or uniform) numbers of ``shape`` from ``generator``, on ``device`` in ``dtype``."""
    sample = (torch.rand if uniform else torch.randn)(
        shape, generator=generator, device="cpu", dtype=torch.float32
    )
    return sample.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------
# Where the subject lives.
# ----------------------------------------------------------------------------


def _as_device(device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, (str, int)) or isinstance(device, bool):
        raise TypeError(f"device must be a torch.device or a string such as 'cuda', "
                        f"got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device {device!r} is not a device torch knows: {error}") from None


def _as_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}")
    tolerances_for(dtype)  # raises ValueError for a dtype without tolerances
    return dtype


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _refuse_meta(device: torch.device, what: str) -> None:
    if device.type == "meta":
        raise ValueError(
            f"cannot diagnose {what} on the meta device: meta tensors have shapes but no "
            "values, and every check compares values; move it to a real device first "
            "(for a module: module.to_empty(device='cpu'), then initialise its weights)"
        )


def function_placement(device, dtype) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of a function's probes: the arguments, else CPU and float32."""
    device = torch.device("cpu") if device is None else _as_device(device)
    dtype = torch.float32 if dtype is None else _as_dtype(dtype)
    _refuse_meta(device, "a function")
    return device, dtype


def module_placement(module: nn.Module, device, dtype) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of a module's probes: those of its parameters and buffers.

    ``device`` and ``dtype``, when given, must be ones the module's tensors have
    (a module with no tensors takes any; CPU and float32 by default).
    """
    name = type(module).__name__
    tensors = [*module.parameters(), *module.buffers()]
    floating = [t for t in tensors if t.is_floating_point()]
    devices = [t.device for t in (floating or tensors)]
    dtypes = [t.dtype for t in floating]
    if device is None:
        device = devices[0] if devices else torch.device("cpu")
    else:
        device = _as_device(device)
        if devices and not any(_same_device(device, d) for d in devices):
            raise ValueError(
                f"device={device} but the parameters of {name} are on {devices[0]}: "
                f"move the module with {name}.to({str(device)!r}) or leave device out"
            )
        if device.index is None:
            device = next((d for d in devices if _same_device(device, d)), device)
    if dtype is None:
        dtype = dtypes[0] if dtypes else torch.float32
        try:
            tolerances_for(dtype)
        except ValueError as error:
            raise ValueError(f"the parameters of {name} are {dtype}: {error}") from None
    else:
        dtype = _as_dtype(dtype)
        if dtypes and dtype not in dtypes:
            raise ValueError(
                f"dtype={dtype} but the parameters of {name} are {dtypes[0]}: convert the "
                f"module with {name}.to({dtype}) or leave dtype out"
            )
    _refuse_meta(device, name)
    return device, dtype


def _placement_note(device: torch.device, dtype: torch.dtype) -> str:
    """'' on the CPU in float32 (the book's default), else ' in bfloat16 on cuda:0'."""
    if device.type == "cpu" and dtype == torch.float32:
        return ""
    return f" in {str(dtype).removeprefix('torch.')} on {device}"


# ----------------------------------------------------------------------------
# The two calling conventions.
# ----------------------------------------------------------------------------


def accepts(fn: Callable, names: tuple[str, ...], position: int) -> bool | None:
    """Whether ``fn`` has a parameter named in ``names`` or a positional one at ``position``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.name in names for p in params):
        return True
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > position


class FunctionSubject:
    """Calls ``fn(query, key, value[, mask])``."""

    kind = "function"

    def __init__(self, fn: Callable, head_dim: int, batch_size: int, num_tokens: int,
                 device: torch.device, dtype: torch.dtype):
        self.fn = fn
        self.head_dim = head_dim
        self.batch_size = batch_size
        self.num_tokens = num_tokens
        self.device, self.dtype = device, dtype
        takes_mask = accepts(fn, ("mask", "attn_mask", "attention_mask"), 3)
        # A builtin such as torch's scaled_dot_product_attention has no signature;
        # it takes the mask as its fourth positional argument.
        self.takes_mask = True if takes_mask is None else takes_mask
        self.causal = False
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def describe(self) -> str:
        return (f"{self.name}, a function (query, key, value[, mask]) -> output"
                f"{_placement_note(self.device, self.dtype)}")

    def call(self, q, k, v, mask=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        try:
            result = self.fn(q, k, v) if mask is None else self.fn(q, k, v, mask)
        except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
            raise UserError(describe_error(error)) from None
        return unpack(result)

    def inputs(self, batch_size=None, num_queries=None, num_keys=None, seed=0):
        batch_size = batch_size or self.batch_size
        num_queries = num_queries or self.num_tokens
        num_keys = num_keys or num_queries
        gen = cpu_generator(seed)
        shape_q = (batch_size, num_queries, self.head_dim)
        shape_k = (batch_size, num_keys, self.head_dim)
        q = draw(shape_q, gen, self.device, self.dtype)  # (B, T_q, head_dim)
        k = draw(shape_k, gen, self.device, self.dtype)  # (B, T_k, head_dim)
        v = draw(shape_k, gen, self.device, self.dtype)  # (B, T_k, head_dim)
        return q, k, v


class ModuleSubject:
    """Calls ``module(x[, mask])`` in eval mode unless a check asks for training."""

    kind = "module"

    def __init__(self, module: nn.Module, causal, context_length, d_in, batch_size, num_tokens,
                 device: torch.device, dtype: torch.dtype):
        self.module = module
        self.name = type(module).__name__
        self.batch_size = batch_size
        self.device, self.dtype = device, dtype
        self.causal = _find_causal(module) if causal is None else bool(causal)
        self.context_length = (
            _find_attr(module, "context_length") if context_length is None else context_length
        )
        self.d_in = _find_d_in(module) if d_in is None else d_in
        if self.context_length is not None:
            num_tokens = max(2, min(num_tokens, int(self.context_length)))
        self.num_tokens = num_tokens
        forward = module.forward
        self.takes_mask = bool(accepts(forward, ("mask", "attn_mask", "attention_mask"), 1))
        self.takes_return_weights = bool(accepts(forward, ("return_weights",), 99))
        self.dropout_p = _find_dropout(module)

    def describe(self) -> str:
        kind = "a causal module" if self.causal else "a non-causal module"
        extra = f", context_length={self.context_length}" if self.context_length else ""
        return (f"{self.name}, {kind} x -> output (d_in={self.d_in}{extra})"
                f"{_placement_note(self.device, self.dtype)}")

    def call(self, x, mask=None, return_weights=False):
        kwargs = {"return_weights": True} if return_weights else {}
        try:
            result = self.module(x, **kwargs) if mask is None else self.module(x, mask, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's error becomes evidence
            raise UserError(describe_error(error)) from None
        return unpack(result)

    def inputs(self, batch_size=None, num_tokens=None, seed=0):
        batch_size = batch_size or self.batch_size
        num_tokens = num_tokens or self.num_tokens
        gen = cpu_generator(seed)
        return draw((batch_size, num_tokens, self.d_in), gen, self.device, self.dtype)  # (B, T, d_in)


def module_sink_logit(module: nn.Module) -> torch.Tensor | None:
    """The learned attention sink of a layer (its ``sink_logit`` tensor), or None (chapter 13)."""
    sink = getattr(module, "sink_logit", None)
    return sink if isinstance(sink, torch.Tensor) else None


def _find_attr(module: nn.Module, name: str):
    for sub in module.modules():
        value = getattr(sub, name, None)
        if value is not None and not isinstance(value, (nn.Module, torch.Tensor)):
            return value
    return None


def _find_causal(module: nn.Module) -> bool:
    declared = getattr(module, "causal", None)
    if isinstance(declared, bool):
        return declared
    return any(isinstance(getattr(sub, "mask", None), torch.Tensor) for sub in module.modules())


def _find_d_in(module: nn.Module) -> int:
    d_in = _find_attr(module, "d_in")
    if isinstance(d_in, int):
        return d_in
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            return sub.in_features
    raise ValueError(
        f"cannot tell the input size of {type(module).__name__}: pass diagnose(..., d_in=...)"
    )


def _find_dropout(module: nn.Module) -> float:
    for sub in module.modules():
        if isinstance(sub, nn.Dropout) and sub.p > 0:
            return float(sub.p)
        for name in ("dropout_p", "dropout"):
            value = getattr(sub, name, None)
            if isinstance(value, float) and value > 0:
                return value
    return 0.0
