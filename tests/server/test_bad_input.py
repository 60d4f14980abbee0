"""Bad input on the wire: each gets an RPC exception or a clean close, and the server lives on.

Raw sockets against ``rpcsrv serve`` in a child process, so a crash would be visible as a dead process.
"""

from __future__ import annotations

import socket
import struct

import pytest

from rpcsrv.protocol import (NEED_DATA, Connection, ConnectionClosed, DataType, Device, Dialect,
                             HandshakeDone, OpaqueHandle, RemoteError, Return, Role, RPCCode, TensorHeader)
from rpcsrv.protocol.codes import RPC_CODE_SUCCESS


class Raw:
    """A hand-driven client: sends whatever bytes a test wants, decodes the answers."""

    def __init__(self, server, key: str = "", dialect=Dialect.CLASSIC, init: bool = True):
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        self.conn = Connection(Role.CLIENT, strict=False, dialect=dialect)
        if init:
            self.sock.sendall(self.conn.start(key))
            self.handshake_reply()
            assert isinstance(self.ask(self.conn.send_init_server()), Return)
            # a first call with an argument tells the server which dialect we speak
            assert self.global_handle("tvm.rpc.server.workpath") != 0

    def handshake_reply(self) -> None:
        """Read the server's handshake answer into the connection (which then expects packets)."""
        head = self.recv_exact(8)
        assert head[:4] == struct.pack("<i", RPC_CODE_SUCCESS)
        (n,) = struct.unpack_from("<i", head, 4)
        self.conn.receive_data(head + self.recv_exact(n))
        assert isinstance(self.conn.next_event(), HandshakeDone)

    def recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                break
            out += chunk
        return out

    def send(self, data) -> None:
        self.sock.sendall(b"".join(bytes(p) for p in data) if isinstance(data, list) else data)

    def event(self):
        while True:
            ev = self.conn.next_event()
            if ev is not NEED_DATA:
                return ev
            self.conn.receive_data(self.sock.recv(1 << 16))

    def ask(self, data):
        self.send(data)
        return self.event()

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def global_handle(self, name: str) -> int:
        ev = self.ask(self.conn.send_syscall(RPCCode.GET_GLOBAL_FUNC, [name]))
        return ev.values[0].value


def packet(body: bytes) -> bytes:
    return struct.pack("<q", len(body)) + body


def still_serving(server) -> None:
    assert server.alive()
    c = Raw(server)
    assert c.global_handle("tvm.rpc.server.workpath") != 0


def test_bad_magic_is_closed(server):
    c = Raw(server, init=False)
    c.send(struct.pack("<ii", 0x12345, 7) + b"client:")
    assert c.closed_by_server()
    still_serving(server)


def test_wrong_protocol_version_is_an_exception(server):
    # before any argument the dialect is unknown: the server answers in tvm-ffi's encoding
    c = Raw(server, init=False, dialect=Dialect.FFI)
    c.send(c.conn.start(""))
    c.handshake_reply()
    ev = c.ask(c.conn.send_init_server(version="0.7.9"))
    assert isinstance(ev, RemoteError) and "version mismatch" in ev.message
    still_serving(server)


def test_request_before_init_is_an_exception(server):
    c = Raw(server, init=False, dialect=Dialect.FFI)
    c.send(c.conn.start(""))
    c.handshake_reply()
    ev = c.ask(c.conn.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["tvm.rpc.server.workpath"]))
    assert isinstance(ev, RemoteError) and "kInitServer" in ev.message


def test_unknown_rpc_code_then_session_goes_on(server):
    c = Raw(server)
    ev = c.ask(packet(struct.pack("<i", 99) + b"\0" * 4))
    assert isinstance(ev, RemoteError) and "unknown RPC code 99" in ev.message
    assert c.global_handle("tvm.rpc.server.workpath") != 0


