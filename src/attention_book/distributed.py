"""Attention over a sequence split across devices, with ``torch.distributed``.

One device cannot hold the activations of a very long sequence, so context parallelism
splits the sequence: each of ``P`` ranks holds ``T / P`` positions of the queries, keys and
values, ``(B, H, T / P, d)``, and returns its positions of the output. Everything a
Transformer does token by token needs nothing from the other ranks; attention does, and
this module holds the three ways of supplying it:

- :func:`allgather_kv_attention`: every rank gathers all keys and values, then attends
  with its own queries (the Llama 3 way);
- :func:`ring_attention`: the key/value blocks travel around a ring of ranks, one hop per
  step, and each rank folds every block into chapter 10's online softmax (Ring Attention);
- :func:`ulysses_attention`: an all-to-all turns the split by positions into a split by
  heads, each rank attends over the whole sequence for its heads, and a second all-to-all
  turns the output back (DeepSpeed-Ulysses).

:func:`shard_positions` says which positions a rank holds: a ``"contiguous"`` block, or the
``"zigzag"`` pair of chunks ``r`` and ``2P - 1 - r`` that balances the causal work.
:func:`run_on_ranks` starts ``P`` processes joined by the gloo backend over 127.0.0.1, so
all of it runs on one laptop; :func:`count_traffic` counts the bytes each rank sends and
receives and the scores it computes. Functions meant to run in the ranks live here, in the
package, because each rank process imports the function it runs by its module and name.

Taught in chapter 17.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "LAYOUTS",
    "METHODS",
    "RankFailed",
    "run_on_ranks",
    "shard_positions",
    "shard",
    "unshard",
    "Traffic",
    "count_traffic",
    "allgather_kv_attention",
    "ring_attention",
    "ulysses_attention",
    "simulate_ring_attention",
    "AttentionCase",
    "CaseResult",
    "run_attention_cases",
]

LAYOUTS = ("contiguous", "zigzag")


# --------------------------------------------------------------------------- starting ranks


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
    "from attention_book.distributed import _rank_main\n"
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


# --------------------------------------------------------------------------- layouts


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_layout(layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_divisible(seq_len: int, world_size: int, layout: str) -> None:
    if seq_len % world_size:
        raise ValueError(
            f"the sequence length T = {seq_len} is not divisible by world_size = "
            f"{world_size}: every rank must hold the same number of positions")
    if layout == "zigzag" and seq_len % (2 * world_size):
        raise ValueError(
            f"layout 'zigzag' cuts the sequence into 2 * world_size = {2 * world_size} "
            f"chunks, but T = {seq_len} is not divisible by {2 * world_size}")


def shard_positions(seq_len: int, world_size: int, rank: int,
                    layout: str = "contiguous") -> torch.Tensor:
    """The sequence positions that one rank holds.

    ``"contiguous"``: rank ``r`` holds the block ``r * T/P … (r + 1) * T/P - 1``.
    ``"zigzag"``: the sequence is cut into ``2P`` chunks of ``T / 2P`` and rank ``r`` holds
    chunks ``r`` and ``2P - 1 - r``, an early and a late one, so that with a causal mask every
    rank has the same work (the layout Llama 3's context parallelism uses).

    Args:
        seq_len: ``T``, the length of the whole sequence.
        world_size: ``P``, the number of ranks.
        rank: which rank, ``0 <= rank < P``.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        returns ``(T / P,)``.

    Returns:
        The positions in increasing order, an int64 tensor.

    Raises:
        ValueError: ``T`` is not divisible by ``P`` (by ``2P`` for zigzag), or ``rank`` is
            out of range.

    Taught in chapter 17.
    """
    _check_int("seq_len", seq_len, 1)
    _check_int("world_size", world_size, 1)
    _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    _check_layout(layout)
    _check_divisible(seq_len, world_size, layout)
    if layout == "contiguous":
        size = seq_len // world_size
        return torch.arange(rank * size, (rank + 1) * size)  # (T/P,)
    chunk = seq_len // (2 * world_size)
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk),
                      torch.arange(late * chunk, (late + 1) * chunk)])  # (T/P,)


def shard(x: torch.Tensor, world_size: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """The positions of ``x`` that one rank holds (dim -2 is the sequence).

    Args:
        x: a whole sequence, e.g. the queries of every position.
        world_size: ``P``.
        rank: which rank.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        x ``(..., T, d)``; returns ``(..., T / P, d)``.

    Returns:
        ``x[..., shard_positions(T, P, rank, layout), :]``, a new tensor.

    Taught in chapter 17.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError("x must be a tensor of at least 2 dims (..., T, d)")
    positions = shard_positions(x.size(-2), world_size, rank, layout)  # (T/P,)
    return x[..., positions, :]  # (..., T/P, d)


def unshard(shards: Sequence[torch.Tensor], layout: str = "contiguous") -> torch.Tensor:
    """Put the ranks' shards back into one sequence: the inverse of :func:`shard`.

    Args:
        shards: one tensor per rank, in rank order.
        layout: the layout they were cut with.

    Shapes:
        each shard ``(..., T / P, d)``; returns ``(..., T, d)``.

    Returns:
        The whole sequence, each shard at the positions its rank holds.

    Taught in chapter 17.
    """
    _check_layout(layout)
    if not shards or any(not isinstance(s, torch.Tensor) or s.dim() < 2 for s in shards):
        raise ValueError("shards must be a non-empty list of tensors (..., T / P, d)")
    world_size, local = len(shards), shards[0].size(-2)
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"the shards must have one shape, got {[tuple(s.shape) for s in shards]}")
    seq_len = world_size * local
    whole = shards[0].new_empty(*shards[0].shape[:-2], seq_len, shards[0].size(-1))  # (..., T, d)
    for rank, piece in enumerate(shards):
        whole[..., shard_positions(seq_len, world_size, rank, layout), :] = piece
    return whole


