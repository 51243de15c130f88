"""The sandbox in which a student's code runs while it is graded.

Two kinds of process run student code during ``autograde``: the process that holds one
answer while its hidden tests call it (:mod:`.clean`), and the Jupyter kernel in which
nbgrader re-runs the whole notebook for the student's feedback. Both enter this sandbox
before any student code runs, in layers; the first three are enforced by the kernel:

1. **A private view of the file system** (:func:`enter_jail`), where the kernel allows
   unprivileged user namespaces: a new, empty root in which only the Python installation,
   the virtual environment and the book's package exist, read-only, at their usual paths
   (the checkers and the grader hidden in an answer's view), plus a private scratch folder,
   and for an answer an empty network namespace (no network device at all). The course
   folder, the repository and every home folder do not exist there. Docker's default
   seccomp profile, Kubernetes and Ubuntu 24.04's AppArmor refuse these namespaces; the
   next two layers do not need them.
2. **Landlock** (:mod:`.landlock`, Linux 5.13 and later, no privileges): files may be read
   only beneath the Python roots and the package (for an answer without the checkers and
   the grader), written only in the private scratch folder; no TCP bind or connect (a
   kernel may listen on exactly the five ports of its connection file); no signal and no
   abstract socket reaches a process outside the sandbox. Nothing else of ``/proc`` than
   the process's own entry is readable.
3. **A seccomp filter** (:mod:`.syscalls`): no network socket, no new Unix socket (none at
   all in an answer's process), no new processes, no writable shared file mappings, no
   ptrace and no reach into other processes, no namespaces, mounts, BPF or ``io_uring``.
4. **Limits** (:func:`limit_resources`): memory, CPU time, open files, file size; the size
   of the scratch folder; for a kernel that may start processes, a PID namespace of its own
   (or a cgroup, or ``RLIMIT_NPROC``), and every process it left behind is ended with it
   (:mod:`.processes`).
5. **An audit hook** (:func:`install_audit_hook`, PEP 578), which explains in a sentence a
   student can read why an attempt from Python that a kernel layer refuses too (opening the
   course, a socket, a process, importing the checkers) is refused, and reports it on a
   channel of that student's own. It is an explanation, not the boundary: native code below
   Python (``torch.ops.aten.from_file``, any C++ operator that opens a path) never passes
   it, and is stopped by layers 1-3.

No process that runs student code gets an environment variable that is not on
:data:`STUDENT_ENVIRONMENT`, a list of names (never prefixes): a hub's API token in the
grader's environment never reaches a kernel or an answer.

:func:`available_layers` says which layers this machine gives; :data:`POLICIES` states what
a chapter's own cells need beyond the default (chapter 17 starts worker processes that talk
over loopback TCP).

``python -m attention_book.classroom.sandbox kernel -f CONNECTION_FILE`` is the sandboxed
Jupyter kernel that the book's course configuration gives nbgrader (:func:`_kernel_main`: a
small trusted process outside the sandbox that starts the kernel, reads nothing of it, and
ends everything the kernel left when it ends).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import signal
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__:
    from . import landlock, processes, syscalls
else:  # pragma: no cover - the kernel spec runs this file as a script, without the package
    import types

    def _sibling(name: str):  # compiled from its source: no bytecode cache runs here
        path = Path(__file__).with_name(f"{name}.py")
        module = types.ModuleType(f"_sandbox_{name}")
        module.__file__ = str(path)
        sys.modules[module.__name__] = module
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
        return module

    landlock, processes, syscalls = _sibling("landlock"), _sibling("processes"), _sibling(
        "syscalls")

__all__ = ["POLICIES", "STUDENT_ENVIRONMENT", "Layers", "Policy", "SandboxError",
           "available_layers", "confine", "die_with_parent", "enter_jail", "folder_bytes",
           "install_audit_hook", "jail_available", "keep_readable_path", "limit_resources",
           "package_root", "policy_for", "private_loopback", "python_roots", "readable_tree",
           "student_environment"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 1, 2, 4
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE, _PR_SET_PDEATHSIG = 38, 4, 1
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: The system's shared libraries and what the loader reads: no secrets, needed by NumPy/torch.
SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache",
                    "/usr/share/zoneinfo", "/etc/localtime", "/proc/cpuinfo",
                    "/sys/devices/system/cpu",
                    # how the C library names a local address (127.0.0.1 is localhost): gloo
                    # and torch.distributed ask, and warn where they cannot tell
                    "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf")

#: Module prefixes an answer may not import while it is graded.
GRADER_MODULES = ("attention_book.exercises", "attention_book.classroom", "nbgrader",
                  "nbformat", "sqlite3", "_sqlite3")

#: Starting a process: refused (and reported) where the policy gives none; the seccomp
#: filter refuses ``fork``/``clone``/``execve`` there too.
_PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn", "os.startfile", "_posixsubprocess.fork_exec"})
_PATH_EVENTS = frozenset({  # every path argument must be writable
    "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
    "os.utime", "os.chflags", "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr",
    "shutil.rmtree", "shutil.move", "shutil.chown", "os.mkfifo", "os.mknod"})
#: Path events whose last integer arguments are the folder descriptors their paths are
#: relative to (``dir_fd``): one per path.
_DIR_FD_EVENTS = frozenset({"os.remove", "os.rmdir", "os.rename", "os.mkdir", "shutil.rmtree"})
_COPY_EVENTS = frozenset({  # the first path is read, the second written
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "os.link",
    "os.symlink"})
#: What the kernel layers refuse whatever the arguments, explained when Python asks for it:
#: the network (Landlock's TCP rules, the seccomp filter's socket families, the answer's
#: empty network namespace) and a new root (no capability is left). Nothing is refused here
#: that the kernel would allow (``ctypes``, ``mmap``, ``chdir`` are not: the kernel layers
#: decide what they can reach), so what is reported is something the sandbox really refused.
_NETWORK_EVENTS = frozenset({
    "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.sendto", "socket.sendmsg", "urllib.Request", "http.client.connect",
    "ftplib.connect", "smtplib.connect", "telnetlib.Telnet.open", "webbrowser.open",
    "os.chroot"})
#: What any process may read of /proc beyond its own entry: process lists (psutil, at a
#: kernel's shutdown), never another process's memory or environment.
_PROC_INFO = re.compile(
    r"/proc/(cpuinfo|meminfo|stat|uptime|loadavg|mounts|\d+/(stat|status|cmdline))")
#: The environment variables a process that runs student code gets, by exact name: the
#: locale, the library and module paths, the numeric settings of the book's test command
#: (tools/numerics/*.env), matplotlib's backend and what ipykernel itself reads. Nothing is
#: kept by prefix: a hub's API token (``JUPYTERHUB_API_TOKEN``, ``JPY_API_TOKEN``), cloud
#: credentials or any other secret of the grader's environment never reaches student code.
STUDENT_ENVIRONMENT = (
    "PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ",
    "TERM", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED",
    "PYTHONIOENCODING", "PYTHONUTF8", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
    "MKL_NUM_THREADS", "MKL_CBWR",
    "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MPLBACKEND",
    "PYDEVD_DISABLE_FILE_VALIDATION", "JPY_PARENT_PID", "JPY_SESSION_NAME")
_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxError(RuntimeError):
    """The sandbox could not be set up as asked."""


@dataclass(frozen=True)
class Policy:
    """What a chapter's own code needs beyond the default sandbox (which allows neither).

    Args:
        processes: the chapter's cells start worker processes (they inherit every layer).
        loopback_tcp: those workers talk to each other over TCP on loopback. Only a private
            network namespace (layer 1) can limit TCP to loopback; where there is none, TCP
            stays closed and those cells fail in the feedback run (the grade never depends
            on them).
    """

    processes: bool = False
    loopback_tcp: bool = False


#: Per chapter, what its cells need; every chapter not named here gets ``Policy()``. The
#: answers themselves never get more than the default: no exercise needs a process or a
#: socket (chapter 17's exercises are pure functions; its cells start gloo ranks).
POLICIES: dict[int, Policy] = {17: Policy(processes=True, loopback_tcp=True)}


def policy_for(chapter: int | None) -> Policy:
    """The sandbox policy of a chapter's feedback kernel (:data:`POLICIES`).

    Args:
        chapter: the chapter number (``None``: the default).

    Returns:
        Its :class:`Policy`.
    """
    return POLICIES.get(chapter, Policy()) if chapter is not None else Policy()


def student_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs student code: :data:`STUDENT_ENVIRONMENT` only.

    Args:
        environ: the grader's environment (default: this process's).

    Returns:
        The variables of :data:`STUDENT_ENVIRONMENT` that ``environ`` has (none whose name
        looks like a secret's, should the list ever name one).
    """
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in STUDENT_ENVIRONMENT
            if name in environ and not _SECRET_NAME.search(name)}


