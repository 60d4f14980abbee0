"""How a server session loads libraries with native code: the board's policy, in one place.

A session's modules live in one of two backends (``backend.py``): this process (:class:`LocalBackend`) or
the session's worker process (``proxy.Worker``).  :class:`NativeSession` decides which loads a library, and
a module or function belongs to the backend that handed it out (:meth:`NativeSession.backend_of`).

``mode`` (``rpcsrv serve --native``):

* ``isolated`` (default): the library's whole module tree lives in the session's worker process
  (``proxy.py``); a crash or hang ends that worker, the session gets an error and goes on.  The
  worker, and what it holds for the session, are charged to the session's memory account.
  (A library whose graphs call only ExampleJSON subgraphs stays in the server process, see
  :func:`graphs_call_host_code`, unless ``isolate="all"`` (``--isolate all``): then every library
  loads in the worker, and sessions compute in processes of their own, in parallel without sharing
  the server's interpreter lock; their runs still take the server's compute slots, ``proxy.py``.
  ``isolate="auto"`` (the server's default) does so only for a session that loads while another
  session holds modules in the server process: one session alone computes in the server, with no
  process and no per-call message; sessions that compute at the same time, in processes side by side.)
* ``inprocess``: native functions run in the server process (trusted boards; no IPC per call,
  but a crash takes the server down).
* ``off`` (``--no-native``): a plain host library is refused at ``load_module``; in a library with a
  blob, the host functions refuse to run (so does a graph that calls one, when it is created).

``call_timeout`` (``rpcsrv serve --call-timeout``, isolated mode on Linux): each request to the session's
worker is bounded (``proxy.Worker``: past it the worker is killed and the session ends), and every library
loads in the worker, as with ``isolate="all"``: a call running in a thread of the server cannot be stopped.

Before any worker starts, the library's machine and runtime symbols are checked here, so a
cross-built library fails at ``load_module`` naming its architecture and the functions it needed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any, Optional

from ..executor import RuntimeModule
from ..loader import load_library
from ..loader.graph_json import GraphJSONError, parse_graph_json
from ..loader.modules import GraphExecutorFactoryModule, HostLibraryModule
from .backend import Backend, LocalBackend
from .confine import ConfineOptions
from .library import NativeError, inspect_native
from .machine import board
from .runtime import has_native_code

MODES = ("isolated", "inprocess", "off")
ISOLATE = ("native", "all", "auto")

#: sessions holding modules loaded in this process (with ``isolate="auto"``, while one does, the others
#: load theirs in their workers: two models never share the interpreter lock)
_HERE: "weakref.WeakSet[NativeSession]" = weakref.WeakSet()
_HERE_LOCK = threading.Lock()


class NativeSession:
    """One session's native state: the mode, its backends (this process's; its worker, started lazily) and its
    shared arena.  ``confine``: how its workers are confined (the server's options)."""

    def __init__(self, mode: str = "isolated", max_memory: int = 4 << 30, timeout: float = float("inf"),
                 isolate: str = "native", confine: ConfineOptions = ConfineOptions(),
                 call_timeout: Optional[float] = None):
        if mode not in MODES:
            raise ValueError(f"native mode must be one of {', '.join(MODES)}, got {mode!r}")
        if isolate not in ISOLATE:
            raise ValueError(f"isolate must be one of {', '.join(ISOLATE)}, got {isolate!r}")
        self.mode = mode
        self.confine = confine
        self.local = LocalBackend(native=mode == "inprocess")
        # every library in the worker (always, or while another session computes here): only where
        # workers run (isolated mode, Linux)
        workers = mode == "isolated" and sys.platform.startswith("linux")
        #: seconds one request to the worker may take (``--call-timeout``): every library then loads in the
        #: worker, where a call past it can be stopped (a thread of this process cannot be)
        self.call_timeout = call_timeout if workers else None
        self.isolate_all = (isolate == "all" or self.call_timeout is not None) and workers
        self.isolate_auto = isolate == "auto" and workers
        self._claimed_before = False  # whether the session held modules here before its current load
        # time.monotonic() value of the session's end: native calls are stopped there
        self.deadline: Optional[float] = time.monotonic() + timeout if timeout != float("inf") else None
        self.max_memory = max_memory
        self.arena = None  # created with the first worker: buffers allocated after it are shared
        self.worker = None
        self.account = None  # the session's MemoryAccount (set by the session): its worker is charged to it
        self.workspace: Optional[str] = None  # the session's workspace (set by the session): the worker's files
        self._own_workspace: Optional[str] = None  # else one of its own (sessions made without a server)
        self.confined: Optional[dict] = None  # the layers in force in the current worker (confine.py)
        # workers this session took, and those that ended other than by closing (read by
        # rpcsrv.board.observe through worker_counts, at scrape time)
        self.workers_started = 0
        self.workers_crashed = 0

    def _open_arena(self) -> None:
        if self.arena is not None or not sys.platform.startswith("linux"):
            return
        from .shm import Arena

        capacity = self.max_memory if sys.maxsize > 2 ** 32 else min(self.max_memory, 512 << 20)
        try:
            self.arena = Arena(max(capacity, 1 << 20), name="rpcsrv-session")
        except OSError:
            self.arena = None  # arrays are copied to the worker instead

    def zeros(self, nbytes: int):
        """A zero-filled session buffer (in the shared arena when there is one)."""
        import numpy as np

        if self.arena is not None:
            try:
                return self.arena.zeros(nbytes)
            except MemoryError:
                pass
        return np.zeros(nbytes, dtype=np.uint8)

    def release(self, buf) -> None:
        if self.arena is not None and buf is not None:
            self.arena.release(buf)

    def _deadline(self) -> Optional[float]:
        return self.deadline

    def backend_of(self, obj: Any) -> Backend:
        """The backend a module or function belongs to (the one that handed it out)."""
        return getattr(obj, "worker", None) or self.local

    def load(self, path: str) -> RuntimeModule:
        """``tvm.rpc.server.load_module`` under this session's policy: the backend that loads it, and how."""
        loaded = load_library(path)
        libraries = [n for n in loaded.root.walk() if isinstance(n, HostLibraryModule) and has_native_code(n)]
        if (not libraries or not graphs_call_host_code(loaded.root, libraries)) and self._claim_here():
            try:
                return self.local.build(loaded.root, native=False)  # host symbols listed, not loaded
            except BaseException:
                self._unclaim()
                raise
        for node in libraries:
            check_loadable(node)
        if self.mode == "off" and isinstance(loaded.root, HostLibraryModule):  # nothing but native code
            names = sorted({f for n in libraries for f in inspect_native(n.path).public_functions()})
            raise NativeError(f"{os.path.basename(path)}: this server does not run native code "
                              f"(--no-native); the library has native functions: {', '.join(names)}")
        if self.mode != "isolated":  # in this process; with --no-native its host functions refuse to run
            return self._here(self.local.build(loaded.root))
        if self.worker is None or not self.worker.alive:
            from .proxy import take_worker

            if self.worker is not None:
                self._count_end(self.worker)
                self.worker.close()
                self.worker = None  # closed: not closed again if no new worker can be taken
            self._open_arena()
            self.worker = take_worker(self.arena, self._deadline, self.account, self.confine)
            self.worker.call_timeout = self.call_timeout
            self.confined = None
            self.workers_started += 1
        path = os.path.abspath(path)
        if self.worker.confining:
            path = self._confine_worker(path)
        return self.worker.load_module(path)

    def _confine_worker(self, path: str) -> str:
        """Confine the worker (once) to this session's workspace and budget (``confine.py``), before it
        loads anything; returns where the worker finds the library (a library from outside the workspace,
        as tests load them, is copied in first)."""
        import shutil
        import tempfile

        from . import confine

        options = self.confine
        root = self.workspace if self.workspace is not None and confine.reachable(self.workspace, options) else None
        if root is None:
            if self._own_workspace is None:
                self._own_workspace = tempfile.mkdtemp(prefix="rpcsrv-native-")
            root = self._own_workspace
            if not confine.reachable(root, options):
                raise NativeError(f"the native worker's user ({options.user}) cannot reach {root}: make "
                                  f"its parent folders searchable by others (chmod o+x) or start the server "
                                  f"with --workdir or TMPDIR under such a folder")
        if self.confined is None:
            self.confined, _ = self.worker.request(("confine", confine.policy(root, self.max_memory, options)),
                                                   "confining the native worker")
            absent = {k: v for k, v in self.confined.items() if not v.startswith("in force") and k != "loan"}
            import logging

            log = logging.getLogger("rpcsrv.native")
            if absent:
                log.warning("native worker %s confined without: %s", self.worker.pid,
                            "; ".join(f"{k} ({v})" for k, v in absent.items()))
            loan = self.confined.get("loan", "absent: the worker did not say")
            if not loan.startswith("in force"):
                log.warning("native worker %s cannot serve repeated native calls from the client's socket "
                            "(they cross the server each time): %s", self.worker.pid, loan[len("absent: "):])
        real = os.path.realpath(path)
        if os.path.commonpath([real, os.path.realpath(root)]) != os.path.realpath(root):
            fd, copy = tempfile.mkstemp(suffix=os.path.splitext(path)[1], dir=root)
            os.close(fd)
            shutil.copyfile(real, copy)
            real = copy
        confine.hand_over(real, options)
        return real

    def _claim_here(self) -> bool:
        """Whether a library without native code to run may load in the server process: not with
        ``isolate`` all, nor with auto while another session holds modules here.  Decided and recorded
        in one step, so sessions loading at the same moment do not all find the server free."""
        if self.isolate_all:
            return False
        with _HERE_LOCK:
            if self.isolate_auto and any(other is not self for other in _HERE):
                return False
            self._claimed_before = self in _HERE
            _HERE.add(self)
            return True

    def _unclaim(self) -> None:
        """Undo a claim whose load failed (a session with no module here does not count)."""
        with _HERE_LOCK:
            if not self._claimed_before:
                _HERE.discard(self)

    def _here(self, module: RuntimeModule) -> RuntimeModule:
        """``module``, loaded in the server process: this session now computes here."""
        with _HERE_LOCK:
            _HERE.add(self)
        return module

    def close(self) -> None:
        with _HERE_LOCK:
            _HERE.discard(self)
        if self.worker is not None:
            self._count_end(self.worker)
            self.worker.close()
            self.worker = None
        if self.arena is not None:
            self.arena.close()
        if self._own_workspace is not None:
            import shutil

            shutil.rmtree(self._own_workspace, ignore_errors=True)
            self._own_workspace = None

    # worker counts for the board's metrics ------------------------------------------------------------
    def _count_end(self, worker) -> None:
        if not worker.alive and worker.dead != "closed":
            self.workers_crashed += 1

    def worker_counts(self) -> tuple[int, int, int]:
        """(alive, started, crashed) of this session's workers, the current one included (a crash
        counts as soon as it happened, before the session notices)."""
        w = self.worker
        if w is None:
            return 0, self.workers_started, self.workers_crashed
        gone = 0 if w.alive or w.dead == "closed" else 1
        return (1 if w.alive else 0), self.workers_started, self.workers_crashed + gone


def graphs_call_host_code(root: Any, libraries: list[HostLibraryModule]) -> bool:
    """Whether native code is needed: the tree has no graph executor factory (a plain host library,
    a Relax VM library, ...) or one of its graphs calls a host function by ``func_name``.  A BYOC
    library whose graphs call only ExampleJSON subgraphs runs in the server process: its host
    symbols (TVM's helpers, our exporter's placeholder) are listed but not loaded."""
    factories = [n for n in root.walk() if isinstance(n, GraphExecutorFactoryModule)]
    if not factories:
        return True
    symbols = {s for lib in libraries for s in lib.symbols}
    for factory in factories:
        try:
            called = parse_graph_json(factory.graph_json).called()
        except GraphJSONError:
            return True  # the executor reports the bad graph, wherever it loads
        if any(name in symbols or f"__tvm_ffi_{name}" in symbols for name in called):
            return True
    return False


def check_loadable(node: HostLibraryModule) -> None:
    """NativeError when this board cannot run the library (machine, unresolvable symbols)."""
    from .shim import PROVIDED

    info = inspect_native(node.path)
    here = board()
    if not here.runs(info.machine):
        raise NativeError(f"{os.path.basename(node.path)}: the library is built for {info.machine}, this board "
                          f"is {here}; its functions cannot run here: "
                          f"{', '.join(info.public_functions()) or 'none'}")
    missing = [s for s in info.runtime_symbols if s not in PROVIDED]
    if missing:
        raise NativeError(f"{os.path.basename(node.path)}: needs TVM runtime symbols rpcsrv does not provide: "
                          f"{', '.join(missing)}")
