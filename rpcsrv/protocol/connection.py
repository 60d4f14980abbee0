"""Sans-IO TVM RPC connection: feed it bytes, take events out; ask it for the bytes to send.

Modelled on h11: no sockets, no threads, no clocks.  The same class serves the server
(``Connection(Role.SERVER)``) and our client (``Connection(Role.CLIENT, dialect=...)``).

Wire shape (``rpc_endpoint.cc``, ``python/tvm/rpc/server.py``):

* handshake: client sends ``int32 RPC_MAGIC``, ``int32 len``, key ``"client:<key> [-opt=v ...]"``;
  server answers ``int32 RPC_CODE_SUCCESS`` then ``int32 len`` + ``"server:<key>"``, or
  ``int32 RPC_CODE_MISMATCH`` and closes;
* then packets: ``int64 nbytes`` followed by ``nbytes`` bytes starting with ``int32 RPCCode``.

Why one file of ~500 lines: receiving is one state machine over the phases of a packet (length,
prefix, whole body growing as it arrives, copy target, streamed pieces, discard); its pieces share
the buffer and region bookkeeping, and split across files they would only be harder to follow.  The
protocol states and transitions are data in ``states.py``, sending is ``outgoing.py``.

Dialect: the two dialects are byte-identical until the first packed sequence that carries an argument,
so a server in auto mode detects the dialect there (:func:`detect_dialect`).  The kInitServer answer
comes before that point; in auto mode it is a Return with zero values, which both dialects' clients
parse and ignore (TVM's own server sends a void in its own dialect).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from .codec import (MAX_NDIM, ProtocolError, Reader, Writer, decode_packed_seq, detect_dialect, encode_packed_seq,
                    split_trailing_bytes)
from .codes import (RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, SYSCALL_START,
                    Dialect, RPCCode)
from .events import (NEED_DATA, BadPacket, CallFunc, CallFuncChunk, CallFuncEnd, CallFuncStart,
                     ConnectionClosed, CopyAck, CopyFromRemote,
                     CopyToRemote, CopyToRemoteStart, Event, HandshakeDone, HandshakeRefused,
                     HandshakeRequest, InitServer, RemoteError, Return, Shutdown, Syscall)
from .outgoing import PacketWriter
from .states import (ALWAYS_TRACKED, CLIENT_RECEIVES, SENDS, SERVER_RECEIVES, TRANSITIONS_GET, LocalProtocolError,
                     Role, State, advance)

DEFAULT_MAX_PACKET = 1 << 32  # 4 GiB: larger packets are refused before any allocation
MAX_KEY_LEN = 4096

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


# ----------------------------------------------------------------------------- connection

PREFIX = 512  # bytes of a large packet read before deciding where its body goes
STREAM_MIN = 1 << 16  # packets at least this large may stream their body into a target
CHUNK = 1 << 20  # size of the pieces a streamed call's trailing bytes arrive in
# Reads, for every driver (see Connection.reads): small reads ask for RECV_SIZE bytes, because
# recv(n) allocates n bytes first (1 MB per call cost ~17 us of a ~45 us round trip: malloc maps and
# unmaps it); regions of RECV_INTO_MIN bytes and more are received in place (recv_into) instead.
RECV_SIZE = 1 << 16
RECV_INTO_MIN = 1 << 16


@dataclass
class Connection(PacketWriter):
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

    # -- input
    def receive_data(self, data) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if not self._avail() and self._region() is None:  # the common case: nothing pending
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

    def writable(self) -> Optional[memoryview]:
        """The memory the next received bytes belong in (for ``recv_into``), or None."""
        return None if self._avail() else self._region()

    def _region(self) -> Optional[memoryview]:
        if self._region_buf is None or self._phase in (None, "await", "end"):
            return None
        if self._phase == "discard":
            return self._region_buf[:min(len(self._region_buf), self._total - self._filled)]
        return self._region_buf[self._filled:self._region_size()]

    def _region_size(self) -> int:
        """Bytes the current region holds when complete."""
        if self._phase == "discard":
            return self._total
        if self._phase == "chunks":
            return min(len(self._region_buf), self._total - self._streamed)
        if self._phase == "grow":
            return min(len(self._region_buf), self._total - len(self._body))
        return len(self._region_buf)

    def advance(self, n: int) -> None:
        """``n`` bytes were received into :meth:`writable`'s region."""
        self._filled += n

    def set_copy_target(self, target: Optional[memoryview], error: str = "") -> None:
        """(server) Where the announced kCopyToRemote body goes; None (with ``error``) discards it."""
        assert self._phase == "await" and self._copy is not None
        extra = self._prefix
        if target is None or len(target) != self._copy.nbytes:
            self._phase, self._region_buf = "discard", memoryview(bytearray(min(self._total, 1 << 20)))
            self._total, self._filled = self._copy.nbytes, len(extra)
            self._discard_error = error or "copy target rejected"
            return
        target = target.cast("B") if target.format != "B" else target
        target[:len(extra)] = extra
        self._phase, self._region_buf, self._filled = "target", target, len(extra)

    def stream_call(self, accept: bool) -> None:
        """(server) Answer :class:`CallFuncStart`: stream the trailing bytes in pieces (True) or
        receive the whole call as one :class:`CallFunc` (False)."""
        assert self._phase == "await" and self._call is not None
        if accept:
            extra = self._prefix
            scratch = bytearray(min(CHUNK, self._call.nbytes))
            scratch[:len(extra)] = extra
            self._phase, self._region_buf, self._filled = "chunks", memoryview(scratch), len(extra)
            self._total, self._streamed = self._call.nbytes, 0
            return
        self._call = None
        self._receive_whole(self._whole_prefix)

    def _receive_whole(self, prefix: bytes) -> None:
        """Receive the rest of a large packet whole, in memory that grows only as its bytes arrive:
        each piece lands in a scratch buffer of at most CHUNK bytes and is appended to the body, so a
        header claiming gigabytes costs nothing until the gigabytes are really sent."""
        self._body = bytearray(prefix)
        scratch = bytearray(min(CHUNK, self._total - len(prefix)))
        self._phase, self._region_buf, self._filled = "grow", memoryview(scratch), 0

    def expect_copy_ack(self, target: Optional[memoryview]) -> None:
        """(client) Receive the next kCopyAck body straight into ``target`` (its exact size); None
        forgets a target named before."""
        self._ack_target = target.cast("B") if target is not None and target.format != "B" else target

    def _avail(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        return out

    def _fill_from_buffer(self) -> None:
        """Move buffered bytes into the current region (repeatedly while discarding: the discard
        region is reused, so one pass may not take everything buffered)."""
        while self._avail():
            region = self._region()
            if not region:
                return
            n = min(len(region), self._avail())
            region[:n] = self._buf[self._pos:self._pos + n]
            self._pos += n
            self._filled += n

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
        if self.strict:
            if action not in SENDS[self.role]:
                raise LocalProtocolError(f"a {self.role.value} does not send a {action}")
            self._state = advance(self.role, self._state, action)
        elif action in ALWAYS_TRACKED:  # a codec: follows the handshake, never refuses
            self._state = TRANSITIONS_GET((self.role, self._state, action), self._state)

    def next_event(self) -> Event:
        """The next complete event, :data:`NEED_DATA`, or :class:`ConnectionClosed`.

        Raises LocalProtocolError on a server that still owes the answer to the last request."""
        if self._state is State.ANSWERING and self.strict:
            raise LocalProtocolError("the server must answer the last request before reading the next")
        ev = self._next_event()
        if ev is NEED_DATA:
            return ev
        action = (SERVER_RECEIVES if self.role is Role.SERVER else CLIENT_RECEIVES).get(type(ev))
        if action is None:
            return ev
        if not self.strict:
            if action in ALWAYS_TRACKED:
                self._state = TRANSITIONS_GET((self.role, self._state, action), self._state)
            return ev
        if action == "answer" and self._state is State.IDLE and isinstance(ev, RemoteError):
            action = "notice"  # an exception the server sent unasked (timeout, shutdown)
        new = TRANSITIONS_GET((self.role, self._state, action))
        if new is None:
            peer = "client" if self.role is Role.SERVER else "server"
            return self._fail(f"the {peer} sent {type(ev).__name__} in state {self._state.value!r}")
        self._state = new
        return ev

    def _next_event(self) -> Event:
        if self._closed_event is not None:
            return self._closed_event
        if self._state is State.HANDSHAKE:
            return self._next_handshake()
        if self._state is State.AWAIT_ACCEPT:
            return NEED_DATA
        while True:
            if self._phase is None:
                avail = len(self._buf) - self._pos
                if avail < 8:
                    return self._eof_event(avail == 0)
                (n,) = _I64.unpack_from(self._buf, self._pos)
                if n < 4 or n > self.max_packet:
                    return self._fail(f"packet length {n} is outside 4..{self.max_packet}")
                if n < STREAM_MIN and avail >= 8 + n:  # a whole small packet is here (the common case)
                    start = self._pos + 8
                    packet = self._buf[start:start + n]  # a copy: events may keep views into it
                    self._pos = start + n
                    if self._pos > 65536 and self._pos * 2 > len(self._buf):
                        del self._buf[:self._pos]
                        self._pos = 0
                    return self._parse_packet(packet)
                self._pos += 8
                self._total = n
                streamed = n >= STREAM_MIN
                self._start_region("prefix" if streamed else "packet", bytearray(PREFIX if streamed else n))
            if self._phase == "await":
                return NEED_DATA
            if self._phase == "end":
                call, self._call = self._call, None
                self._phase = self._region_buf = None
                return CallFuncEnd(call.handle)
            self._fill_from_buffer()
            size = self._region_size()
            if self._filled < size:
                return self._eof_event(False)
            event = self._region_complete()
            if event is not None:
                return event

    def _start_region(self, phase: str, buf) -> None:
        self._phase, self._region_buf, self._filled = phase, memoryview(buf), 0

    def _region_complete(self) -> Optional[Event]:
        phase, region = self._phase, self._region_buf
        if phase == "packet":
            self._phase = self._region_buf = None
            return self._parse_packet(region.obj if isinstance(region.obj, bytearray) else bytearray(region))
        if phase == "prefix":
            return self._prefix_complete(bytes(region))
        if phase == "grow":
            self._body += region[:self._filled]
            self._filled = 0
            if len(self._body) < self._total:
                return None
            body, self._body = self._body, bytearray()
            self._phase = self._region_buf = None
            return self._parse_packet(body)
        if phase == "chunks":
            chunk, n = region[:self._filled], self._filled
            self._streamed += n
            self._filled = 0
            if self._streamed == self._total:
                self._phase = "end"
            return CallFuncChunk(chunk)
        if phase == "target":
            self._phase = self._region_buf = None
            if self._copy is not None:
                copy, self._copy = self._copy, None
                return CopyToRemote(copy.tensor, copy.nbytes, region, in_place=True)
            return CopyAck(region)
        # discard
        self._phase = self._region_buf = None
        copy, self._copy = self._copy, None
        return BadPacket(RPCCode.COPY_TO_REMOTE, self._discard_error)

    def _prefix_complete(self, prefix: bytes) -> Optional[Event]:
        (code,) = _I32.unpack_from(prefix)
        if code == RPCCode.COPY_ACK and self._ack_target is not None \
                and len(self._ack_target) == self._total - 4:
            target, self._ack_target = self._ack_target, None
            target[:len(prefix) - 4] = prefix[4:]
            self._phase, self._region_buf, self._filled = "target", target, len(prefix) - 4
            return None
        if code == RPCCode.COPY_TO_REMOTE and self.role is Role.SERVER:
            r = Reader(prefix, max_ndim=self.max_ndim)
            r.pos = 4
            try:
                tensor = r.tensor()
                nbytes = r.u64("copy size")
            except ProtocolError:
                tensor = None
            if tensor is not None and nbytes == self._total - r.pos:
                self._copy = CopyToRemoteStart(tensor, nbytes)
                self._prefix = prefix[r.pos:]
                self._phase, self._region_buf = "await", None
                return self._copy
        if code == RPCCode.CALL_FUNC and self.role is Role.SERVER and self.dialect is not None:
            (handle,) = _U64.unpack_from(prefix, 4)
            head = split_trailing_bytes(prefix, 12, self.dialect, self._total)
            if head is not None:
                args, start = head
                self._call = CallFuncStart(handle, args, self._total - start)
                self._prefix, self._whole_prefix = prefix[start:], prefix
                self._phase, self._region_buf = "await", None
                return self._call
        self._receive_whole(prefix)
        return None

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

    def _seq(self, packet, offset: int) -> list:
        r = Reader(packet, offset, max_ndim=self.max_ndim)
        if self.dialect is None:
            self.dialect = detect_dialect(packet, offset)
        try:
            values = decode_packed_seq(r, self.wire_dialect)
        except ProtocolError:
            self._other_dialect(packet, offset)
            raise
        if r.remaining:
            self._other_dialect(packet, offset)
            raise ProtocolError(f"{r.remaining} unexpected bytes after the arguments at offset {r.pos}")
        return values

    def _other_dialect(self, packet, offset: int) -> None:
        """A sequence that fails in the fixed dialect but parses in the other one: name the mismatch,
        and answer from now on in the peer's dialect so that it can read the error."""
        other = detect_dialect(packet, offset)
        if other is not None and self.dialect is not None and other is not self.dialect:
            fixed, self.dialect = self.dialect, other
            era = {Dialect.CLASSIC: "classic TVM (0.7-0.20)", Dialect.FFI: "tvm-ffi (TVM >= 0.21)"}
            raise ProtocolError(f"dialect mismatch: the peer speaks {era[other]}, but this end is fixed to "
                                f"{era[fixed]} (rpcsrv serve --dialect {fixed.value}; use --dialect auto)")

    def _parse_packet(self, packet: bytearray) -> Event:
        mv = memoryview(packet)
        r = Reader(mv, max_ndim=self.max_ndim)
        code = r.i32("RPC code")
        try:
            if code == RPCCode.CALL_FUNC:
                handle = r.u64("function handle")
                return CallFunc(handle, self._seq(mv, r.pos))
            if code == RPCCode.SHUTDOWN:
                return Shutdown()
            if code == RPCCode.INIT_SERVER:
                version = r.string("protocol version")
                return InitServer(version, self._seq(mv, r.pos))
            if code == RPCCode.COPY_TO_REMOTE:
                tensor = r.tensor()
                nbytes = r.u64("copy size")
                if nbytes != r.remaining:
                    raise ProtocolError(f"copy size {nbytes} does not match the {r.remaining} data bytes sent")
                return CopyToRemote(tensor, nbytes, r.raw(nbytes, "copy data"))
            if code == RPCCode.COPY_FROM_REMOTE:
                tensor = r.tensor()
                return CopyFromRemote(tensor, r.u64("copy size"))
            if code == RPCCode.RETURN:
                return Return(self._seq(mv, r.pos))
            if code == RPCCode.EXCEPTION:
                values = self._seq(mv, r.pos)
                return RemoteError(str(values[0]) if values else "")
            if code == RPCCode.COPY_ACK:
                return CopyAck(mv[4:])
            if SYSCALL_START <= code <= max(RPCCode):
                return Syscall(RPCCode(code), self._seq(mv, r.pos))
            raise ProtocolError(f"unknown RPC code {code}")
        except ProtocolError as exc:
            return BadPacket(code, str(exc))

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

