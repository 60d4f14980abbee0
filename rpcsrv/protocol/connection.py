"""Sans-IO TVM RPC connection: feed it bytes, take events out; ask it for the bytes to send.

Modelled on h11: no sockets, no threads, no clocks.  The same class serves the server
(``Connection(Role.SERVER)``) and our client (``Connection(Role.CLIENT, dialect=...)``).

Wire shape (``rpc_endpoint.cc``, ``python/tvm/rpc/server.py``):

* handshake: client sends ``int32 RPC_MAGIC``, ``int32 len``, key ``"client:<key> [-opt=v ...]"``;
  server answers ``int32 RPC_CODE_SUCCESS`` then ``int32 len`` + ``"server:<key>"``, or
  ``int32 RPC_CODE_MISMATCH`` and closes;
* then packets: ``int64 nbytes`` followed by ``nbytes`` bytes starting with ``int32 RPCCode``.

Dialect: the two dialects are byte-identical until the first packed sequence that carries an argument,
so a server in auto mode detects the dialect there (:func:`detect_dialect`).  The kInitServer answer
comes before that point; in auto mode it is a Return with zero values, which both dialects' clients
parse and ignore (TVM's own server sends a void in its own dialect).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Optional

from .codec import ProtocolError, Reader, Writer, decode_packed_seq, detect_dialect, encode_packed_seq
from .codes import (PROTOCOL_VERSION, RPC_CODE_MISMATCH, RPC_CODE_SUCCESS, RPC_MAGIC, SYSCALL_START,
                    Dialect, RPCCode)
from .values import TensorHeader

DEFAULT_MAX_PACKET = 1 << 32  # 4 GiB: larger packets are refused before any allocation
MAX_KEY_LEN = 4096

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


class Role(enum.Enum):
    SERVER = "server"
    CLIENT = "client"


# ----------------------------------------------------------------------------- events

class Event:
    """Base class of everything :meth:`Connection.next_event` returns."""


class NeedData(Event):
    """Nothing complete yet: feed more bytes."""


NEED_DATA = NeedData()


@dataclass
class HandshakeRequest(Event):
    """(server) A client presented its key, e.g. ``"client:board-a -timeout=10"``."""

    header: str

    @property
    def key(self) -> Optional[str]:
        """The key after ``client:`` (None when the header is not a client header)."""
        first = self.header.split()[0] if self.header.split() else ""
        return first[len("client:"):] if first.startswith("client:") else None

    @property
    def options(self) -> dict[str, str]:
        """Options after the key (``-timeout=10`` → ``{"timeout": "10"}``)."""
        opts = {}
        for word in self.header.split()[1:]:
            if word.startswith("-") and "=" in word:
                k, v = word[1:].split("=", 1)
                opts[k] = v
        return opts


@dataclass
class HandshakeDone(Event):
    """(client) The server accepted; ``server_key`` is its ``"server:<key>"`` header."""

    server_key: str


@dataclass
class HandshakeRefused(Event):
    """(client) The server answered a code other than success (e.g. key mismatch)."""

    code: int


@dataclass
class InitServer(Event):
    version: str
    args: list


@dataclass
class CallFunc(Event):
    handle: int
    args: list


@dataclass
class Syscall(Event):
    code: RPCCode
    args: list


@dataclass
class CopyToRemote(Event):
    tensor: TensorHeader
    nbytes: int
    data: memoryview


@dataclass
class CopyFromRemote(Event):
    tensor: TensorHeader
    nbytes: int


@dataclass
class Return(Event):
    values: list


@dataclass
class RemoteError(Event):
    """(client) The server answered kException."""

    message: str


@dataclass
class CopyAck(Event):
    data: memoryview


@dataclass
class Shutdown(Event):
    pass


@dataclass
class BadPacket(Event):
    """A well-framed packet whose content is wrong; the peer expects an answer (an exception)."""

    code: int
    error: str


@dataclass
class ConnectionClosed(Event):
    """The peer closed (``clean``: at a packet boundary) or the stream is beyond repair."""

    clean: bool = True
    error: str = ""


# ----------------------------------------------------------------------------- connection

@dataclass
class Connection:
    role: Role
    dialect: Optional[Dialect] = None
    max_packet: int = DEFAULT_MAX_PACKET
    _buf: bytearray = field(default_factory=bytearray)
    _pos: int = 0
    _state: str = "handshake"
    _packet: Optional[bytearray] = None
    _filled: int = 0
    _eof: bool = False
    _closed_event: Optional[ConnectionClosed] = None

    # -- input
    def receive_data(self, data) -> None:
        """Feed bytes from the peer; ``b""`` means the peer closed."""
        if not data:
            self._eof = True
            return
        if self._packet is not None:
            mv = memoryview(data).cast("B")
            n = min(len(mv), len(self._packet) - self._filled)
            self._packet[self._filled:self._filled + n] = mv[:n]
            self._filled += n
            data = mv[n:]
            if not data:
                return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

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
        self._state = "closed"
        self._closed_event = ConnectionClosed(clean=False, error=error)
        return self._closed_event

    def next_event(self) -> Event:
        """The next complete event, :data:`NEED_DATA`, or :class:`ConnectionClosed`."""
        if self._closed_event is not None:
            return self._closed_event
        if self._state == "handshake":
            return self._next_handshake()
        if self._state == "await_accept":
            return NEED_DATA
        if self._packet is None:
            if self._avail() < 8:
                return self._eof_event(self._avail() == 0)
            (n,) = _I64.unpack(self._take(8))
            if n < 4 or n > self.max_packet:
                return self._fail(f"packet length {n} is outside 4..{self.max_packet}")
            self._packet = bytearray(n)
            take = min(n, self._avail())
            self._packet[:take] = self._buf[self._pos:self._pos + take]
            self._pos += take
            self._filled = take
        if self._filled < len(self._packet):
            return self._eof_event(False)
        packet, self._packet = self._packet, None
        return self._parse_packet(packet)

    def _eof_event(self, at_boundary: bool) -> Event:
        if not self._eof:
            return NEED_DATA
        if at_boundary and self._packet is None:
            self._closed_event = ConnectionClosed(clean=True)
        else:
            self._closed_event = ConnectionClosed(clean=False, error="peer closed in the middle of a packet")
        self._state = "closed"
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
            self._state = "await_accept"
            return HandshakeRequest(key)
        self._state = "packets"
        return HandshakeDone(key)

    def _fail_refused(self, code: int) -> Event:
        self._state = "closed"
        self._closed_event = ConnectionClosed(clean=False, error=f"server refused the handshake (code {code})")
        return HandshakeRefused(code)

    def _seq(self, packet, offset: int) -> list:
        r = Reader(packet, offset)
        if self.dialect is None:
            guess = detect_dialect(packet, offset)
            if guess is not None:
                self.dialect = guess
            dialect = guess or Dialect.FFI
        else:
            dialect = self.dialect
        values = decode_packed_seq(r, dialect)
        if r.remaining:
            raise ProtocolError(f"{r.remaining} unexpected bytes after the arguments at offset {r.pos}")
        return values

    def _parse_packet(self, packet: bytearray) -> Event:
        mv = memoryview(packet)
        r = Reader(mv)
        code = r.i32("RPC code")
        try:
            if code == RPCCode.SHUTDOWN:
                return Shutdown()
            if code == RPCCode.INIT_SERVER:
                version = r.string("protocol version")
                return InitServer(version, self._seq(mv, r.pos))
            if code == RPCCode.CALL_FUNC:
                handle = r.u64("function handle")
                return CallFunc(handle, self._seq(mv, r.pos))
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
        self._state = "packets"
        key = f"server:{server_key}".encode()
        return _I32.pack(RPC_CODE_SUCCESS) + _I32.pack(len(key)) + key

    def refuse(self) -> bytes:
        """(server) Refuse the handshake (key mismatch); the caller then closes."""
        self._state = "closed"
        self._closed_event = ConnectionClosed(clean=True)
        return _I32.pack(RPC_CODE_MISMATCH)

    def start(self, key: str = "") -> bytes:
        """(client) The opening bytes: magic and ``client:<key>``."""
        header = f"client:{key}".encode()
        return _I32.pack(RPC_MAGIC) + _I32.pack(len(header)) + header

    def _packet_bytes(self, code: int, fill) -> list:
        w = Writer()
        w.i32(code)
        fill(w)
        parts = w.finish()
        return [_I64.pack(sum(len(p) for p in parts))] + parts

    def _dialect_for_send(self) -> Dialect:
        return self.dialect or Dialect.FFI

    def send_return(self, values: list) -> list:
        return self._packet_bytes(RPCCode.RETURN,
                                  lambda w: encode_packed_seq(w, values, self._dialect_for_send()))

    def send_init_reply(self) -> list:
        """(server) The kInitServer answer: void in a known dialect, zero values in auto mode."""
        return self.send_return([None] if self.dialect else [])

    def send_exception(self, message: str) -> list:
        return self._packet_bytes(RPCCode.EXCEPTION,
                                  lambda w: encode_packed_seq(w, [message], self._dialect_for_send()))

    def send_copy_ack(self, data) -> list:
        return [_I64.pack(4 + len(data)) + _I32.pack(RPCCode.COPY_ACK), data]

    def send_init_server(self, args: Optional[list] = None, version: str = PROTOCOL_VERSION) -> list:
        def fill(w: Writer) -> None:
            w.blob(version.encode())
            encode_packed_seq(w, args or [], self._dialect_for_send())
        return self._packet_bytes(RPCCode.INIT_SERVER, fill)

    def send_call(self, handle: int, args: list) -> list:
        def fill(w: Writer) -> None:
            w.u64(handle)
            encode_packed_seq(w, args, self._dialect_for_send(), bytes_object=True)
        return self._packet_bytes(RPCCode.CALL_FUNC, fill)

    def send_syscall(self, code: RPCCode, args: list) -> list:
        return self._packet_bytes(code, lambda w: encode_packed_seq(w, args, self._dialect_for_send()))

    def send_copy_to_remote(self, tensor: TensorHeader, data) -> list:
        def fill(w: Writer) -> None:
            w.tensor(tensor)
            w.u64(len(data))
            w.put_big(data)
        return self._packet_bytes(RPCCode.COPY_TO_REMOTE, fill)

    def send_copy_from_remote(self, tensor: TensorHeader, nbytes: int) -> list:
        def fill(w: Writer) -> None:
            w.tensor(tensor)
            w.u64(nbytes)
        return self._packet_bytes(RPCCode.COPY_FROM_REMOTE, fill)

    def send_shutdown(self) -> list:
        return self._packet_bytes(RPCCode.SHUTDOWN, lambda w: None)


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

