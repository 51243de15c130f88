"""The sandbox graded code runs in (``attention_book.classroom.sandbox``), layer by layer.

Each check runs in a forked child that enters a layer (the private view, Landlock, the
seccomp filter, the limits, the audit hook) and reports back as JSON, so this process stays
as it was. The attacks are the classes of ``../shared/reviews/classroom-trial-v3.md`` that
go below the audit hook: ``torch.ops.aten.from_file`` (a native read of another student's
work, a writable shared mapping of the grader's own source), ``/proc/<ppid>/cmdline``, and
``torch.distributed.TCPStore`` sockets. Each kernel layer is shown to stop them on its own.
The regime without user namespaces is made the way Docker's default profile makes it: a
seccomp filter that refuses ``unshare`` and ``clone`` with ``CLONE_NEWUSER``
(:func:`~attention_book.classroom.syscalls.refuse_user_namespaces`). The kernel test starts
the sandboxed Jupyter kernel that nbgrader uses for feedback runs, in both regimes, and
speaks to it as nbgrader does.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from attention_book.classroom import clean, landlock, sandbox, syscalls

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
GRADER_SOURCE = Path(clean.__file__).resolve()
#: Start a kernel as a Docker hub would: user namespaces refused by a seccomp filter.
DOCKER_PREFIX = ("from attention_book.classroom.syscalls import refuse_user_namespaces; "
                 "refuse_user_namespaces(); import runpy; ")


def in_child(body) -> dict:
    """Run ``body()`` in a forked child and return the dict it returns."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            result = body()
        except BaseException as error:  # noqa: BLE001
            result = {"crashed": f"{type(error).__name__}: {error}"}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def attempt(action) -> str:
    try:
        action()
    except BaseException as error:  # noqa: BLE001
        return type(error).__name__
    return "done"


def ended_by(body) -> int:
    """Run ``body()`` in a forked child; return the signal that ended it (0: it returned)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            body()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def native_attacks(secret: Path) -> dict:
    """The trial's attacks below the audit hook, each as "done" or the exception's name."""
    import torch

    return {
        "native read": attempt(lambda: torch.ops.aten.from_file(str(secret), False, 4,
                                                                  dtype=torch.uint8)),
        "shared map of the grader": attempt(lambda: torch.ops.aten.from_file(
            str(GRADER_SOURCE), True, 4, dtype=torch.uint8)),
        "parent command line": attempt(lambda: open(f"/proc/{os.getppid()}/cmdline").read()),
        "tcp store": attempt(lambda: torch.distributed.TCPStore("127.0.0.1", 0, 1, True,
                                                               wait_for_workers=False)),
    }


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file that stands for the course's gradebook: graded code must not reach it."""
    path = tmp_path / "course" / "gradebook.db"
    path.parent.mkdir()
    path.write_text("the answers")
    return path


def test_this_machine_gives_every_layer():
    assert sandbox.jail_available(), (
        "user namespaces are off here; the book's machines and CI have them (see the "
        "instructor guide for what grading without them leaves open)")
    layers = sandbox.available_layers()
    assert layers.landlock >= 6 and layers.seccomp and layers.protected, layers
    assert "Landlock ABI" in layers.describe() and "seccomp" in layers.describe()


def test_a_docker_profile_refuses_the_view_and_landlock_and_seccomp_still_hold():
    def body():
        syscalls.refuse_user_namespaces()
        layers = sandbox.available_layers()
        return {"namespaces": layers.namespaces, "landlock": layers.landlock,
                "seccomp": layers.seccomp, "protected": layers.protected,
                "jail": attempt(lambda: sandbox.enter_jail(tempfile.mkdtemp(), []))}

    seen = in_child(body)
    assert seen == {"namespaces": False, "landlock": seen["landlock"], "seccomp": True,
                    "protected": True, "jail": "SandboxError"}, seen
    assert seen["landlock"] >= 6
    assert not sandbox.Layers().protected and "UNPROTECTED" in sandbox.Layers().describe()