@dataclass(frozen=True)
class Layers:
    """The kernel-enforced layers of a sandbox: offered by a machine, or entered by a process.

    Args:
        namespaces: the private view (user, mount and, for answers, network namespaces).
        landlock: the Landlock ABI in force (0: none).
        seccomp: the syscall filter is loaded.
    """

    namespaces: bool = False
    landlock: int = 0
    seccomp: bool = False

    @property
    def protected(self) -> bool:
        """Whether files are fenced by the kernel (a private view or Landlock)."""
        return self.namespaces or self.landlock > 0

    def __bool__(self) -> bool:
        return self.protected

    def describe(self) -> str:
        """One line naming each layer, for the instructor's summary."""
        parts = []
        if self.namespaces:
            parts.append("private file view (user and mount namespaces; for answers an empty "
                         "network namespace too)")
        if self.landlock:
            net = ", TCP" if self.landlock >= 4 else ""
            scope = ", signals" if self.landlock >= 6 else ""
            parts.append(f"Landlock ABI {self.landlock} (files{net}{scope})")
        if self.seccomp:
            parts.append("seccomp filter (sockets, processes, shared writable mappings, ptrace)")
        if not parts:
            return ("UNPROTECTED: no kernel-enforced layer (audit hook and resource limits "
                    "only)")
        return " + ".join(parts) + " + resource limits + audit hook"

    def to_json(self) -> str:
        """The layers as JSON (they travel to the processes that report them)."""
        return json.dumps(asdict(self))


def available_layers(*, use_jail: bool = True) -> Layers:
    """Which kernel-enforced layers this machine gives a graded process (each tried in a child).

    Args:
        use_jail: consider the private view (False: as if the machine refused it).

    Returns:
        The :class:`Layers` a sandbox here would enter.
    """
    return Layers(namespaces=bool(use_jail and jail_available()), landlock=landlock.abi_version(),
                  seccomp=_in_child(lambda: syscalls.confine(kill=False)))


def _in_child(action: Callable[[], None]) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            action()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


