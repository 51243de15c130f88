"""FlashAttention as Triton kernels: forward, log-sum-exp and the FlashAttention-2 backward pass.

Chapter 10 computed attention tile by tile in Python; chapter 20 writes the same algorithm as
fused GPU kernels in Triton (the kernels are in ``_triton_kernels.py``):

- :func:`flash_attention` is differentiable attention over ``(B, H, T, head_dim)`` tensors,
  with grouped key/value heads (``H_kv`` dividing ``H``), any ``T`` and an optional causal mask;
- :func:`flash_attention_forward` is its forward pass alone, returning the output and the
  log-sum-exp of every query row, as chapter 10's ``partial_attention`` does;
- :func:`jit` is ``triton.jit`` on a machine with a CUDA GPU and Triton's interpreter
  without one, so that the kernels the chapter writes run on any CPU;
- :func:`autotune` times block sizes, warps and stages on a GPU and keeps the fastest;
- :func:`flash_attention_flops` and :func:`flash_attention_bytes` count what a call computes
  and the fewest bytes it must move, for the roofline.

CUDA tensors run the compiled kernels. CPU tensors run the same kernels through Triton's
interpreter (NumPy, one program after another), which checks the arithmetic and the masks but
says nothing about speed; the learner sets no environment variable. The interpreter of
Triton 3.x cannot multiply bfloat16 tiles (it reads their bits as integers), so on the CPU
bfloat16 inputs are widened to float32, which holds every bfloat16 exactly: the products are
those a GPU's bfloat16 tensor cores make, but the weights ``P`` are not rounded to bfloat16
before the second product, as they are on a GPU.

Triton is optional: ``import attention_book`` works without it, and the first call that
needs it says how to install it (``pip install 'attention-book[kernels]'``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "KernelConfig",
    "SUPPORTED_HEAD_DIMS",
    "autotune",
    "default_config",
    "flash_attention",
    "flash_attention_bytes",
    "flash_attention_flops",
    "flash_attention_forward",
    "jit",
    "require_triton",
    "set_default_config",
    "tuning_candidates",
    "uses_interpreter",
]

#: Head sizes the kernels support: ``tl.dot`` needs at least 16 along every side and
#: ``tl.arange`` a power of two; above 128 one tile's rows no longer fit the registers.
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INSTALL = ("pip install 'attention-book[kernels]' (or pip install triton; Triton has wheels for "
            "Linux only: on macOS or Windows run the chapter on Colab, whose runtimes have it)")


def require_triton():
    """Import Triton, or say how to install it.

    Args:
        none.

    Returns:
        The ``triton`` module.

    Raises:
        ModuleNotFoundError: Triton is not installed; the message gives the command.

    Taught in chapter 20.
    """
    try:
        import triton
    except ImportError as error:
        raise ModuleNotFoundError(
            f"The book's Triton kernels need Triton, which this Python does not have. Install it "
            f"with {_INSTALL}, then restart the kernel.") from error
    return triton


def uses_interpreter(device: torch.device | str | None = None) -> bool:
    """Whether kernels for ``device`` run through Triton's interpreter (on the CPU).

    Args:
        device: a tensor's device; default: the device :func:`jit` compiles for, CUDA when
            PyTorch sees a GPU, else the CPU.

    Returns:
        ``True`` for the CPU, ``False`` for CUDA.

    Taught in chapter 20.
    """
    if device is None:
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


_HELPERS: dict = {}
_LAUNCH_DEPTH = [0]


@contextlib.contextmanager
def _language_helpers_interpreted():
    """While interpreted kernels run, let them call Triton's own ``@triton.jit`` helpers.

    ``tl.max``, ``tl.sum`` and ``tl.zeros`` are themselves ``@triton.jit`` functions, decorated
    when Triton is imported: as interpreter functions only if ``TRITON_INTERPRET=1`` was set
    before that import, and then for the whole process. Otherwise they are compiled-kernel
    helpers whose ``__call__`` only raises. During an interpreted launch such a call runs the
    helper's interpreted version instead, with ``triton.language.core`` (which the helpers
    use) switched to the interpreter's NumPy versions; both are put back afterwards. The
    compiled path never calls ``__call__``, so it is unaffected.
    """
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    def call(self, *args, **kwargs):
        return _interpreted_helper(self.fn)(*args, **kwargs)

    if _LAUNCH_DEPTH[0] > 0:  # already inside a launch
        yield
        return
    original = JITFunction.__call__
    JITFunction.__call__ = call
    scope = interpreter._patch_lang(require_triton().language.standard.max.fn)
    _LAUNCH_DEPTH[0] += 1
    try:
        yield
    finally:
        _LAUNCH_DEPTH[0] -= 1
        scope.restore()
        JITFunction.__call__ = original


def _interpreted_helper(fn):
    """The interpreter's rewrite of ``fn``, called directly (the language is already patched)."""
    from triton.runtime.interpreter import InterpretedFunction

    rewritten = _HELPERS.get(fn)
    if rewritten is None:
        rewritten = _HELPERS[fn] = InterpretedFunction(fn).rewrite()
    return rewritten


