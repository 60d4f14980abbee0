"""TVM's RPC tracker and proxy control messages, sans-IO (facts from ``python/tvm/rpc/base.py``,
``tracker.py``, ``server.py``, ``proxy.py``).

Tracker wire shape:

* opening: the peer sends ``int32 RPC_TRACKER_MAGIC``; the tracker answers the same four bytes;
* then strictly request/answer: each message is ``int32 nbytes`` + UTF-8 JSON (a list whose first item
  is a :class:`TrackerCode`); the tracker answers each with one message of the same shape.  The
  tracker refuses sizes outside ``1..MAX_MESSAGE``.

What a board says (in TVM's server order):

* ``[UPDATE_INFO, {"key": "server:<key>", "addr": [custom_addr, port]}]`` → ``SUCCESS``: who we are;
  the tracker's ``summary()`` lists this dict, and only a connection that sent it has its queue entries
  removed when it closes (leaving cleanly = closing the connection);
* ``[PUT, key, [port, matchkey], custom_addr]`` → ``SUCCESS``: one free slot; the tracker hands
  ``[addr, port, matchkey]`` to the next client that requests ``key`` (addr is ``custom_addr`` or
  the address the tracker sees);
* ``[GET_PENDING_MATCHKEYS]`` → list of this connection's match keys still queued (TVM's server sends
  it every 2 s while idle, which doubles as its ping);
* the client then connects with ``client:<matchkey>``; the board accepts only that key and puts a
  fresh match key after the session (or when the handed-out key went unused for a while).

Proxy (``proxy.py``): the board opens a TCP connection to the proxy and sends the RPC handshake with
``server:<key>``; when a client with ``client:<key>`` arrives the proxy answers ``int32
RPC_CODE_SUCCESS`` + ``int32 len`` + the client's key (with its options) and forwards bytes both ways.
As ``RPC_CODE_SUCCESS == RPC_MAGIC``, that answer reads exactly like a client's handshake.
"""

from __future__ import annotations

import enum
import json
import random
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

from construct import GreedyBytes, Int32sl, Prefixed

from .codes import RPC_CODE_DUPLICATE, RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, RPC_TRACKER_MAGIC

MAX_MESSAGE = 1 << 20  # the tracker closes a connection that announces a bigger message
MAGIC_BYTES = struct.pack("<i", RPC_TRACKER_MAGIC)
Message = Prefixed(Int32sl, GreedyBytes)  # one framed JSON message
_I32 = struct.Struct("<i")


class TrackerCode(enum.IntEnum):
    FAIL = -1
    SUCCESS = 0
    PING = 1
    STOP = 2
    PUT = 3
    REQUEST = 4
    UPDATE_INFO = 5
    SUMMARY = 6
    GET_PENDING_MATCHKEYS = 7


class TrackerError(Exception):
    """The peer broke the tracker protocol (bad magic, bad size, bad JSON, unexpected answer)."""


# ---------------------------------------------------------------------------- framing
def encode(value: Any) -> bytes:
    """One framed message (the JSON text of ``value``)."""
    data = json.dumps(value).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise TrackerError(f"message of {len(data)} bytes exceeds the tracker's {MAX_MESSAGE}")
    return Message.build(data)


def check_magic(data: bytes) -> None:
    """The tracker's answer to our opening must be its magic."""
    if len(data) != 4 or _I32.unpack(data)[0] != RPC_TRACKER_MAGIC:
        raise TrackerError(f"not an RPC tracker (answered {bytes(data)!r} to the tracker magic)")


@dataclass
class MessageReader:
    """Feed bytes; take decoded JSON messages out (partial input is kept for the next feed)."""

    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (size,) = _I32.unpack_from(self._buf)
            if not 0 < size <= MAX_MESSAGE:
                raise TrackerError(f"message size {size} is outside 1..{MAX_MESSAGE}")
            if len(self._buf) < 4 + size:
                break
            body = bytes(self._buf[4:4 + size])
            del self._buf[:4 + size]
            try:
                out.append(json.loads(body.decode("utf-8")))
            except (UnicodeDecodeError, ValueError) as exc:
                raise TrackerError(f"message is not UTF-8 JSON: {exc}") from None
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)