def test_landlock_alone_fences_native_files_proc_tcp_and_signals(secret, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def body():
        import torch

        abi = landlock.restrict([*sandbox.python_roots(), sandbox.package_root(),
                                 *sandbox.SYSTEM_LIBRARIES, "/proc/self"],
                                [str(scratch), "/dev/null"])
        seen = native_attacks(secret)
        seen.update({
            "abi": abi,
            "python read": attempt(lambda: secret.read_text()),
            "write the package": attempt(lambda: open(GRADER_SOURCE, "r+b")),
            "own status": attempt(lambda: open("/proc/self/status").read()),
            "scratch": attempt(lambda: (scratch / "x.txt").write_text("ok")),
            "signal the parent": attempt(lambda: os.kill(os.getppid(), 0)),
            "honest work": (torch.ones(2, 2) @ torch.ones(2, 2)).sum().item(),
        })
        return seen

    before = GRADER_SOURCE.read_bytes()
    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["abi"] >= 6
    for action in ("native read", "shared map of the grader", "tcp store", "parent command line",
                   "python read", "write the package", "signal the parent"):
        assert seen[action] != "done", (action, seen)
    assert seen["own status"] == seen["scratch"] == "done" and seen["honest work"] == 8.0
    assert GRADER_SOURCE.read_bytes() == before and secret.read_text() == "the answers"


def test_the_seccomp_filter_alone_refuses_sockets_processes_and_shared_writes(tmp_path):
    target = tmp_path / "mapped.bin"
    target.write_bytes(b"\0" * 16)

    def body():
        import mmap
        import socket
        import threading

        import torch

        syscalls.confine(kill=False)
        with open(target, "r+b") as handle:
            seen = {
                "socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
                "udp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
                "unix pair": attempt(socket.socketpair),
                "fork": attempt(os.fork),
                "shared writable map": attempt(lambda: mmap.mmap(handle.fileno(), 16)),
                "private map": attempt(lambda: mmap.mmap(handle.fileno(), 16,
                                                         flags=mmap.MAP_PRIVATE)),
                "native shared map": attempt(lambda: torch.ops.aten.from_file(
                    str(target), True, 4, dtype=torch.uint8)),
                "unshare": attempt(lambda: sandbox.enter_jail(tempfile.mkdtemp(), [])),
                "thread": attempt(lambda: threading.Thread(target=len, args=("",)).start()),
                "honest work": (torch.ones(3) * 2).sum().item(),
            }
        return seen

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    for action in ("socket", "udp", "fork", "shared writable map", "native shared map",
                   "unshare"):
        assert seen[action] in ("PermissionError", "RuntimeError", "SandboxError",
                                "OSError"), (action, seen)
    assert seen["unix pair"] == seen["private map"] == seen["thread"] == "done"
    assert seen["honest work"] == 6.0

    def native_socket():
        import torch

        syscalls.confine(kill=True)  # as an answer's process: the kernel ends it
        torch.distributed.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)

    import signal

    assert ended_by(native_socket) == signal.SIGSYS

    def one_thread(start_another: bool):
        import threading

        import torch

        torch.set_num_threads(1)
        syscalls.confine(kill=True, threads=False)  # an answer's process: one thread only
        (torch.ones(3, requires_grad=True).softmax(0) * 2).sum().backward()  # needs none
        if start_another:
            threading.Thread(target=len, args=("",)).start()

    assert ended_by(lambda: one_thread(False)) == 0
    assert ended_by(lambda: one_thread(True)) == signal.SIGSYS


