"""The book's Triton kernel against PyTorch's: ``python -m attention_book.benchmark --only kernel``.

On a CUDA GPU, in bfloat16, for head sizes 64 and 128, causal and not, and T from 1024 to
16384 (B * T = 16384 tokens, H * head_dim = 2048, as Triton's fused-attention tutorial
sizes its runs): the time and TFLOP/s of :func:`attention_book.triton_attention.flash_attention`
and of ``F.scaled_dot_product_attention``, forward and forward + backward, with their ratio,
and ``tiled_attention`` (chapter 10's Python loop) at the two shortest lengths. Before that:
:func:`~attention_book.triton_attention.autotune` over a few block sizes, warps and stages (at
T = 4096), and the forward kernel's optimisations switched on one at a time. Times are
medians of ``triton.testing.do_bench`` (which empties the L2 cache before each run).

On the CPU the kernels run through Triton's interpreter, whose times say nothing about a GPU:
the table reports only how closely the kernels agree with PyTorch, and says so.

Taught in chapter 20.
"""

from __future__ import annotations

import datetime
import json
import math
import time

import torch
import torch.nn.functional as F

from .flash import tiled_attention
from .triton_attention import (
    KernelConfig,
    autotune,
    default_config,
    flash_attention,
    flash_attention_flops,
    flash_attention_forward,
    require_triton,
    set_default_config,
    tuning_candidates,
)

__all__ = ["bench_kernel", "results_json", "KERNEL_LENGTHS", "HEAD_DIMS", "TOKENS", "MODEL_WIDTH"]

KERNEL_LENGTHS = (1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
TOKENS = 16384  # B * T
MODEL_WIDTH = 2048  # H * head_dim
TILED_LENGTHS = (1024, 4096)  # chapter 10's Python loop: slow, so only the shorter lengths
TUNE_LENGTH = 4096
ABLATION_LENGTH = 8192
_DEVICE = "cuda"  # where the GPU tables run (a dry run on the CPU patches it)
TARGETS = {"forward": 1.3, "forward+backward": 2.0}  # at most this times PyTorch's time

_CANDIDATES = {head_dim: tuning_candidates(head_dim) for head_dim in HEAD_DIMS}


def _shape(num_tokens: int, head_dim: int) -> tuple[int, int, int, int]:
    return TOKENS // num_tokens, MODEL_WIDTH // head_dim, num_tokens, head_dim


def _inputs(num_tokens, head_dim, dtype, device, requires_grad=False, seed=0):
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = _shape(num_tokens, head_dim)
    return [torch.randn(shape, generator=generator, device=device, dtype=dtype,
                        requires_grad=requires_grad) for _ in range(3)]


def _cpu_agreement() -> str:
    """Through the interpreter: the largest errors against PyTorch, and no timing."""
    lines = ["kernel: the book's Triton kernels on the CPU, through Triton's interpreter",
             "  The interpreter runs each program in turn with NumPy: it checks the arithmetic",
             "  and the masks, but its times say nothing about a GPU, so none are reported.",
             "  Run `python -m attention_book.benchmark --device cuda --only kernel` on a GPU.",
             "  B=2, H=4, H_kv=2, T=100, head_dim=32; largest |difference| to "
             "F.scaled_dot_product_attention",
             f"  {'dtype':<10} {'causal':<7} {'output':>10} {'dQ':>10} {'dK':>10} {'dV':>10}"]
    generator = torch.Generator().manual_seed(0)
    base = [torch.randn(2, heads, 100, 32, generator=generator) for heads in (4, 2, 2)]
    grad_output = torch.randn(2, 4, 100, 32, generator=generator)
    for dtype in (torch.float32, torch.bfloat16):
        for is_causal in (False, True):
            results = []
            for fn in (flash_attention, _sdpa):
                inputs = [tensor.to(dtype).clone().requires_grad_() for tensor in base]
                output = fn(*inputs, is_causal=is_causal)
                output.backward(grad_output.to(dtype))
                results.append([output] + [tensor.grad for tensor in inputs])
            errors = [float((ours.detach().float() - theirs.detach().float()).abs().max())
                      for ours, theirs in zip(*results, strict=True)]
            lines.append(f"  {str(dtype).removeprefix('torch.'):<10} {str(is_causal):<7} "
                         + " ".join(f"{error:>10.1e}" for error in errors))
    return "\n".join(lines)


def _sdpa(query, key, value, *, is_causal=False):
    return F.scaled_dot_product_attention(query, key, value, is_causal=is_causal,
                                          enable_gqa=key.size(1) != query.size(1))


def _milliseconds(fn, grad_to_none=None) -> float:
    triton = require_triton()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                         return_mode="median"))


def _forward_and_backward(fn, inputs, grad_output, is_causal):
    def run():
        fn(*inputs, is_causal=is_causal).backward(grad_output)
    return run