# --------------------------------------------------------------------------- paths


def python_roots() -> list[str]:
    """The folders a Python process of this environment reads: its installation and venv.

    That is the interpreter's prefixes, its standard library and site-packages, and every
    other folder on ``sys.path`` that holds installed packages (a ``site-packages`` or
    ``dist-packages`` folder added by a ``.pth`` file, say) -- never the working folder.

    Returns:
        Absolute, resolved paths (each once).
    """
    roots = [sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(path)
    roots.append(str(Path(sys.executable).resolve().parent))
    roots += [entry for entry in sys.path
              if entry and Path(entry).name in ("site-packages", "dist-packages")]
    return _unique(roots)


def package_root() -> str:
    """The folder that holds the ``attention_book`` package (``src/`` or ``site-packages``).

    Found without importing the package (an import starts threads, and a process must be
    single-threaded to enter the jail).
    """
    import importlib.util

    module = sys.modules.get("attention_book")
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec("attention_book")
        origin = spec.origin if spec is not None else None
    if origin is None:
        raise SandboxError("the attention_book package is not installed here")
    return str(Path(origin).resolve().parent.parent)


def _unique(paths: Iterable[str]) -> list[str]:
    seen: list[str] = []
    for path in paths:
        if not path:
            continue
        real = os.path.realpath(path)
        if os.path.exists(real) and real not in seen:
            seen.append(real)
    return seen


def readable_tree(roots: Iterable[str], hidden: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split readable roots so that Landlock can leave the ``hidden`` folders out.

    Landlock rights hold for a whole folder tree and cannot be taken back beneath it, so a
    root with a hidden folder inside is opened entry by entry instead.

    Args:
        roots: folders (or files) that may be read.
        hidden: folders inside them that may not be read.

    Returns:
        ``(readable, listable)``: paths to read in full, and folders whose listing alone may
        be read (the parents of hidden folders; their names stay visible).
    """
    hidden = [os.path.realpath(path) for path in hidden]
    readable: list[str] = []
    listable: list[str] = []

    def walk(path: str) -> None:
        if any(path == h for h in hidden):
            return
        if not any(h.startswith(path.rstrip("/") + "/") for h in hidden):
            readable.append(path)
            return
        listable.append(path)
        try:
            entries = sorted(os.listdir(path))
        except OSError:
            return
        for name in entries:
            walk(os.path.join(path, name))

    for root in _unique(roots):
        walk(root)
    return readable, listable


def keep_readable_path(readable: Iterable[str]) -> None:
    """Drop from ``sys.path`` every folder the sandbox does not let this process read.

    An entry outside the view (a ``PYTHONPATH`` folder of the grader's, the working folder)
    would only make the import system, and any library that walks ``sys.path``, try a folder
    the sandbox refuses, and an honest student's import would look like an attempt.

    Args:
        readable: the roots the process may read.
    """
    roots = tuple(_unique(readable))
    sys.path[:] = [entry for entry in sys.path
                   if entry and _under(os.path.realpath(entry), roots)]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


# --------------------------------------------------------------------------- the jail


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """End this process (``SIGKILL``) when the process that started it ends.

    A sandboxed kernel or answer process must not outlive the grader that started it (a
    killed ``autograde`` would leave student code running). Call it first thing in the
    child; if the parent is already gone, the child ends now.
    """
    parent = os.getppid()
    _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the signal was armed
        os._exit(1)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(number)} (errno {number})")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _map_root_to(uid: int, gid: int) -> None:
    """In a new user namespace: root there is ``uid``/``gid`` outside (no other id exists)."""
    try:
        _write("/proc/self/setgroups", "deny")
    except OSError:
        pass
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")


def jail_available() -> bool:
    """Whether this machine lets an ordinary process create user, mount and network namespaces.

    Returns:
        True when :func:`enter_jail` can work here (checked in a throwaway child process).
    """
    return _in_child(lambda: _check(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET),
                                    "unshare"))


def _bind(libc, source: str, target: str, *, writable: bool = False) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _check(libc.mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None),
           f"bind {source}")
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID
    if not source.startswith("/dev/"):
        flags |= _MS_NODEV
    if not writable:
        flags |= _MS_RDONLY
    _check(libc.mount(None, target.encode(), None, flags, None), f"remount {source}")


def _drop_capabilities(libc) -> None:
    """No capabilities left in the jail's namespace (so its mounts cannot be undone)."""
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    number = 126 if os.uname().machine in ("x86_64", "amd64") else 91  # capset
    _check(libc.syscall(number, ctypes.byref(header), ctypes.byref(data)), "capset")
    for cap in range(64):  # and nothing to regain: empty the bounding set (best effort)
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP


def enter_jail(root: str | os.PathLike, readable: Iterable[str], *, hidden: Iterable[str] = (),
               scratch: str | None = None, scratch_megabytes: int = 64,
               cwd: str = "/", network: bool = True, keep_capabilities: bool = False,
               files: dict[str, str] | None = None) -> None:
    """Move this (single-threaded) process into a private, read-only view of the files.

    Args:
        network: also an empty network namespace (no device but a loopback that is down):
            no network at all. A Jupyter kernel keeps the machine's, because nbgrader talks
            to it over loopback TCP; Landlock then fences its ports.
        root: an empty folder that becomes the new root (a tmpfs is mounted on it).
        readable: files and folders to show at their usual paths, read-only.
        hidden: folders inside ``readable`` to cover with an empty folder.
        scratch: if given, a private writable tmpfs at this path (e.g. ``/tmp``).
        scratch_megabytes: the size of that tmpfs.
        cwd: the working folder inside the jail.
        keep_capabilities: keep the namespace's capabilities for now (a kernel that makes a
            private network later, :func:`private_loopback`, drops them itself).
        files: files written into the view, by path, in place of the machine's (read-only too).

    Raises:
        SandboxError: the kernel refused a step (no user namespaces, a threaded process).
    """
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | (_CLONE_NEWNET if network else 0)
    _check(libc.unshare(flags), "unshare(user, mount" + (", network)" if network else ")"))
    # A process that is not dumpable (the grader makes itself so, and its forks inherit it) has
    # its /proc/self files owned by root, so an account other than root could not write its own
    # uid_map below. It becomes dumpable only until the jail is set up (the end of this
    # function makes it not dumpable again), before any of the answer's code runs.
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    _map_root_to(uid, gid)
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    root = os.path.realpath(root)
    _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"size=8m,mode=0755"), "tmpfs root")
    if scratch:  # first, so that folders bound below it stay visible
        target = root + scratch
        os.makedirs(target, exist_ok=True)
        _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                          f"size={int(scratch_megabytes)}m,mode=1777".encode()), "scratch")
    files = files or {}
    for path in [*readable, *_DEVICES]:
        real = os.path.realpath(path)
        if not os.path.exists(real) or path in files:
            continue
        _bind(libc, real, root + real)
        link = os.path.abspath(path)
        if link != real and os.path.islink(link) and not os.path.lexists(root + link):
            os.makedirs(os.path.dirname(root + link), exist_ok=True)
            os.symlink(os.readlink(link), root + link)  # /lib64 -> usr/lib64, as outside
    for path, text in files.items():
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        with open(root + path, "w", encoding="utf-8") as handle:
            handle.write(text)
    for path in hidden:
        target = root + os.path.realpath(path)
        if os.path.isdir(target):
            _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs",
                              _MS_NOSUID | _MS_NODEV | _MS_RDONLY, b"size=4k,mode=0555"),
                   f"hide {path}")
    os.chdir(root)
    os.chroot(root)
    os.chdir("/")
    _check(libc.mount(None, b"/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                      b"size=8m,mode=0755"), "read-only root")
    os.chdir(cwd)
    if not keep_capabilities:
        _drop_capabilities(libc)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def private_loopback() -> None:
    """Move the calling thread into a new network namespace whose loopback is up; then drop
    every capability of the thread.

    A kernel's own sockets, made before, stay where they are (nbgrader reaches them); what
    the calling thread and everything it starts opens from now on lives in a network with
    nothing but a loopback of its own: workers that talk over TCP reach each other and
    nothing else. Call it inside the jail, which must have kept its capabilities.

    Raises:
        SandboxError: the kernel refused a step.
    """
    import fcntl
    import socket
    import struct

    libc = _libc()
    probe = -1
    try:
        _check(libc.unshare(_CLONE_NEWNET), "unshare(network)")
        # a socket of the C library's, not Python's: the audit hook explains Python's to students
        probe = libc.socket(socket.AF_INET, socket.SOCK_DGRAM, 0)
        if probe < 0:
            _check(-1, "socket")
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe, 0x8913, request))[1]  # GET
        fcntl.ioctl(probe, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))  # SET up
    except OSError as error:
        raise SandboxError(f"a private loopback network: {error}") from error
    finally:
        if probe >= 0:
            os.close(probe)
        _drop_capabilities(libc)


