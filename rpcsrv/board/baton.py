"""Lending a session's connection to its native worker while the client repeats native calls (issue 26).

The worker's side, and why, is ``rpcsrv.native.replay``.  Here, per session: :meth:`Baton.note` sees
every request the session answers.  Requests of the three kinds the worker may repeat (a call of one of
its native functions that answered nothing, the lookup that handed out that function's handle, the
free of that handle) are recorded byte for byte with their answers; any other request clears the
record (it may have changed what those bytes mean: arrays freed, copied, handles gone).  When a call
comes again while recorded, :meth:`Baton.lend` sends the record and (the first time) the connection
to the worker, and waits on the worker's socket as for a long native call.  The worker gives the
connection back at a packet boundary; the session's accounts and metrics then take in what it served,
the handle table takes the handle counts it leaves, and the session reads on.

Lending never takes what the server must see: it needs nothing buffered ahead, no stream in progress,
and a worker that is idle.  A loan that served nothing doubles the number of repeats the next one waits
for (up to :data:`MAX_SKIP`), so a client that mixes calls with other requests pays at most a few
round trips more, and then nothing.  If the worker dies during a loan, the shared page says where: in
a native call, that request is answered with the crash, as on the usual path, and the session goes
on; in the middle of an answer, the connection ends (the client would read a broken packet).
"""

from __future__ import annotations

import mmap
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional

import trio

from .answers import Returned
from .handles import PackedFunction
from ..native.confine_wire import ProtocolViolation
from ..native.fastpath import DEADLINE, wait_answer
from ..native.library import NativeError, NativeFunction
from ..native.replay import CALLING, IDLE, PAGE_FORMAT, PAGE_SIZE, Entry, hold
from ..native.shm import _seal
from ..native.wire import FrameError
from ..native.worker import _send
from ..protocol import CallFunc, FunctionHandle, RPCCode, Syscall

#: the global the clients of both dialects call to look a function up in a module
GET_FUNCTION = "tvm.rpc.server.ModuleGetFunction"
#: recorded requests at most (a client repeating more distinct requests than this is not a loop)
MAX_ENTRIES = 16
#: the most repeats a loan waits for after loans that served nothing
MAX_SKIP = 64


def harden(sock: Any) -> None:
    """Undo what native code that held the connection may have set on it and what would reach the server
    itself: a linger time (the server's last ``close`` would wait for it, on the event loop).  Called
    when the worker is gone, just before the server closes the connection.  (Its other settings,
    buffer sizes, time-outs, ``O_NONBLOCK``, touch only this session; the owner that receives ``SIGIO``
    is refused by the worker's filter, and the server ignores ``SIGIO``.)"""
    import struct

    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
    except OSError:
        pass


class _Here:
    """The state ``replay.hold`` reads, for a loan served in the server's own process (its calls are
    given to it bound: only results are converted, and here they stay as they are)."""

    @staticmethod
    def to_wire(value: Any) -> Any:
        return value


_HERE = _Here()


class LoanBroken(ConnectionError):
    """The worker died while part of an answer may have gone out: the connection must end."""


@dataclass
class Recorded:
    entry: Entry
    event: Any  # the request, for the metrics
    answer: Any  # the session's answer, for the metrics
    what: str  # the function's name, for errors
    args: Any = None  # in process: (the native function, its arguments), bound when first lent
    call: Any = None  # in process: that bound call


