"""Sans-IO TVM RPC connection: feed it bytes, take events out; ask it for the bytes to send.

Modelled on h11: no sockets, no threads, no clocks.  The same class serves the server
(``Connection(Role.SERVER)``) and our client (``Connection(Role.CLIENT, dialect=...)``).

Wire shape (``rpc_endpoint.cc``, ``python/tvm/rpc/server.py``):

* handshake: client sends ``int32 RPC_MAGIC``, ``int32 len``, key ``"client:<key> [-opt=v ...]"``;
  server answers ``int32 RPC_CODE_SUCCESS`` then ``int32 len`` + ``"server:<key>"``, or
  ``int32 RPC_CODE_MISMATCH`` and closes;
* then packets: ``int64 nbytes`` followed by ``nbytes`` bytes starting with ``int32 RPCCode``.

This file holds the connection's state and its input, and moves the state; the pieces it is made of each
have their file: the states and transitions as data (``states.py``, looked up through per-role tables made
once from them), reading, one reader object per phase chosen from a table (``readers.py``, as h11's
``_readers.py``: the handshake, framing, and large packets received into regions as they arrive), one
packet's bytes to an event (``parsing.py``), and sending (``outgoing.py``).  A small packet that is all
here (the common case) is framed straight from the buffer, or from the bytes as read
(:meth:`Connection.next_event_in`), by one rule (``readers.small_packet``), and handed to the parser whole.

A server may lend its socket, between requests, to a borrower that answers requests it recorded byte for
byte (:meth:`Connection.lend`, :meth:`Connection.take_back`: ``rpcsrv.board.baton``): the protocol's state
stays here, in one place.

Dialect: the two dialects are byte-identical until the first packed sequence that carries an argument,
so a server in auto mode detects the dialect there (:func:`detect_dialect`).  The kInitServer answer
comes before that point; in auto mode it is a Return with zero values, which both dialects' clients
parse and ignore (TVM's own server sends a void in its own dialect).
"""

from __future__ import annotations

import struct
from typing import Optional

from .codec import MAX_NDIM, ProtocolError, Reader, Writer, decode_packed_seq, encode_packed_seq
from .codes import RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, Dialect
from .events import NEED_DATA, ConnectionClosed, Event, HandshakeRefused
from .outgoing import PacketWriter
from .parsing import PacketParser
from .readers import AGAIN, CHUNK, LENT, PREFIX, READERS, STREAM_MIN, Awaiting
from .states import RECEIVE_MOVES, SEND_MOVES, STAY, LocalProtocolError, Role, State, refusal

__all__ = ["CHUNK", "DEFAULT_MAX_PACKET", "PREFIX", "RECV_INTO_MIN", "RECV_SIZE", "STREAM_MIN", "Connection",
           "decode_values", "encode_values"]

DEFAULT_MAX_PACKET = 1 << 32  # 4 GiB: larger packets are refused before any allocation

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
#: the states in which what arrives is packets (before: the handshake)
_FRAMED = frozenset({State.IDLE, State.ANSWERING, State.AWAITING, State.CLOSED})

# Reads, for every driver (see Connection.reads): small reads ask for RECV_SIZE bytes, because
# recv(n) allocates n bytes first (1 MB per call cost ~17 us of a ~45 us round trip: malloc maps and
# unmaps it); regions of RECV_INTO_MIN bytes and more are received in place (recv_into) instead.
RECV_SIZE = 1 << 16
RECV_INTO_MIN = 1 << 16