# --------------------------------------------------------------------------- kernel layers


def confine(readable: Iterable[str], writable: Iterable[str] = (), *,
            hidden: Iterable[str] = (), listen_ports: Iterable[int] = (),
            policy: Policy = Policy(), network_namespace: bool = False, kill: bool = False,
            all_threads: bool = False, filter_syscalls: bool = True,
            threads: bool = True, sockets: bool = True, drop_capabilities: bool = True,
            tcp_later: bool = False) -> Layers:
    """Enter layers 2 and 3 (Landlock and the seccomp filter), whichever this machine has.

    Capabilities are dropped too (a grader run as root keeps none). Call it after
    :func:`enter_jail`, if at all, and before any student code runs.

    Args:
        readable: files and folders that may be read (the system libraries are added).
        writable: folders that may be written (the private scratch folder).
        hidden: folders inside ``readable`` that stay closed (the checkers, the grader).
        listen_ports: TCP ports the process may bind (a kernel's own).
        policy: what the chapter's code needs beyond the default.
        network_namespace: the process is in a private network namespace, so TCP that the
            policy allows can only reach loopback.
        kill: a refused system call ends the process with ``SIGSYS`` (answers); otherwise
            it fails with ``EPERM`` (kernels).
        all_threads: the process has threads already (seccomp reaches them; Landlock must
            come before any thread, which the caller ensures).
        filter_syscalls: load the seccomp filter now (a kernel loads it later, once its own
            sockets exist).
        threads: the process may start threads (an answer's process may not: see
            :func:`.syscalls.confine`).
        sockets: the process may make new sockets (an answer's process has the one it needs:
            it may not, so no Unix socket of the instructor's is within its reach).
        drop_capabilities: drop them now (a kernel that makes a private network later keeps
            them until then).
        tcp_later: leave TCP to Landlock's caller: the process will move into a private
            network (:func:`private_loopback`) before any student code runs.

    Returns:
        The :class:`Layers` now in force (``namespaces`` is ``network_namespace``).
    """
    tcp = policy.loopback_tcp and (network_namespace or tcp_later)
    roots, listable = readable_tree([*readable, *SYSTEM_LIBRARIES, *_DEVICES], hidden)
    abi = 0
    if landlock.abi_version() > 0:
        try:
            abi = landlock.restrict([*roots, "/proc/self"], [*writable, "/dev/null"],
                                    listable=listable, listen_ports=listen_ports, tcp=tcp)
        except landlock.LandlockError:
            abi = 0
    if drop_capabilities:
        try:
            _drop_capabilities(_libc())
        except SandboxError:
            pass
    filtered = False
    if filter_syscalls:
        try:
            syscalls.confine(processes=policy.processes, tcp=tcp, kill=kill,
                             all_threads=all_threads, threads=threads, sockets=sockets)
            filtered = True
        except syscalls.SyscallFilterError:
            filtered = False
    return Layers(namespaces=network_namespace, landlock=abi, seccomp=filtered)


