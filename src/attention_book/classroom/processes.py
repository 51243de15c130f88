"""Every process of a grading run ends with it: subreapers, process trees, limits on their number.

Student code can start processes where a chapter's policy allows it (chapter 17's cells start
worker ranks), and a process can leave its parent's session (``setsid``), keep inherited
descriptors open and outlive everything that started it. Three tools here make sure no such
process outlives the run that started it, and that none blocks it:

- :func:`become_subreaper`: a process marked so adopts every orphan below it (Linux's
  ``PR_SET_CHILD_SUBREAPER``), instead of the machine's ``init``; so every process started
  below it, however it detached itself, stays its descendant and can be found and ended;
- :func:`end_descendants`: ends (``SIGKILL``) every descendant of a process, round after
  round until none is left (a process that forks while its siblings are killed is found in
  the next round), and reaps them;
- :func:`supervise` (``python -m attention_book.classroom.processes``): runs one command as
  a subreaper's child, waits for *its exit* (not for the end of its output, which a left-over
  child could hold open forever), ends it and everything below it past a deadline, ends
  every process it left behind, and says in a small JSON file what it had to end.

:func:`contain_processes` bounds how many processes one sandboxed kernel may start: a cgroup
of the ``pids`` controller where this process may create one (as root, outside a
container), and ``RLIMIT_NPROC`` and ``RLIMIT_CPU`` otherwise (``RLIMIT_NPROC`` does not
bind root). Where user namespaces exist the kernel runs in a PID namespace of its own as
well (:mod:`.sandbox`), so its end is the end of every process in it.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Containment", "become_subreaper", "contain_processes", "descendants",
           "end_descendants", "limit_process_count", "main", "supervise"]

_PR_SET_CHILD_SUBREAPER = 36
_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # v1 pids hierarchy, or v2


def become_subreaper() -> bool:
    """Make this process adopt the orphans of every process started below it.

    Returns:
        True when the kernel took it (Linux 3.4 and later).
    """
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return False


def _parents() -> dict[int, int]:
    """Every process of the machine that this process can see, with its parent."""
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # "pid (name) state ppid ...": the name may hold spaces and brackets
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this process), children first.

    Args:
        pid: the root of the tree.

    Returns:
        Process ids, each once.
    """
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(root, []))
    while todo:
        current = todo.pop(0)
        if current in found or current == root:
            continue
        found.append(current)
        todo += children.get(current, [])
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all(pids: Sequence[int]) -> set[int]:
    """``SIGKILL`` to each of ``pids``; the ones it reached. Reaps this process's children."""
    ended = set()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        except OSError:
            pass
    _reap()
    time.sleep(0.01)
    return ended


def end_descendants(pid: int | None = None, *, spare: Sequence[int] = (),
                    rounds: int = 100) -> int:
    """End every process below ``pid`` (default: this process) and reap this process's own.

    Args:
        pid: the root of the tree (it is not ended itself).
        spare: processes to leave alone (and, with them, whatever runs below them).
        rounds: how many times to look again for processes started meanwhile.

    Returns:
        How many processes were ended.
    """
    ended: set[int] = set()
    for _ in range(rounds):
        spared = set(spare)
        for kept in spare:
            spared.update(descendants(kept))
        found = [p for p in descendants(pid) if p not in spared]
        if not found:
            break
        ended |= _kill_all(found)
    _reap()
    return len(ended)