def _tune(log, deadline: float) -> dict:
    """Autotune each head size (forward causal and not; backward causal) until the deadline."""
    report = {}
    for head_dim in HEAD_DIMS:
        for is_causal in (True, False):
            if time.perf_counter() > deadline:
                log(f"  autotune: out of time, d={head_dim} causal={is_causal} keeps its default")
                continue
            query, key, value = _inputs(TUNE_LENGTH, head_dim, torch.bfloat16, _DEVICE)
            candidates = _CANDIDATES[head_dim]
            started = time.perf_counter()
            results = autotune(query, key, value, is_causal=is_causal, candidates=candidates,
                               backward=is_causal)
            if is_causal:  # the backward kernels' configs serve the non-causal case too
                for kernel in ("backward_dkdv", "backward_dq"):
                    best = results[kernel][0]
                    if math.isfinite(best[1]):
                        set_default_config(kernel, head_dim, best[0], dtype=torch.bfloat16,
                                           is_causal=False)
            log(f"  autotune d={head_dim} causal={is_causal} at T={TUNE_LENGTH} "
                f"({time.perf_counter() - started:.0f}s, compiling included):")
            for kernel, rows in results.items():
                for config, milliseconds in rows:
                    log(f"    {kernel:<14} block_m={config.block_m:<4} block_n={config.block_n:<4}"
                        f" warps={config.num_warps} stages={config.num_stages}: "
                        f"{milliseconds:8.3f} ms")
                report[f"{kernel} d={head_dim} causal={is_causal}"] = [
                    [config.block_m, config.block_n, config.num_warps, config.num_stages, ms]
                    for config, ms in rows]
    return report


def _ablation(log) -> dict:
    """The causal forward kernel at one length: plain, then each optimisation switched on."""
    report = {}
    length = ABLATION_LENGTH
    log(f"  the causal forward kernel at T={length}, one optimisation at a time (bfloat16):")
    for head_dim in HEAD_DIMS:
        query, key, value = _inputs(length, head_dim, torch.bfloat16, _DEVICE)
        flops = flash_attention_flops(*_shape(length, head_dim)[:3], length, head_dim,
                                      is_causal=True)
        plain = KernelConfig(64, 64, 4, 2)
        tuned = default_config("forward", head_dim, _DEVICE, is_causal=True)
        steps = [("plain: exp, every tile masked, 64x64 tiles", plain, False, False),
                 ("+ exp2 with log2(e) in the scale", plain, True, False),
                 ("+ unmasked loop for whole tiles", plain, True, True),
                 (f"+ tuned tiles {tuned.block_m}x{tuned.block_n}, {tuned.num_warps} warps, "
                  f"{tuned.num_stages} stages", tuned, True, True)]
        for name, config, use_exp2, split_masked in steps:
            def run(config=config, use_exp2=use_exp2, split_masked=split_masked,
                    inputs=(query, key, value)):
                flash_attention_forward(*inputs, is_causal=True, config=config,
                                        use_exp2=use_exp2, split_masked=split_masked)
            milliseconds = _milliseconds(run)
            log(f"    d={head_dim:<4} {name:<58} {milliseconds:8.3f} ms "
                f"{flops / milliseconds / 1e9:7.1f} TFLOP/s")
            report[f"d={head_dim} {name}"] = milliseconds
        sdpa = _milliseconds(lambda inputs=(query, key, value): _sdpa(*inputs, is_causal=True))
        log(f"    d={head_dim:<4} {'F.scaled_dot_product_attention':<58} {sdpa:8.3f} ms "
            f"{flops / sdpa / 1e9:7.1f} TFLOP/s")
        report[f"d={head_dim} sdpa"] = sdpa
    return report


def _table(log, deadline: float) -> list[dict]:
    """Every length, head size and mask: the book's kernel, PyTorch's, and tiled_attention.

    The causal rows (the issue's targets) come first; rows left when the deadline passes are
    skipped, and the table says so.
    """
    rows = []
    log(f"  {'pass':<17} {'d':>4} {'causal':<6} {'T':>6} {'B':>3} {'H':>3}  "
        f"{'book ms':>8} {'TFLOP/s':>8}  {'sdpa ms':>8} {'TFLOP/s':>8}  {'book/sdpa':>9}  "
        f"{'tiled/sdpa':>10}")
    cases = [(pass_name, head_dim, is_causal, num_tokens) for is_causal in (True, False)
             for pass_name in ("forward", "forward+backward") for head_dim in HEAD_DIMS
             for num_tokens in KERNEL_LENGTHS]
    for index, (pass_name, head_dim, is_causal, num_tokens) in enumerate(cases):
        if time.perf_counter() > deadline:
            log(f"  out of time: {len(cases) - index} rows not measured")
            break
        rows.append(_row(log, pass_name, head_dim, is_causal, num_tokens))
    return rows


