"""The worker's system-call filter: a small seccomp BPF program of our own, built per machine.

What it refuses (``EPERM``, so a refused call fails clearly and the worker goes on):

* network and local sockets: ``socket``, ``socketpair``, ``connect``, ``bind``, ``listen``,
  ``accept``/``accept4`` (the worker already holds the one socket it needs, its pair to the server);
* processes: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` or with a namespace flag,
  ``execve``/``execveat``; ``clone3`` answers ``ENOSYS`` (its flags sit in memory a filter cannot
  read; the C library then falls back to ``clone``, which is checked), so threads stay allowed;
* other processes: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``, the ``pidfd_*`` calls,
  ``kill``/``tgkill`` to any process but the worker itself, ``tkill`` and the ``sigqueueinfo`` calls,
  naming a descriptor's owner (``fcntl`` ``F_SETOWN``/``F_SETOWN_EX``/``F_SETSIG``, ``ioctl``
  ``FIOSETOWN``/``SIOCSPGRP``: the owner gets the descriptor's ``SIGIO``, a signal by other means; the
  client's socket a worker holds while it answers repeated calls is one such descriptor),
  ``prlimit64`` and the ``sched_set*`` calls on any process but the worker (0 or its pid);
* the rest of the machine: mounts and namespaces, keys, ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring`` (it would run socket and file calls behind the filter's back),
  modules, ``kexec``, ``reboot``, handles by name, the ``set*id`` calls, ``chmod``/``chown`` and
  ``mknod`` families, and the terminal-injection ``ioctl``\\ s ``TIOCSTI``/``TIOCLINUX``.

A call made with another architecture's numbers (i386 ``int 0x80`` on x86-64, x32) ends the
process: that is the only kill in the filter.  Why not libseccomp: its Python bindings are built
from the C library's source (no wheel on PyPI; Debian packages them for the system Python only),
and ~60 fixed numbers per machine plus four argument checks are a short, testable program.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

# the kernel's seccomp constants (linux/seccomp.h, linux/filter.h, linux/audit.h)
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
CLONE_THREAD = 0x00010000
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME (denied even for threads)
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
#: naming a descriptor's owner (who gets its SIGIO/SIGURG): by ioctl, and by fcntl (the same on every machine)
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
X32_BIT = 0x40000000

#: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;} (one BPF instruction; little- or big-endian native)
SOCK_FILTER = struct.Struct("=HBBI")

#: machine -> (AUDIT_ARCH_*, index into the number columns of SYSCALLS, seccomp's own number)
ARCHES = {"x86_64": (0xC000003E, 0, 317), "aarch64": (0xC00000B7, 1, 277), "armv7": (0x40000028, 2, 383)}

#: name: (x86_64, aarch64, arm EABI) numbers; None where the machine has no such call
#: (checked against the kernel headers by tests/native/hostile/test_confine_layers.py where they exist)
SYSCALLS = {
    "socket": (41, 198, 281), "socketpair": (53, 199, 288), "bind": (49, 200, 282), "listen": (50, 201, 284),
    "connect": (42, 203, 283), "accept": (43, 202, 285), "accept4": (288, 242, 366),
    "fork": (57, None, 2), "vfork": (58, None, 190), "execve": (59, 221, 11), "execveat": (322, 281, 387),
    "ptrace": (101, 117, 26), "process_vm_readv": (310, 270, 376), "process_vm_writev": (311, 271, 377),
    "kcmp": (312, 272, 378), "tkill": (200, 130, 238), "rt_sigqueueinfo": (129, 138, 178),
    "rt_tgsigqueueinfo": (297, 240, 363), "pidfd_send_signal": (424, 424, 424), "pidfd_open": (434, 434, 434),
    "pidfd_getfd": (438, 438, 438), "process_madvise": (440, 440, 440), "process_mrelease": (448, 448, 448),
    "mount": (165, 40, 21), "umount2": (166, 39, 52), "pivot_root": (155, 41, 218), "chroot": (161, 51, 61),
    "unshare": (272, 97, 337), "setns": (308, 268, 375), "open_tree": (428, 428, 428),
    "move_mount": (429, 429, 429), "fsopen": (430, 430, 430), "fsconfig": (431, 431, 431),
    "fsmount": (432, 432, 432), "fspick": (433, 433, 433), "mount_setattr": (442, 442, 442),
    "add_key": (248, 217, 309), "request_key": (249, 218, 310), "keyctl": (250, 219, 311),
    "bpf": (321, 280, 386), "perf_event_open": (298, 241, 364), "userfaultfd": (323, 282, 388),
    "io_uring_setup": (425, 425, 425), "io_uring_enter": (426, 426, 426), "io_uring_register": (427, 427, 427),
    "kexec_load": (246, 104, 347), "kexec_file_load": (320, 294, 401), "init_module": (175, 105, 128),
    "finit_module": (313, 273, 379), "delete_module": (176, 106, 129), "reboot": (169, 142, 88),
    "name_to_handle_at": (303, 264, 370), "open_by_handle_at": (304, 265, 371),
    "setuid": (105, 146, 23), "setgid": (106, 144, 46), "setreuid": (113, 145, 70), "setregid": (114, 143, 71),
    "setresuid": (117, 147, 164), "setresgid": (119, 149, 170), "setgroups": (116, 159, 81),
    "setfsuid": (122, 151, 138), "setfsgid": (123, 152, 139), "setuid32": (None, None, 213),
    "setgid32": (None, None, 214), "setreuid32": (None, None, 203), "setregid32": (None, None, 204),
    "setresuid32": (None, None, 208), "setresgid32": (None, None, 210), "setgroups32": (None, None, 206),
    "setfsuid32": (None, None, 215), "setfsgid32": (None, None, 216),
    "chmod": (90, None, 15), "fchmod": (91, 52, 94), "fchmodat": (268, 53, 333), "fchmodat2": (452, 452, 452),
    "chown": (92, None, 182), "fchown": (93, 55, 95), "lchown": (94, None, 16), "fchownat": (260, 54, 325),
    "chown32": (None, None, 212), "fchown32": (None, None, 207), "lchown32": (None, None, 198),
    "mknod": (133, None, 14), "mknodat": (259, 33, 324),
    # checked by argument, not denied outright
    "clone": (56, 220, 120), "clone3": (435, 435, 435), "kill": (62, 129, 37), "tgkill": (234, 131, 268),
    "ioctl": (16, 29, 54), "fcntl": (72, 25, 55), "fcntl64": (None, None, 221),
    "prlimit64": (302, 261, 369), "sched_setaffinity": (203, 122, 241), "sched_setscheduler": (144, 119, 156),
    "sched_setparam": (142, 118, 154), "sched_setattr": (314, 274, 380),
}
#: calls on a process named by their first argument: allowed on the worker itself only (0 or its pid)
SELF_ONLY = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
CHECKED = ("clone", "clone3", "kill", "tgkill", "ioctl", "fcntl", "fcntl64", *SELF_ONLY)
DENIED = tuple(name for name in SYSCALLS if name not in CHECKED)


def machine() -> str | None:
    """This process's machine as ``ARCHES`` names it, or None (no filter for it)."""
    m = platform.machine().lower()
    if m in ("x86_64", "amd64"):
        return "x86_64" if ctypes.sizeof(ctypes.c_void_p) == 8 else None
    if m in ("aarch64", "arm64"):
        return "aarch64" if ctypes.sizeof(ctypes.c_void_p) == 8 else "armv7"  # 32-bit userland on a 64-bit kernel
    if m.startswith("armv7") or m.startswith("armv8l") or m == "armv6l":
        return "armv7"
    return None


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k & 0xFFFFFFFF)