# --------------------------------------------------------------------------- limits


def limit_resources(*, memory_bytes: int | None = None, cpu_seconds: int | None = None,
                    file_bytes: int | None = None, open_files: int | None = None) -> None:
    """Lower this process's limits (they cannot be raised again without privileges).

    Args:
        memory_bytes: address space (``RLIMIT_AS``).
        cpu_seconds: CPU time (``RLIMIT_CPU``); the process is killed past it.
        file_bytes: the largest file it may write (``RLIMIT_FSIZE``; 0: none at all). A
            write past it fails with an error instead of killing the process.
        open_files: open file descriptors (``RLIMIT_NOFILE``).
    """
    def lower(kind, value):
        soft, hard = resource.getrlimit(kind)
        new = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (new, new))

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes is not None:
        lower(resource.RLIMIT_AS, int(memory_bytes))
    if cpu_seconds is not None:
        lower(resource.RLIMIT_CPU, int(cpu_seconds))
    if file_bytes is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        lower(resource.RLIMIT_FSIZE, int(file_bytes))
    if open_files is not None:
        lower(resource.RLIMIT_NOFILE, int(open_files))


# --------------------------------------------------------------------------- the audit hook


def install_audit_hook(*, readable: Iterable[str], writable: Iterable[str] = (),
                       allow_processes: bool = False, allow_network: bool = False,
                       blocked_modules: Iterable[str] = (),
                       report: Callable[[str, str], None] | None = None) -> None:
    """Explain, from now on, what the kernel layers refuse graded code, and report it.

    Only what a kernel layer refuses too is refused here (a file outside the view, a network
    socket, a new process where the policy gives none, the grader's modules): the hook turns
    the kernel's bare ``EACCES`` into a sentence and a report, so that a report is evidence.
    It runs in the graded process and can be taken apart by code that reaches its closure,
    so it is an explanation, never the boundary. Refusals met while an installed module's
    code runs at its import (a library probing its machine) are refused but not reported.

    Args:
        readable: roots under which files may be opened for reading.
        writable: roots under which files may be written (the private scratch folder).
        allow_processes: let the process start others (only inside a jail, whose view the
            children share; a kernel running chapter 17's ranks needs it).
        blocked_modules: module prefixes that may not be imported.
        allow_network: let it use TCP (a kernel in a network namespace of its own, whose
            loopback is all it reaches).
        report: called with ``(event, detail)`` before each refusal (it must not raise).
    """
    readable = tuple(_unique([*readable, *_DEVICES]))
    writable = tuple(_unique(writable))
    # A read-only root shown inside a writable one (a clone under /tmp, seen in a jail whose
    # scratch is /tmp) stays read-only: writing under it is refused and reported.
    shadowed = tuple(root for root in readable if _under(root, writable) and root not in writable)

    def may_write(path: str) -> bool:
        return _under(path, writable) and not _under(path, shadowed)

    blocked = tuple(blocked_modules)
    denied_events = set() if allow_network else set(_NETWORK_EVENTS)
    denied_events.add("os.chroot")
    if not allow_processes:
        denied_events |= _PROCESS_EVENTS
    denied_events = frozenset(denied_events)
    realpath, fspath, getframe = os.path.realpath, os.fspath, sys._getframe
    try:
        library = tuple(_unique([*python_roots(), package_root()]))
    except SandboxError:
        library = tuple(_unique(python_roots()))
    here = __file__
    busy = [False]

    def importing_a_library() -> bool:
        # an installed module's own code, run as it is imported, probes what it may (a
        # machine id, a socket), and the import system looks for a module in every folder of
        # sys.path: refused all the same, but no student's attempt. Walking out
        # from the refusal, the first frame that is not library code decides: a student's
        # cell or answer (report), or the body of a library module being imported (not).
        frame = getframe(1)
        while frame is not None and frame.f_code.co_filename == here:
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            return True  # the import system looking along sys.path for a module
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith("<frozen "):
                if not _under(name, library):
                    return False
                if frame.f_code.co_name == "<module>":
                    return True
            frame = frame.f_back
        return False

    def refuse(event: str, detail: str) -> None:
        if report is not None and not busy[0]:
            busy[0] = True
            try:
                if not importing_a_library():
                    report(event, detail)
            except Exception:  # noqa: BLE001 - reporting never decides
                pass
            finally:
                busy[0] = False
        raise PermissionError(f"not allowed while your work is graded: {event} {detail}".strip())

    readlink, join, isabs = os.readlink, os.path.join, os.path.isabs

    def path_of(value, dir_fd=None) -> str | None:
        if isinstance(value, int) or value is None:
            return None
        try:
            path = os.fsdecode(fspath(value))
            if type(dir_fd) is int and dir_fd >= 0 and not isabs(path):  # rmtree's unlinks
                path = join(readlink(f"/proc/self/fd/{dir_fd}"), path)
            return realpath(path)
        except (TypeError, ValueError, OSError):
            return "?"

    own = f"/proc/{os.getpid()}/"

    def proc_allowed(path: str) -> bool:
        return (path.startswith(own) and not path.endswith(("/mem", "/environ"))) or bool(
            _PROC_INFO.fullmatch(path))

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path = path_of(args[0])
            if path is None:
                return
            if path.startswith("/proc/"):
                if not proc_allowed(path):
                    refuse("reading", path)
                return
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if path == "/dev/null":
                return
            if writing:
                if not may_write(path):
                    refuse("writing", path)
            elif not (_under(path, readable) or _under(path, writable)):
                refuse("reading", path)
        elif event in ("os.listdir", "os.scandir"):
            path = path_of(args[0] if args and args[0] is not None else ".")
            if path == "/proc" or (path and path.startswith(own)):
                return
            if path and not (_under(path, readable) or _under(path, writable)):
                refuse("listing", path)
        elif event in _COPY_EVENTS:
            source, target = (path_of(args[0]) if args else None,
                              path_of(args[1]) if len(args) > 1 else None)
            if source and source != "?" and not (_under(source, readable)
                                                 or _under(source, writable)):
                refuse("reading", source)
            if target and (target == "?" or not may_write(target)):
                refuse("changing", target)
        elif event in _PATH_EVENTS:
            # (path, dir_fd) for remove and rmdir, (path, mode, dir_fd) for mkdir and chmod,
            # (source, target, source dir_fd, target dir_fd) for rename: the folder descriptor
            # a relative path is relative to (shutil.rmtree's way) follows its paths
            fds = [value for value in args[1:] if type(value) is int]
            paths = [value for value in args[:2] if not isinstance(value, int)]
            bases = fds[-len(paths):] if event in _DIR_FD_EVENTS and fds else []
            for index, value in enumerate(paths):
                path = path_of(value, bases[index] if index < len(bases) else None)
                if path and path != "?" and not may_write(path):
                    refuse("changing", path)
                if path == "?" and not writable:
                    refuse("changing", "a file")
        elif event == "sqlite3.connect":
            database = args[0] if args else None
            if str(database) not in (":memory:", "", "file::memory:"):  # IPython's history
                refuse("opening a database", str(database))
        elif event == "socket.__new__":
            import socket as _socket

            family = args[1] if len(args) > 1 else None
            allowed = (_socket.AF_UNIX, -1, None) + (
                (_socket.AF_INET, _socket.AF_INET6, _socket.AF_NETLINK) if allow_network else ())
            if family not in allowed:  # a local pair (asyncio) is fine
                refuse("opening a network socket", "")
        elif event in denied_events:
            refuse(event, "")
        elif event == "import" and blocked:
            name = args[0] if args and isinstance(args[0], str) else ""
            if name.startswith(blocked):
                refuse("importing", name)

    sys.addaudithook(hook)


