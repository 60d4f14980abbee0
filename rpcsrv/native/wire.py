"""The link between a session and its native worker: the backend interface over a Unix socket pair.

The worker serves the session the same :class:`~rpcsrv.native.backend.Backend` a session has in its own
process (``worker.py`` runs a ``LocalBackend``; ``proxy.py`` is the session's side, ``WorkerBackend``): each
request names one of its methods, the answer is its result.  One request at a time, each a message: an
8-byte length, then a pickled tuple (the server loads the worker's messages with a restricted unpickler,
``confine_wire.py``: native code in the worker can forge them) or a binary frame (below).  A request is sent
as ``(budget, request)``: ``budget`` is the session's room for what the worker allocates (``budget.Budget``,
None for no limit).  The backend's requests: ``("load", path)``, ``("get", module, name, query_imports)``,
``("call", function, args)``, ``("global", name, args)`` (a global function over the worker's modules:
executor creation), ``("timer", function, params, f_preproc)``; the worker process's own: ``("free", ids)``,
``("stats",)``, ``("attach", capacity)`` (with the session arena's descriptor), ``("confine", policy)`` and
``("hold", ...)`` (a loan of the client's connection, ``replay.py``).  Answers: ``("ok", value, outs, held)``,
``("err", message, None, held)`` or ``("budget", (what, nbytes, name, used, limit), None, held)`` (an
allocation refused before it was made); ``held`` is what the worker holds for the session after the request,
in bytes.  While a request runs, the worker may ask for a compute slot, ``("slot",)`` (answered ``("slot",
threads)``), and give it back, ``("slot-done",)``.  The first message of all is the server's: the worker's
start message (its configuration, ``proxy.WorkerConfig``); the worker answers it with its hello.

Values cross as themselves (ints, floats, str, bytes, Device, DataType, None), except (:class:`Values`, one
conversion for both ends, each with its own references):

* arrays: ``Shared(region, offset, dtype, shape, strides)`` when they live in a region both sides
  map (``shm.py``), so only the handle crosses; otherwise ``Copied(array)``, and the worker sends
  back every copied argument after the call (``outs``) so that writes reach the caller's memory;
* modules and functions of the worker: ``Ref(kind, id, name)``, proxies on the session's side.

The common request, a call whose arguments are all shared arrays, plain scalars and worker objects,
and its answer when the value is a scalar or None, travel as fixed binary frames instead
(:func:`encode_call`/:func:`decode_call`, :func:`encode_result`/:func:`decode_result`): they decode to the
same tuples as their pickles, at a fraction of the cost (pickling the ``Shared`` records was ~30 us of a
~130 us worker round trip).  A message is a binary frame when its first byte is ``C`` or ``R`` (a pickle
starts with ``0x80``).  A malformed frame raises :class:`FrameError` (a ``ValueError``): the worker
answers it as an error.
"""

from __future__ import annotations

import pickle
import socket
import struct
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import numpy as np
from construct import Int8ul, Int16ul, Int64sl, Int64ul, Struct

from ..protocol.structs import fixed_struct
from .confine_wire import ProtocolViolation, loads


class Ref(NamedTuple):  # named tuples: built and pickled several times faster than dataclasses
    kind: str  # "mod" or "fn"
    id: int
    name: str  # type key of a module, name of a function


class Shared(NamedTuple):
    region: str  # "session" (the session's arena) or "worker" (the worker's)
    offset: int
    dtype: str
    shape: tuple
    strides: tuple


@dataclass
class Copied:
    array: Any


# ---------------------------------------------------------------------------- values
#: values that cross as themselves
_PLAIN = frozenset({type(None), bool, int, float, str, bytes})


