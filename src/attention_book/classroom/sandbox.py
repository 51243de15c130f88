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
3. **A seccomp filter** (:mod:`.syscalls`): no socket but local ones, no new processes, no
   writable shared file mappings, no ptrace and no reach into other processes, no
   namespaces, mounts, BPF or ``io_uring``.
4. **Resource limits** (:func:`limit_resources`): memory, CPU time, open files, file size.
5. **An audit hook** (:func:`install_audit_hook`, PEP 578), which explains in a sentence a
   student can read why an attempt from Python (opening the course, a socket, ``ctypes``,
   importing the checkers) is refused, and reports it. It is an explanation, not the
   boundary: native code below Python (``torch.ops.aten.from_file``, any C++ operator
   that opens a path) never passes it, and is stopped by layers 1-3.

:func:`available_layers` says which layers this machine gives; :data:`POLICIES` states what
a chapter's own cells need beyond the default (chapter 17 starts worker processes that talk
over loopback TCP).

``python -m attention_book.classroom.sandbox kernel -f CONNECTION_FILE`` is the sandboxed
Jupyter kernel that the book's course configuration gives nbgrader.

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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__:
    from . import landlock, syscalls
else:  # pragma: no cover - the kernel spec runs this file as a script, without the package
    import importlib.util

    def _sibling(name: str):
        spec = importlib.util.spec_from_file_location(
            f"_sandbox_{name}", Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    landlock, syscalls = _sibling("landlock"), _sibling("syscalls")

__all__ = ["POLICIES", "Layers", "Policy", "SandboxError", "available_layers", "confine",
           "die_with_parent", "enter_jail", "install_audit_hook", "jail_available",
           "limit_resources", "neuter_native_file_access", "package_root", "policy_for", "python_roots",
           "readable_tree"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 1, 2, 4
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE, _PR_SET_PDEATHSIG = 38, 4, 1
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: The system's shared libraries and what the loader reads: no secrets, needed by NumPy/torch.
SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache",
                    "/usr/share/zoneinfo", "/etc/localtime", "/proc/cpuinfo",
                    "/sys/devices/system/cpu")

#: Module prefixes an answer may not import while it is graded.
GRADER_MODULES = ("attention_book.exercises", "attention_book.classroom", "nbgrader",
                  "nbformat", "sqlite3", "_sqlite3")

_PROCESS_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg", "signal.pthread_kill"})
_PATH_EVENTS = frozenset({  # every path argument must be writable
    "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.truncate",
    "os.utime", "os.chflags", "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr",
    "shutil.rmtree", "shutil.move", "shutil.chown", "os.mkfifo", "os.mknod"})
_COPY_EVENTS = frozenset({  # the first path is read, the second written
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree", "os.link",
    "os.symlink"})
_ALWAYS_DENIED = frozenset({
    "dbm.open", "resource.setrlimit",
    "resource.prlimit", "mmap.__new__", "os.chroot", "os.chdir", "os.fchdir", "socket.bind",
    "socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.sendto",
    "socket.sendmsg", "urllib.Request", "http.client.connect", "ftplib.connect",
    "smtplib.connect", "telnetlib.Telnet.open", "webbrowser.open", "syslog.openlog",
    "os.setuid", "os.setgid", "_posixsubprocess.fork_exec", "msvcrt.open_osfhandle",
    "winreg.OpenKey", "sys.remote_exec"})
#: What any process may read of /proc beyond its own entry: process lists (psutil, at a
#: kernel's shutdown), never another process's memory or environment.
_PROC_INFO = re.compile(r"/proc/(cpuinfo|meminfo|stat|uptime|loadavg|\d+/(stat|status|cmdline))")
#: The environment variables a sandboxed kernel keeps (prefixes); every other one (a hub's
#: API token, say) is removed before student code runs.
_KERNEL_ENVIRONMENT = ("PATH", "LANG", "LC_", "LD_LIBRARY_PATH", "PYTHON", "OMP_", "MKL_",
                       "ATEN_", "KMP_", "ONEDNN_", "OPENBLAS_", "BOOK_", "MPLBACKEND",
                       "PYDEVD_", "JPY_", "TZ")
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
               cwd: str = "/", network: bool = True) -> None:
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
    try:
        _write("/proc/self/setgroups", "deny")
    except OSError:
        pass
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
    root = os.path.realpath(root)
    _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"size=8m,mode=0755"), "tmpfs root")
    if scratch:  # first, so that folders bound below it stay visible
        target = root + scratch
        os.makedirs(target, exist_ok=True)
        _check(libc.mount(b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                          f"size={int(scratch_megabytes)}m,mode=1777".encode()), "scratch")
    for path in [*readable, *_DEVICES]:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        _bind(libc, real, root + real)
        link = os.path.abspath(path)
        if link != real and os.path.islink(link) and not os.path.lexists(root + link):
            os.makedirs(os.path.dirname(root + link), exist_ok=True)
            os.symlink(os.readlink(link), root + link)  # /lib64 -> usr/lib64, as outside
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
    _drop_capabilities(libc)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