def block_imports(prefixes: Iterable[str]) -> None:
    """Forget the modules under ``prefixes`` and refuse to import them again.

    Args:
        prefixes: dotted module prefixes (``attention_book.exercises``).
    """
    prefixes = tuple(prefixes)

    def blocked(name: str) -> bool:
        return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)

    for name in list(sys.modules):
        if blocked(name):
            parent, _, child = name.rpartition(".")
            if parent in sys.modules and not blocked(parent):
                try:
                    delattr(sys.modules[parent], child)
                except AttributeError:
                    pass
            del sys.modules[name]

    class _Refuse:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if blocked(name):
                raise ImportError(f"{name} is not available while your work is graded "
                                  "(an answer may not use the checkers or the grader)")
            return None

    sys.meta_path.insert(0, _Refuse())


# --------------------------------------------------------------------------- the kernel


#: The names of a private network's addresses, for a kernel whose workers talk over its
#: loopback: the C library then names every address a worker sees (an IPv4 address seen on
#: an IPv6 socket too) without asking a name server, which that network does not have.
LOCAL_HOSTS = "127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n"
#: The most bytes a kernel's scratch folder may hold where it is a plain folder (without the
#: private view it is no tmpfs of a fixed size): past it the kernel is ended.
KERNEL_SCRATCH_BYTES = 256 * 2**20
#: The most processes one kernel may run where its policy lets it start any.
KERNEL_PROCESSES = 128


def _connection_file(argv: list[str]) -> str | None:
    for index, arg in enumerate(argv):
        if arg == "-f" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("-f="):
            return arg[3:]
    return None


