"""What a session does with its board: one interface, in this process or in the session's worker process.

Modelled on TVM's ``RPCSession`` (``src/runtime/rpc/rpc_session.h``) and its ``LocalSession``
(``rpc_local_session.h``): a session's requests become calls of a :class:`Backend` (load a module, get a
function, call it, call a global function over the backend's modules, time a function, lend the client's
connection for repeated native calls), and the session never asks which backend it has.  Two implement it:

* :class:`LocalBackend`: in this process (the server's, for libraries that run here: ``--native
  inprocess``, or no native code to run; and the worker's own, serving the session below);
* ``proxy.WorkerBackend``: in the session's worker process, one request per call over a socket pair
  (``wire.py``).  The worker serves it with a ``LocalBackend`` (``worker.py``): the same methods, so each
  global function is registered once (:data:`GLOBALS`) and each value converted one way (``wire.Values``).

Which backend loads a library is the board's policy (``host.py``); a module or function a backend hands
out belongs to it (``NativeSession.backend_of``).  The session's buffers (``DevAllocData``, copies to and
from the client) are memory both backends share (``shm.py``); what a backend does with arrays is read and
write them in place.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

from ..executor import BuildOptions, RuntimeModule, build_runtime
from ..executor.graph import debug, executor as graph
from ..loader import load_library
from .library import NativeError, NativeFunction
from .measure import PREPROC, time_evaluator
from .runtime import link_roots, native_options

Runner = Callable[..., Awaitable[tuple[bool, Any]]]


def _create(debugging: bool) -> Callable[..., RuntimeModule]:
    def create(backend: "LocalBackend", *args: Any) -> RuntimeModule:
        make = debug.create_graph_executor_debug if debugging else graph.create_graph_executor
        return make(*args, allocate=backend.options.allocate)
    return create


#: the global functions that work on a backend's modules, by name: ``fn(backend, *args)``.  Registered here
#: once; the board's registry hands them out (``rpcsrv.board.globals``), and they run where their module
#: lives (:meth:`Backend.call_global`)
GLOBALS: dict[str, Callable[..., Any]] = {
    "tvm.graph_executor.create": _create(False), "tvm.graph_runtime.create": _create(False),
    "tvm.graph_executor_debug.create": _create(True), "tvm.graph_runtime_debug.create": _create(True),
}


class Backend:
    """What a session does with its board (TVM's ``RPCSession``).  Modules and functions a backend hands out
    are its own; the session passes them back to the backend they came from."""

    def load_module(self, path: str) -> RuntimeModule:
        """``tvm.rpc.server.load_module``: the library at ``path``, its module tree built here."""
        raise NotImplementedError

    def get_function(self, module: Any, name: str, query_imports: bool = False) -> Optional[Callable[..., Any]]:
        """The function ``name`` of ``module`` (and of its imports with ``query_imports``), or None."""
        return module.find_function(name, bool(query_imports))

    def call(self, fn: Callable[..., Any], args: list) -> Any:
        """Call ``fn`` (blocking: the session runs this in a thread)."""
        return fn(*args)

    def runner(self, fn: Any, limiter: Any = None) -> Optional[Runner]:
        """How the event loop calls ``fn`` without a thread hop (``fastpath.py``): an awaitable runner
        answering ``(done, value)``, or None for the thread."""
        return None

    def call_global(self, name: str, args: list) -> Any:
        """The global function ``name`` of :data:`GLOBALS`, over this backend's modules in ``args``."""
        raise NotImplementedError

    def time_evaluator(self, fn: Any, params: tuple, f_preproc: str = "") -> Callable[..., bytes]:
        """TVM's time evaluator of ``fn`` (``measure.py``), run where ``fn`` runs (no IPC in the timings)."""
        raise NotImplementedError

    # the loan of the client's connection (``rpcsrv.board.baton``, ``replay.py``) --------------------------
    def owns(self, fn: Any) -> bool:
        """Whether ``fn`` is one of this backend's native functions, whose repeated calls a loan may answer."""
        return False

    def last_call(self, fn: Any) -> Any:
        """What a loan needs to repeat the call of ``fn`` its runner just made (taken once), or None."""
        return None

    async def lend(self, io: Any, entries: list, counts: dict, calls: dict) -> Optional[dict]:
        """Serve the client's connection (``io``, a ``Transport``) with the recorded requests ``entries``
        (``replay.Entry``; ``calls``: entry index -> what :meth:`last_call` gave for it) until the client asks
        for something else; returns what was served (``replay.hold``'s result), or None when the loan could
        not start (busy).  :class:`LoanDied` when the serving process died, with the state its shared page
        was left in; cancelled, it stops the loan."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds."""


class LoanDied(Exception):
    """The process serving a loan died: ``error`` says why, ``state`` and ``index`` are the shared page's
    (``replay.IDLE``/``CALLING``/..., the entry it was calling)."""

    def __init__(self, error: Exception, state: int, index: int):
        super().__init__(str(error))
        self.error, self.state, self.index = error, state, index


class LocalBackend(Backend):
    """The board in this process.  ``native``: host libraries run their native functions here
    (``runtime.native_options``); else they are listed and refuse to run.  ``allocate``: the storage of the
    graph executors it builds (a worker's: its shared arena)."""

    def __init__(self, native: bool = False, allocate: Optional[Callable[[int], Any]] = None):
        options = native_options() if native else BuildOptions()
        self.native = native
        self.options = options if allocate is None else BuildOptions(options.host_library, allocate)
        self._last: Optional[tuple[Any, tuple]] = None  # (native function, its arguments): its runner's last call
        self.page: Any = None  # the shared page of this backend's loans (``replay.PAGE_SIZE`` bytes)
        self._bound: dict[int, tuple] = {}  # id(call record) -> (the record, its bound call): kept across loans

    def load_module(self, path: str) -> RuntimeModule:
        return self.build(load_library(path).root)

    def build(self, root: Any, native: Optional[bool] = None) -> RuntimeModule:
        """The runtime modules of a loaded tree (a library the policy has already read, ``host.py``);
        ``native=False``: its host libraries listed, not loaded (no native code of it runs)."""
        if native is False and self.native:
            return build_runtime(root, BuildOptions(allocate=self.options.allocate))
        top = build_runtime(root, self.options)
        return link_roots(top) if self.native else top

    def runner(self, fn: Any, limiter: Any = None) -> Optional[Runner]:
        from .fastpath import Inline

        return Inline(fn, limiter, self._called) if type(fn) is NativeFunction else None

    def _called(self, fn: Any, args: tuple) -> None:
        self._last = (fn, args)

    def call_global(self, name: str, args: list) -> Any:
        fn = GLOBALS.get(name)
        if fn is None:
            raise NativeError(f"{name} is not a global function of rpcsrv's backends")
        return fn(self, *args)

    def time_evaluator(self, fn: Any, params: tuple, f_preproc: str = "") -> Callable[..., bytes]:
        preproc = PREPROC.get(f_preproc) if f_preproc else None
        if f_preproc and preproc is None:
            raise ValueError(f"Cannot find {f_preproc} in the global function")
        return time_evaluator(fn, *params, f_preproc=preproc)

    def owns(self, fn: Any) -> bool:
        return type(fn) is NativeFunction

    def last_call(self, fn: Any) -> Any:
        last, self._last = self._last, None
        return last if last is not None and last[0] is fn else None

    async def lend(self, io: Any, entries: list, counts: dict, calls: dict) -> Optional[dict]:
        """The loan's loop in a thread of this process (the same loop as a worker's, in C: it holds no
        interpreter lock while it waits or calls), with the native calls bound here."""
        import mmap
        import socket

        import trio

        from .replay import PAGE_SIZE, hold

        bound = {i: self._bind(record) for i, record in calls.items()}
        if self.page is None:
            self.page = mmap.mmap(-1, PAGE_SIZE)
        done: list = []

        async def serve() -> None:
            done.append(await trio.to_thread.run_sync(hold, _Here, io.sock, self.page, [tuple(e) for e in entries],
                                                      counts, bound, io.spin))
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                if not done:  # the session ends (deadline, shutdown) while the thread holds the
                    io.sock.shutdown(socket.SHUT_RDWR)  # connection: its loop sees the close
                raise
        return done[0]

    def _bind(self, record: tuple) -> Any:
        """The bound call of a call record (``(function, arguments)``), made once per record."""
        kept = self._bound.get(id(record))
        if kept is None or kept[0] is not record:
            if len(self._bound) >= 64:
                self._bound.clear()
            fn, args = record
            kept = self._bound[id(record)] = (record, fn.bind(*args, hold=True, returns=True))
        return kept[1]


class _Here:
    """The state ``replay.hold`` reads, for a loan served in this process (its calls are given to it bound:
    only results are converted, and here they stay as they are)."""

    @staticmethod
    def to_wire(value: Any) -> Any:
        return value
