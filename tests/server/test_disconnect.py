"""A client that disconnects mid-packet, mid-upload, mid-copy or mid-run: its handles, buffers and
partial files are released and the server keeps serving.

The server has a tight server-wide budget (96 MiB) and 64 MiB per session: if a dead session's
charges leaked, the next client could not allocate 60 MiB.  Its workspace folder must be gone too."""

from __future__ import annotations

import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rpcsrv.client import rpc
from rpcsrv.client.graph_executor import GraphModule
from conftest import ServerProcess
from rpcsrv.protocol import Connection, Dialect, Role, RPCCode
from test_hostile import handshake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_responsive import N, slow_library  # noqa: E402

MB = 1 << 20


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    work = tmp_path_factory.mktemp("disconnect-work")
    srv = ServerProcess("--max-memory-mb", "64", "--max-total-memory-mb", "96", workdir=work)
    srv.work = work
    yield srv
    assert srv.alive()
    srv.stop()


def all_released(srv, timeout: float = 15.0) -> None:
    """A new session can take 60 MiB of the 96 MiB server budget, and no other workspace is left."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with rpc.connect(srv.host, srv.port) as sess:
                sess.empty((60 * MB,), "uint8")
                others = [p for p in srv.work.iterdir() if p.name.startswith("session-")]
                assert len(others) <= 1, others  # only this session's own workspace
                return
        except (rpc.RPCError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def raw_session(srv, dialect=Dialect.FFI):
    """A raw socket past handshake and kInitServer, and a codec to build its packets."""
    return handshake(srv.host, srv.port), Connection(Role.CLIENT, dialect=dialect, strict=False)


def test_disconnect_mid_packet(tight):
    s, _ = raw_session(tight)
    s.sendall(struct.pack("<qi", 1 << 20, RPCCode.CALL_FUNC) + b"\x00" * 1000)
    s.close()
    all_released(tight)


def test_disconnect_mid_upload(tight):
    sess = rpc.connect(tight.host, tight.port)
    sess.empty((40 * MB,), "uint8")  # held by the session that dies
    upload = sess.get_function("tvm.rpc.server.upload")
    parts = sess._conn.send_call(upload.handle, ["big.bin", memoryview(bytes(30 * MB))])
    data = b"".join(bytes(p) for p in parts)
    sess._sock.sendall(data[:len(data) // 2])
    deadline = time.monotonic() + 10  # (a loaded machine may take more than a moment to write the first piece)
    while not list(tight.work.glob("session-*/big.bin.part")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tight.work.glob("session-*/big.bin.part"))  # the partial file exists meanwhile
    sess._sock.close()
    all_released(tight)
    assert not list(tight.work.glob("session-*/big.bin*"))


def test_disconnect_mid_copy(tight):
    sess = rpc.connect(tight.host, tight.port)
    arr = sess.empty((40 * MB,), "uint8")
    parts = sess._conn.send_copy_to_remote(arr.header, memoryview(bytes(40 * MB)))
    data = b"".join(bytes(p) for p in parts)
    sess._sock.sendall(data[:len(data) // 3])
    sess._sock.close()
    all_released(tight)


def test_disconnect_mid_run(tight, tmp_path):
    sess = rpc.connect(tight.host, tight.port)
    sess.upload(str(slow_library(tmp_path / "slow.blob")))
    gmod = GraphModule(sess.load_module("slow.blob")["default"](sess.cpu(0)))
    gmod.set_input("x", np.zeros((N, N), "float32"))
    run = gmod.module["run"]
    sess._send(sess._conn.send_call(run.handle, []))  # the run starts; nobody waits for it
    time.sleep(0.2)
    sess._sock.shutdown(socket.SHUT_RDWR)
    sess._sock.close()
    all_released(tight, timeout=60)
