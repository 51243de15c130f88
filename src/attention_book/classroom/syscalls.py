"""A seccomp-bpf filter for graded code: the system calls that file rules cannot express.

Landlock (:mod:`.landlock`) decides which files a process may open. What it cannot say, this
filter says, through libseccomp's own Python bindings (Debian's ``python3-seccomp``;
``tools/ensure_seccomp.sh`` installs them, or PyPI's ``pyseccomp``, which has the same API):

- **no network**: ``socket`` for any family but local (Unix) sockets is refused, so neither
  Python's ``socket`` nor native code (``torch.distributed.TCPStore``) opens one; a chapter
  whose workers talk over loopback TCP may open TCP sockets (see :data:`.sandbox.POLICIES`);
- **no Unix socket by path**: a kernel may make no new Unix socket once its own exist
  (``unix=False``), and an answer's process no socket at all (``sockets=False``), so neither
  reaches a service of the instructor's account through a socket file (Landlock does not
  fence ``connect`` on those before its ABI adds it);
- **no new processes**: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` and
  ``execve`` are refused, unless the policy allows processes;
- **no new threads** in an answer's process (``threads=False``): every ``clone`` is refused.
  The refusal of the forbidden PyTorch operators at the dispatcher holds in the thread that
  runs the answer (a dispatch mode is per thread), so an answer may not start another one.
  The answer's process pins PyTorch to one thread before the filter, and makes none of its
  own; a Jupyter kernel keeps its threads;
- **no writable shared file mappings**: ``mmap`` with ``PROT_WRITE`` and ``MAP_SHARED`` on a
  file, the way ``torch.ops.aten.from_file(..., shared=True)`` writes into a file;
- **no reach into other processes or the kernel**: ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_getfd``, ``kcmp``, namespaces (``unshare``, ``setns``, namespace flags of
  ``clone``), ``mount`` and friends, ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring``, keyrings, file handles, kernel modules.

A refused call either fails with ``EPERM`` (a Jupyter kernel, which must live on to give the
student feedback) or ends the whole process at once with ``SIGSYS`` (an answer's process:
whoever started it sees the signal and reports it, and nothing in the process can hide
it; Python-level attempts are refused earlier, and reported, by the audit hook). ``clone3``
answers "not implemented", as in Docker's profile, so the C library falls back to ``clone``,
whose flags a filter can read. The filter also holds every other architecture's system
calls back (a 32-bit call cannot go around it).

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["SyscallFilterError", "available", "confine", "refuse_user_namespaces"]

_CLONE_THREAD = 0x00010000
_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                    0x40000000, 0x00000080)  # mount, cgroup, uts, ipc, user, pid, net, time
_PROT_WRITE, _MAP_SHARED, _MAP_ANONYMOUS = 0x2, 0x1, 0x20
_SOCK_STREAM, _SOCK_TYPE_MASK = 1, 0xF
_NEVER = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
          "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount",
          "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf",
          "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
          "io_uring_register", "keyctl", "add_key", "request_key", "name_to_handle_at",
          "open_by_handle_at", "init_module", "finit_module", "delete_module", "kexec_load",
          "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "quotactl", "syslog",
          "fanotify_init", "iopl", "ioperm", "settimeofday", "clock_settime", "adjtimex",
          "clock_adjtime", "personality", "lookup_dcookie", "vhangup", "sethostname",
          "setdomainname")
_PROCESSES = ("fork", "vfork", "execve", "execveat")


class SyscallFilterError(RuntimeError):
    """No seccomp bindings here, or the kernel refused the filter."""


def _import_bindings():
    try:
        import seccomp
    except ImportError:
        try:
            import pyseccomp as seccomp
        except ImportError:
            return None
    return seccomp


# Imported now, while every file is readable: the filter is loaded after Landlock closes
# the folders that Debian's module lives in.
_SECCOMP = _import_bindings()


def _bindings():
    if _SECCOMP is None:
        raise SyscallFilterError("no seccomp bindings in this Python (tools/ensure_seccomp.sh "
                                 "installs Debian's python3-seccomp)")
    return _SECCOMP


def available() -> bool:
    """Whether this Python has seccomp bindings and this kernel takes a filter.

    Returns:
        True when :func:`confine` can work here.
    """
    try:
        seccomp = _bindings()
        seccomp.SyscallFilter(seccomp.ALLOW)
    except Exception:  # noqa: BLE001 - no bindings, or no libseccomp
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return any(line.startswith("Seccomp:") for line in handle)
    except OSError:  # pragma: no cover - no /proc: trust the bindings
        return True


def _rule(seccomp, flt, action, name: str, *args) -> None:
    try:
        flt.add_rule(action, name, *args)
    except (RuntimeError, ValueError, OSError):  # a call this architecture does not have
        pass


def confine(*, processes: bool = False, tcp: bool = False, all_threads: bool = False,
            kill: bool = False, threads: bool = True, unix: bool = True,
            sockets: bool = True) -> None:
    """Load the grading filter into this process (and every process it starts).

    Args:
        kill: end the process with ``SIGSYS`` on a refused call (otherwise it fails with
            ``EPERM``).
        processes: allow new processes (a chapter whose cells start workers).
        tcp: allow TCP sockets besides Unix ones (with ``processes``, for workers that talk
            over loopback inside a network namespace of their own).
        all_threads: apply it to every thread of the process (a kernel whose threads were
            started before), not only to the calling one.
        threads: allow new threads (a kernel's, a rank's). Without it, and without
            ``processes``, ``clone`` is refused whatever its flags.
        unix: allow new Unix sockets (``socket(AF_UNIX, …)``). Without it no socket can
            reach a Unix socket by its path (the instructor's services): a pair of connected
            sockets (``socketpair``) stays possible, and so do the sockets made before.
        sockets: allow new sockets at all (an answer's process has the one it needs).

    Raises:
        SyscallFilterError: no bindings, or the kernel refused the filter.
    """
    seccomp = _bindings()
    trap = seccomp.KILL_PROCESS if kill else seccomp.ERRNO(errno.EPERM)
    try:
        flt = seccomp.SyscallFilter(seccomp.ALLOW)
        if all_threads:
            flt.set_attr(seccomp.Attr.CTL_TSYNC, 1)
        for name in _NEVER:
            _rule(seccomp, flt, trap, name)
        _rule(seccomp, flt, seccomp.ERRNO(errno.ENOSYS), "clone3")
        # with TCP (in a network namespace of its own), also netlink's routing sockets, by which
        # the C library lists that namespace's interfaces (gloo asks for them)
        allowed = ({socket.AF_UNIX} if unix else set()) | (
            {socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK} if tcp else set())
        if sockets:
            for family in range(64):
                if family not in allowed:
                    _rule(seccomp, flt, trap, "socket", seccomp.Arg(0, seccomp.EQ, family))
        else:
            for name in ("socket", "socketpair", "connect", "bind", "listen", "accept",
                         "accept4"):
                _rule(seccomp, flt, trap, name)
        if tcp:
            _rule(seccomp, flt, trap, "socket", seccomp.Arg(0, seccomp.EQ, socket.AF_NETLINK),
                  seccomp.Arg(2, seccomp.NE, 0))  # NETLINK_ROUTE only
            for family in (socket.AF_INET, socket.AF_INET6):
                for kind in range(2, 11):  # datagram, raw, packet, ...: only streams
                    _rule(seccomp, flt, trap, "socket", seccomp.Arg(0, seccomp.EQ, family),
                          seccomp.Arg(1, seccomp.MASKED_EQ, _SOCK_TYPE_MASK, kind))
        _rule(seccomp, flt, trap, "mmap",
              seccomp.Arg(2, seccomp.MASKED_EQ, _PROT_WRITE, _PROT_WRITE),
              seccomp.Arg(3, seccomp.MASKED_EQ, _MAP_SHARED | _MAP_ANONYMOUS, _MAP_SHARED))
        if processes:
            for flag in _NAMESPACE_FLAGS:
                _rule(seccomp, flt, trap, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        else:
            for name in _PROCESSES:
                _rule(seccomp, flt, trap, name)
            if threads:
                _rule(seccomp, flt, trap, "clone",
                      seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
            else:
                _rule(seccomp, flt, trap, "clone")
        flt.load()
    except SyscallFilterError:
        raise
    except Exception as error:  # noqa: BLE001 - the bindings raise several kinds
        raise SyscallFilterError(f"the seccomp filter could not be loaded: {error}") from error


def refuse_user_namespaces() -> None:
    """Refuse user namespaces to this process and its children, as Docker's default profile does.

    ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with ``EPERM`` and ``clone3`` with
    ``ENOSYS``. The tests grade under it to show what a Docker or Kubernetes hub gives.

    Raises:
        SyscallFilterError: no bindings, or the kernel refused the filter.
    """
    seccomp = _bindings()
    try:
        flt = seccomp.SyscallFilter(seccomp.ALLOW)
        user = 0x10000000
        flt.add_rule(seccomp.ERRNO(errno.EPERM), "unshare",
                     seccomp.Arg(0, seccomp.MASKED_EQ, user, user))
        flt.add_rule(seccomp.ERRNO(errno.EPERM), "clone",
                     seccomp.Arg(0, seccomp.MASKED_EQ, user, user))
        flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        flt.load()
    except Exception as error:  # noqa: BLE001
        raise SyscallFilterError(f"the filter could not be loaded: {error}") from error