def _arg_low(i: int) -> int:
    """Offset of the low 32 bits of argument ``i`` in struct seccomp_data (little-endian machines)."""
    return 16 + 8 * i


def program(arch: str, own_pid: int) -> list[tuple[int, int, int, int]]:
    """The filter's instructions for ``arch`` (a key of ARCHES); ``own_pid`` may be signalled."""
    audit, col, _ = ARCHES[arch]
    eperm = RET_ERRNO | errno.EPERM
    nr = {name: nums[col] for name, nums in SYSCALLS.items() if nums[col] is not None}
    prog = [_ins(LD_W_ABS, 4), _ins(JEQ_K, audit, 1, 0), _ins(RET_K, RET_KILL_PROCESS), _ins(LD_W_ABS, 0)]
    if arch == "x86_64":  # x32 numbers reach the same entry: refuse them all
        prog += [_ins(JGE_K, X32_BIT, 0, 1), _ins(RET_K, RET_KILL_PROCESS)]
    for name in DENIED:
        if name in nr:
            prog += [_ins(JEQ_K, nr[name], 0, 1), _ins(RET_K, eperm)]
    prog += [_ins(JEQ_K, nr["clone3"], 0, 1), _ins(RET_K, RET_ERRNO | errno.ENOSYS)]
    # clone: a thread (CLONE_THREAD) without namespace flags; anything else is a new process
    prog += [_ins(JEQ_K, nr["clone"], 0, 5), _ins(LD_W_ABS, _arg_low(0)),
             _ins(JSET_K, CLONE_NAMESPACES, 2, 0), _ins(JSET_K, CLONE_THREAD, 0, 1),
             _ins(RET_K, RET_ALLOW), _ins(RET_K, eperm)]
    # kill / tgkill: only this process (its own threads; abort() and Python's signals use them)
    for name in ("kill", "tgkill"):
        prog += [_ins(JEQ_K, nr[name], 0, 4), _ins(LD_W_ABS, _arg_low(0)), _ins(JEQ_K, own_pid, 0, 1),
                 _ins(RET_K, RET_ALLOW), _ins(RET_K, eperm)]
    for name in SELF_ONLY:  # the server's limits, CPUs and scheduling are not the worker's to set
        prog += [_ins(JEQ_K, nr[name], 0, 5), _ins(LD_W_ABS, _arg_low(0)), _ins(JEQ_K, 0, 2, 0),
                 _ins(JEQ_K, own_pid, 1, 0), _ins(RET_K, eperm), _ins(RET_K, RET_ALLOW)]
    prog += [_ins(JEQ_K, nr["ioctl"], 0, 7), _ins(LD_W_ABS, _arg_low(1)), _ins(JEQ_K, TIOCSTI, 3, 0),
             _ins(JEQ_K, TIOCLINUX, 2, 0), _ins(JEQ_K, FIOSETOWN, 1, 0), _ins(JEQ_K, SIOCSPGRP, 0, 1),
             _ins(RET_K, eperm), _ins(RET_K, RET_ALLOW)]
    # a descriptor's owner receives its SIGIO/SIGURG: naming one is signalling another process
    for name in ("fcntl", "fcntl64"):
        if name in nr:
            prog += [_ins(JEQ_K, nr[name], 0, 6), _ins(LD_W_ABS, _arg_low(1)), _ins(JEQ_K, F_SETOWN, 2, 0),
                     _ins(JEQ_K, F_SETSIG, 1, 0), _ins(JEQ_K, F_SETOWN_EX, 0, 1), _ins(RET_K, eperm),
                     _ins(RET_K, RET_ALLOW)]
    prog.append(_ins(RET_K, RET_ALLOW))
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(own_pid: int | None = None) -> str:
    """Install the filter on every thread of this process (TSYNC); returns what is in force.
    Needs no_new_privs set first (or CAP_SYS_ADMIN).  Raises OSError when the kernel refuses."""
    arch = machine()
    if arch is None:
        raise OSError(errno.ENOSYS, f"no seccomp filter for machine {platform.machine()}")
    prog = program(arch, os.getpid() if own_pid is None else own_pid)
    raw = b"".join(SOCK_FILTER.pack(*ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(ARCHES[arch][2]), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if rc != 0:
        err = ctypes.get_errno() if rc < 0 else errno.ESRCH  # > 0: a thread that could not be synchronised
        raise OSError(err, f"seccomp filter refused: {os.strerror(err)}")
    return f"seccomp ({arch}, {len(prog)} instructions, all threads)"
