"""Sans-IO TVM RPC connection: feed it bytes, take events out; ask it for the bytes to send.

Modelled on h11: no sockets, no threads, no clocks.  The same class serves the server
(``Connection(Role.SERVER)``) and our client (``Connection(Role.CLIENT, dialect=...)``).

Wire shape (``rpc_endpoint.cc``, ``python/tvm/rpc/server.py``):

* handshake: client sends ``int32 RPC_MAGIC``, ``int32 len``, key ``"client:<key> [-opt=v ...]"``;
  server answers ``int32 RPC_CODE_SUCCESS`` then ``int32 len`` + ``"server:<key>"``, or
  ``int32 RPC_CODE_MISMATCH`` and closes;
* then packets: ``int64 nbytes`` followed by ``nbytes`` bytes starting with ``int32 RPCCode``.

This file frames packets and moves the protocol's state; the pieces it is made of each have their
file: the states and transitions as data (``states.py``, looked up through per-role tables made once
from them), one packet's bytes to an event (``parsing.py``), large packets received into regions as
they arrive (``regions.py``), and sending (``outgoing.py``).  A small packet that is all here (the
common case) is framed here straight from the buffer and handed to the parser whole.

Dialect: the two dialects are byte-identical until the first packed sequence that carries an argument,
so a server in auto mode detects the dialect there (:func:`detect_dialect`).  The kInitServer answer
comes before that point; in auto mode it is a Return with zero values, which both dialects' clients
parse and ignore (TVM's own server sends a void in its own dialect).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from .codec import MAX_NDIM, ProtocolError, Reader, Writer, decode_packed_seq, encode_packed_seq
from .codes import RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, Dialect
from .events import (NEED_DATA, CallFuncStart, ConnectionClosed, CopyToRemoteStart, Event, HandshakeDone,
                     HandshakeRefused, HandshakeRequest)
from .outgoing import PacketWriter
from .parsing import PacketParser
from .regions import CHUNK, PREFIX, STREAM_MIN, RegionReceiver
from .states import RECEIVE_MOVES, SEND_MOVES, STAY, LocalProtocolError, Role, State, refusal

__all__ = ["CHUNK", "DEFAULT_MAX_PACKET", "PREFIX", "RECV_INTO_MIN", "RECV_SIZE", "STREAM_MIN", "Connection",
           "decode_values", "encode_values"]

DEFAULT_MAX_PACKET = 1 << 32  # 4 GiB: larger packets are refused before any allocation
MAX_KEY_LEN = 4096

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
#: the states in which what arrives is packets (before: the handshake)
_FRAMED = frozenset({State.IDLE, State.ANSWERING, State.AWAITING, State.CLOSED})

# Reads, for every driver (see Connection.reads): small reads ask for RECV_SIZE bytes, because
# recv(n) allocates n bytes first (1 MB per call cost ~17 us of a ~45 us round trip: malloc maps and
# unmaps it); regions of RECV_INTO_MIN bytes and more are received in place (recv_into) instead.
RECV_SIZE = 1 << 16
RECV_INTO_MIN = 1 << 16


@dataclass
class Connection(RegionReceiver, PacketParser, PacketWriter):
    """One end of an RPC connection.

    Input: :meth:`receive_data` (bytes the socket gave) or, to skip a copy, :meth:`writable` +
    :meth:`advance` (``recv_into`` the region it names); then :meth:`next_event` until it returns
    :data:`NEED_DATA`.  Large copies stream straight into their destination: the server names it in
    answer to :class:`CopyToRemoteStart` (:meth:`set_copy_target`); the client names it before asking
    (:meth:`expect_copy_ack`).  A large call whose last argument is bytes (an upload) may stream those
    bytes in pieces through one reusable buffer (:class:`CallFuncStart`, :meth:`stream_call`).
    """

    role: Role
    dialect: Optional[Dialect] = None
    max_packet: int = DEFAULT_MAX_PACKET
    max_ndim: int = MAX_NDIM
    _buf: bytearray = field(default_factory=bytearray)
    _pos: int = 0
    strict: bool = True  # check states and transitions (False: a plain codec, for tools and tests)
    _state: State = State.HANDSHAKE
    # current packet: phase is None (awaiting length), "prefix", "packet", "grow", "target", "discard",
    # "await", "chunks", "end"
    _phase: Optional[str] = None
    _total: int = 0
    _region_buf: Optional[memoryview] = None
    _filled: int = 0
    _prefix: bytes = b""
    _copy: Optional[CopyToRemoteStart] = None
    _call: Optional[CallFuncStart] = None
    _whole_prefix: bytes = b""
    _streamed: int = 0
    _discard_error: str = ""
    _ack_target: Optional[memoryview] = None
    _eof: bool = False
    _closed_event: Optional[ConnectionClosed] = None
    _body: bytearray = field(default_factory=bytearray)  # a large packet received whole, so far
    #: the last small packet parsed, length prefix included, as received (None after a large one):
    #: the bytes a repeated request is known by (``rpcsrv.board.baton``)
    last_packet: Optional[bytes] = None
    _calls: dict = field(default_factory=dict)  # call packets decoded, by their bytes (``parsing.py``)
    _lent: bool = False  # the socket is with a borrower (``lend``)

    def __post_init__(self):
        # this end's transitions, per state: what a received event type and a sent action lead to
        self._receive_moves = RECEIVE_MOVES[(self.role, self.strict)]
        self._send_moves = SEND_MOVES[(self.role, self.strict)]

    # -- input
    def receive_data(self, data) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if self._region_buf is None and self._pos == len(self._buf):  # the common case: nothing pending
            if self._pos:
                self._buf.clear()
                self._pos = 0
            self._buf += data
            return
        mv = memoryview(data).cast("B")
        region = self.writable()
        if region is not None:
            n = min(len(mv), len(region))
            region[:n] = mv[:n]
            self.advance(n)
            mv = mv[n:]
        if mv:
            if self._pos and self._pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
            self._buf += mv

    def reads(self):
        """The receive loop every driver shares, as a generator: it yields what to read next — a
        byte count (``recv`` that many and send the bytes back) or a memoryview (``recv_into`` it and
        send back the count) — and returns the next event.  A sync driver::

            steps = conn.reads()
            try:
                want = next(steps)
                while True:
                    want = steps.send(sock.recv(want) if type(want) is int else sock.recv_into(want))
            except StopIteration as done:
                event = done.value
        """
        while True:
            ev = self.next_event()
            if ev is not NEED_DATA:
                return ev
            region = self.writable()
            if region is not None and len(region) >= RECV_INTO_MIN:
                n = yield region
                if n:
                    self.advance(n)
                else:
                    self.receive_data(b"")
            else:
                self.receive_data((yield RECV_SIZE))

    def drained(self) -> bool:
        """Nothing received is left to parse (no request read ahead, none half read, no close or
        failure pending): the next event needs bytes from the socket first."""
        return (self._pos == len(self._buf) and self._phase is None and self._region_buf is None
                and not self._eof and self._closed_event is None)

    def _avail(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        return out

    def _fail(self, error: str) -> ConnectionClosed:
        self._state = State.CLOSED
        self._closed_event = ConnectionClosed(clean=False, error=error)
        return self._closed_event

    @property
    def state(self) -> State:
        """Where this end is in the protocol (see :mod:`rpcsrv.protocol.states`)."""
        return self._state

    def _go(self, action: str) -> None:
        """Move on a local action (what this end sends); LocalProtocolError when not allowed."""
        new = self._send_moves[self._state].get(action)
        if new is not None:
            self._state = new
        elif self.strict:
            raise refusal(self.role, self._state, action)

    def next_event(self) -> Event:
        """The next complete event, :data:`NEED_DATA`, or :class:`ConnectionClosed`.

        Raises LocalProtocolError on a server that still owes the answer to the last request."""
        if self._state is State.ANSWERING and self.strict:
            raise LocalProtocolError("the server must answer the last request before reading the next")
        ev = self._next_event()
        if ev is NEED_DATA:
            return ev
        return self._moved(ev)

    def next_event_in(self, data: bytes) -> Event:
        """:meth:`receive_data` then :meth:`next_event`, for bytes read while :meth:`drained`: when they are
        one whole small packet (the common case: a request, read by one ``recv``), its event straight from
        them, never copied into the buffer (the bytes it is known by are ``data`` itself)."""
        if type(data) is bytes and len(data) >= 8 and self._state in _FRAMED and self.drained():
            (n,) = _I64.unpack_from(data)
            if 4 <= n < STREAM_MIN and len(data) == 8 + n and n <= self.max_packet:
                if self._state is State.ANSWERING and self.strict:
                    raise LocalProtocolError("the server must answer the last request before reading the next")
                self.last_packet = data
                ev = self._calls.get(data)  # the same call again: decoded once
                return self._moved(ev if ev is not None else self._parse_packet(memoryview(data)[8:], data))
        self.receive_data(data)
        return self.next_event()

    def _moved(self, ev: Event) -> Event:
        """``ev``, received: the state it leads to taken (or the connection failed, when not allowed)."""
        new = self._receive_moves[self._state].get(type(ev), STAY)
        if new is STAY:
            return ev
        if new is None:
            peer = "client" if self.role is Role.SERVER else "server"
            return self._fail(f"the {peer} sent {type(ev).__name__} in state {self._state.value!r}")
        self._state = new
        return ev

    def _next_event(self) -> Event:
        if self._phase is None and self._state in _FRAMED and self._closed_event is None:
            pos = self._pos  # framing the next packet: the common case is a whole small one, here
            avail = len(self._buf) - pos
            if avail < 8:
                return self._eof_event(avail == 0)
            (n,) = _I64.unpack_from(self._buf, pos)
            if n < 4 or n > self.max_packet:
                return self._fail(f"packet length {n} is outside 4..{self.max_packet}")
            start = pos + 8
            if n < STREAM_MIN and avail >= 8 + n:
                raw = bytes(self._buf[pos:start + n])  # a copy: events may keep views into it
                self.last_packet = raw
                self._pos = start + n
                if self._pos > 65536 and self._pos * 2 > len(self._buf):
                    del self._buf[:self._pos]
                    self._pos = 0
                ev = self._calls.get(raw)  # the same call again (a loop, a tuner): decoded once
                if ev is not None:
                    return ev
                return self._parse_packet(memoryview(raw)[8:], raw)
            self.last_packet = None
            self._pos = start
            self._start_large(n)
        if self._closed_event is not None:
            return self._closed_event
        if self._state is State.HANDSHAKE:
            return self._next_handshake()
        if self._state is State.AWAIT_ACCEPT:
            return NEED_DATA
        return self._next_in_region()

    def _eof_event(self, at_boundary: bool) -> Event:
        if not self._eof:
            return NEED_DATA
        if at_boundary and self._phase is None:
            self._closed_event = ConnectionClosed(clean=True)
        else:
            self._closed_event = ConnectionClosed(clean=False, error="peer closed in the middle of a packet")
        self._state = State.CLOSED
        return self._closed_event

    def _next_handshake(self) -> Event:
        if self._avail() < 4:
            return self._eof_event(False) if self._avail() else self._eof_event(True)
        (magic,) = _I32.unpack_from(self._buf, self._pos)
        if self.role is Role.CLIENT and magic != RPC_MAGIC:
            self._take(4)
            return self._fail_refused(magic)
        if magic != RPC_MAGIC:
            return self._fail(f"bad magic 0x{magic & 0xffffffff:x} (expected 0x{RPC_MAGIC:x})")
        if self._avail() < 8:
            return self._eof_event(False)
        (klen,) = _I32.unpack_from(self._buf, self._pos + 4)
        if not 0 <= klen <= MAX_KEY_LEN:
            return self._fail(f"key length {klen} is outside 0..{MAX_KEY_LEN}")
        if self._avail() < 8 + klen:
            return self._eof_event(False)
        self._take(8)
        try:
            key = self._take(klen).decode("utf-8")
        except UnicodeDecodeError:
            return self._fail("key is not UTF-8")
        if self.role is Role.SERVER:
            return HandshakeRequest(key)
        return HandshakeDone(key)

    def _fail_refused(self, code: int) -> Event:
        self._closed_event = ConnectionClosed(clean=False, error=f"server refused the handshake (code {code})")
        return HandshakeRefused(code)

    # -- output
    def accept(self, server_key: str = "") -> bytes:
        """(server) Accept the handshake, answering ``server:<server_key>``."""
        self._go("accept")
        key = f"server:{server_key}".encode()
        return _I32.pack(RPC_CODE_SUCCESS) + _I32.pack(len(key)) + key

    def refuse(self) -> bytes:
        """(server) Refuse the handshake (key mismatch); the caller then closes."""
        self._go("refuse")
        self._closed_event = ConnectionClosed(clean=True)
        return _I32.pack(RPC_CODE_MISMATCH)

    # -- a loan of the socket
    def lend(self) -> None:
        """(server) The socket goes to a borrower that answers requests it has recorded byte for byte (a
        backend, for repeated native calls: ``rpcsrv.board.baton``).  Only between requests, with nothing
        buffered: the borrower moves no state (each request it takes it answers whole), and until
        :meth:`take_back` this end reads nothing."""
        if self._state is not State.IDLE or not self.drained() or self._lent:
            raise LocalProtocolError("the connection can only be lent between requests, with nothing buffered")
        self._lent = True

    def take_back(self, unread: bytes = b"") -> None:
        """(server) The socket is back; ``unread``: what the borrower read of a request it did not answer,
        which this end now reads as if from the socket."""
        if not self._lent:
            raise LocalProtocolError("the connection was not lent")
        self._lent = False
        if unread:
            self.receive_data(unread)

    def start(self, key: str = "") -> bytes:
        """(client) The opening bytes: magic and ``client:<key>``."""
        self._go("hello")
        header = f"client:{key}".encode()
        return _I32.pack(RPC_MAGIC) + _I32.pack(len(header)) + header


def encode_values(values: list, dialect: Dialect) -> bytes:
    """A packed sequence as one bytes object (for tests and tools)."""
    w = Writer()
    encode_packed_seq(w, values, dialect)
    return b"".join(bytes(p) for p in w.finish())


def decode_values(data, dialect: Dialect) -> list:
    """Decode a whole buffer holding exactly one packed sequence."""
    r = Reader(memoryview(data))
    values = decode_packed_seq(r, dialect)
    if r.remaining:
        raise ProtocolError(f"{r.remaining} unexpected bytes after the arguments")
    return values