# --------------------------------------------------------------------------- kernel layers


def confine(readable: Iterable[str], writable: Iterable[str] = (), *,
            hidden: Iterable[str] = (), listen_ports: Iterable[int] = (),
            policy: Policy = Policy(), network_namespace: bool = False, kill: bool = False,
            all_threads: bool = False, filter_syscalls: bool = True,
            threads: bool = True) -> Layers:
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

    Returns:
        The :class:`Layers` now in force (``namespaces`` is ``network_namespace``).
    """
    tcp = policy.loopback_tcp and network_namespace
    roots, listable = readable_tree([*readable, *SYSTEM_LIBRARIES, *_DEVICES], hidden)
    abi = 0
    if landlock.abi_version() > 0:
        try:
            abi = landlock.restrict([*roots, "/proc/self"], [*writable, "/dev/null"],
                                    listable=listable, listen_ports=listen_ports, tcp=tcp)
        except landlock.LandlockError:
            abi = 0
    try:
        _drop_capabilities(_libc())
    except SandboxError:
        pass
    filtered = False
    if filter_syscalls:
        try:
            syscalls.confine(processes=policy.processes, tcp=tcp, kill=kill,
                             all_threads=all_threads, threads=threads)
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


# --------------------------------------------------------------------------- native file access


def _refuse(what: str) -> Callable:
    def refused(*args, **kwargs):
        raise PermissionError(f"{what} is not available while your work is graded")

    refused.__name__ = what.rsplit(".", 1)[-1]
    return refused


def neuter_native_file_access(*, processes: bool = False) -> None:
    """Replace the functions that read, map or load files below Python's ``open``.

    Args:
        processes: keep the low-level process starter (a jailed kernel may start processes:
            they share its jail).
    """
    import torch

    targets = [(torch, "from_file"), (torch.UntypedStorage, "from_file"),
               (torch.TypedStorage, "from_file"), (torch.ops, "load_library"),
               (torch.classes, "load_library"), (torch.jit, "load"),
               (torch._C, "PyTorchFileReader"), (torch._C, "PyTorchFileWriter"),
               (torch._C, "import_ir_module"), (torch._C, "_load_for_lite_interpreter")]
    for name in ("ByteStorage", "FloatStorage", "DoubleStorage", "LongStorage", "IntStorage",
                 "BoolStorage", "HalfStorage", "BFloat16Storage", "ShortStorage", "CharStorage"):
        klass = getattr(torch, name, None)
        if klass is not None:
            targets.append((klass, "from_file"))
    try:
        import numpy

        targets += [(numpy, "fromfile"), (numpy, "memmap")]
        core = getattr(numpy, "_core", None) or getattr(numpy, "core", None)
        multiarray = getattr(core, "multiarray", None)
        if multiarray is not None:
            targets.append((multiarray, "fromfile"))
    except ImportError:  # pragma: no cover - numpy comes with torch
        pass
    for owner, name in targets:
        if getattr(owner, name, None) is None:
            continue
        try:
            setattr(owner, name, _refuse(f"{getattr(owner, '__name__', 'torch')}.{name}"))
        except (AttributeError, TypeError):
            pass
    if processes:
        return
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = _refuse("_posixsubprocess.fork_exec")
        import subprocess

        subprocess._fork_exec = _refuse("subprocess._fork_exec")
    except (ImportError, AttributeError):  # pragma: no cover - not on Linux
        pass


# --------------------------------------------------------------------------- the audit hook


def install_audit_hook(*, readable: Iterable[str], writable: Iterable[str] = (),
                       allow_processes: bool = False, blocked_modules: Iterable[str] = (),
                       report: Callable[[str, str], None] | None = None) -> None:
    """Refuse, from now on, what graded code may not do (see the module docstring).

    Args:
        readable: roots under which files may be opened for reading.
        writable: roots under which files may be written (the private scratch folder).
        allow_processes: let the process start others (only inside a jail, whose view the
            children share; a kernel running chapter 17's ranks needs it).
        blocked_modules: module prefixes that may not be imported.
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
    denied_events = set(_ALWAYS_DENIED)
    if not allow_processes:
        denied_events |= _PROCESS_EVENTS
    denied_events = frozenset(denied_events)
    realpath, fspath = os.path.realpath, os.fspath
    busy = [False]

    def refuse(event: str, detail: str) -> None:
        if report is not None and not busy[0]:
            busy[0] = True
            try:
                report(event, detail)
            except Exception:  # noqa: BLE001 - reporting never decides
                pass
            finally:
                busy[0] = False
        raise PermissionError(f"not allowed while your work is graded: {event} {detail}".strip())

    def path_of(value) -> str | None:
        if isinstance(value, int) or value is None:
            return None
        try:
            return realpath(os.fsdecode(fspath(value)))
        except (TypeError, ValueError):
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
            for value in args[:2]:
                path = path_of(value)
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
            if family not in (_socket.AF_UNIX, -1, None):  # a local pair (asyncio) is fine
                refuse("opening a network socket", "")
        elif event in denied_events or event.startswith("ctypes."):
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


def _kernel_main(argv: list[str]) -> int:
    """Start a sandboxed IPython kernel (nbgrader's kernel for feedback runs).

    Reads ``BOOK_SANDBOX_*`` environment variables set by the kernel spec of the run:
    ``BOOK_SANDBOX_READABLE`` (extra readable folders, ``os.pathsep``-separated),
    ``BOOK_SANDBOX_MEMORY`` (bytes), ``BOOK_SANDBOX_POLICY`` (a :class:`Policy` as JSON),
    ``BOOK_SANDBOX_JAIL`` (``0``: no private view), ``BOOK_SANDBOX_REQUIRE`` (the
    :class:`Layers` the run promised, as JSON: the kernel stops if it cannot enter them).
    Every refusal is written to the kernel's own standard error as a ``[sandbox]`` line,
    which nbgrader's log keeps for the instructor's summary.
    """
    # A module imported for the first time would have its bytecode cached beside it, which
    # the sandbox refuses (and reports, flagging an honest student): the kernel writes none.
    sys.dont_write_bytecode = True
    die_with_parent()  # a feedback run's kernel ends with the nbgrader that started it
    cwd = os.getcwd()
    connection = None
    for index, arg in enumerate(argv):
        if arg == "-f" and index + 1 < len(argv):
            connection = argv[index + 1]
        elif arg.startswith("-f="):
            connection = arg[3:]
    if connection is None:
        print("usage: python -m attention_book.classroom.sandbox kernel -f CONNECTION_FILE",
              file=sys.stderr)
        return 2
    with open(connection, encoding="utf-8") as handle:
        connection_text = handle.read()
    info = json.loads(connection_text)
    ports = [int(info[key]) for key in ("shell_port", "iopub_port", "stdin_port",
                                        "control_port", "hb_port") if info.get(key)]
    policy = Policy(**json.loads(os.environ.get("BOOK_SANDBOX_POLICY", "{}")))
    required = Layers(**json.loads(os.environ.get("BOOK_SANDBOX_REQUIRE", "{}")))
    extra = [p for p in os.environ.get("BOOK_SANDBOX_READABLE", "").split(os.pathsep) if p]
    readable = [*python_roots(), package_root(), cwd, *SYSTEM_LIBRARIES, *extra]
    memory = int(os.environ.get("BOOK_SANDBOX_MEMORY", str(8 * 2**30)))
    log = os.dup(2)  # nbgrader's log: ipykernel sends fd 2 to the notebook later
    running = [False]  # refusals while ipykernel starts (probes of its own) are not reported

    def refused(event: str, detail: str) -> None:
        if running[0]:
            say(f"refused: {event} {detail}".strip())

    def say(text: str) -> None:
        try:
            os.write(log, f"[sandbox] {text}\n".encode(errors="replace"))
        except OSError:
            pass

    import tempfile

    jailed = False
    if os.environ.get("BOOK_SANDBOX_JAIL", "1") != "0":
        root = tempfile.mkdtemp(prefix="abk-kernel-")
        try:
            enter_jail(root, readable, scratch="/tmp", scratch_megabytes=256, cwd=cwd,
                       network=False)
            jailed = True
        except (SandboxError, OSError) as error:
            say(f"no private file view ({error})")
    scratch = "/tmp" if jailed else os.path.realpath(tempfile.mkdtemp(prefix="abk-kernel-"))
    connection_copy = os.path.join(scratch, "kernel-connection.json")
    with open(connection_copy, "w", encoding="utf-8") as handle:
        handle.write(connection_text)
    for key in list(os.environ):  # no token or secret of the grader reaches student code
        if not key.startswith(_KERNEL_ENVIRONMENT):
            del os.environ[key]
    for key in ("HOME", "IPYTHONDIR", "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR", "XDG_CACHE_HOME",
                "HF_HOME", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        os.environ[key] = scratch
    tempfile.tempdir = scratch
    startup = os.path.join(scratch, "profile_default", "startup")
    os.makedirs(startup, exist_ok=True)
    open(os.path.join(startup, "README"), "w").close()  # IPython copies it otherwise
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if "" in sys.path:
        sys.path.remove("")
    # Landlock before the first thread (ipykernel starts several): it holds for all of them.
    layers = confine(readable, [scratch], listen_ports=ports, policy=policy,
                     filter_syscalls=False)
    import matplotlib

    matplotlib.use("module://matplotlib_inline.backend_inline")
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
    neuter_native_file_access(processes=policy.processes)
    install_audit_hook(readable=readable, writable=[scratch],
                       allow_processes=policy.processes, blocked_modules=("nbgrader",),
                       report=refused)
    args = [a for a in argv if a != connection and not a.startswith("-f")
            and not a.startswith("--HistoryManager.hist_file")]
    app = IPKernelApp.instance()
    app.initialize(["-f", connection_copy, *args, "--HistoryManager.hist_file=:memory:"])
    filtered = False
    try:  # after ipykernel made its sockets, before any cell runs, on every thread
        syscalls.confine(processes=policy.processes, tcp=False, all_threads=True)
        filtered = True
    except syscalls.SyscallFilterError as error:
        say(f"no seccomp filter ({error})")
    layers = Layers(namespaces=jailed, landlock=layers.landlock, seccomp=filtered)
    if (required.namespaces and not layers.namespaces) or layers.landlock < required.landlock \
            or (required.seccomp and not layers.seccomp):
        say(f"stopped: this kernel entered {layers.describe()}, not the {required.describe()} "
            "that the run promised")
        os._exit(3)
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

