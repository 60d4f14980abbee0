"""The worker's file (and TCP) rules: Landlock through ctypes, at the ABI version the kernel has.

Landlock is unprivileged: a process restricts itself, and what it (and every thread or process it
starts later) may open is then the union of the rules it added, per access right the ruleset
handles.  Here: read-only beneath the system's shared libraries and Python's own files, read-write
beneath the session's workspace, nothing anywhere else (no ``/tmp``, no ``/etc/passwd``, no listing
of ``/``).  From ABI 4 the ruleset also handles TCP bind/connect (none allowed), from ABI 6 it is
*scoped*: no signals to, and no abstract Unix sockets of, processes outside the sandbox.  Landlock
also refuses ``ptrace``-class access (``/proc/<pid>/mem``, ``environ``, ``process_vm_readv``) to
processes outside the domain.

``landlock_restrict_self`` applies to the calling thread and what it starts; threads that already
exist stay as they were (``restrict`` reports how many there are: the worker confines itself
before it starts any).  The three calls have the same numbers on every machine (444-446).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* bits and the ABI version that introduced each
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2  # ABI 6

READ_ONLY = READ_FILE | READ_DIR
#: in the workspace: files and folders, but no executing, no device nodes, and no symlinks, FIFOs or
#: sockets: the server works in the same folder with its own rights, and a symlink there could send one of
#: its writes (an upload) or reads outside, a FIFO could block it
READ_WRITE = ((1 << 16) - 1) & ~(EXECUTE | MAKE_CHAR | MAKE_BLOCK | MAKE_SYM | MAKE_FIFO | MAKE_SOCK)

#: struct landlock_ruleset_attr {u64 handled_access_fs; u64 handled_access_net; u64 scoped;}
RULESET_ATTR = struct.Struct("=QQQ")
#: struct landlock_path_beneath_attr {u64 allowed_access; s32 parent_fd;} __attribute__((packed))
PATH_BENEATH = struct.Struct("=Qi")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(*args: int | bytes | None) -> int:
    conv = [a if isinstance(a, (bytes, type(None))) else ctypes.c_long(a) for a in args]
    return _libc.syscall(*conv)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (not built in, or disabled at boot)."""
    v = _syscall(SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    return int(v) if v > 0 else 0


def handled_fs(abi: int) -> int:
    return FS_BY_ABI[max(k for k in FS_BY_ABI if k <= abi)]


def restrict(read_only: list[str], read_write: list[str]) -> str:
    """Restrict this thread (and all it starts) to the given trees; returns what is in force.
    Paths that do not exist are skipped.  Raises OSError when the kernel has no Landlock."""
    abi = abi_version()
    if abi < 1:
        raise OSError(errno.ENOSYS, "this kernel has no Landlock")
    fs = handled_fs(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = RULESET_ATTR.pack(fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = _syscall(SYS_CREATE_RULESET, attr[:size], size, 0)
    if ruleset < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for paths, access in ((read_only, READ_ONLY), (read_write, READ_WRITE)):
            for path in paths:
                _add(ruleset, path, access & fs)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"PR_SET_NO_NEW_PRIVS: {os.strerror(err)}")
        if _syscall(SYS_RESTRICT_SELF, ruleset, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    extra = (", TCP" if net else "") + (", signals and abstract sockets scoped" if scoped else "")
    return f"Landlock ABI {abi} (files{extra})"


def _add(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a tree this machine does not have
    try:
        if not os.path.isdir(path):  # a file: only file rights apply to it
            access &= WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV | EXECUTE
        rule = PATH_BENEATH.pack(access, fd)
        if _syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
