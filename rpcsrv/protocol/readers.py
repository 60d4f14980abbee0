"""How a :class:`~rpcsrv.protocol.connection.Connection` reads: one reader object per phase, chosen from a table.

As h11's ``_readers.py``: the connection holds its current reader and asks it for the next event
(:meth:`Reader.next`: an event, :data:`~rpcsrv.protocol.events.NEED_DATA`, or :data:`AGAIN` after it handed over
to the next reader). Between packets (``Connection._reader`` None) the reader is the one :data:`READERS` gives
the connection's state (the handshake; then :class:`Framing`). :class:`Framing` takes a small packet that is all
in the buffer in one step (``Connection._small``: the one framing rule, which ``Connection.next_event_in``
applies to bytes as read); a packet too large for that, or not all here yet, is received into a *region*, memory the
driver may ``recv_into`` (:meth:`Reader.region`), phase by phase, each its own reader with its own state: the
packet whole (:class:`WholePacket`), or first its head (:class:`Prefix`, ``PREFIX`` bytes), which decides where
the body goes: growing as it arrives (:class:`Growing`), straight into a copy's target (:class:`IntoTarget`:
named by the server in answer to ``CopyToRemoteStart``, or by the client before it asks), in reusable pieces
(:class:`Chunks`, then :class:`End`: a streamed upload), or nowhere (:class:`Discard`: a refused copy);
:class:`Awaiting` holds a head until the server decides. While the socket is lent (``Connection.lend``) the
reader is :data:`LENT`, which reads nothing.
"""

from __future__ import annotations

import struct
from typing import Any, Optional

from .codec import ProtocolError, Reader as ValueReader, split_trailing_bytes
from .codes import RPC_MAGIC, RPCCode
from .events import (NEED_DATA, BadPacket, CallFuncChunk, CallFuncEnd, CallFuncStart, CopyAck, CopyToRemote,
                     CopyToRemoteStart, Event, HandshakeDone, HandshakeRequest)
from .states import LocalProtocolError, Role, State

PREFIX = 512  # bytes of a large packet read before deciding where its body goes
STREAM_MIN = 1 << 16  # packets at least this large may stream their body into a target
CHUNK = 1 << 20  # size of the pieces a streamed call's trailing bytes arrive in
DISCARD = 1 << 20  # size of the scratch a refused copy's bytes are dropped into
MAX_KEY_LEN = 4096

#: a reader's answer when it handed over to the next reader: ask the connection's reader again
AGAIN = object()

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_COPY_ACK, _COPY_TO_REMOTE, _CALL_FUNC = int(RPCCode.COPY_ACK), int(RPCCode.COPY_TO_REMOTE), int(RPCCode.CALL_FUNC)


class Reader:
    """One phase of reading."""

    def next(self, conn: Any) -> Any:
        """The next event, NEED_DATA, or AGAIN (``conn._reader`` was replaced: ask it)."""
        raise NotImplementedError

    def region(self) -> Optional[memoryview]:
        """The memory the next received bytes belong in (for ``recv_into``), or None."""
        return None


class Handshake(Reader):
    """The opening bytes: the client's magic and key (server), the server's answer (client)."""

    def next(self, conn: Any) -> Any:
        avail = len(conn._buf) - conn._pos
        if avail < 4:
            return conn._eof_event(avail == 0)
        (magic,) = _I32.unpack_from(conn._buf, conn._pos)
        if conn.role is Role.CLIENT and magic != RPC_MAGIC:
            conn._take(4)
            return conn._fail_refused(magic)
        if magic != RPC_MAGIC:
            return conn._fail(f"bad magic 0x{magic & 0xffffffff:x} (expected 0x{RPC_MAGIC:x})")
        if avail < 8:
            return conn._eof_event(False)
        (klen,) = _I32.unpack_from(conn._buf, conn._pos + 4)
        if not 0 <= klen <= MAX_KEY_LEN:
            return conn._fail(f"key length {klen} is outside 0..{MAX_KEY_LEN}")
        if avail < 8 + klen:
            return conn._eof_event(False)
        conn._take(8)
        try:
            key = conn._take(klen).decode("utf-8")
        except UnicodeDecodeError:
            return conn._fail("key is not UTF-8")
        return HandshakeRequest(key) if conn.role is Role.SERVER else HandshakeDone(key)


