#!/usr/bin/env python3
"""Chapter 20's GPU check, in one run of at most about five minutes on one H100.

usage (from the repository root, on the GPU machine, no install needed):

    PYTHONPATH=src python3 tools/gpu_kernel_check.py

1. ``tests/test_triton_attention.py --device cuda``: every kernel test compiled for the GPU
   (forward, log-sum-exp and gradients against float64 and PyTorch, causal and not, grouped
   heads, ragged lengths, float32, bfloat16 and float16, every bad input), shared among four
   pytest processes that compile at once. Up to 150 s.
2. The kernel benchmark (``python -m attention_book.benchmark --device cuda --only kernel``):
   autotuning over a few block sizes, warps and stages (up to 80 s, compiling included), the
   causal forward kernel with one optimisation switched on at a time, then the table of the
   book's kernel against ``F.scaled_dot_product_attention`` (and ``tiled_attention`` at the
   shortest lengths), forward and forward + backward, bfloat16, head sizes 64 and 128, causal
   and not, T from 1024 to 16384, and the issue's targets (met / NOT met).

Everything goes to stdout as it is measured; with ``$OUT`` set, the same text also goes to
``$OUT/gpu_kernel_check.txt``, the pytest output to ``$OUT/tests.txt`` and the numbers to
``$OUT/kernel_benchmark.json``. A failing step is reported and the next one still runs; the
exit status is 1 when the tests failed or a step crashed.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
TEST_SECONDS = int(os.environ.get("GPU_CHECK_TEST_SECONDS", 150))
PROCESSES = 4
TOTAL_SECONDS = 300  # the benchmark starts no new row of its table after this
STARTED = time.perf_counter()
_LOG: list[str] = []


def log(line: str = "") -> None:
    print(line, flush=True)
    _LOG.append(line)
    if OUT is not None:
        (OUT / "gpu_kernel_check.txt").write_text("\n".join(_LOG) + "\n")


def _pytest(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--device", "cuda", "-o", "addopts=", "-p",
            "no:cacheprovider", *arguments]


def run_tests() -> bool:
    """The kernel tests on CUDA, in PROCESSES pytest processes at once (compiling dominates)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1",  # what ran before a timeout is kept
                   "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    collected = subprocess.run(_pytest("--collect-only", "-q", "tests/test_triton_attention.py"),
                               cwd=ROOT, env=environment, capture_output=True, text=True,
                               timeout=120)
    node_ids = [line for line in collected.stdout.splitlines() if "::" in line]
    if collected.returncode != 0 or not node_ids:
        log(collected.stdout[-3000:] + collected.stderr[-3000:])
        log("tests: FAILED to collect")
        return False
    shares = [node_ids[index::PROCESSES] for index in range(PROCESSES)]
    log(f"$ pytest tests/test_triton_attention.py --device cuda: {len(node_ids)} tests in "
        f"{PROCESSES} processes")
    processes = [subprocess.Popen(_pytest("-q", "-rfE", *share), cwd=ROOT, env=environment,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for share in shares if share]
    outputs, passed = [], True
    for process in processes:
        try:
            output, _ = process.communicate(
                timeout=max(1.0, TEST_SECONDS - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0] + f"\nTIMED OUT after {TEST_SECONDS} s"
        passed = passed and process.returncode == 0
        outputs.append(output)
    text = "\n".join(outputs)
    if OUT is not None:
        (OUT / "tests.txt").write_text(text)
    summary = [line for line in text.splitlines()
               if line.startswith(("FAILED", "ERROR", "TIMED OUT")) or " passed" in line
               or " failed" in line or line.startswith("E ")]
    for line in summary[-60:]:
        log("  " + line)
    log(f"tests: {'PASSED' if passed else 'FAILED'} in {time.perf_counter() - started:.0f} s")
    return passed


def run_benchmark() -> bool:
    sys.path.insert(0, str(ROOT / "src"))
    from attention_book.kernel_benchmark import bench_kernel, results_json

    started = time.perf_counter()
    budget = max(90.0, TOTAL_SECONDS - (started - STARTED))  # rows stop when it is spent
    _, results = bench_kernel("cuda", tune=True, tune_seconds=80, seconds=budget, log=log)
    if OUT is not None:
        (OUT / "kernel_benchmark.json").write_text(results_json(results))
    log(f"benchmark: done in {time.perf_counter() - started:.0f} s")
    return True


def main() -> int:
    import torch

    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    log(f"python {platform.python_version()}, torch {torch.__version__}, triton {triton_version}, "
        f"CUDA {torch.version.cuda}")
    if not torch.cuda.is_available():
        log("no CUDA device: this script checks the kernels on a GPU")
        return 1
    log(f"GPU: {torch.cuda.get_device_name(0)}")
    ok = True
    for step in (run_tests, run_benchmark):
        log(f"\n== {step.__name__} ({time.perf_counter() - started:.0f} s so far)")
        try:
            ok = step() and ok
        except Exception:  # noqa: BLE001 - report it and go on to the next step
            for line in traceback.format_exc().splitlines():
                log("  " + line)
            ok = False
    log(f"\ntotal {time.perf_counter() - started:.0f} s; {'all steps passed' if ok else 'FAILURES above'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