# --------------------------------------------------------------------------- counting traffic


@dataclasses.dataclass
class Traffic:
    """What one rank sent, received and computed while :func:`count_traffic` was open.

    The bytes are those of the attention tensors this module passes to the collectives
    (queries, keys, values, outputs and their gradients), counted as each rank's share:
    an all-gather of ``n`` bytes per rank sends ``n`` to each of the ``P - 1`` others and
    receives ``P - 1`` pieces of ``n``. The small exchange of shapes that each attention
    call starts with, to check its input, is not counted.

    Attributes:
        bytes_sent: bytes this rank sent to the others.
        bytes_received: bytes this rank received.
        score_pairs: (query, key) scores this rank computed, all batches and heads together
            (the masked ones of a tile crossed by the causal diagonal included).
        tiles: blocks of scores computed; a block wholly in the future is skipped.
        pairs_per_step: for :func:`ring_attention`, the scores computed at each ring step.
        calls: ``(collective, bytes sent, bytes received)`` for each call, in order.

    Taught in chapter 17.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    score_pairs: int = 0
    tiles: int = 0
    pairs_per_step: list[int] = dataclasses.field(default_factory=list)
    calls: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)


_METERS: list[Traffic] = []


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count the bytes and the scores of the attention calls made inside the block.

    Args:
        none.

    Shapes:
        none.

    Returns:
        A context manager that yields a :class:`Traffic`, filled in as the block runs
        (forward passes, and backward passes that run inside the block).

    Taught in chapter 17.
    """
    traffic = Traffic()
    _METERS.append(traffic)
    try:
        yield traffic
    finally:
        _METERS.remove(traffic)


def _record(name: str, sent: int, received: int) -> None:
    for traffic in _METERS:
        traffic.bytes_sent += sent
        traffic.bytes_received += received
        traffic.calls.append((name, sent, received))


def _record_work(score_pairs: int, tiles: int) -> None:
    for traffic in _METERS:
        traffic.score_pairs += score_pairs
        traffic.tiles += tiles


def _record_step(score_pairs: int) -> None:
    for traffic in _METERS:
        traffic.pairs_per_step.append(score_pairs)


# --------------------------------------------------------------------------- groups and checks


def _group_of(group) -> tuple[object, int, int]:
    """``(group, rank in it, its size)``, with clear errors for a group that cannot be used."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "torch.distributed is not initialised: call this function inside the ranks "
            "(e.g. in a function run by attention_book.distributed.run_on_ranks) or after "
            "torch.distributed.init_process_group(...)")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of "
                         "the group it was given")
    return group, rank, dist.get_world_size(group)


def _peer(group, rank: int) -> int:
    """The global rank of the group's rank ``rank`` (point-to-point calls use global ranks)."""
    return dist.get_global_rank(group, rank)