class Waiting(Reader):
    """Nothing to read now: the server owes the handshake's answer (``accept`` or ``refuse``)."""

    def next(self, conn: Any) -> Any:
        return NEED_DATA


class Framing(Reader):
    """Between packets: the next one's length, then the packet (small and here) or a region reader for it."""

    def next(self, conn: Any) -> Any:
        buf, pos = conn._buf, conn._pos
        n = conn._small(buf, pos)
        if n >= 0:
            raw = bytes(buf[pos:pos + 8 + n])  # a copy: events may keep views into it
            conn._take_packet(8 + n)
            return conn._packet(raw)
        avail = len(buf) - pos
        if avail < 8:
            return conn._eof_event(avail == 0)
        (n,) = _I64.unpack_from(buf, pos)
        if n < 4 or n > conn.max_packet:
            return conn._fail(f"packet length {n} is outside 4..{conn.max_packet}")
        conn.last_packet = None
        conn._take_packet(8)
        conn._reader = Prefix(n) if n >= STREAM_MIN else WholePacket(n)
        return AGAIN


class Lent(Reader):
    """The socket is with a borrower (``Connection.lend``): this end reads nothing until it is back."""

    def next(self, conn: Any) -> Any:
        raise LocalProtocolError("the connection is lent: take it back first")


class Region(Reader):
    """Bytes received into ``buf`` (a memoryview) up to ``size``; ``filled`` so far.  :meth:`complete` says what
    they make: an event, or AGAIN (its successor reads on)."""

    def __init__(self, buf: memoryview, size: int, filled: int = 0):
        self.buf, self.size, self.filled = buf, size, filled

    def region(self) -> Optional[memoryview]:
        return self.buf[self.filled:self.size]

    def next(self, conn: Any) -> Any:
        conn._fill(self)
        if self.filled < self.size:
            return conn._eof_event(False)
        return self.complete(conn)

    def complete(self, conn: Any) -> Any:
        raise NotImplementedError


class WholePacket(Region):
    """A packet under ``STREAM_MIN`` that was not all here: received whole, then parsed."""

    def __init__(self, n: int):
        super().__init__(memoryview(bytearray(n)), n)

    def complete(self, conn: Any) -> Event:
        conn._reader = None
        return conn._parse_packet(self.buf.obj)


class Prefix(Region):
    """The first ``PREFIX`` bytes of a large packet of ``total`` bytes: what they announce decides where its
    body goes (a copy's target, the pieces of an upload, or its whole body)."""

    def __init__(self, total: int):
        super().__init__(memoryview(bytearray(PREFIX)), PREFIX)
        self.total = total

    def complete(self, conn: Any) -> Any:
        prefix, total = bytes(self.buf), self.total
        code = int.from_bytes(prefix[:4], "little", signed=True)
        target = conn._ack_target
        if code == _COPY_ACK and target is not None and len(target) == total - 4:
            conn._ack_target = None
            target[:len(prefix) - 4] = prefix[4:]
            conn._reader = IntoTarget(target, len(prefix) - 4)
            return AGAIN
        if code == _COPY_TO_REMOTE and conn.role is Role.SERVER:
            r = ValueReader(prefix, max_ndim=conn.max_ndim)
            r.pos = 4
            try:
                tensor = r.tensor()
                nbytes = r.u64("copy size")
            except ProtocolError:
                tensor = None
            if tensor is not None and nbytes == total - r.pos:
                event = CopyToRemoteStart(tensor, nbytes)
                conn._reader = Awaiting(event, total, prefix[r.pos:], prefix)
                return event
        if code == _CALL_FUNC and conn.role is Role.SERVER and conn.dialect is not None:
            handle = int.from_bytes(prefix[4:12], "little")
            head = split_trailing_bytes(prefix, 12, conn.dialect, total)
            if head is not None:
                args, start = head
                event = CallFuncStart(handle, args, total - start)
                conn._reader = Awaiting(event, total, prefix[start:], prefix)
                return event
        conn._reader = Growing(prefix, total)
        return AGAIN


