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

from attention_book.classroom import clean, landlock, processes, sandbox, syscalls

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
                   "database", "network", "checkers"):
        assert seen[action] == "PermissionError", (action, seen[action])
    # what the kernel layers decide, not the hook: a signal (Landlock scopes it), ctypes (its
    # native calls meet the same layers); refusing them here flagged honest imports (trial v4)
    assert seen["kill"] == seen["ctypes"] == "done"
    assert {"reading", "writing", "subprocess.Popen", "os.fork", "importing"} <= set(
        seen["reports"])
    assert "os.kill" not in seen["reports"] and not any(
        event.startswith("ctypes") for event in seen["reports"])
    assert secret.exists()


def test_limits():
    """The resource limits hold; native readers (torch.from_file, numpy.fromfile) are the kernel
    layers' to refuse (native_attacks), not replaced: safetensors loads weights with them."""
    def body():
        sandbox.limit_resources(file_bytes=0, memory_bytes=4 * 2**30, cpu_seconds=60)
        import torch

        target = Path(tempfile.gettempdir(), f"abk-limit-{os.getpid()}")
        outcome = {
            "write": attempt(lambda: target.write_bytes(b"x" * 10)),
            "from_file": attempt(lambda: torch.from_file(str(Path(os.__file__)), size=4)),
            "big": attempt(lambda: torch.empty(2**31, dtype=torch.float64).fill_(1)),
        }
        outcome["size"] = target.stat().st_size if target.exists() else None
        if target.exists():
            target.unlink()
        return outcome

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["write"] == "OSError" and seen["size"] in (None, 0)
    assert seen["from_file"] == "done"  # a readable file: allowed, as in an honest load
    assert seen["big"] in ("RuntimeError", "MemoryError")


class _Kernel:
    """The sandboxed kernel of nbgrader's feedback runs, started and spoken to as nbgrader does."""

    def __init__(self, tmp_path: Path, regime: str, policy: dict | None = None,
                 scratch_bytes: int | None = None):
        from jupyter_client.manager import KernelManager

        spec = tmp_path / "jupyter" / "kernels" / "abk-test"
        spec.mkdir(parents=True)
        start = ([sys.executable, "-P", sandbox.__file__] if regime == "namespaces" else
                 [sys.executable, "-P", "-c",
                  DOCKER_PREFIX + f"runpy.run_path({sandbox.__file__!r}, run_name='__main__')"])
        temporary = tmp_path / "kernel-tmp"  # as autograde's kernel spec does: nothing in /tmp
        temporary.mkdir()
        self.report = tmp_path / "report.log"  # made by the run; the kernel only appends
        self.report.touch()
        env = {"TMPDIR": str(temporary), "BOOK_SANDBOX_REPORT": str(self.report),
               "BOOK_SANDBOX_POLICY": json.dumps(policy or {})}
        if scratch_bytes is not None:
            env["BOOK_SANDBOX_SCRATCH_BYTES"] = str(scratch_bytes)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [*start, "kernel", "-f", "{connection_file}"],
            "display_name": "sandboxed", "language": "python", "env": env}))
        self.work = tmp_path / "work"
        self.work.mkdir()
        os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter")
        self.manager = KernelManager(kernel_name="abk-test")
        self.manager.start_kernel(cwd=str(self.work))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str) -> str:
        texts = []

        def hook(message):
            content = message["content"]
            if message["header"]["msg_type"] in ("stream", "error", "execute_result"):
                texts.append(content.get("text") or content.get("ename")
                             or str(content.get("data", {}).get("text/plain")))

        self.client.execute_interactive(code, timeout=120, output_hook=hook)
        return "".join(texts)

    def run_until_it_ends(self, code: str, limit: float = 300) -> bool:
        """Send ``code`` and wait for the kernel to end (a condition, not a fixed time)."""
        import time

        self.client.execute(code)
        deadline = time.monotonic() + limit
        while self.manager.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        return not self.manager.is_alive()

    def shut_down(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)  # as nbgrader ends a notebook's kernel
        os.environ.pop("JUPYTER_PATH", None)

    def reported(self) -> list[str]:
        return self.report.read_text(errors="replace").splitlines()


TOKENS = {"JUPYTERHUB_API_TOKEN": "the-instructor-s-hub-token",
          "JPY_API_TOKEN": "the-instructor-s-hub-token"}


