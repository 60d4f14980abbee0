"""Repeated native calls answered by the session's worker straight from the client's socket.

A client that calls a kernel over and over (a tuner, a script: ``f(a, b)`` or ``lib["f"](a, b)``)
sends the same request bytes every time and gets the same answer bytes back.  Through the server, each
such call crosses two processes (client -> server -> worker -> server -> client): four wake-ups and the
server's whole request path, where TVM's own server, which serves the session in the process that holds
the library, has two.  So when the server has seen a native call repeat, it *lends the connection* to
the worker (``rpcsrv.board.baton``): it sends the client's socket (once, with ``SCM_RIGHTS``) and a table
of the requests it has just answered, byte for byte, with their answers and their effects; it then reads
nothing from that socket until the worker gives it back.

Meanwhile the worker (:func:`hold`) reads each request (blocking, as TVM's server does: one ``recv``
and one ``send`` per request) and answers it only when it is one of the table's, whole, and allowed:

* ``call``: a native function with shared arrays whose bound call this worker holds
  (``WorkerState.bound``), on a function handle the session holds;
* ``get``: the lookup that hands out that function handle (the session reissues the same handle for the
  same function: ``rpcsrv.board.globals``), counted up;
* ``free``: the free of that handle, counted down (never below zero).

Anything else (another request, the client gone, ``IDLE_RETURN`` without a request) ends the loan: the
bytes read of a request it does not answer go back with the connection (``unread``), and the server
parses them as if it had read them itself.  A call whose result differs from the recorded one (an
error, a value) ends it too, with the result, for the server to answer.  What the worker served goes
back to the server with the connection (counts per request, bytes, the handles' counts) for its
accounts and metrics.

A shared page (:data:`PAGE_SIZE` bytes, sealed) says where the worker is: ``IDLE`` (waiting: nothing
read), ``READING`` (bytes of a request read, not answered), ``CALLING`` entry *i* (a request read, its
native call running: if the worker dies now, the server answers that request with the crash),
``ANSWERING`` (part of an answer may be out).  Dead while ``READING`` or ``ANSWERING``, the stream is
lost and the connection ends.  The server reads the page only once the worker is gone, as an untrusted
word.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import struct
import time
from typing import Any, Callable, NamedTuple, Optional

from ..config import environment
from .wire import FrameError, decode_head

IDLE, CALLING, ANSWERING, READING = 0, 1, 2, 3
PAGE_SIZE = 64
#: the page: state (u32), entry index (u32)
PAGE_FORMAT = struct.Struct("<II")
#: how long without a request before the worker gives the connection back (the server then owns idle
#: time-outs, closing and every other request again)
IDLE_RETURN = 0.05
#: the longest a loan polls for the next request before its blocking read (seconds; ``--poll-us`` is checked
#: against the same bound)
MAX_SPIN = 1.0


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
    """The worker's answer to ``("hold", entries, counts, spin)``: serve the loan (:func:`hold`).  The first
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
    _, entries, counts, spin = req
    if not 0.0 <= float(spin) <= MAX_SPIN:
        raise ValueError(f"a loan's poll time of {spin!r} s is outside 0..{MAX_SPIN}")
    return hold(state, state.lent[0], state.lent[1], entries, dict(counts), spin=float(spin))


def _callable(state: Any, frame: bytes) -> Any:
    """The bound native call a call frame runs here (None: not one this worker holds bound)."""
    try:
        _budget, oid, _nargs, at = decode_head(bytearray(frame))
    except FrameError:
        return None
    return state.bound.get((oid, bytes(frame[at:])))


