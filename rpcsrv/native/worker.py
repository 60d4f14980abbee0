"""The native worker: a child process that hosts a session's native module trees.

Started by ``proxy.Worker`` as ``python -m rpcsrv.native.worker FD SESSION_ARENA_FD SIZE``: ``FD``
is its end of a Unix socket pair, the arena is the session's shared memory (``shm.py``).  It loads
libraries with ``load_native_module`` (so graph executors, and anything else in the tree, call
native functions in this process), keeps the modules and functions it hands out in a table, and
answers one request at a time (``wire.py``).  Its own arena (executor storage) is created here and
its descriptor sent back in the first message.  What it allocates for the session is checked
against the budget each request carries, before it is allocated, and each answer says how much
it holds (``budget.py``).  If native code crashes, this process dies and the
session sees a closed socket; nothing else is affected.

Started with ``RPCSRV_CONFINE=1`` (``confine.worker_env``), it loads the runtime shim and the modules it
may need while it can, starts no thread, and refuses to load a library until the session has sent its
``("confine", policy)``: then it confines itself in its main thread (``confine.apply``) and answers what
is in force.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Optional

import numpy as np

from .budget import WorkerBudget, refusal_in
from .wire import Copied, Ref, Shared, decode_args, decode_call, decode_head, decode_result, encode_result

WORKER_ARENA = 4 << 30 if sys.maxsize > 2 ** 32 else 256 << 20
#: seconds between a worker's checks that the server that started it is still there (``watch_parent``)
PARENT_CHECK = 1.0


class WorkerState:
    def __init__(self, session_arena, own_arena):
        self.objects: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.arenas = {"session": session_arena, "worker": own_arena}
        self.budget = WorkerBudget()
        self.bound: dict[tuple, Any] = {}  # (function id, wire arguments) -> its bound native call
        self.confined: dict | None = None  # the layers in force, once confined (``_confine``)
        self.ctl: Optional[socket.socket] = None  # the socket to the server (``main``)
        self.lent: Optional[tuple] = None  # the client's socket and the shared page, once lent (``_hold``)
        #: a confined worker (``RPCSRV_CONFINE=1``) runs nothing before its session has confined it
        self.confining = os.environ.get("RPCSRV_CONFINE") == "1"

    # values ---------------------------------------------------------------
    def to_local(self, v: Any, copied: list) -> Any:
        if isinstance(v, Shared):
            arena = self.arenas.get(v.region)
            if arena is None:
                raise ValueError(f"unknown shared region {v.region!r}")
            return arena.view(v.offset, v.dtype, v.shape, v.strides)
        if isinstance(v, Copied):
            arr = np.array(v.array, copy=True)
            copied.append(arr)
            return arr
        if isinstance(v, Ref):
            obj = self.objects.get(v.id)
            if obj is None:
                raise ValueError(f"unknown worker object {v.id}")
            return obj
        if isinstance(v, list):
            return [self.to_local(x, copied) for x in v]
        return v

    def to_wire(self, v: Any) -> Any:
        from ..executor.module import RuntimeModule

        if v is None or isinstance(v, (bool, int, float, str, bytes)):
            return v
        if isinstance(v, np.ndarray):
            for region, arena in self.arenas.items():
                if arena is not None and v.dtype.kind != "O":
                    off = arena.offset_of(v)
                    if off is not None:
                        return Shared(region, off, v.dtype.str, v.shape, v.strides)
            self.budget.check(v.nbytes, "returned array")  # the session charges it when it arrives
            return Copied(np.ascontiguousarray(v))
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, RuntimeModule):
            return self.put("mod", v, v.type_key)
        if callable(v):
            return self.put("fn", v, getattr(v, "__name__", "function"))
        if isinstance(v, dict):
            return {k: self.to_wire(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(self.to_wire(x) for x in v)
        return v  # Device, DataType and other plain values

    def put(self, kind: str, obj: Any, name: str) -> Ref:
        i = next(self.ids)
        self.objects[i] = obj
        return Ref(kind, i, name)

    # requests -------------------------------------------------------------
    def request(self, data: bytearray, fds: list[int]) -> tuple[Any, list]:
        """The value and copied-back arguments of a pickled request (``fds``: what came with it)."""
        budget, req = _decode(data)
        self.budget.grant(budget)
        if req[0] == "attach":  # a spare worker joins a session: map its arena
            from .shm import Arena

            self.arenas["session"] = Arena(req[1], fd=fds[0]) if fds else None
            self.bound.clear()
            return None, []
        if req[0] == "confine":
            return _confine(self, req[1]), []
        if req[0] == "hold":  # the server lends this worker its client's connection (``replay.py``)
            from .replay import take

            self.refuse_unconfined("call")
            return take(self, req, fds), []
        self.refuse_unconfined(req[0])
        return self.handle(req)

    def refuse_unconfined(self, op: str) -> None:
        """Nothing of a session's runs in a confined worker before it is confined."""
        if self.confining and self.confined is None and op in ("load", "get", "call", "timer", "global"):
            raise RuntimeError("the native worker runs nothing before it is confined")

    def handle(self, req: tuple) -> tuple[Any, list]:
        """The value and copied-back arguments of one request (errors raise)."""
        op = req[0]
        copied: list = []
        if op == "load":
            from .runtime import load_native_module

            return self.to_wire(load_native_module(req[1])), []
        if op == "get":
            _, oid, name, query_imports = req
            mod = self.to_local(Ref("mod", oid, ""), copied)
            fn = mod.find_function(name, bool(query_imports))
            return (None if fn is None else self.put("fn", fn, name)), []
        if op == "call":
            _, oid, args = req
            fn = self.to_local(Ref("fn", oid, ""), copied)
            local = [self.to_local(a, copied) for a in args]
            return self.to_wire(fn(*local)), copied
        if op == "timer":
            from .measure import PREPROC, time_evaluator

            _, oid, params, preproc = req
            fn = self.to_local(Ref("fn", oid, ""), copied)
            f_pre = PREPROC.get(preproc) if preproc else None
            if preproc and f_pre is None:
                raise ValueError(f"Cannot find {preproc} in the global function")
            return self.put("fn", time_evaluator(fn, *params, f_preproc=f_pre), "time_evaluator"), []
        if op == "global":  # a global function whose module argument lives here (executor creation)
            _, name, args = req
            fn = _worker_globals().get(name)
            if fn is None:
                raise ValueError(f"{name} cannot run in the native worker")
            local = [self.to_local(a, copied) for a in args]
            return self.to_wire(fn(*local)), copied
        if op == "free":
            from ..executor.module import RuntimeModule

            freed = [self.objects.pop(i, None) for i in req[1]]
            self.bound.clear()  # (bound calls hold their functions)
            if self.budget.held and any(isinstance(obj, RuntimeModule) for obj in freed):
                del freed  # executors sit in reference cycles: what they hold goes back now, and the
                gc.collect()  # session's account with it, not at some later collection (~6 ms)
            return None, []
        if op == "stats":
            from .shim import load_shim

            own = self.arenas["worker"]
            return {"objects": len(self.objects), "held": self.budget.held, "arena_used": own.used if own else 0,
                    "workspace_outstanding": int(load_shim().rpcsrv_workspace_outstanding())}, []
        raise ValueError(f"unknown worker request {op!r}")


    def call_frame(self, frame: bytearray) -> tuple[Any, list]:
        """The value and copied-back arguments of a binary call frame (``wire.py``).  A native function
        called with the same argument bytes again (a kernel with the same buffers: a tuner's loop) runs
        its bound call, arguments converted once: ~1 us here instead of ~50 (views, DLTensors)."""
        budget, oid, nargs, at = decode_head(frame)
        self.budget.grant(budget)
        self.refuse_unconfined("call")
        key = (oid, bytes(frame[at:]))  # equal bytes, equal arguments (checked when first decoded)
        bound = self.bound.get(key)
        if bound is None:
            args = decode_args(frame, at, nargs)
            bound = self._bind(oid, args)
            if bound is None:
                return self.handle(("call", oid, args))
            if len(self.bound) >= BOUND_CALLS:
                self.bound.clear()
            self.bound[key] = bound
        return self.to_wire(bound()), []

    def _bind(self, oid: int, args: list) -> Any:
        """A bound call of native function ``oid`` with these arguments, or None when it is not one of
        native code with shared arrays and plain scalars (their arena views stay valid as long as the
        worker maps the arenas: the whole of its life)."""
        from .library import NativeFunction

        fn = self.objects.get(oid)
        if not isinstance(fn, NativeFunction) or not all(type(a) in _BINDABLE for a in args):
            return None
        return fn.bind(*[self.to_local(a, []) for a in args], hold=False, returns=True)


