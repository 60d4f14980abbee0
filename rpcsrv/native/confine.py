"""Confinement of the native worker: what uploaded native code may touch, layer by layer.

The worker (``worker.py``) confines itself when the session hands it its policy (``("confine",
policy)``, before the first ``load``), in its main thread, before it has started any thread of its
own; each layer is applied on its own and reported, so a kernel without one degrades clearly:

=========== ============================================================ ===========================
layer       what it does                                                 refused as
=========== ============================================================ ===========================
memory      ``RLIMIT_DATA`` = the worker's data at confinement + the      ``malloc`` returns NULL,
            session's memory budget + :data:`HEADROOM`; no core dumps     numpy ``MemoryError``
identity    a root server's worker becomes ``--native-user`` (default     ``EACCES`` on files of
            ``nobody``): no groups, no capabilities (bounding set too)    others
files       Landlock (``confine_landlock.py``): read-only beneath the     ``EACCES``
            system libraries and Python's files, read-write beneath the
            session's workspace only; TCP and signals too from ABI 4/6
syscalls    seccomp (``confine_seccomp.py``): no sockets, no connect, no  ``EPERM`` (``ENOSYS`` for
            fork/exec (threads allowed), no ptrace/process_vm_*, no       ``clone3``)
            signals, limits or scheduling of others, no mounts,
            namespaces, io_uring, bpf
environment the worker starts with a scrubbed environment (:func:`worker_env`): only :data:`PASS_ENV`
            and ``--native-env`` names pass (rpcsrv's own settings come in its start message)
=========== ===================================================================================

``no_new_privs`` is set with the first of Landlock/seccomp.  The server's choices (``--native-confine``,
``--native-user``, ``--native-env``) are a :class:`ConfineOptions`, part of its options and handed to what
needs them.  :func:`layers` says what this kernel and those options give (``rpcsrv check``, the server's
start-up log); :func:`apply` is the worker's half and returns what it put in force.  ``--native inprocess``
runs native code in the server: nothing here applies to it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
from dataclasses import dataclass
from typing import Any, Optional

from . import confine_landlock, confine_seccomp

#: bytes of data the worker may grow by beyond the session's budget: BLAS buffers and thread stacks, the
#: Relax VM's and the graph executor's own objects, pickled messages (docs/native.md: measured peak 91 MiB
#: over the native test flows on x86-64, 2 BLAS threads; 32-bit boards have smaller stacks and buffers)
HEADROOM = (256 << 20) if sys.maxsize > 2 ** 32 else (128 << 20)
#: environment variables that pass to the worker without being named: what must be set before Python starts
#: (the dynamic loader's path, Python's, the thread settings of BLAS and OpenMP, read when they load); anything
#: else of the server's stays behind.  rpcsrv's own settings, the server's plugin choice and the rest of the
#: worker's configuration come in its start message (``proxy.WorkerConfig``), never through the environment
PASS_ENV = ("LD_LIBRARY_PATH", "PYTHONPATH", "OPENBLAS_*", "OMP_*", "GOTO_NUM_THREADS", "MKL_NUM_THREADS")
#: read-only trees beyond Python's own (sys.prefix, sys.path): system libraries and what the C library,
#: OpenBLAS and Python read at run time
SYSTEM_READ = ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib", "/lib", "/lib32", "/lib64",
               "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
               "/sys/devices/system/cpu", "/proc/self", "/dev/urandom", "/dev/zero")
LAYERS = ("memory", "identity", "files", "syscalls", "environment")


@dataclass(frozen=True)
class ConfineOptions:
    """The server's confinement options (``rpcsrv serve --native-confine/--native-user/--native-env``)."""

    enabled: bool = True
    user: str = "nobody"
    env: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------- the server side

def _passes(name: str, names: list[str]) -> bool:
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in names)


def worker_env(environ: dict[str, str], options: ConfineOptions = ConfineOptions()) -> dict[str, str]:
    """The environment a confined worker starts with: the passing names of ``environ`` only.  BLAS
    starts single-threaded unless told otherwise, so no thread exists before the worker confines its main
    thread (Landlock binds the threads started after it); the server's slots raise it per run."""
    names = list(PASS_ENV) + list(options.env)
    env = {k: v for k, v in environ.items() if _passes(k, names)}
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _user_ids(options: ConfineOptions) -> Optional[tuple[int, int]]:
    """(uid, gid) the worker drops to: only when the server runs as root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pw = pwd.getpwnam(options.user)
    except KeyError:
        raise ValueError(f"--native-user {options.user!r}: no such user") from None
    return pw.pw_uid, pw.pw_gid


def policy(workspace: str, budget: int, options: ConfineOptions) -> dict[str, Any]:
    """What the session sends its worker (``("confine", policy)``); the workspace is made the
    worker user's (the server keeps its own rights over it)."""
    ids = _user_ids(options)
    if ids is not None and confine_landlock.abi_version() > 0:
        os.chown(workspace, *ids)  # Landlock keeps symlinks, FIFOs and sockets out of it (confine_landlock.py)
        os.chmod(workspace, 0o700)
    elif ids is not None:  # without Landlock the worker's user gets no folder the server works in: it
        os.chmod(workspace, 0o711)  # reads the libraries it loads (by name), and writes nothing
    roots = {os.path.realpath(p) for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path] if p}
    import rpcsrv

    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(rpcsrv.__file__))))
    return {"workspace": os.path.realpath(workspace), "read_only": sorted(roots) + list(SYSTEM_READ),
            "ids": ids, "budget": int(budget), "headroom": HEADROOM}