def _row(log, pass_name: str, head_dim: int, is_causal: bool, num_tokens: int) -> dict:
    backward = pass_name != "forward"
    batch, heads = _shape(num_tokens, head_dim)[:2]
    inputs = _inputs(num_tokens, head_dim, torch.bfloat16, _DEVICE, requires_grad=backward)
    flops = flash_attention_flops(batch, heads, num_tokens, num_tokens, head_dim,
                                  is_causal=is_causal, backward=backward)
    candidates = {"book": flash_attention, "sdpa": _sdpa}
    if num_tokens in TILED_LENGTHS and (not backward or num_tokens == min(TILED_LENGTHS)):
        candidates["tiled"] = tiled_attention
    times = {}
    for name, fn in candidates.items():
        if backward:
            run = _forward_and_backward(fn, inputs, torch.randn_like(inputs[0]), is_causal)
            times[name] = _milliseconds(run, grad_to_none=inputs)
        else:
            with torch.no_grad():
                times[name] = _milliseconds(lambda fn=fn: fn(*inputs, is_causal=is_causal))
    tiled = (f"{times['tiled'] / times['sdpa']:>10.1f}" if "tiled" in times else f"{'-':>10}")
    log(f"  {pass_name:<17} {head_dim:>4} {str(is_causal):<6} {num_tokens:>6} {batch:>3} "
        f"{heads:>3}  {times['book']:>8.3f} {flops / times['book'] / 1e9:>8.1f}  "
        f"{times['sdpa']:>8.3f} {flops / times['sdpa'] / 1e9:>8.1f}  "
        f"{times['book'] / times['sdpa']:>9.2f}  {tiled}")
    return {"pass": pass_name, "head_dim": head_dim, "causal": is_causal, "T": num_tokens,
            "B": batch, "H": heads, "flops": flops,
            **{f"{name}_ms": value for name, value in times.items()}}


def _targets(rows: list[dict]) -> list[str]:
    lines = []
    for pass_name, limit in TARGETS.items():
        for head_dim in HEAD_DIMS:
            ratios = [row["book_ms"] / row["sdpa_ms"] for row in rows
                      if row["pass"] == pass_name and row["head_dim"] == head_dim
                      and row["causal"] and row["T"] >= 4096]
            if ratios:
                worst = max(ratios)
                lines.append(f"  target: causal {pass_name}, d={head_dim}, T >= 4096: at most "
                             f"{limit}x PyTorch's time: worst {worst:.2f}x -> "
                             f"{'met' if worst <= limit else 'NOT met'}")
    return lines


def bench_kernel(device: str = "cpu", *, tune: bool = True, tune_seconds: float = 120.0,
                 seconds: float | None = None, log=print) -> tuple[str, dict]:
    """The kernel benchmark: the GPU tables, or the interpreter's agreement on the CPU.

    Args:
        device: ``"cuda"`` or ``"cpu"``.
        tune: autotune the kernels first (GPU only).
        tune_seconds: stop starting new autotuning runs after this many seconds.
        seconds: stop starting new rows of the table once this many seconds have passed since
            the start (default: no limit); the causal rows come first.
        log: called with each line as soon as it is measured.

    Returns:
        ``(text, results)``: the printed lines, and the numbers as a JSON-ready dict.

    Taught in chapter 20.
    """
    require_triton()
    lines: list[str] = []

    def emit(line: str) -> None:
        lines.append(line)
        log(line)

    if device != "cuda":
        text = _cpu_agreement()
        for line in text.splitlines():
            emit(line)
        return "\n".join(lines), {"device": "cpu", "interpreter_agreement": text}
    import triton

    properties = torch.cuda.get_device_properties(0)
    emit(f"kernel: the book's Triton kernels against F.scaled_dot_product_attention, bfloat16, "
         f"{properties.name}, torch {torch.__version__}, triton {triton.__version__}, "
         f"{datetime.date.today().isoformat()}")
    emit(f"  B * T = {TOKENS} tokens, H * head_dim = {MODEL_WIDTH}; times: medians of "
         f"triton.testing.do_bench (L2 emptied before each run); FLOPs: "
         f"flash_attention_flops (causal: half; backward: 2.5x forward)")
    started = time.perf_counter()
    results: dict = {"device": properties.name, "torch": torch.__version__,
                     "triton": triton.__version__, "date": datetime.date.today().isoformat()}
    if tune:
        results["autotune"] = _tune(emit, time.perf_counter() + tune_seconds)
    results["ablation"] = _ablation(emit)
    results["table"] = _table(emit, math.inf if seconds is None else started + seconds)
    for line in _targets(results["table"]):
        emit(line)
    return "\n".join(lines), results


def results_json(results: dict) -> str:
    """The results as indented JSON (for ``$OUT`` files).

    Args:
        results: what :func:`bench_kernel` returned.

    Returns:
        A JSON string.

    Taught in chapter 20.
    """
    return json.dumps(results, indent=1, default=str)