#: argument types a bound call may be cached for (``WorkerState._bound``), and how many are kept
_BINDABLE = (Shared, int, float, bool, type(None))
BOUND_CALLS = 256


def _confine(state: WorkerState, policy: dict) -> dict:
    """Confine this worker once (``confine.apply``), then start its parent watch."""
    if state.confined is None:
        from .confine import apply

        state.confined = {**apply(policy), "loan": _loan_readiness()}
        watch_parent()
    return state.confined


def _loan_readiness() -> str:
    """Whether this worker, confined, can serve its session's repeated native calls from the client's
    socket (``replay.py``): ``"in force: ..."`` or ``"absent: why"``."""
    try:
        from . import replay
    except ImportError as exc:
        return (f"absent: the confined worker cannot import its loan loop ({exc}); its user may not read "
                f"rpcsrv's folder {os.path.dirname(os.path.dirname(__file__))}")
    return replay.readiness()


def _worker_globals() -> dict:
    """Global functions that take a module of this worker and build on it here."""
    from ..executor.graph import debug, executor as graph

    return {"tvm.graph_executor.create": graph.create_graph_executor,
            "tvm.graph_runtime.create": graph.create_graph_executor,
            "tvm.graph_executor_debug.create": debug.create_graph_executor_debug,
            "tvm.graph_runtime_debug.create": debug.create_graph_executor_debug}