def _check_shards(query, key, value, is_causal, group, layout) -> tuple[object, int, int, int]:
    """Check the local shards and that every rank holds the same shapes; return the group."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be a shard (B, H, T / P, d), got shape "
                             f"{tuple(tensor.shape)}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    _check_layout(layout)
    if query.shape[:3] != key.shape[:3] or key.shape[:3] != value.shape[:3]:
        raise ValueError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} must share (B, H, T / P)")
    if query.size(-1) != key.size(-1):
        raise ValueError(f"query and key must have the same head_dim, got {query.size(-1)} "
                         f"and {key.size(-1)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, "
                        f"{key.dtype} and {value.dtype}")
    group, rank, world_size = _group_of(group)
    # Every rank checks every rank's shapes, so all of them raise the same error together
    # instead of some of them blocking in a collective that the others never join.
    mine = torch.tensor([*query.shape, value.size(-1)], dtype=torch.int64)  # (5,)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(everyone, mine, group=group)
    local_lengths = [int(shape[2]) for shape in everyone]
    if len(set(local_lengths)) > 1:
        raise ValueError(
            f"the ranks hold {local_lengths} positions: a sequence of T = {sum(local_lengths)} "
            f"is not divisible by world_size = {world_size}, so it cannot be split evenly")
    if any(not torch.equal(shape, everyone[0]) for shape in everyone):
        raise ValueError("the ranks' shards differ in (B, H, T / P, head_dim, value dim): "
                         f"{[tuple(shape.tolist()) for shape in everyone]}")
    if layout == "zigzag" and query.size(2) % 2:
        raise ValueError(
            f"layout 'zigzag' cuts the sequence into 2 * world_size = {2 * world_size} "
            f"chunks, but T = {world_size * query.size(2)} is not divisible by "
            f"{2 * world_size}")
    return group, rank, world_size, world_size * query.size(2)


# --------------------------------------------------------------------------- local attention


def _chunk_of(seq_len: int, world_size: int, layout: str) -> int:
    """The side of a tile: the layout's chunk, within which positions are consecutive."""
    return seq_len // world_size if layout == "contiguous" else seq_len // (2 * world_size)


def _pieces(length: int, chunk: int) -> list[slice]:
    return [slice(start, start + chunk) for start in range(0, length, chunk)]


def _tile_kind(q_pos: torch.Tensor, k_pos: torch.Tensor, is_causal: bool) -> str:
    """``"full"``, ``"skip"`` or ``"diagonal"`` for two runs of consecutive positions."""
    if not is_causal or int(k_pos[-1]) <= int(q_pos[0]):
        return "full"  # every query may see every key
    if int(k_pos[0]) > int(q_pos[-1]):
        return "skip"  # every key lies in every query's future
    return "diagonal"


def _tile(q, q_pos, k, k_pos, v, kind, scale):
    """One tile of attention: its normalised output and each row's log-sum-exp."""
    attn_scores = q @ k.transpose(-2, -1) * scale  # (B, H, Cq, Ck)
    if kind == "diagonal":
        future = k_pos[None, :] > q_pos[:, None]  # (Cq, Ck)
        attn_scores = attn_scores.masked_fill(future, float("-inf"))
    log_sum_exp = torch.logsumexp(attn_scores, dim=-1)  # (B, H, Cq)
    # Every row of a computed tile sees at least one key (its own position on the
    # diagonal), so the log-sum-exp is finite.
    attn_weights = torch.exp(attn_scores - log_sum_exp.unsqueeze(-1))  # (B, H, Cq, Ck)
    return attn_weights @ v, log_sum_exp  # (B, H, Cq, d_v), (B, H, Cq)