def test_the_jail_shows_python_and_the_package_read_only_and_nothing_else(secret):
    exercises = Path(sandbox.package_root(), "attention_book", "exercises")

    def body():
        root = tempfile.mkdtemp()
        sandbox.enter_jail(root, [*sandbox.python_roots(), sandbox.package_root(),
                                  *sandbox.SYSTEM_LIBRARIES], hidden=[str(exercises)])
        import xml.dom.minidom  # noqa: F401 - a module not imported before: read in the jail

        return {
            "secret": attempt(lambda: secret.read_text()),
            "pth": attempt(lambda: (SITE / "zz_cheat.pth").write_text("import os")),
            "checkers": os.listdir(exercises),
            "uid": os.getuid(),
            "chroot": attempt(lambda: os.chroot("/")),
            "numpy": __import__("numpy").ones(2).tolist(),
        }

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["secret"] == "FileNotFoundError"
    assert seen["pth"] in ("OSError", "PermissionError")
    assert seen["checkers"] == [] and seen["chroot"] == "PermissionError"
    assert seen["numpy"] == [1.0, 1.0]
    assert not (SITE / "zz_cheat.pth").exists()


def test_the_audit_hook_refuses_and_reports(secret):
    def body():
        reports = []
        sandbox.block_imports(("attention_book.exercises",))  # as the answer's process does
        sandbox.install_audit_hook(readable=sandbox.python_roots(), writable=[],
                                   blocked_modules=("attention_book.exercises",),
                                   report=lambda event, detail: reports.append(event))
        import socket
        import sqlite3
        import subprocess

        return {
            "read secret": attempt(lambda: secret.read_text()),
            "list course": attempt(lambda: os.listdir(secret.parent)),
            "read python": attempt(lambda: Path(os.__file__).read_text()[:10]),
            "write": attempt(lambda: open(SITE / "zz_cheat.pth", "w")),
            "remove": attempt(lambda: os.remove(secret)),
            "process": attempt(lambda: subprocess.run(["true"])),
            "fork": attempt(os.fork),
            "kill": attempt(lambda: os.kill(os.getppid(), 0)),
            "database": attempt(lambda: sqlite3.connect(str(secret))),
            "network": attempt(lambda: socket.create_connection(("127.0.0.1", 9))),
            "ctypes": attempt(lambda: __import__("ctypes").CDLL(None)),
            "checkers": attempt(lambda: __import__("attention_book.exercises.ch02")),
            "reports": reports,
        }

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["read python"] == "done"
    for action in ("read secret", "list course", "write", "remove", "process", "fork",
                   "kill", "database", "network", "ctypes", "checkers"):
        assert seen[action] == "PermissionError", (action, seen[action])
    assert {"reading", "writing", "subprocess.Popen", "os.fork", "os.kill",
            "importing"} <= set(seen["reports"])
    assert secret.exists()


def test_limits_and_native_readers():
    def body():
        sandbox.limit_resources(file_bytes=0, memory_bytes=4 * 2**30, cpu_seconds=60)
        sandbox.neuter_native_file_access()
        import numpy
        import torch

        target = Path(tempfile.gettempdir(), f"abk-limit-{os.getpid()}")
        outcome = {
            "write": attempt(lambda: target.write_bytes(b"x" * 10)),
            "from_file": attempt(lambda: torch.from_file(str(Path(os.__file__)), size=4)),
            "fromfile": attempt(lambda: numpy.fromfile(os.__file__, dtype="uint8")),
            "load": attempt(lambda: torch.jit.load("x")),
            "big": attempt(lambda: torch.empty(2**31, dtype=torch.float64).fill_(1)),
        }
        outcome["size"] = target.stat().st_size if target.exists() else None
        if target.exists():
            target.unlink()
        return outcome

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["write"] == "OSError" and seen["size"] in (None, 0)
    assert seen["from_file"] == seen["fromfile"] == seen["load"] == "PermissionError"
    assert seen["big"] in ("RuntimeError", "MemoryError")