def _send(sock: socket.socket, obj: Any, fds: list[int] = (), data: Optional[bytes] = None) -> None:
    """Send ``obj`` pickled, or ``data`` (a binary frame, ``wire.py``) as it is."""
    if data is None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = len(data).to_bytes(8, "little")
    if fds:
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(header + data)  # one write: one wake-up of the other side


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes (returned as received: a copied array argument is not copied once more here)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError
        got += k
    return buf


def _recv(sock: socket.socket) -> Any:
    n = int.from_bytes(_recv_exact(sock, 8), "little")
    return _decode(_recv_exact(sock, n))


def _decode(data: bytearray) -> Any:
    """A message: a binary call or result frame (``wire.py``), else a pickle."""
    if data[:1] == b"C":
        return decode_call(data)
    if data[:1] == b"R":
        return decode_result(bytes(data))
    return pickle.loads(data)


def _recv_with_fds(sock: socket.socket) -> tuple[Any, list[int]]:
    """A message (its bytes: ``_decode``) and the descriptors sent with its header (``attach`` carries the
    session's arena)."""
    head, fds, _flags, _addr = socket.recv_fds(sock, 8, 4)
    if not head:
        raise EOFError
    head += _recv_exact(sock, 8 - len(head)) if len(head) < 8 else b""
    data = _recv_exact(sock, int.from_bytes(head, "little"))
    return data, list(fds)


def _error_answer(exc: Exception) -> tuple:
    """The answer to a request that raised ``exc`` (without ``held``, which the loop adds)."""
    refused = refusal_in(exc)
    if refused is not None:  # refused before allocating: the session words it as its account does
        return ("budget", refused.args, None)
    text = str(exc) or type(exc).__name__
    if type(exc).__name__ not in ("NativeError", "ExecutorError", "RuntimeError"):
        text = f"{type(exc).__name__}: {text}"
    if os.environ.get("RPCSRV_WORKER_TRACE"):
        traceback.print_exc()
    return ("err", text, None)


#: the nice increment this worker's computing thread still has to take at its first model run (``main``)
_NICE: list[int] = []


def _slot(sock: socket.socket) -> int:
    """Ask the server for a compute slot (while a request is being handled) and wait: its BLAS threads."""
    if _NICE:  # the first model run here: from now on this thread computes at the workers' priority
        compute_lower = _NICE.pop()
        from ..executor.compute import lower_priority

        lower_priority([threading.get_native_id()], compute_lower)
    _send(sock, ("slot",))
    answer = _recv(sock)
    if answer[0] != "slot":
        raise RuntimeError(f"the server answered {answer[0]!r} to a compute slot request")
    return int(answer[1])


#: how much lower a worker's scheduling priority is than the server's (a nice increment; the environment
#: variable RPCSRV_WORKER_NICE overrides it): while workers compute on every core, the server still
#: answers small calls and hands out compute slots promptly (``bench/concurrency_bench.py --isolate all``)
WORKER_NICE = 5


