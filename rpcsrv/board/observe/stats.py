"""What a board counts while it serves, for its metrics and status page.

Plain Python numbers, no locks and no metrics library: everything here runs on the trio loop. The
cost on the request path is one :meth:`ServerStats.observe` per answered request (a dict lookup, a
few additions and a bisect: about 0.4 us, measured); the rest is counted where the data already is (the
transport's byte counts, the session record, the memory accounts) and read at scrape time, so open
sessions cost nothing until someone looks.  A session's numbers are folded into the totals when it
ends, so counters never go back.

Labels stay bounded: RPC code names (an enum), function kinds (:data:`KINDS`), end reasons (the
session record's), and a session *slot* (the lowest free number below ``max_sessions``) for the
per-session memory gauge; peers and file names appear only on the status page.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from ...protocol import (BadPacket, CallFunc, CallFuncEnd, CopyFromRemote, CopyToRemote, InitServer,
                         Syscall)
from ...protocol.codes import RPCCode
from ..answers import Failed

#: function kinds of the latency histograms
KINDS = ("small_call", "copy", "upload", "module_call", "model_run")
#: histogram bucket upper bounds, seconds (a small call is ~0.1 ms; a model run up to minutes)
BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
          5.0, 10.0, 30.0, 60.0, 300.0)
#: names of the functions that run a whole model (graph executor, Relax VM, the time evaluator's wrapper)
MODEL_RUNS = frozenset({"run", "invoke", "invoke_stateful", "run_individual", "profile"})
UPLOAD = "tvm.rpc.server.upload"
#: how many recent errors the status page shows
ERROR_RING = 32

_EVENTS = {InitServer: ("init_server", "small_call"), CopyToRemote: ("copy_to_remote", "copy"),
           CopyFromRemote: ("copy_from_remote", "copy"), CallFuncEnd: ("call_func", "upload")}
_CODES = {c: c.name.lower() for c in RPCCode}
#: the codes a client sends requests with (the ``code`` label's values, besides ``unknown``)
REQUEST_CODES = tuple(_CODES[c] for c in RPCCode if c in (RPCCode.INIT_SERVER, RPCCode.CALL_FUNC,
                                                           RPCCode.COPY_FROM_REMOTE, RPCCode.COPY_TO_REMOTE)
                      or c >= RPCCode.GET_GLOBAL_FUNC)


def function_kind(fn: Any) -> str:
    """The latency kind of a call to ``fn`` (a session's PackedFunction, or None once freed)."""
    if fn is None or not getattr(fn, "blocking", False):
        return "small_call"
    name = fn.name
    if name in MODEL_RUNS or name.startswith("time_evaluator("):
        return "model_run"
    return "upload" if name == UPLOAD else "module_call"


class Cell:
    """Requests of one (RPC code, kind): how many, how many failed, and their latency histogram."""

    __slots__ = ("code", "count", "errors", "sum", "buckets")

    def __init__(self, code: str):
        self.code = code
        self.count = 0
        self.errors = 0
        self.sum = 0.0
        self.buckets = [0] * (len(BOUNDS) + 1)  # the last one: beyond every bound (+Inf)


@dataclass
class LiveSession:
    """An open session as the metrics and the status page see it."""

    number: int
    slot: int
    record: Any  # rpcsrv.board.records.SessionRecord (peer, start, calls, transport)
    session: Any  # rpcsrv.board.session.Session (account, handles, errors, native)
    opened: float = field(default_factory=time.time)
    stream_t0: float = 0.0  # when the streamed call in progress started (perf_counter)
    cells: dict = field(default_factory=dict)  # function handle -> its Cell (ServerStats.observe)


@dataclass
class ErrorEntry:
    when: float
    session: int
    peer: str
    code: str
    message: str


class ServerStats:
    """One server's counters (``Server.stats``); made only when the board serves metrics."""

    def __init__(self):
        self.started = time.time()
        self.board_port = 0  # the RPC port, once bound (the status page shows it)
        self.cells: dict[tuple[str, str], Cell] = {}
        self.loaned = 0  # requests native workers answered while they held the connection (``observe_many``)
        self.live: dict[int, LiveSession] = {}
        self.errors: deque[ErrorEntry] = deque(maxlen=ERROR_RING)
        self.sessions_total = 0
        self.ended: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.connections_total = 0
        self.bytes_in = 0  # of connections that ended (open ones are read from their transports)
        self.bytes_out = 0
        self.workers_started = 0  # of sessions that ended
        self.workers_crashed = 0

    # ------------------------------------------------------------------ session life (not per call)
    def open(self, record: Any, session: Any) -> LiveSession:
        self.sessions_total += 1
        used = {s.slot for s in self.live.values()}
        slot = next(i for i in range(len(used) + 1) if i not in used)
        live = LiveSession(self.sessions_total, slot, record, session)
        self.live[live.number] = live
        return live

    def close(self, live: Optional[LiveSession], io: Any, end: Optional[str]) -> None:
        """A connection ended (``live``: its session, if it had one; ``end``: the record's reason)."""
        self.connections_total += 1
        if io is not None:
            self.bytes_in += io.bytes_in
            self.bytes_out += io.bytes_out
        if live is None:
            return
        self.live.pop(live.number, None)
        self.ended[end or "closed"] = self.ended.get(end or "closed", 0) + 1
        native = getattr(live.session, "native", None)
        if native is not None and hasattr(native, "worker_counts"):
            _alive, started, crashed = native.worker_counts()
            self.workers_started += started
            self.workers_crashed += crashed

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    # ------------------------------------------------------------------ per request (the hot path)
    def observe(self, ev: Any, answer: Any, seconds: float, live: LiveSession, count: int = 1) -> None:
        """One request answered in ``seconds`` (``count``: that many like it, ``seconds`` their total,
        each counted at the mean)."""
        if type(ev) is CallFunc:  # the common case: the cell of the function's handle, found once per handle
            cell = live.cells.get(ev.handle)
            if cell is None:
                fn = live.session.handles.objects.get(ev.handle)
                cell = self._cell("call_func", function_kind(fn))
                if fn is not None:  # (handles are never reused within a session)
                    live.cells[ev.handle] = cell
        else:
            cell = self._event_cell(ev)
        cell.count += count
        cell.sum += seconds
        cell.buckets[bisect_left(BOUNDS, seconds if count == 1 else seconds / count)] += count
        if type(answer) is Failed:
            cell.errors += 1
            self.errors.append(ErrorEntry(time.time(), live.number, live.record.peer, cell.code, answer.message[:500]))

    def observe_many(self, ev: Any, answer: Any, count: int, seconds: float, live: LiveSession) -> None:
        """``count`` more requests like ``ev`` answered like ``answer`` in ``seconds`` in all: those a native
        worker answered while it held the connection (``rpcsrv.board.baton``), each at the mean."""
        self.loaned += count
        self.observe(ev, answer, seconds, live, count)

    def _cell(self, code: str, kind: str) -> Cell:
        cell = self.cells.get((code, kind))
        if cell is None:
            cell = self.cells[code, kind] = Cell(code)
        return cell

    def _event_cell(self, ev: Any) -> Cell:
        t = type(ev)
        if t is Syscall:
            return self._cell(_CODES.get(ev.code, "unknown"), "small_call")
        if t is BadPacket:
            return self._cell(_CODES.get(ev.code, "unknown"), "small_call")
        return self._cell(*_EVENTS.get(t, ("unknown", "small_call")))

    # ------------------------------------------------------------------ read at scrape time
    def traffic(self) -> tuple[int, int]:
        """Bytes received and sent, ended connections and open sessions together."""
        rx, tx = self.bytes_in, self.bytes_out
        for s in self.live.values():
            io = s.record.io
            if io is not None:
                rx += io.bytes_in
                tx += io.bytes_out
        return rx, tx

    def workers(self) -> tuple[int, int, int]:
        """Native workers: (alive now, started, crashed) over every session, open or ended."""
        alive, started, crashed = 0, self.workers_started, self.workers_crashed
        for s in self.live.values():
            native = getattr(s.session, "native", None)
            if native is not None and hasattr(native, "worker_counts"):
                a, st, cr = native.worker_counts()
                alive, started, crashed = alive + a, started + st, crashed + cr
        return alive, started, crashed
