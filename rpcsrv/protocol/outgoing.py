"""The sending half of a :class:`~rpcsrv.protocol.connection.Connection`: every packet an RPC peer
writes, as a list of buffers (large payloads by reference, never joined).

Packet shape: ``int64 nbytes``, then ``int32 RPCCode`` and the body (``rpc_endpoint.cc``); bodies
that carry values use the packed-sequence codec in the connection's dialect (tvm-ffi until known).
"""

from __future__ import annotations

import struct
from typing import Optional

from .codec import Writer, encode_packed_seq
from .codes import PROTOCOL_VERSION, Dialect, RPCCode
from .kinds import DEFAULT_DIALECT, TABLES, wire_dialect
from .states import State
from .values import TensorHeader

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


class PacketWriter:
    """Mixed into ``Connection``: builds packets in ``self.dialect``; each send first moves the
    connection's state (``_go``), which refuses a packet this end may not send now."""

    dialect: Optional[Dialect]

    def _go(self, action: str) -> None:  # the state machine lives in Connection
        raise NotImplementedError

    @property
    def wire_dialect(self) -> Dialect:
        """The dialect of what is sent and read now (the default until the peer's is known)."""
        return wire_dialect(self.dialect)

    def send_value(self, value) -> list:
        """(server) The answer to a kCallFunc: the function's return ``value`` with its type code
        (``EncodeReturn``); a plain value's packet comes from its dialect's head, made once."""
        self._go("answer")
        table = TABLES[self.dialect or DEFAULT_DIALECT]
        packet = table.return_packet(value)
        if packet is not None:
            return [packet]
        w = _packet(RPCCode.RETURN)
        encode_packed_seq(w, table.pack_return(value), table.dialect)
        return _done(w)

    def send_return(self, values: list) -> list:
        self._go("answer")
        w = _packet(RPCCode.RETURN)
        encode_packed_seq(w, values, self.wire_dialect)
        return _done(w)

    def send_init_reply(self) -> list:
        """(server) The kInitServer answer: zero values, which clients of both dialects read and ignore
        (a void in a fixed dialect would break a client of the other one before it could be told why)."""
        return self.send_return([])

    def send_exception(self, message: str) -> list:
        """(server) The answer to a request, or a notice unasked (session timeout, shutdown)."""
        self._go("notice" if self._state is State.IDLE else "answer")
        w = _packet(RPCCode.EXCEPTION)
        encode_packed_seq(w, [message], self.wire_dialect)
        return _done(w)

    def send_copy_ack(self, data) -> list:
        self._go("answer")
        return [_I64.pack(4 + len(data)) + _I32.pack(RPCCode.COPY_ACK), data]

    def send_init_server(self, args: Optional[list] = None, version: str = PROTOCOL_VERSION) -> list:
        self._go("request")
        w = _packet(RPCCode.INIT_SERVER)
        w.blob(version.encode())
        encode_packed_seq(w, args or [], self.wire_dialect)
        return _done(w)

    def send_call(self, handle: int, args: list) -> list:
        self._go("request")
        w = _packet(RPCCode.CALL_FUNC)
        w.u64(handle)
        encode_packed_seq(w, args, self.wire_dialect, bytes_object=True)
        return _done(w)

    def send_syscall(self, code: RPCCode, args: list) -> list:
        self._go("request")
        w = _packet(code)
        encode_packed_seq(w, args, self.wire_dialect)
        return _done(w)

    def send_copy_to_remote(self, tensor: TensorHeader, data) -> list:
        self._go("request")
        w = _packet(RPCCode.COPY_TO_REMOTE)
        w.tensor(tensor)
        w.u64(len(data))
        w.put_big(data)
        return _done(w)

    def send_copy_from_remote(self, tensor: TensorHeader, nbytes: int) -> list:
        self._go("request")
        w = _packet(RPCCode.COPY_FROM_REMOTE)
        w.tensor(tensor)
        w.u64(nbytes)
        return _done(w)

    def send_shutdown(self) -> list:
        self._go("close")
        return _done(_packet(RPCCode.SHUTDOWN))


_HEAD = struct.Struct("<qi")


def _packet(code: int) -> Writer:
    """A writer for one packet, opened with its length (filled in by :func:`_done`) and RPC code."""
    w = Writer()
    w.put(_HEAD.pack(0, code))
    return w


def _done(w: Writer) -> list:
    """The packet's buffers, its length written into the first (a bytearray holding the head)."""
    parts = w.finish()
    _I64.pack_into(parts[0], 0, sum(map(len, parts)) - 8)
    return parts