class Baton:
    def __init__(self, session: Any, worker: Any):
        self.session, self.worker = session, worker
        self.recorded: dict[bytes, Recorded] = {}
        self.functions: dict[int, PackedFunction] = {}  # the worker's function handles the record names
        self.page: Optional[mmap.mmap] = None
        self.skip, self.backoff = 0, 1
        self.lent = False  # the worker holds the client's socket (sent once)
        self.served = 0  # requests the worker answered, over the session

    # ------------------------------------------------------------------ recording
    def note(self, ev: Any, answer: Any, packet: Optional[bytes], out: list) -> bool:
        """Record the request just answered; True when the worker should take the connection now."""
        kind = self._kind(ev, answer) if packet is not None else None
        if kind is None:
            if self.recorded:
                self.forget()
            return False
        k, handle, frame, what, args = kind
        answer_bytes = b"".join(bytes(b) for b in out)
        seen = self.recorded.get(packet)
        entry = Entry(packet, k, handle, frame, answer_bytes)
        if seen is not None and seen.entry == entry and (args is None or seen.args[0] is args[0]):
            seen.event, seen.answer = ev, answer  # (an in-process call keeps its bound call)
        else:
            self.recorded[packet] = Recorded(entry, ev, answer, what, args)
        if len(self.recorded) > MAX_ENTRIES:
            self.forget()
            return False
        if k != "call" or seen is None or seen.entry != entry or self.worker is not None and self.worker.dead:
            return False
        if self.skip:
            self.skip -= 1
            return False
        return True

    def forget(self) -> None:
        """Drop the record, and with it the functions it kept (a function the client freed goes now:
        in the worker, what it holds, an executor's storage, goes with it)."""
        self.recorded.clear()
        self.functions.clear()

    def _kind(self, ev: Any, answer: Any) -> Optional[tuple]:
        """``(kind, handle, frame, name)`` of a request the worker may repeat, else None."""
        handles = self.session.handles
        if type(ev) is CallFunc:
            func = handles.objects.get(ev.handle)
            if type(func) is not PackedFunction or type(answer) is not Returned:
                return None
            if self._ours(func.fn):  # one of the native functions, called
                if self.worker is None:  # in process: the call's arguments, as the session ran it
                    last, self.session.last_native = self.session.last_native, None
                    if last is None or last[0] is not func.fn or answer.value is not None:
                        return None
                    self.functions[ev.handle] = func
                    return "call", ev.handle, b"", func.name, last
                frame, self.worker.last_frame = self.worker.last_frame, None
                if frame is None or answer.value is not None:
                    return None
                self.functions[ev.handle] = func
                return "call", ev.handle, frame, func.name, None
            value = answer.value
            if func.name == GET_FUNCTION and type(value) is FunctionHandle:
                found = handles.objects.get(value.value)
                if type(found) is PackedFunction and self._ours(found.fn):
                    self.functions[value.value] = found
                    return "get", value.value, b"", found.name, None
            return None
        if type(ev) is Syscall and ev.code == RPCCode.FREE_HANDLE and ev.args:
            handle = getattr(ev.args[0], "value", None)
            if handle in self.functions and type(answer) is Returned:
                return "free", handle, b"", self.functions[handle].name, None
        return None

    def _ours(self, fn: Any) -> bool:
        """A function the loan may run: the worker's, or (in process) a native function."""
        if self.worker is None:
            return type(fn) is NativeFunction
        return getattr(fn, "worker", None) is self.worker

    def _count(self, handle: int) -> int:
        handles = self.session.handles
        return handles.refs.get(handle, 1) if handle in handles.objects else 0

    def _counts(self, recorded: list) -> dict:
        """How many times the session holds each function handle the record names (the loan's start)."""
        return {h: self._count(h) for h in {r.entry.handle for r in recorded}}

    # ------------------------------------------------------------------ lending
    def _page_fd(self) -> int:
        fd = os.memfd_create("rpcsrv-loan", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 2))
        os.ftruncate(fd, PAGE_SIZE)
        _seal(fd)  # the worker cannot shrink it under the server's mapping
        self.page = mmap.mmap(fd, PAGE_SIZE)
        return fd

    async def lend(self, io: Any, conn: Any, record: Any = None, stats: Any = None,
                   live: Any = None) -> Optional[tuple]:
        """Lend the connection until the worker gives it back.  Returns None, or what the server still
        owes: ``(packet, kind, value)`` for a request the worker took off the socket and could not
        answer (``err``: the call's error text, ``value``: its wire value, ``crash``: the error of its
        worker's death); the server answers it as if it had read ``packet`` itself."""
        worker = self.worker
        if worker is None:
            return await self._lend_here(io, conn, record, stats, live)
        if worker.dead is not None or not conn.drained() or not worker.lock.acquire(blocking=False):
            return None
        recorded = list(self.recorded.values())
        counts = self._counts(recorded)
        try:
            fds: list[int] = []
            try:
                if not self.lent:
                    io.share()  # before the worker can touch the descriptor's flags
                    fds = [io.sock.fileno(), self._page_fd()]
                _send(worker.sock, (worker._budget(), ("hold", [tuple(r.entry) for r in recorded], counts, io.spin)),
                      fds)
                self.lent = True
            finally:
                if len(fds) == 2:
                    os.close(fds[1])
            try:
                if not await wait_answer(worker):
                    return self._died(NativeError(DEADLINE), recorded)
                reply = worker._settle(worker._recv())
            except (ProtocolViolation, EOFError, OSError, ConnectionError, FrameError) as exc:
                return self._died(worker._failure(exc, "native call"), recorded)
            except BaseException:
                if worker.dead is None:  # cancelled (the session ends) while the worker holds the connection
                    worker.kill("stopped: its session ended while it served the connection")
                raise
        finally:
            worker.lock.release()
            io.sock.setblocking(False)  # the worker read it blocking (the server's reads say MSG_DONTWAIT
            # anyway: native code in the worker may change the flag at any time)
        return self._returned(reply, recorded, counts, io, conn, record, stats, live)

    async def _lend_here(self, io: Any, conn: Any, record: Any, stats: Any, live: Any) -> Optional[tuple]:
        """``--native inprocess``: the loan's loop runs in a thread of the server (the same loop, in C:
        it holds no interpreter lock while it waits or calls), with the native calls bound here."""
        if not conn.drained():
            return None
        recorded = list(self.recorded.values())
        bound = {}
        for i, r in enumerate(recorded):
            if r.entry.kind == "call":
                if r.call is None:
                    fn, args = r.args
                    r.call = fn.bind(*args, hold=True, returns=True)
                bound[i] = r.call
        counts = self._counts(recorded)
        if self.page is None:
            self.page = mmap.mmap(-1, PAGE_SIZE)
        self.lent = True
        done: list = []

        async def serve() -> None:
            done.append(await trio.to_thread.run_sync(hold, _HERE, io.sock, self.page,
                                                      [tuple(r.entry) for r in recorded], counts, bound, io.spin))
            nursery.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    if not done:  # the session ends (deadline, shutdown) while the thread holds the
                        io.sock.shutdown(socket.SHUT_RDWR)  # connection: its loop sees the close
                    raise
        finally:
            io.sock.setblocking(False)
        return self._returned(("ok", done[0]), recorded, counts, io, conn, record, stats, live)

    def _died(self, error: Exception, recorded: list) -> Optional[tuple]:
        """The worker is gone during a loan: the request it was running, if it was, owes its crash."""
        self.forget()
        state, index = PAGE_FORMAT.unpack_from(self.page, 0) if self.page is not None else (0, 0)
        if state == CALLING and 0 <= index < len(recorded):
            return recorded[index].entry.packet, "crash", error
        if state != IDLE:  # bytes of the client's read and lost, or half an answer sent
            raise LoanBroken(f"the native worker died holding the client's connection mid-request: {error}")
        return None

    def _returned(self, reply: tuple, recorded: list, counts: dict, io: Any, conn: Any, record: Any,
                  stats: Any, live: Any) -> Optional[tuple]:
        """Take in what the worker served (accounts, metrics, handle counts); what is owed, if anything."""
        result = reply[1] if reply[0] == "ok" and type(reply[1]) is dict else None
        if result is None:  # refused to serve (a worker that cannot): lend no more
            self.skip = self.backoff = MAX_SKIP
            return None
        served = _ints(result.get("served"), len(recorded))
        seconds = result.get("seconds") or []
        total = sum(served)
        self.served += total
        self._settle_counts(result.get("counts"), counts, served, recorded)
        if record is not None:
            record.calls += total
        io.bytes_in += _int(result.get("bytes_in"))
        io.bytes_out += _int(result.get("bytes_out"))
        if stats is not None and live is not None:
            for r, n, s in zip(recorded, served, seconds):
                if n:
                    stats.observe_many(r.event, r.answer, n, float(s), live)
        self.skip, self.backoff = (self.backoff, min(2 * self.backoff, MAX_SKIP)) if not total else (0, 1)
        unread = result.get("unread")
        if unread:  # what the worker read of a request it left to the server
            if type(unread) is not bytes or len(unread) > max(len(r.entry.packet) for r in recorded) + 1:
                raise LoanBroken("the native worker gave back more than it may have read")
            io.bytes_in += len(unread)
            conn.receive_data(unread)
        pending = result.get("pending")
        if result.get("why") != "pending" or type(pending) is not tuple or len(pending) != 3:
            return None
        self.forget()  # the call answered otherwise than recorded
        kind, value, index = pending
        if kind not in ("err", "value") or type(index) is not int or not 0 <= index < len(recorded):
            raise LoanBroken("the native worker named no request it had taken")
        if kind == "value" and self.worker is not None:
            value = self.worker.from_wire(value)
        return recorded[index].entry.packet, kind, value

    def _settle_counts(self, reported: Any, before: dict, served: list, recorded: list) -> None:
        """The handle counts the worker leaves, within what its gets and frees could have made them."""
        if type(reported) is not dict:
            return
        gets = sum(n for r, n in zip(recorded, served) if r.entry.kind == "get")
        for handle, was in before.items():
            now = min(max(_int(reported.get(handle)), 0), was + gets)
            if now != was:
                self.session.handles.set_count(handle, self.functions[handle], now)


def _int(v: Any) -> int:
    return v if type(v) is int and v >= 0 else 0


def _ints(v: Any, n: int) -> list[int]:
    return [_int(x) for x in v][:n] + [0] * (n - len(v)) if type(v) is list else [0] * n