class Values:
    """How values cross the link, written once for both ends: arrays by handle where both ends map them
    (``regions``: name -> ``shm.Arena`` or None) or copied, containers item by item, modules and functions by
    reference.  Each end gives its own references (:meth:`reference`, :meth:`dereference`) and copies
    (:meth:`copy`, :meth:`copied`); ``copied`` lists collect the arrays that went as copies (written back)."""

    def __init__(self, regions: dict[str, Any]):
        self.regions = regions

    def encode(self, v: Any, copied: list) -> Any:
        if type(v) in _PLAIN:
            return v
        if isinstance(v, np.ndarray):
            if v.dtype.kind != "O":
                for region, arena in self.regions.items():
                    offset = arena.offset_of(v) if arena is not None else None
                    if offset is not None:
                        return Shared(region, offset, v.dtype.str, v.shape, v.strides)
            return self.copy(v, copied)
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, (bytearray, memoryview)):  # bytes arguments (load_params) arrive as views
            return bytes(v)
        if isinstance(v, dict):
            return {k: self.encode(x, copied) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(self.encode(x, copied) for x in v)
        ref = self.reference(v)
        return v if ref is None else ref  # (Device, DataType and other plain values as they are)

    def decode(self, v: Any, copied: list) -> Any:
        t = type(v)
        if t is Shared:
            arena = self.regions.get(v.region)
            if arena is None:
                raise ValueError(f"unknown shared region {v.region!r}")
            return arena.view(v.offset, v.dtype, v.shape, v.strides)
        if t is Copied:
            return self.copied(v.array, copied)
        if t is Ref:
            return self.dereference(v)
        if isinstance(v, dict):
            return {k: self.decode(x, copied) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(self.decode(x, copied) for x in v)
        return v

    def reference(self, obj: Any) -> Optional["Ref"]:
        """This end's object as a reference (None: it crosses as itself)."""
        raise NotImplementedError

    def dereference(self, ref: "Ref") -> Any:
        """What a reference names, on this end."""
        raise NotImplementedError

    def copy(self, array: np.ndarray, copied: list) -> "Copied":
        """An array outside the shared regions, sent as a copy."""
        copied.append(array)
        return Copied(array)

    def copied(self, array: np.ndarray, copied: list) -> np.ndarray:
        """An array that came as a copy."""
        return array


# ---------------------------------------------------------------------------- framing
#: the largest message a worker may send without a session budget to size it by
DEFAULT_LIMIT = (4 << 30) if sys.maxsize > 2 ** 32 else (512 << 20)


def message_limit(account: Any) -> int:
    """Bytes one message from a worker may hold: the session's memory limit (its largest answer is an array it
    could hold), plus room for the message around it."""
    if account is None:
        return DEFAULT_LIMIT
    limits = [limit for _name, _used, limit in account.room()]
    return (min(limits) if limits else DEFAULT_LIMIT) + (1 << 20)


def recv_checked(sock: socket.socket, limit: int) -> Any:
    """One message from a worker, read as from an untrusted peer (its native code can forge them): a length
    beyond ``limit`` is refused before anything is allocated, a binary frame is checked field by field, a
    pickle builds only what an answer is made of (``confine_wire.loads``).  Either refusal is a
    ``ProtocolViolation``: the session stops the worker, as after a crash."""
    n = int.from_bytes(recv_exact(sock, 8), "little")
    if n > limit:
        raise ProtocolViolation(f"the native worker announced a {n}-byte message (limit {limit})")
    data = recv_exact(sock, n)
    if data[:1] == b"R":
        try:
            return decode_result(bytes(data))
        except FrameError as exc:
            raise ProtocolViolation(f"the native worker sent a malformed result frame: {exc}") from None
    return loads(data)
def send(sock: socket.socket, obj: Any, fds: list[int] = (), data: Optional[bytes] = None) -> None:
    """Send ``obj`` pickled, or ``data`` (a binary frame) as it is, with ``fds`` (``SCM_RIGHTS``)."""
    if data is None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = len(data).to_bytes(8, "little")
    if fds:
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(header + data)  # one write: one wake-up of the other side


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes (returned as received: a copied array argument is not copied once more here)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError
        got += k
    return buf


def decode_message(data: bytearray) -> Any:
    """A message from the server: a binary call or result frame, else a pickle (the worker trusts its server;
    the server reads the worker's with ``confine_wire.recv``)."""
    if data[:1] == b"C":
        return decode_call(data)
    if data[:1] == b"R":
        return decode_result(bytes(data))
    return pickle.loads(data)


def recv(sock: socket.socket) -> Any:
    """One message, decoded (:func:`decode_message`)."""
    n = int.from_bytes(recv_exact(sock, 8), "little")
    return decode_message(recv_exact(sock, n))


def recv_with_fds(sock: socket.socket) -> tuple[bytearray, list[int]]:
    """One message's bytes and the descriptors sent with its header (``attach`` carries the session's arena)."""
    head, fds, _flags, _addr = socket.recv_fds(sock, 8, 4)
    if not head:
        raise EOFError
    head += recv_exact(sock, 8 - len(head)) if len(head) < 8 else b""
    data = recv_exact(sock, int.from_bytes(head, "little"))
    return data, list(fds)


# ---------------------------------------------------------------------------- binary frames
class FrameError(ValueError):
    """A malformed binary frame (the worker answers it as an error; a session takes it for a broken worker)."""


# call: "C", the function's id, what the session has charged for the worker, the number of accounts in
# the budget (255: no budget) and of arguments; then each account (used, limit, name length, name) and
# each argument (a tag byte and its fields)
CallHead = Struct("tag" / Int8ul, "oid" / Int64ul, "charged" / Int64sl, "accounts" / Int8ul, "nargs" / Int16ul)
Account = Struct("used" / Int64sl, "limit" / Int64sl, "name_len" / Int8ul)
SharedHead = Struct("region" / Int8ul, "offset" / Int64ul, "ndim" / Int8ul, "dtype_len" / Int8ul)
# answer: "R", what the worker holds for the session, the value's tag, the value (8 bytes)
ResultFrame = Struct("tag" / Int8ul, "held" / Int64sl, "kind" / Int8ul, "value" / Int64ul)

CALL, ACCOUNT, SHARED, RESULT = (fixed_struct(c) for c in (CallHead, Account, SharedHead, ResultFrame))
CALL_TAG, RESULT_TAG = ord("C"), ord("R")
NO_BUDGET = 255
REGIONS = ("session", "worker")
_Q, _q, _d = struct.Struct("<Q"), struct.Struct("<q"), struct.Struct("<d")
MAX_NDIM = 64


def encode_call(oid: int, budget: Any, args: list) -> Optional[bytes]:
    """The binary frame of ``(budget, ("call", oid, args))``, or None when an argument needs pickle."""
    if len(args) > 0xFFFF:
        return None
    parts = []
    for a in args:
        t = type(a)
        if t is Shared:
            dtype = a.dtype.encode()
            if len(a.shape) > MAX_NDIM or len(a.strides) != len(a.shape) or len(dtype) > 255:
                return None
            parts += [b"S", SHARED.pack(REGIONS.index(a.region), a.offset, len(a.shape), len(dtype)), dtype,
                      struct.pack(f"<{2 * len(a.shape)}q", *a.shape, *a.strides)]
        elif t is bool:
            parts += [b"b", _q.pack(a)]
        elif t is int and -(1 << 63) <= a < (1 << 63):
            parts += [b"i", _q.pack(a)]
        elif t is float:
            parts += [b"f", _d.pack(a)]
        elif a is None:
            parts.append(b"n")
        elif t is Ref:
            parts += [b"r", _Q.pack(a.id)]
        else:
            return None
    if budget is None:
        return CALL.pack(CALL_TAG, oid, 0, NO_BUDGET, len(args)) + b"".join(parts)
    charged, accounts = budget
    if len(accounts) >= NO_BUDGET:
        return None
    head = [CALL.pack(CALL_TAG, oid, charged, len(accounts), len(args))]
    for name, used, limit in accounts:
        raw = name.encode()[:255]
        head += [ACCOUNT.pack(used, limit, len(raw)), raw]
    return b"".join(head + parts)


def decode_call(frame: bytes) -> tuple:
    """``(budget, ("call", oid, args))`` from a call frame (ValueError when it is malformed)."""
    budget, oid, nargs, at = decode_head(frame)
    return budget, ("call", oid, decode_args(frame, at, nargs))


def decode_head(frame: bytes) -> tuple[Any, int, int, int]:
    """``(budget, oid, number of arguments, where they start)`` of a call frame: a worker that has
    seen the same argument bytes before needs no more (``worker.WorkerState.call_frame``)."""
    try:
        _tag, oid, charged, n_accounts, nargs = CALL.unpack_from(frame, 0)
        at = CALL.size
        if n_accounts == NO_BUDGET:
            return None, oid, nargs, at
        accounts = []
        for _ in range(n_accounts):
            used, limit, name_len = ACCOUNT.unpack_from(frame, at)
            at += ACCOUNT.size
            accounts.append((_text(frame, at, name_len), used, limit))
            at += name_len
    except struct.error as exc:
        raise FrameError(f"truncated call frame ({exc})") from None
    return (charged, tuple(accounts)), oid, nargs, at


def decode_args(frame: bytes, at: int, nargs: int) -> list:
    """The ``nargs`` arguments of a call frame from offset ``at`` (ValueError when malformed)."""
    args: list = []
    try:
        for _ in range(nargs):
            tag = frame[at]
            at += 1
            if tag == 0x53:  # S
                region, offset, ndim, dtype_len = SHARED.unpack_from(frame, at)
                at += SHARED.size
                if region >= len(REGIONS):
                    raise FrameError(f"unknown shared region {region}")
                dtype = _text(frame, at, dtype_len)
                at += dtype_len
                dims = struct.unpack_from(f"<{2 * ndim}q", frame, at)
                at += 16 * ndim
                args.append(Shared(REGIONS[region], offset, dtype, dims[:ndim], dims[ndim:]))
            elif tag in (0x62, 0x69):  # b, i
                value = _q.unpack_from(frame, at)[0]
                args.append(bool(value) if tag == 0x62 else value)
                at += 8
            elif tag == 0x66:  # f
                args.append(_d.unpack_from(frame, at)[0])
                at += 8
            elif tag == 0x6E:  # n
                args.append(None)
            elif tag == 0x72:  # r
                args.append(Ref("fn", _Q.unpack_from(frame, at)[0], ""))
                at += 8
            else:
                raise FrameError(f"unknown argument tag {tag}")
    except (struct.error, IndexError) as exc:
        raise FrameError(f"truncated call frame ({exc})") from None
    if at != len(frame):
        raise FrameError(f"{len(frame) - at} stray bytes after a call frame")
    return args


def _text(frame: bytes, at: int, n: int) -> str:
    if at + n > len(frame):
        raise FrameError("truncated call frame (a name runs past its end)")
    try:
        return bytes(frame[at:at + n]).decode()
    except UnicodeDecodeError:
        raise FrameError("a name in a call frame is not UTF-8") from None


_KINDS = {type(None): 0, bool: 1, int: 2, float: 3}


def encode_result(answer: tuple) -> Optional[bytes]:
    """The binary frame of ``("ok", value, [], held)`` when the value is None, a bool, an int or a float."""
    status, value, outs, held = answer
    kind = _KINDS.get(type(value))
    if status != "ok" or outs or kind is None or (kind == 2 and not -(1 << 63) <= value < (1 << 63)):
        return None
    raw = _Q.unpack(_d.pack(value))[0] if kind == 3 else int(value or 0) & 0xFFFFFFFFFFFFFFFF
    return RESULT.pack(RESULT_TAG, held, kind, raw)


def decode_result(frame: bytes) -> tuple:
    """``("ok", value, [], held)`` from a result frame (ValueError when it is malformed)."""
    if len(frame) != RESULT.size:
        raise FrameError(f"a result frame of {len(frame)} bytes (expected {RESULT.size})")
    _tag, held, kind, raw = RESULT.unpack(frame)
    if kind == 0:
        value = None
    elif kind == 1:
        value = bool(raw)
    elif kind == 2:
        value = _q.unpack(_Q.pack(raw))[0]
    elif kind == 3:
        value = _d.unpack(_Q.pack(raw))[0]
    else:
        raise FrameError(f"unknown result kind {kind}")
    return ("ok", value, [], held)
