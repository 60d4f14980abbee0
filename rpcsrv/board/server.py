"""The trio server: one task per connection, each with its own session.

Structured concurrency (trio): the listener's nursery owns every connection task; a connection's
failure ends only that connection; Ctrl-C cancels the nursery and every session cleans up (buffers
dropped, workspace removed) on the way out.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import time
from time import perf_counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import trio

from .accounts import MemoryAccount
from ..executor import compute
from .records import SessionRecord
from .globals import REGISTRY, Registry
from .limits import Limits
from ..protocol import (NEED_DATA, CallFuncChunk, CallFuncEnd, CallFuncStart, Connection, ConnectionClosed,
                       CopyToRemoteStart, Dialect,
                       HandshakeRequest, Role, Shutdown)
from ..protocol.connection import RECV_SIZE
from ..native.host import NativeSession
from ..native.library import NativeError
from .baton import harden
from .session import INIT_DONE, Answer, CopyData, Failed, Returned, Session, _message
from .transport import SPIN_SECONDS, IdleTimeout, Transport
from .workspace import Workspace

log = logging.getLogger("rpcsrv.board.server")

HANDSHAKE_TIMEOUT = 30.0


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 9090
    port_end: Optional[int] = None
    key: str = ""
    workdir: Optional[Path] = None
    dialect: Optional[Dialect] = None  # None: detect per connection
    limits: Limits = field(default_factory=Limits)
    registry: Registry = field(default_factory=lambda: REGISTRY)
    # deployment hooks (rpcsrv/farm/registration.py, rpcsrv/cli.py): a tracker registration admits only its
    # match keys; ``draining`` + ``sessions`` let SIGTERM close running sessions with a message
    gate: Optional[Any] = None
    draining: bool = False
    sessions: set = field(default_factory=set)
    state: Optional["ServerState"] = None  # made on first use (inside trio): see shared_state
    native: str = "isolated"  # native host code: "isolated" (worker process), "inprocess" or "off"
    isolate: str = "auto"  # which libraries load in the session's worker: "native" (needed), "all", or
    # "auto" (all while another session computes in the server)
    poll_us: int = round(SPIN_SECONDS * 1e6)  # how long a session polls for the next request (transport.py)
    # obs (issue 28): ``--metrics-port`` serves /metrics and the status page (rpcsrv.board.observe); ``stats``
    # (an observe.stats.ServerStats, made by serve) counts for them, None when the board serves no metrics
    metrics_port: Optional[int] = None
    metrics_host: Optional[str] = None
    stats: Optional[Any] = None
    metrics_bound: Optional[int] = None  # the metrics port once bound


class ServerState:
    """What all connections share: the server-wide memory account, the worker-thread limiter, and
    the counts the connection and session limits are checked against."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.account = MemoryAccount(limits.max_total_memory, name="server")
        self.limiter = trio.CapacityLimiter(limits.max_threads)
        self.connections = 0
        self.sessions = 0


def shared_state(cfg: ServerConfig) -> ServerState:
    if cfg.state is None:
        cfg.state = ServerState(cfg.limits)
    return cfg.state


def encode(conn: Connection, answer: Answer) -> list:
    """The bytes of a session's answer, in the connection's dialect."""
    if isinstance(answer, Returned):
        if answer.call:  # a function's result: the common case
            return conn.send_value(answer.value)
        if answer is INIT_DONE:
            return conn.send_init_reply()
        return conn.send_return([answer.value])
    if isinstance(answer, CopyData):
        return conn.send_copy_ack(answer.data)
    if isinstance(answer, Failed):
        return conn.send_exception(answer.message)
    raise TypeError(f"not an answer: {answer!r}")


