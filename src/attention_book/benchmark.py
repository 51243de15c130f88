"""What attention costs, measured: ``python -m attention_book.benchmark``.

Seven measurements, each a table of medians over repeated runs after a
warm-up run, with ratios between rows taken in the same run:

1. ``MultiHeadAttention`` forward + backward (B=2, T=1024, d=768, 12 heads,
   causal) with ``backend="sdpa"`` and ``backend="naive"`` against
   ``torch.nn.MultiheadAttention`` (``need_weights=False``, the same causal mask).
2. Causal attention at B=1, 12 heads, T=4096, head_dim=64: the book's naive
   attention, :func:`attention_book.flash.tiled_attention` and PyTorch's fused
   ``scaled_dot_product_attention``: time, and peak extra memory measured as the
   growth of the peak resident set size (``VmHWM``, reset just before the call)
   of a fresh subprocess per variant across one call, next to
   :func:`peak_tensor_bytes`.
3. Generating 512 tokens one at a time, recomputing attention over the whole
   prefix at every step versus a :class:`attention_book.kv_cache.KVCache`.
4. Only with ``--only window`` (it takes a minute or two on 2 cores): a
   sliding window at T=16384 (B=1, 4 heads, head_dim=64, window 1024):
   :func:`~attention_book.flash.tiled_attention` with ``window=`` against full
   causal ``tiled_attention``, and PyTorch's fused kernel with ``is_causal=True``
   and with the window as a boolean mask; time and peak extra memory (chapter 13).
5. Serving 32 requests of different lengths with a small ``TinyGPT`` (chapter 16): the
   KV memory of a cache preallocated per request (``KVCache(context_length)`` per layer, as
   ``TinyGPT.generate`` keeps) against the peak of a :class:`~attention_book.serving.PagedKVCache`,
   and tokens per second of continuous batching (:func:`~attention_book.serving.generate_batch`)
   against generating one request at a time, both with the book's attention and both with
   PyTorch's fused kernel (``backend="sdpa"``, as a server runs it): each ratio compares the
   two ways with one attention kernel, so it measures the batching alone.
6. Only with ``--only linear`` (chapter 18): the gated delta rule at T=2048 (B=1, 8 heads,
   d_k = d_v = 64) as the token loop, in chunkwise form
   (:func:`~attention_book.linear_attention.delta_rule` with ``chunk_size=64``) and as Hugging
   Face transformers' ``torch_chunk_gated_delta_rule`` (Qwen3-Next's torch code), in one run;
   then generating one token after ``L`` tokens for growing ``L``: a
   :class:`~attention_book.linear_attention.GatedDeltaNet` layer with its fixed
   :class:`~attention_book.linear_attention.RecurrentState` against a ``MultiHeadAttention``
   layer with a :class:`~attention_book.kv_cache.KVCache` holding ``L`` tokens (time per token
   and the bytes each memory holds).
7. Only with ``--only sparse`` (chapter 19): causal attention at T=4096 and T=16384 (B=1,
   4 heads, head_dim=64) as PyTorch's fused ``scaled_dot_product_attention``, as top-k
   gather attention (:func:`~attention_book.sparse.topk_attention`, k=256 keys per query)
   and as block-sparse FlexAttention compiled with ``torch.compile``
   (:func:`~attention_book.sparse.block_topk_attention`, 2 blocks of 128 keys per block of
   queries), both choosing from the same random index scores; time and peak extra
   memory, and each sparse output against dense attention given the same keys as a mask.
   On the CPU top-k gather runs at T=4096 only (one call takes about 20 s there, and its
   work grows like T * k); the table says so.
8. Only with ``--only kernel`` (chapter 20, needs Triton): on a GPU, the book's Triton kernel
   (:func:`~attention_book.triton_attention.flash_attention`) against PyTorch's fused
   ``scaled_dot_product_attention`` and ``tiled_attention``, forward and forward + backward,
   causal and not, bfloat16, T from 1024 to 16384, in TFLOP/s and as ratios, after autotuning;
   on the CPU, where the kernels run through Triton's interpreter, only how closely they
   agree with PyTorch (:mod:`attention_book.kernel_benchmark`).

The rows of one table run interleaved (round-robin), so a change of machine
load affects them alike. This is a benchmark, not a test: nothing in the test
suite times anything. Options: ``--threads`` (default 2), ``--repeats``,
``--only``, ``--device`` and ``--dtype``.

On a GPU (``--device cuda``) the same tables run in float32 and bfloat16 (or the
``--dtype`` given): every timing waits for the GPU (``torch.cuda.synchronize``), and
memory is the growth of ``torch.cuda.max_memory_allocated`` across one call. Taught in
chapter 10.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .attention import causal_mask, scaled_dot_product_attention, sliding_window_mask
from .flash import tile_plan, tiled_attention
from .kv_cache import KVCache, kv_cache_bytes
from .linear_attention import GatedDeltaNet, delta_rule
from .model import TinyGPT
from .modules import MultiHeadAttention
from .serving import ContinuousBatcher
from .sparse import block_topk_attention, block_topk_mask, topk_attention, topk_mask

# The shapes the issue asks for.
MHA_SHAPE = {"batch_size": 2, "num_tokens": 1024, "d_model": 768, "num_heads": 12}
LONG_SHAPE = {"batch_size": 1, "num_heads": 12, "num_tokens": 4096, "head_dim": 64}
DECODE_SHAPE = {"num_tokens": 512, "d_model": 384, "num_heads": 6}
WINDOW_SHAPE = {"batch_size": 1, "num_heads": 4, "num_tokens": 16384, "head_dim": 64,
                "window": 1024}
SERVING_SHAPE = {"num_requests": 32, "vocab_size": 256, "d_model": 128, "num_heads": 4,
                 "num_layers": 4, "context_length": 256, "block_size": 16}
LINEAR_SHAPE = {"batch_size": 1, "num_heads": 8, "num_tokens": 2048, "head_dim": 64,
                "chunk_size": 64}
LINEAR_DECODE_SHAPE = {"d_model": 512, "num_heads": 8, "lengths": (256, 1024, 4096, 16384)}
# 256 keys per query either way: k = 256 for top-k gather, 2 blocks of 128 keys per block of
# queries for block-sparse. (Chapter 19's k = 2048 makes one gather call at T=4096 take minutes
# on 2 cores.)
SPARSE_SHAPE = {"batch_size": 1, "num_heads": 4, "head_dim": 64, "top_k": 256,
                "top_k_blocks": 2, "block_size": 128}
SPARSE_LENGTHS = (4096, 16384)
# Larger tiles than the default 128 mean fewer small operations in the Python loop.
TILE_BLOCK_SIZE = 256
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def header(threads: int, device: str = "cpu") -> str:
    """The machine, thread count (or GPU) and versions, printed above the tables."""
    import numpy

    lines = [
        "attention_book benchmark (medians over repeated runs after one warm-up run)",
        f"machine : {_cpu_name()}, {os.cpu_count()} logical CPUs, {platform.platform()}",
        f"threads : torch.get_num_threads() = {threads}; load average before the run "
        f"{os.getloadavg()[0]:.1f} (other processes compete for the CPUs when it exceeds 0)",
        f"versions: python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}",
    ]
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        lines.append(f"device  : {properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
                     f"CUDA {torch.version.cuda}, driver capability "
                     f"{properties.major}.{properties.minor}")
    return "\n".join(lines)


class _Device:
    """Where the benchmark runs: creates tensors there and waits for it before reading a clock."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def sync(self) -> None:
        if self.name == "cuda":
            torch.cuda.synchronize()

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=self.name, dtype=self.dtype)

    def module(self, module: nn.Module) -> nn.Module:
        return module.to(device=self.name, dtype=self.dtype)

    def peak_extra_mib(self, fn: Callable[[], object]) -> float:
        """Growth of the GPU's allocated memory across one call of ``fn`` (CUDA only)."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del result
        return (peak - before) / 2**20

    @property
    def label(self) -> str:
        return f"{self.name}, {str(self.dtype).removeprefix('torch.')}"


CPU = _Device("cpu", torch.float32)


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, *,
                   device: torch.device | str | None = None) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    A GPU runs the work that a call launches after the call has returned, so on a CUDA
    ``device`` the clock is read only once the device has finished
    (``torch.cuda.synchronize``); without it, a GPU timing measures the launches alone.
    The warm-up runs pay the one-time costs (the first call at each new shape sets up its
    kernels), which are not what a timing should report.

    Args:
        fn: the work to time, called with no argument.
        repeats: the timed runs.
        warmup: untimed runs first.
        device: where ``fn`` computes; a CUDA device is synchronised around each run.

    Shapes:
        none.

    Returns:
        The median of the ``repeats`` timings, in seconds.

    Taught in chapter 10.
    """
    sync = torch.device(device).type == "cuda" if device is not None else False

    def wait() -> None:
        if sync:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        wait()
        start = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _TensorMemoryTracker(TorchDispatchMode):
    """Follow the storages that PyTorch operations create: live bytes now, and the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._outside: set[int] = set()  # storages that existed before: inputs, parameters
        self._live: dict[int, list[int]] = {}  # storage address -> [bytes, python references]

    def _release(self, address: int) -> None:
        entry = self._live.get(address)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._live[address]
            self.current -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for item in pytree.tree_leaves((args, kwargs)):
            if isinstance(item, torch.Tensor):
                address = item.untyped_storage().data_ptr()
                if address not in self._live:
                    self._outside.add(address)
        result = func(*args, **kwargs)
        for item in pytree.tree_leaves(result):
            if not isinstance(item, torch.Tensor):
                continue
            storage = item.untyped_storage()
            address = storage.data_ptr()
            if address in self._outside or storage.nbytes() == 0:
                continue
            if address in self._live:
                self._live[address][1] += 1
            else:
                self._live[address] = [storage.nbytes(), 1]
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            weakref.finalize(item, self._release, address)
        return result


def peak_tensor_bytes(fn: Callable[[], object]) -> int:
    """The most bytes of new tensors alive at once while ``fn()`` runs (its result included).

    Every tensor an operation returns is followed until Python lets go of it;
    inputs that existed before the call are not counted. This counts exactly
    what a function written with PyTorch operations allocates, and is the same
    on every machine; scratch memory that a fused kernel keeps to itself is
    invisible to it (the benchmark therefore also measures the peak RSS).

    Args:
        fn: the computation, called once with no arguments (run it under ``torch.no_grad()``).

    Shapes:
        (any)

    Returns:
        The peak, in bytes.

    Taught in chapter 10.
    """
    tracker = _TensorMemoryTracker()
    with tracker:
        result = fn()
    del result
    return tracker.peak


def time_interleaved(
    variants: dict[str, Callable[[], object]], repeats: int, *, warmup: bool = True,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Run every variant once as warm-up, then ``repeats`` rounds, rotating the order.

    ``sync`` waits for an asynchronous device (a GPU) before each clock reading.
    """
    names = list(variants)
    if warmup:
        for name in names:
            variants[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            sync()
            start = time.perf_counter()
            variants[name]()
            sync()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def format_table(title: str, seconds: dict[str, list[float]], reference: str,
                 extra: dict[str, str] | None = None, extra_title: str = "") -> str:
    """A text table: median, spread and the ratio to ``reference`` for each row."""
    ref_median = statistics.median(seconds[reference])
    width = max(len(name) for name in seconds)
    lines = [title, f"  {'variant':<{width}}  {'median':>10}  {'min..max':>17}  "
                    f"{'x ' + reference:>12}  {extra_title}".rstrip()]
    for name, times in seconds.items():
        median = statistics.median(times)
        spread = f"{min(times):.3f}..{max(times):.3f}"
        cell = "" if extra is None else extra.get(name, "")
        lines.append(f"  {name:<{width}}  {median:>9.3f}s  {spread:>17}  "
                     f"{median / ref_median:>11.2f}x  {cell}".rstrip())
    return "\n".join(lines)


def _ratio(seconds: dict[str, list[float]], numerator: str, denominator: str) -> float:
    return statistics.median(seconds[numerator]) / statistics.median(seconds[denominator])


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bench_multihead(repeats: int, device: _Device = CPU) -> str:
    """Target 1: MultiHeadAttention forward + backward against torch.nn.MultiheadAttention."""
    batch_size, num_tokens, d_model, num_heads = MHA_SHAPE.values()
    torch.manual_seed(0)
    x = device.tensor(torch.randn(batch_size, num_tokens, d_model)).requires_grad_()  # (B, T, d)
    ours_sdpa = device.module(
        MultiHeadAttention(d_model, d_model, num_heads, num_tokens, backend="sdpa"))
    ours_naive = device.module(
        MultiHeadAttention(d_model, d_model, num_heads, num_tokens, backend="naive"))
    torch_mha = device.module(
        nn.MultiheadAttention(d_model, num_heads, bias=False, batch_first=True))
    # nn.MultiheadAttention's boolean mask has the opposite polarity: True = may NOT attend.
    torch_mask = ~causal_mask(num_tokens, device=device.name)  # (T, T)

    def run_torch() -> None:
        out, _ = torch_mha(x, x, x, attn_mask=torch_mask, need_weights=False, is_causal=True)
        out.sum().backward()

    variants = {
        "nn.MultiheadAttention": run_torch,
        "MultiHeadAttention(sdpa)": lambda: ours_sdpa(x).sum().backward(),
        "MultiHeadAttention(naive)": lambda: ours_naive(x).sum().backward(),
    }
    seconds = time_interleaved(variants, repeats, sync=device.sync)
    vs_torch = _ratio(seconds, "MultiHeadAttention(sdpa)", "nn.MultiheadAttention")
    vs_naive = _ratio(seconds, "MultiHeadAttention(sdpa)", "MultiHeadAttention(naive)")
    shape = ", ".join(f"{key}={value}" for key, value in MHA_SHAPE.items())
    return "\n".join([
        format_table(f"1. forward + backward, causal ({shape}; {device.label}), {repeats} runs",
                     seconds, "nn.MultiheadAttention"),
        f"  target: sdpa <= 1.0x nn.MultiheadAttention: {vs_torch:.2f}x -> "
        f"{_verdict(vs_torch <= 1.0)}; sdpa faster than naive: {vs_naive:.2f}x -> "
        f"{_verdict(vs_naive < 1.0)}",
    ])


def _long_inputs(device: _Device = CPU) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch_size, num_heads, num_tokens, head_dim = LONG_SHAPE.values()
    torch.manual_seed(0)
    shape = (batch_size, num_heads, num_tokens, head_dim)
    return tuple(device.tensor(torch.randn(shape)) for _ in range(3))  # (B, H, T, head_dim)


LONG_VARIANTS: dict[str, Callable[..., torch.Tensor]] = {
    "naive (book)": lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True)[0],
    "tiled_attention": lambda q, k, v: tiled_attention(
        q, k, v, block_size=TILE_BLOCK_SIZE, is_causal=True),
    "F.scaled_dot_product_attention": lambda q, k, v: (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _rss_growth_mib(fn: Callable[[], object]) -> float:
    """Growth of the peak RSS (``VmHWM``) of this process across one call of ``fn`` (Linux).

    Freed heap memory is first handed back to the system (``malloc_trim``) and the
    kernel's peak-RSS mark is reset to the current RSS (``/proc/self/clear_refs``),
    so the peak that follows belongs to this call alone.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    before_kib = _status_kib("VmRSS")
    result = fn()
    peak_kib = _status_kib("VmHWM")
    del result
    return (peak_kib - before_kib) / 1024


def _memory_child(variant: str, threads: int) -> None:
    """In a fresh process: print the growth of the peak RSS across one call of ``variant``."""
    torch.set_num_threads(threads)
    if variant in WINDOW_VARIANTS:
        query, key, value = _window_inputs()
        fn = WINDOW_VARIANTS[variant]
    else:
        query, key, value = _long_inputs()
        fn = LONG_VARIANTS[variant]
    with torch.no_grad():
        extra_mib = _rss_growth_mib(lambda: fn(query, key, value))
    print(json.dumps({"extra_mib": extra_mib}))


def _peak_extra_mib(variant: str, threads: int) -> float:
    command = [sys.executable, "-m", "attention_book.benchmark", "--memory-child", variant,
               "--threads", str(threads)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["extra_mib"]


def bench_long(repeats: int, threads: int, device: _Device = CPU) -> str:
    """Target 2: tiled_attention's time and peak extra memory against the naive attention."""
    query, key, value = _long_inputs(device)
    with torch.no_grad():
        expected = LONG_VARIANTS["F.scaled_dot_product_attention"](query, key, value)
        worst = (LONG_VARIANTS["tiled_attention"](query, key, value) - expected).abs().max()
    with torch.no_grad():
        if device.name == "cuda":
            memory = {name: device.peak_extra_mib(lambda fn=fn: fn(query, key, value))
                      for name, fn in LONG_VARIANTS.items()}
        else:
            memory = {name: _peak_extra_mib(name, threads) for name in LONG_VARIANTS}
        tensor_mib = {name: peak_tensor_bytes(lambda fn=fn: fn(query, key, value)) / 2**20
                      for name, fn in LONG_VARIANTS.items()}
    with torch.no_grad():
        variants = {name: (lambda fn=fn: fn(query, key, value))
                    for name, fn in LONG_VARIANTS.items()}
        seconds = time_interleaved(variants, repeats, sync=device.sync)
    time_ratio = _ratio(seconds, "tiled_attention", "naive (book)")
    memory_ratio = memory["tiled_attention"] / memory["naive (book)"]
    vs_fused = _ratio(seconds, "tiled_attention", "F.scaled_dot_product_attention")
    shape = ", ".join(f"{key}={value}" for key, value in LONG_SHAPE.items())
    extra = {name: f"{mib:9.1f} MiB  {mib / memory['naive (book)']:6.1%}  "
                   f"{tensor_mib[name]:9.1f} MiB"
             for name, mib in memory.items()}
    peak_name = "peak extra GPU memory" if device.name == "cuda" else "peak extra RSS"
    peak_note = (
        "  peak extra GPU memory: torch.cuda.max_memory_allocated() - memory_allocated() "
        "across one call (inputs already allocated, the output counts)"
        if device.name == "cuda" else
        "  peak extra RSS: VmHWM - VmRSS across one call in a fresh subprocess per variant, "
        "after malloc_trim and a reset of VmHWM (inputs already allocated, the output counts)")
    return "\n".join([
        format_table(f"2. causal attention forward ({shape}, block_size={TILE_BLOCK_SIZE}; "
                     f"{device.label}), {repeats} runs", seconds, "naive (book)", extra,
                     f"{peak_name}  (% of naive)  peak tensors"),
        peak_note,
        "  peak tensors: peak_tensor_bytes, the tensors the call's operations return "
        "(blind to a fused kernel's private scratch memory)",
        f"  tiled_attention vs F.scaled_dot_product_attention: max |difference| = "
        f"{worst:.2e}, time {vs_fused:.2f}x",
        f"  target: tiled memory <= 15% of naive: {memory_ratio:.1%} -> "
        f"{_verdict(memory_ratio <= 0.15)}; tiled time <= 0.5x naive: {time_ratio:.2f}x -> "
        f"{_verdict(time_ratio <= 0.5)}",
    ])


def _window_inputs(device: _Device = CPU) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch_size, num_heads, num_tokens, head_dim, _ = WINDOW_SHAPE.values()
    torch.manual_seed(0)
    shape = (batch_size, num_heads, num_tokens, head_dim)
    return tuple(device.tensor(torch.randn(shape)) for _ in range(3))  # (B, H, T, head_dim)


def _window_mask(query: torch.Tensor) -> torch.Tensor:
    return sliding_window_mask(query.size(-2), WINDOW_SHAPE["window"], device=query.device)  # (T, T)


WINDOW_VARIANTS: dict[str, Callable[..., torch.Tensor]] = {
    "tiled_attention, causal": lambda q, k, v: tiled_attention(
        q, k, v, block_size=TILE_BLOCK_SIZE, is_causal=True),
    "tiled_attention, window": lambda q, k, v: tiled_attention(
        q, k, v, block_size=TILE_BLOCK_SIZE, window=WINDOW_SHAPE["window"]),
    "F.sdpa, is_causal": lambda q, k, v: (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "F.sdpa, window mask": lambda q, k, v: (
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_window_mask(q))),
}


def bench_window(repeats: int, threads: int, device: _Device = CPU) -> str:
    """Target 4 (chapter 13): a sliding window against full causal attention at T=16384."""
    query, key, value = _window_inputs(device)
    num_tokens, window = WINDOW_SHAPE["num_tokens"], WINDOW_SHAPE["window"]
    with torch.no_grad():
        expected = WINDOW_VARIANTS["F.sdpa, window mask"](query, key, value)
        worst = (WINDOW_VARIANTS["tiled_attention, window"](query, key, value) - expected).abs().max()
        del expected
        if device.name == "cuda":
            memory = {name: device.peak_extra_mib(lambda fn=fn: fn(query, key, value))
                      for name, fn in WINDOW_VARIANTS.items()}
        else:
            memory = {name: _peak_extra_mib(name, threads) for name in WINDOW_VARIANTS}
        variants = {name: (lambda fn=fn: fn(query, key, value))
                    for name, fn in WINDOW_VARIANTS.items()}
        seconds = time_interleaved(variants, repeats, sync=device.sync)
    plan_causal = tile_plan(num_tokens, num_tokens, TILE_BLOCK_SIZE, is_causal=True)
    plan_window = tile_plan(num_tokens, num_tokens, TILE_BLOCK_SIZE, window=window)
    tiles = {name: int((plan != 0).sum()) for name, plan in (("causal", plan_causal),
                                                              ("window", plan_window))}
    speedup = _ratio(seconds, "tiled_attention, causal", "tiled_attention, window")
    fused_speedup = _ratio(seconds, "F.sdpa, is_causal", "F.sdpa, window mask")
    shape = ", ".join(f"{key}={value}" for key, value in WINDOW_SHAPE.items())
    peak_name = "peak extra GPU memory" if device.name == "cuda" else "peak extra RSS"
    extra = {name: f"{mib:9.1f} MiB" for name, mib in memory.items()}
    return "\n".join([
        format_table(f"4. sliding window against full causal, forward ({shape}, "
                     f"block_size={TILE_BLOCK_SIZE}; {device.label}), {repeats} runs",
                     seconds, "tiled_attention, causal", extra, peak_name),
        f"  tiles computed by tiled_attention: causal {tiles['causal']:,}, window "
        f"{tiles['window']:,} ({tiles['window'] / tiles['causal']:.1%})",
        f"  tiled_attention(window) vs F.sdpa with the window mask: max |difference| = "
        f"{worst:.2e}",
        f"  the window makes tiled_attention {speedup:.1f}x faster than causal; the fused "
        f"kernel given the window as a mask is {1 / fused_speedup:.2f}x the time of its "
        "is_causal (the mask skips no tile)",
    ])


def _generate(layer: MultiHeadAttention, first: torch.Tensor, num_tokens: int,
              use_cache: bool) -> torch.Tensor:
    """Feed each output (layer-normalised) back in as the next token; return every output."""
    d_model = first.size(-1)
    outputs = []
    if use_cache:
        cache = KVCache(num_tokens)
        token = first  # (1, 1, d)
        for _ in range(num_tokens):
            out = layer(token, kv_cache=cache)  # (1, 1, d)
            outputs.append(out)
            token = torch.nn.functional.layer_norm(out, (d_model,))  # (1, 1, d)
    else:
        sequence = first  # (1, t, d)
        for _ in range(num_tokens):
            out = layer(sequence)[:, -1:]  # (1, 1, d)
            outputs.append(out)
            next_token = torch.nn.functional.layer_norm(out, (d_model,))  # (1, 1, d)
            sequence = torch.cat([sequence, next_token], dim=1)  # (1, t + 1, d)
    return torch.cat(outputs, dim=1)  # (1, num_tokens, d)


def bench_decode(repeats: int, device: _Device = CPU) -> str:
    """Target 3: decoding 512 tokens with a KVCache against recomputing every step."""
    num_tokens, d_model, num_heads = DECODE_SHAPE.values()
    torch.manual_seed(0)
    layer = device.module(
        MultiHeadAttention(d_model, d_model, num_heads, num_tokens, backend="sdpa")).eval()
    first = device.tensor(torch.randn(1, 1, d_model))  # (1, 1, d)
    with torch.no_grad():
        recomputed = _generate(layer, first, num_tokens, use_cache=False)
        cached = _generate(layer, first, num_tokens, use_cache=True)
        worst = (recomputed - cached).abs().max().item()
        variants = {
            "recompute every step": lambda: _generate(layer, first, num_tokens, False),
            "KVCache": lambda: _generate(layer, first, num_tokens, True),
        }
        # The equality check above already ran both paths once: it is the warm-up.
        seconds = time_interleaved(variants, repeats, warmup=False, sync=device.sync)
    speedup = _ratio(seconds, "recompute every step", "KVCache")
    shape = ", ".join(f"{key}={value}" for key, value in DECODE_SHAPE.items())
    return "\n".join([
        format_table(f"3. generating {num_tokens} tokens one at a time ({shape}; "
                     f"{device.label}), "
                     f"{repeats} runs", seconds, "recompute every step"),
        f"  outputs: max |recompute - KVCache| = {worst:.2e} over all {num_tokens} steps",
        f"  target: KVCache >= 5x faster: {speedup:.1f}x -> {_verdict(speedup >= 5.0)}",
    ])


def _serving_workload() -> tuple[list[torch.Tensor], list[int]]:
    num_requests, vocab_size = SERVING_SHAPE["num_requests"], SERVING_SHAPE["vocab_size"]
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 129, (num_requests,), generator=generator).tolist()
    prompts = [torch.randint(0, vocab_size, (n,), generator=generator) for n in lengths]
    new_tokens = torch.randint(8, 97, (num_requests,), generator=generator).tolist()
    return prompts, new_tokens


def bench_serving(repeats: int, device: _Device = CPU) -> str:
    """Target 5 (chapter 16): paged against preallocated KV memory; batched against one at a time."""
    sizes = {k: SERVING_SHAPE[k] for k in ("vocab_size", "d_model", "num_heads", "num_layers",
                                          "context_length")}
    block_size = SERVING_SHAPE["block_size"]
    torch.manual_seed(0)
    model = device.module(TinyGPT(**sizes)).eval()
    prompts, new_tokens = _serving_workload()
    prompts = [prompt.to(device.name) for prompt in prompts]
    num_blocks = sum(-(-(len(p) + n - 1) // block_size) for p, n in zip(prompts, new_tokens,
                                                                          strict=True))

    pool: dict[str, int] = {}

    def continuous(chosen: TinyGPT = model) -> list[torch.Tensor]:
        batcher = ContinuousBatcher(chosen, block_size=block_size, num_blocks=num_blocks)
        ids = [batcher.submit(p, n) for p, n in zip(prompts, new_tokens, strict=True)]
        batcher.run()
        return [batcher.output(i) for i in ids]

    def memory_per_step() -> None:
        """Step by step: requests alive, tokens cached and blocks in use, summed over steps."""
        batcher = ContinuousBatcher(model, block_size=block_size, num_blocks=num_blocks)
        for prompt, count in zip(prompts, new_tokens, strict=True):
            batcher.submit(prompt, count)
        pool.update(alive=0, tokens=0, blocks=0, peak_blocks=0, peak_alive=0)
        while not batcher.done:
            record = batcher.step()
            cache = batcher.cache
            pool["alive"] += len(cache.seq_ids)
            pool["tokens"] += sum(cache.length(seq_id) for seq_id in cache.seq_ids)
            pool["blocks"] += record.blocks_in_use
            pool["peak_blocks"] = max(pool["peak_blocks"], record.blocks_in_use)
            pool["peak_alive"] = max(pool["peak_alive"], len(cache.seq_ids))
        pool["block_nbytes"] = batcher.cache.block_nbytes

    def one_at_a_time(chosen: TinyGPT = model) -> list[torch.Tensor]:
        return [chosen.generate(p[None], n)[0] for p, n in zip(prompts, new_tokens, strict=True)]

    # The same weights with PyTorch's fused attention in every layer, as a server runs it (no
    # weights to return): both ways then use one kernel, as both use the book's attention above.
    fused = TinyGPT(**sizes, mixers=[
        MultiHeadAttention(sizes["d_model"], sizes["d_model"], sizes["num_heads"],
                           context_length=sizes["context_length"], backend="sdpa")
        for _ in range(sizes["num_layers"])])
    fused.load_state_dict(model.state_dict())
    fused = device.module(fused).eval()

    with torch.no_grad():
        same = sum(torch.equal(a, b) for a, b in zip(continuous(), one_at_a_time(), strict=True))
        same_fused = sum(torch.equal(a, b) for a, b in zip(
            continuous(fused), one_at_a_time(fused), strict=True))
        memory_per_step()
        # What TinyGPT.generate holds for one request: a KVCache(context_length) per layer.
        attention = model.blocks[0].attention
        keys = device.tensor(torch.zeros(1, attention.num_kv_heads, 1,
                                         attention.head_dim))  # (1, H_kv, 1, head_dim)
        per_request = 0
        for _ in model.blocks:
            cache = KVCache(model.context_length)
            cache.update(keys, keys)
            per_request += cache.nbytes
        # The equality check above ran both ways once: it is the warm-up.
        seconds = time_interleaved({"one request at a time": one_at_a_time,
                                    "continuous batching": continuous,
                                    "one at a time, fused": lambda: one_at_a_time(fused),
                                    "batching, fused": lambda: continuous(fused)}, repeats,
                                   warmup=False, sync=device.sync)
    token_nbytes = pool["block_nbytes"] // block_size
    assert per_request == model.context_length * token_nbytes
    preallocated_peak = pool["peak_alive"] * per_request
    paged_peak = pool["peak_blocks"] * pool["block_nbytes"]
    # Over all steps: the fraction of the memory held that holds no token.
    waste_preallocated = 1 - pool["tokens"] / (pool["alive"] * model.context_length)
    waste_paged = 1 - pool["tokens"] / (pool["blocks"] * block_size)
    total_tokens = sum(new_tokens)
    rates = {name: f"{total_tokens / statistics.median(times):9.0f} tokens/s"
             for name, times in seconds.items()}
    speedup = _ratio(seconds, "one request at a time", "continuous batching")
    fused_speedup = _ratio(seconds, "one at a time, fused", "batching, fused")
    shape = ", ".join(f"{key}={value}" for key, value in SERVING_SHAPE.items())
    return "\n".join([
        format_table(f"5. serving {len(prompts)} requests, prompts 8-128 and 8-96 new tokens "
                     f"({shape}; {device.label}), {repeats} runs", seconds,
                     "one request at a time", rates, "throughput"),
        f"  KV memory at the peak ({pool['peak_alive']} requests in flight): preallocated "
        f"KVCache(context_length) per request and layer {preallocated_peak / 2**20:.2f} MiB, "
        f"paged cache {paged_peak / 2**20:.2f} MiB ({paged_peak / preallocated_peak:.1%})",
        f"  KV memory holding no token, over all steps: preallocated {waste_preallocated:.1%}, "
        f"paged {waste_paged:.1%}",
        f"  outputs: {same} of {len(prompts)} requests generate the same tokens both ways "
        f"({same_fused} of {len(prompts)} with the fused kernel)",
        f"  with PyTorch's fused attention (backend='sdpa') both ways: continuous batching "
        f"{fused_speedup:.1f}x faster than one at a time",
        f"  target: continuous batching faster than one at a time: {speedup:.1f}x -> "
        f"{_verdict(speedup > 1.0)}; paged peak below preallocated: "
        f"{_verdict(paged_peak < preallocated_peak)}",
    ])


def _gated_delta_inputs(device: _Device = CPU) -> tuple[torch.Tensor, ...]:
    batch_size, num_heads, num_tokens, head_dim, _ = LINEAR_SHAPE.values()
    generator = torch.Generator().manual_seed(0)
    shape = (batch_size, num_heads, num_tokens)
    query = torch.randn(*shape, head_dim, generator=generator)  # (B, H, T, d)
    key = torch.nn.functional.normalize(torch.randn(*shape, head_dim, generator=generator), dim=-1)
    value = torch.randn(*shape, head_dim, generator=generator)  # (B, H, T, d)
    beta = torch.rand(shape, generator=generator)  # (B, H, T)
    decay = -0.1 * torch.rand(shape, generator=generator)  # (B, H, T), log space
    return tuple(device.tensor(tensor) for tensor in (query, key, value, beta, decay))


def _hugging_face_chunk() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """transformers' ``torch_chunk_gated_delta_rule`` itself, under its kernel-hub wrappers."""
    import inspect

    from transformers.models.qwen3_next import modeling_qwen3_next

    return inspect.unwrap(modeling_qwen3_next.torch_chunk_gated_delta_rule)


def bench_linear(repeats: int, device: _Device = CPU) -> str:
    """Target 6 (chapter 18): the chunkwise delta rule against the loop and Hugging Face; decoding."""
    query, key, value, beta, decay = _gated_delta_inputs(device)
    chunk_size = LINEAR_SHAPE["chunk_size"]
    hugging_face = _hugging_face_chunk()

    def hf_layout(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.transpose(1, 2).contiguous()  # (B, H, T, ...) -> (B, T, H, ...)

    hf_inputs = [hf_layout(tensor) for tensor in (query, key, value, decay, beta)]
    variants = {
        "token loop": lambda: delta_rule(query, key, value, beta, decay=decay),
        "chunkwise (book)": lambda: delta_rule(query, key, value, beta, decay=decay,
                                               chunk_size=chunk_size),
        "transformers torch_chunk": lambda: hugging_face(*hf_inputs, chunk_size=chunk_size,
                                                         output_final_state=True),
    }
    with torch.no_grad():
        loop_out, loop_state = variants["token loop"]()
        chunk_out, chunk_state = variants["chunkwise (book)"]()
        hf_out, hf_state = variants["transformers torch_chunk"]()
        worst = max((chunk_out - loop_out).abs().max().item(),
                    (hf_out.transpose(1, 2) - loop_out).abs().max().item(),
                    (chunk_state - loop_state).abs().max().item())
        seconds = time_interleaved(variants, repeats, warmup=False, sync=device.sync)
    vs_loop = _ratio(seconds, "token loop", "chunkwise (book)")
    vs_hf = _ratio(seconds, "chunkwise (book)", "transformers torch_chunk")
    shape = ", ".join(f"{key}={value}" for key, value in LINEAR_SHAPE.items())

    d_model, num_heads, lengths = LINEAR_DECODE_SHAPE.values()
    torch.manual_seed(0)
    recurrent = device.module(GatedDeltaNet(d_model, num_heads)).eval()
    attention = device.module(MultiHeadAttention(d_model, d_model, num_heads,
                                                 context_length=max(lengths) + 64)).eval()
    head_dim = d_model // num_heads
    token = device.tensor(torch.randn(1, 1, d_model))  # (1, 1, d_model)
    decode_rows = []
    decode_repeats = max(repeats, 20)
    calls = decode_repeats + 1  # one warm-up call each
    with torch.no_grad():
        for length in lengths:
            # The memories as they stand after `length` tokens (their contents do not matter
            # for the cost of the next step); each timed call then adds one token.
            cache = KVCache(length + calls)
            filler = device.tensor(torch.randn(1, num_heads, length, head_dim))  # (1, H, L, d)
            cache.update(filler, filler)
            state = recurrent.new_cache()
            state.advance(length, device.tensor(torch.randn(1, num_heads, head_dim, head_dim)))
            timed = time_interleaved(
                {f"KVCache, L={length}": lambda cache=cache: attention(token, kv_cache=cache),
                 f"RecurrentState, L={length}": lambda state=state: recurrent(token,
                                                                              kv_cache=state)},
                decode_repeats, sync=device.sync)
            held = kv_cache_bytes(num_layers=1, batch_size=1, num_kv_heads=num_heads,
                                  head_dim=head_dim, context_length=length,
                                  bytes_per_element=filler.element_size())
            decode_rows.append((length, held, state.nbytes,
                                statistics.median(timed[f"KVCache, L={length}"]),
                                statistics.median(timed[f"RecurrentState, L={length}"])))
    lines = [
        format_table(f"6. gated delta rule forward ({shape}; {device.label}), {repeats} runs",
                     seconds, "token loop"),
        f"  outputs: max |difference| to the token loop = {worst:.2e} (chunkwise and "
        "transformers, outputs and final state)",
        f"  target: chunkwise >= 5x faster than the loop: {vs_loop:.1f}x -> "
        f"{_verdict(vs_loop >= 5.0)}; within 1.5x of transformers' torch_chunk: "
        f"{vs_hf:.2f}x -> {_verdict(vs_hf <= 1.5)}",
        f"  generating one token after L tokens (d_model={d_model}, {num_heads} heads; "
        "medians): MultiHeadAttention + KVCache against GatedDeltaNet + RecurrentState",
        f"  {'L':>7}  {'KV cache':>10}  {'state':>10}  {'ms/token KV':>11}  {'ms/token state':>14}",
    ]
    for length, cache_bytes, state_bytes, cache_s, state_s in decode_rows:
        lines.append(f"  {length:>7}  {cache_bytes / 2**20:>7.2f} MiB  {state_bytes / 2**20:>6.2f} MiB"
                     f"  {cache_s * 1e3:>11.3f}  {state_s * 1e3:>14.3f}")
    return "\n".join(lines)


def _dense_with(mask: torch.Tensor) -> Callable[..., torch.Tensor]:
    """Dense attention whose keys are those of ``mask`` ``(B, T, T)``, shared by the heads."""
    return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask[:, None])


def bench_sparse(repeats: int, device: _Device = CPU,
                 lengths: tuple[int, ...] = SPARSE_LENGTHS) -> str:
    """Target 7 (chapter 19): dense SDPA against top-k gather and block-sparse FlexAttention."""
    from torch.nn.attention.flex_attention import flex_attention

    batch_size, num_heads, head_dim, top_k, top_k_blocks, block_size = SPARSE_SHAPE.values()
    dense = lambda q, k, v, scores: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True)
    compiled = torch.compile(flex_attention)
    variants = {
        "dense SDPA (causal)": dense,
        f"top-k gather (k={top_k})": lambda q, k, v, scores: topk_attention(
            q, k, v, scores, top_k),
        f"block-sparse Flex ({top_k_blocks} blocks)": lambda q, k, v, scores: (
            block_topk_attention(q, k, v, scores, top_k_blocks, block_size=block_size,
                                 kernel=compiled)),
    }
    gather, flex = list(variants)[1:]
    lines = []
    with torch.no_grad():
        # Sanity check at a small T: top-k with k covering every key, and block-sparse with
        # every block kept, are dense causal attention.
        torch.manual_seed(0)
        small = 256
        q, k, v = (device.tensor(torch.randn(batch_size, num_heads, small, head_dim))
                   for _ in range(3))  # (B, H, T, head_dim)
        scores = device.tensor(torch.randn(batch_size, small, small))  # (B, T, T)
        expected = dense(q, k, v, scores)
        worst_small = max(
            (topk_attention(q, k, v, scores, small) - expected).abs().max().item(),
            (block_topk_attention(q, k, v, scores, small // block_size,
                                  block_size=block_size) - expected).abs().max().item())
        lines.append(f"7. sparse against dense causal attention, forward (chapter 19; "
                     f"{device.label}), {repeats} runs per length")
        lines.append(f"  T={small}, k={small} and every block kept: max |difference| to dense "
                     f"causal = {worst_small:.2e} -> {_verdict(worst_small < 1e-4)}")
        for num_tokens in lengths:
            torch.manual_seed(0)
            shape = (batch_size, num_heads, num_tokens, head_dim)
            q, k, v = (device.tensor(torch.randn(shape)) for _ in range(3))  # (B, H, T, head_dim)
            scores = device.tensor(torch.randn(batch_size, num_tokens, num_tokens))  # (B, T, T)
            skip_gather = device.name == "cpu" and num_tokens > lengths[0]
            names = [name for name in variants if not (skip_gather and name == gather)]
            calls = {name: (lambda fn=variants[name], inputs=(q, k, v, scores): fn(*inputs))
                     for name in names}
            start = time.perf_counter()
            flex_out = calls[flex]()
            device.sync()
            first_call = time.perf_counter() - start
            # Each sparse output against dense attention given the chosen keys as a mask; these
            # calls are also the warm-up.
            tiles = block_topk_mask(scores, top_k_blocks, block_size=block_size).to_dense()
            tile_mask = tiles[:, 0].repeat_interleave(block_size, 1).repeat_interleave(
                block_size, 2)[:, :num_tokens, :num_tokens].bool()  # (B, T, T)
            flex_mask = tile_mask & causal_mask(num_tokens, device=device.name)  # (B, T, T)
            del tile_mask
            worst = {"block-sparse": (flex_out - _dense_with(flex_mask)(q, k, v)).abs().max().item()}
            del flex_mask, flex_out
            if not skip_gather:
                gather_mask = topk_mask(scores, top_k)  # (B, T, T)
                worst["top-k"] = (calls[gather]()
                                  - _dense_with(gather_mask)(q, k, v)).abs().max().item()
                del gather_mask
            calls[names[0]]()
            if device.name == "cuda":
                memory = {name: device.peak_extra_mib(fn) for name, fn in calls.items()}
            else:
                memory = {name: _rss_growth_mib(fn) for name, fn in calls.items()}
            seconds = time_interleaved(calls, repeats, warmup=False, sync=device.sync)
            kept = int(tiles.sum())
            causal_tiles = tiles.size(-1) * (tiles.size(-1) + 1) // 2
            del tiles
            peak_name = "peak extra GPU memory" if device.name == "cuda" else "peak extra RSS"
            extra = {name: f"{mib:9.1f} MiB" for name, mib in memory.items()}
            lines += [
                format_table(f"  T={num_tokens} (B={batch_size}, {num_heads} heads, head_dim="
                             f"{head_dim}, block_size={block_size})", seconds,
                             "dense SDPA (causal)", extra, peak_name),
                "  outputs: max |difference| to dense SDPA with the same keys as a mask: "
                + ", ".join(f"{name} {value:.2e}" for name, value in worst.items())
                + f" -> {_verdict(max(worst.values()) < 1e-4)}",
                f"  block-sparse computes {kept:,} of the {causal_tiles:,} causal tiles "
                f"({kept / causal_tiles:.0%}); its first call at this T (compiling) took "
                f"{first_call:.0f}s, outside the timing",
            ]
            if skip_gather:
                lines.append(f"  {gather}: not run at T={num_tokens} on the CPU (too slow: "
                             f"see its time at T={lengths[0]}; its work grows like T * k, "
                             f"{num_tokens // lengths[0]}x that here)")
            del q, k, v, scores, calls
    if device.name != "cuda":
        lines.append("  peak extra RSS: VmHWM - VmRSS across one call in this process, after "
                     "malloc_trim and a reset of VmHWM (inputs and index scores already "
                     "allocated, the output counts)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, print the header and the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per row (default 5)")
    parser.add_argument("--only", choices=["multihead", "long", "decode", "window", "serving",
                                           "linear", "sparse", "kernel"],
                        action="append",
                        help="run only these tables (repeatable); 'window' (T=16384, chapter 13) "
                             "and 'linear' (chapter 18) and 'sparse' (chapter 19) and 'kernel' "
                             "(chapter 20) run only when named")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where to run (default cpu)")
    parser.add_argument("--dtype", choices=list(DTYPES), action="append",
                        help="floating dtype (repeatable; default float32 on the CPU, "
                             "float32 and bfloat16 on a GPU)")
    parser.add_argument("--memory-child", choices=[*LONG_VARIANTS, *WINDOW_VARIANTS],
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child is not None:
        _memory_child(args.memory_child, args.threads)
        return
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA device that PyTorch can use "
                     f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
    if args.device == "cpu" and args.dtype not in (None, ["float32"]):
        parser.error("on the CPU the benchmark runs in float32 only")
    dtypes = args.dtype or (["float32", "bfloat16"] if args.device == "cuda" else ["float32"])
    torch.set_num_threads(args.threads)
    only = args.only or ["multihead", "long", "decode", "serving"]
    print(header(torch.get_num_threads(), args.device), flush=True)
    started = time.perf_counter()
    for dtype in dtypes:
        device = _Device(args.device, DTYPES[dtype])
        # On the CPU the naive run at T=4096 and recomputing 512 prefixes take seconds per
        # run: fewer repeats keep the total reasonable.
        slow_repeats = args.repeats if args.device == "cuda" else max(1, min(args.repeats, 3))
        if "multihead" in only:
            print("\n" + bench_multihead(args.repeats, device), flush=True)
        if "long" in only:
            print("\n" + bench_long(slow_repeats, args.threads, device), flush=True)
        if "decode" in only:
            print("\n" + bench_decode(slow_repeats, device), flush=True)
        if "window" in only:
            print("\n" + bench_window(slow_repeats, args.threads, device), flush=True)
        if "serving" in only:
            print("\n" + bench_serving(slow_repeats, device), flush=True)
        if "linear" in only:
            print("\n" + bench_linear(slow_repeats, device), flush=True)
        if "sparse" in only:
            print("\n" + bench_sparse(slow_repeats, device), flush=True)
    if "kernel" in only:  # bfloat16 on a GPU whatever --dtype says; needs Triton
        from .kernel_benchmark import bench_kernel

        print()
        bench_kernel(args.device, log=lambda line: print(line, flush=True))
    print(f"\ntotal wall time {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
