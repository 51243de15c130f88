"""Landlock: the kernel's file and TCP rules for one process, without privileges.

Landlock (Linux 5.13 and later) lets any process give up access for itself and for every
process it starts: after :func:`restrict`, files can be opened only beneath the folders a
rule names, with the rights it names (read, or read and write), TCP sockets can bind and
connect only to the ports a rule names (ABI 4 and later), and, from ABI 6, signals and
abstract Unix sockets reach no process outside the restricted ones. Nothing undoes it,
not even for root, and it needs no user namespace, so it holds on the Docker and Kubernetes
hubs that refuse those.

The C library has no wrapper for Landlock's three system calls, and no binding of the
Landlock project's own exists for Python (it maintains Go and Rust ones; the Python
packages on PyPI are pre-releases of single authors), so this module calls them through
``ctypes``, with the structures of ``<linux/landlock.h>``.

Not taught in a chapter: the instructor guide (``instructor_guide.md``) explains grading.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

__all__ = ["LandlockError", "abi_version", "restrict"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = (1 << 8, 1 << 9, 1 << 10, 1 << 11,
                                                             1 << 12)
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
#: The rights a rule on a regular file (not a folder) may carry.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV
#: Reading: files, folder listings, and running programs (a chapter's worker processes).
READ = READ_FILE | READ_DIR | EXECUTE


class LandlockError(OSError):
    """The kernel refused a Landlock step."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none, or Landlock is not enabled).

    Returns:
        1 to 7 on current kernels (4 adds TCP rules, 6 scopes signals and abstract sockets).
    """
    try:
        version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0),
                                  ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return 0
    return max(int(version), 0)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    return rights


def restrict(readable: Iterable[str], writable: Iterable[str] = (), *,
             listable: Iterable[str] = (), listen_ports: Iterable[int] = (),
             tcp: bool = False) -> int:
    """Give up, for this process and its children, every file right and port not named here.

    Args:
        readable: files and folders that may be read (folders: everything beneath).
        listable: folders whose listing (names only, and of the folders beneath) may be
            read: the parents of readable entries whose siblings stay closed.
        writable: folders (or files) that may also be written, created in and removed from.
        listen_ports: TCP ports this process may bind (a kernel's own sockets).
        tcp: leave TCP alone (a chapter whose workers talk over loopback, in a network
            namespace of their own); otherwise no TCP bind or connect but ``listen_ports``.

    Returns:
        The ABI that was used.

    Raises:
        LandlockError: Landlock is not available, or a step failed.
    """
    abi = abi_version()
    if abi < 1:
        raise LandlockError("Landlock is not available on this kernel")
    libc = _libc()
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, 0, 0)
    if abi >= 4 and not tcp:
        attr.handled_access_net = _BIND_TCP | _CONNECT_TCP
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        number = ctypes.get_errno()
        raise LandlockError(number, f"landlock_create_ruleset: {os.strerror(number)}")
    try:
        for paths, rights in ((listable, READ_DIR), (readable, READ), (writable, handled)):
            for path in paths:
                _add_path(libc, ruleset, path, rights & handled)
        if attr.handled_access_net:
            for port in listen_ports:
                rule = _NetPortAttr(_BIND_TCP, int(port))
                if libc.syscall(_ADD_RULE, ruleset, _RULE_NET_PORT, ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    number = ctypes.get_errno()
                    raise LandlockError(number, f"landlock port {port}: {os.strerror(number)}")
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            number = ctypes.get_errno()
            raise LandlockError(number, f"no_new_privs: {os.strerror(number)}")
        if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            number = ctypes.get_errno()
            raise LandlockError(number, f"landlock_restrict_self: {os.strerror(number)}")
    finally:
        os.close(ruleset)
    return abi


def _add_path(libc, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine does not have
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(rights, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
            number = ctypes.get_errno()
            raise LandlockError(number, f"landlock rule for {path}: {os.strerror(number)}")
    finally:
        os.close(fd)
