"""The sandbox graded code runs in (``attention_book.classroom.sandbox``).

Each check runs in a forked child that enters the sandbox and reports back as JSON, so this
process stays as it was. The kernel test starts the sandboxed Jupyter kernel that nbgrader
uses for feedback runs and speaks to it as nbgrader does.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from attention_book.classroom import sandbox

SITE = Path(sysconfig.get_paths()["purelib"]).resolve()


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


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file that stands for the course's gradebook: graded code must not reach it."""
    path = tmp_path / "course" / "gradebook.db"
    path.parent.mkdir()
    path.write_text("the answers")
    return path


def test_this_machine_gives_graded_code_a_private_view():
    assert sandbox.jail_available(), (
        "user namespaces are off here; the book's machines and CI have them (see the "
        "instructor guide for what grading without them leaves open)")


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


def test_the_sandboxed_kernel_runs_honest_work_and_refuses_the_rest(secret, tmp_path):
    from jupyter_client.manager import KernelManager

    spec = tmp_path / "jupyter" / "kernels" / "abk-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-P", sandbox.__file__, "kernel", "-f", "{connection_file}"],
        "display_name": "sandboxed", "language": "python"}))
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
        run("scratch", "open('/tmp/x', 'w').write('hi'); print(open('/tmp/x').read())")
        run("token", "print(os.environ.get('JUPYTERHUB_API_TOKEN'))")
        manager.shutdown_kernel(now=True)
    finally:
        os.environ.pop("JUPYTER_PATH", None)
        os.environ.pop("JUPYTERHUB_API_TOKEN", None)
    assert "ok 2.0" in outputs["honest"] and str(work) in outputs["honest"]
    assert "the answers" not in outputs["secret"]
    assert "Error" in outputs["secret"] and "Error" in outputs["pth"]
    assert outputs["notes"] == "ModuleNotFoundError"
    assert outputs["scratch"] == "hi\n"  # a private /tmp, gone with the kernel
    assert outputs["token"] == "None\n"
    assert not (SITE / "zz_cheat.pth").exists()