def hold(state: Any, client: socket.socket, page: Any, entries: list, counts: dict,
         calls: Optional[dict] = None, spin: float = 0.0) -> dict:
    """Serve the client's requests that are ``entries`` until one is not; return what was served.

    ``counts``: how many times the session has handed out each function handle the entries name
    (the worker keeps them while it serves ``get``/``free``; they go back in the result).  The socket
    is read blocking, with ``IDLE_RETURN`` as its receive time-out: one ``recv`` and one ``send`` per
    request, as in TVM's own server (the server, which reads nothing meanwhile, makes it non-blocking
    again when it has it back).  What was read of a request that is not one of the entries goes back
    unanswered (``unread``), for the server to parse as if it had read it itself.  ``calls``: the bound
    call of each call entry, by index (a loan in the server's own process); else the worker's, found by
    each entry's frame.  ``spin``: seconds the C loop polls for the next request before its blocking read
    (the server's ``--poll-us``; the Python loop reads at once)."""
    table, bound = {}, {}
    for i, raw in enumerate(entries):
        e = Entry(*raw)
        if e.kind == "call":
            fn = calls.get(i) if calls is not None else _callable(state, e.frame)
            if fn is None:
                continue  # not a bound native call here (a model run, copied arguments): the server's
            bound[i] = fn
        table[e.packet] = (i, e)
    served = [0] * len(entries)
    seconds = [0.0] * len(entries)
    result = {"why": "empty", "served": served, "seconds": seconds, "counts": counts, "bytes_in": 0,
              "bytes_out": 0, "pending": None, "unread": b""}
    if not bound:
        return result
    longest = max(len(p) for p in table)
    word = memoryview(page).cast("B").cast("I")  # [state, entry index]
    word[0] = IDLE
    loop = _c_loop(entries, bound) if use_c() else None
    client.setblocking(True)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(IDLE_RETURN))
    if loop is not None:
        try:
            return loop(state, client, page, counts, longest, result, spin)
        finally:
            _untimed(client)
    clock, recv, send = time.perf_counter, client.recv, client.send
    bytes_in = bytes_out = 0
    why = "closed"
    try:
        while True:
            try:
                seen = recv(longest + 1)
            except BlockingIOError:  # IDLE_RETURN without a request
                why = "idle"
                break
            except OSError:
                break
            if not seen:
                break
            word[0] = READING
            hit = table.get(seen)
            if hit is None:
                seen = _rest(recv, seen, longest)  # a request in pieces: read on while it may be ours
                hit = table.get(seen)
            if hit is None or (hit[1].kind != "get" and counts.get(hit[1].handle, 0) <= 0):
                result["unread"] = seen  # another request, or a handle the session no longer holds:
                why = "other"  # the server answers it (and words the error)
                break
            t0 = clock()
            i, e = hit
            bytes_in += len(seen)
            kind = e.kind
            if kind == "get":
                counts[e.handle] = counts.get(e.handle, 0) + 1
            elif kind == "free":
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
                    word[0] = READING  # the request is in the server's hands from here
                    why, result["pending"] = "pending", pending
                    break
            word[0] = ANSWERING
            answer = e.answer
            sent = send(answer)
            if sent != len(answer):  # (rare: a full socket buffer takes part of it)
                client.sendall(answer[sent:])
            word[0] = IDLE
            bytes_out += len(e.answer)
            served[i] += 1
            seconds[i] += clock() - t0
    finally:
        result.update(why=why, bytes_in=bytes_in, bytes_out=bytes_out)
        _untimed(client)
    return result


def readiness() -> str:
    """Whether this process can serve a loan, and with which loop: ``"in force: ..."`` or ``"absent: why"``
    (what a worker reports once confined; ``rpcsrv check`` and the server's log show it)."""
    if not hasattr(socket, "recv_fds") or not hasattr(os, "memfd_create"):
        return "absent: this system cannot pass a socket to another process with its shared page"
    if not use_c():
        return "in force: Python loop (RPCSRV_LOAN_LOOP=python)"
    try:
        from .shim import load_shim

        load_shim().rpcsrv_loan
    except (ImportError, OSError, AttributeError, RuntimeError) as exc:
        return f"in force: Python loop (the runtime shim has no C loop: {exc})"
    return "in force: C loop (rpcsrv_loan of the runtime shim)"


def _untimed(client: socket.socket) -> None:
    """The socket's receive time-out back to none (the server sets it non-blocking again)."""
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))
    except OSError:
        pass


def _c_loop(entries: list, bound: dict) -> Optional[Callable]:
    """The loan's loop in C (``rpcsrv_loan`` of the runtime shim), when the shim has it and every call
    is a bound call of native code: one ``recv`` and one ``send`` per request, no Python in between."""
    try:
        from .shim import load_shim

        shim = load_shim()
        fn = shim.rpcsrv_loan
    except (ImportError, OSError, AttributeError, RuntimeError):
        return None
    if not all(hasattr(f, "parts") for f in bound.values()):
        return None
    if fn.argtypes is None:  # (once per loaded shim; a foreign function's restype is c_int by default)
        c = ctypes
        fn.argtypes = [c.c_int, c.POINTER(_LoanEntry), c.c_int32, c.POINTER(c.c_int64), c.c_int64,
                       c.POINTER(c.c_char), c.POINTER(c.c_int64), c.POINTER(c.c_uint32), c.POINTER(c.c_int64),
                       c.c_double]
        fn.restype = c.c_int
    return lambda *a: _run_c(fn, entries, bound, *a)


