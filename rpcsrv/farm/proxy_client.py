"""Serve through TVM's RPC proxy (``rpcsrv serve --proxy HOST:PORT --key K``): a board behind NAT
connects out and waits there for clients.

One connection waits at the proxy at a time (the proxy refuses a second board under the same key
with ``RPC_CODE_DUPLICATE``).  When the proxy pairs it with a client it answers with the client's key
(see :mod:`rpcsrv.protocol.tracker`), which reads exactly like a client's handshake, so the
connection is handed to the ordinary :func:`rpcsrv.board.server.serve_connection` (told not to answer the
handshake again) and a new connection goes to wait at the proxy.  Errors reconnect with backoff.
While the board's self-test fails (``Server.health``, ``rpcsrv.board.health``) no connection waits at the
proxy: the waiting one is closed, and a new one waits once the test passes again.
"""

from __future__ import annotations

import logging
import socket

import trio

from ..protocol import tracker as tp
from ..board.server import Server, serve_connection

log = logging.getLogger("rpcsrv.proxy")


async def _peek_code(stream: trio.SocketStream) -> int:
    """The proxy's four-byte answer, left in the socket for the session to read."""
    while True:
        data = await stream.socket.recv(4, socket.MSG_PEEK)
        if not data:
            raise trio.BrokenResourceError("the proxy closed the connection")
        if len(data) == 4:
            return tp.proxy_answer_code(data)
        await trio.sleep(0.01)


async def serve_via_proxy(host: str, port: int, server: Server, first_backoff: float = 0.25,
                          max_backoff: float = 5.0, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Wait at the proxy for clients and serve each; runs until cancelled."""
    backoff = first_backoff
    started = False
    health = server.health
    link: list[trio.CancelScope] = []  # the waiting connection's scope, closed when the self-test fails
    resumed = trio.Event()

    def changed(ok: bool, reason: str) -> None:
        nonlocal resumed
        if ok:
            resumed.set()
            return
        resumed = trio.Event()
        for scope in link:
            scope.cancel()

    health.watch(changed)
    async with trio.open_nursery() as sessions:
        while True:
            if not health.ok:
                if not started:
                    task_status.started()
                    started = True
                log.warning("not waiting at proxy %s:%d: %s", host, port, health.reason)
                await resumed.wait()
            stream = None
            try:
                with trio.CancelScope() as scope:
                    link[:] = [scope]
                    stream = await trio.open_tcp_stream(host, port)
                    await stream.send_all(tp.proxy_hello(server.options.key))
                    if not started:
                        task_status.started()
                        started = True
                    log.info("waiting at proxy %s:%d under key %r", host, port, server.options.key)
                    await _peek_code(stream)
                link.clear()
                if scope.cancelled_caught:  # the self-test failed while the board waited
                    if stream is not None:
                        await stream.aclose()
                    continue
            except tp.TrackerError as exc:
                log.warning("proxy %s:%d: %s", host, port, exc)
            except (OSError, trio.BrokenResourceError) as exc:
                log.warning("proxy %s:%d unreachable (%s); retry in %.2gs", host, port, exc, backoff)
            else:
                backoff = first_backoff
                sessions.start_soon(serve_connection, stream, server, True)
                continue
            if stream is not None:
                await stream.aclose()
            if not started:
                task_status.started()
                started = True
            await trio.sleep(backoff)
            backoff = min(max_backoff, backoff * 2)