def _check_interpreter_version() -> None:
    """Triton's interpreter before 3.7 fails, with NumPy 2, on any loop whose bounds are
    computed at run time (each kernel of the book has one): say so instead."""
    import numpy

    triton = require_triton()
    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    if version < (3, 7) and int(numpy.__version__.split(".")[0]) >= 2:
        raise RuntimeError(
            f"Triton {triton.__version__}'s interpreter cannot run these kernels on the CPU with "
            f"NumPy {numpy.__version__} (it turns a loop bound into a Python int in a way "
            f"NumPy 2 refuses). Install Triton 3.7 or later for the CPU (pip install "
            f"'triton>=3.7'), or run on a CUDA GPU, where Triton compiles them.")


def _interpreted_kernel(fn):
    """``fn`` as an interpreter function: launched on CPU tensors, or called by another kernel."""
    from triton.runtime.interpreter import InterpretedFunction

    _check_interpreter_version()

    class InterpretedKernel(InterpretedFunction):
        def run(self, *args, **kwargs):
            with _language_helpers_interpreted():
                return super().run(*args, **kwargs)

        def __call__(self, *args, **kwargs):  # a call from inside a running kernel
            return _interpreted_helper(self.fn)(*args, **kwargs)

    return InterpretedKernel(fn)


def jit(fn):
    """``triton.jit`` with a CUDA GPU; Triton's interpreter, which runs on the CPU, without one.

    The decorated kernel is launched as any Triton kernel, ``kernel[grid](...)``: compiled
    for the GPU when PyTorch sees one, else interpreted with NumPy, program after program,
    on CPU tensors. Nothing else changes, so a chapter's kernels run everywhere, and nothing
    is switched for the rest of the process (Triton's own switch, ``TRITON_INTERPRET=1``,
    would have to be set before Triton is imported, and would hold for every kernel). In your
    own GPU code write ``@triton.jit``.

    Args:
        fn: the kernel (or a helper that kernels call), a Python function written in Triton.

    Returns:
        A ``triton.JITFunction``, or an interpreter function (``InterpretedFunction``).

    Taught in chapter 20.
    """
    triton = require_triton()
    if uses_interpreter():
        return _interpreted_kernel(fn)
    return triton.jit(fn)


_KERNELS: dict[bool, object] = {}