def layers(options: ConfineOptions = ConfineOptions()) -> dict[str, str]:
    """Each layer and what a worker started now gets: ``"in force: ..."``, or ``"absent: why"`` /
    ``"off: why"`` (``rpcsrv check``; the server logs it at start-up)."""
    if not options.enabled:
        return {name: "off: --native-confine off" for name in LAYERS}
    if not sys.platform.startswith("linux"):
        return {name: f"absent: no worker confinement on {sys.platform}" for name in LAYERS}
    abi = confine_landlock.abi_version()
    seccomp = _seccomp_available()
    try:
        ids = _user_ids(options)
        identity = (f"in force: the worker runs as {options.user} (uid {ids[0]}), no capabilities"
                    if ids else f"in force: the server is not root (uid {os.geteuid()}); no_new_privs")
    except ValueError as exc:
        identity = f"absent: {exc}"
    return {
        "memory": f"in force: RLIMIT_DATA = the session's budget + {HEADROOM >> 20} MiB",
        "identity": identity,
        "files": f"in force: Landlock ABI {abi}" if abi else "absent: this kernel has no Landlock",
        "syscalls": (f"in force: seccomp filter ({confine_seccomp.machine()})" if seccomp
                     else "absent: no seccomp filter for this kernel or machine"),
        "environment": f"in force: scrubbed; passing {', '.join(list(PASS_ENV) + list(options.env))}",
    }


def report(found: Optional[dict[str, str]] = None, options: ConfineOptions = ConfineOptions()) -> str:
    """One line per layer (``found`` as :func:`layers` or :func:`apply` returns it; else what ``options`` give)."""
    found = layers(options) if found is None else found
    return "\n".join(f"  {name:<12} {found.get(name, 'absent')}" for name in LAYERS)


def _seccomp_available() -> bool:
    if confine_seccomp.machine() is None:
        return False
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as f:
            return "errno" in f.read().split()
    except OSError:
        return False


# ----------------------------------------------------------------------------------- the worker side

PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4


def apply(pol: dict[str, Any]) -> dict[str, str]:
    """Confine this process (the worker's main thread, before it starts threads); returns each layer's
    state.  A layer the kernel refuses is reported absent and the others still apply."""
    done: dict[str, str] = {"environment": "in force: scrubbed at start"}
    os.environ["TMPDIR"] = os.environ["HOME"] = pol["workspace"]
    os.chdir(pol["workspace"])  # not the server's folder: relative paths name the workspace's files
    import tempfile

    tempfile.tempdir = pol["workspace"]
    try:  # counted before the identity drop: a process that left root may not list its own /proc (qemu)
        others = len(os.listdir("/proc/self/task")) - 1
    except OSError:
        others = 0
    done["memory"] = _layer(_memory, pol)
    done["identity"] = _layer(_identity, pol)
    done["files"] = _layer(lambda p: confine_landlock.restrict(p["read_only"], [p["workspace"], "/dev/null"]), pol)
    if others and done["files"].startswith("in force"):
        done["files"] += f" (not on the {others} thread(s) started before it)"
    done["syscalls"] = _layer(lambda p: confine_seccomp.install(), pol)
    return done


def _layer(step, pol: dict[str, Any]) -> str:
    try:
        return f"in force: {step(pol)}"
    except (OSError, ValueError) as exc:
        return f"absent: {exc}"


def _memory(pol: dict[str, Any]) -> str:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    limit = _vm_data() + pol["budget"] + pol["headroom"]
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return f"RLIMIT_DATA {limit >> 20} MiB (budget {pol['budget'] >> 20} + headroom {pol['headroom'] >> 20} MiB)"


def _vm_data() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) << 10
    return 0


def _identity(pol: dict[str, Any]) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    ids = pol["ids"]
    if ids is None:
        if libc.prctl(confine_landlock.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        return f"uid {os.getuid()} (the server's, not root), no_new_privs"
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = 40
    for cap in range(last + 1):  # while still root: nothing could give them back (exec is denied anyway)
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    uid, gid = ids
    os.setgroups([])
    os.setresgid(gid, gid, gid)  # the C library applies these to every thread
    os.setresuid(uid, uid, uid)
    if libc.prctl(confine_landlock.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    caps = _status("CapEff")
    if os.getuid() != uid or os.geteuid() != uid or caps != "0000000000000000":
        raise OSError(1, f"dropping to uid {uid} did not hold (uid {os.getuid()}, CapEff {caps})")
    return f"uid {uid} gid {gid}, no capabilities, no_new_privs"


def _status(key: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split()[1]
    return ""


def reachable(path: str, options: ConfineOptions) -> bool:
    """Whether the worker's user can reach ``path``: every folder above it searchable by that user (a
    session workspace under a private folder is not: the session's worker then works in a folder of its
    own, ``host.py``)."""
    ids = _user_ids(options) if options.enabled else None
    if ids is None:
        return True
    uid, gid = ids
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.stat(parent)
        bit = 0o100 if st.st_uid == uid else (0o010 if st.st_gid == gid else 0o001)
        if not st.st_mode & bit:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def hand_over(path: str, options: ConfineOptions) -> None:
    """Make a library the worker is about to load readable by the worker's user (a root server's
    uploads are root's, and may be private under its umask); it stays the server's."""
    if options.enabled and _user_ids(options) is not None:
        os.chmod(path, os.stat(path).st_mode | 0o044)
