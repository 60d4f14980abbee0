"""Connection and session limits: idle and stalled clients cannot lock others out, and
clients over a limit are refused cleanly (the socket closes, or the client reads the reason)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from rpcsrv.client import rpc
from conftest import ServerProcess
from rpcsrv.protocol import RPCCode
from test_hostile import handshake


def test_idle_and_stalled_clients_do_not_lock_out_a_new_one(server):
    idle = [socket.create_connection((server.host, server.port)) for _ in range(256)]
    stalled = []
    try:
        for _ in range(64):
            s = handshake(server.host, server.port)
            s.sendall(struct.pack("<qi", 4096, RPCCode.CALL_FUNC) + b"\x00" * 100)  # then nothing
            stalled.append(s)
        start = time.perf_counter()
        with rpc.connect(server.host, server.port) as sess:
            assert sess.get_function("tvm.rpc.server.workpath")("a").endswith("a")
        elapsed = time.perf_counter() - start
        assert elapsed < 1.0, f"a new client waited {elapsed * 1e3:.0f} ms"
    finally:
        for s in idle + stalled:
            s.close()


def test_connections_over_the_limit_are_closed_at_once(tmp_path):
    srv = ServerProcess("--max-connections", "8", workdir=tmp_path)
    try:
        held = [socket.create_connection((srv.host, srv.port)) for _ in range(8)]
        time.sleep(0.2)
        start = time.perf_counter()
        with pytest.raises((rpc.RPCError, OSError)):
            rpc.connect(srv.host, srv.port, timeout=5)
        assert time.perf_counter() - start < 2
        held.pop().close()
        time.sleep(0.2)
        with rpc.connect(srv.host, srv.port) as sess:  # a slot came free
            assert sess.listdir(".") == ""
        for s in held:
            s.close()
        assert srv.alive()
        assert "--max-connections" in srv.stderr()
    finally:
        srv.stop()


def test_sessions_over_the_limit_read_the_reason(tmp_path):
    srv = ServerProcess("--max-sessions", "2", workdir=tmp_path)
    try:
        first, second = rpc.connect(srv.host, srv.port), rpc.connect(srv.host, srv.port)
        with pytest.raises(rpc.RPCError, match="limit.*--max-sessions"):
            rpc.connect(srv.host, srv.port)
        first.close()
        time.sleep(0.2)
        with rpc.connect(srv.host, srv.port) as third:
            assert third.listdir(".") == ""
        second.close()
    finally:
        srv.stop()


def test_idle_timeout_drops_silent_and_stalled_connections(tmp_path):
    srv = ServerProcess("--idle-timeout", "0.5", workdir=tmp_path)
    try:
        silent = socket.create_connection((srv.host, srv.port))  # never sends its handshake
        stalled = handshake(srv.host, srv.port)
        stalled.sendall(struct.pack("<qi", 4096, RPCCode.CALL_FUNC))  # and never the body
        for s in (silent, stalled):
            s.settimeout(5)  # closed by the server well before the 30 s handshake timeout
            said = b""
            while chunk := s.recv(4096):
                said += chunk
            # nothing, or (after a handshake) the reason in one exception packet, then the close
            assert said == b"" or (s is stalled and b"RPCSessionIdleError" in said)
            s.close()
        with rpc.connect(srv.host, srv.port) as sess:
            assert sess.listdir(".") == ""
    finally:
        srv.stop()


def test_timeout_mid_send_closes_instead_of_writing_after_half_a_packet(server):
    """The session times out while its 64 MiB answer is half sent (the client is not reading): the
    server must end the connection, not append an exception packet to half a packet."""
    sess = rpc.connect(server.host, server.port, session_timeout=1)
    arr = sess.empty((64 << 20,), "uint8")
    sess._send(sess._conn.send_copy_from_remote(arr.header, 64 << 20))
    time.sleep(2.0)  # the server blocks on a full socket buffer and its session times out
    data = bytearray()
    sess._sock.settimeout(10)
    while True:
        chunk = sess._sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    assert len(data) < 8 + 4 + (64 << 20)  # the answer was cut short ...
    assert b"RPCSessionTimeoutError" not in data  # ... and nothing was written after it
    sess._sock.close()
