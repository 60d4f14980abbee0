"""Repeated native calls answered by the session's worker straight from the client's socket (issue 26).

A client that calls a kernel over and over (a tuner, a script: ``f(a, b)`` or ``lib["f"](a, b)``)
sends the same request bytes every time and gets the same answer bytes back.  Through the server, each
such call crosses two processes (client -> server -> worker -> server -> client): four wake-ups and the
server's whole request path, where TVM's own server, which serves the session in the process that holds
the library, has two.  So when the server has seen a native call repeat, it *lends the connection* to
the worker (``rpcsrv.board.baton``): it sends the client's socket (once, with ``SCM_RIGHTS``) and a table
of the requests it has just answered, byte for byte, with their answers and their effects; it then reads
nothing from that socket until the worker gives it back.

Meanwhile the worker (:func:`hold`) *peeks* at each request (``MSG_PEEK``: nothing is consumed) and
serves it only when it is one of the table's, whole, and allowed:

* ``call``: a native function with shared arrays whose bound call this worker holds
  (``WorkerState.bound``), on a function handle the session holds;
* ``get``: the lookup that hands out that function handle (the session reissues the same handle for the
  same function: ``rpcsrv.board.globals``), counted up;
* ``free``: the free of that handle, counted down (never below zero).

Anything else (another request, a partial one, the client gone, ``IDLE_RETURN`` without a request, the
server asking) ends the loan with the socket untouched at a packet boundary, and the server reads on as
if the worker had never been there.  A call whose result differs from the recorded one (an error, a
value) ends it too, with the result, for the server to answer.  What the worker served goes back to the
server with the connection (counts per request, bytes, the handles' counts) for its accounts and metrics.

A shared page (:data:`PAGE_SIZE` bytes, sealed) says where the worker is: ``IDLE`` (nothing consumed),
``CALLING`` entry *i* (a request consumed, its native call running: if the worker dies now, the server
answers that request with the crash), ``ANSWERING`` (part of an answer may be out: a death here ends
the connection).  The server reads it only once the worker is gone, and as an untrusted word.
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import time
from typing import Any, NamedTuple

from .wire import decode_head

IDLE, CALLING, ANSWERING = 0, 1, 2
PAGE_SIZE = 64
#: the page: state (u32), entry index (u32)
PAGE_FORMAT = struct.Struct("<II")
#: after an answer, how long the worker polls for the next request before it sleeps in ``poll`` (the
#: client's next request is usually tens of microseconds away; a sleep costs a wake-up per call)
SPIN = float(os.environ.get("RPCSRV_LOAN_SPIN", "300e-6"))
#: how long without a request before the worker gives the connection back (the server then owns idle
#: time-outs, closing and every other request again)
IDLE_RETURN = 0.05
#: how long a request may stay partial (its bytes arriving in pieces) before it goes to the server
PARTIAL_WAIT = 1e-3


class Entry(NamedTuple):
    """One request the worker may answer: its whole packet (length prefix included), what it is
    (``call``/``get``/``free``), the function handle it names, the call frame (``wire.py``) of a call,
    and the answer's bytes."""

    packet: bytes
    kind: str
    handle: int
    frame: bytes
    answer: bytes


def take(state: Any, req: tuple, fds: list[int]) -> dict:
    """The worker's answer to ``("hold", entries, counts)``: serve the loan (:func:`hold`).  The first
    loan brings the client's socket and the shared page (``fds``), kept in ``state.lent`` for the next."""
    if fds:
        if state.lent is not None or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise ValueError("the client's connection was lent twice")
        client = socket.socket(fileno=fds[0])
        page = mmap.mmap(fds[1], PAGE_SIZE)
        os.close(fds[1])
        state.lent = (client, page)
    if state.lent is None:
        raise ValueError("no connection was lent to this worker")
    _, entries, counts = req
    return hold(state, state.ctl, state.lent[0], state.lent[1], entries, dict(counts))


def _callable(state: Any, frame: bytes) -> Any:
    """The bound native call a call frame runs here (None: not one this worker holds bound)."""
    try:
        _budget, oid, _nargs, at = decode_head(bytearray(frame))
    except Exception:
        return None
    return state.bound.get((oid, bytes(frame[at:])))


def _send_all(sock: socket.socket, data: bytes) -> int:
    """All of ``data`` out on the client's socket (non-blocking: the server's flags are shared)."""
    view, sent = memoryview(data), 0
    while sent < len(data):
        try:
            sent += sock.send(view[sent:])
        except (BlockingIOError, InterruptedError):
            select.select([], [sock], [], 1.0)
    return sent