def _kernels(interpret: bool):
    """The kernel module, loaded once for the GPU and once for the interpreter.

    Each copy has its own globals, so a kernel of the interpreted copy calls the interpreted
    helpers, and CPU and CUDA tensors can take turns in one process.
    """
    if interpret not in _KERNELS:
        name = f"attention_book._triton_kernels_{'interpreted' if interpret else 'compiled'}"
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("_triton_kernels.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if interpret:  # the kernels and their helpers, each as an interpreter function
            from triton.runtime.jit import JITFunction

            for attribute, value in list(vars(module).items()):
                if isinstance(value, JITFunction):
                    setattr(module, attribute, _interpreted_kernel(value.fn))
        sys.modules[name] = module
        _KERNELS[interpret] = module
    return _KERNELS[interpret]


@dataclass(frozen=True)
class KernelConfig:
    """The launch parameters of one kernel: tile sizes, warps and pipeline stages.

    Args:
        block_m: queries per tile (rows of a program's query block).
        block_n: keys per tile.
        num_warps: groups of 32 GPU threads that run one program.
        num_stages: how many tiles the compiler loads ahead while computing (software
            pipelining); ignored by the interpreter.

    Taught in chapter 20.
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_m", "block_n", "num_warps", "num_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), "
                                 f"got {value}")


# Which pass a config is for: the forward kernel, the backward's dK/dV kernel (block_n keys
# per program, block_m queries per step) and its dQ kernel (block_m queries per program).
_PASSES = ("forward", "backward_dkdv", "backward_dq")
_INTERPRETER_CONFIGS = {  # the interpreter pays per operation: few, large tiles are fastest
    "forward": KernelConfig(64, 64),
    "backward_dkdv": KernelConfig(64, 64),
    "backward_dq": KernelConfig(64, 64),
}
# A reasonable start on an H100, keyed by (kernel, head_dim > 64): configs whose registers
# ptxas fits without spilling for sm_90 (compiled on a CPU, checked with ptxas -v). autotune()
# finds faster ones per GPU and head size.
_GPU_CONFIGS = {
    ("forward", False): KernelConfig(128, 64, 4, 3),
    ("forward", True): KernelConfig(128, 64, 8, 3),
    ("backward_dkdv", False): KernelConfig(64, 128, 8, 3),
    ("backward_dkdv", True): KernelConfig(64, 64, 8, 2),
    ("backward_dq", False): KernelConfig(128, 64, 8, 3),
    ("backward_dq", True): KernelConfig(32, 32, 4, 3),
}
_TUNED: dict[tuple, KernelConfig] = {}


def default_config(kernel: str, head_dim: int, device: torch.device | str = "cuda", *,
                   dtype: torch.dtype = torch.bfloat16, is_causal: bool = False) -> KernelConfig:
    """The config :func:`flash_attention` launches a kernel with.

    The interpreter runs 64 x 64 tiles: it pays for every operation, whatever its size. On
    a GPU it is the fastest config :func:`autotune` found in this process for this head size,
    dtype and mask, or else a reasonable start.

    Args:
        kernel: ``"forward"``, ``"backward_dkdv"`` or ``"backward_dq"``.
        head_dim: the head size.
        device: where the kernel runs.
        dtype: the inputs' dtype.
        is_causal: whether the causal mask is on.

    Returns:
        A :class:`KernelConfig`.

    Taught in chapter 20.
    """
    if kernel not in _PASSES:
        raise ValueError(f"kernel must be one of {_PASSES}, got {kernel!r}")
    if uses_interpreter(device):
        return _INTERPRETER_CONFIGS[kernel]
    tuned = _TUNED.get((kernel, head_dim, dtype, is_causal))
    return tuned if tuned is not None else _GPU_CONFIGS[kernel, head_dim > 64]


def set_default_config(kernel: str, head_dim: int, config: KernelConfig, *,
                       dtype: torch.dtype = torch.bfloat16, is_causal: bool = False) -> None:
    """Make ``config`` the GPU config of ``kernel`` for this head size, dtype and mask.

    Args:
        kernel: ``"forward"``, ``"backward_dkdv"`` or ``"backward_dq"``.
        head_dim: the head size.
        config: the config to launch with (what :func:`autotune` found, say).
        dtype: the inputs' dtype.
        is_causal: whether the causal mask is on.

    Returns:
        None; :func:`default_config` returns ``config`` from now on in this process.

    Taught in chapter 20.
    """
    if kernel not in _PASSES:
        raise ValueError(f"kernel must be one of {_PASSES}, got {kernel!r}")
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    _TUNED[kernel, head_dim, dtype, is_causal] = config


def _check_inputs(query, key, value, is_causal, scale) -> float:
    """Validate the arguments of the public functions; return the scale."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; the kernels take float16, "
                            f"bfloat16 or float32")
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, heads, T, head_dim), got shape "
                             f"{tuple(tensor.shape)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, "
                        f"{key.dtype} and {value.dtype}")
    if not query.device == key.device == value.device:
        raise ValueError(f"query, key and value must be on one device, got {query.device}, "
                         f"{key.device} and {value.device}")
    if query.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the kernels run on CUDA or, through Triton's interpreter, on the "
                         f"CPU; got tensors on {query.device}")
    if key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the "
                         f"same shape (B, H_kv, T_k, head_dim)")
    batch, num_heads, num_queries, head_dim = query.shape
    _, num_kv_heads, num_keys, key_dim = key.shape
    if key.size(0) != batch:
        raise ValueError(f"query has batch size {batch} and key {key.size(0)}")
    if key_dim != head_dim:
        raise ValueError(f"query has head_dim {head_dim} and key and value {key_dim}: the kernels "
                         f"need one head size for queries, keys and values")
    if head_dim > SUPPORTED_HEAD_DIMS[-1]:
        raise ValueError(f"head_dim {head_dim} is over the kernels' limit of "
                         f"{SUPPORTED_HEAD_DIMS[-1]}: a tile's rows would not fit the registers")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not a head size the kernels support: one of "
                         f"{SUPPORTED_HEAD_DIMS} (a power of two, at least 16 for tl.dot)")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"query has {num_heads} heads and key and value {num_kv_heads}: the "
                         f"query heads must be a multiple of the key/value heads")
    if num_queries < 1 or num_keys < 1:
        raise ValueError(f"query has {num_queries} positions and key {num_keys}: both need at "
                         f"least one")
    if batch * num_heads > 65535:
        raise ValueError(f"B * H = {batch} * {num_heads} = {batch * num_heads} programs along "
                         f"the grid's second axis, over CUDA's limit of 65535")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if is_causal and num_queries != num_keys:
        raise ValueError(f"is_causal needs as many queries as keys, got T_q = {num_queries} and "
                         f"T_k = {num_keys}: for T_q != T_k the book aligns the mask bottom-right "
                         f"and PyTorch top-left; use tiled_attention or an explicit mask")
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be finite and non-zero, got {scale}")
    return float(scale)


