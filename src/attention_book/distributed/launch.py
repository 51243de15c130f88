"""Start ``P`` Python processes joined by ``torch.distributed``, run a function on each, collect.

:func:`run_on_ranks` is the launcher of chapter 17: it knows nothing about attention. It opens
a small key/value store (a ``TCPStore``) on a free port of 127.0.0.1, starts one fresh Python
process per rank, which joins a gloo process group there and runs ``fn(rank, world_size,
*args)``, and returns the ranks' results in rank order. It also owns what a launcher must get
right: a timeout for starting and one for running, a rank's traceback (the first to fail)
raised in the caller as :class:`RankFailed`, and no process left behind, whatever happens.

A rank imports the function it runs by its module and name, so that function must live in an
importable module (the book's rank functions live in :mod:`attention_book.distributed`), never
in a notebook.

Taught in chapter 17.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["RankFailed", "run_on_ranks"]


class RankFailed(RuntimeError):
    """A rank started by :func:`run_on_ranks` raised; the message holds its traceback."""

    def __init__(self, message: str, rank: int, rank_traceback: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback


# The first thing a rank process runs: read its header from stdin (a pickle of strings, ints
# and bytes: no import needed), take the parent's sys.path, so that the function it runs is
# importable exactly as in the parent, then hand over to _rank_main, which unpickles it.
_BOOT = (
    "import pickle, sys\n"
    "header = pickle.load(sys.stdin.buffer)\n"
    "sys.path[:] = header['sys_path']\n"
    "from attention_book.distributed.launch import _rank_main\n"
    "_rank_main(header)\n"
)


def _check_spawnable(fn: object) -> None:
    """Raise unless the rank processes can import ``fn`` by its module and name."""
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", ""))
    if module in (None, "__main__") or "<" in qualname:
        where = "a lambda or a nested function" if "<" in qualname else "defined in __main__"
        raise TypeError(
            f"fn {qualname!r} is {where}: each rank is a new Python process that imports the "
            "function it runs by module and name, so it must be a top-level function of an "
            "importable module (a notebook's functions live in __main__ and cannot be "
            "imported; the book's rank functions live in attention_book.distributed)"
        )


def _outcome_bytes(status: tuple) -> tuple[bytes, bool]:
    """Pickle a rank's outcome; a result that cannot be pickled becomes an error outcome.

    Returns the bytes and whether the outcome is a success.
    """
    try:
        return pickle.dumps(status), status[0] == "ok"
    except Exception:  # noqa: BLE001 - an unpicklable result becomes a readable error
        error = ("error", "the result of fn could not be pickled:\n" + traceback.format_exc(),
                 time.monotonic())
        return pickle.dumps(error), False


def _write_result(path: Path, status: tuple) -> bool:
    """Write a rank's outcome atomically (the parent reads only complete files).

    Returns whether the outcome written is a success.
    """
    data, ok = _outcome_bytes(status)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return ok


def _loopback_interface() -> str | None:
    """The name of the loopback network interface ("lo" on Linux, "lo0" on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):  # not every platform lists its interfaces
        return None
    return next((name for name in names if name.startswith("lo")), None)


def _rank_main(header: dict) -> None:
    """Body of a rank process: join the gloo group, run ``fn``, write the outcome, exit."""
    result_path = Path(header["result_path"])
    exit_code = 0
    try:
        torch.set_num_threads(1)  # P processes share the machine's cores
        # Gloo binds to the address of the machine's host name unless told otherwise; the
        # ranks all live here, so keep their connections on 127.0.0.1.
        loopback = _loopback_interface()
        if loopback is not None and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback
        fn, args = pickle.loads(header["payload"])
        timeout = datetime.timedelta(seconds=header["group_timeout"])
        store = dist.TCPStore("127.0.0.1", header["port"], is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=header["rank"],
                                world_size=header["world_size"], timeout=timeout)
        Path(header["started_path"]).touch()  # every rank has joined: fn starts now
        result = fn(header["rank"], header["world_size"], *args)
        dist.destroy_process_group()
        exit_code = 0 if _write_result(result_path, ("ok", result)) else 1
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        exit_code = 1
        _write_result(result_path, ("error", traceback.format_exc(), time.monotonic()))
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit at once: a failed rank must not wait in the gloo teardown for peers that are gone.
    os._exit(exit_code)


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """Kill every rank process (and anything it started) and reap it."""
    for process in processes:
        if process.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(process.pid, signal.SIGKILL)  # its own session: kills children too
                else:
                    process.kill()
            except ProcessLookupError:
                pass
    for process in processes:
        process.wait()


def _tail(path: Path, limit: int = 2000) -> str:
    text = path.read_bytes().decode(errors="replace") if path.exists() else ""
    return text[-limit:].strip() or "(nothing)"