class Connection(PacketParser, PacketWriter):
    """One end of an RPC connection.

    Input: :meth:`receive_data` (bytes the socket gave) or, to skip a copy, :meth:`writable` +
    :meth:`advance` (``recv_into`` the region it names); then :meth:`next_event` until it returns
    :data:`NEED_DATA`.  Large copies stream straight into their destination: the server names it in
    answer to :class:`CopyToRemoteStart` (:meth:`set_copy_target`); the client names it before asking
    (:meth:`expect_copy_ack`).  A large call whose last argument is bytes (an upload) may stream those
    bytes in pieces through one reusable buffer (:class:`CallFuncStart`, :meth:`stream_call`).
    ``strict`` False: a plain codec, for tools and tests (follows the handshake, refuses nothing).
    """

    def __init__(self, role: Role, dialect: Optional[Dialect] = None, max_packet: int = DEFAULT_MAX_PACKET,
                 max_ndim: int = MAX_NDIM, strict: bool = True):
        self.role, self.dialect, self.max_packet, self.max_ndim = role, dialect, max_packet, max_ndim
        self.strict = strict
        self._buf = bytearray()  # received bytes, read from ``_pos``
        self._pos = 0
        self._state = State.HANDSHAKE
        #: what reads a packet under way (``readers.py``: a region reader, the loan's); None between packets,
        #: where the state's reader (``READERS``) reads on
        self._reader = None
        self._eof = False
        self._closed_event: Optional[ConnectionClosed] = None
        self._ack_target: Optional[memoryview] = None  # (client) where the next kCopyAck body goes
        #: the last small packet parsed, length prefix included, as received (None after a large one):
        #: the bytes a repeated request is known by (``rpcsrv.board.baton``)
        self.last_packet: Optional[bytes] = None
        self._calls: dict = {}  # call packets decoded, by their bytes (``parsing.py``)
        # this end's transitions, per state: what a received event type and a sent action lead to
        self._receive_moves = RECEIVE_MOVES[(role, strict)]
        self._send_moves = SEND_MOVES[(role, strict)]

    # -- input
    def receive_data(self, data) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if self._pos == len(self._buf) and self._reader is None:  # the common case: nothing pending
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

    def writable(self) -> Optional[memoryview]:
        """The memory the next received bytes belong in (for ``recv_into``), or None."""
        return None if len(self._buf) - self._pos or self._reader is None else self._reader.region()

    def advance(self, n: int) -> None:
        """``n`` bytes were received into :meth:`writable`'s region."""
        self._reader.filled += n

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
        return (self._pos == len(self._buf) and self._reader is None and not self._eof
                and self._closed_event is None)

    @property
    def state(self) -> State:
        """Where this end is in the protocol (see :mod:`rpcsrv.protocol.states`)."""
        return self._state

    def next_event(self) -> Event:
        """The next complete event, :data:`NEED_DATA`, or :class:`ConnectionClosed`.

        Raises LocalProtocolError on a server that still owes the answer to the last request."""
        if self._state is State.ANSWERING and self.strict:
            raise LocalProtocolError("the server must answer the last request before reading the next")
        if self._closed_event is not None:
            return self._closed_event
        ev = AGAIN
        while ev is AGAIN:
            ev = (self._reader or READERS[self._state]).next(self)
        if ev is NEED_DATA:
            return ev
        return self._moved(ev)

    def next_event_in(self, data: bytes) -> Event:
        """:meth:`receive_data` then :meth:`next_event`, for bytes read while :meth:`drained`: when they are
        one whole small packet (the common case: a request, read by one ``recv``), its event straight from
        them, never copied into the buffer (the bytes it is known by are ``data`` itself)."""
        if type(data) is bytes and self._state in _FRAMED and self.drained() and self._small(data, 0) == len(data) - 8:
            if self._state is State.ANSWERING and self.strict:
                raise LocalProtocolError("the server must answer the last request before reading the next")
            return self._moved(self._packet(data))
        self.receive_data(data)
        return self.next_event()

    # -- what the readers ask of the connection
    def _small(self, buf, pos: int) -> int:
        """The framing rule for the common case: the length of the packet at ``pos`` of ``buf`` when it is small
        (under ``STREAM_MIN``, within ``max_packet``) and all in ``buf``, else -1 (a region reads it, or a
        reader refuses its length).  Applied to the buffer (``readers.Framing``) and to bytes as read."""
        if len(buf) - pos >= 8:
            (n,) = _I64.unpack_from(buf, pos)
            if 4 <= n < STREAM_MIN and n <= self.max_packet and len(buf) - pos >= 8 + n:
                return n
        return -1

    def _packet(self, raw: bytes) -> Event:
        """The event of the small packet ``raw`` (its length prefix included): a call the client repeats (a
        loop, a tuner, ``lib["f"]`` lookups) is decoded once, and known by its bytes."""
        self.last_packet = raw
        ev = self._calls.get(raw)
        return ev if ev is not None else self._parse_packet(memoryview(raw)[8:], raw)

    def _take_packet(self, n: int) -> None:
        """Consume ``n`` buffered bytes (the buffer is trimmed once most of it is read)."""
        self._pos += n
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos:self._pos + n])
        self._take_packet(n)
        return out

    def _fill(self, reader) -> None:
        """Move buffered bytes into ``reader``'s region (repeatedly while a refused copy is dropped: its
        region is reused, so one pass may not take everything buffered)."""
        while len(self._buf) - self._pos:
            region = reader.region()
            if not region:
                return
            n = min(len(region), len(self._buf) - self._pos)
            region[:n] = self._buf[self._pos:self._pos + n]
            self._pos += n
            reader.filled += n

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

    def _go(self, action: str) -> None:
        """Move on a local action (what this end sends); LocalProtocolError when not allowed."""
        new = self._send_moves[self._state].get(action)
        if new is not None:
            self._state = new
        elif self.strict:
            raise refusal(self.role, self._state, action)

    def _fail(self, error: str) -> ConnectionClosed:
        self._state = State.CLOSED
        self._closed_event = ConnectionClosed(clean=False, error=error)
        return self._closed_event

    def _fail_refused(self, code: int) -> Event:
        self._closed_event = ConnectionClosed(clean=False, error=f"server refused the handshake (code {code})")
        return HandshakeRefused(code)

    def _eof_event(self, at_boundary: bool) -> Event:
        if not self._eof:
            return NEED_DATA
        if at_boundary and self._reader is None:
            self._closed_event = ConnectionClosed(clean=True)
        else:
            self._closed_event = ConnectionClosed(clean=False, error="peer closed in the middle of a packet")
        self._reader = None
        self._state = State.CLOSED
        return self._closed_event

    # -- where a large packet's body goes (the server's decisions, the client's copy target)
    def _awaiting(self) -> Awaiting:
        if type(self._reader) is not Awaiting:
            raise LocalProtocolError("no large request is waiting for a decision")
        return self._reader

    def set_copy_target(self, target: Optional[memoryview], error: str = "") -> None:
        """(server) Where the announced kCopyToRemote body goes; None (with ``error``) discards it."""
        self._reader = self._awaiting().into(target, error)

    def stream_call(self, accept: bool) -> None:
        """(server) Answer :class:`CallFuncStart`: stream the trailing bytes in pieces (True) or
        receive the whole call as one :class:`CallFunc` (False)."""
        self._reader = self._awaiting().streamed(accept)

    def expect_copy_ack(self, target: Optional[memoryview]) -> None:
        """(client) Receive the next kCopyAck body straight into ``target`` (its exact size); None
        forgets a target named before."""
        self._ack_target = target.cast("B") if target is not None and target.format != "B" else target

    # -- a loan of the socket
    def lend(self) -> None:
        """(server) The socket goes to a borrower that answers requests it has recorded byte for byte (a
        backend, for repeated native calls: ``rpcsrv.board.baton``).  Only between requests, with nothing
        buffered: the borrower moves no state (each request it takes it answers whole), and until
        :meth:`take_back` this end reads nothing."""
        if self._state is not State.IDLE or not self.drained():
            raise LocalProtocolError("the connection can only be lent between requests, with nothing buffered")
        self._reader = LENT

    def take_back(self, unread: bytes = b"") -> None:
        """(server) The socket is back; ``unread``: what the borrower read of a request it did not answer,
        which this end now reads as if from the socket."""
        if self._reader is not LENT:
            raise LocalProtocolError("the connection was not lent")
        self._reader = None
        if unread:
            self.receive_data(unread)

    # -- the handshake's answers
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

