"""Two servers in one process keep their own metrics (a registry each, nothing in prometheus_client's
global one), and the HTTP responder's edges: keep-alive, HEAD, 405, 404, a malformed request, and a
scrape while a session is open in the other server."""

from __future__ import annotations

import socket
import urllib.request

import trio

from conftest import need_module
from metrics_helpers import Scrape

need_module("prometheus_client", "the metrics endpoint (pip install 'rpcsrv[metrics]')")

from prometheus_client import REGISTRY, generate_latest  # noqa: E402

from rpcsrv.board.options import ServeOptions  # noqa: E402
from rpcsrv.board.server import Server, serve  # noqa: E402
from rpcsrv.client import rpc  # noqa: E402


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode()


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


async def test_two_servers_keep_their_own_metrics(tmp_path):
    cfgs = [Server(ServeOptions(port=0, metrics_port=0, workdir=tmp_path)) for _ in range(2)]
    async with trio.open_nursery() as nursery:
        ports = [await nursery.start(serve, cfg) for cfg in cfgs]

        def session() -> None:
            with rpc.connect("127.0.0.1", ports[0]) as sess:
                f = sess.get_function("tvm.rpc.server.workpath")
                for _ in range(7):
                    f("x")

        await trio.to_thread.run_sync(session)
        with trio.fail_after(10):
            while cfgs[0].stats.live:  # the session's end is noticed by the server task
                await trio.sleep(0.02)
        one, two = [Scrape(await trio.to_thread.run_sync(_get, cfg.metrics_bound, "/metrics")) for cfg in cfgs]
        assert one("rpcsrv_requests_total", code="call_func") == 7
        assert one("rpcsrv_sessions_ended_total", reason="closed") == 1
        assert two("rpcsrv_requests_total", code="call_func") == 0 and two("rpcsrv_sessions_total") == 0
        assert two("rpcsrv_received_bytes_total") == 0 < one("rpcsrv_received_bytes_total")
        assert b"rpcsrv_" not in generate_latest(REGISTRY)  # nothing in the process-wide registry

        port = cfgs[1].metrics_bound
        pair = await trio.to_thread.run_sync(_raw, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                                                         b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        assert pair.count(b"HTTP/1.1 200") == 1 and pair.count(b"HTTP/1.1 404") == 1  # keep-alive
        head = await trio.to_thread.run_sync(_raw, port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")  # headers only
        post = await trio.to_thread.run_sync(_raw, port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert post.startswith(b"HTTP/1.1 405")
        bad = await trio.to_thread.run_sync(_raw, port, b"GARBAGE\x00\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400")
        try:  # headers past 8 KiB: refused (the answer may be lost to the reset of the unread rest)
            huge = await trio.to_thread.run_sync(_raw, port, b"GET / HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")
        except ConnectionResetError:
            huge = b"HTTP/1.1 431 (reset)"
        assert huge.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), huge[:100]
        assert "rpcsrv board" in await trio.to_thread.run_sync(_get, port, "/")  # still serving
        nursery.cancel_scope.cancel()