def _merge(out_a, lse_a, out_b, lse_b):
    """Merge two partial attention results over disjoint keys (log-sum-exp form).

    ``out`` is each part's normalised output and ``lse`` its log-sum-exp
    ``L = m + log(l)``; the union's weights are ``exp(L_a - L)`` and ``exp(L_b - L)``.
    """
    log_sum_exp = torch.logaddexp(lse_a, lse_b)  # (B, H, C)
    weight_a = torch.exp(lse_a - log_sum_exp).unsqueeze(-1)  # (B, H, C, 1)
    weight_b = torch.exp(lse_b - log_sum_exp).unsqueeze(-1)  # (B, H, C, 1)
    return out_a * weight_a + out_b * weight_b, log_sum_exp


def _attend(query, q_pos, key, k_pos, value, chunk, is_causal, states=None):
    """Fold the tiles of ``query`` against one block of keys into the running states.

    ``states`` holds one ``(out, lse)`` per chunk of queries (``None`` before any key). The
    number of scores and tiles computed is recorded in the open :func:`count_traffic` meters.
    Differentiable: autograd follows it when it runs with gradients on.
    """
    scale = 1.0 / math.sqrt(query.size(-1))
    q_pieces, k_pieces = _pieces(query.size(-2), chunk), _pieces(key.size(-2), chunk)
    states = [None] * len(q_pieces) if states is None else list(states)
    pairs = tiles = 0
    batch_heads = query.size(0) * query.size(1)
    for index, q_piece in enumerate(q_pieces):
        for k_piece in k_pieces:
            kind = _tile_kind(q_pos[q_piece], k_pos[k_piece], is_causal)
            if kind == "skip":
                continue
            part = _tile(query[..., q_piece, :], q_pos[q_piece], key[..., k_piece, :],
                         k_pos[k_piece], value[..., k_piece, :], kind, scale)
            states[index] = part if states[index] is None else _merge(*states[index], *part)
            pairs += batch_heads * (q_piece.stop - q_piece.start) * (k_piece.stop - k_piece.start)
            tiles += 1
    _record_work(pairs, tiles)
    return states, pairs


def _finish(states) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the query chunks' states into the output and its log-sum-exp."""
    out = torch.cat([state[0] for state in states], dim=-2)  # (B, H, T_local, d_v)
    log_sum_exp = torch.cat([state[1] for state in states], dim=-1)  # (B, H, T_local)
    return out, log_sum_exp


# --------------------------------------------------------------------------- collectives


class _AllGatherSequence(torch.autograd.Function):
    """All-gather along the sequence (dim 2); its backward is a reduce-scatter."""

    @staticmethod
    def forward(ctx, shard_, group, world_size):
        ctx.group, ctx.world_size = group, world_size
        shard_ = shard_.contiguous()
        pieces = [torch.empty_like(shard_) for _ in range(world_size)]
        dist.all_gather(pieces, shard_, group=group)
        _record("all_gather", (world_size - 1) * shard_.nbytes, (world_size - 1) * shard_.nbytes)
        return torch.cat(pieces, dim=2)  # (B, H, T, d), in rank order

    @staticmethod
    def backward(ctx, grad_whole):
        # Every rank used every shard, so a shard's gradient is the sum over all ranks of
        # their gradient for it: a reduce-scatter of the (B, H, T, d) gradients.
        pieces = [piece.contiguous() for piece in grad_whole.chunk(ctx.world_size, dim=2)]
        grad_shard = torch.empty_like(pieces[0])  # (B, H, T/P, d)
        dist.reduce_scatter(grad_shard, pieces, group=ctx.group)
        nbytes = (ctx.world_size - 1) * grad_shard.nbytes
        _record("reduce_scatter", nbytes, nbytes)
        return grad_shard, None, None