def _prepare(tensor: torch.Tensor, interpret: bool) -> torch.Tensor:
    """A last stride of 1, and, for the interpreter, float32 in place of bfloat16."""
    if interpret and tensor.dtype == torch.bfloat16:
        tensor = tensor.float()  # exact: every bfloat16 is a float32
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _strides(tensor: torch.Tensor) -> tuple[int, int, int]:
    return tensor.stride(0), tensor.stride(1), tensor.stride(2)


def _cdiv(length: int, tile: int) -> int:
    """How many tiles of ``tile`` cover ``length``: ``ceil(length / tile)``."""
    return -(-length // tile)


def _precision(dtype: torch.dtype) -> str:
    # float32 products in full float32 ("ieee"), as PyTorch's matmul does by default; TF32
    # would round the inputs to 10 bits of mantissa. 16-bit inputs ignore the setting.
    return "ieee" if dtype == torch.float32 else "tf32"


def _launching(interpret: bool):
    """What a launch runs inside: the interpreter's access to Triton's helpers, or nothing."""
    return _language_helpers_interpreted() if interpret else contextlib.nullcontext()


def _launch_options(config: KernelConfig, interpret: bool) -> dict:
    return {} if interpret else {"num_warps": config.num_warps, "num_stages": config.num_stages}


def _forward(query, key, value, is_causal, scale, config, use_exp2=True, split_masked=True):
    """Launch the forward kernel; returns the output in the inputs' dtype and the float32 LSE."""
    interpret = uses_interpreter(query.device)
    kernels = _kernels(interpret)
    q, k, v = (_prepare(tensor, interpret) for tensor in (query, key, value))
    batch, num_heads, num_queries, head_dim = q.shape
    group = num_heads // k.size(1)
    if config is None:
        config = default_config("forward", head_dim, query.device, dtype=query.dtype,
                                is_causal=is_causal)
    if config.block_m % config.block_n:
        raise ValueError(f"the forward kernel needs block_m ({config.block_m}) to be a multiple "
                         f"of block_n ({config.block_n})")
    output = torch.empty_like(q)  # (B, H, T_q, head_dim)
    lse = torch.empty(batch, num_heads, num_queries, dtype=torch.float32, device=q.device)
    grid = (_cdiv(num_queries, config.block_m), batch * num_heads)
    with _launching(interpret):
        kernels.attention_forward_kernel[grid](
            q, k, v, output, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(output),
            num_heads, group, num_queries, k.size(2), scale,
            HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
            IS_CAUSAL=is_causal, USE_EXP2=use_exp2, SPLIT_MASKED=split_masked,
            PRECISION=_precision(q.dtype), **_launch_options(config, interpret))
    return output.to(query.dtype), lse


def _backward(grad_output, query, key, value, output, lse, is_causal, scale, configs=None):
    """FlashAttention-2's backward pass: D, then dK and dV per key block, then dQ per query block."""
    interpret = uses_interpreter(query.device)
    kernels = _kernels(interpret)
    q, k, v, o, do = (_prepare(tensor, interpret)
                      for tensor in (query, key, value, output, grad_output))
    batch, num_heads, num_queries, head_dim = q.shape
    num_kv_heads, num_keys = k.size(1), k.size(2)
    group = num_heads // num_kv_heads
    configs = dict(configs or {})
    for kernel in ("backward_dkdv", "backward_dq"):
        configs.setdefault(kernel, default_config(kernel, head_dim, query.device,
                                                  dtype=query.dtype, is_causal=is_causal))
    dkdv, dq_config = configs["backward_dkdv"], configs["backward_dq"]
    if dkdv.block_n % dkdv.block_m:
        raise ValueError(f"the dK/dV kernel needs block_n ({dkdv.block_n}) to be a multiple of "
                         f"block_m ({dkdv.block_m})")
    if dq_config.block_m % dq_config.block_n:
        raise ValueError(f"the dQ kernel needs block_m ({dq_config.block_m}) to be a multiple of "
                         f"block_n ({dq_config.block_n})")
    precision = _precision(q.dtype)

    with _launching(interpret):
        delta = torch.empty(batch, num_heads, num_queries, dtype=torch.float32, device=q.device)
        block = 64 if not interpret else 32
        kernels.backward_preprocess_kernel[(_cdiv(num_queries, block), batch * num_heads)](
            o, do, delta, *_strides(o), *_strides(do), num_heads, num_queries,
            HEAD_DIM=head_dim, BLOCK_M=block)

        grad_key = torch.empty_like(k)  # (B, H_kv, T_k, head_dim)
        grad_value = torch.empty_like(v)
        kernels.backward_dkdv_kernel[(_cdiv(num_keys, dkdv.block_n), batch * num_kv_heads)](
            q, k, v, do, lse, delta, grad_key, grad_value,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(grad_key),
            *_strides(grad_value), num_heads, num_kv_heads, group, num_queries, num_keys, scale,
            HEAD_DIM=head_dim, BLOCK_M=dkdv.block_m, BLOCK_N=dkdv.block_n, IS_CAUSAL=is_causal,
            PRECISION=precision, **_launch_options(dkdv, interpret))

        grad_query = torch.empty_like(q)  # (B, H, T_q, head_dim)
        kernels.backward_dq_kernel[(_cdiv(num_queries, dq_config.block_m), batch * num_heads)](
            q, k, v, do, lse, delta, grad_query,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(grad_query),
            num_heads, group, num_queries, num_keys, scale,
            HEAD_DIM=head_dim, BLOCK_M=dq_config.block_m, BLOCK_N=dq_config.block_n,
            IS_CAUSAL=is_causal, PRECISION=precision, **_launch_options(dq_config, interpret))
    return (grad_query.to(query.dtype), grad_key.to(key.dtype), grad_value.to(value.dtype))


class _FlashAttention(torch.autograd.Function):
    """Forward by the forward kernel; backward by recomputing P from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, query, key, value, is_causal, scale):
        output, lse = _forward(query, key, value, is_causal, scale, None)
        ctx.save_for_backward(query, key, value, output, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        query, key, value, output, lse = ctx.saved_tensors
        grads = _backward(grad_output, query, key, value, output, lse, ctx.is_causal, ctx.scale)
        return (*grads, None, None)


def flash_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                    is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention by the book's fused Triton kernels, forward and backward (FlashAttention-2).

    Equal, up to rounding, to ``F.scaled_dot_product_attention(query, key, value,
    is_causal=is_causal, scale=scale, enable_gqa=True)``. The forward kernel keeps an online
    softmax per query block and never stores the ``(T_q, T_k)`` weights; it saves one
    log-sum-exp per query row, from which the backward kernels recompute the weights. Query
    head ``h`` uses key/value head ``h // (H / H_kv)``, read in place. CUDA tensors run
    compiled kernels; CPU tensors run the same kernels through Triton's interpreter.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        is_causal: hide the keys after each query (needs ``T_q == T_k``).
        scale: multiplies the scores; default ``1 / sqrt(head_dim)``.

    Shapes:
        query ``(B, H, T_q, head_dim)``, key and value ``(B, H_kv, T_k, head_dim)`` with
        ``H_kv`` dividing ``H`` and ``head_dim`` one of :data:`SUPPORTED_HEAD_DIMS`;
        returns ``(B, H, T_q, head_dim)``.

    Returns:
        The attention output in the inputs' dtype (float16, bfloat16 or float32); gradients
        flow to all three inputs.

    Taught in chapter 20.
    """
    scale = _check_inputs(query, key, value, is_causal, scale)
    require_triton()
    return _FlashAttention.apply(query, key, value, is_causal, scale)


def flash_attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                            is_causal: bool = False, scale: float | None = None,
                            config: KernelConfig | None = None, use_exp2: bool = True,
                            split_masked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone: the output and the log-sum-exp of every query row.

    The pair is chapter 10's partial result (``partial_attention``) over all the keys, and
    the log-sum-exp is what the backward pass needs. The two switches turn off the
    optimisations chapter 20 adds one at a time, so that each can be measured.

    Args:
        query: the queries.
        key: the keys.
        value: the values.
        is_causal: hide the keys after each query (needs ``T_q == T_k``).
        scale: multiplies the scores; default ``1 / sqrt(head_dim)``.
        config: tile sizes, warps and stages; default :func:`default_config`. ``block_m``
            must be a multiple of ``block_n``.
        use_exp2: fold ``log2(e)`` into the scale and use ``exp2`` (else ``exp``).
        split_masked: run the tiles that need no mask in a loop without one (else mask all).

    Shapes:
        as :func:`flash_attention`; returns ``(B, H, T_q, head_dim)`` and ``(B, H, T_q)``.

    Returns:
        ``(output, log_sum_exp)``: the output in the inputs' dtype, the log-sum-exp
        (natural logarithm) in float32. No gradients.

    Taught in chapter 20.
    """
    scale = _check_inputs(query, key, value, is_causal, scale)
    if config is not None and not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    for name, flag in (("use_exp2", use_exp2), ("split_masked", split_masked)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    require_triton()
    with torch.no_grad():
        return _forward(query, key, value, is_causal, scale, config, use_exp2, split_masked)


def flash_attention_flops(batch_size: int, num_heads: int, num_queries: int, num_keys: int,
                          head_dim: int, *, is_causal: bool = False,
                          backward: bool = False) -> int:
    """The FLOPs of attention's matrix products as kernel benchmarks count them.

    The forward pass makes two products, ``Q K^T`` and ``P V``: ``4 B H T_q T_k d``. With the
    causal mask half of them (the convention of FlashAttention's and Triton's benchmarks,
    exact as T grows). The backward pass makes five products (one recomputes ``Q K^T``),
    2.5 times the forward; ``backward=True`` counts forward and backward together (3.5x).

    Args:
        batch_size: B.
        num_heads: H, the query heads.
        num_queries: T_q.
        num_keys: T_k.
        head_dim: d.
        is_causal: count half the scores.
        backward: count the forward and the backward pass.

    Returns:
        The FLOPs, an int.

    Taught in chapter 20.
    """
    flops = 4 * batch_size * num_heads * num_queries * num_keys * head_dim
    if is_causal:
        flops //= 2
    return flops * 7 // 2 if backward else flops


def flash_attention_bytes(batch_size: int, num_heads: int, num_kv_heads: int, num_queries: int,
                          num_keys: int, head_dim: int, *, element_bytes: int = 2,
                          backward: bool = False) -> int:
    """The fewest bytes a fused attention kernel must move between HBM and the chip.

    Forward: read Q, K and V once, write the output and the float32 log-sum-exp. Backward
    adds: read Q, K, V, O, dO, the log-sum-exp and D; write dQ, dK and dV (``backward=True``
    counts both passes). Re-reading a key tile from HBM for every query block, which the
    GPU's L2 cache mostly saves, is not counted: this is the compulsory traffic.

    Args:
        batch_size: B.
        num_heads: H, the query heads.
        num_kv_heads: H_kv, the key/value heads.
        num_queries: T_q.
        num_keys: T_k.
        head_dim: d.
        element_bytes: bytes per element of the inputs (2 for bfloat16).
        backward: count the forward and the backward pass.

    Returns:
        The bytes, an int.

    Taught in chapter 20.
    """
    query_side = batch_size * num_heads * num_queries * head_dim * element_bytes  # Q, O, dO, dQ
    key_side = batch_size * num_kv_heads * num_keys * head_dim * element_bytes  # K, V, dK, dV
    rows = batch_size * num_heads * num_queries * 4  # one float32 per query row
    forward = 2 * query_side + 2 * key_side + rows
    if not backward:
        return forward
    return forward + 4 * query_side + 4 * key_side + 2 * rows


def autotune(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
             is_causal: bool = False, candidates: dict | None = None, backward: bool = True,
             warmup_ms: int = 10, repeat_ms: int = 40) -> dict[str, list[tuple]]:
    """Time candidate configs of each kernel on this GPU and keep the fastest.

    Each candidate is compiled (seconds each, the first time) and timed with
    ``triton.testing.do_bench``; the fastest becomes :func:`default_config` for this head
    size, dtype and mask in this process. A config that does not compile or does not fit the
    GPU's shared memory is reported with time ``inf``.

    Args:
        query: the queries, on a CUDA device.
        key: the keys.
        value: the values.
        is_causal: tune the causal kernels.
        candidates: ``{kernel: [KernelConfig, ...]}`` for ``"forward"``, ``"backward_dkdv"``,
            ``"backward_dq"``; default a small grid around the defaults.
        backward: tune the backward kernels too.
        warmup_ms: ``do_bench``'s warm-up per config.
        repeat_ms: ``do_bench``'s measuring time per config.

    Shapes:
        as :func:`flash_attention`.

    Returns:
        ``{kernel: [(config, milliseconds), ...]}``, fastest first.

    Taught in chapter 20.
    """
    scale = _check_inputs(query, key, value, is_causal, None)
    _refuse_to_time(query.device)
    triton = require_triton()
    head_dim = query.size(-1)
    candidates = candidates or tuning_candidates(head_dim)
    kernels = ["forward"] + (["backward_dkdv", "backward_dq"] if backward else [])
    results: dict[str, list[tuple]] = {}
    with torch.no_grad():
        output, lse = _forward(query, key, value, is_causal, scale, None)
        grad_output = torch.randn_like(output)
    for kernel in kernels:
        rows = []
        for config in candidates[kernel]:
            if kernel == "forward":
                def run(config=config):
                    return _forward(query, key, value, is_causal, scale, config)
            else:
                def run(config=config, kernel=kernel):
                    return _backward(grad_output, query, key, value, output, lse, is_causal,
                                     scale, {kernel: config})
            try:
                milliseconds = triton.testing.do_bench(run, warmup=warmup_ms, rep=repeat_ms)
            except Exception:  # noqa: BLE001 - out of shared memory or registers: not a candidate
                milliseconds = math.inf
            rows.append((config, float(milliseconds)))
        rows.sort(key=lambda row: row[1])
        if math.isfinite(rows[0][1]):
            set_default_config(kernel, head_dim, rows[0][0], dtype=query.dtype,
                               is_causal=is_causal)
        results[kernel] = rows
    return results


def _refuse_to_time(device: torch.device) -> None:
    if uses_interpreter(device):
        raise ValueError("autotune times kernels on a GPU: through the interpreter (CPU tensors) "
                         "a time says nothing about a GPU")


def tuning_candidates(head_dim: int) -> dict[str, list[KernelConfig]]:
    """The configs :func:`autotune` tries by default: a few that fit an H100 without spilling.

    Args:
        head_dim: the head size.

    Returns:
        ``{kernel: [KernelConfig, ...]}`` for ``"forward"``, ``"backward_dkdv"`` and
        ``"backward_dq"``.

    Taught in chapter 20.
    """
    if head_dim > 64:
        return {"forward": [KernelConfig(128, 64, 8, 3), KernelConfig(128, 64, 8, 4),
                            KernelConfig(128, 32, 8, 3), KernelConfig(64, 64, 4, 4)],
                "backward_dkdv": [KernelConfig(64, 64, 8, 2), KernelConfig(32, 64, 8, 3),
                                  KernelConfig(64, 64, 8, 3)],
                "backward_dq": [KernelConfig(32, 32, 4, 3), KernelConfig(64, 32, 8, 3),
                                KernelConfig(128, 128, 8, 2)]}
    return {"forward": [KernelConfig(128, 64, 4, 3), KernelConfig(128, 64, 8, 3),
                        KernelConfig(128, 128, 8, 3), KernelConfig(64, 64, 4, 4)],
            "backward_dkdv": [KernelConfig(64, 128, 8, 3), KernelConfig(32, 128, 8, 3),
                              KernelConfig(32, 64, 4, 3)],
            "backward_dq": [KernelConfig(128, 64, 8, 3), KernelConfig(128, 32, 8, 3),
                            KernelConfig(64, 32, 4, 3)]}
