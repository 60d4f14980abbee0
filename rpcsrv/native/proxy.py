"""The session's side of native isolation: a worker process and proxies for what it hosts.

:class:`Worker` starts ``python -m rpcsrv.native.worker`` with one end of a socket pair and the
session's arena (``shm.py``), and sends it one request at a time (``wire.py``).  Requests are
made from the session's worker threads (module functions are blocking calls), never on the trio
loop.  Each request waits at most until the session's deadline: a crash (closed socket) or a
missed deadline (the worker is killed) becomes a :class:`NativeError` naming what happened; the
worker is gone, later requests on its proxies fail clearly, and the next ``load_module`` starts a
fresh worker.  :func:`take_worker` hands out a warm spare (the server keeps one; an idle spare costs
one Python process) and starts the next in the background.

Memory: a worker taken for a session is charged to the session's account (:data:`WORKER_COST`, its
own footprint), and so is what it holds for the session: each request carries the account's room,
the worker refuses allocations beyond it before making them (``budget.py``), and each answer's
``held`` is charged (or released) here.  All of it goes back to the account when the worker ends.

:class:`WorkerModule` and :class:`WorkerFunction` are the session's handles on the worker's
objects; they are ``RuntimeModule``/callables like any other, so the server hands them out
unchanged.  Dropping a proxy frees the worker's object with the next request.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional

import numpy as np

from ..executor import compute
from ..executor.module import RuntimeModule
from .library import NativeError
from .shm import Arena
from .wire import Copied, FrameError, Ref, Shared, encode_call
from .confine_wire import ProtocolViolation, loads, message_limit, recv
from .worker import _send

START_TIMEOUT = 30.0
#: what a native worker itself costs its session: a started worker holds ~25 MiB of private memory
#: (Python, numpy, the executor; measured on x86-64 Linux), and the libraries and kernels it loads add more
WORKER_COST = 32 << 20
#: bytes held per byte of an array argument copied to the worker (one outside the shared arenas: a
#: session buffer allocated before its worker started), while the call runs: the pickled request, the
#: worker's received message and its unpickled array
COPY_COST = 3


class Worker:
    def __init__(self, arena: Optional[Arena], deadline: Callable[[], Optional[float]] = lambda: None):
        self.arena = arena
        self.deadline = deadline
        self.lock = threading.Lock()
        self.dead: Optional[str] = None
        self._garbage: list[int] = []
        self._garbage_lock = threading.RLock()  # reentrant: a finalizer may run inside the swap below
        self.account: Any = None  # the session's MemoryAccount (rpcsrv.board.accounts), once taken by a session
        self.charged = 0  # bytes the worker holds for the session, as last reported and charged
        self.last_frame: Optional[bytes] = None  # the last call frame that answered (``fastpath``)
        self.cost = 0  # WORKER_COST, while charged to ``account``
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [theirs.fileno()] + ([arena.fd] if arena else [])
        from . import confine

        self.confining = confine.SETTINGS.enabled  # a scrubbed environment; confined before its first load
        env = confine.worker_env(os.environ) if self.confining else dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rpcsrv.native.worker", str(theirs.fileno()),
                 str(arena.fd if arena else -1), str(arena.capacity if arena else 0)],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.worker_arena: Optional[Arena] = None
        self._start()

    def _start(self) -> None:
        """The worker's hello: its arena's descriptor and (ready, pid, arena size).  Whatever goes wrong
        on the way, the process is killed and reaped and every descriptor received or held is closed."""
        fds: list[int] = []
        why = "failed to start"
        try:
            if not self._wait(time.monotonic() + START_TIMEOUT):
                why = "did not start"
                raise NativeError(f"the native worker did not start within {START_TIMEOUT:.0f}s")
            msg, fds, _flags, _addr = socket.recv_fds(self.sock, 8, 1)
            if len(msg) < 8 or not fds:
                raise NativeError("the native worker failed to start")
            n = int.from_bytes(msg, "little")
            data = b""
            while len(data) < n:
                chunk = self.sock.recv(n - len(data))
                if not chunk:
                    raise NativeError("the native worker failed to start (it closed its socket)")
                data += chunk
            _ready, self.pid, size = loads(data)  # a worker's word is checked (confine_wire.py)
            self.worker_arena = Arena(size, fd=fds[0])
        except BaseException as exc:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.kill(why)
            if isinstance(exc, NativeError) and why == "failed to start":
                raise NativeError(f"{exc} ({self._exit_text()})") from None
            raise

    def _recv(self) -> Any:
        """The worker's next message, read as from an untrusted peer (``confine_wire.py``)."""
        return recv(self.sock, message_limit(self.account))

    def _wait(self, until: Optional[float]) -> bool:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        while True:
            timeout = None if until is None else max(0, int((until - time.monotonic()) * 1000) + 1)
            if poller.poll(timeout):
                return True
            if until is not None and time.monotonic() >= until:
                return False

    def _exit_text(self) -> str:
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self.sock.close()
        self._unbill()

    def _unbill(self) -> None:
        """The worker is gone: its memory goes back to the session's account."""
        amount, self.charged, self.cost = self.charged + self.cost, 0, 0
        if self.account is not None and amount:
            self.account.release(amount)

    def _budget(self) -> Any:
        """The budget sent with a request (``budget.Budget``)."""
        return None if self.account is None else (self.charged, self.account.room())

    def _settle(self, answer: tuple) -> tuple:
        """Charge (or release) what the worker reports holding after a request; returns ``answer``."""
        try:
            held = int(answer[-1])
        except (TypeError, ValueError):
            held = self.charged
        if held < 0:  # the worker's word only within sense: never a credit against the budgets
            held = self.charged
        if self.account is not None and held != self.charged:
            if held > self.charged:
                self.account.add_held(held - self.charged)
            else:
                self.account.release(self.charged - held)
        self.charged = held
        return answer

    @property
    def alive(self) -> bool:
        return self.dead is None

    def request(self, req: tuple, what: str) -> tuple[Any, list]:
        with self.lock:
            if self.dead is not None:
                raise NativeError(f"{what}: the native worker of this session is gone ({self.dead}); "
                                  f"load the module again")
            try:
                if self._garbage:
                    with self._garbage_lock:
                        garbage, self._garbage = self._garbage, []
                    _send(self.sock, (None, ("free", garbage)))
                    if self._settle(self._recv())[0] != "ok":
                        raise EOFError
                budget = self._budget()
                frame = encode_call(req[1], budget, req[2]) if req[0] == "call" else None
                _send(self.sock, (budget, req), data=frame)
                answer = self._settle(self._answer(what))
            except (ProtocolViolation, EOFError, OSError, ConnectionError, FrameError) as exc:
                raise self._failure(exc, what) from None
        return self._result(answer, what)

    def _failure(self, exc: BaseException, what: str) -> NativeError:
        """The worker is killed after a request failed with ``exc``: the error that says why."""
        if isinstance(exc, ProtocolViolation):  # forged by native code: the worker goes, as after a crash
            self.kill(f"broke the protocol: {exc}")
            return NativeError(f"{what}: {exc}; its worker was stopped, load the module again")
        text = self._exit_text()
        self.kill(f"crashed: {text}")
        return NativeError(f"{what}: native code crashed ({text}); this session's native modules are gone, "
                           f"load the module again")

    def _result(self, answer: tuple, what: str) -> tuple[Any, list]:
        """An answer's value and copied-back arguments, or its error raised."""
        if answer[0] == "err":
            raise NativeError(answer[1])
        if answer[0] == "budget":  # refused in the worker before allocating
            if self.account is None:  # (never: no account, no budget sent)
                raise NativeError(f"{what}: refused by the native worker's memory budget: {answer[1]}")
            raise self.account.refusal(*answer[1])
        return answer[1], answer[2]

    def _answer(self, what: str, first: Optional[tuple] = None) -> tuple:
        """The answer to the request just sent (``first``: its first message, already read).  Meanwhile
        the worker may ask for a compute slot (``("slot",)``, a model run starting there): it is held in
        the server's compute policy (``rpcsrv.executor.compute``) until ``("slot-done",)`` or the
        answer, so the worker's runs share the cores' slots with every other session's."""
        with contextlib.ExitStack() as held:
            while True:
                if first is not None:
                    answer, first = first, None
                elif not self._wait(self.deadline()):
                    self.kill("stopped at the session deadline")
                    raise NativeError(f"{what}: native code was still running at the session deadline; "
                                      f"its worker was stopped")
                else:
                    answer = self._recv()
                if answer[0] == "slot":
                    held.close()
                    try:
                        threads = held.enter_context(compute.job(local=False, deadline=self.deadline()))
                    except compute.SlotTimeout:  # the worker waits for the slot: it is stopped, as at a deadline
                        self.kill("stopped at the session deadline")
                        raise NativeError(f"{what}: no compute slot came free before the session deadline "
                                          f"(other sessions held them all); its worker was stopped") from None
                    _send(self.sock, ("slot", threads))
                elif answer[0] == "slot-done":
                    held.close()
                else:
                    return answer

    def forget(self, oid: int) -> None:
        with self._garbage_lock:  # finalizers run in any thread, also while a request takes the list
            self._garbage.append(oid)

    def close(self) -> None:
        if self.dead is None:
            self.kill("closed")
        if self.worker_arena is not None:
            self.worker_arena.close()

    # values ---------------------------------------------------------------
    def to_wire(self, v: Any, copied: list) -> Any:
        if isinstance(v, np.ndarray):
            for region, arena in (("session", self.arena), ("worker", self.worker_arena)):
                if arena is not None:
                    off = arena.offset_of(v)
                    if off is not None:
                        return Shared(region, off, v.dtype.str, v.shape, v.strides)
            copied.append(v)
            return Copied(v)
        if isinstance(v, (WorkerModule, WorkerFunction)):
            if v.worker is not self:
                raise NativeError("a module or function of another native worker cannot be passed here")
            return Ref(v.kind, v.oid, "")
        if isinstance(v, RuntimeModule) or callable(v):
            raise NativeError(f"{type(v).__name__} objects of the server cannot be passed to native modules")
        if isinstance(v, (list, tuple)):
            return [self.to_wire(x, copied) for x in v]
        if isinstance(v, (memoryview, bytearray)):  # bytes arguments (load_params) arrive as views
            return bytes(v)
        return v

    def from_wire(self, v: Any) -> Any:
        if isinstance(v, Shared):
            arena = self.arena if v.region == "session" else self.worker_arena
            return arena.view(v.offset, v.dtype, v.shape, v.strides)
        if isinstance(v, Copied):
            return v.array
        if isinstance(v, Ref):
            return WorkerModule(self, v.id, v.name) if v.kind == "mod" else WorkerFunction(self, v.id, v.name)
        if isinstance(v, dict):
            return {k: self.from_wire(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(self.from_wire(x) for x in v)
        return v

    def call(self, req_head: tuple, args: tuple, what: str) -> Any:
        copied: list = []
        wire_args = [self.to_wire(a, copied) for a in args]
        # arrays outside the shared arenas (and bytes, e.g. load_params) cross as copies: charged while
        # the request runs
        transient = 0 if self.account is None else COPY_COST * (
            sum(a.nbytes for a in copied) + sum(len(w) for w in wire_args if isinstance(w, bytes)))
        if transient:
            self.account.charge(transient, "arguments copied to the native worker")
        try:
            result, outs = self.request(req_head + (wire_args,), what)
        finally:
            if transient:
                self.account.release(transient)
        for mine, theirs in zip(copied, outs):
            if mine.flags.writeable:
                np.copyto(mine, theirs)
        return self.from_wire(result)

    def attach(self, arena: Optional[Arena], deadline: Callable[[], Optional[float]]) -> None:
        """Give a spare worker its session: the session's arena (mapped there) and deadline."""
        with self.lock:
            _send(self.sock, (None, ("attach", arena.capacity if arena else 0)), [arena.fd] if arena else [])
            if not self._wait(time.monotonic() + START_TIMEOUT) or self._recv()[0] != "ok":
                raise NativeError("the spare native worker did not take its session")
        self.arena, self.deadline = arena, deadline

    def call_global(self, name: str, args: tuple) -> Any:
        """Global function ``name`` run in the worker (its module arguments live there)."""
        return self.call(("global", name), args, name)

    def load(self, path: str) -> "WorkerModule":
        result, _ = self.request(("load", path), "load_module")
        return self.from_wire(result)


_pool_lock = threading.Lock()
_spare: Optional[Worker] = None


def take_worker(arena: Optional[Arena], deadline: Callable[[], Optional[float]], account: Any = None) -> Worker:
    """A worker for a session: the warm spare if there is one (Python and numpy already started,
    about a second saved on a small board), else a new one; a new spare starts in the background.
    With ``account`` (the session's), the worker is charged to it first (BudgetError when no room)."""
    global _spare
    if account is not None:
        account.charge(WORKER_COST, "native worker")
        try:
            worker = take_worker(arena, deadline)
        except BaseException:
            account.release(WORKER_COST)
            raise
        worker.account, worker.cost = account, WORKER_COST
        return worker
    with _pool_lock:
        worker, _spare = _spare, None
    try:
        from .confine import SETTINGS

        if worker is not None and worker.confining != SETTINGS.enabled:  # started under other settings
            worker.close()
            worker = None
        if worker is not None and worker.alive and worker.proc.poll() is None:
            worker.attach(arena, deadline)
        else:
            if worker is not None:
                worker.close()  # a dead spare: its process reaped, its arena descriptor closed
            worker = Worker(arena, deadline)
    except (NativeError, OSError, EOFError):  # the spare died or refused its session: a fresh worker
        if worker is not None:
            worker.close()
        worker = Worker(arena, deadline)
    threading.Thread(target=_refill, name="rpcsrv-spare-worker", daemon=True).start()
    return worker


def _refill() -> None:
    global _spare
    try:
        worker = Worker(None)
    except Exception:  # no spare this time; the next session starts its own
        return
    with _pool_lock:
        if _spare is None:
            _spare = worker
            return
    worker.close()


class _Proxy:
    kind = ""

    def __init__(self, worker: Worker, oid: int, name: str):
        self.worker, self.oid, self.name = worker, oid, name
        weakref.finalize(self, worker.forget, oid)


class WorkerFunction(_Proxy):
    """A function that lives in the worker; calling it is one request."""

    kind = "fn"

    @property
    def __name__(self) -> str:  # noqa: A003 - the server names handles after their function
        return self.name

    def __call__(self, *args: Any) -> Any:
        return self.worker.call(("call", self.oid), args, self.name)

    async def acall(self, *args: Any) -> tuple[bool, Any]:
        """The call from the event loop (``fastpath.worker_call``): ``(done, value)``."""
        from .fastpath import worker_call

        return await worker_call(self.worker, self.oid, args, self.name)

    def time_evaluator(self, params: tuple, f_preproc: str) -> "WorkerFunction":
        """TVM's time evaluator for this function, run inside the worker (no IPC in the timings)."""
        result, _ = self.worker.request(("timer", self.oid, params, f_preproc), "time_evaluator")
        return self.worker.from_wire(result)


class WorkerModule(_Proxy, RuntimeModule):
    """A module that lives in the worker (its imports stay there: lookups ask the worker)."""

    kind = "mod"

    def __init__(self, worker: Worker, oid: int, type_key: str):
        RuntimeModule.__init__(self)
        _Proxy.__init__(self, worker, oid, type_key)
        self.type_key = type_key
        #: functions found, by (name, query_imports): a client that looks a function up before every
        #: call (``lib["f"](...)``) asks the worker once
        self._found: dict[tuple[str, bool], WorkerFunction] = {}

    def get_function(self, name: str) -> Optional[WorkerFunction]:
        return self.find_function(name, False)

    def find_function(self, name: str, query_imports: bool = True) -> Optional[WorkerFunction]:
        key = (name, bool(query_imports))
        fn = self._found.get(key)
        if fn is None or not self.worker.alive:
            result, _ = self.worker.request(("get", self.oid, name, key[1]), f"get_function {name}")
            fn = self.worker.from_wire(result)
            if fn is not None:
                self._found[key] = fn
        return fn

    def __repr__(self) -> str:
        return f"<WorkerModule {self.type_key!r} #{self.oid} in worker {self.worker.pid}>"