class _AllToAll(torch.autograd.Function):
    """Split ``x`` along ``split_dim`` into ``P`` parts, send part ``j`` to rank ``j``, and
    concatenate the parts received along ``cat_dim``; the backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, group, world_size, rank, split_dim, cat_dim):
        ctx.args = (group, world_size, rank, cat_dim, split_dim)  # the reverse
        return _all_to_all(x, group, world_size, rank, split_dim, cat_dim)

    @staticmethod
    def backward(ctx, grad):
        return (_all_to_all(grad, *ctx.args), None, None, None, None, None)


def _all_to_all(x, group, world_size, rank, split_dim, cat_dim):
    outgoing = [part.contiguous() for part in x.chunk(world_size, dim=split_dim)]
    incoming = [torch.empty_like(part) for part in outgoing]
    dist.all_to_all(incoming, outgoing, group=group)
    sent = sum(part.nbytes for index, part in enumerate(outgoing) if index != rank)
    received = sum(part.nbytes for index, part in enumerate(incoming) if index != rank)
    _record("all_to_all", sent, received)
    return torch.cat(incoming, dim=cat_dim)


def _pass_along_ring(tensors, group, world_size, rank):
    """Send the tensors to the next rank and receive the previous rank's, asynchronously.

    Returns the pending requests and the buffers that will hold what arrives.
    """
    packed = torch.cat([tensor.reshape(-1) for tensor in tensors])  # one message
    arriving = torch.empty_like(packed)
    requests = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, packed, _peer(group, (rank + 1) % world_size), group),
        dist.P2POp(dist.irecv, arriving, _peer(group, (rank - 1) % world_size), group),
    ])
    _record("send/recv", packed.nbytes, arriving.nbytes)
    return requests, arriving


def _unpack(packed, like):
    """Cut one received message back into tensors shaped like ``like``."""
    tensors, start = [], 0
    for tensor in like:
        tensors.append(packed[start:start + tensor.numel()].view_as(tensor))
        start += tensor.numel()
    return tensors


# --------------------------------------------------------------------------- the three methods


def allgather_kv_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                           group=None, is_causal: bool = False,
                           layout: str = "contiguous") -> torch.Tensor:
    """Context-parallel attention that all-gathers the keys and values (the Llama 3 way).

    Each rank gathers the keys and values of every rank, ``(B, H, T, d)``, and attends with
    its own queries. With ``is_causal`` the mask follows the true sequence positions of the
    layout, and tiles wholly in a query's future are skipped. Gradients flow: the backward
    of the all-gather is a reduce-scatter of the key and value gradients.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask of the whole sequence.
        layout: how the sequence was split, ``"contiguous"`` or ``"zigzag"``
            (:func:`shard_positions`).

    Shapes:
        query, key ``(B, H, T / P, d)``, value ``(B, H, T / P, d_v)``;
        returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output over the whole sequence.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group, layout)
    key_all = _AllGatherSequence.apply(key, group, world_size)  # (B, H, T, d), rank order
    value_all = _AllGatherSequence.apply(value, group, world_size)  # (B, H, T, d_v)
    k_pos = torch.cat([shard_positions(seq_len, world_size, source, layout)
                       for source in range(world_size)])  # (T,)
    q_pos = shard_positions(seq_len, world_size, rank, layout)  # (T/P,)
    chunk = _chunk_of(seq_len, world_size, layout)
    states, _ = _attend(query, q_pos, key_all, k_pos, value_all, chunk, is_causal)
    return _finish(states)[0]  # (B, H, T/P, d_v)