def _open_report() -> int:
    """The kernel's report file, opened before any student code runs (-1: none).

    ``BOOK_SANDBOX_REPORT`` names it; or ``BOOK_SANDBOX_REPORTS`` names the run's folder of
    reports, one per student, and the kernel's working folder, which nbgrader sets to the
    student's folder of the course's ``autograded/`` (``BOOK_SANDBOX_STUDENTS``:
    ``<course>/autograded/<student>/<assignment>``), says whose. The file must exist (the run
    made it): a kernel opens its own student's and can reach no other, so whatever a student's
    code writes there concerns that student alone.
    """
    path = os.environ.get("BOOK_SANDBOX_REPORT")
    folder = os.environ.get("BOOK_SANDBOX_REPORTS")
    students = os.environ.get("BOOK_SANDBOX_STUDENTS")
    if not path and folder and students:
        try:
            parts = Path(os.getcwd()).resolve().relative_to(Path(students).resolve()).parts
        except ValueError:
            parts = ()
        if parts and parts[0] not in (".", ".."):
            path = os.path.join(folder, f"{parts[0]}.log")
    if not path or not os.path.isfile(path):
        return -1
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except OSError:
        return -1


def _new_pid_namespace() -> bool:
    """Enter new user and PID namespaces: the next child is the first process of its own PID
    namespace, whose end ends every process in it."""
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
        return False
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        _map_root_to(uid, gid)
    except OSError:
        return False
    return True