class Awaiting(Reader):
    """A large packet's head, announced as ``event`` (``CopyToRemoteStart``, ``CallFuncStart``): nothing is read
    until the server says where its body goes (``Connection.set_copy_target``, ``stream_call``).  ``extra``: the
    head's bytes past the announced fields; ``prefix``: the whole head."""

    def __init__(self, event: Event, total: int, extra: bytes, prefix: bytes):
        self.event, self.total, self.extra, self.prefix = event, total, extra, prefix

    def next(self, conn: Any) -> Any:
        return NEED_DATA

    def into(self, target: Optional[memoryview], error: str) -> Region:
        """The body of an announced copy: into ``target``, or discarded (``target`` None: refused)."""
        extra = self.extra
        if target is None or len(target) != self.event.nbytes:
            return Discard(self.event.nbytes, len(extra), error or "copy target rejected")
        target = target.cast("B") if target.format != "B" else target
        target[:len(extra)] = extra
        return IntoTarget(target, len(extra), self.event)

    def streamed(self, accept: bool) -> Region:
        """The body of an announced call: its trailing bytes in pieces, or the whole call at once."""
        if not accept:
            return Growing(self.prefix, self.total)
        nbytes = self.event.nbytes
        scratch = bytearray(min(CHUNK, nbytes))
        scratch[:len(self.extra)] = self.extra
        return Chunks(self.event, memoryview(scratch), nbytes, len(self.extra))


class Growing(Region):
    """A large packet received whole, in memory that grows only as its bytes arrive: each piece lands in a
    scratch buffer of at most ``CHUNK`` bytes and is appended to the body, so a header claiming gigabytes costs
    nothing until the gigabytes are really sent."""

    def __init__(self, prefix: bytes, total: int):
        self.body = bytearray(prefix)
        self.total = total
        scratch = memoryview(bytearray(min(CHUNK, total - len(prefix))))
        super().__init__(scratch, min(len(scratch), total - len(prefix)))

    def complete(self, conn: Any) -> Any:
        self.body += self.buf[:self.filled]
        self.filled = 0
        self.size = min(len(self.buf), self.total - len(self.body))
        if len(self.body) < self.total:
            return AGAIN
        conn._reader = None
        return conn._parse_packet(self.body)


class IntoTarget(Region):
    """A body received straight into the memory it is for: a copy to the server (``copy``: its announcement),
    or the client's copy from the server (``CopyAck``)."""

    def __init__(self, target: memoryview, filled: int, copy: Optional[CopyToRemoteStart] = None):
        super().__init__(target, len(target), filled)
        self.copy = copy

    def complete(self, conn: Any) -> Event:
        conn._reader = None
        if self.copy is not None:
            return CopyToRemote(self.copy.tensor, self.copy.nbytes, self.buf, in_place=True)
        return CopyAck(self.buf)


class Discard(Region):
    """A refused copy's ``total`` bytes, dropped as they arrive (``filled`` already in the head), then the refusal."""

    def __init__(self, total: int, filled: int, error: str):
        super().__init__(memoryview(bytearray(min(total, DISCARD))), total, filled)
        self.error = error

    def region(self) -> Optional[memoryview]:
        return self.buf[:min(len(self.buf), self.size - self.filled)]

    def complete(self, conn: Any) -> Event:
        conn._reader = None
        return BadPacket(RPCCode.COPY_TO_REMOTE, self.error)


class Chunks(Region):
    """A streamed call's trailing bytes, ``total`` of them, in pieces of one reusable buffer."""

    def __init__(self, call: CallFuncStart, scratch: memoryview, total: int, filled: int):
        super().__init__(scratch, min(len(scratch), total), filled)
        self.call, self.total, self.streamed = call, total, 0

    def complete(self, conn: Any) -> Event:
        chunk, n = self.buf[:self.filled], self.filled
        self.streamed += n
        self.filled = 0
        self.size = min(len(self.buf), self.total - self.streamed)
        if self.streamed == self.total:
            conn._reader = End(self.call)
        return CallFuncChunk(chunk)


class End(Reader):
    """After a streamed call's last piece: the call's end."""

    def __init__(self, call: CallFuncStart):
        self.call = call

    def next(self, conn: Any) -> Event:
        conn._reader = None
        return CallFuncEnd(self.call.handle)


FRAMING = Framing()
LENT = Lent()
#: the reader between packets, for each state of the connection
READERS = {State.HANDSHAKE: Handshake(), State.AWAIT_ACCEPT: Waiting(), State.IDLE: FRAMING,
           State.ANSWERING: FRAMING, State.AWAITING: FRAMING, State.CLOSED: FRAMING}
