"""The trio server: one task per connection, each with its own session.

Structured concurrency (trio): the listener's nursery owns every connection task; a connection's
failure ends only that connection; Ctrl-C cancels the nursery and every session cleans up (buffers
dropped, workspace removed) on the way out.

:class:`Server` is one running board: its options (``options.ServeOptions``, immutable, as ``rpcsrv serve``
was told) and its live state (the server-wide memory account, the worker-thread limiter, the counts the
limits are checked against, the running sessions, a tracker's gate, the metrics).  What each piece needs of
the options is handed to it: the limits to each connection and session, the native options and the call
timeout to each session's policy (``rpcsrv.native.host``).
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import time
from time import perf_counter
from typing import Any, Optional

import trio

from .accounts import MemoryAccount
from .answers import INIT_DONE, Answer, CopyData, Failed, Returned
from ..executor import compute
from .records import SessionRecord
from .globals import REGISTRY, Registry
from .health import Health
from .options import ServeOptions
from ..protocol import (NEED_DATA, CallFuncChunk, CallFuncEnd, CallFuncStart, Connection, ConnectionClosed,
                       CopyToRemoteStart, HandshakeRequest, Role, Shutdown)
from ..protocol.connection import RECV_SIZE
from ..native.host import NativeSession
from .baton import harden
from .session import Session
from .transport import IdleTimeout, Transport
from .workspace import Workspace

log = logging.getLogger("rpcsrv.board.server")

HANDSHAKE_TIMEOUT = 30.0


class Server:
    """One board: its options and what all its connections share while it runs."""

    def __init__(self, options: ServeOptions, registry: Registry = REGISTRY):
        self.options = options
        self.registry = registry
        self.account = MemoryAccount(options.limits.max_total_memory, name="server")
        self._limiter: Optional[trio.CapacityLimiter] = None
        self.connections = 0  # open sockets (--max-connections)
        self.sessions = 0  # handshaken sessions (--max-sessions)
        #: each running session's cancel scope: a draining server cancels them, and waits for the set to empty
        self.running: set = set()
        self.draining = False  # stopping: new handshakes are refused, running sessions told and closed
        #: admits the keys a tracker registration matches (rpcsrv/farm/registration.py), else ``options.key``
        self.gate: Optional[Any] = None
        #: what ``--metrics-port`` counts (an observe.stats.ServerStats, made by ``open_metrics``), and its port
        self.stats: Optional[Any] = None
        self.metrics_bound: Optional[int] = None
        #: the self-test's verdict (``--health-interval``, ``health.py``): what /healthz, the metrics and the farm read
        self.health = Health()

    @property
    def limiter(self) -> trio.CapacityLimiter:
        """The worker threads all sessions share (``--max-threads``), made on first use (inside trio)."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self.options.limits.max_threads)
        return self._limiter


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