async def serve_connection(stream: trio.SocketStream, cfg: ServerConfig, answered: bool = False) -> None:
    """Serve one client from handshake to close (``answered``: a proxy already answered its handshake)."""
    state, limits = shared_state(cfg), cfg.limits
    try:
        peer = "%s:%s" % stream.socket.getpeername()[:2]
    except (OSError, AttributeError, TypeError):
        peer = "?"
    conn = Connection(Role.SERVER, dialect=cfg.dialect, max_packet=limits.max_packet, max_ndim=limits.max_ndim)
    session: Optional[Session] = None
    counted = False
    io = Transport(stream.socket, spin=max(cfg.poll_us, 0) * 1e-6, idle_timeout=limits.idle_timeout)
    record: Optional[SessionRecord] = None
    stats, live = cfg.stats, None  # obs
    admitted = False
    scope: Optional[trio.CancelScope] = None
    try:
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as hs_scope:
            request = await _next(io, conn)
        if hs_scope.cancelled_caught or not isinstance(request, HandshakeRequest):
            log.info("%s: no valid handshake (%s)", peer, getattr(request, "error", "timeout"))
            return
        admitted = cfg.gate.admit(request.key) if cfg.gate is not None else request.key == cfg.key
        if not admitted or cfg.draining:
            log.warning("%s: key mismatch (client sent %r)", peer, request.header)
            if stats is not None:  # obs
                stats.refuse("draining" if cfg.draining else "key")
            await io.send_all([conn.refuse()])
            return
        answer = conn.accept(cfg.key)
        if not answered:
            await io.send_all([answer])
        if state.sessions >= limits.max_sessions:
            if stats is not None:  # obs
                stats.refuse("limit")
            await _refuse_session(io, conn, peer, f"the server already serves {state.sessions} sessions, "
                                                  f"its limit (--max-sessions); try again later")
            return
        state.sessions += 1
        counted = True
        timeout = _timeout(request.options.get("timeout"))
        record = SessionRecord(peer=peer, key=cfg.key, start=time.monotonic(), io=io)
        account = MemoryAccount(limits.max_memory, parent=state.account, name="session")
        session = Session(conn, Workspace.create(cfg.workdir, max_bytes=limits.max_workspace),
                          cfg.registry, limits, peer, account=account, limiter=state.limiter,
                          native=NativeSession(cfg.native, limits.max_memory, timeout, isolate=cfg.isolate))
        log.info("%s: session started in %s", peer, session.workspace.root)
        if stats is not None:  # obs
            live = stats.open(record, session)
        idle: Optional[IdleTimeout] = None
        session.bind_allocations()  # this task serves it (and only it)
        with trio.move_on_after(timeout) as scope:
            cfg.sessions.add(scope)
            try:  # the idle clock runs in the transport, only while it waits for the client
                await _session_loop(io, conn, session, peer, record, live, stats)
            except IdleTimeout as exc:
                idle = exc
        if scope.cancelled_caught and io.broken:  # never write after half a packet: the client
            record.end = "timeout" if not cfg.draining else "shutdown"  # would read garbage
            log.info("%s: session ended in the middle of an answer", peer)
        elif idle is not None:
            record.end = "idle"
            log.info("%s: %s waiting for the client; closing", peer, idle)
            if idle.reading and not io.broken:  # a client that does not read would not read this either
                await io.send_all(conn.send_exception(f"RPCSessionIdleError: no request for {limits.idle_timeout:g}s; "
                                                      "the board closed the session"))
        elif scope.cancelled_caught and cfg.draining:
            record.end = "shutdown"
            await io.send_all(conn.send_exception("RPCServerShutdown: the board is shutting down; "
                                                  "this session was closed and its files removed"))
        elif scope.cancelled_caught:
            record.end = "timeout"
            log.info("%s: session timed out after %ss", peer, timeout)
            await io.send_all(conn.send_exception(
                f"RPCSessionTimeoutError: Your {timeout}s session has expired, "
                f'try to increase the "session_timeout" value.'))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.info("%s: connection lost: %s", peer, exc)
        if record is not None:
            record.end = "lost"
    finally:
        io.close()
        if counted:
            state.sessions -= 1
        if session is not None:
            session.close()
            log.info("%s: session closed", peer)
        if admitted and cfg.gate is not None:
            cfg.gate.release()
        if record is not None:
            record.finish(session)
        if stats is not None:  # obs: after session.close (its worker counts are final)
            stats.close(live, io, record.end if record is not None else None)
        cfg.sessions.discard(scope)  # last: a draining server waits for this set to empty
        if session is not None and session.baton is not None and session.baton.lent:
            harden(stream.socket)  # (its worker is gone by now: session.close)
        with trio.CancelScope(shield=True):
            await stream.aclose()


def _timeout(text: Optional[str]) -> float:
    try:
        value = float(text) if text else 0.0
    except ValueError:
        return float("inf")
    return value if value > 0 else float("inf")


async def _next(io: Transport, conn: Connection):
    """The next event, reading as the connection's shared receive loop asks (``Connection.reads``:
    it looks at what is buffered first).  The common case, a small request that one ``recv`` brings
    whole after the connection parsed all it had, is read here without starting that loop (and
    without asking the connection for an event it cannot have yet)."""
    if conn.drained():
        ev = conn.next_event_in(await io.recv(RECV_SIZE))
    else:
        ev = conn.next_event()
    if ev is not NEED_DATA:
        return ev
    steps = conn.reads()
    try:
        want = next(steps)
        while True:
            want = steps.send(await (io.recv(want) if type(want) is int else io.recv_into(want)))
    except StopIteration as done:
        return done.value


#: the events that steer the loop instead of asking for an answer
_STEERING = frozenset({ConnectionClosed, Shutdown, CopyToRemoteStart, CallFuncStart, CallFuncChunk})


