"""The native worker: a child process that serves its session the board's backend.

Started by ``process.WorkerProcess`` as ``python -m rpcsrv.native.worker FD SESSION_ARENA_FD SIZE``: ``FD`` is
its end of a Unix socket pair, the arena is the session's shared memory (``shm.py``).  Its first message is its
start message (``process.WorkerConfig``): it takes the server's settings (``rpcsrv.config.environment.adopt``),
loads the runtime shim and compiled kernels the server gave it (never compiling: ``toolchain.BuildPolicy``'s
``given``) and the server's choice of plugins, computes as told, and reads nothing of rpcsrv's from its
environment.
Then it serves a :class:`~rpcsrv.native.backend.LocalBackend` (native code on, executor storage in its own
arena, whose descriptor its hello sends back): each request names a method of the backend (``wire.py``), its
objects travel as references into this process's table, and the answer is the method's result
(:class:`WorkerState`).  What it allocates for the session is checked against the budget each request
carries, before it is allocated, and each answer says how much it holds (``budget.py``).  If native code
crashes, this process dies and the session sees a closed socket; nothing else is affected.

Confined (``WorkerConfig.confine``), it imports the runtime shim and every module it may need while it can,
starts no thread, and refuses to run anything of the session's until the session has sent its
``("confine", policy)``: then it confines itself in its main thread (``confine.apply``) and answers what is
in force.
"""

from __future__ import annotations

import gc
import itertools
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Optional

import numpy as np

from ..config import environment
from .budget import WorkerBudget, refusal_in
from .wire import (Ref, Shared, Values, decode_args, decode_head, decode_message, encode_result, recv, recv_with_fds,
                   send)

WORKER_ARENA = 4 << 30 if sys.maxsize > 2 ** 32 else 256 << 20
#: seconds between a worker's checks that the server that started it is still there (``watch_parent``)
PARENT_CHECK = 1.0
#: the backend's requests: request name -> the ``Backend`` method that serves it
METHODS = {"load": "load_module", "get": "get_function", "call": "call", "global": "call_global",
           "timer": "time_evaluator"}


class _WorkerValues(Values):
    """The worker's end of the link: its objects by reference into its table; copied arguments go back."""

    def __init__(self, state: "WorkerState", regions: dict):
        super().__init__(regions)
        self.state = state

    def reference(self, obj: Any) -> Optional[Ref]:
        from ..executor.module import RuntimeModule

        if isinstance(obj, RuntimeModule):
            return self.state.put("mod", obj, obj.type_key)
        if callable(obj):
            return self.state.put("fn", obj, getattr(obj, "__name__", "function"))
        return None

    def dereference(self, ref: Ref) -> Any:
        obj = self.state.objects.get(ref.id)
        if obj is None:
            raise ValueError(f"unknown worker object {ref.id}")
        return obj

    def copy(self, array: np.ndarray, copied: list) -> Any:
        self.state.budget.check(array.nbytes, "returned array")  # the session charges it when it arrives
        return super().copy(np.ascontiguousarray(array), [])

    def copied(self, array: np.ndarray, copied: list) -> np.ndarray:
        arr = np.array(array, copy=True)
        copied.append(arr)  # sent back after the call, so that writes reach the caller's memory
        return arr


class WorkerState:
    def __init__(self, session_arena, own_arena, backend: Any = None, confining: bool = False):
        self.objects: dict[int, Any] = {}
        self.ids = itertools.count(1)
        self.arenas = {"session": session_arena, "worker": own_arena}
        self.values = _WorkerValues(self, self.arenas)
        self.backend = backend  # the LocalBackend it serves (``main``)
        self.budget = WorkerBudget()
        self.bound: dict[tuple, Any] = {}  # (function id, wire arguments) -> its bound native call
        self.confined: dict | None = None  # the layers in force, once confined (``_confine``)
        self.ctl: Optional[socket.socket] = None  # the socket to the server (``main``)
        self.lent: Optional[tuple] = None  # the client's socket and the shared page, once lent (``replay.take``)
        #: a confined worker runs nothing before its session has confined it
        self.confining = confining

    def to_wire(self, v: Any) -> Any:
        """A value as it goes back to the session (what a loan's pending answer carries: ``replay.py``)."""
        return self.values.encode(v, [])

    def put(self, kind: str, obj: Any, name: str) -> Ref:
        i = next(self.ids)
        self.objects[i] = obj
        return Ref(kind, i, name)

    # requests -------------------------------------------------------------
    def request(self, data: bytearray, fds: list[int]) -> tuple[Any, list]:
        """The value and copied-back arguments of a pickled request (``fds``: what came with it)."""
        budget, req = decode_message(data)
        self.budget.grant(budget)
        op = req[0]
        if op == "attach":  # a spare worker joins a session: map its arena
            from .shm import Arena

            self.arenas["session"] = Arena(req[1], fd=fds[0]) if fds else None
            self.bound.clear()
            return None, []
        if op == "confine":
            return _confine(self, req[1]), []
        self.refuse_unconfined(op)
        if op == "hold":  # the server lends this worker its client's connection (``replay.py``)
            from .replay import take

            return take(self, req, fds), []
        return self.handle(req)

    def refuse_unconfined(self, op: str) -> None:
        """Nothing of a session's runs in a confined worker before it is confined."""
        if self.confining and self.confined is None and (op in METHODS or op == "hold"):
            raise RuntimeError("the native worker runs nothing before it is confined")

    def handle(self, req: tuple) -> tuple[Any, list]:
        """The value and copied-back arguments of one request (errors raise): a backend method, or ``free``
        and ``stats`` of this process."""
        op = req[0]
        method = METHODS.get(op)
        if method is not None:
            copied: list = []
            fields = [self.values.decode(f, copied) for f in req[1:]]
            return self.values.encode(getattr(self.backend, method)(*fields), []), copied
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
                return self.handle(("call", Ref("fn", oid, ""), args))
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
        return fn.bind(*[self.values.decode(a, []) for a in args], hold=False, returns=True)