class Containment:
    """A cgroup of the ``pids`` controller for one process tree, or nothing.

    Args:
        path: the cgroup's folder (``None``: no cgroup could be made here).
    """

    def __init__(self, path: Path | None):
        self.path = path

    def join(self) -> None:
        """Move this process into the cgroup: every process it starts from now on is in it."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def close(self) -> int:
        """End every other process in the cgroup, leave it and remove it; how many were ended."""
        if self.path is None:
            return 0
        ended: set[int] = set()
        for _ in range(100):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()
                        if int(p) != os.getpid()]
            except OSError:
                break
            if not pids:
                break
            ended |= _kill_all(pids)
        try:
            (self.path.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")
            self.path.rmdir()
        except OSError:
            pass
        return len(ended)


def contain_processes(max_processes: int = 256) -> Containment:
    """A new cgroup that holds at most ``max_processes`` processes, where one can be made.

    Args:
        max_processes: the bound (``pids.max``).

    Returns:
        A :class:`Containment` (its ``path`` is ``None`` where no cgroup could be made: a
        container's read-only cgroup folder, an account that is not root).
    """
    for root in _CGROUP_ROOTS:
        base = Path(root)
        if not (base / "cgroup.procs").exists():
            continue
        if base.name != "pids":  # the unified (v2) hierarchy: only if it has the controller
            controllers = base / "cgroup.subtree_control"
            try:
                if "pids" not in controllers.read_text().split():
                    continue
            except OSError:
                continue
        path = base / f"attention-book-{os.getpid()}-{time.monotonic_ns()}"
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / "pids.max").write_text(f"{int(max_processes)}\n")
            return Containment(path)
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
    return Containment(None)


def _processes_of_this_account() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


def limit_process_count(max_processes: int = 256, cpu_seconds: int | None = None) -> None:
    """``RLIMIT_NPROC`` (binds every account but root) and ``RLIMIT_CPU`` of this process.

    The kernel counts ``RLIMIT_NPROC`` over the whole account, so the bound is the account's
    processes now plus ``max_processes``.

    Args:
        max_processes: how many more processes this process and its descendants may start.
        cpu_seconds: CPU time of each process (``None``: unchanged).
    """
    def lower(kind, value):
        soft, hard = resource.getrlimit(kind)
        new = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (new, new))

    lower(resource.RLIMIT_NPROC, _processes_of_this_account() + int(max_processes))
    if cpu_seconds is not None:
        lower(resource.RLIMIT_CPU, int(cpu_seconds))


# --------------------------------------------------------------------------- supervise


def supervise(command: Sequence[str], *, timeout: float | None = None,
              output: str | os.PathLike | None = None, cwd: str | None = None,
              env: dict[str, str] | None = None) -> dict:
    """Run ``command`` as this subreaper's child; end it past ``timeout``; end what it left.

    The command's standard output and error go to ``output`` (a file, never a pipe, so no
    process that inherits them can hold anything up).

    Args:
        command: the program and its arguments.
        timeout: seconds it may run (``None``: no limit).
        output: file for its standard output and error (default: ``/dev/null``).
        cwd: its working folder.
        env: its environment (default: this process's).

    Returns:
        ``{"status": exit status or None, "timed_out": bool, "left_behind": int}``: the
        command's exit status (``None`` if it was ended), and how many processes were still
        running below it when it ended (all of them are ended now).
    """
    become_subreaper()
    sink = open(output, "ab") if output is not None else open(os.devnull, "wb")  # noqa: SIM115
    try:
        child = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=sink,
                                 stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                 start_new_session=True)
    finally:
        sink.close()
    timed_out = False
    try:
        status = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        status = None
        end_descendants()
        child.wait()
    left = end_descendants()
    return {"status": status, "timed_out": timed_out, "left_behind": left}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attention_book.classroom.processes [--timeout S] [--output F] --result R -- CMD``.

    Runs ``CMD`` under :func:`supervise` and writes its result as JSON to ``R``. Ends
    itself and everything below it when the process that started it ends (or sends it
    ``SIGTERM``).
    """
    parser = argparse.ArgumentParser(prog="python -m attention_book.classroom.processes",
                                     description=main.__doc__)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--result", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")

    def stop(signum, frame):
        end_descendants()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:  # the run's end (autograde killed) is this supervisor's end, and so its tree's
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    result = supervise(command, timeout=args.timeout, output=args.output)
    Path(args.result).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