def hold(state: Any, ctl: socket.socket, client: socket.socket, page: Any, entries: list,
         counts: dict) -> dict:
    """Serve the client's requests that are ``entries`` until one is not; return what was served.

    ``counts``: how many times the session has handed out each function handle the entries name
    (the worker keeps them while it serves ``get``/``free``; they go back in the result)."""
    table, bound = {}, {}
    for i, raw in enumerate(entries):
        e = Entry(*raw)
        if e.kind == "call":
            fn = _callable(state, e.frame)
            if fn is None:
                continue  # not a bound native call here (a model run, copied arguments): the server's
            bound[i] = fn
        table[e.packet] = (i, e)
    served = [0] * len(entries)
    seconds = [0.0] * len(entries)
    result = {"why": "empty", "served": served, "seconds": seconds, "counts": counts, "bytes_in": 0,
              "bytes_out": 0, "pending": None}
    if not bound:
        return result
    longest = max(len(p) for p in table)
    poller = select.poll()
    poller.register(client.fileno(), select.POLLIN)
    poller.register(ctl.fileno(), select.POLLIN)
    word = memoryview(page).cast("B").cast("I")  # [state, entry index]
    clock, peek, flags = time.perf_counter, client.recv, socket.MSG_PEEK | socket.MSG_DONTWAIT
    partial_since = None
    while True:
        try:  # the hot path: the next request is there already (peeked: nothing consumed yet)
            seen = peek(longest + 1, flags)
        except (BlockingIOError, InterruptedError):
            why = _wait(poller, ctl.fileno(), clock)
            if why:
                result["why"] = why
                return result
            continue
        except OSError:
            seen = b""
        if not seen:
            result["why"] = "closed"
            return result
        hit = table.get(seen)
        if hit is None:
            if _partial(seen, longest):  # the rest of a request that may be ours is on its way
                partial_since = partial_since or clock()
                if clock() - partial_since < PARTIAL_WAIT:
                    continue
            result["why"] = "other"
            return result
        partial_since = None
        t0 = clock()
        i, e = hit
        if e.kind != "get" and counts.get(e.handle, 0) <= 0:
            result["why"] = "other"  # a handle the session no longer holds: the server words the error
            return result
        client.recv(len(seen))  # consumed: from here the request is ours to answer
        result["bytes_in"] += len(seen)
        if e.kind == "get":
            counts[e.handle] = counts.get(e.handle, 0) + 1
        elif e.kind == "free":
            counts[e.handle] -= 1
        else:
            word[1], word[0] = i, CALLING
            try:
                value = bound[i]()
            except Exception as exc:  # answered by the server, worded as on its own path
                value, pending = None, ("err", str(exc) or type(exc).__name__, i)
            else:
                pending = None if value is None else ("value", state.to_wire(value), i)
            if pending is not None:
                word[0] = IDLE
                result.update(why="pending", pending=pending)
                return result
        word[0] = ANSWERING
        answer = e.answer
        try:
            sent = client.send(answer)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent != len(answer):  # (rare: only a full socket buffer sends part)
            _send_all(client, answer[sent:])
        word[0] = IDLE
        result["bytes_out"] += len(answer)
        served[i] += 1
        seconds[i] += clock() - t0


def _wait(poller: Any, ctl_fd: int, clock: Any) -> str:
    """Wait for the client's next request: poll a while (it is usually tens of microseconds away; a
    sleep costs a wake-up per call), then sleep in ``poll`` up to ``IDLE_RETURN``.  Returns why the
    loan ends (``idle``, ``asked``: the server wrote) or "" when the client's socket is readable."""
    ready = poller.poll(0)
    if not ready:
        end = clock() + SPIN
        while not ready and clock() < end:
            ready = poller.poll(0)
        if not ready:
            ready = poller.poll(int(IDLE_RETURN * 1000))
        if not ready:
            return "idle"
    return "asked" if any(fd == ctl_fd for fd, _ in ready) else ""


def _partial(seen: bytes, longest: int) -> bool:
    """Whether ``seen`` is the start of a packet no longer than the longest entry (more may come)."""
    if len(seen) < 8:
        return True
    total = 8 + int.from_bytes(seen[:8], "little")
    return len(seen) < total <= longest