async def _session_loop(io: Transport, conn: Connection, session: Session, peer: str,
                        record: Optional[SessionRecord] = None, live: Optional[Any] = None,
                        stats: Optional[Any] = None) -> None:
    while True:
        ev = await _next(io, conn)
        if type(ev) in _STEERING:
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
                if live is not None:  # obs: a streamed call's latency counts from its start
                    live.stream_t0 = perf_counter()
                continue
            await session.stream_piece(ev.data)  # CallFuncChunk
            continue
        if record is not None:
            record.calls += 1
        if live is None:
            answer = await session.handle(ev)
            await io.send_all(out := encode(conn, answer))
        else:  # obs (issue 28): the request's latency, by RPC code and function kind
            t0 = live.stream_t0 if type(ev) is CallFuncEnd else perf_counter()
            answer = await session.handle(ev)
            await io.send_all(out := encode(conn, answer))
            stats.observe(ev, answer, perf_counter() - t0, live)
        baton = session.baton
        if baton is not None:  # its native worker may answer the client's repeated calls (baton.py)
            if baton.note(ev, answer, conn.last_packet, out):
                owed = await baton.lend(io, conn, record, stats, live)
                if owed is not None:
                    await io.send_all(_owed(conn, session, record, *owed))


def _owed(conn: Connection, session: Session, record: Optional[SessionRecord], packet: bytes, kind: str,
          value: Any) -> list:
    """The answer to a request a native worker took off the socket and left to the server (``baton.py``):
    the connection reads its bytes again, as if from the socket, and the answer is worded as on the
    server's own path."""
    conn.receive_data(packet)
    conn.next_event()
    if record is not None:
        record.calls += 1
    if kind == "crash":
        return encode(conn, Failed(_message(value)))
    if kind == "err":
        return encode(conn, Failed(_message(NativeError(value))))
    return encode(conn, Returned(session.to_wire(value), True))


async def _refuse_session(io: Transport, conn: Connection, peer: str, reason: str) -> None:
    """Over the session limit: answer the client's first request (kInitServer) with the reason, so a
    TVM client shows it to its user, then close."""
    log.warning("%s: refused: %s", peer, reason)
    with trio.move_on_after(5):
        ev = await _next(io, conn)
        if not isinstance(ev, ConnectionClosed):
            await io.send_all(conn.send_exception(f"rpcsrv: {reason}"))


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


def _ignore_sigio() -> None:
    """The server ignores ``SIGIO``, whose default ends a process: a socket's owner receives it, and
    native code holding a lent connection (``baton.py``) could name the server as its owner (the
    worker's seccomp filter refuses that; a board without one, under qemu-user, has only this)."""
    try:
        signal.signal(signal.SIGIO, signal.SIG_IGN)
    except (ValueError, AttributeError, OSError):  # not the main thread (in-process tests), or no SIGIO
        pass


async def serve(cfg: ServerConfig, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen and serve until cancelled; ``task_status.started`` receives the bound port."""
    listener = await open_listener(cfg)
    port = listener.socket.getsockname()[1]
    log.info("rpcsrv listening on %s:%d", cfg.host, port)
    metrics = await open_metrics(cfg, port)  # obs
    task_status.started(port)

    state = shared_state(cfg)
    _ignore_sigio()
    # threads computing in this process yield to its event loop, which answers every session
    compute.POLICY.configure(compute.ComputeSettings.from_environment("RPCSRV_COMPUTE_NICE"))

    async def handler(stream: trio.SocketStream) -> None:
        if state.connections >= cfg.limits.max_connections:
            log.warning("refused a connection: %d open, the limit (--max-connections)", state.connections)
            if cfg.stats is not None:  # obs
                cfg.stats.refuse("connections")
            with trio.CancelScope(shield=True):
                await stream.aclose()  # closed at once: the client sees the connection end
            return
        state.connections += 1
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            await serve_connection(stream, cfg)
        except Exception:  # one broken connection must never take the server down
            log.exception("connection handler failed")
        finally:
            state.connections -= 1

    async with trio.open_nursery() as nursery:
        if metrics is not None:  # obs
            await nursery.start(metrics[0], cfg, metrics[1])
        await trio.serve_listeners(handler, [listener])


async def open_metrics(cfg: ServerConfig, port: int = 0):
    """obs (issue 28): with ``cfg.metrics_port``, the counters and the bound metrics listener, as
    ``(serve_metrics, listener)`` to start in the server's nursery; else None."""
    if cfg.metrics_port is None:
        return None
    from .observe.http import open_metrics_listener, serve_metrics  # prometheus_client, h11: the metrics extra
    from .observe.stats import ServerStats

    if cfg.stats is None:
        cfg.stats = ServerStats()
    cfg.stats.board_port = port
    listener = await open_metrics_listener(cfg.metrics_host or cfg.host, cfg.metrics_port)
    cfg.metrics_bound = listener.socket.getsockname()[1]
    return serve_metrics, listener
