"""The session's worker process as a backend: :class:`Worker`.

:class:`Worker` is the :class:`~rpcsrv.native.backend.Backend` whose modules live in the session's worker
process (``process.py`` starts it; ``worker.py`` serves it with a ``LocalBackend``): each of its methods is one
request over the socket pair (``wire.py``).  Requests are made from the session's threads (module functions
are blocking calls) or, for a native call, from the event loop (:meth:`Worker.call_async`, no thread hop: the
request is one binary frame and the loop waits on the worker's socket), one at a time.
Each waits at most until the session's deadline: a crash (closed socket) or a missed deadline (the worker is
killed) becomes a :class:`NativeError` naming what happened; the worker is gone, later requests on its
proxies fail clearly, and the next ``load_module`` starts a fresh worker.  :func:`take_worker` hands out the
warm spare (``process.SPARES``) when it has the session's configuration.

Memory: a worker taken for a session is charged to the session's account (:data:`WORKER_COST`, its
own footprint), and so is what it holds for the session: each request carries the account's room,
the worker refuses allocations beyond it before making them (``budget.py``), and each answer's
``held`` is charged (or released) here.  All of it goes back to the account when the worker ends.

What the worker hosts, the session holds as proxies (``remote.py``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import os
import select
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from ..config import environment
from ..executor import compute
from .backend import Backend, LoanDied
from .confine import ConfineOptions
from .confine_wire import ProtocolViolation
from .library import NativeError
from .process import SPARES, START_TIMEOUT, WorkerConfig, WorkerProcess, worker_config
from .remote import SessionValues, WorkerFunction, WorkerModule
from .shm import Arena, seal
from .wire import FrameError, Ref, encode_call, message_limit, recv_checked, send

#: what a native worker itself costs its session: a started worker holds ~25 MiB of private memory
#: (Python, numpy, the executor; measured on x86-64 Linux), and the libraries and kernels it loads add more
WORKER_COST = 32 << 20
#: bytes held per byte of an array argument copied to the worker (one outside the shared arenas: a
#: session buffer allocated before its worker started), while the call runs: the pickled request, the
#: worker's received message and its unpickled array
COPY_COST = 3
#: why a call in a worker ended at the session deadline
DEADLINE = "native code was still running at the session deadline; its worker was stopped"


class CallTimeout(NativeError):
    """A request to the worker ran past the board's call timeout (``rpcsrv serve --call-timeout``): the worker
    was killed, and the session that made the request ends after this error is answered."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"RPCCallTimeout: {what} ran longer than this board's call timeout ({seconds:g} s, "
                         f"--call-timeout); its native worker was killed and the session ends")
#: the errors that mean the worker is broken (crashed, forged a message): it is stopped
BROKEN = (ProtocolViolation, EOFError, OSError, ConnectionError, FrameError)


