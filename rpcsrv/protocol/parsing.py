"""One whole packet's bytes → one event: the RPC code, then the fields that code carries.

Mixed into :class:`~rpcsrv.protocol.connection.Connection`, which hands over each complete packet
(without its length).  A malformed packet becomes a :class:`BadPacket` event, never an exception.
Argument sequences go through the kinds table of the connection's dialect (``kinds.TABLES``, one
``decode_seq`` per dialect, looked up once per packet); in auto mode the first sequence that tells
the dialects apart fixes the connection's dialect (:func:`~rpcsrv.protocol.codec.detect_dialect`).
"""

from __future__ import annotations

import struct
from typing import Optional

from .codec import ProtocolError, Reader, detect_dialect
from .codes import SYSCALL_START, Dialect, RPCCode
from .events import (BadPacket, CallFunc, CopyAck, CopyFromRemote, CopyToRemote, Event, InitServer, RemoteError,
                     Return, Shutdown, Syscall)
from .kinds import DEFAULT_DIALECT, TABLES

_CALL_HEAD = struct.Struct("<iQ")  # a kCallFunc packet opens with its code and the function handle
_CALL_FUNC = int(RPCCode.CALL_FUNC)
_LAST_CODE = int(max(RPCCode))
#: the dialect's sequence decoder; None (auto, not known yet) reads in the default dialect
DECODERS = {**{d: TABLES[d].decode_seq for d in Dialect}, None: TABLES[DEFAULT_DIALECT].decode_seq}
ERAS = {Dialect.CLASSIC: "classic TVM (0.7-0.20)", Dialect.FFI: "tvm-ffi (TVM >= 0.21)"}


#: a call packet at most this long is remembered, decoded, by its bytes (``MEMO_CALLS`` of them per
#: connection): a client that repeats a call (a loop, a tuner, ``lib["f"]`` lookups) sends the same bytes,
#: and its event (never changed by whoever reads it) is decoded once
MEMO_BYTES = 512
MEMO_CALLS = 64


class PacketParser:
    """Mixed into ``Connection`` (``dialect``, ``max_ndim``, ``_calls``: the calls decoded, by bytes)."""

    def _parse_packet(self, packet, raw: Optional[bytes] = None) -> Event:
        """The event of one packet (``raw``: the packet as received, length prefix included, under
        which a small call is remembered decoded: ``Connection._next_event`` looks there first)."""
        mv = memoryview(packet)
        if len(packet) >= 12:  # the common case first: a call, its code and handle in one unpack
            code, handle = _CALL_HEAD.unpack_from(packet)
            if code == _CALL_FUNC:
                try:
                    ev = CallFunc(handle, self._seq(mv, 12))
                except ProtocolError as exc:
                    return BadPacket(code, str(exc))
                if raw is not None and len(raw) <= MEMO_BYTES:
                    if len(self._calls) >= MEMO_CALLS:
                        self._calls.clear()
                    self._calls[raw] = ev
                return ev
        r = Reader(mv, max_ndim=self.max_ndim)
        code = r.i32("RPC code")
        try:
            return self._parse_other(code, r, mv)
        except ProtocolError as exc:
            return BadPacket(code, str(exc))

    def _parse_other(self, code: int, r: Reader, mv: memoryview) -> Event:
        if code == RPCCode.CALL_FUNC:  # too short to hold its handle
            r.u64("function handle")
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
        if SYSCALL_START <= code <= _LAST_CODE:
            return Syscall(RPCCode(code), self._seq(mv, r.pos))
        raise ProtocolError(f"unknown RPC code {code}")

    def _seq(self, packet, offset: int) -> list:
        """The packed sequence from ``offset`` to the packet's end."""
        r = Reader(packet, offset, None, self.max_ndim)
        if self.dialect is None:
            self.dialect = detect_dialect(packet, offset)
        try:
            values = DECODERS[self.dialect](r)
        except ProtocolError:
            self._other_dialect(packet, offset)
            raise
        if r.pos != r.end:
            self._other_dialect(packet, offset)
            raise ProtocolError(f"{r.remaining} unexpected bytes after the arguments at offset {r.pos}")
        return values

    def _other_dialect(self, packet, offset: int) -> None:
        """A sequence that fails in the fixed dialect but parses in the other one: name the mismatch,
        and answer from now on in the peer's dialect so that it can read the error."""
        self._calls.clear()  # (decoded in the dialect that no longer holds)
        other = detect_dialect(packet, offset)
        if other is not None and self.dialect is not None and other is not self.dialect:
            fixed, self.dialect = self.dialect, other
            raise ProtocolError(f"dialect mismatch: the peer speaks {ERAS[other]}, but this end is fixed to "
                                f"{ERAS[fixed]} (rpcsrv serve --dialect {fixed.value}; use --dialect auto)")