#: argument types a bound call may be cached for (``WorkerState._bind``), and how many are kept
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


def _error_answer(exc: Exception) -> tuple:
    """The answer to a request that raised ``exc`` (without ``held``, which the loop adds)."""
    refused = refusal_in(exc)
    if refused is not None:  # refused before allocating: the session words it as its account does
        return ("budget", refused.args, None)
    text = str(exc) or type(exc).__name__
    if type(exc).__name__ not in ("NativeError", "ExecutorError", "RuntimeError"):
        text = f"{type(exc).__name__}: {text}"
    if environment.is_set("RPCSRV_WORKER_TRACE"):
        traceback.print_exc()
    return ("err", text, None)


class _Slots:
    """This worker's compute slots, granted by its server (``ComputePolicy.configure``'s ``slots``): a job asks
    over the socket and waits.  At its first model run the computing thread takes the workers' priority."""

    def __init__(self, sock: socket.socket, nice: int):
        self.sock, self.nice = sock, nice

    def acquire(self) -> int:
        """Ask the server for a compute slot (while a request is being handled) and wait: its BLAS threads."""
        if self.nice:  # the first model run here: from now on this thread computes at the workers' priority
            from ..executor.compute import lower_priority

            lower_priority([threading.get_native_id()], self.nice)
            self.nice = 0
        send(self.sock, ("slot",))
        answer = recv(self.sock)
        if answer[0] != "slot":
            raise RuntimeError(f"the server answered {answer[0]!r} to a compute slot request")
        return int(answer[1])

    def release(self) -> None:
        send(self.sock, ("slot-done",))


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
    from .. import config, executor, loader, native, protocol

    for package in (config, executor, loader, native, protocol):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name != __spec__.name:  # (this module runs as __main__)
                importlib.import_module(info.name)
    from ..executor.kernels.clib import compiled
    from .machine import board

    board()  # read from the interpreter's file once (cached)
    compiled.library()  # the compiled executor kernels the server gave: a confined worker may not read them later


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's to handle
    sock = socket.socket(fileno=int(argv[0]))
    config = recv(sock)  # the start message (the server's, trusted: a pickle)
    environment.adopt(config.settings)
    from ..executor.kernels.clib import compiled
    from . import shim

    shim.POLICY.configure("given", given=config.shim)  # the server's files: a worker never compiles
    compiled.POLICY.configure("given", given=config.kernels)
    if config.confine:
        _preload()
    else:  # a confined worker starts its threads after it has confined itself (Landlock binds those)
        watch_parent()
    from .shm import Arena

    session_arena = Arena(int(argv[2]), fd=int(argv[1])) if int(argv[1]) >= 0 else None
    own = Arena(WORKER_ARENA, name="rpcsrv-worker")
    from ..executor import compute
    from ..executor.memory import ALLOCATION_HOOK
    from ..loader.plugins import adopt
    from .backend import LocalBackend

    if config.plugins is not None:
        adopt(config.plugins)  # the plugins the server loaded, under its choice
    # a model run here takes its slot (and BLAS threads) from the server's compute policy; every thread of the
    # worker but this one at the workers' priority (BLAS's exist by now; later ones inherit it from their
    # creator); this one at its first model run (``_Slots``): until then it answers requests and runs kernels
    # called one by one at the server's priority, as the server's threads do
    slots = _Slots(sock, config.compute.nice)
    compute.POLICY.configure(config.compute, slots=(slots.acquire, slots.release))
    compute.lower_priority([t for t in compute.thread_ids() if t != threading.get_native_id()], config.compute.nice)
    state = WorkerState(session_arena, own, LocalBackend(native=True, allocate=own.zeros), config.confine)
    state.ctl = sock
    ALLOCATION_HOOK.set(state.budget.charge)  # executors check their storage against the session's budget
    send(sock, ("ready", os.getpid(), WORKER_ARENA), [own.fd])
    while True:
        try:
            data, fds = recv_with_fds(sock)
        except (EOFError, OSError):
            return 0
        binary = data[:1] == b"C"  # a binary call frame gets a binary answer when its value allows
        try:
            answer = ("ok", *(state.call_frame(data) if binary else state.request(data, fds)))
        except Exception as exc:
            answer = _error_answer(exc)
        try:
            answer += (state.budget.held,)
            send(sock, answer, data=encode_result(answer) if binary else None)
        except Exception as exc:  # an answer pickle refuses (TypeError, ValueError too): an error, not an exit
            send(sock, ("err", f"the worker could not send its answer: {type(exc).__name__}: {exc}", None,
                        state.budget.held))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