def test_unknown_type_code_is_an_exception(server):
    c = Raw(server)
    body = struct.pack("<iii", RPCCode.GET_GLOBAL_FUNC, 1, 42) + b"\0" * 8
    ev = c.ask(packet(body))
    assert isinstance(ev, RemoteError) and "type" in ev.message
    assert c.global_handle("tvm.rpc.server.workpath") != 0


@pytest.mark.parametrize("dialect", [Dialect.CLASSIC, Dialect.FFI])
def test_unknown_and_foreign_handles(server, dialect):
    a, b = Raw(server, dialect=dialect), Raw(server, dialect=dialect)
    h = a.global_handle("tvm.rpc.server.workpath")
    ev = b.ask(b.conn.send_call(h, ["x"]))  # a's handle in b's session
    assert isinstance(ev, RemoteError) and "unknown function handle" in ev.message
    ev = b.ask(b.conn.send_call(0xDEAD, []))
    assert isinstance(ev, RemoteError) and "unknown function handle" in ev.message
    ev = b.ask(b.conn.send_syscall(RPCCode.FREE_HANDLE, [OpaqueHandle(0xBEEF), 10]))
    assert isinstance(ev, RemoteError) and "unknown handle" in ev.message
    ev = b.ask(b.conn.send_syscall(RPCCode.DEV_FREE_DATA, [Device(1, 0), OpaqueHandle(0xBEEF)]))
    assert isinstance(ev, RemoteError) and "unknown data handle" in ev.message
    assert isinstance(a.ask(a.conn.send_call(h, ["x"])), Return)


def test_copy_out_of_bounds_is_an_exception(server):
    c = Raw(server)
    ev = c.ask(c.conn.send_syscall(RPCCode.DEV_ALLOC_DATA, [Device(1, 0), 16, 64, DataType.parse("float32")]))
    data = ev.values[0].value
    t = TensorHeader(data, Device(1, 0), DataType.parse("float32"), (8,), 0)
    ev = c.ask(c.conn.send_copy_to_remote(t, b"\0" * 32))
    assert isinstance(ev, RemoteError) and "exceeds" in ev.message
    ev = c.ask(c.conn.send_copy_from_remote(TensorHeader(data, Device(1, 0), t.dtype, (2,), 12), 8))
    assert isinstance(ev, RemoteError) and "exceeds" in ev.message
    ev = c.ask(c.conn.send_copy_from_remote(TensorHeader(data, Device(2, 0), t.dtype, (2,), 0), 8))
    assert isinstance(ev, RemoteError) and "not available" in ev.message


def test_memory_budget(server):
    c = Raw(server)
    ev = c.ask(c.conn.send_syscall(RPCCode.DEV_ALLOC_DATA, [Device(1, 0), 1 << 50, 64, DataType.parse("float32")]))
    assert isinstance(ev, RemoteError) and "budget" in ev.message
    still_serving(server)


def test_truncated_packet_then_close(server):
    c = Raw(server)
    full = b"".join(bytes(p) for p in c.conn.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["tvm.rpc.server.workpath"]))
    c.send(full[: len(full) // 2])
    c.sock.close()
    still_serving(server)


@pytest.mark.parametrize("length", [1 << 60, 2, -5])
def test_absurd_packet_length_closes(server, length):
    c = Raw(server)
    c.send(struct.pack("<q", length) + b"\0" * 16)
    assert c.closed_by_server()
    still_serving(server)


def test_truncated_arguments_are_an_exception(server):
    c = Raw(server)
    body = struct.pack("<iii", RPCCode.GET_GLOBAL_FUNC, 1, 11) + struct.pack("<Q", 1000) + b"abc"
    ev = c.ask(packet(body))
    assert isinstance(ev, RemoteError) and "exceeds" in ev.message
    assert not isinstance(c.ask(c.conn.send_syscall(RPCCode.GET_GLOBAL_FUNC, ["x"])), ConnectionClosed)
