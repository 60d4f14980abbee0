"""Lending a session's connection to its backend while the client repeats native calls.

One mechanism, and its one owner of the protocol state: the connection (``protocol.Connection``) is told
when it is lent and given back, with what the borrower read of a request it did not answer
(``Connection.lend``, ``take_back``); the borrower matches whole recorded packets and writes recorded answers,
and never parses or moves the protocol.  The borrower is the backend whose native functions the client calls
(``rpcsrv.native.backend``): the session's worker process, which takes the client's socket (``replay.py``:
why, and its loop), or this process, whose loan runs the same loop in a thread.

Per session: :meth:`Baton.note` sees every request the session answers.  Requests of the three kinds the
backend may repeat (a call of one of its native functions that answered nothing, the lookup that handed out
that function's handle, the free of that handle) are recorded byte for byte with their answers; any other
request clears the record (it may have changed what those bytes mean: arrays freed, copied, handles gone).
When a call comes again while recorded, :meth:`Baton.lend` lends the connection with the record and waits,
as for a long native call.  The backend gives the connection back at a packet boundary; the session's
accounts and metrics then take in what it served, the handle table takes the handle counts it leaves, and
the session reads on.

Lending never takes what the server must see: it needs nothing buffered ahead, no stream in progress,
and a backend that is idle.  A loan that served nothing doubles the number of repeats the next one waits
for (up to :data:`MAX_SKIP`), so a client that mixes calls with other requests pays at most a few
round trips more, and then nothing.  If the worker dies during a loan, the shared page says where: in
a native call, that request is answered with the crash, as on the usual path, and the session goes
on; in the middle of an answer, the connection ends (the client would read a broken packet).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any, Optional

from .answers import Answer, Failed, Returned, message
from .handles import PackedFunction
from ..native.backend import LoanDied
from ..native.library import NativeError
from ..native.replay import CALLING, IDLE, Entry
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
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
    except OSError:
        pass


class LoanBroken(ConnectionError):
    """The worker died while part of an answer may have gone out: the connection must end."""


@dataclass
class Recorded:
    entry: Entry
    event: Any  # the request, for the metrics
    answer: Any  # the session's answer, for the metrics
    what: str  # the function's name, for errors
    call: Any = None  # a call's record, what the backend repeats it with (``Backend.last_call``)


class Baton:
    def __init__(self, session: Any, backend: Any):
        self.session, self.backend = session, backend
        self.recorded: dict[bytes, Recorded] = {}
        self.functions: dict[int, PackedFunction] = {}  # the backend's function handles the record names
        self.skip, self.backoff = 0, 1
        self.lent = False  # the connection was lent (a worker may hold the client's socket since)
        self.served = 0  # requests the backend answered, over the session

    # ------------------------------------------------------------------ recording
    def note(self, ev: Any, answer: Any, packet: Optional[bytes], out: list) -> bool:
        """Record the request just answered; True when the connection should be lent now."""
        kind = self._kind(ev, answer) if packet is not None else None
        if kind is None:
            if self.recorded:
                self.forget()
            return False
        k, handle, frame, what, call = kind
        answer_bytes = b"".join(bytes(b) for b in out)
        seen = self.recorded.get(packet)
        entry = Entry(packet, k, handle, frame, answer_bytes)
        if seen is not None and seen.entry == entry and (type(call) is not tuple or seen.call[0] is call[0]):
            seen.event, seen.answer = ev, answer  # (a call in this process keeps its record: its bound call)
        else:
            self.recorded[packet] = Recorded(entry, ev, answer, what, call)
        if len(self.recorded) > MAX_ENTRIES:
            self.forget()
            return False
        if k != "call" or seen is None or seen.entry != entry or getattr(self.backend, "dead", None):
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
        """``(kind, handle, frame, name, call record)`` of a request the backend may repeat, else None."""
        handles = self.session.handles
        if type(ev) is CallFunc:
            func = handles.objects.get(ev.handle)
            if type(func) is not PackedFunction or type(answer) is not Returned:
                return None
            if self.backend.owns(func.fn):  # one of the native functions, called
                call = self.backend.last_call(func.fn)
                if call is None or answer.value is not None:
                    return None
                self.functions[ev.handle] = func
                return "call", ev.handle, call if type(call) is bytes else b"", func.name, call
            value = answer.value
            if func.name == GET_FUNCTION and type(value) is FunctionHandle:
                found = handles.objects.get(value.value)
                if type(found) is PackedFunction and self.backend.owns(found.fn):
                    self.functions[value.value] = found
                    return "get", value.value, b"", found.name, None
            return None
        if type(ev) is Syscall and ev.code == RPCCode.FREE_HANDLE and ev.args:
            handle = getattr(ev.args[0], "value", None)
            if handle in self.functions and type(answer) is Returned:
                return "free", handle, b"", self.functions[handle].name, None
        return None

    def _count(self, handle: int) -> int:
        handles = self.session.handles
        return handles.refs.get(handle, 1) if handle in handles.objects else 0

    def _counts(self, recorded: list) -> dict:
        """How many times the session holds each function handle the record names (the loan's start)."""
        return {h: self._count(h) for h in {r.entry.handle for r in recorded}}

    # ------------------------------------------------------------------ lending
    async def lend(self, io: Any, conn: Any, record: Any = None, stats: Any = None,
                   live: Any = None) -> Optional[Answer]:
        """Lend the connection until the backend gives it back.  Returns None, or the answer the server still
        owes: to a request the backend took off the socket and did not answer (an error, a value, or its
        worker's death), worded as on the server's own path; the connection has taken that request in."""
        if not conn.drained():
            return None
        recorded = list(self.recorded.values())
        counts = self._counts(recorded)
        calls = {i: r.call for i, r in enumerate(recorded) if r.entry.kind == "call"}
        conn.lend()
        self.lent = True
        try:
            result = await self.backend.lend(io, [r.entry for r in recorded], counts, calls)
        except LoanDied as died:
            return self._died(died, recorded, conn, record)
        except BaseException:
            conn.take_back()
            raise
        finally:
            io.sock.setblocking(False)  # the borrower read it blocking (the server's reads say MSG_DONTWAIT
            # anyway: native code in the worker may change the flag at any time)
        return self._returned(result, recorded, counts, io, conn, record, stats, live)

    def _died(self, died: LoanDied, recorded: list, conn: Any, record: Any) -> Optional[Answer]:
        """The worker is gone during a loan: the request it was running, if it was, owes its crash."""
        self.forget()
        if died.state == CALLING and 0 <= died.index < len(recorded):
            return self._owed(conn, record, recorded[died.index].entry.packet, Failed(message(died.error)))
        if died.state != IDLE:  # bytes of the client's read and lost, or half an answer sent
            raise LoanBroken(f"the native worker died holding the client's connection mid-request: {died.error}")
        conn.take_back()
        return None

    def _returned(self, result: Optional[dict], recorded: list, counts: dict, io: Any, conn: Any, record: Any,
                  stats: Any, live: Any) -> Optional[Answer]:
        """Take in what the backend served (accounts, metrics, handle counts); what is owed, if anything."""
        if not result:  # busy, or refused to serve (a worker that cannot): lend no more
            conn.take_back()
            if result is not None:
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
        unread = result.get("unread") or b""
        if unread:  # what the backend read of a request it left to the server
            if type(unread) is not bytes or len(unread) > max(len(r.entry.packet) for r in recorded) + 1:
                conn.take_back()
                raise LoanBroken("the native worker gave back more than it may have read")
            io.bytes_in += len(unread)
        pending = result.get("pending")
        if result.get("why") != "pending" or type(pending) is not tuple or len(pending) != 3:
            conn.take_back(unread)
            return None
        self.forget()  # the call answered otherwise than recorded
        kind, value, index = pending
        if kind not in ("err", "value") or type(index) is not int or not 0 <= index < len(recorded):
            conn.take_back()
            raise LoanBroken("the native worker named no request it had taken")
        answer = Failed(message(NativeError(value))) if kind == "err" else Returned(self.session.to_wire(value), True)
        return self._owed(conn, record, recorded[index].entry.packet, answer)

    def _owed(self, conn: Any, record: Any, packet: bytes, answer: Answer) -> Answer:
        """The answer to a request the backend took off the socket: the connection takes the request's bytes
        back, as if from the socket, and moves on it as on any request."""
        conn.take_back(packet)
        conn.next_event()
        if record is not None:
            record.calls += 1
        return answer

    def _settle_counts(self, reported: Any, before: dict, served: list, recorded: list) -> None:
        """The handle counts the backend leaves, within what its gets and frees could have made them."""
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