@pytest.mark.parametrize("regime", ["namespaces", "docker"])
def test_the_sandboxed_kernel_runs_honest_work_and_refuses_the_rest(secret, tmp_path, regime):
    from jupyter_client.manager import KernelManager

    spec = tmp_path / "jupyter" / "kernels" / "abk-test"
    spec.mkdir(parents=True)
    start = ([sys.executable, "-P", sandbox.__file__] if regime == "namespaces" else
             [sys.executable, "-P", "-c",
              DOCKER_PREFIX + f"runpy.run_path({sandbox.__file__!r}, run_name='__main__')"])
    temporary = tmp_path / "kernel-tmp"  # as autograde's kernel spec does: nothing in /tmp
    temporary.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [*start, "kernel", "-f", "{connection_file}"],
        "display_name": "sandboxed", "language": "python", "env": {"TMPDIR": str(temporary)}}))
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.py").write_text("import os\n")  # shipped beside the notebook
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter")
    os.environ["JUPYTERHUB_API_TOKEN"] = "the instructor's token"  # as in a hub terminal
    try:
        manager = KernelManager(kernel_name="abk-test")
        manager.start_kernel(cwd=str(work))
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        outputs = {}

        def run(name, code):
            texts = []

            def hook(message):
                content = message["content"]
                if message["header"]["msg_type"] in ("stream", "error", "execute_result"):
                    texts.append(content.get("text") or content.get("ename")
                                 or str(content.get("data", {}).get("text/plain")))

            client.execute_interactive(code, timeout=120, output_hook=hook)
            outputs[name] = "".join(texts)

        run("honest", "%timeit -n 3 -r 1 sum(range(10))\nimport os, torch\n"
                      "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)\n"
                      "print('ok', torch.ones(2).sum().item(), os.getcwd())")
        run("secret", f"print(open({str(secret)!r}).read())")
        run("pth", f"open({str(SITE / 'zz_cheat.pth')!r}, 'w').write('import os')")
        run("notes", "import notes")
        run("scratch", "import tempfile\nx = os.path.join(tempfile.gettempdir(), 'x')\n"
                       "open(x, 'w').write('hi'); print(open(x).read())")
        run("token", "print(os.environ.get('JUPYTERHUB_API_TOKEN'))")
        run("native", "import json, os\nfrom pathlib import Path\n" + inspect.getsource(attempt) + "\n"
            + inspect.getsource(native_attacks).replace("str(secret)", repr(str(secret)))
            .replace("str(GRADER_SOURCE)", repr(str(GRADER_SOURCE)))
            + "\nprint(json.dumps(native_attacks(None)))")
        manager.shutdown_kernel(now=True)
    finally:
        os.environ.pop("JUPYTER_PATH", None)
        os.environ.pop("JUPYTERHUB_API_TOKEN", None)
    assert "ok 2.0" in outputs["honest"] and str(work) in outputs["honest"]
    assert "the answers" not in outputs["secret"]
    assert "Error" in outputs["secret"] and "Error" in outputs["pth"]
    assert outputs["notes"] == "ModuleNotFoundError"
    assert outputs["scratch"] == "hi\n"  # a private scratch folder, gone with the kernel
    assert outputs["token"] == "None\n"
    assert not (SITE / "zz_cheat.pth").exists()
    native = json.loads(outputs["native"].strip().splitlines()[-1])
    assert set(native) == {"native read", "shared map of the grader", "parent command line",
                           "tcp store"} and "done" not in native.values(), native


def test_a_sandboxed_process_ends_with_the_process_that_started_it():
    """Kernels, graders and answers call die_with_parent: a killed autograde leaves none."""
    import select
    import signal
    import time

    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - the "grader"
        os.close(read)
        if os.fork() == 0:  # the "answer": holds the pipe open for as long as it lives
            sandbox.die_with_parent()
            os.write(write, b"armed")
            time.sleep(600)
            os._exit(0)
        time.sleep(600)
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 5) == b"armed"
        os.kill(middle, signal.SIGKILL)
        os.waitpid(middle, 0)
        ready, _, _ = select.select([read], [], [], 60)  # a condition, not a fixed time
        assert ready and os.read(read, 1) == b"", "the answer outlived its grader"
    finally:
        os.close(read)
