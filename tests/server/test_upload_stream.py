"""Large uploads stream to their file piece by piece: memory stays bounded, refusals are clear answers
once the bytes are in, a half-received upload never replaces a file, and the session goes on.

Driven against ``rpcsrv serve`` in a child process, with our client, the real TVM client and raw
sockets (to cut a connection in the middle of an upload).
"""

from __future__ import annotations

import numpy as np
import pytest

from rpcsrv.client import rpc
from conftest import module_server, need_module
from rpcsrv.protocol import Dialect


def peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    """A server whose sessions may store at most 8 MB."""
    yield from module_server(tmp_path_factory, "--max-workspace-mb", "8")


def payload(nbytes: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def test_large_upload_streams_with_bounded_server_memory(server, tmp_path):
    """A 192 MB file goes up (mapped on our side) and back byte for byte; the server's peak memory
    grows by far less than the file, because the bytes go to disk 1 MB at a time."""
    big = tmp_path / "big.bin"
    data = payload(192 << 20)
    big.write_bytes(data)
    s = rpc.connect(server.host, server.port)
    s.upload(b"warm-up" * 20000, "w.bin")  # the path the big upload takes, imports included
    before = peak_rss_mb(server.proc.pid)
    s.upload(str(big))
    grown = peak_rss_mb(server.proc.pid) - before
    assert grown < 48, f"server peak memory grew by {grown:.0f} MB for a 192 MB upload"
    assert s.listdir(".") == "big.bin,w.bin"  # no .part file left behind
    assert s.download("big.bin") == data
    s.close()


def test_tvm_client_large_upload(server):
    tvm = need_module("tvm", "the real TVM client (apache-tvm)")
    sess = tvm.rpc.connect(server.host, server.port)
    data = payload(5 << 20, 1)
    sess.upload(bytearray(data), "five.bin")
    assert bytes(sess.download("five.bin")) == data
    sess.upload(bytearray(payload(3 << 20, 2)), "five.bin")  # replaced as a whole
    assert bytes(sess.download("five.bin")) == payload(3 << 20, 2)


def test_upload_over_budget_is_refused_and_the_session_goes_on(small_server):
    s = rpc.connect(small_server.host, small_server.port)
    s.upload(payload(3 << 20), "keep.bin")
    with pytest.raises(rpc.RPCError, match="exceeds the workspace budget"):
        s.upload(payload(6 << 20), "too-much.bin")
    assert s.listdir(".") == "keep.bin"
    assert s.download("keep.bin") == payload(3 << 20)
    s.upload(payload(4 << 20, 3), "keep.bin")  # replacing counts the old file as freed
    assert s.download("keep.bin") == payload(4 << 20, 3)


def test_large_upload_outside_the_workspace_is_refused(server):
    s = rpc.connect(server.host, server.port)
    for bad in ("../escape.bin", "/tmp/escape.bin"):
        with pytest.raises(rpc.RPCError, match="workspace|absolute"):
            s.upload(payload(1 << 20), bad)
    assert s.get_function("tvm.rpc.server.workpath")("x").endswith("/x")  # still serving


def test_cut_in_the_middle_of_an_upload_leaves_no_file(server, tmp_path):
    """A client that disconnects half way: the server lives on and the half file never appears."""
    s = rpc.connect(server.host, server.port)
    s.upload(b"old" * 30000, "f.bin")
    handle = s.get_function("tvm.rpc.server.upload").handle
    packet = b"".join(bytes(p) for p in s._conn.send_call(handle, ["f.bin", payload(4 << 20)]))
    s._sock.sendall(packet[:len(packet) // 2])
    s._sock.close()
    other = rpc.connect(server.host, server.port)
    assert other.get_function("tvm.rpc.server.workpath")("x")
    assert server.alive()


def test_large_upload_in_the_classic_dialect(server):
    """The classic dialect's bytes argument (type code kTVMBytes) goes the same way."""
    s = rpc.connect(server.host, server.port, dialect=Dialect.CLASSIC)
    data = payload(2 << 20, 4)
    s.upload(data, "classic.bin")
    assert s.download("classic.bin") == data