class _RingAttention(torch.autograd.Function):
    """Ring attention: forward with the online softmax, backward recomputed from the
    log-sum-exp while the key/value blocks and their gradients travel around the ring."""

    @staticmethod
    def forward(ctx, query, key, value, group, rank, world_size, seq_len, is_causal, layout):
        chunk = _chunk_of(seq_len, world_size, layout)
        q_pos = shard_positions(seq_len, world_size, rank, layout)  # (T/P,)
        states = None
        block = (key, value)
        for step in range(world_size):
            source = (rank - step) % world_size  # whose keys and values this rank holds now
            if step < world_size - 1:  # send them on while computing with them
                requests, arriving = _pass_along_ring(block, group, world_size, rank)
            k_pos = shard_positions(seq_len, world_size, source, layout)
            states, pairs = _attend(query, q_pos, block[0], k_pos, block[1], chunk, is_causal,
                                    states)
            _record_step(pairs)
            if step < world_size - 1:
                for request in requests:
                    request.wait()
                block = _unpack(arriving, block)
        out, log_sum_exp = _finish(states)  # (B, H, T/P, d_v), (B, H, T/P)
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        ctx.args = (group, rank, world_size, seq_len, is_causal, layout)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, log_sum_exp = ctx.saved_tensors
        group, rank, world_size, seq_len, is_causal, layout = ctx.args
        scale = 1.0 / math.sqrt(query.size(-1))
        chunk = _chunk_of(seq_len, world_size, layout)
        q_pos = shard_positions(seq_len, world_size, rank, layout)
        # FlashAttention-2's D_i = sum_j a_ij dP_ij = dO_i . O_i, one number per query.
        delta = (grad_out * out).sum(dim=-1)  # (B, H, T/P)
        grad_query = torch.zeros_like(query)
        block = (key, value, torch.zeros_like(key), torch.zeros_like(value))
        for step in range(world_size):
            source = (rank - step) % world_size
            k_block, v_block, grad_k, grad_v = block
            grad_k, grad_v = grad_k.clone(), grad_v.clone()
            k_pos = shard_positions(seq_len, world_size, source, layout)
            for q_piece in _pieces(query.size(-2), chunk):
                for k_piece in _pieces(key.size(-2), chunk):
                    kind = _tile_kind(q_pos[q_piece], k_pos[k_piece], is_causal)
                    if kind == "skip":
                        continue
                    q_tile, k_tile = query[..., q_piece, :], k_block[..., k_piece, :]
                    attn_scores = q_tile @ k_tile.transpose(-2, -1) * scale  # (B, H, Cq, Ck)
                    if kind == "diagonal":
                        future = k_pos[k_piece][None, :] > q_pos[q_piece][:, None]
                        attn_scores = attn_scores.masked_fill(future, float("-inf"))
                    # The weights, rebuilt exactly from the saved log-sum-exp (chapter 10).
                    attn_weights = torch.exp(attn_scores - log_sum_exp[..., q_piece, None])
                    grad_o = grad_out[..., q_piece, :]  # (B, H, Cq, d_v)
                    grad_v[..., k_piece, :] += attn_weights.transpose(-2, -1) @ grad_o
                    grad_weights = grad_o @ v_block[..., k_piece, :].transpose(-2, -1)
                    grad_scores = attn_weights * (grad_weights - delta[..., q_piece, None])
                    grad_query[..., q_piece, :] += grad_scores @ k_tile * scale
                    grad_k[..., k_piece, :] += grad_scores.transpose(-2, -1) @ q_tile * scale
            # The block moves on with its gradients; after P hops they are home again.
            if step < world_size - 1:
                moving = (k_block, v_block, grad_k, grad_v)
            else:
                moving = (grad_k, grad_v)
            if world_size > 1:
                requests, arriving = _pass_along_ring(moving, group, world_size, rank)
                for request in requests:
                    request.wait()
                block = _unpack(arriving, moving)
            else:
                block = moving
        grad_key, grad_value = block[-2], block[-1]
        return grad_query, grad_key, grad_value, None, None, None, None, None, None


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   group=None, is_causal: bool = False,
                   layout: str = "contiguous") -> torch.Tensor:
    """Ring attention: key/value blocks travel around the ranks into an online softmax.

    At step ``s`` rank ``r`` holds the keys and values of rank ``r - s``; it sends them on to
    rank ``r + 1`` while it folds them into chapter 10's online softmax, kept in
    log-sum-exp form, ``(output, L)`` per query. After ``P`` steps it has seen every block,
    yet never held more than two. With ``is_causal`` a tile wholly in the future is
    skipped: with the contiguous layout the early ranks then sit idle, with zigzag every
    rank does the same work at every step. The backward pass is FlashAttention's:
    it recomputes each tile's weights from the saved log-sum-exp while the blocks travel
    around the ring again, carrying their key and value gradients back home.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask of the whole sequence.
        layout: how the sequence was split, ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        query, key ``(B, H, T / P, d)``, value ``(B, H, T / P, d_v)``;
        returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output over the whole sequence.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group, layout)
    return _RingAttention.apply(query, key, value, group, rank, world_size, seq_len,
                                is_causal, layout)


def ulysses_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                      group=None, is_causal: bool = False) -> torch.Tensor:
    """DeepSpeed-Ulysses: trade the split by positions for a split by heads, and back.

    An all-to-all sends head group ``j`` of this rank's positions to rank ``j``; rank ``j``
    then holds all ``T`` positions of ``H / P`` heads, attends over the whole sequence (no
    layout needed: every rank has every position), and a second all-to-all sends each rank
    its positions of every head. Gradients flow: the backward of an all-to-all is the
    reverse all-to-all. The shards must be contiguous.

    Args:
        query: this rank's queries.
        key: this rank's keys.
        value: this rank's values.
        group: the process group (default: every rank).
        is_causal: apply the causal mask.

    Shapes:
        query, key ``(B, H, T / P, d)``, value ``(B, H, T / P, d_v)``, ``H`` divisible by
        ``P``; returns ``(B, H, T / P, d_v)``.

    Returns:
        This rank's positions of the attention output.

    Taught in chapter 17.
    """
    group, rank, world_size, seq_len = _check_shards(query, key, value, is_causal, group,
                                                     "contiguous")
    num_heads = query.size(1)
    if num_heads % world_size:
        raise ValueError(
            f"ulysses_attention gives each rank num_heads / world_size heads: num_heads "
            f"({num_heads}) must be divisible by world_size ({world_size})")
    # Split the heads (dim 1) over the ranks and gather the sequence (dim 2).
    q_heads = _AllToAll.apply(query, group, world_size, rank, 1, 2)  # (B, H/P, T, d)
    k_heads = _AllToAll.apply(key, group, world_size, rank, 1, 2)  # (B, H/P, T, d)
    v_heads = _AllToAll.apply(value, group, world_size, rank, 1, 2)  # (B, H/P, T, d_v)
    positions = torch.arange(seq_len)  # (T,)
    states, _ = _attend(q_heads, positions, k_heads, positions, v_heads,
                        seq_len // world_size, is_causal)
    out_heads = _finish(states)[0]  # (B, H/P, T, d_v)
    return _AllToAll.apply(out_heads, group, world_size, rank, 2, 1)  # (B, H, T/P, d_v)


METHODS = {
    "allgather": allgather_kv_attention,
    "ring": ring_attention,
    "ulysses": ulysses_attention,
}


# --------------------------------------------------------------------------- one process


def simulate_ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            world_size: int, *, is_causal: bool = False,
                            layout: str = "contiguous") -> torch.Tensor:
    """Ring attention with ``P`` simulated ranks in one process, for reading and testing.

    The same algorithm as :func:`ring_attention`, with the ranks as a loop: at step ``s``
    simulated rank ``r`` folds the block of rank ``(r - s) mod P`` into its online softmax.
    No process is started and nothing is sent.

    Args:
        query: the queries of the whole sequence.
        key: the keys of the whole sequence.
        value: the values of the whole sequence.
        world_size: ``P``, the number of simulated ranks.
        is_causal: apply the causal mask.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Shapes:
        query, key ``(B, H, T, d)``, value ``(B, H, T, d_v)``; returns ``(B, H, T, d_v)``.

    Returns:
        The attention output of the whole sequence, put back together from the ranks.

    Taught in chapter 17.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(f"{name} must be a tensor (B, H, T, d)")
    seq_len = query.size(2)
    positions = [shard_positions(seq_len, world_size, rank, layout)
                 for rank in range(world_size)]  # raises for a length that does not divide
    chunk = _chunk_of(seq_len, world_size, layout)
    states = [None] * world_size
    for step in range(world_size):
        for rank in range(world_size):
            source = (rank - step) % world_size
            states[rank], _ = _attend(query[..., positions[rank], :], positions[rank],
                                      key[..., positions[source], :], positions[source],
                                      value[..., positions[source], :], chunk, is_causal,
                                      states[rank])
    return unshard([_finish(state)[0] for state in states], layout)