async def serve_connection(stream: trio.SocketStream, server: Server, answered: bool = False) -> None:
    """Serve one client from handshake to close (``answered``: a proxy already answered its handshake)."""
    opts = server.options
    limits = opts.limits
    try:
        peer = "%s:%s" % stream.socket.getpeername()[:2]
    except (OSError, AttributeError, TypeError):
        peer = "?"
    conn = Connection(Role.SERVER, dialect=opts.dialect, max_packet=limits.max_packet, max_ndim=limits.max_ndim)
    session: Optional[Session] = None
    counted = False
    io = Transport(stream.socket, spin=max(opts.poll_us, 0) * 1e-6, idle_timeout=limits.idle_timeout)
    record: Optional[SessionRecord] = None
    stats, live = server.stats, None
    admitted = False
    scope: Optional[trio.CancelScope] = None
    try:
        with trio.move_on_after(HANDSHAKE_TIMEOUT) as hs_scope:
            request = await _next(io, conn)
        if hs_scope.cancelled_caught or not isinstance(request, HandshakeRequest):
            log.info("%s: no valid handshake (%s)", peer, getattr(request, "error", "timeout"))
            return
        admitted = server.gate.admit(request.key) if server.gate is not None else request.key == opts.key
        if not admitted or server.draining:
            log.warning("%s: key mismatch (client sent %r)", peer, request.header)
            if stats is not None:
                stats.refuse("draining" if server.draining else "key")
            await io.send_all([conn.refuse()])
            return
        answer = conn.accept(opts.key)
        if not answered:
            await io.send_all([answer])
        if server.sessions >= limits.max_sessions:
            if stats is not None:
                stats.refuse("limit")
            await _refuse_session(io, conn, peer, f"the server already serves {server.sessions} sessions, "
                                                  f"its limit (--max-sessions); try again later")
            return
        server.sessions += 1
        counted = True
        timeout = _timeout(request.options.get("timeout"))
        record = SessionRecord(peer=peer, key=opts.key, start=time.monotonic(), io=io)
        account = MemoryAccount(limits.max_memory, parent=server.account, name="session")
        native = opts.native
        session = Session(conn, Workspace.create(opts.workdir, max_bytes=limits.max_workspace),
                          server.registry, limits, peer, account=account, limiter=server.limiter,
                          native=NativeSession(native.mode, limits.max_memory, timeout, native.isolate, native.confine,
                                               opts.call_timeout))
        log.info("%s: session started in %s", peer, session.workspace.root)
        if stats is not None:
            live = stats.open(record, session)
        idle: Optional[IdleTimeout] = None
        session.bind_allocations()  # this task serves it (and only it)
        with trio.move_on_after(timeout) as scope:
            server.running.add(scope)
            try:  # the idle clock runs in the transport, only while it waits for the client
                await _session_loop(io, conn, session, peer, record, live, stats)
            except IdleTimeout as exc:
                idle = exc
        if scope.cancelled_caught and io.broken:  # never write after half a packet: the client
            record.end = "timeout" if not server.draining else "shutdown"  # would read garbage
            log.info("%s: session ended in the middle of an answer", peer)
        elif session.ending is not None:  # a call cut by --call-timeout: its error was the last answer
            record.end = session.ending
            log.warning("%s: a call ran past the call timeout (%gs); the session ended and its worker was killed",
                        peer, opts.call_timeout)
        elif idle is not None:
            record.end = "idle"
            log.info("%s: %s waiting for the client; closing", peer, idle)
            if idle.reading and not io.broken:  # a client that does not read would not read this either
                await io.send_all(conn.send_exception(f"RPCSessionIdleError: no request for {limits.idle_timeout:g}s; "
                                                      "the board closed the session"))
        elif scope.cancelled_caught and server.draining:
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
            server.sessions -= 1
        if session is not None:
            session.close()
            log.info("%s: session closed", peer)
        if admitted and server.gate is not None:
            server.gate.release()
        if record is not None:
            record.finish(session)
        if stats is not None:  # after session.close (its worker counts are final)
            stats.close(live, io, record.end if record is not None else None)
        server.running.discard(scope)  # last: a draining server waits for this set to empty
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
                if live is not None:  # a streamed call's latency counts from its start
                    live.stream_t0 = perf_counter()
                continue
            await session.stream_piece(ev.data)  # CallFuncChunk
            continue
        if record is not None:
            record.calls += 1
        if live is None:
            answer = await session.handle(ev)
            await io.send_all(out := encode(conn, answer))
        else:  # the request's latency, by RPC code and function kind (the metrics)
            t0 = live.stream_t0 if type(ev) is CallFuncEnd else perf_counter()
            answer = await session.handle(ev)
            await io.send_all(out := encode(conn, answer))
            stats.observe(ev, answer, perf_counter() - t0, live)
        if session.ending is not None:  # (its answer, the error that says why, is sent)
            return
        baton = session.baton
        if baton is not None:  # its backend may answer the client's repeated native calls (baton.py)
            if baton.note(ev, answer, conn.last_packet, out):
                owed = await baton.lend(io, conn, record, stats, live)
                if owed is not None:  # a request the borrower took off the socket and left to the session
                    await io.send_all(encode(conn, owed))