def watch_parent(interval: float = PARENT_CHECK) -> threading.Thread:
    """End this process once the process that started it is gone (this one reparented).

    An idle worker ends when the server's end of its socket closes; one inside a long or hung native
    call does not read the socket until the call returns, so a server that stopped (drain timeout) or
    died would leave it running.  A thread checks the parent every ``interval`` seconds: native calls
    release the interpreter lock, so it runs while they do.  (``PR_SET_PDEATHSIG`` would fire when the
    server *thread* that started the worker ends, and those come and go.)"""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(3)

    thread = threading.Thread(target=watch, name="rpcsrv-parent-watch", daemon=True)
    thread.start()
    return thread


def _preload() -> None:
    """Everything a confined worker may import or open later, now: the runtime shim and the compiled
    executor kernels (loaded with the server's rights), and every module of the executor, loader, native
    and protocol packages.  After the identity drop neither Python's own folders nor rpcsrv's may be
    readable (a Python or a checkout in root's home): a module first imported then fails."""
    import importlib
    import pkgutil

    from .shim import ShimUnavailable, load_shim

    try:
        load_shim()
    except (ShimUnavailable, OSError):
        pass  # load_module names what the library needed
    from .. import executor, loader, native, protocol

    for package in (executor, loader, native, protocol):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name != __spec__.name:  # (this module runs as __main__)
                importlib.import_module(info.name)
    from ..executor.kernels.clib import compiled
    from .machine import board

    board()  # read from the interpreter's file once (cached)
    compiled.library()  # the compiled executor kernels: a confined worker can neither run cc nor read the cache


def main(argv: list[str]) -> int:
    from .shm import Arena

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's to handle
    if os.environ.get("RPCSRV_CONFINE") == "1":
        _preload()
    else:  # a confined worker starts its threads after it has confined itself (Landlock binds those)
        watch_parent()
    sock = socket.socket(fileno=int(argv[0]))
    session_arena = Arena(int(argv[2]), fd=int(argv[1])) if int(argv[1]) >= 0 else None
    own = Arena(WORKER_ARENA, name="rpcsrv-worker")
    from ..executor.graph import executor as graph

    graph.STORAGE_ALLOCATOR = own.zeros  # executor storage lives where the session can map it
    from ..executor.memory import ALLOCATION_HOOK
    from . import runtime  # noqa: F401  (the executor and the native layer, imported before "ready")
    from ..loader.plugins import load_plugins_from_env

    load_plugins_from_env()  # the board plugins the server chose (issue 23)

    from ..executor import compute

    # a model run here takes its slot (and BLAS threads) from the server's compute policy
    compute.POLICY.configure(compute.ComputeSettings.from_environment(), slots=(lambda: _slot(sock), lambda: _send(sock, ("slot-done",))))
    # every thread of the worker but this one (BLAS's exist by now; later ones inherit it from their
    # creator); this one at its first model run (``_slot``): until then it answers requests and runs
    # kernels called one by one at the server's priority, as the server's threads do
    nice = compute.ComputeSettings.from_environment("RPCSRV_WORKER_NICE").nice
    compute.lower_priority([t for t in compute.thread_ids() if t != threading.get_native_id()], nice)
    _NICE.append(nice)
    state = WorkerState(session_arena, own)
    state.ctl = sock
    ALLOCATION_HOOK.set(state.budget.charge)  # executors check their storage against the session's budget
    _send(sock, ("ready", os.getpid(), WORKER_ARENA), [own.fd])
    while True:
        try:
            data, fds = _recv_with_fds(sock)
        except (EOFError, OSError):
            return 0
        binary = data[:1] == b"C"  # a binary call frame gets a binary answer when its value allows
        try:
            answer = ("ok", *(state.call_frame(data) if binary else state.request(data, fds)))
        except Exception as exc:
            answer = _error_answer(exc)
        try:
            answer += (state.budget.held,)
            _send(sock, answer, data=encode_result(answer) if binary else None)
        except Exception as exc:  # an answer pickle refuses (TypeError, ValueError too): an error, not an exit
            _send(sock, ("err", f"the worker could not send its answer: {type(exc).__name__}: {exc}", None,
                         state.budget.held))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
