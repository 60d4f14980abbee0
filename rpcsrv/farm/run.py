"""``rpcsrv serve`` as a farm board: listen (or wait at a proxy), register with a tracker, stop cleanly.

Graceful stop on SIGTERM or SIGINT (``docker stop``, ``systemctl stop``, Ctrl-C), in this order:

1. leave the tracker (closing the connection makes it drop the board's queue entries), so no new
   client is sent here; new handshakes are refused from now on;
2. every running session gets an RPC exception saying the board is shutting down, then its
   connection closes and its workspace is removed;
3. after at most ``drain_seconds`` (sessions busy in a kernel finish it first) the listener stops.

A second signal skips the wait.

With ``--health-interval`` the board's self-test (``BoardOptions.self_test``) runs while the board is free
(``rpcsrv.board.health``); while it fails, the board is off the tracker (or the proxy), and back when it passes.
"""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import trio

from .registration import TrackerRegistration
from ..board.health import run_health
from ..board.server import Server, open_metrics, serve

log = logging.getLogger("rpcsrv.farm.run")


@dataclass
class BoardOptions:
    tracker: Optional[tuple[str, int]] = None
    custom_addr: Optional[str] = None
    proxy: Optional[tuple[str, int]] = None
    drain_seconds: float = 10.0
    #: the board's self-test for ``--health-interval`` (the problems found; ``rpcsrv.check.self_test``)
    self_test: Optional[Callable[[], list]] = None


async def run_board(server: Server, opts: BoardOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            registration = None
            if opts.proxy:
                from .proxy_client import serve_via_proxy

                metrics = await open_metrics(server)  # (serve() starts it when it listens itself)
                if metrics is not None:
                    await nursery.start(metrics[0], server, metrics[1])
                await nursery.start(serve_via_proxy, opts.proxy[0], opts.proxy[1], server)
                where = "through proxy %s:%d" % opts.proxy
            else:
                port = await nursery.start(serve, server)
                where = f"on {server.options.host}:{port}"
                if opts.tracker:
                    registration = TrackerRegistration(opts.tracker[0], opts.tracker[1], server.options.key, port,
                                                       opts.custom_addr)
                    server.gate = registration
                    server.health.watch(registration.health_changed)
                    await nursery.start(registration.run)
                    where += " registered with tracker %s:%d" % opts.tracker
            if server.options.health_interval and opts.self_test is not None:
                await nursery.start(run_health, server, opts.self_test)
            key = server.options.key
            print(f"rpcsrv: serving {where}" + (f" with key {key!r}" if key else ""), flush=True)
            if server.metrics_bound is not None:  # a line of its own, after the board's port
                host = server.options.metrics_host or server.options.host
                print(f"rpcsrv: metrics and status page on http://{host}:{server.metrics_bound}/", flush=True)
            async for signum in signals:
                log.warning("signal %d: stopping (leave tracker, close %d session(s))", signum, len(server.running))
                break
            if registration is not None:
                registration.leave()
            server.draining = True
            for scope in list(server.running):
                scope.cancel()
            with trio.move_on_after(opts.drain_seconds):
                async with trio.open_nursery() as waiter:
                    waiter.start_soon(_second_signal, signals, waiter.cancel_scope)
                    while server.running:
                        await trio.sleep(0.02)
                    waiter.cancel_scope.cancel()
            nursery.cancel_scope.cancel()
    print("rpcsrv: stopped", file=sys.stderr)


async def _second_signal(signals, scope: trio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return