def _run_c(fn: Any, entries: list, bound: dict, state: Any, client: socket.socket, page: Any, counts: dict,
           longest: int, result: dict, spin: float) -> dict:
    from .abi import TVMFFIAny, TVMValue

    handles = sorted({Entry(*raw).handle for raw in entries})
    slots = (ctypes.c_int64 * max(len(handles), 1))(*[counts.get(h, 0) for h in handles])
    table = (_LoanEntry * len(entries))()
    cells: dict = {}  # the result cells of the bound calls, by entry (alive for the call)
    for i, raw in enumerate(entries):
        e, x = Entry(*raw), table[i]
        x.packet, x.packet_len = e.packet, len(e.packet)
        x.answer, x.answer_len = e.answer, len(e.answer)
        x.kind, x.slot = KINDS.get(e.kind, 3), handles.index(e.handle)
        if i in bound:
            abi, f, args, codes, nargs, _fail = bound[i].parts
            ret, code = (TVMFFIAny() if abi == 2 else TVMValue()), ctypes.c_int32(4)
            cells[i] = (ret, code)
            x.abi, x.nargs, x.fptr = abi, nargs, ctypes.cast(f, ctypes.c_void_p)
            x.args, x.codes = ctypes.cast(args, ctypes.c_void_p), ctypes.cast(codes, ctypes.c_void_p) if codes else None
            x.ret, x.ret_code = ctypes.cast(ctypes.pointer(ret), ctypes.c_void_p), ctypes.pointer(code)
        elif e.kind == "call":
            x.kind = 3  # a call not bound here: never matched (the C loop answers only what it can run)
    buf = ctypes.create_string_buffer(longest + 1)
    got, io = ctypes.c_int64(0), (ctypes.c_int64 * 2)()
    word = (ctypes.c_uint32 * 2).from_buffer(page)
    try:
        why = fn(client.fileno(), table, len(entries), slots, longest, buf, ctypes.byref(got), word, io, spin)
    finally:
        del word  # (the page's buffer export ends here)
    for i in range(len(entries)):
        result["served"][i], result["seconds"][i] = table[i].served, table[i].seconds
    result["counts"] = {h: slots[j] for j, h in enumerate(handles)}
    result["bytes_in"], result["bytes_out"] = io[0], io[1]
    result["why"] = ("closed", "idle", "other", "pending", "pending")[why] if 0 <= why <= 4 else "closed"
    if why == 2:
        result["unread"] = buf.raw[:got.value]
    elif why in (3, 4):
        i = memoryview(page).cast("B").cast("I")[1]
        _abi, _f, _args, _codes, _n, fail = bound[i].parts
        if why == 3:
            exc = fail()
            result["pending"] = ("err", str(exc) or type(exc).__name__, i)
        else:
            from .library import _from_any, _from_value

            ret, code = cells[i]
            value = _from_any(ret, "") if _abi == 2 else _from_value(ret, code.value, "")
            result["pending"] = ("value", state.to_wire(value), i)
    return result


class _LoanEntry(ctypes.Structure):
    """``LoanEntry`` of ``shim.c``."""

    _fields_ = [("packet", ctypes.c_char_p), ("packet_len", ctypes.c_int64), ("answer", ctypes.c_char_p),
                ("answer_len", ctypes.c_int64), ("kind", ctypes.c_int32), ("slot", ctypes.c_int32),
                ("abi", ctypes.c_int32), ("nargs", ctypes.c_int32), ("fptr", ctypes.c_void_p),
                ("args", ctypes.c_void_p), ("codes", ctypes.c_void_p), ("ret", ctypes.c_void_p),
                ("ret_code", ctypes.POINTER(ctypes.c_int32)), ("served", ctypes.c_int64),
                ("seconds", ctypes.c_double)]


#: entry kinds as ``shim.c`` numbers them (3: never matched)
KINDS = {"call": 0, "get": 1, "free": 2}
def use_c() -> bool:
    """Whether a loan's loop runs in C when the shim has it (``RPCSRV_LOAN_LOOP=python``: the Python loop, for
    tests; a worker has its server's setting)."""
    return environment.text("RPCSRV_LOAN_LOOP") != "python"


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for ``SO_RCVTIMEO`` (the C library's own sizes: 32-bit ARM too)."""
    return struct.pack("@ll", int(seconds), int((seconds % 1) * 1e6))


def _rest(recv: Any, seen: bytes, longest: int) -> bytes:
    """``seen`` and the rest of its packet while that packet could be one of the entries (no longer than
    ``longest``), up to a receive time-out or the client's close (then what came so far)."""
    while _partial(seen, longest):
        try:
            more = recv(longest + 1 - len(seen))
        except OSError:
            return seen
        if not more:
            return seen
        seen += more
    return seen


def _partial(seen: bytes, longest: int) -> bool:
    """Whether ``seen`` is the start of a packet no longer than the longest entry (more may come)."""
    if len(seen) < 8:
        return True
    total = 8 + int.from_bytes(seen[:8], "little")
    return len(seen) < total <= longest
