"""``/metrics``, ``/`` (the status page) and ``/healthz`` on the board's metrics port.

A small HTTP/1.1 responder: h11 (sans-IO, the model this project's protocol code follows) parses
and frames, trio moves the bytes, in the server's own nursery.  Everything is answered on the trio
loop, so the metrics read the server's state with no lock and no thread: a scrape sees one
consistent moment.  Bounded: at most :data:`MAX_CLIENTS` connections, requests of at most 8 KiB
of headers, :data:`TIMEOUT` seconds per connection; only GET and HEAD.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any, Optional

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .collector import board_version, make_registry
from .page import render
from .stats import ServerStats

log = logging.getLogger("rpcsrv.board.observe")

MAX_CLIENTS = 16
TIMEOUT = 30.0


class MetricsApp:
    """The three pages of one server."""

    def __init__(self, server: Any, stats: ServerStats):
        self.server = server
        self.stats = stats
        self.registry = make_registry(server, stats)
        self.version = board_version()

    def respond(self, method: str, target: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``target``."""
        path = target.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", render(self.server, self.stats, self.version).encode()
        if path == "/healthz":  # 503 while draining, or while the self-test fails (with its reason)
            health = self.server.health
            if self.server.draining:
                return 503, "text/plain; charset=utf-8", b"draining\n"
            if not health.ok:
                return 503, "text/plain; charset=utf-8", f"unhealthy: {health.reason}\n".encode()
            return 200, "text/plain; charset=utf-8", b"ok\n"
        return 404, "text/plain; charset=utf-8", b"not found: try /, /metrics or /healthz\n"


async def _answer(stream: trio.SocketStream, conn: h11.Connection, status: int, ctype: str, body: bytes,
                  head: bool = False) -> None:
    headers = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
    data = conn.send(h11.Response(status_code=status, headers=headers))
    if not head:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)


async def handle_client(stream: trio.SocketStream, app: MetricsApp) -> None:
    """One HTTP connection: requests one after another (keep-alive) until it closes or times out."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=8192)
    with trio.move_on_after(TIMEOUT):
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(8192))  # b"": the client closed
                elif isinstance(event, h11.Request):
                    method = event.method.decode("ascii", "replace")
                    if method not in ("GET", "HEAD"):
                        await _answer(stream, conn, 405, "text/plain", b"only GET and HEAD\n")
                    else:
                        try:
                            status, ctype, body = app.respond(method, event.target.decode("ascii", "replace"))
                        except Exception:  # a bug in a page: its answer is a 500, the board goes on
                            log.exception("metrics endpoint: %s failed", event.target[:100])
                            status, ctype, body = 500, "text/plain", b"internal error (see the board's log)\n"
                        await _answer(stream, conn, status, ctype, body, head=method == "HEAD")
                elif isinstance(event, h11.ConnectionClosed):
                    break
                elif event is h11.PAUSED:  # a request answered: the next one, or close
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        break
                    conn.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                try:
                    await _answer(stream, conn, exc.error_status_hint, "text/plain", b"bad request\n")
                except (h11.LocalProtocolError, trio.BrokenResourceError):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:  # never take the board down over a page
            log.exception("metrics endpoint: answering failed")
    with trio.CancelScope(shield=True):
        await stream.aclose()


async def open_metrics_listener(host: str, port: int) -> trio.SocketListener:
    """Bind the metrics port (an OSError naming it when busy)."""
    sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        await sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno or errno.EADDRINUSE, f"metrics port {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(32)
    return trio.SocketListener(sock)


async def serve_metrics(server: Any, listener: Optional[trio.SocketListener] = None,
                        task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``server``'s metrics and status page until cancelled (``task_status.started``: the bound port)."""
    opts = server.options
    if listener is None:
        listener = await open_metrics_listener(opts.metrics_host or opts.host, opts.metrics_port)
    app = MetricsApp(server, server.stats)
    port = server.metrics_bound = listener.socket.getsockname()[1]
    log.info("metrics and status page on http://%s:%d/", opts.metrics_host or opts.host, port)
    task_status.started(port)
    limiter = trio.CapacityLimiter(MAX_CLIENTS)

    async def handler(stream: trio.SocketStream) -> None:
        if limiter.borrowed_tokens >= MAX_CLIENTS:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        async with limiter:
            await handle_client(stream, app)

    await trio.serve_listeners(handler, [listener])