# ---------------------------------------------------------------------------- messages
def update_info(key: str, port: int, custom_addr: Optional[str]) -> list:
    return [TrackerCode.UPDATE_INFO, {"key": "server:" + key, "addr": [custom_addr, port]}]


def put(key: str, port: int, matchkey: str, custom_addr: Optional[str]) -> list:
    return [TrackerCode.PUT, key, [port, matchkey], custom_addr]


def pending_matchkeys() -> list:
    return [TrackerCode.GET_PENDING_MATCHKEYS]


def ping() -> list:
    return [TrackerCode.PING]


def summary() -> list:
    return [TrackerCode.SUMMARY]


def request(key: str, user: str = "", priority: int = 1) -> list:
    return [TrackerCode.REQUEST, key, user, priority]


def expect_success(answer: Any, what: str) -> None:
    if answer != TrackerCode.SUCCESS:
        raise TrackerError(f"tracker refused {what}: answered {answer!r}")


def new_matchkey(key: str, used: set[str], rng: random.Random) -> str:
    """``<key>:<random>`` (the tracker splits at the last colon to find the key again)."""
    while True:
        candidate = f"{key}:{rng.random()}"
        if candidate not in used:
            return candidate


# ---------------------------------------------------------------------------- board policy
@dataclass
class BoardSlot:
    """A board's registration state: which match key is on offer, which was handed to a client.

    Pure bookkeeping, no I/O: the trio side asks it what to send and tells it what happened.

    * :meth:`offer` → the PUT for a fresh match key (on connect, after each session, on regeneration);
    * :meth:`admit` the ``client:<key>`` of a connecting client: only the key on offer opens a session
      (each key opens one), so a request the tracker matched reaches this board exactly once;
    * :meth:`on_pending` with the tracker's pending list: a key the tracker handed out but no client
      used for longer than ``unmatched_timeout`` is replaced (TVM's server does the same).
    """

    key: str
    port: int
    custom_addr: Optional[str] = None
    unmatched_timeout: float = 6.0
    rng: random.Random = field(default_factory=random.Random)
    matchkey: Optional[str] = None  # on offer (queued at the tracker or handed to a client)
    used: set = field(default_factory=set)
    busy: int = 0  # sessions opened through the tracker and still running
    _unmatched_since: Optional[float] = None

    def hello(self) -> list:
        return update_info(self.key, self.port, self.custom_addr)

    def offer(self) -> list:
        self.matchkey = new_matchkey(self.key, self.used, self.rng)
        self.used.add(self.matchkey)
        self._unmatched_since = None
        return put(self.key, self.port, self.matchkey, self.custom_addr)

    def admit(self, client_key: Optional[str]) -> bool:
        if client_key is None or self.matchkey is None or client_key != self.matchkey:
            return False
        self.matchkey = None
        self.busy += 1
        return True

    def session_done(self) -> None:
        self.busy = max(0, self.busy - 1)

    def on_pending(self, pending: Any, now: float) -> Optional[list]:
        """The PUT to send after a pending-keys answer, or None."""
        if not isinstance(pending, list):
            raise TrackerError(f"pending match keys should be a list, got {pending!r}")
        if self.matchkey is None or self.matchkey in pending:
            self._unmatched_since = None
            return None
        if self._unmatched_since is None:
            self._unmatched_since = now
            return None
        if now - self._unmatched_since > self.unmatched_timeout:
            return self.offer()
        return None


# ---------------------------------------------------------------------------- proxy handshake
def proxy_hello(key: str) -> bytes:
    """What a board behind a proxy sends first: the RPC magic and ``server:<key>``."""
    header = ("server:" + key).encode("utf-8")
    return _I32.pack(RPC_MAGIC) + _I32.pack(len(header)) + header


def proxy_answer_code(data: bytes) -> int:
    """Check the proxy's first four bytes: SUCCESS means a client's key follows; raise otherwise."""
    (code,) = _I32.unpack(data)
    if code == RPC_CODE_SUCCESS:
        return code
    if code == RPC_CODE_DUPLICATE:
        raise TrackerError("the proxy already has a board waiting under this key")
    if code == RPC_CODE_MISMATCH:
        raise TrackerError("the proxy found no client for this key before its timeout")
    raise TrackerError(f"not an RPC proxy (answered code 0x{code & 0xffffffff:x})")