def folder_bytes(folder: str) -> int:
    """The bytes the files under ``folder`` take on disk (what a scratch folder's bound counts)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _kernel_main(argv: list[str]) -> int:
    """Start a sandboxed IPython kernel (nbgrader's kernel for feedback runs).

    This process stays outside the sandbox and starts the kernel as its child. It adopts
    every process started below it (:func:`.processes.become_subreaper`), gives the kernel a
    PID namespace of its own where its policy lets it start processes and user namespaces
    exist (a cgroup, or ``RLIMIT_NPROC``, elsewhere), bounds its scratch folder where no
    tmpfs does, and when the kernel ends, ends every process the kernel left behind and says
    so. None of nbgrader's descriptors reaches the kernel: its standard streams are
    ``/dev/null``, so nothing a student's code writes or starts holds nbgrader's output.

    Reads ``BOOK_SANDBOX_*`` environment variables set by the kernel spec of the run:
    ``BOOK_SANDBOX_READABLE`` (extra readable folders, ``os.pathsep``-separated),
    ``BOOK_SANDBOX_MEMORY`` (bytes), ``BOOK_SANDBOX_POLICY`` (a :class:`Policy` as JSON),
    ``BOOK_SANDBOX_JAIL`` (``0``: no private view), ``BOOK_SANDBOX_REQUIRE`` (the
    :class:`Layers` the run promised, as JSON: the kernel stops if it cannot enter them),
    ``BOOK_SANDBOX_REPORT`` or ``BOOK_SANDBOX_REPORTS`` (where it reports, see
    :func:`_open_report`), ``BOOK_SANDBOX_SCRATCH_BYTES`` (the scratch folder's bound without
    the private view; default :data:`KERNEL_SCRATCH_BYTES`). Every refusal and every stop is
    a line of that report.
    """
    sys.dont_write_bytecode = True
    die_with_parent()  # a feedback run's kernel ends with the nbgrader that started it
    connection = _connection_file(argv)
    if connection is None:
        print("usage: python -m attention_book.classroom.sandbox kernel -f CONNECTION_FILE",
              file=sys.stderr)
        return 2
    report = _open_report()
    write = os.write

    def say(text: str) -> None:
        if report >= 0:
            try:
                write(report, f"{text}\n".encode(errors="replace"))
            except OSError:
                pass

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nbgrader's output pipe is nobody's to hold
        os.dup2(devnull, fd)
    os.close(devnull)
    policy = Policy(**json.loads(os.environ.get("BOOK_SANDBOX_POLICY", "{}")))
    jail = os.environ.get("BOOK_SANDBOX_JAIL", "1") != "0"
    processes.become_subreaper()
    own_pids = False
    containment = processes.Containment(None)
    if policy.processes:
        own_pids = jail and _new_pid_namespace()
        if not own_pids:
            containment = processes.contain_processes(KERNEL_PROCESSES)
            containment.join()
        if not own_pids and containment.path is None:  # inherited by the kernel
            processes.limit_process_count(KERNEL_PROCESSES, cpu_seconds=3600)
    import tempfile

    scratch = os.path.realpath(tempfile.mkdtemp(prefix="abk-kernel-"))
    child = os.fork()
    if child == 0:  # pragma: no cover - the kernel, in its own process
        code = 0
        try:
            code = _kernel_child(argv, connection, policy, scratch, jail, say)
        except BaseException as error:  # noqa: BLE001 - report it, never hang nbgrader
            say(f"stopped: the kernel could not start ({type(error).__name__}: {error})"[:500])
            code = 3
        os._exit(code)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel gets it through its group

    def stop(signum, frame):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    # without the private view the scratch folder is a plain folder: watched (in the view it
    # is a tmpfs of a fixed size mounted on it, and the folder seen from here stays empty)
    status = None
    bound = int(os.environ.get("BOOK_SANDBOX_SCRATCH_BYTES", KERNEL_SCRATCH_BYTES))
    while status is None:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = wait_status
        elif pid == 0:
            if folder_bytes(scratch) > bound:
                say(f"stopped: the notebook's scratch files passed {bound / 2**20:g} MB, so "
                    "its kernel was ended")
                stop(None, None)
            time.sleep(0.2)
    left = processes.end_descendants() + containment.close()
    if left:
        say(f"ended: {left} process(es) that the notebook's code started were still running "
            "when its kernel ended")
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    if status is None:
        return 1
    return os.waitstatus_to_exitcode(status) & 0xFF


def _kernel_child(argv: list[str], connection: str, policy: Policy, scratch: str, jail: bool,
                  say: Callable[[str], None]) -> int:
    """The kernel itself: the sandbox's layers, then ipykernel (see :func:`_kernel_main`)."""
    die_with_parent()
    cwd = os.getcwd()
    with open(connection, encoding="utf-8") as handle:
        connection_text = handle.read()
    info = json.loads(connection_text)
    ports = [int(info[key]) for key in ("shell_port", "iopub_port", "stdin_port",
                                        "control_port", "hb_port") if info.get(key)]
    required = Layers(**json.loads(os.environ.get("BOOK_SANDBOX_REQUIRE", "{}")))
    extra = [p for p in os.environ.get("BOOK_SANDBOX_READABLE", "").split(os.pathsep) if p]
    readable = [*python_roots(), package_root(), cwd, *SYSTEM_LIBRARIES, *extra]
    memory = int(os.environ.get("BOOK_SANDBOX_MEMORY", str(8 * 2**30)))
    backend = os.environ.get("MPLBACKEND", "")
    if not backend.startswith(("module://matplotlib_inline.", "module://attention_book.")):
        backend = "module://matplotlib_inline.backend_inline"
    running = [False]  # refusals while ipykernel starts (probes of its own) are not reported

    def refused(event: str, detail: str) -> None:
        if running[0]:
            say(f"refused: {event} {detail}".strip())

    import tempfile

    # a private loopback network for workers that talk over TCP, made once ipykernel's own
    # sockets exist: the jail keeps its capabilities until then
    network_later = jail and policy.loopback_tcp
    jailed = False
    if jail:
        try:
            enter_jail(scratch, readable, scratch="/tmp", scratch_megabytes=256, cwd=cwd,
                       network=False, keep_capabilities=network_later, files={
                           "/etc/hosts": LOCAL_HOSTS} if network_later else None)
            jailed = True
        except (SandboxError, OSError) as error:
            say(f"no private file view ({error})")
    network_later = network_later and jailed
    own_scratch = "/tmp" if jailed else scratch
    connection_copy = os.path.join(own_scratch, "kernel-connection.json")
    with open(connection_copy, "w", encoding="utf-8") as handle:
        handle.write(connection_text)
    kept = student_environment()
    os.environ.clear()  # no token or secret of the grader reaches student code
    os.environ.update(kept)
    for key in ("HOME", "IPYTHONDIR", "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR", "XDG_CACHE_HOME",
                "HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR", "TRITON_CACHE_DIR"):
        os.environ[key] = own_scratch
    tempfile.tempdir = own_scratch
    startup = os.path.join(own_scratch, "profile_default", "startup")
    os.makedirs(startup, exist_ok=True)
    open(os.path.join(startup, "README"), "w").close()  # IPython copies it otherwise
    os.environ.update({"PYTHONSAFEPATH": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                       "MPLBACKEND": backend})
    keep_readable_path(readable)
    # Landlock before the first thread (ipykernel starts several): it holds for all of them.
    layers = confine(readable, [own_scratch], listen_ports=ports, policy=policy,
                     filter_syscalls=False, drop_capabilities=not network_later,
                     tcp_later=network_later)
    import matplotlib

    matplotlib.use(backend)
    import matplotlib.font_manager  # noqa: F401 - the font cache is read before writes stop
    from ipykernel import kernelbase
    from ipykernel.kernelapp import IPKernelApp

    listing = kernelbase.Kernel._process_children

    def children(self):  # no other process's /proc is readable: no children to list
        try:
            return listing(self)
        except Exception:  # noqa: BLE001
            return []

    kernelbase.Kernel._process_children = children
    contained = jailed or layers.landlock > 0
    limit_resources(memory_bytes=memory, file_bytes=64 * 2**20 if contained else 0,
                    open_files=4096)
    args = [a for a in argv if a != connection and not a.startswith("-f")
            and not a.startswith("--HistoryManager.hist_file")]
    app = IPKernelApp.instance()
    app.initialize(["-f", connection_copy, *args, "--HistoryManager.hist_file=:memory:"])
    tcp = False
    if network_later:
        try:
            private_loopback()
            tcp = True
        except SandboxError as error:
            say(f"no private network for the chapter's workers ({error})")
            if layers.landlock >= 4:  # TCP closed again for this thread and what it starts
                landlock.restrict(["/"], ["/"], listen_ports=())
    install_audit_hook(readable=readable, writable=[own_scratch],
                       allow_processes=policy.processes, allow_network=tcp,
                       blocked_modules=("nbgrader",), report=refused)
    filtered = False
    try:  # after ipykernel made its sockets, before any cell runs, on every thread
        syscalls.confine(processes=policy.processes, tcp=tcp, all_threads=True, unix=False)
        filtered = True
    except syscalls.SyscallFilterError as error:
        say(f"no seccomp filter ({error})")
    layers = Layers(namespaces=jailed, landlock=layers.landlock, seccomp=filtered)
    if (required.namespaces and not layers.namespaces) or layers.landlock < required.landlock \
            or (required.seccomp and not layers.seccomp):
        say(f"stopped: this kernel entered {layers.describe()}, not the {required.describe()} "
            "that the run promised")
        return 3
    say(f"layers: {layers.describe()}")
    running[0] = True
    app.start()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m attention_book.classroom.sandbox kernel -f FILE`` (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kernel"]:
        return _kernel_main(argv[1:])
    if argv[:1] == ["check"]:
        print(available_layers().describe())
        return 0
    print("usage: python -m attention_book.classroom.sandbox {kernel -f FILE | check}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