@pytest.mark.parametrize("regime", ["namespaces", "docker"])
def test_the_sandboxed_kernel_runs_honest_work_and_refuses_the_rest(secret, tmp_path, regime,
                                                                    monkeypatch):
    import socket

    for name, value in TOKENS.items():  # as in a hub terminal, where the guide runs autograde
        monkeypatch.setenv(name, value)
    service = tmp_path / "service.sock"  # a service of the instructor's account (trial v4 D7)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(service))
    listener.listen(4)
    listener.setblocking(False)
    kernel = _Kernel(tmp_path, regime, scratch_bytes=8 * 2**20)
    (kernel.work / "notes.py").write_text("import os\n")  # shipped beside the notebook
    outputs = {}
    try:
        outputs["honest"] = kernel.run(
            "%timeit -n 3 -r 1 sum(range(10))\nimport os, torch\n"
            "import matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)\n"
            "print('ok', torch.ones(2).sum().item(), os.getcwd())")
        # what PyTorch and transformers do at import (ctypes.CDLL(None)): no refusal, no flag
        outputs["library"] = kernel.run(
            "import ctypes\nimport torch.distributed.elastic.multiprocessing.redirects\n"
            "print('imported', bool(ctypes.CDLL(None)))")
        outputs["secret"] = kernel.run(f"print(open({str(secret)!r}).read())")
        outputs["pth"] = kernel.run(f"open({str(SITE / 'zz_cheat.pth')!r}, 'w').write('import os')")
        outputs["notes"] = kernel.run("import notes")
        outputs["scratch"] = kernel.run(
            "import tempfile\nx = os.path.join(tempfile.gettempdir(), 'x')\n"
            "open(x, 'w').write('hi'); print(open(x).read())")
        outputs["token"] = kernel.run(
            "print(sorted(name for name in os.environ if 'TOKEN' in name or 'JPY_API' in name), "
            "[value for value in os.environ.values() if 'hub-token' in value])")
        outputs["unix"] = kernel.run(
            "import socket\nclient = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            f"client.connect({str(service)!r})\nclient.sendall(b'from a kernel')")
        outputs["native"] = kernel.run(
            "import json, os\nfrom pathlib import Path\n" + inspect.getsource(attempt) + "\n"
            + inspect.getsource(native_attacks).replace("str(secret)", repr(str(secret)))
            .replace("str(GRADER_SOURCE)", repr(str(GRADER_SOURCE)))
            + "\nprint(json.dumps(native_attacks(None)))")
        # forged reports: whatever the kernel writes lands in its own student's report only
        outputs["forged"] = kernel.run(  # every file and pipe it holds (not its own sockets)
            "import os, stat\nfor fd in range(256):\n    try:\n"
            "        kind = os.fstat(fd).st_mode\n"
            "        if stat.S_ISFIFO(kind) or stat.S_ISREG(kind):\n"
            "            os.write(fd, b'refused: reading the-forged-line\\n')\n"
            "    except OSError:\n        pass")
        if regime == "docker":  # no tmpfs: the process that started the kernel bounds its scratch
            outputs["disk"] = kernel.run_until_it_ends(
                "for index in range(4):\n"
                "    open(os.path.join(tempfile.gettempdir(), f'fill-{index}'), 'wb')"
                ".write(b'x' * 2**22)\nimport time\ntime.sleep(600)")
    finally:
        kernel.shut_down()
        try:
            accepted = listener.accept()
        except BlockingIOError:
            accepted = None
        listener.close()
    assert "ok 2.0" in outputs["honest"] and str(kernel.work) in outputs["honest"]
    assert outputs["library"] == "imported True\n"
    assert "the answers" not in outputs["secret"]
    assert "Error" in outputs["secret"] and "Error" in outputs["pth"]
    assert outputs["notes"] == "ModuleNotFoundError"
    assert outputs["scratch"] == "hi\n"  # a private scratch folder, gone with the kernel
    assert outputs["token"] == "[] []\n", outputs["token"]
    assert "Error" in outputs["unix"] and accepted is None, (outputs["unix"], accepted)
    assert not (SITE / "zz_cheat.pth").exists()
    native = json.loads(outputs["native"].strip().splitlines()[-1])
    assert set(native) == {"native read", "shared map of the grader", "parent command line",
                           "tcp store"} and "done" not in native.values(), native
    reported = kernel.reported()
    assert any(line.startswith("layers: ") for line in reported), reported
    assert any(line.startswith("refused: writing") and "zz_cheat.pth" in line
               for line in reported), reported
    if regime == "docker":  # in the private view the course is not there to be refused
        assert any(line.startswith("refused: reading") and secret.name in line
                   for line in reported), reported
    assert not any("ctypes" in line or "redirects" in line for line in reported), reported
    assert "refused: reading the-forged-line" in reported  # its own report: it concerns itself
    if regime == "docker":
        assert outputs["disk"] is True  # ended, well before its 600 s
        assert any(line.startswith("stopped: the notebook's scratch files passed 8 MB")
                   for line in reported), reported


def _running(token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    if token.encode() in handle.read():
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("regime", ["namespaces", "docker"])
def test_a_kernel_that_may_start_processes_leaves_none_behind(tmp_path, regime):
    """Trial v4 D5: chapter 17's policy lets a kernel start processes; one that leaves its
    session and keeps the kernel's descriptors still ends with the kernel, which says so."""
    import time
    import uuid

    token = f"left-behind-{uuid.uuid4().hex}"
    kernel = _Kernel(tmp_path, regime, policy={"processes": True, "loopback_tcp": False})
    try:
        started = kernel.run(
            "import subprocess, sys\n"
            f"for _ in range(3):\n    subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(600)', {token!r}], start_new_session=True, "
            "close_fds=False)\nprint('started')")
        assert started == "started\n", started
        deadline = time.monotonic() + 60  # a condition, not a fixed time
        while len(_running(token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_running(token)) == 3
    finally:
        kernel.shut_down()
    deadline = time.monotonic() + 60
    while _running(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(token) == []
    reported = kernel.reported()
    if regime == "docker":  # no PID namespace: the process that started the kernel ended them
        assert any(line.startswith("ended: 3 process") for line in reported), reported


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


def test_a_supervised_command_ends_everything_it_left_and_nothing_waits_on_its_output(tmp_path):
    """Trial v4 D5: nbgrader's run is waited for by its exit, not by the end of its output, which
    a process it left behind (its own session, the output still open) would hold forever; what
    it left is ended, and counted."""
    import subprocess
    import time
    import uuid

    token = f"left-behind-{uuid.uuid4().hex}"
    leaves = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(600)', {token!r}], start_new_session=True)\nprint('done')")
    result = tmp_path / "result.json"
    begun = time.monotonic()
    supervisor = subprocess.run(
        [sys.executable, "-P", processes.__file__, "--timeout", "300",
         "--output", str(tmp_path / "log"), "--result", str(result), "--",
         sys.executable, "-c", leaves], capture_output=True, timeout=300, check=False)
    assert supervisor.returncode == 0, supervisor.stderr
    assert time.monotonic() - begun < 250  # it did not wait for the sleeper's 600 s
    assert json.loads(result.read_text()) == {"status": 0, "timed_out": False, "left_behind": 1}
    assert (tmp_path / "log").read_text() == "done\n"
    assert _running(token) == []

    hangs = "import time\ntime.sleep(600)"  # past its time: it and its tree end
    subprocess.run([sys.executable, "-P", processes.__file__, "--timeout",
                    "1", "--result", str(result), "--", sys.executable, "-c", hangs],
                   timeout=300, check=True)
    assert json.loads(result.read_text())["timed_out"] is True


def test_the_grader_never_runs_a_bytecode_cache_of_the_package(tmp_path):
    """Trial v4 D8: bytecode planted beside the package's source (as an unsafe run could) is what
    Python runs; the grading process starts through SOURCE_ONLY and runs the source."""
    import importlib.util
    import subprocess

    from attention_book.classroom import integrity

    package = tmp_path / "attention_book"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = package / "probe.py"
    source.write_text("VALUE = 'the source'\n")
    cache = Path(importlib.util.cache_from_source(str(source)))
    cache.parent.mkdir()
    planted = compile("VALUE = 'planted bytecode'\n", str(source), "exec")
    stat = source.stat()
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    cache.write_bytes(_code_to_timestamp_pyc(planted, stat.st_mtime, stat.st_size))
    probe = "import attention_book.probe as p; print(p.VALUE)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    plain = subprocess.run([sys.executable, "-P", "-c", probe], env=env, capture_output=True,
                           text=True, timeout=120, check=True)
    assert plain.stdout == "planted bytecode\n"  # the attack works on a plain import
    guarded = subprocess.run([sys.executable, "-P", "-c", integrity.SOURCE_ONLY + probe], env=env,
                             capture_output=True, text=True, timeout=120, check=True)
    assert guarded.stdout == "the source\n"
    assert integrity.remove_bytecode_caches(package) == [] and not cache.exists()


def test_without_the_view_a_shared_mapping_cannot_be_made_writable():
    """Trial v4 D8: `mprotect` could turn a read-only shared mapping writable; under Landlock the
    file can only have been opened for reading outside the scratch folder, and the kernel then
    refuses PROT_WRITE on the mapping (what the seccomp filter cannot see in mprotect)."""
    import ctypes
    import mmap

    def body():
        sandbox.confine([*sandbox.python_roots(), sandbox.package_root()], [], filter_syscalls=False)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        seen = {"write open": attempt(lambda: open(GRADER_SOURCE, "r+b"))}
        fd = os.open(GRADER_SOURCE, os.O_RDONLY)
        address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        seen["mapped"] = address not in (None, ctypes.c_void_p(-1).value)
        result = libc.mprotect(address, 4096, mmap.PROT_READ | mmap.PROT_WRITE)
        seen["mprotect"] = "refused" if result != 0 else "done"
        seen["errno"] = ctypes.get_errno()
        return seen

    seen = in_child(body)
    assert seen.get("crashed") is None, seen
    assert seen["write open"] == "PermissionError" and seen["mapped"], seen
    assert seen["mprotect"] == "refused" and seen["errno"] == 13, seen  # EACCES