async def _refuse_session(io: Transport, conn: Connection, peer: str, reason: str) -> None:
    """Over the session limit: answer the client's first request (kInitServer) with the reason, so a
    TVM client shows it to its user, then close."""
    log.warning("%s: refused: %s", peer, reason)
    with trio.move_on_after(5):
        ev = await _next(io, conn)
        if not isinstance(ev, ConnectionClosed):
            await io.send_all(conn.send_exception(f"rpcsrv: {reason}"))


async def open_listener(options: ServeOptions) -> trio.SocketListener:
    """Bind the first free port in [port, port_end) (TVM's --port/--port-end)."""
    end = options.port_end if options.port_end and options.port_end > options.port else options.port + 1
    last: Optional[OSError] = None
    for port in range(options.port, end):
        sock = trio.socket.socket(socket.AF_INET6 if ":" in options.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await sock.bind((options.host, port))
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            last = exc
            continue
        sock.listen(128)
        return trio.SocketListener(sock)
    raise OSError(f"no free port in [{options.port}, {end}) on {options.host}: {last}")


def _ignore_sigio() -> None:
    """The server ignores ``SIGIO``, whose default ends a process: a socket's owner receives it, and
    native code holding a lent connection (``baton.py``) could name the server as its owner (the
    worker's seccomp filter refuses that; a board without one, under qemu-user, has only this)."""
    try:
        signal.signal(signal.SIGIO, signal.SIG_IGN)
    except (ValueError, AttributeError, OSError):  # not the main thread (in-process tests), or no SIGIO
        pass


async def serve(server: Server, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen and serve until cancelled; ``task_status.started`` receives the bound port."""
    opts = server.options
    listener = await open_listener(opts)
    port = listener.socket.getsockname()[1]
    log.info("rpcsrv listening on %s:%d", opts.host, port)
    metrics = await open_metrics(server, port)
    task_status.started(port)

    _ignore_sigio()
    # threads computing in this process yield to its event loop, which answers every session
    compute.POLICY.configure(opts.compute)
    if opts.build is not None:  # the shim and kernels this board lacks: built off every request's path
        from ..native.builds import BUILD

        BUILD.start(opts.build)

    async def handler(stream: trio.SocketStream) -> None:
        if server.connections >= opts.limits.max_connections:
            log.warning("refused a connection: %d open, the limit (--max-connections)", server.connections)
            if server.stats is not None:
                server.stats.refuse("connections")
            with trio.CancelScope(shield=True):
                await stream.aclose()  # closed at once: the client sees the connection end
            return
        server.connections += 1
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            await serve_connection(stream, server)
        except Exception:  # one broken connection must never take the server down
            log.exception("connection handler failed")
        finally:
            server.connections -= 1

    async with trio.open_nursery() as nursery:
        if metrics is not None:
            await nursery.start(metrics[0], server, metrics[1])
        await trio.serve_listeners(handler, [listener])


async def open_metrics(server: Server, port: int = 0):
    """With ``--metrics-port``, the counters and the bound metrics listener, as ``(serve_metrics, listener)``
    to start in the server's nursery; else None."""
    opts = server.options
    if opts.metrics_port is None:
        return None
    from .observe.http import open_metrics_listener, serve_metrics  # prometheus_client, h11: the metrics extra
    from .observe.stats import ServerStats

    if server.stats is None:
        server.stats = ServerStats()
    server.stats.board_port = port
    listener = await open_metrics_listener(opts.metrics_host or opts.host, opts.metrics_port)
    server.metrics_bound = listener.socket.getsockname()[1]
    return serve_metrics, listener