def run_on_ranks(fn: Callable, world_size: int, *args, timeout: float = 300.0,
                 start_timeout: float = 300.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined by gloo.

    Each rank is a fresh Python process (one thread for torch) that joins a process group
    with the gloo backend over 127.0.0.1, rendezvousing at a TCP store that this process
    opens on a free port. ``fn`` and ``args`` are pickled to the ranks, so ``fn`` must be
    a top-level function of an importable module, never one defined in a notebook. What a
    rank prints is kept out of the caller's output; it is shown when that rank fails.

    Args:
        fn: the function each rank runs, ``fn(rank, world_size, *args)``; ``torch.distributed``
            is initialised when it starts.
        world_size: the number of ranks ``P`` (>= 1).
        *args: further arguments for ``fn``, pickled (tensors included).
        timeout: seconds the ranks may run once all of them have joined the group; then
            every rank is stopped and ``TimeoutError`` is raised.
        start_timeout: seconds allowed for starting the processes and joining the group
            (each process imports torch, several seconds on a busy machine).

    Shapes:
        none: the results are whatever ``fn`` returns.

    Returns:
        The list of the ranks' return values, in rank order.

    Raises:
        RankFailed: a rank raised; the first to fail is named, with its traceback.
        TimeoutError: the ranks did not finish in time.

    No rank process outlives the call, whether it returns or raises.

    Taught in chapter 17.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    _check_spawnable(fn)
    try:
        payload = pickle.dumps((fn, args))
    except Exception as error:
        raise TypeError(f"the arguments for fn cannot be pickled to the ranks: {error}") from error

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=start_timeout))
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="attention_book_ranks_") as folder:
        folder_path = Path(folder)
        logs = [folder_path / f"rank{rank}.log" for rank in range(world_size)]
        results = [folder_path / f"rank{rank}.result" for rank in range(world_size)]
        started = [folder_path / f"rank{rank}.started" for rank in range(world_size)]
        try:
            for rank in range(world_size):
                header = {"sys_path": list(sys.path), "rank": rank, "world_size": world_size,
                          "port": store.port, "group_timeout": start_timeout + timeout,
                          "result_path": str(results[rank]),
                          "started_path": str(started[rank]), "payload": payload}
                with open(logs[rank], "wb") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=(os.name == "posix"))
                processes.append(process)
                process.stdin.write(pickle.dumps(header))
                process.stdin.close()
            return _wait_for_ranks(fn, processes, logs, results, started, timeout,
                                   start_timeout)
        finally:
            _stop(processes)
            del store


def _wait_for_ranks(fn, processes, logs, results, started, timeout, start_timeout) -> list:
    """Poll the ranks until all succeed, one fails, or time runs out."""
    world_size = len(processes)
    name = getattr(fn, "__qualname__", repr(fn))
    deadline = time.monotonic() + start_timeout
    running_since = None
    first_failure = None
    while True:
        time.sleep(0.02)
        now = time.monotonic()
        if running_since is None and all(path.exists() for path in started):
            running_since = now
            deadline = now + timeout
        codes = [process.poll() for process in processes]
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed and first_failure is None:
            first_failure = now
        # After a first failure, give the others a moment: a rank blocked in a collective with
        # the failed one fails too, and the earliest traceback is the cause.
        if first_failure is not None and (all(code is not None for code in codes)
                                          or now > first_failure + 2.0):
            _stop(processes)
            raise _rank_failure(name, world_size, logs, results, processes)
        if first_failure is None and all(code == 0 for code in codes):
            return [pickle.loads(path.read_bytes())[1] for path in results]
        if first_failure is None and now > deadline:
            _stop(processes)
            waiting = [rank for rank, code in enumerate(codes) if code is None]
            if running_since is None:
                raise TimeoutError(
                    f"the {world_size} ranks did not all start within start_timeout="
                    f"{start_timeout} s; ranks {waiting} had not finished starting; all "
                    "ranks were stopped")
            raise TimeoutError(
                f"{name} did not finish within timeout={timeout} s on every rank: ranks "
                f"{waiting} were still running; all {world_size} ranks were stopped")


def _rank_failure(name, world_size, logs, results, processes) -> RankFailed:
    """The error of the rank that failed first (earliest traceback), with its output."""
    failures = []
    for rank, (path, process) in enumerate(zip(results, processes, strict=True)):
        if path.exists():
            outcome = pickle.loads(path.read_bytes())
            if outcome[0] == "error":
                failures.append((outcome[2], rank, outcome[1]))
        elif process.returncode not in (0, None) and process.returncode != -signal.SIGKILL:
            failures.append((math.inf, rank,
                             f"the process exited with code {process.returncode} without a "
                             f"result; its last output:\n{_tail(logs[rank])}"))
    if not failures:  # killed from outside: report what is known
        failures.append((math.inf, 0, f"the ranks stopped without a result; rank 0's last "
                                       f"output:\n{_tail(logs[0])}"))
    failures.sort(key=lambda item: (item[0], item[1]))
    _, rank, rank_traceback = failures[0]
    others = [r for _, r, _ in failures[1:]]
    also = f" (ranks {others} failed after it)" if others else ""
    output = _tail(logs[rank])
    message = (f"rank {rank} of {world_size} failed in {name}{also}:\n{rank_traceback}"
               + (f"\nwhat rank {rank} printed:\n{output}" if output != "(nothing)" else ""))
    return RankFailed(message, rank, rank_traceback)