# --------------------------------------------------------------------------- running cases


@dataclasses.dataclass
class AttentionCase:
    """One attention call for :func:`run_attention_cases`: a method and whole-sequence inputs.

    Attributes:
        method: ``"allgather"``, ``"ring"`` or ``"ulysses"``.
        query: the queries of the whole sequence ``(B, H, T, d)``; each rank takes its shard.
        key: the keys ``(B, H, T, d)``.
        value: the values ``(B, H, T, d_v)``.
        is_causal: apply the causal mask.
        layout: ``"contiguous"`` or ``"zigzag"`` (Ulysses: contiguous only).
        grad_output: if given, ``(B, H, T, d_v)``: run the backward pass with it too.
        subgroups: ``None`` to run on every rank, or a partition of the ranks into groups,
            e.g. ``((0, 2), (1, 3))``: each group runs the case on its own, at the same time.

    Taught in chapter 17.
    """

    method: str
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    is_causal: bool = False
    layout: str = "contiguous"
    grad_output: torch.Tensor | None = None
    subgroups: tuple[tuple[int, ...], ...] | None = None


@dataclasses.dataclass
class CaseResult:
    """What one rank returns for one :class:`AttentionCase`.

    Attributes:
        group_ranks: the global ranks of the group that ran the case.
        rank: this rank's index in that group.
        positions: the sequence positions this rank held ``(T / P,)``.
        output: this rank's shard of the output ``(B, H, T / P, d_v)`` (``None`` on error).
        grads: the gradients of this rank's query, key and value shards, or ``None``.
        forward: the :class:`Traffic` of the forward pass.
        backward: the :class:`Traffic` of the backward pass, or ``None``.
        error: ``"ValueError: …"`` when the method rejected its input, else ``None``.

    Taught in chapter 17.
    """

    group_ranks: tuple[int, ...]
    rank: int
    positions: torch.Tensor
    output: torch.Tensor | None
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    forward: Traffic
    backward: Traffic | None
    error: str | None = None


