"""The receiving half of a :class:`~rpcsrv.protocol.connection.Connection` for packets too large to
take in one piece: where their bytes go while they arrive.

A small packet is framed and parsed in one step from the connection's buffer.  A large one is
received into a *region* (memory the driver may ``recv_into``), phase by phase: its first ``PREFIX``
bytes, then its whole body growing as it arrives (``grow``), or straight into a copy's target
(``target``, named by the server in answer to :class:`CopyToRemoteStart`, or by the client before
it asks), or in reusable pieces (``chunks``: a streamed upload), or nowhere (``discard``: a refused
copy).  The phases share the buffer and region bookkeeping, which is why they live together here.
"""

from __future__ import annotations

from typing import Optional

from .codec import ProtocolError, Reader, split_trailing_bytes
from .codes import RPCCode
from .events import (NEED_DATA, BadPacket, CallFuncChunk, CallFuncEnd, CallFuncStart, CopyAck, CopyToRemote,
                     CopyToRemoteStart, Event)
from .states import Role

PREFIX = 512  # bytes of a large packet read before deciding where its body goes
STREAM_MIN = 1 << 16  # packets at least this large may stream their body into a target
CHUNK = 1 << 20  # size of the pieces a streamed call's trailing bytes arrive in

_COPY_ACK, _COPY_TO_REMOTE, _CALL_FUNC = int(RPCCode.COPY_ACK), int(RPCCode.COPY_TO_REMOTE), int(RPCCode.CALL_FUNC)


class RegionReceiver:
    """Mixed into ``Connection`` (whose dataclass fields hold the phase, region and buffers)."""

    def writable(self) -> Optional[memoryview]:
        """The memory the next received bytes belong in (for ``recv_into``), or None."""
        return None if len(self._buf) - self._pos else self._region()

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

    def _fill_from_buffer(self) -> None:
        """Move buffered bytes into the current region (repeatedly while discarding: the discard
        region is reused, so one pass may not take everything buffered)."""
        while len(self._buf) - self._pos:
            region = self._region()
            if not region:
                return
            n = min(len(region), len(self._buf) - self._pos)
            region[:n] = self._buf[self._pos:self._pos + n]
            self._pos += n
            self._filled += n

    def _start_large(self, n: int) -> None:
        """A packet of ``n`` bytes that is large, or not all here yet: receive it into a region."""
        self._total = n
        streamed = n >= STREAM_MIN
        self._phase, self._region_buf, self._filled = \
            "prefix" if streamed else "packet", memoryview(bytearray(PREFIX if streamed else n)), 0

    def _next_in_region(self) -> Event:
        """Progress on the packet being received into a region: an event, or NEED_DATA."""
        while True:
            if self._phase is None:
                return self._next_event()  # the region's packet is done: back to framing
            if self._phase == "await":
                return NEED_DATA
            if self._phase == "end":
                call, self._call = self._call, None
                self._phase = self._region_buf = None
                return CallFuncEnd(call.handle)
            self._fill_from_buffer()
            if self._filled < self._region_size():
                return self._eof_event(False)
            event = self._region_complete()
            if event is not None:
                return event

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
        self._copy = None
        return BadPacket(RPCCode.COPY_TO_REMOTE, self._discard_error)

    def _prefix_complete(self, prefix: bytes) -> Optional[Event]:
        code = int.from_bytes(prefix[:4], "little", signed=True)
        if code == _COPY_ACK and self._ack_target is not None and len(self._ack_target) == self._total - 4:
            target, self._ack_target = self._ack_target, None
            target[:len(prefix) - 4] = prefix[4:]
            self._phase, self._region_buf, self._filled = "target", target, len(prefix) - 4
            return None
        if code == _COPY_TO_REMOTE and self.role is Role.SERVER:
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
        if code == _CALL_FUNC and self.role is Role.SERVER and self.dialect is not None:
            handle = int.from_bytes(prefix[4:12], "little")
            head = split_trailing_bytes(prefix, 12, self.dialect, self._total)
            if head is not None:
                args, start = head
                self._call = CallFuncStart(handle, args, self._total - start)
                self._prefix, self._whole_prefix = prefix[start:], prefix
                self._phase, self._region_buf = "await", None
                return self._call
        self._receive_whole(prefix)
        return None
