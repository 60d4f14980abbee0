"""The trio server: one task per connection, each with its own session.

Structured concurrency (trio): the listener's nursery owns every connection task; a connection's
failure ends only that connection; Ctrl-C cancels the nursery and every session cleans up (buffers
dropped, workspace removed) on the way out.
"""

from __future__ import annotations

import errno
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import trio

from .globals import REGISTRY, Registry
from .protocol import (NEED_DATA, CallFuncChunk, CallFuncStart, Connection, ConnectionClosed,
                       CopyToRemoteStart, Dialect,
                       HandshakeRequest, Role, Shutdown)
from .protocol.connection import DEFAULT_MAX_PACKET
from .native.host import NativeSession
from .session import Limits, Session
from .transport import Transport
from .workspace import Workspace

log = logging.getLogger("rpcsrv.server")

HANDSHAKE_TIMEOUT = 30.0
# small reads: recv(n) allocates n bytes first, and 1 MB per call cost ~17 us of a ~45 us round trip
# (malloc maps and unmaps it); bodies of 64 KiB and more are received in place (recv_into) instead
RECV_SIZE = 1 << 16


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 9090
    port_end: Optional[int] = None
    key: str = ""
    workdir: Optional[Path] = None
    dialect: Optional[Dialect] = None  # None: detect per connection
    max_packet: int = DEFAULT_MAX_PACKET
    limits: Limits = field(default_factory=Limits)
    registry: Registry = field(default_factory=lambda: REGISTRY)
    native: str = "isolated"  # native host code: "isolated" (worker process), "inprocess" or "off"


async def serve_connection(stream: trio.SocketStream, cfg: ServerConfig) -> None:
    """Serve one client from handshake to close."""
    try:
        peer = "%s:%s" % stream.socket.getpeername()[:2]
    except (OSError, AttributeError, TypeError):
        peer = "?"
    conn = Connection(Role.SERVER, dialect=cfg.dialect, max_packet=cfg.max_packet)
    session: Optional[Session] = None
    io = Transport(stream.socket)
    try:
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as hs_scope:
            request = await _next(io, conn)
        if hs_scope.cancelled_caught or not isinstance(request, HandshakeRequest):
            log.info("%s: no valid handshake (%s)", peer, getattr(request, "error", "timeout"))
            return
        if request.key != cfg.key:
            log.warning("%s: key mismatch (client sent %r)", peer, request.header)
            await io.send_all([conn.refuse()])
            return
        await io.send_all([conn.accept(cfg.key)])
        timeout = _timeout(request.options.get("timeout"))
        session = Session(conn, Workspace.create(cfg.workdir, max_bytes=cfg.limits.max_workspace),
                          cfg.registry, cfg.limits, peer)
        session.native = NativeSession(cfg.native, cfg.limits.max_memory, timeout)
        log.info("%s: session started in %s", peer, session.workspace.root)
        with trio.move_on_after(timeout) as scope:
            await _session_loop(io, conn, session, peer)
        if scope.cancelled_caught:
            log.info("%s: session timed out after %ss", peer, timeout)
            await io.send_all(conn.send_exception(
                f"RPCSessionTimeoutError: Your {timeout}s session has expired, "
                f'try to increase the "session_timeout" value.'))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.info("%s: connection lost: %s", peer, exc)
    finally:
        io.close()
        if session is not None:
            session.close()
            log.info("%s: session closed", peer)
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _timeout(text: Optional[str]) -> float:
    try:
        value = float(text) if text else 0.0
    except ValueError:
        return float("inf")
    return value if value > 0 else float("inf")


async def _next(io: Transport, conn: Connection):
    while True:
        ev = conn.next_event()
        if ev is not NEED_DATA:
            return ev
        region = conn.writable()
        if region is not None and len(region) >= 1 << 16:
            n = await io.recv_into(region)  # large bodies land in place, no copies
            if n:
                conn.advance(n)
            else:
                conn.receive_data(b"")
        else:
            conn.receive_data(await io.recv(RECV_SIZE))


async def _session_loop(io: Transport, conn: Connection, session: Session, peer: str) -> None:
    while True:
        ev = await _next(io, conn)
        if isinstance(ev, ConnectionClosed):
            if not ev.clean:
                log.info("%s: closing: %s", peer, ev.error)
            return
        if isinstance(ev, Shutdown):
            return
        if isinstance(ev, CopyToRemoteStart):
            conn.set_copy_target(*session.copy_target(ev))
            continue
        if isinstance(ev, CallFuncStart):
            conn.stream_call(session.open_stream(ev))
            continue
        if isinstance(ev, CallFuncChunk):
            await session.stream_piece(ev.data)
            continue
        await io.send_all(await session.handle(ev))


async def open_listener(cfg: ServerConfig) -> trio.SocketListener:
    """Bind the first free port in [port, port_end) (TVM's --port/--port-end)."""
    end = cfg.port_end if cfg.port_end and cfg.port_end > cfg.port else cfg.port + 1
    last: Optional[OSError] = None
    for port in range(cfg.port, end):
        sock = trio.socket.socket(socket.AF_INET6 if ":" in cfg.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await sock.bind((cfg.host, port))
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            last = exc
            continue
        sock.listen(128)
        return trio.SocketListener(sock)
    raise OSError(f"no free port in [{cfg.port}, {end}) on {cfg.host}: {last}")


async def serve(cfg: ServerConfig, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen and serve until cancelled; ``task_status.started`` receives the bound port."""
    listener = await open_listener(cfg)
    port = listener.socket.getsockname()[1]
    log.info("rpcsrv listening on %s:%d", cfg.host, port)
    task_status.started(port)

    async def handler(stream: trio.SocketStream) -> None:
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            await serve_connection(stream, cfg)
        except Exception:  # one broken connection must never take the server down
            log.exception("connection handler failed")

    await trio.serve_listeners(handler, [listener])