def _case_positions(seq_len: int, world_size: int, rank: int, layout: str) -> torch.Tensor:
    """The rank's positions; for a length the layout cannot split, a split it can't check
    locally (uneven, or odd shards), so that the attention function itself reports it."""
    try:
        return shard_positions(seq_len, world_size, rank, layout)
    except ValueError:
        return torch.tensor_split(torch.arange(seq_len), world_size)[rank]


def run_attention_cases(rank: int, world_size: int,
                        cases: Sequence[AttentionCase]) -> list[CaseResult]:
    """Run every case on this rank: shard, attend, backward, count; a function for the ranks.

    Meant for :func:`run_on_ranks`, so that one start of the processes serves many cases:
    ``run_on_ranks(run_attention_cases, 4, cases)``. A method that rejects its input with a
    ``ValueError`` or ``TypeError`` (on every rank alike) gives a result with ``error`` set;
    any other exception fails the rank.

    Args:
        rank: this rank's global rank.
        world_size: the number of ranks.
        cases: the cases, identical on every rank.

    Shapes:
        see :class:`AttentionCase` and :class:`CaseResult`.

    Returns:
        One :class:`CaseResult` per case, in order.

    Taught in chapter 17.
    """
    groups = {}
    for case in cases:  # every rank creates every subgroup, in the same order
        if case.subgroups is not None and case.subgroups not in groups:
            groups[case.subgroups] = [dist.new_group(list(ranks)) for ranks in case.subgroups]
    results = []
    for case in cases:
        if case.subgroups is None:
            group, members = None, tuple(range(world_size))
        else:
            index = next(i for i, ranks in enumerate(case.subgroups) if rank in ranks)
            group, members = groups[case.subgroups][index], tuple(case.subgroups[index])
        group_rank, size = members.index(rank), len(members)
        positions = _case_positions(case.query.size(2), size, group_rank, case.layout)
        with_grad = case.grad_output is not None
        query, key, value = (tensor[..., positions, :].clone().requires_grad_(with_grad)
                             for tensor in (case.query, case.key, case.value))
        kwargs = {"group": group, "is_causal": case.is_causal}
        if case.method != "ulysses":
            kwargs["layout"] = case.layout
        method = METHODS[case.method]
        try:
            with count_traffic() as forward:
                if case.method == "ulysses" and case.layout != "contiguous":
                    raise ValueError("ulysses_attention takes contiguous shards: every rank "
                                     "ends up with the whole sequence, so it needs no layout")
                output = method(query, key, value, **kwargs)
        except (ValueError, TypeError) as error:
            results.append(CaseResult(members, group_rank, positions, None, None, forward,
                                      None, f"{type(error).__name__}: {error}"))
            continue
        backward = grads = None
        if with_grad:
            with count_traffic() as backward:
                output.backward(case.grad_output[..., positions, :])
            grads = (query.grad, key.grad, value.grad)
        results.append(CaseResult(members, group_rank, positions, output.detach(), grads,
                                  forward, backward))
    return results