class Worker(Backend):
    """The session's worker process, as a backend.  ``process``: a started one (the spare), else one is started
    with ``config`` (default: the server's confinement on)."""

    def __init__(self, arena: Optional[Arena], deadline: Callable[[], Optional[float]] = lambda: None,
                 config: Optional[WorkerConfig] = None, process: Optional[WorkerProcess] = None):
        self.process = process or WorkerProcess(config or worker_config(ConfineOptions()), arena)
        self.sock, self.pid, self.proc = self.process.sock, self.process.pid, self.process.proc
        self.confining = self.process.config.confine  # confined before its first load (``host.py``)
        self.arena = arena if process is None else None  # (a spare is given its session's arena: ``attach``)
        self.deadline = deadline
        #: seconds any one request may take (``--call-timeout``; None: only the session's deadline bounds it)
        self.call_timeout: Optional[float] = None
        self.lock = threading.Lock()
        self.dead: Optional[str] = None
        self._garbage: list[int] = []
        self._garbage_lock = threading.RLock()  # reentrant: a finalizer may run inside the swap below
        self.account: Any = None  # the session's MemoryAccount (rpcsrv.board.accounts), once taken by a session
        self.limit = message_limit(None)  # the longest message it may send (``wire.message_limit``: its account's)
        self.charged = 0  # bytes the worker holds for the session, as last reported and charged
        self.cost = 0  # WORKER_COST, while charged to ``account``
        self.last_frame: Optional[bytes] = None  # the last call frame that answered (``call_async``)
        self.page: Optional[mmap.mmap] = None  # the loans' shared page, once the connection was lent
        try:
            self.worker_arena = Arena(self.process.arena_size, fd=self.process.arena_fd)
        except BaseException:
            self.kill("failed to start")
            raise
        self.values = SessionValues(self)
        #: seconds the event loop waits for an answer in a plain ``select`` before waiting through trio
        self.quick_wait = environment.seconds("RPCSRV_NATIVE_QUICK_WAIT")

    # ---------------------------------------------------------------------------- requests
    def _recv(self) -> Any:
        """The worker's next message, read as from an untrusted peer (``wire.recv_checked``)."""
        return recv_checked(self.sock, self.limit)

    def _wait(self, until: Optional[float]) -> bool:
        return self.process.wait(until)

    def _until(self) -> tuple[Optional[float], bool]:
        """When a request starting now must be answered (``time.monotonic()``; None: never), and whether
        that is the call timeout's cut (else the session's deadline)."""
        deadline = self.deadline()
        if self.call_timeout is None:
            return deadline, False
        cut = time.monotonic() + self.call_timeout
        return (cut, True) if deadline is None or cut < deadline else (deadline, False)

    def _expired(self, what: str, by_timeout: bool) -> NativeError:
        """The request ran out of time: the worker is killed; the error that says which clock ran out."""
        if by_timeout:
            self.kill(f"stopped: a request ran past the call timeout ({self.call_timeout:g} s)")
            return CallTimeout(what, self.call_timeout)
        self.kill("stopped at the session deadline")
        return NativeError(f"{what}: {DEADLINE}")

    def kill(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
        self.process.kill()
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
        """One request (``wire.py``): its value and copied-back arguments, or its error raised."""
        with self.lock:
            if self.dead is not None:
                raise NativeError(f"{what}: the native worker of this session is gone ({self.dead}); "
                                  f"load the module again")
            try:
                self._free_garbage()
                budget = self._budget()
                frame = encode_call(req[1].id, budget, req[2]) if req[0] == "call" else None
                until = self._until()
                send(self.sock, (budget, req), data=frame)
                answer = self._settle(self._answer(what, None, until))
            except BROKEN as exc:
                raise self._failure(exc, what) from None
        return self._result(answer, what)

    def _free_garbage(self) -> None:
        if self._garbage:
            with self._garbage_lock:
                garbage, self._garbage = self._garbage, []
            send(self.sock, (None, ("free", garbage)))
            if self._settle(self._recv())[0] != "ok":
                raise EOFError

    def _failure(self, exc: BaseException, what: str) -> NativeError:
        """The worker is killed after a request failed with ``exc``: the error that says why."""
        if isinstance(exc, ProtocolViolation):  # forged by native code: the worker goes, as after a crash
            self.kill(f"broke the protocol: {exc}")
            return NativeError(f"{what}: {exc}; its worker was stopped, load the module again")
        text = self.process.exit_text()
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

    def _answer(self, what: str, first: Optional[tuple] = None,
                until: Optional[tuple[Optional[float], bool]] = None) -> tuple:
        """The answer to the request just sent (``first``: its first message, already read), by ``until``
        (``_until()`` when it was sent; default: the session's deadline).  Meanwhile
        the worker may ask for a compute slot (``("slot",)``, a model run starting there): it is held in
        the server's compute policy (``rpcsrv.executor.compute``) until ``("slot-done",)`` or the
        answer, so the worker's runs share the cores' slots with every other session's."""
        limit, by_timeout = until if until is not None else (self.deadline(), False)
        with contextlib.ExitStack() as held:
            while True:
                if first is not None:
                    answer, first = first, None
                elif not self._wait(limit):
                    raise self._expired(what, by_timeout)
                else:
                    answer = self._recv()
                if answer[0] == "slot":
                    held.close()
                    try:
                        threads = held.enter_context(compute.job(local=False, deadline=limit))
                    except compute.SlotTimeout:  # the worker waits for the slot: it is stopped, as at a deadline
                        if by_timeout:
                            raise self._expired(what, True) from None
                        self.kill("stopped at the session deadline")
                        raise NativeError(f"{what}: no compute slot came free before the session deadline "
                                          f"(other sessions held them all); its worker was stopped") from None
                    send(self.sock, ("slot", threads))
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
        self.worker_arena.close()

    def call_request(self, head: tuple, args: Any, what: str) -> Any:
        """A request whose last field is arguments (``call``, ``global``): arrays outside the shared arenas
        (and bytes, e.g. load_params) cross as copies, charged while the request runs, and written back."""
        copied: list = []
        wire_args = self.values.encode(list(args), copied)
        transient = 0 if self.account is None else COPY_COST * (
            sum(a.nbytes for a in copied) + sum(len(w) for w in wire_args if isinstance(w, bytes)))
        if transient:
            self.account.charge(transient, "arguments copied to the native worker")
        try:
            result, outs = self.request(head + (wire_args,), what)
        finally:
            if transient:
                self.account.release(transient)
        for mine, theirs in zip(copied, outs):
            if mine.flags.writeable:
                np.copyto(mine, theirs)
        return self.values.decode(result, [])

    def attach(self, arena: Optional[Arena], deadline: Callable[[], Optional[float]]) -> None:
        """Give a spare worker its session: the session's arena (mapped there) and deadline."""
        with self.lock:
            send(self.sock, (None, ("attach", arena.capacity if arena else 0)), [arena.fd] if arena else [])
            if not self._wait(time.monotonic() + START_TIMEOUT) or self._recv()[0] != "ok":
                raise NativeError("the spare native worker did not take its session")
        self.arena, self.deadline = arena, deadline
        self.values.regions["session"] = arena

    async def wait_answer(self, what: str = "native call",
                          until: Optional[tuple[Optional[float], bool]] = None) -> None:
        """Wait on the event loop for the worker's next message, until ``until`` (``_until()`` when the request
        was sent; default: the session's deadline): when that comes first, the worker is stopped (its answer
        would never be read) and the error that says so is raised."""
        import trio

        limit, by_timeout = until if until is not None else (self.deadline(), False)
        at = math.inf if limit is None else trio.current_time() + limit - time.monotonic()
        with trio.move_on_at(at) as waited:
            await trio.lowlevel.wait_readable(self.sock)
        if waited.cancelled_caught:
            raise self._expired(what, by_timeout)

    async def call_async(self, oid: int, what: str, *args: Any) -> tuple[bool, Any]:
        """Call this worker's function ``oid`` (named ``what``) from the event loop: ``(True, value)``;
        ``(False, None)`` when the call must take the blocking path (``Worker.call`` in a thread):
        arguments that are copied or need pickle, objects to free first, or the worker busy with another
        thread's request.

        The request is one binary frame (``wire.py``) into an idle worker's socket, so the send never
        blocks; the loop then waits for the answer.  A compute slot asked for meanwhile (a model run in the
        worker) is held from a thread, as ``Worker.request`` does; a crash, the deadline: the same errors
        as there.  Cancelled (the session ends while native code runs), the worker is stopped, as at the
        deadline: its answer would never be read."""
        import trio

        self.last_frame = None  # the frame of a call that went this way, for a loan's record
        copied: list = []
        wire_args = [self.values.encode(a, copied) for a in args]
        if copied or self._garbage or self.dead is not None:
            return False, None
        frame = encode_call(oid, self._budget(), wire_args)
        if frame is None or not self.lock.acquire(blocking=False):
            return False, None
        try:
            try:
                until = self._until() if self.call_timeout is not None else None
                send(self.sock, None, data=frame)
                # not answered at once: wait on the loop (a plain ``select`` first: waiting through trio is an
                # epoll registration, a cancel scope and a task switch, ~40 Python calls a request)
                if not select.select([self.sock], [], [], self.quick_wait)[0]:
                    await self.wait_answer(what, until)
                answer = self._recv()  # read as from an untrusted peer (wire.recv_checked)
                if answer[0] in ("slot", "slot-done"):  # a model run in the worker: its slot is held in a thread
                    answer = await trio.to_thread.run_sync(self._answer, what, answer, until)
                answer = self._settle(answer)
            except BROKEN as exc:
                raise self._failure(exc, what) from None
            except BaseException:
                if self.dead is None:  # cancelled with native code running
                    self.kill("stopped: its session ended during a native call")
                raise
        finally:
            self.lock.release()
        value = self.values.decode(self._result(answer, what)[0], [])
        self.last_frame = frame
        return True, value

    # ---------------------------------------------------------------------------- the backend
    def load(self, path: str) -> "WorkerModule":
        return self.load_module(path)

    def load_module(self, path: str) -> "WorkerModule":
        result, _ = self.request(("load", path), "load_module")
        return self.values.decode(result, [])

    def get_function(self, module: Any, name: str, query_imports: bool = False) -> Optional["WorkerFunction"]:
        return module.find_function(name, bool(query_imports))

    def call(self, fn: Any, args: list) -> Any:
        return fn(*args)

    def runner(self, fn: Any, limiter: Any = None) -> Optional[Callable]:
        if isinstance(fn, WorkerFunction) and fn.worker is self:
            return functools.partial(self.call_async, fn.oid, fn.name)
        return None

    def call_global(self, name: str, args: Any) -> Any:
        return self.call_request(("global", name), args, name)

    def time_evaluator(self, fn: Any, params: tuple, f_preproc: str = "") -> "WorkerFunction":
        result, _ = self.request(("timer", Ref("fn", fn.oid, ""), tuple(params), f_preproc), "time_evaluator")
        return self.values.decode(result, [])

    def owns(self, fn: Any) -> bool:
        return getattr(fn, "worker", None) is self

    def last_call(self, fn: Any) -> Any:
        frame, self.last_frame = self.last_frame, None
        return frame

    async def lend(self, io: Any, entries: list, counts: dict, calls: dict) -> Optional[dict]:
        """The loan served by the worker: the client's socket and the shared page go with the first one
        (``SCM_RIGHTS``), then ``("hold", entries, counts, spin)``; the event loop waits on the worker's socket
        as for a long native call.  Cancelled while the worker holds the connection, the worker is stopped."""
        from .replay import PAGE_FORMAT, PAGE_SIZE

        if self.dead is not None or not self.lock.acquire(blocking=False):
            return None
        try:
            fds: list[int] = []
            try:
                if self.page is None:
                    io.share()  # before the worker can touch the descriptor's flags
                    fd = os.memfd_create("rpcsrv-loan", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 2))
                    fds = [io.sock.fileno(), fd]
                    os.ftruncate(fd, PAGE_SIZE)
                    seal(fd)  # the worker cannot shrink it under the server's mapping
                    self.page = mmap.mmap(fd, PAGE_SIZE)
                send(self.sock, (self._budget(), ("hold", [tuple(e) for e in entries], counts, io.spin)), fds)
            finally:
                if len(fds) == 2:
                    os.close(fds[1])
            try:
                try:
                    await self.wait_answer("a repeated native call")
                except NativeError as exc:
                    raise LoanDied(exc, *PAGE_FORMAT.unpack_from(self.page, 0)) from None
                reply = self._settle(self._recv())
            except BROKEN as exc:
                raise LoanDied(self._failure(exc, "native call"), *PAGE_FORMAT.unpack_from(self.page, 0)) from None
            except BaseException:
                if self.dead is None:  # cancelled (the session ends) while the worker holds the connection
                    self.kill("stopped: its session ended while it served the connection")
                raise
        finally:
            self.lock.release()
        if reply[0] == "ok" and type(reply[1]) is dict:
            result = reply[1]
            pending = result.get("pending")
            if type(pending) is tuple and len(pending) == 3 and pending[0] == "value":
                result["pending"] = ("value", self.values.decode(pending[1], []), pending[2])
            return result
        return {}  # refused to serve (a worker that cannot)


def take_worker(arena: Optional[Arena], deadline: Callable[[], Optional[float]], account: Any = None,
                confine: ConfineOptions = ConfineOptions()) -> Worker:
    """A worker for a session: the warm spare if it has this configuration (Python and numpy already started,
    about a second saved on a small board), else a new one.  With ``account`` (the session's), the worker is
    charged to it first (BudgetError when no room)."""
    if account is not None:
        account.charge(WORKER_COST, "native worker")
        try:
            worker = take_worker(arena, deadline, confine=confine)
        except BaseException:
            account.release(WORKER_COST)
            raise
        worker.account, worker.cost, worker.limit = account, WORKER_COST, message_limit(account)
        return worker
    config = worker_config(confine)
    spare = SPARES.take(config)
    if spare is not None:
        worker = Worker(None, process=spare)
        try:
            worker.attach(arena, deadline)
            return worker
        except (NativeError, OSError, EOFError):  # the spare died or refused its session: a fresh worker
            worker.close()
    return Worker(arena, deadline, config)
