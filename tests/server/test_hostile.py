"""A hostile client cannot make the server hold memory for bytes it never sends, and cannot stall
other clients (the claimed-length attack among them)."""

from __future__ import annotations

import socket
import struct
import time

from rpcsrv.client import rpc
from rpcsrv.protocol import RPC_MAGIC, RPCCode


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def handshake(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A raw connection past the handshake and kInitServer (what a real client sends first)."""
    s = socket.create_connection((host, port), timeout=timeout)
    key = b"client:"
    s.sendall(struct.pack("<ii", RPC_MAGIC, len(key)) + key)
    head = _recv_exact(s, 8)
    (n,) = struct.unpack_from("<i", head, 4)
    _recv_exact(s, n)
    version = b"0.8.0"
    body = struct.pack("<i", RPCCode.INIT_SERVER) + struct.pack("<Q", len(version)) + version + struct.pack("<i", 0)
    s.sendall(struct.pack("<q", len(body)) + body)
    (n,) = struct.unpack("<q", _recv_exact(s, 8))
    _recv_exact(s, n)
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def claim_gigabyte(host: str, port: int, code: int = RPCCode.CALL_FUNC) -> socket.socket:
    """After a valid handshake: a packet header claiming 1 GiB, then 520 bytes, then silence."""
    s = handshake(host, port)
    s.sendall(struct.pack("<qi", 1 << 30, code) + b"\x01" * 516)
    return s


def test_claimed_length_costs_no_memory_and_stalls_nobody(server):
    time.sleep(0.2)
    before = rss_kb(server.proc.pid)
    attackers = []
    worst = 0.0
    for code in (RPCCode.CALL_FUNC, RPCCode.RETURN, RPCCode.COPY_TO_REMOTE, RPCCode.CALL_FUNC):
        attackers.append(claim_gigabyte(server.host, server.port, code))
        start = time.perf_counter()
        with rpc.connect(server.host, server.port) as other:
            assert other.get_function("tvm.rpc.server.workpath")("x").endswith("x")
        worst = max(worst, time.perf_counter() - start)
    time.sleep(0.2)
    grown_mb = (rss_kb(server.proc.pid) - before) / 1024
    for s in attackers:
        s.close()
    assert grown_mb <= 64, f"four 1 GiB claims grew the server by {grown_mb:.0f} MB"
    # the target is 100 ms (bench/hardening_bench.py reports it); a loose bound here keeps
    # the test meaningful on a loaded machine: zero-filling 1 GiB took seconds
    assert worst < 1.0, f"another client's session took {worst * 1e3:.0f} ms to open"
    with rpc.connect(server.host, server.port) as other:
        assert other.listdir(".") == ""
